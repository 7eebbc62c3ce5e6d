"""Measure the startup recovery pass on a root with many workspaces (default 10,000).

    .venv/bin/python -m tests.crash.measure_recovery [N]

Builds a root whose store holds N workspace rows (directory runtime: a real directory with its
marker and recorded identity per row; 1% left `creating` by a "crash", half of those with their
directory), starts a real xumd, and prints the pass's own timing (`daemon.status`
details.recovery.last_pass.ms: reconciling every row) and the whole startup step (reconcile + the
strays scan) from the daemon log. Entry point for the bench: `measure(n) -> dict`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from xumd.store import Store

from tests.support.daemon import DaemonProcess, short_tmpdir


def populate(root: Path, plain: Path, n: int) -> None:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(root / "state.db")
    store.migrate()
    st = plain.stat()
    now = time.time()
    project_id = "prj_" + secrets.token_hex(8)
    wdir = root / "workspaces" / "plain"
    wdir.mkdir(parents=True)
    with store.transaction():
        store.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
            " VALUES (?, 'plain', ?, ?, ?, 'directory', ?, ?)",
            (project_id, str(plain), st.st_dev, st.st_ino, now, now),
        )
        for i in range(n):
            wid = "ws_" + secrets.token_hex(8)
            inc = secrets.token_hex(16)
            path = wdir / f"w{i}"
            creating = i % 100 == 0
            dev = ino = None
            if not (creating and i % 200 == 0):
                path.mkdir()
                (path / ".xum-incarnation").write_text(f"xum {wid} {inc}\n")
                pst = path.stat()
                dev, ino = pst.st_dev, pst.st_ino
            store.execute(
                "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation,"
                " dev, ino, setup_status, created_at, updated_at)"
                " VALUES (?, ?, ?, 'directory', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    wid,
                    project_id,
                    f"w{i}",
                    str(path),
                    "creating" if creating else "active",
                    inc,
                    None if creating else dev,
                    None if creating else ino,
                    "running" if creating else "ok",
                    now,
                    now,
                ),
            )
    store.close()


def measure(n: int = 10_000) -> dict[str, Any]:
    base = short_tmpdir("xumm-")
    try:
        plain = base / "plain"
        plain.mkdir()
        root = base / "root"
        populate(root, plain, n)
        daemon = DaemonProcess(root, log_level="info")
        started = time.perf_counter()
        daemon.start(timeout=120)
        ready_s = time.perf_counter() - started
        try:
            status = daemon.call("daemon.status")["details"]["recovery"]
        finally:
            daemon.close()
        step_ms = None
        for line in daemon.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "daemon.startup_step" and entry.get("step") == "recovery":
                step_ms = entry.get("ms")
        return {
            "workspaces": n,
            "reconcile_ms": status["last_pass"]["ms"],
            "startup_step_ms": step_ms,
            "ready_s": round(ready_s, 3),
            "flagged_interrupted": status["interrupted"],
            "actions": status["last_pass"]["actions"],
        }
    finally:
        if not os.environ.get("XUM_KEEP_TMP"):
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000), indent=2))
