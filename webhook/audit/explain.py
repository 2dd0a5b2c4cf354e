"""``runguard explain``: why a run looks the way it does, and what it could have asked for.

Pure: (object, Policy, Context) -> ``Explanation``. The engine's own decision
(``evaluate``: mutate, then validate, as the cluster applies them) says what changed
(``Decision.mutations``: each change's rule id and warning) and what is refused
(``Decision.violations``); nothing here judges again. This module adds which RunPolicy
governed (the engine's ``review``), which profile the run named and got, what each rule
is for (``RULES``) and the profiles the run's namespace may use (their
``namespaceSelector`` over the Namespace's labels, from the cluster view), with their
values and ranges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.audit.clusteraudit import label_selector
from webhook.engine import Change, Decision, Violation, evaluate
from webhook.engine.context import (
    NO_CONTEXT,
    Context,
    namespace_labels,
    project_profile_names,
    project_profile_spec,
)
from webhook.engine.pod import Pod
from webhook.engine.registry import RULES
from webhook.engine.rules.dra import device_routes
from webhook.engine.subject import Review, review
from webhook.policy.kube import LabelSelector, QuantityRange
from webhook.policy.model import Policy, Profile, RunPolicy
from webhook.policy.project import ProjectProfileError, beyond, read_project_profile

EDITS_SHOWN = 30  # JSON Patch operations the text lists
SHOWN = ("cpu", "memory", "gpu")  # the columns of the text table (JSON has every resource)


@dataclass(frozen=True)
class ProfileChoice:
    """A profile of the governing RunPolicy, as a user choosing one reads it."""

    name: str
    description: str
    # Whether the run's namespace may use it; None: the cluster view lacks the
    # Namespace's labels to tell (offline without ``--cluster-state``).
    usable: bool | None
    scope: str  # "every namespace", or the selector in kubectl's syntax
    requests: dict[str, str]  # short resource name -> "4", or "8Gi..64Gi (default 16Gi)"
    limits: dict[str, str]
    # Why the RunPolicy refuses it wherever it is named (a project's own profile that
    # does not load or goes beyond the RunPolicy); "" when only its scope keeps it away.
    refused: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "usable": self.usable,
            "scope": self.scope,
            "requests": self.requests,
            "limits": self.limits,
            "refused": self.refused,
        }


@dataclass(frozen=True)
class Explanation:
    """What ``runguard explain`` says of one object."""

    kind: str
    namespace: str
    name: str
    judged: str  # what was judged: the manifest given, its last-applied configuration...
    applies: bool  # a run some RunPolicy governs
    allowed: bool
    run_policy: str | None
    profile_label: str | None  # where a run names its profile
    profile_asked: str | None
    asked_by: str | None  # label, annotation or default
    profile: str | None  # the profile applied
    changes: tuple[Change, ...]
    violations: tuple[Violation, ...]
    warnings: tuple[str, ...]
    choices: tuple[ProfileChoice, ...]
    # The engine's JSON Patch from the object judged to the one admitted: every edit the
    # warnings summarize (a Job's or CronJob's template at CREATE; none for a Deployment's
    # and the like, whose template is judged, not patched).
    patch: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())
    # How the run gets its devices, by what each counts as (extended resources, claim
    # templates, extended resources a DeviceClass maps): ``3 gpu: 2 as nvidia.com/gpu, ...``
    devices: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "judged": self.judged,
            "applies": self.applies,
            "allowed": self.allowed,
            "runPolicy": self.run_policy,
            "profile": {
                "label": self.profile_label,
                "asked": self.profile_asked,
                "askedBy": self.asked_by,
                "applied": self.profile,
            },
            "changes": [
                {"rule": c.rule, "warning": c.warning, "why": rule_purpose(c.rule, "mutation")}
                for c in self.changes
            ],
            "violations": [
                {**v.to_dict(), "why": rule_purpose(v.rule, "violation")} for v in self.violations
            ],
            "warnings": list(self.warnings),
            "profiles": [c.to_dict() for c in self.choices],
            "patch": list(self.patch),
            "notes": list(self.notes),
            "devices": list(self.devices),
        }


def rule_purpose(rule: str, side: str) -> str:
    """What the webhook does under ``rule`` (``side``: mutation or violation), from the
    one declaration of every rule id."""
    declared = RULES.get(rule)
    return getattr(declared, side, "") if declared is not None else ""


def explain(
    obj: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    context: Context = NO_CONTEXT,
    judged: str = "the manifest given",
    notes: tuple[str, ...] = (),
) -> Explanation:
    """The explanation of ``obj`` under ``policy``, as the cluster would admit it now."""
    decision = evaluate(obj, policy, namespace=namespace, context=context)
    r = review(obj, policy, namespace, None, context)
    governing = r.governing if decision.applies else None
    asked = asked_by = label = None
    if governing is not None and r.target is not None:
        cfg = governing.profiles_config
        label = cfg.label
        for source, values in (("label", r.target.labels), ("annotation", r.target.annotations)):
            if values.get(cfg.label):
                asked, asked_by = values[cfg.label], source
                break
        else:
            if cfg.default is not None:
                asked, asked_by = cfg.default, "default"
    return Explanation(
        kind=decision.kind,
        namespace=decision.namespace,
        name=decision.name,
        judged=judged,
        applies=decision.applies,
        allowed=decision.allowed,
        run_policy=governing.name if governing is not None else None,
        profile_label=label,
        profile_asked=asked,
        asked_by=asked_by,
        profile=decision.profile,
        changes=tuple(decision.mutations),
        violations=tuple(decision.violations),
        warnings=tuple(w for w in decision.warnings if not _said(w, decision)),
        choices=profile_choices(governing, context, decision.namespace) if governing else (),
        patch=tuple(decision.patch),
        notes=notes,
        devices=_devices(r, governing),
    )


def _devices(r: Review, governing: RunPolicy | None) -> tuple[str, ...]:
    """The run's device routes (``rules.dra.device_routes``), of its pod spec as given."""
    if governing is None or r.target is None:
        return ()
    target = r.target
    pod = Pod(target.spec, target.labels, target.annotations, governing, target.spec_path,
              namespace=r.namespace, context=r.context)  # fmt: skip
    return tuple(device_routes(pod))


