"""What a review is about, worked out once: the object and the old one located, the
RunPolicy that governs it, who asks, whether the platform created it, and the records
runguard keeps on it.

``mutate`` and ``validate`` build one ``Review`` per request; every step and check that
needs more than the pod spec (the trust checks of ``rules/trust.py``, the records) reads
it from there instead of locating the object again, and the ``Pod`` the steps and checks
judge is made from it (``Review.pod``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook.engine import scope
from webhook.engine.context import Context, Ownership
from webhook.engine.pod import Pod
from webhook.engine.podspec import InvalidObject, Target, locate, object_meta
from webhook.engine.rules import ownership
from webhook.engine.scope import service_account as service_account  # (webhook.serving.shells')
from webhook.engine.types import JSON, Violation
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Policy, RunPolicy


@dataclass
class Review:
    """One review: the pod template of the object and of the old one, the RunPolicy that
    governs it (fixed at CREATE and recorded on the object) and who asks."""

    root: Policy  # every RunPolicy (``root.run_policies``)
    obj: Any
    old: Any
    namespace: str
    context: Context
    target: Target | None = None
    invalid: list[Violation] = field(default_factory=list)  # the object cannot be located
    old_target: Target | None = None
    governing: RunPolicy | None = None  # None: outside every RunPolicy
    # whether the platform created the object, by each RunPolicy's platform asked so far
    _ownerships: list[tuple[RunPolicy, Ownership]] = field(default_factory=list, repr=False)

    @property
    def policy(self) -> RunPolicy:
        """The governing RunPolicy, else the first: whose enforcement mode answers for an
        object outside every RunPolicy. Which RunPolicies judge such an object is
        ``webhook.engine.scope``'s, each by its own scope."""
        return self.governing or self.root.first

    @property
    def metadata(self) -> JSON:
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        return meta if isinstance(meta, dict) else {}

    @property
    def old_metadata(self) -> JSON | None:
        if not isinstance(self.old, dict):
            return None
        meta = self.old.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def owner_references(self) -> tuple[Any, ...]:
        refs = self.metadata.get("ownerReferences")
        return tuple(refs) if isinstance(refs, list) else ()

    def ownership(self, policy: RunPolicy) -> Ownership:
        """Whether the platform of ``policy`` created the object (worked out once each)."""
        for asked, found in self._ownerships:
            if asked is policy:
                return found
        found = ownership.ownership_of(
            self.metadata, self.namespace, policy, self.context, self.old_metadata, self.root
        )
        self._ownerships.append((policy, found))
        return found

    def pod(self, target: Target, policy: RunPolicy, spec: JSON) -> Pod:
        """The ``Pod`` the steps and checks judge: ``target`` (the object's run, or the
        old one's) with the pod spec ``spec``, by ``policy``, where the object lives,
        who asks and whether the platform created it."""
        return Pod(
            spec,
            target.labels,
            target.annotations,
            policy,
            target.spec_path,
            target.claim_templates,
            self.namespace,
            self.context,
            self.ownership(policy),
            self.owner_references,
            self.root,
        )


def review(
    obj: Any,
    root: Policy,
    namespace: str | None,
    old: Any,
    context: Context,
    governing: RunPolicy | None = None,
) -> Review:
    """The review of ``obj`` (and ``old`` on UPDATE) under the RunPolicies of ``root``."""
    ns = namespace or object_meta(obj)[1]
    r = Review(root, obj, old if isinstance(old, dict) else None, ns, context)
    try:
        r.target = locate(obj)
    except InvalidObject as exc:
        r.invalid = exc.violations
    if r.old is not None:
        try:
            r.old_target = locate(r.old)
        except InvalidObject:
            r.old_target = None
    r.governing = governing or _governing(r)
    return r


def _governing(r: Review) -> RunPolicy | None:
    """The RunPolicy that governs the object. On UPDATE, the one recorded at CREATE
    (label ``runguard.io/policy`` of the old object), whatever the labels say now; for an
    object from before that label, the one its old labels chose. At CREATE, the first
    whose selector matches and whose ``requesters`` created it."""
    if r.old is not None:
        recorded = ownership.records(r.old_metadata or {})[2]
        named = r.root.named(recorded) if recorded else None
        if named is not None:
            return named if scope.covers(named, r.namespace) else None
        if r.old_target is None:
            return None
        # From before the label: its labels choose, and a RunPolicy with requesters only
        # when the stamp names one of them (a lax policy is never assumed).
        stamp = ownership.records(r.old_metadata or {})[0]
        return scope.choose(
            r.root,
            r.old_target.labels,
            r.namespace,
            lambda p: ownership.stamped_by(p.requesters, stamp),
        )
    if r.target is None:
        return None
    return scope.choose(
        r.root,
        r.target.labels,
        r.namespace,
        lambda p: ownership.requested_by(p, r.metadata, r.namespace, r.context),
    )


def names_platform_objects(r: Review) -> bool:
    """The pod spec names the objects of a platform that looks at the namespace, or runs
    as one of its ServiceAccounts."""
    return r.target is not None and bool(scope.claimed_by(r.root, r.target.spec, r.namespace))


