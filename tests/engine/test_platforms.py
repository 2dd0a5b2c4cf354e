"""The real platforms are the users: every object under tests/platforms/, built as the
platform's own code builds it, through the engine with the shipped policy.

Each fixture ``NAME.yaml`` (one object) has an ``NAME.expect.yaml`` beside it; the format
is described in tests/platforms/README.md. A fixture whose expectation records a known
mismatch (``xfail:``) is marked ``xfail(strict=True)``: the suite stays green while the
gap is visible, and the test fails loudly (XPASS) once the policy or the engine is fixed,
so the marker is removed then.

A pod controller is judged twice, as the cluster would: the object itself (the
controllers' validating webhook) and the Pod its controller creates from the template
(the Pod webhooks). Every Pod is judged as the webhooks receive it, after the built-in
ServiceAccount admission plugin added the API token volume (``admitted_pod``).

A Pod an operator creates (``operator:``) is judged as the operator submits it: the
operator's identity asks, its ``ownerReferences`` name the owning custom resources by uid,
and those are in the cluster state as runguard stamped them when each was created
(``operator_chain``). An operator's custom resource can be a fixture of its own: runguard
records who created it and does not otherwise judge it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO, TESTS

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import Decision, evaluate, scope
from webhook.engine.context import Context, Requester
from webhook.engine.rules import ownership
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Operator, Policy

ROOT = TESTS / "platforms"
EXPECT_SUFFIX = ".expect.yaml"
EXPECT_KEYS = frozenset(
    {
        "description",
        "policy",
        "policyPatch",
        "annotations",
        "applies",
        "allowed",
        "violations",
        "podViolations",
        "unchanged",
        "kept",
        "removed",
        "equals",
        "as",
        "clusterState",
        "operator",
        "xfail",
        "because",
    }
)

# kind -> keys from the object to its pod template
TEMPLATES: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
}
OPERATOR_KEYS = frozenset({"identity", "owners"})
OWNER_KEYS = frozenset({"apiVersion", "kind", "name", "createdBy", "labels", "annotations"})

# What the controllers add to the Pods they create (kube-controller-manager 1.33).
CONTROLLER_LABELS: dict[str, dict[str, str]] = {
    "Job": {
        "batch.kubernetes.io/controller-uid": "0b7a3c52-8d1e-4f7a-9a51-3c0f5d2e1b11",
        "controller-uid": "0b7a3c52-8d1e-4f7a-9a51-3c0f5d2e1b11",
    },
    "CronJob": {
        "batch.kubernetes.io/controller-uid": "0b7a3c52-8d1e-4f7a-9a51-3c0f5d2e1b12",
        "controller-uid": "0b7a3c52-8d1e-4f7a-9a51-3c0f5d2e1b12",
    },
    "Deployment": {"pod-template-hash": "5d8f7c9b6d"},
    "StatefulSet": {"apps.kubernetes.io/pod-index": "0"},
    "ReplicaSet": {},
}


# ------------------------------------------------------------------------ fixtures


def fixtures() -> Iterator[Any]:
    for path in sorted(ROOT.glob("*/*.yaml")):
        if path.name.endswith(EXPECT_SUFFIX):
            continue
        for name, expect in load_cases(path):
            marks = []
            if expect.get("xfail"):
                marks.append(
                    pytest.mark.xfail(
                        strict=True, raises=KnownMismatch, reason=str(expect["xfail"])
                    )
                )
            case_id = f"{path.parent.name}/{path.stem}" + (f"/{name}" if name else "")
            yield pytest.param(path, name, id=case_id, marks=marks)


class KnownMismatch(AssertionError):
    """The failure an ``xfail`` expectation announces (its ``because`` text was found)."""


def load_cases(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(case name, expectation) pairs: one unnamed case, or the named ``cases``."""
    expect_path = path.with_name(path.stem + EXPECT_SUFFIX)
    doc = yaml.safe_load(expect_path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), f"{expect_path}: not a mapping"
    if "cases" not in doc:
        return [("", check_expect(doc, expect_path))]
    unknown = set(doc) - {"cases"}
    assert not unknown, f"{expect_path}: with cases, nothing else at the top: {sorted(unknown)}"
    out = []
    for case in doc["cases"]:
        assert isinstance(case, dict) and case.get("name"), f"{expect_path}: a case needs a name"
        name = case.pop("name")
        out.append((name, check_expect(case, expect_path)))
    return out


