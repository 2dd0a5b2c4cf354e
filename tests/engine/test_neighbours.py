"""Beside the cluster's neighbours: a vertical autoscaler's limits, meshes' sidecars and
CA bundles, their init containers, and device families (``docs/neighbours.md``)."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from harness import REPO, TESTS, run_pod
from harness.meshes import CA_MOUNTS, CA_VOLUMES, ISTIO_RESOURCES, istio_injected

from webhook.engine import evaluate, validate
from webhook.engine.context import Context, Requester
from webhook.policy.loader import load_policy
from webhook.policy.model import (
    DeviceFamily,
    NamePattern,
    Policy,
    Profile,
    RunPolicy,
    VolumesConfig,
)

PLATFORM = load_policy(TESTS / "cases" / "_policies" / "platform")


def run(containers: list[dict[str, Any]], profile: str = "1xa100", **spec: Any) -> dict[str, Any]:
    """A run naming ``profile``, with these containers (``run_pod``'s metadata)."""
    pod = run_pod(**spec)
    pod["metadata"]["labels"]["dhcore/template"] = profile
    pod["spec"] = {"containers": containers, **spec}
    return pod


# --- the profile wins against limits ---------------------------------------------------


def test_a_limit_below_the_profiles_request_is_raised_to_it() -> None:
    # A vertical autoscaler (or the user) left cpu 3 as the limit; the profile asks 8.
    pod = run(
        [
            {
                "name": "main",
                "image": "x",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "3", "memory": "8Gi"}},
            }
        ]
    )
    decision = evaluate(pod, PLATFORM)
    assert decision.allowed, decision.violations
    main = decision.object["spec"]["containers"][0]
    assert main["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    assert any("cpu limit 3 -> 8 (its request)" in w for w in decision.warnings)


def test_a_limit_above_the_profiles_request_is_kept() -> None:
    pod = run([{"name": "main", "image": "x", "resources": {"limits": {"cpu": "12"}}}])
    main = evaluate(pod, PLATFORM).object["spec"]["containers"][0]
    assert main["resources"]["requests"]["cpu"] == "8"
    assert main["resources"]["limits"]["cpu"] == "12"


def test_the_profiles_own_limit_wins_over_the_runs() -> None:
    # 1xa100 names its memory limit: the run's lower one is replaced by it, not the request.
    pod = run([{"name": "main", "image": "x", "resources": {"limits": {"memory": "1Gi"}}}])
    main = evaluate(pod, PLATFORM).object["spec"]["containers"][0]
    assert main["resources"]["requests"]["memory"] == "32Gi"
    assert main["resources"]["limits"]["memory"] == "64Gi"


def test_only_the_main_containers_limits_are_raised_and_twice_is_once() -> None:
    pod = run(
        [
            {"name": "main", "image": "x", "resources": {"limits": {"cpu": "3"}}},
            {"name": "side", "image": "x", "resources": {"limits": {"cpu": "1"}}},
        ]
    )
    once = evaluate(pod, PLATFORM).object
    main, side = once["spec"]["containers"]
    assert main["resources"]["limits"]["cpu"] == "8"
    assert side["resources"]["limits"] == {"cpu": "1", "memory": "282Mi"}
    again = evaluate(copy.deepcopy(once), PLATFORM)
    assert again.object == once
    assert again.patch == []


# --- shared add-on ConfigMaps ----------------------------------------------------------

SHIPPED = load_policy(REPO / "policies")
RUNS = SHIPPED.named("digitalhub")
CORE = Context(Requester("system:serviceaccount:digitalhub:core"))
ALICE = Context(Requester("alice", ("developers",)))


def with_shared(
    policy: RunPolicy, shared: tuple[str, ...], platform: tuple[str, ...] = ()
) -> Policy:
    """``policy`` with these shared (and platform) ConfigMap patterns, as lint would not
    let them be written together: what the engine does on its own."""
    volumes = policy.volumes.model_copy(
        update={
            "shared_config_maps": tuple(NamePattern.compile(t) for t in shared),
            "platform_config_maps": policy.volumes.platform_config_maps
            + tuple(NamePattern.compile(t) for t in platform),
        }
    )
    return Policy.of(policy.model_copy(update={"volumes": volumes}))


def test_a_shared_configmap_is_kept_in_every_volume_form_and_the_environment() -> None:
    projected = {
        "name": "bundle",
        "projected": {
            "sources": [
                {"configMap": {"name": "istio-ca-root-cert"}},
                {"configMap": {"name": "someone-elses"}},
            ]
        },
    }
    env = [
        {
            "name": "TRUST",
            "valueFrom": {
                "configMapKeyRef": {"name": "linkerd-identity-trust-roots", "key": "ca-bundle.crt"}
            },
        }
    ]
    pod = run(
        [{"name": "main", "image": "x", "env": env, "volumeMounts": CA_MOUNTS}],
        volumes=[*CA_VOLUMES, projected],
    )
    decision = evaluate(pod, SHIPPED, context=CORE)
    assert decision.allowed, decision.violations
    spec = decision.object["spec"]
    assert spec["volumes"] == [
        *CA_VOLUMES,
        {
            "name": "bundle",
            "projected": {"sources": [{"configMap": {"name": "istio-ca-root-cert"}}]},
        },
    ]
    assert spec["containers"][0]["volumeMounts"] == CA_MOUNTS
    assert spec["containers"][0]["env"][0] == env[0]  # then the profile's


def test_without_the_declaration_the_ca_bundle_is_pre_existing_data() -> None:
    policy = with_shared(RUNS, ("kube-root-ca.crt",))
    pod = run([{"name": "main", "image": "x", "volumeMounts": CA_MOUNTS}], volumes=CA_VOLUMES)
    spec = evaluate(pod, policy, context=CORE).object["spec"]
    assert "volumes" not in spec
    assert "volumeMounts" not in spec["containers"][0]


def test_kube_root_ca_in_a_configmap_volume_is_shared_by_default() -> None:
    assert VolumesConfig().shared_config_maps == (NamePattern.compile("kube-root-ca.crt"),)
    volume = {"name": "ca", "configMap": {"name": "kube-root-ca.crt"}}
    pod = run([{"name": "main", "image": "x"}], volumes=[volume])
    assert evaluate(pod, PLATFORM).object["spec"]["volumes"] == [volume]


def test_a_shared_name_is_nobodys_even_where_a_platform_pattern_would_take_it() -> None:
    # lint refuses writing both; the engine still lets shared win
    policy = with_shared(RUNS, ("istio-ca-root-cert",), platform=("istio-*",))
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ml", "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "web", "image": "nginx"}],
            "volumes": [{"name": "ca", "configMap": {"name": "istio-ca-root-cert"}}],
        },
    }
    assert evaluate(plain, policy, context=ALICE).violations == []
    crl = copy.deepcopy(plain)
    crl["spec"]["volumes"] = [{"name": "crl", "configMap": {"name": "istio-ca-crl"}}]
    assert [v.rule for v in evaluate(crl, policy, context=ALICE).violations] == [
        "ownership.not-a-run"
    ]
    created = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "ml"},
        "data": {"root-cert.pem": "..."},
    }
    assert validate(created, policy, context=ALICE).violations == []
    created["metadata"]["name"] = "istio-ca-crl"
    assert [v.rule for v in validate(created, policy, context=ALICE).violations] == [
        "ownership.reserved-name"
    ]


