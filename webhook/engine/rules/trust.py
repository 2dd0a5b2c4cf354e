"""Trust over time: what runguard decided at CREATE holds for the object's whole life.

These checks judge the review, not only the pod spec: runguard's records as ``/mutate``
writes them, the scope kept on UPDATE, owners not rewritten, what the platform's objects
run kept the platform's, no debug container in a platform Pod but the platform's, no
platform ServiceAccount for anyone else's Pod. Each check is one function of the
``Review`` (with ``old`` on UPDATE) declared in ``TRUST_CHECKS``; a check that does not
concern the request (CREATE, another subresource) finds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.engine import scope
from webhook.engine.pod import spec_prefix
from webhook.engine.rule import Declarations
from webhook.engine.rules import dra, ownership, podclaims, reserved, runtime, stamp
from webhook.engine.rules.debug import check_debug_container
from webhook.engine.rules.growth import check_growth, check_size_record
from webhook.engine.rules.not_a_run import OWNERSHIP_UNKNOWN
from webhook.engine.rules.operator_objects import (
    check_operator_references,
    check_reserved_labels,
    created_by_platform,
    unknown_object,
)
from webhook.engine.rules.operators import plural
from webhook.engine.rules.queue import QUEUE_CHECKS, changed_message, queue_kept, queue_of
from webhook.engine.rules.reserved import OWNERSHIP_SERVICE_ACCOUNT
from webhook.engine.rules.scope import (
    SCOPE_LABELS,
    check_scope_annotations,
    check_scope_labels,
    scope_label_keys,
)
from webhook.engine.rules.stamp import OWNERSHIP_STAMP
from webhook.engine.scope import service_account
from webhook.engine.subject import Review, expected_records
from webhook.engine.types import Violation
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_CHANGED = RULES.rule(
    "ownership.changed",
    mutation="",
    violation=(
        "on UPDATE, what an object the platform created runs changed (a controller's pod "
        "template spec, a Pod's images, an operator's custom resource's spec or its scale "
        "subresource) by someone else than a platform identity, a controller or an operator"
    ),
)

TrustCheck = Callable[[Review], list[Violation]]


def check_records(r: Review) -> list[Violation]:
    """The records are what ``/mutate`` writes: at CREATE for the request's user (a
    forged stamp or record of a Pod that skipped ``/mutate`` is denied), on UPDATE the
    old object's. Unknown requester (offline without ``--as``): nothing to compare with."""
    if r.invalid or (r.old is None and r.context.requester is None):
        return []
    stamp, record, label = ownership.records(r.metadata)
    named = ownership.string_map(r.metadata, "annotations").get(PLATFORM_POLICY)
    now = {
        REQUESTED_BY: stamp,
        PLATFORM_RECORD: record,
        PLATFORM_POLICY: named,
        POLICY_LABEL: label,
    }
    out = []
    for key, expected in expected_records(r).items():
        if now[key] == expected:
            continue
        if _cache_caught_up(r, key, now[key], expected):
            out.append(
                Violation(
                    OWNERSHIP_UNKNOWN,
                    f"metadata.annotations[{key}]",
                    "runguard's cache learnt this Pod's owner between its two webhooks: "
                    "create it again (its controller retries)",
                )
            )
            continue
        rule = SCOPE_LABELS if key == POLICY_LABEL else OWNERSHIP_STAMP
        where = "labels" if key == POLICY_LABEL else "annotations"
        when = "at creation" if r.old is None else "and cannot change"
        out.append(
            Violation(
                rule,
                f"metadata.{where}[{key}]",
                f"{key} is written by runguard's mutating webhook {when}: "
                f"{now[key]!r} is not {expected!r} (was the webhook bypassed?)",
            )
        )
    return out


def _cache_caught_up(r: Review, key: str, now: str | None, expected: str | None) -> bool:
    """At CREATE, ``/mutate`` found no platform record through the object's owners and
    ``/validate`` does: the cache synced the owner in between. Claiming less than it may
    is never a forgery, but the object must not be stored without its record: a
    retryable ``ownership.unknown``, as when the owner is not synced at all."""
    return (
        r.old is None
        and key in (PLATFORM_RECORD, PLATFORM_POLICY)
        and now is None
        and expected is not None
        and bool(r.metadata.get("ownerReferences"))
    )


