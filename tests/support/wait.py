"""Waiting in tests: on a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


def until(
    condition: Callable[[], T],
    timeout: float = 20.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


async def wait_for(condition: Callable[[], T], timeout: float = 10.0) -> T:
    """`until` inside an event loop: poll `condition` under an anyio deadline (never a bare
    sleep), without blocking the loop between looks."""
    with anyio.fail_after(timeout):
        while not (value := condition()):
            await anyio.sleep(0.02)
    return value
