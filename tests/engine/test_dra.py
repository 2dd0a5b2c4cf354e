"""Devices by dynamic resource allocation, counted against a run's maximums and device
families with the shipped policies (gpu maximum 2 per run, the nvidia family 14 compute
slices; ``resources.deviceClasses``: gpu.nvidia.com a whole GPU, mig.nvidia.com a MIG
slice by its profile): each attack of the issue is refused, each legitimate use is not.

The templates reach the engine as they do in ``runguard apply --cluster-state``: a
``StaticClusterState`` made from the API objects, the template's spec kept.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest
import yaml
from harness import REPO
from harness.routing import Cel
from harness.shipped import ALICE, KCM, SHIPPED, rules

from webhook.audit.explain import explain, to_text
from webhook.audit.liveview import WHATIF_KINDS, ReadState
from webhook.clusterstate.model import meta_from_object
from webhook.clusterstate.static import StaticClusterState
from webhook.engine import evaluate, validate
from webhook.engine.claimspec import claim_asks
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.install.names import RESERVED_NAMES_WEBHOOK
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy, build_run_policy

GPU = "gpu.nvidia.com"
DIGITALHUB = SHIPPED.named("digitalhub")
assert DIGITALHUB is not None
DIGITALHUB_SPEC = {
    k: v
    for k, v in yaml.safe_load((REPO / "policies" / "runpolicy.yaml").read_text())["spec"].items()
    if k != "platform"  # a Platform document's name: no platform needed here
}
MIG = "mig.nvidia.com"


def request(name: str = "gpu", device_class: str = GPU, count: int = 1, **more: Any) -> Any:
    return {"name": name, "exactly": {"deviceClassName": device_class, "count": count, **more}}


def template(name: str, *requests: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def run(*templates: str, gpus: str | None = None, **spec: Any) -> dict[str, Any]:
    """Her run Pod (the shipped ``small`` profile), naming ``templates`` by claim."""
    container: dict[str, Any] = {"name": "main", "image": "python:3.11"}
    if templates:
        container["resources"] = {"claims": [{"name": f"c{i}"} for i in range(len(templates))]}
    if gpus is not None:
        container.setdefault("resources", {})["limits"] = {"nvidia.com/gpu": gpus}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"},
        },
        "spec": {"containers": [container], **spec},
    }
    if templates:
        pod["spec"]["resourceClaims"] = [
            {"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
        ]
    return pod


def judged(pod: dict[str, Any], *objects: dict[str, Any]) -> Any:
    state = StaticClusterState.from_documents(objects)
    decision = evaluate(pod, SHIPPED, namespace="ml", context=Context(ALICE, state, "CREATE"))
    assert decision.error is None, decision.message()
    return decision


def mig(profile: str | None, count: int = 1, name: str = "slice") -> Any:
    selectors = (
        [{"cel": {"expression": f'device.attributes["{GPU}"].profile == "{profile}"'}}]
        if profile
        else []
    )
    return request(name, MIG, count, selectors=selectors)


# --- the attacks of the issue: each admitted unchanged before ---------------------------


def test_eight_gpus_through_a_claim_template_are_refused_naming_the_maximum() -> None:
    decision = judged(run("eight"), template("eight", request(count=8)))
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    message = decision.message()
    assert "8 gpu (8 by template eight), above the maximum 2 for one run" in message
    assert "count 56, above the family's maximum 14" in message  # and the nvidia family


@pytest.mark.parametrize(
    ("more", "said"),
    [
        ({"allocationMode": "All"}, "allocationMode All (every matching device of the node)"),
        ({"adminAccess": True}, "adminAccess (access to devices other Pods hold)"),
    ],
)
def test_every_device_of_the_node_or_admin_access_is_refused(more: Any, said: str) -> None:
    decision = judged(run("all"), template("all", request(**more)))
    assert not decision.allowed and "resources.device-request" in rules(decision)
    assert said in decision.message()


def test_first_available_counts_at_its_largest() -> None:
    alternatives = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "eight", "deviceClassName": GPU, "count": 8},
            {"name": "one", "deviceClassName": GPU, "count": 1},
        ],
    }
    decision = judged(run("either"), template("either", alternatives))
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert "8 gpu (8 by template either)" in decision.message()


def test_extended_resources_and_claims_add_up() -> None:
    decision = judged(run("one", gpus="2"), template("one", request()))
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert "3 gpu (2 as nvidia.com/gpu, 1 by template one)" in decision.message()


def test_two_requests_of_one_template_and_two_claims_of_one_pod_add_up() -> None:
    twice = template("twice", request("a", count=2), request("b", count=2))
    assert "4 gpu (4 by template twice)" in judged(run("twice"), twice).message()
    pair = template("pair", request(count=2))
    decision = judged(run("pair", "pair"), pair)
    assert not decision.allowed
    assert "4 gpu (2 by template pair, 2 by template pair)" in decision.message()


def test_a_device_class_the_admin_never_named_is_refused_naming_the_allowed_ones() -> None:
    decision = judged(run("fpga"), template("fpga", request(device_class="fpga.example.com")))
    assert not decision.allowed and rules(decision) == {"resources.device-request"}
    assert (
        "DeviceClass 'fpga.example.com' is not one runs may use "
        "(allowed: gpu.nvidia.com, mig.nvidia.com)"
    ) in decision.message()


def test_mig_devices_of_unknown_profile_count_as_the_heaviest() -> None:
    decision = judged(run("migs"), template("migs", mig(None, count=3)))
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert "count 21, above the family's maximum 14" in decision.message()
    # A selector that only may pin it (an alternative of two) pins nothing.
    either = {
        "cel": {
            "expression": f'device.attributes["{GPU}"].profile == "1g.10gb" || true',
        }
    }
    loose = template("loose", request("s", MIG, 3, selectors=[either]))
    assert not judged(run("loose"), loose).allowed


def test_an_extended_resource_a_device_class_maps_counts_as_its_devices() -> None:
    pod = run()
    implicit = f"deviceclass.resource.kubernetes.io/{GPU}"
    pod["spec"]["containers"][0]["resources"] = {"limits": {implicit: "8"}}
    decision = judged(pod)
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert f"8 gpu (8 as {implicit})" in decision.message()
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"deviceclass.resource.kubernetes.io/fpga.example.com": "1"}
    }
    assert rules(judged(pod)) == {"resources.device-request"}


# --- legitimate uses -------------------------------------------------------------------


def test_one_gpu_by_claim_and_a_mig_slice_within_the_family_are_admitted() -> None:
    assert judged(run("one"), template("one", request())).allowed
    assert judged(run("two"), template("two", request(count=2))).allowed
    slices = template("slices", mig("1g.10gb", count=3), mig("3g.40gb", name="big"))
    assert judged(run("slices"), slices).allowed  # 3 x 1 + 3 = 6 of 14
    # One GPU by extended resource and 7 compute slices by claim: 14, the family's maximum.
    assert judged(run("half", gpus="1"), template("half", mig("7g.80gb"))).allowed


def test_a_template_not_there_yet_or_no_cluster_state_counts_nothing_here() -> None:
    assert judged(run("later")).allowed  # judged when it is made (and its claim)
    decision = evaluate(run("eight"), SHIPPED, namespace="ml")
    assert decision.allowed  # offline without --cluster-state: no template known


def test_runguard_apply_with_cluster_state_refuses_eight_gpus(tmp_path: Any) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump(template("eight", request(count=8))))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(run("eight")))
    found = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies"),
         "--cluster-state", str(state), "-o", "json", str(pod)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert found.returncode == 1, found.stderr
    assert "above the maximum 2 for one run" in found.stdout


# --- the claim the resource-claim controller makes: no race with the template ----------

CLAIM_CONTROLLER = Requester(f"{KCM}resource-claim-controller")


def made_claim(*requests: Any, owner: str = "train") -> dict[str, Any]:
    """The ResourceClaim the controller makes for Pod ``owner`` from its template."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{owner}-c0-x7k2p",
            "namespace": "ml",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u1", "controller": True}
            ],
        },
        "spec": {"devices": {"requests": list(requests)}},
    }


