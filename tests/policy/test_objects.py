"""RunPolicy and Profile as Kubernetes objects: the CRDs generated from the policy model,
the checks of ``/validate-policy`` (lint's errors, by key), the mirror into the policy
directory and the ``Loaded`` condition each object gets (the real apiserver is in
tests/e2e/test_policy_objects.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO

from webhook.policy.crd import MIRRORED, PLURALS, document_of, policy_crds
from webhook.policy.mirror.objects import check_object, conditions, mirror, object_files
from webhook.policy.schema import policy_schema
from webhook.serving.app import create_app
from webhook.watches.policy import Mirror, status_updates

POLICIES = REPO / "policies"
STRUCTURAL = ("type", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def shipped() -> list[dict[str, Any]]:
    return [
        d
        for path in sorted(POLICIES.glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]


def as_object(doc: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """``doc`` as the apiserver hands it over: uid, managedFields, status..."""
    meta = {**doc["metadata"], "uid": "u-1", "generation": 3, "managedFields": [{}], **metadata}
    return {**doc, "metadata": meta, "status": {"conditions": []}}


def crd_spec(kind: str) -> dict[str, Any]:
    (crd,) = [c for c in policy_crds() if c["spec"]["names"]["kind"] == kind]
    (version,) = crd["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def schema_keys(node: Any, defs: dict[str, Any], path: str = "") -> set[str]:
    """Every key path the JSON Schema of the files declares."""
    if not isinstance(node, dict):
        return set()
    if "$ref" in node:
        return schema_keys(defs[node["$ref"].rsplit("/", 1)[1]], defs, path)
    found = set()
    for name, sub in (node.get("properties") or {}).items():
        found |= {f"{path}.{name}"} | schema_keys(sub, defs, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found |= schema_keys(node["items"], defs, path + "[]")
    return found


def crd_keys(node: dict[str, Any], path: str = "") -> set[str]:
    found = set()
    for name, sub in (node.get("properties") or {}).items():
        found |= {f"{path}.{name}"} | crd_keys(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found |= crd_keys(node["items"], path + "[]")
    return found


@pytest.mark.parametrize("kind", ["RunPolicy", "Profile"])
def test_the_crd_documents_every_key_of_the_files(kind: str) -> None:
    schema = policy_schema()
    spec_def = schema["$defs"]["RunPolicySpec" if kind == "RunPolicy" else "ProfileSpec"]
    assert crd_keys(crd_spec(kind)) == schema_keys(spec_def, schema["$defs"])


@pytest.mark.parametrize("kind", ["RunPolicy", "Profile"])
def test_the_crd_schema_is_structural(kind: str) -> None:
    """What the apiserver demands of a CRD schema: every node typed (or int-or-string,
    or free), no $ref, no if/then, no uniqueItems, properties or additionalProperties."""

    def check(node: dict[str, Any], path: str) -> None:
        assert any(node.get(k) for k in STRUCTURAL), path
        for banned in ("$ref", "if", "then", "allOf", "uniqueItems", "propertyNames", "const"):
            assert banned not in node, (path, banned)
        assert not ({"properties", "additionalProperties"} <= set(node)), path
        assert "default" not in node, path  # said in the description instead
        for name, sub in (node.get("properties") or {}).items():
            check(sub, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                check(node[key], f"{path}.{key}")

    check(crd_spec(kind), kind)


def test_the_policy_crds_are_cluster_scoped_with_status_and_columns() -> None:
    """RunPolicy and Profile are the installation's, with a Loaded status; a project's
    ProjectProfile lives in its namespace, judged per run, with no status."""
    for crd in policy_crds():
        spec = crd["spec"]
        kind = spec["names"]["kind"]
        mirrored = kind != "ProjectProfile"
        assert spec["scope"] == ("Cluster" if mirrored else "Namespaced")
        assert spec["group"] == "runguard.io"
        assert crd["metadata"]["name"] == f"{PLURALS[kind]}.runguard.io"
        (version,) = spec["versions"]
        assert ("subresources" in version) == mirrored
        columns = [c["name"] for c in version["additionalPrinterColumns"]]
        assert columns[-2:] == (["Loaded", "Age"] if mirrored else ["Description", "Age"])
    description = crd_spec("RunPolicy")["properties"]["enforcement"]["description"]
    assert 'Default: "Deny".' in description  # defaults are said, never applied


def test_a_null_that_means_something_stays_allowed() -> None:
    seccomp = crd_spec("RunPolicy")["properties"]["security"]["properties"]["seccompProfile"]
    assert seccomp["nullable"] is True and None in seccomp["enum"]
    assert "Unchanged" in seccomp["enum"]


def test_an_object_is_the_document_of_its_file() -> None:
    for doc in shipped():
        obj = as_object(doc, annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"})
        assert document_of(obj) == doc


# --- /validate-policy: what lint says ------------------------------------------------


BROKEN = {
    "apiVersion": "runguard.io/v1",
    "kind": "Profile",
    "metadata": {"name": "lots"},
    "spec": {"resources": {"requests": {"cpu": "lots"}}, "runtimeClass": "nvidia"},
}


def test_a_broken_profile_gets_lints_errors_naming_the_key() -> None:
    checked = check_object(as_object(BROKEN), POLICIES)
    assert checked.errors == [
        'Profile lots: spec.resources.requests.cpu: "lots" is not a quantity',
        'Profile lots: spec.runtimeClass: unknown key "runtimeClass" '
        '(did you mean "runtimeClassName"?)',
    ]


def test_a_profile_above_the_maximums_names_the_run_policy() -> None:
    profile = {**BROKEN, "metadata": {"name": "1xt4"}}
    profile["spec"] = {"resources": {"requests": {"cpu": "400"}}}
    (error,) = check_object(profile, POLICIES).errors
    assert error.startswith('Profile 1xt4: spec.resources.requests.cpu: "400" is above')
    assert error.endswith("(RunPolicy digitalhub)")


def test_a_run_policy_is_refused_for_the_errors_it_causes_in_the_profiles() -> None:
    (run_policy,) = [
        d for d in shipped() if d["kind"] == "RunPolicy" and d["metadata"]["name"] == "digitalhub"
    ]
    lowered = json.loads(json.dumps(run_policy))
    lowered["spec"]["resources"]["maximums"]["cpu"] = "1"
    errors = check_object(lowered, POLICIES).errors
    assert errors and all(e.startswith("Profile ") for e in errors)
    assert any("is above the maximum" in e for e in errors)


def test_the_shipped_objects_pass() -> None:
    for doc in shipped():
        assert check_object(as_object(doc), POLICIES).errors == []


def test_validate_policy_refuses_with_the_errors(tmp_path: Path) -> None:
    client = create_app({"policy_dir": str(POLICIES)}).test_client()

    def review(obj: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-7",
                "operation": "CREATE",
                "name": obj["metadata"]["name"],
                "kind": {"group": "runguard.io", "version": "v1", "kind": obj["kind"]},
                "object": obj,
            },
        }
        answer = client.post("/validate-policy", json=body)
        assert answer.status_code == 200
        response: dict[str, Any] = answer.get_json()["response"]
        return response

    refused = review(BROKEN)
    assert refused["uid"] == "u-7" and refused["allowed"] is False
    message = refused["status"]["message"]
    assert message.startswith("runguard: Profile lots does not load (fix these keys")
    assert 'spec.resources.requests.cpu: "lots" is not a quantity' in message
    assert review(shipped()[0])["allowed"] is True


# --- the mirror and the status --------------------------------------------------------


def test_the_mirror_holds_exactly_the_objects(tmp_path: Path) -> None:
    objects = [as_object(d) for d in shipped()]
    assert mirror(objects, tmp_path) is True
    assert mirror(objects, tmp_path) is False  # nothing changed, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(object_files(objects))
    assert mirror(objects[1:], tmp_path) is True
    assert len(list(tmp_path.iterdir())) == len(objects) - 1
    judged = conditions(tmp_path)
    assert set(judged) == {(d["kind"], d["metadata"]["name"]) for d in shipped()[1:]}


def test_every_object_gets_a_condition_and_the_culprit_its_errors(tmp_path: Path) -> None:
    objects = [as_object(d) for d in shipped()]
    mirror(objects, tmp_path)
    assert all(ok for ok, _ in conditions(tmp_path).values())
    mirror([*objects, as_object(BROKEN)], tmp_path)
    judged = conditions(tmp_path)
    ok, message = judged["Profile", "lots"]
    assert not ok and message.startswith('spec.resources.requests.cpu: "lots" is not a quantity')
    others = [judged[k] for k in judged if k != ("Profile", "lots")]
    assert others and all(
        not ok and message.startswith("not loaded: errors in Profile lots")
        for ok, message in others
    )


def test_a_condition_is_written_only_when_it_changes() -> None:
    obj = as_object(shipped()[0])
    key = (obj["kind"], obj["metadata"]["name"])
    (status,) = status_updates({key: obj}, {key: (True, "loaded")}).values()
    (condition,) = status["conditions"]
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == (
        "True",
        "Loaded",
        3,
    )
    assert status["observedGeneration"] == 3
    obj["status"] = status
    assert status_updates({key: obj}, {key: (True, "loaded")}) == {}
    (changed,) = status_updates({key: obj}, {key: (True, "loaded again")}).values()
    assert changed["conditions"][0]["lastTransitionTime"] == condition["lastTransitionTime"]


def test_the_watch_mirrors_events_and_writes_each_status_once(tmp_path: Path) -> None:
    written: list[tuple[str, str, Any]] = []
    state = Mirror(tmp_path, lambda kind, name, status: written.append((kind, name, status)))
    docs = shipped()
    for kind in MIRRORED:
        state.replace(kind, [as_object(d) for d in docs if d["kind"] == kind])
    state.sync()
    assert sorted((k, n) for k, n, _ in written) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )
    for kind, name, status in written:  # the status writes come back as events
        state.objects[kind, name]["status"] = status
    written.clear()
    state.sync()
    assert written == []
    state.event("Profile", "ADDED", as_object(BROKEN))
    state.sync()
    assert (tmp_path / "profile-lots.yaml").is_file()
    assert {status["conditions"][0]["status"] for _, _, status in written} == {"False"}
    state.event("Profile", "DELETED", as_object(BROKEN))
    state.sync()
    assert not (tmp_path / "profile-lots.yaml").exists()


def test_manifests_url_can_add_the_policy_webhook(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main

    url = "https://127.0.0.1:8443"
    args = ["manifests", "-p", str(POLICIES), "--url", url, "-o", "json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["items"]
    assert main([*args, "--policy-objects"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert items[:-1] == plain
    (hook,) = items[-1]["webhooks"]
    assert items[-1]["metadata"]["name"] == "runguard-policies"
    assert hook["clientConfig"] == {"url": f"{url}/validate-policy"}
    assert hook["rules"][0]["resources"] == ["runpolicies", "profiles", "platforms"]


# --- an edit that changes routing is held until the webhooks route it -------------------

TRAINING = "system:serviceaccount:kubeflow:training-operator"


def with_an_operator(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shipped documents with Kubeflow's training-operator added to the Platform:
    a kind the operators webhooks must route before the policy relies on it."""
    out = json.loads(json.dumps(docs))
    for doc in out:
        if doc["kind"] == "Platform":
            doc["spec"]["operators"].append(
                {"identity": TRAINING, "kinds": ["kubeflow.org/PyTorchJob"]}
            )
    return out


