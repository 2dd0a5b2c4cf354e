"""Checks across documents: unique names, profiles within the maximums, Platforms named.

What one document's schema cannot see: the documents of a directory together (how
many RunPolicies, duplicate profile names, a default profile that does not exist, a
profile above the RunPolicy's maximums, a Platform that is not there: ``platforms.py``)
and values the schema cannot compare (a default priority class outside the allowed ones,
``gpu`` beside its resource name).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from webhook.inputs.quantity import parse
from webhook.policy import model, platforms, project
from webhook.policy.declare import iter_keys
from webhook.policy.errors import PolicyIssue
from webhook.policy.formats import quantity_problem
from webhook.policy.kube import RESOURCE_LIST, RESOURCE_RANGE_LIST, resolve_resource_name
from webhook.policy.model import KINDS, run_policy_path
from webhook.policy.model.devices import counts_as_problem
from webhook.policy.patterns import label_keys, patterns_overlap
from webhook.policy.platforms import PlatformAt, platform_issues, platform_of, written_platforms
from webhook.policy.schema_issues import describe, show_list
from webhook.policy.source import Path_, PolicySource, SourceDocument, duplicate_names

__all__ = [
    "RESOURCE_LISTS",
    "cross_document_issues",
    "gpu_resource_name",
    "resource_bounds",
    "resource_values",
]
RANGE_KEYS = ("min", "default", "max")


def resource_values(doc: SourceDocument, path: Path_, gpu: str) -> dict[str, tuple[str, Decimal]]:
    """Valid quantities of the resource list at ``path``: resolved name -> (key, value)."""
    raw = doc.get(*path)
    out: dict[str, tuple[str, Decimal]] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        is_scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
        if is_scalar and quantity_problem(value) is None:
            out[resolve_resource_name(key, gpu)] = (key, parse(value))
    return out


def resource_bounds(
    doc: SourceDocument, path: Path_, gpu: str
) -> dict[str, list[tuple[Path_, Decimal]]]:
    """Valid quantities of the resource list at ``path``, a range's bounds and default
    among them: resolved name -> [(where below ``path``, value)]."""
    raw = doc.get(*path)
    out: dict[str, list[tuple[Path_, Decimal]]] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        found: list[tuple[Path_, Any]] = [((key,), value)]
        if isinstance(value, dict):
            found = [((key, bound), value.get(bound)) for bound in RANGE_KEYS]
        for where, quantity in found:
            is_scalar = isinstance(quantity, str | int | float) and not isinstance(quantity, bool)
            if is_scalar and quantity_problem(quantity) is None:
                out.setdefault(resolve_resource_name(key, gpu), []).append((where, parse(quantity)))
    return out


def _range_issues(doc: SourceDocument, path: Path_, gpu: str) -> list[PolicyIssue]:
    """A range's default between its min and its max."""
    issues = []
    for entries in resource_bounds(doc, path, gpu).values():
        bounds = {where[-1]: (where, value) for where, value in entries if len(where) == 2}
        if set(bounds) != set(RANGE_KEYS):
            continue  # a quantity, or a range the schema reports
        (low_at, low), (at, default), (high_at, high) = (bounds[k] for k in RANGE_KEYS)
        for ok, other_at, relation in (
            (low <= default, low_at, "below"),
            (default <= high, high_at, "above"),
        ):
            if not ok:
                issues.append(
                    doc.issue(
                        (*path, *at),
                        f"default {describe(doc.get(*path, *at))} is {relation} "
                        f"{other_at[-1]} {describe(doc.get(*path, *other_at))}",
                    )
                )
    return issues


def gpu_resource_name(source: PolicySource) -> str:
    run_policy = source.run_policy
    return model.gpu_resource_name(run_policy.get("spec") if run_policy else None)


