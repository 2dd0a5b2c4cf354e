"""Kyverno beside runguard: the same run Pods through the e2e apiserver (not a test).

Kyverno's admission controller (``cmd/kyverno`` at the version ``bench/kyverno/build.sh``
pins, built from the Go module proxy once and cached beside the e2e binaries) runs out of
cluster (``--serverIP``: its webhooks are registered by URL on 127.0.0.1) against the
apiserver of ``bench_create.CreateLatency``, with ``bench/kyverno/policy.yaml``: two
ClusterPolicies rendered from ``policies/`` (RunPolicy ``digitalhub``) by
``kyverno_documents`` that do what runguard's mutation and validation do to a run Pod,
as far as Kyverno's ClusterPolicy language goes (the file's header lists what it cannot
say). Kyverno's webhooks are limited to namespace ``bench-kyverno`` (its ``webhooks``
setting), where the policies match run Pods at CREATE.

* ``agreement()``: the same Pods (the valid run, the run as the user wrote it, the 14
  non-compliant ones of ``bench_create``) created in ``bench-pair`` (runguard's two
  webhooks) and in ``bench-kyverno``: the share of the same allowed/denied answers;
* latency: ``bench-kyverno`` is one more case of ``CreateLatency.round``, the same valid
  Pod, interleaved create by create with the others: ``create_added_ms_kyverno_pair``;
* ``cpu_round()``: CPU time (user + system, from ``/proc``) of Kyverno's process and of
  runguard's process tree per create, each namespace alone for a batch, alternating:
  ``kyverno_cpu_us_pair``, ``runguard_cpu_us_pair``.

``KyvernoSide(create, cel=True)`` also serves Kyverno's CEL pair (``bench_cel.py``'s
MutatingPolicy + ValidatingPolicy) in namespace ``bench-kyverno-cel`` from the same
process: case ``kyverno_cel``, ``create_added_ms_kyverno_cel_pair``,
``kyverno_cel_cpu_us_pair`` (``bench_peers.py``, ``make bench``).

    .venv/bin/python bench/bench_kyverno.py [--rounds 3] [--creates 100]
    .venv/bin/python bench/bench_kyverno.py --write-policy   # re-render bench/kyverno/policy.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import bench_cel
import bench_create
import yaml
from bench_config import BENCH
from bench_create import NS, CreateLatency, noncompliant_pods, run_policy
from e2e.cluster import ClusterError

from webhook.engine.rules.pod_security import RESTRICTED_VOLUME_TYPES
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import NamePattern, Policy, RunPolicy
from webhook.policy.patterns import split

JSON = dict[str, Any]
BUILD = BENCH / "kyverno" / "build.sh"
POLICY_FILE = BENCH / "kyverno" / "policy.yaml"
KYVERNO_NS = "kyverno"  # Kyverno's own: its configuration, certificates, leases
BENCH_NS = "bench-kyverno"  # where its webhooks and policies apply
CASE = "kyverno"
# Kyverno's webhooks for its ClusterPolicies take their namespaceSelector from its
# configuration (here: both namespaces, since a CEL policy's own selector is ANDed with
# it) and also its matchConditions, which its CEL policies' webhooks do not: so a Pod in
# the CEL pair's namespace is not sent to the ClusterPolicies' webhooks as well.
ONLY_CLUSTER_POLICY_NS = [
    {"name": "runguard-bench-clusterpolicies", "expression": f"request.namespace == '{BENCH_NS}'"}
]
CEL_CASE = "kyverno_cel"
MUTATE_NAME, VALIDATE_NAME = "runguard-bench-mutate", "runguard-bench-validate"
RUN = 'request.object.metadata.labels."dhcore/run"'
MAIN = (
    'request.object.metadata.annotations."runguard.io/main-container" || '
    "request.object.spec.containers[0].name"
)
NOT_EXPRESSED = """\
# What this does not say, and why (runguard's rule ids):
#   ownership.*, the platform record and the RunPolicy label: who created a run, through
#     controllers by uid in runguard's cluster cache, and records that cannot change on
#     UPDATE; Kyverno stamps the requester (an annotation) and nothing more here;
#   resources.memory-limit: a limit of ceil(request x 1.1) Mi (Kyverno's multiply gives
#     the exact product, not rounded to Mi);
#   resources.exceeded for the run's total (all containers and sidecars, as the
#     scheduler counts) and resources.clamped (a request above its limit lowered);
#   volumes.pre-existing and secrets.forbidden decided by who created the run (the
#     platform's names are the platform's runs' only): here names decide, for anyone;
#     secrets stripped from env only (not envFrom, volumes, imagePullSecrets);
#   profile.applied and the mutation backstop: runguard denies a Pod that bypassed its
#     mutating webhook by running every mutation step again; Kyverno validates fields;
#   a RunPolicy chosen per Pod among several, unknown-profile fallback, preemption modes,
#   warnings per change.
"""


# --- the policies -----------------------------------------------------------------------


def _match(policy: RunPolicy) -> JSON:
    selector = policy.selector.to_dict()
    return {
        "any": [
            {
                "resources": {
                    "kinds": ["Pod"],
                    "namespaces": [BENCH_NS],
                    "operations": ["CREATE"],
                    "selector": selector,
                }
            }
        ]
    }


def _pattern(text: str) -> str:
    """A runguard name pattern as a Kyverno wildcard with the run's label substituted."""
    literals, keys = split(text)
    out = literals[0]
    for key, literal in zip(keys, literals[1:], strict=True):
        out += '{{request.object.metadata.labels."' + key + '"}}' + literal
    return out


