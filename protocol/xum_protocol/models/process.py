"""Protocol models of the `process` domain."""

from __future__ import annotations

from xum_protocol.methods_base import MethodSpec

METHODS: list[MethodSpec] = []
