"""Reading Kubernetes objects from YAML or JSON files (multi-document, ``List`` kinds, stdin).

Every file is bounded first (``webhook.inputs.limits``: bytes, nesting, aliases, numbers),
so a hostile file is an ``InputError`` saying ``file:line: message``, never a crash, a
hang or an output many times its size. Objects are read as kubectl reads them: aliases
expanded into independent copies, timestamps and binary kept as their text (JSON has
neither), lone UTF-16 surrogates replaced.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from webhook.inputs.limits import (
    OBJECT_FILES,
    LimitError,
    Limits,
    check_size,
    check_yaml,
    float_problem,
    int_problem,
    int_text_problem,
    load_json,
    read_bounded,
    read_path,
    without_lone_surrogates,
)

try:  # libyaml when present: several times faster on large inputs
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _Loader = yaml.SafeLoader


class InputError(ValueError):
    """A file that holds no readable Kubernetes objects; the message says where."""


class _ObjectLoader(_Loader):  # type: ignore[misc]
    """The safe loader with numbers range-checked, and timestamps and binary as text."""


def _construct_int(loader: Any, node: yaml.ScalarNode) -> int:
    problem = int_text_problem(node.value.replace("_", ""))
    value: int = 0 if problem else yaml.SafeLoader.construct_yaml_int(loader, node)
    problem = problem or int_problem(value)
    if problem:
        raise LimitError(node.start_mark.line + 1, problem)
    return value


def _construct_float(loader: Any, node: yaml.ScalarNode) -> float:
    value: float = yaml.SafeLoader.construct_yaml_float(loader, node)
    problem = float_problem(value)
    if problem:
        raise LimitError(node.start_mark.line + 1, problem)
    return value


def _construct_text(loader: Any, node: yaml.ScalarNode) -> str:
    return str(node.value)


_ObjectLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_ObjectLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_ObjectLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_text)
_ObjectLoader.add_constructor("tag:yaml.org,2002:binary", _construct_text)


def read_text(source: str, limits: Limits = OBJECT_FILES) -> tuple[str, str]:
    """(display name, text) of a path, or of stdin for ``-``, read no further than
    ``limits`` allow."""
    name = "<stdin>" if source == "-" else source
    try:
        if source != "-":
            return name, read_path(source, limits)
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            return name, read_bounded(stream, limits)
        text = sys.stdin.read(limits.max_bytes + 1)  # a text stream (tests)
        check_size(text, limits)
        return name, text
    except LimitError as exc:
        raise InputError(exc.where(name)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc}") from exc


def load_documents(text: str, name: str = "<input>", limits: Limits = OBJECT_FILES) -> list[Any]:
    """The documents of ``text``, YAML (JSON is YAML), empty ones left out; raises
    InputError saying ``name:line: what``."""
    try:
        check_size(text, limits)
        if text.lstrip().startswith(("{", "[")):
            docs: list[Any] = [load_json(text, limits)]
            shared = False
        else:
            shared = check_yaml(text, limits) > 0
            docs = [d for d in yaml.load_all(text, Loader=_ObjectLoader) if d is not None]
    except LimitError as exc:
        raise InputError(exc.where(name)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{name}{line}: invalid YAML: {problem}") from exc
    if shared or "\\u" in text or "\\U" in text:
        docs = [_plain(d) for d in docs]
    return docs


def _plain(value: Any) -> Any:
    """A copy sharing nothing (an alias is a copy, as kubectl sends it), its strings
    without lone surrogates. Recursion is bounded: the depth was checked."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return without_lone_surrogates(value)
    return value


def parse_objects(text: str, name: str = "<input>", limits: Limits = OBJECT_FILES) -> list[Any]:
    """Every object in ``text``: YAML documents (JSON is YAML), flattening lists (``kind:
    List``, ``PodList``...) item by item, as kubectl does."""
    objects: list[Any] = []
    for doc in load_documents(text, name, limits):
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


def read_objects(source: str, limits: Limits = OBJECT_FILES) -> list[Any]:
    name, text = read_text(source, limits)
    return parse_objects(text, name, limits)