def _names_ok(expression: str, patterns: Sequence[NamePattern]) -> str:
    """JMESPath: ``expression`` (a name) matches one of the patterns."""
    tests = [f"pattern_match('{_pattern(p.text)}', {expression})" for p in patterns]
    return " || ".join(tests) if tests else "`false`"


def _rule(name: str, policy: RunPolicy, **body: Any) -> JSON:
    return {"name": name, "match": _match(policy), **body}


def mutate_rules(policy: RunPolicy) -> list[JSON]:
    res, sec = policy.resources, policy.security
    gpu = res.gpu_resource_name
    rules: list[JSON] = [
        _rule("stamp", policy, mutate={"patchStrategicMerge": {"metadata": {"annotations": {
            REQUESTED_BY: "{{request.userInfo.username}}"}}}}),
    ]  # fmt: skip
    label = policy.profiles_config.label
    for name, profile in sorted(policy.profiles.items()):
        container: JSON = {"name": "{{ " + MAIN + " }}"}
        resources = {
            part: {
                gpu if r == "gpu" else r: str(v)
                for r, v in getattr(profile.resources, part).items()
            }
            for part in ("requests", "limits")
        }
        container["resources"] = {part: values for part, values in resources.items() if values}
        if profile.env:
            container["env"] = [dict(e) for e in profile.env]
        spec: JSON = {"containers": [container]}
        if profile.node_selector:
            spec["nodeSelector"] = dict(profile.node_selector)
        if profile.tolerations:
            spec["tolerations"] = [dict(t) for t in profile.tolerations]
        for key, value in (
            ("priorityClassName", profile.priority_class_name),
            ("runtimeClassName", profile.runtime_class_name),
        ):
            if value is not None:
                spec[key] = value
        rules.append(_rule(
            f"profile-{name}", policy,
            preconditions={"all": [{"key": "{{ request.object.metadata.labels.\"" + label
                                    + "\" || '' }}", "operator": "Equals", "value": name}]},
            mutate={"patchStrategicMerge": {"spec": spec}},
        ))  # fmt: skip
    classes = sorted(n for n, p in policy.profiles.items() if p.priority_class_name is not None)
    for field in ("priority", "preemptionPolicy"):  # computed by the apiserver from the class
        rules.append(_rule(f"forget-{field}", policy, preconditions={"all": [
            {"key": "{{ request.object.metadata.labels.\"" + label + "\" || '' }}",
             "operator": "AnyIn", "value": classes},
            {"key": "{{ request.object.spec." + field + " == null }}", "operator": "Equals",
             "value": False}]},
            mutate={"patchesJson6902": yaml.safe_dump([
                {"op": "remove", "path": f"/spec/{field}"}])}))  # fmt: skip
    # Request defaults as JSON patches, one level at a time (a rule sees the previous one's
    # result): the resources, the requests, then each resource. (Lengths, not strings:
    # Kyverno's Equals reads "16Gi" as a quantity and fails on "".)
    wanted = {r: str(v) for r, v in res.defaults.requests.items()}
    levels = (
        ("resources", "element.resources", {"requests": wanted}),
        ("resources/requests", "element.resources.requests", wanted),
        *(
            (f"resources/requests/{r}", f'element.resources.requests."{r}"', v)
            for r, v in wanted.items()
        ),
    )
    for index, (path, expression, value) in enumerate(levels if wanted else ()):
        rules.append(_rule(f"defaults-{index + 1}", policy, mutate={"foreach": [{
            "list": "request.object.spec.containers",
            "preconditions": {"all": [{"key": "{{ length(" + expression + " || '') }}",
                                       "operator": "Equals", "value": 0}]},
            "patchesJson6902": yaml.safe_dump([{
                "op": "add", "path": "/spec/containers/{{elementIndex}}/" + path,
                "value": value}]),
        }]}))  # fmt: skip
    if res.memory_limit_factor is not None:
        rules.append(_rule("memory-limit", policy, mutate={"foreach": [{
            "list": "request.object.spec.containers",
            "preconditions": {"all": [
                {"key": "{{ length(element.resources.limits.memory || '') }}",
                 "operator": "Equals", "value": 0},
                {"key": "{{ length(element.resources.requests.memory || '') }}",
                 "operator": "GreaterThan", "value": 0}]},
            "patchesJson6902": yaml.safe_dump([{
                "op": "add", "path": "/spec/containers/{{elementIndex}}/resources/limits",
                "value": {"memory": "{{ multiply(element.resources.requests.memory, `"
                          f"{res.memory_limit_factor}`) }}}}"}}]),
        }]}))  # fmt: skip
    clamps = []
    for resource, maximum in sorted(res.maximums.items()):
        resource = gpu if resource == "gpu" else resource
        for part in ("requests", "limits"):
            clamps.append({
                "list": "request.object.spec.containers",
                "preconditions": {"all": [{
                    "key": "{{ element.resources." + part + ".\"" + resource + "\" || '0' }}",
                    "operator": "GreaterThan", "value": str(maximum)}]},
                "patchesJson6902": yaml.safe_dump([{
                    "op": "replace",
                    "path": f"/spec/containers/{{{{elementIndex}}}}/resources/{part}/"
                            + resource.replace("~", "~0").replace("/", "~1"),
                    "value": str(maximum)}]),
            })  # fmt: skip
    if clamps and res.on_exceed == "Clamp":
        rules.append(_rule("clamp", policy, mutate={"foreach": clamps}))
    if sec.on_root == "Strip":
        ids = {
            "runAsUser": sec.run_as_user,
            "runAsGroup": sec.run_as_group,
            "fsGroup": sec.fs_group,
        }
        for field, value in ids.items():
            if value is None:
                continue
            rules.append(_rule(
                f"root-pod-{field}", policy,
                preconditions={"all": [{"key": "{{ request.object.spec.securityContext."
                                        + field + " || `1` }}", "operator": "Equals", "value": 0}]},
                mutate={"patchesJson6902": yaml.safe_dump([{
                    "op": "replace", "path": f"/spec/securityContext/{field}", "value": value}])},
            ))  # fmt: skip
        per_container = []
        for field in ("runAsUser", "runAsGroup"):
            value = ids[field]
            if value is None:
                continue
            per_container.append({
                "list": "request.object.spec.containers",
                "preconditions": {"all": [{"key": "{{ element.securityContext." + field
                                           + " || `1` }}", "operator": "Equals", "value": 0}]},
                "patchesJson6902": yaml.safe_dump([{
                    "op": "replace",
                    "path": f"/spec/containers/{{{{elementIndex}}}}/securityContext/{field}",
                    "value": value}]),
            })  # fmt: skip
        if per_container:
            rules.append(_rule("root-containers", policy, mutate={"foreach": per_container}))
    pod_context: JSON = {"runAsNonRoot": True}
    if sec.seccomp_profile:
        pod_context["seccompProfile"] = {"type": sec.seccomp_profile}
    hardened: JSON = {"allowPrivilegeEscalation": False, "privileged": False}
    drop = list(sec.drop_capabilities)
    if drop:
        hardened["capabilities"] = {"drop": drop}
    rules.append(_rule("harden", policy, mutate={"patchStrategicMerge": {"spec": {
        "securityContext": pod_context,
        "containers": [{"(name)": "*", "securityContext": hardened}]}}}))  # fmt: skip
    if not sec.allowed_capabilities:
        rules.append(_rule("capabilities-stripped", policy, mutate={"foreach": [{
            "list": "request.object.spec.containers",
            "preconditions": {"all": [{"key": "{{ length(element.securityContext.capabilities.add"
                                       " || `[]`) }}", "operator": "GreaterThan", "value": 0}]},
            "patchesJson6902": yaml.safe_dump([{
                "op": "remove",
                "path": "/spec/containers/{{elementIndex}}/securityContext/capabilities/add"}]),
        }]}))  # fmt: skip
    rules.extend(strip_rules(policy))
    return rules


