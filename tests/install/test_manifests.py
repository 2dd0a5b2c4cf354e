"""Install manifests (the container image: ``test_image.py``).

* the webhook configurations rendered from a Policy, field by field;
* ``runguard manifests`` (stdout, --ca-bundle, --url, --write, --check);
* every YAML under ``manifests/`` parses, the kustomize base hangs together (names,
  labels, ports, mounts agree) and the Deployment is hardened as promised;
* drift: the generated files in ``manifests/`` equal what ``policies/`` renders to.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO
from harness.manifests_base import BASE, base_documents, base_object, deployment_pod
from harness.references import OWNED, OWNED_POLICY, REFERENCES, RUN_POLICY
from harness.routing import Cel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webhook
from webhook.cli import main
from webhook.install import certs, manifests
from webhook.install.conditions import POD_CLAIM
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, build_run_policy


@pytest.fixture
def policy() -> Policy:
    return Policy.of(build_run_policy(RUN_POLICY, []))


def pod_rule(operations: list[str], resources: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": operations,
        "resources": resources,
        "scope": "Namespaced",
    }


EXPECTED_NAMESPACE_SELECTOR = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["batch-legacy", "kube-system", "runguard"],
        }
    ]
}
EXPECTED_OBJECT_SELECTOR = {
    "matchLabels": {"app.kubernetes.io/managed-by": "dhcore"},
    "matchExpressions": [{"key": "dhcore/run", "operator": "Exists"}],
}


def controller_rules(operations: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "operations": operations,
            "resources": resources,
            "scope": "Namespaced",
        }
        for group, resources in (
            ("apps", ["deployments", "statefulsets", "replicasets", "daemonsets",
                      "deployments/status", "statefulsets/status", "replicasets/status",
                      "daemonsets/status"]),
            ("batch", ["jobs", "cronjobs", "jobs/status", "cronjobs/status"]),
            ("", ["replicationcontrollers", "replicationcontrollers/status"]),
        )
    ]  # fmt: skip


# Status subresources change labels, annotations and owners too: routed only when they do.
STATUS_CONDITION = {
    "name": "status-changes-metadata",
    "expression": (
        "request.?subResource.orValue('') != 'status' ||\n"
        "object.metadata.?labels.orValue({}) != oldObject.metadata.?labels.orValue({}) ||\n"
        "object.metadata.?annotations.orValue({}) != oldObject.metadata.?annotations.orValue({})"
        " ||\n"
        "object.metadata.?ownerReferences.orValue([]) != "
        "oldObject.metadata.?ownerReferences.orValue([])"
    ),
}


# The template of a Job, Deployment... or a CronJob's job, bound to `t`; its labels match
# RUN_POLICY's selector.
RUN_TEMPLATE_CONDITION = {
    "name": "run-template",
    "expression": (
        "[object.spec.?template.or(object.spec.?jobTemplate.?spec.?template).orValue({})]"
        ".exists(t,\n"
        "  t.?metadata.?labels[?'app.kubernetes.io/managed-by'] == optional.of('dhcore')\n"
        "  && t.?metadata.?labels[?'dhcore/run'].hasValue())"
    ),
}


# Controllers: the template is a run's, or was before the update, or the object carries
# runguard's records (docs/dev/guarantees.md, "Trust over time": an object cannot leave runguard's
# sight).
RECORDS = (
    "object.?metadata.?annotations[?'runguard.io/requested-by'].hasValue()"
    " || object.?metadata.?annotations[?'runguard.io/platform'].hasValue()"
    " || object.?metadata.?labels[?'runguard.io/policy'] in [optional.of('platform')]"
)
# ... or the old object did (an update removing them reaches runguard, which puts them back)
RECORDS_KEPT = (
    RECORDS
    + " || (oldObject != null && ("
    + RECORDS.replace("object.?metadata", "oldObject.?metadata")
    + "))"
)
# ... or it templates or selects its Pods by runguard's RunPolicy label (scope.labels)
POLICY_LABEL_IN_TEMPLATE = (
    "object.spec.?template.or(object.spec.?jobTemplate.?spec.?template).orValue({})"
    ".?metadata.?labels[?'runguard.io/policy'].hasValue()"
    " || object.spec.?selector.?matchLabels[?'runguard.io/policy'].hasValue()"
    " || object.spec.?selector.?matchExpressions.orValue([]).exists(e,"
    " e.?key.orValue('') == 'runguard.io/policy')"
)
CONTROLLERS_CONDITION = {
    "name": "run-template",
    "expression": (
        RUN_TEMPLATE_CONDITION["expression"]
        + "\n|| (oldObject != null && [oldObject.?spec.?template.or(oldObject.?spec.?jobTemplate"
        ".?spec.?template).orValue({})].exists(o,\n"
        "  o.?metadata.?labels[?'app.kubernetes.io/managed-by'] == optional.of('dhcore')\n"
        "  && o.?metadata.?labels[?'dhcore/run'].hasValue()))\n|| "
        + RECORDS_KEPT
        + "\n|| "
        + POLICY_LABEL_IN_TEMPLATE
    ),
}
OTHER_PODS_CONDITIONS = [
    {
        "name": "not-a-run",
        "expression": (
            "!(object.metadata.?labels[?'app.kubernetes.io/managed-by'] == optional.of('dhcore')"
            "\n && object.metadata.?labels[?'dhcore/run'].hasValue())"
        ),
    },
    {"name": "platform-names-or-records", "expression": RECORDS_KEPT},
]


# --- rendering -----------------------------------------------------------------------


def webhook_fields(path: str) -> dict[str, Any]:
    """What every webhook rendered from RUN_POLICY has, calling runguard's ``path``."""
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": "runguard", "namespace": "runguard", "path": path, "port": 443}
        },
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "namespaceSelector": EXPECTED_NAMESPACE_SELECTOR,
    }


def test_mutating_configuration_field_by_field(policy: Policy) -> None:
    config = manifests.mutating_webhook_configuration(policy)
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["kind"] == "MutatingWebhookConfiguration"
    assert config["metadata"]["name"] == "runguard"
    assert config["metadata"]["labels"]["app.kubernetes.io/component"] == "admission"
    common = {**webhook_fields("/mutate"), "reinvocationPolicy": "IfNeeded"}
    assert config["webhooks"] == [
        {
            **common,
            "name": "mutate.runguard.io",
            "rules": [
                pod_rule(["CREATE", "UPDATE"], ["pods", "pods/ephemeralcontainers", "pods/status"])
            ],
            "objectSelector": EXPECTED_OBJECT_SELECTOR,
            "matchConditions": [STATUS_CONDITION],
        },
        # Controllers carry the run labels in their pod template, out of objectSelector's
        # sight: a CEL condition on the template instead. Mutated at CREATE, to be stamped,
        # and on UPDATE, to keep runguard's records.
        {
            **common,
            "name": "mutate-controllers.runguard.io",
            "rules": controller_rules(["CREATE", "UPDATE"]),
            "matchConditions": [CONTROLLERS_CONDITION, STATUS_CONDITION],
        },
        # Pods outside the selector that carry runguard's records.
        {
            **common,
            "name": "mutate-references.runguard.io",
            "rules": [pod_rule(["CREATE", "UPDATE"], ["pods", "pods/status"])],
            "matchConditions": [*OTHER_PODS_CONDITIONS, STATUS_CONDITION],
        },
    ]


POD_RESOURCES = ["pods", "pods/ephemeralcontainers", "pods/resize", "pods/status"]


