"""One crash-test world: a root, a repository copied from a template (made once per process),
and a real daemon that can be started with a fault point armed, killed and restarted."""

from __future__ import annotations

import atexit
import shutil
import signal
from pathlib import Path
from typing import Any

from xum_client.errors import XumClientError, XumRpcError

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.wait import until

FAST_CLEANUP = (
    "[cleanup]\nbackoff_initial_s = 0.05\nbackoff_max_s = 0.2\nbackoff_jitter = 0.1\n"
    "poll_interval_s = 0.2\n"
)

_template: Path | None = None


def template_repo() -> Path:
    """A small repository with a tracked tree and ignore rules, made once and copied per test."""
    global _template
    if _template is None:
        base = short_tmpdir("xumt-")
        atexit.register(shutil.rmtree, base, True)
        _template = make_repo(
            base / "repo",
            {
                "README.md": "hello\n",
                "src/app.py": "print('app')\n",
                ".gitignore": "node_modules/\n*.log\n",
            },
        )
    return _template


DIRTY = {
    "README.md": "hello, edited and not staged\n",
    "staged.txt": "staged but not committed\n",
    "notes/untracked.txt": "untracked, not ignored\n",
}


def make_dirty(checkout: Path) -> dict[str, str]:
    """Uncommitted work of three kinds: unstaged edit, staged new file, untracked file."""
    for rel, content in DIRTY.items():
        target = checkout / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    git(checkout, "add", "--", "staged.txt")
    return dict(DIRTY)


class World:
    def __init__(self, base: Path, *, config: str = FAST_CLEANUP) -> None:
        self.base = base
        self.root = base / "root"
        self.repo = base / "repo"
        shutil.copytree(template_repo(), self.repo, symlinks=True)
        write_config(self.root, config)
        self.daemon: DaemonProcess | None = None
        self.project_id = ""
        self.raise_at: str | None = None
        """The point armed in `raise` mode (`XUM_FAULT=<point>:raise`) instead of SIGKILL:
        the drivers then see the operation fail and the daemon live on
        (tests/recovery/test_failure_matrix.py)."""
        self.answers: list[Any] = []
        self.armed_raise = False

    # -- daemon ----------------------------------------------------------------------------------

    def start(self, fault: str | None = None, *, wait_ready: bool = True) -> DaemonProcess:
        if self.daemon is not None:
            self.daemon.close()
        self.armed_raise = bool(fault and fault == self.raise_at)
        if self.armed_raise:
            fault = f"{fault}:raise"
        env = {"XUM_FAULT": fault} if fault else {}
        self.daemon = DaemonProcess(self.root, env=env, log_level="info")
        self.daemon.start(wait_ready=wait_ready)
        return self.daemon

    @property
    def d(self) -> DaemonProcess:
        assert self.daemon is not None
        return self.daemon

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.d.call(method, params)

    def try_call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | XumRpcError:
        try:
            return self.call(method, params)
        except XumRpcError as exc:
            return exc

    def expect_killed(self, method: str, params: dict[str, Any]) -> None:
        """The call must not answer: the daemon dies by SIGKILL at the armed point. In raise
        mode it answers (an error, or success when the point lies after the commit) and the
        daemon lives on."""
        if self.armed_raise:
            self.answers.append(self.try_call(method, params))
            assert self.d.proc is not None and self.d.proc.poll() is None, (
                f"{method}: the daemon died after a raised fault; log tail:\n"
                + self.d.log_text()[-3000:]
            )
            return
        try:
            answer = self.call(method, params)
        except (XumClientError, OSError):
            answer = None
        code = self.d.wait(30)
        assert code == -signal.SIGKILL, (
            f"{method}: daemon exited with {code}, not by SIGKILL (answer {answer}); log tail:\n"
            + self.d.log_text()[-3000:]
        )

    def wait_killed(self) -> None:
        code = self.d.wait(30)
        assert code == -signal.SIGKILL, f"daemon exited with {code}: {self.d.log_text()[-3000:]}"

    def close(self) -> None:
        if self.daemon is not None:
            # Stop the daemon's own children first (a spawned process must not outlive a test).
            if self.daemon.proc is not None and self.daemon.proc.poll() is None:
                try:
                    for proc in self.call("process.list", {}).get("processes", []):
                        if proc.get("state") in ("running", "stopping", "pending_stop"):
                            self.try_call("process.stop", {"process_id": proc["id"]})
                except (XumClientError, OSError):
                    pass
            self.daemon.close()
            self.daemon = None

    # -- helpers ---------------------------------------------------------------------------------

    def add_project(self) -> str:
        self.project_id = self.call("project.add", {"path": str(self.repo)})["project"]["id"]
        return self.project_id

    def create(self, name: str, **extra: Any) -> dict[str, Any]:
        ws: dict[str, Any] = self.call(
            "workspace.create", {"project_id": self.project_id, "name": name, **extra}
        )["workspace"]
        return ws

    def workspaces(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call("workspace.list", {})["workspaces"]
        return found

    def ws(self, workspace_id: str) -> dict[str, Any] | None:
        for w in self.workspaces():
            if w["id"] == workspace_id:
                return w
        return None

    def finish_cleanup(self, timeout: float = 20.0) -> None:
        """Let pending cleanup run to the end (retry now rather than wait for the backoff)."""

        def done() -> bool:
            pending = self.call("cleanup.list", {"state": "pending"})["obligations"]
            if not pending:
                return True
            self.try_call("cleanup.retry", {})
            return False

        until(done, timeout=timeout, interval=0.1, message="pending cleanup to finish")