def strip_rules(policy: RunPolicy) -> list[JSON]:
    """What runguard removes rather than denies: device variables, secrets outside
    ``secrets.allowed`` (env references), claims and ConfigMaps the platform did not make
    for the run (the volume and its mounts). Last items first, so indexes hold."""
    res, vol = policy.resources, policy.volumes
    rules: list[JSON] = []

    def in_env(name: str, condition: JSON) -> None:
        rules.append(_rule(name, policy, mutate={"foreach": [{
            "list": "request.object.spec.containers",
            "foreach": [{
                "list": "element.env || `[]`",
                "order": "Descending",
                "preconditions": {"all": [condition]},
                "patchesJson6902": yaml.safe_dump([{
                    "op": "remove",
                    "path": "/spec/containers/{{elementIndex0}}/env/{{elementIndex1}}"}]),
            }],
        }]}))  # fmt: skip

    if res.device_env:
        in_env("device-env-stripped", {"key": "{{ element.name }}", "operator": "AnyIn",
                                        "value": list(res.device_env)})  # fmt: skip
    if policy.secrets.on_forbidden == "Strip":
        ok = _names_ok("element.valueFrom.secretKeyRef.name", policy.secrets.allowed)
        in_env("secrets-stripped", {
            "key": "{{ element.valueFrom.secretKeyRef && !(" + ok + ") || `false` }}",
            "operator": "Equals", "value": True})  # fmt: skip
    if vol.on_pre_existing == "Strip":
        wanted = [(kind, field, [_pattern(p.text) for p in patterns]) for kind, field, patterns in (
            ("persistentVolumeClaim", "claimName", vol.platform_claims),
            ("configMap", "name", vol.platform_config_maps))]  # fmt: skip
        for kind, field, patterns in wanted:
            of_mount = ("{{ request.object.spec.volumes[?name=='{{element.name}}']." + kind
                        + "." + field + " | [0] || '' }}")  # fmt: skip
            foreign = [{"key": of_mount, "operator": "NotEquals", "value": ""},
                       {"key": of_mount, "operator": "AnyNotIn", "value": patterns}]  # fmt: skip
            rules.append(_rule(f"pre-existing-{kind}-mounts", policy, mutate={"foreach": [{
                "list": "request.object.spec.containers",
                "foreach": [{
                    "list": "element.volumeMounts || `[]`",
                    "order": "Descending",
                    "preconditions": {"all": foreign},
                    "patchesJson6902": yaml.safe_dump([{"op": "remove", "path":
                        "/spec/containers/{{elementIndex0}}/volumeMounts/{{elementIndex1}}"}]),
                }],
            }]}))  # fmt: skip
            own = "{{ element." + kind + "." + field + " || '' }}"
            rules.append(_rule(f"pre-existing-{kind}", policy, mutate={"foreach": [{
                "list": "request.object.spec.volumes || `[]`",
                "order": "Descending",
                "preconditions": {"all": [
                    {"key": own, "operator": "NotEquals", "value": ""},
                    {"key": own, "operator": "AnyNotIn", "value": patterns}]},
                "patchesJson6902": yaml.safe_dump([{
                    "op": "remove", "path": "/spec/volumes/{{elementIndex}}"}]),
            }]}))  # fmt: skip
    return rules


