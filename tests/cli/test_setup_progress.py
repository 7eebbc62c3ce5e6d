"""`xum ws new` / `xum ws unarchive` on a real terminal (a PTY) stream the setup's output while
the daemon is still running it; with --json, or through a pipe, the output is unchanged."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import commit_config, make_repo

XUM = str(Path(sys.executable).parent / "xum")


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    # The setup prints a line, then waits until the test has seen that line on the terminal.
    script = (
        "echo first-line-of-setup; i=0; "
        f"while [ ! -f {ctl}/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
        "printf 'second-line-of-setup'"
    )
    repo = make_repo(tmp_short / "repo")
    commit_config(repo, f"[scripts]\nsetup = [{json.dumps(script)}, 'echo third-line']\n")
    return repo


@pytest.fixture
def daemon(root: Path, repo: Path) -> Iterator[DaemonProcess]:
    write_config(root, "script_timeout_s = 60\n")
    proc = DaemonProcess(root).start()
    try:
        project = proc.call("project.add", {"path": str(repo)})["project"]
        proc.call("project.trust", {"project_id": project["id"]})
        yield proc
    finally:
        proc.close()


class Terminal:
    """`xum ARGS` with a PTY as its stdin/stdout/stderr."""

    def __init__(self, daemon: DaemonProcess, *args: str) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [XUM, "--root", str(daemon.root), *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm", "COLUMNS": "120"},
            start_new_session=True,
        )
        os.close(slave)
        self.seen = b""

    def read_until(self, needle: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.seen and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the other side is closed
                    break
                if not chunk:
                    break
                self.seen += chunk
        assert needle in self.seen, self.seen[-2000:]
        return self.seen

    def finish(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        with_rest = True
        while with_rest:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            try:
                chunk = os.read(self.master, 65536) if ready else b""
            except OSError:
                chunk = b""
            self.seen += chunk
            with_rest = bool(chunk)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def test_new_and_unarchive_stream_setup_output_on_a_terminal(
    daemon: DaemonProcess, ctl: Path
) -> None:
    term = Terminal(daemon, "ws", "new", "repo", "one")
    try:
        term.read_until(b"first-line-of-setup")
        # Shown while the setup still runs: it waits for this file.
        assert b"created one" not in term.seen
        ws = daemon.call("workspace.list")["workspaces"][0]
        assert ws["state"] == "creating" and ws["setup"]["status"] == "running"
        (ctl / "go").touch()
        assert term.finish() == 0, term.seen
        out = term.seen.decode(errors="replace")
        assert "second-line-of-setup" in out and "third-line" in out
        assert "$ echo third-line" in out
        assert out.index("third-line") < out.index("created one")
        assert "setup: ok" in out
    finally:
        term.close()

    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    term = Terminal(daemon, "ws", "unarchive", "repo/one")
    try:
        term.read_until(b"restored one")
        assert term.finish() == 0
        out = term.seen.decode(errors="replace")
        assert out.index("first-line-of-setup") < out.index("restored one")
        assert "third-line" in out
    finally:
        term.close()


def test_json_and_pipes_are_unchanged(daemon: DaemonProcess, ctl: Path) -> None:
    (ctl / "go").touch()
    term = Terminal(daemon, "--json", "ws", "new", "repo", "two")
    try:
        assert term.finish() == 0
        result = json.loads(term.seen.decode())  # nothing but the result's JSON
        assert result["workspace"]["name"] == "two" and result["setup"]["status"] == "ok"
    finally:
        term.close()
    piped = subprocess.run(
        [XUM, "--root", str(daemon.root), "ws", "new", "repo", "three"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert piped.stdout.startswith("created three (ws_")
    assert "first-line-of-setup" not in piped.stdout + piped.stderr
