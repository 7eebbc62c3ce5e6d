"""docs/PROTOCOL.md lists every method and every event type: its generated sections are up to
date (`make schema`), and the event catalog matches what the daemon really publishes (every
`publish("type", field=...)` call in daemon/xumd: the type and its fields are listed)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from xum_protocol.docs import methods_table, render
from xum_protocol.event_types import EVENT_TYPES
from xum_protocol.methods import METHODS

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = ROOT / "docs" / "PROTOCOL.md"
DAEMON = ROOT / "daemon" / "xumd"


def _published() -> dict[str, set[str]]:
    """event type -> fields passed by name at its call sites, across daemon/xumd."""
    found: dict[str, set[str]] = {}
    for path in sorted(DAEMON.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        module = ".".join(path.relative_to(DAEMON.parent).with_suffix("").parts)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("publish", "_publish"):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                type_ = first.value
            elif isinstance(first, ast.Name) and first.id.isupper():
                type_ = getattr(importlib.import_module(module), first.id)
            else:
                continue  # a helper's parameter, or a test method's params.type
            fields = {kw.arg for kw in node.keywords if kw.arg is not None}
            found.setdefault(type_, set()).update(fields)
    return found


def test_generated_sections_are_up_to_date() -> None:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    assert render(text) == text, (
        "docs/PROTOCOL.md's method or event list is stale: run `make schema` and commit it"
    )


def test_every_method_is_listed() -> None:
    table = methods_table()
    for name in METHODS:
        assert f"| `{name}` |" in table


def test_every_published_event_type_is_in_the_catalog() -> None:
    published = _published()
    # The scan itself works: it sees the kinds of call sites the daemon uses.
    for known in ("workspace.state_changed", "cleanup.obligation_changed", "lease.released"):
        assert known in published, f"the scan missed {known}"
    by_type = {event.type: event for event in EVENT_TYPES}
    missing = sorted(set(published) - set(by_type))
    assert not missing, f"published but not in xum_protocol.event_types: {missing}"
    unused = sorted(set(by_type) - set(published))
    assert not unused, f"in the catalog but never published: {unused}"
    for type_, fields in published.items():
        documented = {name.rstrip("?") for name in by_type[type_].data}
        extra = fields - documented
        assert not extra, f"{type_} publishes undocumented data fields {sorted(extra)}"
    assert len({e.type for e in EVENT_TYPES}) == len(EVENT_TYPES), "a type listed twice"
