"""Garbage never crashes the daemon, and every request with an id gets exactly one response.

Hypothesis interleaves garbage frames (random bytes, invalid UTF-8, deep nesting, huge numbers,
JSON that is not a request, a partial last line) with real requests carrying unique ids, on one
connection, and checks the answers after the daemon closes it.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.raw import exchange


@pytest.fixture(scope="module")
def fuzz_daemon() -> Iterator[DaemonProcess]:
    tmp = short_tmpdir()
    root = tmp / "root"
    write_config(root, "enable_test_methods = true\n")
    proc = DaemonProcess(root, log_level="info").start()
    yield proc
    proc.close()
    shutil.rmtree(tmp, ignore_errors=True)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


def _nested(depth: int, opener: bytes, closer: bytes) -> bytes:
    return opener * depth + closer * depth


garbage = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b'"\xff\xfe"', b'{"a": "\xed\xa0\x80"}', b"\xc3\x28", b"\x00\x00"]),
    st.integers(min_value=1, max_value=5000).map(lambda n: _nested(n, b"[", b"]")),
    st.integers(min_value=1, max_value=3000).map(lambda n: _nested(n, b'{"a":', b"}")[:-1]),
    st.integers(min_value=1, max_value=2000).map(lambda n: b"9" * n),
    st.sampled_from([b"1e999", b"-1e400", b"[1e308, -1e308]", b"NaN", b"Infinity"]),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda method, params: json.dumps(
            {"jsonrpc": "2.0", "method": method, "params": params}
        ).encode(),
        st.text(max_size=20),
        json_values,
    ),
)

METHODS = ["subtract", "sum", "get_data", "no.such", "daemon.status", "hello", "update"]


@st.composite
def requests(draw: st.DrawFn, index: int) -> tuple[str, bytes]:
    request_id = f"req-{index}"
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": draw(st.sampled_from(METHODS)),
        "id": request_id,
    }
    params = draw(st.one_of(st.none(), st.lists(json_values, max_size=4), json_values))
    if params is not None:
        message["params"] = params
    return request_id, json.dumps(message).encode()


@st.composite
def sessions(draw: st.DrawFn) -> tuple[bytes, list[str], bool]:
    frames: list[bytes] = []
    ids: list[str] = []
    for index in range(draw(st.integers(min_value=1, max_value=12))):
        if draw(st.booleans()):
            request_id, frame = draw(requests(index))
            ids.append(request_id)
            frames.append(frame + b"\n")
        else:
            frames.append(draw(garbage) + b"\n")
    partial = draw(st.booleans())
    if partial:
        frames.append(draw(garbage))  # a last line without its newline
    return b"".join(frames), ids, partial


def _response_ids(answers: list[Any]) -> list[Any]:
    found: list[Any] = []
    for answer in answers:
        items = answer if isinstance(answer, list) else [answer]
        for item in items:
            assert isinstance(item, dict) and item.get("jsonrpc") == "2.0", item
            assert ("result" in item) != ("error" in item), item
            found.append(item.get("id"))
    return found


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(session=sessions())
def test_garbage_never_crashes_and_each_request_is_answered_once(
    fuzz_daemon: DaemonProcess, session: tuple[bytes, list[str], bool]
) -> None:
    data, ids, _partial = session
    answers = exchange(fuzz_daemon.socket_path, data, timeout=20)
    counts = Counter(i for i in _response_ids(answers) if isinstance(i, str) and i in ids)
    assert counts == Counter(ids), (counts, ids)
    assert fuzz_daemon.proc is not None and fuzz_daemon.proc.poll() is None, fuzz_daemon.log_text()[
        -3000:
    ]


def test_daemon_still_serves_after_the_fuzzing(fuzz_daemon: DaemonProcess) -> None:
    assert fuzz_daemon.call("daemon.status")["pid"] == fuzz_daemon.pid
    log = fuzz_daemon.log_text()
    assert "Traceback" not in log and "daemon.failed" not in log
