"""``ownership.debug``: who may open a running Pod of the platform's.

A debug container added to a Pod the platform created, or that holds its objects or
runs as one of its accounts, is a shell in the run with its secrets and its token; so
is a connection into it (``SHELLS``: ``kubectl exec``, ``attach``, ``port-forward``, a
proxy, a token bound to it), judged on the Pod as the cluster holds it
(``webhook.serving.shells`` reads the Pod, ``webhook.engine.connect`` judges it). Only
the platform (or, for a token, the Pod's node) may.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from webhook.engine import scope
from webhook.engine.context import Context
from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership
from webhook.engine.subject import Review
from webhook.engine.types import JSON, Violation
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy, RunPolicy

RULES = Declarations(__name__)
OWNERSHIP_DEBUG = RULES.rule(
    "ownership.debug",
    mutation="",
    violation=(
        "an ephemeral container added to a Pod the platform created or that holds the "
        "platform's objects, or a door opened into one (kubectl exec, attach, "
        "port-forward, pods/proxy, services/proxy, a token bound to it), by someone "
        "else than a platform identity"
    ),
)


def check_debug_container(r: Review) -> list[Violation]:
    """``ownership.debug``: an ephemeral container added to a Pod that holds the platform's
    objects or runs as one of its accounts, by anyone but a platform identity (a shell in
    the run, with its secrets or its token)."""
    if r.context.subresource != "ephemeralcontainers" or r.target is None:
        return []
    if r.old_target is None or r.target.kind != "Pod":
        return []
    before = r.old_target.spec.get("ephemeralContainers") or []
    after = r.target.spec.get("ephemeralContainers") or []
    if not isinstance(after, list) or len(after) <= len(before if isinstance(before, list) else []):
        return []
    if _platform_owners(r.root, r.old_metadata, r.old_target.spec, r.namespace, r.context):
        return [
            Violation(
                OWNERSHIP_DEBUG,
                "spec.ephemeralContainers",
                "the platform created this Pod, or it holds the platform's secrets or "
                "volumes: only the platform may add a debug container to it",
            )
        ]
    return []


# What opens a door into a running Pod, by subresource: a shell or a tty (exec,
# attach), a port inside its network namespace, where NetworkPolicies do not apply
# (portforward, proxy: Ray's job API on a head Pod runs whatever it is sent; a
# Service's proxy is judged on each Pod it reaches), and a
# token of its account bound to it (serviceaccounts/token, TokenRequest), which
# ``webhook.serving.shells`` would take for the Pod itself when it opens a shell.
SHELLS = {
    "exec": "kubectl exec",
    "attach": "kubectl attach",
    "portforward": "kubectl port-forward",
    "proxy": "a proxy (pods/proxy, services/proxy)",
    "token": "a token bound to it",
}


def check_shell(
    pod: Any, root: Policy, namespace: str | None, context: Context, by: Any = None
) -> list[Violation]:
    """``ownership.debug`` for a door opened into ``pod``, the Pod as the cluster holds it
    (``SHELLS``: ``kubectl exec``, ``attach``, ``port-forward``, ``pods/proxy``, a token
    bound to it): the same shell, secrets and token as a debug container, by another
    door, so the same judgment. ``by``: the Pod whose own token opens it, when the
    request says so (``webhook.serving.shells``), in the same namespace: a platform Pod opening
    a shell into another of the same platform (an MPI launcher running its workers by
    ``kubectl exec``) is that platform, and no other's; a Pod of a platform whose
    identities are all the target's platform's may too (``scope.may_open``: no more than
    those identities themselves). The kubelet of the Pod's node may mint its tokens."""
    what = SHELLS.get(context.subresource)
    if what is None:
        return []
    owners = _platform_owners(root, _meta(pod), _spec(pod), namespace, context)
    if not owners:
        return []
    if by is not None:
        by_platforms = _platforms_of(root, _meta(by), _spec(by), namespace)
        if all(any(scope.may_open(b, o) for b in by_platforms) for o in owners):
            return []
    if context.subresource == "token" and _its_node(pod, context):
        return []
    if context.subresource == "token":
        who_may = "only the platform or the Pod's node may mint a token bound to it"
    else:
        who_may = f"only the platform may open {what} into it"
    message = "the platform created this Pod, or it holds the platform's secrets or volumes: "
    return [Violation(OWNERSHIP_DEBUG, context.subresource, message + who_may)]