# --- room for a sidecar ----------------------------------------------------------------


def istio_meshed(profile: str, cni: bool = True) -> dict[str, Any]:
    """A run naming ``profile`` as Istio's injector leaves it (``harness.meshes``)."""
    return istio_injected(run([{"name": "main", "image": "python:3.11"}], profile), cni=cni)


@pytest.mark.parametrize("profile", ["1xa100", "2xa100", "cpu-large"])
def test_a_meshed_run_of_a_shipped_profile_is_admitted_with_its_ca_bundle(profile: str) -> None:
    pod = istio_meshed(profile)
    decision = evaluate(pod, SHIPPED, context=CORE)
    assert decision.allowed, decision.violations
    spec = decision.object["spec"]
    assert spec["volumes"] == pod["spec"]["volumes"]
    validation, proxy = spec["initContainers"]
    assert proxy["volumeMounts"] == pod["spec"]["initContainers"][1]["volumeMounts"]
    assert proxy["resources"] == ISTIO_RESOURCES  # the sidecar's own, untouched
    assert validation["resources"] == ISTIO_RESOURCES
    main = spec["containers"][0]["resources"]
    asked = SHIPPED.first.profiles[profile].resources
    assert {k: main["requests"][k] for k in asked.requests} == dict(asked.requests)
    assert {k: main["limits"][k] for k in asked.limits} == dict(asked.limits)


