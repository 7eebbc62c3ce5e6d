"""atheris target: NDJSON framing + JSON-RPC dispatch, in-process (see README.md)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris
import orjson

with atheris.instrument_imports():
    import xumd.daemon.feature as daemon_service
    import xumd.rpc.spec_examples as spec_examples
    from xum_protocol import framing
    from xumd.app import App
    from xumd.base.config import DaemonConfig
    from xumd.base.paths import RootPaths
    from xumd.store import Store


class _Peer:
    """A connection as the router sees it (`xumd.rpc.dispatch.Peer`, checked by mypy: a member
    missing here made every `events.subscribe` an internal error the fuzzer took for a crash)."""

    id: int = 1
    pid: int | None = None
    uid: int | None = None
    protocol: str = "1.0"

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params})
        return True

    def on_close(self, callback: Callable[[], None]) -> None:
        pass

    def keep_streaming(self) -> None:
        pass


def _app() -> App:
    root = Path(tempfile.mkdtemp(prefix="xumfz-"))
    store = Store(root / "state.db")
    store.migrate()
    app = App(RootPaths(root), DaemonConfig(), store)
    daemon_service.install(app)
    spec_examples.install(app.router)
    return app


APP = _app()
LOOP = asyncio.new_event_loop()
PEER = _Peer()


def _valid_id(value: Any) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)


async def _answer(message: Any) -> None:
    items = message if isinstance(message, list) else [message]
    for item in items:
        if isinstance(item, dict) and item.get("method") == "daemon.shutdown":
            return  # would only flag the app as stopping; not interesting here
    replies = [await APP.router.handle(item, PEER) for item in items]
    for item, reply in zip(items, replies, strict=True):
        if reply is None:
            continue
        orjson.dumps(reply)  # every answer must be encodable
        assert reply.get("jsonrpc") == "2.0", reply
        assert ("result" in reply) != ("error" in reply), reply
        if "error" in reply:
            assert reply["error"]["code"] != -32603, reply
        if isinstance(item, dict) and "id" in item and _valid_id(item["id"]):
            assert reply["id"] == item["id"], (item, reply)


def test_one_input(data: bytes) -> None:
    for frame in data.split(framing.DELIMITER):
        if not frame.strip():
            continue
        try:
            message = framing.decode(frame)
        except ValueError:
            continue  # answered as a parse error by the connection, not the router
        LOOP.run_until_complete(_answer(message))
    APP.stopping = False


def main() -> None:
    # Instrument every loaded function (the daemon's, pydantic's, orjson's Python side):
    # instrument_imports alone missed the modules imported through the package __init__s.
    atheris.instrument_all()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
