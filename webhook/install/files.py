"""The generated files of ``manifests/`` and the chart: the webhook configurations, the
policy ConfigMap, the policy objects' CRDs and webhook, the cluster-state component's
RBAC for the operators' kinds, the run user's role; written as YAML.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from webhook.engine.rules.operators import plural
from webhook.engine.rules.ownership import enabled as ownership_enabled
from webhook.install.floor import floor_policies
from webhook.install.names import (
    AVAILABLE_MODE_FILE,
    CONFIG_MAP_FILE,
    CONFIG_MAP_NAME,
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    FLOOR_FILE,
    LABELS,
    MIN_KUBERNETES,
    POLICY_OBJECTS_DIR,
    POLICY_WEBHOOK_FILE,
    SHELLS_WEBHOOK_FILE,
    WEBHOOKS_FILE,
)
from webhook.install.webhooks import (
    policy_object_webhook,
    shells_webhook_configuration,
    webhook_configurations,
)
from webhook.policy.model import Policy


def policy_object_files(namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """The generated files of the policy-objects component: the CRDs (their schema
    generated from the policy model) and the webhook configuration that checks them."""
    from webhook.policy.crd import CRD_FILES, policy_crds

    files = {
        f"{POLICY_OBJECTS_DIR}/{CRD_FILES[crd['spec']['names']['kind']]}": to_yaml(
            [crd], _CRD_HEADER
        )
        for crd in policy_crds()
    }
    files[POLICY_WEBHOOK_FILE] = to_yaml([policy_object_webhook(namespace=namespace)], _HEADER)
    return files


OPERATORS_RBAC_FILE = "cluster-state/operators-rbac.yaml"
OPERATORS_ROLE = "runguard-cluster-state-operators"


def operators_watch_rbac(policy: Policy) -> list[dict[str, Any]]:
    """The cluster-state component's ClusterRole for the operators' kinds the policy names
    (get, list, watch: the watch cache follows an operator's Pods to its custom
    resources, or to the Pods that created them: ``pods`` in the core group ""), and its
    binding to the webhook's ServiceAccount."""
    by_group: dict[str, set[str]] = {}
    for p in policy.run_policies:
        if ownership_enabled(p):
            for group_kind in p.platform.operator_kinds:
                group, _, kind = group_kind.rpartition("/")
                by_group.setdefault(group, set()).add(plural(kind))
    rules = [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": ["get", "list", "watch"]}
        for group, resources in sorted(by_group.items())
    ]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
         "metadata": {"name": OPERATORS_ROLE, "labels": dict(LABELS)}, "rules": rules},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": OPERATORS_ROLE, "labels": dict(LABELS)},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": OPERATORS_ROLE},
         # its namespace is the base's, set by kustomize
         "subjects": [{"kind": "ServiceAccount", "name": DEFAULT_SERVICE}]},
    ]  # fmt: skip


RUN_USER_ROLE_FILE = "run-user-role.yaml"
RUN_USER_ROLE = "runguard-run-user"
# What a user of a run namespace needs, each through an admission request runguard can
# judge: runs and their controllers written (created, changed, deleted), their logs and
# events read. None of what `runguard audit --rbac` reports: no Secret or ConfigMap read,
# no update of a ConfigMap's data, no connection into a Pod, token, impersonation,
# Service, Ingress or NetworkPolicy written. A workload's `scale` subresource is left
# out too: `replicas` is changed by a patch of the object, which runguard judges.
_KEEP = ["create", "delete", "get", "list", "watch"]
_WRITE = [*_KEEP, "update", "patch"]
_READ = ["get", "list", "watch"]
RUN_USER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": _KEEP},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # Created (a platform name is refused at CREATE) and deleted, never updated: an
    # update of a ConfigMap's data is judged by no admission webhook of runguard's. Nor
    # read: a read of the platform's ConfigMaps is no admission request (her Pods read
    # hers).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": _KEEP},
    {"apiGroups": [""], "resources": ["events", "limitranges", "resourcequotas", "services",
                                      "endpoints"], "verbs": _READ},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": _WRITE},
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": _WRITE},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": _READ},
]  # fmt: skip


def run_user_role(policy: Policy) -> dict[str, Any]:
    """ClusterRole ``runguard-run-user``, for a RoleBinding per run namespace: what its
    users need (``RUN_USER_RULES``) and the operators' kinds the policy names, written
    like the workloads (runguard judges them at admission)."""
    by_group: dict[str, set[str]] = {}
    for p in policy.run_policies:
        for group_kind in p.platform.operator_kinds:
            group, _, kind = group_kind.rpartition("/")
            if group:  # Pod: a core kind, in the rules already
                by_group.setdefault(group, set()).add(plural(kind))
    operators = [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(_WRITE)}
        for group, resources in sorted(by_group.items())
    ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": RUN_USER_ROLE, "labels": dict(LABELS)},
        "rules": [{**r, "verbs": list(r["verbs"])} for r in RUN_USER_RULES] + operators,
    }


def read_policy_files(directory: Path) -> dict[str, str]:
    """The text of each policy file the loader reads, by file name."""
    # The loader decides which files make a policy; the ConfigMap must hold exactly those.
    from webhook.policy.loader import policy_files

    return {p.name: p.read_text(encoding="utf-8") for p in policy_files(directory)}


def policy_config_map(
    files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, Any]:
    """The ConfigMap mounted as runguard's policy directory: one key per policy file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP_NAME, "namespace": namespace, "labels": dict(LABELS)},
        "data": dict(sorted(files.items())),
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (policy files in the ConfigMap) as readable literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # kubectl users read these files: no &id001 anchors


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
YamlDumper = _Dumper  # for other renderings of the same objects (webhook/install/chart.py)


def to_yaml(objects: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """Multi-document YAML, keys in the order built (apiVersion, kind, metadata first)."""
    body = yaml.dump_all(
        [dict(o) for o in objects],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
        allow_unicode=True,
        width=100,
    )
    return header + body


REQUIRES = (
    f"# Needs Kubernetes {MIN_KUBERNETES}+: the webhooks route by CEL matchConditions (GA in "
    f"{MIN_KUBERNETES}).\n"
)
_HEADER = (
    "# Generated from policies/ by `runguard manifests -p policies --write manifests`.\n"
    "# Do not edit: edit policies/ and regenerate (tests/install/test_manifests.py checks it).\n"
)


_RUN_USER_HEADER = (
    "#\n"
    "# The recommended role of a run namespace's users: bind it there, e.g.\n"
    "#   kubectl create rolebinding run-users -n NAMESPACE \\\n"
    "#     --clusterrole=runguard-run-user --group=TEAM\n"
    "# `runguard audit --rbac` lists none of its verbs (docs/threat-model.md).\n"
)
_CRD_HEADER = (
    "# Generated from the policy model (webhook/policy/model/, the same as\n"
    "# webhook/policy/runguard.schema.json) by `runguard manifests --write manifests`.\n"
    "# Do not edit: tests/install/test_manifests.py checks it.\n"
)


_FLOOR_HEADER = (
    "# The floor: the rules that need no cluster state, as ValidatingAdmissionPolicies the\n"
    "# apiserver runs itself, so they hold while runguard is unreachable (docs/operations.md,\n"
    '# "Outages"). Needs Kubernetes 1.30+ (ValidatingAdmissionPolicy GA).\n'
)


def available_mode(policy: Policy, *, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """The kustomize component of the available mode: the webhooks that judge runs fail
    open (``failurePolicy: Ignore``), each by its index in its configuration."""
    closed = webhook_configurations(policy, namespace=namespace)
    opened = webhook_configurations(policy, namespace=namespace, available=True)
    patches = []
    for shut, open_ in zip(closed, opened, strict=True):
        ops = [
            {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": "Ignore"}
            for i, (a, b) in enumerate(zip(shut["webhooks"], open_["webhooks"], strict=True))
            if a["failurePolicy"] != b["failurePolicy"]
        ]
        patches.append(
            {
                "target": {"kind": shut["kind"], "name": shut["metadata"]["name"]},
                "patch": yaml.dump(ops, Dumper=_Dumper, sort_keys=False, width=100),
            }
        )
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "metadata": {"name": AVAILABLE_MODE_FILE.split("/")[0], "labels": dict(LABELS)},
        "patches": patches,
    }


_AVAILABLE_HEADER = (
    "# Optional component: the available mode. The webhooks that judge runs fail open\n"
    "# (failurePolicy: Ignore): while runguard is unreachable, runs are admitted unmutated,\n"
    "# judged only by the floor (floor.yaml). What that gives up: docs/operations.md,\n"
    '# "Outages". Enable it in manifests/kustomization.yaml:\n'
    "#\n"
    "#   components:\n"
    "#     - available-mode\n"
)


def generated_files(
    policy: Policy, files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, str]:
    """The generated files of the kustomize base, by name: text to write.

    The webhook configurations carry no ``caBundle``: kustomize copies it from the TLS
    Secret's ``ca.crt`` (see ``manifests/kustomization.yaml``), so it cannot drift either.
    """
    return {
        WEBHOOKS_FILE: to_yaml(
            webhook_configurations(policy, namespace=namespace), _HEADER + REQUIRES
        ),
        FLOOR_FILE: to_yaml(floor_policies(policy, namespace=namespace), _HEADER + _FLOOR_HEADER),
        AVAILABLE_MODE_FILE: to_yaml(
            [available_mode(policy, namespace=namespace)], _HEADER + _AVAILABLE_HEADER
        ),
        CONFIG_MAP_FILE: to_yaml([policy_config_map(files, namespace=namespace)], _HEADER),
        OPERATORS_RBAC_FILE: to_yaml(operators_watch_rbac(policy), _HEADER),
        RUN_USER_ROLE_FILE: to_yaml([run_user_role(policy)], _HEADER + _RUN_USER_HEADER),
        SHELLS_WEBHOOK_FILE: to_yaml(
            [shells_webhook_configuration(policy, namespace=namespace)], _HEADER
        ),
        **policy_object_files(namespace),
    }
