"""The method table is the one list of the protocol's methods.

- each method is declared once, as a `MethodSpec` constant of its domain's models named after it;
- `xum_protocol.method_names` (the names without the models, for the lean start and `hello`) is
  what `make schema` writes from the table, byte for byte;
- the router registers a protocol method against its spec (a name alone is refused, unless the
  route loads its model at its first request: the daemon's own), and mypy --strict rejects a
  handler whose params or result are not its spec's, a deferred feature's route included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from xum_protocol import method_names
from xum_protocol.methods import DOMAINS, METHODS, MethodSpec, render_lua, render_names
from xum_protocol.models.daemon import EmptyParams
from xum_protocol.models.process import PROCESS_GET, ProcessRef
from xumd.rpc.dispatch import RequestContext, Router

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("daemon", "protocol")


def test_each_method_is_one_constant_named_after_it() -> None:
    declared: dict[str, str] = {}
    for domain in DOMAINS:
        for variable, value in vars(domain).items():
            if isinstance(value, MethodSpec):
                assert variable == value.name.upper().replace(".", "_"), (domain, variable)
                assert declared.setdefault(value.name, domain.__name__) == domain.__name__
                assert METHODS[value.name] is value
    assert set(declared) == set(METHODS)
    assert len(METHODS) > 40  # the gathering found the domains' constants


def test_the_method_names_are_what_make_schema_writes_from_the_table() -> None:
    written = Path(method_names.__file__).read_text()
    assert written == render_names(), (
        "xum_protocol/method_names.py is stale (a method was added, renamed or removed): "
        "run `make schema` and commit the result"
    )
    assert set(METHODS) == method_names.METHOD_NAMES


def test_the_neovim_plugins_mutating_methods_are_what_make_schema_writes() -> None:
    written = (REPO / "clients" / "nvim" / "lua" / "xum" / "methods.lua").read_text()
    assert written == render_lua(), (
        "clients/nvim/lua/xum/methods.lua is stale: run `make schema` and commit the result"
    )
    for name in method_names.MUTATING:
        assert f"['{name}'] = true" in written


async def _handler(params: Any, ctx: RequestContext) -> Any:
    raise AssertionError("not called")


def test_a_protocol_method_is_registered_by_its_spec() -> None:
    router = Router()
    router.add(PROCESS_GET, _handler)
    assert router.routes["process.get"].params is ProcessRef
    with pytest.raises(RuntimeError, match="register it by its spec"):
        router.add("process.list", _handler, ProcessRef)
    with pytest.raises(RuntimeError, match="needs its params model"):
        router.add("x.unknown", _handler)
    # The daemon's own, whose model loads at the first request; a method outside the table.
    router.add("daemon.status", _handler, params_from=lambda: EmptyParams)
    router.add("test.thing", _handler, BaseModel)
    assert set(router.routes) == {"process.get", "daemon.status", "test.thing"}


# Each line marked `wrong` is a handler whose params or result are not its method's.
_SNIPPET = """
from xum_protocol.models.gc import GC_PLAN, GcPlanParams, GcPlanResult
from xum_protocol.models.process import PROCESS_GET, ProcessRef, ProcessResult
from xum_protocol.models.turn import TurnIdParams, TurnResult
from xumd.rpc.deferred import Deferred
from xumd.rpc.dispatch import Encoded, Router
from xumd.rpc.dispatch import RequestContext as Ctx

router = Router()
service: Deferred[int] = Deferred("example", lambda: 1)


async def get(p: ProcessRef, ctx: Ctx) -> ProcessResult: raise NotImplementedError
async def get_encoded(p: ProcessRef, ctx: Ctx) -> Encoded: raise NotImplementedError
async def other_params(p: TurnIdParams, ctx: Ctx) -> ProcessResult: raise NotImplementedError
async def other_result(p: ProcessRef, ctx: Ctx) -> TurnResult: raise NotImplementedError
async def plan(s: int, p: GcPlanParams, ctx: Ctx) -> GcPlanResult: raise NotImplementedError
async def plan_other(s: int, p: GcPlanParams, ctx: Ctx) -> TurnResult: raise NotImplementedError


router.add(PROCESS_GET, get)
router.add(PROCESS_GET, get_encoded)
router.add(PROCESS_GET, other_params)  # wrong
router.add(PROCESS_GET, other_result)  # wrong
router.add(GC_PLAN, service.route(plan))
router.add(GC_PLAN, service.route(plan_other))  # wrong
"""


def test_mypy_rejects_a_handler_that_is_not_its_specs(tmp_path: Path) -> None:
    snippet = tmp_path / "registrations.py"
    snippet.write_text(textwrap.dedent(_SNIPPET))
    wrong = [
        number
        for number, line in enumerate(snippet.read_text().splitlines(), start=1)
        if line.endswith("# wrong")
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            str(snippet),
        ],
        cwd=REPO,
        env={**os.environ, "MYPYPATH": os.pathsep.join(str(REPO / p) for p in SOURCES)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    lines = sorted({int(line.split(":")[1]) for line in errors})
    assert lines == wrong, done.stdout + done.stderr
    assert all("[arg-type]" in line for line in errors), done.stdout