def test_validating_configuration_field_by_field(policy: Policy) -> None:
    config = manifests.validating_webhook_configuration(policy)
    assert config["kind"] == "ValidatingWebhookConfiguration"
    assert config["metadata"]["name"] == "runguard"
    pods, controllers, others, claims = config["webhooks"]
    ops = ["CREATE", "UPDATE"]
    common = webhook_fields("/validate")
    assert pods == {
        **common,
        "name": "validate.runguard.io",
        "rules": [pod_rule(ops, POD_RESOURCES)],
        "failurePolicy": "Fail",
        "objectSelector": EXPECTED_OBJECT_SELECTOR,
        "matchConditions": [STATUS_CONDITION],
    }
    # Controllers carry the run labels in their pod template, invisible to objectSelector:
    # a CEL condition on the template instead, and fail closed like the Pods.
    assert controllers == {
        **common,
        "name": "validate-controllers.runguard.io",
        "rules": controller_rules(ops),
        "failurePolicy": "Fail",
        "matchConditions": [CONTROLLERS_CONDITION, STATUS_CONDITION],
    }
    assert others == {
        **common,
        "name": "validate-references.runguard.io",
        "rules": [pod_rule(ops, POD_RESOURCES)],
        "matchConditions": [*OTHER_PODS_CONDITIONS, STATUS_CONDITION],
    }
    # Whatever the policy, the ResourceClaims made for a Pod: its devices are the run's.
    assert claims == {
        **common,
        "name": "validate-reserved-names.runguard.io",
        "rules": [DEVICE_CLAIMS_RULE],
        "failurePolicy": "Fail",
        "matchConditions": [
            {"name": "platform-name", "expression": f"request.operation == 'CREATE' && {POD_CLAIM}"}
        ],
    }
    # reinvocationPolicy exists only for mutating webhooks; the apiserver rejects it here.
    assert "reinvocationPolicy" not in pods and "reinvocationPolicy" not in controllers


def test_other_namespace_service_and_selector(policy: Policy) -> None:
    for config in manifests.webhook_configurations(policy, namespace="guard", service="rg"):
        for hook in config["webhooks"]:
            assert hook["clientConfig"]["service"]["namespace"] == "guard"
            assert hook["clientConfig"]["service"]["name"] == "rg"
            (expr,) = hook["namespaceSelector"]["matchExpressions"]
            assert expr["values"] == ["batch-legacy", "guard", "kube-system"]


def test_empty_selector_and_no_exclusions_still_exclude_runguard() -> None:
    policy = Policy.of(
        build_run_policy({"kind": "RunPolicy", "metadata": {"name": "p"}, "spec": {}}, [])
    )
    for config in manifests.webhook_configurations(policy):
        for hook in config["webhooks"]:
            assert hook.get("objectSelector", {}) == {}
            assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["runguard"]


def test_ca_bundle_is_the_file_base64(policy: Policy) -> None:
    pem = certs.new_cert_set("runguard", "runguard", [], datetime.now(UTC)).ca_bundle
    for config in manifests.webhook_configurations(policy, ca_bundle=pem):
        for hook in config["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == pem


def test_url_replaces_the_service(policy: Policy) -> None:
    mutating, validating = manifests.webhook_configurations(policy, url="https://10.0.0.5:8443/")
    for hook in mutating["webhooks"]:
        assert hook["clientConfig"] == {"url": "https://10.0.0.5:8443/mutate"}
    for hook in validating["webhooks"]:
        assert hook["clientConfig"] == {"url": "https://10.0.0.5:8443/validate"}


@pytest.mark.parametrize(
    "url", ["http://10.0.0.5:8443", "https://", "https://u:p@host", "https://h/?q=1", "10.0.0.5"]
)
def test_bad_url_is_refused(policy: Policy, url: str) -> None:
    with pytest.raises(manifests.ManifestError):
        manifests.webhook_configurations(policy, url=url)


def test_bad_ca_bundle_is_refused(policy: Policy) -> None:
    with pytest.raises(manifests.ManifestError, match="no PEM certificate"):
        manifests.webhook_configurations(policy, ca_bundle=b"not a cert")


def test_yaml_round_trips_without_anchors(policy: Policy) -> None:
    objects = manifests.webhook_configurations(policy)
    text = manifests.to_yaml(objects)
    assert list(yaml.safe_load_all(text)) == objects
    assert "&id" not in text and "*id" not in text


def test_policy_config_map_holds_each_file_verbatim() -> None:
    files = {"b.yaml": "kind: Profile\n# tail  \n", "a.yml": "kind: RunPolicy\n"}
    config_map = manifests.policy_config_map(files, namespace="guard")
    assert config_map["metadata"] == {
        "name": "runguard-policies",
        "namespace": "guard",
        "labels": manifests.LABELS,
    }
    assert list(config_map["data"]) == ["a.yml", "b.yaml"]
    (parsed,) = yaml.safe_load_all(manifests.to_yaml([config_map]))
    assert parsed["data"] == files


# --- routing: exactly what reaches runguard, every webhook failing closed ----------------


@pytest.fixture
def owned() -> Policy:
    return Policy.of(build_run_policy(OWNED_POLICY, []))


Route = tuple[str, str, str, str, str]  # configuration kind, webhook, group, resource, operation


def routes(configs: list[dict[str, Any]]) -> tuple[set[Route], dict[str, tuple[str, ...]]]:
    """Every (configuration, webhook, group, resource, operation) rendered, and how each
    webhook narrows it: ``objectSelector`` or the names of its matchConditions."""
    rows: set[Route] = set()
    narrowed: dict[str, tuple[str, ...]] = {}
    for config in configs:
        for hook in config["webhooks"]:
            assert hook["failurePolicy"] == "Fail", hook["name"]  # every one fails closed
            assert hook["namespaceSelector"]["matchExpressions"][0]["operator"] == "NotIn"
            for rule in hook["rules"]:
                assert rule["apiVersions"] == ["v1"] and rule["scope"] == "Namespaced"
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for operation in rule["operations"]:
                            rows.add((config["kind"], hook["name"], group, resource, operation))
            how = tuple(c["name"] for c in hook.get("matchConditions", []))
            if "objectSelector" in hook:
                assert how == (STATUS,), hook["name"]
                how = ("objectSelector", STATUS)
            narrowed[hook["name"]] = how
    return rows, narrowed


MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"
STATUS = "status-changes-metadata"
CONTROLLERS = [(g, f"{r}{sub}") for g, r in (
    ("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets"),
    ("apps", "daemonsets"), ("batch", "jobs"), ("batch", "cronjobs"),
    ("", "replicationcontrollers")) for sub in ("", "/status")]  # fmt: skip
RUN_PODS: set[Route] = {
    *((MUTATING, "mutate.runguard.io", "", r, op)
      for r in ("pods", "pods/ephemeralcontainers", "pods/status")
      for op in ("CREATE", "UPDATE")),
    *((VALIDATING, "validate.runguard.io", "", r, op)
      for r in POD_RESOURCES for op in ("CREATE", "UPDATE")),
}  # fmt: skip
RUN_CONTROLLERS: set[Route] = {
    *((MUTATING, "mutate-controllers.runguard.io", g, r, op)
      for g, r in CONTROLLERS for op in ("CREATE", "UPDATE")),
    *((VALIDATING, "validate-controllers.runguard.io", g, r, op)
      for g, r in CONTROLLERS for op in ("CREATE", "UPDATE")),
}  # fmt: skip
# Pods outside every selector that carry runguard's records (docs/dev/guarantees.md, "Trust over
# time": only runguard writes them, so it sees every object carrying one), or with ownership on name
# the platform's objects: stamped at CREATE, records kept on UPDATE, judged on both.
OTHER_PODS: set[Route] = {
    *((MUTATING, "mutate-references.runguard.io", "", r, op)
      for r in ("pods", "pods/status") for op in ("CREATE", "UPDATE")),
    *((VALIDATING, "validate-references.runguard.io", "", r, op)
      for r in POD_RESOURCES for op in ("CREATE", "UPDATE")),
}  # fmt: skip


# Whatever the policy: the ResourceClaims the resource-claim controller makes for a Pod
# (their devices count against the run's maximums), by a condition on their owner.
POD_DEVICE_CLAIMS: set[Route] = {
    (VALIDATING, "validate-reserved-names.runguard.io", "resource.k8s.io", "resourceclaims",
     "CREATE"),
}  # fmt: skip
DEVICE_CLAIMS_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["resourceclaims"],
    "scope": "Namespaced",
}


