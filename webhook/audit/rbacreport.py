"""``runguard audit --rbac``: the doors admission cannot see, read from RBAC.

Some verbs reach the platform's objects without any admission request: reading a
Secret, changing a ConfigMap's data, the kubelet's API through ``nodes/proxy``, a
token, impersonation. No webhook can judge them; who holds them is decided by RBAC
alone. This module says, for the namespaces runs live in, which subjects (users,
groups, ServiceAccounts) hold such verbs, and through which bindings.

No I/O of its own: ``rbac_report`` takes the cluster's objects as plain dicts (as
``kubectl get namespaces,roles,rolebindings,clusterroles,clusterrolebindings -A -o
yaml`` prints them, or as the CLI lists them) and a ``Platform`` (what the policy says
about namespaces, platform names and identities: ``platform_of``).

RBAC is read as the apiserver's authorizer reads it (``webhook.audit.rbac``); the doors
and the grants opening each are ``webhook.audit.rbacdoors``'.

Findings about the cluster's own operators are expected, not findings: cluster admins
(the group ``system:masters``, anyone a ClusterRoleBinding binds to ``cluster-admin``),
Kubernetes' components (``system:`` users other than ``system:anonymous``, the group
``system:nodes``, ServiceAccounts of ``kube-system``) and the platform's identities
(``platform.identities``, ``controllers``, ``operators``, ``installers``). They are kept
with the reason (``Finding.expected``) and left out of reports unless asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from webhook.audit.rbac import (
    CLUSTER_WIDE,
    Binding,
    Rule,
    Subject,
    bound_rules,
    cluster_role_rules,
    meta_of,
    read_bindings,
    role_rules,
)
from webhook.audit.rbacdoors import DOORS, RBAC_API, Door
from webhook.audit.reportbook import REPORT_LABELS, SOURCE, ReportFormat, timestamp
from webhook.engine.rule import CONCERNS
from webhook.engine.rules.ownership import service_account_identities
from webhook.inputs.documents import is_list, list_items
from webhook.install.manifests import SHELLS_CONFIGURATION_NAME as SHELLS_CONFIGURATION
from webhook.keys import REPORT_LABEL
from webhook.policy.model import Policy
from webhook.policy.patterns import split

__all__ = [
    "CLUSTER_WIDE",
    "DOORS",
    "Door",
    "Finding",
    "Platform",
    "RbacReport",
    "Subject",
    "platform_of",
    "rbac_report",
    "rbac_reports",
    "shells_webhook_installed",
    "to_rows",
    "to_table",
]

REPORT_NAME = "runguard-rbac"  # each run namespace's report, and the cluster-scoped one


# --- the policy's side ----------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """What the report needs of the policy, as plain values."""

    # Per RunPolicy, the namespaces it leaves out: a namespace is a run namespace when at
    # least one RunPolicy governs it.
    exclusions: tuple[frozenset[str], ...] = (frozenset(),)
    secret_patterns: tuple[str, ...] = ()
    config_map_patterns: tuple[str, ...] = ()
    identities: frozenset[str] = frozenset()  # user names, and group:NAME for groups
    # Where the platform's and its operators' ServiceAccounts live.
    account_namespaces: frozenset[str] = frozenset()

    def governs(self, namespace: str) -> bool:
        return any(namespace not in excluded for excluded in self.exclusions)

    def names(self, kind: str) -> tuple[str, ...]:
        return self.secret_patterns if kind == "secrets" else self.config_map_patterns


def platform_of(policy: Policy) -> Platform:
    """The platform every RunPolicy of ``policy`` declares, together."""
    policies = policy.run_policies
    identities: set[str] = set()
    secrets: dict[str, None] = {}
    config_maps: dict[str, None] = {}
    accounts: set[str] = set()
    for p in policies:
        accounts.update(namespace for namespace, _ in service_account_identities(p))
        platform = p.platform
        named = [*platform.identities, *platform.controllers, *platform.installers]
        named += [o.identity for o in platform.operators]
        identities.update(_identity(i) for i in named)
        secrets.update(dict.fromkeys(n.text for n in p.secrets.allowed))
        config_maps.update(dict.fromkeys(n.text for n in p.volumes.platform_config_maps))
        for operator in platform.operators:
            config_maps.update(dict.fromkeys(n.text for n in operator.config_maps))
    return Platform(
        exclusions=tuple(p.exclude_namespaces for p in policies),
        secret_patterns=tuple(secrets),
        config_map_patterns=tuple(config_maps),
        identities=frozenset(identities),
        account_namespaces=frozenset(accounts),
    )


def _identity(identity: str) -> str:
    """A policy identity as ``Subject.identity`` spells it."""
    if identity.startswith("serviceaccount:"):
        return "system:" + identity
    return identity


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Any name ``pattern`` can match, whatever the runs' labels: a placeholder is any
    non-empty text, ``*`` any text."""
    literals, _ = split(pattern)
    parts = (".*".join(re.escape(chunk) for chunk in literal.split("*")) for literal in literals)
    return re.compile(".+".join(parts), re.DOTALL)


