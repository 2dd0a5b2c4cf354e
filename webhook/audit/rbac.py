"""RBAC read as the apiserver's authorizer reads it: subjects, rules and bindings.

- A rule matches a request when its ``verbs``, ``apiGroups`` and ``resources`` do
  (``*`` is any; a resource ``*/scale`` is that subresource of any resource) and, when
  it names ``resourceNames``, only for those names.
- A RoleBinding grants its role's rules in its namespace only, and never on cluster-scoped
  resources (``nodes/proxy``, impersonating users and groups); a ClusterRoleBinding
  grants them everywhere. Its rows carry the namespace ``CLUSTER_WIDE`` (``*``).
- An aggregated ClusterRole (``aggregationRule``) holds its stored rules and those of
  every ClusterRole its selectors pick, as the aggregation controller writes them, so a
  role not yet aggregated reads as it will be.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.audit.rbacdoors import Resource

CLUSTER_WIDE = "*"  # a ClusterRoleBinding's rows: every namespace, and cluster-scoped grants


@dataclass(frozen=True, order=True)
class Subject:
    kind: str  # User | Group | ServiceAccount
    name: str
    namespace: str = ""  # a ServiceAccount's

    @property
    def identity(self) -> str:
        """The name the apiserver knows it by: a user name, ``group:NAME``."""
        if self.kind == "ServiceAccount":
            return f"system:serviceaccount:{self.namespace}:{self.name}"
        if self.kind == "Group":
            return f"group:{self.name}"
        return self.name

    def __str__(self) -> str:
        if self.kind == "ServiceAccount":
            return f"ServiceAccount {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]  # resourceNames; empty: any name

    @classmethod
    def read(cls, rule: Any) -> Rule:
        rule = rule if isinstance(rule, dict) else {}

        def strings(key: str) -> frozenset[str]:
            values = rule.get(key)
            return frozenset(v for v in values if isinstance(v, str)) if values else frozenset()

        return cls(
            strings("apiGroups"), strings("resources"), strings("verbs"), strings("resourceNames")
        )

    def grants(self, resource: Resource) -> frozenset[str]:
        """The verbs of ``resource`` this rule grants (the door's verbs only)."""
        if "*" not in self.groups and resource.group not in self.groups:
            return frozenset()
        if not _resource_matches(self.resources, resource.resource):
            return frozenset()
        if "*" in self.verbs:
            return resource.verbs
        return resource.verbs & self.verbs


def _resource_matches(granted: frozenset[str], wanted: str) -> bool:
    """The authorizer's ResourceMatches: ``*``, the exact name, or ``*/sub`` for a
    subresource. ``wanted`` ending ``/*`` (``userextras/*``) is any of its subresources."""
    if "*" in granted or wanted in granted:
        return True
    base, _, sub = wanted.partition("/")
    if not sub:
        return False
    if sub == "*":
        return any(g.partition("/")[0] == base and g.partition("/")[2] for g in granted) or any(
            g.startswith("*/") for g in granted
        )
    return f"*/{sub}" in granted


def meta_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A LabelSelector as a ClusterRole's ``aggregationRule`` holds it, read as the
    aggregation controller reads it: an empty one picks every ClusterRole, one it
    cannot read (an unknown operator) none."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        if not isinstance(expr, dict):
            return False
        key, op, values = str(expr.get("key")), expr.get("operator"), expr.get("values") or ()
        present = key in labels
        value = labels.get(key)
        meets = {
            "In": present and value in values,
            "NotIn": not (present and value in values),
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(op), False)
        if not meets:
            return False
    return True


def role_rules(roles: Iterable[dict[str, Any]]) -> dict[tuple[str, str], tuple[Rule, ...]]:
    """Each Role's rules, by (namespace, name)."""
    return {
        (
            str(meta_of(o).get("namespace", "")),
            str(meta_of(o).get("name", "")),
        ): tuple(Rule.read(r) for r in o.get("rules") or ())
        for o in roles
    }


def cluster_role_rules(cluster_roles: Iterable[dict[str, Any]]) -> dict[str, tuple[Rule, ...]]:
    """Each ClusterRole's rules, aggregated ones resolved (to a fixed point: ``admin``
    aggregates ``edit``, which aggregates ``view``)."""
    stored: dict[str, tuple[Rule, ...]] = {}
    labels: dict[str, Mapping[str, Any]] = {}
    selectors: dict[str, list[Any]] = {}
    for role in cluster_roles:
        name = meta_of(role).get("name")
        if not isinstance(name, str):
            continue
        stored[name] = tuple(Rule.read(r) for r in role.get("rules") or ())
        labels[name] = meta_of(role).get("labels") or {}
        aggregation = role.get("aggregationRule")
        if isinstance(aggregation, dict):
            selectors[name] = list(aggregation.get("clusterRoleSelectors") or ())
    rules = {name: dict.fromkeys(r) for name, r in stored.items()}
    for _ in range(len(selectors) + 1):
        changed = False
        for name, chosen in selectors.items():
            for other, other_labels in labels.items():
                if other != name and any(_selector_matches(s, other_labels) for s in chosen):
                    for rule in list(rules[other]):
                        if rule not in rules[name]:
                            rules[name][rule] = None
                            changed = True
        if not changed:
            break
    return {name: tuple(r) for name, r in rules.items()}


@dataclass(frozen=True)
class Binding:
    kind: str  # RoleBinding | ClusterRoleBinding
    namespace: str  # CLUSTER_WIDE for a ClusterRoleBinding
    name: str
    role_kind: str
    role: str
    subjects: tuple[Subject, ...]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} -> {self.role_kind}/{self.role}"


def _subjects(binding: dict[str, Any], namespace: str) -> tuple[Subject, ...]:
    out = []
    for s in binding.get("subjects") or ():
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            continue
        kind = s.get("kind")
        if kind == "ServiceAccount":
            # A RoleBinding's ServiceAccount without a namespace is in the binding's.
            out.append(Subject(kind, s["name"], s.get("namespace") or namespace))
        elif kind in ("User", "Group"):
            out.append(Subject(kind, s["name"]))
    return tuple(out)


def read_bindings(objects: Iterable[dict[str, Any]]) -> Iterator[Binding]:
    for obj in objects:
        kind = obj.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        meta, ref = meta_of(obj), obj.get("roleRef")
        if not isinstance(ref, dict):
            continue
        namespace = str(meta.get("namespace") or "") if kind == "RoleBinding" else CLUSTER_WIDE
        yield Binding(
            kind,
            namespace,
            str(meta.get("name", "")),
            str(ref.get("kind", "")),
            str(ref.get("name", "")),
            _subjects(obj, namespace),
        )


def bound_rules(
    binding: Binding,
    roles: Mapping[tuple[str, str], tuple[Rule, ...]],
    cluster_roles: Mapping[str, tuple[Rule, ...]],
) -> tuple[Rule, ...]:
    """The rules of the role ``binding`` names (``role_rules``, ``cluster_role_rules``)."""
    if binding.role_kind != "Role":
        return cluster_roles.get(binding.role, ())
    if binding.namespace == CLUSTER_WIDE:  # a ClusterRoleBinding cannot name a Role
        return ()
    return roles.get((binding.namespace, binding.role), ())
