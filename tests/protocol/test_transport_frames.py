"""The asyncio transport over the sans-IO frame reader: frames split anywhere, many
frames per read, the cap, a peer that reads nothing, a peer gone mid-frame, and handlers answered
inline (in the read callback, without a task), including ones that raise or wrongly await.

The reader is checked byte by byte in memory; the rest runs a real `Server` on a real Unix
socket inside the test's event loop, with its own small router (so the inline handlers can
observe where they run)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from xum_protocol import framing
from xum_protocol.errors import ErrorKind
from xum_protocol.framing import FrameReader
from xum_protocol.models.base import Params
from xumd.base.config import DaemonConfig
from xumd.base.errors import XumError
from xumd.rpc import server as server_module
from xumd.rpc.dispatch import RequestContext, Router, _validation_errors
from xumd.rpc.server import Server, bind_socket
from xumd.rpc.transport import WRITE_HIGH, FrameProtocol

from tests.support.daemon import short_tmpdir
from tests.support.peer import NullPeer
from tests.support.wait import wait_for

# -- the sans-IO reader ----------------------------------------------------------------------

STREAM = b'{"a":1}\n{"b":"x\\ny"}\n\n[1,2]\n{"c":3}\n'
FRAMES = [b'{"a":1}', b'{"b":"x\\ny"}', b"", b"[1,2]", b'{"c":3}']


def test_a_stream_split_at_every_byte_gives_the_same_frames() -> None:
    for cut in range(len(STREAM) + 1):
        reader = FrameReader(64)
        got = reader.feed(STREAM[:cut]) + reader.feed(STREAM[cut:])
        assert got == FRAMES, cut
        assert reader.finish() is None
    reader = FrameReader(64)
    one_by_one = [frame for i in range(len(STREAM)) for frame in reader.feed(STREAM[i : i + 1])]
    assert one_by_one == FRAMES and reader.finish() is None  # nothing held back


def test_many_frames_in_one_read() -> None:
    frames = [orjson.dumps({"id": i}) for i in range(5000)]
    reader = FrameReader(64)
    assert reader.feed(b"\n".join(frames) + b"\n") == frames


def test_the_cap_is_exact_however_the_frame_is_split() -> None:
    at_cap = b"x" * 10
    for cut in range(12):
        reader = FrameReader(10)
        data = at_cap + b"\n"
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == [at_cap]
        assert not reader.oversize
    for cut in range(13):
        reader = FrameReader(10)
        data = b"ok\n" + b"y" * 11 + b"\nnext\n"
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        # The frames before the oversize one are served; nothing after it.
        assert got == [b"ok"], (cut, got)
        assert reader.oversize and reader.ended
        assert reader.feed(b"more\n") == [] and reader.finish() is None


def test_without_a_newline_the_held_bytes_are_capped() -> None:
    held = FrameReader(10)
    assert held.feed(b"12345") == [] and held.feed(b"67890") == [] and not held.oversize
    assert held.feed(b"\n") == [b"1234567890"]  # at the cap, the held bytes make one frame
    reader = FrameReader(10)
    assert reader.feed(b"12345") == [] and reader.feed(b"67890") == [] and not reader.oversize
    assert reader.feed(b"1") == [] and reader.oversize
    # One byte past the cap ends the stream: nothing more is held or returned.
    assert reader.feed(b"\n") == [] and reader.finish() is None


def test_the_last_frame_may_lack_its_newline() -> None:
    reader = FrameReader(64)
    assert reader.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert reader.finish() == b'{"b"'
    assert reader.finish() is None


# -- a real server on a real socket ----------------------------------------------------------


class _P(BaseModel):
    n: int = 0


class _R(BaseModel):
    n: int
    task: bool


def _router(seen: list[bool]) -> Router:
    router = Router()

    async def echo(params: _P, ctx: RequestContext) -> _R:
        # In the read callback there is no current task; in the task path there is one.
        in_task = asyncio.current_task() is not None
        seen.append(in_task)
        return _R(n=params.n, task=in_task)

    async def boom(params: _P, ctx: RequestContext) -> _R:
        raise RuntimeError("inline bug")

    async def refused(params: _P, ctx: RequestContext) -> _R:
        raise XumError(ErrorKind.NOT_FOUND, "no such thing")

    async def awaits(params: _P, ctx: RequestContext) -> _R:
        await anyio.sleep(0)  # wrong: registered inline
        return _R(n=params.n, task=True)

    router.add("t.inline", echo, _P, inline=True)
    router.add("t.task", echo, _P)
    router.add("t.boom", boom, _P, inline=True)
    router.add("t.refused", refused, _P, inline=True)
    router.add("t.awaits", awaits, _P, inline=True)
    return router


@asynccontextmanager
async def _serving(router: Router, **config: Any) -> AsyncIterator[tuple[Path, Server]]:
    path = short_tmpdir() / "s"
    server = Server(router, DaemonConfig(**config))
    server.attach(bind_socket(path))
    async with anyio.create_task_group() as conns, anyio.create_task_group() as work:
        conns.start_soon(server.serve, conns, work)
        try:
            yield path, server
        finally:
            conns.cancel_scope.cancel()
            work.cancel_scope.cancel()


def _req(method: str, id_: int, n: int = 0) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method, "id": id_, "params": {"n": n}}) + b"\n"


async def _read_answers(reader: asyncio.StreamReader, count: int) -> list[Any]:
    with anyio.fail_after(30):
        return [orjson.loads(await reader.readline()) for _ in range(count)]


def _run(test: Callable[[], Any]) -> None:
    anyio.run(test)


def test_inline_handlers_run_without_a_task_and_others_in_one() -> None:
    seen: list[bool] = []

    async def main() -> None:
        async with _serving(_router(seen)) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req("t.inline", 1, 5) + _req("t.task", 2, 6))
            answers = {a["id"]: a for a in await _read_answers(reader, 2)}
            assert answers[1]["result"] == {"n": 5, "task": False}
            assert answers[2]["result"] == {"n": 6, "task": True}
            writer.close()

    _run(main)
    assert sorted(seen) == [False, True]


def test_an_inline_handler_that_raises_is_answered_and_the_connection_lives() -> None:
    async def main() -> None:
        async with _serving(_router([])) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req("t.boom", 1) + _req("t.refused", 2) + _req("t.awaits", 3))
            writer.write(_req("t.inline", 4, 9))
            answers = {a["id"]: a for a in await _read_answers(reader, 4)}
            assert answers[1]["error"]["data"]["kind"] == "internal"
            assert answers[2]["error"]["data"]["kind"] == "not_found"
            assert answers[2]["error"]["message"] == "no such thing"
            # A handler marked inline that awaits is stopped and answered, never left hanging.
            assert answers[3]["error"]["data"]["kind"] == "internal"
            assert answers[4]["result"] == {"n": 9, "task": False}
            writer.close()

    _run(main)


def test_a_frame_split_across_reads_at_every_byte() -> None:
    frame = _req("t.inline", 7, 3)

    async def main() -> None:
        async with _serving(_router([])) as (path, _server):
            for cut in range(1, len(frame)):
                reader, writer = await asyncio.open_unix_connection(str(path))
                writer.write(frame[:cut])
                await writer.drain()
                await anyio.wait_all_tasks_blocked()  # the daemon has read the first part
                writer.write(frame[cut:])
                (answer,) = await _read_answers(reader, 1)
                assert answer["result"] == {"n": 3, "task": False}, cut
                writer.close()

    _run(main)


def test_many_frames_in_one_write_all_answered() -> None:
    count = 2000

    async def main() -> None:
        async with _serving(_router([])) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path), limit=2**20)
            blob = b"".join(_req("t.inline" if i % 2 else "t.task", i, i) for i in range(count))
            writer.write(blob)
            answers = await _read_answers(reader, count)
            assert sorted(a["id"] for a in answers) == list(range(count))
            assert all(a["result"]["n"] == a["id"] for a in answers)
            writer.close()

    _run(main)


def test_a_frame_over_the_cap_in_one_read_with_frames_before_it() -> None:
    async def main() -> None:
        async with _serving(_router([]), max_frame_bytes=1024) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req("t.inline", 1) + b"x" * 2000 + b"\n" + _req("t.inline", 2))
            first, refusal = await _read_answers(reader, 2)
            assert first["id"] == 1
            assert refusal["error"]["data"] == {"kind": "frame_too_large", "limit": 1024}
            with anyio.fail_after(10):
                assert await reader.read() == b""  # closed; the frame after it is not served
            writer.close()

    _run(main)


def test_a_peer_that_reads_nothing_is_slowed_then_answered_in_full() -> None:
    """Inline answers go straight to the transport only while it has room: a client that
    pipelines without reading fills the socket, the transport's buffer (to its high-water
    mark), then the outbox; its frames then wait for the reader task and the daemon stops
    reading it (its send blocks). Others are served meanwhile, and once it reads, every answer
    is there."""
    count = 20_000
    blob = b"".join(_req("t.inline", i) for i in range(count))

    async def main() -> None:
        async with _serving(_router([]), write_queue_messages=16, write_queue_bytes=4096) as (
            path,
            server,
        ):
            flood, sender = _flood(path, blob)
            conn = await wait_for(lambda: next(iter(server.connections), None))
            proto = conn._proto
            # The daemon stops reading it (without back-pressure it would read on and buffer
            # every answer), while the sender still has most of its blob to send.
            await wait_for(lambda: proto._read_paused, 30)
            assert sender.is_alive()
            assert proto.transport is not None
            assert proto.transport.get_write_buffer_size() <= WRITE_HIGH + len(blob) // count * 2
            assert len(conn._outbox) <= 16
            # Another client is served while that one is stuck.
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req("t.inline", 2, 2))
            (answer,) = await _read_answers(reader, 1)
            assert answer["result"]["n"] == 2
            writer.close()

            # Now it reads: every request it sent is answered once, none lost.
            ids = await anyio.to_thread.run_sync(_answer_ids, flood, count)
            sender.join(30)
            assert sorted(ids) == list(range(count))
            flood.close()

    _run(main)


def _flood(path: Path, blob: bytes) -> tuple[socket.socket, threading.Thread]:
    """A client that sends `blob` from a thread of its own and reads nothing (yet)."""
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    flood.connect(str(path))
    flood.settimeout(60)
    sender = threading.Thread(target=flood.sendall, args=(blob,), daemon=True)
    sender.start()
    return flood, sender


def _answer_ids(peer: socket.socket, count: int) -> list[int]:
    """The ids of the next `count` answers read on `peer` (blocking: run it in a thread)."""
    ids: list[int] = []
    buf = b""
    while len(ids) < count:
        chunk = peer.recv(1 << 20)
        assert chunk, "closed before every answer came"
        buf += chunk
        *lines, buf = buf.split(b"\n")
        ids.extend(orjson.loads(line)["id"] for line in lines)
    return ids


class _Counted(FrameProtocol):
    """The daemon's transport protocol, counting what the socket is handed: reads that
    carried frames, writes to the transport, and the transport's buffer after each write."""

    instances: list[_Counted] = []

    def __init__(self, max_frame: int) -> None:
        super().__init__(max_frame)
        self.reads_with_frames = 0
        self.writes = 0
        self.written = 0
        self.most_buffered = 0
        _Counted.instances.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.Transport)
        write = transport.write

        def counted(data: bytes | bytearray | memoryview) -> None:
            write(data)
            self.writes += 1
            self.written += len(data)
            self.most_buffered = max(self.most_buffered, transport.get_write_buffer_size())

        transport.write = counted  # type: ignore[method-assign]

    def data_received(self, data: bytes) -> None:
        self.reads_with_frames += data.count(b"\n") > 0
        super().data_received(data)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[_Counted]:
    monkeypatch.setattr(server_module, "FrameProtocol", _Counted)
    _Counted.instances = []
    return _Counted.instances