def test_without_ownership_runs_and_runguards_records_reach_runguard(policy: Policy) -> None:
    rows, narrowed = routes(manifests.webhook_configurations(policy))
    assert rows == RUN_PODS | RUN_CONTROLLERS | OTHER_PODS | POD_DEVICE_CLAIMS
    assert narrowed == {
        "mutate.runguard.io": ("objectSelector", STATUS),
        "mutate-controllers.runguard.io": ("run-template", STATUS),
        "mutate-references.runguard.io": ("not-a-run", "platform-names-or-records", STATUS),
        "validate.runguard.io": ("objectSelector", STATUS),
        "validate-controllers.runguard.io": ("run-template", STATUS),
        "validate-references.runguard.io": ("not-a-run", "platform-names-or-records", STATUS),
        "validate-reserved-names.runguard.io": ("platform-name",),
    }


def test_with_ownership_every_rule_and_condition(owned: Policy) -> None:
    rows, narrowed = routes(manifests.webhook_configurations(owned))
    assert rows == RUN_PODS | RUN_CONTROLLERS | OTHER_PODS | {
        # Objects created with a platform name (ownership.reserved-name).
        *((VALIDATING, "validate-reserved-names.runguard.io", "", r, "CREATE")
          for r in ("persistentvolumeclaims", "secrets", "configmaps")),
        (VALIDATING, "validate-reserved-names.runguard.io", "resource.k8s.io", "resourceclaims",
         "CREATE"),
        # Snapshots of a platform claim (ownership.not-a-run); token Secrets for the
        # platform's ServiceAccount, created or renamed (ownership.service-account).
        (VALIDATING, "validate-reserved-names.runguard.io", "snapshot.storage.k8s.io",
         "volumesnapshots", "CREATE"),
        (VALIDATING, "validate-reserved-names.runguard.io", "", "secrets", "UPDATE"),
    }  # fmt: skip
    assert narrowed == {
        "mutate.runguard.io": ("objectSelector", STATUS),
        "mutate-controllers.runguard.io": ("run-template-or-platform-names", STATUS),
        "mutate-references.runguard.io": ("not-a-run", "platform-names-or-records", STATUS),
        "validate.runguard.io": ("objectSelector", STATUS),
        "validate-controllers.runguard.io": ("run-template-or-platform-names", STATUS),
        "validate-references.runguard.io": ("not-a-run", "platform-names-or-records", STATUS),
        "validate-reserved-names.runguard.io": ("platform-name",),
    }
    conditions = {
        (hook["name"], c["name"]): c["expression"]
        for config in manifests.webhook_configurations(owned)
        for hook in config["webhooks"]
        for c in hook.get("matchConditions", [])
    }
    # The short ones, as an admin reads them; the others are evaluated below.
    assert conditions["validate-references.runguard.io", "not-a-run"] == (
        "!(object.metadata.?labels[?'app.kubernetes.io/managed-by'] == optional.of('dhcore')\n"
        " && object.metadata.?labels[?'dhcore/run'].hasValue())"
    )
    named = "object.metadata.?annotations[?'kubernetes.io/service-account.name'].orValue('')"
    assert conditions["validate-reserved-names.runguard.io", "platform-name"] == (
        "(request.operation == 'CREATE'\n"
        " && (request.resource.resource == 'persistentvolumeclaims'"
        " && object.metadata.?name.orValue('').matches('^(?:v-.+-.*)$')\n"
        "  || request.resource.resource == 'secrets'"
        " && object.metadata.?name.orValue('').matches('^(?:sec-.*-.+|registry[.]pull)$')\n"
        "  || request.resource.resource == 'configmaps'"
        " && object.metadata.?name.orValue('').matches('^(?:init-config-map-.+)$')\n"
        "  || request.resource.resource == 'resourceclaims'"
        " && object.metadata.?name.orValue('').matches('^(?:gpu-.+)$')\n"
        # a new claim cloning a claim of any name: a platform one, or one made for a Pod
        # (ownership.not-a-run, its owner read from the cache)
        "  || request.resource.resource == 'persistentvolumeclaims' && ("
        "(object.?spec.?dataSource.?kind.orValue('') == 'PersistentVolumeClaim'"
        " && object.?spec.?dataSource.?name.orValue('').matches('^.+$'))\n"
        "|| (object.?spec.?dataSourceRef.?kind.orValue('') == 'PersistentVolumeClaim'"
        " && object.?spec.?dataSourceRef.?name.orValue('').matches('^.+$')))\n"
        # a snapshot of a claim of any name: a platform one, or one made for a Pod
        "  || request.resource.resource == 'volumesnapshots'"
        " && object.?spec.?source.?persistentVolumeClaimName.orValue('')"
        ".matches('^.+$')\n"
        # a ResourceClaim made for a Pod: its devices are the run's (resources.exceeded)
        f"  || {POD_CLAIM}))\n"
        # a token Secret for the platform's ServiceAccount (ownership.service-account)
        "|| request.resource.resource == 'secrets'"
        " && object.?type.orValue('') == 'kubernetes.io/service-account-token'"
        f" && (request.namespace == 'digitalhub' && {named} == 'core')"
        f" && (oldObject == null || {named.replace('object.metadata', 'oldObject.?metadata')}"
        f" != {named})"
    )
    # Mutating and validating webhooks route the same objects.
    for mutating, validating in (("mutate-controllers", "validate-controllers"),
                                 ("mutate-references", "validate-references")):  # fmt: skip
        for condition in narrowed[f"{mutating}.runguard.io"]:
            assert (
                conditions[f"{mutating}.runguard.io", condition]
                == conditions[f"{validating}.runguard.io", condition]
            )


