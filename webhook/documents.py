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
    """Every object in ``text``: YAML documents (JSON is YAML), flattening lists (``kind:
    List``, ``PodList``...) item by item, as kubectl does."""
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
        elif is_list(doc):
            objects.extend(list_items(doc))
        else:
            objects.append(doc)
    return objects


def is_list(doc: Any) -> bool:
    """``kind: List`` or a typed list (``PodList``, ``JobList``...) with ``items``: kubectl
    creates each item, so runguard judges each item."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        return False
    kind = doc.get("kind")
    return isinstance(kind, str) and kind.endswith("List")


def list_items(doc: dict[str, Any]) -> list[Any]:
    """The items of a list; a typed list's items lacking ``kind``/``apiVersion`` (as the API
    returns them) get the list's (``PodList`` -> ``Pod``)."""
    kind: str = doc["kind"]
    if kind == "List":
        return list(doc["items"])
    defaults = {"kind": kind[: -len("List")], "apiVersion": doc.get("apiVersion")}
    return [
        {**{k: v for k, v in defaults.items() if v is not None}, **item}
        if isinstance(item, dict)
        else item
        for item in doc["items"]
    ]


def read_objects(source: str) -> list[Any]:
    name, text = read_text(source)
    return parse_objects(text, name)
