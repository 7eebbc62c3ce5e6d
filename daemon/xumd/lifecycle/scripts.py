"""Setup and teardown scripts from `.xum/config.toml`, run only for a trusted config.

Running a repository's scripts is running code from the repository, so (like direnv's allow) the
daemon runs them only when the project trusts that exact file content: `project.trust` stores its
sha256, and a changed file is untrusted again. Each command runs with `/bin/sh -c` in the checkout,
in its own process group, with a per-command deadline and whole-tree kill (xumd.system.procutil),
and its output is bounded (head + diagnostic tail).

Config:
    [scripts]
    setup = ["npm ci"]
    teardown = ["docker compose down"]
    preserve = [".env*"]      # ignored files kept across archive/unarchive (also top-level)
"""

from __future__ import annotations

import contextlib
import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from xumd.base import logs
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import rows, wsenv
from xumd.store import Store
from xumd.system import smallfile
from xumd.system.containment import Containment, Marked
from xumd.system.procutil import BoundedOutput, CommandNotFound, run_command

log = logs.get("xumd.lifecycle.scripts")

CONFIG_RELPATH = Path(".xum") / "config.toml"
MAX_CONFIG_BYTES = 1 << 20
"""A config larger than this is refused (it is read on the event loop, whole)."""
Phase = Literal["setup", "teardown"]
OUTPUT_LIMIT = 32 * 1024


