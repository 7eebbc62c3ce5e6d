"""The floor for RPC figures: a bare asyncio NDJSON server on a Unix socket.

It decodes each line with orjson and answers with a result of the same shape and size as
`daemon.status` (so both sides move the same bytes), or with a canned result file given as the
second argument; `test.publish` is broadcast to every other connection (the fan-out floor).
No dispatch, no validation, no logging, no bookkeeping. Run as `python -m bench.echo SOCKET
[RESULT.json]`; it sends READY=1 to NOTIFY_SOCKET once it listens, exactly like xumd.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

import orjson

_STATUS = {
    "pid": os.getpid(),
    "root": "/tmp/xbench-root/root",
    "version": "0.1.0",
    "protocol": "1.0",
    "started_at": time.time(),
    "uptime_s": 0.0,
    "connections": 1,
    "shutting_down": False,
    "details": {},
}


_PAYLOAD: object = _STATUS
_WRITERS: set[asyncio.StreamWriter] = set()


def _broadcast(params: object, sender: asyncio.StreamWriter) -> None:
    """The floor of event fan-out: one line written to every other connection."""
    line = orjson.dumps({"jsonrpc": "2.0", "method": "event", "params": params}) + b"\n"
    for other in _WRITERS:
        if other is not sender:
            other.write(line)


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    _WRITERS.add(writer)
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                writer.write(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700}}\n')
                continue
            if isinstance(message, dict) and message.get("method") == "test.publish":
                _broadcast(message.get("params"), writer)
            if isinstance(message, dict) and "id" in message:
                reply = {"jsonrpc": "2.0", "id": message["id"], "result": _PAYLOAD}
                writer.write(orjson.dumps(reply) + b"\n")
                await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        _WRITERS.discard(writer)
        writer.close()


def _notify(state: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(state.encode(), address)


async def _main(path: str) -> None:
    server = await asyncio.start_unix_server(_serve_one, path=path, limit=16 * 1024 * 1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    _notify("READY=1")
    async with server:
        await stop.wait()
    os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) > 2:  # a canned result (e.g. a captured workspace.list answer)
        with open(sys.argv[2], "rb") as canned:
            _PAYLOAD = orjson.loads(canned.read())
    asyncio.run(_main(sys.argv[1]))
