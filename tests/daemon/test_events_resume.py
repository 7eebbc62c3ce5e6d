"""Events after a reconnect: `events.subscribe {after_seq, epoch}` replays
what a client missed from the bounded ring, or says `resync_required` with a snapshot; replay then
live events are gap-free and duplicate-free, even while events are published concurrently."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.raw import RawPeer

TEST_METHODS = "enable_test_methods = true\n"


def _daemon(config: str = "") -> Iterator[DaemonProcess]:
    root = short_tmpdir("xumev-") / "root"
    write_config(root, TEST_METHODS + config)
    proc = DaemonProcess(root).start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    yield from _daemon()


@pytest.fixture
def small_ring() -> Iterator[DaemonProcess]:
    yield from _daemon("event_ring_size = 4\n")


def call(peer: RawPeer, method: str, params: dict[str, Any], id_: int = 1) -> Any:
    peer.send_json({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
    while True:
        message = peer.read()
        if message.get("id") == id_:
            return message


def publish(sock: Path, type_: str, count: int = 1, **data: Any) -> int:
    with RawPeer(sock) as peer:
        answer = call(peer, "test.publish", {"type": type_, "count": count, "data": data})
    seq: int = answer["result"]["seq"]
    return seq


def subscribe(peer: RawPeer, **params: Any) -> dict[str, Any]:
    answer = call(peer, "events.subscribe", params)
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


def next_event(peer: RawPeer) -> dict[str, Any]:
    message = peer.read()
    assert message.get("method") == "event", message
    params: dict[str, Any] = message["params"]
    return params


def test_resume_replays_exactly_what_was_missed(daemon: DaemonProcess) -> None:
    sock = daemon.socket_path
    with RawPeer(sock) as first:
        start = subscribe(first)
        assert start["snapshot"] is not None and start["resync_required"] is False
        assert start["events"] == []
        publish(sock, "test.seen", count=3)
        seen = [next_event(first) for _ in range(3)]
        assert [e["seq"] for e in seen] == [start["seq"] + 1, start["seq"] + 2, start["seq"] + 3]
    # Disconnected: these are missed.
    last = publish(sock, "test.missed", count=5, n=1)
    with RawPeer(sock) as again:
        resumed = subscribe(again, after_seq=seen[-1]["seq"], epoch=start["epoch"])
        assert resumed["resync_required"] is False
        assert resumed["snapshot"] is None
        assert resumed["seq"] == last
        assert [e["seq"] for e in resumed["events"]] == list(range(seen[-1]["seq"] + 1, last + 1))
        assert {e["type"] for e in resumed["events"]} == {"test.missed"}
        assert all(
            e["epoch"] == start["epoch"] and e["data"] == {"n": 1} for e in resumed["events"]
        )
        # And live events follow, numbered on from the answer's seq.
        publish(sock, "test.live")
        assert next_event(again)["seq"] == last + 1


def test_resume_filters_the_replay_by_types(daemon: DaemonProcess) -> None:
    sock = daemon.socket_path
    with RawPeer(sock) as peer:
        start = subscribe(peer)
    publish(sock, "test.other", count=2)
    wanted = publish(sock, "test.wanted")
    publish(sock, "test.other")
    with RawPeer(sock) as peer:
        resumed = subscribe(
            peer, types=["test.wanted"], after_seq=start["seq"], epoch=start["epoch"]
        )
    assert [e["seq"] for e in resumed["events"]] == [wanted]
    assert resumed["seq"] == wanted + 1


def test_resume_at_the_current_seq_replays_nothing(daemon: DaemonProcess) -> None:
    sock = daemon.socket_path
    seq = publish(sock, "test.x", count=2)
    with RawPeer(sock) as peer:
        epoch = subscribe(peer)["epoch"]
        resumed = subscribe(peer, after_seq=seq, epoch=epoch, types=["test.none"])
    assert resumed == {
        "epoch": epoch,
        "seq": seq,
        "snapshot": None,
        "resync_required": False,
        "events": [],
        "workspaces_next": None,
    }


def test_a_ring_that_no_longer_holds_the_next_event_means_resync(
    small_ring: DaemonProcess,
) -> None:
    sock = small_ring.socket_path
    with RawPeer(sock) as peer:
        start = subscribe(peer)
    publish(sock, "test.x", count=4)
    with RawPeer(sock) as peer:
        # Four events, a ring of four: everything after start["seq"] is still there.
        held = subscribe(peer, after_seq=start["seq"], epoch=start["epoch"])
        assert held["resync_required"] is False and len(held["events"]) == 4
    last = publish(sock, "test.x")
    with RawPeer(sock) as peer:
        # The fifth pushed out the one right after start["seq"]: no sound replay.
        lost = subscribe(peer, after_seq=start["seq"], epoch=start["epoch"])
        assert lost["resync_required"] is True
        assert lost["events"] == []
        assert set(lost["snapshot"]) >= {"projects", "workspaces"}
        assert lost["seq"] == last
        # One later is still held.
        later = subscribe(peer, after_seq=start["seq"] + 1, epoch=start["epoch"])
        assert later["resync_required"] is False and len(later["events"]) == 4


def test_ring_size_zero_makes_every_resume_a_resync() -> None:
    for daemon in _daemon("event_ring_size = 0\n"):
        sock = daemon.socket_path
        seq = publish(sock, "test.x")
        with RawPeer(sock) as peer:
            epoch = subscribe(peer)["epoch"]
            # Nothing missed: that is still provable without a ring.
            assert subscribe(peer, after_seq=seq, epoch=epoch)["resync_required"] is False
            publish(sock, "test.x")
            assert subscribe(peer, after_seq=seq, epoch=epoch)["resync_required"] is True


def test_another_epoch_or_a_seq_from_the_future_means_resync(daemon: DaemonProcess) -> None:
    sock = daemon.socket_path
    seq = publish(sock, "test.x", count=3)
    with RawPeer(sock) as peer:
        epoch = subscribe(peer)["epoch"]
        other = subscribe(peer, after_seq=1, epoch="0" * 16)
        assert other["resync_required"] is True and other["snapshot"] is not None
        assert other["epoch"] == epoch != "0" * 16
        future = subscribe(peer, after_seq=seq + 10, epoch=epoch)
        assert future["resync_required"] is True and future["snapshot"] is not None


def test_a_daemon_restart_is_told_apart_from_a_gap() -> None:
    root = short_tmpdir("xumev-") / "root"
    write_config(root, TEST_METHODS)
    first = DaemonProcess(root).start()
    try:
        publish(first.socket_path, "test.x")
        with RawPeer(first.socket_path) as peer:
            before = subscribe(peer)
            hello = call(peer, "hello", {"protocol": "1.1"}, id_=2)["result"]
            assert hello["epoch"] == before["epoch"]
    finally:
        first.close()
    second = DaemonProcess(root).start()
    try:
        with RawPeer(second.socket_path) as peer:
            hello = call(peer, "hello", {"protocol": "1.1"}, id_=2)["result"]
            # A new run numbers from 1 again: its current seq (0) must not be read as "nothing
            # missed" for a client of the last run.
            after = subscribe(peer, after_seq=0, epoch=before["epoch"])
    finally:
        second.close()
    assert hello["epoch"] != before["epoch"]
    assert after["epoch"] == hello["epoch"]
    assert after["resync_required"] is True and after["snapshot"] is not None


@pytest.mark.parametrize(
    "params",
    [{"after_seq": 3}, {"epoch": "abc"}, {"after_seq": -1, "epoch": "abc"}],
    ids=["seq-without-epoch", "epoch-without-seq", "negative-seq"],
)
def test_resume_params_that_do_not_go_together_are_invalid(
    daemon: DaemonProcess, params: dict[str, Any]
) -> None:
    with RawPeer(daemon.socket_path) as peer:
        answer = call(peer, "events.subscribe", params)
    assert answer["error"]["data"]["kind"] == "invalid_params"


def _publisher(sock: Path, stop: threading.Event, errors: list[BaseException]) -> None:
    """Publish events in many small requests, so they interleave with the subscribes."""
    try:
        with RawPeer(sock) as peer:
            n = 0
            while not stop.is_set():
                n += 1
                call(peer, "test.publish", {"type": "test.flood", "count": 3}, id_=n)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _read_until(peer: RawPeer, seq: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < seq:
        seqs.append(next_event(peer)["seq"])
    return seqs


def test_replay_then_live_is_gap_free_and_duplicate_free_under_concurrent_publishing(
    daemon: DaemonProcess,
) -> None:
    sock = daemon.socket_path
    stop = threading.Event()
    errors: list[BaseException] = []
    thread = threading.Thread(target=_publisher, args=(sock, stop, errors), daemon=True)
    with RawPeer(sock) as first:
        start = subscribe(first)
        thread.start()
        try:
            # Many reconnects while events flow: each resumes from what the last one saw.
            position = start["seq"]
            peers = [first]
            for _ in range(15):
                got = _read_until(peers[-1], position + 1)
                assert got == list(range(position + 1, got[-1] + 1)), "a gap or a duplicate"
                position = got[-1]
                peer = RawPeer(sock)
                peers.append(peer)
                resumed = subscribe(peer, after_seq=position, epoch=start["epoch"])
                assert resumed["resync_required"] is False
                replayed = [e["seq"] for e in resumed["events"]]
                assert replayed == list(range(position + 1, resumed["seq"] + 1))
                position = resumed["seq"]
                # The next live event is the one right after the answer's seq.
                live = next_event(peer)["seq"]
                assert live == position + 1, (live, position)
                position = live
                peers[-2].close()
        finally:
            stop.set()
            thread.join(timeout=30)
            for peer in peers:
                peer.close()
    assert not errors, errors


def test_async_client_resumes_from_its_stream_position(daemon: DaemonProcess) -> None:
    from xum_client import AsyncClient

    sock = daemon.socket_path

    async def first() -> tuple[str, int]:
        async with AsyncClient(socket_path=sock) as client, client.subscribe(["test."]) as events:
            publish(sock, "test.a", count=2)
            got = [await events.__anext__() for _ in range(2)]
            assert [e.type for e in got] == ["test.a", "test.a"]
            assert events.position == got[-1].seq
            return events.epoch, events.position

    epoch, position = anyio.run(first)
    missed = publish(sock, "test.b", count=3)
    publish(sock, "other.c")

    async def again() -> list[tuple[int, int]]:
        async with (
            AsyncClient(socket_path=sock) as client,
            client.subscribe(["test."], after_seq=position, epoch=epoch) as events,
        ):
            assert events.snapshot.resync_required is False
            assert events.snapshot.snapshot is None
            assert events.position == position  # nothing handed out yet
            seen = []
            for _ in range(3):
                event = await events.__anext__()
                seen.append((event.seq, events.position))
            # The last replayed event brings the state to the answer's seq (past other.c).
            assert events.position == events.snapshot.seq == missed + 1
            live = publish(sock, "test.d")
            event = await events.__anext__()
            assert (event.seq, events.position) == (live, live)
            return seen

    seen = anyio.run(again)
    assert [seq for seq, _ in seen] == [missed - 2, missed - 1, missed]
    assert [pos for _, pos in seen[:2]] == [missed - 2, missed - 1]


def test_cli_events_watches_and_resumes(daemon: DaemonProcess) -> None:
    import json
    import subprocess
    import sys

    xum = [str(Path(sys.executable).parent / "xum"), "--socket", str(daemon.socket_path)]
    start = publish(daemon.socket_path, "test.x")
    with RawPeer(daemon.socket_path) as peer:
        epoch = subscribe(peer)["epoch"]
    last = publish(daemon.socket_path, "test.y", count=2)

    def replay(*extra: str, count: int) -> list[str]:
        """The lines of `xum events` resuming after `start`, which must exit 0."""
        resume = ["--after-seq", str(start), "--epoch", epoch, "--count", str(count)]
        done = subprocess.run(
            [*xum, "events", *extra, *resume], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    answer = json.loads(replay("--json", count=2)[0])
    assert answer["resync_required"] is False
    assert [e["seq"] for e in answer["events"]] == [last - 1, last]
    assert replay(count=2)[1].split() == [str(last - 1), "test.y"]
    # --count stops the replay too: one line of the two events missed.
    assert [line.split()[:2] for line in replay(count=1)[1:]] == [[str(last - 1), "test.y"]]
    watcher = subprocess.Popen(
        [*xum, "events", "--after-seq", "0", "--epoch", "other", "--count", "1", "--type", "z."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().startswith("resync required (epoch ")
        # Subscribed (the answer came): the next matching event ends it (--count 1).
        live = publish(daemon.socket_path, "z.live")
        out, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, err
        assert out.split()[:2] == [str(live), "z.live"]
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()


def test_a_second_subscribe_on_one_connection_replaces_the_first(daemon: DaemonProcess) -> None:
    sock = daemon.socket_path
    with RawPeer(sock) as peer:
        first = subscribe(peer, types=["test.a"])
        # Resume on the same connection (to change the types): no event may come twice.
        again = subscribe(peer, types=["test."], after_seq=first["seq"], epoch=first["epoch"])
        assert again["resync_required"] is False
        a = publish(sock, "test.a")
        b = publish(sock, "test.b")
        assert [next_event(peer)["seq"], next_event(peer)["seq"]] == [a, b]
        # A plain subscribe replaces it too: only its types from now on.
        call(peer, "events.subscribe", {"types": ["test.c"]}, id_=3)
        publish(sock, "test.a")
        c = publish(sock, "test.c")
        assert next_event(peer)["seq"] == c


def test_a_replay_too_large_for_a_frame_is_a_resync() -> None:
    # max_frame_bytes 64 KiB: a replay over half of it (32 KiB) is answered with a snapshot.
    for daemon in _daemon("max_frame_bytes = 65536\n"):
        sock = daemon.socket_path
        with RawPeer(sock) as peer:
            start = subscribe(peer)
        publish(sock, "test.big", count=3, pad="x" * 10_000)
        with RawPeer(sock) as peer:
            fits = subscribe(peer, after_seq=start["seq"], epoch=start["epoch"])
            assert fits["resync_required"] is False and len(fits["events"]) == 3
        publish(sock, "test.big", count=1, pad="x" * 10_000)
        with RawPeer(sock) as peer:
            big = subscribe(peer, after_seq=start["seq"], epoch=start["epoch"])
            assert big["resync_required"] is True and big["snapshot"] is not None
            # Filtered by types, the same gap fits again.
            small = subscribe(
                peer, after_seq=start["seq"], epoch=start["epoch"], types=["test.none"]
            )
            assert small["resync_required"] is False and small["events"] == []


def test_the_ring_is_bounded_in_bytes_too() -> None:
    # Room for two events of ~10 kB: a third pushes the oldest out, whatever the count allows.
    for daemon in _daemon("event_ring_bytes = 25000\n"):
        sock = daemon.socket_path
        with RawPeer(sock) as peer:
            start = subscribe(peer)
        last = publish(sock, "test.big", count=3, pad="x" * 10_000)
        with RawPeer(sock) as peer:
            lost = subscribe(peer, after_seq=start["seq"], epoch=start["epoch"])
            assert lost["resync_required"] is True
            held = subscribe(peer, after_seq=last - 2, epoch=start["epoch"])
            assert held["resync_required"] is False
            assert [e["seq"] for e in held["events"]] == [last - 1, last]
