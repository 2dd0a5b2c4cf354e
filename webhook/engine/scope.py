"""One scope decision per RunPolicy: whether an object is in a RunPolicy's sight.

A RunPolicy declares its scope in four keys, and nothing else decides it:

- ``excludeNamespaces``: namespaces it never looks at (``covers``);
- ``selector``: the Pods (and pod templates) that are its runs (``selects``);
- ``requesters``: when set, only the runs these identities create (``choose``);
- ``platform``: whose objects and accounts it keeps for the platform's runs; an object
  outside every run that names them, runs as one of those accounts, carries runguard's
  records or is one of its operators' kinds is in its sight too (``claims``,
  ``recorder``).

``in_scope`` is that decision for one RunPolicy; the functions below are its parts,
which the engine asks one at a time (which RunPolicy governs, which platform records
an object, which platforms a Pod holds something of). Each RunPolicy decides for
itself: one RunPolicy's exclusions or selector are never another's. The engine judges
with these functions, and ``webhook.install.manifests`` renders the webhooks'
``namespaceSelector``, ``objectSelector`` and CEL ``matchConditions`` from the same
keys read the same way (``run_terms``): a Pod is a run for routing only where its
RunPolicy covers the request's namespace. ``tests/engine/test_scope_routing.py``
evaluates the rendered conditions with a CEL library against the engine: every request
the engine would deny or change reaches a webhook, and is in some RunPolicy's scope.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.engine.podspec import InvalidObject, locate
from webhook.engine.rules import ownership
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import LabelSelector, Policy, RunPolicy


def in_scope(root: Policy, policy: RunPolicy, obj: Any, namespace: str | None) -> bool:
    """The scope decision of one RunPolicy of ``root``: whether ``obj`` is in its sight.
    Its namespaces (``covers``), then its selector on the object's pod labels (its runs,
    and the Pods its ``requesters`` may or may not have created: ``choose`` decides
    which), then its platform (``claims``, its operators' kinds, runguard's records on
    the object or its pod template). The engine changes or refuses nothing outside the
    scope of every RunPolicy, and the webhooks route at least that scope
    (``tests/engine/test_scope_routing.py``)."""
    if not covers(policy, namespace):
        return False
    try:
        target = locate(obj)
    except InvalidObject:
        return True  # what cannot be read is judged, and refused, by whoever sees it
    if target is not None and policy.selector.matches(target.labels):
        return True
    if not ownership.enabled(policy):
        return _carries_records(root, obj, target.metadata if target else None)
    return (
        operator_kind_of(policy, obj)
        or (target is not None and claims(policy, target.spec, namespace))
        or _carries_records(root, obj, target.metadata if target else None)
    )


def _carries_records(root: Policy, obj: Any, template: Any) -> bool:
    """The object carries one of runguard's records (a stamp, a platform record, the
    label of one of ``root``'s RunPolicies), or its pod template or selector uses
    runguard's RunPolicy label, which only runguard writes, on each Pod."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    stamp, record, label = ownership.records(meta if isinstance(meta, dict) else {})
    if stamp is not None or record is not None or (label is not None and root.named(label)):
        return True
    if POLICY_LABEL in ownership.string_map(template, "labels"):
        return True
    spec = obj.get("spec") if isinstance(obj, dict) else None
    selector = spec.get("selector") if isinstance(spec, dict) else None
    return POLICY_LABEL in ownership.string_map(selector, "matchLabels") or any(
        isinstance(e, dict) and e.get("key") == POLICY_LABEL
        for e in (selector.get("matchExpressions") or () if isinstance(selector, dict) else ())
    )


def covers(policy: RunPolicy, namespace: str | None) -> bool:
    """The RunPolicy looks at this namespace (not one of its ``excludeNamespaces``)."""
    return namespace not in policy.exclude_namespaces


def looked_at(root: Policy, namespace: str | None) -> bool:
    """Some RunPolicy looks at this namespace: where every one excludes it, runguard
    touches nothing (and no webhook is called there)."""
    return any(covers(p, namespace) for p in root.run_policies)


def selects(policy: RunPolicy, labels: Mapping[str, str], namespace: str | None) -> bool:
    """A Pod with these labels in this namespace is a run of the RunPolicy, by its
    selector (its ``requesters`` are ``choose``'s)."""
    return covers(policy, namespace) and policy.selector.matches(labels)


def choose(
    root: Policy,
    labels: Mapping[str, str],
    namespace: str | None,
    requested: Callable[[RunPolicy], bool] | None = None,
) -> RunPolicy | None:
    """The RunPolicy governing a pod with these labels in this namespace, if any: the
    first that selects it and, when it names ``requesters``, whose requesters created it
    (``requested(policy)``; None: no requester is known)."""
    for policy in root.run_policies:
        if not selects(policy, labels, namespace):
            continue
        if policy.requesters and (requested is None or not requested(policy)):
            continue
        return policy
    return None


