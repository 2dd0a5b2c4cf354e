"""The JSON Schema (Draft 2020-12) of policy documents, generated from the model.

One schema covers both kinds: ``kind`` selects the ``spec`` schema with ``if``/``then``
(not ``oneOf``, whose failures say only "not valid under any of the given schemas").
Everything under it is pydantic's ``models_json_schema`` of the model (``model/``),
written the way editors and ``loader._translate`` read it: ``None`` means "absent", not
a value (no ``null`` branches); enumerations are plain ``enum``s; no titles. Kubernetes
strings are ``$defs`` entries with a custom ``format`` that ``runguard`` checks exactly
(``formats.py``) and, for editors that ignore unknown formats, an approximate ``pattern``.

The published file ``webhook/policy/runguard.schema.json`` is ``runguard schema -o
webhook/policy/runguard.schema.json``; a test keeps the two identical.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from pydantic.json_schema import GenerateJsonSchema, models_json_schema
from pydantic_core import core_schema

from webhook.policy.declare import Section
from webhook.policy.formats import DEFS, FORMATS, REF, format_checker
from webhook.policy.kube import RESOURCE_LIST, RESOURCE_RANGE_LIST, Metadata
from webhook.policy.model import API_VERSION, KINDS, Document

__all__ = ["API_VERSION", "KINDS", "SCHEMA_ID", "policy_schema", "validator"]

SCHEMA_ID = "https://runguard.io/schemas/v1/runguard.schema.json"


class PolicySchemaGenerator(GenerateJsonSchema):
    """pydantic's generator, writing what a policy file may say and nothing else."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> dict[str, Any]:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out

    def nullable_schema(self, schema: core_schema.NullableSchema) -> dict[str, Any]:
        return self.generate_inner(schema["schema"])  # None is the key left out

    def literal_schema(self, schema: core_schema.LiteralSchema) -> dict[str, Any]:
        out = super().literal_schema(schema)
        out.pop("type", None)  # "is not one of ..." says it; a type error would repeat it
        return out

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> dict[str, Any]:
        out: dict[str, Any] = super().default_schema(schema)
        if "default" in out and out["default"] is None:
            del out["default"]
        return out

    def handle_ref_overrides(self, json_schema: dict[str, Any]) -> dict[str, Any]:
        return json_schema  # a key's description beside its type's $ref is what editors show

    def dict_schema(self, schema: core_schema.DictSchema) -> dict[str, Any]:
        out = super().dict_schema(schema)
        keys = self.generate_inner(schema["keys_schema"]) if "keys_schema" in schema else {}
        if REF in keys:  # a Format: pydantic does not know it for a $ref yet
            out["propertyNames"] = keys
        return out

    def decimal_schema(self, schema: core_schema.DecimalSchema) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number"}
        self.update_with_validations(out, schema, self.ValidationsMapping.numeric)
        return out


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of one policy document (a RunPolicy or a Profile)."""
    return copy.deepcopy(_schema())


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    models: list[type[Section]] = [Document]
    for spec, metadata in KINDS.values():
        models += [m for m in (spec, metadata) if m not in models]
    _, generated = models_json_schema(
        [(model, "validation") for model in models],
        ref_template=DEFS + "{model}",
        schema_generator=PolicySchemaGenerator,
    )
    defs: dict[str, Any] = generated["$defs"]
    envelope = defs.pop(Document.__name__)
    for definition in (*FORMATS, RESOURCE_LIST, RESOURCE_RANGE_LIST):
        defs[definition.ref] = definition.definition()
    branches = []
    namespaced = [m for _, m in KINDS.values() if "namespace" in m.model_fields]
    if namespaced:  # the envelope's metadata allows no namespace: each kind says its own
        envelope["properties"]["metadata"] = {
            "type": "object",
            "description": envelope["properties"]["metadata"].get("description", ""),
        }
    for kind, (spec, metadata) in KINDS.items():
        then = {"spec": {"$ref": DEFS + spec.__name__}}
        if metadata is not Metadata or namespaced:
            then["metadata"] = {"$ref": DEFS + metadata.__name__}
        branches.append(
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"properties": then},
            }
        )
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "runguard policy document",
        **envelope,
        "allOf": branches,
        "$defs": dict(sorted(defs.items())),
    }
    written: dict[str, Any] = _write_refs(schema)
    for holder in (written, *written["$defs"].values()):
        for prop in holder.get("properties", {}).values():
            target = written["$defs"].get(prop.get("$ref", "").removeprefix(DEFS), {})
            if "description" not in prop and "description" in target:
                prop["description"] = target["description"]  # a section's docstring
    return written


def _write_refs(node: Any) -> Any:
    """Turn the placeholders of ``formats.REF`` into ``$ref``s."""
    if isinstance(node, dict):
        out = {key: _write_refs(value) for key, value in node.items()}
        if REF in out:
            return {"$ref": DEFS + out.pop(REF), **out}
        return out
    if isinstance(node, list):
        return [_write_refs(item) for item in node]
    return node


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    """A validator for one policy document, with runguard's formats checked."""
    return Draft202012Validator(_schema(), format_checker=format_checker())


assert API_VERSION == "runguard.io/v1"