def _said(warning: str, decision: Decision) -> bool:
    """A warning that only repeats a change (each change is listed with its rule)."""
    return any(c.warning == warning for c in decision.mutations)


def profile_choices(
    policy: RunPolicy, context: Context, namespace: str
) -> tuple[ProfileChoice, ...]:
    """Every profile a run in ``namespace`` may name, by name, with whether it may use
    it: the project's own (ProjectProfile, which wins over an installation-wide profile
    of the same name there, as in the engine) and ``policy``'s."""
    labels = namespace_labels(context, namespace)
    own = _project_choices(policy, context, namespace)
    mine = {choice.name for choice in own}
    return tuple(
        sorted(
            [
                *own,
                *(
                    _choice(policy, profile, labels)
                    for name, profile in policy.profiles.items()
                    if name not in mine
                ),
            ],
            key=lambda choice: choice.name,
        )
    )


def _project_choices(policy: RunPolicy, context: Context, namespace: str) -> list[ProfileChoice]:
    """The project's own profiles the view holds; one that does not load or exceeds
    the RunPolicy is listed as not usable, as the engine refuses it."""
    gpu = policy.resources.gpu_resource_name
    out = []
    for name in project_profile_names(context, namespace):
        spec = project_profile_spec(context, namespace, name)
        scope = f"this project ({namespace})"
        try:
            profile = read_project_profile(spec or "", namespace, name, gpu)
        except ProjectProfileError as exc:
            refused = f"does not load: {exc}"
            out.append(ProfileChoice(name, "(does not load)", False, scope, {}, {}, refused))
            continue
        problems = [
            f"spec.{'.'.join(map(str, at))}: {why}"
            for at, why in beyond(profile, policy, namespace)
        ]
        refused = f"beyond the RunPolicy: {'; '.join(problems)}" if problems else ""
        choice = _choice(policy, profile, None)
        out.append(replace(choice, usable=not problems, scope=scope, refused=refused))
    return out


def usable(profile: Profile, labels: Mapping[str, str] | None) -> bool | None:
    """Whether a namespace with ``labels`` may use ``profile`` (the engine's
    ``Pod.may_use``, which fails closed where this says None: labels unknown)."""
    selector = profile.namespace_selector
    if selector is None:
        return True
    return None if labels is None else selector.matches(labels)


def _choice(policy: RunPolicy, profile: Profile, labels: Mapping[str, str] | None) -> ProfileChoice:
    short = policy.resources.short
    return ProfileChoice(
        name=profile.name,
        description=profile.description,
        usable=usable(profile, labels),
        scope=_scope(profile.namespace_selector),
        requests={short(k): value_text(v) for k, v in profile.resources.requests.items()},
        limits={short(k): value_text(v) for k, v in profile.resources.limits.items()},
    )


def value_text(value: str | QuantityRange) -> str:
    """A profile's value as a user reads it: ``4``, or ``8Gi..64Gi (default 16Gi)``."""
    if isinstance(value, QuantityRange):
        return f"{value.min}..{value.max} (default {value.default})"
    return value


def _scope(selector: LabelSelector | None) -> str:
    if selector is None:
        return "every namespace"
    return f"namespaces labelled {label_selector(selector) or '(any)'}"


# --- text ------------------------------------------------------------------------------


