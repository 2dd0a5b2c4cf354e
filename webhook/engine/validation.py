"""The rules of SPEC section 3: every violation of a (shape-checked) pod spec."""

from __future__ import annotations

from collections.abc import Callable

from webhook.engine.mutation import (
    Pod,
    _env_secret,
    preemption_mode,
    preexisting_reference,
    profile_name,
    secret_allowed,
)
from webhook.engine.podspec import ALL_CONTAINER_LISTS, iter_containers
from webhook.engine.types import JSON, Violation
from webhook.policy.model import PREEMPTION_MODES
from webhook.quantity import parse

# Keys of a Volume that name its type (everything but ``name``).
_NOT_TYPES = frozenset({"name"})


def _meta_path(base: str) -> str:
    """The pod metadata path next to a pod spec path (``spec.template.spec`` -> ``...metadata``)."""
    return base[: -len("spec")] + "metadata"


def check_profile(pod: Pod, base: str) -> list[Violation]:
    cfg = pod.policy.profiles_config
    name = profile_name(pod.labels, pod.annotations, pod.policy)
    if name is None or name in pod.policy.profiles or cfg.unknown == "Default":
        return []
    known = ", ".join(sorted(pod.policy.profiles)) or "none"
    return [
        Violation(
            "profile.unknown",
            f"{_meta_path(base)}.labels[{cfg.label}]",
            f"profile {name!r} does not exist (known: {known})",
        )
    ]


def check_resources(pod: Pod, base: str) -> list[Violation]:
    cfg = pod.policy.resources
    gpu = cfg.gpu_resource_name
    out: list[Violation] = []
    for list_name, i, container in iter_containers(pod.spec):
        res = container.get("resources") or {}
        requests = res.get("requests") or {}
        limits = res.get("limits") or {}
        path = f"{base}.{list_name}[{i}].resources"
        for part, values in (("requests", requests), ("limits", limits)):
            for resource, value in values.items():
                maximum = cfg.maximum_values.get(resource)
                if maximum is not None and parse(value) > maximum:
                    out.append(
                        Violation(
                            "resources.exceeded",
                            f"{path}.{part}.{resource}",
                            f"{value} is above the maximum {cfg.maximums[resource]}",
                        )
                    )
        if (gpu in requests or gpu in limits) and (
            gpu not in requests or gpu not in limits or parse(requests[gpu]) != parse(limits[gpu])
        ):
            out.append(
                Violation(
                    "resources.gpu-mismatch",
                    f"{path}.requests.{gpu}",
                    f"gpu request {requests.get(gpu, 'unset')} must equal gpu limit "
                    f"{limits.get(gpu, 'unset')}",
                )
            )
    return out


def check_security(pod: Pod, base: str) -> list[Violation]:
    allowed_caps = pod.policy.security.allowed_capabilities
    out: list[Violation] = []
    psc = pod.spec.get("securityContext") or {}
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if psc.get(key) == 0:
            out.append(
                Violation("security.root", f"{base}.securityContext.{key}", f"{key} 0 is root")
            )
    if psc.get("runAsNonRoot") is False:
        out.append(
            Violation("security.root", f"{base}.securityContext.runAsNonRoot", "must not be false")
        )
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.spec.get(key) is True:
            out.append(
                Violation("security.host-namespace", f"{base}.{key}", f"{key} is not allowed")
            )
    for list_name, i, container in iter_containers(pod.spec, ALL_CONTAINER_LISTS):
        sc = container.get("securityContext") or {}
        path = f"{base}.{list_name}[{i}].securityContext"
        for key in ("runAsUser", "runAsGroup"):
            if sc.get(key) == 0:
                out.append(Violation("security.root", f"{path}.{key}", f"{key} 0 is root"))
        if sc.get("runAsNonRoot") is False:
            out.append(Violation("security.root", f"{path}.runAsNonRoot", "must not be false"))
        for key in ("privileged", "allowPrivilegeEscalation"):
            if sc.get(key) is True:
                out.append(
                    Violation("security.privileged", f"{path}.{key}", f"{key} is not allowed")
                )
        added = [
            c for c in (sc.get("capabilities") or {}).get("add") or () if c not in allowed_caps
        ]
        if added:
            out.append(
                Violation(
                    "security.capabilities",
                    f"{path}.capabilities.add",
                    f"capabilities {', '.join(added)} are not allowed",
                )
            )
    return out


