"""``ownership.stamp`` and ``ownership.owner-changed``: what runguard recorded at an
object's CREATE holds for its whole life.

The stamp (``runguard.io/requested-by``) never changes on UPDATE, and an object cannot
enter the platform's scope by an update (its stamp, written when runguard did not see
it, is not runguard's); the ``ownerReferences`` of a stamped object may only lose
entries, or be written by a platform identity or a controller. What the records are,
and who the platform is, are ``ownership``'s; the records' values at CREATE are checked
by ``trust.check_records``.
"""

from __future__ import annotations

from webhook.engine.context import Context
from webhook.engine.rule import Declarations
from webhook.engine.rules.ownership import enabled, is_platform_identity, string_map
from webhook.engine.types import JSON, Violation
from webhook.keys import REQUESTED_BY
from webhook.policy.model import Policy, RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_STAMP = RULES.rule(
    "ownership.stamp",
    mutation=(
        "at CREATE: `runguard.io/requested-by` (the user), `runguard.io/platform` (whether the "
        "platform created it, directly or through its controllers) with "
        "`runguard.io/platform-policy` (the RunPolicy whose platform that is) and the label "
        "`runguard.io/policy` (its RunPolicy) written, anything sent overwritten; on UPDATE: put "
        "back as they were"
    ),
    violation=(
        "at CREATE, records that are not what `/mutate` writes (a Pod that skipped it); on "
        "UPDATE, records changed; an object entering the platform's scope by an update"
    ),
)


OWNERSHIP_OWNER_CHANGED = RULES.rule(
    "ownership.owner-changed",
    mutation="",
    violation=(
        "on UPDATE, `ownerReferences` of an object runguard stamped rewritten or added by someone"
        " else than a platform identity or a controller (removing one, the garbage collector "
        "orphaning, is allowed)"
    ),
)


def check_owner_change(
    new_meta: JSON, old_meta: JSON, root: Policy, context: Context
) -> list[Violation]:
    """``ownership.owner-changed``: the ownerReferences of an object runguard stamped may
    only lose entries (the garbage collector orphaning it), or be written by a platform
    identity or a controller (adoption, release); adoption grants nothing, since what the
    object may use was recorded at its CREATE."""
    if REQUESTED_BY not in string_map(old_meta, "annotations"):
        return []
    before = old_meta.get("ownerReferences") or []
    after = new_meta.get("ownerReferences") or []
    if not isinstance(after, list) or not isinstance(before, list):
        return []
    if all(ref in before for ref in after):
        return []
    for policy in root.run_policies:
        if is_platform_identity(policy, context.requester):
            return []
        requester = context.requester
        if requester is not None and requester.username in policy.platform.owner_kinds:
            return []
    return [
        Violation(
            OWNERSHIP_OWNER_CHANGED,
            "metadata.ownerReferences",
            "the owners of an object runguard admitted are the controllers' and the "
            "platform's to write: only removing one is allowed",
        )
    ]


def check_stamp(
    new_meta: JSON,
    old_meta: JSON,
    in_scope_before: bool,
    policy: RunPolicy,
    context: Context,
    adopted: bool = False,
) -> list[Violation]:
    """On UPDATE: the stamp never changes, and an object cannot enter the platform's scope
    by an update (its stamp, written when runguard did not see it, is not runguard's).
    ``adopted``: runguard records the object now (``subject.adopts``), with the stamp of
    the requester."""
    if not enabled(policy) or context.operation != "UPDATE":
        return []
    before = string_map(old_meta, "annotations").get(REQUESTED_BY)
    after = string_map(new_meta, "annotations").get(REQUESTED_BY)
    out: list[Violation] = []
    requester = context.requester
    stamped_now = adopted and requester is not None and after == requester.username
    if before != after and not stamped_now:
        out.append(
            Violation(
                OWNERSHIP_STAMP,
                f"metadata.annotations[{REQUESTED_BY}]",
                f"the stamp {REQUESTED_BY} is written by runguard at creation and cannot change",
            )
        )
    if not in_scope_before and not is_platform_identity(policy, context.requester):
        out.append(
            Violation(
                OWNERSHIP_STAMP,
                "metadata",
                "an existing object cannot become a run or use the platform's objects by an "
                "update: create it anew",
            )
        )
    return out
