"""Ownership: the platform's volumes and secrets only for its runs.

Names and labels are written by whoever writes the manifest, so they cannot alone decide
what a run may use. With ``platform.identities`` set, an object is the platform's when,
at its CREATE:

- the request's user is a platform identity (a user name, ``group:NAME`` of its groups,
  ``serviceaccount:NS:NAME``; a user name is never compared with a group identity);
- or the request comes from a controller (``platform.controllers``, the
  kube-controller-manager's job-controller, replicaset-controller...) or an operator
  (``platform.operators``) and the object's controller owner, of a kind that identity
  owns, found *by uid* in the cluster state, was the platform's when *it* was created.
  An ``ownerReferences`` a user writes proves nothing: the requester must be the
  controller itself. An operator's object with no owner of its kinds yet is undecided
  (``unknown``), not refused: the operator's own webhook may add the owner after
  runguard's mutation, and validation, which sees the object whole, decides.

That decision is recorded by runguard at CREATE (``runguard.io/platform``, with
``runguard.io/platform-policy`` naming whose platform, beside the stamp
``runguard.io/requested-by``), overwriting anything sent, and never changes: later
checks read the record of the object as it was (``old``), never its new owners or a
string comparison of the stamp. Without ``platform.identities`` the checks are off and
names decide (``runguard lint`` warns).

This module says who the platform is, what it recorded and which names it reserves;
the checks built on it sit beside it, one module per rule: ``stamp`` (the records
kept), ``reserved`` (what only the platform may create), ``not_a_run`` (its objects
used by a pod it did not create), ``debug`` (a shell into its Pods),
``operator_objects`` (its operators' custom resources) and ``trust`` (over time).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from webhook.engine import doors
from webhook.engine.context import OWNERSHIP_OFF, Context, ObjectMeta, Ownership, Requester
from webhook.engine.types import JSON
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import NamePattern, Policy, RunPolicy
from webhook.policy.patterns import split

_MAX_DEPTH = 6  # Pod -> ReplicaSet -> Deployment is 2; anything longer is not a controller chain
GROUP = "group:"
SERVICE_ACCOUNT = "serviceaccount:"


def enabled(policy: RunPolicy) -> bool:
    return bool(policy.platform.identities)


def identity_matches(identity: str, requester: Requester) -> bool:
    """Typed: ``group:NAME`` against the groups only, ``serviceaccount:NS:NAME`` against
    the service account's user name, anything else against the user name."""
    if identity.startswith(GROUP):
        return identity[len(GROUP) :] in requester.groups
    if identity.startswith(SERVICE_ACCOUNT):
        return requester.username == "system:" + identity
    return requester.username == identity


def is_identity(identities: tuple[str, ...], requester: Requester | None) -> bool:
    return requester is not None and any(identity_matches(i, requester) for i in identities)


def is_platform_identity(policy: RunPolicy, requester: Requester | None) -> bool:
    return is_identity(policy.platform.identities, requester)


def is_platform_or_installer(policy: RunPolicy, requester: Requester | None) -> bool:
    """The platform itself, or one of ``platform.installers`` (its chart): who may change
    what the platform's objects are."""
    return is_platform_identity(policy, requester) or is_identity(
        policy.platform.installers, requester
    )


def service_account_identities(policy: RunPolicy) -> frozenset[tuple[str, str]]:
    """(namespace, name) of every ServiceAccount that is a platform identity or one of its
    operators: a Pod running as an operator's account could create Pods as the operator."""
    out = set()
    operators = (o.identity for o in policy.platform.operators)
    for identity in (*policy.platform.identities, *operators):
        text = identity.removeprefix("system:")
        if text.startswith(SERVICE_ACCOUNT):
            namespace, _, name = text[len(SERVICE_ACCOUNT) :].partition(":")
            if namespace and name:
                out.add((namespace, name))
    return frozenset(out)


def recorded_platform(
    policy: RunPolicy, annotations: Mapping[str, str], root: Policy | None = None
) -> bool:
    """The object's record says the platform created it. An object stamped before
    records existed (no record key) counts when its stamp is a platform *user* name.
    With ``root`` (every RunPolicy), a record another platform wrote does not count
    (``recorded_for``)."""
    record = annotations.get(PLATFORM_RECORD)
    if record is not None:
        return record == "true" and recorded_for(policy, annotations, root)
    return stamped_by(policy.platform.identities, annotations.get(REQUESTED_BY))


