"""The floor: runguard's rules that need no cluster state, rendered from the policy as
ValidatingAdmissionPolicies (CEL run inside the apiserver), so they still deny while
runguard is unreachable.

One policy and one binding per RunPolicy, matching the Pods its webhook matches (the
same ``objectSelector`` and ``namespaceSelector``, ``conditions.namespace_selector``),
at CREATE. Each validation denies only what runguard denies or would have mutated into
compliance, and admits what runguard's mutation gives (``tests/install/test_floor.py`` runs
both over the case corpus and generated Pods); its message names the rule it mirrors.

What the floor carries, by rule:

- ``security.root``: a uid, gid, fsGroup or supplemental group 0, ``runAsNonRoot:
  false`` (not with ``security.onRoot: Allow``);
- ``security.privileged``: a privileged container, a Windows host process, and at level
  restricted ``allowPrivilegeEscalation: true``;
- ``security.capabilities``: a capability added outside ``allowedCapabilities`` within
  the level (and the platform's operators' own);
- ``security.host-namespace`` and ``security.host-ports``;
- ``volumes.forbidden-type``: a volume type outside ``volumes.allowedTypes`` within the
  level, a hostPath outside ``volumes.allowedHostPaths``;
- ``resources.exceeded``: a container's request or limit above a maximum, the run's total
  (containers and sidecars summed, each init container, pod-level resources) above one,
  extended resources a DeviceClass maps (``deviceclass.resource.kubernetes.io/<class>``,
  a class's own ``extendedResourceName``) added to the resource their devices count as;
- ``resources.device-request``: an extended resource
  ``deviceclass.resource.kubernetes.io/<class>`` of a class not in
  ``resources.deviceClasses``;
- ``scheduling.priority-class``: a priority class outside the allowed ones.

What it leaves to runguard (it needs runguard's mutation, the cluster, or who created
the Pod): fields a run leaves out and runguard fills (``runAsNonRoot``, seccomp, dropped
capabilities, no escalation: the namespace's Pod Security ``enforce`` label checks them
in the apiserver too), profiles, defaults, secrets and pre-existing volumes, ownership,
queues and records (a run's profile depends on its project's profiles, which shadow the
policy's by name: cluster state), the devices of claim templates (the floor cannot read
a ResourceClaimTemplate, nor the claims made from it) and so the device families, run
time, the identity checks of ``allowedHostPaths``, and Pod UPDATEs. A RunPolicy naming
``requesters`` governs only the Pods they create, directly or through a controller,
which the apiserver cannot tell: its floor denies a Pod the next RunPolicy's floor would
deny too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from webhook.engine.rules.dra import RESOURCES_DEVICE_REQUEST
from webhook.engine.rules.pod_security import (
    SECURITY_HOST_PORTS,
    SECURITY_PRIVILEGED,
    allowed_capabilities,
)
from webhook.engine.rules.resources import RESOURCES_EXCEEDED
from webhook.engine.rules.scheduling import SCHEDULING_PRIORITY_CLASS
from webhook.engine.rules.security import (
    SECURITY_CAPABILITIES,
    SECURITY_HOST_NAMESPACE,
    SECURITY_ROOT,
)
from webhook.engine.rules.volumes import VOLUMES_FORBIDDEN_TYPE, forbidden_type
from webhook.install.cel import _cel_string, _join, _namespace_outside, _render, _selector
from webhook.install.conditions import namespace_selector
from webhook.install.names import DEFAULT_NAMESPACE, LABELS, _rule
from webhook.policy.formats import HOST_PATH_PLACEHOLDER
from webhook.policy.model import Policy, RunPolicy
from webhook.policy.model.devices import IMPLICIT_EXTENDED_PREFIX
from webhook.policy.model.fields import VolumeType

FLOOR_PREFIX = "runguard-floor-"
FLOOR_LABELS = {**LABELS, "app.kubernetes.io/component": "floor"}
# Every inline volume source a Pod may have (the policy model's list).
VOLUME_TYPES = get_args(VolumeType)
# A run's total is summed as floats (CEL's quantity library has no sum of a list): a
# billionth over the maximum is let through, never a total runguard admits refused.
_ROUNDING = "1.000000001"

_C = "variables.containers"
_PSC = "object.spec.?securityContext"
_CONTAINERS = "object.spec.?containers.orValue([])"
_INIT = "object.spec.?initContainers.orValue([])"
_VARIABLES = {
    # every container, for the security rules
    "containers": f"{_CONTAINERS} + {_INIT} + object.spec.?ephemeralContainers.orValue([])",
    # every container that asks for resources
    "sized": f"{_CONTAINERS} + {_INIT}",
    # what runs together: the containers and the sidecars (init containers that keep
    # running); each other init container runs alone, before them
    "together": f"{_CONTAINERS} + {_INIT}.filter(c, c.?restartPolicy.orValue('') == 'Always')",
}
_ACTIONS = {"Deny": ["Deny"], "Warn": ["Warn"], "Audit": ["Audit"]}


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_cel_string(v) for v in values) + "]"


def _root(p: RunPolicy) -> list[tuple[str, str, str]]:
    if p.security.on_root == "Allow":
        return []
    ids = " && ".join(
        f"{_PSC}.?{k}.orValue(1) != 0" for k in ("runAsUser", "runAsGroup", "fsGroup")
    )
    containers = (
        f"{_C}.all(c, c.?securityContext.?runAsUser.orValue(1) != 0"
        " && c.?securityContext.?runAsGroup.orValue(1) != 0"
        " && c.?securityContext.?runAsNonRoot.orValue(true))"
    )
    return [
        (
            SECURITY_ROOT,
            f"{ids} && !{_PSC}.?supplementalGroups.orValue([]).exists(g, g == 0)"
            f" && {_PSC}.?runAsNonRoot.orValue(true) && {containers}",
            "a user or group id 0, or runAsNonRoot false",
        )
    ]


def _privileges(p: RunPolicy) -> list[tuple[str, str, str]]:
    escalation = (
        " && c.?securityContext.?allowPrivilegeEscalation.orValue(false) == false"
        if p.security.level == "restricted"
        else ""
    )
    operators = frozenset(c for o in p.platform.operators for c in o.allowed_capabilities)
    allowed = sorted(allowed_capabilities(p) | operators)
    return [
        (
            SECURITY_PRIVILEGED,
            f"{_C}.all(c, !c.?securityContext.?privileged.orValue(false)"
            f" && !c.?securityContext.?windowsOptions.?hostProcess.orValue(false){escalation})"
            f" && !{_PSC}.?windowsOptions.?hostProcess.orValue(false)",
            "a privileged container, a host process"
            + (", or privilege escalation allowed" if escalation else ""),
        ),
        (
            SECURITY_CAPABILITIES,
            f"{_C}.all(c, c.?securityContext.?capabilities.?add.orValue([])"
            f".all(a, a in {_list(allowed)}))",
            f"a capability added outside {', '.join(allowed) or 'none'}",
        ),
        (
            SECURITY_HOST_NAMESPACE,
            "!object.spec.?hostNetwork.orValue(false) && !object.spec.?hostPID.orValue(false)"
            " && !object.spec.?hostIPC.orValue(false)",
            "the host's network, PID or IPC namespace",
        ),
        (
            SECURITY_HOST_PORTS,
            f"{_C}.all(c, c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))",
            "a host port",
        ),
    ]


def _host_path(p: RunPolicy) -> str:
    """CEL: the hostPath volume ``v`` is one of ``allowedHostPaths`` (``false`` if none), a
    trailing ``/`` aside; ``{namespace}`` is the request's."""
    alternatives = []
    for allowed in p.volumes.allowed_host_paths:
        pieces = [_regex_literal(piece) for piece in allowed.split(HOST_PATH_PLACEHOLDER)]
        regex = " + request.namespace + ".join(_cel_string(piece) for piece in pieces)
        alternatives.append(f"v.hostPath.?path.orValue('').matches('^' + {regex} + '/*$')")
    return " || ".join(alternatives)