def cross_document_issues(source: PolicySource) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    run_policies = source.run_policies
    if not run_policies:
        issues.append(
            PolicyIssue(
                source.directory, None, "", "no RunPolicy document (at least one is required)"
            )
        )
    issues.extend(_several_run_policies(run_policies))

    issues.extend(duplicate_names(source.profiles, "profile"))
    profile_names = {doc.name for doc in source.profiles if doc.name is not None}

    for doc in (*source.profiles, *source.project_profiles):
        issues.extend(_queue_profile_issues(doc))
    gpu = gpu_resource_name(source)
    for doc in source.documents:
        for path in RESOURCE_LISTS.get(doc.kind or "", ()):
            issues.extend(_duplicate_resources(doc, path, gpu))
            issues.extend(_range_issues(doc, path, gpu))

    platform_docs = platforms.by_name(source)
    for run_policy in run_policies:
        issues.extend(_run_policy_issues(run_policy, source.profiles, profile_names, gpu))
        issues.extend(_shared_config_map_issues(run_policy, platform_of(run_policy, platform_docs)))
    for written in written_platforms(source):
        issues.extend(platforms.reference_issues(written))
    issues.extend(platform_issues(source))
    issues.extend(_project_profile_issues(source, gpu))
    return issues


def _project_profile_issues(source: PolicySource, gpu: str) -> list[PolicyIssue]:
    """A ProjectProfile's name once in its namespace, and every value within each
    RunPolicy that may govern runs there (``project.beyond``)."""
    issues: list[PolicyIssue] = []
    seen: dict[tuple[str, str], SourceDocument] = {}
    built: list[tuple[SourceDocument, model.RunPolicySpec]] = []
    for doc in source.run_policies:
        try:
            policy = model.RunPolicySpec.model_validate(doc.get("spec"), context={"gpu": gpu})
            built.append((doc, policy))
        except ValueError:
            continue  # the schema reports what is wrong with it
    for doc in source.project_profiles:
        namespace, name = doc.get("metadata", "namespace"), doc.name
        if not isinstance(namespace, str) or name is None:
            continue  # the schema says a namespace and a name are required
        first = seen.setdefault((namespace, name), doc)
        if first is not doc:
            issues.append(
                doc.issue(
                    ("metadata", "name"),
                    f'duplicate profile name "{name}" in namespace {namespace} (also at '
                    f"{first.file}:{first.line_of(('metadata', 'name'))})",
                )
            )
        try:
            spec = model.ProjectProfileSpec.model_validate(doc.get("spec"), context={"gpu": gpu})
        except ValueError:
            continue
        for run_policy, policy in built:
            if namespace in policy.exclude_namespaces:
                continue
            for where, problem in project.beyond(spec, policy, namespace):
                at = _as_written(doc, ("spec", *where), gpu)
                line = run_policy.line_of(("kind",))
                if where[0] == "resources" and len(where) > 2:
                    maximums = run_policy_path("resources", "maximums")
                    key = where[2] if run_policy.get(*maximums, where[2]) is not None else "gpu"
                    line = run_policy.line_of((*maximums, key))
                issues.append(doc.issue(at, f"{problem} ({run_policy.file}:{line})"))
    return issues


def _as_written(doc: SourceDocument, path: Path_, gpu: str) -> Path_:
    """``path`` with a resource named as the document writes it (``gpu`` for the gpu
    resource when the document says ``gpu``)."""
    if len(path) > 3 and path[1] == "resources" and path[3] == gpu:
        if doc.get(*path[:3], "gpu") is not None:
            return (*path[:3], "gpu", *path[4:])
    return path


# A profile's keys that place a run by node: a queue profile leaves placement to its flavors.
_NODE_PLACEMENT = ("nodeSelector", "tolerations", "affinity")


def _queue_profile_issues(doc: SourceDocument) -> list[PolicyIssue]:
    """A profile schedules by node or by queue, never both."""
    if not doc.get("spec", "queue"):
        return []
    return [
        doc.issue(
            ("spec", key),
            f"a queue profile (spec.queue) sets no {key}: the queue's flavors place its runs "
            "(schedule by node or by queue, not both)",
        )
        for key in _NODE_PLACEMENT
        if doc.get("spec", key)
    ]


def _several_run_policies(run_policies: list[SourceDocument]) -> list[PolicyIssue]:
    """Several RunPolicies are tried by name, so names must differ; profiles are shared,
    so every RunPolicy must mean the same resource by ``gpu``."""
    issues: list[PolicyIssue] = []
    for doc in run_policies:
        same = [o for o in run_policies if o is not doc and o.name == doc.name]
        if same and doc.name is not None:
            others = ", ".join(o.where for o in same)
            issues.append(
                doc.issue(
                    ("metadata", "name"),
                    f'duplicate RunPolicy name "{doc.name}" (also at {others}): RunPolicies '
                    "are tried in name order",
                )
            )
    gpus = {model.gpu_resource_name(d.get("spec")) for d in run_policies}
    if len(gpus) > 1:
        for doc in run_policies:
            issues.append(
                doc.issue(
                    run_policy_path("resources", "gpu_resource_name"),
                    "every RunPolicy must name the same gpu resource (found "
                    f"{', '.join(sorted(gpus))}): profiles are shared and say gpu for it",
                )
            )
    return issues


