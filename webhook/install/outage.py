"""What holds while runguard is unreachable, read from the admission objects a cluster has
(``runguard audit --outage``): whether the webhooks judging runs fail closed (no run
starts) or open (the available mode: runs start unmutated), whether the floor is there and
is what the policy renders, and, per RunPolicy, the rules the floor carries and those only
runguard judges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.install.floor import FLOOR_PREFIX, floor_policies, floor_rules
from webhook.install.names import CONFIGURATION_NAME, DEFAULT_NAMESPACE
from webhook.policy.model import Policy, RunPolicy

# What runguard alone does to a run, lost while it is down in the available mode.
GIVEN_UP = (
    "profiles applied (resources, node selectors, tolerations, priority, queue labels)",
    "defaults and hardening filled (requests, memory limits, runAsNonRoot, seccomp, "
    "dropped capabilities, no privilege escalation)",
    "root stripped and foreign secrets, claims and configMaps removed (refused only where "
    "the floor refuses them)",
    "ownership: the platform's objects, through controllers and operators",
    "runguard's records on runs (runguard.io/requested-by, the policy label) and receipts",
)
_WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass
class Outage:
    """The answer: ``lines`` to print, and ``problems`` (the available mode without a
    current floor: a run may then start below it)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def carried(p: RunPolicy) -> list[str]:
    """The rules of the RunPolicy ``p`` the floor carries."""
    return sorted({rule for rule, _, _ in floor_rules(p)})


def only_runguard(p: RunPolicy) -> list[str]:
    """The engine's rules the floor does not carry for ``p``."""
    from webhook.engine.registry import RULES

    return sorted(set(RULES) - set(carried(p)))


def _runguard_namespace(objects: Iterable[Mapping[str, Any]]) -> str:
    for obj in objects:
        for hook in obj.get("webhooks") or ():
            service = (hook.get("clientConfig") or {}).get("service") or {}
            if service.get("namespace"):
                return str(service["namespace"])
    return DEFAULT_NAMESPACE


def _floor_state(policy: Policy, objects: list[Mapping[str, Any]], namespace: str) -> str | None:
    """None when the cluster's floor is the policy's; else what differs."""
    found = {
        (o.get("kind"), (o.get("metadata") or {}).get("name")): o.get("spec")
        for o in objects
        if str((o.get("metadata") or {}).get("name", "")).startswith(FLOOR_PREFIX)
    }
    wanted = floor_policies(policy, namespace=namespace)
    missing = [
        o["metadata"]["name"] for o in wanted if (o["kind"], o["metadata"]["name"]) not in found
    ]
    if missing:
        return f"missing: {', '.join(sorted(set(missing)))}"
    stale = [
        o["metadata"]["name"]
        for o in wanted
        if not _contains(found[(o["kind"], o["metadata"]["name"])], o["spec"])
    ]
    if stale:
        return f"not what the policy renders: {', '.join(sorted(set(stale)))}"
    return None


def _contains(served: Any, wanted: Any) -> bool:
    """``served`` says everything ``wanted`` says (the apiserver adds defaults)."""
    if isinstance(wanted, dict):
        return isinstance(served, dict) and all(
            _contains(served.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(served, list)
            and len(served) == len(wanted)
            and all(_contains(s, w) for s, w in zip(served, wanted, strict=True))
        )
    return bool(served == wanted)


def outage(policy: Policy, objects: Iterable[Mapping[str, Any]]) -> Outage:
    """What holds while runguard is down, from the cluster's webhook configurations,
    ValidatingAdmissionPolicies and bindings (``objects``)."""
    objects = list(objects)
    ours = [
        o
        for o in objects
        if o.get("kind") in _WEBHOOK_KINDS
        and (o.get("metadata") or {}).get("name") == CONFIGURATION_NAME
    ]
    out = Outage()
    if not ours:
        out.lines.append(
            "runguard's webhook configurations are not in the cluster: runguard judges nothing"
        )
    hooks = [h for o in ours for h in o.get("webhooks") or ()]
    opened = sorted(h.get("name", "") for h in hooks if h.get("failurePolicy") == "Ignore")
    floor = _floor_state(policy, objects, _runguard_namespace(ours))
    if opened:
        out.lines.append(
            f"mode: available: {len(opened)} webhooks judging runs fail open ({', '.join(opened)})"
        )
        out.lines.append("while runguard is down, runs start unmutated; given up until it is back:")
        out.lines += [f"  - {item}" for item in GIVEN_UP]
    elif ours:
        out.lines.append("mode: fail-closed: while runguard is down, no run starts")
    out.lines.append("floor: " + ("the policy's" if floor is None else floor))
    if opened and floor is not None:
        out.problems.append(f"the available mode without the policy's floor ({floor})")
    for p in policy.run_policies:
        out.lines.append(f"RunPolicy {p.name}:")
        out.lines.append(f"  the floor carries: {', '.join(carried(p))}")
        out.lines.append(f"  only runguard judges: {', '.join(only_runguard(p))}")
    out.lines += [f"problem: {problem}" for problem in out.problems]
    return out
