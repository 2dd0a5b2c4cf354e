"""Every door, from the Kubernetes API schema (SPEC section 8).

The schema is the ``kubernetes`` client's models (the newest supported release: the
client is generated from the apiserver's OpenAPI document, ``requirements.lock`` pins
it). The walk starts at ``V1PodSpec`` and collects every string field that names an
object: the name of a reference type (``LocalObjectReference``, ``SecretKeySelector``,
``TypedObjectReference``, ...) and every field whose own name says so (``secretName``,
``claimName``, ``serviceAccountName``, ``resourceClaimName``, ``...ClassName``). Each
must be a door runguard judges and routes (``webhook.engine.doors.DOORS``) or be listed
with its reason in ``NOT_DOORS``: a new field in a new release fails here first.
"""

from __future__ import annotations

import re

import kubernetes.client as k8s
import pytest
from test_manifests import OWNED, REFERENCES

from webhook.engine.doors import CONTAINERS, DOORS, NOT_DOORS, Door, _walk
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


NAMED_DOORS = [d for d in DOORS if d.kind in ("Secret", "ConfigMap", "PersistentVolumeClaim")]


@pytest.mark.parametrize("door", NAMED_DOORS, ids=lambda d: d.text)
def test_every_door_of_a_platform_kind_is_judged_and_routed(door: Door) -> None:
    """Each door of a kind the platform names (claims, configMaps, secrets) has a case in
    ``test_manifests.REFERENCES``, where the engine and the webhooks' CEL are compared
    (ServiceAccounts and resource claims have their own rules and tests)."""
    hits = [
        name
        for name, spec in REFERENCES.items()
        if any(isinstance(value, str) for value, _, _ in _walk(spec, door.path, "spec."))
    ]
    assert hits, f"no case in test_manifests.REFERENCES goes through {door.text}"
    for name in hits:
        assert platform_references(REFERENCES[name], OWNED), name
