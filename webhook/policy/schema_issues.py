"""jsonschema's errors in runguard's words, at the key and line they are about.

``schema_issues`` validates one document against the schema generated from the model
(``schema.validator()``) and turns each error into a ``PolicyIssue``: an unknown key
with the key it was probably meant to be, a wrong type with a hint to quote, an enum
with its values, a Kubernetes format with what is wrong in it (``formats.py``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from jsonschema import ValidationError

from webhook.policy.errors import PolicyIssue
from webhook.policy.formats import FORMAT_PROBLEMS
from webhook.policy.schema import validator
from webhook.policy.source import Path_, SourceDocument

__all__ = ["describe", "schema_issues", "show_list"]

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}
# Keywords that only approximate a runguard format for editors: the format says it better.
_SHADOWED_BY_FORMAT = {"pattern", "maxLength", "minLength", "minimum"}


def describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def show_list(values: Any) -> str:
    return ", ".join("null" if v is None else str(v) for v in values)


def schema_issues(doc: SourceDocument) -> list[PolicyIssue]:
    """Every schema error of ``doc``, each once."""
    issues: list[PolicyIssue] = []
    for error in validator().iter_errors(doc.data):
        issues.extend(_translate(error, doc))
    return list(dict.fromkeys(issues))  # one missing key can be reported by several branches


def _translate(error: ValidationError, doc: SourceDocument) -> list[PolicyIssue]:
    path: Path_ = tuple(error.absolute_path)
    keyword = str(error.validator)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if keyword in _SHADOWED_BY_FORMAT and schema.get("format") in FORMAT_PROBLEMS:
        return []
    if "propertyNames" in error.absolute_schema_path:
        path = (*path, str(error.instance))  # the error is about the key itself
    keys = _KEY_ISSUES.get(keyword)
    if keys is not None and isinstance(error.instance, dict):
        return [doc.issue((*path, key), message) for key, message in keys(error, schema)]
    if keyword == "anyOf" and error.context:
        chosen = _branch_of(error)
        if chosen:  # the errors of the alternative the value's type says it meant
            return [issue for sub in chosen for issue in _translate(sub, doc)]
    if keyword == "type":
        raw = doc.raw.get(path)
        return [doc.issue(path, _type_message(error.validator_value, error.instance, raw))]
    words = _MESSAGES.get(keyword)
    return [doc.issue(path, (words(error) if words else None) or error.message)]


def _unknown_keys(error: ValidationError, schema: dict[str, Any]) -> list[tuple[str, str]]:
    known = set(schema.get("properties", {}))
    patterns = list(schema.get("patternProperties", {}))
    return [
        (key, _unknown_key(key, known, bool(patterns)))
        for key in error.instance
        if key not in known and not any(re.search(p, key) for p in patterns)
    ]


def _missing_keys(error: ValidationError, schema: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (key, "required key is missing")
        for key in error.validator_value
        if key not in error.instance
    ]


# An error about a mapping's keys: each key it names, with what is wrong with it.
_KEY_ISSUES: dict[str, Callable[[ValidationError, dict[str, Any]], list[tuple[str, str]]]] = {
    "additionalProperties": _unknown_keys,
    "required": _missing_keys,
}


def _const(error: ValidationError) -> str:
    if error.validator_value == "":
        return 'must be empty with operator "Exists"'
    return f"must be {error.validator_value}, not {describe(error.instance)}"


def _format(error: ValidationError) -> str | None:
    problem = FORMAT_PROBLEMS.get(str(error.validator_value))
    return problem(error.instance) if problem else None


def _when(limit: Any, message: str) -> Callable[[ValidationError], str | None]:
    """``message`` when the keyword's value is ``limit``; jsonschema's own otherwise."""
    return lambda error: message if error.validator_value == limit else None


# A keyword's error in runguard's words (None: jsonschema's own message).
_MESSAGES: dict[str, Callable[[ValidationError], str | None]] = {
    "enum": lambda e: f"{describe(e.instance)} is not one of {show_list(e.validator_value)}",
    "const": _const,
    "format": _format,
    "minItems": _when(1, "must not be empty"),
    "minProperties": _when(1, "must not be empty"),
    "maxItems": _when(0, "must be empty with this operator"),
    "maxProperties": _when(1, "set exactly one of its keys"),
    "uniqueItems": lambda e: "has duplicate items",
    "minimum": lambda e: f"{describe(e.instance)} is below the minimum {e.validator_value}",
    "maximum": lambda e: f"{describe(e.instance)} is above the maximum {e.validator_value}",
    "minLength": _when(1, "must not be empty"),
}


def _branch_of(error: ValidationError) -> list[ValidationError]:
    """The errors of the one ``anyOf`` alternative of the value's own type (a range, a
    mapping, rather than a quantity), none when it is not one alone."""
    by_branch: dict[Any, list[ValidationError]] = {}
    for sub in error.context or ():
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    typed = [
        subs
        for subs in by_branch.values()
        if not any(e.validator == "type" and not e.relative_path for e in subs)
    ]
    return typed[0] if len(typed) == 1 else []


def _unknown_key(key: str, known: set[str], resource_list: bool) -> str:
    message = f'unknown key "{key}"'
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    aliases = {"mem": "memory", "disk": "ephemeral-storage", "gpus": "gpu"}
    hint = aliases.get(key) if resource_list else None
    if hint or close:
        message += f' (did you mean "{hint or close[0]}"?)'
    elif resource_list:
        message += " (cpu, memory, gpu, ephemeral-storage or an extended resource domain/name)"
    elif known:
        message += f" (expected one of {', '.join(sorted(known))})"
    return message


def _type_message(expected: Any, instance: Any, raw: str | None) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    wanted = " or ".join(_TYPE_NAMES.get(n, n) for n in names)
    message = f"expected {wanted}, got {describe(instance)}"
    if names == ["string"] and raw is not None and not isinstance(instance, dict | list):
        message += f'; quote it ("{raw}") to mean text'
    return message
