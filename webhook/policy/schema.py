"""The JSON Schema (Draft 2020-12) of policy documents, and the checks behind its formats.

One schema covers both kinds: ``kind`` selects the ``spec`` schema with ``if``/``then``
(not ``oneOf``, whose failures say only "not valid under any of the given schemas").
Every key has a ``description`` so editors (yaml-language-server, VS Code, IntelliJ)
can complete and explain it. Kubernetes-specific strings (quantities, label keys,
names, name patterns) carry a custom ``format`` that ``runguard`` checks exactly (the
functions below) and, for editors that ignore unknown formats, an approximate
``pattern``.

The published file ``webhook/policy/runguard.schema.json`` is generated from
``policy_schema()`` by ``runguard schema -o webhook/policy/runguard.schema.json``; a
test keeps the two identical.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from webhook.quantity import is_quantity, parse

__all__ = [
    "API_VERSION",
    "FORMAT_PROBLEMS",
    "KINDS",
    "SCHEMA_ID",
    "format_checker",
    "label_key_problem",
    "label_value_problem",
    "name_pattern_problem",
    "policy_schema",
    "quantity_problem",
    "validator",
]

API_VERSION = "runguard.io/v1"
KINDS = ("RunPolicy", "Profile")
SCHEMA_ID = "https://runguard.io/schemas/v1/runguard.schema.json"

# --- Kubernetes string formats -------------------------------------------------------

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_QUALIFIED_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(_DNS_SUBDOMAIN)
_NAME_PART_RE = re.compile(_QUALIFIED_NAME_PART)
_LABEL_VALUE_RE = re.compile(rf"({_QUALIFIED_NAME_PART})?")
# Kubernetes quantity grammar (apimachinery resource.Quantity), non-negative only.
_QUANTITY_RE = re.compile(
    r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?"
)
_PLACEHOLDER_RE = re.compile(r"\{labels\[([^\]{}]*)\]\}")
_PATTERN_LITERAL_RE = re.compile(r"[a-z0-9.*-]*")


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def quantity_problem(value: object) -> str | None:
    """Why ``value`` is not a non-negative Kubernetes quantity (``500m``, ``32Gi``, ``2``)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None  # the type keyword reports it
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a quantity"
    if isinstance(value, str) and not _QUANTITY_RE.fullmatch(value):
        if value.startswith("-") and is_quantity(value):
            return f"{_show(value)} is negative"
        return f"{_show(value)} is not a quantity"
    if not is_quantity(value):
        return f"{_show(value)} is not a quantity"
    if parse(value) < 0:
        return f"{_show(value)} is negative"
    return None


def dns_label_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 63 or not _DNS_LABEL_RE.fullmatch(value):
        return (
            f"{_show(value)} is not a valid name (at most 63 lowercase letters, digits "
            'and "-", starting and ending with a letter or digit)'
        )
    return None


def dns_subdomain_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(value):
        return (
            f"{_show(value)} is not a valid name (lowercase letters, digits, "
            '"-" and ".", starting and ending with a letter or digit)'
        )
    return None


def label_key_problem(value: object) -> str | None:
    """Why ``value`` is not a Kubernetes label/annotation key (``[prefix/]name``)."""
    if not isinstance(value, str):
        return None
    if value.count("/") > 1:
        return f'invalid label key {_show(value)}: at most one "/"'
    prefix, _, name = value.rpartition("/")
    if "/" in value and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return (
            f"invalid label key {_show(value)}: the prefix must be a DNS subdomain "
            '(lowercase letters, digits, "-" and ".")'
        )
    if not name or len(name) > 63 or not _NAME_PART_RE.fullmatch(name):
        return (
            f"invalid label key {_show(value)}: the name must be at most 63 letters, "
            'digits, "-", "_" or ".", starting and ending with a letter or digit'
        )
    return None


def label_value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (
            f"invalid label value {_show(value)}: at most 63 letters, digits, "
            '"-", "_" or ".", starting and ending with a letter or digit'
        )
    return None


def resource_name_problem(value: object) -> str | None:
    """Why ``value`` is not an extended resource name (``nvidia.com/gpu``)."""
    if not isinstance(value, str):
        return None
    prefix, slash, name = value.partition("/")
    if (
        not slash
        or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)
        or not _NAME_PART_RE.fullmatch(name)
        or len(name) > 63
    ):
        return f"{_show(value)} is not an extended resource name (domain/name, e.g. nvidia.com/gpu)"
    return None


