"""``webhook/engine/rules/volumes.py`` on its own: step 6 ``drop_preexisting_volumes`` and
``check_volumes`` on a ``Pod`` built directly: volume types, the platform's claims and
ConfigMaps, projected sources and claim templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.pods import NOT_PLATFORM, container, pod_of, policy_of

from webhook.engine.rules.volumes import (
    VOLUMES_FORBIDDEN_TYPE,
    VOLUMES_PRE_EXISTING,
    check_volumes,
    drop_preexisting_volumes,
)
from webhook.policy.model import Policy

RUN = {"dhcore/run": "r1"}
TYPES = ["persistentVolumeClaim", "emptyDir", "ephemeral", "configMap", "projected", "nfs"]


def policy(tmp_path: Path, *, on_pre_existing: str = "Strip", **volumes: Any) -> Policy:
    return policy_of(
        tmp_path,
        {
            "security": {"level": "baseline"},
            "volumes": {
                "allowedTypes": TYPES,
                "platformClaims": ["v-{labels[dhcore/run]}-*"],
                "platformConfigMaps": ["init-{labels[dhcore/run]}"],
                "sharedConfigMaps": ["public-ca"],
                "onPreExisting": on_pre_existing,
                **volumes,
            },
        },
    )


def mounted(*volumes: dict[str, Any]) -> dict[str, Any]:
    mounts = [{"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes]
    return {"containers": [container(volumeMounts=mounts)], "volumes": list(volumes)}


def pvc(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def config_map(name: str, cm: str) -> dict[str, Any]:
    return {"name": name, "configMap": {"name": cm}}


PLATFORMS = (
    pvc("data", "v-r1-data"),
    config_map("init", "init-r1"),
    config_map("ca", "public-ca"),
    {"name": "tmp", "emptyDir": {}},
)
CLONE = {
    "name": "clone",
    "ephemeral": {"volumeClaimTemplate": {"spec": {"dataSource": {"kind": "PersistentVolumeClaim",
                                                                  "name": "prod-db"}}}},
}  # fmt: skip


def test_strip_removes_each_pre_existing_volume_with_its_mounts(tmp_path: Path) -> None:
    run = pod_of(
        policy(tmp_path),
        mounted(pvc("theirs", "prod-db"), config_map("cm", "kube-proxy"), CLONE, *PLATFORMS),
        labels=RUN,
    )
    change = drop_preexisting_volumes(run)
    assert change is not None and change.rule == VOLUMES_PRE_EXISTING
    assert run.spec == mounted(*PLATFORMS)
    assert check_volumes(run) == []
    assert drop_preexisting_volumes(run) is None  # a fixed point


def test_strip_leaves_the_platforms_and_the_shared_volumes(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), mounted(*PLATFORMS), labels=RUN)
    assert drop_preexisting_volumes(run) is None
    assert run.spec == mounted(*PLATFORMS)
    assert check_volumes(run) == []


LABELS = {"fieldPath": "metadata.labels"}


def test_strip_drops_only_the_foreign_source_of_a_projected_volume(tmp_path: Path) -> None:
    projected = {
        "name": "bundle",
        "projected": {
            "sources": [
                {"configMap": {"name": "kube-root-ca.crt"}},
                {"configMap": {"name": "kube-proxy"}},
                {"downwardAPI": {"items": [{"path": "l", "fieldRef": LABELS}]}},
            ]
        },
    }  # fmt: skip
    run = pod_of(policy(tmp_path), mounted(projected), labels=RUN)
    found = check_volumes(run)
    assert [(v.rule, v.path) for v in found] == [
        (VOLUMES_PRE_EXISTING, "spec.volumes[0].projected.sources[1].configMap")
    ]
    change = drop_preexisting_volumes(run)
    assert change is not None and change.rule == VOLUMES_PRE_EXISTING
    sources = run.spec["volumes"][0]["projected"]["sources"]
    assert sources == [projected["projected"]["sources"][0], projected["projected"]["sources"][2]]
    assert run.spec["containers"][0]["volumeMounts"] == [{"name": "bundle", "mountPath": "/bundle"}]


def test_deny_keeps_the_volumes_and_the_check_names_each(tmp_path: Path) -> None:
    spec = mounted(pvc("theirs", "prod-db"), config_map("cm", "kube-proxy"), CLONE)
    run = pod_of(policy(tmp_path, on_pre_existing="Deny"), spec, labels=RUN)
    assert drop_preexisting_volumes(run) is None
    assert run.spec == spec
    assert [(v.rule, v.path) for v in check_volumes(run)] == [
        (VOLUMES_PRE_EXISTING, "spec.volumes[0]"),
        (VOLUMES_PRE_EXISTING, "spec.volumes[1]"),
        (VOLUMES_PRE_EXISTING, "spec.volumes[2]"),
    ]


def test_the_platforms_claim_in_a_run_it_did_not_create_is_pre_existing(
    tmp_path: Path,
) -> None:
    spec = mounted(pvc("data", "v-r1-data"), config_map("init", "init-r1"))
    run = pod_of(policy(tmp_path), spec, labels=RUN, ownership=NOT_PLATFORM)
    found = check_volumes(run)
    assert [(v.rule, v.path) for v in found] == [
        (VOLUMES_PRE_EXISTING, "spec.volumes[0]"),
        (VOLUMES_PRE_EXISTING, "spec.volumes[1]"),
    ]
    assert all("only runs the platform creates" in v.message for v in found)
    assert drop_preexisting_volumes(run) is not None
    assert "volumes" not in run.spec


def test_a_type_outside_allowed_types_is_forbidden(tmp_path: Path) -> None:
    node = {"name": "node", "hostPath": {"path": "/var/run"}}
    spec = mounted(node, {"name": "t", "emptyDir": {}})
    run = pod_of(policy(tmp_path), spec, labels=RUN)
    assert [(v.rule, v.path) for v in check_volumes(run)] == [
        (VOLUMES_FORBIDDEN_TYPE, "spec.volumes[0]")
    ]


def test_restricted_forbids_a_type_the_list_allows(tmp_path: Path) -> None:
    nfs = mounted({"name": "share", "nfs": {"server": "nas", "path": "/x"}})
    assert check_volumes(pod_of(policy(tmp_path / "b"), nfs, labels=RUN)) == []  # baseline
    restricted = policy_of(
        tmp_path / "r", {"security": {"level": "restricted"}, "volumes": {"allowedTypes": TYPES}}
    )
    [violation] = check_volumes(pod_of(restricted, nfs, labels=RUN))
    assert (violation.rule, violation.path) == (VOLUMES_FORBIDDEN_TYPE, "spec.volumes[0]")
    assert "Pod Security level restricted" in violation.message


def test_an_allowed_host_path_only_for_the_platforms_runs(tmp_path: Path) -> None:
    socket = mounted({"name": "sock", "hostPath": {"path": "/run/csi/ml"}})
    allowing = policy(tmp_path, allowedHostPaths=["/run/csi/{namespace}"])
    assert check_volumes(pod_of(allowing, socket, labels=RUN, namespace="ml")) == []
    other = pod_of(allowing, socket, labels=RUN, namespace="other")
    assert [v.rule for v in check_volumes(other)] == [VOLUMES_FORBIDDEN_TYPE]
    users = pod_of(allowing, socket, labels=RUN, namespace="ml", ownership=NOT_PLATFORM)
    assert [v.rule for v in check_volumes(users)] == [VOLUMES_FORBIDDEN_TYPE]


def test_a_claim_template_that_copies_data_is_pre_existing(tmp_path: Path) -> None:
    templates = (
        ("spec.volumeClaimTemplates[0]", {"spec": {"volumeName": "pv-prod"}}),
        ("spec.volumeClaimTemplates[1]", {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
    )
    run = pod_of(policy(tmp_path), labels=RUN, claim_templates=templates)
    assert [(v.rule, v.path) for v in check_volumes(run)] == [
        (VOLUMES_PRE_EXISTING, "spec.volumeClaimTemplates[0].spec")
    ]
