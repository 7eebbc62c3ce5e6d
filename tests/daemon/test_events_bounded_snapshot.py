"""A bounded `events.subscribe` snapshot (protocol 1.3, `snapshot_limit`): on a root with more
workspaces than one page, the snapshot holds the first page of `workspace.list` and
`workspaces_next` the cursor of the rest, which `workspace.list` pages to the end; without it
the snapshot is whole, as before; a resync is bounded the same way, a resume carries no cursor;
bad values are `invalid_params`. Rows are written straight into the store
(tests/support/manyrows)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.aio import AsyncClient

from tests.support.daemon import DaemonProcess, serve, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.manyrows import populate
from tests.support.raw import RawPeer

COUNT = 1203
PAGE = 500


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    yield from serve(
        "xumbs-", "enable_test_methods = true\n", prepare=lambda root: populate(root, COUNT)
    )


def call(peer: RawPeer, method: str, params: dict[str, Any], id_: int) -> dict[str, Any]:
    peer.send_json({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
    while True:
        message: dict[str, Any] = peer.read()
        if message.get("id") == id_:
            return message


def ids(workspaces: list[dict[str, Any]]) -> list[str]:
    return [w["id"] for w in workspaces]


def whole_listing(daemon: DaemonProcess) -> list[str]:
    with RawPeer(daemon.socket_path) as peer:
        return ids(call(peer, "workspace.list", {}, 1)["result"]["workspaces"])


def test_a_bounded_snapshot_is_the_first_page_and_its_cursor_pages_the_rest(
    daemon: DaemonProcess,
) -> None:
    full = whole_listing(daemon)
    assert len(full) == COUNT
    with RawPeer(daemon.socket_path) as peer:
        result = call(peer, "events.subscribe", {"snapshot_limit": PAGE}, 1)["result"]
        first = ids(result["snapshot"]["workspaces"])
        assert first == full[:PAGE]
        assert result["snapshot"]["projects"], "projects stay whole"
        after = result["workspaces_next"]
        assert isinstance(after, str) and after.startswith("c2.")
        got, pages, n = list(first), 1, 2
        while after is not None:
            page = call(peer, "workspace.list", {"limit": PAGE, "after": after}, n)["result"]
            got += ids(page["workspaces"])
            after, pages, n = page["next"], pages + 1, n + 1
        assert got == full
        assert pages == 3  # 500 + 500 + 203


def test_without_snapshot_limit_the_snapshot_is_whole(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        result = call(peer, "events.subscribe", {}, 1)["result"]
    assert ids(result["snapshot"]["workspaces"]) == whole_listing(daemon)
    assert result["workspaces_next"] is None


def test_a_limit_above_the_count_gives_everything_and_no_cursor(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        result = call(peer, "events.subscribe", {"snapshot_limit": 10_000}, 1)["result"]
    assert len(result["snapshot"]["workspaces"]) == COUNT
    assert result["workspaces_next"] is None


def test_a_resync_is_bounded_and_a_resume_has_no_cursor(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        first = call(peer, "events.subscribe", {"snapshot_limit": 7}, 1)["result"]
        resync = call(
            peer,
            "events.subscribe",
            {"snapshot_limit": 7, "after_seq": 0, "epoch": "another-run"},
            2,
        )["result"]
        assert resync["resync_required"] is True
        assert len(resync["snapshot"]["workspaces"]) == 7
        assert resync["workspaces_next"] == first["workspaces_next"]
        resumed = call(
            peer,
            "events.subscribe",
            {"snapshot_limit": 7, "after_seq": first["seq"], "epoch": first["epoch"]},
            3,
        )["result"]
    assert resumed["resync_required"] is False
    assert resumed["snapshot"] is None
    assert resumed["workspaces_next"] is None


@pytest.mark.parametrize("bad", [0, -1, 10_001, "5", True, 2.5])
def test_a_bad_snapshot_limit_is_invalid_params(daemon: DaemonProcess, bad: Any) -> None:
    with RawPeer(daemon.socket_path) as peer:
        answer = call(peer, "events.subscribe", {"snapshot_limit": bad}, 1)
    assert answer["error"]["data"]["kind"] == "invalid_params", answer
    assert "snapshot_limit" in str(answer["error"]), answer


async def test_the_python_client_pages_the_snapshot_and_the_stream_follows(
    daemon: DaemonProcess,
) -> None:
    full = whole_listing(daemon)
    async with AsyncClient(socket_path=daemon.socket_path) as client:
        asked: list[str] = []
        call = client.call

        async def counting(method: str, params: Any = None, **kw: Any) -> dict[str, Any]:
            asked.append(method)
            return await call(method, params, **kw)

        client.call = counting  # type: ignore[method-assign]
        async with client.subscribe(snapshot_page=PAGE) as stream:
            assert asked == ["events.subscribe", "workspace.list", "workspace.list"]
            assert stream.snapshot.snapshot is not None
            assert ids(stream.snapshot.snapshot["workspaces"]) == full
            assert stream.snapshot.workspaces_next is None
            seq = await client.call("test.publish", {"type": "test.after"})
            event = await stream.__anext__()
            assert event.type == "test.after" and event.seq == seq["seq"]
    async with (
        AsyncClient(socket_path=daemon.socket_path) as client,
        client.subscribe(snapshot_page=None) as stream,
    ):
        assert stream.snapshot.snapshot is not None
        assert ids(stream.snapshot.snapshot["workspaces"]) == full


def test_on_the_subscribed_connection_a_page_shows_every_event_before_it_and_none_after(
    tmp_short: Path,
) -> None:
    """What the clients' paged snapshot rests on (docs/PROTOCOL.md, "A bounded snapshot"): while
    another client renames workspaces, every page of `workspace.list` read on the subscribed
    connection agrees with the events that arrived before it, never older, never newer."""
    root = short_tmpdir("xumbo-") / "root"
    proc = DaemonProcess(root).start()
    try:
        project = add_project(proc, make_repo(tmp_short / "repo"))
        ids_ = [
            create(proc, project["id"], f"o{i}", runtime="directory")["workspace"]["id"]
            for i in range(8)
        ]
        stop = threading.Event()
        renamed = 0

        def rename() -> None:
            nonlocal renamed
            with proc.client() as client:
                n = 0
                while not stop.is_set() and n < 60:
                    ws = ids_[n % len(ids_)]
                    client.call("workspace.rename", {"workspace_id": ws, "name": f"o{n}x{ws[-4:]}"})
                    n += 1
                renamed = n

        with RawPeer(proc.socket_path) as peer:
            call(peer, "events.subscribe", {"types": ["workspace."], "snapshot_limit": 1}, 1)
            names: dict[str, str] = {}
            worker = threading.Thread(target=rename)
            worker.start()
            checked, n = 0, 2
            try:
                while worker.is_alive() or checked == 0:
                    after: str | None = None
                    while True:
                        params: dict[str, Any] = {"limit": 3}
                        if after is not None:
                            params["after"] = after
                        peer.send_json(
                            {
                                "jsonrpc": "2.0",
                                "id": n,
                                "method": "workspace.list",
                                "params": params,
                            }
                        )
                        while True:
                            message = peer.read()
                            if message.get("method") == "event":
                                ws = message["params"]["data"].get("workspace")
                                if ws is not None:
                                    names[ws["id"]] = ws["name"]
                                continue
                            assert message.get("id") == n, message
                            break
                        page = message["result"]
                        for ws in page["workspaces"]:
                            if ws["id"] in names:
                                assert ws["name"] == names[ws["id"]], (ws, names)
                                checked += 1
                        n += 1
                        after = page["next"]
                        if after is None:
                            break
            finally:
                stop.set()
                worker.join(60)
        assert renamed >= 10 and checked > 0, (renamed, checked)
    finally:
        proc.close()