def _regex_literal(text: str) -> str:
    """``text`` matched literally by an RE2 regex (a bracket per special character)."""
    return "".join(
        c if c.isalnum() or c in "/_-" else "\\" + c if c in "\\^]" else f"[{c}]" for c in text
    )


def _volumes(p: RunPolicy) -> list[tuple[str, str, str]]:
    forbidden = [t for t in VOLUME_TYPES if t != "hostPath" and forbidden_type(t, p) is not None]
    allowed = sorted(t for t in VOLUME_TYPES if t not in forbidden and t != "hostPath")
    terms = [f"!has(v.{t})" for t in forbidden]
    terms.append(
        f"(!has(v.hostPath) || {_host_path(p)})"
        if p.volumes.allowed_host_paths
        else "!has(v.hostPath)"
    )
    return [
        (
            VOLUMES_FORBIDDEN_TYPE,
            f"object.spec.?volumes.orValue([]).all(v, {' && '.join(terms)})",
            f"a volume type outside {', '.join(allowed)}"
            + (
                ", or a hostPath outside volumes.allowedHostPaths"
                if p.volumes.allowed_host_paths
                else ""
            ),
        )
    ]


def _amount(holder: str, part: str, resource: str) -> str:
    return f"quantity({holder}.?resources.?{part}[?{_cel_string(resource)}].orValue('0'))"


