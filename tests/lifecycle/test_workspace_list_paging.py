"""`workspace.list` at scale: rows straight to JSON, and paging.

In process: the direct path (lifecycle/listing.py) answers byte for byte what the model path
(`WorkspaceInfo` per row, dumped) answers on the same rows, including rows the direct path leaves
to the model (odd stored JSON of other features, paths `Path()` normalises, bad columns), under
every filter and at every page size; every row a real daemon wrote through the API (a copy of its
store) is built by the direct path, none by the model path; it runs a fixed number of SQL
statements whatever the row count; the answer validates against the protocol's models; a page
stays under its byte budget; the order is the order rows were written (a stepped-back clock
hides nothing), and a database of the earlier (creation time, id) order keeps it, with its
cursors. With a real daemon: pages
concatenate to the full listing under the filters, a create, archive, unarchive, rename or
removal between pages neither repeats nor skips another workspace, nor does a clock stepped back
(libfaketime), bad `limit`/`after` are `invalid_params`, and the Python clients and `xum ws ls`
fetch every page.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from click.testing import CliRunner
from xum_client.aio import AsyncClient
from xum_client.cli import cli as cli_main
from xum_client.errors import XumRpcError
from xum_client.sync import Client
from xum_protocol.cursor import list_cursor, parse_list_cursor
from xum_protocol.models.workspace import WorkspaceListParams, WorkspaceListResult
from xumd.app import App
from xumd.base.config import DaemonConfig
from xumd.base.paths import RootPaths
from xumd.cleanup import obligations
from xumd.lifecycle import listing
from xumd.lifecycle.service import WorkspaceService
from xumd.startup.composition import install_features
from xumd.store import Store
from xumd.store.db import _migrations

from tests.cli.test_daemon import xum
from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import make_repo
from tests.support.inproc import installed_app
from tests.support.lifecycle_helpers import add_project, commit_scripts, create, rpc_error
from tests.support.wait import until

P1, P2 = "prj_00000000000000a1", "prj_00000000000000a2"
T0 = 1_764_000_000.25


# -- in process: the direct path against the model path ----------------------------------------


@pytest.fixture
def app(tmp_short: Path) -> Iterator[App]:
    with installed_app(tmp_short) as app:
        yield app


def _ws(store: Store, n: int, **cols: Any) -> str:
    ws_id = cols.pop("id", f"ws_{n:016x}")
    row: dict[str, Any] = {
        "id": ws_id,
        "project_id": P1,
        "name": f"w{n}",
        "runtime": "worktree",
        "path": f"/srv/ws/w{n}",
        "state": "active",
        "incarnation": f"inc{n}",
        "setup_status": "none",
        "created_at": T0 + n,
        "updated_at": T0 + n + 0.5,
        **cols,
    }
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    store.execute(f"INSERT INTO workspaces ({names}) VALUES ({marks})", list(row.values()))
    return str(ws_id)


def _ob(store: Store, ws_id: str, n: int, **cols: Any) -> None:
    row: dict[str, Any] = {
        "id": f"ob_{ws_id}_{n}",
        "workspace_id": ws_id,
        "project_id": P1,
        "kind": "trash",
        "seq": n,
        "path": f"/srv/trash/{ws_id}",
        "incarnation": "inc",
        "state": "pending",
        "attempts": 0,
        "next_attempt_at": T0 + 99,
        "created_at": T0 + n,
        "updated_at": T0 + n,
        **cols,
    }
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    store.execute(f"INSERT INTO cleanup_obligations ({names}) VALUES ({marks})", list(row.values()))


def _hostile_mix(store: Store) -> int:
    """Rows of every shape the listing meets; returns how many workspaces."""
    with store.transaction():
        _projects(store)
        n = 0

        def ws(**cols: Any) -> str:
            nonlocal n
            n += 1
            return _ws(store, n, **cols)

        plain = ws(branch="xum/w1", base="abc123")
        for position, port in ((1, 41002), (0, 41001), (2, 41000)):  # stored out of order
            store.execute(
                "INSERT INTO workspace_ports (port, workspace_id, position, allocated_at)"
                " VALUES (?, ?, ?, ?)",
                (port, plain, position, T0),
            )
        store.execute(
            "INSERT INTO workspace_env (workspace_id, env) VALUES (?, ?)",
            (plain, json.dumps({"B": "2", "A": "x y", "U": "é😀"})),
        )
        bad_env = ws(runtime="directory")
        store.execute("INSERT INTO workspace_env VALUES (?, 'not json')", (bad_env,))
        list_env = ws()
        store.execute("INSERT INTO workspace_env VALUES (?, '[1, 2]')", (list_env,))
        odd_env = ws()
        store.execute("INSERT INTO workspace_env VALUES (?, ?)", (odd_env, '{"N": 1, "Z": null}'))
        archived = ws(state="archived", snapshot_ref="refs/xum/a", snapshot_commit="c0ffee")
        _ob(store, archived, 0, state="completed", attempts=1, incarnation="old")
        _ob(store, archived, 1, state="completed", attempts=2)
        _ob(store, archived, 2, kind="reclaim", state="completed", detail='{"bytes": 4096}')
        removing = ws(state="removing")
        _ob(store, removing, 0, kind="teardown", state="pending", last_error="busy", attempts=3)
        _ob(store, removing, 1, state="pending", next_attempt_at=T0 + 5)
        failed = ws(state="archived")
        _ob(store, failed, 0, state="failed", reason="gone", last_error="EIO")
        reclaim_only = ws(state="archived")
        _ob(store, reclaim_only, 0, kind="reclaim", state="pending")
        ws(snapshot_ref="refs/xum/b")  # a ref without a commit: no snapshot
        ws(setup_status="ok", setup_output=json.dumps({"output": "done\n", "commands": 2}))
        ws(setup_status="failed", setup_output="plain text, not JSON")
        ws(setup_status="untrusted", setup_output="[1]")
        ws(setup_status="running", setup_output="")
        # Stored JSON the direct path builds, and near misses it must leave to the model: a
        # type the model would convert (an int where it dumps a float, a bool or a float where
        # it wants an int), a key the model would keep as an extra, a value out of its set.
        # (A setup outcome the model refuses fails the model path itself: not listed here.)
        job = {"pid": 7, "argv": ["sleep", "60"], "signal": "SIGTERM", "ran_s": 0.5}
        for detail in (
            {"output": "", "error": None, "config_hash": None, "hint": None, "commands": 0},
            {"output": "x\n", "commands": 1, "leftovers": [job]},
            {"error": "setup was interrupted"},
            {"status": "ok", "output": "the column's status wins"},
            {"leftovers": [{**job, "ran_s": None}, {**job, "signal": "SIGKILL"}]},
            {"leftovers": [{**job, "ran_s": 1}]},
            {"leftovers": [{**job, "extra": 1}]},
            {"commands": True},
            {"commands": 2.0},
            {"output": "", "extra": 1},
        ):
            ws(setup_status="failed", setup_output=json.dumps(detail))
        ws(setup_status="ok", setup_output="null")
        ws(setup_status="ok", setup_output='{"output": "a", "output": "b"}')
        kept = {
            "status": "completed",
            "attempts": 0,
            "next_attempt_at": None,
            "last_error": None,
            "reason": None,
            "reclaim": {"status": "completed", "bytes": 58},
            "obligations": [],
        }
        for status in (
            kept,
            {**kept, "status": "pending", "next_attempt_at": T0 + 9, "obligations": ["ob_1"]},
            {**kept, "reclaim": None, "reason": "only a trash entry", "last_error": "EIO"},
            {**kept, "next_attempt_at": 5},
            {**kept, "reclaim": {"status": "completed", "bytes": 1.5}},
            {**kept, "reclaim": {"status": "done"}},
            {**kept, "reclaim": {"bytes": 1}},
            {**kept, "reclaim": [1]},
            {**kept, "obligations": [1]},
            {**kept, "attempts": False},
            {**kept, "extra": 1},
        ):
            ws(state="archived", last_cleanup=json.dumps(status))
        ws(state="archived", last_cleanup="[]")
        outcome = {
            "status": "archived",
            "attempts": 1,
            "error": None,
            "process_id": "proc_0000000000000001",
            "at": T0 + 3,
            "next_attempt_at": None,
        }
        for found in (outcome, {"status": "gave_up"}, {**outcome, "at": 5}, {**outcome, "x": 1}):
            ws(auto_archive="on_agent_exit", auto_archive_outcome=json.dumps(found))
        ws(auto_archive="on_agent_exit", auto_archive_outcome='{"attempts": 1}')
        ws(state="archived", last_cleanup=json.dumps({"status": "completed", "attempts": 1}))
        ws(state="archived", last_cleanup="{")
        ws(state="archived", last_cleanup=json.dumps({"status": "weird"}))
        with_both = ws(state="archived", last_cleanup=json.dumps({"status": "failed"}))
        _ob(store, with_both, 0, state="completed")
        ws(
            auto_archive="on_agent_exit",
            auto_archive_outcome=json.dumps({"status": "retrying", "attempts": 2}),
        )
        ws(auto_archive="on_agent_exit", auto_archive_outcome="nope")
        ws(auto_archive="on_agent_exit")
        ws(path="/srv/ws/trailing/")
        ws(path="//srv//double")
        ws(path="/srv/./dot")
        ws(path="relative/path")
        ws(path="/")
        ws(name="é-ünï", path="/srv/ws/é ünï")
        ws(state="creating", interrupted=1, interrupted_reason="daemon stopped mid-create")
        ws(state="restoring", handle_id="h_1", owner_workspace_id=plain)
        ws(state="archiving", created_at=T0 + 1000, updated_at=T0 + 1000)
        # Same creation time, ids out of order: the listing keeps the order they were written
        # in, and a cursor between them must hold.
        ws(id="ws_00000000000000fe", created_at=T0 + 500)
        ws(id="ws_00000000000000fd", created_at=T0 + 500)
        ws(id="ws_00000000000000ff", created_at=T0 + 500, project_id=P2)
        ws(created_at=1_764_000_100, project_id=P2)  # an integer time (REAL column)
        for state in ("active", "archived"):
            ws(project_id=P2, state=state)
        return n


def _model_bytes(svc: WorkspaceService, project_id: str | None, state: str | None) -> bytes:
    """The answer the way every release before 1.2 built it."""
    result = WorkspaceListResult(workspaces=svc.list_workspaces(project_id, state))
    return orjson.dumps(result.model_dump(mode="json"))


def _direct(svc: WorkspaceService, **params: Any) -> dict[str, Any]:
    return svc.list_json(WorkspaceListParams.model_validate(params))


FILTERS = [
    {},
    {"project_id": P1},
    {"project_id": P2},
    {"state": "archived"},
    {"state": "active"},
    {"project_id": P2, "state": "archived"},
    {"state": "restoring"},
]


@pytest.mark.parametrize("filters", FILTERS, ids=json.dumps)
def test_direct_listing_is_the_model_listing_byte_for_byte(
    app: App, filters: dict[str, Any]
) -> None:
    count = _hostile_mix(app.store)
    svc = app.get(WorkspaceService)
    direct = _direct(svc, **filters)
    assert direct["next"] is None
    expected = _model_bytes(svc, filters.get("project_id"), filters.get("state"))
    assert orjson.dumps(direct["workspaces"]) == orjson.dumps(orjson.loads(expected)["workspaces"])
    if not filters:
        assert len(direct["workspaces"]) == count
    # The answer is what the protocol says: it validates as the result model (the schema is
    # generated from it) and nothing is lost or reshaped doing so.
    answer = orjson.dumps(direct)
    parsed = WorkspaceListResult.model_validate_json(answer)
    assert orjson.dumps(parsed.model_dump(mode="json")) == answer


def test_every_page_size_concatenates_to_the_listing(app: App) -> None:
    count = _hostile_mix(app.store)
    svc = app.get(WorkspaceService)
    for filters in FILTERS:
        full = _direct(svc, **filters)["workspaces"]
        for limit in range(1, count + 2):
            got: list[dict[str, Any]] = []
            after: str | None = None
            pages = 0
            while True:
                params = {**filters, "limit": limit, **({"after": after} if after else {})}
                page = _direct(svc, **params)
                pages += 1
                assert len(page["workspaces"]) <= limit
                got += page["workspaces"]
                after = page["next"]
                if after is None:
                    break
                assert len(page["workspaces"]) == limit, "a short small page must end it"
            assert got == full, (filters, limit)
            assert pages == max(1, -(-len(full) // limit)), "no empty trailing page"


def _projects(store: Store) -> None:
    for pid, name in ((P1, "one"), (P2, "two")):
        store.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
            " VALUES (?, ?, ?, 1, 1, 'git', ?, ?)",
            (pid, name, f"/srv/{name}", T0, T0),
        )


def _common_rows(store: Store, first: int, count: int) -> None:
    """Workspaces of the everyday shape: ports, environment, some with obligations."""
    with store.transaction():
        for n in range(first, first + count):
            ws_id = _ws(store, n, state="archived" if n % 3 else "active")
            if n % 3:
                _ob(store, ws_id, 0, state="completed")
                _ob(store, ws_id, 1, kind="reclaim", state="completed")
            store.execute('INSERT INTO workspace_env VALUES (?, \'{"A": "1"}\')', (ws_id,))
            store.execute(
                "INSERT INTO workspace_ports (port, workspace_id, position, allocated_at)"
                " VALUES (?, ?, 0, ?)",
                (20_000 + n, ws_id, T0),
            )


def test_a_page_is_cut_at_its_byte_budget_and_next_continues(app: App) -> None:
    """Workspaces with 64 KiB of environment each (the most `workspace.create` takes): a page
    of 10,000 would be megabytes over a client's frame cap; it stops near PAGE_BYTES instead,
    with `next`, and the pages still concatenate to the listing."""
    with app.store.transaction():
        _projects(app.store)
        big = json.dumps({"V": "x" * (64 * 1024 - 16)})
        for n in range(1, 161):
            ws_id = _ws(app.store, n)
            app.store.execute("INSERT INTO workspace_env VALUES (?, ?)", (ws_id, big))
    svc = app.get(WorkspaceService)
    full = _direct(svc)["workspaces"]
    assert len(full) == 160 and full[0]["env"]["V"]
    got: list[dict[str, Any]] = []
    after: str | None = None
    sizes: list[int] = []
    while True:
        page = _direct(svc, limit=10_000, **({"after": after} if after else {}))
        sizes.append(len(orjson.dumps(page)))
        got += page["workspaces"]
        after = page["next"]
        if after is None:
            break
    assert got == full
    assert len(sizes) == 3, sizes  # 160 rows of ~64 KiB: 10 MiB in pages of at most 4 MiB
    assert max(sizes) <= listing.PAGE_BYTES + 128 * 1024, sizes


def test_a_page_counts_its_cleanup_errors_against_its_byte_budget(app: App) -> None:
    """Workspaces whose cleanup is pending with a full diagnostic tail each (a filesystem that
    refuses every removal): the status shows ~4,000 characters per row that no column of the
    row holds. A page of 10,000 must still stop near PAGE_BYTES (4,500 such rows made one page
    of 18.9 MB, over a client's 16 MiB frame cap), and the pages concatenate to the listing."""
    tail = ("rm: cannot remove 'x': Device or resource busy " * 90)[: obligations.ERROR_LIMIT]
    with app.store.transaction():
        _projects(app.store)
        for n in range(1, 1501):  # ~7.5 MB in all: one page of it passes PAGE_BYTES twice over
            ws_id = _ws(app.store, n, state="removing")
            _ob(app.store, ws_id, 0, state="pending", last_error=tail)
    svc = app.get(WorkspaceService)
    got: list[dict[str, Any]] = []
    after: str | None = None
    sizes: list[int] = []
    while True:
        page = _direct(svc, limit=10_000, **({"after": after} if after else {}))
        sizes.append(len(orjson.dumps(page)))
        got += page["workspaces"]
        after = page["next"]
        if after is None:
            break
    assert got == _direct(svc)["workspaces"] and len(got) == 1500
    assert got[0]["last_cleanup"]["last_error"] == tail
    assert len(sizes) > 1 and max(sizes) <= listing.PAGE_BYTES + 128 * 1024, sizes


def test_listing_runs_a_fixed_number_of_statements(app: App) -> None:
    with app.store.transaction():
        _projects(app.store)
    _common_rows(app.store, 1, 10)
    svc = app.get(WorkspaceService)
    seen: list[str] = []
    app.store._db.set_trace_callback(seen.append)
    try:
        _direct(svc)
        small_count = len(seen)
        _common_rows(app.store, 100, 300)
        seen.clear()
        large = _direct(svc)
        paged = _direct(svc, limit=50)
    finally:
        app.store._db.set_trace_callback(None)
    assert len(large["workspaces"]) == 310 and len(paged["workspaces"]) == 50
    # One statement for the rows, one for the obligations of those that have any, whatever
    # the number of rows (the model path ran three per row).
    assert small_count == 2
    assert len(seen) == 4, seen
    assert orjson.dumps(large) == orjson.dumps(
        {**orjson.loads(_model_bytes(svc, None, None)), "next": None}
    )


# -- rows the API writes: built directly ------------------------------------------------------

_API_CONFIG = (
    "stop_grace_s = 0.5\n"
    "[ports]\ncount = 2\nrange_start = {start}\nrange_end = {end}\n"
    "[cleanup]\nbackoff_initial_s = 3600\nbackoff_max_s = 3600\n"  # a failed step stays pending
    "[processes]\nprobe_interval_s = 0.1\n"
)


def _copy_store(root: Path, into: Path) -> Path:
    """A consistent copy of a running daemon's store (SQLite's backup), as a root of its own."""
    into.mkdir()
    src = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    dst = sqlite3.connect(into / "state.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return into


def test_rows_the_api_writes_are_built_directly(tmp_short: Path) -> None:
    """A real daemon makes a workspace of every shape the API writes (both runtimes; no setup, a
    setup that printed, one that failed, one that left a background job, one not trusted; ports
    and environment; archived with its cleanup steps on record and, a day later, with only the
    status it keeps once they are purged; unarchived; a teardown that keeps failing; an agent's
    exit that archived its workspace). On a copy of its store, `workspace.list` builds every one
    of them directly (the model path is the fallback for odd rows, at ~10x the cost a row), and
    the answer is byte for byte the model path's."""
    if LIBFAKETIME is None:
        pytest.skip("libfaketime not installed (/usr/lib/*/faketime/; Debian package faketime)")
    root = tmp_short / "root"
    start = 30000 + (os.getpid() * 7) % 29000
    write_config(root, _API_CONFIG.format(start=start, end=start + 99))
    clock = tmp_short / "faketime"
    clock.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    plain_repo = make_repo(tmp_short / "plain")
    scripted_repo = make_repo(tmp_short / "scripted")
    setup = [
        "echo hello",
        "echo to stderr >&2",
        f"if [ -f {ctl}/leave ]; then sleep 60 >/dev/null 2>&1 & fi",
        f"test ! -f {ctl}/fail",
    ]
    teardown = f"if [ -f {ctl}/stuck ]; then echo 'still in use' >&2; exit 3; fi"
    commit_scripts(scripted_repo, teardown=teardown, setup=setup)
    untrusted_repo = make_repo(tmp_short / "untrusted")
    commit_scripts(untrusted_repo, teardown="true", setup=["echo never"])
    made: dict[str, str] = {}
    daemon = DaemonProcess(root, env=env).start()
    try:
        plain = add_project(daemon, plain_repo)["id"]
        scripted = add_project(daemon, scripted_repo)["id"]
        daemon.call("project.trust", {"project_id": scripted})
        untrusted = add_project(daemon, untrusted_repo)["id"]

        def ws(label: str, project: str, **extra: Any) -> str:
            made[label] = create(daemon, project, label.replace(" ", "-"), **extra)["workspace"][
                "id"
            ]
            return made[label]

        def archive(label: str) -> None:
            daemon.call("workspace.archive", {"workspace_id": made[label]})

        ws("worktree", plain)
        ws("directory", plain, runtime="directory")
        ws("env", plain, env={"A": "1", "B_2": "ü 😀"})
        ws("setup", scripted)
        ws("setup directory", scripted, runtime="directory")
        ws("untrusted", untrusted)
        (ctl / "fail").touch()
        ws("setup failed", scripted)
        (ctl / "fail").unlink()
        (ctl / "leave").touch()
        ws("setup left a job", scripted)
        (ctl / "leave").unlink()
        for label in ("purged", "purged directory", "unarchived"):
            ws(label, plain, runtime="directory" if "directory" in label else "worktree")
            archive(label)
        daemon.call("workspace.unarchive", {"workspace_id": made["unarchived"]})
        ws("auto-archived", plain, auto_archive="on_agent_exit")
        ws("auto-archive on", plain, auto_archive="on_agent_exit")
        spawn = {"workspace_id": made["auto-archived"], "kind": "agent", "argv": ["true"]}
        daemon.call("process.spawn", spawn)
        until(lambda: _state(daemon, made["auto-archived"]) == "archived", message="auto-archived")
        # Two days on, the next start forgets the finished steps: those archived rows answer
        # from the status they keep.
        clock.write_text("+2d\n")
        daemon.restart()
        until(lambda: not _obligations_of(root, made["purged"]), message="steps purged")
        ws("archived", scripted)
        archive("archived")
        (ctl / "stuck").touch()
        ws("cleanup pending", scripted)
        archive("cleanup pending")
        copy = _copy_store(root, tmp_short / "copy")
    finally:
        daemon.close()
    with installed_app(copy) as app:
        kept = {r["id"]: r for r in app.store.all("SELECT * FROM workspaces")}
        # The shapes this test is about are there (each made as the API makes it).
        assert set(made.values()) <= set(kept)
        statuses = {label: kept[i]["setup_status"] for label, i in made.items()}
        assert statuses["setup"] == "ok" and statuses["setup failed"] == "failed"
        assert statuses["untrusted"] == "untrusted" and statuses["worktree"] == "none"
        assert '"leftovers": [{' in kept[made["setup left a job"]]["setup_output"]
        assert kept[made["purged"]]["last_cleanup"] and not _obligations_of(copy, made["purged"])
        assert _obligations_of(copy, made["cleanup pending"])
        assert kept[made["auto-archived"]]["auto_archive_outcome"]
        svc = app.get(WorkspaceService)
        fell_back: list[str] = []

        def model_path(ws_id: str) -> dict[str, Any]:
            fell_back.append(ws_id)
            return svc._info_json(ws_id)

        direct = listing.listing(app.store, model_path)["workspaces"]
        names = {i: label for label, i in made.items()}
        assert [names.get(i, i) for i in fell_back] == []
        model = orjson.loads(_model_bytes(svc, None, None))["workspaces"]
        assert len(direct) == len(kept)
        for got, expected in zip(direct, model, strict=True):
            assert orjson.dumps(got) == orjson.dumps(expected), names.get(got["id"])


def _state(daemon: DaemonProcess, ws_id: str) -> str:
    found: str = daemon.call("workspace.get", {"workspace_id": ws_id})["workspace"]["state"]
    return found


def _obligations_of(root: Path, ws_id: str) -> list[str]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        found = db.execute(
            "SELECT state FROM cleanup_obligations WHERE workspace_id = ?", (ws_id,)
        ).fetchall()
    finally:
        db.close()
    return [state for (state,) in found]


def _time_cursor(created_at: float, workspace_id: str) -> str:
    """A cursor the way daemons before the listing sequence made it (creation time, id)."""
    raw = f"{float(created_at)!r}\n{workspace_id}".encode()
    return "c1." + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def test_cursor_round_trips_and_refuses_what_it_did_not_make() -> None:
    for seq in (0, 1, 7, 2**63 - 1):
        assert parse_list_cursor(list_cursor(seq)) == seq
    old = _time_cursor(T0, "ws_0123456789abcdef")
    assert parse_list_cursor(old) == (T0, "ws_0123456789abcdef")
    assert parse_list_cursor(_time_cursor(1764000100, "x")) == (1764000100.0, "x")
    for bad in [
        "",
        "ws_0123456789abcdef",
        "7",
        "c2.",
        "c2.-1",
        "c2.+1",
        "c2.01",
        "c2.1.5",
        "c2. 1",
        "c2.1 ",
        "c2.\u0661",  # an Arabic-Indic digit: a digit to str.isdigit, not one the daemon writes
        "c2.9223372036854775808",  # past SQLite's INTEGER
        "c2." + "9" * 5000,  # past int()'s digit limit: still this error, not another
        "c3.1",
        "c1.",
        "c1.$$$",
        "c2." + old[3:],
        "c1.bm90IGEgY3Vyc29y",  # base64 of text without the separator
        "c1.bmFuCndzXzE",  # nan
        "c1.aW5mCndzXzE",  # inf
        "c1.MS4wCg",  # no id
        "c1.MS4wCndzXzEKeA",  # a control character in the id
        "c1.MDEuMAp3c18x",  # a time not written the way the daemon writes it
        "c1.//79",  # not UTF-8
    ]:
        with pytest.raises(ValueError, match=r"not a workspace\.list cursor"):
            parse_list_cursor(bad)


# -- a real daemon --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    tmp = short_tmpdir("xuml-")
    daemon = DaemonProcess(tmp / "root").start()
    try:
        one = add_project(daemon, make_repo(tmp / "one"))["id"]
        two = add_project(daemon, make_repo(tmp / "two"))["id"]
        for index in range(7):
            create(daemon, one if index % 2 else two, f"w{index}", runtime="directory")
        yield {"daemon": daemon, "projects": [one, two]}
    finally:
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _pages(daemon: DaemonProcess, limit: int, **filters: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        params = {**filters, "limit": limit, **({"after": after} if after else {})}
        result = daemon.call("workspace.list", params)
        pages.append([w["id"] for w in result["workspaces"]])
        after = result["next"]
        if after is None:
            return pages


def test_daemon_pages_concatenate_under_every_filter(world: dict[str, Any]) -> None:
    daemon: DaemonProcess = world["daemon"]
    for filters in [{}, {"project_id": world["projects"][0]}, {"state": "active"}]:
        full = daemon.call("workspace.list", filters)
        assert full.get("next") is None, "without limit: everything, no cursor"
        ids = [w["id"] for w in full["workspaces"]]
        assert ids, filters
        created = [w["created_at"] for w in full["workspaces"]]
        assert created == sorted(created), "creation order (the clock did not step back here)"
        for limit in (1, 2, 3, len(ids), len(ids) + 5):
            pages = _pages(daemon, limit, **filters)
            assert [i for page in pages for i in page] == ids, (filters, limit)
            assert [len(page) for page in pages[:-1]] == [limit] * (len(pages) - 1)
            assert 1 <= len(pages[-1]) <= limit


def test_create_and_remove_between_pages_skip_and_repeat_nothing(
    world: dict[str, Any],
) -> None:
    daemon: DaemonProcess = world["daemon"]
    project = world["projects"][0]
    before = [w["id"] for w in daemon.call("workspace.list")["workspaces"]]
    first = daemon.call("workspace.list", {"limit": 3})
    seen = [w["id"] for w in first["workspaces"]]
    # The last workspace of the page goes (the cursor came from it), one of a later page goes,
    # and a new one comes.
    gone = [seen[-1], before[4]]
    for ws_id in gone:
        daemon.call("workspace.remove", {"workspace_id": ws_id, "force": True})
    new = create(daemon, project, "between", runtime="directory")["workspace"]["id"]
    try:
        after = first["next"]
        while after is not None:
            page = daemon.call("workspace.list", {"limit": 2, "after": after})
            seen += [w["id"] for w in page["workspaces"]]
            after = page["next"]
        assert len(seen) == len(set(seen)), "a workspace was listed twice"
        stayed = [i for i in before if i not in gone]
        assert [i for i in seen if i in stayed or i == new] == [*stayed, new]
        assert before[4] not in seen
    finally:
        daemon.call("workspace.remove", {"workspace_id": new, "force": True})
        for index, ws_id in enumerate(gone):
            create(daemon, project, f"again{index}-{time.monotonic_ns()}", runtime="directory")
            assert ws_id


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": -1},
        {"limit": 10_001},
        {"limit": "5"},
        {"limit": True},
        {"limit": 1.5},
        {"after": ""},
        {"after": "ws_0123456789abcdef"},
        {"after": "c1.$$$"},
        {"after": 5},
        {"after": "x" * 401},
    ],
    ids=lambda p: json.dumps(p)[:40],
)
def test_bad_limit_or_after_is_invalid_params(
    world: dict[str, Any], params: dict[str, Any]
) -> None:
    error = rpc_error(world["daemon"], "workspace.list", params)
    assert error.kind == "invalid_params"
    assert error.data["errors"][0]["loc"][0] in ("limit", "after")


def test_a_cursor_of_another_listing_resumes_from_its_place(world: dict[str, Any]) -> None:
    """A cursor is a place in the listing order, so a filtered listing may resume from a
    cursor of the unfiltered one: the workspaces after it that match."""
    daemon: DaemonProcess = world["daemon"]
    everything = daemon.call("workspace.list")["workspaces"]
    cursor = daemon.call("workspace.list", {"limit": 3})["next"]
    project = world["projects"][1]
    got = daemon.call("workspace.list", {"project_id": project, "after": cursor})["workspaces"]
    assert [w["id"] for w in got] == [w["id"] for w in everything[3:] if w["project_id"] == project]


def test_python_clients_iterate_every_page(world: dict[str, Any]) -> None:
    daemon: DaemonProcess = world["daemon"]
    full = [w["id"] for w in daemon.call("workspace.list")["workspaces"]]
    project = world["projects"][0]
    mine = [w["id"] for w in daemon.call("workspace.list", {"project_id": project})["workspaces"]]
    with Client(daemon.root) as client:
        asked: list[dict[str, Any]] = []
        call = client.call

        def spy(method: str, params: Any = None) -> dict[str, Any]:
            asked.append(params)
            return call(method, params)

        client.call = spy  # type: ignore[method-assign]
        assert [w["id"] for w in client.iter_workspaces(page=2)] == full
        assert len(asked) == -(-len(full) // 2) and all(p["limit"] == 2 for p in asked)
        assert "after" not in asked[0] and all(p["after"].startswith("c2.") for p in asked[1:])
        client.call = call  # type: ignore[method-assign]
        assert [w["id"] for w in client.iter_workspaces({"project_id": project}, 1)] == mine
        with pytest.raises(ValueError, match="page size"):
            list(client.iter_workspaces({"limit": 3}))
        with pytest.raises(XumRpcError) as caught:
            list(client.iter_workspaces(page=0))
        assert caught.value.kind == "invalid_params"

    async def collect() -> tuple[list[str], list[str]]:
        async with AsyncClient(daemon.root) as aclient:
            every = [w["id"] async for w in aclient.iter_workspaces(page=3)]
            only = [w["id"] async for w in aclient.iter_workspaces({"project_id": project}, 2)]
            return every, only

    assert anyio.run(collect) == (full, mine)


def test_cli_ws_ls_fetches_all_pages_and_one_with_limit(world: dict[str, Any]) -> None:
    daemon: DaemonProcess = world["daemon"]
    full = daemon.call("workspace.list")["workspaces"]
    runner = CliRunner()
    base = ["--root", str(daemon.root), "--json"]

    listed = runner.invoke(cli_main, [*base, "ws", "ls"])
    assert listed.exit_code == 0, listed.output
    assert [w["id"] for w in json.loads(listed.output)["workspaces"]] == [w["id"] for w in full]

    first = runner.invoke(cli_main, [*base, "ws", "ls", "--limit", "2"])
    assert first.exit_code == 0, first.output
    page = json.loads(first.output)
    assert [w["id"] for w in page["workspaces"]] == [w["id"] for w in full[:2]]
    rest = runner.invoke(cli_main, [*base, "ws", "ls", "--after", page["next"]])
    assert rest.exit_code == 0, rest.output
    assert [w["id"] for w in json.loads(rest.output)["workspaces"]] == [w["id"] for w in full[2:]]

    human = runner.invoke(cli_main, ["--root", str(daemon.root), "ws", "ls", "--limit", "1"])
    assert human.exit_code == 0, human.output
    assert full[0]["name"] in human.output and "--after c2." in human.output

    # The real entry point: usage errors are exit 2 with a message naming the option.
    done = xum("--root", str(daemon.root), "ws", "ls", "--limit", "0")
    assert done.returncode == 2 and "--limit" in done.stderr, done.stderr
    for bogus in ("bogus", "c2.x", "c1.$$$", "c9.", "c0.1", "c9.a b"):
        done = xum("--root", str(daemon.root), "ws", "ls", "--after", bogus)
        assert done.returncode == 2, (bogus, done.stderr)
        assert "--after" in done.stderr and "not a workspace.list cursor" in done.stderr
    # A cursor of a later form (a newer daemon's, through --host) is the daemon's to judge:
    # this one answers invalid_params, not the CLI a usage error.
    done = xum("--root", str(daemon.root), "--json", "ws", "ls", "--after", "c9.bmV3ZXI")
    assert done.returncode not in (0, 2), done.stderr
    assert "invalid_params" in done.stdout + done.stderr


def test_event_snapshot_lists_the_workspaces_as_workspace_list(world: dict[str, Any]) -> None:
    """`events.subscribe`'s snapshot uses the same direct listing."""
    daemon: DaemonProcess = world["daemon"]
    listed = daemon.call("workspace.list")["workspaces"]
    with Client(daemon.root) as client:
        snapshot = client.call("events.subscribe", {"types": ["workspace."]})["snapshot"]
    assert snapshot["workspaces"] == listed and listed


def test_cursors_past_either_end(app: App) -> None:
    count = _hostile_mix(app.store)
    svc = app.get(WorkspaceService)
    full = _direct(svc)["workspaces"]
    beyond = _direct(svc, limit=5, after=list_cursor(2**63 - 1))
    assert beyond == {"workspaces": [], "next": None}
    before = _direct(svc, after=list_cursor(0))
    assert before["workspaces"] == full and len(full) == count


def test_rows_of_an_earlier_schema_keep_their_order_and_its_cursors_resume(
    tmp_short: Path,
) -> None:
    """A database from before the listing sequence (schema 11), its rows inserted out of their
    creation order: migration 0012 numbers them in the order they were listed in (creation
    time, then id), a cursor that daemon made resumes at the same place, and a workspace
    created after the upgrade comes last, even with an earlier clock."""
    db = tmp_short / "state.db"
    raw = sqlite3.connect(db)
    for number, _, sql in _migrations():
        if number <= 11:
            raw.executescript(f"BEGIN;\n{sql}\nPRAGMA user_version={number};\nCOMMIT;")
    raw.close()
    store = Store(db)
    try:
        with store.transaction():
            _projects(store)
            # Inserted in this order; listed before the upgrade by (created_at, id).
            for n, created in ((1, T0 + 5), (2, T0 + 1), (3, T0 + 5), (4, T0 + 3), (5, T0)):
                _ws(store, n, id=f"ws_{6 - n:016x}", created_at=created)
        old_order = [
            (r["created_at"], r["id"])
            for r in store.all("SELECT * FROM workspaces ORDER BY created_at, id")
        ]
        assert store.migrate() == _migrations()[-1][0]
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        svc = app.get(WorkspaceService)
        assert [w["id"] for w in _direct(svc)["workspaces"]] == [i for _, i in old_order]
        with store.transaction():
            late = _ws(store, 9, created_at=T0 - 60)
        ids = [i for _, i in old_order] + [late]
        assert [w["id"] for w in _direct(svc)["workspaces"]] == ids
        for index, (created, ws_id) in enumerate(old_order):
            assert _walk(svc, 2, _time_cursor(created, ws_id)) == ids[index + 1 :]
        # A place between rows (its row was removed before the upgrade) resumes after it too,
        # and places past either end give everything after them.
        assert _walk(svc, 1, _time_cursor(T0 + 2, "ws_x")) == ids[2:]
        assert _walk(svc, 2, _time_cursor(T0 + 10**9, "ws_f")) == [late]
        assert _walk(svc, 2, _time_cursor(0.0, "ws_0")) == ids
    finally:
        store.close()


def test_cli_listing_with_a_pre_paging_daemon_asks_unpaged(world: dict[str, Any]) -> None:
    """A daemon whose hello says 1.1 refuses `limit` (unknown params field): `xum ws ls` then
    asks for everything at once, as before, and --limit is a usage error naming the need."""
    import click
    from xum_client.commands.listing import list_workspaces

    daemon: DaemonProcess = world["daemon"]
    with Client(daemon.root) as client:
        assert client.server is not None
        client.server["protocol"] = "1.1"  # what an older daemon's hello says
        asked: list[Any] = []
        call = client.call

        def spy(method: str, params: Any = None) -> dict[str, Any]:
            asked.append(params)
            return call(method, params)

        client.call = spy  # type: ignore[method-assign]
        result = list_workspaces(client, {}, None, None)
        assert asked == [{}] and result["workspaces"]
        with pytest.raises(click.UsageError, match=r"protocol 1\.2"):
            list_workspaces(client, {}, 5, None)


def _walk(svc: WorkspaceService, limit: int, after: str | None, **filters: Any) -> list[str]:
    """The ids of every page from `after` on."""
    seen: list[str] = []
    while True:
        page = _direct(svc, limit=limit, **filters, **({"after": after} if after else {}))
        seen += [w["id"] for w in page["workspaces"]]
        after = page["next"]
        if after is None:
            return seen


def test_a_workspace_created_with_an_earlier_clock_between_pages_is_not_skipped(
    app: App,
) -> None:
    """The wall clock stepped back (NTP, a VM resumed) between two pages: the workspace created
    then has a `created_at` before the cursor's. The listing order is the order the daemon
    recorded the workspaces, not their clock, so it comes on a later page like any new one."""
    with app.store.transaction():
        _projects(app.store)
        for n in range(1, 7):
            _ws(app.store, n)
    svc = app.get(WorkspaceService)
    first = _direct(svc, limit=3)
    seen = [w["id"] for w in first["workspaces"]]
    with app.store.transaction():
        stepped = _ws(app.store, 90, created_at=T0 - 3600, updated_at=T0 - 3600)
        equal = _ws(app.store, 91, id="ws_0000000000000000", created_at=T0 + 3)
    seen += _walk(svc, 2, first["next"])
    assert seen == [f"ws_{n:016x}" for n in range(1, 7)] + [stepped, equal]
    # The unpaged listing (and the model path) has the same order: pages concatenate to it.
    assert [w["id"] for w in _direct(svc)["workspaces"]] == seen
    assert [w.id for w in svc.list_workspaces(None, None)] == seen


# -- a real daemon under changes between pages ------------------------------------------------

LIBFAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"), None)


def _walk_daemon(
    daemon: DaemonProcess,
    limit: int,
    between: Iterator[None] | None = None,
    **filters: Any,
) -> list[str]:
    """Every page's ids, running the next step of `between` after each page that has a next."""
    seen: list[str] = []
    after: str | None = None
    while True:
        params = {**filters, "limit": limit, **({"after": after} if after else {})}
        page = daemon.call("workspace.list", params)
        seen += [w["id"] for w in page["workspaces"]]
        after = page["next"]
        if after is None:
            return seen
        if between is not None:
            next(between, None)


def test_a_workspace_created_after_the_clock_stepped_back_is_on_a_later_page() -> None:
    """A real daemon whose wall clock steps back an hour (libfaketime, the clock being the one
    thing a test cannot step for real) between two pages: the workspace it creates then carries
    the earlier `created_at`, and the listing still shows it, after the others."""
    if LIBFAKETIME is None:
        pytest.skip("libfaketime not installed (/usr/lib/*/faketime/; Debian package faketime)")
    tmp = short_tmpdir("xumc-")
    spec = tmp / "faketime"
    spec.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(spec),
        "FAKETIME_NO_CACHE": "1",  # read the file on every call: the step lands at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # deadlines keep their real clock
    }
    daemon = DaemonProcess(tmp / "root", env=env).start()
    try:
        project = add_project(daemon, make_repo(tmp / "one"))["id"]
        made = [
            create(daemon, project, f"w{i}", runtime="directory")["workspace"] for i in range(4)
        ]

        def step_back() -> Iterator[None]:
            spec.write_text("-3600\n")
            made.append(create(daemon, project, "stepped", runtime="directory")["workspace"])
            yield

        seen = _walk_daemon(daemon, 2, step_back())
        stepped = made[-1]
        assert stepped["created_at"] < min(w["created_at"] for w in made[:-1]) - 3000
        assert seen == [w["id"] for w in made]
        full = daemon.call("workspace.list")["workspaces"]
        assert [w["id"] for w in full] == seen
    finally:
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_archive_unarchive_rename_remove_create_between_pages() -> None:
    """Every page of a real daemon's listing, with a structural change after each page: a
    workspace is listed at most once, every one that was there throughout exactly once and in
    its place, a removed one not yet reached never, a new one at the end; under a `state`
    filter, one that stayed in that state throughout exactly once."""
    tmp = short_tmpdir("xumi-")
    daemon = DaemonProcess(tmp / "root").start()
    try:
        projects = [add_project(daemon, make_repo(tmp / n))["id"] for n in ("one", "two")]
        ids = [
            create(daemon, projects[i % 2], f"w{i}", runtime="directory")["workspace"]["id"]
            for i in range(10)
        ]
        daemon.call("workspace.archive", {"workspace_id": ids[1]})
        daemon.call("workspace.archive", {"workspace_id": ids[7]})
        removed: list[str] = []
        created: list[str] = []

        def changes() -> Iterator[None]:
            # after page 1 (ids 0-2 seen): one seen and one ahead change state, one ahead goes
            daemon.call("workspace.archive", {"workspace_id": ids[0]})
            daemon.call("workspace.archive", {"workspace_id": ids[5]})
            daemon.call("workspace.remove", {"workspace_id": ids[4], "force": True})
            removed.append(ids[4])
            yield
            # after page 2: a new one, a rename ahead, an unarchive ahead
            new = create(daemon, projects[0], "late", runtime="directory")["workspace"]["id"]
            created.append(new)
            daemon.call("workspace.rename", {"workspace_id": ids[8], "name": "renamed"})
            daemon.call("workspace.unarchive", {"workspace_id": ids[7]})
            yield
            # after page 3: the one the cursor came from goes, another comes
            daemon.call("workspace.remove", {"workspace_id": ids[9], "force": True})
            created.append(
                create(daemon, projects[1], "later", runtime="directory")["workspace"]["id"]
            )

        seen = _walk_daemon(daemon, 3, changes())
        assert len(seen) == len(set(seen)), "a workspace was listed twice"
        assert seen == [i for i in ids if i not in removed[:1]] + created
        # Filtered by state: the ones active throughout come once each, in order.
        for ws_id in (ids[0], ids[5]):
            daemon.call("workspace.unarchive", {"workspace_id": ws_id})
        active_throughout = [i for i in ids if i not in (ids[1], ids[4], ids[7], ids[9])]

        def state_changes() -> Iterator[None]:
            daemon.call("workspace.archive", {"workspace_id": ids[7]})  # ahead: leaves
            daemon.call("workspace.unarchive", {"workspace_id": ids[1]})  # behind: too late
            yield

        seen = _walk_daemon(daemon, 2, state_changes(), state="active")
        assert len(seen) == len(set(seen)), "a workspace was listed twice"
        assert [i for i in seen if i in active_throughout] == active_throughout
        assert ids[7] not in seen and ids[1] not in seen
    finally:
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("bad_next", [5, ["c2.1"], {"c": 1}, "same"])
def test_python_paging_refuses_a_next_that_would_end_or_loop_the_listing(bad_next: Any) -> None:
    """A daemon that answers a `next` that is no cursor (or the cursor it was given) is broken:
    both iterators raise, rather than report a listing cut short as complete or loop for ever.
    The daemon is a stand-in here: a real one never answers so."""
    from xum_client.paging import aiter_workspaces, iter_workspaces

    asked: list[dict[str, Any]] = []

    def answer(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        if "after" not in params:
            return {"workspaces": [{"id": "ws_1"}], "next": "same"}
        return {"workspaces": [{"id": "ws_2"}], "next": bad_next}

    def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert method == "workspace.list"
        return answer(params)

    async def acall(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return call(method, params)

    match = "same cursor twice" if bad_next == "same" else "no cursor"
    with pytest.raises(RuntimeError, match=match):
        list(iter_workspaces(call, page=1))

    async def walk() -> None:
        async for _ in aiter_workspaces(acall, page=1):
            pass

    with pytest.raises(RuntimeError, match=match):
        anyio.run(walk)
    assert [p.get("after") for p in asked] == [None, "same"] * 2