def validate_rules(policy: RunPolicy) -> list[JSON]:
    res, sec, vol = policy.resources, policy.security, policy.volumes
    gpu = res.gpu_resource_name
    label = policy.profiles_config.label
    rules: list[JSON] = []

    def deny(name: str, message: str, conditions: list[JSON]) -> None:
        rules.append(_rule(name, policy, validate={
            "message": message, "deny": {"conditions": {"any": conditions}}}))  # fmt: skip

    if policy.profiles_config.unknown == "Deny":
        deny("profile-unknown", f"the profile named in {label} does not exist", [{
            "key": "{{ request.object.metadata.labels.\"" + label + "\" || '' }}",
            "operator": "AnyNotIn", "value": sorted(policy.profiles)}])  # fmt: skip
    if sec.level is not None:
        rules.append(_rule("pod-security", policy, validate={
            "podSecurity": {"level": sec.level, "version": "latest"}}))  # fmt: skip
    for resource, maximum in sorted(res.maximums.items()):
        resource = gpu if resource == "gpu" else resource
        slug = resource.replace("/", "-").replace(".", "-")
        rules.append(_rule(f"maximum-{slug}", policy, validate={
            "message": f"{resource} above the maximum {maximum}",
            "foreach": [{"list": "request.object.spec.containers", "deny": {"conditions": {"any": [
                {"key": "{{ element.resources." + part + ".\"" + resource + "\" || '0' }}",
                 "operator": "GreaterThan", "value": str(maximum)}
                for part in ("requests", "limits")]}}}]}))  # fmt: skip
    rules.append(_rule("gpu-request-is-limit", policy, validate={
        "message": "the gpu request differs from the gpu limit",
        "foreach": [{"list": "request.object.spec.containers", "deny": {"conditions": {"any": [{
            "key": "{{ element.resources.requests.\"" + gpu + "\" || '0' }}",
            "operator": "NotEquals",
            "value": "{{ element.resources.limits.\"" + gpu + "\" || '0' }}"}]}}}]}))  # fmt: skip
    wanted = sorted(res.defaults.requests)
    if wanted:
        rules.append(_rule("requests-set", policy, validate={
            "message": f"every container sets requests {', '.join(wanted)}",
            "foreach": [{"list": "request.object.spec.containers", "deny": {"conditions": {"any": [
                {"key": "{{ length(element.resources.requests.\"" + r + "\" || '') }}",
                 "operator": "Equals", "value": 0} for r in wanted]}}}]}))  # fmt: skip
    if res.device_env:
        rules.append(_rule("device-env", policy, validate={
            "message": "a variable selecting devices outside the pod's requests",
            "foreach": [{"list": "request.object.spec.containers[].env[]", "deny": {"conditions": {
                "any": [{"key": "{{ element.name }}", "operator": "AnyIn",
                         "value": list(res.device_env)}]}}}]}))  # fmt: skip
    allowed = set(vol.allowed_types)
    if sec.level == "restricted":
        allowed &= RESTRICTED_VOLUME_TYPES
    forbidden = [t for t in bench_create.VOLUME_TYPES if t not in allowed]
    rules.append(
        _rule(
            "volume-types",
            policy,
            validate={
                "message": f"a volume type outside {', '.join(sorted(allowed))}",
                "foreach": [
                    {
                        "list": "request.object.spec.volumes || `[]`",
                        "deny": {
                            "conditions": {
                                "any": [
                                    {
                                        "key": "{{ keys(element) }}",
                                        "operator": "AnyIn",
                                        "value": forbidden,
                                    }
                                ]
                            }
                        },
                    }
                ],
            },
        )
    )
    claims = _names_ok("element.persistentVolumeClaim.claimName", vol.platform_claims)
    maps = _names_ok("element.configMap.name", vol.platform_config_maps)
    rules.append(_rule("pre-existing", policy, validate={
        "message": "a claim or configMap the platform did not create for this run",
        "foreach": [{"list": "request.object.spec.volumes || `[]`", "deny": {"conditions": {"any": [
            {"key": "{{ element.persistentVolumeClaim && !(" + claims + ") || `false` }}",
             "operator": "Equals", "value": True},
            {"key": "{{ element.configMap && !(" + maps + ") || `false` }}",
             "operator": "Equals", "value": True}]}}}]}))  # fmt: skip
    secret_ok = _names_ok("element.valueFrom.secretKeyRef.name", policy.secrets.allowed)
    rules.append(_rule("secrets", policy, validate={
        "message": "a secret outside secrets.allowed",
        "foreach": [{"list": "request.object.spec.containers[].env[]", "deny": {"conditions": {
            "any": [{"key": "{{ element.valueFrom.secretKeyRef && !(" + secret_ok
                     + ") || `false` }}", "operator": "Equals", "value": True}]}}}]}))  # fmt: skip
    classes = policy.scheduling.priority_classes.allowed
    if classes is not None:
        deny("priority-class", "a priority class not allowed", [{
            "key": "{{ request.object.spec.priorityClassName || '' }}",
            "operator": "AnyNotIn", "value": ["", *sorted(classes)]}])  # fmt: skip
    return rules


