"""A project's own profiles (``ProjectProfile``): read from the cluster, bounded by the
RunPolicy that governs the runs of their namespace.

A project admin writes a ProjectProfile in her namespace; it gives her team no more than
the cluster admin's RunPolicy allows anyone there. ``beyond`` says what of a profile is
outside that RunPolicy, as (key path below ``spec``, problem); ``runguard lint`` and the
policy objects' admission check report each at its line (``consistency.py``), and the
engine refuses a run naming a profile with any (``profile.project-invalid``), so a
profile that got in some other way (runguard down, a RunPolicy lowered since) still
gives nothing beyond it:

* every quantity, and every bound of a range, at most the RunPolicy's maximum (an
  extended resource a DeviceClass maps to dynamic resource allocation as the devices it
  stands for: a profile may give its GPUs that way);
* what a run may get of a device family (each range at its max) at most its maximum;
* its priority class one of the allowed ones;
* no environment variable that selects devices on the node (``resources.deviceEnv``):
  devices come through requests, as for the users' own containers (an installation-wide
  profile may set them, a project's may not);
* no inter-pod affinity term reaching Pods of other namespaces (``namespaces`` naming
  another, or a ``namespaceSelector``): a project's profile keeps to its project;
* its run time (default and maximum) at most the RunPolicy's ``runTime.maximum``.

Nothing a profile sets touches the run's security context: root and privileges are
stripped or denied after the profile is applied, whatever profile the run names.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import orjson
from pydantic import ValidationError

from webhook.inputs.quantity import parse
from webhook.policy.kube import QuantityRange
from webhook.policy.model import (
    Policy,
    Profile,
    ProfileValues,
    ProjectProfileSpec,
    RunPolicy,
    RunPolicySpec,
)

__all__ = ["KIND", "ProjectProfileError", "above_other_maximums", "beyond", "read_project_profile"]

KIND = "ProjectProfile"
Where = tuple[str | int, ...]
_AFFINITIES = ("podAffinity", "podAntiAffinity")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


class ProjectProfileError(ValueError):
    """A ProjectProfile's spec the model cannot read; the message says where and why."""


@functools.lru_cache(maxsize=512)
def read_project_profile(spec: str, namespace: str, name: str, gpu: str) -> Profile:
    """The profile of a ProjectProfile ``namespace/name`` whose spec is the JSON text
    ``spec`` (``gpu``: what the RunPolicy means by it). Raises ``ProjectProfileError``.
    Cached: the same text is read once, however many runs name it."""
    try:
        data = orjson.loads(spec) if spec else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise ProjectProfileError("its spec could not be read (absent, or over the size kept)")
    try:
        ProjectProfileSpec.model_validate(data, context={"gpu": gpu})
        return Profile.model_validate(
            {**data, "name": name, "project": namespace}, context={"gpu": gpu}
        )
    except ValidationError as exc:
        raise ProjectProfileError(_said(exc, data)) from None


def _said(exc: ValidationError, data: dict[str, Any]) -> str:
    """The model's first error as lint words it: at the key of the document it is about
    (``spec.resources.requests.cpu``, never the validator's own steps), preferring an
    error of the value's own shape (a range's bound) to a branch it was not written as."""
    errors = exc.errors()
    shaped = [e for e in errors if not str(e["type"]).endswith("_type")]
    error = (shaped or errors)[0]
    where: list[str] = ["spec"]
    node: Any = data
    loc = error["loc"]
    for i, step in enumerate(loc):
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
        elif i == len(loc) - 1 and error["type"] == "missing":
            node = None  # the key itself, absent
        else:
            continue  # a step of the validator (a union's branch), not of the document
        where.append(str(step))
    words = _LINT_WORDS.get(str(error["type"]), str(error["msg"]).removeprefix("Value error, "))
    return f"{'.'.join(where)}: {words}"


# The model's words where lint has its own (``schema_issues``) for the same mistake.
_LINT_WORDS = {"missing": "required key is missing", "extra_forbidden": "unknown key"}


def beyond(
    profile: ProfileValues, policy: RunPolicySpec, namespace: str
) -> list[tuple[Where, str]]:
    """(key path below ``spec``, problem) of each value of ``profile``, a profile of
    project ``namespace``, beyond what ``policy`` allows (see the module docstring)."""
    found = list(_above_maximums(profile, policy))
    found.extend(_above_families(profile, policy))
    allowed = policy.scheduling.allowed_priority_classes
    pc = profile.priority_class_name
    if pc is not None and allowed is not None and pc not in allowed:
        found.append(
            (
                ("priorityClassName",),
                f'"{pc}" is not an allowed priority class ({", ".join(sorted(allowed))})',
            )
        )
    found.extend(_workload_priority_class(profile, policy))
    device_env = set(policy.resources.device_env)
    for i, var in enumerate(profile.env):
        if var.get("name") in device_env:
            found.append(
                (
                    ("env", i, "name"),
                    f'"{var["name"]}" selects devices on the node: a project\'s profile asks '
                    "for devices in resources",
                )
            )
    found.extend(_other_namespaces(profile.affinity or {}, namespace))
    found.extend(_longer_run_time(profile, policy))
    return found


