"""Protocol models of the `lease` domain."""

from __future__ import annotations

from xum_protocol.methods_base import MethodSpec

METHODS: list[MethodSpec] = []
