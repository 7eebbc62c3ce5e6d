"""The TypeScript client (clients/ts) and the VS Code extension's logic (clients/vscode): their
node test suites, run against real xumd processes (each suite starts its own daemons on temp
roots, with this interpreter's xumd).

Needs Node >= 20 and the packages from the lockfiles (`make ts-deps`, which `make test` runs when
npm is present); skips saying which is missing otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _node_major() -> int | None:
    node = shutil.which("node")
    if node is None:
        return None
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    try:
        return int(out.strip().lstrip("v").split(".")[0])
    except ValueError:
        return None


def _run_suite(package: str) -> None:
    major = _node_major()
    if major is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (CI installs them; see docs/DEVELOPING.md)")
    if major < 20:
        pytest.skip(f"node {major} is too old: the suites need Node >= 20 (node --test)")
    directory = REPO / "clients" / package
    for needed in ("ts", package):
        if not (REPO / "clients" / needed / "node_modules").is_dir():
            pytest.skip(f"clients/{needed}/node_modules is missing: run `make ts-deps` (npm ci)")
    env = {**os.environ, "XUMD": f"{sys.executable} -m xumd", "XUM_PYTHON": sys.executable}
    env.pop("XUM_SOCKET", None)
    env.pop("XUM_ROOT", None)
    proc = subprocess.run(
        ["npm", "test", "--silent"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        f"npm test in clients/{package} failed ({proc.returncode}):\n"
        f"{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"
    )
    # The runner's summary: every test ran and passed, none skipped silently.
    assert "# fail 0" in proc.stdout, proc.stdout[-4000:]
    assert "# pass 0" not in proc.stdout, proc.stdout[-4000:]


# Each suite starts a dozen daemons: well over the default per-test timeout on a loaded machine.
@pytest.mark.timeout(900)
def test_typescript_client_against_a_real_daemon() -> None:
    _run_suite("ts")


@pytest.mark.timeout(900)
def test_vscode_extension_logic_against_a_real_daemon() -> None:
    _run_suite("vscode")
