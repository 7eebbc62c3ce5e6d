"""Planning cleanup obligations: the ordered steps that remove a checkout, and reclaims for trash
entries that no obligation names (left by a crash between a move and its record).

A checkout's plan is inserted inside the caller's transaction, so the logical change and its
obligations commit together; they are attempted, and announced, only after that commit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xumd.base import logs
from xumd.checkouts.marker import worktree_admin_dir
from xumd.cleanup import trash_area
from xumd.cleanup.fence import WorkspaceRecords
from xumd.cleanup.obligations import ObligationRow, Obligations, new_id
from xumd.cleanup.outcomes import OutcomeRecorder
from xumd.cleanup.schedule import Clock
from xumd.store import Store

log = logs.get("xumd.cleanup")

TeardownEnv = Callable[[str], dict[str, str]]
"""The workspace's variables as they are now, kept in its teardown obligation (its teardown may
run after its row, ports and env are gone). The lifecycle's (`wsenv.frozen`), which owns them;
handed in by the composition root."""


class Planner:
    def __init__(
        self,
        store: Store,
        obligations: Obligations,
        recorder: OutcomeRecorder,
        clock: Clock,
        *,
        trash_dir: Path,
        teardown_env: TeardownEnv,
        records: WorkspaceRecords,
    ) -> None:
        self.store = store
        self.obligations = obligations
        self.recorder = recorder
        self.clock = clock
        self.trash_dir = trash_dir
        self.teardown_env = teardown_env
        self.records = records

    def plan_checkout_removal(
        self,
        *,
        workspace_id: str,
        project_id: str,
        incarnation: str,
        runtime: str,
        repo_path: Path,
        checkout: Path,
        dev: int | None,
        ino: int | None,
        teardown: bool,
    ) -> list[str]:
        """Insert the ordered obligations (teardown?, trash, reclaim) for one checkout. Called
        inside the caller's `store.transaction()`, so the logical change and its obligations
        commit together; they are attempted only after that commit."""
        now = self.clock.time()
        row = self.records.name_and_setup(workspace_id)
        admin = worktree_admin_dir(checkout) if runtime == "worktree" else None
        base = {"runtime": runtime, "repo": str(repo_path), "name": row["name"] if row else ""}
        seq = self.obligations.next_seq(workspace_id)
        planned: list[ObligationRow] = []

        def add(kind: str, detail: dict[str, Any], ob_id: str | None = None) -> str:
            ob = ObligationRow.due_now(
                id=ob_id or new_id(),
                workspace_id=workspace_id,
                project_id=project_id,
                kind=kind,
                seq=seq + len(planned),
                path=str(checkout),
                dev=dev,
                ino=ino,
                incarnation=incarnation,
                detail={**base, **detail},
                now=now,
            )
            planned.append(ob)
            return ob.id

        with self.store.transaction():
            if teardown:
                # Whether setup ran decides what an untrusted config means at teardown time.
                # Its environment too: a removed workspace's teardown runs after its row (and
                # the ports and env released with it) is gone.
                add(
                    "teardown",
                    {
                        "setup_status": row["setup_status"] if row else None,
                        "env": self.teardown_env(workspace_id),
                    },
                )
            trash_id = new_id()
            add(
                "trash",
                {
                    "trash_path": str(self.trash_dir / trash_id),
                    "admin_dir": str(admin) if admin else None,
                },
                trash_id,
            )
            add("reclaim", {"trash_ob": trash_id})
            for ob in planned:
                self.obligations.insert(ob)
        ids = [ob.id for ob in planned]
        self.recorder.announce_later(ids)
        return ids

    def adopt_orphan_trash(self, now: float) -> None:
        """A reclaim for each trash entry no obligation names (a crash between move and record).
        Only real directories: a symlink in the trash is never followed."""
        try:
            entries = list(os.scandir(self.trash_dir))
        except FileNotFoundError:
            return
        known = self.obligations.referenced_trash_paths()
        for entry in entries:
            if entry.path in known or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            ob = ObligationRow.due_now(
                id=new_id(),
                workspace_id="",
                project_id="",
                kind="reclaim",
                seq=0,
                path=entry.path,
                dev=st.st_dev,
                ino=st.st_ino,
                incarnation="",
                detail={
                    "trash_path": entry.path,
                    "orphan": True,
                    "trash_mount": trash_area.area_mount(self.trash_dir),
                },
                now=now,
            )
            with self.store.transaction():
                self.obligations.insert(ob)
            log.info("cleanup.orphan_trash_adopted", obligation=ob.id, path=entry.path)
            self.recorder.announce_later([ob.id])
