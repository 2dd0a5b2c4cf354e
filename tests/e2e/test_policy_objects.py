"""RunPolicy, Platform and Profile as Kubernetes objects, against the real kube-apiserver: the
generated CRDs are accepted, ``kubectl apply -f policies/`` works as is, ``kubectl get``
and ``kubectl explain`` document them, a broken Profile is refused at ``kubectl apply``
naming its key, and ``runguard serve --policy-objects`` serves them, reloads a
``kubectl patch`` within seconds and writes each object's ``Loaded`` condition."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.install import manifests
from webhook.policy.crd import CRD_FILES, PLURALS

from .cluster import Cluster
from .devcluster import Runguard, runguard_command
from .runs import Webhook, until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "manifests" / manifests.POLICY_OBJECTS_DIR


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Iterator[None]:
    for name in CRD_FILES.values():
        cluster.kubectl("apply", "--server-side", "-f", str(COMPONENT / name), check=True)
    for plural in PLURALS.values():
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.runguard.io", check=True
        )
    yield
    cluster.kubectl("delete", "runpolicies,platforms.runguard.io,profiles", "--all", "--wait")


@pytest.fixture(scope="module")
def served(
    cluster: Cluster, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runguard]:
    """``kubectl apply -f policies/``, then runguard serving the objects, its policy
    webhook registered (by URL, on loopback)."""
    done = cluster.kubectl("apply", "-f", str(REPO / "policies"))
    assert done.returncode == 0, done.stderr
    base = tmp_path_factory.mktemp("policy-objects")
    mirror = base / "policies"
    mirror.mkdir()
    server = Runguard(
        base / "server", mirror, serve_args=("--policy-objects", str(cluster.kubeconfig))
    )
    server.start()
    hook = manifests.policy_object_webhook(url=server.url, ca_bundle=server.ca_file.read_bytes())
    cluster.kubectl("apply", "-f", "-", input=json.dumps(hook), check=True)
    try:
        yield server
    finally:
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", manifests.POLICY_CONFIGURATION_NAME
        )
        server.stop()


def get(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    done = cluster.kubectl("get", kind, name, "-o", "json", check=True)
    obj: dict[str, Any] = json.loads(done.stdout)
    return obj


def loaded(obj: dict[str, Any]) -> str | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition["type"] == "Loaded":
            return str(condition["status"])
    return None


def test_the_shipped_policy_files_apply_as_they_are(cluster: Cluster, served: Runguard) -> None:
    shipped = [
        d
        for path in sorted((REPO / "policies").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]
    for doc in shipped:
        live = get(cluster, doc["kind"].lower() + ".runguard.io", doc["metadata"]["name"])
        assert live["spec"] == doc["spec"]  # nothing pruned, nothing defaulted
    table = cluster.kubectl("get", "profiles", check=True).stdout.splitlines()
    assert table[0].split() == ["NAME", "CPU", "MEMORY", "GPU", "SCOPE", "LOADED", "AGE"]
    names = sorted(line.split()[0] for line in table[1:])
    assert names == sorted(d["metadata"]["name"] for d in shipped if d["kind"] == "Profile")


def test_kubectl_explain_documents_every_key(cluster: Cluster, crds: None) -> None:
    done = cluster.kubectl("explain", "profile.spec.resources", check=True)
    assert "Requests and limits of the main container:" in done.stdout
    assert "requests" in done.stdout and "limits" in done.stdout
    done = cluster.kubectl("explain", "runpolicy.spec.enforcement", check=True)
    assert "Audit" in done.stdout


def test_the_platform_is_an_object_the_run_policies_name(
    cluster: Cluster, served: Runguard
) -> None:
    """The Platform applied from policies/platform.yaml: listed with its identities and
    project label, explained key by key, and loaded with the RunPolicies naming it."""
    until(
        "the Platform loaded",
        lambda: loaded(get(cluster, "platform.runguard.io", "digitalhub")) == "True",
    )
    table = cluster.kubectl("get", "platforms.runguard.io", check=True).stdout.splitlines()
    assert table[0].split() == ["NAME", "IDENTITIES", "PROJECT", "LABEL", "LOADED", "AGE"]
    (row,) = table[1:]
    assert row.split()[:2] == ["digitalhub", '["system:serviceaccount:digitalhub:core"]']
    assert "dhcore/project" in row
    done = cluster.kubectl("explain", "platform.spec.identities", check=True)
    assert "Who the platform acts as" in done.stdout
    for name in ("builds", "digitalhub"):
        assert get(cluster, "runpolicy", name)["spec"]["platform"] == "digitalhub"


def test_the_server_serves_the_objects_and_names_them(served: Runguard) -> None:
    status, ready = served.readyz()
    assert status == 200, ready
    assert ready["policy"]["runPolicies"] == ["builds", "digitalhub"]
    assert len(ready["policy"]["profiles"]) == 4


def test_every_object_says_it_loaded(cluster: Cluster, served: Runguard) -> None:
    def all_loaded() -> bool:
        items = json.loads(
            cluster.kubectl(
                "get", "runpolicies,platforms.runguard.io,profiles", "-o", "json", check=True
            ).stdout
        )["items"]
        return bool(items) and all(loaded(item) == "True" for item in items)

    until("every object's Loaded condition True", all_loaded)


def test_a_broken_profile_is_refused_naming_the_key(cluster: Cluster, served: Runguard) -> None:
    broken = {
        "apiVersion": "runguard.io/v1",
        "kind": "Profile",
        "metadata": {"name": "lots"},
        "spec": {"resources": {"requests": {"cpu": "lots"}}, "runtimeClass": "nvidia"},
    }
    done = cluster.kubectl("apply", "-f", "-", input=json.dumps(broken))
    assert done.returncode != 0
    assert 'spec.resources.requests.cpu: "lots" is not a quantity' in done.stderr
    assert 'unknown key "runtimeClass" (did you mean "runtimeClassName"?)' in done.stderr
    assert "Profile lots" in done.stderr
    gone = cluster.kubectl("get", "profile", "lots")
    assert gone.returncode != 0


def test_a_profile_with_ranges_and_a_namespace_selector_is_stored_as_written(
    cluster: Cluster, served: Runguard
) -> None:
    """The CRD keeps a range (and a plain quantity beside it) as written; a range above the
    RunPolicy's maximums is refused at ``kubectl apply`` with lint's message."""
    ranged = {
        "apiVersion": "runguard.io/v1",
        "kind": "Profile",
        "metadata": {"name": "ranged"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"example.com/team": "team-a"}},
            "resources": {
                "requests": {
                    "cpu": "4",
                    "memory": {"min": "16Gi", "default": "32Gi", "max": "64Gi"},
                },
                "limits": {"nvidia.com/gpu": {"min": 1, "default": 1, "max": 2}},
            },
        },
    }
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(ranged), check=True)
        assert get(cluster, "profile.runguard.io", "ranged")["spec"] == ranged["spec"]
        until(
            "the ranged profile loaded",
            lambda: loaded(get(cluster, "profile.runguard.io", "ranged")) == "True",
        )
        above = json.loads(json.dumps(ranged))
        above["spec"]["resources"]["requests"]["memory"]["max"] = "96Gi"
        done = cluster.kubectl("apply", "-f", "-", input=json.dumps(above))
        assert done.returncode != 0
        assert (
            'spec.resources.requests.memory.max: "96Gi" is above the maximum "66Gi"' in done.stderr
        )
    finally:
        cluster.kubectl("delete", "profile.runguard.io", "ranged", "--ignore-not-found")
        # served without it before the next test reads the digest (it would see this
        # change, not its own)
        until(
            "the ranged profile gone from what runguard serves",
            lambda: "ranged" not in served.readyz()[1]["policy"]["profiles"],
        )


def test_a_patch_reaches_admission_within_seconds(cluster: Cluster, served: Runguard) -> None:
    before = served.readyz()[1]["policy"]["digest"]
    patch = {"spec": {"resources": {"requests": {"cpu": "6"}}}}
    cluster.kubectl(
        "patch", "profile", "1xt4", "--type", "merge", "-p", json.dumps(patch), check=True
    )

    def mirrored_cpu() -> object:
        mirrored = yaml.safe_load((served.policy_dir / "profile-1xt4.yaml").read_text())
        return mirrored["spec"]["resources"]["requests"]["cpu"]

    until(
        "the patch mirrored and served",
        lambda: mirrored_cpu() == "6" and served.readyz()[1]["policy"]["digest"] != before,
        15,
    )
    live = get(cluster, "profile", "1xt4")
    until(
        "the status of the new generation",
        lambda: (
            (get(cluster, "profile", "1xt4").get("status") or {}).get("observedGeneration")
            == live["metadata"]["generation"]
        ),
    )


def test_the_audit_judges_with_the_objects(cluster: Cluster, served: Runguard) -> None:
    """``runguard audit --policy-objects``: the policy the cluster holds, not the files
    (the 1xt4 profile patched above is the cluster's only)."""
    done = subprocess.run(
        [runguard_command(), "audit", "--policy-objects", "-o", "policyreport",
         "--kubeconfig", str(cluster.kubeconfig), "-p", "/nonexistent"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    cluster_report = next(yaml.safe_load_all(done.stdout))
    assert cluster_report["kind"] == "ClusterPolicyReport"
    loaded = {
        (r["resources"][0]["kind"], r["resources"][0]["name"])
        for r in cluster_report["results"]
        if r["result"] == "pass"
    }
    assert ("RunPolicy", "digitalhub") in loaded and ("Profile", "1xt4") in loaded


OPERATOR = {"identity": "system:serviceaccount:kubeflow:training-operator",
            "kinds": ["kubeflow.org/PyTorchJob"]}  # fmt: skip


def condition_message(cluster: Cluster, kind: str, name: str) -> str:
    for condition in (get(cluster, kind, name).get("status") or {}).get("conditions") or ():
        if condition["type"] == "Loaded":
            return str(condition["message"])
    return ""


def held_objects(cluster: Cluster) -> list[str]:
    """The policy objects whose Loaded condition says their edit is held."""
    held = []
    for kind in ("runpolicy", "platform.runguard.io", "profile.runguard.io"):
        names = cluster.kubectl(
            "get", kind, "-o", "jsonpath={.items[*].metadata.name}", check=True
        ).stdout.split()
        held += [
            f"{kind}/{n}" for n in names if condition_message(cluster, kind, n).startswith("held:")
        ]
    return held


def settled_digest(served: Runguard) -> str | None:
    """The served policy's digest when it is the same a recheck of held edits later."""
    first = served.readyz()[1]["policy"]["digest"]
    time.sleep(4)  # one HELD_RECHECK (3 s) of the policy watch, and the reload after it
    return first if served.readyz()[1]["policy"]["digest"] == first else None


def test_a_routing_edit_waits_for_the_webhooks(
    cluster: Cluster, served: Runguard, runguard: Webhook, tmp_path: Path
) -> None:
    """An operator added with kubectl is held (the objects say so, the policy before the
    edit keeps serving) until runguard's webhook configurations route its kind."""
    runguard.unregister(cluster)  # the session's configurations: put back by its fixture
    try:
        registered = served.manifests_with("--policy-objects")  # routing of policies/
        cluster.kubectl("apply", "-f", "-", input=registered, check=True)
        # An edit of an earlier test held until these configurations route it is served
        # now: the digest before this test's edit is the one after that, once settled.
        until("no policy object held", lambda: not held_objects(cluster))
        before = until("the served policy settled", lambda: settled_digest(served), 60)
        patch = [{"op": "add", "path": "/spec/operators/-", "value": OPERATOR}]
        cluster.kubectl("patch", "platform.runguard.io", "digitalhub", "--type", "json",
                        "-p", json.dumps(patch), check=True)  # fmt: skip
        until(
            "the edit held",
            lambda: condition_message(cluster, "runpolicy", "digitalhub").startswith("held:"),
        )
        assert served.readyz()[1]["policy"]["digest"] == before
        # The admin renders the configurations from the edited files and applies them.
        edited = tmp_path / "policies"
        edited.mkdir()
        for path in (REPO / "policies").glob("*.yaml"):
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            for doc in docs:
                if doc["kind"] == "Platform" and doc["metadata"]["name"] == "digitalhub":
                    doc["spec"]["operators"].append(OPERATOR)
            (edited / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
        rendered = subprocess.run(
            [runguard_command(), "manifests", "-p", str(edited), "--url", served.url,
             "--ca-bundle", str(served.ca_file), "--no-floor"],  # the floor: test_floor.py
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "pytorchjobs" in rendered
        cluster.kubectl("apply", "-f", "-", input=rendered, check=True)
        until("the edit served", lambda: served.readyz()[1]["policy"]["digest"] != before)
        until(
            "the edit loaded",
            lambda: condition_message(cluster, "runpolicy", "digitalhub").startswith("loaded"),
        )
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                        manifests.CONFIGURATION_NAME, "--ignore-not-found")  # fmt: skip