def check_expect(expect: dict[str, Any], where: Path) -> dict[str, Any]:
    unknown = set(expect) - EXPECT_KEYS
    assert not unknown, f"{where}: unknown keys {sorted(unknown)}"
    assert "policy" in expect, f"{where}: no policy"
    if expect.get("xfail"):
        assert expect.get("because"), f"{where}: an xfail needs `because` (text of the failure)"
    operator = expect.get("operator")
    if operator is not None:
        assert isinstance(operator, dict) and not set(operator) - OPERATOR_KEYS, (
            f"{where}: operator takes {sorted(OPERATOR_KEYS)}"
        )
        assert operator.get("identity") and operator.get("owners"), (
            f"{where}: operator needs an identity and owners"
        )
        for owner in operator["owners"]:
            assert isinstance(owner, dict) and not set(owner) - OWNER_KEYS, (
                f"{where}: an owner takes {sorted(OWNER_KEYS)}"
            )
            missing = {"apiVersion", "kind", "name", "createdBy"} - set(owner)
            assert not missing, f"{where}: an owner needs {sorted(missing)}"
    return expect


def load_object(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert len(docs) == 1, f"{path}: one object per fixture, found {len(docs)}"
    obj = json.loads(json.dumps(docs[0]))  # no YAML anchors left shared between paths
    assert isinstance(obj, dict) and (obj.get("kind") in TEMPLATES or is_custom(obj)), (
        f"{path}: not a pod, a controller or an operator's custom resource"
    )
    return obj


def is_custom(obj: dict[str, Any]) -> bool:
    """An object of a custom resource (an API group with a dot: argoproj.io, ray.io)."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return "." in group and isinstance(obj.get("kind"), str)


_POLICIES: dict[str, Policy] = {}


def policy_for(expect: dict[str, Any], tmp_path: Path) -> Policy:
    """The shipped policy directory, optionally with a JSON merge patch on its RunPolicy."""
    directory = REPO / expect["policy"]
    patch = expect.get("policyPatch")
    if patch is None:
        key = str(directory)
        if key not in _POLICIES:
            _POLICIES[key] = load_policy(directory)
        return _POLICIES[key]
    patched = tmp_path / "policy"
    patched.mkdir()
    for source in sorted(directory.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text(encoding="utf-8")) if d]
        for doc in docs:
            if doc.get("kind") == "RunPolicy":
                doc["spec"] = merge_patch(doc["spec"], patch)
        (patched / source.name).write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return load_policy(patched)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# ------------------------------------------------------------ what the cluster adds


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    node = obj
    for key in TEMPLATES[obj["kind"]]:
        node = node[key]
    return node


KCM = "system:serviceaccount:kube-system:"
# kind -> (the controller creating its Pods, owners from the Pod up: (kind, stamp) with
# "platform" for the platform's identity)
OWNER_CHAINS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "Job": ("job", (("Job", "platform"),)),
    "CronJob": ("job", (("Job", f"{KCM}cronjob-controller"), ("CronJob", "platform"))),
    "Deployment": (
        "replicaset",
        (("ReplicaSet", f"{KCM}deployment-controller"), ("Deployment", "platform")),
    ),
    "StatefulSet": ("statefulset", (("StatefulSet", "platform"),)),
    "ReplicaSet": ("replicaset", (("ReplicaSet", "platform"),)),
    "DaemonSet": ("daemonset", (("DaemonSet", "platform"),)),
}


def platform_user(policy: Policy) -> str:
    """The user name the platform's first identity acts as."""
    identities = policy.first.platform.identities
    if not identities:
        return "nobody"
    first = identities[0]
    return "system:" + first if first.startswith("serviceaccount:") else first


def contexts(
    obj: dict[str, Any], pod: dict[str, Any], expect: dict[str, Any], policy: Policy
) -> tuple[Context, Context]:
    """Who creates the object and its Pod, and the cluster they see (docs/dev/guarantees.md,
    "Ownership").

    By default the platform's first identity creates the object; a controller's Pod comes
    from the kube-controller-manager's controller, owned (by uid, in the cluster state)
    by objects the platform stamped. ``as:`` names another requester (a user's kubectl),
    ``clusterState:`` adds objects (claims a project owns), ``operator:`` has an
    operator create the Pod (``operator_chain``)."""
    user = expect.get("as") or platform_user(policy)
    extra = [copy.deepcopy(o) for o in expect.get("clusterState") or ()]
    namespace = obj["metadata"].get("namespace", "default")
    if expect.get("operator"):
        assert obj["kind"] == "Pod", "operator: the fixture is the Pod the operator creates"
        requester, owners = operator_chain(pod, expect["operator"], policy, extra)
        ctx = Context(requester, StaticClusterState.from_documents([*owners, *extra]))
        return ctx, ctx
    if obj["kind"] == "Pod" or is_custom(obj):
        state = StaticClusterState.from_documents(extra)
        ctx = Context(Requester(user), state)
        return ctx, ctx
    controller, chain = OWNER_CHAINS[obj["kind"]]
    # As runguard recorded them when each was created (docs/dev/guarantees.md, "Trust over time"):
    # who asked, whether that was the platform (the chain's top, created by ``user``), the
    # RunPolicy.
    requester = Requester(user)
    governing = scope.choose(
        policy,
        template_of(obj)["metadata"].get("labels") or {},
        namespace,
        lambda p: ownership.is_identity(p.requesters, requester),
    )
    records = (
        {PLATFORM_RECORD: "true"} if ownership.is_platform_identity(policy.first, requester) else {}
    )
    owners: list[dict[str, Any]] = []
    for i, (kind, stamp) in enumerate(chain):
        owners.append(
            {
                "apiVersion": "v1",
                "kind": kind,
                "metadata": {
                    "name": f"{obj['metadata']['name']}-{i}",
                    "namespace": namespace,
                    "uid": f"uid-{kind.lower()}-{i}",
                    "labels": {POLICY_LABEL: governing.name} if governing else {},
                    "annotations": {
                        REQUESTED_BY: user if stamp == "platform" else stamp,
                        **records,
                    },
                },
            }
        )
    for child, parent in zip(owners, owners[1:], strict=False):
        child["metadata"]["ownerReferences"] = [_reference(parent)]
    pod["metadata"]["ownerReferences"] = [_reference(owners[0])]
    state = StaticClusterState.from_documents([*owners, *extra])
    return Context(Requester(user), state), Context(
        Requester(f"{KCM}{controller}-controller"), state
    )


def _reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"kind": owner["kind"], "name": meta["name"], "uid": meta["uid"], "controller": True}


