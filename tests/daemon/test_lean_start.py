"""The lean start (xumd.startup.lazy_start): a root with nothing to recover serves before its
feature graph is loaded, and the graph is built at the first request that needs it.

- before READY=1 an empty root's daemon has imported neither psutil nor any feature of the graph,
  and still swept for leftovers (containment); `hello` lists every method all the same;
- the first request of a feature method builds the graph once (concurrent first requests
  included), runs the graph's startup steps then, and is answered as on a full start, bad params
  with the same error;
- a failed build is answered `internal`, and the next request builds it;
- a root with a record builds the graph at once after READY=1 (tests/daemon/
  test_start_with_records.py: what waits for it); so does one with a record in any table,
  anything in a state directory, or a state directory that cannot be listed (fail closed);
- `daemon.status` shows the unbuilt features as the built ones show an empty root;
- the method table is what the graph registers; the root lock's start time is psutil's;
- what is written without the protocol's models (hello, daemon.status, containment's status)
  is what the models write (the method names: tests/protocol/test_method_table.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from xum_protocol.errors import ErrorKind
from xum_protocol.methods import METHODS
from xum_protocol.models.daemon import ContainmentStatus, DaemonStatusResult, HelloResult
from xumd.app import App
from xumd.base.config import DaemonConfig
from xumd.base.paths import RootPaths
from xumd.startup import lazy_start
from xumd.startup.composition import install_features
from xumd.store import Store
from xumd.system import rootlock
from xumd.system.containment import Containment
from xumd.system.platform import linux

from tests.daemon.test_startup_cost import HEAVY_BEFORE_READY, heavy, imported
from tests.support.daemon import DaemonProcess
from tests.support.raw import RawPeer, first_calls_together
from tests.support.raw import ask as raw_ask
from tests.support.wait import until


def ask(daemon: DaemonProcess, method: str, params: Any = None, request_id: int = 1) -> Any:
    return raw_ask(daemon.socket_path, method, params, request_id)


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    found = []
    for line in daemon.log_text().splitlines():
        if f'"{name}"' in line and line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == name:
                found.append(record)
    return found


def logged_ready(daemon: DaemonProcess, count: int = 1) -> str:
    """The log once it holds `count` `daemon.ready` lines (READY=1 is sent just before)."""
    until(lambda: daemon.log_text().count('"daemon.ready"') >= count, message="daemon.ready")
    return daemon.log_text()


def steps(daemon: DaemonProcess) -> list[str]:
    return [record["step"] for record in events(daemon, "daemon.startup_step")]


def test_an_empty_root_is_ready_without_the_feature_graph(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        log = logged_ready(daemon)
        before_ready = imported(log[: log.index('"daemon.ready"')])
        assert "xumd.startup.composition" in before_ready  # the measurement saw the start-up
        assert heavy(before_ready, HEAVY_BEFORE_READY) == []
        # The containment sweep still ran before serving; the graph's passes did not.
        assert steps(daemon) == ["containment.sweep"]
        assert events(daemon, "daemon.start_shape")[0]["lean"] is True
        capabilities = ask(daemon, "hello", {"protocol": "1.0"})["result"]["capabilities"]
        assert set(capabilities) == set(METHODS)
        # The first feature request builds the graph, its startup steps run then.
        assert ask(daemon, "project.list", {})["result"] == {"projects": []}
        assert steps(daemon) == [
            "containment.sweep",
            "lifecycle.pool",
            "processes.adopt",
            "recovery",
        ]
        assert len(events(daemon, "lazy_start.features_built")) == 1
        assert "xumd.lifecycle.service" in imported(daemon.log_text())
    finally:
        daemon.close()


def test_bad_params_of_a_first_request_are_refused_as_on_a_full_start(tmp_short: Path) -> None:
    bad = {"project": 5, "nonsense": True}
    lean = DaemonProcess(tmp_short / "lean").start()
    whole_root = tmp_short / "whole"
    (whole_root / "workspaces").mkdir(parents=True)
    (whole_root / "workspaces" / "left").mkdir()  # something to recover: a full start
    whole = DaemonProcess(whole_root, log_level="info").start()
    try:
        assert events(whole, "daemon.start_shape")[0]["lean"] is False
        refused = ask(lean, "workspace.create", bad)["error"]
        assert refused["data"]["kind"] == ErrorKind.INVALID_PARAMS.value
        assert refused == ask(whole, "workspace.create", bad)["error"]
    finally:
        lean.close()
        whole.close()


def test_concurrent_first_requests_build_the_graph_once(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        methods = ["project.list", "workspace.list", "process.list", "lease.list"] * 2
        replies = first_calls_together(daemon.socket_path, methods)
        assert all("result" in reply for reply in replies), replies
        assert len(events(daemon, "lazy_start.features_built")) == 1
        assert steps(daemon).count("recovery") == 1
    finally:
        daemon.close()


def test_a_failed_build_is_internal_and_the_next_request_builds(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info", env={"XUM_FAULT": "lazy_start.build_fails"})
    daemon.start()
    try:
        failed = ask(daemon, "project.list", {})["error"]
        assert failed["data"]["kind"] == ErrorKind.INTERNAL.value
        assert "project.list is unavailable: the daemon's features failed" in failed["message"]
        assert len(events(daemon, "lazy_start.build_failed")) == 1
        assert ask(daemon, "daemon.status")["result"]["pid"] == daemon.pid
        assert ask(daemon, "project.list", {})["result"] == {"projects": []}
        assert steps(daemon).count("recovery") == 1
    finally:
        daemon.close()


def test_a_root_with_a_record_builds_its_graph_at_once_after_ready(
    root: Path, tmp_short: Path
) -> None:
    project = tmp_short / "proj"
    project.mkdir()
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        ask(daemon, "project.add", {"path": str(project)})
        assert "result" in ask(daemon, "project.list", {})
    finally:
        daemon.close()
    again = DaemonProcess(root, log_level="info").start()  # READY=1, then reconciled
    try:
        assert events(again, "daemon.start_shape")[-1] == {
            **events(again, "daemon.start_shape")[-1],
            "lean": False,
            "at_once": True,
            "why": "records in projects",
        }
        # Built by the start-up itself, not by a request: the passes ran after READY=1.
        log = logged_ready(again, 2)
        second = log.rindex('"daemon.start_shape"')
        ready = log.index('"daemon.ready"', second)
        assert ready < log.index('"step": "recovery"', second)
        assert events(again, "lazy_start.features_built")[-1]["caller"] == "start-up"
        assert len(ask(again, "project.list", {})["result"]["projects"]) == 1
    finally:
        again.close()


def test_idle_status_and_snapshot_are_what_the_built_features_show(root: Path) -> None:
    daemon = DaemonProcess(root).start()
    try:
        before = daemon.call("daemon.status")["details"]
        snapshots = [ask(daemon, "events.subscribe", {})["result"]["snapshot"]]
        snapshots.append(ask(daemon, "events.subscribe", {"snapshot_limit": 5})["result"])
        daemon.call("project.list")
        after = daemon.call("daemon.status")["details"]
        assert ask(daemon, "events.subscribe", {})["result"]["snapshot"] == snapshots[0]
        paged = ask(daemon, "events.subscribe", {"snapshot_limit": 5})["result"]
        assert paged["snapshot"] == snapshots[1]["snapshot"]
        assert paged["workspaces_next"] == snapshots[1]["workspaces_next"]
        assert list(snapshots[0]) == ["projects", "workspaces", "processes"]
    finally:
        daemon.close()
    for details in (before, after):
        details["recovery"]["last_pass"].pop("ms")
        details.pop("fds")  # `open` is sampled
    assert list(before) == list(after)
    assert before == after


@pytest.mark.parametrize("test_methods", [False, True])
def test_the_method_table_is_what_the_graph_registers(tmp_short: Path, test_methods: bool) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        config = DaemonConfig(enable_test_methods=test_methods)
        whole = App(RootPaths(tmp_short), config, store)
        install_features(whole)
        lean = App(RootPaths(tmp_short), config, store)
        install_features(lean, lean=True)
        pending = lean.router.pending()
        # Pending: the protocol's methods the daemon's own features did not register, then
        # the graph's test methods.
        own = set(lean.router.routes) - set(pending)
        expected = sorted(set(METHODS) - own)
        assert expected and own & set(METHODS)  # both sides registered something
        expected += lazy_start.FEATURE_TEST_METHODS if test_methods else ()
        assert pending == expected
        assert set(lean.router.routes) == set(whole.router.routes)
        for name in pending:
            route = whole.router.routes[name]
            # A pending route is refused while stopping and runs in a task: so do the real ones.
            assert not route.allowed_while_stopping and not route.inline, name
    finally:
        store.close()


def test_the_lock_files_start_time_is_psutils() -> None:
    code = (
        "import psutil; from xumd.system import rootlock;"
        "print(rootlock.own_create_time() == psutil.Process().create_time())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True"], done.stderr
    assert rootlock.own_create_time() == psutil.Process().create_time()
    assert linux.kernel_boot_time() == psutil.boot_time()


def test_hello_and_status_bytes_are_what_their_models_write(root: Path) -> None:
    daemon = DaemonProcess(root).start()
    try:
        daemon.call("project.list")  # every feature's details, built
        with RawPeer(daemon.socket_path, timeout=30) as peer:
            for method, params, model in [
                ("hello", {"protocol": "1.0"}, HelloResult),
                ("daemon.status", {}, DaemonStatusResult),
            ]:
                peer.send_json({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
                line = peer.read_line(timeout=30)
                assert line is not None
                start = line.index(b'"result":') + len(b'"result":')
                written = line[start : line.rindex(b"}")]
                parsed = model.model_validate_json(written)
                assert parsed.__pydantic_serializer__.to_json(parsed) == written, method
    finally:
        daemon.close()


def test_containment_status_is_what_its_model_dumps() -> None:
    cont = Containment(tag="t", cgroup_setting="/nowhere", cgroup_unusable="not absolute")
    cont.swept += [{"pid": 5}]
    cont.escaped = [{"pid": 6, "marker": "m", "argv": ["a", "b"]}]
    cont.runs_without_cgroup = 2
    status = cont.status()
    assert ContainmentStatus.model_validate(status).model_dump(mode="json") == status
    assert list(status) == list(ContainmentStatus.model_fields)


HELLOS: list[Any] = [
    None,
    {},
    [],
    ["1.0"],
    {"protocol": "1.0"},
    {"protocol": "1.5", "client": {"name": "xum", "version": "0.1"}},
    {"protocol": "1.5", "client": {"name": "xum"}},
    {"protocol": "1.5", "client": None},
    {"protocol": "1.5", "client": {"name": ""}},
    {"protocol": "1.5", "client": {"name": "n" * 200, "version": "v" * 200}},
    {"protocol": "1.5", "client": {"name": "n" * 201}},
    {"protocol": "1.5", "client": {"name": "x", "version": "v" * 201}},
    {"protocol": "1.5", "client": {"name": "x", "extra": 1}},
    {"protocol": "1.5", "client": {"name": 5}},
    {"protocol": "1.5", "client": "xum"},
    {"protocol": "1" * 32},
    {"protocol": "1" * 33},
    {"protocol": 1.3},
    {"protocol": "1.5", "other": True},
    {"client": {"name": "x"}},
]


@pytest.mark.parametrize("raw", HELLOS, ids=[repr(h)[:50] for h in HELLOS])
def test_lean_params_take_only_what_the_models_take(raw: Any) -> None:
    from pydantic import ValidationError
    from xum_protocol.models.daemon import EmptyParams, HelloParams
    from xumd.daemon.feature import lean_empty, lean_hello

    for lean, model in ((lean_hello, HelloParams), (lean_empty, EmptyParams)):
        got = lean(raw)
        if got is None:
            continue  # the model decides: nothing to compare
        try:
            if isinstance(raw, list):
                checked = model.model_validate(dict(zip(model.model_fields, raw, strict=False)))
            else:
                checked = model.model_validate(raw or {})
        except ValidationError as exc:
            raise AssertionError(
                f"{lean.__name__} took {raw!r}, which {model.__name__} refuses"
            ) from exc
        if model is HelloParams:
            assert got.protocol == checked.protocol  # type: ignore[union-attr, attr-defined]


def test_hello_and_status_load_no_model(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        hello = {"protocol": "1.5", "client": {"name": "t", "version": "1"}}
        assert ask(daemon, "hello", hello)["result"]["pid"] == daemon.pid
        for _ in range(3):
            assert ask(daemon, "daemon.status")["result"]["pid"] == daemon.pid
        assert heavy(imported(daemon.log_text()), ("pydantic", "xum_protocol.models")) == []
        # Another shape goes to the model: refused with its words.
        refused = ask(daemon, "hello", {"protocol": "1.5", "client": {"name": ""}})["error"]
        assert refused["data"]["kind"] == ErrorKind.INVALID_PARAMS.value
        assert refused["data"]["errors"][0]["loc"] == ["client", "name"]
        assert "pydantic" in imported(daemon.log_text())
    finally:
        daemon.close()


def _why_not_lean(root: Path, prepare: Any) -> str | None:
    """`why_not_lean` of a migrated root after `prepare(root, store)` changed it."""
    root.mkdir(parents=True, exist_ok=True)
    store = Store(root / "state.db")
    store.migrate()
    try:
        prepare(root, store)
        return lazy_start.why_not_lean(App(RootPaths(root), DaemonConfig(), store))
    finally:
        store.close()


def _project_row(root: Path, store: Store) -> None:
    store.execute(
        "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
        " VALUES ('prj_0000000000000001', 'p', '/nowhere', 1, 1, 'directory', 0, 0)"
    )


def _table_added_later(root: Path, store: Store) -> None:
    store.execute("CREATE TABLE later_feature (id TEXT)")
    store.execute("INSERT INTO later_feature VALUES ('x')")


def _file_where_trash_goes(root: Path, store: Store) -> None:
    (root / "trash").write_text("not a directory")


def _left_in_processes(root: Path, store: Store) -> None:
    (root / "processes" / "p_1").mkdir(parents=True)


@pytest.mark.parametrize(
    ("prepare", "reason"),
    [
        (_project_row, "records in projects"),
        (_table_added_later, "records in later_feature"),
        (_file_where_trash_goes, "trash: Not a directory"),
        (_left_in_processes, "entries in processes"),
    ],
)
def test_what_makes_a_root_start_whole(tmp_short: Path, prepare: Any, reason: str) -> None:
    """Fail closed: a record in any table (one a later version adds too), anything in a state
    directory, or a state directory that cannot be listed means the full start, recovery
    before serving; only a root with nothing at all is lean."""
    assert _why_not_lean(tmp_short / "empty", lambda root, store: None) is None
    assert _why_not_lean(tmp_short / "root", prepare) == reason