def name_pattern_problem(value: object) -> str | None:
    """Why ``value`` is not a name pattern (``*`` and ``{labels[KEY]}`` in a Kubernetes name)."""
    if not isinstance(value, str):
        return None
    if not value:
        return "an empty pattern matches no name"
    literal_parts = []
    pos = 0
    for match in _PLACEHOLDER_RE.finditer(value):
        literal_parts.append(value[pos : match.start()])
        problem = label_key_problem(match.group(1))
        if problem:
            return f"pattern {_show(value)}: {problem}"
        pos = match.end()
    literal_parts.append(value[pos:])
    for part in literal_parts:
        if "{" in part or "}" in part:
            return f"pattern {_show(value)}: a brace must be part of a placeholder {{labels[KEY]}}"
        if not _PATTERN_LITERAL_RE.fullmatch(part):
            return (
                f"pattern {_show(value)} can never match a Kubernetes name "
                '(only lowercase letters, digits, "-", "." and "*" besides {labels[KEY]})'
            )
    return None


FORMAT_PROBLEMS: dict[str, Callable[[object], str | None]] = {
    "quantity": quantity_problem,
    "dns-label": dns_label_problem,
    "dns-subdomain": dns_subdomain_problem,
    "label-key": label_key_problem,
    "label-value": label_value_problem,
    "resource-name": resource_name_problem,
    "name-pattern": name_pattern_problem,
}


def format_checker() -> FormatChecker:
    """A checker knowing only runguard's formats (the standard ones are not used)."""
    checker = FormatChecker(formats=())
    for name, problem in FORMAT_PROBLEMS.items():
        checker.checks(name)(_is_ok(problem))
    return checker


def _is_ok(problem: Callable[[object], str | None]) -> Callable[[object], bool]:
    return lambda value: problem(value) is None


