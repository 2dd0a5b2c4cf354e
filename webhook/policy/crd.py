"""RunPolicy, Profile, ProjectProfile and Platform as Kubernetes objects: their
CustomResourceDefinitions, and the way between an object in the cluster and a policy
document in a file.

The CRDs' ``openAPIV3Schema`` is the JSON Schema of ``schema.py`` (so the same
pydantic model) rewritten into what the apiserver accepts, a *structural* schema:

* every ``$ref`` written out in place, the key's own description winning over its
  type's; ``const`` as a one-value ``enum``; an ``enum`` given its type, and
  ``nullable`` when null is one of its values (``seccompProfile: null``: left alone);
* what the apiserver refuses or does not know left out: ``uniqueItems``,
  ``propertyNames``, runguard's own ``format``s (their ``pattern`` stays), ``$schema``,
  ``title``, and the ``if``/``then`` conditions between keys (an operator's values), which
  runguard's webhook checks; a quantity (a string or a number in the files) is int-or-string, as in
  Kubernetes' own types; a quantity or a range (a profile's resource) keeps any value
  (``x-kubernetes-preserve-unknown-fields``), checked by runguard's webhook;
* defaults are not applied by the apiserver (they would be written into the stored
  object): each is said in the key's description instead, which ``kubectl explain``
  shows;
* an object that allows no unknown key keeps its unknown keys
  (``x-kubernetes-preserve-unknown-fields``) instead of the apiserver pruning them
  silently: runguard's validating webhook then refuses them with the message ``runguard
  lint`` gives (``unknown key "runtimeClass" (did you mean "runtimeClassName"?)``).

RunPolicy, Profile and Platform are cluster-scoped, with a ``status`` subresource
runguard writes (a ``Loaded`` condition: true, or false with the errors naming the key);
a RunPolicy's ``spec.platform`` (a Platform's name, or the older inline mapping) keeps
any value in the CRD and is checked by runguard's webhook; a project's
ProjectProfile is namespaced, without status (runguard reads it from its cache and
judges it on each run). Each kind has printer columns. ``runguard manifests --write``
writes them to ``manifests/policy-objects/``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from webhook.policy.formats import DEFS
from webhook.policy.model import API_VERSION, KINDS
from webhook.policy.schema import policy_schema

__all__ = [
    "CRD_FILES",
    "GROUP",
    "MIRRORED",
    "NAMESPACED",
    "PLURALS",
    "VERSION",
    "document_of",
    "object_file_name",
    "policy_crds",
]

GROUP, VERSION = API_VERSION.split("/")
PLURALS = {
    "RunPolicy": "runpolicies",
    "Profile": "profiles",
    "ProjectProfile": "projectprofiles",
    "Platform": "platforms",
}
SHORT_NAMES = {
    "RunPolicy": ["rpol"],
    "Profile": ["rprof"],
    "ProjectProfile": ["pprof"],
    "Platform": ["rplat"],
}
# A project's profiles live in its namespace; the policy's kinds are cluster-scoped.
NAMESPACED = frozenset({"ProjectProfile"})
# The kinds the policy watch mirrors into the policy directory (a ProjectProfile is read
# by the cluster-state watch instead: ``webhook.policy.project``).
MIRRORED = ("RunPolicy", "Profile", "Platform")
CRD_FILES = {kind: f"{GROUP}_{plural}.yaml" for kind, plural in PLURALS.items()}
LOADED = "Loaded"  # the condition runguard writes in each object's status
LABELS = {"app.kubernetes.io/name": "runguard", "app.kubernetes.io/part-of": "runguard"}

# Keys the apiserver's structural schemas refuse, or that mean nothing to it.
_DROPPED = {"$schema", "$id", "title", "uniqueItems", "propertyNames", "format", "default"}
_DROPPED |= {"allOf", "if", "then", "else"}  # conditions between keys: the webhook judges them
_KUBE_FORMATS = {"int32", "int64", "float", "double", "byte", "date", "date-time"}

# A request as written: a quantity, or a range {"default":..,"max":..,"min":..} (kubectl
# prints a map as JSON), what a user may pick.
_RESOURCE_COLUMNS = [
    {"name": name, "type": "string", "jsonPath": f".spec.resources.requests.{key}"}
    for name, key in (("CPU", "cpu"), ("Memory", "memory"), ("GPU", "gpu"))
]
_DESCRIPTION = {
    "name": "Description",
    "type": "string",
    "jsonPath": ".spec.description",
    "priority": 1,  # kubectl get -o wide: a sentence would crowd the table
}
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "RunPolicy": [
        {"name": "Enforcement", "type": "string", "jsonPath": ".spec.enforcement"},
        {"name": "Default profile", "type": "string", "jsonPath": ".spec.profiles.default"},
    ],
    "Profile": [
        *_RESOURCE_COLUMNS,
        # the namespaces it is kept to; empty: every namespace
        {"name": "Scope", "type": "string", "jsonPath": ".spec.namespaceSelector"},
        _DESCRIPTION,
    ],
    # its scope is its namespace (kubectl get -A shows it)
    "ProjectProfile": [*_RESOURCE_COLUMNS, _DESCRIPTION],
    "Platform": [
        {"name": "Identities", "type": "string", "jsonPath": ".spec.identities"},
        {"name": "Project label", "type": "string", "jsonPath": ".spec.projectLabel"},
    ],
}
COMMON_COLUMNS = [
    {
        "name": "Loaded",
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{LOADED}")].status',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Written by runguard: whether the object is part of the serving policy.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "description": "The generation of the object the conditions are about.",
        },
        "conditions": {
            "type": "array",
            "description": (
                f"{LOADED}: True when the object loads with the others, False with the "
                "errors (each naming its key) while runguard keeps serving the last good "
                "policy."
            ),
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "observedGeneration": {"type": "integer", "format": "int64"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                },
            },
        },
    },
}


def policy_crds() -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of the policy kinds, in ``KINDS`` order."""
    schema = policy_schema()
    defs = schema["$defs"]
    return [_crd(kind, defs, spec.__name__) for kind, (spec, _) in KINDS.items()]


