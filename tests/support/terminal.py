"""Driving a command on a real terminal (a PTY): type one line once it has printed anything (its
prompt: the terminal is attached), read until the expected text or a deadline, then its exit."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Mapping, Sequence


def run_on_a_terminal(
    argv: Sequence[str], env: Mapping[str, str], line: bytes, expect: bytes, timeout_s: float
) -> tuple[int, bytes]:
    """(exit code, everything the terminal showed); fails when `expect` never showed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        list(argv),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=dict(env),
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + timeout_s
        sent = False
        while expect not in seen and time.monotonic() < deadline:
            if not sent and seen:  # the shell's prompt: the terminal is attached
                os.write(master, line)
                sent = True
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert expect in seen, seen
        return proc.wait(timeout_s), seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