def to_text(e: Explanation) -> str:
    """The human report: verdict, governance, each change and why, what else to pick."""
    where = f"{e.namespace}/{e.name}" if e.namespace else e.name or "(unnamed)"
    if not e.applies:
        lines = [f"{e.kind or 'object'} {where}: not a run any RunPolicy governs, untouched"]
        lines += [f"  refused: {v}" for v in e.violations]
        return "\n".join(lines + [f"  note: {n}" for n in e.notes])
    lines = [f"{e.kind} {where}: {'allowed' if e.allowed else 'DENIED'}"]
    lines.append(f"  judged:     {e.judged}")
    lines.append(f"  RunPolicy:  {e.run_policy}")
    lines.append(f"  profile:    {_profile_line(e)}")
    lines += [f"  devices:    {d}" for d in e.devices]
    lines += [f"  note: {n}" for n in e.notes]
    if e.changes:
        lines.append(f"  changes ({len(e.changes)}):")
        for c in e.changes:
            lines.append(f"    [{c.rule}] {c.warning.removeprefix('runguard: ')}")
            if why := rule_purpose(c.rule, "mutation"):
                lines.append(f"        why: {why}")
    else:
        lines.append("  changes: none")
    lines += _edits_text(e.patch)
    if e.violations:
        lines.append(f"  {'refused' if not e.allowed else 'violations'} ({len(e.violations)}):")
        for v in e.violations:
            lines.append(f"    {v}")
    lines += [f"  warning: {w}" for w in e.warnings]
    lines += _choices_text(e)
    return "\n".join(lines)


def _edits_text(patch: tuple[dict[str, Any], ...]) -> list[str]:
    """The JSON Patch, an operation a line (runguard's records left out: ownership's
    stamp says who created the run, not how it changed)."""
    edits = [op for op in patch if not op.get("path", "").startswith("/metadata")]
    if not edits:
        return []
    lines = [f"  edits ({len(edits)}, JSON Patch):"]
    for op in edits[:EDITS_SHOWN]:
        value = "" if op["op"] == "remove" else " " + _compact(op.get("value"))
        lines.append(f"    {op['op']} {op['path']}{value}")
    if len(edits) > EDITS_SHOWN:
        lines.append(f"    ... {len(edits) - EDITS_SHOWN} more (-o json lists each)")
    return lines


def _compact(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 100 else text[:97] + "..."


def _profile_line(e: Explanation) -> str:
    if e.profile_asked is None:
        return f"none (a run names one with the label {e.profile_label})"
    how = {
        "label": f"named by the label {e.profile_label}",
        "annotation": f"named by the annotation {e.profile_label}",
        "default": "the RunPolicy's default (the run names none)",
    }[e.asked_by or "default"]
    if e.profile is None:
        return f"{e.profile_asked} ({how}), not applied"
    if e.profile == f"{e.namespace}/{e.profile_asked}":  # how the engine names a project's
        return f"{e.profile_asked} ({how}; project {e.namespace}'s own ProjectProfile)"
    if e.profile != e.profile_asked:
        return f"{e.profile} instead of {e.profile_asked} ({how}; unknown, the default used)"
    return f"{e.profile} ({how})"


def _choices_text(e: Explanation) -> list[str]:
    if not e.choices:
        return ["  profiles: the RunPolicy has none"]
    open_to = [c for c in e.choices if c.usable]
    unknown = [c for c in e.choices if c.usable is None]
    closed = [c for c in e.choices if c.usable is False and not c.refused]
    refused = [c for c in e.choices if c.refused]
    lines = [
        f"  profiles namespace {e.namespace} may use "
        f"(label {e.profile_label}=NAME; requests, a range is min..max):"
    ]
    lines += _choices_table(open_to)
    if unknown:
        lines.append(
            "  kept to some namespaces (the cluster view lacks this Namespace's labels to "
            f"tell; give --cluster-state with it): {', '.join(c.name for c in unknown)}"
        )
    if closed:
        lines.append(f"  kept to other namespaces: {', '.join(c.name for c in closed)}")
    if refused:
        lines.append("  this project's own, refused by the RunPolicy (a run naming one is denied):")
        lines += [f"    {c.name}: {c.refused}" for c in refused]
    return lines


def _choices_table(choices: list[ProfileChoice]) -> list[str]:
    """The profiles a run may name, a row each: name, requests shown, description."""
    rows = [("NAME", *(r.upper() for r in SHOWN), "DESCRIPTION")]
    rows += [(c.name, *(c.requests.get(r, "-") for r in SHOWN), c.description) for c in choices]
    if len(rows) == 1:
        return ["    none"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(SHOWN) + 1)]
    lines = []
    for row in rows:
        cells = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
        lines.append(f"    {cells}  {row[-1]}".rstrip())
    return lines