def operator_chain(
    pod: dict[str, Any], operator: dict[str, Any], policy: Policy, extra: list[dict[str, Any]]
) -> tuple[Requester, list[dict[str, Any]]]:
    """The operator's request for ``pod`` and the objects owning it, as the cluster holds
    them: each owner (``operator.owners``, from the Pod up) created in turn from the top
    by its ``createdBy`` (``platform``: the platform's first identity, ``operator``: the
    operator, else that user name), through runguard's webhooks as the apiserver calls
    them (``evaluate``, which writes the stamp and the platform record), each owned by
    the next by uid; the Pod owned by the first. An owner of a kube controller kind (a
    Job an operator creates) carries the Pod's template; an owner Pod (a Spark driver)
    only the Pod's image."""
    namespace = pod["metadata"].setdefault("namespace", "default")
    identity = str(operator["identity"])
    creators = {"platform": platform_user(policy), "operator": identity}
    made: list[dict[str, Any]] = []
    parent: dict[str, Any] | None = None
    owners = list(enumerate(operator["owners"]))
    for i, owner in reversed(owners):
        kind = owner["kind"]
        meta: dict[str, Any] = {
            "name": owner["name"],
            "namespace": namespace,
            "uid": f"uid-{kind.lower()}-{i}",
            "labels": dict(owner.get("labels") or {}),
            "annotations": dict(owner.get("annotations") or {}),
        }
        if parent is not None:
            meta["ownerReferences"] = [{**_reference(parent), "blockOwnerDeletion": True}]
        obj: dict[str, Any] = {"apiVersion": owner["apiVersion"], "kind": kind, "metadata": meta}
        if kind == "Pod":  # a Pod owning Pods (a Spark driver its executors): a bare one
            image = pod["spec"]["containers"][0]["image"]
            obj["spec"] = {"containers": [{"name": "main", "image": image}]}
        elif kind in TEMPLATES:
            node = obj
            for key in TEMPLATES[kind][:-1]:
                node = node.setdefault(key, {})
            labels = pod["metadata"].get("labels") or {}
            node["template"] = {"metadata": {"labels": dict(labels)},
                                "spec": copy.deepcopy(pod["spec"])}  # fmt: skip
        creator = creators.get(owner["createdBy"], owner["createdBy"])
        state = StaticClusterState.from_documents([*made, *extra])
        decision = evaluate(obj, policy, namespace=namespace,
                            context=Context(Requester(creator), state))  # fmt: skip
        assert decision.allowed, f"the owner {kind} {owner['name']}: {decision.message()}"
        parent = decision.object
        made.append(parent)
    assert parent is not None
    pod["metadata"]["ownerReferences"] = [{**_reference(parent), "blockOwnerDeletion": True}]
    return Requester(identity), made