def admitted_run_pod() -> dict[str, Any]:
    """The run Pod as the cache holds it once admitted: its RunPolicy recorded."""
    pod = run("later")
    pod["metadata"]["labels"][POLICY_LABEL] = "digitalhub"
    return pod


def claim_judged(claim: dict[str, Any], *objects: dict[str, Any]) -> Any:
    state = StaticClusterState.from_documents(objects)
    context = Context(CLAIM_CONTROLLER, state, "CREATE")
    decision = validate(claim, SHIPPED, namespace="ml", context=context)
    assert decision.error is None, decision.message()
    return decision


def test_a_template_made_after_its_pod_gets_the_run_no_more_than_its_maximum() -> None:
    """The Pod was admitted before its template existed (nothing to count); the claim the
    controller then makes from an 8-GPU template is refused, naming the maximum."""
    assert judged(run("later")).allowed
    decision = claim_judged(made_claim(request(count=8)), admitted_run_pod())
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert "8 gpu (8 by claim train-c0-x7k2p of Pod train), above the maximum 2" in (
        decision.message()
    )
    refused = claim_judged(made_claim(request(allocationMode="All")), admitted_run_pod())
    assert rules(refused) == {"resources.device-request"}
    assert claim_judged(made_claim(request()), admitted_run_pod()).allowed
    # Another Pod's claim (no run of runguard's: the cache keeps run Pods only) is its own.
    assert claim_judged(made_claim(request(count=8), owner="other"), admitted_run_pod()).allowed