class ScriptProgress(Protocol):
    """Told as a run goes (setup shows it to clients: lifecycle.setup.ScriptEvents)."""

    def started(self, index: int, count: int, command: str) -> None: ...

    def printed(self, data: bytes) -> None: ...

    def finished(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ProjectConfig:
    path: Path
    hash: str
    setup: list[str] = field(default_factory=list)
    teardown: list[str] = field(default_factory=list)
    preserve: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class ScriptOutcome:
    status: str  # ok | failed | timeout | untrusted | none
    output: str = ""
    error: str | None = None
    config_hash: str | None = None
    hint: str | None = None
    commands: int = 0
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    """What its commands left running, stopped when each ended (containment.Stopped)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "config_hash": self.config_hash,
            "hint": self.hint,
            "commands": self.commands,
            "leftovers": self.leftovers,
        }


def config_file(checkout: Path, project_path: Path | None = None) -> Path | None:
    """The config that applies: the checkout's own, else the project's (directory runtime)."""
    for base in (checkout, project_path):
        if base is None:
            continue
        candidate = base / CONFIG_RELPATH
        if candidate.is_file():
            return candidate
    return None


def _strings(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"[scripts] {key} must be a list of strings")
    return list(value)


def load_config(path: Path) -> ProjectConfig:
    # The checkout is the user's: its config may be swapped for a FIFO, a device or a huge file
    # after `config_file` looked.
    raw = smallfile.read_regular(path, MAX_CONFIG_BYTES)
    digest = hashlib.sha256(raw).hexdigest()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        scripts = data.get("scripts", {})
        if not isinstance(scripts, dict):
            raise ValueError("[scripts] must be a table")
        preserve = _strings(scripts.get("preserve"), "preserve") + _strings(
            data.get("preserve"), "preserve"
        )
        return ProjectConfig(
            path=path,
            hash=digest,
            setup=_strings(scripts.get("setup"), "setup"),
            teardown=_strings(scripts.get("teardown"), "teardown"),
            preserve=preserve,
        )
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
        return ProjectConfig(path=path, hash=digest, error=f"{path}: {exc}")


def preserve_globs(checkout: Path, project_path: Path | None = None) -> list[str]:
    """Preserving ignored files runs no code, so it needs no trust."""
    found = config_file(checkout, project_path)
    if found is None:
        return []
    try:
        return load_config(found).preserve
    except OSError:
        return []


class ScriptLeases(Protocol):
    """The processes feature's lease store (`xumd.processes.leases.LeaseStore`), as a run uses
    it: each run holds a durable use lease (kind setup/teardown) with its child's pid, so it
    makes the workspace busy and survives a daemon crash."""

    def covering(
        self, workspace_id: str, kind: str, *, label: str = ""
    ) -> contextlib.AbstractAsyncContextManager[Any]: ...


class ScriptRunner:
    def __init__(
        self,
        store: Store,
        root: Path,
        *,
        timeout_s: float,
        grace_s: float = 5.0,
        leases: ScriptLeases | None,
        containment: Containment | None,
    ):
        """`leases` and `containment` have no default: the composition root hands in the
        daemon's; None (a runner outside the daemon: tests) runs each command without a lease or
        a marker, by the caller's explicit choice."""
        self.store = store
        self.root = root
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.leases = leases
        # Each command carries a marker naming its lease (the durable record written before it
        # starts), so its descendants are found again.
        self.containment = containment
        # Per workspace: processes an earlier run left that survived SIGKILL. A later run (a
        # teardown's retry) must not report success while they still run.
        self.escapees: dict[str, list[Marked]] = {}

    async def run(
        self,
        phase: Phase,
        *,
        project_id: str,
        workspace: WorkspaceRef,
        cwd: Path,
        progress: ScriptProgress | None = None,
        kept_env: dict[str, str] | None = None,
    ) -> ScriptOutcome:
        """`kept_env`: the workspace's variables as its teardown obligation recorded them
        (wsenv.frozen), used once its row is gone."""
        project = rows.get_project(self.store, project_id)
        found = config_file(cwd, project.path if project else None)
        if found is None:
            return ScriptOutcome(status="none")
        try:
            config = load_config(found)
        except OSError as exc:
            return ScriptOutcome(status="failed", error=f"cannot read {found}: {exc}")
        commands = config.setup if phase == "setup" else config.teardown
        if config.error:
            return ScriptOutcome(status="failed", error=config.error, config_hash=config.hash)
        if not commands:
            return ScriptOutcome(status="none", config_hash=config.hash)
        trusted = project.trusted_config_hash if project else None
        if trusted != config.hash:
            return ScriptOutcome(
                status="untrusted",
                config_hash=config.hash,
                commands=len(commands),
                error=f"{found} is not trusted"
                + (" (it changed since it was trusted)" if trusted else ""),
                hint=f"review {found}, then run: xum project trust {project_id} --hash "
                f"{config.hash}",
            )
        env = wsenv.compose(self.store, self.root, workspace, kept_env)
        try:
            return await self._run_commands(
                phase, commands, config.hash, workspace, cwd, progress, env
            )
        finally:
            if progress is not None:
                progress.finished()

    def _lease(self, ws: WorkspaceRef, phase: Phase) -> Any:
        if self.leases is None:
            return contextlib.nullcontext(None)
        return self.leases.covering(ws.id, phase, label=f"{phase} script")

    async def _run_commands(  # noqa: PLR0917 - private; the run's fields in order
        self,
        phase: Phase,
        commands: list[str],
        digest: str,
        ws: WorkspaceRef,
        cwd: Path,
        progress: ScriptProgress | None,
        env: dict[str, str],
    ) -> ScriptOutcome:
        output = BoundedOutput(OUTPUT_LIMIT)
        # Said, never silent: a background server a setup started is gone once it ends.
        stopped: list[dict[str, Any]] = []

        def outcome(status: str, error: str | None = None) -> ScriptOutcome:
            return ScriptOutcome(
                status=status,
                output=output.text(),
                error=error,
                config_hash=digest,
                commands=len(commands),
                leftovers=stopped,
            )

        earlier = self.escapees.pop(ws.id, [])
        if earlier and self.containment is not None:
            earlier = await self.containment.still_running(earlier, self.grace_s)
            if earlier:
                self.escapees[ws.id] = earlier
                return outcome(
                    "failed",
                    f"an earlier {phase} run left processes that could not be stopped: "
                    f"{_describe([m.describe() for m in earlier])}",
                )
        for index, command in enumerate(commands, 1):
            output.feed(f"$ {command}\n".encode())
            log.info("script.start", phase=phase, workspace=ws.id, index=index)
            if progress is not None:
                progress.started(index, len(commands), command)
            try:
                async with self._lease(ws, phase) as lease:
                    cont = self.containment
                    marker = None
                    if cont is not None:
                        record = lease.lease.id if lease is not None else f"{phase}-run"
                        marker = cont.run_marker(record) if lease is None else cont.marker(record)
                    result = await run_command(
                        ["/bin/sh", "-c", command],
                        cwd=cwd,
                        env=env,
                        timeout_s=self.timeout_s,
                        grace_s=self.grace_s,
                        output_limit=OUTPUT_LIMIT,
                        on_start=lease.on_start if lease is not None else None,
                        on_output=progress.printed if progress is not None else None,
                        containment=cont,
                        marker=marker,
                    )
            except (CommandNotFound, OSError) as exc:
                return outcome("failed", f"{phase} command {index} could not start: {exc}")
            output.feed(result.output.text().encode())
            stopped += [s.describe() for s in result.stopped]
            log.info(
                "script.done",
                phase=phase,
                workspace=ws.id,
                index=index,
                returncode=result.returncode,
                timed_out=result.timed_out,
                leftovers_stopped=[s.pid for s in result.stopped],
            )
            if result.escaped:
                # Fail closed: the step (a teardown's obligation) stays pending, naming them,
                # and so does its retry while they run.
                self.escapees[ws.id] = list(result.escaped)
                return outcome(
                    "failed",
                    f"{phase} command {index} ({command!r}) left processes that could not be "
                    f"stopped: {_describe([m.describe() for m in result.escaped])}",
                )
            if result.timed_out:
                return outcome(
                    "timeout",
                    f"{phase} command {index} ({command!r}) timed out after "
                    f"{self.timeout_s}s; its process tree was killed",
                )
            if not result.ok:
                return outcome(
                    "failed",
                    f"{phase} command {index} ({command!r}) exited with {result.returncode}",
                )
        return outcome("ok")


def _describe(escaped: list[dict[str, Any]]) -> str:
    return ", ".join(f"pid {e['pid']} ({' '.join(e.get('argv') or [])[:80]})" for e in escaped)