def test_pipelined_inline_answers_leave_in_one_write_per_read(counted: list[_Counted]) -> None:
    """Frames that arrive in one read are answered with one write, in the order they came."""
    count = 50
    blob = b"".join(_req("t.inline", i, i) for i in range(count))

    async def main() -> None:
        async with _serving(_router([])) as (path, _server):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(blob)
            answers = await _read_answers(reader, count)
            assert [a["id"] for a in answers] == list(range(count))
            assert all(a["result"] == {"n": a["id"], "task": False} for a in answers)
            (proto,) = counted
            assert proto.reads_with_frames >= 1
            assert proto.writes == proto.reads_with_frames
            writer.close()

    _run(main)


def test_joined_answers_keep_the_transport_bound_for_a_peer_that_reads_nothing(
    counted: list[_Counted],
) -> None:
    """Joining does not let a read's answers pile up past the high-water mark: the transport
    holds at most WRITE_HIGH plus two answers (the one that crossed it, and one the writer task
    hands over before it waits), as when each answer was written on its own; a read of 256 KiB
    of frames would otherwise be answered with one write of about as much."""
    count = 20_000
    blob = b"".join(_req("t.inline", i) for i in range(count))

    async def main() -> None:
        async with _serving(_router([]), write_queue_messages=16, write_queue_bytes=4096) as (
            path,
            server,
        ):
            flood, sender = _flood(path, blob)
            conn = await wait_for(lambda: next(iter(server.connections), None))
            await wait_for(lambda: conn._proto._read_paused, 30)
            (proto,) = counted
            answer_size = len(blob) // count
            assert WRITE_HIGH < proto.most_buffered <= WRITE_HIGH + 2 * answer_size
            assert proto.writes * 10 < proto.written // answer_size  # joined, not one each

            ids = await anyio.to_thread.run_sync(_answer_ids, flood, count)
            sender.join(30)
            # Every answer, once (past the pause they took the task path: completion order).
            assert sorted(ids) == list(range(count))
            flood.close()

    _run(main)


