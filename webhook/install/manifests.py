"""The objects that put runguard in the admission path, rendered from a Policy.

``webhook_configurations(policy)`` returns the ``MutatingWebhookConfiguration`` and
``ValidatingWebhookConfiguration`` as dicts. They route to runguard only what it must
judge (fail closed, narrowly), and every webhook fails closed:

- Pods by ``objectSelector``, the policy's ``selector``;
- pod controllers (Jobs, CronJobs, Deployments, StatefulSets, ReplicaSets, DaemonSets,
  ReplicationControllers), whose run labels are in their pod *template*, where an
  ``objectSelector`` cannot look, by a CEL ``matchConditions`` rendered from the
  selector: the template's labels match it, or (ownership on, ``platform.identities``
  set) the template names one of the platform's claims, configMaps or secrets;
- with ownership on, Pods outside the selector that name the platform's objects
  (``ownership.not-a-run``), and the creation of a PVC, Secret or ConfigMap with a
  platform name (``ownership.reserved-name``), by CEL again.

Runguard's own namespace and the policy's ``excludeNamespaces`` are left out by
``namespaceSelector``. ``matchConditions`` are GA in Kubernetes 1.30: the configurations
need 1.30 or later. ``policy_config_map(files)`` is the ConfigMap the Deployment mounts
as its policy directory.

``generated_files`` renders both into the two files of the kustomize base in
``manifests/`` that are generated (``runguard manifests -p policies --write
manifests``), so what the apiserver routes and the policy runguard loads come from the
same ``policies/`` and a test fails when they disagree.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from webhook.engine.doors import CONTAINER_LISTS, CONTAINERS, DOORS, MAP_VALUES
from webhook.engine.rules.operators import plural
from webhook.engine.rules.ownership import (
    SNAPSHOT_GROUP,
    TOKEN_ACCOUNT_ANNOTATION,
    TOKEN_SECRET_TYPE,
    reserved_patterns,
    service_account_identities,
)
from webhook.engine.rules.ownership import enabled as ownership_enabled
from webhook.engine.scope import run_terms
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import LabelSelector, NamePattern, Policy
from webhook.policy.patterns import split

__all__ = [
    "CONFIG_MAP_FILE",
    "CONFIG_MAP_NAME",
    "CONFIGURATION_NAME",
    "CONTROLLERS_WEBHOOK",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "MIN_KUBERNETES",
    "MUTATING_CONTROLLERS_WEBHOOK",
    "MUTATING_REFERENCES_WEBHOOK",
    "MUTATING_WEBHOOK",
    "PLATFORM_OBJECTS",
    "POD_CONTROLLERS",
    "REQUIRES",
    "RESERVED_NAMES_WEBHOOK",
    "POD_TOKENS_WEBHOOK",
    "SHELLS_WEBHOOK",
    "SHELLS_WEBHOOK_FILE",
    "VALIDATING_REFERENCES_WEBHOOK",
    "VALIDATING_WEBHOOK",
    "WEBHOOKS_FILE",
    "ManifestError",
    "controller_condition",
    "generated_files",
    "mutating_webhook_configuration",
    "name_regex",
    "operator_condition",
    "policy_config_map",
    "read_policy_files",
    "references_expression",
    "reserved_name_condition",
    "reserved_rules",
    "selector_expression",
    "shells_webhook_configuration",
    "to_yaml",
    "validating_webhook_configuration",
    "webhook_configurations",
]

DEFAULT_NAMESPACE = "runguard"
DEFAULT_SERVICE = "runguard"
SERVICE_PORT = 443
CONFIGURATION_NAME = "runguard"
# matchConditions are GA (on by default, and their CEL environment with optional
# types, `?.` and `orValue`) from this version on.
MIN_KUBERNETES = "1.30"
# Run Pods, by objectSelector.
MUTATING_WEBHOOK = "mutate.runguard.io"
VALIDATING_WEBHOOK = "validate.runguard.io"
# Pod controllers whose template is a run's or names the platform's objects, by CEL
# (the template is out of an objectSelector's sight). Mutated only to be stamped.
MUTATING_CONTROLLERS_WEBHOOK = "mutate-controllers.runguard.io"
CONTROLLERS_WEBHOOK = "validate-controllers.runguard.io"
# Ownership on: Pods outside the selector naming the platform's objects (stamped at
# CREATE, judged by ownership.not-a-run), and objects created with a platform name.
MUTATING_REFERENCES_WEBHOOK = "mutate-references.runguard.io"
VALIDATING_REFERENCES_WEBHOOK = "validate-references.runguard.io"
RESERVED_NAMES_WEBHOOK = "validate-reserved-names.runguard.io"
# Platform operators' objects (Argo Workflows, RayClusters, ...), by kind.
MUTATING_OPERATORS_WEBHOOK = "mutate-operators.runguard.io"
OPERATORS_WEBHOOK = "validate-operators.runguard.io"
MUTATE_PATH, VALIDATE_PATH = "/mutate", "/validate"
CONFIG_MAP_NAME = "runguard-policies"
# Pod subresources that change a Pod's spec after creation: each is a door into a running
# run (``kubectl debug`` adds containers, ``pods/resize`` changes resources), so each is
# routed to runguard. The e2e suite reads the real apiserver's list and fails on a new one.
POD_SPEC_SUBRESOURCES = ("pods/ephemeralcontainers", "pods/resize")
# The status subresource of a Pod and of every pod controller may change labels,
# annotations and (except a Pod's) ownerReferences: the apiserver's status strategies put
# back only the spec. So it is routed too, but only when it changes one of them (the
# ``status-changes-metadata`` condition): the kubelet's and the controllers' status
# updates never wait on runguard.
STATUS = "status"
POD_STATUS = f"pods/{STATUS}"
STATUS_METADATA = {"labels": "{}", "annotations": "{}", "ownerReferences": "[]"}
WEBHOOKS_FILE = "webhooks.yaml"
CONFIG_MAP_FILE = "policy-configmap.yaml"
# The policy-objects component: RunPolicy and Profile as custom resources (its CRDs and
# the webhook that checks them are generated; its kustomization and RBAC are written).
POLICY_OBJECTS_DIR = "policy-objects"
POLICY_WEBHOOK_FILE = f"{POLICY_OBJECTS_DIR}/webhook.yaml"
POLICY_WEBHOOK = "validate-policies.runguard.io"
POLICY_CONFIGURATION_NAME = "runguard-policies"
VALIDATE_POLICY_PATH = "/validate-policy"
# The cluster-state component: a shell opened into a Pod (``kubectl exec``, ``attach``:
# CONNECT, whose object is the command, not the Pod) is judged on the Pod runguard reads
# with that component's credentials, so its webhook ships with them.
SHELLS_WEBHOOK_FILE = "cluster-state/shells-webhook.yaml"
SHELLS_WEBHOOK = "validate-shells.runguard.io"
POD_TOKENS_WEBHOOK = "validate-pod-tokens.runguard.io"
SHELLS_CONFIGURATION_NAME = "runguard-shells"
# Doors into a running Pod (``webhook.engine.rules.trust.SHELLS``), and the token a
# TokenRequest binds to a Pod (which its bearer could present as that Pod's).
# A Service's proxy reaches the Pods behind it (judged on each).
SHELL_SUBRESOURCES = (
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "pods/proxy",
    "services/proxy",
)
TOKEN_SUBRESOURCE = "serviceaccounts/token"
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
LABELS = {"app.kubernetes.io/name": "runguard", "app.kubernetes.io/part-of": "runguard"}
# Lets an admin apply everything else first: `kubectl apply -k manifests/ -l
# 'app.kubernetes.io/component!=admission'`, then the webhooks once runguard is Ready.
ADMISSION_LABELS = {**LABELS, "app.kubernetes.io/component": "admission"}

# The pod controllers whose templates runguard judges, by API group (every kind
# webhook.engine.podspec finds a template in).
POD_CONTROLLERS = {
    "apps": ("deployments", "statefulsets", "replicasets", "daemonsets"),
    "batch": ("jobs", "cronjobs"),
    "": ("replicationcontrollers",),
}
# The objects whose names the platform's patterns reserve: resource -> kind (the kind
# ownership.reserved_patterns knows them by).
PLATFORM_OBJECTS = {
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "secrets": "Secret",
    "configmaps": "ConfigMap",
    "resourceclaims": "ResourceClaim",
}
# The API group of those outside the core group (v1: resource.k8s.io from Kubernetes 1.34,
# where dynamic resource allocation is on by default; matchPolicy Equivalent sends a
# v1beta2 request too, converted).
PLATFORM_OBJECT_GROUPS = {"resourceclaims": "resource.k8s.io"}


class ManifestError(Exception):
    """An input the manifests cannot be rendered from (a bad --url, a bad CA bundle)."""


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
    on (``namespace_selector(shared=True)``): only a RunPolicy's own are written."""
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
            for p in policy.run_policies()
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
            for p in policy.run_policies()
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
    names = ", ".join(f"optional.of({_cel_string(p.name)})" for p in policy.run_policies())
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


def _condition(name: str, expression: _Expr) -> dict[str, str]:
    return {"name": name, "expression": _render(expression)}


def _any_ownership(policy: Policy) -> bool:
    return any(ownership_enabled(p) for p in policy.run_policies())


def controller_condition(policy: Policy) -> dict[str, str] | None:
    """The controllers' matchCondition: the template is a run's (or, on UPDATE, was), or
    (ownership on) names the platform's objects, or the object carries runguard's records.
    None when every controller qualifies (empty selector)."""
    run = _runs(policy, "t.?metadata.?labels")
    was = _runs(policy, "o.?metadata.?labels")
    if run is None or was is None:
        return None
    references = (
        _join("||", _references(policy, "t.?spec"), _names_a_claim("t.?spec"))
        if _any_ownership(policy)
        else None
    )
    name = "run-template" if references is None else "run-template-or-platform-names"
    either = _join("||", run, references)
    assert either is not None
    # A one-element list binds the template to `t` (this CEL has no `let`).
    claims = _ANY_NAME if references else None  # a claim template cloning any claim
    routed = _join(
        "||",
        _Exists(f"[{TEMPLATE}]", "t", either),
        None
        if claims is None
        else _exists("object.spec.?volumeClaimTemplates", "ct", _clones("ct.?spec", claims)),
        f"(oldObject != null && {_render(_Exists(f'[{OLD_TEMPLATE}]', 'o', was))})",
        _records_kept(policy),
        _policy_label_in_template(),
    )
    assert routed is not None
    return _condition(name, routed)


def _policy_label_in_template() -> str:
    """CEL: a controller templates or selects its Pods by runguard's RunPolicy label
    (``scope.labels``: the label is runguard's to write on each Pod)."""
    label = _cel_string(POLICY_LABEL)
    return (
        f"{TEMPLATE}.?metadata.?labels[?{label}].hasValue()"
        f" || object.spec.?selector.?matchLabels[?{label}].hasValue()"
        f" || object.spec.?selector.?matchExpressions.orValue([]).exists(e,"
        f" e.?key.orValue('') == {label})"
    )


def _pod_reference_conditions(policy: Policy) -> list[dict[str, str]] | None:
    """A Pod outside every selector that names the platform's objects or runs as its
    ServiceAccount (ownership on), or carries runguard's records. None when every Pod is
    a run (empty selector)."""
    run = _runs(policy, "object.metadata.?labels")
    if run is None:
        return None
    references = (
        _join("||", _references(policy, "object.spec"), _names_a_claim("object.spec"))
        if _any_ownership(policy)
        else None
    )
    either = _join("||", references, _records_kept(policy))
    assert either is not None
    return [
        _condition("not-a-run", f"!({_render(run, ' ')})"),
        _condition("platform-names-or-records", either),
    ]


def reserved_name_condition(policy: Policy) -> dict[str, str] | None:
    """Ownership on: a PVC, Secret, ConfigMap or ResourceClaim created with a name a
    platform pattern gives (placeholders as wildcards). None when the policy reserves no
    name."""
    if not _any_ownership(policy):
        return None
    alternatives = [
        f"request.resource.resource == {_cel_string(resource)}"
        f" && object.metadata.?name.orValue('').matches({_cel_string(regex)})"
        for resource, regex in _reserved(policy).items()
    ]
    # A new claim cloning, or a snapshot of, a claim of any name: a platform one, or one
    # made for a Pod (whose owner runguard reads from its cache).
    alternatives.append(
        "request.resource.resource == 'persistentvolumeclaims' && ("
        + _render(_clones("object.?spec", _ANY_NAME))
        + ")"
    )
    alternatives.append(
        "request.resource.resource == 'volumesnapshots'"
        " && object.?spec.?source.?persistentVolumeClaimName.orValue('')"
        f".matches({_cel_string(_ANY_NAME)})"
    )
    created = _join("||", *alternatives)
    if created is not None:  # the token Secrets' rule routes UPDATEs of Secrets too
        created = _join("&&", "request.operation == 'CREATE'", created)
    expr = _join("||", created, _token_secret(policy))
    return None if expr is None else _condition("platform-name", expr)


def _token_accounts(policy: Policy) -> list[tuple[str, str]]:
    """(namespace, name) of the platforms' and operators' ServiceAccounts, over every
    RunPolicy with ownership on."""
    return sorted(
        {sa for p in policy.run_policies() if ownership_enabled(p)
         for sa in service_account_identities(p)}
    )  # fmt: skip


def _token_secret(policy: Policy) -> str | None:
    """CEL: a Secret of type ``kubernetes.io/service-account-token`` for a platform's or
    operator's ServiceAccount (``ownership.service-account``), created or, on UPDATE,
    newly naming it (the token controller filling one in keeps its name). None when
    the platforms name no ServiceAccount."""
    accounts = _token_accounts(policy)
    if not accounts:
        return None
    named = f"object.metadata.?annotations[?{_cel_string(TOKEN_ACCOUNT_ANNOTATION)}].orValue('')"
    was = named.replace("object.metadata", "oldObject.?metadata")
    which = " || ".join(
        f"request.namespace == {_cel_string(ns)} && {named} == {_cel_string(name)}"
        for ns, name in accounts
    )
    return (
        "request.resource.resource == 'secrets'"
        f" && object.?type.orValue('') == {_cel_string(TOKEN_SECRET_TYPE)}"
        f" && ({which})"
        f" && (oldObject == null || {was} != {named})"
    )


def reserved_rules(policy: Policy) -> list[dict[str, Any]]:
    """The rules of the reserved-names webhook: CREATE of the objects the platform names,
    of PVCs (clones) and VolumeSnapshots whenever ownership is on (a claim made for a Pod
    is that Pod's, whatever its name); CREATE and UPDATE of Secrets when it names
    ServiceAccounts (their token Secrets)."""
    reserved = _reserved(policy)
    if _any_ownership(policy) and "persistentvolumeclaims" not in reserved:
        reserved = {**reserved, "persistentvolumeclaims": ""}  # clones of a Pod's claim
    rules = _reserved_rules(reserved)
    if _any_ownership(policy):
        rules.append(_rule(SNAPSHOT_GROUP, ["volumesnapshots"], ["CREATE"]))
    if _token_accounts(policy):
        rules.append(_rule("", ["secrets"], ["CREATE", "UPDATE"]))
    return rules


def _clones(spec: str, claims: str) -> _Expr:
    """CEL: the claim spec ``spec`` clones a claim whose name matches ``claims``."""
    parts = [
        f"({spec}.?{key}.?kind.orValue('') == 'PersistentVolumeClaim'"
        f" && {spec}.?{key}.?name.orValue('').matches({_cel_string(claims)}))"
        for key in ("dataSource", "dataSourceRef")
    ]
    joined = _join("||", *parts)
    assert joined is not None
    return joined


# --- the webhooks ---------------------------------------------------------------------


def _client_config(
    path: str, namespace: str, service: str, ca_bundle: bytes | None, url: str | None
) -> dict[str, Any]:
    config: dict[str, Any]
    if url is not None:
        config = {"url": url.rstrip("/") + path}
    else:
        config = {
            "service": {"name": service, "namespace": namespace, "path": path, "port": SERVICE_PORT}
        }
    if ca_bundle is not None:
        config["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    return config


def _rule(group: str, resources: Iterable[str], operations: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["v1"],
        "operations": operations,
        "resources": list(resources),
        "scope": "Namespaced",
    }


def _operator_rules(policy: Policy) -> list[dict[str, Any]]:
    """The operators' kinds (``platform.operators``), stamped at CREATE and kept on
    UPDATE, so that their Pods' ownership can follow them."""
    by_group: dict[str, list[str]] = {}
    for p in policy.run_policies():
        if ownership_enabled(p):
            for group_kind in sorted(p.platform.operator_kinds):
                group, _, kind = group_kind.rpartition("/")
                if group:  # a core kind (Pod) is sent to runguard as a run already
                    by_group.setdefault(group, []).append(plural(kind))
    # status: runguard's records put back (status_condition: only when the metadata
    # changes); scale: the object it scales is judged (only the platform scales its own)
    return [
        {
            **_rule(
                group,
                [f"{r}{sub}" for r in sorted(set(resources)) for sub in ("", "/status", "/scale")],
                ["CREATE", "UPDATE"],
            ),
            "apiVersions": ["*"],
        }
        for group, resources in sorted(by_group.items())
    ]


# A map key CEL cannot select as a field (`a.?in` does not parse): read as `a[?'in']`.
_CEL_RESERVED = frozenset(
    "as break const continue else false for function if import in let loop package "
    "namespace null return true var void while".split()
)
_CEL_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _field_set(base: str, steps: Sequence[str], depth: int = 0) -> str:
    """CEL: the optional ``base`` has a value at ``steps`` (``*``: some item of a list)."""
    expr = base
    for i, step in enumerate(steps):
        if step == "*":
            var = f"x{depth}"
            rest = _field_set(f"optional.of({var})", steps[i + 1 :], depth + 1)
            return f"{expr}.orValue([]).exists({var}, {rest})"
        if _CEL_FIELD.fullmatch(step) and step not in _CEL_RESERVED:
            expr += f".?{step}"
        else:
            expr += f"[?{_cel_string(step)}]"
    return f"{expr}.hasValue()"


def _template_runs(policy: Policy, base: str, steps: Sequence[str], depth: int = 0) -> _Expr | None:
    """CEL: some pod template at ``steps`` below the optional ``base`` (``*``: any item of
    a list or value of a map) has the labels of a run (``_runs``)."""
    expr = base
    for i, step in enumerate(steps):
        if step == "*":
            var, each = f"k{depth}", f"t{depth}"
            # a map's key (a string) stands for its value; anything else is a list's item
            whole = f"{expr}.value()"
            value = f"(type({whole}) == map ? {whole}[{var}] : {{}})"
            item = f"[type({var}) == string ? {value} : {var}]"
            rest = _template_runs(policy, f"optional.of({each})", steps[i + 1 :], depth + 1)
            return _exists(expr, var, None if rest is None else _Exists(item, each, rest))
        if _CEL_FIELD.fullmatch(step) and step not in _CEL_RESERVED:
            expr += f".?{step}"
        else:
            expr += f"[?{_cel_string(step)}]"
    return _runs(policy, f"{expr}.?metadata.?labels")


def _requested_by(identities: Iterable[str]) -> _Expr | None:
    """CEL: the request's user is one of ``identities`` (typed as the engine reads them:
    ``group:NAME`` among the groups, ``serviceaccount:NS:NAME`` its user name)."""
    identities = list(identities)
    users = sorted(
        {
            "system:" + i if i.startswith("serviceaccount:") else i
            for i in identities
            if not i.startswith("group:")
        }
    )
    groups = sorted({i.removeprefix("group:") for i in identities if i.startswith("group:")})
    return _join(
        "||",
        None
        if not users
        else f"request.userInfo.username in [{', '.join(map(_cel_string, users))}]",
        *(f"{_cel_string(g)} in request.userInfo.?groups.orValue([])" for g in groups),
    )


def _of_kind(group_kind: str) -> str:
    group, _, kind = group_kind.rpartition("/")
    return f"request.kind.group == {_cel_string(group)} && request.kind.kind == {_cel_string(kind)}"


def operator_condition(policy: Policy) -> dict[str, str] | None:
    """The operators' matchCondition: an object of their kinds reaches runguard only when
    it matters. It is a run (a RunPolicy's selector, now or in its old form); it carries
    or claims runguard's records (now or before: only runguard writes them); the platform
    or an installer asks, or a controller or operator creates it (runguard records whose
    it is); it sets a field that names or selects another object (``references``: whose
    that object is, only the cache knows); its kind's operator keys on reserved labels
    (anywhere in it: every one is judged); or it is scaled by someone its platform does
    not let scale its objects (a Scale carries no labels). None when every object is a
    run."""
    run = _runs(policy, "object.metadata.?labels")
    was = _runs(policy, "oldObject.metadata.?labels")
    if run is None or was is None:
        return None
    owned = [p for p in policy.run_policies() if ownership_enabled(p)]
    references = [
        f"({_of_kind(kind)} && {_field_set('object', r.steps)})"
        for p in owned
        for kind, declared in sorted(p.platform.references.items())
        for _, r in declared
    ]
    reserved = [
        f"({_of_kind(kind)})"
        for p in owned
        for o in p.platform.operators
        if o.reserved_labels
        for kind in o.kinds
        if "/" in kind
    ]
    exempt = [
        _requested_by([*p.platform.identities, *p.platform.installers, *p.platform.owner_kinds])
        for p in owned
    ]
    everyone_exempt = _join("&&", *dict.fromkeys(e if e is not None else "false" for e in exempt))
    scaled = (
        None
        if not owned
        else _join(
            "&&",
            "request.?subResource.orValue('') == 'scale'",
            None if everyone_exempt is None else f"!({_render(everyone_exempt, ' ')})",
        )
    )
    # (a controller or operator creating one for an owner: runguard records whose it is)
    creators = _requested_by(k for p in owned for k in p.platform.owner_kinds)
    # (created with a run's pod template: /mutate writes the profile into it)
    templated = [
        _join("&&", "request.operation == 'CREATE'", _of_kind(kind), template)
        for p in owned
        for kind, entry in sorted(p.platform.templates.items())
        for steps in entry.steps
        if (template := _template_runs(policy, "object", steps)) is not None
    ]
    routed = _join(
        "||",
        run,
        f"(oldObject != null && ({_render(was, ' ')}))",
        _records(policy, "object.?metadata"),
        f"(oldObject != null && ({_records(policy, 'oldObject.?metadata')}))",
        _requested_by(i for p in owned for i in (*p.platform.identities, *p.platform.installers)),
        None if creators is None else _join("&&", "request.operation == 'CREATE'", creators),
        *dict.fromkeys(references),
        *dict.fromkeys(templated),
        *dict.fromkeys(reserved),
        scaled,
    )
    assert routed is not None
    return _condition("run-records-platform-or-references", routed)


def _controller_rules(operations: list[str]) -> list[dict[str, Any]]:
    return [
        _rule(group, [*resources, *(f"{r}/{STATUS}" for r in resources)], operations)
        for group, resources in POD_CONTROLLERS.items()
    ]


def status_condition() -> dict[str, str]:
    """A request through a ``status`` subresource reaches runguard only when it changes
    what runguard judges of the object's metadata (an UPDATE: ``oldObject`` is there)."""
    changed = " ||\n".join(
        f"object.metadata.?{key}.orValue({empty}) != oldObject.metadata.?{key}.orValue({empty})"
        for key, empty in STATUS_METADATA.items()
    )
    return {
        "name": "status-changes-metadata",
        "expression": f"request.?subResource.orValue('') != {_cel_string(STATUS)} ||\n{changed}",
    }


def namespace_selector(policy: Policy, namespace: str, *, shared: bool = False) -> dict[str, Any]:
    """Every namespace but runguard's own (it must start without itself) and the excluded:
    a RunPolicy's own, or, ``shared`` by every RunPolicy (the webhooks without an
    objectSelector), only what all of them exclude (one's exclusion is not another's)."""
    left_out = (
        set.intersection(*(set(p.exclude_namespaces) for p in policy.run_policies()))
        if shared
        else set(policy.exclude_namespaces)
    )
    excluded = sorted({namespace, *left_out})
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": excluded}]}


class _Target:
    """Where the webhooks call runguard, and which namespaces they leave out."""

    def __init__(
        self,
        policy: Policy,
        namespace: str,
        service: str,
        ca_bundle: bytes | None,
        url: str | None,
    ) -> None:
        _check_inputs(ca_bundle, url)
        self.policy = policy
        self.namespace = namespace
        self.service = service
        self.ca_bundle = ca_bundle
        self.url = url

    def webhook(
        self,
        name: str,
        path: str,
        rules: list[dict[str, Any]],
        *,
        object_selector: Policy | None = None,
        conditions: Sequence[Mapping[str, str]] = (),
        mutating: bool = False,
    ) -> dict[str, Any]:
        hook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": _client_config(
                path, self.namespace, self.service, self.ca_bundle, self.url
            ),
            "rules": rules,
            "failurePolicy": "Fail",  # every webhook: what reaches runguard waits for it
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "namespaceSelector": (
                namespace_selector(object_selector, self.namespace)
                if object_selector is not None
                else namespace_selector(self.policy, self.namespace, shared=True)
            ),
        }
        if object_selector is not None:
            hook["objectSelector"] = object_selector.selector.to_dict()
        if conditions:
            hook["matchConditions"] = [dict(c) for c in conditions]
        if mutating:
            # Mutation is idempotent, so running again after other mutating webhooks is safe.
            hook["reinvocationPolicy"] = "IfNeeded"
        return hook


def _check_inputs(ca_bundle: bytes | None, url: str | None) -> None:
    if url is not None:
        parts = urlsplit(url)
        # The apiserver only calls https URLs, and rejects user info, queries and fragments.
        if parts.scheme != "https" or not parts.hostname:
            raise ManifestError(f"--url must be an https:// URL with a host, not {url!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ManifestError(f"--url must have no user, query or fragment: {url!r}")
    if ca_bundle is not None and b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        raise ManifestError("the CA bundle holds no PEM certificate")


def _per_run_policy(name: str, run_policy: Policy, index: int) -> str:
    """The Pod webhook of each RunPolicy (an objectSelector cannot OR selectors): the first
    keeps the plain name, the others carry their RunPolicy's (``mutate-NAME.runguard.io``)."""
    if index == 0:
        return name
    first, _, rest = name.partition(".")
    return f"{first}-{run_policy.name}.{rest}"


def _conditions(condition: Mapping[str, str] | None) -> list[Mapping[str, str]]:
    """``condition`` (if any) and the status condition: every webhook below routes a
    ``status`` subresource."""
    return [*([condition] if condition is not None else []), status_condition()]


def _configuration(
    kind: str, hooks: list[dict[str, Any]], name: str = CONFIGURATION_NAME
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": dict(ADMISSION_LABELS)},
        "webhooks": hooks,
    }


def mutating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Run Pods are mutated on CREATE; on UPDATE runguard only puts back the running spec
    (``kubectl apply`` re-sending the user's manifest), since a Pod's spec is immutable.
    Run controllers, and Pods outside the selector naming the platform's objects, are
    only stamped (``runguard.io/requested-by``), at CREATE."""
    target = _Target(policy, namespace, service, ca_bundle, url)
    hooks = [
        target.webhook(
            _per_run_policy(MUTATING_WEBHOOK, run_policy, i),
            MUTATE_PATH,
            # ephemeralcontainers: a debug container added with `kubectl debug` is hardened;
            # status: runguard's records put back
            [_rule("", ["pods", "pods/ephemeralcontainers", POD_STATUS], ["CREATE", "UPDATE"])],
            object_selector=run_policy,
            conditions=_conditions(None),
            mutating=True,
        )
        for i, run_policy in enumerate(policy.run_policies())
    ]
    hooks += [
        target.webhook(
            MUTATING_CONTROLLERS_WEBHOOK,
            MUTATE_PATH,
            # UPDATE: runguard's records are put back (a controller copying its parent's
            # annotations cannot change them)
            _controller_rules(["CREATE", "UPDATE"]),
            conditions=_conditions(controller_condition(policy)),
            mutating=True,
        ),
    ]
    operators = _operator_rules(policy)
    if operators:
        hooks.append(
            target.webhook(
                MUTATING_OPERATORS_WEBHOOK,
                MUTATE_PATH,
                operators,
                conditions=_conditions(operator_condition(policy)),
                mutating=True,
            )
        )
    references = _pod_reference_conditions(policy)
    if references is not None:
        hooks.append(
            target.webhook(
                MUTATING_REFERENCES_WEBHOOK,
                MUTATE_PATH,
                [_rule("", ["pods", POD_STATUS], ["CREATE", "UPDATE"])],
                conditions=[*references, status_condition()],
                mutating=True,
            )
        )
    return _configuration("MutatingWebhookConfiguration", hooks)


def validating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Run Pods (objectSelector), the controllers whose template is a run's or names the
    platform's objects, and with ownership on, Pods outside the selector naming them and
    objects created with a platform name (CEL matchConditions). All fail closed."""
    target = _Target(policy, namespace, service, ca_bundle, url)
    ops = ["CREATE", "UPDATE"]
    hooks = [
        target.webhook(
            _per_run_policy(VALIDATING_WEBHOOK, run_policy, i),
            VALIDATE_PATH,
            [_rule("", ["pods", *POD_SPEC_SUBRESOURCES, POD_STATUS], ops)],
            object_selector=run_policy,
            conditions=_conditions(None),
        )
        for i, run_policy in enumerate(policy.run_policies())
    ]
    hooks += [
        # On UPDATE the condition reads the new object: an object entering the scope is
        # judged (ownership.stamp); one leaving it no longer matters to runguard.
        target.webhook(
            CONTROLLERS_WEBHOOK,
            VALIDATE_PATH,
            _controller_rules(ops),
            conditions=_conditions(controller_condition(policy)),
        ),
    ]
    operators = _operator_rules(policy)
    if operators:
        hooks.append(
            target.webhook(
                OPERATORS_WEBHOOK,
                VALIDATE_PATH,
                operators,
                conditions=_conditions(operator_condition(policy)),
            )
        )
    references = _pod_reference_conditions(policy)
    if references is not None:
        # UPDATE too: the stamp must not change, and `kubectl debug` must not add a
        # container naming the platform's objects to a Pod that is not the platform's.
        hooks.append(
            target.webhook(
                VALIDATING_REFERENCES_WEBHOOK,
                VALIDATE_PATH,
                [_rule("", ["pods", *POD_SPEC_SUBRESOURCES, POD_STATUS], ops)],
                conditions=[*references, status_condition()],
            )
        )
    reserved = reserved_name_condition(policy)
    if reserved is not None:
        hooks.append(
            target.webhook(
                RESERVED_NAMES_WEBHOOK,
                VALIDATE_PATH,
                reserved_rules(policy),  # a name never changes: CREATE only, but tokens
                conditions=[reserved],
            )
        )
    return _configuration("ValidatingWebhookConfiguration", hooks)


def webhook_configurations(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> list[dict[str, Any]]:
    """The mutating then the validating configuration (``ManifestError`` on bad input)."""
    kw: dict[str, Any] = {
        "namespace": namespace,
        "service": service,
        "ca_bundle": ca_bundle,
        "url": url,
    }
    return [
        mutating_webhook_configuration(policy, **kw),
        validating_webhook_configuration(policy, **kw),
    ]


def policy_object_webhook(
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the policy objects: every RunPolicy,
    Profile and project's ProjectProfile created or updated is checked by runguard as
    ``runguard lint`` checks files (``/validate-policy``), and refused with the errors,
    each naming its key."""
    from webhook.policy.crd import GROUP, NAMESPACED, PLURALS, VERSION

    _check_inputs(ca_bundle, url)
    hook = {
        "name": POLICY_WEBHOOK,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(VALIDATE_POLICY_PATH, namespace, service, ca_bundle, url),
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": ["CREATE", "UPDATE"],
                "resources": [p for k, p in PLURALS.items() if (k in NAMESPACED) == namespaced],
                "scope": "Namespaced" if namespaced else "Cluster",
            }
            for namespaced in (False, True)
        ],
        "failurePolicy": "Fail",  # a policy object nobody checked never reaches the mirror
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
    }
    return _configuration("ValidatingWebhookConfiguration", [hook], POLICY_CONFIGURATION_NAME)


def shells_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the doors into a running Pod: ``kubectl
    exec``, ``attach``, ``port-forward``, ``pods/proxy`` and ``services/proxy`` (CONNECT),
    judged on the Pod, each Pod the Service reaches (``ownership.debug``: a Pod of the
    platform's is the platform's to open), and a token
    bound to a Pod (CREATE of ``serviceaccounts/token`` with a Pod as ``boundObjectRef``;
    the kubelets' own, group ``system:nodes``, never wait on runguard). An objectSelector
    cannot see the Pod (the object is ``PodExecOptions`` or a ``TokenRequest``), so every
    one in the namespaces some platform governs reaches runguard, and waits on it: fail
    closed, as a debug container. No webhook when no RunPolicy has a platform
    (``platform.identities``)."""
    target = _Target(policy, namespace, service, ca_bundle, url)
    hooks = []
    if _any_ownership(policy):
        pod_bound = _condition(
            "token-bound-to-a-pod",
            _join(
                "&&",
                "!('system:nodes' in request.userInfo.groups)",
                "object.?spec.?boundObjectRef.?kind.orValue('') == 'Pod'",
            )
            or "",
        )
        hooks = [
            target.webhook(
                SHELLS_WEBHOOK, VALIDATE_PATH, [_rule("", SHELL_SUBRESOURCES, ["CONNECT"])]
            ),
            target.webhook(
                POD_TOKENS_WEBHOOK,
                VALIDATE_PATH,
                [_rule("", [TOKEN_SUBRESOURCE], ["CREATE"])],
                conditions=[pod_bound],
            ),
        ]
    return _configuration("ValidatingWebhookConfiguration", hooks, SHELLS_CONFIGURATION_NAME)


def policy_object_files(namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """The generated files of the policy-objects component: the two CRDs (their schema
    generated from the policy model) and the webhook configuration that checks them."""
    from webhook.policy.crd import CRD_FILES, policy_crds

    files = {
        f"{POLICY_OBJECTS_DIR}/{CRD_FILES[crd['spec']['names']['kind']]}": to_yaml(
            [crd], _CRD_HEADER
        )
        for crd in policy_crds()
    }
    files[POLICY_WEBHOOK_FILE] = to_yaml([policy_object_webhook(namespace=namespace)], _HEADER)
    return files


OPERATORS_RBAC_FILE = "cluster-state/operators-rbac.yaml"
OPERATORS_ROLE = "runguard-cluster-state-operators"


def operators_watch_rbac(policy: Policy) -> list[dict[str, Any]]:
    """The cluster-state component's ClusterRole for the operators' kinds the policy names
    (get, list, watch: the watch cache follows an operator's Pods to its custom
    resources, or to the Pods that created them: ``pods`` in the core group ""), and its
    binding to the webhook's ServiceAccount."""
    by_group: dict[str, set[str]] = {}
    for p in policy.run_policies():
        if ownership_enabled(p):
            for group_kind in p.platform.operator_kinds:
                group, _, kind = group_kind.rpartition("/")
                by_group.setdefault(group, set()).add(plural(kind))
    rules = [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": ["get", "list", "watch"]}
        for group, resources in sorted(by_group.items())
    ]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
         "metadata": {"name": OPERATORS_ROLE, "labels": dict(LABELS)}, "rules": rules},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": OPERATORS_ROLE, "labels": dict(LABELS)},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": OPERATORS_ROLE},
         # its namespace is the base's, set by kustomize
         "subjects": [{"kind": "ServiceAccount", "name": DEFAULT_SERVICE}]},
    ]  # fmt: skip


RUN_USER_ROLE_FILE = "run-user-role.yaml"
RUN_USER_ROLE = "runguard-run-user"
# What a user of a run namespace needs, each through an admission request runguard can
# judge: runs and their controllers written (created, changed, deleted), their logs and
# events read. None of what `runguard audit --rbac` reports: no Secret or ConfigMap read,
# no update of a ConfigMap's data, no connection into a Pod, token, impersonation,
# Service, Ingress or NetworkPolicy written. A workload's `scale` subresource is left
# out too: `replicas` is changed by a patch of the object, which runguard judges.
_KEEP = ["create", "delete", "get", "list", "watch"]
_WRITE = [*_KEEP, "update", "patch"]
_READ = ["get", "list", "watch"]
RUN_USER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": _KEEP},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # Created (a platform name is refused at CREATE) and deleted, never updated: an
    # update of a ConfigMap's data is judged by no admission webhook of runguard's. Nor
    # read: a read of the platform's ConfigMaps is no admission request (her Pods read
    # hers).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": _KEEP},
    {"apiGroups": [""], "resources": ["events", "limitranges", "resourcequotas", "services",
                                      "endpoints"], "verbs": _READ},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": _WRITE},
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": _WRITE},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": _READ},
]  # fmt: skip


def run_user_role(policy: Policy) -> dict[str, Any]:
    """ClusterRole ``runguard-run-user``, for a RoleBinding per run namespace: what its
    users need (``RUN_USER_RULES``) and the operators' kinds the policy names, written
    like the workloads (runguard judges them at admission)."""
    by_group: dict[str, set[str]] = {}
    for p in policy.run_policies():
        for group_kind in p.platform.operator_kinds:
            group, _, kind = group_kind.rpartition("/")
            if group:  # Pod: a core kind, in the rules already
                by_group.setdefault(group, set()).add(plural(kind))
    operators = [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(_WRITE)}
        for group, resources in sorted(by_group.items())
    ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": RUN_USER_ROLE, "labels": dict(LABELS)},
        "rules": [{**r, "verbs": list(r["verbs"])} for r in RUN_USER_RULES] + operators,
    }


def read_policy_files(directory: Path) -> dict[str, str]:
    """The text of each policy file the loader reads, by file name."""
    # The loader decides which files make a policy; the ConfigMap must hold exactly those.
    from webhook.policy.loader import policy_files

    return {p.name: p.read_text(encoding="utf-8") for p in policy_files(directory)}


def policy_config_map(
    files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, Any]:
    """The ConfigMap mounted as runguard's policy directory: one key per policy file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP_NAME, "namespace": namespace, "labels": dict(LABELS)},
        "data": dict(sorted(files.items())),
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (policy files in the ConfigMap) as readable literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # kubectl users read these files: no &id001 anchors


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
YamlDumper = _Dumper  # for other renderings of the same objects (webhook/install/chart.py)


def to_yaml(objects: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """Multi-document YAML, keys in the order built (apiVersion, kind, metadata first)."""
    body = yaml.dump_all(
        [dict(o) for o in objects],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
        allow_unicode=True,
        width=100,
    )
    return header + body


REQUIRES = (
    f"# Needs Kubernetes {MIN_KUBERNETES}+: the webhooks route by CEL matchConditions (GA in "
    f"{MIN_KUBERNETES}).\n"
)
_HEADER = (
    "# Generated from policies/ by `runguard manifests -p policies --write manifests`.\n"
    "# Do not edit: edit policies/ and regenerate (tests/test_manifests.py checks it).\n"
)


_RUN_USER_HEADER = (
    "#\n"
    "# The recommended role of a run namespace's users: bind it there, e.g.\n"
    "#   kubectl create rolebinding run-users -n NAMESPACE \\\n"
    "#     --clusterrole=runguard-run-user --group=TEAM\n"
    "# `runguard audit --rbac` lists none of its verbs (docs/threat-model.md).\n"
)
_CRD_HEADER = (
    "# Generated from the policy model (webhook/policy/model/, the same as\n"
    "# webhook/policy/runguard.schema.json) by `runguard manifests --write manifests`.\n"
    "# Do not edit: tests/test_manifests.py checks it.\n"
)


def generated_files(
    policy: Policy, files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, str]:
    """The generated files of the kustomize base, by name: text to write.

    The webhook configurations carry no ``caBundle``: kustomize copies it from the TLS
    Secret's ``ca.crt`` (see ``manifests/kustomization.yaml``), so it cannot drift either.
    """
    return {
        WEBHOOKS_FILE: to_yaml(
            webhook_configurations(policy, namespace=namespace), _HEADER + REQUIRES
        ),
        CONFIG_MAP_FILE: to_yaml([policy_config_map(files, namespace=namespace)], _HEADER),
        OPERATORS_RBAC_FILE: to_yaml(operators_watch_rbac(policy), _HEADER),
        RUN_USER_ROLE_FILE: to_yaml([run_user_role(policy)], _HEADER + _RUN_USER_HEADER),
        SHELLS_WEBHOOK_FILE: to_yaml(
            [shells_webhook_configuration(policy, namespace=namespace)], _HEADER
        ),
        **policy_object_files(namespace),
    }