def test_at_the_profiles_own_size_the_maximums_refuse_a_meshed_run(tmp_path: Path) -> None:
    """The maximums as they were, at the largest profile: the sidecar tips the run over."""
    for path in (REPO / "policies").glob("*.yaml"):
        text = path.read_text().replace('cpu: "18"', 'cpu: "16"').replace("66Gi", "64Gi")
        (tmp_path / path.name).write_text(text)
    decision = evaluate(istio_meshed("2xa100"), load_policy(tmp_path), context=CORE)
    assert {(v.rule, v.path) for v in decision.violations} == {
        ("resources.exceeded", "spec.resources.requests.cpu"),
        ("resources.exceeded", "spec.resources.requests.memory"),
        ("resources.exceeded", "spec.resources.limits.memory"),
    }


# --- an injector's init container needing NET_ADMIN -------------------------------------


def test_a_mesh_init_container_losing_net_admin_says_why_and_what_to_do() -> None:
    pod = istio_meshed("1xa100", cni=False)
    decision = evaluate(pod, SHIPPED, context=CORE)
    assert decision.allowed, decision.violations
    assert (
        "runguard: NET_ADMIN removed, a mesh cannot redirect traffic (use its CNI mode): "
        "istio-init" in decision.warnings
    )
    init = decision.object["spec"]["initContainers"][0]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["runAsUser"] == 8877  # root replaced, as for any run
    # the mesh's CNI mode needs nothing removed, so nothing is said
    meshed = evaluate(istio_meshed("1xa100"), SHIPPED, context=CORE)
    assert not any("NET_ADMIN" in w for w in meshed.warnings)


def test_refused_for_net_admin_the_message_names_the_cni_mode(tmp_path: Path) -> None:
    for path in (REPO / "policies").glob("*.yaml"):
        text = path.read_text().replace("onRoot: Strip ", "onRoot: Deny  ")
        (tmp_path / path.name).write_text(text)
    decision = evaluate(istio_meshed("1xa100", cni=False), load_policy(tmp_path), context=CORE)
    messages = {v.path: v.message for v in decision.violations if v.rule == "security.capabilities"}
    assert messages == {
        "spec.initContainers[0].securityContext.capabilities.add": (
            "capabilities NET_ADMIN, NET_RAW are not allowed at level restricted: remove them "
            "(a mesh's init container cannot redirect traffic without NET_ADMIN: use its CNI "
            "mode)"
        )
    }


# --- device families -------------------------------------------------------------------


def devices(*per_container: dict[str, str], profile: str = "none") -> dict[str, Any]:
    """A run whose containers each ask for these devices (requests = limits)."""
    pod = run(
        [
            {"name": f"c{i}", "image": "x", "resources": {"requests": d, "limits": dict(d)}}
            for i, d in enumerate(per_container)
        ],
        profile,
    )
    del pod["metadata"]["labels"]["dhcore/template"]
    return pod


def family_violations(pod: dict[str, Any]) -> dict[str, str]:
    decision = evaluate(pod, SHIPPED, context=CORE)
    return {v.path: v.message for v in decision.violations}


