"""CEL: what the apiserver sends to runguard. The expressions of the webhooks'
``matchConditions``, rendered from the policy: its selectors, its name patterns, the
doors into a Pod, the operators' references and records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.engine.doors import CONTAINER_LISTS, CONTAINERS, DOORS, MAP_VALUES
from webhook.engine.rules.ownership import enabled as ownership_enabled
from webhook.engine.rules.ownership import (
    reserved_patterns,
    service_account_identities,
)
from webhook.engine.scope import run_terms
from webhook.install.names import (
    PLATFORM_OBJECT_GROUPS,
    PLATFORM_OBJECTS,
    ManifestError,
    _rule,
)
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import LabelSelector, NamePattern, Policy
from webhook.policy.patterns import split

# --- CEL: what the apiserver sends to runguard ------------------------------------------
#
# The expressions run in the apiserver's matchConditions environment, where `object` is
# untyped: every field that may be absent is read with optional selection (`a.?b`,
# `m[?k]`, `.orValue(default)`), so an absent field is never an evaluation error (an
# error fails the request, as the webhook's failurePolicy is Fail). The apiserver does
# not estimate their cost when it stores a configuration (1.33); at run time each
# expression is bounded (1,000,000 units, 2,500,000 for all of a webhook's conditions) and
# going over fails the request. Only names that are there cost much (a `matches` is
# priced by the name's length times the regex's): measured on 1.33 with the shipped
# policy, a Pod reading secrets that are not the platform's is refused from somewhere
# between 9,000 and 15,000 of them with 63-character names, 3,000 and 4,000 with 253
# (tests/e2e/test_routing.py keeps a point either side).

# The pod template of a controller: `spec.template`, or a CronJob's
# `spec.jobTemplate.spec.template`; `{}` when neither is there.
TEMPLATE = "object.spec.?template.or(object.spec.?jobTemplate.?spec.?template).orValue({})"
OLD_TEMPLATE = TEMPLATE.replace("object.spec", "oldObject.?spec")


@dataclass(frozen=True)
class _Join:
    """``parts`` joined by ``op`` (``||`` or ``&&``), one per line."""

    op: str
    parts: tuple[_Expr, ...]


@dataclass(frozen=True)
class _Exists:
    """The list ``items`` has an element ``var`` for which ``body`` holds."""

    items: str
    var: str
    body: _Expr


_Expr = str | _Join | _Exists


def _join(op: str, *parts: _Expr | None) -> _Expr | None:
    present: list[_Expr] = []
    for part in parts:
        if isinstance(part, _Join) and part.op == op:
            present.extend(part.parts)
        elif part is not None:
            present.append(part)
    if len(present) <= 1:
        return present[0] if present else None
    return _Join(op, tuple(present))


def _exists(items: str, var: str, body: _Expr | None, empty: str = "[]") -> _Exists | None:
    """``items`` is an optional list (absent: empty), or a map (``empty`` "{}": ``var`` is
    each key)."""
    return None if body is None else _Exists(f"{items}.orValue({empty})", var, body)


def _render(expr: _Expr, indent: str = "") -> str:
    """CEL text, a condition per line, nested ones indented (what an admin reads)."""
    if isinstance(expr, str):
        return expr
    if isinstance(expr, _Exists):
        inner = indent + "  "
        return f"{expr.items}.exists({expr.var},\n{inner}{_render(expr.body, inner)})"
    parts = []
    for part in expr.parts:
        if isinstance(part, _Join):  # the other operator (_join flattens the same one)
            parts.append(f"({_render(part, indent + ' ')})")
        else:
            parts.append(_render(part, indent))
    return f"\n{indent}{expr.op} ".join(parts)


def _cel_string(text: str) -> str:
    """``text`` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _selector(selector: LabelSelector, labels: str) -> _Expr | None:
    """The labels map ``labels`` (an expression, may be optional) matches ``selector``;
    None for the empty selector, which matches everything.

    Each requirement reads the label as an optional, ``labels[?key]``: absent is
    ``optional.none()``, which equals no ``optional.of(value)``. So ``In`` needs the
    label and ``NotIn`` matches an absent one, as in Kubernetes."""
    terms: list[_Expr | None] = []

    def label(key: str) -> str:
        return f"{labels}[?{_cel_string(key)}]"

    def one_of(values: Sequence[str]) -> str:
        return "[" + ", ".join(f"optional.of({_cel_string(v)})" for v in values) + "]"

    for key, value in selector.match_labels.items():
        terms.append(f"{label(key)} == optional.of({_cel_string(value)})")
    for requirement in selector.match_expressions:
        key, operator = requirement["key"], requirement["operator"]
        values = requirement.get("values") or []
        if operator == "In":
            terms.append(f"{label(key)} in {one_of(values)}")
        elif operator == "NotIn":
            terms.append(f"!({label(key)} in {one_of(values)})")
        elif operator == "Exists":
            terms.append(f"{label(key)}.hasValue()")
        elif operator == "DoesNotExist":
            terms.append(f"!{label(key)}.hasValue()")
        else:  # the schema allows no other: never route less than asked
            raise ManifestError(f"selector: unknown operator {operator!r}")
    return _join("&&", *terms)


