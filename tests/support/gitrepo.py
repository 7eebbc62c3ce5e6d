"""Real git repositories made by tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "xum test",
    "GIT_AUTHOR_EMAIL": "test@xum.invalid",
    "GIT_COMMITTER_NAME": "xum test",
    "GIT_COMMITTER_EMAIL": "test@xum.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    import os

    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in (files or {"README.md": "hello\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def commit_config(repo: Path, text: str, message: str = "xum config") -> None:
    """Commit `text` as the project's `.xum/config.toml` (what the daemon reads at a checkout's
    commit) into `repo`."""
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text(text)
    git(repo, "add", ".xum/config.toml")
    git(repo, "commit", "-q", "-m", message)
