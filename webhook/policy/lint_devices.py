"""``lint`` warnings on devices by dynamic resource allocation and on run time.

A profile's run time that its own maximum, or the RunPolicy's, cuts short; an extended
resource a DeviceClass maps (``extendedResourceName``) that is also a device plugin's
resource elsewhere in the policy, or that two classes map; a profile giving the
resource a DeviceClass stands for (``deviceclass.resource.kubernetes.io/<class>``) of a
class the RunPolicy does not let runs use, so every run of it is refused.

Read from the documents as written (for lines), defensively: what the schema refuses is
the loader's to report.
"""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Any

from webhook.policy.errors import PolicyIssue
from webhook.policy.model import profile_path, run_policy_path
from webhook.policy.model.devices import IMPLICIT_EXTENDED_PREFIX, VALUE
from webhook.policy.source import PolicySource, SourceDocument

__all__ = ["device_and_run_time_warnings"]

_RUN_TIME = profile_path("run_time")
_MOST_RUN_TIME = run_policy_path("run_time", "maximum")
_DEVICE_CLASSES = run_policy_path("resources", "device_classes")
_MAXIMUMS = run_policy_path("resources", "maximums")
_FAMILIES = run_policy_path("resources", "families")
_PROFILE_RESOURCES = (profile_path("resources", "requests"), profile_path("resources", "limits"))


def device_and_run_time_warnings(source: PolicySource, gpu: str) -> Iterator[PolicyIssue]:
    """Every warning of this module's (see its doc), for ``lint``."""
    run_policy = source.run_policy
    for doc in source.run_policies:
        yield from _mapping_warnings(doc, gpu)
    for profile in (*source.profiles, *source.project_profiles):
        yield from _run_time_warnings(profile, run_policy)
        if run_policy is not None:
            yield from _unallowed_class_warnings(profile, run_policy)


def _run_time_warnings(
    profile: SourceDocument, run_policy: SourceDocument | None
) -> Iterator[PolicyIssue]:
    """A runTime default above the profile's maximum (runs get the maximum), and an
    installation-wide profile's run time above the RunPolicy's maximum (a project's
    profile above it is the loader's error: it is not applied)."""
    default, maximum = _seconds(profile, "default"), _seconds(profile, "maximum")
    if default is not None and maximum is not None and default > maximum:
        yield profile.issue(
            (*_RUN_TIME, "default"),
            f"run time default {default} seconds is above the profile's maximum {maximum}: "
            f"runs setting none get {maximum}",
        )
    most = run_policy.get(*_MOST_RUN_TIME) if run_policy is not None else None
    if run_policy is None or not isinstance(most, int) or profile.kind != "Profile":
        return
    for key, seconds in (("default", default), ("maximum", maximum)):
        if seconds is not None and seconds > most:
            yield profile.issue(
                (*_RUN_TIME, key),
                f"run time {key} {seconds} seconds is above RunPolicy {run_policy.name}'s "
                f"runTime.maximum {most} ({run_policy.file}:"
                f"{run_policy.line_of(_MOST_RUN_TIME)}): its runs get {seconds}, as an "
                "installation-wide profile is the admin's own",
            )


def _seconds(profile: SourceDocument, key: str) -> int | None:
    value = profile.get(*_RUN_TIME, key)
    return value if _whole(value) else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping_warnings(doc: SourceDocument, gpu: str) -> Iterator[PolicyIssue]:
    """A class's extendedResourceName that another class maps too, or that the policy
    names as a device plugin's resource (a maximum, a family member, another class's
    countsAs) while the class counts it as something else: runguard counts every one
    of it as the class's devices, on device-plugin nodes too."""
    classes = doc.get(*_DEVICE_CLASSES)
    if not isinstance(classes, dict):
        return
    counted = {name: _counts_as(config, gpu) for name, config in classes.items()}
    mapped_by: dict[str, str] = {}
    for name, config in classes.items():
        mapped = config.get("extendedResourceName") if isinstance(config, dict) else None
        if not isinstance(mapped, str) or mapped == counted[name]:
            continue  # none, or the class's devices counted as themselves: once
        path = (*_DEVICE_CLASSES, name, "extendedResourceName")
        first = mapped_by.setdefault(mapped, name)
        if first != name:
            yield doc.issue(
                path,
                f"{mapped} is also the extendedResourceName of DeviceClass {first}: which "
                "class the scheduler allocates it from is not said; map it once",
            )
            continue
        named = _plugin_resource(doc, mapped, gpu, counted, name)
        if named is not None:
            as_what = (counted[name] or "?").replace(VALUE, "*")
            yield doc.issue(
                path,
                f"{mapped} is also a device plugin's resource ({named}): runguard counts "
                f"every {mapped} a run asks for as {name} devices ({as_what}), on "
                "device-plugin nodes too",
            )


def _counts_as(config: Any, gpu: str) -> str | None:
    counts_as = config.get("countsAs") if isinstance(config, dict) else None
    if not isinstance(counts_as, str):
        return None
    return gpu if counts_as == "gpu" else counts_as


def _plugin_resource(
    doc: SourceDocument, resource: str, gpu: str, counted: dict[str, str | None], mine: str
) -> str | None:
    """Where the RunPolicy names ``resource`` as a resource of its own; None: nowhere."""
    maximums = doc.get(*_MAXIMUMS)
    for key in maximums if isinstance(maximums, dict) else ():
        if (gpu if key == "gpu" else key) == resource:
            return f"resources.maximums {key}"
    families = doc.get(*_FAMILIES)
    for family in families if isinstance(families, list) else ():
        members = family.get("members") if isinstance(family, dict) else None
        for key in members if isinstance(members, dict) else ():
            if isinstance(key, str) and fnmatchcase(resource, key):
                return f"a member of device family {family.get('name')}"
    for name, counts_as in counted.items():
        if (
            name != mine
            and counts_as is not None
            and fnmatchcase(resource, counts_as.replace(VALUE, "*"))
        ):
            return f"what DeviceClass {name}'s devices count as"
    return None


def _unallowed_class_warnings(
    profile: SourceDocument, run_policy: SourceDocument
) -> Iterator[PolicyIssue]:
    """A profile giving ``deviceclass.resource.kubernetes.io/<class>`` of a class not in
    the RunPolicy's ``resources.deviceClasses``: its runs are all refused."""
    classes = run_policy.get(*_DEVICE_CLASSES)
    allowed = set(classes) if isinstance(classes, dict) else set()
    for path in _PROFILE_RESOURCES:
        values = profile.get(*path)
        for resource in values if isinstance(values, dict) else ():
            if not isinstance(resource, str) or not resource.startswith(IMPLICIT_EXTENDED_PREFIX):
                continue
            device_class = resource[len(IMPLICIT_EXTENDED_PREFIX) :]
            if device_class not in allowed:
                yield profile.issue(
                    (*path, resource),
                    f"DeviceClass {device_class} is not in RunPolicy {run_policy.name}'s "
                    f"resources.deviceClasses ({', '.join(sorted(allowed)) or 'none'}): every "
                    "run of this profile is refused (resources.device-request)",
                )