def owned_with(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The configurations of OWNED_POLICY with ``spec`` for its spec."""
    return manifests.webhook_configurations(
        Policy.of(build_run_policy({**OWNED_POLICY, "spec": spec}, []))
    )


def test_reserved_names_only_for_the_kinds_with_patterns() -> None:
    # per-run names are reserved; "v-*" without a placeholder names installation-wide claims
    claims = {"platformClaims": ["v-{labels[dhcore/run]}-*", "shared-*"]}
    spec = {**OWNED_POLICY["spec"], "volumes": claims, "secrets": {}, "resources": {}}
    rows, _ = routes(owned_with(spec))
    reserved = {r[2:] for r in rows if r[1] == "validate-reserved-names.runguard.io"}
    assert reserved == {("", "persistentvolumeclaims", "CREATE"),
                        ("snapshot.storage.k8s.io", "volumesnapshots", "CREATE"),
                        ("resource.k8s.io", "resourceclaims", "CREATE"),  # a Pod's devices
                        # the token Secrets of the platform's ServiceAccount only
                        ("", "secrets", "CREATE"), ("", "secrets", "UPDATE")}  # fmt: skip


def test_ownership_without_platform_names_routes_runs_and_records() -> None:
    spec = {**OWNED_POLICY["spec"], "volumes": {}, "secrets": {}, "resources": {}}
    rows, narrowed = routes(owned_with(spec))
    # the token Secrets of the platform's own ServiceAccount (ownership.service-account)
    tokens = {(VALIDATING, "validate-reserved-names.runguard.io", "", "secrets", op)
              for op in ("CREATE", "UPDATE")}  # fmt: skip
    # clones and snapshots of a claim made for a Pod (its own, whatever its name)
    claims = {(VALIDATING, "validate-reserved-names.runguard.io", "", "persistentvolumeclaims",
               "CREATE"),
              (VALIDATING, "validate-reserved-names.runguard.io", "snapshot.storage.k8s.io",
               "volumesnapshots", "CREATE")}  # fmt: skip
    assert rows == RUN_PODS | RUN_CONTROLLERS | OTHER_PODS | tokens | claims | POD_DEVICE_CLAIMS
    # the platform's own ServiceAccount is still a platform name (ownership.service-account)
    assert narrowed["validate-controllers.runguard.io"] == (
        "run-template-or-platform-names",
        STATUS,
    )


def test_empty_selector_routes_every_pod_and_controller() -> None:
    spec = {k: v for k, v in OWNED_POLICY["spec"].items() if k != "selector"}
    rows, narrowed = routes(owned_with(spec))
    # Every Pod is a run: no Pod is outside the selector to judge by its references.
    assert {r[1] for r in rows} == {"mutate.runguard.io", "mutate-controllers.runguard.io",
                                    "validate.runguard.io", "validate-controllers.runguard.io",
                                    "validate-reserved-names.runguard.io"}  # fmt: skip
    assert narrowed["validate-controllers.runguard.io"] == (STATUS,)


def test_name_regex_reads_patterns_as_ownership_does() -> None:
    from webhook.policy.patterns import NamePattern

    def regex(*texts: str) -> str | None:
        return manifests.name_regex(NamePattern.compile(t) for t in texts)

    assert regex() is None
    assert regex("v-{labels[dhcore/run]}-*") == "^(?:v-.+-.*)$"
    assert regex("a.b", "a.b", "c-*") == "^(?:a[.]b|c-.*)$"
    assert regex("*") == "^(?:.+)$"  # a name is never empty: an absent one matches nothing
    assert regex("{labels[x]}{labels[y]}") == "^(?:.+.+)$"


# --- the CEL conditions evaluated, against what the engine judges -----------------------
#
# cel-expr-python is CEL's C++ implementation; the apiserver runs cel-go (the e2e suite,
# tests/e2e/test_routing.py, sends the same kinds of objects through it). Both implement
# the CEL spec, optional types included.


@pytest.fixture(scope="module")
def cel() -> Cel:
    return Cel()


RUN_LABELS = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}


OWNED_ALONE = Policy.of(OWNED)


def hook(name: str, policy: Policy = OWNED_ALONE) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        h
        for c in manifests.webhook_configurations(policy)
        for h in c["webhooks"]
        if h["name"] == name
    ]
    assert len(found) == 1, name
    return found[0]


names = st.sampled_from([
    "v-r1-data", "v-a-", "v-x", "v--", "init-config-map-r1", "init-config-map-", "sec-db-r1",
    "sec--r1", "sec-db-", "registry.pull", "registryxpull", "team-datasets", "digitalhub", "x",
    "gpu-r1", "gpu-", "gpu_r1",
])  # fmt: skip
named = st.fixed_dictionaries({"name": names})
volumes = st.one_of(
    st.builds(lambda n: {"persistentVolumeClaim": {"claimName": n}}, names),
    st.builds(lambda n: {"configMap": {"name": n}}, names),
    st.builds(lambda n: {"secret": {"secretName": n}}, names),
    st.builds(lambda s: {"projected": {"sources": s}}, st.lists(st.one_of(
        st.builds(lambda d: {"configMap": d}, named), st.builds(lambda d: {"secret": d}, named),
        st.just({"downwardAPI": {"items": []}})), max_size=3)),
    st.just({"emptyDir": {}}),
    st.just({"projected": {}}),
).map(lambda v: {"name": "vol", **v})  # fmt: skip
env = st.one_of(
    st.just({"name": "A", "value": "1"}),
    st.builds(lambda n: {"name": "A", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}},
              names),
    st.builds(lambda n: {"name": "A", "valueFrom": {"configMapKeyRef": {"name": n, "key": "k"}}},
              names),
    st.just({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
)  # fmt: skip
env_from = st.one_of(
    st.builds(lambda n: {"secretRef": {"name": n}}, names),
    st.builds(lambda n: {"configMapRef": {"name": n}}, names),
    st.builds(lambda n: {"prefix": "X_", "configMapRef": {"name": n}}, names),
)
container = st.builds(
    lambda extra: {"name": "c", "image": "x", **extra},
    st.fixed_dictionaries({}, optional={"env": st.lists(env, max_size=3),
                                        "envFrom": st.lists(env_from, max_size=2)}),
)  # fmt: skip
pod_specs = st.fixed_dictionaries(
    {"containers": st.lists(container, min_size=1, max_size=2)},
    optional={
        "volumes": st.lists(volumes, max_size=3),
        "initContainers": st.lists(container, max_size=2),
        "ephemeralContainers": st.lists(container, max_size=1),
        "imagePullSecrets": st.lists(named, max_size=2),
    },
)
label_maps = st.dictionaries(
    st.sampled_from(["app.kubernetes.io/managed-by", "dhcore/run", "tier", "other"]),
    st.sampled_from(["dhcore", "r1", "gold", "", "x"]),
    max_size=4,
)


def wrapped(kind: str, labels: dict[str, str] | None, spec: dict[str, Any]) -> dict[str, Any]:
    """A ``kind`` whose pod template has ``labels`` (None: no metadata at all) and ``spec``."""
    template: dict[str, Any] = {"spec": spec}
    if labels is not None:
        template["metadata"] = {"labels": labels} if labels else {}
    if kind == "CronJob":
        return {
            "kind": kind,
            "metadata": {"name": "c"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}},
        }
    return {"kind": kind, "metadata": {"name": "c"}, "spec": {"template": template}}  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labels=label_maps, spec=pod_specs)
def test_pod_conditions_route_what_the_engine_judges(
    cel: Cel, labels: dict[str, str], spec: dict[str, Any]
) -> None:
    """A Pod reaches runguard when it is a run (objectSelector), or when it is not and
    names the platform's objects: exactly the Pods ``ownership.not-a-run`` can judge."""
    from webhook.engine.rules.ownership import platform_references

    pod = {"kind": "Pod", "metadata": {"name": "p", "labels": labels}, "spec": spec}
    run = OWNED.selector.matches(labels)
    judged = not run and (bool(platform_references(spec, OWNED)) or names_a_claim(spec))
    for name in ("mutate-references.runguard.io", "validate-references.runguard.io"):
        assert cel.routed(hook(name), pod, "pods") == judged


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["Job", "CronJob", "Deployment", "ReplicationController"]),
    labels=st.one_of(st.none(), label_maps),
    spec=pod_specs,
)
def test_controller_condition_routes_what_the_engine_judges(
    cel: Cel, kind: str, labels: dict[str, str] | None, spec: dict[str, Any]
) -> None:
    """A controller reaches runguard when its template is a run's, or names the
    platform's objects (``_stamp_only`` stamps it, ``_outside_selector`` judges it)."""
    from webhook.engine.rules.ownership import platform_references

    obj = wrapped(kind, labels, spec)
    judged = (
        OWNED.selector.matches(labels or {})
        or bool(platform_references(spec, OWNED))
        or names_a_claim(spec)
    )
    for name in ("mutate-controllers.runguard.io", "validate-controllers.runguard.io"):
        assert cel.routed(hook(name), obj, "cronjobs" if kind == "CronJob" else "jobs") == judged
    # Without ownership, runs only.
    runs_only = Policy.of(build_run_policy(RUN_POLICY, []))
    assert cel.routed(hook("validate-controllers.runguard.io", runs_only),
                      obj, "jobs") == OWNED.selector.matches(labels or {})  # fmt: skip


@pytest.mark.parametrize(
    ("change", "routed"),
    [
        ({}, False),  # the kubelet's and the controllers' status updates
        ({"labels": {"app.kubernetes.io/managed-by": "dhcore"}}, True),  # one label removed
        ({"labels": {**RUN_LABELS, "runguard.io/policy": "builds"}}, True),
        ({"annotations": {"runguard.io/platform": "true"}}, True),
        ({"ownerReferences": [{"kind": "Job", "name": "x", "uid": "u"}]}, True),
    ],
)
def test_a_status_update_is_routed_only_when_it_changes_metadata(
    cel: Cel, change: dict[str, Any], routed: bool
) -> None:
    """The status subresources' strategies keep only the spec: labels, annotations and owners
    sent to ``pods/status`` or ``jobs/status`` are stored. Those reach runguard; the rest
    of the status traffic does not."""
    expression = manifests.status_condition()["expression"]
    program = cel.env.compile(expression)
    old = {"kind": "Pod", "metadata": {"name": "p", "labels": RUN_LABELS}, "spec": {}}
    new = {**old, "metadata": {**old["metadata"], **change}, "status": {"phase": "Running"}}

    def holds(obj: dict[str, Any], before: dict[str, Any] | None, request: dict[str, Any]) -> bool:
        value = program.eval(data={"object": obj, "oldObject": before, "request": request})
        assert value.type() == cel.cel.Type.BOOL, value
        return bool(value.value())

    status = {"operation": "UPDATE", "subResource": "status"}
    assert holds(new, old, status) is routed
    # any other request is decided by the webhook's other conditions
    assert holds(new, None, {"operation": "CREATE"})
    assert holds(new, old, {"operation": "UPDATE", "subResource": "ephemeralcontainers"})
    assert holds(new, old, {"operation": "UPDATE"})


