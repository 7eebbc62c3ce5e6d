"""A root with many workspaces on record, written straight into the real schema: thousands of
rows in well under a second, where `workspace.create` takes tens of milliseconds each. The rows
are archived directory workspaces of one project, so the start-up pass finds nothing to
reconcile (an archived workspace has no checkout), each as the daemon leaves one made by
`workspace.create` (no setup) and `workspace.archive` a day later, once its completed cleanup
steps are purged: the setup's outcome and the cleanup status it keeps are stored, the archived
directory's identity kept. `tests/bench/test_rows.py` compares a row with one a real daemon
wrote through the API, column for column.

    python -m tests.support.manyrows ROOT COUNT     # prints the project's id

Run it before the daemon starts on ROOT (it migrates the store itself), or on a stopped one.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

from xumd.store import Store

PROJECT_ID = "prj_00000000000000b1"

# What the daemon stores for a workspace created without a setup, then archived: the setup's
# outcome, the version after create's and archive's commits, and (reclaim's byte count apart)
# the cleanup status it keeps.
SETUP_OUTPUT = json.dumps(
    {"output": "", "error": None, "config_hash": None, "hint": None, "commands": 0, "leftovers": []}
)
VERSION = 7
RECLAIMED_BYTES = 57


def kept_status(reclaimed: int) -> str:
    return json.dumps(
        {
            "status": "completed",
            "attempts": 0,
            "next_attempt_at": None,
            "last_error": None,
            "reason": None,
            "reclaim": {"status": "completed", "bytes": reclaimed},
            "obligations": [],
        }
    )


def populate(root: Path, count: int) -> str:
    """`count` archived workspaces `m0`..`m{count-1}` of one project (a real directory beside
    ROOT, `many`), in that listing order. Returns the project's id."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    project_dir = root.parent / "many"
    project_dir.mkdir(exist_ok=True)
    st = project_dir.stat()
    now = time.time()
    store = Store(root / "state.db")
    store.slow_ms = float("inf")  # its warning would go to stdout, where the id is printed
    try:
        store.migrate()
        with store.transaction() as db:
            db.execute(
                "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
                " VALUES (?, 'many', ?, ?, ?, 'directory', ?, ?)",
                (PROJECT_ID, str(project_dir), st.st_dev, st.st_ino, now, now),
            )
            base = root / "workspaces" / "many"
            kept = kept_status(RECLAIMED_BYTES)
            db.executemany(
                "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation,"
                " dev, ino, setup_status, setup_output, last_cleanup, version, created_at,"
                " updated_at)"
                " VALUES (?, ?, ?, 'directory', ?, 'archived', ?, ?, ?, 'none', ?, ?, ?, ?, ?)",
                [
                    (
                        f"ws_{secrets.token_hex(8)}",
                        PROJECT_ID,
                        f"m{index}",
                        str(base / f"m{index}"),
                        secrets.token_hex(16),
                        st.st_dev,
                        st.st_ino + 1 + index,  # the archived directory's, gone since
                        SETUP_OUTPUT,
                        kept,
                        VERSION,
                        now + index * 1e-3,
                        now + index * 1e-3,
                    )
                    for index in range(count)
                ],
            )
    finally:
        store.close()
    return PROJECT_ID


if __name__ == "__main__":
    print(populate(Path(sys.argv[1]), int(sys.argv[2])))
