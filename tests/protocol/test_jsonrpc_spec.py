"""Every example of the JSON-RPC 2.0 specification (section 7), verbatim, against a real daemon.

https://www.jsonrpc.org/specification#examples. The daemon serves the spec's example methods
(subtract, sum, update, notify_hello, notify_sum, get_data) with `enable_test_methods = true`.
Each exchange is socat-style: send the frame, half-close, read every answer until the daemon
closes; so "nothing returned" is checked exactly (no line at all before EOF).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.raw import RawPeer, exchange


@pytest.fixture(scope="module")
def spec_daemon() -> Iterator[DaemonProcess]:
    tmp = short_tmpdir()
    root = tmp / "root"
    write_config(root, "enable_test_methods = true\n")
    proc = DaemonProcess(root, log_level="info").start()
    yield proc
    proc.close()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def sock(spec_daemon: DaemonProcess) -> Path:
    return spec_daemon.socket_path


def one(sock: Path, frame: str) -> Any:
    answers = exchange(sock, frame + "\n")
    assert len(answers) == 1, answers
    return answers[0]


def assert_error(response: Any, code: int, request_id: Any) -> None:
    assert isinstance(response, dict), response
    assert set(response) == {"jsonrpc", "error", "id"}, response
    assert response["jsonrpc"] == "2.0"
    assert response["id"] == request_id
    assert response["error"]["code"] == code, response
    assert isinstance(response["error"]["message"], str) and response["error"]["message"]


def by_id(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # "The Response objects being returned from a batch call MAY be returned in any order."
    return sorted(responses, key=lambda r: (r.get("id") is not None, json.dumps(r.get("id"))))


# -- rpc call with positional parameters ------------------------------------------------------


def test_positional_params(sock: Path) -> None:
    assert one(sock, '{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}') == {
        "jsonrpc": "2.0",
        "result": 19,
        "id": 1,
    }
    assert one(sock, '{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}') == {
        "jsonrpc": "2.0",
        "result": -19,
        "id": 2,
    }


# -- rpc call with named parameters -----------------------------------------------------------


def test_named_params(sock: Path) -> None:
    frame = '{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}'  # noqa: E501
    assert one(sock, frame) == {"jsonrpc": "2.0", "result": 19, "id": 3}
    frame = '{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}'  # noqa: E501
    assert one(sock, frame) == {"jsonrpc": "2.0", "result": 19, "id": 4}


# -- a Notification ---------------------------------------------------------------------------


def test_notifications_get_no_response(sock: Path) -> None:
    assert exchange(sock, '{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}\n') == []
    assert exchange(sock, '{"jsonrpc": "2.0", "method": "foobar"}\n') == []


# -- rpc call of non-existent method ----------------------------------------------------------


def test_non_existent_method(sock: Path) -> None:
    assert_error(one(sock, '{"jsonrpc": "2.0", "method": "foobar", "id": "1"}'), -32601, "1")


# -- rpc call with invalid JSON ---------------------------------------------------------------


def test_invalid_json(sock: Path) -> None:
    frame = '{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]'
    assert_error(one(sock, frame), -32700, None)


# -- rpc call with invalid Request object ----------------------------------------------------


def test_invalid_request_object(sock: Path) -> None:
    assert_error(one(sock, '{"jsonrpc": "2.0", "method": 1, "params": "bar"}'), -32600, None)


# -- rpc call Batch, invalid JSON -------------------------------------------------------------


def test_batch_invalid_json(sock: Path) -> None:
    frame = (
        '[ {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        '{"jsonrpc": "2.0", "method" ]'
    )
    assert_error(one(sock, frame), -32700, None)


# -- rpc call with an empty Array -------------------------------------------------------------


def test_empty_array(sock: Path) -> None:
    assert_error(one(sock, "[]"), -32600, None)


# -- rpc call with an invalid Batch (but not empty) -------------------------------------------


def test_invalid_batch_of_one(sock: Path) -> None:
    answer = one(sock, "[1]")
    assert isinstance(answer, list) and len(answer) == 1
    assert_error(answer[0], -32600, None)


# -- rpc call with invalid Batch --------------------------------------------------------------


def test_invalid_batch_of_three(sock: Path) -> None:
    answer = one(sock, "[1,2,3]")
    assert isinstance(answer, list) and len(answer) == 3
    for item in answer:
        assert_error(item, -32600, None)


# -- rpc call Batch ---------------------------------------------------------------------------


def test_mixed_batch(sock: Path) -> None:
    frame = """[
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
    ]"""
    answer = one(sock, frame.replace("\n", " "))
    assert isinstance(answer, list) and len(answer) == 5
    answers = by_id(answer)
    # ordered by id: null, "1", "2", "5", "9"
    assert_error(answers[0], -32600, None)
    assert answers[1] == {"jsonrpc": "2.0", "result": 7, "id": "1"}
    assert answers[2] == {"jsonrpc": "2.0", "result": 19, "id": "2"}
    assert_error(answers[3], -32601, "5")
    assert answers[4] == {"jsonrpc": "2.0", "result": ["hello", 5], "id": "9"}


# -- rpc call Batch (all notifications) -------------------------------------------------------


def test_all_notification_batch_returns_nothing(sock: Path) -> None:
    frame = (
        '[{"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},'
        '{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}]'
    )
    assert exchange(sock, frame + "\n") == []


# -- edges the examples imply -----------------------------------------------------------------


def test_batch_of_one_request_answers_with_an_array(sock: Path) -> None:
    answer = one(sock, '[{"jsonrpc": "2.0", "method": "subtract", "params": [3, 1], "id": 7}]')
    assert answer == [{"jsonrpc": "2.0", "result": 2, "id": 7}]


@pytest.mark.parametrize(
    "frame",
    [
        '{"method": "subtract", "params": [1, 1], "id": 1}',  # no jsonrpc member
        '{"jsonrpc": "1.0", "method": "subtract", "params": [1, 1], "id": 1}',
        '{"jsonrpc": "2.0", "method": "subtract", "params": 5, "id": 1}',
        '{"jsonrpc": "2.0", "method": "subtract", "params": null, "id": 1}',
    ],
)
def test_invalid_request_with_a_readable_id_keeps_it(sock: Path, frame: str) -> None:
    assert_error(one(sock, frame), -32600, 1)


@pytest.mark.parametrize("bad_id", ["true", "{}", "[1]"])
def test_invalid_id_is_answered_with_null(sock: Path, bad_id: str) -> None:
    frame = f'{{"jsonrpc": "2.0", "method": "subtract", "params": [1, 1], "id": {bad_id}}}'
    assert_error(one(sock, frame), -32600, None)


def test_null_id_is_a_request_not_a_notification(sock: Path) -> None:
    assert one(sock, '{"jsonrpc": "2.0", "method": "get_data", "id": null}') == {
        "jsonrpc": "2.0",
        "result": ["hello", 5],
        "id": None,
    }


def test_invalid_params_and_internal_error(sock: Path) -> None:
    response = one(sock, '{"jsonrpc": "2.0", "method": "subtract", "params": {"x": 1}, "id": 8}')
    assert_error(response, -32602, 8)
    assert response["error"]["data"]["kind"] == "invalid_params"
    assert response["error"]["data"]["errors"]
    response = one(sock, '{"jsonrpc": "2.0", "method": "test.fail", "id": 9}')
    assert_error(response, -32603, 9)
    assert "RuntimeError" not in response["error"]["message"]  # no internals leak


def test_notification_errors_are_silent(sock: Path) -> None:
    frames = (
        '{"jsonrpc": "2.0", "method": "subtract", "params": {"x": 1}}\n'
        '{"jsonrpc": "2.0", "method": "test.fail"}\n'
        '{"jsonrpc": "2.0", "method": "no.such"}\n'
    )
    assert exchange(sock, frames) == []


def test_oversize_batch_is_refused(sock: Path) -> None:
    batch = "[" + ",".join(["1"] * 1001) + "]"
    assert_error(one(sock, batch), -32600, None)


def test_pipelined_requests_each_answered(sock: Path) -> None:
    frames = "".join(
        json.dumps({"jsonrpc": "2.0", "method": "subtract", "params": [i, 1], "id": i}) + "\n"
        for i in range(50)
    )
    answers = exchange(sock, frames)
    assert sorted(a["id"] for a in answers) == list(range(50))
    assert all(a["result"] == a["id"] - 1 for a in answers)


def test_final_frame_without_newline_is_answered(sock: Path) -> None:
    answers = exchange(sock, '{"jsonrpc": "2.0", "method": "get_data", "id": "tail"}')
    assert answers == [{"jsonrpc": "2.0", "result": ["hello", 5], "id": "tail"}]


def test_blank_lines_are_ignored(sock: Path) -> None:
    with RawPeer(sock) as peer:
        peer.send('\n\n  \n{"jsonrpc": "2.0", "method": "get_data", "id": 1}\n')
        assert peer.read()["id"] == 1
