"""Protocol models of the `project` domain."""

from __future__ import annotations

from xum_protocol.methods_base import MethodSpec

METHODS: list[MethodSpec] = []