# --- the schema ----------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _enum(values: list[Any], description: str, default: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"enum": values, "description": description}
    if default is not None:
        out["default"] = default
    return out


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _object(
    description: str,
    properties: dict[str, Any],
    required: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        out["required"] = required
    out.update(extra)
    return out


def _array(description: str, items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "description": description, "items": items, **extra}


def _defs() -> dict[str, Any]:
    quantity = {
        "type": ["string", "number"],
        "format": "quantity",
        "pattern": _QUANTITY_RE.pattern.join("^$"),
        "minimum": 0,
        "description": "A Kubernetes quantity: 500m, 2, 0.5, 32Gi, 1G, 1e3.",
    }
    resource_list = {
        "type": "object",
        "description": (
            "Resource name to quantity. `gpu` means the cluster's gpu resource "
            "(`resources.gpuResourceName`); extended resources are written domain/name."
        ),
        "properties": {
            "cpu": {**_ref("quantity"), "description": "CPU cores: 500m, 2, 0.5."},
            "memory": {**_ref("quantity"), "description": "Memory bytes: 256Mi, 32Gi, 1G."},
            "gpu": {
                **_ref("quantity"),
                "description": "GPUs, counted in `resources.gpuResourceName`: 1, 2.",
            },
            "ephemeral-storage": {**_ref("quantity"), "description": "Local disk: 10Gi."},
        },
        "patternProperties": {
            "^hugepages-": _ref("quantity"),
            "/": _ref("quantity"),
        },
        "propertyNames": {
            "description": "cpu, memory, gpu, ephemeral-storage, hugepages-SIZE or domain/name.",
            "if": {"pattern": "/"},
            "then": {"format": "resource-name"},
        },
        "additionalProperties": False,
    }
    label_key = {
        "type": "string",
        "format": "label-key",
        "pattern": rf"^({_DNS_SUBDOMAIN}/)?{_QUALIFIED_NAME_PART}$",
        "maxLength": 317,
        "description": "A Kubernetes label key: [prefix/]name, e.g. dhcore/run.",
    }
    label_value = {
        "type": "string",
        "format": "label-value",
        "pattern": rf"^({_QUALIFIED_NAME_PART})?$",
        "maxLength": 63,
        "description": "A Kubernetes label value.",
    }
    label_map = {
        "type": "object",
        "description": "Label key to label value.",
        "propertyNames": _ref("labelKey"),
        "additionalProperties": _ref("labelValue"),
    }
    dns_label = {
        "type": "string",
        "format": "dns-label",
        "pattern": rf"^{_DNS_LABEL}$",
        "maxLength": 63,
        "description": "A Kubernetes name (RFC 1123 label): a namespace name.",
    }
    dns_subdomain = {
        "type": "string",
        "format": "dns-subdomain",
        "pattern": rf"^{_DNS_SUBDOMAIN}$",
        "maxLength": 253,
        "description": "A Kubernetes object name (RFC 1123 subdomain).",
    }
    name_pattern = {
        "type": "string",
        "format": "name-pattern",
        "minLength": 1,
        "description": (
            "A name pattern: `*` matches any run of characters, `{labels[KEY]}` is the "
            "pod's value of label KEY (a pod lacking it matches nothing), e.g. "
            "`v-{labels[dhcore/run]}-*`."
        ),
    }
    label_selector_requirement = _object(
        "A label selector requirement.",
        {
            "key": {**_ref("labelKey"), "description": "The label key."},
            "operator": _enum(
                ["In", "NotIn", "Exists", "DoesNotExist"], "How key and values relate."
            ),
            "values": _array(
                "Values for In and NotIn; empty for Exists and DoesNotExist.",
                _ref("labelValue"),
            ),
        },
        ["key", "operator"],
        allOf=[
            {
                "if": {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
                "then": {"required": ["values"], "properties": {"values": {"minItems": 1}}},
            },
            {
                "if": {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}}},
                "then": {"properties": {"values": {"maxItems": 0}}},
            },
        ],
    )
    label_selector = _object(
        "A Kubernetes LabelSelector.",
        {
            "matchLabels": {**_ref("labelMap"), "description": "Labels a Pod must carry."},
            "matchExpressions": _array(
                "Requirements a Pod's labels must meet (ANDed).", _ref("labelSelectorRequirement")
            ),
        },
    )
    toleration = _object(
        "A Kubernetes Toleration.",
        {
            "key": {**_ref("labelKey"), "description": "The taint key; empty with Exists: all."},
            "operator": _enum(["Exists", "Equal"], "Exists or Equal (default).", "Equal"),
            "value": _string("The taint value (Equal only)."),
            "effect": _enum(
                ["NoSchedule", "PreferNoSchedule", "NoExecute"], "Taint effect; empty: all."
            ),
            "tolerationSeconds": {
                "type": "integer",
                "description": "NoExecute only: how long the pod stays bound after the taint.",
            },
        },
        allOf=[
            {
                "if": {"properties": {"operator": {"const": "Exists"}}, "required": ["operator"]},
                "then": {"properties": {"value": {"const": ""}}},
            }
        ],
    )
    node_selector_requirement = _object(
        "A node selector requirement.",
        {
            "key": _string("Node label key or field name."),
            "operator": _enum(
                ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"], "How key and values relate."
            ),
            "values": _array("Values to compare with.", {"type": "string"}),
        },
        ["key", "operator"],
    )
    node_selector_term = _object(
        "A node selector term (its requirements are ANDed).",
        {
            "matchExpressions": _array("By node labels.", _ref("nodeSelectorRequirement")),
            "matchFields": _array("By node fields.", _ref("nodeSelectorRequirement")),
        },
    )
    pod_affinity_term = _object(
        "A pod (anti-)affinity term.",
        {
            "labelSelector": {**_ref("labelSelector"), "description": "Pods to (not) be near."},
            "namespaceSelector": {
                **_ref("labelSelector"),
                "description": "Namespaces whose pods labelSelector applies to.",
            },
            "namespaces": _array("Namespaces the selector applies to.", {"type": "string"}),
            "topologyKey": _string("Node label key defining the topology domain."),
            "matchLabelKeys": _array(
                "Pod label keys merged into labelSelector.", {"type": "string"}
            ),
            "mismatchLabelKeys": _array(
                "Pod label keys negated into labelSelector.", {"type": "string"}
            ),
        },
        ["topologyKey"],
    )
    weighted_pod_affinity_term = _object(
        "A preferred pod (anti-)affinity term.",
        {
            "weight": {**_ref("weight"), "description": "Preference weight, 1 to 100."},
            "podAffinityTerm": {**_ref("podAffinityTerm"), "description": "The term."},
        },
        ["weight", "podAffinityTerm"],
    )
    pod_affinity = _object(
        "Pod (anti-)affinity.",
        {
            "requiredDuringSchedulingIgnoredDuringExecution": _array(
                "Terms that must hold.", _ref("podAffinityTerm")
            ),
            "preferredDuringSchedulingIgnoredDuringExecution": _array(
                "Terms preferred, by weight.", _ref("weightedPodAffinityTerm")
            ),
        },
    )
    affinity = _object(
        "A Kubernetes Affinity.",
        {
            "nodeAffinity": _object(
                "Node affinity.",
                {
                    "requiredDuringSchedulingIgnoredDuringExecution": _object(
                        "Node selector terms (ORed) that must hold.",
                        {"nodeSelectorTerms": _array("ORed terms.", _ref("nodeSelectorTerm"))},
                        ["nodeSelectorTerms"],
                    ),
                    "preferredDuringSchedulingIgnoredDuringExecution": _array(
                        "Terms preferred, by weight.",
                        _object(
                            "A preferred node selector term.",
                            {
                                "weight": {**_ref("weight"), "description": "1 to 100."},
                                "preference": {
                                    **_ref("nodeSelectorTerm"),
                                    "description": "Nodes preferred.",
                                },
                            },
                            ["weight", "preference"],
                        ),
                    ),
                },
            ),
            "podAffinity": {**_ref("podAffinity"), "description": "Near pods like these."},
            "podAntiAffinity": {
                **_ref("podAffinity"),
                "description": "Away from pods like these.",
            },
        },
    )
    key_ref = {
        "name": _string("Object name."),
        "key": _string("Key in the object."),
        "optional": {"type": "boolean", "description": "Whether the object may be missing."},
    }
    env_var = _object(
        "A container environment variable.",
        {
            "name": _string("Variable name.", minLength=1),
            "value": _string("Literal value (quote numbers and booleans)."),
            "valueFrom": _object(
                "Where the value comes from.",
                {
                    "fieldRef": _object(
                        "A pod field.",
                        {
                            "fieldPath": _string("e.g. metadata.name"),
                            "apiVersion": _string("Schema version of fieldPath."),
                        },
                        ["fieldPath"],
                    ),
                    "resourceFieldRef": _object(
                        "A container resource.",
                        {
                            "resource": _string("e.g. limits.memory"),
                            "containerName": _string("Container, for volumes."),
                            "divisor": {**_ref("quantity"), "description": "Unit, e.g. 1Mi."},
                        },
                        ["resource"],
                    ),
                    "configMapKeyRef": _object("A ConfigMap key.", key_ref, ["key"]),
                    "secretKeyRef": _object("A Secret key.", key_ref, ["key"]),
                },
                minProperties=1,
                maxProperties=1,
            ),
        },
        ["name"],
    )
    return {
        "quantity": quantity,
        "resourceList": resource_list,
        "resourceRequirements": _object(
            "Requests and limits, per resource name.",
            {
                "requests": {**_ref("resourceList"), "description": "Requested resources."},
                "limits": {**_ref("resourceList"), "description": "Resource limits."},
            },
        ),
        "labelKey": label_key,
        "labelValue": label_value,
        "labelMap": label_map,
        "dnsLabel": dns_label,
        "dnsSubdomain": dns_subdomain,
        "namePattern": name_pattern,
        "namePatterns": {
            "type": "array",
            "items": _ref("namePattern"),
            "uniqueItems": True,
            "description": "Name patterns; a name matching any of them is allowed.",
        },
        "labelSelector": label_selector,
        "labelSelectorRequirement": label_selector_requirement,
        "toleration": toleration,
        "tolerations": _array("Kubernetes Tolerations.", _ref("toleration")),
        "nodeSelectorRequirement": node_selector_requirement,
        "nodeSelectorTerm": node_selector_term,
        "weight": {"type": "integer", "minimum": 1, "maximum": 100, "description": "1 to 100."},
        "podAffinityTerm": pod_affinity_term,
        "weightedPodAffinityTerm": weighted_pod_affinity_term,
        "podAffinity": pod_affinity,
        "affinity": affinity,
        "envVar": env_var,
        "metadata": _object(
            "Document metadata.",
            {
                "name": _string("The document's name."),
                "labels": {**_ref("labelMap"), "description": "Free-form labels."},
                "annotations": {
                    "type": "object",
                    "description": "Free-form annotations.",
                    "propertyNames": _ref("labelKey"),
                    "additionalProperties": {"type": "string"},
                },
            },
            ["name"],
        ),
        "runPolicySpec": _run_policy_spec(),
        "profileSpec": _profile_spec(),
    }


