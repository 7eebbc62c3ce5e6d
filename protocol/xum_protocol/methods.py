"""The method table: name -> spec (params model, result model, summary), gathered from the
domain modules, where each method is declared once as a `MethodSpec` constant named after it.

Every other list of the methods derives from this one: the JSON Schema and docs/PROTOCOL.md
(`make schema`), the TypeScript types (from the schema), the daemon's routes (registered against
these specs), and `xum_protocol.method_names`, the names alone for what must not load the models
(written from this table by `make schema`; tests/protocol/test_method_table.py checks it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models import (
    cleanup,
    daemon,
    events,
    gc,
    lease,
    process,
    project,
    recovery,
    turn,
    usage,
    workspace,
)

DOMAINS = (
    daemon,
    project,
    workspace,
    usage,
    gc,
    cleanup,
    process,
    lease,
    turn,
    recovery,
    events,
)
"""The modules that declare methods, in the table's order."""


def _gather() -> dict[str, MethodSpec[Any, Any]]:
    table: dict[str, MethodSpec[Any, Any]] = {}
    for domain in DOMAINS:
        for value in vars(domain).values():
            if not isinstance(value, MethodSpec) or table.get(value.name) is value:
                continue
            if value.name in table:
                raise RuntimeError(f"method {value.name} declared twice")
            table[value.name] = value
    return table


METHODS: dict[str, MethodSpec[Any, Any]] = _gather()

__all__ = ["METHODS", "MethodSpec"]

NAMES_DOC = (
    "The names of the protocol's methods, without their models: what a server answers `hello`'s\n"
    "`capabilities` from, and registers before any model is loaded, and which of them are\n"
    "mutating (a client's retry names them with a request key). Written from\n"
    "`xum_protocol.methods.METHODS` by `make schema` (tests/protocol/test_method_table.py checks\n"
    "it is fresh): do not edit."
)


def render_names() -> str:
    """The source of `xum_protocol.method_names`: the table's names, in its order."""
    names = "".join(f'        "{name}",\n' for name in METHODS)
    mutating = "".join(f'        "{name}",\n' for name, spec in METHODS.items() if spec.mutating)
    return (
        f'"""{NAMES_DOC}"""\n\nfrom __future__ import annotations\n\n'
        f"METHOD_NAMES: frozenset[str] = frozenset(\n    {{\n{names}    }}\n)\n\n"
        f"MUTATING: frozenset[str] = frozenset(\n    {{\n{mutating}    }}\n)\n"
        f'"""The methods whose params accept a `request_key` (`MethodSpec.mutating`)."""\n'
    )


def render_lua() -> str:
    """The Neovim plugin's table of mutating methods (clients/nvim/lua/xum/methods.lua): the
    methods its client keys, as the Python and TypeScript clients do."""
    mutating = "".join(f"  ['{name}'] = true,\n" for name, spec in METHODS.items() if spec.mutating)
    return (
        "-- The protocol's mutating methods: their params accept a `request_key`, which the\n"
        "-- client gives each call so that a call whose answer was lost is sent again safely.\n"
        "-- Written from `xum_protocol.methods.METHODS` by `make schema`\n"
        "-- (tests/protocol/test_method_table.py checks it is fresh): do not edit.\n"
        f"local M = {{}}\n\nM.MUTATING = {{\n{mutating}}}\n\nreturn M\n"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m xum_protocol.methods FILE [--lua LUAFILE]`: write `render_names()` to FILE
    (and `render_lua()` to LUAFILE)."""
    args = sys.argv[1:] if argv is None else argv
    Path(args[0]).write_text(render_names())
    if len(args) == 3 and args[1] == "--lua":
        Path(args[2]).write_text(render_lua())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
