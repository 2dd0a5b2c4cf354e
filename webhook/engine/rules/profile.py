"""Step 1 and rule ``profile.unknown``: the profile the run names wins over the user's values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.engine.context import cluster_lacks
from webhook.engine.pod import (
    Pod,
    copy_value,
    main_container,
    resources_of,
    same_quantity,
    warning,
)
from webhook.engine.rule_ids import PROFILE_APPLIED, PROFILE_UNKNOWN
from webhook.engine.types import JSON, Change, Violation

# Set by the apiserver's Priority plugin from priorityClassName; it refuses a Pod whose
# values disagree with the class, and re-runs after a webhook changed the object.
PRIORITY_COMPUTED = ("priority", "preemptionPolicy")


def forget_computed_priority(spec: JSON) -> None:
    """After changing the class: let the Priority plugin compute these again."""
    for key in PRIORITY_COMPUTED:
        spec.pop(key, None)


def note_profile_fallback(pod: Pod) -> Change | None:
    """An unknown profile name fell back to the default (``unknown: Default``)."""
    if not pod.profile_fallback or pod.profile is None:
        return None
    return Change(
        PROFILE_UNKNOWN,
        warning(f"unknown profile {pod.profile_asked!r}, using {pod.profile.name!r}"),
    )


def apply_profile(pod: Pod) -> Change | None:
    profile = pod.profile
    if profile is None:
        return None
    changed: list[str] = []
    spec = pod.spec
    main = main_container(pod)
    for part, values in (("requests", profile.requests), ("limits", profile.limits)):
        if not values:
            continue
        current = resources_of(main, part)
        for resource, value in values.items():
            if not same_quantity(current.get(resource), value):
                current[resource] = value
                changed.append(f"{pod.short(resource)} {part[:-1]} {value}")
    if profile.node_selector:
        selector = spec.get("nodeSelector")
        if selector is None:
            selector = spec["nodeSelector"] = {}
        for key, value in profile.node_selector.items():
            if selector.get(key) != value:
                selector[key] = value
                changed.append(f"nodeSelector {key}")
    if profile.env:
        env = main.get("env")
        if env is None:
            env = main["env"] = []
        for var in profile.env:
            idx = next((i for i, e in enumerate(env) if e["name"] == var["name"]), None)
            if idx is None:
                env.append(dict(var))
                changed.append(f"env {var['name']}")
            elif env[idx] != var:
                env[idx] = dict(var)
                changed.append(f"env {var['name']}")
    if profile.tolerations and merge_tolerations(spec, profile.tolerations):
        changed.append("tolerations")
    overrides: tuple[tuple[str, Any], ...] = (
        ("affinity", profile.affinity),
        ("priorityClassName", profile.priority_class_name),
        ("runtimeClassName", profile.runtime_class_name),
    )
    lacking: list[str] = []
    for key, value in overrides:
        kind = _CLUSTER_KINDS.get(key)
        if value is not None and kind and cluster_lacks(pod.context, kind, value):
            lacking.append(f"{kind} {value}")  # the apiserver would refuse the run
            continue
        if value is not None and spec.get(key) != value:
            spec[key] = copy_value(value)
            if key == "priorityClassName":
                forget_computed_priority(spec)
            changed.append(key)
    # first, so the warning's 120 characters never hide it
    changed[:0] = [f"not set: the cluster has no {what}" for what in lacking]
    if not changed:
        return None
    return Change(PROFILE_APPLIED, warning(f"profile {profile.name} applied", changed))


_CLUSTER_KINDS = {"priorityClassName": "PriorityClass", "runtimeClassName": "RuntimeClass"}


def merge_tolerations(spec: JSON, wanted: Iterable[Any]) -> bool:
    """Add each wanted toleration, replacing user tolerations with the same key and effect."""
    tolerations: list[JSON] = spec.get("tolerations") or []
    before = list(tolerations)
    for t in wanted:
        key, effect = t.get("key"), t.get("effect")
        same = [u for u in tolerations if u.get("key") == key and u.get("effect") == effect]
        if same == [t]:
            continue
        tolerations = [u for u in tolerations if u.get("key") != key or u.get("effect") != effect]
        tolerations.append(dict(t))
    if tolerations != before:
        spec["tolerations"] = tolerations
        return True
    return False


def check_profile(pod: Pod) -> list[Violation]:
    cfg = pod.policy.profiles_config
    name = pod.profile_asked
    if name is None or name in pod.policy.profiles or cfg.unknown == "Default":
        return []
    known = ", ".join(sorted(pod.policy.profiles)) or "none"
    return [
        Violation(
            PROFILE_UNKNOWN,
            f"{pod.meta_path}.labels[{cfg.label}]",
            f"profile {name!r} does not exist (known: {known})",
        )
    ]
