"""How a policy key is declared: ``Section``, the markers its types use, and ``iter_keys``.

A key is one field of a ``Section`` (a frozen pydantic model): its snake_case name is what
the engine reads, its camelCase alias what the YAML says; its type, default, description
and constraints are the ``Field``. The JSON Schema (``schema.py``), the loading and
defaults (``model.build_run_policy``), lint and the reference docs (``reference.py``) are
all derived from those fields.

Values the engine needs precomputed from keys (parsed maximums, the gpu name resolved)
are ``functools.cached_property``s of the section: computed once when the model is
built (``model_post_init``), then plain attributes.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, ClassVar, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

__all__ = ["UNIQUE", "AsWritten", "Key", "Section", "Shape", "iter_keys", "key_path"]


class Section(BaseModel):
    """Base of every policy model: frozen, unknown keys refused, camelCase keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel)

    _derived: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._derived = tuple(
            name
            for klass in cls.__mro__
            for name, value in vars(klass).items()
            if isinstance(value, cached_property)
        )

    def model_post_init(self, context: Any, /) -> None:
        for name in self._derived:  # computed now, so that the engine only reads them
            getattr(self, name)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` (by attribute name, not checked); derived values follow
        the updated fields unless ``update`` sets them too."""
        copied = super().model_copy(update=update, deep=deep)
        for name in self._derived:
            if name not in (update or {}):
                del copied.__dict__[name]
        copied.model_post_init(None)
        return copied


class Shape(Section):
    """A Kubernetes object shape (Toleration, Affinity, ...): one key in the reference docs."""


@dataclass(frozen=True)
class AsWritten:
    """``Annotated`` metadata: check a value against a ``Shape``, keep it as written.

    The engine copies tolerations, affinities and env vars into pods as the admin wrote
    them (no defaults filled in, no key renamed), so the model keeps the plain dict.
    """

    shape: type[Shape]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(
            _keep_as_written, handler.generate_schema(self.shape)
        )


def _keep_as_written(value: Any, check: Callable[[Any], Any]) -> Any:
    check(value)
    return value


class _Unique:
    """``Annotated`` metadata for a list whose items must differ (``uniqueItems``)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_check_unique, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {**handler(schema), "uniqueItems": True}


def _check_unique(items: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(set(items)) != len(items):
        raise PydanticCustomError("unique_items", "has duplicate items")
    return items


UNIQUE = _Unique()


@dataclass(frozen=True)
class Key:
    """One policy key: its path of YAML names below ``spec``, and its field."""

    path: tuple[str, ...]
    name: str  # the attribute the engine reads
    field: FieldInfo
    owner: type[Section]

    def uses(self, marker: object) -> bool:
        """True when ``marker`` (a ``Format``, ``RESOURCE_LIST``) is in the key's type."""
        return marker in self.field.metadata or _mentions(self.field.annotation, marker)


def iter_keys(model: type[Section], prefix: tuple[str, ...] = ()) -> Iterator[Key]:
    """Every key of ``model`` and of the sections below it, depth first, in declared order.

    ``Shape``s (Kubernetes objects) are one key each: their own fields are Kubernetes'.
    """
    for name, field in model.model_fields.items():
        key = Key((*prefix, field.alias or name), name, field, model)
        yield key
        section = section_of(field.annotation)
        if section is not None:
            yield from iter_keys(section, key.path)


def key_path(model: type[Section], *names: str) -> tuple[str, ...]:
    """The YAML path of the key reached through attribute ``names``.

    ``key_path(RunPolicySpec, "profiles_config", "default")`` is ``("profiles", "default")``;
    a name the model does not have is a KeyError at import, not a rule that never fires.
    """
    path = []
    owner: Any = model
    for name in names:
        field = owner.model_fields[name]
        path.append(field.alias or name)
        owner = _model_of(field.annotation)
    return tuple(path)


def _model_of(annotation: Any) -> type[Section] | None:
    if get_origin(annotation) in (Union, types.UnionType):
        found = [_model_of(arg) for arg in get_args(annotation) if arg is not type(None)]
        return found[0] if len(found) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


def section_of(annotation: Any) -> type[Section] | None:
    """The section a field holds (``X`` or ``X | None``), unless a Kubernetes shape."""
    model = _model_of(annotation)
    return None if model is None or issubclass(model, Shape) else model


def _mentions(annotation: Any, marker: object) -> bool:
    if get_origin(annotation) is Annotated:
        args = get_args(annotation)
        return any(m is marker for m in args[1:]) or _mentions(args[0], marker)
    return any(_mentions(arg, marker) for arg in get_args(annotation))
