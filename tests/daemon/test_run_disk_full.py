"""`xum run` and a process's kept output writing into a full disk (a real small tmpfs, filled by
the process itself; we are root).

- A detached (kept) process's output file filled the disk between two polls: the drop that
  frees the space must not need space itself. Its record (`output.meta`) is written whole at
  spawn and updated in place, so the hole is punched, the disk has room again, the process
  goes on, and nothing it wrote after is lost.
- An attached `xum run` whose own output cannot be written (its stdout is a file on a full
  disk): one clear line, exit 1, the process is stopped with the session (no orphan), and the
  daemon goes on serving.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.processes.output_log import META_SLOT, OutputLog, create_meta

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.tmpfs import tmpfs
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")


def _xum(daemon: DaemonProcess, *options: str) -> list[str]:
    return [XUM, "--root", str(daemon.root), *options]


HEAD, TAIL = 32 * 1024, 224 * 1024  # the defaults of [processes] output_*_bytes


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumdf-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill_by_appending(fd: int) -> int:
    """Append to `fd` (as a child does, O_APPEND) until the filesystem refuses; bytes written."""
    written = 0
    for size in (1 << 16, 4096, 1):
        try:
            while True:
                written += os.write(fd, b"x" * size)
        except OSError:
            continue
    return written


def test_a_drop_on_a_full_disk_is_recorded_without_new_space_and_frees_it(base: Path) -> None:
    with tmpfs(base / "fs", "size=1m") as mount:
        path, meta = mount / "output", mount / "output.meta"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            create_meta(meta)
            output = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)
            written = _fill_by_appending(fd)
            assert _free(mount) == 0 and written > HEAD + 2 * TAIL
            # The old record (a new file, replaced whole) failed here with ENOSPC and the
            # drop was never made: the disk stayed full for the process's life.
            assert output.refresh()
            assert output.dropped > 0 and _free(mount) > 0
            assert os.write(fd, b"END\n") == 4  # the process goes on writing
            assert output.refresh()
            last = output.read(output.total - 4, 16)
            assert last.data == b"END\n"
            assert meta.stat().st_size == 2 * META_SLOT  # updated in place, never grown
            output.close()
            again = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)
            assert (again.hole_start, again.kept_from) == (output.hole_start, output.kept_from)
            again.close()
        finally:
            os.close(fd)


def test_a_torn_slot_reads_the_other_and_the_older_form_still_reads(base: Path) -> None:
    path, meta = base / "output", base / "output.meta"
    path.write_bytes(b"x" * (HEAD + 3 * TAIL))
    create_meta(meta)
    first = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)  # drops once: slot 1
    dropped_once = (first.hole_start, first.kept_from)
    assert first.dropped > 0
    first.close()
    # A crash tore the next record as it was written (so its hole was never punched: the
    # record comes first): the other slot's range is read.
    raw = bytearray(meta.read_bytes())
    raw[:META_SLOT] = b'{"seq": 2, "hole_start": 32768, "kep'.ljust(META_SLOT - 1, b"\xff") + b"\n"
    meta.write_bytes(bytes(raw))
    torn = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)
    assert (torn.hole_start, torn.kept_from) == dropped_once
    torn.close()
    # A process kept by an older daemon has its meta file in the older form.
    meta.write_text(json.dumps({"hole_start": dropped_once[0], "kept_from": dropped_once[1]}))
    older = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)
    assert (older.hole_start, older.kept_from) == dropped_once
    older.close()


def test_a_drop_whose_record_failed_is_retried_without_new_output(base: Path) -> None:
    # The record cannot be written (an immutable file: EPERM even for root). Nothing is
    # dropped without it; once it can be, the next poll drops, though the child wrote nothing
    # more (a child stopped by a full disk writes nothing more until then).
    path, meta = base / "output", base / "output.meta"
    path.write_bytes(b"x" * (HEAD + 3 * TAIL))
    create_meta(meta)
    done = subprocess.run(["chattr", "+i", str(meta)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {meta} immutable here: {done.stderr}")
    try:
        output = OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)
        assert output.dropped == 0
        assert output.read(HEAD + 8192, 10).data == b"x" * 10  # kept: no record, no hole
    finally:
        subprocess.run(["chattr", "-i", str(meta)], check=True)
    assert not output.refresh()  # no new output...
    assert output.dropped > 0  # ...and yet the drop is made now
    output.close()


@pytest.fixture
def kept_daemon(base: Path) -> Iterator[tuple[DaemonProcess, Path, str]]:
    root = base / "root"
    write_config(root, "[processes]\nkeep_processes = true\n")
    with tmpfs(root / "processes", "size=4m") as mount:
        daemon = DaemonProcess(root).start()
        try:
            project = add_project(daemon, make_repo(base / "repo"))
            ws = create(daemon, project["id"], "a")["workspace"]
            yield daemon, mount, ws["id"]
        finally:
            daemon.close()


def test_a_detached_run_that_fills_the_disk_gets_its_space_back_and_goes_on(
    kept_daemon: tuple[DaemonProcess, Path, str], base: Path
) -> None:
    daemon, mount, _ = kept_daemon
    go = base / "go"
    # Eight MB into a 4 MB filesystem as fast as the pipe goes: full between two polls. `tr`
    # failing (its status, kept outside the full filesystem) is the proof that it filled.
    status = base / "tr.status"
    script = (
        f"head -c 8000000 /dev/zero | tr '\\0' x; echo $? > {status}; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; echo; echo END"
    )
    started = subprocess.run(
        [
            *_xum(daemon, "--json", "run"),
            "--detach",
            "--kind",
            "agent",
            "a",
            "--",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=base,
    )
    assert started.returncode == 0, started
    process: dict[str, Any] = json.loads(started.stdout)["process"]
    output = mount / process["id"] / "output"

    def bounded() -> bool:
        allocated = output.stat().st_blocks * 512
        return allocated <= HEAD + 2 * TAIL + 64 * 1024 and _free(mount) > 0

    # Before: the record of the drop needed a block the child had taken; no drop ever came.
    until(status.exists, 30, message="the writer to end")
    assert status.read_text().strip() != "0", "the disk never filled: nothing was tested"
    until(bounded, 30, message="the full output file's middle dropped, the space freed")
    go.touch()
    until(
        lambda: (
            daemon.call("process.get", {"process_id": process["id"]})["process"]["state"]
            == "exited"
        ),
        30,
        message="the run to end",
    )
    got = daemon.call("process.get", {"process_id": process["id"]})["process"]
    assert got["exit"]["code"] == 0, got  # its last write had room: nothing after was lost
    tail = daemon.call(
        "process.output", {"process_id": process["id"], "since": output.stat().st_size - 16}
    )
    assert tail["data"].endswith("\nEND\n"), tail
    assert tail["dropped_total"] > 0 and tail["source"] == "file"
    assert daemon.call("daemon.status")["pid"] == daemon.pid


def test_an_attached_run_whose_output_cannot_be_written_ends_clearly_and_stops_the_process(
    base: Path, daemon_for_run: tuple[DaemonProcess, str]
) -> None:
    daemon, ws_ref = daemon_for_run
    pidfile = base / "child.pid"
    with tmpfs(base / "full", "size=1m") as mount, (mount / "out.log").open("w") as out:
        ran = subprocess.run(
            [*_xum(daemon, "run"), ws_ref, "--", "sh", "-c", f"echo $$ > {pidfile}; exec yes line"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert ran.returncode == 1, ran
    assert ran.stderr.rstrip().endswith("xum: cannot write the output: No space left on device")
    assert "Traceback" not in ran.stderr
    ws_id = daemon.call("workspace.list")["workspaces"][0]["id"]

    def stopped() -> list[dict[str, Any]]:
        found = daemon.call("process.list", {"workspace_id": ws_id})["processes"]
        return [p for p in found if p["state"] == "exited"]

    until(lambda: bool(stopped()), 30, message="the run's process stopped with its session")
    [process] = stopped()
    assert process["exit"]["stop_reason"] == "session", process
    child = int(pidfile.read_text())
    until(lambda: not Path(f"/proc/{child}").exists(), 10, message="no orphan left running")
    assert daemon.call("daemon.status")["pid"] == daemon.pid


@pytest.fixture
def daemon_for_run(base: Path) -> Iterator[tuple[DaemonProcess, str]]:
    daemon = DaemonProcess(base / "root").start()
    try:
        project = add_project(daemon, make_repo(base / "repo"))
        create(daemon, project["id"], "a")
        yield daemon, "repo/a"
    finally:
        daemon.close()


def test_xum_run_when_the_root_fills_reports_the_exit_then_refuses_disk_full(base: Path) -> None:
    # The root itself (the store) on a 4 MB tmpfs that fills while an attached run is on its
    # way: the run's exit still reaches its caller; a run asked for on the full root is
    # refused `disk_full` naming the filesystem, with no process or lease left; once there is
    # room, runs work again.
    from tests.support.tmpfs import fill

    go = base / "go"
    with tmpfs(base / "root", "size=4m") as root:
        daemon = DaemonProcess(root).start()
        try:
            project = add_project(daemon, make_repo(base / "repo"))
            ws = create(daemon, project["id"], "a")["workspace"]
            script = f"echo started; while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 7"
            running = subprocess.Popen(
                [*_xum(daemon, "run"), "repo/a", "--", "sh", "-c", script],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                until(
                    lambda: any(
                        p["state"] == "running"
                        for p in daemon.call("process.list", {"workspace_id": ws["id"]})[
                            "processes"
                        ]
                    ),
                    30,
                    message="the attached run started",
                )
                filler = fill(root)
                go.touch()
                out, err = running.communicate(timeout=60)
            finally:
                if running.poll() is None:
                    running.kill()
                    running.wait()
            assert running.returncode == 7, (out, err)
            assert out == "started\ndone\n" and err == ""

            refused = subprocess.run(
                [*_xum(daemon, "--json", "run"), "repo/a", "--", "echo", "never"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert refused.returncode == 1, refused
            error = json.loads(refused.stdout)["error"]
            assert error["kind"] == "disk_full" and error["data"]["filesystem"] == str(root)
            found = daemon.call("process.list", {"workspace_id": ws["id"]})["processes"]
            assert [p["argv"] for p in found if p["argv"][0] == "echo"] == []
            assert all(p["state"] == "exited" for p in found), found

            filler.unlink()
            # The ended run's lease could not be removed while the store was full: once there
            # is room it goes, by itself (no holder is left to keep the workspace busy).
            until(
                lambda: daemon.call("lease.list", {"workspace_id": ws["id"]})["leases"] == [],
                30,
                message="the ended run's lease removed once the store has room",
            )
            archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
            assert archived["workspace"]["state"] == "archived"
            daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
            again = subprocess.run(
                [*_xum(daemon, "run"), "repo/a", "--", "sh", "-c", "echo back; exit 3"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (again.returncode, again.stdout) == (3, "back\n"), again
        finally:
            daemon.close()


def test_a_fifo_in_place_of_the_record_never_blocks_and_drops_nothing(base: Path) -> None:
    # Something put a FIFO where `output.meta` goes: reading it would block the daemon's event
    # loop forever (no writer), writing it would too (no reader). Neither is opened blocking;
    # without a record nothing is dropped.
    import threading

    path, meta = base / "output", base / "output.meta"
    path.write_bytes(b"x" * (HEAD + 3 * TAIL))
    os.mkfifo(meta, 0o600)
    made: list[OutputLog] = []
    opener = threading.Thread(
        target=lambda: made.append(OutputLog(path, meta, head_limit=HEAD, tail_limit=TAIL)),
        daemon=True,
    )
    opener.start()
    opener.join(10)
    if opener.is_alive():
        with open(meta, "wb"):  # release the blocked reader, so the thread can end
            pass
        pytest.fail("opening the log blocked on the FIFO at output.meta")
    [output] = made
    assert output.dropped == 0
    assert output.read(HEAD + 8192, 4).data == b"xxxx"
    output.close()


def test_a_daemon_whose_log_disk_is_full_keeps_serving_and_says_what_it_lost(base: Path) -> None:
    # The daemon's stderr (its log) is a file on a full filesystem. A log line that cannot be
    # written is counted, never raised: before, the first one ended the request half-way and
    # then the daemon (exit 1).
    from tests.support.tmpfs import fill

    with tmpfs(base / "logs", "size=1m") as logs:
        daemon = DaemonProcess(base / "root")
        daemon.log_path.symlink_to(logs / "xumd.log")
        daemon.start()
        try:
            project = add_project(daemon, make_repo(base / "repo"))
            filler = fill(logs)
            made = [create(daemon, project["id"], n)["workspace"] for n in ("a", "b")]
            archived = daemon.call("workspace.archive", {"workspace_id": made[0]["id"]})
            assert archived["cleanup"]["status"] == "completed"
            ran = subprocess.run(
                [*_xum(daemon, "run"), "repo/b", "--", "sh", "-c", "echo hi; exit 4"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (ran.returncode, ran.stdout) == (4, "hi\n"), ran
            assert daemon.proc is not None and daemon.proc.poll() is None
            filler.unlink()
            daemon.call("workspace.get", {"workspace_id": made[1]["id"]})
            until(
                lambda: "logs.lines_dropped" in (logs / "xumd.log").read_text(errors="replace"),
                10,
                message="the daemon to log how many lines it could not write",
            )
        finally:
            daemon.close()


def test_a_log_line_to_a_reader_that_is_gone_is_counted_not_raised() -> None:
    # `xumd 2>&1 | tee log` whose tee died: EPIPE at the next line (Python ignores SIGPIPE).
    from xumd.base import logs

    read_end, write_end = os.pipe()
    os.close(read_end)
    gone = os.fdopen(write_end, "w")
    try:
        logger = logs._NamedPrintLogger(gone, "xumd.test")
        logger.info('{"event": "one"}')
        logger.error('{"event": "two"}')
    finally:
        with contextlib.suppress(OSError):
            gone.close()
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as reader, os.fdopen(write_end, "w") as back:
        logs._NamedPrintLogger(back, "xumd.test").info('{"event": "three"}')
        back.close()
        lines = reader.read().splitlines()
    assert lines[0] == '{"event": "three"}'
    note = json.loads(lines[1])
    assert note["event"] == "logs.lines_dropped" and note["lines"] >= 2, note
