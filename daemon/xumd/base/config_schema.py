"""The daemon configuration's schema as pydantic models, derived from `xumd.base.config`'s tables of
keys (type, default, bounds, description): the documentation's source (field descriptions, JSON
Schema). The daemon validates ROOT/config.toml with `xumd.base.config` itself, which imports no
pydantic on its way to readiness; tests/daemon/test_config_lean.py checks that pydantic, given the
same keys, takes and refuses what `xumd.base.config` does, in the same words.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from xumd.base import config


def _model(section: type[config.Section]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, key in section.KEYS.items():
        if isinstance(key.kind, type) and issubclass(key.kind, config.Section):
            nested = _model(key.kind)
            fields[name] = (nested, Field(default_factory=nested, description=key.doc))
            continue
        if key.kind is list:
            fields[name] = (list[str], Field(default_factory=list, description=key.doc))
            continue
        fields[name] = (
            key.kind,
            Field(  # a None bound is no bound, in pydantic as in `xumd.base.config`
                default=key.default,
                description=key.doc,
                gt=key.gt,
                ge=key.ge,
                le=key.le,
                min_length=key.min_length,
            ),
        )
    validators: dict[str, Any] = {}
    if section._consistent is not config.Section._consistent:

        def consistent(model: BaseModel) -> BaseModel:
            # The section's own rule, read off the model's attributes (the same names).
            why = section._consistent(model)  # type: ignore[arg-type]
            if why is not None:
                raise ValueError(why)
            return model

        validators["_consistent"] = model_validator(mode="after")(consistent)
    model: type[BaseModel] = create_model(
        section.__name__,
        __config__=ConfigDict(extra="forbid"),
        __doc__=section.__doc__,
        __validators__=validators,
        **fields,
    )
    return model


DaemonConfig = _model(config.DaemonConfig)
