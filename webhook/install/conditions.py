"""The webhooks' ``matchConditions`` and rules rendered from the policy: the pod
controllers whose template is a run's or names the platform's objects, Pods naming the
platform's objects, reserved names, tokens, the operators' kinds, the status
subresource, and the namespaces left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from webhook.engine.rules.operators import plural
from webhook.engine.rules.ownership import (
    SNAPSHOT_GROUP,
    TOKEN_ACCOUNT_ANNOTATION,
    TOKEN_SECRET_TYPE,
    service_account_identities,
)
from webhook.engine.rules.ownership import enabled as ownership_enabled
from webhook.install.cel import (
    _ANY_NAME,
    OLD_TEMPLATE,
    TEMPLATE,
    _cel_string,
    _Exists,
    _exists,
    _Expr,
    _join,
    _names_a_claim,
    _records,
    _records_kept,
    _references,
    _render,
    _reserved,
    _reserved_rules,
    _runs,
)
from webhook.install.names import (
    NAMESPACE_LABEL,
    POD_CONTROLLERS,
    STATUS,
    STATUS_METADATA,
    _rule,
)
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy, RunPolicy


def _condition(name: str, expression: _Expr) -> dict[str, str]:
    return {"name": name, "expression": _render(expression)}


def _any_ownership(policy: Policy) -> bool:
    return any(ownership_enabled(p) for p in policy.run_policies)


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


POD_CLAIM = (
    "request.resource.resource == 'resourceclaims'"
    " && object.metadata.?ownerReferences.orValue([]).exists(o,"
    " o.kind == 'Pod' && o.?controller.orValue(false))"
)


def reserved_name_condition(policy: Policy) -> dict[str, str] | None:
    """A ResourceClaim made for a Pod (its devices are the run's, whatever the policy);
    ownership on: a PVC, Secret, ConfigMap or ResourceClaim created with a name a
    platform pattern gives (placeholders as wildcards)."""
    if not _any_ownership(policy):
        return _condition("platform-name", f"request.operation == 'CREATE' && {POD_CLAIM}")
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
    alternatives.append(POD_CLAIM)
    created = _join("||", *alternatives)
    if created is not None:  # the token Secrets' rule routes UPDATEs of Secrets too
        created = _join("&&", "request.operation == 'CREATE'", created)
    expr = _join("||", created, _token_secret(policy))
    return None if expr is None else _condition("platform-name", expr)


def _token_accounts(policy: Policy) -> list[tuple[str, str]]:
    """(namespace, name) of the platforms' and operators' ServiceAccounts, over every
    RunPolicy with ownership on."""
    return sorted(
        {sa for p in policy.run_policies if ownership_enabled(p)
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
    # A claim made for a Pod from its template, whatever the policy: its devices are the
    # run's (webhook.engine.rules.dra).
    reserved.setdefault("resourceclaims", "")
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


def _operator_rules(policy: Policy) -> list[dict[str, Any]]:
    """The operators' kinds (``platform.operators``), stamped at CREATE and kept on
    UPDATE, so that their Pods' ownership can follow them."""
    by_group: dict[str, list[str]] = {}
    for p in policy.run_policies:
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
    owned = [p for p in policy.run_policies if ownership_enabled(p)]
    # (a controller or operator creating one for an owner: runguard records whose it is)
    creators = _requested_by(k for p in owned for k in p.platform.owner_kinds)
    routed = _join(
        "||",
        run,
        f"(oldObject != null && ({_render(was, ' ')}))",
        _records(policy, "object.?metadata"),
        f"(oldObject != null && ({_records(policy, 'oldObject.?metadata')}))",
        _requested_by(i for p in owned for i in (*p.platform.identities, *p.platform.installers)),
        None if creators is None else _join("&&", "request.operation == 'CREATE'", creators),
        *dict.fromkeys(_reference_fields(owned)),
        *dict.fromkeys(_templates(policy, owned)),
        *dict.fromkeys(_reserved_kinds(owned)),
        _unexempt_scale(owned),
    )
    assert routed is not None
    return _condition("run-records-platform-or-references", routed)


def _reference_fields(owned: list[RunPolicy]) -> list[str]:
    """CEL, per reference of an operator's kind: the object sets the field that names
    or selects another object."""
    return [
        f"({_of_kind(kind)} && {_field_set('object', r.steps)})"
        for p in owned
        for kind, declared in sorted(p.platform.references.items())
        for _, r in declared
    ]


def _templates(policy: Policy, owned: list[RunPolicy]) -> list[_Expr | None]:
    """CEL, per template of an operator's kind: created with a run's pod template
    (/mutate writes the profile into it)."""
    return [
        _join("&&", "request.operation == 'CREATE'", _of_kind(kind), template)
        for p in owned
        for kind, entry in sorted(p.platform.templates.items())
        for steps in entry.steps
        if (template := _template_runs(policy, "object", steps)) is not None
    ]


def _reserved_kinds(owned: list[RunPolicy]) -> list[str]:
    """CEL, per kind whose operator keys on reserved labels: the object is of it."""
    return [
        f"({_of_kind(kind)})"
        for p in owned
        for o in p.platform.operators
        if o.reserved_labels
        for kind in o.kinds
        if "/" in kind
    ]


def _unexempt_scale(owned: list[RunPolicy]) -> _Expr | None:
    """CEL: a scale by someone no platform lets scale its objects (None: no platform)."""
    if not owned:
        return None
    exempt = [
        _requested_by([*p.platform.identities, *p.platform.installers, *p.platform.owner_kinds])
        for p in owned
    ]
    everyone_exempt = _join("&&", *dict.fromkeys(e if e is not None else "false" for e in exempt))
    return _join(
        "&&",
        "request.?subResource.orValue('') == 'scale'",
        None if everyone_exempt is None else f"!({_render(everyone_exempt, ' ')})",
    )


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


def namespace_selector(policy: RunPolicy, namespace: str) -> dict[str, Any]:
    """Every namespace but runguard's own (it must start without itself) and the ones the
    RunPolicy excludes."""
    return _not_in({namespace, *policy.exclude_namespaces})


def shared_namespace_selector(policy: Policy, namespace: str) -> dict[str, Any]:
    """Every namespace but runguard's own and, for a webhook every RunPolicy shares (one
    without an objectSelector), only what all of them exclude (one's exclusion is not
    another's)."""
    left_out = set.intersection(*(set(p.exclude_namespaces) for p in policy.run_policies))
    return _not_in({namespace, *left_out})


def _not_in(excluded: set[str]) -> dict[str, Any]:
    values = sorted(excluded)
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": values}]}
