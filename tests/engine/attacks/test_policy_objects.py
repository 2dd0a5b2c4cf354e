"""Attacks on the policy objects (RunPolicy and Profile as custom resources, watched live):
who may write them, and a live edit the webhooks do not route yet.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces; the
admin edits policies with ``kubectl edit runpolicy``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from harness import REPO
from harness.attack_chains import DH_NS, DIGITALHUB, RUN_SECRET, owned_by, state
from harness.shipped import ALICE, CORE

from webhook.engine import evaluate, mutate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy


def test_policy_objects_are_cluster_scoped_and_not_aggregated_to_edit() -> None:
    """Stopped: a user with ``edit`` (a RoleBinding in her namespace) cannot create or
    change a RunPolicy or Profile: both CRDs are cluster-scoped and no ClusterRole of the
    component aggregates them anywhere; the watch's own role only reads them and patches
    their status. The one aggregated role that writes is a project's own profiles
    (ProjectProfile, namespaced), and only to ``admin``; ``view`` (so ``edit``) reads
    them."""
    directory = REPO / "manifests" / "policy-objects"
    for name in ("runguard.io_runpolicies.yaml", "runguard.io_profiles.yaml"):
        crd = yaml.safe_load((directory / name).read_text(encoding="utf-8"))
        assert crd["spec"]["scope"] == "Cluster", name
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    for path in directory.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            labels = ((doc or {}).get("metadata") or {}).get("labels") or {}
            to = {k.removeprefix(aggregate) for k in labels if k.startswith(aggregate)}
            if not to:
                continue
            assert to <= {"admin", "view"}, (path, doc["metadata"]["name"])
            for rule in doc["rules"]:
                assert set(rule["resources"]) == {"projectprofiles"}, rule
                if to != {"admin"}:
                    assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    for doc in yaml.safe_load_all((directory / "rbac.yaml").read_text(encoding="utf-8")):
        for rule in (doc or {}).get("rules", ()):
            if set(rule["resources"]) & {"runpolicies", "profiles"}:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


TRAINING = Requester("system:serviceaccount:kubeflow:training-operator")


def edited_policies(tmp_path: Path) -> Policy:
    """The shipped policies as an admin edits them live (``kubectl edit platform``): one
    more operator, Kubeflow's training-operator for PyTorchJobs."""
    for path in (REPO / "policies").glob("*.yaml"):
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        for doc in docs:
            if doc.get("kind") == "Platform":  # every RunPolicy names it, as the shipped do
                doc["spec"]["operators"].append(
                    {"identity": TRAINING.username, "kinds": ["kubeflow.org/PyTorchJob"]}
                )
        (tmp_path / path.name).write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return load_policy(tmp_path)


def test_a_live_policy_edit_is_routed_before_it_is_relied_on(tmp_path: Path) -> None:
    """Chain: with RunPolicy and Profile as objects watched live, an admin adds an operator
    (Kubeflow's training-operator, ``kubeflow.org/PyTorchJob``) with ``kubectl edit
    platform digitalhub``. The policy watch mirrors it and the server serves it within
    seconds; nothing renders the webhook configurations again (``runguard manifests
    --check`` compares them with ``policies/`` in Git, not with the objects). The
    operators webhooks still list only the old kinds, so a user's PyTorchJob created with
    the Core's records (``runguard.io/requested-by: ...core``, ``runguard.io/platform:
    "true"``) is never stamped and keeps them. Once runguard watches the new kind (after
    the ``rollout restart`` docs/operations.md asks for when a kind is added; until then
    such Pods fail closed), the training-operator's Pod for her PyTorchJob is judged the
    platform's: the run's secret, as the platform's. The same drift leaves a
    new secret or claim pattern unreserved (the reserved-names condition is rendered from
    the old patterns: a user creates the platform's future secret first) and a new
    RunPolicy's Pods unrouted (objectSelector per RunPolicy).

    Why it matters: "what the engine judges and what reaches it cannot drift"
    (docs/dev/guarantees.md, "Trust over time", every door by construction); with live objects the
    two now come from different sources.

    Closed: the policy watch renders the webhook configurations from the edited policy
    and compares them with the cluster's; an edit whose routing differs is held (its
    status says so, the policy before it is served) until an admin applies them.
    """
    live = edited_policies(tmp_path)
    forged = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "steal", "namespace": DH_NS, "uid": "pt-1",
                        "annotations": forged}}  # fmt: skip
    pod = owned_by(
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "steal-master-0", "namespace": DH_NS},
         "spec": {"containers": [{"name": "pytorch", "image": "alice/miner",
                                  "envFrom": [{"secretRef": {"name": RUN_SECRET}}]}]}},
        job,
    )  # fmt: skip
    decision = evaluate(pod, live, namespace=DH_NS, context=Context(TRAINING, state(job)))
    assert decision.allowed and decision.object["metadata"]["annotations"][PLATFORM_RECORD]
    # the engine would have stamped her PyTorchJob as hers, had it reached runguard
    sent = copy.deepcopy(job)
    stamped = mutate(sent, live, namespace=DH_NS, context=Context(ALICE, state())).object
    assert PLATFORM_RECORD not in stamped["metadata"]["annotations"]
    # Closed: the policy watch holds an edit that changes what the webhooks route until
    # the cluster's configurations route it, and serves the policy before it meanwhile.
    from webhook.watches.policy import held_because, policy_routing

    ns = manifests.DEFAULT_NAMESPACE
    before = policy_routing(DIGITALHUB, ns)
    held = held_because(DIGITALHUB, live, lambda: (before, ns))
    assert held is not None and "mutate-operators.runguard.io" in held, held
    assert held_because(DIGITALHUB, live, lambda: (policy_routing(live, ns), ns)) is None
