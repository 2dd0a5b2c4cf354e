"""runguard's mutation and validation of a run Pod in CEL, for the peers of 2026 (not a test).

Renders from ``policies/`` (RunPolicy ``digitalhub``, as ``bench_create.py`` and
``bench_kyverno.py`` do) the same CEL twice:

* ``bench/kyverno/cel-policy.yaml``: a Kyverno ``MutatingPolicy`` and ``ValidatingPolicy``
  (``policies.kyverno.io/v1``), doing what ``bench/kyverno/policy.yaml``'s ClusterPolicies
  do, evaluated by Kyverno's webhooks (``bench_peers.py`` runs them in namespace
  ``bench-kyverno-cel``);
* ``bench/map/policy.yaml``: a ``MutatingAdmissionPolicy`` and a
  ``ValidatingAdmissionPolicy`` with their bindings (``admissionregistration.k8s.io/v1``,
  MAP GA since Kubernetes 1.36), evaluated inside the apiserver (namespace ``bench-map``).

The mutations (``mutations()``) are JSON Patches built by CEL, one list per step, in the
order runguard's mutation runs them; the validations are ``bench_create.vap_rules``, the
VAP's (every rule runguard's ``/validate`` applies that CEL can say). What CEL cannot say
is in each file's header (``NOT_EXPRESSED``).

    .venv/bin/python bench/bench_cel.py --write-policy   # re-render both files
    .venv/bin/python bench/bench_cel.py --check-policy   # exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import bench_create
import yaml
from bench_config import BENCH, POLICY_DIR, REPO
from bench_create import _cel, _Dumper, _name_matches, run_policy, vap_documents, vap_rules

from webhook.keys import MAIN_CONTAINER_ANNOTATION, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, RunPolicy

JSON = dict[str, Any]
KYVERNO_CEL_FILE = BENCH / "kyverno" / "cel-policy.yaml"
MAP_FILE = BENCH / "map" / "policy.yaml"
MAP_SUBSET_FILE = BENCH / "map" / "subset.yaml"
KYVERNO_CEL_NS = "bench-kyverno-cel"
MAP_NS = "bench-map"
MAP_SUBSET_NS = "bench-map-subset"
MUTATE_NAME, VALIDATE_NAME = "runguard-bench-cel-mutate", "runguard-bench-cel-validate"
MAP_NAME = "runguard-bench-map"
MAP_VAP_NAME = "runguard-bench-map-validate"
C = "object.spec.containers"
MI = 1024 * 1024

NOT_EXPRESSED = """\
# What CEL cannot say (runguard's rule ids):
#   anything decided by other objects: who created a run through a controller (the owner
#     chain by uid, in runguard's cluster cache: ownership.*, the platform's names being
#     the platform's runs' only), claims shared with a project; a MAP or VAP sees the
#     request, its namespace and the parameter objects its binding names, none chosen
#     per request (Kyverno's CEL has a resource library for lookups, at a call per
#     request: not used here); names decide, for the requester alone;
#   state across requests: the mutation backstop's receipts (runguard denies a Pod that
#     bypassed its mutating webhook by running every step again; CEL validates the
#     outcome's fields: profile.applied and the rest of the list above);
#   a warning per change: a mutation says nothing to the user.
# What CEL could say but these do not (more expressions, not a different language):
#   UPDATE (oldObject: scope.labels, the stamp and records unchanged), init containers
#     mutated (requests, clamps, root ids: containers only, as the ClusterPolicies),
#     secrets in envFrom, volumes and imagePullSecrets stripped (denied instead), a
#     request above its limit lowered (denied instead), several RunPolicies chosen per
#     Pod (an earlier one's selector is a matchCondition), the unknown-profile fallback,
#     MLRun's preemption modes, affinity from a profile.
"""


def _path(*parts: str) -> str:
    """A CEL string of a JSON Pointer; parts are literal keys, or CEL ``+ expr +`` pieces
    written as ``{expr}``."""
    out, literal = [], ""
    for part in parts:
        if part.startswith("{") and part.endswith("}"):
            out.append(_cel(literal + "/"))
            out.append(f"string({part[1:-1]})")
            literal = ""
        else:
            literal += "/" + part.replace("~", "~0").replace("/", "~1")
    if literal:
        out.append(_cel(literal))
    return " + ".join(out)


def _patch(op: str, path: str, value: str | None = None) -> str:
    tail = f", value: {value}" if value is not None else ""
    return f"JSONPatch{{op: {_cel(op)}, path: {path}{tail}}}"


def _ensure(present: str, path: str) -> str:
    """CEL list: an ``add {}`` at ``path`` unless the optional ``present`` has a value."""
    return f"({present}.hasValue() ? [] : [{_patch('add', path, '{}')}])"


def _per_container(condition: str, patches: str) -> str:
    """A list of patches for each container where ``condition`` holds (``i``, ``c``)."""
    return f"{C}.transformList(i, c, {condition}, {patches}).flatten()"


def _removals(indexes: str, at: Sequence[str]) -> str:
    """CEL list: ``remove`` of each item of the list at ``at`` whose index is in the
    ascending list ``indexes`` (each one shifted by the removals before it: a filtered
    list of typed objects cannot be a patch's value)."""
    return f"{indexes}.transformList(k, x, {_patch('remove', _path(*at, '{x - k}'))})"


def _add(at: Sequence[str], value: str) -> str:
    return _patch("add", _path(*at), value)


def _set_keys(base: str, at: Sequence[str], field: str, values: dict[str, str]) -> str:
    """CEL list: the map ``base.?field`` (``base`` an optional chain, at ``at``) made to
    hold ``values``, key by key, each string compared as written."""
    changes = " + ".join(
        f"({base}.?{field}[?{_cel(k)}] == optional.of({_cel(v)}) ? [] : "
        f"[{_patch('add', _path(*at, field, k), _cel(v))}])"
        for k, v in values.items()
    )
    return f"{_ensure(f'{base}.?{field}', _path(*at, field))} + {changes}"


def _profile(policy: RunPolicy) -> list[JSON]:
    """The profile named by the label: the main container's requests, limits and env,
    the pod's nodeSelector, tolerations and classes."""
    res = policy.resources
    gpu = res.gpu_resource_name
    mutations = []
    main, at = "variables.mainContainer", ["spec", "containers", "{variables.mainIndex}"]
    for name, profile in sorted(policy.profiles.items()):
        steps: list[str] = []
        parts = {
            part: {
                gpu if r == "gpu" else r: str(v)
                for r, v in getattr(profile.resources, part).items()
            }
            for part in ("requests", "limits")
        }
        parts = {part: values for part, values in parts.items() if values}
        if parts:
            steps.append(_ensure(f"{main}.?resources", _path(*at, "resources")))
            for part, values in parts.items():
                steps.append(_set_keys(f"{main}.?resources", [*at, "resources"], part, values))
        if profile.env:
            env = f"{main}.?env.orValue([])"
            steps.append(
                f"({main}.?env.hasValue() ? [] : [{_patch('add', _path(*at, 'env'), '[]')}])"
            )
            for item in profile.env:
                value = _cel(dict(item))
                same = f"{env}.exists(e, e.name == {_cel(item['name'])} && " + (
                    f"e.?value == optional.of({_cel(item['value'])}))"
                    if "value" in item
                    else "false)"
                )
                index = f"{env}.transformList(j, e, e.name == {_cel(item['name'])}, j)"
                steps.append(
                    f"({same} ? [] : {index}.size() > 0 ? "
                    f"[{_patch('add', _path(*at, 'env', '{' + index + '[0]}'), value)}] : "
                    f"[{_patch('add', _path(*at, 'env', '-'), value)}])"
                )
        spec = "object.spec"
        if profile.node_selector:
            nodes = dict(profile.node_selector)
            steps.append(_set_keys("optional.of(object.spec)", ["spec"], "nodeSelector", nodes))
        for toleration in profile.tolerations:
            same = " && ".join(f"t.?{k} == optional.of({_cel(str(v))})"
                               for k, v in toleration.items())  # fmt: skip
            value = _cel({k: str(v) for k, v in toleration.items()})
            steps.append(
                f"({spec}.?tolerations.orValue([]).exists(t, {same}) ? [] : "
                f"has({spec}.tolerations) ? [{_add(['spec', 'tolerations', '-'], value)}] "
                f": [{_add(['spec', 'tolerations'], '[' + value + ']')}])"
            )
        for field, value in (
            ("priorityClassName", profile.priority_class_name),
            ("runtimeClassName", profile.runtime_class_name),
        ):
            if value is None:
                continue
            forget = ""
            if field == "priorityClassName":  # the apiserver computed these from the old class
                forget = "".join(
                    f" + ({spec}.?{computed}.hasValue() ? "
                    f"[{_patch('remove', _path('spec', computed))}] : [])"
                    for computed in ("priority", "preemptionPolicy")
                )
            steps.append(
                f"({spec}.?{field} == optional.of({_cel(value)}) ? [] : "
                f"[{_patch('add', _path('spec', field), _cel(value))}]{forget})"
            )
        if steps:
            mutations.append(
                _jsonpatch(f"variables.profile != {_cel(name)} ? [] : " + " + ".join(steps))
            )
    return mutations


def _jsonpatch(expression: str) -> JSON:
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": " ".join(expression.split())}}


SUBSET_STEPS = ("profile", "defaults", "clamp", "root")  # what MAP is asked for at least
SUBSET_RULES = ("profile.", "resources.defaults", "resources.exceeded", "security.",
                "volumes.forbidden-type")  # fmt: skip  # its VAP: Pod Security, the maximums


def mutations(policy: RunPolicy, only: Sequence[str] | None = None) -> list[JSON]:
    """runguard's mutation steps of a run Pod (``only`` these, if given)."""
    return [mutation for step, mutation in steps(policy) if only is None or step in only]


def steps(policy: RunPolicy) -> list[tuple[str, JSON]]:
    """runguard's mutation steps of a run Pod, as far as JSON Patches built by CEL go."""
    res, sec, vol = policy.resources, policy.security, policy.volumes
    gpu = res.gpu_resource_name
    user = "request.userInfo.username"
    stamp = (
        "has(object.metadata.annotations) ? "
        f"[{_add(['metadata', 'annotations', REQUESTED_BY], user)}] : "
        f"[{_add(['metadata', 'annotations'], '{' + _cel(REQUESTED_BY) + ': ' + user + '}')}]"
    )
    # the RunPolicy's label (a run Pod has labels: its selector matched them)
    label = f"object.metadata.labels[?{_cel(POLICY_LABEL)}] == optional.of({_cel(policy.name)})"
    set_label = _add(["metadata", "labels", POLICY_LABEL], _cel(policy.name))
    stamp = f"({stamp}) + ({label} ? [] : [{set_label}])"
    out: list[tuple[str, JSON]] = [
        ("stamp", _jsonpatch(stamp)),
        *(("profile", m) for m in _profile(policy)),
    ]
    ci = ["spec", "containers", "{i}"]
    wanted = {r: str(v) for r, v in res.defaults.requests.items()}
    if wanted:
        missing = " || ".join(f"!c.?resources.?requests[?{_cel(r)}].hasValue()" for r in wanted)
        out.append(("defaults", _jsonpatch(_per_container(missing, " + ".join([
            _ensure("c.?resources", _path(*ci, "resources")),
            _set_keys("c.?resources", [*ci, "resources"], "requests", {}).rsplit(" + ", 1)[0],
            *(f"(c.?resources.?requests[?{_cel(r)}].hasValue() ? [] : "
              f"[{_patch('add', _path(*ci, 'resources', 'requests', r), _cel(v))}])"
              for r, v in wanted.items()),
        ])))))  # fmt: skip
    if res.memory_limit_factor is not None:
        factor = Fraction(str(res.memory_limit_factor))
        bytes_ = "quantity(c.resources.requests['memory']).asInteger()"
        limit = (f"string(({bytes_} * {factor.numerator} + {factor.denominator * MI - 1}) / "
                 f"{factor.denominator * MI}) + 'Mi'")  # fmt: skip
        out.append(("memory-limit", _jsonpatch(_per_container(
            "c.?resources.?requests[?'memory'].hasValue() && "
            "!c.?resources.?limits[?'memory'].hasValue()",
            f"(has(c.resources.limits) ? [] : [{_add([*ci, 'resources', 'limits'], '{}')}]) + "
            f"[{_add([*ci, 'resources', 'limits', 'memory'], limit)}]",
        ))))  # fmt: skip
    if res.maximums and res.on_exceed == "Clamp":
        clamps = []
        for resource, maximum in sorted(res.maximums.items()):
            resource = gpu if resource == "gpu" else resource
            for part in ("requests", "limits"):
                value = f"c.?resources.?{part}[?{_cel(resource)}]"
                path = _path(*ci, "resources", part, resource)
                clamps.append(
                    f"({value}.hasValue() && quantity({value}.value()).isGreaterThan("
                    f"quantity({_cel(str(maximum))})) ? "
                    f"[{_patch('replace', path, _cel(str(maximum)))}] : [])"
                )
        out.append(("clamp", _jsonpatch(_per_container("true", " + ".join(clamps)))))
    if sec.on_root == "Strip":
        ids = {"runAsUser": sec.run_as_user, "runAsGroup": sec.run_as_group,
               "fsGroup": sec.fs_group}  # fmt: skip
        psc = "object.spec.?securityContext"
        pod = [
            f"({psc}.?{field} == optional.of(0) ? "
            f"[{_patch('replace', _path('spec', 'securityContext', field), str(value))}] : [])"
            for field, value in ids.items()
            if value is not None
        ]
        per = [
            f"(c.?securityContext.?{field} == optional.of(0) ? "
            f"[{_patch('replace', _path(*ci, 'securityContext', field), str(ids[field]))}] : [])"
            for field in ("runAsUser", "runAsGroup")
            if ids[field] is not None
        ]
        root = " + ".join([*pod, _per_container("true", " + ".join(per))])
        out.append(("root", _jsonpatch(root)))
    # hardening: runAsNonRoot and seccomp on the pod; escalation and privilege off, the
    # capabilities dropped, added ones removed, in every container
    pod_fields = {"runAsNonRoot": "true"}
    if sec.seccomp_profile:
        pod_fields["seccompProfile"] = _cel({"type": sec.seccomp_profile})
    psc = "object.spec.?securityContext"
    harden = [f"(has(object.spec.securityContext) ? [] : "
              f"[{_patch('add', _path('spec', 'securityContext'), '{}')}])"]  # fmt: skip
    harden.append(f"({psc}.?runAsNonRoot == optional.of(true) ? [] : "
                  f"[{_add(['spec', 'securityContext', 'runAsNonRoot'], 'true')}])")  # fmt: skip
    if sec.seccomp_profile:
        seccomp = pod_fields["seccompProfile"]
        harden.append(
            f"({psc}.?seccompProfile.?type == optional.of({_cel(sec.seccomp_profile)}) ? [] : "
            f"[{_add(['spec', 'securityContext', 'seccompProfile'], seccomp)}])"
        )
    sc = "c.?securityContext"
    drop = list(sec.drop_capabilities)
    per = [
        f"(has(c.securityContext) ? [] : [{_patch('add', _path(*ci, 'securityContext'), '{}')}])",
        *(
            f"({sc}.?{field} == optional.of(false) ? [] : "
            f"[{_patch('add', _path(*ci, 'securityContext', field), 'false')}])"
            for field in ("allowPrivilegeEscalation", "privileged")
        ),
    ]
    if drop:
        per.append(
            f"({sc}.?capabilities.?drop.orValue([]).all(d, d in {_cel(drop)}) && "
            f"{_cel(drop)}.all(d, d in {sc}.?capabilities.?drop.orValue([])) ? [] : "
            f"({sc}.?capabilities.hasValue() ? [] : "
            f"[{_patch('add', _path(*ci, 'securityContext', 'capabilities'), '{}')}]) + "
            f"[{_patch('add', _path(*ci, 'securityContext', 'capabilities', 'drop'), _cel(drop))}])"
        )
    if not sec.allowed_capabilities:
        added = _path(*ci, "securityContext", "capabilities", "add")
        per.append(f"({sc}.?capabilities.?add.hasValue() ? [{_patch('remove', added)}] : [])")
    harden.append(_per_container("true", " + ".join(per)))
    out.append(("harden", _jsonpatch(" + ".join(harden))))
    # removed rather than denied: device variables, env secrets outside secrets.allowed
    gone = []
    if res.device_env:
        gone.append(f"e.name in {_cel(list(res.device_env))}")
    if policy.secrets.on_forbidden == "Strip":
        name = "e.valueFrom.secretKeyRef.name"
        gone.append(f"(e.?valueFrom.?secretKeyRef.hasValue() && (!variables.platform || "
                    f"!{_name_matches(name, policy.secrets.allowed)}))")  # fmt: skip
    if gone:
        at = f"c.env.transformList(j, e, {' || '.join(gone)}, j)"
        condition = f"c.?env.orValue([]).exists(e, {' || '.join(gone)})"
        out.append(
            ("strip-env", _jsonpatch(_per_container(condition, _removals(at, [*ci, "env"]))))
        )
    if vol.on_pre_existing == "Strip":
        foreign = _foreign_volume(policy)
        names = "variables.foreignVolumes"
        volumes = f"object.spec.volumes.transformList(j, v, {foreign}, j)"
        mounts = f"c.volumeMounts.transformList(j, m, m.name in {names}, j)"
        out.append(("strip-volumes", _jsonpatch(
            f"{names}.size() == 0 ? [] : {_removals(volumes, ['spec', 'volumes'])} + "
            + _per_container(f"c.?volumeMounts.orValue([]).exists(m, m.name in {names})",
                             _removals(mounts, [*ci, "volumeMounts"]))
        )))  # fmt: skip
    return out


def _foreign_volume(policy: RunPolicy) -> str:
    """CEL, of a volume ``v``: a claim or ConfigMap the platform did not make for this run
    (by its name patterns; any, when the requester is not the platform)."""
    vol = policy.volumes
    claim = _name_matches("v.persistentVolumeClaim.claimName", vol.platform_claims)
    config_map = _name_matches("v.configMap.name", vol.platform_config_maps)
    return (f"(has(v.persistentVolumeClaim) && (!variables.platform || !{claim})) || "
            f"(has(v.configMap) && (!variables.platform || !{config_map}))")  # fmt: skip


def mutation_variables(policy: RunPolicy) -> list[JSON]:
    label = policy.profiles_config.label
    users = [i for i in policy.platform.identities if not i.startswith("group:")]
    groups = [
        i.removeprefix("group:") for i in policy.platform.identities if i.startswith("group:")
    ]
    platform = (f"request.userInfo.username in {_cel(users)} || "
                f"request.userInfo.?groups.orValue([]).exists(g, g in {_cel(groups)})")  # fmt: skip
    main = f"object.metadata.?annotations[?{_cel(MAIN_CONTAINER_ANNOTATION)}]"
    return [
        {"name": "profile",
         "expression": f"object.metadata.?labels[?{_cel(label)}].orValue('')"},
        {"name": "mainIndexes",
         "expression": f"{C}.transformList(i, c, optional.of(c.name) == {main}, i)"},
        {"name": "mainIndex",
         "expression": "variables.mainIndexes.size() > 0 ? variables.mainIndexes[0] : 0"},
        {"name": "mainContainer", "expression": f"{C}[variables.mainIndex]"},
        {"name": "platform", "expression": platform},
        {"name": "foreignVolumes",
         "expression": "object.spec.?volumes.orValue([]).filter(v, "
                       f"{_foreign_volume(policy)}).map(v, v.name)"},
    ]  # fmt: skip


# --- the documents ------------------------------------------------------------------------


def _constraints(full: Policy, namespaces: Sequence[str]) -> tuple[JSON, list[JSON]]:
    """matchConstraints (run Pods at CREATE in ``namespaces``) and matchConditions (not
    an earlier RunPolicy's), as the VAP of ``bench_create.vap_documents`` has them."""
    vap = vap_documents(full, namespaces)[0]["spec"]
    constraints = copy.deepcopy(vap["matchConstraints"])
    term = {"key": bench_create.NAMESPACE_LABEL, "operator": "In", "values": list(namespaces)}
    constraints["namespaceSelector"] = {"matchExpressions": [term]}
    return constraints, copy.deepcopy(vap.get("matchConditions", []))


def _spec(full: Policy, namespaces: Sequence[str], mutating: bool, subset: bool = False) -> JSON:
    policy = run_policy(full)
    constraints, conditions = _constraints(full, namespaces)
    spec: JSON = {"failurePolicy": "Fail", "matchConstraints": constraints}
    if conditions:
        spec["matchConditions"] = conditions
    if mutating:
        spec["reinvocationPolicy"] = "Never"
        spec["variables"] = mutation_variables(policy)
        spec["mutations"] = mutations(policy, SUBSET_STEPS if subset else None)
    else:
        vap = vap_documents(full, namespaces)[0]["spec"]
        spec["variables"] = vap["variables"]
        spec["validations"] = [
            v for v in vap["validations"]
            if not subset or v["message"].lstrip("[").startswith(SUBSET_RULES)
        ]  # fmt: skip
    return spec


def kyverno_cel_documents(full: Policy) -> list[JSON]:
    """Kyverno's MutatingPolicy and ValidatingPolicy: evaluated at admission by Kyverno
    (no background scan, no VAP or MAP generated from them)."""
    meta = {"annotations": {"policies.kyverno.io/title": "runguard bench: " + RUN_POLICY}}
    docs = []
    for kind, name, mutating in (
        ("MutatingPolicy", MUTATE_NAME, True),
        ("ValidatingPolicy", VALIDATE_NAME, False),
    ):
        spec = _spec(full, (KYVERNO_CEL_NS,), mutating)
        spec["evaluation"] = {"admission": {"enabled": True}, "background": {"enabled": False}}
        if not mutating:
            spec["validationActions"] = ["Deny"]
        docs.append({"apiVersion": "policies.kyverno.io/v1", "kind": kind,
                     "metadata": {"name": name, **copy.deepcopy(meta)}, "spec": spec})  # fmt: skip
    return docs


def map_vap_documents(full: Policy, subset: bool = False) -> list[JSON]:
    """The MutatingAdmissionPolicy and ValidatingAdmissionPolicy, bound to ``bench-map``;
    with ``subset``, only the steps and rules the issue asks of them at least (the profile
    by label, defaults and clamps, root stripped; Pod Security restricted, the maximums),
    bound to ``bench-map-subset``."""
    docs = []
    suffix, namespace = ("-subset", MAP_SUBSET_NS) if subset else ("", MAP_NS)
    for kind, name, mutating in (
        ("MutatingAdmissionPolicy", MAP_NAME + suffix, True),
        ("ValidatingAdmissionPolicy", MAP_VAP_NAME + suffix, False),
    ):
        spec = _spec(full, (namespace,), mutating, subset)
        selector = spec["matchConstraints"].pop("namespaceSelector")
        binding: JSON = {"policyName": name, "matchResources": {"namespaceSelector": selector}}
        if not mutating:
            binding["validationActions"] = ["Deny"]
        docs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": name}, "spec": spec})  # fmt: skip
        docs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind + "Binding",
                     "metadata": {"name": name}, "spec": binding})  # fmt: skip
    return docs