def kyverno_documents(full: Policy) -> list[JSON]:
    policy = run_policy(full)
    meta = {"annotations": {"policies.kyverno.io/title": "runguard bench: " + policy.name}}
    return [
        {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
         "metadata": {"name": MUTATE_NAME, **meta},
         "spec": {"background": False, "rules": mutate_rules(policy)}},
        {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
         "metadata": {"name": VALIDATE_NAME, **meta},
         "spec": {"background": False, "validationFailureAction": "Enforce",
                  "rules": validate_rules(policy)}},
    ]  # fmt: skip


def kyverno_text(policy: Policy) -> str:
    header = (
        "# Generated by bench/bench_kyverno.py --write-policy from policies/ (RunPolicy "
        f"{bench_create.RUN_POLICY!r}): do not edit.\n"
        "# Kyverno ClusterPolicies doing what runguard's webhooks do to a run Pod, for the\n"
        "# create-latency comparison of bench/bench_kyverno.py: the requester stamped, the\n"
        "# profile applied (requests, limits, env of the main container; nodeSelector,\n"
        "# tolerations, classes), request defaults, memory limits, clamps to the maximums,\n"
        "# root ids replaced, privilege escalation off, capabilities dropped and added ones\n"
        "# removed, seccomp RuntimeDefault, runAsNonRoot; then Pod Security (restricted),\n"
        "# unknown profiles, maximums, gpu request = limit, device variables, volume types,\n"
        "# claims, ConfigMaps and secrets by runguard's name patterns, priority classes.\n"
        + NOT_EXPRESSED
    )
    return header + yaml.safe_dump_all(kyverno_documents(policy), sort_keys=False, width=100)


# --- Kyverno, run out of cluster ------------------------------------------------------------


class KyvernoUnavailable(RuntimeError):
    """Kyverno could not be built or started: the benchmark goes on without it."""


