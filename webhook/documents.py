"""Reading Kubernetes objects from YAML or JSON files (multi-document, ``List`` kinds, stdin)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

try:  # libyaml when present: several times faster on large inputs
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _Loader = yaml.SafeLoader


class InputError(ValueError):
    """A file that holds no readable Kubernetes objects; the message says where."""


def read_text(source: str) -> tuple[str, str]:
    """(display name, text) of a path, or of stdin for ``-``."""
    if source == "-":
        return "<stdin>", sys.stdin.read()
    try:
        return source, Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: cannot read: {exc}") from exc


def parse_objects(text: str, name: str = "<input>") -> list[Any]:
    """Every object in ``text``: YAML documents (JSON is YAML), flattening ``kind: List``."""
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            docs: list[Any] = [json.loads(text)]
        else:
            docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{name}{line}: invalid YAML: {problem}") from exc
    objects: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            objects.extend(doc)
        elif (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            objects.extend(doc["items"])
        else:
            objects.append(doc)
    return objects


def read_objects(source: str) -> list[Any]:
    name, text = read_text(source)
    return parse_objects(text, name)