RUN_POLICY = bench_create.RUN_POLICY


MUTATIONS_SAID = (
    "# Mutations, JSON Patches built by CEL, in runguard's order: the requester stamped and\n"
    "# the RunPolicy's label;\n"
    "# the profile by label (main container's requests, limits, env; nodeSelector,\n"
    "# tolerations, classes, the priority computed from the old class removed); request\n"
    "# defaults; memory limits ceil(request x factor) Mi; clamps to the maximums; root ids\n"
    "# replaced on the pod and containers; runAsNonRoot, seccomp, escalation and privilege\n"
    "# off, capabilities dropped and added ones removed; device variables and foreign env\n"
    "# secrets removed; claims and ConfigMaps the platform did not make for the run removed\n"
    "# with their mounts. Validations: bench/vap/policy.yaml's, runguard rule ids:\n"
)


def _header(what: str, policy: Policy, subset: bool) -> str:
    rules = sorted({rule for rule, _, _ in vap_rules(run_policy(policy))})
    if subset:
        rules = [rule for rule in rules if rule.startswith(SUBSET_RULES)]
    return (
        "# Generated by bench/bench_cel.py --write-policy from policies/ (RunPolicy "
        f"{RUN_POLICY!r}): do not edit.\n"
        + what
        + ("# Validations, runguard rule ids:\n" if subset else MUTATIONS_SAID)
        + "".join(f"#   {rule}\n" for rule in rules)
        + NOT_EXPRESSED
    )