def build() -> tuple[Path, Path]:
    """The cached Kyverno binary and its CRDs (``bench/kyverno/build.sh``, built once; a
    cold build says so on stderr, and takes half an hour on 2 busy cores)."""
    done = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise KyvernoUnavailable("bench/kyverno/build.sh failed (its output is above)")
    binary = Path(done.stdout.strip().splitlines()[-1])
    return binary, binary.parent / "crds"


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes, in seconds (``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class KyvernoSide:
    """Kyverno's admission controller beside ``create``'s runguard, in its cluster.

    ``start()`` after ``create.start()``: installs Kyverno's CRDs and its configuration,
    starts ``kyverno`` (its webhooks only for ``bench-kyverno``), applies the policies
    and adds the ``kyverno`` case to ``create``'s rounds; ``stop()`` ends the process."""

    def __init__(
        self, create: CreateLatency, log: Callable[[str], None] = print, cel: bool = False
    ) -> None:
        self.create = create
        self.log = log
        # with cel, Kyverno's CEL pair too (bench_cel.py), in its own namespace
        self.namespaces = [BENCH_NS, *([bench_cel.KYVERNO_CEL_NS] if cel else [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.build_seconds: float | None = None

    def start(self, timeout: float = 180.0) -> None:
        cluster = self.create.cluster
        if cluster is None:
            raise KyvernoUnavailable("the e2e apiserver is not running")
        started = time.monotonic()
        binary, crds = build()
        self.build_seconds = time.monotonic() - started
        if not crds.is_dir():
            raise KyvernoUnavailable(f"no CRDs beside {binary}")
        for path in sorted(crds.rglob("*.yaml")):
            cluster.kubectl("apply", "--server-side", "-f", str(path), check=True)
        for namespace in (KYVERNO_NS, *self.namespaces):
            cluster.kubectl("create", "namespace", namespace, check=True)
        term = {"key": bench_create.NAMESPACE_LABEL, "operator": "In", "values": self.namespaces}
        selector = {"namespaceSelector": {"matchExpressions": [term]}}
        config = [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "kyverno", "namespace": KYVERNO_NS},
             "data": {"webhooks": json.dumps(selector), "defaultRegistry": "localhost",
                      "matchConditions": json.dumps(ONLY_CLUSTER_POLICY_NS)}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "kyverno-metrics", "namespace": KYVERNO_NS}, "data": {}},
        ]  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                        "items": config}), check=True)  # fmt: skip
        port = _free_port()
        workdir = self.create.workdir / "kyverno"
        workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "KYVERNO_NAMESPACE": KYVERNO_NS,
            "KYVERNO_SERVICEACCOUNT_NAME": "kyverno",
            "KYVERNO_DEPLOYMENT": "kyverno",
            "KYVERNO_POD_NAME": "kyverno-bench",
            "INIT_CONFIG": "kyverno",
            "METRICS_CONFIG": "kyverno-metrics",
            "GOMAXPROCS": "2",
        }
        args = [
            str(binary),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--serverIP=127.0.0.1:{port}",
            "--webhookServerHost=127.0.0.1",
            f"--webhookServerPort={port}",
            f"--servicePort={port}",
            "--metricsHost=127.0.0.1",
            f"--metricsPort={_free_port()}",
            f"--controllerRuntimeMetricsAddress=127.0.0.1:{_free_port()}",
            f"--profilePort={_free_port()}",
            # as its chart names them (the Service it would have is kyverno-svc)
            f"--caSecretName=kyverno-svc.{KYVERNO_NS}.svc.kyverno-tls-ca",
            f"--tlsSecretName=kyverno-svc.{KYVERNO_NS}.svc.kyverno-tls-pair",
            f"--backgroundServiceAccountName=system:serviceaccount:{KYVERNO_NS}:kyverno-background",
            f"--reportsServiceAccountName=system:serviceaccount:{KYVERNO_NS}:kyverno-reports",
            "--admissionReports=false",
            "--omitEvents=PolicyApplied,PolicySkipped,PolicyViolation,PolicyError",
            "--loggingFormat=text",
        ]
        with open(workdir / "kyverno.log", "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, env=env, start_new_session=True,
            )  # fmt: skip
        items = kyverno_documents(self.create.policy)
        if bench_cel.KYVERNO_CEL_NS in self.namespaces:
            items += bench_cel.kyverno_cel_documents(self.create.policy)
        docs = {"apiVersion": "v1", "kind": "List", "items": items}
        deadline = time.monotonic() + timeout
        while True:  # the CRDs are served a moment after they are created
            done = cluster.kubectl("apply", "-f", "-", input=json.dumps(docs), check=False)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise KyvernoUnavailable(f"the policies were not accepted: {done.stderr}")
            time.sleep(1)
        self.create.cases[CASE] = (BENCH_NS, "valid")
        self.create.added["create_added_ms_kyverno_pair"] = (CASE, "none")
        if bench_cel.KYVERNO_CEL_NS in self.namespaces:
            self.create.cases[CEL_CASE] = (bench_cel.KYVERNO_CEL_NS, "valid")
            self.create.added["create_added_ms_kyverno_cel_pair"] = (CEL_CASE, "none")
        self.create.stamped_namespaces.update(self.namespaces)
        for namespace in self.namespaces:
            self._wait_for_admission(deadline, namespace)
        self.log(f"kyverno ready in {time.monotonic() - started:.1f}s "
                 f"(build or cache {self.build_seconds:.1f}s)")  # fmt: skip

    def _wait_for_admission(self, deadline: float, namespace: str) -> None:
        bad = json.dumps(noncompliant_pods(self.create.pods["stamped"])["hostNetwork"]).encode()
        valid = self.create._bodies["valid"]
        while True:
            self._alive()
            denied = self.create.create(namespace, bad)[0] != 201
            status, answer, _ = self.create.create(namespace, valid)
            if denied and status == 201 and self.create._stamped(answer):
                return
            if time.monotonic() > deadline:
                raise KyvernoUnavailable(
                    f"Kyverno's admission not active in {namespace}: hostNetwork denied "
                    f"{denied}, valid pod "
                    f"{status} {bench_create._reason(answer)}"
                )
            time.sleep(1)

    def _alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            log = self.create.workdir / "kyverno" / "kyverno.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.is_file() else []
            raise KyvernoUnavailable("kyverno exited; its log ends:\n" + "\n".join(tail))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    # -- the comparisons --

    def agreement(self, namespace: str = BENCH_NS) -> dict[str, Any]:
        """The same Pods through runguard's pair (``bench-pair``) and Kyverno's
        (``namespace``): allowed or denied by each, and the share that agree."""
        return agreement(self.create, namespace, _kyverno_reason)

    def cpu_round(self, creates: int = 100) -> dict[str, float]:
        """CPU per create of Kyverno's process and of runguard's process tree, each
        namespace alone for a batch of ``creates`` (Kyverno, runguard, Kyverno again,
        the two Kyverno batches averaged), in us."""
        assert self.proc is not None and self.create.runguard is not None
        runguard_pid = self.create.runguard.pid
        assert runguard_pid is not None
        body = self.create._bodies["valid"]

        def batch(namespace: str, pids: list[int]) -> float:
            before = _cpu_seconds(pids)
            for _ in range(creates):
                status, answer, _ = self.create.create(namespace, body)
                if status != 201:
                    raise ClusterError(f"{namespace}: {status} {bench_create._reason(answer)}")
            return (_cpu_seconds(pids) - before) / creates * 1e6

        kyverno = [self.proc.pid]
        first = batch(BENCH_NS, kyverno)
        runguard = batch(NS["pair"], process_tree(runguard_pid))
        second = batch(BENCH_NS, kyverno)
        out = {"kyverno_cpu_us_pair": (first + second) / 2, "runguard_cpu_us_pair": runguard}
        if bench_cel.KYVERNO_CEL_NS in self.namespaces:
            out["kyverno_cel_cpu_us_pair"] = batch(bench_cel.KYVERNO_CEL_NS, kyverno)
        return out


