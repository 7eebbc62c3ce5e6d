"""Run a piece of the test as another user (uid 65534, `nobody`), in a forked child.

Forked, not a new interpreter: the test's interpreter may live under a 0700 home that `nobody`
cannot enter. The child drops its groups, gid and uid, calls the function, and sends back its
answer (or the exception's repr) through a pipe; it never returns into pytest.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

NOBODY = 65534
DEADLINE_S = 60.0

T = TypeVar("T")


def as_nobody(fn: Callable[[], T]) -> T:
    if os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root (tests run as root in CI)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                answer: tuple[str, object] = ("ok", fn())
            except BaseException as exc:  # reported to the parent, whatever it is
                answer = ("error", repr(exc))
            os.write(write, pickle.dumps(answer))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    data = b""
    deadline = time.monotonic() + DEADLINE_S
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)  # stuck (a lock held at the fork): never hang
                os.waitpid(pid, 0)
                pytest.fail(f"the child as nobody gave no answer in {DEADLINE_S}s")
            chunk = pipe.read(65536)
            if not chunk:
                break
            data += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child as nobody failed to answer"
    kind, value = pickle.loads(data)  # our own forked child's answer
    assert kind == "ok", value
    return value  # type: ignore[no-any-return]