# --- RBAC ------------------------------------------------------------------------------


# --- findings --------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """What of a door's resource a rule grants: the verbs, and the names when narrowed."""

    resource: str
    verbs: frozenset[str]
    names: frozenset[str] = frozenset()

    def __str__(self) -> str:
        names = f"[{','.join(sorted(self.names))}]" if self.names else ""
        return f"{','.join(_ordered(self.verbs))} {self.resource}{names}"


VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "impersonate")


def _ordered(verbs: Iterable[str]) -> list[str]:
    return sorted(verbs, key=lambda v: (VERB_ORDER.index(v) if v in VERB_ORDER else 99, v))


SHELLS_OFF_NOTE = "the shells webhook is off: no admission request judges these connections"


@dataclass
class Finding:
    """A subject holding a door's verbs in a namespace (``*``: everywhere)."""

    namespace: str
    subject: Subject
    door: Door
    grants: dict[tuple[str, frozenset[str]], set[str]] = field(default_factory=dict)
    via: dict[str, Binding] = field(default_factory=dict)
    expected: str | None = None  # why these grants are expected; None: a finding

    def add(self, grant: Grant, binding: Binding) -> None:
        self.grants.setdefault((grant.resource, grant.names), set()).update(grant.verbs)
        self.via[str(binding)] = binding

    @property
    def note(self) -> str | None:
        return SHELLS_OFF_NOTE if self.door.needs_shells_off else None

    @property
    def result(self) -> str:
        return "skip" if self.expected else "fail"

    def verbs(self) -> dict[str, frozenset[str]]:
        """The verbs granted, by resource (whatever the names)."""
        out: dict[str, frozenset[str]] = {}
        for (resource, _), verbs in self.grants.items():
            out[resource] = out.get(resource, frozenset()) | verbs
        return out

    def grant_list(self) -> list[Grant]:
        grants = [Grant(r, frozenset(v), names) for (r, names), v in self.grants.items()]
        return sorted(grants, key=lambda g: (g.resource, sorted(g.names)))

    def grant_text(self) -> str:
        """The grants in a line: resources granted the same verbs (and names) together,
        ``get,list,watch secrets; create pods/exec,pods/attach``."""
        together: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for g in self.grant_list():
            together.setdefault((tuple(_ordered(g.verbs)), tuple(sorted(g.names))), []).append(
                g.resource
            )
        return "; ".join(
            f"{','.join(verbs)} {','.join(resources)}" + (f"[{','.join(names)}]" if names else "")
            for (verbs, names), resources in together.items()
        )

    def message(self) -> str:
        grants = self.grant_text()
        where = "in every namespace" if self.namespace == CLUSTER_WIDE else "in this namespace"
        text = f"{self.subject} may {grants} {where}: {self.door.title}"
        if self.expected:
            text += f" (expected: {self.expected})"
        if self.note:
            text += f"; {self.note}"
        return text


def cluster_admins(bindings: Iterable[Binding]) -> frozenset[Subject]:
    """Whom a ClusterRoleBinding binds to ClusterRole ``cluster-admin``."""
    return frozenset(
        subject
        for b in bindings
        if (b.kind, b.role_kind, b.role) == ("ClusterRoleBinding", "ClusterRole", "cluster-admin")
        for subject in b.subjects
    )


def expected(subject: Subject, platform: Platform, admins: frozenset[Subject]) -> str | None:
    """Why a subject's grants are expected (the cluster's and the platform's own
    operators), or None."""
    if subject in admins or (subject.kind, subject.name) == ("Group", "system:masters"):
        return "cluster admin"
    if subject.identity in platform.identities:
        return "platform identity"
    if (
        subject.kind == "User"
        and subject.name.startswith("system:")
        and subject.name != "system:anonymous"
        and not subject.name.startswith("system:serviceaccount:")
    ):
        return "Kubernetes component"
    if (subject.kind, subject.name) == ("Group", "system:nodes"):
        return "Kubernetes component"
    if subject.kind == "ServiceAccount" and subject.namespace == "kube-system":
        return "Kubernetes component"
    return None