def loaded_policy(docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    from webhook.policy.loader import load_policy

    directory = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    directory.mkdir()
    mirror([as_object(d) for d in docs], directory)
    return load_policy(directory)


def test_routing_is_what_the_apiserver_compares(tmp_path: Path) -> None:
    from webhook.watches.policy import policy_routing

    shipped_policy = loaded_policy(shipped(), tmp_path)
    edited = loaded_policy(with_an_operator(shipped()), tmp_path)
    assert policy_routing(shipped_policy, "runguard") == policy_routing(
        loaded_policy(shipped(), tmp_path), "runguard"
    )
    changed = policy_routing(edited, "runguard")
    before = policy_routing(shipped_policy, "runguard")
    assert changed != before
    differ = {name for name in changed if changed[name] != before.get(name)}
    assert any("operators" in name for name in differ), differ


def test_a_routing_edit_is_held_until_the_webhooks_route_it(tmp_path: Path) -> None:
    from webhook.watches.policy import policy_routing

    served_dir = tmp_path / "served"
    served_dir.mkdir()
    written: list[tuple[str, str, Any]] = []
    cluster: dict[str, Any] = {}
    state = Mirror(
        served_dir,
        lambda kind, name, status: written.append((kind, name, status)),
        live=lambda: (cluster.get("routing"), "runguard"),
    )
    docs = shipped()
    for kind in MIRRORED:
        state.replace(kind, [as_object(d) for d in docs if d["kind"] == kind])
    state.sync()  # the first policy is served whatever is registered
    before = {p.name: p.read_text() for p in served_dir.iterdir()}
    cluster["routing"] = policy_routing(loaded_policy(docs, tmp_path), "runguard")
    for doc in with_an_operator(docs):
        if doc["kind"] == "Platform":
            state.event("Platform", "MODIFIED", as_object(doc))
    written.clear()
    state.sync()
    assert {p.name: p.read_text() for p in served_dir.iterdir()} == before  # not served
    messages = {status["conditions"][0]["message"] for _, _, status in written}
    (message,) = messages
    assert message.startswith("held: this edit changes what runguard's webhooks route (")
    assert "runguard manifests" in message
    assert {status["conditions"][0]["status"] for _, _, status in written} == {"False"}
    # Once the cluster's configurations route the edit, it is served.
    cluster["routing"] = policy_routing(loaded_policy(with_an_operator(docs), tmp_path), "runguard")
    written.clear()
    state.sync()
    assert {p.name: p.read_text() for p in served_dir.iterdir()} != before
    assert {status["conditions"][0]["status"] for _, _, status in written} == {"True"}


def test_nothing_is_held_before_the_webhooks_are_registered(tmp_path: Path) -> None:
    state = Mirror(tmp_path, lambda *a: None, live=lambda: (None, "runguard"))
    docs = shipped()
    for kind in MIRRORED:
        state.replace(kind, [as_object(d) for d in docs if d["kind"] == kind])
    state.sync()
    for doc in with_an_operator(docs):
        if doc["kind"] == "Platform":
            state.event("Platform", "MODIFIED", as_object(doc))
    state.sync()
    text = (tmp_path / "platform-digitalhub.yaml").read_text()
    assert TRAINING in text