def _mapped_to(p: RunPolicy, resource: str) -> list[str]:
    """The extended resources a DeviceClass runs may use maps, whose devices count as
    ``resource`` (the engine adds them to it: ``webhook.engine.rules.dra``)."""
    cfg = p.resources
    names = [IMPLICIT_EXTENDED_PREFIX + c for c in cfg.device_classes]
    return sorted(
        n for n in [*names, *cfg.extended_device_classes] if cfg.counted_as(n) == resource
    )


def _maximums(p: RunPolicy) -> list[tuple[str, str, str]]:
    out = []
    for resource, text in sorted(p.resources.maximums.items()):
        maximum = f"quantity({_cel_string(str(text))})"
        limit = f"{maximum}.asApproximateFloat() * {_ROUNDING}"
        mapped = _mapped_to(p, resource)
        terms = []
        for part in ("requests", "limits"):
            amount = _amount("c", part, resource)
            # with the mapped resources, summed: a run's devices however it asks for them
            devices = " + ".join(
                f"{_amount('c', part, r)}.asApproximateFloat()" for r in [resource, *mapped]
            )
            mapped_sum = " + ".join(
                f"variables.together.map(c, {_amount('c', part, r)}.asApproximateFloat()).sum()"
                for r in mapped
            )
            pod_level = f"object.spec.?resources.?{part}[?{_cel_string(resource)}]"
            pod_amount = _amount("object.spec", part, resource)
            terms += [
                f"variables.sized.all(c, !{amount}.isGreaterThan({maximum}))",
                # pod-level resources, where set, are the run's; else its containers' sum
                f"({pod_level}.hasValue()"
                + (
                    f" ? {pod_amount}.asApproximateFloat() + {mapped_sum} <= {limit}"
                    if mapped
                    else f" ? !{pod_amount}.isGreaterThan({maximum})"
                )
                + f" : variables.together.map(c, {devices}).sum() <= {limit})",
            ]
        out.append(
            (
                RESOURCES_EXCEEDED,
                " && ".join(terms),
                f"{resource} above the maximum {text}, in a container or the run's total",
            )
        )
    return out


def _priority_classes(p: RunPolicy) -> list[tuple[str, str, str]]:
    allowed = p.scheduling.priority_classes.allowed
    if allowed is None:
        return []
    return [
        (
            SCHEDULING_PRIORITY_CLASS,
            f"object.spec.?priorityClassName.orValue('') in {_list(['', *sorted(allowed)])}",
            f"a priority class outside {', '.join(sorted(allowed))}",
        )
    ]


def _device_classes(p: RunPolicy) -> list[tuple[str, str, str]]:
    """An extended resource a DeviceClass stands for, of a class runs may not use (a
    claim's class is in its template: beyond the floor)."""
    allowed = sorted(p.resources.device_classes)
    keys = f"k, !k.startsWith({_cel_string(IMPLICIT_EXTENDED_PREFIX)})" + (
        f" || k in {_list(IMPLICIT_EXTENDED_PREFIX + c for c in allowed)}" if allowed else ""
    )
    return [
        (
            RESOURCES_DEVICE_REQUEST,
            f"variables.sized.all(c, c.?resources.?requests.orValue({{}}).all({keys})"
            f" && c.?resources.?limits.orValue({{}}).all({keys}))",
            f"an extended resource {IMPLICIT_EXTENDED_PREFIX}<class> of a DeviceClass runs "
            f"may not use (allowed: {', '.join(allowed) or 'none'})",
        )
    ]