def recorded_for(policy: RunPolicy, annotations: Mapping[str, str], root: Policy | None) -> bool:
    """The platform record was written for ``policy``'s platform: the RunPolicy it names
    (``runguard.io/platform-policy``) is ``policy``, or one of ``root``'s whose every
    identity is one of ``policy``'s (``within``: whoever of it created the object was
    ``policy``'s platform too). A record without that name, written before it was kept,
    counts, as it did; so does any name without ``root`` to read it in."""
    name = annotations.get(PLATFORM_POLICY)
    if name is None or name == policy.name or root is None:
        return True
    named = root.named(name)
    return named is not None and within(named, policy)


def within(a: RunPolicy, b: RunPolicy) -> bool:
    """Every identity of ``a``'s platform is one of ``b``'s: what ``a``'s platform does,
    ``b``'s could have done itself (MLRun's API is also Nuclio's: MLRun is within Nuclio,
    not the converse)."""
    return set(a.platform.identities) <= set(b.platform.identities)


def stamped_by(identities: tuple[str, ...], stamp: str | None) -> bool:
    """A stamp (a user name) is one of these identities' users or ServiceAccounts."""
    return stamp is not None and stamp in _user_names(identities)


@lru_cache(maxsize=64)
def _user_names(identities: tuple[str, ...]) -> frozenset[str]:
    """The user names of the identities that are users or service accounts."""
    return frozenset(
        "system:" + i if i.startswith(SERVICE_ACCOUNT) else i
        for i in identities
        if not i.startswith(GROUP)
    )


def string_map(meta: JSON | None, key: str) -> Mapping[str, Any]:
    """``meta[key]`` (labels, annotations) when it is a mapping, else empty: records are
    read from objects, old ones included, that no shape check has passed."""
    value = (meta or {}).get(key)
    return value if isinstance(value, dict) else {}


def records(object_meta: JSON) -> tuple[str | None, str | None, str | None]:
    """The stamp, the platform record and the governing policy label of an object."""
    annotations = string_map(object_meta, "annotations")
    label = string_map(object_meta, "labels").get(POLICY_LABEL)
    return annotations.get(REQUESTED_BY), annotations.get(PLATFORM_RECORD), label


def ownership_of(
    object_meta: JSON,
    namespace: str,
    policy: RunPolicy,
    context: Context,
    old_meta: JSON | None = None,
    root: Policy | None = None,
) -> Ownership:
    """Whether the object being admitted (a Pod, a pod controller, an operator's object)
    is the platform's. After CREATE: what runguard recorded then, read from the object
    as it was (``old_meta``), whatever the update sends. ``root``: every RunPolicy, to
    tell another platform's records (``recorded_for``)."""
    if not enabled(policy):
        return OWNERSHIP_OFF
    if context.operation != "CREATE":
        meta = old_meta if old_meta is not None else object_meta
        annotations = string_map(meta, "annotations")
        if recorded_platform(policy, annotations, root):
            return Ownership(True)
        if PLATFORM_RECORD not in annotations and annotations.get(REQUESTED_BY) in (
            policy.platform.owner_kinds
        ):
            # created by a controller before records existed: its owner's record then
            stamp = Requester(annotations[REQUESTED_BY])
            as_stamp = Context(stamp, context.state, context.operation)
            admit = _platform_owner(policy, context, root)
            return _through_owner(meta, namespace, policy, as_stamp, admit)
        return Ownership(False)
    if is_platform_identity(policy, context.requester):
        return Ownership(True)
    admit = _platform_owner(policy, context, root)
    return _through_owner(object_meta, namespace, policy, context, admit)


INSTALLER = "installer"  # the record of an object a platform installer created


def creator_record(
    object_meta: JSON,
    namespace: str,
    policy: RunPolicy,
    context: Context,
    root: Policy | None = None,
) -> str | None:
    """What runguard records at CREATE in ``runguard.io/platform``: "true" when the platform
    created the object (directly, or through its controllers and operators), "installer"
    when one of ``platform.installers`` did (the chart installing the platform's own
    components, which may run as the platform's accounts but get nothing else of it),
    None otherwise. ``root``: every RunPolicy, to tell an owner another platform
    recorded (``recorded_for``)."""
    if is_platform_identity(policy, context.requester):
        return "true"
    if is_identity(policy.platform.installers, context.requester):
        return INSTALLER
    seen: list[str] = []
    legacy = _platform_owner(policy, context, root)

    def admit(owner: ObjectMeta, depth: int) -> bool | Ownership:
        record = owner.annotations.get(PLATFORM_RECORD)
        if record in ("true", INSTALLER):
            if not recorded_for(policy, owner.annotations, root):
                return False  # another platform's
            seen.append(record)
            return True
        return legacy(owner, depth)

    if not _through_owner(object_meta, namespace, policy, context, admit).platform:
        return None
    return seen[0] if seen else "true"