def _run_policy_issues(
    run_policy: SourceDocument, profiles: list[SourceDocument], names: set[str], gpu: str
) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    default_path = run_policy_path("profiles_config", "default")
    default = run_policy.get(*default_path)
    if isinstance(default, str) and default not in names:
        known = ", ".join(sorted(names)) or "none"
        issues.append(
            run_policy.issue(
                default_path, f'profile "{default}" is not defined (profiles: {known})'
            )
        )
    factor_path = run_policy_path("resources", "memory_limit_factor")
    on_root_path = run_policy_path("security", "on_root")
    level = run_policy.get(*run_policy_path("security", "level"))
    if run_policy.get(*on_root_path) == "Allow" and level in (None, "restricted"):
        issues.append(
            run_policy.issue(
                on_root_path,
                "onRoot: Allow needs security.level: baseline (restricted requires non-root)",
            )
        )
    factor = run_policy.get(*factor_path)
    if isinstance(factor, float) and not math.isfinite(factor):
        issues.append(run_policy.issue(factor_path, "must be a finite number"))
    allowed = run_policy.get(*run_policy_path("scheduling", "priority_classes", "allowed"))
    class_path = run_policy_path("scheduling", "priority_classes", "default")
    pc_default = run_policy.get(*class_path)
    if isinstance(allowed, list) and isinstance(pc_default, str) and pc_default not in allowed:
        issues.append(
            run_policy.issue(
                class_path,
                f'"{pc_default}" is not in the allowed priority classes ({show_list(allowed)})',
            )
        )

    issues.extend(_workload_class_issues(run_policy, profiles))
    issues.extend(_family_issues(run_policy, profiles, gpu))
    issues.extend(_device_class_issues(run_policy))

    maximums_path = run_policy_path("resources", "maximums")
    maximums = resource_values(run_policy, maximums_path, gpu)
    for doc in profiles:
        for path in RESOURCE_LISTS["Profile"]:
            for name, entries in resource_bounds(doc, path, gpu).items():
                for at, value in entries:
                    if name not in maximums or value <= maximums[name][1]:
                        continue
                    max_key, _ = maximums[name]
                    where = f"{run_policy.file}:{run_policy.line_of((*maximums_path, max_key))}"
                    issues.append(
                        doc.issue(
                            (*path, *at),
                            f"{describe(doc.get(*path, *at))} is above the maximum "
                            f"{describe(run_policy.get(*maximums_path, max_key))} ({where})",
                        )
                    )
    return issues


def _workload_class_issues(
    run_policy: SourceDocument, profiles: list[SourceDocument]
) -> list[PolicyIssue]:
    """A queue profile naming a Kueue priority class the RunPolicy does not allow: the
    run would be refused, so the profile is (as a project's is, ``project.beyond``)."""
    allowed = run_policy.get(*run_policy_path("scheduling", "workload_priority_classes"))
    if not isinstance(allowed, list):
        return []
    where = f"{run_policy.file}:{run_policy.line_of(('kind',))}"
    return [
        doc.issue(
            ("spec", "queue", "priorityClass"),
            f'"{wanted}" is not an allowed Kueue priority class ({show_list(allowed)}) ({where})',
        )
        for doc in profiles
        if isinstance(wanted := doc.get("spec", "queue", "priorityClass"), str)
        and wanted not in allowed
    ]


