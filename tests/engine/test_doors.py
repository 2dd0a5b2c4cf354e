"""Every door, from the Kubernetes API schema (docs/dev/guarantees.md, "Trust over time").

The schema is the ``kubernetes`` client's models (the newest supported release: the
client is generated from the apiserver's OpenAPI document, ``requirements.lock`` pins
it). The walk starts at ``V1PodSpec`` and collects every string field that names an
object: the name of a reference type (``LocalObjectReference``, ``SecretKeySelector``,
``TypedObjectReference``, ...) and every field whose own name says so (``secretName``,
``claimName``, ``serviceAccountName``, ``resourceClaimName``, ``...ClassName``). Each
must be a door runguard judges and routes (``webhook.engine.doors.DOORS``) or be listed
with its reason in ``NOT_DOORS``: a new field in a new release fails here first. And a
door listed is not yet a door judged: each is fed the platform's name (and a foreign
one) in a run a user created, as a Pod and as a Deployment's template, and must be
stripped or denied by the rule the door names.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client as k8s
import pytest
from harness.cluster_state import State
from harness.references import DENY, NAMESPACE, OWNED, REFERENCES, STRIP
from harness.shipped import ALICE, RUN

from webhook.engine import evaluate
from webhook.engine.context import Context
from webhook.engine.doors import CONTAINERS, DOORS, MAP_VALUES, NOT_DOORS, Door, located
from webhook.engine.rules import judge
from webhook.engine.rules.ownership import platform_references

# Types whose ``name`` names another object.
REFERENCE_TYPES = frozenset(
    {
        "V1LocalObjectReference",
        "V1SecretReference",
        "V1SecretKeySelector",
        "V1ConfigMapKeySelector",
        "V1SecretEnvSource",
        "V1ConfigMapEnvSource",
        "V1SecretProjection",
        "V1ConfigMapProjection",
        "V1TypedLocalObjectReference",
        "V1TypedObjectReference",
        "V1ConfigMapVolumeSource",
        "V1ClusterTrustBundleProjection",
    }
)
NAMING_FIELD = re.compile(
    r"(secret|claim|configmap|serviceaccount|volume|class|template).*name$|^serviceaccount$",
    re.IGNORECASE,
)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# Maps whose values are label values or quantities, never an object's name: any other map
# of strings (a CSI driver's volumeAttributes) is walked as the door of its values.
PLAIN_MAPS = frozenset(
    {"matchLabels", "labels", "annotations", "limits", "requests", "nodeSelector", "overhead"}
)


def naming_fields(model: str = "V1PodSpec", path: tuple[str, ...] = (),
                  seen: frozenset[str] = frozenset()) -> set[tuple[str, ...]]:  # fmt: skip
    """Every path below ``model`` to a string field that names an object."""
    cls = getattr(k8s, model)
    out: set[tuple[str, ...]] = set()
    for attribute, type_text in cls.openapi_types.items():
        key = cls.attribute_map[attribute]
        here, inner = (*path, key), type_text
        while (match := re.fullmatch(r"List\[(.+)\]", inner)) is not None:
            inner, here = match[1], (*here, "*")
        if re.fullmatch(r"(Core)?V\d\w+", inner):
            if inner not in seen:  # types are recursive (JSONSchemaProps): once per path
                out |= naming_fields(inner, here, seen | {model})
        elif inner == "str" and (
            (model in REFERENCE_TYPES and key == "name") or NAMING_FIELD.search(key)
        ):
            out.add(here)
        elif inner == "Dict[str, str]" and key not in PLAIN_MAPS:
            out.add((*here, MAP_VALUES))  # a free map: any of its values may name something
    return out


def normalized(path: tuple[str, ...]) -> str:
    if path[0] in CONTAINER_LISTS:
        path = (CONTAINERS, *path[1:])
    return ".".join(path)


FOUND = {normalized(p) for p in naming_fields()}


def test_the_walk_sees_the_schema() -> None:
    """The walk itself: the doors everyone knows are found (else it proves nothing)."""
    assert {
        "volumes.*.secret.secretName",
        "CONTAINERS.*.envFrom.*.secretRef.name",
        "serviceAccountName",
        "volumes.*.csi.nodePublishSecretRef.name",
        "volumes.*.csi.volumeAttributes.{*}",
    } <= FOUND
    assert len(FOUND) > 25


def test_every_field_that_names_an_object_is_judged_or_explained() -> None:
    doors = {door.text for door in DOORS}
    unknown = FOUND - doors - set(NOT_DOORS)
    assert not unknown, f"fields that name an object, neither a door nor explained: {unknown}"


def test_every_door_and_every_exception_is_in_the_schema() -> None:
    """No stale entry: each door and each exception is a field of this release."""
    assert {door.text for door in DOORS} <= FOUND
    assert set(NOT_DOORS) <= FOUND


NAMED_KINDS = ("Secret", "ConfigMap", "PersistentVolumeClaim", "ResourceClaim")
NAMED_DOORS = [d for d in DOORS if d.kind in NAMED_KINDS]


@pytest.mark.parametrize("door", NAMED_DOORS, ids=lambda d: d.text)
def test_every_door_of_a_platform_kind_is_judged_and_routed(door: Door) -> None:
    """Each door of a kind the platform names (claims of storage and of devices,
    configMaps, secrets) has a case in ``test_manifests.REFERENCES``, where the engine
    and the webhooks' CEL are compared (ServiceAccounts have their own rule and tests)."""
    hits = [name for name, spec in REFERENCES.items() if any(r.door == door for r in located(spec))]
    assert hits, f"no case in test_manifests.REFERENCES goes through {door.text}"
    for name in hits:
        assert platform_references(REFERENCES[name], OWNED), name


