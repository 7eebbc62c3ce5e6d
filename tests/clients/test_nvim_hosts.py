"""The Neovim plugin through a host (docs/HOSTS.md): setup{ host = ... } runs `ssh ... xum
bridge` (a real sshd on loopback, tests/support/sshd.py) to a real xumd; the scenario is
`host` in tests/nvim/scenarios.lua."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import VersionMismatch
from xum_client.hosts import HostConfigError, HostEntry, add_host, ssh_command
from xum_client.sync import CLIENT_VERSION, release_context

from tests.clients.test_nvim_plugin import NVIM, headless_nvim, run_scenario, world_in
from tests.hosts.test_config import ssh_failures, xum_ssh_cases
from tests.support.daemon import short_tmpdir
from tests.support.sshd import ALIAS, ALIAS_DOWN, SshServer

pytestmark = pytest.mark.skipif(
    NVIM is None, reason="nvim is not installed (apt-get install neovim)"
)


def lua_answer(tmp_short: Path, name: str, body: str, answer: str) -> Any:
    """Run `body` in a headless Neovim with the plugin; the Lua expression `answer` (evaluated
    after it), as JSON decoded here."""
    script = tmp_short / f"{name}.lua"
    out = tmp_short / f"{name}.json"
    script.write_text(body + f"vim.fn.writefile({{ vim.json.encode({answer}) }}, '{out}')\n")
    done = subprocess.run(
        headless_nvim(f"luafile {script}", "qa!"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_plugin_through_a_host_reconnects_and_names_a_host_down() -> None:
    base = short_tmpdir("xumnh-")
    server = SshServer(base)
    try:
        server.start()
        with world_in(short_tmpdir("xumnv-")) as world:
            hosts_file = base / "hosts.toml"
            add_host(HostEntry("h", ALIAS, str(world.root)), path=hosts_file)
            run_scenario(
                world,
                "host",
                env={
                    **server.env(),
                    "XUM_SOCKET": "<unset>",
                    "XUM_TEST_SSH_ALIAS": ALIAS,
                    "XUM_TEST_SSH_DOWN": ALIAS_DOWN,
                    "XUM_TEST_DAEMON_PID": str(world.daemon.pid),
                    "XUM_HOSTS_FILE": str(hosts_file),
                },
            )
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)


def test_checkhealth_in_host_mode_checks_the_host() -> None:
    """`:checkhealth xum` with setup{ host }: the host's entry, ssh and the daemon's hello
    through it, no local socket; a host that is down and a name not in the hosts file are
    errors with advice for a host (scenario `health_host`)."""
    base = short_tmpdir("xumnh-")
    server = SshServer(base)
    try:
        server.start()
        with world_in(short_tmpdir("xumnv-")) as world:
            hosts_file = base / "hosts.toml"
            add_host(HostEntry("h", ALIAS, str(world.root)), path=hosts_file)
            run_scenario(
                world,
                "health_host",
                env={
                    **server.env(),
                    "XUM_SOCKET": "<unset>",
                    "XUM_TEST_SSH_ALIAS": ALIAS,
                    "XUM_TEST_SSH_DOWN": ALIAS_DOWN,
                    "XUM_HOSTS_FILE": str(hosts_file),
                },
            )
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)


def test_what_a_proxy_command_left_goes_with_ssh(tmp_short: Path) -> None:
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (apt-get install socat)")
    base = short_tmpdir("xumnp-")
    server = SshServer(base)
    marker = tmp_short / "proxy-child.pid"
    try:
        server.start()
        with world_in(short_tmpdir("xumnv-")) as world:
            try:
                run_scenario(
                    world,
                    "host_proxy",
                    env={
                        **server.env(),
                        "XUM_SOCKET": "<unset>",
                        "XUM_TEST_SSH_ALIAS": ALIAS,
                        "XUM_TEST_PROXY_MARKER": str(marker),
                    },
                )
            except BaseException:
                if marker.exists():
                    # The scenario failed: the child it names may still run, and is ours.
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(marker.read_text()), signal.SIGKILL)
                raise
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)


def test_the_plugins_ssh_command_is_the_python_clients(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Word for word, for every $XUM_SSH of the shared table (quotes, backslashes, a path with
    a space): the same argv, or the same refusal where it cannot be split."""
    entry = HostEntry("dev-1", "me@dev.example", "/srv/a b'c$(x)", {"ConnectTimeout": "5"})
    cases = xum_ssh_cases()
    results = lua_answer(
        tmp_short,
        "argv",
        f"local cases = vim.json.decode({json.dumps(json.dumps(cases))})\n"
        "local results = {}\n"
        "for i, case in ipairs(cases) do\n"
        "  vim.env.XUM_SSH = case.text\n"
        "  local argv, err = require('xum.host').ssh_argv({ name = 'dev-1', "
        "dest = 'me@dev.example', remote_root = \"/srv/a b'c$(x)\", "
        "ssh_options = { ConnectTimeout = '5' } })\n"
        "  results[i] = { argv = argv or vim.NIL, err = err or vim.NIL }\n"
        "end\n",
        "results",
    )
    assert len(results) == len(cases)
    for case, result in zip(cases, results, strict=True):
        monkeypatch.setenv("XUM_SSH", case["text"])
        if "error" in case:
            with pytest.raises(HostConfigError, match=case["error"]):
                ssh_command(entry)
            assert result["argv"] is None, case
            assert case["error"] in result["err"], (case, result)
        else:
            assert result == {"argv": ssh_command(entry), "err": None}, case


def test_the_plugin_classifies_ssh_failures_as_the_python_client(tmp_short: Path) -> None:
    """Kind and message word for word, for every case of the shared table."""
    table = ssh_failures()
    results = lua_answer(
        tmp_short,
        "classify",
        f"local table_ = vim.json.decode({json.dumps(json.dumps(table))})\n"
        "local results = {}\n"
        "for i, case in ipairs(table_.cases) do\n"
        "  local kind, message = require('xum.host').classify(table_.entry, case.status, "
        "case.stderr)\n"
        "  results[i] = { kind = kind, message = message }\n"
        "end\n",
        "results",
    )
    expected = [{"kind": c["kind"], "message": c["message"]} for c in table["cases"]]
    assert results == expected


def test_the_plugins_release_check_through_a_host_is_the_python_clients(tmp_short: Path) -> None:
    """The message for a host's daemon of another release, word for word (where it runs, and
    `xum host install` as the fix)."""
    result = lua_answer(
        tmp_short,
        "mismatch",
        "local client = require('xum.client')\n"
        "local err = client.check_release({ server = { version = '9.9.0' } }, "
        "{ name = 'h', dest = 'me@h', remote_root = '/srv/x' })\n"
        "local ok = client.check_release({ server = { version = client.VERSION } }, "
        "{ name = 'h', dest = 'me@h' })\n",
        "{ err = err, ok = ok or vim.NIL }",
    )
    expected = VersionMismatch(CLIENT_VERSION, "9.9.0", *release_context("/srv/x", "h"))
    assert result["err"]["message"] == str(expected)
    assert result["err"]["data"] == {"kind": "version_mismatch", **expected.data}
    assert result["ok"] is None
