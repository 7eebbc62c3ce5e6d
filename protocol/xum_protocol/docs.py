"""Generate the method and event lists of docs/PROTOCOL.md from the method table and the event
catalog: `python -m xum_protocol.docs docs/PROTOCOL.md` (part of `make schema`).

Each list sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` markers; the rest
of the document is hand-written and left as it is. A test fails when a list is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import BaseModel

from xum_protocol.event_types import EVENT_TYPES
from xum_protocol.methods import METHODS
from xum_protocol.request_keys import FIELD


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _params(model: type[BaseModel], mutating: bool) -> str:
    names = [
        name if field.is_required() else f"{name}?" for name, field in model.model_fields.items()
    ]
    if mutating:
        names.append(f"{FIELD}?")
    return "`{" + ", ".join(names) + "}`" if names else "`{}`"


def methods_table() -> str:
    lines = ["| method | params (`?`: optional) | what it does |", "|---|---|---|"]
    for name in sorted(METHODS):
        spec = METHODS[name]
        params = _params(spec.params, spec.mutating)
        lines.append(f"| `{name}` | {params} | {_cell(spec.summary)} |")
    return "\n".join(lines)


def events_table() -> str:
    lines = ["| type | `data` fields (`?`: not always present) | when |", "|---|---|---|"]
    for event in sorted(EVENT_TYPES, key=lambda e: e.type):
        fields = "; ".join(f"`{name}`: {desc}" for name, desc in event.data.items())
        lines.append(f"| `{event.type}` | {_cell(fields)} | {_cell(event.summary)} |")
    return "\n".join(lines)


SECTIONS = {"methods": methods_table, "events": events_table}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated:{name} -->\n)(?:.*?\n)?(<!-- /generated:{name} -->)", re.DOTALL
    )


def render(text: str) -> str:
    """`text` with every generated section brought up to date (a missing marker is an error)."""
    for name, build in SECTIONS.items():
        pattern = _pattern(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- generated:{name} --> section")
        body = build()

        def replace(match: re.Match[str], body: str = body) -> str:
            return match.group(1) + body + "\n" + match.group(2)

        text = pattern.sub(replace, text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "docs/PROTOCOL.md")
    before = path.read_text(encoding="utf-8")
    after = render(before)
    if after != before:
        path.write_text(after, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
