"""The lifecycle coordinator in-process: reservations, admission, drains, directory exclusion."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import structlog.testing
from xumd.base.errors import XumError
from xumd.checkouts.exclusion import DirectoryExclusion, DirKey, dir_key
from xumd.lifecycle.coordinator import Coordinator
from xumd.store import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    db = Store(tmp_path / "state.db")
    db.migrate()
    now = time.time()
    db.execute(
        "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
        " VALUES ('prj_0000000000000001', 'p', '/p', 1, 1, 'git', ?, ?)",
        (now, now),
    )
    for ws_id, state in (("ws_00000000000000a1", "active"), ("ws_00000000000000a2", "archived")):
        db.execute(
            "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation,"
            " created_at, updated_at) VALUES (?, 'prj_0000000000000001', ?, 'worktree', ?, ?,"
            " 'inc', ?, ?)",
            (ws_id, ws_id, f"/w/{ws_id}", state, now, now),
        )
    yield db
    db.close()


ACTIVE = "ws_00000000000000a1"
ARCHIVED = "ws_00000000000000a2"
MISSING = "ws_00000000000000ff"


async def test_shared_validates_after_holding(store: Store) -> None:
    coord = Coordinator(
        store, wait_s=1, directories=DirectoryExclusion(wait_s=1), failure_guard=None
    )
    async with coord.shared(ACTIVE) as ref:
        assert ref.id == ACTIVE and ref.incarnation == "inc"
    with pytest.raises(XumError) as info:
        async with coord.shared(MISSING):
            pass
    assert info.value.kind.value == "not_found"
    with pytest.raises(XumError) as info:
        async with coord.shared(ARCHIVED):
            pass
    assert info.value.kind.value == "invalid_state"
    with pytest.raises(XumError) as info:
        async with coord.shared("prj_0000000000000001"):
            pass
    assert info.value.kind.value == "invalid_scope"


async def test_exclusive_closes_admission_and_drains_shared(store: Store) -> None:
    coord = Coordinator(
        store, wait_s=5, directories=DirectoryExclusion(wait_s=5), failure_guard=None
    )
    order: list[str] = []
    release = anyio.Event()
    admitted = anyio.Event()

    async def holder() -> None:
        async with coord.shared(ACTIVE, label="terminal in pid 4121"):
            admitted.set()
            await release.wait()
            order.append("shared released")

    async def structural() -> None:
        async with coord.exclusive(ACTIVE, "archive"):
            order.append("exclusive acquired")

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await admitted.wait()
        tg.start_soon(structural)
        # Wait until admission is closed, then a new shared is refused at once, naming it.
        with anyio.fail_after(2):
            while coord.closed_by(ACTIVE) is None:
                await anyio.sleep(0.001)
        with pytest.raises(XumError) as info:
            async with coord.shared(ACTIVE):
                pass
        assert info.value.kind.value == "busy"
        assert "archive" in info.value.message
        assert order == []
        release.set()
    assert order == ["shared released", "exclusive acquired"]
    assert coord.closed_by(ACTIVE) is None
    async with coord.shared(ACTIVE):  # admission reopened
        pass


async def test_drain_is_bounded_and_names_holders(store: Store) -> None:
    coord = Coordinator(
        store, wait_s=0.2, directories=DirectoryExclusion(wait_s=0.2), failure_guard=None
    )
    release = anyio.Event()
    admitted = anyio.Event()

    async def holder() -> None:
        async with coord.shared(ACTIVE, label="agent in pid 977"):
            admitted.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await admitted.wait()
        started = time.monotonic()
        with pytest.raises(XumError) as info:
            async with coord.exclusive(ACTIVE, "remove"):
                pass
        assert time.monotonic() - started < 2
        assert info.value.kind.value == "timeout"
        assert "agent in pid 977" in info.value.message
        assert coord.closed_by(ACTIVE) is None  # admission reopened after the refusal
        release.set()


async def test_second_structural_mutation_is_busy_at_once(store: Store) -> None:
    coord = Coordinator(
        store, wait_s=5, directories=DirectoryExclusion(wait_s=5), failure_guard=None
    )
    inside = anyio.Event()
    release = anyio.Event()

    async def first() -> None:
        async with coord.exclusive(ACTIVE, "remove"):
            inside.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await inside.wait()
        with pytest.raises(XumError) as info:
            async with coord.exclusive(ACTIVE, "archive"):
                pass
        assert info.value.kind.value == "busy"
        assert "remove" in info.value.message
        release.set()


async def test_row_removed_before_reservation_is_not_found(store: Store) -> None:
    coord = Coordinator(
        store, wait_s=5, directories=DirectoryExclusion(wait_s=5), failure_guard=None
    )
    async with coord.exclusive(ACTIVE, "remove"):
        store.execute("DELETE FROM workspaces WHERE id = ?", (ACTIVE,))
    with pytest.raises(XumError) as info:
        async with coord.exclusive(ACTIVE, "archive"):
            pytest.fail("acted on a vanished workspace")
    assert info.value.kind.value == "not_found"


def test_dir_key_spellings(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    spellings = [
        real / "ws",
        link / "ws",
        real / "sub" / ".." / "ws",
        link / "sub" / ".." / "ws",
        Path(str(real) + "//ws"),
    ]
    keys = {dir_key(p) for p in spellings}
    assert len({k.realpath for k in keys}) == 1
    assert len({k.identity for k in keys}) == 1
    assert not dir_key(real / "other").conflicts(dir_key(real / "ws"))


def test_dir_keys_of_one_directory_conflict_by_identity_alone() -> None:
    """Two spellings whose realpaths differ (a bind mount, a case-folding filesystem) still
    exclude each other when they reach the same (st_dev, st_ino) and tail."""
    a = DirKey("/mnt/a/ws", (5, 42, "ws"))
    b = DirKey("/srv/b/ws", (5, 42, "ws"))
    assert a.conflicts(b) and b.conflicts(a)
    assert not a.conflicts(DirKey("/srv/b/other", (5, 42, "other")))


async def test_status_names_the_directories_held(store: Store, tmp_path: Path) -> None:
    exclusion = DirectoryExclusion(wait_s=5)
    coord = Coordinator(store, directories=exclusion, failure_guard=None)
    assert coord.status()["directories"] == []
    async with exclusion.directory(tmp_path / "ws"):
        assert coord.status()["directories"] == [os.path.realpath(tmp_path / "ws")]
    assert coord.status()["directories"] == []


@pytest.mark.parametrize("spelling", ["symlink", "dotdot"])
async def test_directory_exclusion_shared_by_spellings(tmp_path: Path, spelling: str) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    other = link / "ws" if spelling == "symlink" else real / "sub" / ".." / "ws"
    exclusion = DirectoryExclusion(wait_s=5)
    order: list[str] = []
    inside = anyio.Event()
    release = anyio.Event()

    async def cleanup() -> None:
        async with exclusion.directory(real / "ws"):
            inside.set()
            await release.wait()
            order.append("cleanup done")

    async def creation() -> None:
        async with exclusion.directory(other) as key:
            order.append("create acquired")
            # the waiter revalidates after it gets the directory
            assert not os.path.lexists(key.realpath)

    async with anyio.create_task_group() as tg:
        tg.start_soon(cleanup)
        await inside.wait()
        tg.start_soon(creation)
        await anyio.wait_all_tasks_blocked()  # the creation is parked on the exclusion
        assert order == []  # still excluded
        release.set()
    assert order == ["cleanup done", "create acquired"]


async def test_directory_wait_is_bounded(tmp_path: Path) -> None:
    exclusion = DirectoryExclusion(wait_s=5)
    async with exclusion.directory(tmp_path / "x"):
        with pytest.raises(XumError) as info:
            async with exclusion.directory(tmp_path / "." / "x", timeout=0.1):
                pass
    assert info.value.kind.value == "timeout"
    assert str(tmp_path / "x") in info.value.message
    async with exclusion.directory(tmp_path / "x", timeout=0.1):
        pass


async def test_a_failed_structural_operation_is_settled_while_still_reserved(
    store: Store,
) -> None:
    """An exclusive operation that raises is settled by the failure guard before its
    reservation opens again (no other operation sees the row mid-way); one that succeeds is
    not settled at all."""
    coord = Coordinator(
        store, wait_s=1, directories=DirectoryExclusion(wait_s=1), failure_guard=None
    )
    seen: list[tuple[str, str, str, str | None]] = []

    def guard(workspace_id: str, op: str) -> Callable[[BaseException], None]:
        def settle(exc: BaseException) -> None:
            seen.append((workspace_id, op, str(exc), coord.closed_by(workspace_id)))

        return settle

    coord.failure_guard = guard
    async with coord.exclusive(ACTIVE, "archive"):
        pass
    assert seen == []
    with pytest.raises(RuntimeError):
        async with coord.exclusive(ACTIVE, "archive"):
            raise RuntimeError("the checkout vanished")
    assert seen == [(ACTIVE, "archive", "the checkout vanished", "archive")]
    assert coord.closed_by(ACTIVE) is None


async def test_reservations_are_forgotten_once_nobody_holds_them(store: Store) -> None:
    """Each workspace and project id gets a reservation record while in use; it goes when its
    last user leaves, so a long-running daemon does not keep one per id it ever saw."""
    coord = Coordinator(
        store, wait_s=1, directories=DirectoryExclusion(wait_s=1), failure_guard=None
    )
    async with coord.shared(ACTIVE):
        async with coord.shared(ACTIVE):
            assert set(coord._reservations) == {ACTIVE}
        assert set(coord._reservations) == {ACTIVE}
    async with coord.exclusive(ACTIVE, "archive"):
        pass
    async with coord.project_shared("prj_0000000000000001", label="create"):
        pass
    with pytest.raises(XumError):
        async with coord.shared(MISSING):
            pass
    assert coord._reservations == {}


async def test_a_directory_wait_uses_the_callers_timeout_else_the_default(tmp_path: Path) -> None:
    """An explicit timeout bounds the wait (not the coordinator's default); without one, the
    default does. Each wait is itself under a test deadline, so a wait that ignored its bound
    fails here instead of hanging."""
    coord = Coordinator(
        Store(tmp_path / "s.db"),
        wait_s=0.1,
        directories=DirectoryExclusion(wait_s=0.1),
        failure_guard=None,
    )
    async with coord.directories.directory(tmp_path / "x"):
        with anyio.fail_after(10), pytest.raises(XumError) as info:
            async with coord.directories.directory(tmp_path / "x"):
                pass
        assert info.value.kind.value == "timeout" and "after 0.1s" in info.value.message
    patient = Coordinator(
        Store(tmp_path / "t.db"),
        wait_s=60,
        directories=DirectoryExclusion(wait_s=60),
        failure_guard=None,
    )
    async with patient.directories.directory(tmp_path / "x"):
        with anyio.fail_after(10), pytest.raises(XumError) as info:
            async with patient.directories.directory(tmp_path / "x", timeout=0.2):
                pass
        assert info.value.kind.value == "timeout" and "after 0.2s" in info.value.message


async def test_exclusive_resolves_a_workspace_in_any_state(store: Store) -> None:
    """A structural operation reserves the workspace whatever its state (unarchive needs an
    archived one); `shared` is the one that insists on `active`."""
    coord = Coordinator(
        store, wait_s=1, directories=DirectoryExclusion(wait_s=1), failure_guard=None
    )
    async with coord.exclusive(ARCHIVED, "unarchive") as ref:
        assert ref.id == ARCHIVED
        assert coord.closed_by(ARCHIVED) == "unarchive"


async def test_a_directory_created_meanwhile_is_still_the_same_directory(tmp_path: Path) -> None:
    """Taken before it exists (a creation), the directory keys by its parent and name; taken
    again once it exists, by itself: the same realpath still conflicts although the identity
    part differs, so the second waits (and times out here). `held` names it meanwhile."""
    exclusion = DirectoryExclusion(wait_s=5)
    target = tmp_path / "ws"
    async with exclusion.directory(target) as first:
        target.mkdir()
        second = dir_key(target)
        assert second.realpath == first.realpath and second.identity != first.identity
        assert exclusion.held() == [str(target)]
        with anyio.fail_after(10), pytest.raises(XumError) as info:
            async with exclusion.directory(target, timeout=0.1):
                pass
        assert info.value.kind.value == "timeout"
    assert exclusion.held() == []


async def test_a_wait_on_a_held_directory_is_logged_once_and_a_free_one_never(
    tmp_path: Path,
) -> None:
    # Who waits on a directory is otherwise invisible (a create parked behind a cleanup).
    exclusion = DirectoryExclusion(wait_s=5)
    with structlog.testing.capture_logs() as logs:
        async with exclusion.directory(tmp_path / "x", label="first"):
            with pytest.raises(XumError):
                async with exclusion.directory(tmp_path / "x", timeout=0.1, label="second"):
                    pass
    waits = [e for e in logs if e["event"] == "coordinator.directory_waiting"]
    assert [(e["path"], e["label"]) for e in waits] == [(str(tmp_path / "x"), "second")]