def stamps_owner(r: Review) -> RunPolicy | None:
    """The RunPolicy whose ``platform`` records who created the object, when runguard
    records it (``scope.recorder``): a governed object, an operator's object, or one
    naming the platform's objects or carrying runguard's records (which only runguard
    may write), each by the RunPolicies that look at its namespace. A user's own
    operator object is not recorded (``_records_operator_object``): its updates then
    never wait on runguard. On UPDATE of an object with a platform record, the RunPolicy
    whose platform wrote it (``scope.recorder`` of the stored object)."""
    if r.old is not None and ownership.records(r.old_metadata or {})[1] is not None:
        old_spec = r.old_target.spec if r.old_target is not None else None
        return scope.recorder(r.root, r.old, old_spec, r.namespace, r.governing, stored=True)
    spec = r.target.spec if r.target is not None else None
    policy = scope.recorder(r.root, r.obj, spec, r.namespace, r.governing)
    if policy is None or r.governing is not None:
        return policy
    if not ownership.is_operator_object(r.obj, r.root) or _records_operator_object(r, policy):
        return policy
    if any(ownership.records(r.metadata)[:2]) or names_platform_objects(r):
        return policy
    return None


def _records_operator_object(r: Review, policy: RunPolicy) -> bool:
    """An operator's object is recorded when the platform (or an installer) creates it,
    or while who did cannot be told yet (its owner not in the cache: the record of an
    operator's object then follows its owner later); never a user's own, whose updates
    then never wait on runguard (the operators' webhooks route only what carries records).
    On UPDATE: as before (only the platform adopts)."""
    if r.old is not None:
        return True
    if ownership.creator_record(r.metadata, r.namespace, policy, r.context, r.root) is not None:
        return True
    found = ownership.ownership_of(r.metadata, r.namespace, policy, r.context, root=r.root)
    return found.unknown is not None


def adopts(r: Review) -> RunPolicy | None:
    """The RunPolicy whose platform records an object that runguard never recorded (made
    before runguard was installed) and that the platform or one of its installers now
    updates (``kubectl rollout restart``, ``helm upgrade``): runguard records it then, as
    theirs. They vouch for it, as they could create it anew; its next ReplicaSet and
    Pods follow it. Anyone else's update records nothing."""
    if r.old is None or r.context.requester is None:
        return None
    if any(ownership.records(r.old_metadata or {})[:2]):
        return None
    owner = stamps_owner(r)
    if owner is None or not ownership.is_platform_or_installer(owner, r.context.requester):
        return None
    return owner


def expected_records(r: Review) -> dict[str, str | None]:
    """What runguard writes on the object: at CREATE, the stamp, the platform record with
    the RunPolicy whose platform wrote it, and the governing RunPolicy (None: the key is
    removed); on UPDATE, what the old object has."""
    if r.old is not None:
        stamp, record, label = ownership.records(r.old_metadata or {})
        named = ownership.string_map(r.old_metadata, "annotations").get(PLATFORM_POLICY)
        kept: dict[str, str | None] = {REQUESTED_BY: stamp, PLATFORM_RECORD: record}
        kept[PLATFORM_POLICY] = named
        adopter = adopts(r)
        if adopter is not None and r.context.requester is not None:
            creator = ownership.creator_record(r.metadata, r.namespace, adopter, r.context, r.root)
            who = r.context.requester.username
            kept = {REQUESTED_BY: who, **_platform_records(adopter, creator)}
        sent = ownership.records(r.metadata)[2]
        if label is None or _ours(r.root, label) or _ours(r.root, sent):
            kept[POLICY_LABEL] = label
        # (else another installation's name, inert: left as the update sends it, unless
        # it sends one of ours, which no update may write)
        return kept
    label = ownership.records(r.metadata)[2]
    if r.governing is not None and r.target is not None:
        label = r.governing.name
    elif _ours(r.root, label):
        label = None  # one of ours on an object none of ours governs: forged
    # (a name none of our RunPolicies has is inert: another installation's, or a renamed
    # policy's; UPDATEs of such an object are judged by its labels, as at CREATE)
    out: dict[str, str | None] = {POLICY_LABEL: label}
    owner = stamps_owner(r)
    if owner is not None and r.context.requester is not None:
        out[REQUESTED_BY] = r.context.requester.username
        creator = ownership.creator_record(r.metadata, r.namespace, owner, r.context, r.root)
        out.update(_platform_records(owner, creator))
    elif owner is not None:
        out.update(_platform_records(owner, None))  # nobody known asks: never the platform
    return out


def _platform_records(owner: RunPolicy, record: str | None) -> dict[str, str | None]:
    """The platform record and, with it, the RunPolicy whose platform wrote it (read back
    by ``scope.recorder``: with two platforms, whose record it is)."""
    return {PLATFORM_RECORD: record, PLATFORM_POLICY: owner.name if record is not None else None}


def _ours(root: Policy, label: str | None) -> bool:
    return label is not None and root.named(label) is not None


def in_scope(r: Review) -> bool:
    """Whether runguard governed the old object: a run, or one naming the objects of a
    platform that looks at the namespace or running as one of its accounts."""
    if r.old_target is None:
        return False
    if r.governing is not None:
        return True
    return bool(scope.claimed_by(r.root, r.old_target.spec, r.namespace))