# --- each door judged by its rule ----------------------------------------------------------


# The run r1's objects, by kind, as the platform names them.
PLATFORM_NAMES = {
    "Secret": "sec-api-r1",
    "ConfigMap": "init-config-map-r1",
    "PersistentVolumeClaim": "v-r1-data",
    "ServiceAccount": "core",
    "ResourceClaim": "gpu-r1",
}
# Names of no platform pattern that a run still may not use through these doors.
FOREIGN_NAMES = {
    "Secret": "team-token",
    "PersistentVolumeClaim": "old-data",
    "ResourceClaim": "train-gpu-x7k2p",  # another Pod's claim, made from its template
}
NAMED_LISTS = ("volumes", "env", "resourceClaims")  # whose entries need a name


def door_spec(door: Door, name: str) -> dict[str, Any]:
    """A pod spec naming ``name`` through ``door`` and nothing else: one entry per list."""

    def build(path: tuple[str, ...], parent: str) -> Any:
        if not path:
            return name
        head, rest = path[0], path[1:]
        if head == MAP_VALUES:  # a driver's attribute, as the Azure drivers name it
            return {"secretName": build(rest, parent)}
        if head == "*":
            item = build(rest, parent)
            if parent in NAMED_LISTS:
                item = {"name": f"{parent}-0", **item}
            return [item]
        node = {head: build(rest, head)}
        if not rest and door.when is not None:
            node[door.when[0]] = door.when[1]
        return node

    path = ("containers", *door.path[1:]) if door.path[0] == CONTAINERS else door.path
    spec: dict[str, Any] = build(path, "")
    containers = spec.setdefault("containers", [{}])
    containers[0].update(name="main", image="python:3.11")
    return spec


def as_object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = {"name": "train", "namespace": NAMESPACE, "labels": dict(RUN)}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata, "name": "serve"},
        "spec": {
            "selector": {"matchLabels": dict(RUN)},
            "template": {"metadata": {"labels": dict(RUN)}, "spec": spec},
        },
    }


def pod_spec(obj: dict[str, Any]) -> Any:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


