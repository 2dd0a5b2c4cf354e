"""Attacks through doors admission cannot see, which ``runguard audit --rbac`` reports
(``webhook/audit/rbacreport.py``): a role reading the platform's ConfigMaps, a subject
that may grant itself a door.

The attacker is ``alice`` with the built-in ``edit`` ClusterRole in a run namespace, or
bound to the recommended ``runguard-run-user``. A chain passes when every step passes: a
test asserts that some step is refused, or shown by the report.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.attack_chains import _role_binding, judged_by, plain
from harness.shipped import ALICE, SHIPPED

from webhook.audit.rbacreport import platform_of, rbac_report
from webhook.install import manifests


def test_the_recommended_role_reads_the_platforms_config_maps() -> None:
    """Chain: the platform's run reads ``init-config-map-r1`` into its environment; a Pod
    of hers reading it is refused (``ownership.not-a-run``: "only its runs may read
    it"), and its volume is stripped from her runs. Bound to the recommended
    ``runguard-run-user`` (``get, list, watch configmaps``, no resourceNames), she
    ``kubectl get configmap init-config-map-r1 -o yaml`` and reads it whole, with no
    admission request, and the report shows nothing (its doors read Secrets only).
    Gap: ``webhook/audit/rbacreport.py`` ``DOORS`` and ``webhook/install/manifests.py``
    ``RUN_USER_RULES``. Fix: a door ``rbac.read-config-maps`` (get/list/watch of
    ``configmaps``, narrowed by resourceNames against ``volumes.platformConfigMaps``
    and the operators' ``configMaps``), and the recommended role without ``get/list/
    watch configmaps`` (``create, delete`` stay; a user reads hers from her Pods).
    Refused now: the role grants no read, and a role that does is reported."""
    reader = plain("copy")
    reader["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "init-config-map-r1"}}]
    assert not judged_by(reader, ALICE).allowed  # what her Pods may not read
    role = manifests.run_user_role(SHIPPED)
    rbac = "rbac.authorization.k8s.io/v1"

    def shown(role: dict[str, Any]) -> list[str]:
        objects = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
            role,
            {"apiVersion": rbac, "kind": "RoleBinding",
             "metadata": {"name": "b", "namespace": "ml"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": role["metadata"]["name"]},
             "subjects": [{"kind": "User", "name": "alice"}]},
        ]  # fmt: skip
        report = rbac_report(objects, platform_of(SHIPPED), shells=True)
        return [f"{f.subject} {f.door.id}" for f in report.unexpected()]

    # The recommended role no longer reads ConfigMaps (the step is refused by RBAC) ...
    reads = [r for r in role["rules"] if "configmaps" in r["resources"]
             and {"get", "list", "watch"} & set(r["verbs"])]  # fmt: skip
    assert reads == [] and shown(role) == []
    # ... and a role that does (the recommended one as it was) is shown.
    old = copy.deepcopy(role)
    old["metadata"]["name"] = "as-it-was"
    old["rules"].append({"apiGroups": [""], "resources": ["configmaps"],
                         "verbs": ["get", "list", "watch"]})  # fmt: skip
    assert shown(old) == ["User alice rbac.read-config-maps"]


@pytest.mark.parametrize(
    "grant",
    [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "verbs": ["bind"], "resourceNames": ["admin"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
         "verbs": ["escalate", "create", "update"]},
    ],
    ids=["bind", "escalate"],
)  # fmt: skip
def test_a_subject_that_may_grant_itself_a_door_is_reported(grant: dict[str, Any]) -> None:
    """Chain: a role in the run namespace with ``create rolebindings`` and ``bind`` on the
    ClusterRole ``admin`` (or ``escalate`` on Roles): she binds herself ``admin`` (or
    writes a Role with ``get secrets``) and reads the platform's Secrets. Today's report
    shows nothing until she has done it: it reads the rules a subject holds, not the
    ones it may grant itself (``docs/threat-model.md`` assumes no such role, "the report
    shows the result": after the fact). Gap: ``webhook/audit/rbacreport.py`` ``DOORS``.
    Fix: a door ``rbac.grant`` (``bind`` on a role that holds a door, or ``escalate`` on
    roles, with ``create``/``update`` of the bindings or roles), or resolve what a
    ``bind`` names into the subject's rules (resourceNames: those roles only)."""
    create = {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
              "verbs": ["create"]}  # fmt: skip
    report = rbac_report(_role_binding("ml", [create, grant]), platform_of(SHIPPED), shells=True)
    assert [str(f.subject) for f in report.unexpected()]