def test_controller_condition_without_template_or_spec(cel: Cel) -> None:
    condition = hook("validate-controllers.runguard.io")
    for obj in ({"kind": "ReplicationController", "spec": {"replicas": 0}},
                {"kind": "CronJob", "spec": {"jobTemplate": {}}},
                {"kind": "Job", "spec": {"template": {"metadata": {}}}}):  # fmt: skip
        assert not cel.routed(condition, obj, "jobs")


# Every place ownership.platform_references looks, with a platform name in it.
# The same names, one character off: none is the platform's.
NOT_PLATFORM = {"v-r1-a": "v-r1", "init-config-map-r1": "init-config-map", "sec-db-r1": "sec-db",
                "registry.pull": "registryxpull", "gpu-r1": "gpu_r1"}  # fmt: skip


def renamed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: renamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v) for v in value]
    return NOT_PLATFORM.get(value, value)


def names_a_claim(spec: Any) -> bool:
    """The pod spec names a claim of any name: it may be one made for another Pod, whose
    owner ``webhook.engine.rules.podclaims`` reads."""
    from webhook.engine.doors import located
    from webhook.engine.rules.podclaims import OWNED_KINDS

    return bool(located(spec, OWNED_KINDS))


@pytest.mark.parametrize("where", REFERENCES)
def test_every_place_a_pod_names_the_platforms_objects(cel: Cel, where: str) -> None:
    from webhook.engine.rules.ownership import platform_references

    spec = REFERENCES[where]
    other = renamed(spec)
    assert platform_references(spec, OWNED) and not platform_references(other, OWNED)
    any_name = names_a_claim(spec)  # routed whatever the claim's name
    for labels in ({}, {"app.kubernetes.io/managed-by": "dhcore"}):  # not runs
        pod = {"kind": "Pod", "metadata": {"labels": labels}, "spec": spec}
        assert cel.routed(hook("validate-references.runguard.io"), pod, "pods"), where
        assert cel.routed(hook("validate-references.runguard.io"), {**pod, "spec": other},
                          "pods") == any_name  # fmt: skip
    run = {"kind": "Pod", "metadata": {"labels": RUN_LABELS}, "spec": spec}
    assert not cel.routed(hook("validate-references.runguard.io"), run, "pods")  # objectSelector's
    for kind in ("Job", "CronJob", "StatefulSet"):
        assert cel.routed(hook("validate-controllers.runguard.io"), wrapped(kind, {}, spec), "jobs")
        assert cel.routed(hook("validate-controllers.runguard.io"), wrapped(kind, {}, other),
                          "jobs") == any_name  # fmt: skip


selectors = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(st.sampled_from(["a", "b", "x/y"]),
                                       st.sampled_from(["1", "2", ""]), max_size=2),
        "matchExpressions": st.lists(st.one_of(
            st.builds(lambda k, op, v: {"key": k, "operator": op, "values": v},
                      st.sampled_from(["a", "b", "c"]), st.sampled_from(["In", "NotIn"]),
                      st.lists(st.sampled_from(["1", "2", "3", ""]), min_size=1, max_size=2,
                               unique=True)),
            st.builds(lambda k, op: {"key": k, "operator": op}, st.sampled_from(["a", "b", "c"]),
                      st.sampled_from(["Exists", "DoesNotExist"])),
        ), max_size=3),
    },
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    selector=selectors,
    labels=st.dictionaries(
        st.sampled_from(["a", "b", "c", "x/y"]), st.sampled_from(["1", "2", "3", ""]), max_size=4
    ),  # fmt: skip
)
def test_selector_expression_is_the_label_selector(
    cel: Cel, selector: dict[str, Any], labels: dict[str, str]
) -> None:
    from webhook.policy.model import LabelSelector

    parsed = LabelSelector.model_validate(selector)
    expression = manifests.selector_expression(parsed, "object.metadata.?labels")
    if expression is None:
        assert parsed.matches(labels)  # the empty selector matches everything
        return
    for metadata in ({"labels": labels}, {} if not labels else None):
        if metadata is not None:
            assert cel.holds(expression, {"metadata": metadata}, "pods") == parsed.matches(labels)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    resource=st.sampled_from(sorted(manifests.PLATFORM_OBJECTS)),
    name=st.one_of(names, st.text("vsecinit-config-map.r1pull", min_size=1, max_size=20)),
)
def test_reserved_name_condition_is_ownership_reserved_name(
    cel: Cel, resource: str, name: str
) -> None:
    from webhook.engine.rules.ownership import reserved_name

    kind = manifests.PLATFORM_OBJECTS[resource]
    obj = {"kind": kind, "metadata": {"name": name}}
    routed = cel.routed(hook("validate-reserved-names.runguard.io"), obj, resource)
    assert routed == (reserved_name(OWNED, kind, name) is not None)


# --- the command -----------------------------------------------------------------------


def test_cli_renders_json_with_ca_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "--out", str(tmp_path / "certs")]) == 0
    capsys.readouterr()
    ca = tmp_path / "certs" / "ca.crt"
    assert (
        main(["manifests", "-p", str(REPO / "policies"), "--ca-bundle", str(ca), "-o", "json"]) == 0
    )
    listing = json.loads(capsys.readouterr().out)
    assert listing["kind"] == "List"
    policy = load_policy(REPO / "policies")
    floor = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * len(
        policy.run_policies
    )
    assert [o["kind"] for o in listing["items"]] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        *floor,
    ]
    for item in listing["items"][:2]:
        for hook in item["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca.read_bytes()
        assert item["webhooks"][0]["objectSelector"] == policy.first.selector.to_dict()


def test_cli_renders_yaml_for_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests", "-p", str(REPO / "policies"), "--url", "https://127.0.0.1:8443"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["webhooks"][0]["clientConfig"] for d in docs if "webhooks" in d] == [
        {"url": "https://127.0.0.1:8443/mutate"},
        {"url": "https://127.0.0.1:8443/validate"},
    ]
    assert [d for d in docs if "webhooks" not in d] == manifests.floor_policies(
        load_policy(REPO / "policies")
    )