def agreement(
    create: CreateLatency, namespace: str, reason: Callable[[JSON], str]
) -> dict[str, Any]:
    """The same Pods (the valid run, the run as written, the stamped run, the
    non-compliant ones; ``not-platform`` as cluster-admin) through runguard's pair and
    through ``namespace``: allowed or denied by each, and the share that agree; and where
    both allowed, which parts of the two objects differ (``differs``: the spec's fields,
    labels, annotations but runguard's platform records, which no peer writes)."""
    valid, stamped = create.pods["valid"], create.pods["stamped"]
    pods = {"valid": valid, "as written": create.pods["full"],
            "stamped": stamped, **noncompliant_pods(stamped)}  # fmt: skip
    rows = []
    differs: dict[str, list[str]] = {}
    for name, pod in pods.items():
        body = json.dumps(pod).encode()
        as_admin = name == "not-platform"
        runguard = create.create(NS["pair"], body, as_admin)
        other = create.create(namespace, body, as_admin)
        said = (
            bench_create._reason(runguard[1]) if runguard[0] != 201 else "allowed",
            reason(other[1]) if other[0] != 201 else "allowed",
        )
        rows.append((name, runguard[0] == 201, other[0] == 201, *said))
        if runguard[0] == other[0] == 201:
            differs[name] = _differences(runguard[1], other[1])
    same = sum(1 for row in rows if row[1] == row[2])
    return {"rows": rows, "same": same, "total": len(rows), "share": same / len(rows),
            "differs": differs}  # fmt: skip