def above_other_maximums(
    profile: ProfileValues, root: Policy, governing: RunPolicy, namespace: str
) -> tuple[RunPolicy, list[tuple[Where, str]]]:
    """Under a RunPolicy without maximums (the shipped ``builds``, for the platform's own
    image builds), a project's profile is bounded by the maximums and device families of
    every other RunPolicy that looks at its namespace: it never gives a run more than the
    installation allows anywhere. (The RunPolicy, the problems) of the first it exceeds."""
    for other in root.run_policies:
        if other is governing or namespace in other.exclude_namespaces:
            continue
        found = [*_above_maximums(profile, other), *_above_families(profile, other)]
        if found:
            return other, found
    return governing, []


def _workload_priority_class(
    profile: ProfileValues, policy: RunPolicySpec
) -> Iterator[tuple[Where, str]]:
    """The Kueue priority class a queue profile names, where the RunPolicy bounds them."""
    allowed = policy.scheduling.workload_priority_classes
    wanted = profile.queue.priority_class if profile.queue is not None else None
    if wanted is not None and allowed is not None and wanted not in allowed:
        yield (
            ("queue", "priorityClass"),
            f'"{wanted}" is not an allowed Kueue priority class '
            f"({', '.join(sorted(allowed)) or 'none'})",
        )


def _longer_run_time(profile: ProfileValues, policy: RunPolicySpec) -> Iterator[tuple[Where, str]]:
    """A run time the profile gives above the RunPolicy's ``runTime.maximum``."""
    most, run_time = policy.run_time.maximum, profile.run_time
    if most is None or run_time is None:
        return
    for key in ("default", "maximum"):
        seconds = getattr(run_time, key)
        if seconds is not None and seconds > most:
            yield ("runTime", key), f"{seconds} seconds is above the RunPolicy's maximum {most}"


def _bounds(value: str | QuantityRange) -> Iterator[tuple[Where, str, Decimal]]:
    """(where below the resource, quantity, amount) of a quantity, or of a range's bounds."""
    if isinstance(value, QuantityRange):
        for key, text, amount in zip(
            ("min", "default", "max"),
            (value.min, value.default, value.max),
            value.amounts,
            strict=True,
        ):
            yield (key,), text, amount
    else:
        yield (), value, parse(value)


def _above_maximums(profile: ProfileValues, policy: RunPolicySpec) -> Iterator[tuple[Where, str]]:
    maximums = policy.resources.maximum_values
    for part in ("requests", "limits"):
        values: Mapping[str, str | QuantityRange] = getattr(profile.resources, part)
        for resource, value in values.items():
            counted = policy.resources.counted_as(resource)  # a DeviceClass's: its devices
            most = maximums.get(counted)
            if most is None:
                continue
            for at, text, amount in _bounds(value):
                if amount > most:
                    written = policy.resources.maximums[counted]
                    yield (
                        ("resources", part, resource, *at),
                        f'"{text}" is above the maximum "{written}"',
                    )


def _above_families(profile: ProfileValues, policy: RunPolicySpec) -> Iterator[tuple[Where, str]]:
    for part in ("requests", "limits"):
        values: Mapping[str, str | QuantityRange] = getattr(profile.resources, part)
        most: dict[str, Decimal] = {}
        for r, v in values.items():
            counted = policy.resources.counted_as(r)
            most[counted] = most.get(counted, Decimal(0)) + max(a for _, _, a in _bounds(v))
        for family in policy.resources.families:
            total = sum(
                (v * w for r, v in most.items() if (w := family.weight(r)) is not None),
                Decimal(0),
            )
            if total > family.max:
                yield (
                    ("resources", part),
                    f"counts {total.normalize():f} of device family {family.name}, above its "
                    f"maximum {family.max.normalize():f}",
                )


def _other_namespaces(affinity: Mapping[str, Any], namespace: str) -> Iterator[tuple[Where, str]]:
    """Inter-pod affinity terms that reach Pods outside ``namespace``."""
    for kind in _AFFINITIES:
        section = affinity.get(kind)
        if not isinstance(section, Mapping):
            continue
        for mode in (_REQUIRED, _PREFERRED):
            for i, term in enumerate(section.get(mode) or ()):
                if not isinstance(term, Mapping):
                    continue
                at: Where = ("affinity", kind, mode, i)
                if mode == _PREFERRED:
                    term, at = term.get("podAffinityTerm") or {}, (*at, "podAffinityTerm")
                if term.get("namespaceSelector") is not None:
                    yield (
                        (*at, "namespaceSelector"),
                        "reaches Pods of other namespaces: a project's profile keeps to its own",
                    )
                others = [n for n in term.get("namespaces") or () if n != namespace]
                if others:
                    yield (
                        (*at, "namespaces"),
                        f"names other namespaces ({', '.join(map(str, others))}): a project's "
                        "profile keeps to its own",
                    )