def test_cli_renders_the_available_mode_without_the_floor_only_on_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--available: the webhooks judging runs fail open, the others stay closed; never
    without the floor, which alone judges runs while runguard is down."""
    policies = str(REPO / "policies")
    assert main(["manifests", "-p", policies, "--no-floor"]) == 0
    closed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in closed] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    assert main(["manifests", "-p", policies, "--available"]) == 0
    opened = [d for d in yaml.safe_load_all(capsys.readouterr().out) if "webhooks" in d]
    ignored = {h["name"] for d in opened for h in d["webhooks"] if h["failurePolicy"] == "Ignore"}
    assert ignored == {
        "mutate.runguard.io", "mutate-digitalhub.runguard.io", "validate.runguard.io",
        "validate-digitalhub.runguard.io", manifests.MUTATING_CONTROLLERS_WEBHOOK,
        manifests.CONTROLLERS_WEBHOOK, manifests.MUTATING_OPERATORS_WEBHOOK,
        manifests.OPERATORS_WEBHOOK,
    }  # fmt: skip
    for shut, open_ in zip(closed, opened, strict=True):
        for a, b in zip(shut["webhooks"], open_["webhooks"], strict=True):
            assert a["failurePolicy"] == "Fail"
            assert {**b, "failurePolicy": "Fail"} == a
    assert main(["manifests", "-p", policies, "--available", "--no-floor"]) == 2
    assert "needs the floor" in capsys.readouterr().err


def test_cli_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = str(REPO / "policies")
    assert main(["manifests", "-p", str(tmp_path)]) == 2  # no policy files
    assert main(["manifests", "-p", policies, "--url", "http://x"]) == 2
    assert main(["manifests", "-p", policies, "--ca-bundle", str(tmp_path / "none")]) == 2
    assert main(["manifests", "-p", policies, "--write", str(tmp_path), "--url", "https://x"]) == 2
    assert "error" in capsys.readouterr().err


def test_cli_write_then_check_catches_a_policy_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    out = tmp_path / "base"
    assert main(["manifests", "-p", str(policies), "--write", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "available-mode",
        "cluster-state",
        "floor.yaml",
        "policy-configmap.yaml",
        "policy-objects",
        "run-user-role.yaml",
        "webhooks.yaml",
    ]
    assert sorted(p.name for p in (out / "cluster-state").iterdir()) == [
        "operators-rbac.yaml",
        "shells-webhook.yaml",
    ]
    assert sorted(p.name for p in (out / "policy-objects").iterdir()) == [
        "runguard.io_platforms.yaml",
        "runguard.io_profiles.yaml",
        "runguard.io_projectprofiles.yaml",
        "runguard.io_runpolicies.yaml",
        "webhook.yaml",
    ]
    assert main(["manifests", "-p", str(policies), "--check", str(out)]) == 0

    run_policy = next(p for p in policies.glob("*.y*ml") if "kind: RunPolicy" in p.read_text())
    run_policy.write_text(run_policy.read_text().replace("kube-public", "kube-other"))
    capsys.readouterr()
    assert main(["manifests", "-p", str(policies), "--check", str(out)]) == 1
    report = capsys.readouterr()
    assert "+      - kube-other" in report.out
    assert "--write" in report.err

    # The floor is checked as the webhooks are: a maximum raised in the policy is drift.
    assert main(["manifests", "-p", str(policies), "--write", str(out)]) == 0
    sized = policies / "runpolicy.yaml"
    sized.write_text(sized.read_text().replace('cpu: "18"', 'cpu: "20"'))
    capsys.readouterr()
    assert main(["manifests", "-p", str(policies), "--check", str(out)]) == 1
    report = capsys.readouterr()
    assert f"{out / manifests.FLOOR_FILE} (committed)" in report.out
    assert "quantity('20')" in report.out


# --- the kustomize base ------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return data


def test_every_yaml_under_manifests_parses_into_objects() -> None:
    docs = base_documents()
    assert "kustomization.yaml" in docs and "deployment.yaml" in docs
    for name, objects in docs.items():
        assert objects, name
        for obj in objects:
            assert isinstance(obj.get("apiVersion"), str) and isinstance(obj.get("kind"), str), name
            if obj["kind"] != "Kustomization":
                assert obj["metadata"]["name"], name
                assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "runguard", name


def test_kustomization_lists_every_resource_and_only_existing_files() -> None:
    k = kustomization()
    assert k["namespace"] == manifests.DEFAULT_NAMESPACE
    # The TLS Secret is written by `runguard certs --out manifests/certs`, beside the keys,
    # and stays out of git with them.
    secret = f"certs/{certs.SECRET_FILE}"
    assert secret in k["resources"] and "secretGenerator" not in k
    assert "/certs/" in (BASE / ".gitignore").read_text().split()
    listed = set(k["resources"]) - {secret}
    on_disk = {
        name for name in base_documents() if name != "kustomization.yaml" and "/" not in name
    }
    assert listed == on_disk
    kinds = {obj["kind"] for name in listed for obj in base_documents()[name]}
    assert kinds == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }


def test_ca_bundle_is_injected_from_the_tls_secret() -> None:
    targets = {}
    for replacement in kustomization()["replacements"]:
        assert replacement["source"] == {
            "kind": "Secret",
            "name": "runguard-tls",
            "fieldPath": "data.[ca.crt]",
        }
        for target in replacement["targets"]:
            targets[target["select"]["kind"]] = target["fieldPaths"]
    assert targets == {
        "MutatingWebhookConfiguration": ["webhooks.*.clientConfig.caBundle"],
        "ValidatingWebhookConfiguration": ["webhooks.*.clientConfig.caBundle"],
    }


def test_generated_files_match_policies() -> None:
    """Drift: fix with `runguard manifests -p policies --write manifests`."""
    policy = load_policy(REPO / "policies")
    rendered = manifests.generated_files(policy, manifests.read_policy_files(REPO / "policies"))
    for name, text in rendered.items():
        committed = list(yaml.safe_load_all((BASE / name).read_text()))
        assert committed == list(yaml.safe_load_all(text)), (
            f"manifests/{name} is stale: run `runguard manifests -p policies --write manifests`"
        )
    # The ConfigMap carries every policy file, and the webhooks the policy's selector.
    config_map = base_object("ConfigMap", manifests.CONFIG_MAP_NAME)
    assert set(config_map["data"]) == {p.name for p in (REPO / "policies").glob("*.y*ml")}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks = base_object(kind, "runguard")["webhooks"]
        assert hooks[0]["objectSelector"] == policy.first.selector.to_dict()
        for hook in hooks:
            assert set(hook["namespaceSelector"]["matchExpressions"][0]["values"]) == {
                "runguard",
                *policy.first.exclude_namespaces,
            }


def test_deployment_is_hardened() -> None:
    deployment = base_object("Deployment", "runguard")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = deployment_pod()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    spread = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["kubernetes.io/hostname"]["maxSkew"] == 1
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    probes = {
        name: (container[name]["httpGet"]["path"], container[name]["httpGet"]["scheme"])
        for name in ("readinessProbe", "livenessProbe")
    }
    assert probes == {
        "readinessProbe": ("/readyz", "HTTPS"),
        "livenessProbe": ("/healthz", "HTTPS"),
    }


# What a kubelet writes for a Secret volume (pkg/volume: secret's SetUpAt, then
# SetVolumeOwnership for a read-only volume): files owned by root:root with the volume's
# defaultMode; with an fsGroup, group fsGroup and the mode or'ed with 0440.
def secret_file_owner_and_mode(
    volume: dict[str, Any], fs_group: int | None
) -> tuple[int, int, int]:
    mode = volume["secret"].get("defaultMode", 0o644)
    if fs_group is None:
        return 0, 0, mode
    return 0, fs_group, mode | 0o440


def readable_by(uid: int, gids: set[int], owner: tuple[int, int, int]) -> bool:
    """POSIX read permission (no capabilities: the container drops ALL)."""
    file_uid, file_gid, mode = owner
    if uid == file_uid:
        return bool(mode & 0o400)
    if file_gid in gids:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def test_the_tls_key_is_readable_by_the_pods_user() -> None:
    """The crash a real kubelet showed (issue 20): the Secret mounted root:root 0440 and
    runguard running as 10001 with no fsGroup, ``[Errno 13] Permission denied``."""
    spec = deployment_pod()["spec"]
    security = spec["securityContext"]
    (container,) = spec["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # no DAC override
    uid = container["securityContext"].get("runAsUser", security["runAsUser"])
    gids = {security["runAsGroup"], *security.get("supplementalGroups", [])}
    fs_group = security.get("fsGroup")
    if fs_group is not None:
        gids.add(fs_group)
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    owner = secret_file_owner_and_mode(tls, fs_group)
    assert readable_by(uid, gids, owner), (uid, gids, oct(owner[2]))
    # The key is not world-readable, and without the fsGroup the same Pod could not read
    # it: the model above is the one that failed on the real node.
    assert not owner[2] & 0o004
    assert not readable_by(uid, {security["runAsGroup"]}, secret_file_owner_and_mode(tls, None))


def test_no_field_the_apiserver_drops() -> None:
    """An empty env value is omitted by the apiserver, so each `kubectl apply` sent it
    again and reported the Deployment "configured" (issue 20)."""
    for container in deployment_pod()["spec"]["containers"]:
        for env in container["env"]:
            assert env.get("value", None) != "", env["name"]


def test_base_objects_refer_to_each_other() -> None:
    deployment = base_object("Deployment", "runguard")
    pod = deployment_pod()
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    assert selects(base_object("PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert base_object("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    for constraint in pod["spec"]["topologySpreadConstraints"]:
        assert selects(constraint["labelSelector"]["matchLabels"])
    service = base_object("Service", manifests.DEFAULT_SERVICE)
    assert selects(service["spec"]["selector"])
    assert base_object("ServiceAccount", pod["spec"]["serviceAccountName"])

    # Service port 443 -> the container port the probes and RUNGUARD_BIND use.
    (port,) = service["spec"]["ports"]
    assert port["port"] == manifests.SERVICE_PORT
    (container_port,) = container["ports"]
    assert port["targetPort"] == container_port["name"] == "https"
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert env["RUNGUARD_BIND"] == f"0.0.0.0:{container_port['containerPort']}"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "https"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in base_object(kind, "runguard")["webhooks"]:
            assert hook["clientConfig"]["service"] == {
                "name": service["metadata"]["name"],
                "namespace": kustomization()["namespace"],
                "path": "/mutate" if kind.startswith("Mutating") else "/validate",
                "port": port["port"],
            }

    # Volumes: the policy ConfigMap and the TLS Secret, mounted where the env points.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["policies"]["configMap"]["name"] == manifests.CONFIG_MAP_NAME
    assert volumes["tls"]["secret"]["secretName"] == certs.SECRET_NAME
    assert env["RUNGUARD_POLICY_DIR"] == mounts["policies"]
    assert env["RUNGUARD_CERT_FILE"] == f"{mounts['tls']}/tls.crt"
    assert env["RUNGUARD_KEY_FILE"] == f"{mounts['tls']}/tls.key"
    assert "subPath" not in json.dumps(container["volumeMounts"])  # subPath mounts never update
    assert mounts["tmp"] == "/tmp" and "emptyDir" in volumes["tmp"]


def test_webhook_service_account_has_no_role_and_audit_role_is_what_audit_lists() -> None:
    from webhook.cli.audit import LISTS, VIEW_LISTS

    # The base binds nothing; the optional audit CronJob binds its own account, never
    # the webhook's; only the optional cluster-state component binds the webhook's, to
    # its read-only role (test_cluster_state_rbac_is_read_only_for_exactly_its_kinds).
    base = [d for name, objects in base_documents().items() if "/" not in name for d in objects]
    assert not [d for d in base if d["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding")]
    webhook_account = deployment_pod()["spec"]["serviceAccountName"]
    for name, objects in base_documents().items():
        for d in objects:
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                if name == "cluster-state/rbac.yaml":
                    assert d["roleRef"]["name"] == "runguard-cluster-state", d
                    continue
                if name == manifests.OPERATORS_RBAC_FILE:
                    assert d["roleRef"]["name"] == manifests.OPERATORS_ROLE, d
                    continue
                if name == "policy-objects/rbac.yaml":  # tests/policy/test_objects.py
                    webhooks = webhook_account in {s["name"] for s in d["subjects"]}
                    assert d["roleRef"]["name"] == (
                        "runguard-policy-objects" if webhooks else "runguard-audit-policy-objects"
                    ), d
                    continue
                assert webhook_account not in {s["name"] for s in d["subjects"]}, d
    granted = {
        (group, resource, verb)
        for rule in base_object("ClusterRole", "runguard-audit")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {
        (api_version.rpartition("/")[0], kind.lower() + "s", "list")
        for kind, api_version, *_ in LISTS
    } | {(group, resource, "list") for group, resource in VIEW_LISTS}
    assert granted == needed


def test_namespace_enforces_restricted_pod_security() -> None:
    namespace = base_object("Namespace")
    assert namespace["metadata"]["name"] == kustomization()["namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_image_tag_is_the_package_version() -> None:
    (image,) = kustomization()["images"]
    assert image["name"] == deployment_pod()["spec"]["containers"][0]["image"]
    assert image["newTag"] == webhook.__version__


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_kustomize_builds_the_base_with_certificates(tmp_path: Path) -> None:
    base = tmp_path / "manifests"
    shutil.copytree(BASE, base, ignore=shutil.ignore_patterns("certs"))
    assert main(["certs", "--out", str(base / "certs")]) == 0
    built = subprocess.run(
        ["kubectl", "kustomize", str(base)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    objects = list(yaml.safe_load_all(built.stdout))
    by_kind = {o["kind"]: o for o in objects}
    ca = (base / "certs" / "ca.crt").read_bytes()
    secret = by_kind["Secret"]
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == certs.SECRET_NAME
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]  # never ca.key
    for key, value in secret["data"].items():
        # One line, as the apiserver returns it: `kubectl apply` then has nothing to send.
        assert value == base64.b64encode((base / "certs" / key).read_bytes()).decode()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in by_kind[kind]["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
    for obj in objects:
        if obj["kind"] not in ("Namespace", "ClusterRole") and "Webhook" not in obj["kind"]:
            assert obj["metadata"]["namespace"] == "runguard", obj["kind"]
    image = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"runguard:{webhook.__version__}"


# --- the optional components: audit CronJob, PolicyReport CRD ---------------------------

COMPONENTS = ("audit-cronjob", "policyreport-crd", "cluster-state", "policy-objects")


def component(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((BASE / name / "kustomization.yaml").read_text())
    return data


def component_objects(name: str) -> list[dict[str, Any]]:
    return [
        obj
        for resource in component(name)["resources"]
        for obj in base_documents()[f"{name}/{resource}"]
    ]


def test_components_are_optional_and_list_their_files() -> None:
    for name in COMPONENTS:
        kustomization_ = component(name)
        assert kustomization_["kind"] == "Component", name
        on_disk = {p.name for p in (BASE / name).glob("*.yaml")} - {"kustomization.yaml"}
        assert set(kustomization_["resources"]) == on_disk, name
        # Not in the base: a cluster that already has the CRD, or wants no CronJob,
        # installs the base as it is.
        assert name not in kustomization().get("components", []), name
        assert not [r for r in kustomization()["resources"] if r.startswith(name)], name


def granted(roles: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_audit_cronjob_rbac_is_least_privilege() -> None:
    from webhook.cli.audit import LISTS, VIEW_LISTS
    from webhook.cli.audit_write import CLUSTER_REPORT_VERBS, FORMATS, REPORT_VERBS

    objects = component_objects("audit-cronjob")
    (cronjob,) = [o for o in objects if o["kind"] == "CronJob"]
    account = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert [o for o in objects if o["kind"] == "ServiceAccount"][0]["metadata"]["name"] == account
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert all(
        b["subjects"] == [{"kind": "ServiceAccount", "name": account}] for b in bindings
    )  # the namespace is the base's, set by kustomize
    roles = [
        base_object("ClusterRole", b["roleRef"]["name"])
        for b in bindings
        if b["roleRef"]["kind"] == "ClusterRole"
    ]
    assert len(roles) == len(bindings)  # no Role, no binding to a role defined elsewhere
    assert granted(roles) == {
        (api_version.rpartition("/")[0], kind.lower() + "s", "list")
        for kind, api_version, *_ in LISTS
    } | {(group, resource, "list") for group, resource in VIEW_LISTS} | {
        (form.group, form.plural, verb) for form in FORMATS.values() for verb in REPORT_VERBS
    } | {
        (form.group, form.cluster_plural, verb)
        for form in FORMATS.values()
        for verb in CLUSTER_REPORT_VERBS
    }
    for role in roles:
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]


def test_audit_cronjob_runs_audit_write_like_the_webhook_runs_serve() -> None:
    (cronjob,) = [o for o in component_objects("audit-cronjob") if o["kind"] == "CronJob"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    job = cronjob["spec"]["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] > 0 and job["backoffLimit"] <= 3
    spec = job["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    webhook_pod = deployment_pod()["spec"]
    (webhook_container,) = webhook_pod["containers"]
    assert container["image"] == webhook_container["image"]
    assert spec["securityContext"] == webhook_pod["securityContext"]
    assert container["securityContext"] == webhook_container["securityContext"]
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    # The policy it judges with is the one the webhook serves.
    args = container["args"]
    assert container["command"] == ["runguard"] and args[0] == "audit" and "--write" in args
    (mount,) = container["volumeMounts"]
    (volume,) = spec["volumes"]
    assert args[args.index("-p") + 1] == mount["mountPath"] and mount["readOnly"] is True
    assert volume == {"name": mount["name"], "configMap": {"name": manifests.CONFIG_MAP_NAME}}


def test_the_crd_accepts_the_reports_audit_writes() -> None:
    import jsonschema

    from webhook.audit.clusteraudit import audit
    from webhook.audit.policyreport import (
        CLUSTER_REPORT_PLURAL,
        REPORT_GROUP,
        REPORT_PLURAL,
        REPORT_VERSION,
        cluster_policy_report,
        to_policy_reports,
    )
    from webhook.engine import mutate

    crd, cluster_crd = component_objects("policyreport-crd")
    for name in component("policyreport-crd")["resources"]:
        text = (BASE / "policyreport-crd" / name).read_text()
        assert "wgpolicyk8s.io/v1alpha2" in text  # the WG's format, said in its header
    assert crd["metadata"]["name"] == f"{REPORT_PLURAL}.{REPORT_GROUP}"
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (REPORT_GROUP, "PolicyReport")
    assert crd["spec"]["scope"] == "Namespaced"
    assert cluster_crd["metadata"]["name"] == f"{CLUSTER_REPORT_PLURAL}.{REPORT_GROUP}"
    assert cluster_crd["spec"]["names"]["kind"] == "ClusterPolicyReport"
    assert cluster_crd["spec"]["scope"] == "Cluster"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == REPORT_VERSION]
    assert version["served"] is True
    (cluster_version,) = [v for v in cluster_crd["spec"]["versions"] if v["name"] == REPORT_VERSION]

    # What `runguard audit` writes passes that version's schema: a pass, a fail, a warn.
    def run(name: str, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r"}},
            "spec": {"containers": [{"name": "main", "image": "x"}], **spec},
        }  # fmt: skip

    policy = Policy.of(build_run_policy(RUN_POLICY, []))
    warn = Policy.of(
        build_run_policy({**RUN_POLICY, "spec": {**RUN_POLICY["spec"], "enforcement": "Warn"}}, [])
    )
    findings = audit([mutate(run("ok"), policy).object, run("host", hostNetwork=True)], policy)
    findings += audit([run("warned", hostNetwork=True)], warn)
    (report,) = to_policy_reports(findings, now=1_700_000_000.5)
    assert {r["result"] for r in report["results"]} == {"pass", "fail", "warn"}
    jsonschema.validate(report, version["schema"]["openAPIV3Schema"])
    typed = version["schema"]["openAPIV3Schema"]["properties"]["results"]["items"]["properties"]
    for result in report["results"]:  # every field Policy Reporter sorts by is typed
        assert {"timestamp", "severity", "category", "source"} <= set(result) & set(typed)
    cluster_report = cluster_policy_report(policy, now=1_700_000_000.5)
    jsonschema.validate(cluster_report, cluster_version["schema"]["openAPIV3Schema"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_kustomize_builds_the_base_with_the_components(tmp_path: Path) -> None:
    base = tmp_path / "manifests"
    shutil.copytree(BASE, base, ignore=shutil.ignore_patterns("certs"))
    assert main(["certs", "--out", str(base / "certs")]) == 0
    with (base / "kustomization.yaml").open("a") as k:
        k.write("components:\n" + "".join(f"  - {name}\n" for name in COMPONENTS))
    built = subprocess.run(
        ["kubectl", "kustomize", str(base)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built.stdout)}
    cronjob = objects["CronJob", "runguard-audit"]
    assert cronjob["metadata"]["namespace"] == "runguard"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"runguard:{webhook.__version__}"
    assert objects["ServiceAccount", "runguard-audit"]["metadata"]["namespace"] == "runguard"
    for name in ("runguard-audit", "runguard-audit-reports"):
        (subject,) = objects["ClusterRoleBinding", name]["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": "runguard-audit",
                           "namespace": "runguard"}  # fmt: skip
    assert ("CustomResourceDefinition", "policyreports.wgpolicyk8s.io") in objects


def test_cluster_state_rbac_is_read_only_for_exactly_its_kinds() -> None:
    """The watch cache's role grants get, list and watch on exactly the resources the
    cache watches (``webhook.clusterstate.RESOURCES``, ResourceClaims and projects'
    profiles), get on Pods
    (the Pod a shell is opened into, ``webhook.serving.shells``), and what a proxy to a Service
    is judged with (get the Service and its Endpoints, list its EndpointSlices and the
    Pods they reach),
    bound to the webhook's account, whose token the component mounts, and the component
    turns the cache on."""
    from webhook.clusterstate.model import RESOURCES
    from webhook.serving.settings import BY_NAME

    objects = component_objects("cluster-state")
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert sorted(b["roleRef"]["name"] for b in bindings) == sorted(roles)
    account = deployment_pod()["spec"]["serviceAccountName"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "ClusterRole"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert granted([roles["runguard-cluster-state"]]) == {
        (group, resource, verb)
        for group, _, resource in RESOURCES.values()
        for verb in ("get", "list", "watch")
    } | {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "services", "get"),
         ("", "endpoints", "get"), ("discovery.k8s.io", "endpointslices", "list")} | {
        ("resource.k8s.io", resource, verb) for verb in ("get", "list", "watch")
        for resource in ("resourceclaims", "resourceclaimtemplates")
    } | {("runguard.io", "projectprofiles", verb) for verb in ("get", "list", "watch")}  # fmt: skip
    # the operators' kinds the shipped policies name, and nothing else
    policy = load_policy(REPO / "policies")
    kinds = {k for p in policy.run_policies for k in p.platform.operator_kinds}
    assert kinds  # the shipped digitalhub policy names Argo, KubeAI and KubeRay
    assert granted([roles[manifests.OPERATORS_ROLE]]) == {
        (k.rpartition("/")[0], manifests.plural(k.rpartition("/")[2]), verb)
        for k in kinds
        for verb in ("get", "list", "watch")
    }
    for role in roles.values():
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
    (patch,) = component("cluster-state")["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "runguard"}
    operations = {op["path"]: op["value"] for op in yaml.safe_load(patch["patch"])}
    assert operations["/spec/template/spec/automountServiceAccountToken"] is True
    assert operations["/spec/template/spec/containers/0/env/-"] == {
        "name": BY_NAME["cluster_state"].env,
        "value": "in-cluster",
    }
    assert operations["/spec/template/spec/volumes/-"] == {
        "name": "shm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"},
    }  # the runtime's 64 MB /dev/shm holds ~130k objects; this one ~500k
    assert operations["/spec/template/spec/containers/0/volumeMounts/-"] == {
        "name": "shm",
        "mountPath": "/dev/shm",
    }


def test_run_user_role_grants_the_runs_and_no_door_admission_cannot_see() -> None:
    """ClusterRole runguard-run-user: what a run namespace's users need (runs and their
    controllers, the operators' kinds the policy names, logs and events), and nothing
    ``runguard audit --rbac`` reports, even with the shells webhook off."""
    from webhook.audit.rbacreport import platform_of, rbac_report

    policy = load_policy(REPO / "policies")
    role = base_object("ClusterRole", manifests.RUN_USER_ROLE)
    rights = granted([role])
    for kind in {k for p in policy.run_policies for k in p.platform.operator_kinds}:
        group, _, name = kind.rpartition("/")
        for verb in ("create", "get", "list", "watch", "delete", "update", "patch"):
            assert (group, manifests.plural(name), verb) in rights, (kind, verb)
    for needed in [("", "pods", "create"), ("", "pods/log", "get"), ("batch", "jobs", "create"),
                   ("batch", "cronjobs", "delete"), ("apps", "deployments", "patch"),
                   ("", "configmaps", "create"), ("", "persistentvolumeclaims", "create"),
                   ("", "events", "list")]:  # fmt: skip
        assert needed in rights, needed
    assert not {r for r in rights if r[1] in ("secrets", "serviceaccounts/token")}
    assert not {r for r in rights if "/" in r[1] and r[1] != "pods/log"}  # no connection
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "team", "namespace": "team-a"},
        "roleRef": {"kind": "ClusterRole", "name": manifests.RUN_USER_ROLE},
        "subjects": [{"kind": "Group", "name": "team-a"}, {"kind": "User", "name": "bob"}],
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    report = rbac_report([namespace, role, binding], platform_of(policy), shells=False)
    assert report.namespaces == ["team-a"] and report.findings == []