def test_a_peer_gone_mid_frame_harms_nobody() -> None:
    async def main() -> None:
        async with _serving(_router([])) as (path, server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req("t.inline", 1) + b'{"jsonrpc": "2.0", "meth')
            (answer,) = await _read_answers(reader, 1)
            assert answer["id"] == 1
            writer.transport.abort()  # gone, half a frame sent
            await wait_for(lambda: not server.connections)
            other_reader, other = await asyncio.open_unix_connection(str(path))
            other.write(_req("t.task", 2, 2))
            (answer,) = await _read_answers(other_reader, 1)
            assert answer["result"] == {"n": 2, "task": True}
            other.close()

    _run(main)


@pytest.mark.parametrize("method", ["t.inline", "t.task"])
def test_a_final_frame_without_newline_is_answered_after_half_close(method: str) -> None:
    async def main() -> None:
        async with _serving(_router([])) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_req(method, 1, 4).rstrip(b"\n"))
            writer.write_eof()
            (answer,) = await _read_answers(reader, 1)
            assert answer["result"]["n"] == 4
            with anyio.fail_after(10):
                assert await reader.read() == b""
            writer.close()

    _run(main)


def test_status_samples_the_open_descriptor_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """daemon.status lists /proc/self/fd at most every OPEN_COUNT_TTL_S (a clock mock: the
    listing itself is real)."""
    from xumd.system import fdlimits

    now = [1000.0]
    monkeypatch.setattr(fdlimits.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(fdlimits, "_open_sample", (float("-inf"), 0))
    limits = fdlimits.plan(1024, 64)
    first = limits.as_status()["open"]
    extra = [socket.socket() for _ in range(5)]
    try:
        assert limits.as_status()["open"] == first  # within the interval: the sample
        now[0] += fdlimits.OPEN_COUNT_TTL_S
        assert limits.as_status()["open"] == first + 5  # then counted again
    finally:
        for sock in extra:
            sock.close()
        limits.close()


# -- params' NUL scan skipped for frames that cannot hold a NUL -------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


@given(_json_values)
def test_a_frame_said_nul_free_decodes_to_no_nul(value: Any) -> None:
    frame = orjson.dumps(value)
    if framing.nul_free(frame):
        assert not _has_nul(framing.decode(frame))
    if _has_nul(value):
        assert not framing.nul_free(frame)


def test_a_raw_nul_inside_a_string_is_not_json() -> None:
    # What nul_free rests on: the only way to a NUL in a decoded string is the escape.
    for frame in (b'{"a":"x\x00y"}', b'{"a\x00":1}'):
        with pytest.raises(ValueError):
            framing.decode(frame)


class _Text(Params):
    text: str = ""
    more: list[str] = []


def _text_router() -> Router:
    router = Router()

    async def echo(params: _Text, ctx: RequestContext) -> _Text:
        return params

    router.add("t.inline", echo, _Text, inline=True)
    router.add("t.task", echo, _Text)
    return router


def _expected_refusal(params: dict[str, Any]) -> dict[str, Any]:
    """What the dict path (the model's own NUL check) answers for these params."""
    with pytest.raises(ValidationError) as caught:
        _Text.model_validate(params)
    return {"errors": _validation_errors(caught.value), "kind": "invalid_params"}


@pytest.mark.parametrize("method", ["t.inline", "t.task"])
def test_nul_in_params_is_refused_as_before_on_either_path(method: str) -> None:
    cases: list[tuple[Any, dict[str, Any]]] = [
        (1, {"text": "a\0b"}),
        (2, {"more": ["ok", "x\0"]}),
        ("id\0", {"text": "\0"}),
    ]

    async def main() -> None:
        async with _serving(_text_router()) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            for id_, params in cases:
                message = {"jsonrpc": "2.0", "method": method, "id": id_, "params": params}
                writer.write(orjson.dumps(message) + b"\n")
                (answer,) = await _read_answers(reader, 1)
                assert answer["id"] == id_
                assert answer["error"]["data"] == _expected_refusal(params)
            # In a batch too (the batch's frame is what is looked at).
            batch = [
                {"jsonrpc": "2.0", "method": method, "id": 9, "params": {"text": "ok"}},
                {"jsonrpc": "2.0", "method": method, "id": 10, "params": {"text": "n\0"}},
            ]
            writer.write(orjson.dumps(batch) + b"\n")
            (answers,) = await _read_answers(reader, 1)
            by_id = {a["id"]: a for a in answers}
            assert by_id[9]["result"]["text"] == "ok"
            assert by_id[10]["error"]["data"] == _expected_refusal({"text": "n\0"})
            writer.close()

    _run(main)


def test_params_without_nul_pass_even_where_the_frame_has_the_escape() -> None:
    async def main() -> None:
        async with _serving(_text_router()) as (path, _server):
            reader, writer = await asyncio.open_unix_connection(str(path))
            # A NUL in the id (not params), and a literal backslash-u0000 in the text.
            for id_, text in (("id\0", "fine"), (3, "a\\u0000b")):
                message = {"jsonrpc": "2.0", "method": "t.inline", "id": id_}
                writer.write(orjson.dumps({**message, "params": {"text": text}}) + b"\n")
                (answer,) = await _read_answers(reader, 1)
                assert answer == {"jsonrpc": "2.0", "id": id_, "result": {"text": text, "more": []}}
            writer.close()

    _run(main)


def test_the_skip_is_only_for_frames_said_nul_free() -> None:
    router = _text_router()
    message = {"jsonrpc": "2.0", "method": "t.inline", "id": 1, "params": {"text": "a\0"}}
    refused = router.handle_now(message, NullPeer())
    assert isinstance(refused, dict) and refused["error"]["data"]["kind"] == "invalid_params"
    # The flag is the transport's promise that no NUL can be there: it is what skips the scan.
    trusted = router.handle_now(message, NullPeer(), nul_free=True)
    assert isinstance(trusted, dict) and "result" in trusted


class _Nothing(Params):
    pass


def test_params_without_fields_are_validated_once_and_still_refuse_extras() -> None:
    """`daemon.status` and its kind take no params: the one valid instance is made once (it
    holds nothing a request could leave behind); anything given is still refused."""
    got: list[Any] = []
    router = Router()

    async def take(params: _Nothing, ctx: RequestContext) -> _R:
        got.append(params)
        return _R(n=len(got), task=False)

    router.add("t.none", take, _Nothing, inline=True)
    router.add("t.none.task", take, _Nothing)
    base = {"jsonrpc": "2.0", "id": 1}
    for extra in ({}, {"params": {}}, {"params": []}, {"params": None}):
        message = {**base, "method": "t.none", **extra}
        if extra == {"params": None}:  # not an object nor an array: the envelope refuses it
            refused = router.handle_now(message, NullPeer())
            assert isinstance(refused, dict) and refused["error"]["code"] == -32600
            continue
        answer = router.handle_now(message, NullPeer())
        assert isinstance(answer, dict) and "result" in answer
    anyio.run(router.handle, {**base, "method": "t.none.task"}, NullPeer())
    assert len(got) == 4 and all(params is got[0] for params in got)
    for params in ({"x": 1}, [1]):
        refused = router.handle_now({**base, "method": "t.none", "params": params}, NullPeer())
        assert isinstance(refused, dict) and refused["error"]["data"]["kind"] == "invalid_params"