KYVERNO_CEL_WHAT = (
    "# Kyverno's CEL policies (MutatingPolicy + ValidatingPolicy, policies.kyverno.io/v1,\n"
    "# stable since Kyverno 1.17) doing what bench/kyverno/policy.yaml's ClusterPolicies\n"
    "# do to a run Pod, for bench/bench_peers.py (namespace bench-kyverno-cel). The same\n"
    "# CEL as bench/map/policy.yaml: Kyverno's own CEL libraries are not needed here.\n"
)
MAP_WHAT = (
    "# Kubernetes' own MutatingAdmissionPolicy + ValidatingAdmissionPolicy\n"
    "# (admissionregistration.k8s.io/v1; MAP GA and on by default since 1.36, no flag on\n"
    "# 1.37), evaluated in the apiserver, for bench/bench_peers.py (namespace bench-map).\n"
    "# They carry the whole of bench/kyverno/cel-policy.yaml's CEL, which covers the\n"
    "# subset asked of them (profile by label, defaults and clamps, root stripped, Pod\n"
    "# Security restricted, the maximums) and more.\n"
)


def text(policy: Policy, documents: Callable[[Policy], list[JSON]], what: str) -> str:
    header = _header(what, policy, subset=documents is map_vap_subset_documents)
    return header + yaml.dump_all(documents(policy), Dumper=_Dumper, sort_keys=False, width=100)


MAP_SUBSET_WHAT = (
    "# Kubernetes' own MutatingAdmissionPolicy + ValidatingAdmissionPolicy as in\n"
    "# bench/map/policy.yaml, with only the subset asked of them at least, for\n"
    "# bench/bench_peers.py (namespace bench-map-subset: MAP's cost with fewer steps).\n"
    "# Mutations: the profile by label, request defaults, clamps to the maximums, root ids\n"
    "# replaced (no requester stamp, no hardening, nothing stripped).\n"
)


def map_vap_subset_documents(full: Policy) -> list[JSON]:
    return map_vap_documents(full, subset=True)


FILES = (
    (KYVERNO_CEL_FILE, kyverno_cel_documents, KYVERNO_CEL_WHAT),
    (MAP_FILE, map_vap_documents, MAP_WHAT),
    (MAP_SUBSET_FILE, map_vap_subset_documents, MAP_SUBSET_WHAT),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-policy", action="store_true",
                        help="write the two files and exit")  # fmt: skip
    parser.add_argument("--check-policy", action="store_true",
                        help="exit 1 unless both files are what policies/ renders now")  # fmt: skip
    args = parser.parse_args(argv)
    policy = load_policy(POLICY_DIR)
    stale = []
    for path, documents, what in FILES:
        rendered = text(policy, documents, what)
        if args.write_policy:
            path.parent.mkdir(exist_ok=True)
            path.write_text(rendered)
            print(f"wrote {path.relative_to(REPO)}")
        elif (path.read_text() if path.is_file() else "") != rendered:
            stale.append(path)
    for path in stale:
        print(f"{path.relative_to(REPO)}: differs from what policies/ renders "
              "(run bench/bench_cel.py --write-policy)", file=sys.stderr)  # fmt: skip
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