_VOLUME_TYPES = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
]

_ID = {"type": "integer", "minimum": 1, "maximum": 2147483647}


def _run_policy_spec() -> dict[str, Any]:
    strip_or_deny = ["Strip", "Deny"]
    return _object(
        "What runguard enforces on platform runs.",
        {
            "selector": {
                **_ref("labelSelector"),
                "description": (
                    "Which Pods are platform runs (a LabelSelector); the webhook "
                    "configurations' objectSelector is rendered from it."
                ),
            },
            "excludeNamespaces": _array(
                "Namespaces whose Pods are never touched.", _ref("dnsLabel"), uniqueItems=True
            ),
            "enforcement": _enum(
                ["Deny", "Warn", "Audit"],
                "What a violation does: Deny rejects, Warn admits with warnings, Audit only "
                "records it.",
                "Deny",
            ),
            "profiles": _object(
                "How a run names its hardware profile.",
                {
                    "label": {
                        **_ref("labelKey"),
                        "description": "Label (else annotation) naming the profile.",
                        "default": "runguard.io/profile",
                    },
                    "default": _string("Profile for a run that names none; omit for none."),
                    "unknown": _enum(
                        ["Deny", "Default"],
                        "A run naming an unknown profile: Deny it, or use the default.",
                        "Deny",
                    ),
                },
            ),
            "resources": _object(
                "Resource defaults and limits, per container.",
                {
                    "gpuResourceName": {
                        "type": "string",
                        "format": "resource-name",
                        "description": "What `gpu` means in profiles and maximums.",
                        "default": "nvidia.com/gpu",
                    },
                    "defaults": {
                        **_ref("resourceRequirements"),
                        "description": "Per container, only where the key is absent.",
                    },
                    "memoryLimitFactor": {
                        "type": "number",
                        "minimum": 1,
                        "description": "No memory limit: limit = ceil(request x factor).",
                    },
                    "maximums": {
                        **_ref("resourceList"),
                        "description": "Highest request or limit allowed, per container.",
                    },
                    "onExceed": _enum(
                        ["Clamp", "Deny"], "Above a maximum: clamp to it, or deny.", "Clamp"
                    ),
                },
            ),
            "security": _object(
                "No root, no privilege.",
                {
                    "onRoot": _enum(strip_or_deny, "Root: replace it, or deny.", "Strip"),
                    "runAsUser": {**_ID, "description": "Replaces uid 0; absent: field removed."},
                    "runAsGroup": {**_ID, "description": "Replaces gid 0; absent: field removed."},
                    "fsGroup": {**_ID, "description": "Replaces fsGroup 0; absent: removed."},
                    "seccompProfile": _enum(
                        ["RuntimeDefault", "Unconfined", None],
                        "Seccomp profile type set on the pod; null: left alone.",
                        "RuntimeDefault",
                    ),
                    "dropCapabilities": _array(
                        "Capabilities dropped from every container.",
                        {"type": "string", "minLength": 1},
                        uniqueItems=True,
                        default=["ALL"],
                    ),
                    "allowedCapabilities": _array(
                        "Capabilities a container may add; others are stripped or denied.",
                        {"type": "string", "minLength": 1},
                        uniqueItems=True,
                    ),
                },
            ),
            "volumes": _object(
                "Volume types and pre-existing volumes.",
                {
                    "allowedTypes": _array(
                        "Volume types a run may use; others are denied.",
                        {"enum": _VOLUME_TYPES},
                        uniqueItems=True,
                    ),
                    "platformClaims": {
                        **_ref("namePatterns"),
                        "description": "claimName patterns of the PVCs the platform creates.",
                    },
                    "platformConfigMaps": {
                        **_ref("namePatterns"),
                        "description": "ConfigMap name patterns the platform creates.",
                    },
                    "onPreExisting": _enum(
                        strip_or_deny,
                        "A PVC/ConfigMap outside the patterns: drop it and its mounts, or deny.",
                        "Strip",
                    ),
                },
            ),
            "secrets": _object(
                "Only platform-managed secrets.",
                {
                    "allowed": {
                        **_ref("namePatterns"),
                        "description": "Secret name patterns (env, envFrom, volumes, projected).",
                    },
                    "onForbidden": _enum(
                        strip_or_deny, "Another secret: remove the reference, or deny.", "Strip"
                    ),
                },
            ),
            "scheduling": _object(
                "Priority classes and spot-node preemption.",
                {
                    "priorityClasses": _object(
                        "Allowed priority classes.",
                        {
                            "default": {
                                **_ref("dnsSubdomain"),
                                "description": "Set when a run has none or a disallowed one.",
                            },
                            "allowed": _array(
                                "Allowed classes; absent: any.",
                                _ref("dnsSubdomain"),
                                uniqueItems=True,
                            ),
                        },
                    ),
                    "preemption": _object(
                        "MLRun's preemption modes, on spot/preemptible nodes.",
                        {
                            "annotation": {
                                **_ref("labelKey"),
                                "description": "Annotation holding a run's mode.",
                                "default": "runguard.io/preemption-mode",
                            },
                            "default": _enum(
                                ["allow", "constrain", "prevent", "none"],
                                "Mode of a run that names none.",
                            ),
                            "nodeSelector": {
                                **_ref("labelMap"),
                                "description": "Node labels of spot nodes.",
                            },
                            "tolerations": {
                                **_ref("tolerations"),
                                "description": "Tolerations for the spot nodes' taints.",
                            },
                        },
                    ),
                },
            ),
        },
        ["selector"],
    )


