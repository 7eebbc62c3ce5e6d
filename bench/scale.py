"""Scale figures: startup and workspace.list with 10,000 workspaces on record, 333 of them
archived with their cleanup pending (999 pending obligations, asked as 1,000: whole workspaces
of 3 steps), every row made through the API or copied from one it made (`populate`); 64
parallel creates across 4 repositories; event fan-out to 100 subscribers."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from bench import procs, synth
from bench.client import Conn
from bench.settings import Settings
from bench.stats import Figure

DAY = 86_400.0
# The root's config while the records are made and measured: a failed cleanup step is retried a
# day later, so the pending template's steps are not due during a run (see `populate`).
SLOW_RETRY = f"[cleanup]\nbackoff_initial_s = {DAY}\nbackoff_max_s = {DAY}\n"
# The pending template's project: a teardown that always fails keeps its cleanup pending.
FAILING_TEARDOWN = '[scripts]\nteardown = ["exit 1"]\n'


def _hex() -> str:
    return secrets.token_hex(8)


# The columns a copy of a template row gets of its own; every other column is the template's,
# with the template's own values in it (its id, name, path, its steps' ids) replaced by the
# copy's (`owned`).
OWN_COLUMNS = frozenset(
    {"id", "name", "path", "incarnation", "dev", "ino", "created_at", "updated_at", "listing_seq"}
)
OWN_OBLIGATION_COLUMNS = frozenset({"id", "workspace_id", "path", "incarnation", "dev", "ino"})
SETTLE_S = 60.0
MARKER = ".xum-incarnation"


def owned(value: Any, mine: dict[str, str]) -> Any:
    """`value` of a template's column with the template's own values (keys of `mine`: its id,
    path, quoted name, its steps' ids) replaced by a copy's; other values as they are."""
    if not isinstance(value, str):
        return value
    for theirs, ours in mine.items():
        value = value.replace(theirs, ours)
    return value


def pending_workspaces(obligations: int, steps: int) -> int:
    """Workspaces whose cleanup is pending for `obligations` pending steps, `steps` each: whole
    workspaces, rounded (1,000 steps of 3 each: 333 workspaces, 999 steps), at least one."""
    return max(1, round(obligations / steps)) if obligations else 0


def populate(
    root: Path, workspaces: int, obligations: int, env: dict[str, str] | None = None
) -> None:
    """`workspaces` workspaces on record (every tenth archived), made the way a real run makes
    them: a daemon on `root` adds a project and makes the first active and the first archived
    workspace through the API (create; archive, its cleanup steps run to the end), and with
    `obligations` a second project whose teardown fails (`FAILING_TEARDOWN`, trusted), where a
    workspace is made and archived: its cleanup stays pending (the teardown failed, the trash
    and reclaim steps wait for it). Then the daemon stops; the others are copies of those rows,
    every column the daemon wrote kept but the ones a workspace has of its own (`OWN_COLUMNS`:
    id, name, path, incarnation, its directory's identity, times, listing order), the template's
    own values inside the others replaced by the copy's (`owned`: its id, name, path and steps'
    ids in the teardown's environment, the trash path, the cleanup status), with their cleanup
    steps copied the same way. The pending copies are the archived ones after the first, as
    many as give `obligations` pending steps in whole workspaces (`pending_workspaces`).
    A copy whose checkout exists (active, or archived with its cleanup pending) gets a real
    directory and its incarnation marker, so a startup pass that reconciles records with the
    disk finds them consistent. The root keeps `SLOW_RETRY` as its config: the pending steps'
    retries stay a day off, and a start finds none due and changes none (on the default 300 s
    cap, steps written under it come due within a run; steps written a day off are pulled in to
    the cap by a start's first cleanup look, a rewrite a root on defaults never does).
    `tests/bench/test_rows.py` holds the copies to their templates column for column, and a
    start to changing none of them. `env`: the daemon's extra environment (another tree
    through PYTHONPATH)."""
    if obligations and workspaces < 20:
        raise ValueError("pending obligations need at least 20 workspaces (two archived)")
    project_dir = root.parent / "proj"
    project_dir.mkdir()
    held_dir = root.parent / "held"
    if obligations:
        (held_dir / ".xum").mkdir(parents=True)
        (held_dir / ".xum" / "config.toml").write_text(FAILING_TEARDOWN)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / "config.toml").write_text(SLOW_RETRY)
    daemon = procs.xumd(root, env=env)
    made = asyncio.run(
        _api_rows(
            daemon,
            project_dir,
            archived=workspaces >= 10,
            held_dir=held_dir if obligations else None,
        )
    )
    now = time.time()
    db = sqlite3.connect(root / "state.db")
    db.row_factory = sqlite3.Row
    with db:
        rows = {
            kind: dict(db.execute("SELECT * FROM workspaces WHERE id = ?", (ws_id,)).fetchone())
            for kind, ws_id in made.items()
        }
        steps = {
            kind: [
                dict(r)
                for r in db.execute(
                    "SELECT * FROM cleanup_obligations WHERE workspace_id = ? ORDER BY seq",
                    (ws_id,),
                )
            ]
            for kind, ws_id in made.items()
        }
        held = (
            pending_workspaces(obligations, sum(s["state"] == "pending" for s in steps["pending"]))
            if obligations
            else 0
        )
        if held and held >= workspaces // 10:
            raise ValueError(f"{held} pending workspaces need more than {workspaces} workspaces")
        columns = [c for c in rows["active"] if c != "listing_seq"]
        insert = (
            f"INSERT INTO workspaces ({', '.join(columns)})"
            f" VALUES ({', '.join('?' for _ in columns)})"
        )
        templates = {0: "active", 9: "archived", 19: "pending"}
        for index in range(workspaces):
            kind = _kind(index, held)
            if templates.get(index) == kind:
                continue  # the template itself
            _copy(db, insert, columns, rows[kind], steps[kind], index, now)
    db.close()


def _kind(index: int, held: int) -> str:
    """The template of the `index`-th workspace: every tenth archived, the `held` archived
    ones after the first pending."""
    if index % 10 != 9:
        return "active"
    return "pending" if 1 <= index // 10 <= held else "archived"


def _copy(
    db: sqlite3.Connection,
    insert: str,
    columns: list[str],
    template: dict[str, Any],
    steps: list[dict[str, Any]],
    index: int,
    now: float,
) -> None:
    """The `index`-th workspace: a copy of `template` and of its cleanup steps."""
    ws_id, inc, name = f"ws_{_hex()}", secrets.token_hex(16), f"w{index}"
    path = Path(template["path"]).parent / name
    step_ids = {s["id"]: f"ob_{_hex()}" for s in steps}
    mine = {
        template["id"]: ws_id,
        template["path"]: str(path),
        '"' + template["name"] + '"': f'"{name}"',
        **step_ids,
    }
    # A copy without a checkout keeps the template's directory identity (that directory is gone).
    dev, ino = template["dev"], template["ino"]
    marker = Path(template["path"]) / MARKER
    if marker.exists():
        path.mkdir()
        text = marker.read_text()
        (path / MARKER).write_text(
            text.replace(template["id"], ws_id).replace(template["incarnation"], inc)
        )
        pst = path.stat()
        dev, ino = pst.st_dev, pst.st_ino
    own = {
        "id": ws_id,
        "name": name,
        "path": str(path),
        "incarnation": inc,
        "dev": dev,
        "ino": ino,
        "created_at": now + index * 1e-3,
        "updated_at": now + index * 1e-3,
    }
    row = {c: owned(v, mine) for c, v in template.items() if c not in OWN_COLUMNS} | own
    db.execute(insert, [row[c] for c in columns])
    for step in steps:
        same_dir = (step["dev"], step["ino"]) == (template["dev"], template["ino"])
        copied = {
            **{c: owned(v, mine) for c, v in step.items() if c not in OWN_OBLIGATION_COLUMNS},
            "id": step_ids[step["id"]],
            "workspace_id": ws_id,
            "path": owned(step["path"], mine),
            "incarnation": inc,
            "dev": dev if same_dir else step["dev"],
            "ino": ino if same_dir else step["ino"],
        }
        names = list(copied)
        db.execute(
            f"INSERT INTO cleanup_obligations ({', '.join(names)})"
            f" VALUES ({', '.join('?' for _ in names)})",
            [copied[n] for n in names],
        )


async def _api_rows(
    daemon: procs.Launched, project_dir: Path, *, archived: bool, held_dir: Path | None
) -> dict[str, str]:
    """The template workspaces, made through the API of a daemon on the root: `active` (w0);
    with `archived`, `archived` (w9, archived and its cleanup run to the end); with `held_dir`,
    `pending` (w19 of that project, its config trusted, archived: the teardown fails, its
    cleanup stays pending). Their ids."""
    daemon.start()
    try:
        conn = await Conn.open(daemon.socket_path, hello=True)
        try:
            project = await conn.call("project.add", {"path": str(project_dir)})
            pid = project["project"]["id"]
            made = {}
            for kind, name in (("active", "w0"), ("archived", "w9"))[: 2 if archived else 1]:
                params = {"project_id": pid, "name": name, "runtime": "directory"}
                made[kind] = (await conn.call("workspace.create", params))["workspace"]["id"]
            if held_dir is not None:
                held = (await conn.call("project.add", {"path": str(held_dir)}))["project"]["id"]
                digest = hashlib.sha256((held_dir / ".xum" / "config.toml").read_bytes())
                await conn.call("project.trust", {"project_id": held, "hash": digest.hexdigest()})
                params = {"project_id": held, "name": "w19", "runtime": "directory"}
                made["pending"] = (await conn.call("workspace.create", params))["workspace"]["id"]
            if archived:
                await conn.call("workspace.archive", {"workspace_id": made["archived"]})
                await _settled(conn, made["archived"])
            if held_dir is not None:
                answer = await conn.call("workspace.archive", {"workspace_id": made["pending"]})
                if answer["cleanup"]["status"] != "pending":
                    raise RuntimeError(f"the held archive's cleanup is not pending: {answer}")
            return made
        finally:
            await conn.close()
    finally:
        daemon.stop()


async def _settled(conn: Conn, ws_id: str) -> None:
    """Until the archive's cleanup, reclaim included, is complete (the background reclaim)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = (await conn.call("workspace.get", {"workspace_id": ws_id}))["workspace"]
        cleanup = found.get("last_cleanup") or {}
        if cleanup.get("status") == "completed" and (cleanup.get("reclaim") or {}).get(
            "status"
        ) in (None, "completed"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the archive of {ws_id} did not settle: {cleanup}")
        await asyncio.sleep(0.05)


async def _rtt(sock: Path, method: str, params: dict[str, Any], count: int) -> list[float]:
    conn = await Conn.open(sock, hello=True)
    try:
        await conn.call(method, params)  # warm-up
        out = []
        for _ in range(count):
            started = time.perf_counter()
            await conn.call(method, params)
            out.append(time.perf_counter() - started)
        return out
    finally:
        await conn.close()


def _sqlite_read_s(db: Path) -> float:
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM workspaces")]
    conn.close()
    orjson.dumps(rows)
    return time.perf_counter() - started


def _records(settings: Settings) -> list[Figure]:
    tag = f"{settings.list_workspaces:,} workspaces, {settings.list_obligations:,} obligations"
    ready = Figure(
        "scale", f"time to ready ({tag})", "ms", "python that reads every row, then READY=1"
    )
    # What the records cost a user against an empty root ("minus empty", and idle RSS): an
    # empty root takes the lean start (docs/PERFORMANCE.md, "Lean start"), a root with records
    # builds its feature graph right after READY=1, and the idle RSS is read once it is built
    # (`daemon.status` waits for it). "Minus one record" is the records' own share: against
    # the same start on a root with one workspace.
    added = Figure(
        "scale",
        f"time to ready, records minus one record ({tag})",
        "ms",
        "the same daemon on a root with one workspace, started right before",
    )
    minus_empty = Figure(
        "scale",
        f"time to ready, records minus empty ({tag})",
        "ms",
        "the same daemon on an empty root (the lean start), started right before",
    )
    # READY=1 is when the socket answers; a root with records builds its feature graph right
    # after it, and its methods wait for the startup passes: the time until they answer.
    reconciled = Figure(
        "scale",
        f"time to reconciled, records minus empty ({tag})",
        "ms",
        "the same daemon on an empty root: spawn to XUM_RECONCILED=1 on both",
    )
    rss = Figure(
        "scale",
        f"idle RSS, records over empty ({tag})",
        "MiB",
        "the same daemon on an empty root, idle after the same calls",
    )
    listing = Figure(
        "scale",
        f"workspace.list, all ({tag})",
        "ms",
        "sqlite read of the rows + the same answer bytes from the echo server",
    )
    page = settings.list_page
    first_page = Figure(
        "scale",
        f"workspace.list, first page of {page:,} ({tag})",
        "ms",
        "sqlite read of the same rows (index range) + the same answer bytes from the echo server",
    )
    mid_page = Figure(
        "scale",
        f"workspace.list, page of {page:,} after {settings.list_workspaces // 2:,} ({tag})",
        "ms",
        "sqlite read of the same rows (index range) + the same answer bytes from the echo server",
    )
    work = procs.short_dir("xbs-")
    root = work / "root"
    empty_root = work / "empty"
    one_root = work / "one" / "root"
    try:
        for fresh in (root, empty_root, one_root):
            procs.xumd(fresh).start().stop()
        populate(root, settings.list_workspaces, settings.list_obligations)
        populate(one_root, 1, 0)
        # The three starts differ in their records only: the same config on each.
        (empty_root / "config.toml").write_text(SLOW_RETRY)
        db = root / "state.db"
        pristine = work / "pristine.db"
        shutil.copyfile(db, pristine)
        for _ in range(settings.repeats):
            # Every repetition on the records as populated (a start changes none of them,
            # tests/bench/test_rows.py; the copy keeps it so should that ever break).
            _restore(db, pristine)
            empty = procs.xumd(empty_root).start()
            empty_reconciled = empty.wait_reconciled()
            empty_rss = asyncio.run(_idle_rss(empty))
            empty.stop()
            one = procs.xumd(one_root).start()
            one.stop()
            floor = procs.Launched(
                [sys.executable, "-m", "bench.floor_reader", str(root / "state.db")],
                work / "unused.sock",
                {"PYTHONPATH": procs.repo_path()},
            ).start()
            floor.stop()
            daemon = procs.xumd(root).start()
            try:
                assert daemon.ready_s is not None and floor.ready_s is not None
                ready.add(daemon.ready_s * 1000, floor.ready_s * 1000)
                assert empty.ready_s is not None and one.ready_s is not None
                added.add(daemon.ready_s * 1000, one.ready_s * 1000)
                minus_empty.add(daemon.ready_s * 1000, empty.ready_s * 1000)
                reconciled.add(daemon.wait_reconciled() * 1000, empty_reconciled * 1000)
                rss.add(asyncio.run(_idle_rss(daemon)), empty_rss)
                count = 3 if settings.quick else 10
                _paired(listing, daemon, work, {}, partial(_sqlite_read_s, db), count)
                middle = _cursor_at(db, settings.list_workspaces // 2)
                for fig, after in ((first_page, None), (mid_page, middle)):
                    params: dict[str, Any] = {"limit": page}
                    if after is not None:
                        params["after"] = after
                    _paired(
                        fig,
                        daemon,
                        work,
                        params,
                        partial(_sqlite_page_s, db, page, after),
                        count * 10,
                    )
            finally:
                daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [ready, added, minus_empty, reconciled, rss, listing, first_page, mid_page]


def _restore(db: Path, pristine: Path) -> None:
    """The state database as `pristine` holds it (no daemon runs on it)."""
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    shutil.copyfile(pristine, db)


async def _idle_rss(daemon: procs.Launched) -> float:
    """MiB, after a client's `hello` and 20 `daemon.status` calls and half a second idle."""
    conn = await Conn.open(daemon.socket_path, hello=True)
    try:
        for _ in range(20):
            await conn.call("daemon.status")
    finally:
        await conn.close()
    await asyncio.sleep(0.5)  # idle means idle: let the loop settle before sampling
    return daemon.rss_bytes() / 2**20


def _paired(
    fig: Figure,
    daemon: procs.Launched,
    work: Path,
    params: dict[str, Any],
    read: Callable[[], float],
    count: int,
) -> None:
    """One pair: the daemon's `workspace.list` round trip against the floor's read of the same
    rows plus the echo server's round trip of the very same answer bytes (best of `count`)."""
    answer = asyncio.run(_capture(daemon.socket_path, params))
    canned = work / "answer.json"
    canned.write_bytes(orjson.dumps(answer))
    echo = procs.echo_server(work / "echo.sock", canned).start()
    try:
        mine = asyncio.run(_rtt(daemon.socket_path, "workspace.list", params, count))
        base = asyncio.run(_rtt(echo.socket_path, "workspace.list", params, count))
        floor_read = min(read() for _ in range(3))
        fig.add(min(mine) * 1000, (min(base) + floor_read) * 1000)
    finally:
        echo.stop()


def _cursor_at(db: Path, index: int) -> str:
    """The paging cursor after the `index`-th workspace of the listing order."""
    from xum_protocol.cursor import list_cursor

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (seq,) = conn.execute(
            "SELECT listing_seq FROM workspaces ORDER BY listing_seq LIMIT 1 OFFSET ?",
            (index - 1,),
        ).fetchone()
    finally:
        conn.close()
    return list_cursor(int(seq))


def _sqlite_page_s(db: Path, limit: int, after: str | None) -> float:
    """The floor's read of one page: the same keyset range on the same index, rows to dicts,
    orjson."""
    from xum_protocol.cursor import parse_list_cursor

    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    if after is None:
        found = conn.execute("SELECT * FROM workspaces ORDER BY listing_seq LIMIT ?", (limit,))
    else:
        found = conn.execute(
            "SELECT * FROM workspaces WHERE listing_seq > ? ORDER BY listing_seq LIMIT ?",
            (parse_list_cursor(after), limit),
        )
    rows = [dict(r) for r in found]
    conn.close()
    orjson.dumps(rows)
    return time.perf_counter() - started


async def _capture(sock: Path, params: dict[str, Any]) -> Any:
    conn = await Conn.open(sock, hello=True)
    try:
        return await conn.call("workspace.list", params)
    finally:
        await conn.close()


# The floor's four threads together: far above what 64 worktree adds take (seconds), so only a
# hung git reaches it (each git call has its own limit too: synth.GIT_TIMEOUT_S).
FLOOR_DEADLINE_S = 900.0


def run_threads(work: list[Callable[[], None]], deadline_s: float) -> None:
    """Run each callable in its own thread and wait for all of them, within one deadline for the
    whole set: a thread still running then is named in a TimeoutError (it is a daemon thread, so
    it does not keep the bench process alive), and a thread's exception is raised here instead of
    being printed and lost (a floor measured without its work would be a false figure)."""
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=guarded, args=(fn,), name=f"bench-{i}", daemon=True)
        for i, fn in enumerate(work)
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise TimeoutError(f"threads still running after {deadline_s:g} s: {', '.join(stuck)}")
    if errors:
        raise errors[0]


def _parallel_creates(settings: Settings) -> Figure:
    total = settings.parallel_creates
    per_repo = total // 4
    fig = Figure(
        "scale",
        f"{total} parallel workspace.create across 4 repos (wall)",
        "ms",
        "4 threads, one per repo, each doing git worktree add -b in turn",
    )
    work = procs.short_dir("xbp-")
    try:
        template = synth.make_template(work / "template", 200)
        xrepos = [synth.copy(template, work / f"x{i}") for i in range(4)]
        frepos = [synth.copy(template, work / f"f{i}") for i in range(4)]
        daemon = procs.xumd(work / "root").start()
        try:
            projects = asyncio.run(_add_projects(daemon.socket_path, xrepos))
            for rep in range(settings.repeats):
                started = time.perf_counter()
                asyncio.run(_creates(daemon.socket_path, projects, per_repo, rep))
                mine = time.perf_counter() - started

                def adds(repo: Path, r: int = rep) -> None:
                    for k in range(per_repo):
                        name = f"r{r}-{k}"
                        synth.git(
                            repo,
                            "worktree",
                            "add",
                            "-q",
                            "-b",
                            name,
                            str(repo.parent / f"{repo.name}-wt" / name),
                            "HEAD",
                        )

                started = time.perf_counter()
                run_threads([partial(adds, repo) for repo in frepos], FLOOR_DEADLINE_S)
                fig.add(mine * 1000, (time.perf_counter() - started) * 1000)
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return fig


async def _add_projects(sock: Path, repos: list[Path]) -> list[str]:
    conn = await Conn.open(sock, hello=True)
    try:
        return [(await conn.call("project.add", {"path": str(r)}))["project"]["id"] for r in repos]
    finally:
        await conn.close()


async def _creates(sock: Path, projects: list[str], per_repo: int, rep: int) -> None:
    conns = [await Conn.open(sock) for _ in range(per_repo * len(projects))]
    try:
        await asyncio.gather(
            *(
                conn.call(
                    "workspace.create",
                    {"project_id": projects[i % len(projects)], "name": f"r{rep}-{i}"},
                )
                for i, conn in enumerate(conns)
            )
        )
    finally:
        for conn in conns:
            await conn.close()


EVENT = {
    "type": "workspace.state_changed",
    "data": {"workspace": {"id": "ws_" + "0" * 16, "state": "active", "path": "/tmp/x" * 10}},
}


async def _fanout_once(sock: Path, subscribers: int, daemon: bool) -> float:
    subs = [await Conn.open(sock) for _ in range(subscribers)]
    trigger = await Conn.open(sock)
    try:
        if daemon:
            for sub in subs:
                await sub.call("events.subscribe", {})
        else:
            for sub in subs:  # same round trip as a subscription, to the floor
                await sub.call("daemon.status", {})
        started = time.perf_counter()
        await trigger.call("test.publish", EVENT)
        await asyncio.gather(*(sub.read_message() for sub in subs))
        return time.perf_counter() - started
    finally:
        for conn in [*subs, trigger]:
            await conn.close()


def _fanout(settings: Settings) -> Figure:
    fig = Figure(
        "scale",
        f"event fan-out to {settings.subscribers} subscribers (publish -> last received)",
        "ms",
        "bare asyncio server writing the line to every connection",
    )
    work = procs.short_dir("xbf-")
    try:
        root = work / "root"
        root.mkdir(mode=0o700)
        (root / "config.toml").write_text("enable_test_methods = true\n")
        daemon = procs.xumd(root).start()
        echo = procs.echo_server(work / "echo.sock").start()
        try:
            for _ in range(settings.repeats):
                mine = asyncio.run(_fanout_once(daemon.socket_path, settings.subscribers, True))
                base = asyncio.run(_fanout_once(echo.socket_path, settings.subscribers, False))
                fig.add(mine * 1000, base * 1000)
        finally:
            echo.stop()
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return fig


def run(settings: Settings) -> list[Figure]:
    return [*_records(settings), _parallel_creates(settings), _fanout(settings)]