def check_volumes(pod: Pod, base: str) -> list[Violation]:
    cfg = pod.policy.volumes
    out: list[Violation] = []
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        path = f"{base}.volumes[{i}]"
        types = [k for k in volume if k not in _NOT_TYPES]
        forbidden = [t for t in types if t not in cfg.allowed_types]
        if forbidden:
            out.append(
                Violation(
                    "volumes.forbidden-type",
                    path,
                    f"volume {volume['name']!r} of type {forbidden[0]} is not allowed",
                )
            )
        reference = preexisting_reference(volume, pod.policy, pod.labels)
        if reference is not None:
            out.append(
                Violation(
                    "volumes.pre-existing",
                    path,
                    f"volume {volume['name']!r} uses pre-existing {reference}",
                )
            )
    return out


def check_secrets(pod: Pod, base: str) -> list[Violation]:
    out: list[Violation] = []

    def check(name: str, path: str) -> None:
        if not secret_allowed(name, pod.policy, pod.labels):
            out.append(
                Violation(
                    "secrets.forbidden", path, f"secret {name!r} is not managed by the platform"
                )
            )

    for list_name, i, container in iter_containers(pod.spec, ALL_CONTAINER_LISTS):
        cpath = f"{base}.{list_name}[{i}]"
        for j, env in enumerate(container.get("env") or ()):
            name = _env_secret(env)
            if name is not None:
                check(name, f"{cpath}.env[{j}].valueFrom.secretKeyRef")
        for j, env_from in enumerate(container.get("envFrom") or ()):
            if "secretRef" in env_from:
                check(env_from["secretRef"]["name"], f"{cpath}.envFrom[{j}].secretRef")
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        if "secret" in volume:
            check(volume["secret"]["secretName"], f"{base}.volumes[{i}].secret")
        projected = volume.get("projected")
        if isinstance(projected, dict):
            for j, source in enumerate(projected.get("sources") or ()):
                if "secret" in source:
                    check(source["secret"]["name"], f"{base}.volumes[{i}].projected.sources[{j}]")
    return out


def check_scheduling(pod: Pod, base: str) -> list[Violation]:
    out: list[Violation] = []
    allowed = pod.policy.scheduling.allowed_priority_classes
    current = pod.spec.get("priorityClassName")
    if allowed is not None and current is not None and current not in allowed:
        out.append(
            Violation(
                "scheduling.priority-class",
                f"{base}.priorityClassName",
                f"priority class {current!r} is not allowed ({', '.join(sorted(allowed))})",
            )
        )
    preemption = pod.policy.scheduling.preemption
    mode = preemption_mode(pod)
    if preemption is not None and mode is not None and mode not in PREEMPTION_MODES:
        out.append(
            Violation(
                "scheduling.preemption-mode",
                f"{_meta_path(base)}.annotations[{preemption.annotation}]",
                f"preemption mode {mode!r} is not one of {', '.join(PREEMPTION_MODES)}",
            )
        )
    return out


RULES: tuple[Callable[[Pod, str], list[Violation]], ...] = (
    check_profile,
    check_resources,
    check_security,
    check_volumes,
    check_secrets,
    check_scheduling,
)


def run_rules(pod: Pod, spec_path: str) -> list[Violation]:
    out: list[Violation] = []
    for rule in RULES:
        out.extend(rule(pod, spec_path))
    return out


__all__ = ["run_rules", "RULES", "JSON"]