def test_mig_slices_are_capped_by_the_nvidia_family_across_containers() -> None:
    # counted in compute slices, 7 per GPU, at most 14 per run
    within = devices(
        {"nvidia.com/mig-3g.40gb": "2"},  # 2 x 3
        {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "1"},  # 7 + 1
    )
    assert family_violations(within) == {}
    over = devices(
        {"nvidia.com/mig-3g.40gb": "2"},
        {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"},
    )
    assert family_violations(over) == {
        f"spec.resources.{part}.family:nvidia": (
            "the run's nvidia devices (1 gpu x 7, 2 nvidia.com/mig-1g.10gb, "
            f"2 nvidia.com/mig-3g.40gb x 3) count 15 {part}, above the family's "
            "maximum 14 for one run"
        )
        for part in ("requests", "limits")
    }


def test_an_odd_mig_profile_counts_as_a_whole_gpu_and_shared_replicas_as_a_quarter() -> None:
    assert family_violations(devices({"nvidia.com/mig-7g.80gb": "2"})) == {}
    assert set(family_violations(devices({"nvidia.com/mig-5g.mystery": "3"}))) == {
        "spec.resources.requests.family:nvidia",
        "spec.resources.limits.family:nvidia",
    }
    assert family_violations(devices({"nvidia.com/gpu.shared": "8"})) == {}
    assert len(family_violations(devices({"nvidia.com/gpu.shared": "9"}))) == 2


def test_a_member_counts_with_its_most_specific_name() -> None:
    family = DeviceFamily.model_validate(
        {
            "name": "nvidia",
            "max": 2,
            "members": {"nvidia.com/*": 1, "nvidia.com/mig-*": 0.5, "nvidia.com/mig-1g.5gb": 0.1},
        }
    )
    assert family.weight("nvidia.com/mig-1g.5gb") == Decimal("0.1")
    assert family.weight("nvidia.com/mig-2g.10gb") == Decimal("0.5")
    assert family.weight("nvidia.com/gpu") == Decimal(1)
    assert family.weight("amd.com/gpu") is None


def test_a_profile_may_ask_for_mig_slices() -> None:
    slice_profile = Profile.model_validate(
        {
            "name": "mig-3g",
            "resources": {
                "requests": {"cpu": "4", "nvidia.com/mig-3g.40gb": "1"},
                "limits": {"nvidia.com/mig-3g.40gb": "1"},
            },
        }
    )
    policy = Policy.of(
        RUNS.model_copy(update={"profiles": {**RUNS.profiles, "mig-3g": slice_profile}})
    )
    decision = evaluate(run([{"name": "main", "image": "x"}], "mig-3g"), policy, context=CORE)
    assert decision.allowed, decision.violations
    assert decision.object["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "nvidia.com/mig-3g.40gb": "1", "memory": "256Mi"},
        "limits": {"nvidia.com/mig-3g.40gb": "1", "memory": "282Mi"},
    }


def linkerd_meshed(profile: str) -> dict[str, Any]:
    """A run as Linkerd's injector leaves it without its CNI plugin: linkerd-init (NET_ADMIN,
    NET_RAW) and the proxy first among the containers (proxy-await, the default)."""
    init = {
        "name": "linkerd-init",
        "image": "cr.l5d.io/linkerd/proxy-init:v2.4.0",
        "args": ["--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140"],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    proxy = {
        "name": "linkerd-proxy",
        "image": "cr.l5d.io/linkerd/proxy:edge-25.1.1",
        "lifecycle": {"postStart": {"exec": {"command": ["/usr/lib/linkerd/linkerd-await"]}}},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsUser": 2102},
    }
    return run([proxy, {"name": "main", "image": "python:3.11"}], profile, initContainers=[init])


def test_a_linkerd_meshed_run_gets_its_profile_on_its_own_container() -> None:
    decision = evaluate(linkerd_meshed("1xa100"), SHIPPED, context=CORE)
    assert decision.allowed, decision.violations
    proxy, main = decision.object["spec"]["containers"]
    assert main["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    assert proxy["resources"] == {  # runguard's defaults, as for any other container
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "282Mi"},
    }
    assert (
        "runguard: NET_ADMIN removed, a mesh cannot redirect traffic (use its CNI mode): "
        "linkerd-init" in decision.warnings
    )
    # runguard's own annotation still names any container, kubectl's no sidecar
    pod = linkerd_meshed("1xa100")
    pod["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "linkerd-proxy"}
    proxy, main = evaluate(pod, SHIPPED, context=CORE).object["spec"]["containers"]
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "1"
    pod["metadata"]["annotations"]["runguard.io/main-container"] = "linkerd-proxy"
    proxy, main = evaluate(pod, SHIPPED, context=CORE).object["spec"]["containers"]
    assert proxy["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in main.get("resources", {}).get("requests", {})


def test_istios_default_container_names_the_main_one() -> None:
    pod = run(
        [{"name": "sidecar-logger", "image": "x"}, {"name": "trainer", "image": "x"}], "1xa100"
    )
    pod["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "trainer"}
    logger, trainer = evaluate(pod, SHIPPED, context=CORE).object["spec"]["containers"]
    assert trainer["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in logger["resources"]["requests"]