def _namespaces(objects: list[dict[str, Any]]) -> set[str]:
    """The cluster's namespaces: its Namespace objects, else every namespace the roles
    and bindings name (a file may hold no Namespace)."""
    listed = {str(meta_of(o).get("name")) for o in objects if o.get("kind") == "Namespace"}
    if listed - {"None"}:
        return listed - {"None"}
    return {
        str(meta_of(o)["namespace"])
        for o in objects
        if o.get("kind") in ("Role", "RoleBinding") and meta_of(o).get("namespace")
    }


def flatten(objects: Iterable[Any]) -> list[dict[str, Any]]:
    """Objects as read (``kind: List`` and typed lists flattened), dicts only."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        if is_list(obj):
            out += flatten(list_items(obj))
        elif isinstance(obj, dict):
            out.append(obj)
    return out


def shells_webhook_installed(objects: Iterable[Any]) -> bool:
    """Whether the objects hold runguard's shells webhook configuration."""
    return any(
        o.get("kind") == "ValidatingWebhookConfiguration"
        and meta_of(o).get("name") == SHELLS_CONFIGURATION
        for o in flatten(objects)
    )


@dataclass
class RbacReport:
    """The run namespaces looked at, and the findings in them (expected ones too)."""

    namespaces: list[str]
    findings: list[Finding]
    shells: bool

    def unexpected(self) -> list[Finding]:
        return [f for f in self.findings if not f.expected]

    def shown(self, include_expected: bool) -> list[Finding]:
        return self.findings if include_expected else self.unexpected()


def rbac_report(
    objects: Iterable[Any],
    platform: Platform,
    *,
    shells: bool,
    namespace: str | None = None,
) -> RbacReport:
    """Who holds each door's verbs in the run namespaces (``namespace`` only, when
    given), sorted by namespace (``*`` first), subject and door."""
    items = flatten(objects)
    run_namespaces = _run_namespaces(items, platform, namespace)
    roles = role_rules(o for o in items if o.get("kind") == "Role")
    cluster_roles = cluster_role_rules(o for o in items if o.get("kind") == "ClusterRole")
    doors = [d for d in DOORS if not (d.needs_shells_off and shells)]
    bindings = list(read_bindings(items))
    admins = cluster_admins(bindings)
    findings: dict[tuple[str, Subject, str], Finding] = {}
    for binding in bindings:
        if binding.namespace != CLUSTER_WIDE and binding.namespace not in run_namespaces:
            continue
        rules = bound_rules(binding, roles, cluster_roles)
        for door in doors:
            grants = list(_door_grants(door, rules, platform, binding.namespace))
            for subject in binding.subjects if grants else ():
                key = (binding.namespace, subject, door.id)
                found = findings.get(key)
                if found is None:
                    reason = expected(subject, platform, admins)
                    found = findings[key] = Finding(
                        binding.namespace, subject, door, expected=reason
                    )
                for grant in grants:
                    found.add(grant, binding)
    return RbacReport(sorted(run_namespaces), _held(findings.values()), shells)


def _run_namespaces(items: list[Any], platform: Platform, namespace: str | None) -> set[str]:
    """The namespaces the platform governs among the objects' (or ``namespace``, if it does)."""
    if namespace is not None:
        return {namespace} if platform.governs(namespace) else set()
    return {ns for ns in _namespaces(items) if platform.governs(ns)}


def _held(findings: Iterable[Finding]) -> list[Finding]:
    """The findings whose door the verbs open, by namespace (``*`` first), subject and door."""
    order = [d.id for d in DOORS]
    return sorted(
        (f for f in findings if f.door.held is None or f.door.held(f.verbs())),
        key=lambda f: (
            f.namespace != CLUSTER_WIDE,
            f.namespace,
            f.subject,
            order.index(f.door.id),
        ),
    )


def _door_grants(
    door: Door, rules: Iterable[Rule], platform: Platform, namespace: str
) -> Iterator[Grant]:
    cluster_wide = namespace == CLUSTER_WIDE
    for rule in rules:
        for resource in door.resources:
            if resource.cluster_scoped and not cluster_wide:
                continue  # a RoleBinding never grants a cluster-scoped resource
            if resource.account_namespaces and not (
                platform.account_namespaces
                if cluster_wide
                else namespace in platform.account_namespaces
            ):
                continue  # no platform account lives there
            verbs = rule.grants(resource)
            if not verbs:
                continue
            names = rule.names
            if resource.platform_names is not None:
                patterns = platform.names(resource.platform_names)
                if resource.platform_only and not patterns:
                    continue  # the platform names none of them
                if names:
                    names = _platform_named(names, patterns)
                    if not names:
                        continue  # narrowed to names that are not the platform's
            yield Grant(resource.resource, verbs, names)