def _meta(pod: Any) -> Any:
    return pod.get("metadata") if isinstance(pod, dict) else None


def _spec(pod: Any) -> JSON:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    return spec if isinstance(spec, dict) else {}


def _its_node(pod: Any, context: Context) -> bool:
    """The requester is the kubelet of the node the Pod runs on."""
    requester = context.requester
    spec = pod.get("spec") if isinstance(pod, dict) else None
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    return (
        requester is not None
        and isinstance(node, str)
        and bool(node)
        and "system:nodes" in requester.groups
        and requester.username == f"system:node:{node}"
    )


def shell_judged(root: Policy, context: Context) -> bool:
    """Whether ``check_shell`` could refuse this requester anything: some RunPolicy has a
    platform that the requester is not (so the Pod must be read to know)."""
    return any(True for _ in _judging(root, context))


def _judging(root: Policy, context: Context) -> Iterator[RunPolicy]:
    """The RunPolicies whose platform the requester is not: those that judge a door it
    opens, or a debug container it adds."""
    for p in root.run_policies:
        if ownership.enabled(p) and not ownership.is_platform_identity(p, context.requester):
            yield p


def _platforms_of(
    root: Policy, metadata: Any, spec: JSON, namespace: str | None
) -> list[RunPolicy]:
    """The RunPolicies (with a platform, looking at the namespace) whose platform a Pod
    (``metadata``, ``spec``) is: its record says so, read as the RunPolicy that wrote it
    (``scope.recorder`` of the stored Pod), or it names that platform's objects or runs
    as one of its accounts."""
    meta = metadata if isinstance(metadata, dict) else {}
    annotations = ownership.string_map(meta, "annotations")
    label = ownership.string_map(meta, "labels").get(POLICY_LABEL)
    governing = root.named(label) if isinstance(label, str) else None
    if governing is not None and not scope.covers(governing, namespace):
        governing = None
    pod = {"kind": "Pod", "metadata": meta, "spec": spec}
    recorder = scope.recorder(root, pod, spec, namespace, governing, stored=True)
    recorded = recorder is not None and ownership.recorded_platform(recorder, annotations, root)
    return [
        p
        for p in scope.platforms(root, namespace)
        if (recorded and p is recorder) or scope.claims(p, spec, namespace)
    ]


def _platform_owners(
    root: Policy, metadata: Any, spec: JSON, namespace: str | None, context: Context
) -> list[RunPolicy]:
    """The RunPolicies whose platform a Pod is (``_platforms_of``) that judge this
    requester: it is not that platform, nor the operator whose kind is the Pod's
    controller. The Core is not refused its own Pod for MLRun's."""
    meta = metadata if isinstance(metadata, dict) else None
    owners = meta.get("ownerReferences") if meta is not None else None
    judging = list(_judging(root, context))
    return [
        p
        for p in _platforms_of(root, metadata, spec, namespace)
        if any(p is j for j in judging) and not _operator_of(p, context, owners)
    ]


def _operator_of(policy: RunPolicy, context: Context, owners: Any) -> bool:
    """The requester is an operator of the platform and the Pod's controller is of one of
    its kinds (Argo's controller signalling its step Pods by exec): owners of a stamped
    object cannot be rewritten (``ownership.owner-changed``)."""
    if context.requester is None or not isinstance(owners, list):
        return False
    for operator in policy.platform.operators:
        if not ownership.is_identity((operator.identity,), context.requester):
            continue
        for ref in owners:
            if isinstance(ref, dict) and ref.get("controller") is True:
                key = ownership.group_kind(ref)
                if key is not None and key in operator.kinds:
                    return True
    return False
