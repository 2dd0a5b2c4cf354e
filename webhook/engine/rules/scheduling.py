"""Step 8 and rules ``scheduling.*``: priority classes and MLRun's preemption modes."""

from __future__ import annotations

from typing import Any

from webhook.engine.pod import Pod, copy_value, warning
from webhook.engine.rules.profile import forget_computed_priority
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import PREEMPTION_MODES


def default_priority_class(pod: Pod) -> Change | None:
    cfg = pod.policy.scheduling
    current = pod.spec.get("priorityClassName")
    allowed = cfg.allowed_priority_classes
    if current is not None and (allowed is None or current in allowed):
        return None
    if cfg.default_priority_class is None:
        return None  # nothing to put instead: validation denies a disallowed class
    pod.spec["priorityClassName"] = cfg.default_priority_class
    forget_computed_priority(pod.spec)
    if current is None:
        return Change(
            "scheduling.priority-class",
            warning(f"priority class defaulted to {cfg.default_priority_class}"),
        )
    return Change(
        "scheduling.priority-class",
        warning(f"priority class {current} not allowed, set to {cfg.default_priority_class}"),
    )


def preemption_mode(pod: Pod) -> str | None:
    cfg = pod.policy.scheduling.preemption
    if cfg is None:
        return None
    return pod.annotations.get(cfg.annotation) or pod.labels.get(cfg.annotation) or cfg.default


def apply_preemption_mode(pod: Pod) -> Change | None:
    """MLRun's modes: prevent keeps runs off spot nodes, constrain keeps them on, allow permits."""
    cfg = pod.policy.scheduling.preemption
    mode = preemption_mode(pod)
    if cfg is None or mode not in ("allow", "constrain", "prevent"):
        return None  # "none", no mode, or an unknown one (denied by validation)
    before = copy_value({k: pod.spec.get(k) for k in ("tolerations", "affinity", "nodeSelector")})
    spec = pod.spec
    spot_tolerations = [dict(t) for t in cfg.tolerations]
    tolerations = [t for t in spec.get("tolerations") or () if t not in spot_tolerations]
    if mode in ("allow", "constrain"):
        tolerations.extend(spot_tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    else:
        spec.pop("tolerations", None)
    if mode == "prevent" and spec.get("nodeSelector"):
        for key, value in cfg.node_selector.items():
            if spec["nodeSelector"].get(key) == value:
                del spec["nodeSelector"][key]
        if not spec["nodeSelector"]:
            del spec["nodeSelector"]
    operator = {"prevent": "NotIn", "constrain": "In", "allow": None}[mode]
    _set_spot_affinity(spec, cfg.node_selector, operator)
    after = {k: spec.get(k) for k in ("tolerations", "affinity", "nodeSelector")}
    if after == before:
        return None
    return Change("scheduling.preemption-mode", warning(f"preemption mode {mode} applied"))


def _set_spot_affinity(spec: JSON, spot: dict[str, str] | Any, operator: str | None) -> None:
    """Make every required node selector term carry exactly the spot expression of the mode."""
    keys = set(spot)
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[JSON] = list(required.get("nodeSelectorTerms") or ())
    wanted = (
        [{"key": k, "operator": operator, "values": [v]} for k, v in spot.items()]
        if operator
        else []
    )
    new_terms = []
    for term in terms or ([{}] if wanted else []):
        expressions = [e for e in term.get("matchExpressions") or () if e.get("key") not in keys]
        expressions.extend(wanted)
        new_term = {k: v for k, v in term.items() if k != "matchExpressions"}
        if expressions:
            new_term["matchExpressions"] = expressions
        if new_term:
            new_terms.append(new_term)
    if new_terms == terms:
        return
    if new_terms:
        spec["affinity"] = affinity
        affinity["nodeAffinity"] = node_affinity
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            **required,
            "nodeSelectorTerms": new_terms,
        }
        return
    node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if not node_affinity:
        affinity.pop("nodeAffinity", None)
    if not affinity:
        spec.pop("affinity", None)


def check_scheduling(pod: Pod) -> list[Violation]:
    out: list[Violation] = []
    allowed = pod.policy.scheduling.allowed_priority_classes
    current = pod.spec.get("priorityClassName")
    if allowed is not None and current is not None and current not in allowed:
        out.append(
            Violation(
                "scheduling.priority-class",
                f"{pod.spec_path}.priorityClassName",
                f"priority class {current!r} is not allowed ({', '.join(sorted(allowed))})",
            )
        )
    preemption = pod.policy.scheduling.preemption
    mode = preemption_mode(pod)
    if preemption is not None and mode is not None and mode not in PREEMPTION_MODES:
        out.append(
            Violation(
                "scheduling.preemption-mode",
                f"{pod.meta_path}.annotations[{preemption.annotation}]",
                f"preemption mode {mode!r} is not one of {', '.join(PREEMPTION_MODES)}",
            )
        )
    return out
