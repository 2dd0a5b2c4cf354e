"""``lint``: the loader's errors plus warnings about policies that load but misbehave.

A warning is a policy that is valid but very likely not what the admin meant: a name
pattern using a label the selector does not guarantee (runs without it can never use
their own volumes), a profile whose requests exceed its limits, a profile priority
class that the scheduling step would replace, and so on.

The rules read documents as written (for lines), at paths taken from the model: a rule
names the attributes of the key it is about (``_run("security", "seccomp_profile")``),
and the rule about name patterns applies to every key the model types as one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Protocol

from webhook.policy.consistency import gpu_resource_name, resource_bounds, resource_values
from webhook.policy.declare import iter_keys
from webhook.policy.errors import PolicyIssue
from webhook.policy.formats import NAME_PATTERN
from webhook.policy.lint_devices import device_and_run_time_warnings
from webhook.policy.loader import read_policy
from webhook.policy.model import Policy, RunPolicySpec, profile_path, run_policy_path
from webhook.policy.patterns import label_keys
from webhook.policy.platforms import (
    PlatformAt,
    by_name,
    platform_of,
    platform_warnings,
    written_platforms,
)
from webhook.policy.source import PolicySource, SourceDocument

__all__ = ["LintReport", "lint"]

Path_ = tuple[str | int, ...]
_run, _profile = run_policy_path, profile_path

# Every list of name patterns in a RunPolicy, wherever the model declares one.
_PATTERN_LISTS = tuple(
    ("spec", *key.path) for key in iter_keys(RunPolicySpec) if key.uses(NAME_PATTERN)
)
_SELECTOR = _run("selector")
_PROFILES = _run("profiles_config")
_MAXIMUMS = _run("resources", "maximums")
_DEVICE_CLASSES = _run("resources", "device_classes")
_FAMILIES = _run("resources", "families")
_DEFAULT_REQUESTS = _run("resources", "defaults", "requests")
_DEFAULT_LIMITS = _run("resources", "defaults", "limits")
_SECCOMP = _run("security", "seccomp_profile")
_ALLOWED_TYPES = _run("volumes", "allowed_types")
_HOST_PATHS = _run("volumes", "allowed_host_paths")
# Node directories a run must never reach: the node's own system and the kubelet's and
# the container runtime's state (a hostPath at, above or below one of them).
_NODE_SYSTEM = ("/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/var/lib/kubelet",
                "/var/lib/containerd", "/run/containerd", "/var/run/containerd",
                "/var/run/docker.sock", "/var/lib/docker", "/var/log")  # fmt: skip
_PREEMPTION = _run("scheduling", "preemption")
_ALLOWED_CLASSES = _run("scheduling", "priority_classes", "allowed")
_REQUESTS = _profile("resources", "requests")
_NAMESPACE_SELECTOR = _profile("namespace_selector")
_LIMITS = _profile("resources", "limits")
_ENV = _profile("env")
_PRIORITY_CLASS = _profile("priority_class_name")


@dataclass
class LintReport:
    """What ``runguard lint`` found: ``errors`` stop the policy loading, ``warnings`` do not."""

    directory: str
    errors: list[PolicyIssue] = field(default_factory=list)
    warnings: list[PolicyIssue] = field(default_factory=list)
    policy: Policy | None = None
    run_policies: int = 0
    profiles: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def lines(self) -> list[str]:
        """Errors, then warnings: ``file:line: key: message`` / ``file:line: warning: ...``."""
        return [str(e) for e in self.errors] + [format_warning(w) for w in self.warnings]

    def summary(self) -> str:
        def count(n: int, word: str) -> str:
            return f"{n} {word}" + ("" if n == 1 else "s")

        found = count(self.run_policies, "RunPolicy").replace("RunPolicys", "RunPolicies")
        return (
            f"{self.directory}: {found}, {count(self.profiles, 'profile')}: "
            f"{count(len(self.errors), 'error')}, {count(len(self.warnings), 'warning')}"
        )


def format_warning(issue: PolicyIssue) -> str:
    where = issue.file if issue.line is None else f"{issue.file}:{issue.line}"
    key = f"{issue.key}: " if issue.key else ""
    return f"{where}: warning: {key}{issue.message}"


class ClusterClasses(Protocol):
    """What ``lint --cluster`` asks of a cluster view (``webhook.clusterstate``)."""

    def has_priority_class(self, name: str) -> bool: ...
    def has_runtime_class(self, name: str) -> bool: ...


def lint(directory: str | Path, cluster: ClusterClasses | None = None) -> LintReport:
    """Check a policy directory; never raises for anything in the files. With
    ``cluster``, a class a RunPolicy or profile names that the cluster lacks is an error:
    the apiserver would refuse every run runguard gave it."""
    source = read_policy(directory)
    if cluster is not None:
        source.errors.extend(_missing_classes(source, cluster))
    warnings = sorted(_warnings(source), key=lambda i: (i.file, i.line or 0))
    return LintReport(
        directory=source.directory,
        errors=source.errors,
        warnings=list(dict.fromkeys(warnings)),
        policy=source.policy,
        run_policies=len(source.run_policies),
        profiles=len(source.profiles),
    )


def _missing_classes(source: PolicySource, cluster: ClusterClasses) -> list[PolicyIssue]:
    named: list[tuple[SourceDocument, tuple[str, ...], str, str]] = []
    for doc in source.run_policies:
        path = _run("scheduling", "priority_classes", "default")
        named.append((doc, path, "PriorityClass", doc.get(*path)))
    for doc in source.profiles:
        for attr, kind in (
            ("priority_class_name", "PriorityClass"),
            ("runtime_class_name", "RuntimeClass"),
        ):
            path = _profile(attr)
            named.append((doc, path, kind, doc.get(*path)))
    issues = []
    for doc, path, kind, name in named:
        if not isinstance(name, str):
            continue
        has = cluster.has_priority_class if kind == "PriorityClass" else cluster.has_runtime_class
        if not has(name):
            issues.append(
                doc.issue(path, f"the cluster has no {kind} {name!r}: runguard will not set it")
            )
    return issues


def _warnings(source: PolicySource) -> Iterator[PolicyIssue]:
    run_policy = source.run_policy
    gpu = gpu_resource_name(source)
    platforms = by_name(source)
    for doc in source.run_policies:
        yield from _run_policy_warnings(doc, gpu, platform_of(doc, platforms))
    for written in written_platforms(source):
        yield from _operator_warnings(written)
    yield from platform_warnings(source)
    yield from device_and_run_time_warnings(source, gpu)
    for profile in source.profiles:
        yield from _profile_warnings(profile, run_policy, gpu)
        yield from _range_warnings(profile, gpu)
        if profile.get(*_NAMESPACE_SELECTOR) is not None:
            for doc in source.run_policies:
                if doc.get(*_PROFILES, "default") == profile.name:
                    yield profile.issue(
                        _NAMESPACE_SELECTOR,
                        f"the default profile of RunPolicy {doc.name} is kept to some "
                        "namespaces: elsewhere a run naming no profile is denied",
                    )
    installation = {doc.name for doc in source.profiles}
    for profile in source.project_profiles:
        yield from _profile_warnings(profile, run_policy, gpu)
        yield from _range_warnings(profile, gpu)
        if profile.name in installation:
            yield profile.issue(
                ("metadata", "name"),
                f"also the name of an installation-wide profile: in namespace "
                f"{profile.get('metadata', 'namespace')} this one wins",
            )


def _range_warnings(doc: SourceDocument, gpu: str) -> Iterator[PolicyIssue]:
    """A range whose request may go above the most its limit allows."""
    requests = resource_bounds(doc, _REQUESTS, gpu)
    limits = resource_bounds(doc, _LIMITS, gpu)
    for name, entries in requests.items():
        if name not in limits or (len(entries) == 1 and len(limits[name]) == 1):
            continue  # not a range: _profile_warnings judges exact values
        at, most = max(entries, key=lambda e: e[1])
        limit_at, limit = max(limits[name], key=lambda e: e[1])
        if most > limit:
            yield doc.issue(
                (*_REQUESTS, *at),
                f"request up to {_text(doc, (*_REQUESTS, *at))} is above the most the limit "
                f"allows, {_text(doc, (*_LIMITS, *limit_at))}: runs asking for more get the limit",
            )


def guaranteed_labels(selector: Any) -> set[str]:
    """Label keys every Pod matching ``selector`` carries (matchLabels, Exists, In)."""
    if not isinstance(selector, dict):
        return set()
    match_labels = selector.get("matchLabels")
    keys = set(match_labels) if isinstance(match_labels, dict) else set()
    for expr in selector.get("matchExpressions") or []:
        if isinstance(expr, dict) and expr.get("operator") in ("Exists", "In"):
            keys.add(str(expr.get("key")))
    return keys


def _run_policy_warnings(
    doc: SourceDocument, gpu: str, platform: PlatformAt | None
) -> Iterator[PolicyIssue]:
    """A RunPolicy's warnings, concern by concern, in the order lint prints them."""
    yield from _selector_warnings(doc)
    yield from _pattern_warnings(doc)
    yield from _identity_warnings(doc, platform)
    yield from _unknown_profile_warnings(doc)
    yield from _default_resource_warnings(doc, gpu)
    yield from _security_warnings(doc)
    yield from _node_path_warnings(doc)
    yield from _device_class_warnings(doc, gpu, set(resource_values(doc, _MAXIMUMS, gpu)))
    yield from _preemption_warnings(doc)


def _selector_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    selector = doc.get(*_SELECTOR)
    if (
        isinstance(selector, dict)
        and not selector.get("matchLabels")
        and not selector.get("matchExpressions")
    ):
        yield doc.issue(
            _SELECTOR,
            "an empty selector makes every Pod outside excludeNamespaces a platform run",
        )


def _pattern_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    """A name pattern matching everything, or using a label the selector does not require."""
    labels = guaranteed_labels(doc.get(*_SELECTOR))
    for list_path in _PATTERN_LISTS:
        patterns = doc.get(*list_path)
        for i, pattern in enumerate(patterns if isinstance(patterns, list) else []):
            if not isinstance(pattern, str):
                continue
            if pattern.strip("*") == "":
                yield doc.issue(
                    (*list_path, i), f'pattern "{pattern}" matches every name: the rule is off'
                )
            for key in label_keys(pattern):
                if key not in labels:
                    yield doc.issue(
                        (*list_path, i),
                        f'pattern uses label "{key}", which the selector does not require; a '
                        "run without it matches no pattern (add a matchExpressions "
                        f"{{key: {key}, operator: Exists}})",
                    )


def _identity_warnings(doc: SourceDocument, platform: PlatformAt | None) -> Iterator[PolicyIssue]:
    identities = platform.get("identities") if platform else None
    named = [doc.get(*path) for path in _PATTERN_LISTS]
    if not identities and any(isinstance(p, list) and p for p in named):
        yield doc.issue(
            ("spec",),
            "no platform.identities: platform names alone decide what a run may use, and "
            "names and labels are written by whoever writes the manifest (a Pod labelled "
            "with another run's id gets that run's volumes and secrets); list the "
            "platform's user",
        )


