"""Fencing: may this obligation still act on this directory? (design invariant 4)

Called under the directory exclusion, just before acting. Two checks, both must pass:
- the store: the workspace row still names the obligation's incarnation and is not live (or the
  row is gone and the id is tombstoned), and no live workspace claims the path;
- the disk: the path is a real directory (a symlink is never followed), with the recorded
  filesystem identity (st_dev, st_ino) and an incarnation marker the obligation recorded.
A failed check is an abandon reason: the obligation is closed and the directory left alone.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from xumd.checkouts.marker import read_marker
from xumd.cleanup.obligations import ABANDONED, ObligationRow

LIVE_STATES = ("creating", "active", "restoring")
"""A workspace in one of these states owns its checkout: cleanup never acts on it."""

OWN_STATES = ("archiving", "archived", "removing")
"""States in which a workspace's own (same-incarnation) obligations may act."""

SUPERSEDED = "path now holds another incarnation"
FOREIGN = "directory replaced by a foreign one"


TRANSITIONAL_STATES = ("creating", "restoring")
"""A workspace passing through these may still roll back to the state our fence expects: an
obligation waits (retried with backoff) rather than being abandoned for good."""


@dataclass(frozen=True, slots=True)
class RowProblem:
    reason: str
    final: bool
    """True: abandon. False: not now (a transition in progress may still roll back)."""


class WorkspaceRecords(Protocol):
    """The lifecycle's rows as cleanup reads them (the fence, the planner, the requests). The
    lifecycle sits above cleanup, so the composition root hands an implementation in
    (lifecycle/rows.py's)."""

    def state_of(self, workspace_id: str) -> sqlite3.Row | None:
        """The row's `state` and `incarnation`, if it exists."""
        ...

    def is_tombstoned(self, workspace_id: str) -> bool: ...

    def is_known(self, workspace_id: str) -> bool:
        """A row or a tombstone has this id."""
        ...

    def live_at(self, path: str, other_than: str, states: Sequence[str]) -> sqlite3.Row | None:
        """The `id` and `state` of another row at `path` in one of `states`, if any."""
        ...

    def name_and_setup(self, workspace_id: str) -> sqlite3.Row | None:
        """The row's `name` and `setup_status`, if it exists."""
        ...


def row_problem(records: WorkspaceRecords, ob: ObligationRow) -> RowProblem | None:
    """Why the store does not allow `ob` to act now, or None."""
    if ob.workspace_id:
        row = records.state_of(ob.workspace_id)
        if row is not None:
            transitional = row["state"] in TRANSITIONAL_STATES
            if row["incarnation"] != ob.incarnation:
                return RowProblem(
                    f"{SUPERSEDED} (workspace {ob.workspace_id} was materialised again"
                    + (f", {row['state']})" if transitional else ")"),
                    final=not transitional,
                )
            if row["state"] not in OWN_STATES:
                return RowProblem(
                    f"workspace {ob.workspace_id} is {row['state']} again; cleanup never acts "
                    "on it",
                    final=not transitional,
                )
        elif not records.is_tombstoned(ob.workspace_id):
            return RowProblem(
                f"workspace {ob.workspace_id} is unknown (no row and no tombstone)", final=True
            )
    live = records.live_at(ob.path, ob.workspace_id, LIVE_STATES)
    if live is not None:
        return RowProblem(
            f"{SUPERSEDED} (live workspace {live['id']} is {live['state']} there)",
            final=live["state"] not in TRANSITIONAL_STATES,
        )
    return None


@dataclass(frozen=True, slots=True)
class DirCheck:
    present: bool
    problem: str | None = None

    @property
    def ok(self) -> bool:
        # Not mutated: DirCheck.ok has no caller.
        return self.present and self.problem is None  # pragma: no mutate


def accepted_markers(
    store_siblings: list[ObligationRow], ob: ObligationRow
) -> set[tuple[str, str]]:
    """Markers that prove the directory is the one recorded: the obligation's own and those of
    sibling obligations recorded for the same directory identity (archived workspaces sharing
    one checkout), abandoned ones excepted."""
    found = {(ob.workspace_id, ob.incarnation)}
    found.update((s.workspace_id, s.incarnation) for s in store_siblings if s.state != ABANDONED)
    return found


def check_directory(
    path: Path, identity: tuple[int, int] | None, markers: set[tuple[str, str]]
) -> DirCheck:
    """Inspect `path` without following a symlink placed there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return DirCheck(present=False)
    except OSError as exc:
        return DirCheck(present=True, problem=f"cannot inspect {path}: {exc.strerror}")
    if stat.S_ISLNK(st.st_mode):
        return DirCheck(True, f"{FOREIGN} (a symlink now sits at the path; not followed)")
    if not stat.S_ISDIR(st.st_mode):
        return DirCheck(True, f"{FOREIGN} (not a directory)")
    marker = read_marker(path)
    if marker is not None and (marker.workspace_id, marker.incarnation) not in markers:
        return DirCheck(
            True, f"{SUPERSEDED} (its marker names {marker.workspace_id} {marker.incarnation})"
        )
    if identity is not None and (st.st_dev, st.st_ino) != identity:
        return DirCheck(True, f"{FOREIGN} (filesystem identity changed)")
    if marker is None:
        return DirCheck(True, f"{FOREIGN} (no xum incarnation marker)")
    return DirCheck(True)
