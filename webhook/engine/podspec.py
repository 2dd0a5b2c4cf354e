"""Finding the pod spec inside an object (a Pod, or the template of a pod controller)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.engine.shape import invalid
from webhook.engine.types import JSON, Violation

# kind -> keys from the object to its pod template (None: the object is the pod)
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
}


class InvalidObject(Exception):
    """The object cannot be judged; carries the ``input.invalid`` violations."""

    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(str(v) for v in violations))
        self.violations = violations


@dataclass
class Target:
    """The pod (or pod template) inside an object: its metadata and spec, and where they are."""

    kind: str
    metadata: JSON  # the pod's (template's) metadata: labels and annotations live here
    spec: JSON
    spec_path: str  # dotted path of ``spec`` inside the object, for violation paths
    keys: tuple[str, ...]  # keys from the object to the pod template (empty for a Pod)
    claim_templates: tuple[tuple[str, JSON], ...] = ()  # a StatefulSet's, with their paths

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.metadata.get("labels") or {}
        return labels

    @property
    def annotations(self) -> dict[str, str]:
        annotations: dict[str, str] = self.metadata.get("annotations") or {}
        return annotations


def object_meta(obj: Any) -> tuple[str, str, str]:
    """kind, namespace, name of anything, tolerating garbage."""
    if not isinstance(obj, dict):
        return "", "", ""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kind, ns, name = obj.get("kind"), meta.get("namespace"), meta.get("name")
    if not name and isinstance(meta.get("generateName"), str):
        name = meta["generateName"]
    return (
        kind if isinstance(kind, str) else "",
        ns if isinstance(ns, str) else "",
        name if isinstance(name, str) else "",
    )


def locate(obj: Any) -> Target | None:
    """The pod template of ``obj``; None for kinds that carry no pod. Raises InvalidObject."""
    if not isinstance(obj, dict):
        raise InvalidObject([invalid("", f"expected an object, got {type(obj).__name__}")])
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise InvalidObject([invalid("kind", "kind is missing or not a string")])
    keys = TEMPLATE_PATHS.get(kind)
    if keys is None:
        return None
    node: Any = obj
    path: list[str] = []
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
        path.append(key)
        if not isinstance(node, dict):
            raise InvalidObject([invalid(".".join(path), f"{kind} has no {'.'.join(path)}")])
    metadata = node.get("metadata", {})
    if metadata is None:
        metadata = {}
    prefix = ".".join(path)
    meta_path = f"{prefix}.metadata" if prefix else "metadata"
    if not isinstance(metadata, dict):
        raise InvalidObject([invalid(meta_path, "metadata is not an object")])
    problems: list[Violation] = []
    for field_name in ("labels", "annotations"):
        value = metadata.get(field_name)
        if value is not None and not _is_str_map(value):
            problems.append(invalid(f"{meta_path}.{field_name}", "must map strings to strings"))
    spec = node.get("spec")
    spec_path = f"{prefix}.spec" if prefix else "spec"
    if not isinstance(spec, dict):
        problems.append(invalid(spec_path, f"{kind} has no pod spec"))
    templates = _claim_templates(obj) if kind == "StatefulSet" else ()
    if templates is None:
        problems.append(invalid("spec.volumeClaimTemplates", "must be a list of objects"))
    if problems:
        raise InvalidObject(problems)
    return Target(kind, metadata, spec, spec_path, keys, templates or ())


def _claim_templates(obj: JSON) -> tuple[tuple[str, JSON], ...] | None:
    """A StatefulSet's ``volumeClaimTemplates`` with their paths; None when malformed."""
    templates = obj["spec"].get("volumeClaimTemplates")
    if templates is None:
        return ()
    if not isinstance(templates, list) or not all(isinstance(t, dict) for t in templates):
        return None
    return tuple((f"spec.volumeClaimTemplates[{i}]", t) for i, t in enumerate(templates))


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )
