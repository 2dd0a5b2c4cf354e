"""The Policy model: a RunPolicy and its Profiles, as the engine reads them.

Built from documents that already passed the JSON Schema (see ``schema.py``), so the
builders here trust shapes and only derive what the engine needs precomputed:
parsed maximums, compiled name patterns, the gpu resource name resolved.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

from webhook.quantity import parse

Enforcement = Literal["Deny", "Warn", "Audit"]
StripOrDeny = Literal["Strip", "Deny"]
PREEMPTION_MODES = ("allow", "constrain", "prevent", "none")

_PLACEHOLDER = re.compile(r"\{labels\[([^\]]+)\]\}")


@dataclass(frozen=True)
class NamePattern:
    """A name pattern: ``*`` matches any run of characters, ``{labels[KEY]}`` the pod's label."""

    text: str
    label_keys: tuple[str, ...]
    _parts: tuple[tuple[str, str], ...]  # ("lit", text) | ("star", "") | ("label", key)

    @classmethod
    def compile(cls, text: str) -> NamePattern:
        parts: list[tuple[str, str]] = []
        keys: list[str] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            parts.extend(_literal_parts(text[pos : m.start()]))
            parts.append(("label", m.group(1)))
            keys.append(m.group(1))
            pos = m.end()
        parts.extend(_literal_parts(text[pos:]))
        return cls(text, tuple(keys), tuple(parts))

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when ``name`` matches; a pod lacking a label the pattern uses matches nothing."""
        values = []
        for key in self.label_keys:
            value = labels.get(key)
            if not isinstance(value, str) or value == "":
                return False
            values.append(value)
        return _compiled(self.text, tuple(values)).fullmatch(name) is not None


@lru_cache(maxsize=4096)
def _compiled(text: str, label_values: tuple[str, ...]) -> re.Pattern[str]:
    """The regex of pattern ``text`` for given label values (one per placeholder, in order).

    Keyed by the text (a string hashes once) rather than the parsed parts."""
    values = iter(label_values)
    regex = []
    for kind, part in NamePattern.compile(text)._parts:
        if kind == "lit":
            regex.append(re.escape(part))
        elif kind == "star":
            regex.append(".*")
        else:
            regex.append(re.escape(next(values)))
    return re.compile("".join(regex), re.DOTALL)


def _literal_parts(text: str) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for i, chunk in enumerate(text.split("*")):
        if i:
            parts.append(("star", ""))
        if chunk:
            parts.append(("lit", chunk))
    return parts


def matches_any(patterns: tuple[NamePattern, ...], name: str, labels: Mapping[str, str]) -> bool:
    return any(p.matches(name, labels) for p in patterns)


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions)."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Mapping[str, Any], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for expr in self.match_expressions:
            key, op = expr["key"], expr["operator"]
            values = expr.get("values") or []
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [dict(e) for e in self.match_expressions]
        return out


@dataclass(frozen=True)
class ProfilesConfig:
    label: str = "runguard.io/profile"
    default: str | None = None
    unknown: Literal["Deny", "Default"] = "Deny"


@dataclass(frozen=True)
class ResourcesConfig:
    gpu_resource_name: str = "nvidia.com/gpu"
    default_requests: Mapping[str, str] = field(default_factory=dict)
    default_limits: Mapping[str, str] = field(default_factory=dict)
    memory_limit_factor: Decimal | None = None
    maximums: Mapping[str, str] = field(default_factory=dict)  # resource name -> text
    maximum_values: Mapping[str, Decimal] = field(default_factory=dict)
    on_exceed: StripOrDeny | Literal["Clamp"] = "Clamp"


@dataclass(frozen=True)
class SecurityConfig:
    on_root: StripOrDeny = "Strip"
    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None
    seccomp_profile: str | None = "RuntimeDefault"
    drop_capabilities: tuple[str, ...] = ("ALL",)
    allowed_capabilities: frozenset[str] = frozenset()


DEFAULT_ALLOWED_VOLUME_TYPES = frozenset(
    {
        "persistentVolumeClaim",
        "emptyDir",
        "ephemeral",
        "configMap",
        "secret",
        "downwardAPI",
        "projected",
    }
)


@dataclass(frozen=True)
class VolumesConfig:
    allowed_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES
    platform_claims: tuple[NamePattern, ...] = ()
    platform_config_maps: tuple[NamePattern, ...] = ()
    on_pre_existing: StripOrDeny = "Strip"


@dataclass(frozen=True)
class SecretsConfig:
    allowed: tuple[NamePattern, ...] = ()
    on_forbidden: StripOrDeny = "Strip"


@dataclass(frozen=True)
class PreemptionConfig:
    annotation: str = "runguard.io/preemption-mode"
    default: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class SchedulingConfig:
    default_priority_class: str | None = None
    allowed_priority_classes: frozenset[str] | None = None  # None: any
    preemption: PreemptionConfig | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    requests: Mapping[str, str] = field(default_factory=dict)  # gpu already resolved
    limits: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    env: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Policy:
    name: str
    selector: LabelSelector
    exclude_namespaces: frozenset[str] = frozenset()
    enforcement: Enforcement = "Deny"
    profiles_config: ProfilesConfig = field(default_factory=ProfilesConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    volumes: VolumesConfig = field(default_factory=VolumesConfig)
    secrets: SecretsConfig = field(default_factory=SecretsConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    digest: str = ""  # sha256 of the source documents, for /readyz and the audit log


def resolve_resource_name(name: str, gpu_resource_name: str) -> str:
    """Policy files say ``gpu`` for the cluster's gpu resource (``nvidia.com/gpu``)."""
    return gpu_resource_name if name == "gpu" else name


def _resources_map(raw: Mapping[str, Any] | None, gpu: str) -> dict[str, str]:
    return {resolve_resource_name(k, gpu): str(v) for k, v in (raw or {}).items()}


def build_policy(run_policy: Mapping[str, Any], profiles: list[Mapping[str, Any]]) -> Policy:
    """Build a Policy from schema-valid ``RunPolicy`` and ``Profile`` documents."""
    spec = run_policy.get("spec") or {}
    sel = spec.get("selector") or {}
    prof = spec.get("profiles") or {}
    res = spec.get("resources") or {}
    sec = spec.get("security") or {}
    vol = spec.get("volumes") or {}
    secrets = spec.get("secrets") or {}
    sched = spec.get("scheduling") or {}
    gpu = res.get("gpuResourceName", "nvidia.com/gpu")

    maximums = _resources_map(res.get("maximums"), gpu)
    factor = res.get("memoryLimitFactor")
    defaults = res.get("defaults") or {}
    pc = sched.get("priorityClasses") or {}
    pre = sched.get("preemption")

    profile_objs = {}
    for doc in profiles:
        pspec = doc.get("spec") or {}
        presources = pspec.get("resources") or {}
        name = doc["metadata"]["name"]
        profile_objs[name] = Profile(
            name=name,
            description=pspec.get("description", ""),
            requests=_resources_map(presources.get("requests"), gpu),
            limits=_resources_map(presources.get("limits"), gpu),
            node_selector=dict(pspec.get("nodeSelector") or {}),
            tolerations=tuple(pspec.get("tolerations") or ()),
            affinity=pspec.get("affinity") or None,
            priority_class_name=pspec.get("priorityClassName"),
            runtime_class_name=pspec.get("runtimeClassName"),
            env=tuple(pspec.get("env") or ()),
        )

    digest = hashlib.sha256(
        json.dumps([run_policy, profiles], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]

    return Policy(
        name=(run_policy.get("metadata") or {}).get("name", "runguard"),
        selector=LabelSelector(
            match_labels=dict(sel.get("matchLabels") or {}),
            match_expressions=tuple(sel.get("matchExpressions") or ()),
        ),
        exclude_namespaces=frozenset(spec.get("excludeNamespaces") or ()),
        enforcement=spec.get("enforcement", "Deny"),
        profiles_config=ProfilesConfig(
            label=prof.get("label", "runguard.io/profile"),
            default=prof.get("default"),
            unknown=prof.get("unknown", "Deny"),
        ),
        resources=ResourcesConfig(
            gpu_resource_name=gpu,
            default_requests=_resources_map(defaults.get("requests"), gpu),
            default_limits=_resources_map(defaults.get("limits"), gpu),
            memory_limit_factor=None if factor is None else Decimal(str(factor)),
            maximums=maximums,
            maximum_values={k: parse(v) for k, v in maximums.items()},
            on_exceed=res.get("onExceed", "Clamp"),
        ),
        security=SecurityConfig(
            on_root=sec.get("onRoot", "Strip"),
            run_as_user=sec.get("runAsUser"),
            run_as_group=sec.get("runAsGroup"),
            fs_group=sec.get("fsGroup"),
            seccomp_profile=sec.get("seccompProfile", "RuntimeDefault"),
            drop_capabilities=tuple(sec.get("dropCapabilities", ["ALL"])),
            allowed_capabilities=frozenset(sec.get("allowedCapabilities") or ()),
        ),
        volumes=VolumesConfig(
            allowed_types=frozenset(vol.get("allowedTypes", DEFAULT_ALLOWED_VOLUME_TYPES)),
            platform_claims=tuple(NamePattern.compile(p) for p in vol.get("platformClaims", [])),
            platform_config_maps=tuple(
                NamePattern.compile(p) for p in vol.get("platformConfigMaps", [])
            ),
            on_pre_existing=vol.get("onPreExisting", "Strip"),
        ),
        secrets=SecretsConfig(
            allowed=tuple(NamePattern.compile(p) for p in secrets.get("allowed", [])),
            on_forbidden=secrets.get("onForbidden", "Strip"),
        ),
        scheduling=SchedulingConfig(
            default_priority_class=pc.get("default"),
            allowed_priority_classes=(
                frozenset(pc["allowed"]) if pc.get("allowed") is not None else None
            ),
            preemption=None
            if pre is None
            else PreemptionConfig(
                annotation=pre.get("annotation", "runguard.io/preemption-mode"),
                default=pre.get("default"),
                node_selector=dict(pre.get("nodeSelector") or {}),
                tolerations=tuple(pre.get("tolerations") or ()),
            ),
        ),
        profiles=profile_objs,
        digest=digest,
    )
