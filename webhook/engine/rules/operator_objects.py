"""An operator's custom resources, which only the platform and the operator may point
at the platform's objects.

An operator acts on what its custom resources say: a label it keys on to find an
object's owner (``ownership.reserved-label``: the spark-operator's
``sparkoperator.k8s.io/app-name``) or a field naming the object to act on
(``ownership.reference``: a RayJob's ``spec.clusterSelector``). Written by anyone else,
either would hand them the platform's object. These are trust checks of the review
(``trust.TRUST_CHECKS`` lists them); the scale subresource of an operator's kind is
``trust.check_operator_scale``'s, which reads the object scaled as these read the
object named (``unknown_object``, ``created_by_platform``).
"""

from __future__ import annotations

from typing import Any

from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership
from webhook.engine.rules.not_a_run import OWNERSHIP_UNKNOWN
from webhook.engine.rules.operators import named_objects, reference_values
from webhook.engine.subject import Review
from webhook.engine.types import Violation
from webhook.keys import PLATFORM_RECORD
from webhook.policy.model import OperatorReference, Policy, RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_RESERVED_LABEL = RULES.rule(
    "ownership.reserved-label",
    mutation="",
    violation=(
        "a custom resource of an operator's kinds, created or changed by someone else than the "
        "platform or that operator, that writes a label the operator keys on to find an "
        "object's owner (`platform.operators[].reservedLabels`)"
    ),
)
OWNERSHIP_REFERENCE = RULES.rule(
    "ownership.reference",
    mutation="",
    violation=(
        "a custom resource of an operator's kinds, created or changed by someone else than the "
        "platform or that operator, that names or selects an object the platform created "
        "through a field the operator acts on (`platform.operators[].references`: a RayJob's "
        "`spec.clusterSelector` naming the platform's RayCluster)"
    ),
)


def check_reserved_labels(r: Review) -> list[Violation]:
    """``ownership.reserved-label``: an operator that finds an object's owner by a label
    (the spark-operator's webhook makes the SparkApplication named by
    ``sparkoperator.k8s.io/app-name`` the driver's owner) would make a user's driver the
    platform's if her custom resource could write that label: only the platform and the
    operator may."""
    if not isinstance(r.obj, dict) or not ownership.is_operator_object(r.obj, r.root):
        return []
    requester = r.context.requester
    kind = ownership.group_kind(r.obj)
    owners = [
        (p, operator)
        for p in r.root.run_policies
        if ownership.enabled(p)
        for operator in p.platform.operators
        if kind in operator.kinds and operator.reserved_labels
    ]
    # Exempt only the platforms that run that operator, and the operator itself.
    if (
        kind is None
        or not owners
        or any(
            ownership.is_platform_or_installer(p, requester)
            or ownership.is_identity((operator.identity,), requester)
            for p, operator in owners
        )
    ):
        return []
    reserved = tuple(dict.fromkeys(k for _, o in owners for k in o.reserved_labels))
    return [
        Violation(
            OWNERSHIP_RESERVED_LABEL,
            path,
            f"{key!r} is a label the {kind.rpartition('/')[2]} operator finds owners "
            "by: only the platform and the operator may write it",
        )
        for path, key in _reserved_label_keys(r.obj.get("spec"), reserved, "spec")
    ]


def _reserved_label_keys(node: Any, reserved: tuple[str, ...], path: str) -> list[tuple[str, str]]:
    """(path, key) of every mapping key under ``node`` that is, or ends with, a reserved
    label key (``.KEY``, as Spark's ``spark.kubernetes.driver.label.KEY``) or holds a
    reserved prefix."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and any(_reserves(r, key) for r in reserved):
                out.append((f"{path}[{key}]", key))
            out.extend(_reserved_label_keys(value, reserved, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out.extend(_reserved_label_keys(item, reserved, f"{path}[{i}]"))
    return out


def _reserves(reserved: str, key: str) -> bool:
    if reserved.endswith("/"):
        return key.startswith(reserved) or f".{reserved}" in key
    return key == reserved or key.endswith(f".{reserved}")


def check_operator_references(r: Review) -> list[Violation]:
    """``ownership.reference``: an operator acts for an object on the object a field of it
    names or selects (``platform.operators[].references``: KubeRay submits a RayJob to the
    RayCluster its ``spec.clusterSelector`` names). Anyone but the platform and that
    operator naming an object the platform created there would run her work in it, with
    its secrets and volumes. The named objects are read from the cluster state (fails
    closed without it); on UPDATE a field left as it was is not judged again."""
    kind = ownership.group_kind(r.obj)
    if kind is None:
        return []
    requester = r.context.requester
    out: list[Violation] = []
    for p in r.root.run_policies:
        declared = p.platform.references.get(kind) if ownership.enabled(p) else None
        if not declared or ownership.is_platform_or_installer(p, requester):
            continue
        for operator, reference in declared:
            if ownership.is_identity((operator.identity,), requester):
                continue
            before = dict(reference_values(r.old, reference.steps))
            for path, value in reference_values(r.obj, reference.steps):
                if path in before and before[path] == value:
                    continue
                found = _names_platform_object(p, reference, path, value, r)
                out.extend(v for v in found if v not in out)
    return out


def _names_platform_object(
    p: RunPolicy, reference: OperatorReference, path: str, value: Any, r: Review
) -> list[Violation]:
    kind = reference.names.rpartition("/")[2]
    what = f"{kind} {value!r}" if reference.by == "name" else f"the {kind}s it selects"
    state = r.context.state
    if state is None or not state.synced(kind):
        return [unknown_object(state, kind, path, what)]
    named = sorted(
        m.name
        for m in named_objects(reference, value, r.namespace, state)
        if created_by_platform(p, m.annotations, r.root)
    )
    if not named:
        return []
    return [
        Violation(
            OWNERSHIP_REFERENCE,
            path,
            f"{kind} {', '.join(named)} is the platform's: its operator would act on it for "
            f"this {reference.kind.rpartition('/')[2]}; only the platform may name it here, "
            "name one of your own",
        )
    ]


def unknown_object(state: Any, kind: str, path: str, what: str, lacking: str = "") -> Violation:
    """``ownership.unknown``: the cluster state lacks what says whether ``what`` is the
    platform's (fails closed; the requester retries)."""
    if not lacking:
        lacking = (
            "no cluster state"
            if state is None
            else f"runguard's cache has not synced {kind} objects yet"
        )
    return Violation(
        OWNERSHIP_UNKNOWN,
        path,
        f"{lacking}: runguard cannot tell whether {what} is the platform's; retry in a moment",
    )


def created_by_platform(p: RunPolicy, annotations: Any, root: Policy) -> bool:
    """The record of an object says the platform (or one of its installers) created it."""
    records = annotations if isinstance(annotations, dict) else dict(annotations)
    if records.get(PLATFORM_RECORD) == ownership.INSTALLER:
        return ownership.recorded_for(p, records, root)
    return ownership.recorded_platform(p, records, root)
