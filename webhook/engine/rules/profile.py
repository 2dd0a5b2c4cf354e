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
    warning,
)
from webhook.engine.rule_ids import PROFILE_APPLIED, PROFILE_UNKNOWN
from webhook.engine.types import JSON, Change, Violation
from webhook.quantity import parse

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
    gpu = pod.policy.resources.gpu_resource_name  # warnings say gpu (Pod.short)
    for part, singular, values in profile.resource_values:
        current = resources_of(main, part)
        for resource, value, amount in values:
            asked = current.get(resource)
            if asked is None or parse(asked) != amount:
                current[resource] = value
                changed.append(f"{'gpu' if resource == gpu else resource} {singular} {value}")
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
            name = var["name"]
            for i, current_var in enumerate(env):
                if current_var["name"] == name:  # the first of that name
                    if current_var != var:
                        env[i] = dict(var)
                        changed.append(f"env {name}")
                    break
            else:
                env.append(dict(var))
                changed.append(f"env {name}")
    if profile.tolerations and merge_tolerations(spec, profile.tolerations):
        changed.append("tolerations")
    lacking: list[str] = []
    for key, value in profile.overrides:
        kind = _CLUSTER_KINDS.get(key)
        if kind and cluster_lacks(pod.context, kind, value):
            lacking.append(f"{kind} {value}")  # the apiserver would refuse the run
            continue
        if spec.get(key) != value:
            spec[key] = copy_value(value)
            if key == "priorityClassName":
                forget_computed_priority(spec)
            changed.append(key)
    if lacking:  # first, so the warning's 120 characters never hide it
        changed[:0] = [f"not set: the cluster has no {what}" for what in lacking]
    if not changed:
        return None
    return Change(PROFILE_APPLIED, _applied_warning(profile.name, tuple(changed)))


_CLUSTER_KINDS = {"priorityClassName": "PriorityClass", "runtimeClassName": "RuntimeClass"}


# (profile, what it changed) -> its warning. Every item is the profile's own text (its
# values, keys, env names), never a run's, so the same few lists recur on every run of a
# profile; bounded all the same, since policies are reloaded.
_APPLIED_WARNINGS: dict[tuple[str, tuple[str, ...]], str] = {}


def _applied_warning(name: str, changed: tuple[str, ...]) -> str:
    """``warning`` of a profile's changes, fitted to 120 characters once per list."""
    text = _APPLIED_WARNINGS.get((name, changed))
    if text is None:
        text = warning(f"profile {name} applied", changed)
        if len(_APPLIED_WARNINGS) < 1024:
            _APPLIED_WARNINGS[name, changed] = text
    return text


def merge_tolerations(spec: JSON, wanted: Iterable[Any]) -> bool:
    """Add each wanted toleration, replacing user tolerations with the same key and effect."""
    before: list[JSON] = spec.get("tolerations") or []
    tolerations = before  # replaced, never changed in place: ``before`` stays as it was
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