def check_policy_label_in_template(r: Review) -> list[Violation]:
    """A controller may not select or template Pods by runguard's RunPolicy label: the
    label is runguard's to write on each Pod, and a Pod it relabels would leave its
    controller's selector, which would create another, without end."""
    if r.target is None or r.target.kind == "Pod" or not isinstance(r.obj, dict):
        return []
    spec = r.obj.get("spec")
    selector = spec.get("selector") if isinstance(spec, dict) else None
    keys = set(r.target.labels)
    if isinstance(selector, dict):
        labels = selector.get("matchLabels")
        keys.update(labels if isinstance(labels, dict) else ())
        for expression in selector.get("matchExpressions") or ():
            if isinstance(expression, dict) and isinstance(expression.get("key"), str):
                keys.add(expression["key"])
    if POLICY_LABEL not in keys:
        return []
    return [
        Violation(
            SCOPE_LABELS,
            "spec.selector",
            f"{POLICY_LABEL} is runguard's label, written on each Pod: a controller may not "
            "select or template Pods by it; remove it",
        )
    ]


def check_platform_change(r: Review) -> list[Violation]:
    """``ownership.changed``: the platform's objects keep running what the platform asked.
    A user with edit rights may scale them, annotate them or restart a rollout, but not
    change a controller's pod template spec or a Pod's images: the Pods would run her code
    with the platform's secrets, recorded as the platform's."""
    if r.target is None and r.old is not None and ownership.is_operator_object(r.obj, r.root):
        return _operator_object_change(r)
    if r.old_target is None or r.target is None:
        return []
    owner = _platform_old(r)
    if owner is None:
        return []
    queue = queue_of(owner, r.context.requester)
    if r.target.kind == "Pod":
        if _images(r.old_target.spec) == _images(r.target.spec):
            return []
        what, where = "the images of a Pod", f"{r.target.spec_path}.containers"
    else:
        if r.old_target.spec == r.target.spec:
            return []
        if queue is not None and queue_kept(queue, r.old_target.spec, r.target.spec):
            return []
        what, where = f"the pod template of a {r.target.kind}", r.target.spec_path
    return [
        Violation(
            OWNERSHIP_CHANGED,
            where,
            f"{what} the platform created is the platform's to change: its Pods run with the "
            "platform's secrets and volumes; ask the platform, or create your own"
            + changed_message(queue, r.context.requester),
        )
    ]


def _operator_object_change(r: Review) -> list[Violation]:
    """An operator's custom resource is its Pods' template (a Workflow's steps, an
    MPIJob's replica specs): its ``spec`` is the platform's to change, or its operator's,
    once the platform created it."""
    old_spec = r.old.get("spec") if isinstance(r.old, dict) else None
    new_spec = r.obj.get("spec") if isinstance(r.obj, dict) else None
    owner = None if old_spec == new_spec else _platform_old(r)
    if owner is None:
        return []
    queue = queue_of(owner, r.context.requester)
    if queue is not None and queue_kept(queue, old_spec, new_spec):
        return []
    kind = r.obj.get("kind") if isinstance(r.obj, dict) else None
    return [
        Violation(
            OWNERSHIP_CHANGED,
            "spec",
            f"the spec of a {kind} the platform created is the platform's to change: its "
            "operator runs its Pods with the platform's secrets and volumes; ask the "
            "platform, or create your own" + changed_message(queue, r.context.requester),
        )
    ]


