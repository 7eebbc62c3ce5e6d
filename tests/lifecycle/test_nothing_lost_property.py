"""Nothing lost, as a property (a seeded random runner, a real daemon, real git): user content of
every kind (plain and binary files, the executable bit, symlinks, empty directories, nested
repositories, edits behind index flags, files a content filter rewrites, paths beyond
PATH_MAX, ignored files) is written into checkouts, interleaved with create, archive,
unarchive, remove with and without force, rename, gc and SIGKILLs of the daemon. After every
step, every byte the user wrote is in place, or comes back byte for byte at unarchive, or was
refused by name, or (remove with force) is named by what the daemon kept. A short budget here;
`make test-reliability` runs a long one."""

from __future__ import annotations

import random
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.reliability.budget import size
from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.ondisk import deep_dir, disk

NAMES = ["a", "b"]
KINDS = [
    "plain",
    "binary",
    "exec",
    "symlink",
    "empty_dir",
    "nested",
    "flagged",
    "crlf",
    "filtered",
    "deep",
    "detached",
    "ignored",
]
HEAD = ":HEAD"
"""What `written` holds for a commit only a detached HEAD holds."""
REFUSALS = {"invalid_state", "conflict", "not_found", "cleanup_pending", "busy", "not_safe"}
FILES = {
    "README.md": "hello\n",
    ".gitignore": "ignored/\n",
    ".gitattributes": "*.crlf text eol=crlf\n*.up filter=case\n",
    "config/local.toml": "setting = 1\n",
    "doc/a.crlf": "one\r\ntwo\r\n",
}


def _visible(entries: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The user's work: what is not ignored (ignored files are reported, not kept)."""
    return {p: v for p, v in entries.items() if p != "ignored" and not p.startswith("ignored/")}


class NothingLost:
    def __init__(self) -> None:
        self.base = short_tmpdir("xump-")
        self.repo = make_repo(self.base / "repo", FILES)
        git(self.repo, "config", "filter.case.clean", "tr a-z A-Z")
        git(self.repo, "config", "filter.case.smudge", "tr A-Z a-z")
        self.daemon = DaemonProcess(self.base / "root").start()
        self.project = self.daemon.call("project.add", {"path": str(self.repo)})["project"]
        self.expected: dict[str, dict[str, tuple[str, str]]] = {}
        """Workspace id -> its checkout's entries as the user left them."""
        self.written: dict[str, set[str]] = {}
        """Workspace id -> the entries the user made (top of each), not ignored."""
        self.n = 0

    def teardown(self) -> None:
        self.daemon.close()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------------------

    def _workspaces(self) -> dict[str, dict[str, Any]]:
        listed = self.daemon.call("workspace.list", {"project_id": self.project["id"]})
        return {w["id"]: w for w in listed["workspaces"]}

    def _by_name(self, name: str) -> dict[str, Any] | None:
        for w in self._workspaces().values():
            if w["name"] == name:
                return w
        return None

    def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.daemon.call(method, params)
        except XumRpcError as exc:
            assert exc.kind in REFUSALS, f"{method} {params}: {exc.kind}: {exc}"
            return None

    # -- steps ----------------------------------------------------------------------------------

    def create(self, name: str) -> None:
        done = self._call("workspace.create", {"project_id": self.project["id"], "name": name})
        if done is not None:
            ws = done["workspace"]
            self.expected[ws["id"]] = _visible(disk(Path(ws["path"])))
            self.written[ws["id"]] = set()

    def both(self) -> None:
        for name in NAMES:
            self.create(name)

    def write(self, name: str, kinds: list[str]) -> None:
        ws = self._by_name(name)
        if ws is None or ws["state"] != "active":
            return
        path = Path(ws["path"])
        for kind in kinds:
            self.n += 1
            made = self._write(path, kind, f"{kind}{self.n}", secrets.token_hex(8))
            if made:
                self.written[ws["id"]].add(made)
        self.expected[ws["id"]] = _visible(disk(path))

    def _write(self, path: Path, kind: str, name: str, noise: str) -> str | None:
        if kind == "plain":
            (path / f"{name}.txt").write_text(f"work {noise}\n")
            return f"{name}.txt"
        if kind == "binary":
            (path / f"{name}.bin").write_bytes(bytes(range(256)) + noise.encode())
            return f"{name}.bin"
        if kind == "exec":
            (path / f"{name}.sh").write_text(f"#!/bin/sh\necho {noise}\n")
            (path / f"{name}.sh").chmod(0o755)
            return f"{name}.sh"
        if kind == "symlink":
            (path / name).symlink_to(f"target-{noise}")
            return name
        if kind == "empty_dir":
            (path / name / "inner").mkdir(parents=True)
            return f"{name}/inner"
        if kind == "nested":
            make_repo(path / name, {"lib.py": "v = 1\n"})
            (path / name / "lib.py").write_text(f"v = 2  # {noise}\n")
            return name
        if kind == "flagged":
            git(path, "update-index", "--assume-unchanged", "config/local.toml")
            (path / "config" / "local.toml").write_text(f"setting = {noise}\n")
            return "config/local.toml"
        if kind == "crlf":
            (path / "doc" / "a.crlf").write_bytes(f"lf only {noise}\n".encode())
            return "doc/a.crlf"
        if kind == "filtered":
            (path / f"{name}.up").write_text(f"Mixed Case {noise}\n")
            return f"{name}.up"
        if kind == "detached":
            git(path, "checkout", "-q", "--detach")
            (path / f"{name}.txt").write_text(f"committed on a detached HEAD {noise}\n")
            git(path, "add", f"{name}.txt")
            git(path, "commit", "-q", "-m", name)
            return HEAD
        if kind == "deep":
            (path / name).mkdir()
            deep_dir(path / name, 4200)
            return name
        (path / "ignored").mkdir(exist_ok=True)
        (path / "ignored" / f"{name}.o").write_text(noise)
        return None

    def archive(self, name: str) -> None:
        ws = self._by_name(name)
        if ws is not None:
            self._call("workspace.archive", {"workspace_id": ws["id"]})

    def round_trip(self, name: str) -> None:
        self.archive(name)
        self.unarchive(name)

    def unarchive(self, name: str) -> None:
        ws = self._by_name(name)
        if ws is None:
            return
        done = self._call("workspace.unarchive", {"workspace_id": ws["id"]})
        if done is not None:
            # every byte the user wrote is back: the invariant below compares
            assert done["restored"].get("unverified", []) == [], done

    def remove(self, name: str, force: bool) -> None:
        ws = self._by_name(name)
        if ws is None:
            return
        done = self._call("workspace.remove", {"workspace_id": ws["id"], "force": force})
        if done is None:
            return
        written = self.written.pop(ws["id"], set())
        self.expected.pop(ws["id"], None)
        if ws["state"] == "archived":
            return  # its work is in the archive it had: kept copy and snapshot stay
        if not force:
            assert not written, f"remove without force deleted user work: {sorted(written)}"
            return
        if HEAD in written:
            assert done.get("snapshot"), f"remove --force kept no detached HEAD: {done}"
            written.discard(HEAD)
        named = set((done.get("snapshot") or {}).get("files", []))
        named |= {e["path"] for e in done.get("raw", [])}
        named |= set((done.get("kept") or {}).get("files", []))
        for made in written:
            assert any(
                n == made or made.startswith(n + "/") or n.startswith(made + "/") for n in named
            ), f"remove --force kept no trace of {made}: {done}"

    def rename(self, name: str, to: str) -> None:
        ws = self._by_name(name)
        if ws is not None:
            self._call("workspace.rename", {"workspace_id": ws["id"], "name": to})
            self._call("workspace.rename", {"workspace_id": ws["id"], "name": name})

    def gc(self) -> None:
        self._call("gc.run", {})

    def sigkill(self) -> None:
        self.daemon.kill()
        self.daemon.restart()

    # -- the property ---------------------------------------------------------------------------

    def every_byte_is_in_place_or_kept(self) -> None:
        for wid, ws in self._workspaces().items():
            if ws["state"] != "active" or wid not in self.expected:
                continue
            assert _visible(disk(Path(ws["path"]))) == self.expected[wid], ws["name"]


OPS = [
    ("write", 30),
    ("round_trip", 20),
    ("archive", 8),
    ("unarchive", 10),
    ("remove", 8),
    ("rename", 5),
    ("gc", 4),
    ("sigkill", 8),
    ("create", 7),
]


def _run(seeds: range, steps: int) -> None:
    """The suite's own seeded runner (a failure names its seed and its steps, and replays
    exactly); the weights keep most steps on writing and archiving, where the risk is."""
    names, weights = zip(*OPS, strict=True)
    for seed in seeds:
        rng = random.Random(seed)
        machine = NothingLost()
        done: list[str] = []
        try:
            machine.both()
            for _ in range(steps):
                op = rng.choices(names, weights)[0]
                name = rng.choice(NAMES)
                if op == "write":
                    kinds = rng.sample(KINDS, rng.randint(1, 4))
                    done.append(f"write {name} {kinds}")
                    machine.write(name, kinds)
                elif op == "remove":
                    force = rng.random() < 0.5
                    done.append(f"remove {name} force={force}")
                    machine.remove(name, force)
                elif op == "rename":
                    done.append(f"rename {name}")
                    machine.rename(name, "r1")
                elif op in ("gc", "sigkill"):
                    done.append(op)
                    getattr(machine, op)()
                else:
                    done.append(f"{op} {name}")
                    getattr(machine, op)(name)
                machine.every_byte_is_in_place_or_kept()
        except BaseException as exc:
            raise AssertionError(f"seed {seed}, after {done}: {exc}") from exc
        finally:
            machine.teardown()


def test_nothing_the_user_wrote_is_lost() -> None:
    _run(range(3), steps=14)


@pytest.mark.reliability
@pytest.mark.timeout(1200)
def test_nothing_the_user_wrote_is_lost_long() -> None:
    _run(range(size(40, 4)), steps=size(40, 14))