def floor_rules(p: RunPolicy) -> list[tuple[str, str, str]]:
    """(rule id, CEL expression, message) of each validation of the RunPolicy ``p``."""
    return [
        *_root(p),
        *_privileges(p),
        *_volumes(p),
        *_maximums(p),
        *_device_classes(p),
        *_priority_classes(p),
    ]


def _selects(p: RunPolicy) -> str | None:
    """CEL: the RunPolicy ``p`` selects the Pod (its namespaces, its selector); None: every
    Pod."""
    selects = _join(
        "&&",
        _namespace_outside(p.exclude_namespaces),
        _selector(p.selector, "object.metadata.?labels"),
    )
    return None if selects is None else _render(selects)


def _not_earlier(policy: Policy, index: int) -> str | None | bool:
    """CEL: no earlier RunPolicy selects the Pod (the first that selects a Pod governs it,
    and its floor judges it); None when there is none, False when an earlier one selects
    every Pod."""
    terms = []
    for earlier in policy.run_policies[:index]:
        selects = _selects(earlier)
        if selects is None:
            return False
        terms.append(f"!({selects})")
    return " && ".join(terms) or None


def _allows(policies: list[RunPolicy]) -> str:
    """CEL: the RunPolicy that governs the Pod among ``policies`` (the first that selects
    it) admits it by its floor; true when none selects it or it does not deny. One that
    names ``requesters`` governs only the Pods they create: the next one may govern it."""
    out = "true"
    for p in reversed(policies):
        own = " && ".join(f"({e})" for _, e, _ in floor_rules(p)) or "true"
        allows = "true" if p.enforcement != "Deny" else own
        if p.requesters:
            allows = f"({allows}) || ({out})"
        selects = _selects(p)
        out = allows if selects is None else f"(({selects}) ? ({allows}) : ({out}))"
    return out


def floor_policies(policy: Policy, *, namespace: str = DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding of each RunPolicy (none for one that an
    earlier one always takes first). A RunPolicy naming ``requesters`` governs only the
    Pods they create, directly or through controllers, which the apiserver cannot tell:
    its floor denies a Pod only when the next RunPolicy's floor would deny it too."""
    out: list[dict[str, Any]] = []
    for index, p in enumerate(policy.run_policies):
        earlier = _not_earlier(policy, index)
        if earlier is False:
            continue
        name = f"{FLOOR_PREFIX}{p.name}"
        spec: dict[str, Any] = {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [_rule("", ["pods"], ["CREATE"])]},
        }
        if isinstance(earlier, str):
            spec["matchConditions"] = [{"name": "not-an-earlier-runpolicys", "expression": earlier}]
        spec["variables"] = [{"name": n, "expression": e} for n, e in _VARIABLES.items()]
        otherwise = ""
        if p.requesters:
            # Not created by them: the next RunPolicy that selects it governs it.
            later = _allows(list(policy.run_policies[index + 1 :]))
            spec["variables"].append({"name": "nextAllows", "expression": later})
            otherwise = " || variables.nextAllows"
        spec["validations"] = [
            {
                "expression": f"({expression}){otherwise}" if otherwise else expression,
                "message": f"[{rule}] {message} (runguard's floor)",
            }
            for rule, expression, message in floor_rules(p)
        ]
        binding = {
            "policyName": name,
            "validationActions": _ACTIONS[p.enforcement],
            "matchResources": {
                "namespaceSelector": namespace_selector(p, namespace),
                "objectSelector": p.selector.to_dict(),
            },
        }
        metadata = {"name": name, "labels": dict(FLOOR_LABELS)}
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": metadata,
                "spec": spec,
            }
        )
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": dict(metadata, labels=dict(FLOOR_LABELS)),
                "spec": binding,
            }
        )
    return out