def _crd(kind: str, defs: Mapping[str, Any], spec_name: str) -> dict[str, Any]:
    spec = _structural(defs[spec_name], defs, ())
    plural = PLURALS[kind]
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
    }
    version: dict[str, Any] = {"name": VERSION, "served": True, "storage": True}
    if kind in MIRRORED:  # runguard writes whether it loaded
        properties["status"] = copy.deepcopy(STATUS_SCHEMA)
        version["subresources"] = {"status": {}}
        columns = PRINTER_COLUMNS[kind] + COMMON_COLUMNS
    else:  # judged per run, read from runguard's cache: no status to write
        columns = PRINTER_COLUMNS[kind] + COMMON_COLUMNS[1:]
    version["additionalPrinterColumns"] = columns
    version["schema"] = {
        "openAPIV3Schema": {
            "type": "object",
            "description": defs[spec_name].get("description", kind),
            "required": ["spec"],
            "properties": properties,
        }
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": dict(LABELS)},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if kind in NAMESPACED else "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": SHORT_NAMES[kind],
                "categories": ["runguard"],
            },
            "versions": [version],
        },
    }


def _structural(node: Any, defs: Mapping[str, Any], seen: tuple[str, ...]) -> Any:
    """``node`` of the JSON Schema as a structural schema (see the module docstring)."""
    if isinstance(node, list):
        return [_structural(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        return _referenced(ref, node, defs, seen)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: _structural(v, defs, seen) for name, v in value.items()}
        elif key == "format":
            if value in _KUBE_FORMATS:
                out[key] = value
        elif key not in _DROPPED:
            out[key] = _structural(value, defs, seen)
    if "default" in node:
        out["description"] = _with_default(out.get("description", ""), node["default"])
    for fix in _STRUCTURAL_FIXES:
        fix(out)
    return out


def _referenced(
    ref: str, node: dict[str, Any], defs: Mapping[str, Any], seen: tuple[str, ...]
) -> Any:
    """A ``$ref`` replaced by its definition, with the referring node's description and
    default."""
    name = ref.removeprefix(DEFS)
    if name in seen:
        raise ValueError(f"recursive schema {' > '.join((*seen, name))}: a CRD cannot say it")
    target = _structural(defs[name], defs, (*seen, name))
    if "description" in node:
        target["description"] = node.pop("description")
    if "default" in node:
        target["description"] = _with_default(target.get("description", ""), node["default"])
    return target


def _as_enum(out: dict[str, Any]) -> None:
    """A ``const`` is a one-value enum; an enum holding null is nullable; an enum has a type."""
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "enum" in out:
        values = [v for v in out["enum"] if v is not None]
        if len(values) < len(out["enum"]):
            out["nullable"] = True  # null means something here: the apiserver must keep it
        else:
            out["enum"] = values
        if "type" not in out:
            out["type"] = "string" if all(isinstance(v, str) for v in values) else "number"


def _quantity_or_range(out: dict[str, Any]) -> None:
    branches = out.get("anyOf")
    if isinstance(branches, list) and any(b.get("type") == "object" for b in branches):
        # a quantity or a range (a profile's resource): a structural schema cannot say
        # either, the field keeps any value and runguard's webhook checks it
        del out["anyOf"]
        out["x-kubernetes-preserve-unknown-fields"] = True


def _int_or_string(out: dict[str, Any]) -> None:
    if isinstance(out.get("type"), list):  # a quantity: 2, 0.5 or "500m"
        del out["type"]
        for bound in ("minimum", "maximum", "pattern"):
            out.pop(bound, None)
        out["x-kubernetes-int-or-string"] = True
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]