def _platform_old(r: Review) -> RunPolicy | None:
    """The RunPolicy whose platform, by its record, created the old object (the one that
    wrote the record, ``scope.recorder`` of the stored object: the RunPolicy the record
    names), unless the request comes from that platform, one of its installers or its
    controllers (they may change what the platform's objects run); None otherwise.
    Another platform is anyone else."""
    old_spec = r.old_target.spec if r.old_target is not None else None
    owner = scope.recorder(r.root, r.old, old_spec, r.namespace, r.governing, stored=True)
    if owner is None:
        return None
    annotations = ownership.string_map(r.old_metadata, "annotations")
    installed = annotations.get(PLATFORM_RECORD) == ownership.INSTALLER
    if not (installed or ownership.recorded_platform(owner, annotations, r.root)):
        return None
    requester = r.context.requester
    if ownership.is_platform_or_installer(owner, requester):
        return None
    if requester is not None and requester.username in owner.platform.owner_kinds:
        return None
    return owner


def _images(spec: Any) -> list[Any]:
    return [
        [c.get("image") for c in spec.get(name) or () if isinstance(c, dict)]
        for name in ("initContainers", "containers")
    ]


def check_scope(r: Review) -> list[Violation]:
    """``scope.labels`` when an UPDATE changes a label that decides whether and how an
    object is governed (any RunPolicy's selector keys, profile label and pattern labels),
    for a Pod's labels and for a controller's template labels alike."""
    if r.old_target is None:
        return []
    labels = r.target.labels if r.target is not None else {}
    if r.governing is None:
        # A RunPolicy its new labels select and its old ones did not: the labels it had
        # were judged at CREATE (a RunPolicy whose requesters did not create it, too).
        old = r.old_target.labels
        entering = next(
            (
                p
                for p in r.root.run_policies
                if scope.selects(p, labels, r.namespace) and not scope.selects(p, old, r.namespace)
            ),
            None,
        )
        if entering is None:
            return []
        return [
            Violation(
                SCOPE_LABELS,
                spec_prefix(r.old_target.spec_path) + "metadata.labels",
                f"these labels make it a run of RunPolicy {entering.name}: an existing object "
                "cannot become a run by an update; create it anew",
            )
        ]
    keys: list[str] = []
    for p in r.root.run_policies:
        keys.extend(scope_label_keys(p))
    return check_scope_labels(
        r.old_target.labels,
        labels,
        list(dict.fromkeys(keys)),
        spec_prefix(r.old_target.spec_path) + "metadata",
    )


def check_owners(r: Review) -> list[Violation]:
    """``ownership.owner-changed``: owners of a stamped object are not rewritten."""
    if r.old is None:
        return []
    return stamp.check_owner_change(r.metadata, r.old_metadata or {}, r.root, r.context)


def check_service_account(r: Review) -> list[Violation]:
    """``ownership.service-account``: only the platform's own objects run as its accounts."""
    if r.target is None or (r.old is not None and r.old_target is not None):
        return []  # a Pod's service account never changes after CREATE
    name = service_account(r.target.spec)
    if not name:
        return []
    for p in scope.platforms(r.root, r.namespace):
        if (r.namespace, name) not in ownership.service_account_identities(p):
            continue
        # the platform, its installers (the chart), or their controllers
        if ownership.creator_record(r.metadata, r.namespace, p, r.context, r.root) is not None:
            return []
        return [
            Violation(
                OWNERSHIP_SERVICE_ACCOUNT,
                f"{r.target.spec_path}.serviceAccountName",
                f"ServiceAccount {name!r} is the platform's own identity: only objects the "
                "platform creates run as it",
            )
        ]
    return []


def check_profile_annotation(r: Review) -> list[Violation]:
    """``scope.labels`` when an UPDATE of a governed object changes the profile annotation
    (``profiles.label`` written as an annotation, read when the label is absent): the
    platform's Deployment would get another profile for its next Pods, as by the label."""
    if r.old_target is None or r.governing is None:
        return []
    annotations = r.target.annotations if r.target is not None else {}
    keys = [p.profiles_config.label for p in r.root.run_policies]
    return check_scope_annotations(
        r.old_target.annotations,
        annotations,
        keys,
        spec_prefix(r.old_target.spec_path) + "metadata",
    )


