"""What only the platform may create: objects with its names, copies of its claims,
tokens of its accounts.

Checks of any object under review before it is located as a run (``trust.OBJECT_CHECKS``
lists them; any violation denies at once): a PVC, Secret, ConfigMap or ResourceClaim
with a name the platform reserves (``ownership.reserved-name``); a claim cloning a
platform-named claim and a VolumeSnapshot of one (``ownership.not-a-run``); a Secret of
type ``kubernetes.io/service-account-token`` for one of the platform's accounts
(``ownership.service-account``). Who the platform is, and its names, are
``ownership``'s.
"""

from __future__ import annotations

from typing import Any

from webhook.engine.context import Context
from webhook.engine.rule import Declarations
from webhook.engine.rules.not_a_run import OWNERSHIP_NOT_A_RUN
from webhook.engine.rules.ownership import (
    SNAPSHOT_GROUP,
    TOKEN_ACCOUNT_ANNOTATION,
    TOKEN_SECRET_TYPE,
    enabled,
    field_at,
    is_identity,
    is_platform_identity,
    is_platform_or_installer,
    platform_named,
    reserved_name,
    service_account_identities,
    string_map,
)
from webhook.engine.types import JSON, Violation
from webhook.policy.model import Policy, RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_RESERVED_NAME = RULES.rule(
    "ownership.reserved-name",
    mutation="",
    violation=(
        "a PVC, Secret, ConfigMap or ResourceClaim created with a platform name (per run, or "
        "installation-wide) "
        "by someone else than the platform (or, for an installation-wide name, "
        "`platform.installers`)"
    ),
)
OWNERSHIP_SERVICE_ACCOUNT = RULES.rule(
    "ownership.service-account",
    mutation="",
    violation=(
        "a Pod not created by the platform running as a ServiceAccount that is a platform identity"
        "; a Secret of type `kubernetes.io/service-account-token` for such a ServiceAccount (or "
        "an operator's) created, or updated to name it, by someone else than the platform or "
        "`platform.installers`"
    ),
)


def check_reserved_name(obj: JSON, root: Policy, context: Context) -> list[Violation]:
    """``ownership.reserved-name``: only the platform creates objects with its names (of
    any RunPolicy); an installation-wide name also ``platform.installers`` (its chart)."""
    if context.operation != "CREATE":
        return []
    kind, metadata = obj.get("kind"), obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(kind, str) or not isinstance(name, str):
        return []
    for policy in root.run_policies:
        if not enabled(policy):
            continue
        pattern = reserved_name(policy, kind, name)
        if pattern is None or is_platform_identity(policy, context.requester):
            continue
        if not pattern.label_keys and is_identity(policy.platform.installers, context.requester):
            continue
        return [
            Violation(
                OWNERSHIP_RESERVED_NAME,
                "metadata.name",
                f"{kind} name {name!r} is reserved for the platform (pattern {pattern.text!r}): "
                "choose another name",
            )
        ]
    return []


def cloned_claims(claim_spec: Any, policy: RunPolicy) -> list[str]:
    """The platform claims a claim spec clones (``dataSource`` / ``dataSourceRef`` naming a
    PersistentVolumeClaim with a platform name): the same door as a generic ephemeral
    volume's, on a PVC of its own or a StatefulSet's claim template."""
    if not isinstance(claim_spec, dict):
        return []
    out = []
    for key in ("dataSource", "dataSourceRef"):
        source = claim_spec.get(key)
        if isinstance(source, dict) and source.get("kind") == "PersistentVolumeClaim":
            name = source.get("name")
            if isinstance(name, str) and platform_named(policy, "PersistentVolumeClaim", name):
                out.append(name)
    return out