def _unknown_fields_kept(out: dict[str, Any]) -> None:
    """Where a structural schema cannot say which keys an object holds, it keeps them all
    (runguard's webhook judges them)."""
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif "properties" in out and isinstance(out.get("additionalProperties"), dict):
        del out["additionalProperties"]  # properties or additionalProperties, not both
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and not {"properties", "additionalProperties"} & set(out):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "patternProperties" in out:
        del out["patternProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True


# What a JSON Schema node needs, in this order, to be a structural one.
_STRUCTURAL_FIXES: tuple[Callable[[dict[str, Any]], None], ...] = (
    _as_enum,
    _quantity_or_range,
    _int_or_string,
    _unknown_fields_kept,
)


def _with_default(description: str, default: Any) -> str:
    if default in ({}, [], "", None):
        return description
    shown = json.dumps(default, separators=(", ", ": "))
    text = description.rstrip()
    return f"{text} Default: {shown}." if text else f"Default: {shown}."


# --- objects and documents ------------------------------------------------------------


def document_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The policy document of a policy object from the cluster: what a file would hold
    (apiVersion, kind, metadata name, labels and annotations, spec), without what the
    apiserver adds (uid, managedFields, status...)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    metadata: dict[str, Any] = {"name": meta.get("name", "")}
    if obj.get("kind") in NAMESPACED and meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    labels = meta.get("labels")
    if labels:
        metadata["labels"] = dict(labels)
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k != "kubectl.kubernetes.io/last-applied-configuration"
    }
    if annotations:
        metadata["annotations"] = annotations
    document: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion", API_VERSION),
        "kind": obj.get("kind"),
        "metadata": metadata,
    }
    if "spec" in obj:
        document["spec"] = obj["spec"]
    return document


_UNSAFE = re.compile(r"[^a-z0-9.-]")


def object_file_name(kind: str, name: str) -> str:
    """The file a mirrored object is written to: ``profile-1xt4.yaml`` (a namespaced
    object's ``name`` is ``namespace/name``: ``projectprofile-team-a_small.yaml``)."""
    return f"{kind.lower()}-{_UNSAFE.sub('_', name.lower())}.yaml"