def test_a_claim_made_for_a_pod_is_routed_whatever_the_policy() -> None:
    _, validating = manifests.webhook_configurations(SHIPPED)
    (hook,) = [h for h in validating["webhooks"] if h["name"] == RESERVED_NAMES_WEBHOOK]
    assert any(
        "resourceclaims" in r["resources"] and r["operations"] == ["CREATE"] for r in hook["rules"]
    )
    cel = Cel()
    claim = made_claim(request(count=8))
    assert cel.routed(hook, claim, "resourceclaims")
    mine = copy.deepcopy(claim)
    del mine["metadata"]["ownerReferences"]
    mine["metadata"]["name"] = "mine"
    assert not cel.routed(hook, mine, "resourceclaims")


def test_audit_and_what_if_read_the_templates_and_fail_closed_without_them() -> None:
    """``runguard audit`` and ``what-if`` read the cluster's ``WHATIF_KINDS`` into a
    ``ReadState``: the templates among them, so a run's devices by claim are counted; a
    view that could not list them says so instead of counting nothing."""
    assert "ResourceClaimTemplate" in WHATIF_KINDS
    eight = [meta_from_object(template("eight", request(count=8)))]
    read = ReadState(eight, WHATIF_KINDS)
    decision = evaluate(run("eight"), SHIPPED, namespace="ml", context=Context(ALICE, read))
    assert "8 gpu (8 by template eight)" in decision.message()
    unread = ReadState([], [k for k in WHATIF_KINDS if k != "ResourceClaimTemplate"])
    decision = evaluate(run("eight"), SHIPPED, namespace="ml", context=Context(ALICE, unread))
    assert not decision.allowed and "cannot count the devices of 'eight'" in decision.message()


# --- how a claim's spec is read (claimspec) ---------------------------------------------


def asks(*requests: Any) -> Any:
    return claim_asks({"devices": {"requests": list(requests)}}, DIGITALHUB.resources)


def test_v1beta1_requests_bracket_selectors_and_several_pins_are_read() -> None:
    # v1beta1: the request's fields directly on it, no "exactly"
    assert asks({"name": "g", "deviceClassName": GPU, "count": 3}).amounts == {"nvidia.com/gpu": 3}
    bracket = {"cel": {"expression": f"device.attributes['{GPU}']['profile'] == '2g.20gb'"}}
    found = asks(request("s", MIG, 2, selectors=[bracket]))
    assert found.amounts == {"nvidia.com/mig-2g.20gb": 2}
    other = {"cel": {"expression": f'device.attributes["{GPU}"].profile == "1g.10gb"'}}
    # two selectors pinning two values: no device matches both, counted as the heaviest
    assert asks(request("s", MIG, 1, selectors=[bracket, other])).amounts == {"nvidia.com/mig-*": 1}
    assert DIGITALHUB.resources.families[0].weight("nvidia.com/mig-*") == 7


def test_what_cannot_be_counted_is_a_problem_never_an_error() -> None:
    assert asks({"name": "g", "exactly": {"deviceClassName": GPU, "count": "8"}}).problems == [
        "request 'g': count '8' is not a whole number above 0"
    ]
    assert claim_asks({"devices": {"requests": "all"}}, DIGITALHUB.resources).problems == [
        "devices.requests is not a list"
    ]
    assert asks("gpu").problems == ["request 0 is not a mapping"]
    assert asks({"name": "g", "firstAvailable": [{"name": "a", "count": 1}]}).problems == [
        "request 'g/a': DeviceClass None is not one runs may use "
        "(allowed: gpu.nvidia.com, mig.nvidia.com)"
    ]


