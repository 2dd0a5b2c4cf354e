"""Rule ``resources.device-request``, and devices by dynamic resource allocation counted
against the run's maximums and device families (``resources.exceeded``).

A run gets devices three ways: extended resources in its containers' resources (the
device plugin's ``nvidia.com/gpu``), the claims its ``resourceClaims`` make from
ResourceClaimTemplates (``resourceClaimTemplateName``: a claim owned by the Pod, made
by the resource-claim controller), and extended resources a DeviceClass maps to dynamic
resource allocation (Kubernetes 1.37: ``deviceclass.resource.kubernetes.io/<class>``,
or the class's own ``extendedResourceName``, declared with the class in
``resources.deviceClasses``). All of them add up, each device counted once as the
resource its class stands for (``webhook.engine.claimspec``), against the ``gpu``
maximum and the device families, the run's total as the scheduler counts it.

A template is read from runguard's cache, its spec kept (``ResourceClaimTemplate``); a
kind the cache has not synced fails closed (retryable). A template that does not exist
yet, or changes after the Pod was admitted, is judged in the claim the resource-claim
controller makes from it (``check_claim_devices``, owned by the run Pod), with the
run's other devices: the cache keeps what a run Pod and a claim a Pod owns ask for
(``webhook.clusterstate.model.device_spec``). Offline
without ``--cluster-state`` no template is known, and only the extended resources are
counted. An existing claim (``resourceClaimName``) is ``resources.device-claim``'s.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from webhook.engine.claimspec import Asked, claim_asks, class_refused
from webhook.engine.context import ClusterView, Context, ObjectMeta
from webhook.engine.pod import CONTAINER_LISTS, Pod
from webhook.engine.rule import Declarations
from webhook.engine.rules.resources import RESOURCES_EXCEEDED, effective_totals, family_total
from webhook.engine.types import Violation
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy, ResourcesConfig

__all__ = [
    "CLAIM_TEMPLATE",
    "RESOURCES_DEVICE_REQUEST",
    "check_claim_devices",
    "check_device_requests",
    "device_routes",
]

RULES = Declarations(__name__)
RESOURCES_DEVICE_REQUEST = RULES.rule(
    "resources.device-request",
    mutation="",
    violation=(
        "a run's device request (claim template, ResourceClaim, or an extended resource a "
        "DeviceClass maps) of a DeviceClass not in `resources.deviceClasses`, with "
        "`allocationMode: All` or `adminAccess`, or a template runguard cannot read yet"
    ),
)

CLAIM_TEMPLATE = "ResourceClaimTemplate"
DEVICE_CLAIM = "ResourceClaim"
# The claim the scheduler makes for a Pod's extended resources a DeviceClass maps
# (Kubernetes 1.37); and the Pod's ``resourceClaims`` entry a claim the resource-claim
# controller makes is for. Both written by Kubernetes, as ``resource.k8s.io`` names them.
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
MAX_POD_CLAIMS = 32  # resourceClaims entries the apiserver allows a Pod
# By the resource a device counts as: (how many, how the run asks for them), for messages.
Routes = dict[str, list[tuple[Decimal, str]]]


def _mapped_resources(pod: Pod, cfg: ResourcesConfig) -> list[str]:
    """The extended resources of the run that a DeviceClass maps (most runs: none)."""
    found: list[str] = []
    for list_name in CONTAINER_LISTS:
        for container in pod.spec.get(list_name) or ():
            res = container.get("resources")
            if not isinstance(res, dict):
                continue
            for part in ("requests", "limits"):
                for resource in res.get(part) or ():
                    if cfg.mapped_device_class(resource) is not None and resource not in found:
                        found.append(resource)
    return found


def check_device_requests(pod: Pod) -> list[Violation]:
    cfg = pod.policy.resources
    mapped = _mapped_resources(pod, cfg)
    claims = pod.spec.get("resourceClaims")
    if not mapped and not claims:  # the usual run
        return []
    out, totals, routes = _counted(pod, cfg, mapped, claims)
    where = f"{pod.spec_path}.resourceClaims"
    out.extend(_above_maximums(where, cfg, totals, routes))
    out.extend(_above_families(where, cfg, totals, routes))
    return out


def device_routes(pod: Pod) -> list[str]:
    """How the run gets its devices, by the resource each counts as (``runguard explain``):
    ``3 gpu: 2 as nvidia.com/gpu, 1 by template one-gpu``."""
    cfg = pod.policy.resources
    _, totals, routes = _counted(
        pod, cfg, _mapped_resources(pod, cfg), pod.spec.get("resourceClaims")
    )
    for resource, amount in totals.items():
        device = resource == cfg.gpu_resource_name or any(f.weight(resource) for f in cfg.families)
        if amount and device and resource not in routes:
            routes[resource] = [(amount, f"as {resource}")]
    return [
        f"{_num(totals[r])} {cfg.short(r)}: {_ways(ways)}" for r, ways in sorted(routes.items())
    ]


def _counted(
    pod: Pod, cfg: ResourcesConfig, mapped: list[str], claims: Any
) -> tuple[list[Violation], dict[str, Decimal], Routes]:
    """What the run asks for, by the resource each device counts as: the violations met
    on the way (classes, modes, templates runguard cannot read), the totals, the routes."""
    out: list[Violation] = []
    asked = Asked()
    routes: Routes = {}
    for i, entry in enumerate(claims if isinstance(claims, list) else ()):
        template = entry.get("resourceClaimTemplateName") if isinstance(entry, dict) else None
        if not isinstance(template, str):
            continue  # an existing claim: resources.device-claim
        path = f"{pod.spec_path}.resourceClaims[{i}]"
        found = _template_asks(pod, template, path, out)
        if found is None:
            continue
        for problem in found.problems:
            out.append(
                Violation(
                    RESOURCES_DEVICE_REQUEST, path, f"ResourceClaimTemplate {template!r}: {problem}"
                )
            )
        for resource, amount in found.amounts.items():
            routes.setdefault(resource, []).append((amount, f"by template {template}"))
        asked.add(Asked(found.amounts))
    totals = _totals(pod, cfg, asked.amounts, mapped, routes, out)
    return out, totals, routes


def _template_asks(pod: Pod, template: str, path: str, out: list[Violation]) -> Asked | None:
    """What template ``template`` of the run's namespace asks for; None when it cannot be
    counted now (no cluster view; not created yet), a violation added when runguard's
    cache cannot tell."""
    state = pod.context.state
    if state is None:
        return None
    if not state.synced(CLAIM_TEMPLATE):
        out.append(
            Violation(
                RESOURCES_DEVICE_REQUEST,
                path,
                f"runguard's cache does not hold ResourceClaimTemplates (not synced yet, or not "
                f"listable by runguard): cannot count the devices of {template!r}; retry in a "
                "moment",
            )
        )
        return None
    meta = state.get(CLAIM_TEMPLATE, pod.namespace, template)
    if meta is None:
        return None  # judged in the claim made from it (check_claim_devices)
    try:
        spec: Any = orjson.loads(meta.spec) if meta.spec else None
    except orjson.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict):
        out.append(
            Violation(
                RESOURCES_DEVICE_REQUEST,
                path,
                f"ResourceClaimTemplate {template!r} cannot be read (too large, or no spec): "
                "its devices cannot be counted",
            )
        )
        return None
    return claim_asks(spec.get("spec"), cfg=pod.policy.resources)


def _totals(
    pod: Pod,
    cfg: ResourcesConfig,
    claimed: dict[str, Decimal],
    mapped: list[str],
    routes: Routes,
    out: list[Violation],
) -> dict[str, Decimal]:
    """The run's totals, its claims' devices and mapped extended resources counted as the
    resources their classes stand for (a class refused added to ``out``)."""
    totals: dict[str, Decimal] = {}
    for part in ("requests", "limits"):
        for resource, amount in effective_totals(pod.spec, part).items():
            totals[resource] = max(totals.get(resource, Decimal(0)), amount)
    for resource in mapped:
        device_class = cfg.mapped_device_class(resource)
        amount = totals.pop(resource, Decimal(0))
        if device_class not in cfg.device_classes:
            out.append(
                Violation(
                    RESOURCES_DEVICE_REQUEST,
                    f"{pod.spec_path}.containers",
                    f"extended resource {resource}: {class_refused(device_class, cfg)}",
                )
            )
            continue
        counted = cfg.device_resource(str(device_class), None)
        totals[counted] = totals.get(counted, Decimal(0)) + amount
        routes.setdefault(counted, []).append((amount, f"as {resource}"))
    for resource, amount in claimed.items():
        totals[resource] = totals.get(resource, Decimal(0)) + amount
    for resource, ways in routes.items():
        direct = totals[resource] - sum((amount for amount, _ in ways), start=Decimal(0))
        if direct > 0:
            ways.insert(0, (direct, f"as {resource}"))
    return totals


def _above_maximums(
    where: str, cfg: ResourcesConfig, totals: dict[str, Decimal], routes: Routes
) -> list[Violation]:
    out = []
    for resource, ways in routes.items():
        maximum = cfg.maximum_values.get(resource)
        if maximum is not None and totals[resource] > maximum:
            out.append(
                Violation(
                    RESOURCES_EXCEEDED,
                    where,
                    f"the run's devices count {_num(totals[resource])} {cfg.short(resource)} "
                    f"({_ways(ways)}), above the maximum {cfg.maximums[resource]} for one run",
                    totals[resource],
                )
            )
    return out


def _above_families(
    where: str, cfg: ResourcesConfig, totals: dict[str, Decimal], routes: Routes
) -> list[Violation]:
    out = []
    for family in cfg.families:
        if not any(family.weight(resource) for resource in routes):
            continue  # no device by claim in this family: check_device_families judges it
        total, shown = family_total(cfg, family, totals)
        if total > family.max:
            out.append(
                Violation(
                    RESOURCES_EXCEEDED,
                    f"{where}.family:{family.name}",
                    f"the run's {family.name} devices, claims included ({shown}), count "
                    f"{_num(total)}, above the family's maximum {_num(family.max)} for one run",
                    total,
                )
            )
    return out


def _ways(ways: list[tuple[Decimal, str]]) -> str:
    return ", ".join(f"{_num(amount)} {how}" for amount, how in ways)


def _num(amount: Decimal) -> str:
    return f"{amount.normalize():f}"


# --- the claim the resource-claim controller makes from a run's template ---------------


def check_claim_devices(
    obj: Any, root: Policy, context: Context, namespace: str
) -> list[Violation]:
    """A ResourceClaim created for a run Pod (its controller owner, a Pod runguard's cache
    holds as a run: it keeps run Pods, by their RunPolicy label) is judged against that
    run's RunPolicy, whatever the order in which the Pod and its template were created:
    its classes, ``allocationMode`` and ``adminAccess``, and the run's devices with it
    against the maximums and families (``_run_with_claim``). A Pod the cache does not hold
    is no run of runguard's (or not seen yet: the window ``docs/threat-model.md`` names)."""
    if context.operation != "CREATE" or obj.get("kind") != "ResourceClaim":
        return []
    owner = _owner_pod(obj)
    state = context.state
    if owner is None or state is None:
        return []
    pod = state.get("Pod", namespace, owner) if state.synced("Pod") else None
    policy = root.named(pod.labels.get(POLICY_LABEL, "")) if pod is not None else None
    if pod is None or policy is None:
        return []
    cfg = policy.resources
    asked = claim_asks(obj.get("spec"), cfg)
    out = [
        Violation(RESOURCES_DEVICE_REQUEST, "spec.devices.requests", f"run Pod {owner}: {p}")
        for p in asked.problems
    ]
    if not state.synced(CLAIM_TEMPLATE) or not state.synced(DEVICE_CLAIM):
        out.append(
            Violation(
                RESOURCES_DEVICE_REQUEST,
                "spec.devices",
                f"runguard's cache does not hold ResourceClaimTemplates and ResourceClaims yet: "
                f"cannot count the other devices of run Pod {owner}; retry in a moment",
            )
        )
        return out
    totals, routes = _run_with_claim(obj, pod, asked, cfg, state)
    out.extend(_above_maximums("spec.devices", cfg, totals, routes))
    out.extend(_above_families("spec.devices", cfg, totals, routes))
    return out


