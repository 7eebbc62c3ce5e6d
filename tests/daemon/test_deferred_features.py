"""Features built at their first request (`xumd.rpc.deferred`: gc, disk usage), with a real
daemon: every method answers properly when its code loads on that very call; a failed load is a
clear `internal` answer and the daemon keeps serving (and loads on the next call); concurrent
first calls load once; nothing of them is imported before readiness
(tests/daemon/test_startup_cost.py
counts the rest)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from xum_protocol.errors import ErrorKind, StdCode
from xum_protocol.methods import METHODS

from tests.support.daemon import DaemonProcess
from tests.support.raw import ask as raw_ask
from tests.support.raw import first_calls_together
from tests.support.wait import until

NOT_CALLED = {"daemon.shutdown"}  # called last, on its own


def ask(daemon: DaemonProcess, method: str, params: Any = None, request_id: int = 1) -> Any:
    return raw_ask(daemon.socket_path, method, params, request_id)


def loaded(daemon: DaemonProcess) -> list[str]:
    """The features the daemon logged as built at a first request, in order."""
    features = []
    for line in daemon.log_text().splitlines():
        if '"rpc.feature_loaded"' in line:
            features.append(json.loads(line)["feature"])
    return features


def test_every_method_answers_properly_when_its_code_loads_on_that_call(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        capabilities = ask(daemon, "hello", {"protocol": "1.0"})["result"]["capabilities"]
        # Every method of the protocol is routed from the start, deferred or not.
        assert set(capabilities) == set(METHODS)
        assert loaded(daemon) == []
        for method in sorted(set(METHODS) - NOT_CALLED):
            # An empty params object: a valid call for some, bad params for the rest; either
            # is a proper answer. What may never come: an internal error, an unknown method.
            reply = ask(daemon, method, {})
            assert reply["id"] == 1, (method, reply)
            if "error" in reply:
                assert reply["error"]["code"] != StdCode.METHOD_NOT_FOUND, (method, reply)
                assert reply["error"]["data"]["kind"] != ErrorKind.INTERNAL.value, (method, reply)
            else:
                assert isinstance(reply["result"], dict), (method, reply)
        # The deferred features were built by those calls, each once.
        assert sorted(loaded(daemon)) == ["gc", "usage"]
        assert ask(daemon, "daemon.shutdown", {})["result"] is not None
        assert daemon.wait() == 0
    finally:
        daemon.close()


def test_a_failed_load_is_an_internal_error_and_the_daemon_keeps_serving(root: Path) -> None:
    # The simulation point makes the first build in this daemon fail as a failed import would.
    daemon = DaemonProcess(root, log_level="info", env={"XUM_FAULT": "rpc.deferred_build_fails"})
    daemon.start()
    try:
        failed = ask(daemon, "gc.plan", {})["error"]
        assert failed["data"]["kind"] == ErrorKind.INTERNAL.value
        assert failed["data"]["feature"] == "gc"
        assert "gc.plan is unavailable: the gc feature failed to load" in failed["message"]
        assert "rpc.feature_load_failed" in daemon.log_text()
        # Still serving, the other features included...
        assert ask(daemon, "daemon.status")["result"]["pid"] == daemon.pid
        assert "workspaces" in ask(daemon, "workspace.usage", {})["result"]
        # ...and the next call loads it.
        assert "items" in ask(daemon, "gc.plan", {})["result"]
        assert sorted(loaded(daemon)) == ["gc", "usage"]
    finally:
        daemon.close()


def test_concurrent_first_calls_load_once(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        replies = first_calls_together(daemon.socket_path, ["gc.plan"] * 8)
        assert all("items" in reply["result"] for reply in replies), replies
        assert loaded(daemon) == ["usage", "gc"]  # gc's build builds usage: each once
    finally:
        daemon.close()


def _record_running_gc_run(root: Path) -> str:
    """A gc run cut by the last stop: recorded `running`, with no item to collect."""
    run_id = "gc_00000000000000aa"
    db = sqlite3.connect(root / "state.db")
    with db:
        db.execute(
            "INSERT INTO gc_runs (id, keys, state, created_at, updated_at)"
            " VALUES (?, '[]', 'running', 0, 0)",
            (run_id,),
        )
    db.close()
    return run_id


def _run_state(root: Path, run_id: str) -> str:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        return str(db.execute("SELECT state FROM gc_runs WHERE id = ?", (run_id,)).fetchone()[0])
    finally:
        db.close()


def test_a_recorded_gc_run_resumes_at_start_without_a_request(root: Path) -> None:
    DaemonProcess(root).start().close()  # the schema
    run_id = _record_running_gc_run(root)
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        until(lambda: _run_state(root, run_id) == "done", message="the run to resume")
        assert loaded(daemon) == ["usage", "gc"]  # built by the worker, not by a request
    finally:
        daemon.close()


def test_a_worker_whose_build_failed_resumes_at_the_first_build(root: Path) -> None:
    # The worker's own build fails (the simulation point: the daemon's first build). It must
    # not end there, or a run recorded `running` would never finish in this daemon's life.
    DaemonProcess(root).start().close()
    run_id = _record_running_gc_run(root)
    daemon = DaemonProcess(root, log_level="info", env={"XUM_FAULT": "rpc.deferred_build_fails"})
    daemon.start()
    try:
        until(lambda: "rpc.feature_load_failed" in daemon.log_text(), message="the failed build")
        assert _run_state(root, run_id) == "running"
        assert "items" in ask(daemon, "gc.plan", {})["result"]  # builds gc
        until(lambda: _run_state(root, run_id) == "done", message="the run to resume")
        assert "daemon.background_failed" not in daemon.log_text()
    finally:
        daemon.close()