def _unknown_profile_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    profiles = doc.get(*_PROFILES)
    if (
        isinstance(profiles, dict)
        and profiles.get("unknown") == "Default"
        and not profiles.get("default")
    ):
        yield doc.issue(
            (*_PROFILES, "unknown"),
            "unknown: Default without profiles.default: an unknown profile means no profile",
        )


def _default_resource_warnings(doc: SourceDocument, gpu: str) -> Iterator[PolicyIssue]:
    """Defaults above the maximums, a default GPU, a default request above its limit."""
    maximums = resource_values(doc, _MAXIMUMS, gpu)
    requests = resource_values(doc, _DEFAULT_REQUESTS, gpu)
    limits = resource_values(doc, _DEFAULT_LIMITS, gpu)
    for path, values in ((_DEFAULT_REQUESTS, requests), (_DEFAULT_LIMITS, limits)):
        for name, (key, value) in values.items():
            if name in maximums and value > maximums[name][1]:
                yield doc.issue(
                    (*path, key),
                    f"default is above the maximum {maximums[name][0]}: "
                    f"{_text(doc, (*_MAXIMUMS, maximums[name][0]))}; "
                    "every run would be clamped or denied",
                )
            if name == gpu and value > 0:
                yield doc.issue((*path, key), "a default gpu gives every container a GPU")
    for name, (key, value) in requests.items():
        if name in limits and value > limits[name][1]:
            limit_path = (*_DEFAULT_LIMITS, limits[name][0])
            yield doc.issue(
                (*_DEFAULT_REQUESTS, key),
                f"default request is above the default limit {_text(doc, limit_path)}",
            )


def _security_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    if doc.get(*_SECCOMP) == "Unconfined":
        yield doc.issue(_SECCOMP, "Unconfined turns seccomp off for every run")
    allowed_types = doc.get(*_ALLOWED_TYPES)
    if isinstance(allowed_types, list) and "hostPath" in allowed_types:
        index = allowed_types.index("hostPath")
        yield doc.issue(
            (*_ALLOWED_TYPES, index),
            "hostPath lets a run read and write the node's filesystem",
        )


