"""Request keys (docs/PROTOCOL.md, "Request keys"): a mutating call named by a key is done once.
A real daemon, a real connection cut after the request went out (tests/support/cutproxy.py),
then the same call again with the same key."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from xum_protocol.request_keys import TTL_S
from xumd.rpc.requestkeys import SWEEP_EVERY_S, RequestKeys
from xumd.store import Store

from tests.support.cutproxy import CuttingProxy
from tests.support.daemon import DaemonProcess
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project
from tests.support.raw import RawPeer
from tests.support.wait import until


def request(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def ask(socket_path: Path, method: str, params: dict[str, Any]) -> dict[str, Any]:
    with RawPeer(socket_path, timeout=60) as peer:
        peer.send_json(request(method, params))
        answer: dict[str, Any] = peer.read(60)
        return answer


def cut_call(proxy_dir: Path, daemon: DaemonProcess, method: str, params: dict[str, Any]) -> None:
    """Send the call through a proxy that closes the connection once it forwarded it: the
    daemon has the request, the client never sees an answer."""
    proxy = CuttingProxy(proxy_dir / "p.sock", daemon.socket_path, method.encode())
    with proxy, RawPeer(proxy.listen, timeout=30) as peer:
        peer.send_json(request(method, params))
        assert proxy.cut.wait(10)
        with pytest.raises((AssertionError, ConnectionResetError)):
            peer.read(30)  # EOF: the answer never came


def named(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = daemon.call("workspace.list")["workspaces"]
    return [w for w in listed if w["name"] == name]


def test_create_cut_after_send_then_retried_with_its_key_is_one_workspace(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    params = {"project_id": project["id"], "name": "a", "request_key": "create-a-1"}
    cut_call(tmp_short, daemon, "workspace.create", params)
    until(lambda: [w for w in named(daemon, "a") if w["state"] == "active"], message="created")
    again = ask(daemon.socket_path, "workspace.create", params)
    assert "result" in again, again
    found = named(daemon, "a")
    assert len(found) == 1
    assert again["result"]["workspace"]["id"] == found[0]["id"]
    assert again["result"]["workspace"]["state"] == "active"
    # Answered from the record: the same bytes each time, and nothing ran again.
    assert ask(daemon.socket_path, "workspace.create", params)["result"] == again["result"]
    assert "rpc.request_key_answered" in daemon.log_text()
    # Without the key the same create is what it always was: a second one, refused.
    unkeyed = {k: v for k, v in params.items() if k != "request_key"}
    assert ask(daemon.socket_path, "workspace.create", unkeyed)["error"]["data"]["kind"] == (
        "conflict"
    )


def test_a_repeat_while_the_first_runs_waits_for_its_answer(tmp_short: Path, repo: Path) -> None:
    holds = tmp_short / "holds"
    point = "workspace.create.hold"
    daemon = DaemonProcess(tmp_short / "root", env=hold_env(point, holds)).start()
    try:
        project = add_project(daemon, repo)
        params = {"project_id": project["id"], "name": "w", "request_key": "wait-1"}
        cut_call(tmp_short, daemon, "workspace.create", params)
        wait_held(point, holds)
        answers: list[dict[str, Any]] = []
        repeat = threading.Thread(
            target=lambda: answers.append(ask(daemon.socket_path, "workspace.create", params))
        )
        repeat.start()
        until(lambda: "rpc.request_key_waiting" in daemon.log_text(), message="the repeat waits")
        assert not answers  # the first is held: the repeat waits for it
        release(point, holds)
        repeat.join(60)
        assert answers and "result" in answers[0], answers
        found = named(daemon, "w")
        assert [w["id"] for w in found] == [answers[0]["result"]["workspace"]["id"]]
    finally:
        daemon.close()


def test_the_same_key_with_other_params_or_another_method_is_invalid_params(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    first = {"project_id": project["id"], "name": "p", "request_key": "k-1"}
    created = ask(daemon.socket_path, "workspace.create", first)["result"]
    other = ask(daemon.socket_path, "workspace.create", {**first, "name": "q"})["error"]
    assert other["data"]["kind"] == "invalid_params"
    assert other["data"]["first_method"] == "workspace.create"
    assert "workspace.create at " in other["message"] and "other params" in other["message"]
    archive = {"workspace_id": created["workspace"]["id"], "request_key": "k-1"}
    elsewhere = ask(daemon.socket_path, "workspace.archive", archive)["error"]
    assert elsewhere["data"]["kind"] == "invalid_params"
    assert elsewhere["data"]["first_method"] == "workspace.create"
    assert named(daemon, "q") == []
    assert (
        daemon.call("workspace.get", {"workspace_id": created["workspace"]["id"]})["workspace"][
            "state"
        ]
        == "active"
    )


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "é", 7])
def test_a_malformed_key_is_refused(daemon: DaemonProcess, key: object) -> None:
    answer = ask(daemon.socket_path, "project.add", {"path": "/nonexistent", "request_key": key})
    assert answer["error"]["data"]["kind"] == "invalid_params"
    assert "request_key" in answer["error"]["message"]


def test_a_read_takes_no_key(daemon: DaemonProcess) -> None:
    answer = ask(daemon.socket_path, "workspace.list", {"request_key": "k"})
    assert answer["error"]["data"]["kind"] == "invalid_params"


def test_archive_repeated_with_its_key_answers_the_first_archive(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    ws = ask(daemon.socket_path, "workspace.create", {"project_id": project["id"], "name": "r"})
    params = {"workspace_id": ws["result"]["workspace"]["id"], "request_key": "arch-1"}
    first = ask(daemon.socket_path, "workspace.archive", params)
    assert first["result"]["workspace"]["state"] == "archived"
    again = ask(daemon.socket_path, "workspace.archive", params)
    assert again["result"] == first["result"]  # not `invalid_state`: it is the same call


def test_an_error_with_no_settler_releases_the_key(daemon: DaemonProcess, repo: Path) -> None:
    params = {"path": str(repo / "missing"), "request_key": "add-1"}
    assert ask(daemon.socket_path, "project.add", params)["error"]["data"]["kind"] != (
        "invalid_params"
    )
    added = ask(daemon.socket_path, "project.add", {**params, "path": str(repo)})
    assert "result" in added, added  # the key was free again: other params are a new call


def test_keys_expire_and_are_swept(tmp_short: Path) -> None:
    now = [1_000_000.0]
    store = Store(tmp_short / "state.db")
    store.migrate()
    keys = RequestKeys(store, clock=lambda: now[0])
    running = keys.start("old", "workspace.create", "h", durable=True)
    keys.answered("old", running, b'{"x":1}')
    keys.finish("old", running, None)
    assert keys.recorded("old") is not None
    now[0] += TTL_S + 1
    assert keys.recorded("old") is None  # expired: not answered, swept or not
    keys.finish("new", keys.start("new", "workspace.create", "h", durable=True), None)
    left = {r["request_key"] for r in store.all("SELECT request_key FROM request_keys")}
    assert left == {"new"}  # the sweep at a keyed call deleted the expired record
    now[0] += SWEEP_EVERY_S / 2
    keys.finish("third", keys.start("third", "workspace.create", "h", durable=True), None)
    assert keys.recorded("new") is not None and keys.recorded("third") is not None
    store.close()


def test_a_method_of_a_feature_built_at_its_first_request_takes_a_key(
    daemon: DaemonProcess,
) -> None:
    params = {"request_key": "gc-1"}
    first = ask(daemon.socket_path, "gc.run", params)
    assert "result" in first, first
    assert ask(daemon.socket_path, "gc.run", params)["result"] == first["result"]
    assert "rpc.request_key_answered" in daemon.log_text()