def _platform_owner(
    policy: RunPolicy, context: Context, root: Policy | None = None
) -> Callable[[ObjectMeta, int], bool | Ownership]:
    """Accepts an owner that was the platform's when it was created: its record, or for
    an owner from before records existed, its stamp and then its own owner's."""

    def admit(owner: ObjectMeta, depth: int) -> bool | Ownership:
        if recorded_platform(policy, owner.annotations, root):
            return True
        stamp = owner.annotations.get(REQUESTED_BY)
        if (
            stamp is None
            or PLATFORM_RECORD in owner.annotations
            or stamp not in policy.platform.owner_kinds
            or depth >= _MAX_DEPTH
        ):
            return False
        refs = [{"kind": k, "name": n, "uid": u, "controller": c} for k, n, u, c in owner.owners]
        as_stamp = Context(Requester(stamp), context.state, context.operation)
        return _through_owner(
            {"ownerReferences": refs}, owner.namespace, policy, as_stamp, admit, depth + 1
        )

    return admit


def created_through(
    object_meta: JSON,
    namespace: str,
    policy: RunPolicy,
    context: Context,
    admit: Callable[[ObjectMeta], bool],
) -> Ownership:
    """The request comes from a controller or operator of ``policy.platform`` and the
    object's controller owner, of a kind it owns, found by uid, is one ``admit`` accepts."""
    return _through_owner(object_meta, namespace, policy, context, lambda o, _d: admit(o))


def _through_owner(
    object_meta: JSON,
    namespace: str,
    policy: RunPolicy,
    context: Context,
    admit: Callable[[ObjectMeta, int], bool | Ownership],
    depth: int = 0,
) -> Ownership:
    requester = context.requester
    if requester is None:
        return Ownership(False)
    kinds = policy.platform.owner_kinds.get(requester.username)
    if kinds is None:
        return Ownership(False)
    owner = _controller_owner(object_meta.get("ownerReferences"), kinds)
    if owner is None:
        references = object_meta.get("ownerReferences")
        if (
            depth == 0
            and requester.username in policy.platform.operators_by_user
            and not _has_controller(references)
        ):
            # No controller owner at all yet: the operator's own webhook may add it after
            # runguard's mutation (the spark-operator's makes the SparkApplication the
            # driver's owner). Undecided, so /mutate strips nothing that /validate, seeing
            # the whole chain, would keep; an owner of another kind decides (not ours).
            return Ownership(
                False,
                f"its operator {requester.username} named no owner of kind "
                f"{' or '.join(sorted(kinds))}",
            )
        return Ownership(False)
    kind, name, uid = owner
    state = context.state
    if state is None:
        return Ownership(False, f"no cluster state to find the owner {kind} {name} (uid {uid})")
    found = state.by_uid(uid)
    if found is None:
        if not state.synced(kind):
            return Ownership(False, f"runguard's cache has not synced {kind} objects yet")
        if getattr(state, "may_lag", False):
            # A controller (only they reach here) names an owner the watch has not
            # delivered yet: the replicaset-controller creates a new ReplicaSet's Pods
            # within milliseconds. Undecided: a retryable denial, never a silent strip;
            # an owner that never appears keeps failing closed.
            return Ownership(False, f"runguard's cache has no {kind} {name} (uid {uid}) yet")
        return Ownership(False)  # a complete state (a file) has no such owner: forged
    if found.kind != kind or found.namespace != namespace or found.name != name:
        return Ownership(False)  # a uid borrowed from another object proves nothing
    verdict = admit(found, depth)
    return verdict if isinstance(verdict, Ownership) else Ownership(verdict)


def _controller_owner(references: Any, kinds: frozenset[str]) -> tuple[str, str, str] | None:
    """The controller owner reference, when it is of one of ``kinds`` (GROUP/Kind)."""
    if not isinstance(references, list):
        return None
    names = {k.rpartition("/")[2] for k in kinds}
    for ref in references:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") in names
            and isinstance(ref.get("uid"), str)
        ):
            return ref["kind"], str(ref.get("name", "")), ref["uid"]
    return None


