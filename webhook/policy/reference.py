"""The policy reference (``docs/policy-reference.md``), generated from the model.

Every key of a RunPolicy and a Profile, in the model's order, with its type, default
and description as the JSON Schema generated from the model states them; then the
types those keys use. ``runguard schema --format markdown`` prints it; a test keeps the
committed file identical.
"""

from __future__ import annotations

import json
import re
from typing import Any

from webhook.policy.declare import Key, Section, iter_keys, section_of
from webhook.policy.formats import DEFS, FORMATS
from webhook.policy.kube import RESOURCE_LIST, RESOURCE_RANGE_LIST, Metadata
from webhook.policy.model import KINDS, Document
from webhook.policy.schema import policy_schema

__all__ = ["policy_reference"]

_OUR_TYPES = {
    definition.ref: definition for definition in (*FORMATS, RESOURCE_LIST, RESOURCE_RANGE_LIST)
}
_SPECS = {spec.__name__: kind for kind, (spec, _) in KINDS.items()}
_HEADER = "| key | type | default | description |\n|---|---|---|---|\n"


def policy_reference() -> str:
    """``docs/policy-reference.md``."""
    schema = policy_schema()
    defs: dict[str, Any] = {**schema["$defs"], Document.__name__: schema}
    shapes: dict[str, None] = {}  # Kubernetes shapes met, in order
    spec_description = schema["properties"]["spec"]["description"]
    out = [
        "# Policy reference\n",
        "<!-- Generated from webhook/policy/model/ by `runguard schema --format markdown "
        "-o docs/policy-reference.md`; do not edit (tests/policy/test_reference.py). -->\n",
        f"{schema['description']} Every key is optional unless its default says "
        "*required*; a key left out takes its default, and \u2014 means absent (that part "
        "of the policy is off). How to write and check a policy: "
        "[policies.md](policies.md).\n",
        "## Every document\n",
        _HEADER
        + _rows(Document, (), defs, shapes, skip=("metadata", "spec"))
        + _rows(Metadata, ("metadata",), defs, shapes)
        + f"| `spec` | mapping, keys below | *required* | {_cell(spec_description)} |\n",
    ]
    for kind, (spec, metadata) in KINDS.items():
        out.append(f"## {kind}: `spec`\n")
        if metadata is not Metadata:
            out.append(f"`metadata`: {defs[metadata.__name__]['description']}\n")
        out.append(_HEADER + _rows(spec, ("spec",), defs, shapes))
    types = "| type | what | checked |\n|---|---|---|\n"
    for ref in _OUR_TYPES:
        definition = defs[ref]
        if "format" in definition:
            checked = f"`format: {definition['format']}` (exactly by runguard)"
        else:
            checked = f"keys: {definition['propertyNames']['description']}"
        types += f"| {_words(ref)} | {_cell(definition['description'])} | {_cell(checked)} |\n"
    for name in shapes:
        types += (
            f"| Kubernetes {name} | {_cell(defs[name]['description'])} | "
            f"the keys of `$defs/{name}` in the JSON Schema |\n"
        )
    out += ["## Types\n", types]
    return "\n".join(out)


def _rows(
    model: type[Section],
    prefix: tuple[str, ...],
    defs: dict[str, Any],
    shapes: dict[str, None],
    skip: tuple[str, ...] = (),
) -> str:
    rows = []
    for key in iter_keys(model):
        if key.path[0] in skip:
            continue
        owner = defs[key.owner.__name__]
        prop = owner["properties"][key.path[-1]]
        section = section_of(key.field.annotation)
        kind = "mapping, keys below" if section else _type(prop, defs, shapes)
        rows.append(
            f"| `{'.'.join((*prefix, *key.path))}` | {kind} | "
            f"{_default(key, prop, owner, section)} | {_cell(prop.get('description', ''))} |\n"
        )
    return "".join(rows)


def _default(key: Key, prop: dict[str, Any], owner: dict[str, Any], section: Any) -> str:
    if key.path[-1] in owner.get("required", ()):
        return "*required*"
    if "default" in prop:
        return f"`{_yaml(prop['default'])}`"
    return "" if section else "\u2014"


def _type(prop: dict[str, Any], defs: dict[str, Any], shapes: dict[str, None]) -> str:
    if "anyOf" in prop:  # a RunPolicy's platform: a Platform's name, or its keys inline
        return " or ".join(_type(branch, defs, shapes) for branch in prop["anyOf"])
    if "$ref" in prop:
        name = prop["$ref"].removeprefix(DEFS)
        if name in _SPECS:
            return f"mapping: the keys of a {_SPECS[name]}'s `spec`"
        if name in _OUR_TYPES:
            return f"[{_words(name)}](#types)"
        shapes[name] = None
        return f"Kubernetes [{name}](#types)"
    if "enum" in prop:
        return " \\| ".join(f"`{_yaml(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{_yaml(prop['const'])}`"
    kind = prop.get("type")
    if kind == "array":
        items = _type(prop["items"], defs, shapes)
        return f"list of {items}" + (", no repeats" if prop.get("uniqueItems") else "")
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        keys = _type(prop.get("propertyNames", {"type": "string"}), defs, shapes)
        return f"mapping: {keys} \u2192 {_type(prop['additionalProperties'], defs, shapes)}"
    if kind in ("integer", "number"):
        low, high = prop.get("minimum"), prop.get("maximum")
        bounds = f" from {low} to {high}" if high is not None else ""
        return str(kind) + (bounds or (f", at least {low}" if low is not None else ""))
    if kind == "string" and prop.get("minLength"):
        return "string (not empty)"
    return str(kind or "any")


def _words(ref: str) -> str:
    """``dnsSubdomain`` -> ``DNS subdomain``."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", ref).lower().replace("dns", "DNS")


def _yaml(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return json.dumps(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