def platforms(root: Policy, namespace: str | None) -> Iterator[RunPolicy]:
    """The RunPolicies with a platform (``platform.identities``) that look at this
    namespace, in the order they are tried."""
    for policy in root.run_policies:
        if ownership.enabled(policy) and covers(policy, namespace):
            yield policy


def claims(policy: RunPolicy, spec: Any, namespace: str | None) -> bool:
    """The pod spec holds what the RunPolicy's platform owns, in a namespace it looks at:
    it names one of its claims, configMaps or secrets, or runs as one of its accounts."""
    if not ownership.enabled(policy) or not covers(policy, namespace):
        return False
    if not isinstance(spec, dict):
        return False
    return bool(ownership.platform_references(spec, policy)) or (
        (namespace, service_account(spec)) in ownership.service_account_identities(policy)
    )


def service_account(spec: Any) -> str:
    """The ServiceAccount a pod spec runs as ("" when it names none)."""
    name = spec.get("serviceAccountName") or spec.get("serviceAccount")
    return name if isinstance(name, str) else ""


def claimed_by(root: Policy, spec: Any, namespace: str | None) -> list[RunPolicy]:
    """Every RunPolicy whose platform the pod spec holds something of (``claims``)."""
    return [p for p in platforms(root, namespace) if claims(p, spec, namespace)]


def operator_kind_of(policy: RunPolicy, obj: Any) -> bool:
    """The object is of a kind one of the RunPolicy's operators owns Pods through."""
    key = ownership.group_kind(obj)
    return key is not None and key != "Pod" and key in policy.platform.operator_kinds


def recorder(
    root: Policy,
    obj: Any,
    spec: Any,
    namespace: str | None,
    governing: RunPolicy | None,
    stored: bool = False,
) -> RunPolicy | None:
    """The RunPolicy whose platform records who created the object (``runguard.io/
    platform``), and whose record it then is: the governing RunPolicy when it has a
    platform; else, among the RunPolicies with a platform that look at the namespace,
    the first whose platform the object concerns (its run, its objects or accounts named,
    its operators' kind), else, for an object carrying runguard's records, the one they
    name (``_carried_owner``), else the first. None: runguard records nothing on it.

    ``stored``: the object as the cluster holds it, whose record is read back as the
    RunPolicy ``runguard.io/platform-policy`` names, written with the record at CREATE
    and kept (None when it names no RunPolicy with a platform that looks at the
    namespace: a removed one's, or another installation's), whatever the object
    concerns by then. A record without that name, written before it was kept, is read
    as above."""
    candidates = list(platforms(root, namespace))
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    annotations = ownership.string_map(meta if isinstance(meta, dict) else {}, "annotations")
    if stored and PLATFORM_RECORD in annotations and PLATFORM_POLICY in annotations:
        return next((p for p in candidates if p.name == annotations[PLATFORM_POLICY]), None)
    if governing is not None:
        if ownership.enabled(governing) and covers(governing, namespace):
            return governing
        return candidates[0] if candidates else None
    for policy in candidates:
        if operator_kind_of(policy, obj) or claims(policy, spec, namespace):
            return policy
    if not candidates or not (annotations.get(REQUESTED_BY) or annotations.get(PLATFORM_RECORD)):
        return None
    return _carried_owner(candidates, annotations) or candidates[0]


def _carried_owner(candidates: list[RunPolicy], annotations: Mapping[str, Any]) -> RunPolicy | None:
    """The RunPolicy a carried record names (``runguard.io/platform-policy``), else, for a
    record without that name (written before it was kept), the platform whose identity or
    installer stamped the object (``runguard.io/requested-by``). None: neither says."""
    name = annotations.get(PLATFORM_POLICY)
    if PLATFORM_RECORD in annotations and name is not None:
        return next((p for p in candidates if p.name == name), None)
    stamp = annotations.get(REQUESTED_BY)
    for policy in candidates:
        platform = policy.platform
        if ownership.stamped_by((*platform.identities, *platform.installers), stamp):
            return policy
    return None


def may_open(opener: RunPolicy, target: RunPolicy) -> bool:
    """A Pod of ``opener``'s platform, by its own token, may do to what ``target``'s
    platform owns only what ``opener``'s identities could themselves: each of them is
    one of ``target``'s (as a requester, each would be ``target``'s platform). MLRun's
    API is also Nuclio's, so MLRun's Pods may open Nuclio's; Nuclio's controller is not
    MLRun's, so Nuclio's Pods may not open MLRun's. Not symmetric, and a chain of
    platforms sharing one identity each gives nothing."""
    return opener is target or ownership.within(opener, target)


def run_terms(root: Policy) -> list[tuple[frozenset[str], LabelSelector]]:
    """What makes a run for routing, per RunPolicy: (the namespaces it leaves out, its
    selector). ``webhook.install.manifests`` renders "a run" as the disjunction of
    ``request.namespace`` outside the first and the labels matching the second, which
    is ``selects`` of each RunPolicy."""
    return [(p.exclude_namespaces, p.selector) for p in root.run_policies]
