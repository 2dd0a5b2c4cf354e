"""Platform documents: the installation-wide settings each RunPolicy naming one reads.

A ``Platform`` (``metadata.name``; ``spec``: identities, controllers, operators, queues,
installers, projectLabel) is written once, and a RunPolicy names it: ``spec.platform:
digitalhub``. Several platforms may share a cluster (MLRun beside DigitalHub): a
Platform each, each RunPolicy naming its own.

* ``platform_issues``: the errors across documents: two Platforms of one name, a
  RunPolicy naming a Platform that is not there;
* ``resolved``: a RunPolicy document as the model builds it, its ``spec.platform`` the
  named Platform's spec: the engine reads a ``PlatformConfig`` on every RunPolicy,
  whichever form was written, and the digest of a converted policy is the one of its
  inline form;
* ``platform_of`` and ``written_platforms``: where a RunPolicy's platform keys are
  written (a Platform's spec, or the RunPolicy's own inline mapping), for the checks
  that report lines;
* ``reference_issues``: an operator's templates and references in one of its own
  kinds, each reference naming a kind of the platform's operators;
* ``platform_warnings``: lint's: a platform written inline (the older form, still
  read) and what to move where, a Platform no RunPolicy names, a RunPolicy naming none
  beside Platforms that exist.

A RunPolicy without ``platform`` has no platform, as before Platform documents
existed: no identities, so the ownership checks are off and names decide.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.declare import key_path
from webhook.policy.errors import PolicyIssue
from webhook.policy.model import PlatformConfig, run_policy_path
from webhook.policy.source import Path_, PolicySource, SourceDocument, duplicate_names

__all__ = [
    "PLATFORM_PATH",
    "PlatformAt",
    "by_name",
    "is_unknown_platform",
    "platform_issues",
    "platform_of",
    "platform_warnings",
    "reference_issues",
    "resolved",
    "written_platforms",
]

PLATFORM_PATH: Path_ = run_policy_path("platform")  # ("spec", "platform")
_UNKNOWN = "is not defined (platforms: "


@dataclass(frozen=True)
class PlatformAt:
    """Where platform keys are written: ``("spec",)`` of a Platform document, or
    ``("spec", "platform")`` of a RunPolicy that writes them inline."""

    doc: SourceDocument
    prefix: Path_

    def path(self, *names: str) -> Path_:
        """The path of the key with these attribute names (``"operators"``)."""
        return (*self.prefix, *key_path(PlatformConfig, *names))

    def get(self, *names: str) -> Any:
        return self.doc.get(*self.path(*names))


def by_name(source: PolicySource) -> dict[str, SourceDocument]:
    """Each Platform by name (the first, when two share one: an error)."""
    out: dict[str, SourceDocument] = {}
    for doc in source.platforms:
        if doc.name is not None:
            out.setdefault(doc.name, doc)
    return out


def platform_of(
    run_policy: SourceDocument, platforms: Mapping[str, SourceDocument]
) -> PlatformAt | None:
    """Where ``run_policy``'s platform is written; None without one (or naming none there)."""
    written = run_policy.get(*PLATFORM_PATH)
    if isinstance(written, dict):
        return PlatformAt(run_policy, PLATFORM_PATH)
    if isinstance(written, str) and written in platforms:
        return PlatformAt(platforms[written], ("spec",))
    return None


def written_platforms(source: PolicySource) -> list[PlatformAt]:
    """Every place platform keys are written, each once: the Platforms, then the inline
    mappings."""
    out = [PlatformAt(doc, ("spec",)) for doc in source.platforms]
    for doc in source.run_policies:
        if isinstance(doc.get(*PLATFORM_PATH), dict):
            out.append(PlatformAt(doc, PLATFORM_PATH))
    return out


def resolved(
    run_policy: Mapping[str, Any], platforms: Mapping[str, SourceDocument]
) -> Mapping[str, Any]:
    """``run_policy`` with the Platform it names in place of the name (as if written
    inline); as it is when it names none."""
    spec = run_policy.get("spec")
    name = spec.get("platform") if isinstance(spec, Mapping) else None
    if not isinstance(name, str):
        return run_policy
    assert isinstance(spec, Mapping)
    platform = platforms[name].get("spec") or {}
    return {**run_policy, "spec": {**spec, "platform": platform}}