def _run_with_claim(
    obj: Any, pod: ObjectMeta, asked: Asked, cfg: ResourcesConfig, state: ClusterView
) -> tuple[dict[str, Decimal], Routes]:
    """The run's devices once claim ``obj`` is made, each counted once: the Pod's extended
    resources (as the cache keeps them, mapped ones as their class's devices), its other
    claims (made already, else their templates as the cache holds them), and this claim;
    the scheduler's claim for the Pod's extended resources a class maps (Kubernetes 1.37,
    ``EXTENDED_RESOURCE_CLAIM``) stands for them: only what it asks beyond what they count
    as is added."""
    try:
        spec: Any = orjson.loads(pod.spec) if pod.spec else {}
    except orjson.JSONDecodeError:
        spec = {}
    totals: dict[str, Decimal] = {}
    for part in ("requests", "limits"):
        for resource, amount in effective_totals(spec, part).items():
            totals[resource] = max(totals.get(resource, Decimal(0)), amount)
    routes: Routes = {}
    for resource in list(totals):
        device_class = cfg.mapped_device_class(resource)
        if device_class is None or device_class not in cfg.device_classes:
            continue  # a device plugin's; or a class refused when the Pod was admitted
        amount, counted = totals.pop(resource), cfg.counted_as(resource)
        totals[counted] = totals.get(counted, Decimal(0)) + amount
        routes.setdefault(counted, []).append((amount, f"as {resource}"))
    # The scheduler's claim is made for the Pod's extended resources: it may ask what they
    # count as (its class's devices, whatever the policy says the class maps).
    stands_for = dict(totals)
    for resource, ways in _other_claims(obj, pod, spec, cfg, state).items():
        for amount, how in ways:
            totals[resource] = totals.get(resource, Decimal(0)) + amount
            routes.setdefault(resource, []).append((amount, how))
    scheduler = _annotation(obj, EXTENDED_RESOURCE_CLAIM) == "true"
    for resource, amount in asked.amounts.items():
        beyond = amount - stands_for.get(resource, Decimal(0)) if scheduler else amount
        if beyond > 0:
            totals[resource] = totals.get(resource, Decimal(0)) + beyond
            how = f"by claim {_name(obj)} of Pod {pod.name}"
            routes.setdefault(resource, []).append((beyond, how))
    for resource, ways in routes.items():
        direct = totals.get(resource, Decimal(0)) - sum((a for a, _ in ways), start=Decimal(0))
        if direct > 0:
            ways.insert(0, (direct, f"as {resource}"))
    return totals, routes