def _differences(ours: JSON, theirs: JSON) -> list[str]:
    """The parts of two created Pods that differ: spec fields (containers by name and
    field), labels, annotations (runguard's platform records left out)."""
    out = []

    def meta(pod: JSON, part: str) -> JSON:
        found: JSON = dict(pod.get("metadata", {}).get(part) or {})
        for key in (PLATFORM_RECORD, PLATFORM_POLICY):
            found.pop(key, None)
        return found

    for part in ("labels", "annotations"):
        if meta(ours, part) != meta(theirs, part):
            out.append(f"metadata.{part}")
    spec, other = ours.get("spec", {}), theirs.get("spec", {})
    for field in sorted(set(spec) | set(other)):
        if field in ("containers", "initContainers"):
            mine = {c["name"]: c for c in spec.get(field) or []}
            yours = {c["name"]: c for c in other.get(field) or []}
            for cname in sorted(set(mine) | set(yours)):
                a, b = mine.get(cname, {}), yours.get(cname, {})
                out += [f"{field}[{cname}].{k}" for k in sorted(set(a) | set(b))
                        if a.get(k) != b.get(k)]  # fmt: skip
        elif spec.get(field) != other.get(field):
            out.append(f"spec.{field}")
    return out


def _kyverno_reason(answer: JSON) -> str:
    message = str(answer.get("message", answer))
    ids = sorted(set(re.findall(r"\[([a-z]+\.[a-z-]+)\]", message)))  # the CEL pair's messages
    if ids:
        return f"denied (kyverno): {', '.join(ids)}"
    rules = sorted(set(re.findall(r"\b(?:runguard-bench-validate|" + VALIDATE_NAME + r"):\s*\n?\s*"
                                  r"([a-z0-9-]+)", message)))  # fmt: skip
    return f"denied (kyverno): {', '.join(rules) or message[:60]}"


def print_agreement(
    agreement: dict[str, Any], log: Callable[[str], None] = print, peer: str = "Kyverno"
) -> None:
    log(f"decision agreement with {peer}, the same Pods through both: "
        f"{agreement['same']}/{agreement['total']} on allowed/denied")  # fmt: skip
    width = max(len(row[0]) for row in agreement["rows"])
    for name, _, _, runguard, other in agreement["rows"]:
        log(f"  {name:<{width}}  runguard {runguard[:50]:<50} | {peer} {other[:60]}")
    differs = agreement.get("differs", {})
    alike = sum(1 for parts in differs.values() if not parts)
    log(f"  allowed by both: {len(differs)}, the same object {alike}; where they differ:")
    for name, parts in differs.items():
        if parts:
            log(f"    {name}: {', '.join(parts)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=100)
    parser.add_argument("--write-policy", action="store_true",
                        help="write bench/kyverno/policy.yaml and exit")  # fmt: skip
    parser.add_argument("--check-policy", action="store_true",
                        help="exit 1 unless bench/kyverno/policy.yaml is what policies/ "
                        "renders now")  # fmt: skip
    args = parser.parse_args(argv)
    policy = load_policy(bench_create.POLICY_DIR)
    text = kyverno_text(policy)
    if args.check_policy:
        shipped = POLICY_FILE.read_text() if POLICY_FILE.is_file() else ""
        kinds = [d["kind"] for d in yaml.safe_load_all(shipped)]
        if shipped == text and kinds == ["ClusterPolicy", "ClusterPolicy"]:
            return 0
        print(f"{POLICY_FILE}: differs from what policies/ renders (run --write-policy)",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.write_policy:
        POLICY_FILE.write_text(text)
        print(f"wrote {POLICY_FILE}")
        return 0
    rounds, cpu = [], []
    with CreateLatency(log=lambda line: print(line, flush=True)) as create:
        side = KyvernoSide(create)
        try:
            side.start()
            print_agreement(side.agreement())
            for i in range(max(1, args.rounds)):
                rounds.append(create.round(args.creates, 60.0))
                cpu.append(side.cpu_round(args.creates))
                print(f"round {i + 1}: runguard pair +{rounds[-1]['create_added_ms_pair']:.2f} ms, "
                      f"kyverno +{rounds[-1]['create_added_ms_kyverno_pair']:.2f} ms; CPU per "
                      f"create: runguard {cpu[-1]['runguard_cpu_us_pair']:.0f} us, kyverno "
                      f"{cpu[-1]['kyverno_cpu_us_pair']:.0f} us", flush=True)  # fmt: skip
        finally:
            side.stop()
    medians, ranges = bench_create.summarize([{**r, **c} for r, c in zip(rounds, cpu, strict=True)])
    keys = ["create_added_ms_pair", "create_added_ms_kyverno_pair", "runguard_cpu_us_pair",
            "kyverno_cpu_us_pair"]  # fmt: skip
    figures = {key: medians[key] for key in keys}
    print(json.dumps({**figures, "ranges": {key: ranges[key] for key in keys}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
