"""Each RunPolicy's own exclusions, through the real apiserver: the configurations
rendered for two RunPolicies that exclude different namespaces are accepted (cel-go
compiles the per-RunPolicy namespace terms), and the apiserver calls a webhook for a
copy of a platform run labelled for the RunPolicy that leaves its namespace out.

The configurations point at an address where nothing listens: a request routed to
runguard fails with "failed calling webhook NAME", one that is not is created (server
side dry runs). The session's runguard is unregistered meanwhile, and registered again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.install import manifests
from webhook.policy.model import Policy, build_run_policy

from .cluster import Cluster
from .devcluster import prepare_cluster
from .runs import Webhook, pod, until, wait_for_admission

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
NAME = "runguard-scope"
UNREACHABLE = "https://127.0.0.1:9"  # the discard port: nothing listens there
TEAM = "rg-scope-team"  # the batch RunPolicy leaves it out, the platform's does not
ML = "rg-scope-ml"  # both look at it
BATCH = {"app": "batch"}


def two_run_policies() -> Policy:
    batch = {
        "apiVersion": "runguard.io/v1", "kind": "RunPolicy", "metadata": {"name": "a-batch"},
        "spec": {"selector": {"matchLabels": BATCH}, "excludeNamespaces": [TEAM]},
    }  # fmt: skip
    platform = {
        "apiVersion": "runguard.io/v1", "kind": "RunPolicy", "metadata": {"name": "platform"},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/managed-by": "dhcore"},
                         "matchExpressions": [{"key": "dhcore/run", "operator": "Exists"}]},
            "platform": {"identities": ["system:serviceaccount:digitalhub:core"]},
            "secrets": {"allowed": ["sec-*-{labels[dhcore/run]}"]},
        },
    }  # fmt: skip
    return Policy.of(build_run_policy(batch, []), build_run_policy(platform, []))


def copy_of_a_run(name: str) -> JSON:
    """A copy of a platform run, its secret kept, labelled for the batch RunPolicy."""
    secret = {"name": "main", "image": "python:3.11",
              "envFrom": [{"secretRef": {"name": "sec-api-r1"}}]}  # fmt: skip
    return pod(name, BATCH, containers=[secret])


def dry_run(cluster: Cluster, namespace: str, obj: JSON) -> str | None:
    """None when the apiserver would create ``obj``, else its error."""
    done = cluster.kubectl(
        "create", "-n", namespace, "--dry-run=server", "-o", "name", "-f", "-",
        input=json.dumps(obj),
    )  # fmt: skip
    return None if done.returncode == 0 else done.stderr


def failed_calling(webhook: str) -> str:
    return f'failed calling webhook "{webhook}"'


@pytest.fixture(scope="module")
def registered(cluster: Cluster, webhook: Webhook) -> Iterator[list[JSON]]:
    prepare_cluster(cluster)
    for namespace in (TEAM, ML):
        cluster.kubectl("create", "namespace", namespace)  # may exist already
    webhook.unregister(cluster)
    configurations = manifests.webhook_configurations(two_run_policies(), url=UNREACHABLE)
    for configuration in configurations:
        configuration["metadata"]["name"] = NAME
        configuration["metadata"]["labels"]["app.kubernetes.io/name"] = NAME
    try:
        wait_for_admission(cluster, active=False)
        listed = {"apiVersion": "v1", "kind": "List", "items": configurations}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        probe = copy_of_a_run("probe")
        called = failed_calling(manifests.MUTATING_REFERENCES_WEBHOOK)
        until(
            "the configurations called",
            lambda: called in (dry_run(cluster, TEAM, probe) or "") or None,
            timeout=60,
        )
        yield configurations
    finally:
        cluster.kubectl(
            "delete", f"mutatingwebhookconfiguration/{NAME}",
            f"validatingwebhookconfiguration/{NAME}", "--ignore-not-found",
        )  # fmt: skip
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)


def test_the_apiserver_stores_the_per_run_policy_namespace_terms(
    cluster: Cluster, registered: list[JSON]
) -> None:
    for rendered in registered:
        done = cluster.kubectl("get", rendered["kind"], NAME, "-o", "json", check=True)
        stored = json.loads(done.stdout)["webhooks"]
        assert [h.get("matchConditions") for h in stored] == [
            h.get("matchConditions") for h in rendered["webhooks"]
        ]
    conditions = [c["expression"] for h in registered[1]["webhooks"]
                  for c in h.get("matchConditions", ())]  # fmt: skip
    assert any(f"!(request.namespace in ['{TEAM}'])" in c for c in conditions)


def test_a_copy_labelled_for_a_run_policy_excluding_the_namespace_is_routed(
    cluster: Cluster, registered: list[JSON]
) -> None:
    """In TEAM the batch RunPolicy looks at nothing: the copy is no run there, and the
    references webhook is called for the platform's secret it names. In ML it is the
    batch RunPolicy's run, called by its own Pod webhook. A batch Pod naming nothing of
    the platform's in TEAM reaches no webhook."""
    refused = dry_run(cluster, TEAM, copy_of_a_run("copy")) or ""
    assert failed_calling(manifests.MUTATING_REFERENCES_WEBHOOK) in refused, refused
    refused = dry_run(cluster, ML, copy_of_a_run("copy")) or ""
    assert failed_calling(manifests.MUTATING_WEBHOOK) in refused, refused
    assert dry_run(cluster, TEAM, pod("plain", BATCH)) is None
    refused = dry_run(cluster, ML, pod("plain", BATCH)) or ""
    assert failed_calling(manifests.MUTATING_WEBHOOK) in refused, refused