def _profile_spec() -> dict[str, Any]:
    return _object(
        "A hardware profile: its values win over the run's, key by key.",
        {
            "description": _string("Shown to users choosing a profile."),
            "resources": {
                **_ref("resourceRequirements"),
                "description": "Requests and limits of the main container.",
            },
            "nodeSelector": {**_ref("labelMap"), "description": "Node labels, per key."},
            "tolerations": {
                **_ref("tolerations"),
                "description": "Added; replaces a run's toleration with the same key and effect.",
            },
            "affinity": {**_ref("affinity"), "description": "Replaces the run's affinity."},
            "priorityClassName": {
                **_ref("dnsSubdomain"),
                "description": "Replaces the run's priority class.",
            },
            "runtimeClassName": {
                **_ref("dnsSubdomain"),
                "description": "Replaces the run's runtime class.",
            },
            "env": _array("Environment of the main container, per name.", _ref("envVar")),
        },
    )


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of one policy document (a RunPolicy or a Profile)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "runguard policy document",
        "description": "A RunPolicy (exactly one per policy directory) or a Profile.",
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION, "description": "Always runguard.io/v1."},
            "kind": _enum(list(KINDS), "RunPolicy or Profile."),
            "metadata": {**_ref("metadata"), "description": "The document's name."},
            "spec": {"type": "object", "description": "Depends on kind."},
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "allOf": [
            {
                "if": {"properties": {"kind": {"const": "RunPolicy"}}, "required": ["kind"]},
                "then": {"properties": {"spec": _ref("runPolicySpec")}},
            },
            {
                "if": {"properties": {"kind": {"const": "Profile"}}, "required": ["kind"]},
                "then": {
                    "properties": {
                        "metadata": {
                            "properties": {
                                "name": {
                                    **_ref("labelValue"),
                                    "minLength": 1,
                                    "description": "The profile's name, as runs name it in "
                                    "the profile label.",
                                }
                            }
                        },
                        "spec": _ref("profileSpec"),
                    }
                },
            },
        ],
        "$defs": _defs(),
    }


def validator() -> Draft202012Validator:
    """A validator for one policy document, with runguard's formats checked."""
    return Draft202012Validator(policy_schema(), format_checker=format_checker())
