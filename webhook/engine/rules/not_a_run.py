"""``ownership.not-a-run``: the platform's objects, used by a pod the platform did not
create.

Every reference of a pod spec to an object with a platform name, through every door of
``webhook.engine.doors`` (``platform_references``): a pod outside every selector may not
use them (``kubectl debug --copy-to`` of a run drops its labels), and a run the platform
did not create may not read a platform configMap into its environment (its volumes and
secrets are stripped or denied by their own rules). When the owner's record is not in
runguard's cache yet, the answer is ``ownership.unknown`` (fail closed, retryable).
"""

from __future__ import annotations

from typing import Any

from webhook.engine.context import Ownership
from webhook.engine.pod import spec_prefix
from webhook.engine.rule import Declarations
from webhook.engine.rules.ownership import enabled, field_at, platform_references
from webhook.engine.rules.volumes import project_claim
from webhook.engine.types import Violation
from webhook.policy.model import RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_NOT_A_RUN = RULES.rule(
    "ownership.not-a-run",
    mutation="",
    violation=(
        "a pod outside every selector using the platform's objects through any door (volumes of "
        "every type and their secret references, claim templates' data sources, env, envFrom, "
        "projected sources, imagePullSecrets), not created by the platform (`kubectl debug "
        "--copy-to`); a pod, or a new claim, not created by the platform naming a claim whose "
        "controller owner is a Pod (an ephemeral volume's PersistentVolumeClaim, a "
        "ResourceClaim made from a Pod's template: that Pod's alone) by `claimName`, a data "
        "source or `resourceClaimName`; a platform configMap read into the environment of a "
        "run the platform did not create; a PVC cloning, or a VolumeSnapshot of, a "
        "platform-named claim by someone else than the platform"
    ),
)


OWNERSHIP_UNKNOWN = RULES.rule(
    "ownership.unknown",
    mutation="",
    violation=(
        "a decision needs an object the cluster cache has not synced (fails closed, naming it)"
    ),
)


def check_not_a_run(
    spec: Any, spec_path: str, ownership: Ownership, policy: RunPolicy
) -> list[Violation]:
    """``ownership.not-a-run``: a pod outside every selector may not use the platform's
    objects (``kubectl debug --copy-to`` of a run drops its labels), unless the platform
    created it."""
    if not enabled(policy) or ownership.platform:
        return []
    prefix = spec_prefix(spec_path)
    if ownership.unknown:  # the owner's record is not in the cache yet: retryable
        if not platform_references(spec, policy):
            return []
        return [
            Violation(
                OWNERSHIP_UNKNOWN,
                "metadata.ownerReferences",
                f"{ownership.unknown}: runguard cannot tell whether the platform created "
                "this Pod, which uses the platform's objects; retry in a moment",
            )
        ]
    return [
        Violation(
            OWNERSHIP_NOT_A_RUN,
            f"{prefix}{path}",
            f"{kind} {name!r} is the platform's and this is not a platform run "
            "(a copy of a run without its labels?): only runs the platform creates may use it",
        )
        for kind, name, path in platform_references(spec, policy)
    ]


def check_ownership(pod: Any) -> list[Violation]:
    """``ownership.unknown``: the decision needs an object runguard's cache lacks (fail closed)."""
    if not enabled(pod.policy):
        return []
    out: list[Violation] = []
    if pod.ownership.unknown and platform_references(pod.spec, pod.policy):
        out.append(
            Violation(
                OWNERSHIP_UNKNOWN,
                f"{pod.meta_path}.ownerReferences",
                f"{pod.ownership.unknown}: runguard cannot tell whether the platform created "
                "this run, which uses the platform's objects; retry in a moment",
            )
        )
    if not pod.ownership.platform and not pod.ownership.unknown:
        # Volumes and secrets are stripped or denied by their own rules; a platform
        # configMap read into the environment is this rule's.
        prefix = spec_prefix(pod.spec_path)
        for kind, name, path in platform_references(pod.spec, pod.policy):
            if kind == "ConfigMap" and (".env[" in path or ".envFrom[" in path):
                out.append(
                    Violation(
                        OWNERSHIP_NOT_A_RUN,
                        f"{prefix}{path}",
                        f"ConfigMap {name!r} is the platform's and the platform did not "
                        "create this run: only its runs may read it",
                    )
                )
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        claim = field_at(volume, "persistentVolumeClaim", "claimName")
        if isinstance(claim, str) and project_claim(pod, claim) is None:
            out.append(
                Violation(
                    OWNERSHIP_UNKNOWN,
                    f"{pod.spec_path}.volumes[{i}]",
                    f"runguard's cache has not synced claims yet: cannot tell whether pvc "
                    f"{claim!r} is shared with this run's project; retry in a moment",
                )
            )
    return out