def test_a_class_mapped_to_its_own_extended_resource_counts_once() -> None:
    spec = copy.deepcopy(DIGITALHUB_SPEC)
    classes = spec["resources"]["deviceClasses"]
    classes[GPU]["extendedResourceName"] = "nvidia.com/gpu"  # as itself: counted once
    classes[MIG]["extendedResourceName"] = "example.com/mig"  # a slice, of no known profile
    policy = build_run_policy({"kind": "RunPolicy", "metadata": {"name": "p"}, "spec": spec}, [])
    assert policy.resources.extended_device_classes == {"example.com/mig": MIG}
    pod = run(gpus="2")
    assert evaluate(pod, Policy.of(policy), namespace="ml").allowed  # 2 gpu, not 4
    pod["spec"]["containers"][0]["resources"]["limits"]["example.com/mig"] = "1"
    decision = evaluate(pod, Policy.of(policy), namespace="ml")
    assert not decision.allowed
    assert "count 21, above the family's maximum 14" in decision.message()  # 2 x 7 + 7


def test_explain_names_the_route_each_device_came_by() -> None:
    state = StaticClusterState.from_documents([template("one", request())])
    context = Context(ALICE, state, "CREATE")
    found = explain(run("one", gpus="1"), SHIPPED, namespace="ml", context=context)
    assert found.devices == ("2 gpu: 1 as nvidia.com/gpu, 1 by template one",)
    assert "  devices:    2 gpu: 1 as nvidia.com/gpu, 1 by template one" in to_text(found)
    assert found.to_dict()["devices"] == list(found.devices)
    plain = explain(run(gpus="1"), SHIPPED, namespace="ml", context=context)
    assert plain.devices == ("1 gpu: 1 as nvidia.com/gpu",)


# --- a profile that gives its devices through DRA (Kubernetes 1.37's mapping) ----------

IMPLICIT_GPU = f"deviceclass.resource.kubernetes.io/{GPU}"


def project_profile(name: str, gpus: str) -> dict[str, Any]:
    return {
        "apiVersion": "runguard.io/v1",
        "kind": "ProjectProfile",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"resources": {"requests": {IMPLICIT_GPU: gpus}, "limits": {IMPLICIT_GPU: gpus}}},
    }


def test_a_profile_may_give_its_gpus_through_dra_within_the_maximum() -> None:
    pod = run()
    pod["metadata"]["labels"]["dhcore/template"] = "dra-one"
    decision = judged(pod, project_profile("dra-one", "1"))
    assert decision.allowed, decision.message()
    limits = decision.object["spec"]["containers"][0]["resources"]["limits"]
    assert limits[IMPLICIT_GPU] == "1"
    pod["metadata"]["labels"]["dhcore/template"] = "dra-eight"
    decision = judged(pod, project_profile("dra-eight", "8"))
    assert not decision.allowed
    (violation,) = [v for v in decision.violations if v.rule == "profile.project-invalid"]
    assert '"8" is above the maximum "2"' in violation.message


# --- a late claim judged with the run's other devices -----------------------------------

SCHEDULER = Requester("system:kube-scheduler")


def admitted_with(gpus: str | None = None, *templates: str, **limits: str) -> dict[str, Any]:
    """The admitted run Pod as the cache holds it, with extended resources: ``gpus``
    of the device plugin, ``limits`` (a class's mapped resource) besides."""
    pod = run(*(templates or ("later",)), gpus=gpus)
    pod["metadata"]["labels"][POLICY_LABEL] = "digitalhub"
    if limits:
        resources = pod["spec"]["containers"][0].setdefault("resources", {})
        resources.setdefault("limits", {}).update(limits)
    return pod


def for_entry(claim: dict[str, Any], entry: str, name: str | None = None) -> dict[str, Any]:
    """``claim`` as the resource-claim controller makes it for the Pod's entry ``entry``."""
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": entry}
    if name is not None:
        claim["metadata"]["name"] = name
    return claim


def scheduler_claim(*requests: Any) -> dict[str, Any]:
    """The claim the 1.37 scheduler makes for the Pod's extended resources a class maps."""
    claim = made_claim(*requests)
    claim["metadata"]["name"] = "train-extended-resources-q8m4z"
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    return claim