def claim_specs(obj: JSON, context: Context) -> list[tuple[str, Any]]:
    """(path, claim spec) of what a CREATE of a PVC or a StatefulSet makes claims from."""
    if context.operation != "CREATE" or obj.get("kind") not in ("PersistentVolumeClaim",
                                                                "StatefulSet"):  # fmt: skip
        return []
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return []
    if obj["kind"] == "PersistentVolumeClaim":
        return [("spec", spec)]
    templates = spec.get("volumeClaimTemplates")
    return [
        (f"spec.volumeClaimTemplates[{i}].spec", t.get("spec"))
        for i, t in enumerate(templates if isinstance(templates, list) else ())
        if isinstance(t, dict)
    ]


def check_claim_clones(obj: JSON, root: Policy, context: Context) -> list[Violation]:
    """``ownership.not-a-run``: only the platform clones its claims, through a PVC of its
    own (``dataSource``/``dataSourceRef``) or a StatefulSet's ``volumeClaimTemplates``."""
    specs = claim_specs(obj, context)
    if not specs:
        return []
    out: list[Violation] = []
    for policy in root.run_policies:
        if not enabled(policy) or is_platform_identity(policy, context.requester):
            continue
        for path, claim_spec in specs:
            out.extend(
                Violation(
                    OWNERSHIP_NOT_A_RUN,
                    path,
                    f"PersistentVolumeClaim {name!r} is the platform's: only the platform "
                    "may clone it into a new claim",
                )
                for name in cloned_claims(claim_spec, policy)
            )
        if out:
            break
    return out


def snapshot_source(obj: Any) -> str | None:
    """The PVC a VolumeSnapshot (``snapshot.storage.k8s.io``) is taken of, if named."""
    if not isinstance(obj, dict) or obj.get("kind") != "VolumeSnapshot":
        return None
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or not api_version.startswith(SNAPSHOT_GROUP + "/"):
        return None
    name = field_at(obj, "spec", "source", "persistentVolumeClaimName")
    return name if isinstance(name, str) else None


def check_claim_snapshots(obj: JSON, root: Policy, context: Context) -> list[Violation]:
    """``ownership.not-a-run``: only the platform snapshots its claims (a VolumeSnapshot
    of a platform-named PVC, which a claim of hers could be restored from)."""
    name = snapshot_source(obj)
    if context.operation != "CREATE" or name is None:
        return []
    for policy in root.run_policies:
        if not enabled(policy) or is_platform_identity(policy, context.requester):
            continue
        if platform_named(policy, "PersistentVolumeClaim", name):
            return [
                Violation(
                    OWNERSHIP_NOT_A_RUN,
                    "spec.source.persistentVolumeClaimName",
                    f"PersistentVolumeClaim {name!r} is the platform's: only the platform "
                    "may snapshot it",
                )
            ]
    return []


def token_account(obj: Any) -> str | None:
    """The ServiceAccount a Secret of type ``kubernetes.io/service-account-token`` is for
    (the token controller writes that account's token into it), if any."""
    if not isinstance(obj, dict) or obj.get("kind") != "Secret":
        return None
    if obj.get("type") != TOKEN_SECRET_TYPE:
        return None
    name = string_map(obj.get("metadata"), "annotations").get(TOKEN_ACCOUNT_ANNOTATION)
    return name if isinstance(name, str) and name else None


def check_token_secret(
    obj: JSON, root: Policy, namespace: str, old: Any, context: Context
) -> list[Violation]:
    """``ownership.service-account``: only the platform (or ``platform.installers``)
    makes a token Secret for one of its ServiceAccounts or its operators': whoever
    mounts it is that account. An UPDATE is judged only when it newly names the
    account, so the token controller filling in the platform's own Secret is not."""
    name = token_account(obj)
    if name is None or (old is not None and token_account(old) == name):
        return []
    for policy in root.run_policies:
        if not enabled(policy) or (namespace, name) not in service_account_identities(policy):
            continue
        if is_platform_or_installer(policy, context.requester):
            continue
        return [
            Violation(
                OWNERSHIP_SERVICE_ACCOUNT,
                f"metadata.annotations[{TOKEN_ACCOUNT_ANNOTATION}]",
                f"ServiceAccount {name!r} is the platform's own identity: only the platform "
                "may make a token Secret for it",
            )
        ]
    return []
