"""Synthetic git repositories for the benchmarks: deterministic, realistic enough to cost what a
real one costs (nested directories, file sizes from a few bytes to a few KiB, one commit).

`make_template(path, files)` builds one repository; `copy(template, dest)` makes an identical
copy (same objects, same index with the same stat data refreshed), so xum and the bare-git floor
each work on their own, identical repository.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "xum bench",
    "GIT_AUTHOR_EMAIL": "bench@xum.invalid",
    "GIT_COMMITTER_NAME": "xum bench",
    "GIT_COMMITTER_EMAIL": "bench@xum.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


# One git call of the bench (an add, a commit of a few thousand files): minutes would mean it hung.
GIT_TIMEOUT_S = 300.0


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV, **(env or {})},
        check=False,
        timeout=GIT_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout


def _layout(files: int, rng: random.Random) -> list[str]:
    # About 20 files per directory, directories nested up to four deep, like a source tree.
    names: list[str] = []
    for index in range(files):
        depth = 1 + index % 4
        parts = [f"d{(index // 20) % (7**level) % 97}" for level in range(1, depth + 1)]
        ext = rng.choice([".py", ".ts", ".md", ".json", ".c", ".h", ".txt"])
        names.append("/".join([*parts, f"f{index}{ext}"]))
    return names


def make_template(path: Path, files: int, seed: int = 7) -> Path:
    rng = random.Random(seed)
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "gc.auto", "0")  # no background gc racing the measurements
    words = [f"token{i}" for i in range(512)]
    for name in _layout(files, rng):
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        size = int(rng.lognormvariate(6.5, 1.0)) % 8192 + 16
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        target.write_text((line * (size // len(line) + 1))[:size])
    (path / ".gitignore").write_text("node_modules/\n*.log\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "synthetic tree")
    git(path, "gc", "-q")
    return path


def copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    git(dest, "update-index", "-q", "--refresh")  # stat data of the copies, as for a real clone
    return dest


def dirty(checkout: Path, count: int = 10) -> None:
    """Modify `count` tracked files and add `count` untracked ones (and one ignored file), the
    same way in every checkout, so every snapshot saves the same work."""
    tracked = sorted(p for p in checkout.rglob("f*.*") if ".git" not in p.parts)[:count]
    for index, target in enumerate(tracked):
        with target.open("a") as handle:
            handle.write(f"edit {index}\n")
    for index in range(count):
        (checkout / f"untracked-{index}.txt").write_text(f"new work {index}\n" * 20)
    (checkout / "debug.log").write_text("ignored\n")
