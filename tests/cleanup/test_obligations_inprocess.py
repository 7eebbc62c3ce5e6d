"""The obligation rows' due times and the store reads the retry service and the start-up pass
make, on a real migrated Store (no daemon, no clock but the numbers given): a step made due, a
failed attempt's count and bounded error, an interrupted one, a write that lost to another (the
row as stored comes back), the later steps held back and released, the next due time, and the
trash entries a pending step still names. The fast selection `make mutate` runs for
cleanup/obligations.py (about a second), beside the service tests that use the same calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.cleanup.obligations import (
    ABANDONED,
    COMPLETED,
    ERROR_LIMIT,
    PENDING,
    ObligationRow,
    Obligations,
    bound_error,
)

from tests.cleanup.test_support import make_app

NOW = 1_000_000.0


@pytest.fixture
def obs(tmp_path: Path) -> Iterator[Obligations]:
    app = make_app(tmp_path / "root")
    yield Obligations(app.store)
    app.store.close()


def add(
    obs: Obligations,
    wid: str,
    seq: int,
    kind: str = "trash",
    *,
    path: str = "/w/a",
    due: float = NOW,
    detail: dict[str, Any] | None = None,
    ino: int | None = 7,
) -> ObligationRow:
    row = ObligationRow.due_now(
        id=f"ob_{wid}_{seq}_{kind}",
        workspace_id=wid,
        project_id="prj_1",
        kind=kind,
        seq=seq,
        path=path,
        dev=1,
        ino=ino,
        incarnation="inc",
        detail=detail or {},
        now=NOW,
    )
    with obs.store.transaction():
        obs.insert(row)
    if due != NOW:
        obs.defer([row.id], due)
    stored = obs.get(row.id)
    assert stored is not None
    return stored


def due_times(obs: Obligations, wid: str) -> list[float]:
    return [r.next_attempt_at for r in obs.for_workspace(wid)]


# -- a row's error and its due time ---------------------------------------------------------------


def test_an_error_within_the_limit_is_kept_whole() -> None:
    assert bound_error("x" * 40, 40) == "x" * 40
    assert bound_error("short") == "short"


def test_a_longer_error_keeps_a_quarter_of_its_head_line_and_its_tail() -> None:
    text = "H" * 30 + "\n" + "m" * 50 + "T" * 23
    assert bound_error(text, 40) == "H" * 10 + "\n[...]\n" + "T" * 23
    assert bound_error(text[:41], 40) == "H" * 10 + "\n[...]\n" + text[41 - 23 : 41]
    bounded = bound_error("first line\n" + "y" * 10_000)
    assert len(bounded) == ERROR_LIMIT
    assert bounded.startswith("first line\n[...]\nyyy")


def test_a_new_step_is_pending_never_attempted_and_due_at_once(obs: Obligations) -> None:
    row = add(obs, "ws_a", 0)
    assert (row.state, row.attempts, row.next_attempt_at) == (PENDING, 0, NOW)
    assert (row.last_error, row.reason, row.created_at, row.updated_at) == (None, None, NOW, NOW)


def test_a_failed_attempt_counts_and_backs_off_and_a_cut_short_one_does_neither(
    obs: Obligations,
) -> None:
    row = add(obs, "ws_a", 0)
    first = obs.fail_attempt(row, NOW + 1, NOW + 11, "teardown failed\n" + "e" * 5000)
    assert (first.attempts, first.next_attempt_at, first.updated_at) == (1, NOW + 11, NOW + 1)
    assert first.last_error is not None and len(first.last_error) == ERROR_LIMIT
    second = obs.fail_attempt(first, NOW + 12, NOW + 32, "again")
    assert (second.attempts, second.last_error) == (2, "again")
    assert obs.get(row.id) == second
    cut = obs.cut_short(second, NOW + 13, "interrupted")
    assert (cut.attempts, cut.next_attempt_at, cut.last_error) == (2, NOW + 13, "interrupted")
    assert obs.get(row.id) == cut


def test_make_due_brings_a_deferred_step_forward_without_an_attempt(obs: Obligations) -> None:
    row = add(obs, "ws_a", 0, "reclaim", due=NOW + 3600)
    made = obs.make_due(row, NOW + 5)
    assert (made.next_attempt_at, made.attempts, made.state) == (NOW + 5, 0, PENDING)
    assert obs.get(row.id) == made
    assert obs.due_workspaces(NOW + 5, ["reclaim"], after=None, limit=10) == ["ws_a"]


def test_a_write_that_lost_to_another_returns_the_row_as_stored(obs: Obligations) -> None:
    row = add(obs, "ws_a", 0)
    done = obs.complete(row, NOW + 1, {"bytes": 5})
    assert done.state == COMPLETED
    # The stale row (still pending in the caller's hands) changes nothing.
    assert obs.make_due(row, NOW + 2) == done
    assert obs.fail_attempt(row, NOW + 2, NOW + 9, "late") == done
    assert obs.abandon(row, NOW + 2, "late") == done
    assert obs.get(row.id) == done


def test_a_write_to_a_row_that_is_gone_returns_the_callers_row(obs: Obligations) -> None:
    row = add(obs, "ws_a", 0)
    with obs.store.transaction():
        obs.store.execute("DELETE FROM cleanup_obligations WHERE id = ?", (row.id,))
    assert obs.make_due(row, NOW + 2) == row


# -- due times across a workspace's steps ---------------------------------------------------------


def test_later_steps_are_deferred_behind_an_earlier_one_and_released_when_it_finishes(
    obs: Obligations,
) -> None:
    first = add(obs, "ws_a", 0, "teardown")
    add(obs, "ws_a", 1, "trash")
    add(obs, "ws_a", 2, "reclaim")
    add(obs, "ws_b", 1, "trash")
    later = NOW + 60
    obs.defer_later_steps("ws_a", 0, later)
    assert due_times(obs, "ws_a") == [NOW, later, later]
    assert due_times(obs, "ws_b") == [NOW]
    obs.defer_later_steps("ws_a", 0, NOW + 30)  # never brought forward by a deferral
    assert due_times(obs, "ws_a") == [NOW, later, later]
    assert obs.release_later_steps("ws_a", 0, NOW + 1) == 2
    assert due_times(obs, "ws_a") == [NOW, NOW + 1, NOW + 1]
    assert first.next_attempt_at == NOW


def test_a_lane_defers_only_its_own_kinds(obs: Obligations) -> None:
    add(obs, "ws_a", 0, "teardown")
    add(obs, "ws_a", 1, "trash")
    add(obs, "ws_a", 2, "reclaim")
    obs.defer_later_steps("ws_a", 0, NOW + 60, kinds=["reclaim"])
    assert due_times(obs, "ws_a") == [NOW, NOW, NOW + 60]
    obs.defer_later_steps("ws_a", 0, NOW + 90, kinds=["trash", "reclaim"])
    assert due_times(obs, "ws_a") == [NOW, NOW + 90, NOW + 90]


def test_a_release_keeps_a_failed_steps_own_backoff(obs: Obligations) -> None:
    add(obs, "ws_a", 0, "teardown")
    failed = add(obs, "ws_a", 1, "trash")
    obs.fail_attempt(failed, NOW, NOW + 100, "busy")
    add(obs, "ws_a", 2, "reclaim", due=NOW + 100)
    assert obs.release_later_steps("ws_a", 0, NOW + 1) == 1
    assert due_times(obs, "ws_a") == [NOW, NOW + 100, NOW + 1]


def test_a_finished_teardown_releases_the_siblings_it_blocked(obs: Obligations) -> None:
    teardown = add(obs, "ws_a", 0, "teardown")
    sibling = add(obs, "ws_b", 0, "trash", due=NOW + 60)
    assert obs.blocking_teardown(sibling) == teardown
    add(obs, "ws_c", 0, "trash", path="/w/other", due=NOW + 60)
    add(obs, "ws_d", 0, "reclaim", due=NOW + 60)
    assert obs.release_blocked_siblings(teardown, NOW + 1) == 1
    assert due_times(obs, "ws_b") == [NOW + 1]
    assert due_times(obs, "ws_c") == due_times(obs, "ws_d") == [NOW + 60]


def test_defer_moves_only_the_named_steps_and_never_earlier(obs: Obligations) -> None:
    a = add(obs, "ws_a", 0)
    b = add(obs, "ws_b", 0, due=NOW + 100)
    add(obs, "ws_c", 0)
    obs.defer([a.id, b.id], NOW + 50)
    assert [due_times(obs, w) for w in ("ws_a", "ws_b", "ws_c")] == [
        [NOW + 50],
        [NOW + 100],
        [NOW],
    ]


def test_the_next_due_time_is_the_earliest_pending_one_of_the_kinds(obs: Obligations) -> None:
    assert obs.next_due(["trash"]) is None
    add(obs, "ws_a", 0, "trash", due=NOW + 30)
    add(obs, "ws_b", 0, "trash", due=NOW + 20)
    add(obs, "ws_c", 0, "reclaim", due=NOW + 10)
    done = add(obs, "ws_d", 0, "trash", due=NOW + 5)
    obs.complete(done, NOW, {})
    assert obs.next_due(["trash"]) == NOW + 20
    assert obs.next_due(["trash", "reclaim"]) == NOW + 10
    assert obs.next_due(["prune"]) is None


def test_due_workspaces_rotate_from_the_cursor(obs: Obligations) -> None:
    for wid in ("ws_a", "ws_b", "ws_c"):
        add(obs, wid, 0)
    add(obs, "ws_d", 0, due=NOW + 1)
    assert obs.due_workspaces(NOW, ["trash"], after=None, limit=2) == ["ws_a", "ws_b"]
    assert obs.due_workspaces(NOW, ["trash"], after="ws_b", limit=2) == ["ws_c"]
    assert obs.due_workspaces(NOW, ["reclaim"], after=None, limit=2) == []


# -- start-up: a wall clock that stepped, old rows, the trash entries still named ----------------


def test_future_retries_are_clamped_and_every_pending_time_shifted(obs: Obligations) -> None:
    add(obs, "ws_a", 0, due=NOW + 10)
    add(obs, "ws_b", 0, due=NOW + 10_000)
    done = add(obs, "ws_c", 0, due=NOW + 10_000)
    obs.complete(done, NOW, {})
    assert obs.clamp_future(NOW + 100) == 1
    assert obs.shift_pending(-5.0) == 2
    assert [due_times(obs, w) for w in ("ws_a", "ws_b", "ws_c")] == [
        [NOW + 5],
        [NOW + 95],
        [NOW + 10_000],
    ]


def test_finished_rows_are_forgotten_after_a_while_unless_their_workspace_still_owes_one(
    obs: Obligations,
) -> None:
    old = add(obs, "ws_a", 0)
    obs.complete(old, NOW, {})
    gave_up = add(obs, "ws_b", 0)
    obs.abandon(gave_up, NOW, "gone")
    kept = add(obs, "ws_c", 0)
    obs.complete(kept, NOW, {})
    add(obs, "ws_c", 1)
    assert obs.purge_finished(NOW + 1, NOW) == 1  # abandoned rows are kept longer
    assert obs.get(old.id) is None and obs.get(kept.id) is not None
    assert obs.purge_finished(NOW + 1, NOW + 1) == 1
    assert obs.get(gave_up.id) is None
    assert obs.count(ABANDONED) == 0 and obs.count(PENDING) == 1


def test_unfinished_paths_are_those_of_pending_and_failed_steps(obs: Obligations) -> None:
    add(obs, "ws_a", 0, path="/w/pending")
    done = add(obs, "ws_b", 0, path="/w/done")
    obs.complete(done, NOW, {})
    failed = add(obs, "ws_c", 0, path="/w/failed")
    with obs.store.transaction():
        obs.store.execute(
            "UPDATE cleanup_obligations SET state = 'failed' WHERE id = ?", (failed.id,)
        )
    assert obs.unfinished_paths() == {"/w/pending", "/w/failed"}


def set_detail_text(obs: Obligations, ob: ObligationRow, text: str) -> None:
    with obs.store.transaction():
        obs.store.execute("UPDATE cleanup_obligations SET detail = ? WHERE id = ?", (text, ob.id))


def test_the_trash_entries_pending_steps_name_skip_a_broken_detail(obs: Obligations) -> None:
    # Broken details first (the earliest due: read first), then the ones that name entries.
    set_detail_text(obs, add(obs, "ws_0", 0, "reclaim", due=NOW - 2), "{not json")
    set_detail_text(obs, add(obs, "ws_1", 0, "reclaim", due=NOW - 1), "[1, 2]")
    add(obs, "ws_2", 0, "trash", detail={"trash_path": "/t/own"})
    moved = add(obs, "ws_3", 0, "trash", detail={"trash_path": "/t/moved"})
    obs.complete(moved, NOW, {})
    add(obs, "ws_3", 1, "reclaim", detail={"trash_ob": moved.id})
    broken = add(obs, "ws_4", 0, "trash")
    set_detail_text(obs, broken, "{not json")
    add(obs, "ws_4", 1, "reclaim", detail={"trash_ob": broken.id})
    listed = add(obs, "ws_5", 0, "trash")
    set_detail_text(obs, listed, "[1]")
    add(obs, "ws_5", 1, "reclaim", detail={"trash_ob": listed.id})
    named = add(obs, "ws_6", 0, "trash", detail={"trash_path": "/t/after"})
    obs.complete(named, NOW, {})
    add(obs, "ws_6", 1, "reclaim", detail={"trash_ob": named.id})
    add(obs, "ws_7", 0, "reclaim", detail={"trash_path": 5})  # not a path: nothing
    finished = add(obs, "ws_8", 0, "trash", detail={"trash_path": "/t/finished"})
    obs.complete(finished, NOW, {})
    assert obs.referenced_trash_paths() == {"/t/own", "/t/moved", "/t/after"}


def test_the_trash_entries_named_by_many_reclaims_are_all_found(obs: Obligations) -> None:
    """More reclaims than one statement asks about (500 ids a statement): each batch read."""
    count = 1001
    with obs.store.transaction():
        for i in range(count):
            for seq, kind, detail in (
                (0, "trash", {"trash_path": f"/t/{i}"}),
                (1, "reclaim", {"trash_ob": f"ob_{i}_0"}),
            ):
                row = ObligationRow.due_now(
                    id=f"ob_{i}_{seq}",
                    workspace_id=f"ws_{i:04}",
                    project_id="prj_1",
                    kind=kind,
                    seq=seq,
                    path=f"/w/{i}",
                    dev=1,
                    ino=i,
                    incarnation="inc",
                    detail=detail,
                    now=NOW + i,
                )
                obs.insert(row)
        obs.store.execute("UPDATE cleanup_obligations SET state = 'completed' WHERE seq = 0")
    assert obs.referenced_trash_paths() == {f"/t/{i}" for i in range(count)}


def test_a_rows_detail_is_json(obs: Obligations) -> None:
    row = add(obs, "ws_a", 0, detail={"b": 1, "a": [2]})
    stored = obs.store.one("SELECT detail FROM cleanup_obligations WHERE id = ?", (row.id,))
    assert stored is not None and json.loads(stored["detail"]) == {"a": [2], "b": 1}
    assert row.detail == {"a": [2], "b": 1}


def test_an_obligation_row_reads_back_as_written(obs: Obligations, tmp_path: Path) -> None:
    row = add(obs, "ws_a", 3, "reclaim", path=str(tmp_path), ino=None)
    assert (row.seq, row.kind, row.path, row.identity) == (3, "reclaim", str(tmp_path), None)
    assert add(obs, "ws_b", 0).identity == (1, 7)