def _platform_named(names: frozenset[str], patterns: tuple[str, ...]) -> frozenset[str]:
    regexes = [_pattern_regex(p) for p in patterns]
    return frozenset(n for n in names if any(r.fullmatch(n) for r in regexes))


# --- rendering -------------------------------------------------------------------------


def _row(f: Finding) -> dict[str, Any]:
    subject: dict[str, str] = {"kind": f.subject.kind, "name": f.subject.name}
    if f.subject.kind == "ServiceAccount":
        subject["namespace"] = f.subject.namespace
    return {
        "namespace": f.namespace,
        "subject": subject,
        "door": f.door.id,
        "title": f.door.title,
        "grants": [str(g) for g in f.grant_list()],
        "via": sorted(f.via),
        "expected": f.expected,
        "note": f.note,
    }


def to_rows(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [_row(f) for f in findings]


TABLE_HEADER = ("NAMESPACE", "SUBJECT", "DOOR", "GRANTS", "VIA")


def to_table(findings: Iterable[Finding]) -> str:
    """A row per finding; its note (or why it is expected) closes the line."""
    rows = [TABLE_HEADER]
    notes = [""]
    for f in findings:
        grants = f.grant_text()
        rows.append((f.namespace, str(f.subject), f.door.id, grants, ", ".join(sorted(f.via))))
        extra = [f"expected: {f.expected}"] if f.expected else []
        notes.append("  (" + "; ".join([*extra, *([f.note] if f.note else [])]) + ")"
                     if extra or f.note else "")  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER) - 1)]
    lines = []
    for row, note in zip(rows, notes, strict=True):
        cells = "  ".join(c.ljust(widths[i]) for i, c in enumerate(row[:-1]))
        lines.append(f"{cells}  {row[-1]}{note}".rstrip())
    return "\n".join(lines)


RBAC_CATEGORY, RBAC_SEVERITY = CONCERNS["rbac"].category, CONCERNS["rbac"].severity


def _result(f: Finding, when: dict[str, int]) -> dict[str, Any]:
    resources = []
    for binding in sorted(f.via.values(), key=str):
        ref = {"apiVersion": RBAC_API, "kind": binding.kind, "name": binding.name}
        if binding.namespace != CLUSTER_WIDE:
            ref["namespace"] = binding.namespace
        resources.append(ref)
    properties = {
        "subject": str(f.subject),
        "grants": f.grant_text(),
        **({"expected": f.expected} if f.expected else {}),
        **({"note": f.note} if f.note else {}),
    }
    return {
        "policy": REPORT_NAME,
        "rule": f.door.id,
        "result": f.result,
        "category": RBAC_CATEGORY,
        "severity": RBAC_SEVERITY,
        "source": SOURCE,
        "timestamp": dict(when),
        "scored": True,
        "resources": resources,
        "message": f.message(),
        "properties": properties,
    }


def _metadata(namespace: str | None) -> dict[str, Any]:
    """Every RBAC report's name and labels (``runguard.io/report: rbac``), and the
    namespace of a namespaced one."""
    return {
        "name": REPORT_NAME,
        **({"namespace": namespace} if namespace is not None else {}),
        "labels": {**REPORT_LABELS, REPORT_LABEL: "rbac"},
    }


def rbac_reports(
    form: ReportFormat, report: RbacReport, *, include_expected: bool = False, now: float = 0.0
) -> list[dict[str, Any]]:
    """The reports of ``form``: the cluster-scoped one of the grants every namespace
    holds (ClusterRoleBindings), then one per run namespace (an empty one where nothing
    was found: writing it replaces what an earlier report said)."""
    when = timestamp(now)
    by_namespace: dict[str, list[dict[str, Any]]] = {ns: [] for ns in report.namespaces}
    by_namespace.setdefault(CLUSTER_WIDE, [])
    for f in report.shown(include_expected):
        by_namespace.setdefault(f.namespace, []).append(_result(f, when))
    cluster = form.wrap(_metadata(None), by_namespace.pop(CLUSTER_WIDE))
    return [cluster, *(form.wrap(_metadata(ns), rs) for ns, rs in sorted(by_namespace.items()))]