def _has_controller(references: Any) -> bool:
    """Some ownerReference, of any kind, is the object's controller."""
    return isinstance(references, list) and any(
        isinstance(ref, dict) and ref.get("controller") is True for ref in references
    )


# --- names the platform reserves -------------------------------------------------------


def reserved_patterns(policy: RunPolicy, kind: str) -> tuple[NamePattern, ...]:
    """The platform's name patterns for objects of ``kind``."""
    if kind == "PersistentVolumeClaim":
        return tuple(policy.volumes.platform_claims)
    if kind == "ConfigMap":
        return tuple(policy.volumes.platform_config_maps)
    if kind == "Secret":
        return tuple(policy.secrets.allowed)
    if kind == "ResourceClaim":
        return tuple(policy.resources.platform_device_claims)
    return ()


def reserved_name(policy: RunPolicy, kind: str, name: str) -> NamePattern | None:
    """The platform pattern ``name`` falls under, placeholders matching any value: a
    per-run name (a pattern naming a run's label) or an installation-wide one (the
    common credentials, a shared claim), which a user could otherwise take first. A
    shared ConfigMap (``volumes.sharedConfigMaps``) is nobody's."""
    if kind == "ConfigMap" and policy.volumes.shared_config_map(name):
        return None
    for pattern in reserved_patterns(policy, kind):
        if _any_labels(pattern.text).fullmatch(name):
            return pattern
    return None


@lru_cache(maxsize=1024)
def _any_labels(text: str) -> re.Pattern[str]:
    """The regex of a pattern whose placeholders stand for any (non-empty) label value."""
    literals, _ = split(text)
    return re.compile(
        ".+".join(".*".join(re.escape(c) for c in lit.split("*")) for lit in literals), re.DOTALL
    )


def platform_named(policy: RunPolicy, kind: str, name: str) -> bool:
    """Whether ``name`` is one the platform's patterns give objects of ``kind``, for any run
    (installation-wide names included: only runs the platform creates may use those).
    A shared ConfigMap (``volumes.sharedConfigMaps``) is nobody's."""
    if kind == "ConfigMap" and policy.volumes.shared_config_map(name):
        return False
    return any(_any_labels(p.text).fullmatch(name) for p in reserved_patterns(policy, kind))


SNAPSHOT_GROUP = "snapshot.storage.k8s.io"


TOKEN_SECRET_TYPE = "kubernetes.io/service-account-token"
TOKEN_ACCOUNT_ANNOTATION = "kubernetes.io/service-account.name"


def requested_by(policy: RunPolicy, object_meta: JSON, namespace: str, context: Context) -> bool:
    """The object was created by one of ``policy.requesters``: the request's user, or a
    controller (or operator) of ``policy.platform`` creating it for an owner, by uid, that
    this RunPolicy governs (which its requesters created)."""
    if is_identity(policy.requesters, context.requester):
        return True

    def governed(owner: ObjectMeta) -> bool:
        return owner.labels.get(POLICY_LABEL) == policy.name

    return created_through(object_meta, namespace, policy, context, governed).platform


def group_kind(obj: Any) -> str | None:
    """``GROUP/Kind`` of an object (``Kind`` in the core group), as operators name kinds."""
    if not isinstance(obj, dict):
        return None
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return None
    group = api_version.rpartition("/")[0]
    return f"{group}/{kind}" if group else kind


def is_operator_object(obj: Any, root: Policy) -> bool:
    """An object of a kind a platform operator owns Pods through (stamped at CREATE). A
    Pod (a Spark driver owning its executors) is a run of its own, not one of these."""
    key = group_kind(obj)
    return (
        key is not None
        and key != "Pod"
        and any(key in p.platform.operator_kinds for p in root.run_policies if enabled(p))
    )


def field_at(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


_NAMED_KINDS = frozenset({"PersistentVolumeClaim", "ConfigMap", "Secret", "ResourceClaim"})


def platform_references(spec: Any, policy: RunPolicy) -> list[tuple[str, str, str]]:
    """(kind, name, path) of every reference in a pod spec to an object with a platform
    name, through every door of ``webhook.engine.doors``, whatever the pod's labels (a
    pattern's placeholders stand for any value). Reads defensively: it also runs on pods
    outside the selector, which are not shape-checked."""
    return [
        (ref.door.kind, ref.name, doors.item_text(ref.item))
        for ref in doors.located(spec, _NAMED_KINDS)
        if platform_named(policy, ref.door.kind, ref.name)
    ]