def platform_issues(source: PolicySource) -> list[PolicyIssue]:
    """Two Platforms of one name; a RunPolicy naming a Platform that is not there."""
    issues = duplicate_names(
        source.platforms, "Platform", ": a RunPolicy names one Platform by its name"
    )
    named = {doc.name for doc in source.platforms if doc.name is not None}
    known = ", ".join(sorted(named)) or "none"
    for run_policy in source.run_policies:
        name = run_policy.get(*PLATFORM_PATH)
        if isinstance(name, str) and name not in named:
            issues.append(run_policy.issue(PLATFORM_PATH, f'Platform "{name}" {_UNKNOWN}{known})'))
    return issues


def is_unknown_platform(issue: PolicyIssue) -> bool:
    """True for ``platform_issues``' error of a RunPolicy naming a missing Platform."""
    return issue.key == "spec.platform" and _UNKNOWN in issue.message


def platform_warnings(source: PolicySource) -> Iterator[PolicyIssue]:
    """A platform written inline, and what to move where; a Platform no RunPolicy
    names; a RunPolicy naming no platform beside Platforms that exist."""
    platforms = by_name(source)
    named: set[str] = set()
    suggested: dict[str, str] = {}  # an inline mapping (as JSON) -> the name to give it
    for name, doc in sorted(platforms.items()):
        suggested.setdefault(_as_json(doc.get("spec") or {}), name)
    for run_policy in sorted(source.run_policies, key=lambda d: d.name or ""):
        written = run_policy.get(*PLATFORM_PATH)
        if isinstance(written, str):
            named.add(written)
        elif isinstance(written, dict):
            name = suggested.setdefault(_as_json(written), run_policy.name or "platform")
            move = (
                f"Platform {name} holds the same keys: remove them"
                if name in platforms
                else "move these keys to a Platform document (kind: Platform, "
                f"metadata.name: {name}, spec: these keys)"
            )
            yield run_policy.issue(
                PLATFORM_PATH,
                f"written inline (the older form): {move} and write platform: {name} here",
            )
        elif written is None and platforms:
            yield run_policy.issue(
                ("spec",),
                "names no platform: it has none (no identities: names alone decide what "
                f"its runs may use); write platform: NAME (Platforms: "
                f"{', '.join(sorted(platforms))})",
            )
    for name, doc in platforms.items():
        if name not in named:
            yield doc.issue(
                ("metadata", "name"),
                f"no RunPolicy names this Platform (platform: {name}): it changes nothing",
            )


def reference_issues(platform: PlatformAt) -> list[PolicyIssue]:
    """An operator's reference (and its templates) is in one of its own kinds, and names a
    kind of the platform's operators: runguard records who created those, and its cache
    keeps them."""
    operators_path = platform.path("operators")
    operators = platform.doc.get(*operators_path)
    if not isinstance(operators, list):
        return []
    kinds = {
        k
        for o in operators
        if isinstance(o, dict)
        for k in o.get("kinds") or ()
        if isinstance(k, str)
    }
    return [
        issue
        for i, operator in enumerate(operators)
        if isinstance(operator, dict)
        for issue in _operator_issues(platform.doc, (*operators_path, i), operator, kinds)
    ]


def _operator_issues(
    doc: SourceDocument, at: Path_, operator: dict[str, Any], kinds: set[str]
) -> Iterator[PolicyIssue]:
    """One operator's templates and references: each ``kind`` one of its own, each
    ``names`` a kind of the platform's operators."""
    own = _list(operator.get("kinds"))
    for j, entry in enumerate(_list(operator.get("templates"))):
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if isinstance(kind, str) and kind not in own:
            yield doc.issue((*at, "templates", j, "kind"), _NOT_OWN.format(kind=kind))
    for j, reference in enumerate(_list(operator.get("references"))):
        if not isinstance(reference, dict):
            continue
        path: Path_ = (*at, "references", j)
        kind, names = reference.get("kind"), reference.get("names")
        if isinstance(kind, str) and kind not in own:
            yield doc.issue((*path, "kind"), _NOT_OWN.format(kind=kind))
        if isinstance(names, str) and names not in kinds:
            yield doc.issue(
                (*path, "names"),
                f'"{names}" is no kind of the platform\'s operators: runguard neither '
                "records who created its objects nor keeps them in its cache",
            )


_NOT_OWN = '"{kind}" is not one of this operator\'s kinds'


def _list(value: Any) -> list[Any]:
    """``value`` if it is a list (as written, maybe invalid), else none."""
    return value if isinstance(value, list) else []


def _as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