def test_a_late_claim_counts_with_the_runs_extended_resources() -> None:
    """2 GPUs as an extended resource, the template (made after the Pod) of 2 more: the
    claim the controller makes is refused, naming the maximum; 1 + 1 is admitted."""
    pod = admitted_with("2")
    assert judged(run("later", gpus="2")).allowed  # the template not there yet
    decision = claim_judged(for_entry(made_claim(request(count=2)), "c0"), pod)
    assert not decision.allowed and rules(decision) == {"resources.exceeded"}
    assert (
        "the run's devices count 4 gpu (2 as nvidia.com/gpu, 2 by claim train-c0-x7k2p of "
        "Pod train), above the maximum 2 for one run"
    ) in decision.message()
    assert claim_judged(for_entry(made_claim(request()), "c0"), admitted_with("1")).allowed


def test_a_late_claim_counts_with_the_pods_other_claims() -> None:
    """Two entries: the other's claim, made already, counts (even once its template is
    gone or changed); before it is made, its template does."""
    pod = admitted_with(None, "first", "second")
    made = for_entry(made_claim(request(count=2)), "c1", "train-c1-b9d3f")
    late = for_entry(made_claim(request()), "c0")
    decision = claim_judged(late, pod, made, template("second", request()))
    assert not decision.allowed
    assert "3 gpu (2 by claim train-c1-b9d3f, 1 by claim train-c0-x7k2p of Pod train)" in (
        decision.message()
    )
    decision = claim_judged(late, pod, template("second", request(count=2)))
    assert "3 gpu (2 by template second, 1 by claim train-c0-x7k2p of Pod train)" in (
        decision.message()
    )
    assert claim_judged(late, pod, template("second", request())).allowed  # 1 + 1
    assert claim_judged(late, pod).allowed  # the other not there yet: judged when made
    # Another Pod's claim for an entry of the same name is not this run's.
    theirs = for_entry(made_claim(request(count=2), owner="other"), "c1", "other-c1-k2j4n")
    assert claim_judged(late, pod, theirs, template("second", request())).allowed


def test_the_schedulers_claim_for_a_mapped_resource_is_not_counted_twice() -> None:
    """A run asking 2 GPUs as ``deviceclass.resource.kubernetes.io/gpu.nvidia.com``: the
    scheduler's claim for them is admitted (2, not 4); one asking more is counted."""
    pod = admitted_with(None, **{IMPLICIT_GPU: "2"})
    state = StaticClusterState.from_documents([pod])
    context = Context(SCHEDULER, state, "CREATE")
    claim = scheduler_claim(request("container-0-request-0", count=2))
    decision = validate(claim, SHIPPED, namespace="ml", context=context)
    assert decision.allowed, decision.message()
    more = scheduler_claim(request("container-0-request-0", count=3))
    decision = validate(more, SHIPPED, namespace="ml", context=context)
    assert not decision.allowed
    assert "3 gpu (2 as deviceclass.resource.kubernetes.io/gpu.nvidia.com, 1 by claim " in (
        decision.message()
    )
    # The device plugin's own name mapped by the cluster's class (1.37 extendedResourceName
    # nvidia.com/gpu): the scheduler's claim stands for the Pod's nvidia.com/gpu.
    plugin_named = StaticClusterState.from_documents([admitted_with("2")])
    claim = scheduler_claim(request("container-0-request-0", count=2))
    decision = validate(claim, SHIPPED, namespace="ml", context=Context(SCHEDULER, plugin_named))
    assert decision.allowed, decision.message()
    # ...and the same claim not the scheduler's (no annotation): counted with the Pod's.
    del claim["metadata"]["annotations"]
    decision = validate(claim, SHIPPED, namespace="ml", context=Context(SCHEDULER, plugin_named))
    assert not decision.allowed and "4 gpu" in decision.message()


def test_the_cache_keeps_what_a_run_pod_and_a_pods_claim_ask_for_and_nothing_else() -> None:
    pod = admitted_with("2")
    main = pod["spec"]["containers"][0]
    main.update(command=["python", "train.py"], env=[{"name": "TOKEN", "value": "s3cret"}])
    main["resources"]["requests"] = {"cpu": "2", "memory": "1Gi"}
    kept = json.loads(meta_from_object(pod).spec)
    assert kept == {
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        "resourceClaims": [{"name": "c0", "resourceClaimTemplateName": "later"}],
    }
    assert meta_from_object(run()).spec == ""  # a run without devices: nothing
    claim = made_claim(request(count=2))
    assert json.loads(meta_from_object(claim).spec) == claim["spec"]
    del claim["metadata"]["ownerReferences"]
    assert meta_from_object(claim).spec == ""  # no Pod's: metadata only
