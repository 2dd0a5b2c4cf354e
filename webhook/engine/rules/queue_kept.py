"""What a queue controller (Kueue, ``platform.queues``) may change in an object of the
platform's: ``queue_kept`` compares the two versions of the object, each seen without
it (``_view``). ``webhook.engine.rules.queue`` says what a queue does, and judges the
same changes by anyone else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.policy.model import QueueController

__all__ = ["owned", "queue_kept"]

# Keys of an object's spec that start, stop and size a run: the queue's to change.
_RUN_KEYS = frozenset({"suspend", "parallelism"})
# What an operator's default pod template holds (KubeRay's submitter: its name, the head's
# image, its resources, restartPolicy), besides the queue's placement.
_BARE_SPEC = frozenset({"containers", "restartPolicy", "nodeSelector", "tolerations",
                        "schedulingGates"})  # fmt: skip
_BARE_CONTAINER = frozenset({"name", "image", "resources"})


def queue_kept(queue: QueueController, old: Any, new: Any) -> bool:
    """Whether ``new`` (an object's spec, or a pod template's spec) differs from ``old``
    only by what ``queue`` may change: ``suspend`` and ``parallelism`` at the top, and in
    every pod template the ``nodeSelector`` keys it adds or removes (a key both have keeps
    its value: Kueue's merge never overwrites one), the tolerations, and its own labels,
    annotations and scheduling gates; and a bare pod template it adds where there was none
    (``_bare``: the operator's default, which the operator would run anyway). An empty
    value (``{}``, ``[]``) where the other version has no key is no change: Kueue writes
    an operator's object as its Go type renders it (a RayJob's worker groups with
    ``scaleStrategy: {}``), which the stored object need not."""
    prefixes = queue.prefixes
    seen = _images(old), _images(new)
    return bool(
        _view(old, new, prefixes, seen[1], top=True) == _view(new, old, prefixes, seen[0], top=True)
    )


def _view(
    node: Any, other: Any, prefixes: tuple[str, ...], images: set[str], top: bool = False
) -> Any:
    """``node`` without what the queue may change, ``other`` being the same place in the
    other version of the object, whose containers run ``images``."""
    if isinstance(node, list):
        items = other if isinstance(other, list) else []
        return [
            _view(v, items[i] if i < len(items) else None, prefixes, images)
            for i, v in enumerate(node)
        ]
    if not isinstance(node, dict):
        return node
    place = _Place(other if isinstance(other, dict) else {}, "containers" in node, top)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if _queues(key, value, place, prefixes, images):
            continue
        value = _value_view(key, value, place, prefixes, images)
        if value in ({}, []) and key in _EMPTY_LEFT_OUT:
            continue
        out[key] = value
    return out


@dataclass(frozen=True)
class _Place:
    """Where ``_view`` is in the object: the other version's node there, whether it is a
    pod spec, whether the object's top."""

    theirs: dict[str, Any]
    pod_spec: bool
    top: bool


# Fields the queue writes into, left out of the view where nothing else is in them.
_EMPTY_LEFT_OUT = frozenset({"nodeSelector", "schedulingGates", "labels", "annotations"})


def _queues(
    key: str, value: Any, place: _Place, prefixes: tuple[str, ...], images: set[str]
) -> bool:
    """The key is the queue's alone here: what starts and sizes the run, the pod's
    tolerations, or a key only this version has whose value is empty (the Go type's
    rendering of a field left out) or an operator's bare template."""
    if place.top and key in _RUN_KEYS:
        return True
    if place.pod_spec and key == "tolerations":
        return True
    return key not in place.theirs and (value in ({}, []) or _bare(value, prefixes, images))


def _value_view(
    key: str, value: Any, place: _Place, prefixes: tuple[str, ...], images: set[str]
) -> Any:
    """``value`` without what the queue may change in it: its placement of the pods, the
    object's labels and annotations it owns, Kubeflow's suspend."""
    if place.top and key == "runPolicy" and isinstance(value, dict):  # Kubeflow's suspend
        value = {k: v for k, v in value.items() if k != "suspend"}
    if place.pod_spec and key in _PLACEMENT and isinstance(value, _PLACEMENT[key]):
        return _placement_view(key, value, place.theirs.get(key), prefixes)
    if key in ("labels", "annotations") and not place.pod_spec and isinstance(value, dict):
        return {k: v for k, v in value.items() if not owned(k, prefixes)}
    return _view(value, place.theirs.get(key), prefixes, images)


# What the queue writes into a pod spec to place its pods, by the type it writes.
_PLACEMENT: dict[str, type] = {"nodeSelector": dict, "schedulingGates": list}


def _placement_view(key: str, value: Any, kept: Any, prefixes: tuple[str, ...]) -> Any:
    """A pod spec's nodeSelector with the keys both versions have (Kueue's merge never
    overwrites one), or its scheduling gates but the queue's."""
    if key == "nodeSelector":
        return {k: v for k, v in value.items() if isinstance(kept, dict) and k in kept}
    return [g for g in value if not (isinstance(g, dict) and owned(g.get("name"), prefixes))]


def _bare(template: Any, prefixes: tuple[str, ...], images: set[str]) -> bool:
    """A pod template that runs nothing the object does not run already: containers of
    its ``images`` with a name and resources only, ``restartPolicy``, the queue's
    placement and its own labels and annotations (no command, env, volumes, account or
    security context). An operator makes such a template by default (KubeRay's submitter:
    the head's image), and the Pods made from it are judged when they are created."""
    if not isinstance(template, dict) or not set(template) <= {"metadata", "spec"}:
        return False
    metadata, spec = template.get("metadata", {}), template.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return False
    containers = spec.get("containers")
    return (
        set(metadata) <= {"labels", "annotations"}
        and all(
            isinstance(keys, dict) and all(owned(k, prefixes) for k in keys)
            for keys in metadata.values()
        )
        and set(spec) <= _BARE_SPEC
        and isinstance(containers, list)
        and bool(containers)
        and all(
            isinstance(c, dict) and set(c) <= _BARE_CONTAINER and c.get("image") in images
            for c in containers
        )
        and all(
            isinstance(g, dict) and owned(g.get("name"), prefixes)
            for g in spec.get("schedulingGates") or ()
        )
    )


def _images(node: Any) -> set[str]:
    """Every container image in the pod specs under ``node``."""
    if isinstance(node, list):
        return {image for item in node for image in _images(item)}
    if not isinstance(node, dict):
        return set()
    found = {image for item in node.values() for image in _images(item)}
    if "containers" in node:
        for name in ("initContainers", "containers"):
            for c in node.get(name) or ():
                if isinstance(c, dict) and isinstance(c.get("image"), str):
                    found.add(c["image"])
    return found


def owned(key: Any, prefixes: tuple[str, ...]) -> bool:
    """``key`` is one of ``prefixes`` or under one ending in '/'."""
    if not isinstance(key, str):
        return False
    return any(key == p or (p.endswith("/") and key.startswith(p)) for p in prefixes)
