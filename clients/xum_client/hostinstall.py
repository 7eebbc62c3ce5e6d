"""`xum host install NAME`: put this very xum on a host that has no network access of its own.

Everything is fetched here and copied over the ssh connection (docs/HOSTS.md, "Installing on a
host"):

1. **Ask the host** (one ssh run): which `python3` (or `python3.13`, `.12`, `.11`) it has, that
   interpreter's version, implementation and platform (`sysconfig.get_platform()`, the C library
   and its version), and which xum is already installed under its data directory
   (`${XDG_DATA_HOME:-$HOME/.local/share}/xum/venv/bin/xum --version`). Same version: nothing
   to do, and it says so (`--force` reinstalls). No CPython >= 3.11: one clear line.
2. **Build a wheelhouse here** for that Python and platform: a wheel of the running xum, made
   from its own installed files (so it is the code this client runs, whether installed from a
   checkout or from a wheel), then `pip download --only-binary=:all: --platform ...
   --python-version ... --abi ...` of its dependencies, pinned to the versions installed here
   (the set this xum is tested with), from whatever index or cache pip is configured with here;
   and pip's own wheel (this Python's `ensurepip` bundle, else downloaded) to install with.
3. **Copy and install** (a second ssh run): the wheels go as a tar stream on ssh's stdin; the
   host makes a fresh virtual environment `xum/venvs/<version>-<random>` (`venv --without-pip`:
   Debian's python3 without python3-venv can do that), installs with pip run from its wheel,
   `--no-index --find-links`, checks `bin/xum --version`, and only then points the symlink
   `xum/venv` at it (rename: atomic, so a client never sees half an install). One install at a
   time per host (a lock file); a failed install removes its own directory and leaves the
   previous one in place. Then the older environments it made are pruned, unless a process
   still uses one (a daemon started before: `hostprune`); one made by hand is never touched.
   Linux hosts only (the wheel platform tags, and /proc for telling what is in use).

Every child (pip, ssh) runs with a deadline; a deadline that passes kills it and says which step.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xumd.system.atomicfile import write_atomic

from xum_client import hosts
from xum_client.errors import XumClientError
from xum_client.hosts import HostEntry, ssh_base
from xum_client.sshlink import classify
from xum_client.sync import CLIENT_VERSION, release_line

DISTRIBUTION = "xum"
PACKAGES = ("xumd", "xum_protocol", "xum_client")
"""The import packages the one distribution ships (pyproject.toml's packages.find)."""
PACKAGE_SUFFIXES = (".py", ".sql", ".typed")
"""What of a package directory goes into the wheel (pyproject.toml's package-data)."""
MIN_PYTHON = (3, 11)
PYTHONS = ("python3", "python3.13", "python3.12", "python3.11")
"""Tried in this order on the host; the first CPython >= 3.11 is used."""

PROBE_TIMEOUT_S = 60.0
DOWNLOAD_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 600.0


class HostInstallError(XumClientError):
    """The install could not be done; the message says which step and why, in one line."""


@dataclass(frozen=True, slots=True)
class HostPython:
    """One interpreter the host has, as it describes itself."""

    path: str
    version: tuple[int, int, int]
    implementation: str
    platform: str
    """`sysconfig.get_platform()`: `linux-x86_64`, `linux-aarch64`, `macosx-14.0-arm64`, ..."""
    libc: str
    """`glibc`, `musl` or empty."""
    libc_version: tuple[int, int] | None

    @property
    def usable(self) -> bool:
        return self.implementation == "cpython" and self.version[:2] >= MIN_PYTHON

    @property
    def short(self) -> str:
        return f"{self.implementation} {'.'.join(map(str, self.version))} at {self.path}"


@dataclass(slots=True)
class Probe:
    """What the host said: its interpreters and the xum installed there (`xum --version`)."""

    pythons: list[HostPython] = field(default_factory=list)
    installed: str | None = None
    """The installed xum's version, None when none is (or it does not run)."""
    installed_text: str | None = None
    not_link: str | None = None
    """The host's `xum/venv` when it is there but not the link an install makes."""
    silent: list[str] = field(default_factory=list)
    """Interpreters found on the host's PATH that did not describe themselves (too old for the
    probe, or broken)."""


# -- asking the host ---------------------------------------------------------------------------

# Runs on the host under any Python 3 (no f-strings: an old one must still say its version).
_PROBE_PY = """
import json, platform, sys, sysconfig, glob, subprocess
impl = getattr(getattr(sys, "implementation", None), "name", "unknown")
libc, libc_version = platform.libc_ver()
if not libc:
    for loader in glob.glob("/lib/ld-musl-*.so.1"):
        libc = "musl"
        try:
            text = subprocess.run([loader], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=10).stdout.decode("utf-8", "replace")
            for line in text.splitlines():
                if line.startswith("Version "):
                    libc_version = line.split()[1]
        except Exception:
            pass
print("XUM-PYTHON " + json.dumps({
    "path": sys.executable, "version": list(sys.version_info[:3]), "implementation": impl,
    "platform": sysconfig.get_platform(), "libc": libc, "libc_version": libc_version,
}))
"""

# Runs on the host under `sh -c` (no single quote, no backslash: it travels single-quoted
# through whatever login shell the user has). $1: the probe (base64); then the interpreters.
_PROBE_SH = """
b=$1; shift
v="${XDG_DATA_HOME:-$HOME/.local/share}/xum/venv"
if [ -e "$v" ] && [ ! -L "$v" ]; then
  printf "XUM-NOT-LINK %s\n" "$v"
fi
x="$v/bin/xum"
if [ -x "$x" ]; then
  v=$("$x" --version 2>&1 | tail -n 1)
  printf "XUM-INSTALLED %s\\n" "$v"
fi
for p in "$@"; do
  if w=$(command -v "$p" 2>/dev/null); then
    printf "XUM-CANDIDATE %s\n" "$w"
    "$p" -c "import base64,sys;exec(base64.b64decode(sys.argv[1]))" "$b" 2>/dev/null || :
  fi
done
"""


def _run_bounded(argv: list[str], timeout: float, late: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` (ssh or this Python's pip: an argv, no shell here) to its end, its output
    captured; past `timeout` it is killed and the install fails with `late`."""
    try:
        return subprocess.run(  # noqa: S603 - argv, no shell; remote words are quoted
            argv,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise HostInstallError(late) from None


def _b64(code: str) -> str:
    return base64.b64encode(code.encode()).decode("ascii")


def _remote(entry: HostEntry, *words: str) -> list[str]:
    """ssh argv running `words` on the host, each quoted for the remote shell."""
    return [*ssh_base(entry), " ".join(shlex.quote(w) for w in words)]


def _ssh_failure(entry: HostEntry, step: str, code: int, stderr: str) -> HostInstallError:
    tail = [line for line in stderr.strip().splitlines() if line.strip()]
    last = tail[-1].strip() if tail else f"exit status {code}"
    if code == 255:
        return HostInstallError(
            f"host {entry.name} ({entry.dest}): ssh failed while {step}: {last}"
        )
    return HostInstallError(f"host {entry.name} ({entry.dest}): {step} failed: {last}")


def parse_probe(text: str) -> Probe:
    probe = Probe()
    candidate: str | None = None
    for line in text.splitlines():
        if line.startswith("XUM-CANDIDATE "):
            if candidate is not None:
                probe.silent.append(candidate)
            candidate = line.removeprefix("XUM-CANDIDATE ").strip()
        elif line.startswith("XUM-NOT-LINK "):
            probe.not_link = line.removeprefix("XUM-NOT-LINK ").strip()
        elif line.startswith("XUM-INSTALLED "):
            probe.installed_text = line.removeprefix("XUM-INSTALLED ").strip()
            words = probe.installed_text.split()
            # click's `xum, version 0.1.0`
            if len(words) == 3 and words[:2] == ["xum,", "version"]:
                probe.installed = words[2]
        elif line.startswith("XUM-PYTHON "):
            try:
                raw = json.loads(line.removeprefix("XUM-PYTHON "))
                libc_version = release_line(str(raw.get("libc_version") or ""))
                major, minor, micro = (int(v) for v in raw["version"][:3])
                probe.pythons.append(
                    HostPython(
                        path=str(raw["path"]),
                        version=(major, minor, micro),
                        implementation=str(raw["implementation"]),
                        platform=str(raw["platform"]),
                        libc=str(raw.get("libc") or ""),
                        libc_version=libc_version,
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
            candidate = None
    if candidate is not None:
        probe.silent.append(candidate)
    return probe


def probe_host(
    entry: HostEntry, pythons: Sequence[str] = PYTHONS, timeout: float = PROBE_TIMEOUT_S
) -> Probe:
    done = _run_bounded(
        _remote(entry, "sh", "-c", _PROBE_SH, "sh", _b64(_PROBE_PY), *pythons),
        timeout,
        f"host {entry.name} ({entry.dest}): no answer within {timeout:.0f}s while asking "
        "which Python it has",
    )
    if done.returncode == hosts.EXIT_SSH_FAILED:
        # Nothing ran there: the same typed error (and exit status) as any command's.
        raise classify(entry, done.returncode, done.stderr)
    if done.returncode != 0:
        raise _ssh_failure(entry, "asking which Python it has", done.returncode, done.stderr)
    return parse_probe(done.stdout)


def choose_python(entry: HostEntry, probe: Probe) -> HostPython:
    """The first CPython >= 3.11 the host has, or the one clear line saying there is none."""
    for python in probe.pythons:
        if python.usable:
            return python
    found = "; ".join(
        [*(p.short for p in probe.pythons), *(f"{path} (does not run)" for path in probe.silent)]
    )
    found = f"found: {found}" if found else "no python3 on its PATH"
    raise HostInstallError(
        f"host {entry.name} ({entry.dest}) has no CPython >= {'.'.join(map(str, MIN_PYTHON))} "
        f"({found}); install one there (e.g. `apt-get install python3.11`), or name it with "
        "--python"
    )


# -- which wheels fit the host -----------------------------------------------------------------


def platform_tags(python: HostPython) -> list[str]:
    """The wheel platform tags the host's interpreter accepts, most specific first (Linux:
    manylinux for its glibc, musllinux for its musl; then plain `linux_<arch>`)."""
    system, _, arch = python.platform.partition("-")
    if system != "linux" or not arch:
        raise HostInstallError(
            f"cannot build a wheelhouse for platform {python.platform!r} ({python.short}): "
            "xum host install supports Linux hosts"
        )
    arch = arch.replace("-", "_").replace(".", "_")
    tags: list[str] = []
    if python.libc == "glibc" and python.libc_version is not None:
        major, minor = python.libc_version
        # PEP 600 names, and the older aliases wheels are still published under (PEP 599).
        legacy = {17: "manylinux2014"}
        if arch in ("x86_64", "i686"):
            legacy.update({12: "manylinux2010", 5: "manylinux1"})
        for m in range(minor, 4, -1) if major == 2 else ():
            tags.append(f"manylinux_2_{m}_{arch}")
            if m in legacy:
                tags.append(f"{legacy[m]}_{arch}")
    elif python.libc == "musl" and python.libc_version is not None:
        major, minor = python.libc_version
        tags += [f"musllinux_{major}_{m}_{arch}" for m in range(minor, -1, -1)]
    tags.append(f"linux_{arch}")
    return tags


# -- the wheelhouse, built here ----------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _package_files(package: str) -> list[tuple[str, Path]]:
    """(path in the wheel, file here) for every file of `package` the wheel ships."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise HostInstallError(f"cannot find the installed package {package!r} to ship")
    base = Path(next(iter(spec.submodule_search_locations)))
    files: list[tuple[str, Path]] = []
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if "__pycache__" in rel.parts or not path.is_file() or path.is_symlink():
            continue
        if path.name.endswith(PACKAGE_SUFFIXES):
            files.append(((Path(package) / rel).as_posix(), path))
    return files


def build_xum_wheel(dest: Path, version: str = CLIENT_VERSION) -> Path:
    """A wheel of the running xum (its installed files, its installed metadata's
    dependencies): pure Python, `py3-none-any`, made without a build backend."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise HostInstallError(
            "the running xum is not an installed distribution (no metadata): install it with "
            "pip first"
        ) from None
    if dist.version != version:
        raise HostInstallError(
            f"the installed xum metadata says {dist.version} but this client is {version}: "
            "reinstall xum here first"
        )
    # The extras (`dev`) stay here: the host gets what running xum needs.
    requires = [r for r in dist.requires or [] if "extra" not in r.partition(";")[2]]
    info = f"{DISTRIBUTION}-{version}.dist-info"
    metadata = "".join(
        [
            "Metadata-Version: 2.1\n",
            f"Name: {DISTRIBUTION}\n",
            f"Version: {version}\n",
            f"Requires-Python: >={'.'.join(map(str, MIN_PYTHON))}\n",
            *(f"Requires-Dist: {r}\n" for r in requires),
        ]
    )
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: xum host install\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    scripts = [ep for ep in dist.entry_points if ep.group == "console_scripts"]
    entry_points = "[console_scripts]\n" + "".join(f"{ep.name} = {ep.value}\n" for ep in scripts)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{DISTRIBUTION}-{version}-py3-none-any.whl"
    record: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:

        def add(name: str, data: bytes) -> None:
            wheel.writestr(name, data)
            record.append((name, _record_hash(data), str(len(data))))

        for package in PACKAGES:
            for name, file in _package_files(package):
                add(name, file.read_bytes())
        add(f"{info}/METADATA", metadata.encode())
        add(f"{info}/WHEEL", wheel_meta.encode())
        add(f"{info}/entry_points.txt", entry_points.encode())
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(record)
        writer.writerow((f"{info}/RECORD", "", ""))
        wheel.writestr(f"{info}/RECORD", out.getvalue())
    return path


def _constraints() -> str:
    """Every distribution installed here, pinned: the host gets the versions this xum runs
    with (those with a wheel for its platform; pip says which one has none)."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != DISTRIBUTION:
            pins.setdefault(name.lower(), f"{name}=={dist.version}")
    return "".join(f"{pin}\n" for pin in sorted(pins.values()))


def _run_pip(args: list[str], what: str, timeout: float) -> None:
    done = _run_bounded(
        [sys.executable, "-m", "pip", *args],
        timeout,
        f"{what}: pip did not finish within {timeout:.0f}s",
    )
    if done.returncode != 0:
        lines = [
            line.strip()
            for line in (done.stderr + done.stdout).splitlines()
            if line.strip().startswith("ERROR")
        ]
        reason = lines[0] if lines else f"pip exited with {done.returncode}"
        raise HostInstallError(f"{what}: {reason}")


def _pip_wheel(dest: Path, timeout: float) -> Path:
    """pip's own wheel, to install with on the host: this Python's `ensurepip` bundle when it
    has one, else downloaded (pip is pure Python: any pip >= 21 will do)."""
    with contextlib.suppress(ImportError, OSError):
        import ensurepip

        bundled = Path(ensurepip.__file__).parent / "_bundled"
        for wheel in sorted(bundled.glob("pip-*-py3-none-any.whl")):
            target = dest / wheel.name
            shutil.copyfile(wheel, target)
            return target
    _run_pip(
        ["download", "--only-binary=:all:", "--no-deps", "-q", "-d", str(dest), "pip>=21"],
        "downloading pip's wheel",
        timeout,
    )
    found = sorted(dest.glob("pip-*.whl"))
    if not found:
        raise HostInstallError("downloading pip's wheel: pip wrote no wheel")
    return found[0]


def wheel_cache() -> Path:
    """Where dependency wheels fetched for hosts are kept for the next install:
    `${XDG_CACHE_HOME:-~/.cache}/xum/wheels` (a flat directory: a wheel's name says which
    Python and platform it is for)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "xum" / "wheels"


def _keep_in_cache(wheels: Sequence[Path], cache: Path) -> None:
    """Copy `wheels` into the cache, each whole or not at all; a cache that cannot be written
    only costs the next install a download. Not durable (a cached wheel lost to a power loss is
    downloaded again), but flushed before its rename: a wheel is used from the cache by its name
    alone, so a name must never hold part of one."""
    with contextlib.suppress(OSError):
        cache.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            if (cache / wheel.name).exists():
                continue
            write_atomic(cache / wheel.name, wheel.read_bytes(), durable=False)


def build_wheelhouse(
    dest: Path, python: HostPython, timeout: float = DOWNLOAD_TIMEOUT_S
) -> list[Path]:
    """Every wheel the host needs for this xum, into `dest` (an empty directory): from the
    wheel cache alone when it has them all, else from pip's index (and then cached)."""
    xum_wheel = build_xum_wheel(dest)
    constraints = dest.parent / f".{dest.name}-constraints.txt"
    constraints.write_text(_constraints())
    major, minor = python.version[:2]
    args = ["download", "-q", "--only-binary=:all:"]
    for tag in platform_tags(python):
        args += ["--platform", tag]
    args += ["--python-version", f"{major}.{minor}", "--implementation", "cp"]
    args += ["--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none"]
    args += ["-c", str(constraints), "-d", str(dest), str(xum_wheel)]
    what = f"fetching xum's dependencies for {python.short} ({python.platform})"
    cache = wheel_cache()
    try:
        try:
            # Offline first: no index is asked when an earlier install cached every wheel.
            _run_pip([*args, "--no-index", "--find-links", str(cache)], what, timeout)
        except HostInstallError:
            _run_pip(args, what, timeout)
            _keep_in_cache([w for w in dest.glob("*.whl") if w != xum_wheel], cache)
    finally:
        constraints.unlink(missing_ok=True)
    _pip_wheel(dest, timeout)
    return sorted(dest.glob("*.whl"))


# -- copy and install, on the host -------------------------------------------------------------

# Runs on the host under the chosen Python >= 3.11; the wheels come as a tar stream on stdin.
# argv: the version to install.
_INSTALL_PY = """
import fcntl, json, os, shutil, subprocess, sys, tarfile, tempfile
version = sys.argv[1]
data = os.path.join(
    os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"),
    "xum",
)
venvs = os.path.join(data, "venvs")
os.makedirs(venvs, mode=0o700, exist_ok=True)
link = os.path.join(data, "venv")


def fail(message):
    print("XUM-FAILED " + message, flush=True)
    sys.exit(3)


if os.path.lexists(link) and not os.path.islink(link):
    fail(link + " exists and is not the link xum host install makes: move it away first")
lock = open(os.path.join(data, "install.lock"), "a")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    fail("another xum host install is running on this host")
staging = tempfile.mkdtemp(prefix=".wheels-", dir=data)
target = None
try:
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
        for member in tar:
            name = member.name
            if (not member.isfile() or "/" in name or name.startswith(".")
                    or not name.endswith(".whl")):
                fail("unexpected entry in the wheelhouse: " + repr(name))
            source = tar.extractfile(member)
            fd = os.open(os.path.join(staging, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out)
    pips = sorted(n for n in os.listdir(staging) if n.startswith("pip-"))
    if not pips:
        fail("the wheelhouse has no pip wheel")
    target = tempfile.mkdtemp(prefix=version + "-", dir=venvs)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", target], check=True,
                   stdout=subprocess.DEVNULL)
    # Ours: only an environment with this mark is ever pruned by a later install.
    with open(os.path.join(target, MARKER), "w") as mark:
        mark.write(version + "\\n")
    python = os.path.join(target, "bin", "python")
    done = subprocess.run(
        [python, os.path.join(staging, pips[-1], "pip"), "install", "--no-index",
         "--find-links", staging, "--no-cache-dir", "--disable-pip-version-check",
         "--no-warn-script-location", "--no-compile", "-q", "xum==" + version],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    if done.returncode != 0:
        lines = done.stdout.decode("utf-8", "replace").strip().splitlines() or ["(no output)"]
        errors = [line for line in lines if line.startswith("ERROR")]
        fail("pip install: " + (errors or lines)[-1])
    check = subprocess.run([os.path.join(target, "bin", "xum"), "--version"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    said = check.stdout.decode("utf-8", "replace").strip()
    if check.returncode != 0 or said.split()[-1:] != [version]:
        fail("the installed xum does not run: " + (said.splitlines() or ["no output"])[-1])
    previous = os.path.realpath(link) if os.path.islink(link) else None
    fresh = os.path.join(data, ".venv-" + os.path.basename(target))
    os.symlink(os.path.relpath(target, data), fresh)
    os.replace(fresh, link)
    # The link is the commit: from here on the new environment is the installed one, never
    # removed as a failed install's, whatever fails after.
    installed, target = target, None
    dirfd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    try:
        pruning = prune(venvs, installed)
    except Exception as exc:
        others = sorted(os.path.join(venvs, n) for n in os.listdir(venvs)
                        if os.path.join(venvs, n) != installed)
        pruning = {"pruned": [], "kept": others,
                   "why": {path: "not pruned: " + repr(exc) for path in others}}
    print("XUM-INSTALLED " + json.dumps({"venv": installed, "link": link, "previous": previous,
                                          "python": sys.executable, **pruning}), flush=True)
finally:
    shutil.rmtree(staging, ignore_errors=True)
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)
"""


def _install_script() -> str:
    """The install script as run on the host: hostprune's source, then the install itself."""
    source = Path(__file__).with_name("hostprune.py")
    try:
        prune_source = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HostInstallError(
            f"cannot read {source} to ship to the host ({exc}): reinstall xum here"
        ) from None
    return prune_source + _INSTALL_PY


def _send_tar(stdin: Any, wheels: Sequence[Path]) -> None:
    try:
        with tarfile.open(fileobj=stdin, mode="w|") as tar:
            for wheel in wheels:
                info = tar.gettarinfo(str(wheel), arcname=wheel.name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(wheel, "rb") as handle:
                    tar.addfile(info, handle)
    except (BrokenPipeError, OSError):
        pass  # the remote side stopped reading: its exit status and output say why
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def push_and_install(
    entry: HostEntry,
    python: HostPython,
    wheels: Sequence[Path],
    version: str = CLIENT_VERSION,
    timeout: float = INSTALL_TIMEOUT_S,
) -> dict[str, Any]:
    argv = _remote(
        entry,
        python.path,
        "-c",
        "import base64,sys;exec(base64.b64decode(sys.argv.pop(1)))",
        _b64(_install_script()),
        version,
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(  # noqa: S603 - argv, no shell here; the remote words are quoted
            argv, stdin=subprocess.PIPE, stdout=out, stderr=err
        )
        # The tar is written from a thread so that the deadline below holds even when the
        # host stops reading: killing ssh ends the write with EPIPE.
        writer = threading.Thread(target=_send_tar, args=(proc.stdin, wheels), daemon=True)
        writer.start()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            writer.join(10)
            raise HostInstallError(
                f"host {entry.name} ({entry.dest}): the install did not finish within "
                f"{timeout:.0f}s (ssh stopped; the host keeps its previous xum)"
            ) from None
        writer.join(10)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    for line in stdout.splitlines():
        if line.startswith("XUM-FAILED "):
            raise HostInstallError(
                f"host {entry.name} ({entry.dest}): install failed: "
                f"{line.removeprefix('XUM-FAILED ')}"
            )
        if line.startswith("XUM-INSTALLED ") and code == 0:
            result: dict[str, Any] = json.loads(line.removeprefix("XUM-INSTALLED "))
            return result
    if code == hosts.EXIT_SSH_FAILED:
        # The connection ended with no word from the install: it may have finished there (the
        # link moved) or not. Saying "failed" could be false; running it again says which.
        tail = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
        raise HostInstallError(
            f"host {entry.name} ({entry.dest}): ssh ended while installing "
            f"({tail[-1] if tail else 'no message'}): the install may or may not have finished "
            f"there; run `xum host install {entry.name}` again to see (it does nothing when "
            "this version is in place)"
        )
    raise _ssh_failure(entry, "installing", code, stderr or stdout)


# -- the whole -------------------------------------------------------------------------------


def install(
    entry: HostEntry,
    *,
    force: bool = False,
    python: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Install this xum on the host (nothing when the same version is there, unless `force`).
    Returns what happened: `{host, version, changed, python, venv, ...}`."""
    version = CLIENT_VERSION
    progress(f"asking {entry.name} which Python it has")
    probe = probe_host(entry, [python] if python else PYTHONS)
    result: dict[str, Any] = {
        "host": entry.name,
        "dest": entry.dest,
        "version": version,
        "installed_before": probe.installed,
    }
    if probe.installed == version and not force:
        return {**result, "changed": False}
    if probe.not_link is not None:
        # Never replaced: someone made it by hand, or another tool owns it.
        raise HostInstallError(
            f"host {entry.name} ({entry.dest}): {probe.not_link} exists and is not the link "
            "`xum host install` makes: move it away first"
        )
    chosen = choose_python(entry, probe)
    with tempfile.TemporaryDirectory(prefix="xum-wheelhouse-") as tmp:
        house = Path(tmp) / "wheels"
        house.mkdir()
        progress(f"building the wheelhouse for {chosen.short} ({chosen.platform})")
        wheels = build_wheelhouse(house, chosen)
        progress(f"copying {len(wheels)} wheels to {entry.name} and installing")
        done = push_and_install(entry, chosen, wheels, version)
    return {
        **result,
        "changed": True,
        "python": chosen.short,
        "wheels": [w.name for w in wheels],
        **done,
    }
