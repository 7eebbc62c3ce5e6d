"""`daemon.status` is answered from kept bytes (daemon_feature.StatusAnswer), `hello` from bytes
built once: neither may ever show a client something older than what it just changed. A real
daemon, real git, a real teardown script, real processes; each change is followed at once by a
status on a connection that has been polling all along (a cache that was never refreshed would
answer what it built first)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from xum_protocol.models.daemon import DaemonStatusResult, HelloResult
from xum_protocol.models.process import PROCESS_BACKGROUND
from xumd.app import App
from xumd.daemon.feature import StatusAnswer
from xumd.processes.managed import Managed
from xumd.processes.supervisor import Supervisor
from xumd.rpc.dispatch import RequestContext
from xumd.system.containment import Containment

from tests.support.gitrepo import make_repo
from tests.support.inproc import installed_app
from tests.support.lifecycle_helpers import commit_scripts, create, failing_teardown, trusted_daemon
from tests.support.peer import NullPeer
from tests.support.wait import until


def test_status_shows_each_change_at_once(tmp_short: Path, root: Path, ctl: Path) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    commit_scripts(repo, teardown=failing_teardown(ctl))
    holder = subprocess.Popen(["sleep", "600"])
    with trusted_daemon(root, repo, "") as (daemon, project), daemon.client() as poller:

        def status() -> dict[str, Any]:
            # Polled twice: the second answer is the kept one, if anything is kept.
            poller.call("daemon.status")
            answer: dict[str, Any] = poller.call("daemon.status")
            return answer

        try:
            # The set-up's own connections are gone once their close is seen: only the poller.
            until(lambda: status()["connections"] == 1, message="set-up connections closed")
            before = status()
            assert before["details"]["processes"]["running"] == 0
            assert before["details"]["processes"]["leases"] == 0
            assert before["details"]["cleanup"]["pending"] == 0

            # Another client connects: counted at once.
            with daemon.client() as other:
                other.call("daemon.status")
                assert status()["connections"] == 2
            until(lambda: status()["connections"] == 1, message="the other client's close seen")
            ws = create(daemon, project["id"], "one")["workspace"]

            # A process started.
            spawned = poller.call(
                "process.spawn",
                {"workspace_id": ws["id"], "kind": "exec", "argv": ["sleep", "600"]},
            )["process"]
            started = status()["details"]["processes"]
            assert started["running"] == 1

            # A lease taken (a running process holds one of its own).
            poller.call(
                "lease.acquire", {"workspace_id": ws["id"], "kind": "editor", "pid": holder.pid}
            )
            assert status()["details"]["processes"]["leases"] == started["leases"] + 1

            # The process stopped.
            poller.call("process.stop", {"process_id": spawned["id"]})
            assert status()["details"]["processes"]["running"] == 0

            # A workspace archived whose teardown fails: its cleanup is queued.
            other_ws = create(daemon, project["id"], "two")["workspace"]
            archived = poller.call("workspace.archive", {"workspace_id": other_ws["id"]})
            assert archived["cleanup"]["status"] == "pending"
            after = status()
            assert after["details"]["cleanup"]["pending"] > 0
            assert after["details"]["cleanup"]["oldest"]["workspace_id"] == other_ws["id"]

            # The clock part is spliced into the kept bytes: it moves with every change.
            assert after["uptime_s"] > before["uptime_s"]
            # And what is kept is what the model writes.
            assert DaemonStatusResult.model_validate(after).model_dump(mode="json") == after
        finally:
            holder.kill()
            holder.wait()


@pytest.fixture
def app(tmp_short: Path) -> Iterator[App]:
    root = tmp_short / "root"
    root.mkdir()
    with installed_app(root) as built:
        yield built


def _answer(app: App, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}}
    reply = app.router.handle_now(message, NullPeer())
    assert isinstance(reply, dict) and "result" in reply, reply
    result: dict[str, Any] = orjson.loads(orjson.dumps(reply["result"]))
    return result


HELLO = {"protocol": "1.0", "client": {"name": "test"}}


def test_hello_lists_a_method_registered_after_its_first_answer(app: App) -> None:
    first = _answer(app, "hello", HELLO)
    assert HelloResult.model_validate(first).capabilities == first["capabilities"]
    assert "daemon.status" in first["capabilities"]
    assert "process.background" in first["capabilities"]

    async def handler(params: Any, ctx: RequestContext) -> Any:
        raise AssertionError("not called")

    # A method of the protocol's table registered late (a feature loaded on first use).
    del app.router.routes["process.background"]
    assert "process.background" not in _answer(app, "hello", HELLO)["capabilities"]
    app.router.add(PROCESS_BACKGROUND, handler)
    assert "process.background" in _answer(app, "hello", HELLO)["capabilities"]


def test_hello_still_negotiates_per_call(app: App) -> None:
    _answer(app, "hello", HELLO)
    reply = app.router.handle_now(
        {"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"protocol": "9.0"}}, NullPeer()
    )
    assert isinstance(reply, dict)
    assert reply["error"]["data"]["kind"] == "protocol_mismatch"


def test_status_provider_change_shows_in_process(app: App) -> None:
    value = {"n": 0}
    app.status_providers["probe"] = lambda: dict(value)
    assert _answer(app, "daemon.status")["details"]["probe"] == {"n": 0}
    assert _answer(app, "daemon.status")["details"]["probe"] == {"n": 0}
    value["n"] = 1
    assert _answer(app, "daemon.status")["details"]["probe"] == {"n": 1}
    app.stopping = True
    assert _answer(app, "daemon.status")["shutting_down"] is True


def _build(uptime_s: float, connections: int, stopping: bool, details: dict[str, Any]) -> Any:
    return DaemonStatusResult(
        pid=1,
        root="/r",
        version="v",
        protocol="1.0",
        started_at=2.5,
        uptime_s=uptime_s,
        connections=connections,
        shutting_down=stopping,
        details=details,
    )


def _build_json(
    uptime_s: float, connections: int, stopping: bool, details: dict[str, Any]
) -> bytes:
    model = _build(uptime_s, connections, stopping, details)
    data: bytes = model.__pydantic_serializer__.to_json(model)
    return data


class _Counted:
    """The builder a StatusAnswer is given, counting how often it is asked to build."""

    def __init__(self) -> None:
        self.builds = 0

    def __call__(
        self, uptime_s: float, connections: int, stopping: bool, details: dict[str, Any]
    ) -> bytes:
        self.builds += 1
        return _build_json(uptime_s, connections, stopping, details)


@pytest.mark.parametrize("uptime_s", [0.0, 0.001, 1.5, 12345.678, 1e16])
def test_status_answer_splices_uptime_exactly(uptime_s: float) -> None:
    build = _Counted()
    answer = StatusAnswer(build)
    # A detail that carries the same key name: only the top-level one is replaced.
    details = {"x": {"uptime_s": 0.0}, "s": '"uptime_s":0.0'}
    answer(99.0, 1, False, details)
    got = answer(uptime_s, 1, False, details).json
    model = _build(uptime_s, 1, False, details)
    assert orjson.loads(got) == orjson.loads(model.__pydantic_serializer__.to_json(model))
    assert build.builds == 1


def test_status_answer_rebuilds_only_when_a_part_changed() -> None:
    build = _Counted()
    answer = StatusAnswer(build)
    answer(1.0, 1, False, {"a": {"n": 1}})
    answer(2.0, 1, False, {"a": {"n": 1}})
    assert build.builds == 1
    for connections, stopping, details in [
        (2, False, {"a": {"n": 1}}),
        (2, True, {"a": {"n": 1}}),
        (2, True, {"a": {"n": 2}}),
        (2, True, {"a": {"n": 2}, "b": {}}),
    ]:
        got = orjson.loads(answer(3.0, connections, stopping, details).json)
        assert (got["connections"], got["shutting_down"], got["details"]) == (
            connections,
            stopping,
            details,
        )
    assert build.builds == 5


def test_containment_status_follows_sweeps_and_escapes() -> None:
    cont = Containment(tag="t")
    assert cont.status()["escaped"] == [] and cont.status()["stopped_at_start"] == 0
    cont.swept += [{"pid": 5}]
    assert cont.status()["stopped_at_start"] == 1
    cont.escaped = [*cont.escaped, {"pid": 6}]
    assert cont.status()["escaped"] == [{"pid": 6}]
    cont.subreaper = True
    assert cont.status()["mechanism"] == "subreaper+marker"


def _managed(process_id: str) -> Managed:
    return Managed(
        id=process_id,
        workspace_id="ws_0000000000000000",
        kind="exec",
        argv=["true"],
        label="true",
        pty=False,
        lease_id=None,
        pid=None,
        pgid=None,
        start_time=None,
        started_at=0.0,
        checkout=Path("/nonexistent"),
    )


def test_processes_summary_follows_every_record_change(app: App) -> None:
    sup = app.find(Supervisor)
    assert sup is not None

    def summary() -> dict[str, Any]:
        details: dict[str, Any] = _answer(app, "daemon.status")["details"]["processes"]
        return details

    assert summary()["running"] == 0
    one = _managed("proc_0000000000000001")
    sup.table.add(one)
    assert summary()["running"] == 1
    one.state = "pending_stop"
    assert (summary()["running"], summary()["pending_stop"]) == (1, 1)
    one.on_daemon_stop = "keep"
    assert summary()["kept_at_stop"] == 1
    one.state = "exited"
    assert (summary()["running"], summary()["pending_stop"]) == (0, 0)
    # A record made before a poll and added after it, while another is pruned: the count of
    # records stays the same, the summary still moves.
    two = _managed("proc_0000000000000002")
    assert summary()["kept_at_stop"] == 1
    sup.table.settings.keep_exited = 0
    sup.table.prune()
    sup.table.add(two)
    assert (summary()["running"], summary()["kept_at_stop"]) == (1, 0)


def test_kept_bytes_answer_the_task_path_alike(app: App) -> None:
    """The task path (`handle`, as batches and a stopping daemon use it) answers the kept bytes
    too, as a plain result when not asked for fragments."""
    message = {"jsonrpc": "2.0", "id": 3, "method": "daemon.status"}
    inline = _answer(app, "daemon.status")

    async def task() -> dict[str, Any] | None:
        return await app.router.handle(message, NullPeer())

    reply = anyio.run(task)
    assert reply is not None and isinstance(reply["result"], dict)
    got = reply["result"]
    assert {k: v for k, v in got.items() if k != "uptime_s"} == {
        k: v for k, v in inline.items() if k != "uptime_s"
    }