def _runs(policy: Policy, labels: str) -> _Expr | None:
    """The labels, in the request's namespace, are a run of one of the policy's
    RunPolicies (``scope.selects`` of each: its namespaces, its selector); None when
    everything is a run (a RunPolicy with an empty selector that excludes nothing). The
    namespaces every RunPolicy excludes never reach the webhooks these conditions are
    on (``shared_namespace_selector``): only a RunPolicy's own are written."""
    declared = run_terms(policy)
    everyone = frozenset.intersection(*(excluded for excluded, _ in declared))
    terms = []
    for excluded, selector in declared:
        own = _namespace_outside(excluded - everyone)
        term = _join("&&", own, _selector(selector, labels))
        if term is None:
            return None
        terms.append(term)
    return _join("||", *terms)


def _namespace_outside(excluded: Iterable[str]) -> str | None:
    """CEL: the request's namespace is none of ``excluded`` (None: nothing excluded)."""
    names = sorted(excluded)
    if not names:
        return None
    return f"!(request.namespace in [{', '.join(_cel_string(n) for n in names)}])"


def selector_expression(selector: LabelSelector, labels: str) -> str | None:
    """CEL: the labels map ``labels`` (an expression) matches ``selector``; None for the
    empty selector."""
    expr = _selector(selector, labels)
    return None if expr is None else _render(expr)


def name_regex(patterns: Iterable[NamePattern]) -> str | None:
    """An RE2 regex (anchored, for CEL ``matches``) of the names the patterns give, for
    any run: ``{labels[KEY]}`` is any non-empty value, ``*`` any run of characters, as
    ``ownership.reserved_name`` reads them. None when there is no pattern."""
    alternatives = []
    for pattern in patterns:
        literals, _ = split(pattern.text)
        alternatives.append(".+".join(_literal_regex(literal) for literal in literals))
    if not alternatives:
        return None
    return "^(?:" + "|".join(dict.fromkeys(alternatives)) + ")$"


def _literal_regex(literal: str) -> str:
    if literal and set(literal) == {"*"}:
        # Any name; `.+` rather than `.*`, as a name is never empty and an absent one,
        # read as '', must match nothing.
        return ".+"
    out = []
    for char in literal:
        if char.isascii() and (char.isalnum() or char == "-"):
            out.append(char)
        elif char == "*":
            out.append(".*")
        elif char in "\\^]":
            out.append("\\" + char)
        else:
            out.append(f"[{char}]")  # `.` and anything else, literally, without escapes
    return "".join(out)


def _matches(value: str, regex: str | None) -> str | None:
    """The optional string ``value`` is there and matches ``regex`` (None: no regex)."""
    if regex is None:
        return None
    return f"{value}.orValue('').matches({_cel_string(regex)})"


# The CEL variable of each list the doors go through (readable, unique when nested).
_LIST_VARS = {
    "volumes": "v",
    "sources": "s",
    CONTAINERS: "c",
    "env": "e",
    "envFrom": "e",
    "imagePullSecrets": "r",
    "resourceClaims": "rc",
}
_DoorItem = tuple[tuple[str, ...], tuple[str, str] | None, str]  # rest of path, when, regex


def _doors(items: list[_DoorItem], base: str) -> _Expr | None:
    """CEL: one of the doors (paths below ``base``) names an object matching its regex."""
    groups: dict[str, list[_DoorItem]] = {}
    for path, when, regex in items:
        groups.setdefault(path[0], []).append((path[1:], when, regex))
    parts: list[_Expr | None] = []
    for head, rest in groups.items():
        if head == CONTAINERS:  # init, regular and ephemeral containers, as one list
            containers = " + ".join(f"{base}.?{n}.orValue([])" for n in CONTAINER_LISTS)
            body = _doors([(p[1:], w, r) for p, w, r in rest], "c")
            parts.append(None if body is None else _Exists(f"({containers})", "c", body))
        elif all(p == (MAP_VALUES,) for p, _, _ in rest):  # every value of a map
            values = f"{base}.?{head}"
            any_value = _join("||", *(_matches(f"{values}[?k]", r) for _, _, r in rest))
            parts.append(_exists(values, "k", any_value, empty="{}"))
        elif all(p[:1] == ("*",) for p, _, _ in rest):
            var = _LIST_VARS.get(head, head[0])
            parts.append(
                _exists(f"{base}.?{head}", var, _doors([(p[1:], w, r) for p, w, r in rest], var))
            )
        elif any(not p for p, _, _ in rest):
            for _, when, regex in rest:
                matched: _Expr | None = _matches(f"{base}.?{head}", regex)
                if when is not None:
                    key, value = when
                    matched = _join(
                        "&&", f"{base}.?{key}.orValue('') == {_cel_string(value)}", matched
                    )
                parts.append(matched)
        else:
            parts.append(_doors(rest, f"{base}.?{head}"))
    return _join("||", *parts)


def _name_regexes(policy: Policy) -> dict[str, str]:
    """kind -> the regex of every platform name of that kind, over every RunPolicy with
    ownership on (every RunPolicy's names are routed)."""
    out = {}
    for kind in ("PersistentVolumeClaim", "ConfigMap", "Secret", "ResourceClaim"):
        patterns = [
            pattern
            for p in policy.run_policies
            if ownership_enabled(p)
            for pattern in reserved_patterns(p, kind)
        ]
        regex = name_regex(patterns)
        if regex is not None:
            out[kind] = regex
    return out


def _references(policy: Policy, spec: str) -> _Expr | None:
    """The pod spec ``spec`` (an expression, may be optional) names an object with a
    platform name through one of ``webhook.engine.doors``' doors, or runs as one of the
    platform's ServiceAccounts; None when no RunPolicy reserves a name."""
    regexes = _name_regexes(policy)
    items: list[_DoorItem] = [
        (door.path, door.when, regexes[door.kind]) for door in DOORS if door.kind in regexes
    ]
    named = _doors(items, spec) if items else None
    accounts = sorted(
        {
            sa
            for p in policy.run_policies
            if ownership_enabled(p)
            for sa in service_account_identities(p)
        }
    )
    account = f"{spec}.?serviceAccountName.orValue({spec}.?serviceAccount.orValue(''))"
    runs_as = _join(
        "||",
        *(
            f"(request.namespace == {_cel_string(ns)} && {account} == {_cel_string(name)})"
            for ns, name in accounts
        ),
    )
    return _join("||", named, runs_as)


# Claims a controller makes for one Pod, owned by it (``webhook.engine.rules.podclaims``):
# no platform name tells them apart, so a pod spec naming any is routed.
_POD_OWNED_KINDS = ("PersistentVolumeClaim", "ResourceClaim")
_ANY_NAME = "^.+$"


def _names_a_claim(spec: str) -> _Expr | None:
    """CEL: the pod spec ``spec`` names an existing claim of any name, through the doors of
    the kinds a controller makes for one Pod: runguard reads whose the claim is."""
    items: list[_DoorItem] = [
        (door.path, door.when, _ANY_NAME) for door in DOORS if door.kind in _POD_OWNED_KINDS
    ]
    return _doors(items, spec)


def _records(policy: Policy, meta: str) -> str:
    """CEL: the metadata ``meta`` carries one of runguard's records (only runguard writes
    them, so an object carrying one is always sent to it): a stamp, or the label of one
    of these RunPolicies (another's name is inert to this runguard)."""
    names = ", ".join(f"optional.of({_cel_string(p.name)})" for p in policy.run_policies)
    return " || ".join(
        [
            f"{meta}.?annotations[?{_cel_string(REQUESTED_BY)}].hasValue()",
            f"{meta}.?annotations[?{_cel_string(PLATFORM_RECORD)}].hasValue()",
            f"{meta}.?labels[?{_cel_string(POLICY_LABEL)}] in [{names}]",
        ]
    )


def _records_kept(policy: Policy) -> str:
    """CEL: the object, or on UPDATE the old one, carries runguard's records: an update
    removing them reaches runguard, which puts them back."""
    was = _records(policy, "oldObject.?metadata")
    return f"{_records(policy, 'object.?metadata')} || (oldObject != null && ({was}))"


def references_expression(policy: Policy, spec: str) -> str | None:
    """CEL: the pod spec ``spec`` (an expression) names an object with a platform name:
    volumes (claims, configMaps, secrets, projected sources), each container's ``env``
    and ``envFrom`` (init, regular and ephemeral containers), ``imagePullSecrets``. None
    when the policy reserves no name."""
    expr = _references(policy, spec)
    return None if expr is None else _render(expr)


def _reserved(policy: Policy) -> dict[str, str]:
    """resource -> the regex of the names the platform reserves for it, if any: every
    pattern of every RunPolicy with ownership on, as ``ownership.reserved_name`` reads
    them (installation-wide names too)."""
    regexes = _name_regexes(policy)
    return {
        resource: regexes[kind] for resource, kind in PLATFORM_OBJECTS.items() if kind in regexes
    }


def _reserved_rules(resources: Iterable[str]) -> list[dict[str, Any]]:
    """The CREATE rules of the reserved-names webhook: one per API group."""
    groups: dict[str, list[str]] = {}
    for resource in resources:
        groups.setdefault(PLATFORM_OBJECT_GROUPS.get(resource, ""), []).append(resource)
    return [_rule(group, names, ["CREATE"]) for group, names in groups.items()]