def check_operator_scale(r: Review) -> list[Violation]:
    """``ownership.changed`` through the ``scale`` subresource of an operator's kind
    (``kubectl scale model``): the request's object is a Scale, which carries only the
    name and the replicas, so the object it scales is read from the cluster state. One
    the platform created is the platform's and its operator's to scale, as its spec is
    theirs to change (a controller or operator may too, as on the object itself)."""
    if r.context.subresource != "scale" or r.old is None or not isinstance(r.obj, dict):
        return []
    if _replicas(r.obj) == _replicas(r.old):
        return []
    group, _, resource = r.context.resource.rpartition("/")
    requester = r.context.requester
    out: list[Violation] = []
    # Every platform declaring the kind judges it: exempt only within its own platform
    # (another platform's Model is not this platform's to scale).
    for p in r.root.run_policies:
        kind = next(
            (
                k
                for k in (p.platform.operator_kinds if ownership.enabled(p) else ())
                if k.rpartition("/")[0] == group and plural(k.rpartition("/")[2]) == resource
            ),
            None,
        )
        if kind is None:
            continue
        if ownership.is_platform_or_installer(p, requester) or (
            requester is not None and requester.username in p.platform.owner_kinds
        ):
            continue
        out.extend(
            v for v in _scales_platform_object(p, kind.rpartition("/")[2], r) if v not in out
        )
    return out


def _replicas(scale: Any) -> Any:
    spec = scale.get("spec") if isinstance(scale, dict) else None
    return spec.get("replicas") if isinstance(spec, dict) else None


def _scales_platform_object(p: RunPolicy, kind: str, r: Review) -> list[Violation]:
    name = r.metadata.get("name")
    what = f"the {kind} {name!r} this scales"
    state = r.context.state
    if state is None or not state.synced(kind):
        return [unknown_object(state, kind, "spec.replicas", what)]
    found = state.get(kind, r.namespace, name) if isinstance(name, str) else None
    if found is None and getattr(state, "may_lag", False):
        lacking = f"runguard's cache has no {kind} {name!r} yet"
        return [unknown_object(state, kind, "spec.replicas", what, lacking)]
    if found is None or not created_by_platform(p, found.annotations, r.root):
        return []
    return [
        Violation(
            OWNERSHIP_CHANGED,
            "spec.replicas",
            f"the {kind} {name!r} was created by the platform: scaling it is the platform's "
            "and its operator's; ask the platform, or create your own",
        )
    ]


# Every trust check, whatever the object's own rules say; adding one is a line here.
TRUST_CHECKS: tuple[TrustCheck, ...] = (
    check_records,
    check_policy_label_in_template,
    check_platform_change,
    check_scope,
    check_owners,
    check_debug_container,
    check_service_account,
    check_reserved_labels,
    check_profile_annotation,
    check_operator_references,
    check_operator_scale,
    *QUEUE_CHECKS,
    check_growth,
    check_size_record,
    runtime.check_exec_time_kept,
)


# Checks of any object under review (a Pod, a claim, a Secret, a snapshot...) before it
# is located as a run: what only the platform may create. Any violation denies at once.
OBJECT_CHECKS: tuple[TrustCheck, ...] = (
    lambda r: reserved.check_reserved_name(r.obj, r.root, r.context),
    lambda r: reserved.check_claim_clones(r.obj, r.root, r.context),
    lambda r: reserved.check_claim_snapshots(r.obj, r.root, r.context),
    lambda r: reserved.check_token_secret(r.obj, r.root, r.namespace, r.old, r.context),
    lambda r: podclaims.check_pod_claim_clones(r.obj, r.root, r.context, r.namespace),
    lambda r: podclaims.check_pod_claim_snapshots(r.obj, r.root, r.context, r.namespace),
    lambda r: dra.check_claim_devices(r.obj, r.root, r.context, r.namespace),
)


def run_object_checks(r: Review) -> list[Violation]:
    """Every violation of ``OBJECT_CHECKS`` (none for an object that is no mapping)."""
    if not isinstance(r.obj, dict):
        return []
    return [v for check in OBJECT_CHECKS for v in check(r)]


def run_trust_checks(r: Review) -> list[Violation]:
    """Every trust violation of the review, from every check."""
    out: list[Violation] = []
    for check in TRUST_CHECKS:
        out.extend(check(r))
    return out
