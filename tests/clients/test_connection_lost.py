"""A call cut by a lost connection says what it cost, in the Python clients as in the TypeScript
client and the Neovim plugin: `ConnectionLost.sent` and its message say whether the request
went out (no answer came: the daemon may or may not have done it) or never did (the daemon never
saw it), naming the call. A real daemon, SIGKILLed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from xum_client.aio import AsyncClient
from xum_client.errors import ConnectionLost
from xum_client.sync import Client

from tests.support.daemon import DaemonProcess, serve
from tests.support.wait import until


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    yield from serve("xumcl-", "enable_test_methods = true\n")


def handling(daemon: DaemonProcess) -> int:
    """Requests the daemon is handling now, besides this `daemon.status`."""
    active: int = daemon.call("daemon.status")["details"]["rpc"]["active"]
    return active - 1


def test_sync_a_call_the_daemon_was_running_was_sent(daemon: DaemonProcess) -> None:
    caught: list[BaseException] = []

    def sleep() -> None:
        with Client(daemon.root) as client:
            try:
                client.call("test.sleep", {"seconds": 60})
            except BaseException as exc:
                caught.append(exc)

    worker = threading.Thread(target=sleep)
    worker.start()
    until(lambda: handling(daemon) >= 1, message="the daemon running test.sleep")
    daemon.kill()
    worker.join(30)
    [err] = caught
    assert isinstance(err, ConnectionLost)
    assert (err.method, err.sent) == ("test.sleep", True)
    assert str(err).startswith(
        "test.sleep was sent and the connection was lost before its answer (the daemon closed "
        "the connection): the daemon may or may not have done it"
    )


def test_sync_a_call_after_the_daemon_died_was_not_sent(daemon: DaemonProcess) -> None:
    with Client(daemon.root) as client:
        daemon.kill()
        with pytest.raises(ConnectionLost) as caught:
            client.call("project.list", {})
    assert (caught.value.method, caught.value.sent) == ("project.list", False)
    assert str(caught.value).startswith("project.list was not sent: ")
    assert str(caught.value).endswith("the daemon never saw it")


async def test_async_sent_then_not_sent(daemon: DaemonProcess) -> None:
    import anyio

    outcome: dict[str, Any] = {}
    async with AsyncClient(daemon.root) as client:

        async def sleep() -> None:
            try:
                await client.call("test.sleep", {"seconds": 60})
            except ConnectionLost as exc:
                outcome["err"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleep)
            # Answers come in order of reading: once this one is here, the sleep was read.
            await client.call("daemon.status")
            await anyio.to_thread.run_sync(daemon.kill)
        err = outcome["err"]
        assert (err.method, err.sent) == ("test.sleep", True)
        assert "test.sleep was sent and the connection was lost before its answer" in str(err)
        with pytest.raises(ConnectionLost) as later:
            await client.call("daemon.status")
        assert (later.value.method, later.value.sent) == ("daemon.status", False)
        assert str(later.value).startswith("daemon.status was not sent: ")