def _preemption_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    preemption = doc.get(*_PREEMPTION)
    if (
        isinstance(preemption, dict)
        and not preemption.get("nodeSelector")
        and not preemption.get("tolerations")
    ):
        yield doc.issue(
            _PREEMPTION,
            "no nodeSelector or tolerations for spot nodes: preemption modes change nothing",
        )


def _node_path_warnings(doc: SourceDocument) -> Iterator[PolicyIssue]:
    """An allowed host path that is, holds or lies in the node's system directories."""
    paths = doc.get(*_HOST_PATHS)
    for i, path in enumerate(paths if isinstance(paths, list) else []):
        if not isinstance(path, str):
            continue
        hit = next((d for d in _NODE_SYSTEM if _within(path, d) or _within(d, path)), None)
        if hit is not None:
            yield doc.issue(
                (*_HOST_PATHS, i),
                f"{path} reaches the node's own {hit}: a run mounting it can read or change "
                "the node",
            )


def _device_class_warnings(
    doc: SourceDocument, gpu: str, maximums: set[str]
) -> Iterator[PolicyIssue]:
    """A device class whose devices count as a resource with no maximum and in no family:
    a run may then ask for any number of them."""
    classes = doc.get(*_DEVICE_CLASSES)
    families = doc.get(*_FAMILIES)
    members = [
        key
        for family in (families if isinstance(families, list) else [])
        if isinstance(family, dict) and isinstance(family.get("members"), dict)
        for key in family["members"]
    ]
    for name, config in (classes if isinstance(classes, dict) else {}).items():
        counts_as = config.get("countsAs") if isinstance(config, dict) else None
        if not isinstance(counts_as, str):
            continue
        resource = gpu if counts_as == "gpu" else counts_as.replace("{value}", "*")
        if resource in maximums or any(
            fnmatchcase(resource, key) or fnmatchcase(key, resource) for key in members
        ):
            continue
        yield doc.issue(
            (*_DEVICE_CLASSES, name, "countsAs"),
            f"{counts_as} has no maximum and is in no device family: a run may ask for any "
            f"number of {name} devices",
        )


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _operator_warnings(platform: PlatformAt) -> Iterator[PolicyIssue]:
    """An operator's ConfigMap pattern that matches every name."""
    operators = platform.get("operators")
    for i, operator in enumerate(operators if isinstance(operators, list) else []):
        patterns = operator.get("configMaps") if isinstance(operator, dict) else None
        for j, pattern in enumerate(patterns if isinstance(patterns, list) else []):
            if isinstance(pattern, str) and pattern.strip("*") == "":
                yield platform.doc.issue(
                    (*platform.path("operators"), i, "configMaps", j),
                    f'pattern "{pattern}" matches every name: the operator\'s Pods could '
                    "mount any ConfigMap",
                )


def _profile_warnings(
    doc: SourceDocument, run_policy: SourceDocument | None, gpu: str
) -> Iterator[PolicyIssue]:
    requests = resource_values(doc, _REQUESTS, gpu)
    limits = resource_values(doc, _LIMITS, gpu)
    for name, (key, value) in requests.items():
        if name not in limits:
            continue
        limit_key, limit = limits[name]
        path = (*_REQUESTS, key)
        if name == gpu and value != limit:
            yield doc.issue(
                path,
                f"gpu request {_text(doc, path)} differs from the gpu limit "
                f"{_text(doc, (*_LIMITS, limit_key))}; runs get the limit",
            )
        elif value > limit:
            yield doc.issue(
                path,
                f"request {_text(doc, path)} is above the limit "
                f"{_text(doc, (*_LIMITS, limit_key))}",
            )

    env = doc.get(*_ENV)
    seen: set[str] = set()
    for i, var in enumerate(env if isinstance(env, list) else []):
        var_name = var.get("name") if isinstance(var, dict) else None
        if isinstance(var_name, str):
            if var_name in seen:
                yield doc.issue((*_ENV, i, "name"), f'env "{var_name}" is set twice')
            seen.add(var_name)

    if run_policy is None:
        return
    priority_class = doc.get(*_PRIORITY_CLASS)
    allowed = run_policy.get(*_ALLOWED_CLASSES)
    if isinstance(priority_class, str) and isinstance(allowed, list):
        if priority_class not in allowed:
            yield doc.issue(
                _PRIORITY_CLASS,
                f'priority class "{priority_class}" is not allowed by the RunPolicy '
                f"({', '.join(map(str, allowed))}); the scheduling step replaces it",
            )


def _text(doc: SourceDocument, path: Path_) -> str:
    return str(doc.get(*path))