def admitted_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """The Pod as the admission webhooks receive it.

    For a controller: the Pod its controller creates from the template (template labels
    plus the controller's own, generateName from the object's name). For every Pod: what
    the ServiceAccount admission plugin adds before webhooks run (serviceAccountName
    ``default`` when unset, the projected ``kube-api-access`` token volume mounted in
    every container) unless automountServiceAccountToken is false.
    """
    if obj["kind"] == "Pod":
        pod = copy.deepcopy(obj)
    else:
        template = copy.deepcopy(template_of(obj))
        meta = template.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), **CONTROLLER_LABELS[obj["kind"]]}
        if obj["kind"] in ("Job", "CronJob"):
            job_name = obj["metadata"]["name"] + ("-29100000" if obj["kind"] == "CronJob" else "")
            labels["batch.kubernetes.io/job-name"] = job_name
            labels["job-name"] = job_name
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": obj["metadata"]["name"] + "-",
                "namespace": obj["metadata"].get("namespace", "default"),
                "labels": labels,
                **({"annotations": meta["annotations"]} if meta.get("annotations") else {}),
            },
            "spec": template["spec"],
        }
    spec = pod["spec"]
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    if spec.get("automountServiceAccountToken") is not False:
        spec.setdefault("volumes", []).append(
            {
                "name": "kube-api-access-7xk2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {
                                            "apiVersion": "v1",
                                            "fieldPath": "metadata.namespace",
                                        },
                                    }
                                ]
                            }
                        },
                    ],
                },
            }
        )
        for key in ("initContainers", "containers"):
            for container in spec.get(key) or ():
                container.setdefault("volumeMounts", []).append(
                    {
                        "name": "kube-api-access-7xk2p",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                )
    return pod


def with_annotations(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    """``obj`` with annotations on its pod (template) metadata, or a custom resource's."""
    obj = copy.deepcopy(obj)
    template = obj if obj["kind"] == "Pod" or is_custom(obj) else template_of(obj)
    meta = template.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return obj


# ------------------------------------------------------------------------ paths

_STEP = re.compile(r"""\.?([A-Za-z0-9_-]+)|\[(\d+)\]|\[['"]([^'"]+)['"]\]""")
ABSENT = object()


def get_path(obj: Any, path: str) -> Any:
    """``spec.containers[0].env`` or ``metadata.labels['dhcore/run']``; ABSENT if missing."""
    node = obj
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        assert m is not None, f"bad path {path!r} at {pos}"
        pos = m.end()
        key: Any = m.group(1) or m.group(3)
        if m.group(2) is not None:
            key = int(m.group(2))
            if not isinstance(node, list) or key >= len(node):
                return ABSENT
        elif not isinstance(node, dict) or key not in node:
            return ABSENT
        node = node[key]
    return node


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def item_names(value: Any) -> list[Any]:
    return [i.get("name") for i in as_list(value) if isinstance(i, dict)]


def describe_items(items: list[Any]) -> str:
    return ", ".join(
        str(i.get("name")) if isinstance(i, dict) and "name" in i else show(i) for i in items
    )


def difference(before: Any, after: Any) -> str:
    """What changed, by item name for lists of named items (env, volumes, mounts)."""
    names_before, names_after = item_names(before), item_names(after)
    if before is not ABSENT and after is not ABSENT and None not in names_before + names_after:
        if names_before and (names_after or after == []):
            lost = [n for n in names_before if n not in names_after]
            added = [n for n in names_after if n not in names_before]
            changed = [
                n
                for n in names_before
                if n in names_after
                and as_list(before)[names_before.index(n)] != as_list(after)[names_after.index(n)]
            ]
            parts = [
                f"{label} {items}"
                for label, items in (("lost", lost), ("added", added), ("changed", changed))
                if items
            ]
            return "; ".join(parts) or "reordered"
    return f"\n  from {show(before)}\n  to   {show(after)}"


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def show(value: Any) -> str:
    if value is ABSENT:
        return "<absent>"
    return yaml.dump(value, Dumper=_NoAliases, default_flow_style=True, width=100).strip()


# -------------------------------------------------------------------------- test


def rules(decision: Decision) -> list[str]:
    return sorted({v.rule for v in decision.violations})


def judge(obj: dict[str, Any], expect: dict[str, Any], policy: Policy) -> list[str]:
    """Every way the engine's decision differs from the platform's expectations."""
    failures: list[str] = []
    applies = expect.get("applies", True)
    allowed = expect.get("allowed", True)

    custom = is_custom(obj)  # an operator's custom resource: the object alone is judged
    pod_in = copy.deepcopy(obj) if custom else admitted_pod(obj)
    object_context, pod_context = contexts(obj, pod_in, expect, policy)
    pod_decision = evaluate(pod_in, policy, context=pod_context)
    single = obj["kind"] == "Pod" or custom
    decision = pod_decision if single else evaluate(obj, policy, context=object_context)
    judged = [(obj["kind"], decision)] + ([] if single else [("Pod", pod_decision)])

    for what, d in judged:
        if d.applies != applies:
            failures.append(f"{what}: applies is {d.applies}, expected {applies}")
        if d.allowed != allowed:
            failures.append(
                f"{what}: allowed is {d.allowed}, expected {allowed}: "
                + "; ".join(str(v) for v in d.violations)
            )
    if "violations" in expect and rules(decision) != sorted(expect["violations"]):
        failures.append(
            f"{obj['kind']}: violations {rules(decision)}, expected {expect['violations']}: "
            + "; ".join(str(v) for v in decision.violations)
        )
    if (
        "podViolations" in expect
        and pod_decision is not decision
        and rules(pod_decision) != sorted(expect["podViolations"])
    ):
        failures.append(
            f"Pod: violations {rules(pod_decision)}, expected {expect['podViolations']}: "
            + "; ".join(str(v) for v in pod_decision.violations)
        )

    pod_out = pod_decision.object
    shown = obj["kind"] if custom else "Pod"
    removed: dict[str, list[str]] = expect.get("removed") or {}
    for path, names in removed.items():
        still = [n for n in names if n in item_names(get_path(pod_out, path))]
        if still:
            failures.append(f"{shown} {path}: {still} should have been removed")
    for path in expect.get("kept") or ():
        after = get_path(pod_out, path)
        after_items = after if isinstance(after, list) else []
        gone = [
            item
            for item in as_list(get_path(pod_in, path))
            if item not in after_items
            and not (isinstance(item, dict) and item.get("name") in removed.get(path, ()))
        ]
        if gone:
            failures.append(f"{shown} {path}: lost {describe_items(gone)}")
    for path in expect.get("unchanged") or ():
        before, after = get_path(pod_in, path), get_path(pod_out, path)
        if before != after:
            failures.append(f"{shown} {path} changed: {difference(before, after)}")
    for path, wanted in (expect.get("equals") or {}).items():
        actual = get_path(pod_out, path)
        wanted_value = ABSENT if wanted is None else wanted
        if actual != wanted_value:
            failures.append(f"{shown} {path} is {show(actual)}, expected {show(wanted_value)}")
    if failures and pod_decision.warnings:
        failures.append("warnings: " + " | ".join(pod_decision.warnings))
    return failures


@pytest.mark.parametrize(("path", "case"), list(fixtures()))
def test_platform_fixture(path: Path, case: str, tmp_path: Path) -> None:
    expect = dict(load_cases(path))[case]
    obj = load_object(path)
    if expect.get("annotations"):
        obj = with_annotations(obj, expect["annotations"])
    failures = judge(obj, expect, policy_for(expect, tmp_path))
    if not failures:
        return
    text = "\n".join(failures)
    because = expect.get("because")
    if because is not None:
        wanted = [because] if isinstance(because, str) else list(because)
        if all(w in text for w in wanted):
            raise KnownMismatch(text)
        text += f"\n(the expected mismatch {wanted} was not the failure)"
    raise AssertionError(text)


def test_every_fixture_has_expectations_and_a_source() -> None:
    found = [p for p in ROOT.glob("*/*.yaml") if not p.name.endswith(EXPECT_SUFFIX)]
    assert len(found) >= 20
    for path in found:
        assert path.with_name(path.stem + EXPECT_SUFFIX).is_file(), f"{path}: no expectations"
        header = path.read_text(encoding="utf-8").split("\n", 1)[0]
        assert header.startswith("# Source:"), f"{path}: the first line must cite its source"
    for expect in ROOT.glob(f"*/*{EXPECT_SUFFIX}"):
        fixture = expect.with_name(expect.name[: -len(EXPECT_SUFFIX)] + ".yaml")
        assert fixture.is_file(), f"{expect}: no fixture"


def test_paths() -> None:
    obj = {"metadata": {"labels": {"dhcore/run": "r1"}}, "spec": {"containers": [{"name": "a"}]}}
    assert get_path(obj, "metadata.labels['dhcore/run']") == "r1"
    assert get_path(obj, "spec.containers[0].name") == "a"
    assert get_path(obj, "spec.containers[1].name") is ABSENT
    assert get_path(obj, "spec.volumes") is ABSENT


def test_an_operators_owners_are_stamped_as_runguard_stamps_them() -> None:
    """``operator:`` builds the chain through runguard: the platform's custom resource is
    recorded as the platform's, and so is the one its operator made from it; a user's is
    not, whatever annotations the operator copied from it onto its own."""
    shipped = load_policy(REPO / "policies")
    ray = "system:serviceaccount:digitalhub:kuberay-operator"
    operators = (Operator(identity=ray, kinds=("ray.io/RayJob", "ray.io/RayCluster")),)
    first, *others = shipped.run_policies
    platform = first.platform.model_copy(update={"operators": operators})
    policy = Policy.of(first.model_copy(update={"platform": platform}), *others)
    core = platform_user(policy)

    def chain(top: str, copied: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "rc-head", "namespace": "ml"},
            "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray"}]},
        }
        owners = [
            {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
             "createdBy": "operator", "annotations": copied},
            {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rj", "createdBy": top},
        ]  # fmt: skip
        requester, made = operator_chain(pod, {"identity": ray, "owners": owners}, policy, [])
        assert requester == Requester(ray)
        return pod, made

    pod, (job, cluster) = chain("platform", {})
    records = {PLATFORM_RECORD: "true", PLATFORM_POLICY: first.name}  # the recording one's
    assert job["metadata"]["annotations"] == {REQUESTED_BY: core, **records}
    assert cluster["metadata"]["annotations"] == {REQUESTED_BY: ray, **records}
    assert cluster["metadata"]["ownerReferences"] == [
        {"kind": "RayJob", "name": "rj", "uid": "uid-rayjob-1", "controller": True,
         "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert [r["uid"] for r in pod["metadata"]["ownerReferences"]] == ["uid-raycluster-0"]
    # KubeRay copies the RayJob's annotations onto its RayCluster (rayjob_controller.go)
    _, (job, cluster) = chain("alice", {REQUESTED_BY: core, PLATFORM_RECORD: "true"})
    assert job["metadata"].get("annotations", {}) == {}  # a user's own: nothing recorded
    assert cluster["metadata"]["annotations"] == {REQUESTED_BY: ray}