DOOR_CASES = [
    pytest.param(door, names[door.kind], id=f"{door.text}={names[door.kind]}")
    for door in DOORS
    for names in (PLATFORM_NAMES, FOREIGN_NAMES)
    if door.kind in names and not (door.by_pattern and names is FOREIGN_NAMES)
]  # a map's value is a reference only by a platform name (any other: the driver's)


def test_every_door_has_a_platform_name_to_be_fed() -> None:
    """A door of a new kind needs a name here, else the test below would skip it."""
    assert {door.kind for door in DOORS} <= set(PLATFORM_NAMES)


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
@pytest.mark.parametrize("policy", [STRIP, DENY], ids=["strip", "deny"])
@pytest.mark.parametrize(("door", "name"), DOOR_CASES)
def test_every_door_is_judged_by_its_rule(door: Door, name: str, policy: Any, kind: str) -> None:
    """In a run a user created, the name through the door is stripped (the reference
    gone from what is stored) or denied, by the rule the door names: a door listed but
    judged by nothing, or by another rule than it says, fails here."""
    obj = as_object(kind, door_spec(door, name))
    assert [(r.door, r.name) for r in located(pod_spec(obj))] == [(door, name)]
    decision = evaluate(obj, policy, namespace=NAMESPACE, context=Context(ALICE, State([])))
    assert decision.error is None, decision.message()
    denied = {v.rule for v in decision.violations if not v.drift}
    if judge(door) in denied:
        assert not decision.allowed
        return
    assert judge(door) in {c.rule for c in decision.mutations}, (denied, decision.mutations)
    if kind == "Pod":
        assert not list(located(pod_spec(decision.object))), decision.object
    # else a template is judged, never patched: each Pod made from it is stripped


@pytest.mark.parametrize(("door", "name"), DOOR_CASES)
def test_the_platforms_run_keeps_what_the_platform_named(door: Door, name: str) -> None:
    """The other side: the platform's own run keeps a platform name through every door
    (a foreign name of a kind it never may use is stripped all the same)."""
    from harness.shipped import CORE

    obj = as_object("Pod", door_spec(door, name))
    decision = evaluate(obj, STRIP, namespace=NAMESPACE, context=Context(CORE, State([])))
    kept = [(r.door, r.name) for r in located(pod_spec(decision.object))]
    may = name == PLATFORM_NAMES[door.kind] and door.text not in NEVER_FOR_A_RUN
    assert (kept == [(door, name)]) == may, decision.mutations


# Doors no run uses, whoever created it: a claim template cloning a claim (runs get new,
# empty claims; the platform copies data in itself).
NEVER_FOR_A_RUN = frozenset(
    {
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSource.name",
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSourceRef.name",
    }
)


def test_stripping_removes_only_what_holds_the_reference() -> None:
    """A projected volume keeps its other sources, an env list its other entries; a
    volume left without sources goes with its mounts."""
    spec = {
        "containers": [{
            "name": "main", "image": "python:3.11",
            "env": [{"name": "A", "value": "1"},
                    {"name": "B",
                     "valueFrom": {"secretKeyRef": {"name": "team-token", "key": "k"}}}],
            "volumeMounts": [{"name": "mixed", "mountPath": "/m"},
                             {"name": "only", "mountPath": "/o"}],
        }],
        "volumes": [
            {"name": "mixed", "projected": {"sources": [
                {"downwardAPI": {"items": []}}, {"secret": {"name": "team-token"}}]}},
            {"name": "only", "projected": {"sources": [{"secret": {"name": "team-token"}}]}},
        ],
    }  # fmt: skip
    decision = evaluate(as_object("Pod", spec), STRIP, namespace=NAMESPACE,
                        context=Context(ALICE, State([])))  # fmt: skip
    stored = decision.object["spec"]
    assert stored["volumes"] == [
        {"name": "mixed", "projected": {"sources": [{"downwardAPI": {"items": []}}]}}
    ]
    main = stored["containers"][0]
    assert main["env"] == [{"name": "A", "value": "1"}]
    assert main["volumeMounts"] == [{"name": "mixed", "mountPath": "/m"}]
