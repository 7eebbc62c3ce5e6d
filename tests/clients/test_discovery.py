"""Finding the daemon, one rule everywhere: --socket, else --root, else
XUM_SOCKET, else XUM_ROOT, else the default root. The rule itself (xum_protocol.discovery), then
the CLI, the Python clients and the daemon following it against a real daemon whose root is too
deep for a Unix socket path."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from xum_client import AsyncClient, Client
from xum_client.errors import DaemonNotRunning
from xum_protocol.discovery import default_root, resolve_socket

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")
XUMD = [sys.executable, "-m", "xumd"]


# -- the rule ------------------------------------------------------------------------------------

ENV = {"XUM_SOCKET": "/env/s.sock", "XUM_ROOT": "/env/root", "HOME": "/home/me"}


def test_an_explicit_socket_beats_everything() -> None:
    choice = resolve_socket("/arg/s.sock", "/arg/root", ENV)
    assert (choice.path, choice.source, choice.root) == (Path("/arg/s.sock"), "--socket", None)


def test_an_explicit_root_beats_the_environment() -> None:
    choice = resolve_socket(None, "/arg/root", ENV)
    assert (choice.path, choice.source) == (Path("/arg/root/xumd.sock"), "--root")
    assert choice.root == Path("/arg/root")


def test_xum_socket_beats_xum_root() -> None:
    choice = resolve_socket(None, None, ENV)
    assert (choice.path, choice.source, choice.root) == (Path("/env/s.sock"), "XUM_SOCKET", None)


def test_xum_root() -> None:
    choice = resolve_socket(env={"XUM_ROOT": "/env/root", "XUM_SOCKET": ""})
    assert (choice.path, choice.source) == (Path("/env/root/xumd.sock"), "XUM_ROOT")


def test_the_default_root_follows_xdg_state_home_then_home() -> None:
    xdg = resolve_socket(env={"XDG_STATE_HOME": "/xdg", "HOME": "/home/me", "XUM_ROOT": ""})
    assert (xdg.path, xdg.source, xdg.root) == (
        Path("/xdg/xum/xumd.sock"),
        "default",
        Path("/xdg/xum"),
    )
    home = resolve_socket(env={"HOME": "/home/me"})
    assert home.path == Path("/home/me/.local/state/xum/xumd.sock")
    assert default_root({"HOME": "/home/me"}) == Path("/home/me/.local/state/xum")


def test_a_leading_tilde_is_home() -> None:
    env = {"HOME": "/home/me"}
    assert resolve_socket("~/s.sock", None, env).path == Path("/home/me/s.sock")
    assert resolve_socket(None, "~", env).path == Path("/home/me/xumd.sock")
    assert resolve_socket(env={**env, "XUM_SOCKET": "~/x"}).path == Path("/home/me/x")
    root = resolve_socket(env={**env, "XUM_ROOT": "~/r"})
    assert (root.path, root.root) == (Path("/home/me/r/xumd.sock"), Path("/home/me/r"))
    # Only "~" alone or before "/": another user's home is not looked up.
    assert resolve_socket(env={**env, "XUM_ROOT": "~bob/r"}).path == Path("~bob/r/xumd.sock")
    assert resolve_socket(env={**env, "XUM_ROOT": "/a/~/b"}).path == Path("/a/~/b/xumd.sock")


def test_empty_values_count_as_unset() -> None:
    choice = resolve_socket("", "", {"XUM_SOCKET": "", "XUM_ROOT": "", "HOME": "/h"})
    assert choice.source == "default" and choice.path == Path("/h/.local/state/xum/xumd.sock")


def test_as_dict_is_what_xum_socket_json_prints() -> None:
    assert resolve_socket(None, None, ENV).as_dict() == {
        "socket": "/env/s.sock",
        "source": "XUM_SOCKET",
        "root": None,
    }


# -- a real daemon on a root too deep for a socket -----------------------------------------------


@pytest.fixture(scope="module")
def deep() -> Iterator[DaemonProcess]:
    base = short_tmpdir("xumds-")
    root = base / ("d" * 60) / ("e" * 60)
    assert len(os.fsencode(root / "xumd.sock")) > 107
    proc = DaemonProcess(root, args=["--socket", str(base / "s.sock")], socket_path=base / "s.sock")
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    return {**env, **values}


def xum(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([XUM, *args], capture_output=True, text=True, timeout=60, env=_env(**env))


def test_cli_reaches_a_deep_root_through_xum_socket_even_with_xum_root_set(
    deep: DaemonProcess,
) -> None:
    done = xum("status", "--json", XUM_ROOT=str(deep.root), XUM_SOCKET=str(deep.socket_path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["root"] == str(deep.root)


def test_cli_socket_option_reaches_a_deep_root_and_beats_root(deep: DaemonProcess) -> None:
    done = xum("--root", str(deep.root), "--socket", str(deep.socket_path), "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pid"] == deep.pid
    # A socket flag beats a wrong XUM_SOCKET too.
    done = xum("--socket", str(deep.socket_path), "status", "--json", XUM_SOCKET="/nonexistent")
    assert done.returncode == 0, done.stderr


def test_cli_root_option_beats_xum_socket(deep: DaemonProcess) -> None:
    # --root names another root (no daemon there): XUM_SOCKET, which does reach a daemon, must not
    # be used instead, or the command would act on a root the user did not name.
    other = short_tmpdir("xumdo-")
    done = xum("--root", str(other), "status", XUM_SOCKET=str(deep.socket_path))
    assert done.returncode == 4, done.stdout
    assert str(other / "xumd.sock") in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ["--socket", "/a/s.sock", "--root", "/b"],
            {"XUM_SOCKET": "/c/s"},
            ("/a/s.sock", "--socket"),
        ),
        (["--root", "/b"], {"XUM_SOCKET": "/c/s", "XUM_ROOT": "/d"}, ("/b/xumd.sock", "--root")),
        ([], {"XUM_SOCKET": "/c/s", "XUM_ROOT": "/d"}, ("/c/s", "XUM_SOCKET")),
        ([], {"XUM_ROOT": "/d"}, ("/d/xumd.sock", "XUM_ROOT")),
        ([], {"XDG_STATE_HOME": "/x"}, ("/x/xum/xumd.sock", "default")),
    ],
    ids=["socket", "root", "XUM_SOCKET", "XUM_ROOT", "default"],
)
def test_xum_socket_prints_the_choice_and_how_it_was_made(
    args: list[str], env: dict[str, str], expected: tuple[str, str]
) -> None:
    done = xum(*args, "socket", "--json", **env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["socket"], answer["source"]) == expected
    plain = xum(*args, "socket", **env)
    assert plain.stdout == expected[0] + "\n"


def test_python_clients_follow_the_same_rule(
    deep: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XUM_ROOT", str(deep.root))
    monkeypatch.setenv("XUM_SOCKET", str(deep.socket_path))
    # The root's own socket path is too long to bind: reaching the daemon, at XUM_SOCKET's path,
    # is XUM_SOCKET's rule at work.
    with Client() as client:
        assert client.socket_path == str(deep.socket_path)
        assert client.call("daemon.status")["pid"] == deep.pid

    async def main() -> int:
        async with AsyncClient() as client:
            assert client.socket_path == str(deep.socket_path)
            return (await client.status()).pid

    assert anyio.run(main) == deep.pid
    # An explicit root beats XUM_SOCKET: that root's own (too long) socket is tried, and refused.
    with pytest.raises(DaemonNotRunning):
        Client(deep.root)


def test_hello_answers_who_the_daemon_is(deep: DaemonProcess) -> None:
    with Client(socket_path=deep.socket_path) as client:
        hello = client.server
        status = client.call("daemon.status")
    assert hello is not None
    assert hello["root"] == str(deep.root)
    assert hello["pid"] == deep.pid
    assert hello["started_at"] == status["started_at"]
    assert hello["server"]["version"] == status["version"]
    assert hello["protocol"] == status["protocol"]
    assert hello["socket"] == str(deep.socket_path)
    assert isinstance(hello["epoch"], str) and len(hello["epoch"]) >= 16


def _answering_pid(sock: Path) -> int | None:
    try:
        with Client(socket_path=sock, timeout=5) as client:
            pid: int = client.call("daemon.status")["pid"]
            return pid
    except DaemonNotRunning:
        return None


def test_the_daemon_follows_the_rule_root_beats_xum_socket() -> None:
    """`xumd --root R` with XUM_SOCKET set listens on R/xumd.sock, where a client given the
    same --root looks; `xumd` without --root listens on XUM_SOCKET."""
    base = short_tmpdir("xumdr-")
    stray = base / "stray.sock"
    for args, expected in ((["--root", str(base / "r1")], base / "r1" / "xumd.sock"), ([], stray)):
        env = _env(XUM_SOCKET=str(stray), XUM_ROOT=str(base / "r2"))
        proc = subprocess.Popen(
            [*XUMD, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            # The socket file exists from bind(), before listen(): wait for an answer.
            answered = until(functools.partial(_answering_pid, expected), message="an answer")
            assert answered == proc.pid
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


# -- the examples in docs/PROTOCOL.md compute the same ------------------------------------------

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"

CASES: list[tuple[dict[str, str], dict[str, str]]] = [
    ({"socket": "/a/s.sock", "root": "/b"}, {"XUM_SOCKET": "/c/s"}),
    ({"root": "/b"}, {"XUM_SOCKET": "/c/s", "XUM_ROOT": "/d"}),
    ({}, {"XUM_SOCKET": "/c/s", "XUM_ROOT": "/d"}),
    ({}, {"XUM_SOCKET": "", "XUM_ROOT": "/d"}),
    ({}, {"XDG_STATE_HOME": "/x", "HOME": "/h"}),
    ({}, {"XDG_STATE_HOME": "", "HOME": "/h"}),
    ({"root": "~/r"}, {}),
    ({"socket": "~/s.sock"}, {}),
    ({}, {"XUM_SOCKET": "~/es.sock", "XUM_ROOT": "/d"}),
    ({}, {"XUM_ROOT": "~"}),
    ({}, {"XUM_ROOT": "~other/x"}),
    ({}, {"XDG_STATE_HOME": "~/st"}),
]


def _block(lang: str) -> str:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    section = text.split("### Finding the daemon", 1)[1]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def _case_env(env: dict[str, str]) -> dict[str, str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XUM_SOCKET", "XUM_ROOT", "XDG_STATE_HOME", "HOME")
    }
    return {**clean, "HOME": "/h", **env}


@pytest.mark.skipif(shutil.which("nvim") is None, reason="nvim is not installed")
@pytest.mark.parametrize(("opts", "env"), CASES)
def test_the_lua_example_agrees(opts: dict[str, str], env: dict[str, str], tmp_path: Path) -> None:
    code = _block("lua").split("local pipe")[0]
    args = ", ".join(f"{k} = {json.dumps(v)}" for k, v in opts.items())
    script = tmp_path / "x.lua"
    script.write_text(code + f'io.stdout:write(xum_socket({{{args}}}) .. "\\n")\n')
    done = subprocess.run(
        ["nvim", "--headless", "-u", "NONE", "-i", "NONE", "-c", f"luafile {script}", "-c", "q"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_case_env(env),
    )
    expected = resolve_socket(opts.get("socket"), opts.get("root"), {"HOME": "/h", **env})
    assert done.stdout.strip() == str(expected.path), done.stderr


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("opts", "env"), CASES)
def test_the_typescript_example_agrees(opts: dict[str, str], env: dict[str, str]) -> None:
    code = _block("ts").split("const conn")[0]
    # Just enough TypeScript stripped to run it on Node without a compiler.
    code = re.sub(r'import \* as (\w+) from ("node:\w+");', r"const \1 = require(\2);", code)
    code = code.replace("export function", "function")
    code = code.replace("(opts: { socket?: string; root?: string } = {}): string", "(opts = {})")
    code = code.replace("(name: string)", "(name)").replace("(p: string)", "(p)")
    code = code.replace(")!", ")")
    code += f"process.stdout.write(xumSocket({json.dumps(opts)}) + '\\n');\n"
    done = subprocess.run(
        ["node", "-e", code], capture_output=True, text=True, timeout=60, env=_case_env(env)
    )
    expected = resolve_socket(opts.get("socket"), opts.get("root"), {"HOME": "/h", **env})
    assert done.stdout.strip() == str(expected.path), done.stderr


def test_daemon_install_still_bakes_an_exported_xum_root_into_the_units() -> None:
    """--root no longer reads XUM_ROOT itself (the discovery rule does); what the CLI uses the
    root for besides the socket must still see it."""
    home = short_tmpdir("xumdh-")
    root = home / "exported-root"
    done = xum("daemon", "install", "--dry-run", "--json", XUM_ROOT=str(root), HOME=str(home))
    assert done.returncode == 0, done.stderr
    service = next(t for p, t in json.loads(done.stdout)["files"].items() if p.endswith(".service"))
    assert f"--root {root}" in service


def test_a_client_names_the_root_it_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root given as `~/...` is the one its socket was derived from, in the client and its
    errors alike (not the unexpanded text)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DaemonNotRunning) as caught:
        Client("~/nowhere")
    assert caught.value.root == str(tmp_path / "nowhere")
    assert caught.value.socket_path == str(tmp_path / "nowhere" / "xumd.sock")
    assert AsyncClient("~/nowhere").root == str(tmp_path / "nowhere")