def _shared_config_map_issues(
    run_policy: SourceDocument, platform: PlatformAt | None
) -> list[PolicyIssue]:
    """A shared ConfigMap is the same for every Pod and nobody's: no label placeholder,
    and no name that is also the platform's (or an operator's) could ever match."""
    shared_path = run_policy_path("volumes", "shared_config_maps")
    shared = run_policy.get(*shared_path)
    if not shared:
        return []
    owned: list[tuple[str, SourceDocument, Path_]] = []
    platform_path = run_policy_path("volumes", "platform_config_maps")
    for i, text in _strings(run_policy.get(*platform_path)):
        owned.append((text, run_policy, (*platform_path, i)))
    if platform is not None:
        operators_path = platform.path("operators")
        operators = platform.doc.get(*operators_path)
        for i, operator in enumerate(operators if isinstance(operators, list) else ()):
            maps = operator.get("configMaps") if isinstance(operator, dict) else None
            for j, text in _strings(maps):
                owned.append((text, platform.doc, (*operators_path, i, "configMaps", j)))
    issues: list[PolicyIssue] = []
    for i, text in _strings(shared):
        if label_keys(text):
            issues.append(
                run_policy.issue(
                    (*shared_path, i),
                    f"{describe(text)}: a shared ConfigMap is the same for every Pod; "
                    "a label placeholder has no place here",
                )
            )
            continue
        for other, doc, where in owned:
            if patterns_overlap(text, other):
                line = doc.line_of(where)
                at = f"line {line}" if doc is run_policy else f"{doc.file}:{line}"
                issues.append(
                    run_policy.issue(
                        (*shared_path, i),
                        f"{describe(text)} is also a name of {describe(other)} "
                        f"({at}): a ConfigMap is either shared "
                        "with every Pod or the platform's, not both",
                    )
                )
    return issues


def _device_class_issues(run_policy: SourceDocument) -> Iterator[PolicyIssue]:
    """Each device class's countsAs and attribute agree."""
    path = run_policy_path("resources", "device_classes")
    written = run_policy.get(*path)
    for name, config in written.items() if isinstance(written, dict) else ():
        if isinstance(config, dict):
            problem = counts_as_problem(config.get("countsAs"), config.get("attribute"))
            if problem is not None:
                yield run_policy.issue((*path, name, "countsAs"), problem)


def _family_issues(
    run_policy: SourceDocument, profiles: list[SourceDocument], gpu: str
) -> list[PolicyIssue]:
    """Device families: names differ, and no profile alone is above a family's maximum."""
    path = run_policy_path("resources", "families")
    written = run_policy.get(*path)
    if not isinstance(written, list):
        return []
    issues: list[PolicyIssue] = []
    families: list[tuple[int, model.DeviceFamily]] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(written):
        try:
            family = model.DeviceFamily.model_validate(raw)
        except ValueError:
            continue  # the schema reports what is wrong with it
        if family.name in seen:
            issues.append(
                run_policy.issue(
                    (*path, i, "name"),
                    f'duplicate family name "{family.name}" (also at line '
                    f"{run_policy.line_of((*path, seen[family.name], 'name'))})",
                )
            )
        seen.setdefault(family.name, i)
        families.append((i, family))
    for doc in profiles:
        for part_path in RESOURCE_LISTS["Profile"]:
            # the most a run may get of each resource: a range's max
            most = {
                n: max(v for _, v in entries)
                for n, entries in resource_bounds(doc, part_path, gpu).items()
            }
            for i, family in families:
                total = sum(
                    (v * w for n, v in most.items() if (w := family.weight(n)) is not None),
                    Decimal(0),
                )
                if total > family.max:
                    where = f"{run_policy.file}:{run_policy.line_of((*path, i, 'max'))}"
                    issues.append(
                        doc.issue(
                            part_path,
                            f"counts {total.normalize():f} of device family {family.name}, "
                            f"above its maximum {family.max.normalize():f} ({where})",
                        )
                    )
    return issues


def _strings(value: object) -> list[tuple[int, str]]:
    """(index, text) of the strings of a list as written (the schema reports the rest)."""
    return (
        [(i, v) for i, v in enumerate(value) if isinstance(v, str)]
        if isinstance(value, list)
        else []
    )


# kind -> where its resource lists are: e.g. ("spec", "resources", "maximums")
RESOURCE_LISTS: dict[str, tuple[Path_, ...]] = {
    kind: tuple(
        ("spec", *key.path)
        for key in iter_keys(spec)
        if key.uses(RESOURCE_LIST) or key.uses(RESOURCE_RANGE_LIST)
    )
    for kind, (spec, _) in KINDS.items()
}


def _duplicate_resources(doc: SourceDocument, path: Path_, gpu: str) -> list[PolicyIssue]:
    raw = doc.get(*path)
    if not isinstance(raw, Mapping) or "gpu" not in raw or gpu not in raw:
        return []
    return [doc.issue((*path, gpu), f'"gpu" and "{gpu}" name the same resource; keep one')]
