"""Generate JSON Schema for the whole protocol: `make schema` (`python -m xum_protocol.schema DIR`).

The output, protocol/schema/xum-protocol.schema.json, is committed for plugin authors; a test
fails when it is stale, so a change to any model is followed by `make schema`.

Each method's `params` and `result`, and each notification's schema, is a standalone JSON Schema
(its `$ref`s point into its own `$defs`). Events: `notifications.event.params` is the envelope
every event has (`data` untyped, so a client accepts event types it does not know);
`notifications.event.typed` is the discriminated union (on `type`) of every known event with its
typed `data`; `notifications.event.types[type]` names that type's definitions in `typed.$defs`
(`event`: `WorkspaceStateChangedEvent`, `data`: `WorkspaceStateChangedData`) and lists its fields.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from xum_protocol.errors import ERROR_CODES
from xum_protocol.event_types import EVENT_TYPES, TYPED_EVENTS, typed_event_adapter
from xum_protocol.methods import METHODS, MethodSpec
from xum_protocol.models.events import EVENT_NOTIFICATION, Event
from xum_protocol.request_keys import FIELD, json_schema
from xum_protocol.version import PROTOCOL_VERSION


def _params(spec: MethodSpec[Any, Any], read: set[type[Any]]) -> dict[str, Any]:
    """The params' schema; a mutating method's accept its `request_key` beside them (read by
    the daemon's transport, never by the handler). Params a read shares (`workspace.get`'s
    and `workspace.keep`'s) are two schemas: the keyed one is titled `<model>Keyed`."""
    schema: dict[str, Any] = spec.params.model_json_schema()
    if spec.mutating:
        schema = {**schema, "properties": {**schema.get("properties", {}), FIELD: json_schema()}}
        if spec.params in read:
            schema["title"] = f"{schema.get('title', spec.params.__name__)}Keyed"
    return schema


def build_schema() -> dict[str, Any]:
    methods: dict[str, Any] = {}
    read = {spec.params for spec in METHODS.values() if not spec.mutating}
    for name in sorted(METHODS):
        spec = METHODS[name]
        methods[name] = {
            "summary": spec.summary,
            "mutating": spec.mutating,
            "params": _params(spec, read),
            "result": spec.result.model_json_schema(mode="serialization"),
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "xum protocol",
        "protocol": PROTOCOL_VERSION,
        "framing": "JSON-RPC 2.0, one message per line (NDJSON, UTF-8); see docs/PROTOCOL.md",
        "errors": {kind.value: code for kind, code in ERROR_CODES.items()},
        "methods": methods,
        "notifications": {
            EVENT_NOTIFICATION: {
                "summary": "One event on a connection subscribed with events.subscribe.",
                "params": Event.model_json_schema(mode="serialization"),
                "typed": typed_event_adapter().json_schema(mode="serialization"),
                "types": {
                    e.type: {
                        "summary": e.summary,
                        "event": TYPED_EVENTS[e.type].__name__,
                        "data": e.model.__name__,
                        "fields": dict(e.data),
                    }
                    for e in EVENT_TYPES
                },
            }
        },
    }


SCHEMA_FILE = "xum-protocol.schema.json"


def render() -> bytes:
    return orjson.dumps(build_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "protocol/schema")
    out.mkdir(parents=True, exist_ok=True)
    (out / SCHEMA_FILE).write_bytes(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
