"""The pod templates of an operator's object (``platform.operators[].templates``).

A RayJob holds a head, worker and submitter template, a JobSet one per replicated job, a
Kubeflow job one per replica type: each is located here as a ``Target`` (the same view
of a pod template the engine has of a Job's), with the keys to write it back. Read
defensively: a user's object, before any schema; what is not a template is skipped (the
Pods made from it are judged anyway).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from webhook.engine import scope
from webhook.engine.podspec import Target
from webhook.engine.rules.ownership import group_kind
from webhook.engine.types import JSON
from webhook.policy.model import OperatorTemplates, Policy

Keys = tuple[str | int, ...]


def declared(obj: Any, root: Policy, namespace: str) -> OperatorTemplates | None:
    """Where ``obj``'s kind holds pod templates, as the first platform looking at its
    namespace declares it; None for any other kind."""
    kind = group_kind(obj)
    if kind is None or kind == "Pod":
        return None
    for policy in scope.platforms(root, namespace):
        entry = policy.platform.templates.get(kind)
        if entry is not None:
            return entry
    return None


def located(obj: JSON, entry: OperatorTemplates) -> list[tuple[Keys, Target]]:
    """Each pod template of ``obj`` at ``entry``'s paths: (keys to it, its Target)."""
    kind = obj.get("kind")
    found: list[tuple[Keys, Target]] = []
    for steps in entry.steps:
        for keys, template in _walk(obj, steps, ()):
            metadata = template.get("metadata")
            metadata = metadata if isinstance(metadata, dict) else {}
            spec = template.get("spec")
            if not isinstance(spec, dict) or not _labels_ok(metadata):
                continue
            path = _dotted(keys)
            found.append((keys, Target(str(kind), metadata, spec, f"{path}.spec", ())))
    return found


def with_spec(obj: JSON, keys: Keys, spec: JSON) -> JSON:
    """A copy of ``obj`` whose template at ``keys`` has ``spec`` (each level copied)."""
    out = dict(obj)
    node: Any = out
    for key in keys:
        child = node[key]
        node[key] = list(child) if isinstance(child, list) else dict(child)
        node = node[key]
    node["spec"] = spec
    return out


def _walk(node: Any, steps: tuple[str, ...], keys: Keys) -> Iterator[tuple[Keys, JSON]]:
    if not steps:
        if isinstance(node, dict):
            yield keys, node
        return
    head, rest = steps[0], steps[1:]
    if head == "*":
        if isinstance(node, list):
            for i, item in enumerate(node):
                yield from _walk(item, rest, (*keys, i))
        elif isinstance(node, dict):
            for key, item in node.items():
                yield from _walk(item, rest, (*keys, key))
    elif isinstance(node, dict) and head in node:
        yield from _walk(node[head], rest, (*keys, head))


def _labels_ok(metadata: JSON) -> bool:
    return all(
        value is None
        or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))
        for value in (metadata.get("labels"), metadata.get("annotations"))
    )


def _dotted(keys: Keys) -> str:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out
