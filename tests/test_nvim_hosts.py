"""The Neovim plugin through a host (docs/HOSTS.md): setup{ host = ... } runs `ssh ... xum
bridge` (a real sshd on loopback, tests/support/sshd.py) to a real xumd; the scenario is
`host` in tests/nvim/scenarios.lua."""

from __future__ import annotations

import shutil

import pytest

from tests.support.daemon import short_tmpdir
from tests.support.sshd import ALIAS, ALIAS_DOWN, SshServer
from tests.test_nvim_plugin import NVIM, run_scenario, world_in

pytestmark = pytest.mark.skipif(
    NVIM is None, reason="nvim is not installed (apt-get install neovim)"
)


def test_plugin_through_a_host_reconnects_and_names_a_host_down() -> None:
    base = short_tmpdir("xumnh-")
    server = SshServer(base)
    try:
        server.start()
        with world_in(short_tmpdir("xumnv-")) as world:
            run_scenario(
                world,
                "host",
                env={
                    **server.env(),
                    "XUM_SOCKET": "<unset>",
                    "XUM_TEST_SSH_ALIAS": ALIAS,
                    "XUM_TEST_SSH_DOWN": ALIAS_DOWN,
                    "XUM_TEST_DAEMON_PID": str(world.daemon.pid),
                },
            )
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