def _other_claims(
    obj: Any, pod: ObjectMeta, spec: Any, cfg: ResourcesConfig, state: ClusterView
) -> Routes:
    """The devices of the Pod's other claims (``resourceClaims`` entries but the one
    ``obj`` is made for): the claim made for the entry when the cache holds it (its
    template may have changed since), else the entry's template; neither: nothing yet,
    judged when it is made."""
    this = _annotation(obj, POD_CLAIM_NAME)
    made: dict[str, ObjectMeta] = {}
    for claim in state.in_namespace(DEVICE_CLAIM, pod.namespace):
        made_for = claim.annotations.get(POD_CLAIM_NAME)
        for kind, owner, uid, controller in claim.owners:
            mine = kind == "Pod" and owner == pod.name and (not pod.uid or uid == pod.uid)
            if controller and mine and made_for is not None:
                made[made_for] = claim
    found: Routes = {}
    entries = spec.get("resourceClaims") if isinstance(spec, dict) else None
    for entry in entries[:MAX_POD_CLAIMS] if isinstance(entries, list) else ():
        name = entry.get("name") if isinstance(entry, dict) else None
        if name is None or name == this:
            continue
        template = entry.get("resourceClaimTemplateName")
        made_claim = made.get(name)
        if made_claim is not None:
            asked = _kept_asks(made_claim.spec, cfg, inner=False)
            how = f"by claim {made_claim.name}"
        elif isinstance(template, str):
            meta = state.get(CLAIM_TEMPLATE, pod.namespace, template)
            kept = meta.spec if meta is not None else ""
            asked, how = _kept_asks(kept, cfg, inner=True), f"by template {template}"
        else:
            continue  # an existing claim: not for runs (resources.device-claim)
        for resource, amount in asked.amounts.items():
            found.setdefault(resource, []).append((amount, how))
    return found


def _kept_asks(kept: str, cfg: ResourcesConfig, *, inner: bool) -> Asked:
    """What a kept spec (a claim's; a template's, the claim's spec inside: ``inner``)
    asks for; nothing when the cache kept none."""
    try:
        spec: Any = orjson.loads(kept) if kept else None
    except orjson.JSONDecodeError:
        spec = None
    if inner and isinstance(spec, dict):
        spec = spec.get("spec")
    return claim_asks(spec, cfg)


def _annotation(obj: Any, key: str) -> str | None:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None


def _owner_pod(obj: Any) -> str | None:
    """The name of the Pod that is the claim's controller owner, if any."""
    metadata = obj.get("metadata")
    owners = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("kind") == "Pod" and owner.get("controller"):
            name = owner.get("name")
            return name if isinstance(name, str) else None
    return None


def _name(obj: Any) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else "(generated)"
