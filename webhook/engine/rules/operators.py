"""What a platform operator's Pods may have beyond the policy (``platform.operators``).

An operator (the mpi-operator, ...) builds the Pods of the platform's objects and adds
what it needs to them: a ConfigMap it makes for the job (``configMaps``), a capability
the platform wrote into the job's template (``allowedCapabilities``). Those grants go to
a run only when it is the platform's (``pod.ownership``, decided from the creator and its
owners by uid) *and* that operator created it: directly (the request's user at CREATE,
its stamp after), or through a Kubernetes controller whose controller owner, by uid,
the operator created (the launcher Job of an MPIJob v2beta1). A user's look-alike
(their own MPIJob, or a Pod naming the operator's ConfigMap) gets none of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from webhook.engine.context import ClusterView, ObjectMeta
from webhook.engine.pod import Pod
from webhook.keys import REQUESTED_BY
from webhook.policy.model import Operator, OperatorReference, matches_any

_MAX_DEPTH = 4  # Pod -> Job -> MPIJob is 1 step up; longer is not an operator's chain


def creating_operator(pod: Pod, undecided: bool = False) -> Operator | None:
    """The operator of ``pod.policy`` that created this platform run, if one did.

    ``undecided``: also while the run's owner is not known yet (an operator's webhook
    adds it after runguard's mutation), so that mutation strips nothing the operator's
    Pod keeps once validation, which sees it whole, decides."""
    platform = pod.policy.platform
    ownership = pod.ownership
    decided = ownership.platform or (undecided and ownership.unknown is not None)
    if not platform.operators or not platform.identities or not decided:
        return None
    context = pod.context
    if context.operation == "CREATE":
        creator = context.requester.username if context.requester else None
    else:
        creator = pod.annotations.get(REQUESTED_BY)  # recorded at CREATE, never changed after
    meta: ObjectMeta | None = None
    for _ in range(_MAX_DEPTH):
        if creator is None:
            return None
        found = platform.operators_by_user.get(creator)
        if found is not None:
            return found
        if creator not in platform.owner_kinds or context.state is None:
            return None
        owner = _controller_owner(pod, meta)
        if owner is None:
            return None
        meta = context.state.by_uid(owner)
        if meta is None:
            return None
        creator = meta.annotations.get(REQUESTED_BY)
    return None


def _controller_owner(pod: Pod, meta: ObjectMeta | None) -> str | None:
    """The uid of the controller owner of the Pod (``meta`` None) or of ``meta``."""
    if meta is None:
        for ref in pod.owner_references:
            if isinstance(ref, dict) and ref.get("controller") is True:
                uid = ref.get("uid")
                return uid if isinstance(uid, str) else None
        return None
    for _kind, _name, uid, controller in meta.owners:
        if controller:
            return str(uid)
    return None


def operator_config_map(pod: Pod, name: str, undecided: bool = False) -> bool:
    """Whether ``name`` is a ConfigMap the operator that created this run makes for it."""
    operator = creating_operator(pod, undecided)
    return operator is not None and matches_any(operator.config_maps, name, pod.labels)


def operator_capabilities(pod: Pod, undecided: bool = False) -> frozenset[str]:
    """Capabilities the operator that created this run lets its containers add."""
    operator = creating_operator(pod, undecided)
    return operator.allowed_capabilities if operator is not None else frozenset()


# --- what an operator's object names (``platform.operators[].references``) ----------------


def plural(kind: str) -> str:
    """The resource name the API serves a custom kind under, by Kubernetes' own default
    (``kubectl``'s and controller-gen's): lower case, plus ``s`` (``es``, ``ies``)."""
    lower = kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    return lower + "s"


def reference_values(obj: Any, steps: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """(path, value) of the field at ``steps`` below ``obj`` (``*``: every item of a
    list); reads defensively: a user's object, before any schema."""

    def walk(node: Any, rest: tuple[str, ...], where: str) -> Iterator[tuple[str, Any]]:
        if not rest:
            if node is not None:
                yield where, node
            return
        head, tail = rest[0], rest[1:]
        if head == "*":
            for i, item in enumerate(node if isinstance(node, list) else ()):
                yield from walk(item, tail, f"{where}[{i}]")
        elif isinstance(node, dict) and head in node:
            if not _PLAIN_KEY.fullmatch(head):
                yield from walk(node[head], tail, f"{where}[{head}]")
            else:
                yield from walk(node[head], tail, f"{where}.{head}" if where else head)

    yield from walk(obj, steps, "")


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a selector written in a user's object picks an object with ``labels``: a
    LabelSelector (``matchLabels``, ``matchExpressions``) or a plain map of labels, read
    either way when it could be both. What cannot be read picks everything (judged as
    the widest selector it could be, never the narrowest)."""
    if not isinstance(selector, dict):
        return True
    as_map = all(isinstance(v, str) for v in selector.values()) and all(
        labels.get(k) == v for k, v in selector.items()
    )
    if set(selector) - {"matchLabels", "matchExpressions"}:
        return as_map
    return as_map or _label_selector(selector, labels)


def _label_selector(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    wanted = selector.get("matchLabels") or {}
    if not isinstance(wanted, dict) or any(labels.get(k) != v for k, v in wanted.items()):
        return not isinstance(wanted, dict)
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return True
    for expression in expressions:
        if not isinstance(expression, dict):
            return True
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list):
            return True
        present = key in labels
        if operator == "In":
            matched = present and labels[key] in values
        elif operator == "NotIn":
            matched = not (present and labels[key] in values)
        elif operator == "Exists":
            matched = present
        elif operator == "DoesNotExist":
            matched = not present
        else:
            return True
        if not matched:
            return False
    return True


def named_objects(
    reference: OperatorReference, value: Any, namespace: str, state: ClusterView
) -> list[ObjectMeta]:
    """The objects of the kind ``reference`` names that ``value`` (the field, as the user
    wrote it) names or selects in ``namespace``."""
    kind = reference.names.rpartition("/")[2]
    if reference.by == "name":
        found = state.get(kind, namespace, value) if isinstance(value, str) and value else None
        return [found] if found is not None else []
    return [meta for meta in state.in_namespace(kind, namespace) if selects(value, meta.labels)]
