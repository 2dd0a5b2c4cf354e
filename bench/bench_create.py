"""What admission adds to a Pod create through the real e2e kube-apiserver (not a test).

Starts etcd + kube-apiserver (``tests/e2e/cluster.py``, the cached e2e binaries), one
``runguard serve`` with the repository's ``policies/``, and registers in the same
cluster, without reconfiguring anything between measurements:

* namespace ``bench-none``: no admission at all;
* ``bench-validate``: runguard's ValidatingWebhookConfiguration only;
* ``bench-pair``: runguard's MutatingWebhookConfiguration and ValidatingWebhookConfiguration;
* ``bench-vap``: a ValidatingAdmissionPolicy (CEL, in the apiserver's process) carrying
  the validation rules runguard's ``/validate`` applies to a run Pod
  (``bench/vap/policy.yaml``, rendered from the loaded policy by ``vap_documents``);
* ``bench-pair-floor``: runguard's two webhooks and its floor (``runguard manifests``'
  ValidatingAdmissionPolicies, ``webhook/install/floor.py``): what the floor adds to a
  run's create beside the pair (``create_added_ms_floor``, over ``bench-pair``).

The webhook configurations are ``runguard manifests``' own, each webhook given one
more ``namespaceSelector`` term (``kubernetes.io/metadata.name In [...]``); the VAP's
binding selects ``bench-vap`` the same way.

The Pod is the typical GPU run of ``typical_run_pod()`` made a valid platform run:
profile ``1xt4`` instead of ``1xa100`` (with the sidecar, the 1xa100 profile's 64Gi limit
puts the run over the policy's 64Gi maximum for one run), passed once through runguard's
mutation offline (``webhook.engine.mutate``), its stamp removed (``bench-validate`` gets it
with the stamp: ``/validate`` alone requires the one ``/mutate`` writes). It is created as the
platform (``system:serviceaccount:digitalhub:core``, a token) by server-side dry run
(``?dryRun=All``: nothing is stored) from one keep-alive HTTPS connection, alternating
the namespaces create by create, so every namespace sees the same moment of this shared
machine. Every answer must be 201; in ``bench-pair`` the stamp runguard's mutation writes
(``runguard.io/requested-by``) must be in the object returned. Reported beside it:

* ``pair_full_patch``: ``typical_run_pod()`` (1xt4) as the user wrote it through both
  webhooks (a 21-operation patch: profile, root, secrets, volumes), minus the same Pod
  with no admission (``none_full``);
* ``pair_empty_patch``: the valid Pod with the stamp already right (mutation changes
  nothing: an empty patch);
* ``vap_trivial``: a VAP matching the same Pods with one validation, ``true``, bound to
  ``bench-vap-trivial`` (the VAP machinery's fixed cost, before any rule);
* ``runguard_direct_validate_ms`` / ``..._mutate_ms``: the same reviews sent straight to
  runguard over one keep-alive TLS connection (runguard's cost, loopback included);
* where the time goes: each case alone for a batch, between two scrapes of the
  apiserver's and runguard's ``/metrics`` histograms (the request, the admit and
  validate steps, each admission plugin, each webhook call as the apiserver times it,
  the matchConditions of runguard's other webhooks, runguard's own time per review),
  in ms per create;
* the connections the apiserver opened to runguard (does it keep them alive?).

Before measuring, non-compliant Pods go to ``bench-validate`` and ``bench-vap``: both
must deny each (printed). Prints a table (median [min-max] over rounds), the load
average, and as its last line one JSON object. Bounded: ``--rounds`` x ``--creates``
per case, each round also capped by ``--round-seconds``; about 3 minutes by default,
cluster start included. Every process started here is stopped on exit.

    .venv/bin/python bench/bench_create.py [--rounds 5] [--creates 200]
    .venv/bin/python bench/bench_create.py --write-vap   # re-render bench/vap/policy.yaml

From another benchmark::

    bench = CreateLatency(); bench.start()
    try:
        rounds = [bench.round(200) for _ in range(5)]
    finally:
        bench.stop()
    medians, ranges = summarize(rounds)
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trivial_app
import yaml
from bench_config import BENCH, POLICY_DIR, REPO
from e2e.cluster import Cluster, ClusterError, build_binaries
from e2e.devcluster import Runguard, prepare_cluster
from harness import slow_clients
from harness.workloads import typical_run_pod

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.rules.pod_security import (
    RESTRICTED_VOLUME_TYPES,
    SAFE_SYSCTLS,
    SELINUX_TYPES,
)
from webhook.install.floor import FLOOR_PREFIX, floor_policies
from webhook.install.manifests import name_regex, selector_expression
from webhook.keys import REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import NamePattern, Policy, RunPolicy
from webhook.policy.patterns import split

JSON = dict[str, Any]

VAP_FILE = BENCH / "vap" / "policy.yaml"
VAP_NAME = "runguard-bench-digitalhub"
TRIVIAL_VAP_NAME = "runguard-bench-trivial"  # one validation, `true`: the VAP's fixed cost
RUN_POLICY = "digitalhub"  # the RunPolicy of policies/ that judges the benchmark's Pod
PLATFORM = ("digitalhub", "core")  # namespace, ServiceAccount: the platform identity
NS = {
    "none": "bench-none",
    "validate": "bench-validate",
    "pair": "bench-pair",
    "vap": "bench-vap",
    "vap_trivial": "bench-vap-trivial",
    "pair_floor": "bench-pair-floor",
}
# Which namespaces each of runguard's configurations serves.
WEBHOOK_NAMESPACES = {
    "MutatingWebhookConfiguration": [NS["pair"], NS["pair_floor"]],
    "ValidatingWebhookConfiguration": [NS["validate"], NS["pair"], NS["pair_floor"]],
}
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
# case -> (namespace, pod variant); the first four give the three targets
CASES: dict[str, tuple[str, str]] = {
    "none": (NS["none"], "valid"),
    "validate": (NS["validate"], "stamped"),  # /validate alone requires the stamp
    "pair": (NS["pair"], "valid"),
    "vap": (NS["vap"], "valid"),
    "none_full": (NS["none"], "full"),
    "pair_full_patch": (NS["pair"], "full"),
    "pair_empty_patch": (NS["pair"], "stamped"),
    "vap_trivial": (NS["vap_trivial"], "valid"),
    "pair_floor": (NS["pair_floor"], "valid"),
}
ADDED = {  # reported figure -> (case, its baseline)
    "create_added_ms_validate": ("validate", "none"),
    "create_added_ms_pair": ("pair", "none"),
    "create_added_ms_vap": ("vap", "none"),
    "create_added_ms_pair_full_patch": ("pair_full_patch", "none_full"),
    "create_added_ms_pair_empty_patch": ("pair_empty_patch", "none"),
    "create_added_ms_vap_trivial": ("vap_trivial", "none"),
    "create_added_ms_pair_floor": ("pair_floor", "none"),
    "create_added_ms_floor": ("pair_floor", "pair"),  # the floor beside the pair
}
TARGETS = {"create_added_ms_validate": 1.5, "create_added_ms_pair": 2.5}  # x ..._vap
MAX_ROUNDS, MAX_CREATES = 20, 2000
UNLISTED_PRIORITY = "bench-unlisted"  # exists in the cluster, not in the policy's list


# --- the Pods -------------------------------------------------------------------------


def run_policy(policy: Policy, name: str = RUN_POLICY) -> RunPolicy:
    for chosen in policy.run_policies:
        if chosen.name == name:
            return chosen
    raise SystemExit(f"bench_create: no RunPolicy {name!r} in {POLICY_DIR}")


def platform_requester() -> Requester:
    namespace, account = PLATFORM
    return Requester(
        f"system:serviceaccount:{namespace}:{account}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def full_pod() -> JSON:
    """bench_http's typical GPU run as the user writes it, on the 1xt4 profile (with
    its sidecar, 1xa100's 64Gi memory limit is over the 64Gi maximum for one run)."""
    pod = typical_run_pod()
    pod["metadata"]["labels"]["dhcore/template"] = "1xt4"
    return pod


def pods(policy: RunPolicy) -> dict[str, JSON]:
    """``full`` (as written), ``valid`` (runguard's mutation of it, without the stamp:
    mutation only stamps it; allowed by the pair, the VAP and no admission) and
    ``stamped`` (mutation changes nothing; allowed by /validate alone, which requires
    the stamp runguard's mutation writes at CREATE)."""
    context = Context(requester=platform_requester())
    alone = Policy.of(policy)  # the RunPolicy judged alone
    full = full_pod()
    mutated = mutate(full, alone, namespace=NS["pair"], context=context)
    if not mutated.allowed or not mutated.mutations:
        raise SystemExit(f"bench_create: runguard does not mutate the pod: {mutated.message()}")
    stamped = copy.deepcopy(mutated.object)
    valid = copy.deepcopy(stamped)
    del valid["metadata"]["annotations"][REQUESTED_BY]
    for name, pod in (("stamped", stamped),):
        decision = validate(pod, alone, namespace=NS["validate"], context=context)
        if not decision.allowed:
            raise SystemExit(f"bench_create: the {name} pod is denied: {decision.message()}")
    if [c.rule for c in mutate(valid, alone, namespace=NS["pair"], context=context).mutations] != [
        "ownership.stamp"
    ]:
        raise SystemExit("bench_create: mutating the valid pod does more than stamp it")
    if mutate(stamped, alone, namespace=NS["pair"], context=context).mutations:
        raise SystemExit("bench_create: mutating the stamped pod is not an empty patch")
    return {"full": full, "valid": valid, "stamped": stamped}


def noncompliant_pods(valid: JSON) -> dict[str, JSON]:
    """Pods both /validate and the VAP must deny (as the platform, except ``not-platform``),
    each one change from ``valid`` (the ``stamped`` Pod: /validate alone allows it)."""

    def edit(change: Callable[[JSON], None]) -> JSON:
        pod = copy.deepcopy(valid)
        change(pod)
        return pod

    def main(pod: JSON) -> JSON:
        container: JSON = pod["spec"]["containers"][0]
        return container

    def sidecar(pod: JSON) -> JSON:
        container: JSON = pod["spec"]["containers"][1]
        return container

    host = {"name": "host", "hostPath": {"path": "/var/run"}}
    return {
        "unknown profile": edit(lambda p: p["metadata"]["labels"].update(
            {"dhcore/template": "8xh100"})),
        "root user": edit(lambda p: p["spec"]["securityContext"].update({"runAsUser": 0})),
        "privileged": edit(lambda p: sidecar(p)["securityContext"].update(
            {"privileged": True, "allowPrivilegeEscalation": True})),
        "escalation unset": edit(lambda p: main(p)["securityContext"].pop(
            "allowPrivilegeEscalation")),
        "capability added": edit(lambda p: main(p)["securityContext"]["capabilities"].update(
            {"add": ["NET_ADMIN"]})),
        "hostNetwork": edit(lambda p: p["spec"].update({"hostNetwork": True})),
        "hostPath volume": edit(lambda p: p["spec"]["volumes"].append(host)),
        "foreign claim": edit(lambda p: p["spec"]["volumes"].append(
            {"name": "old", "persistentVolumeClaim": {"claimName": "someone-elses"}})),
        "foreign secret": edit(lambda p: main(p)["env"].append(
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "other", "key": "t"}}})),
        "cpu over maximum": edit(lambda p: main(p)["resources"].update(
            {"limits": {**main(p)["resources"]["limits"], "cpu": "32"}})),
        "no memory request": edit(lambda p: sidecar(p).update(
            {"resources": {"requests": {"cpu": "100m"}}})),
        "profile not applied": edit(lambda p: main(p)["resources"]["requests"].update(
            {"cpu": "2"})),
        "device env": edit(lambda p: main(p)["env"].append(
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})),
        "priority class": edit(lambda p: p["spec"].update(
            {"priorityClassName": UNLISTED_PRIORITY})),
        "not-platform": copy.deepcopy(valid),  # sent as cluster-admin, not the platform
    }  # fmt: skip


# --- the ValidatingAdmissionPolicy ---------------------------------------------------


def _cel(value: Any) -> str:
    """A CEL literal of a string, or a list or map of strings."""
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a CEL string (\" \\ \uXXXX escapes)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_cel(k)}: {_cel(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_cel(v) for v in value) + "]"


def _pattern_pieces(pattern: NamePattern) -> list[str]:
    """CEL strings of a runguard name pattern's pieces between its ``*``s, each
    ``{labels[KEY]}`` the Pod's label (absent: a NUL, which no name holds)."""
    literals, keys = split(pattern.text)
    pieces: list[list[str]] = [[]]
    for i, literal in enumerate(literals):
        for j, chunk in enumerate(literal.split("*")):
            if j:
                pieces.append([])
            if chunk:
                pieces[-1].append(_cel(chunk))
        if i < len(keys):
            label = f"object.metadata.?labels[?{_cel(keys[i])}].orValue({_cel(chr(0))})"
            pieces[-1].append(label)
    return [" + ".join(piece) or "''" for piece in pieces]


def _name_matches(name: str, patterns: Sequence[NamePattern]) -> str:
    """CEL: the string ``name`` is one the patterns give this Pod. String comparisons
    where the pattern names a label (a regex built per request would be compiled per
    request), a constant regex otherwise (compiled once with the policy)."""
    alternatives = []
    for pattern in patterns:
        if not pattern.label_keys:
            regex = name_regex([pattern])
            assert regex is not None
            alternatives.append(f"{name}.matches({_cel(regex)})")
            continue
        pieces = _pattern_pieces(pattern)
        if len(pieces) == 1:
            alternatives.append(f"{name} == {pieces[0]}")
        elif len(pieces) == 2:
            first, last = pieces
            alternatives.append(
                f"({name}.startsWith({first}) && {name}.endsWith({last}) && "
                f"size({name}) >= size({first}) + size({last}))"
            )
        else:  # rare: more than one * around a label
            regex = " + '.*' + ".join(f"({p}).replace('.', {_cel(chr(92) + '.')})" for p in pieces)
            alternatives.append(f"{name}.matches('^' + {regex} + '$')")
    return "(" + " || ".join(alternatives) + ")" if alternatives else "false"


PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
VOLUME_TYPES = (  # every inline volume source of a 1.33 Pod
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
    "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker",
    "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs",
    "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume", "projected",
    "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
)  # fmt: skip


def vap_rules(policy: RunPolicy) -> list[tuple[str, str, str]]:
    """(runguard rule ids, CEL expression, message) of each validation."""
    res, sec, vol = policy.resources, policy.security, policy.volumes
    restricted = sec.level == "restricted"
    maximums = {name: str(value) for name, value in res.maximums.items()}
    gpu = res.gpu_resource_name
    C = "variables.containers"
    rules: list[tuple[str, str, str]] = []

    def add(rule: str, expression: str, message: str) -> None:
        rules.append((rule, " ".join(expression.split()), f"[{rule}] {message}"))

    # profile
    names = sorted(policy.profiles)
    add("profile.unknown", f"variables.profile == '' || variables.profile in {_cel(names)}",
        f"the profile named in {policy.profiles_config.label} does not exist")  # fmt: skip
    applied = []
    for name in names:
        prof = policy.profiles[name]
        conds = []
        for part in ("requests", "limits"):
            for resource, value in getattr(prof.resources, part).items():
                resource = gpu if resource == "gpu" else resource
                conds.append(
                    f"variables.main.?resources.?{part}[?{_cel(resource)}].hasValue() && "
                    f"quantity(variables.main.resources.{part}[{_cel(resource)}])"
                    f".compareTo(quantity({_cel(str(value))})) == 0"
                )
        for key, value in prof.node_selector.items():
            conds.append(f"object.spec.?nodeSelector[?{_cel(key)}] == optional.of({_cel(value)})")
        for tol in prof.tolerations:
            match = " && ".join(
                f"t.?{field} == optional.of({_cel(str(value))})" for field, value in tol.items()
            )
            conds.append(f"object.spec.?tolerations.orValue([]).exists(t, {match})")
        for field in ("priority_class_name", "runtime_class_name"):
            value = getattr(prof, field)
            if value is not None:
                camel = re.sub(r"_(.)", lambda m: m.group(1).upper(), field)
                conds.append(f"object.spec.?{camel} == optional.of({_cel(value)})")
        for env in prof.env:
            if "value" in env:
                conds.append(
                    f"variables.main.?env.orValue([]).exists(e, e.name == {_cel(env['name'])} "
                    f"&& e.?value == optional.of({_cel(env['value'])}))"
                )
        applied.append(f"(variables.profile == {_cel(name)} && {' && '.join(conds or ['true'])})")
    add("profile.applied", " || ".join(["!(variables.profile in " + _cel(names) + ")", *applied]),
        "the profile's values are not applied to the main container and the pod")  # fmt: skip

    # resources
    defaults = res.defaults
    for part in ("requests", "limits"):
        wanted = sorted(getattr(defaults, part))
        if wanted:
            have = " && ".join(f"c.?resources.?{part}[?{_cel(r)}].hasValue()" for r in wanted)
            add("resources.defaults", f"{C}.all(c, {have})",
                f"every container sets {part} {', '.join(wanted)}")  # fmt: skip
    if res.memory_limit_factor is not None:
        add("resources.memory-limit", f"{C}.all(c, c.?resources.?limits[?'memory'].hasValue())",
            "every container sets a memory limit")  # fmt: skip
    if maximums:
        add("resources.exceeded", f"{C}.all(c, c.?resources.?requests.orValue({{}}).all(r, "
            "!(r in variables.maximums) "
            "|| !quantity(c.resources.requests[r]).isGreaterThan(variables.maximums[r]))"
            f" && c.?resources.?limits.orValue({{}}).all(r, !(r in variables.maximums) "
            "|| !quantity(c.resources.limits[r]).isGreaterThan(variables.maximums[r])))",
            "a request or limit is above the policy's maximum")  # fmt: skip
        totals = []
        for resource in maximums:
            for part in ("requests", "limits"):
                totals.append(
                    f"variables.runContainers.map(c, quantity(c.?resources.?{part}"
                    f"[?{_cel(resource)}].orValue('0')).asApproximateFloat()).sum() <= "
                    f"variables.maximums[{_cel(resource)}].asApproximateFloat()"
                )
        add("resources.exceeded", " && ".join(totals),
            "the run's total (containers and sidecars summed) is above a maximum")  # fmt: skip
    add("resources.clamped", f"{C}.all(c, c.?resources.?requests.orValue({{}}).all(r, "
        "!c.?resources.?limits[?r].hasValue() || "
        "!quantity(c.resources.requests[r]).isGreaterThan(quantity(c.resources.limits[r]))))",
        "a request is above its limit")  # fmt: skip
    add("resources.gpu-mismatch", f"{C}.all(c, "
        f"c.?resources.?requests[?{_cel(gpu)}].orValue('0') == "
        f"c.?resources.?limits[?{_cel(gpu)}].orValue('0') || "
        f"(c.?resources.?requests[?{_cel(gpu)}].hasValue() && "
        f"c.?resources.?limits[?{_cel(gpu)}].hasValue() && "
        f"quantity(c.resources.requests[{_cel(gpu)}]).compareTo("
        f"quantity(c.resources.limits[{_cel(gpu)}])) == 0))",
        "the gpu request differs from the gpu limit")  # fmt: skip
    if res.device_env:
        add("resources.device-env", f"{C}.all(c, c.?env.orValue([]).all(e, "
            f"!(e.name in {_cel(list(res.device_env))})))",
            "a variable selecting devices outside the pod's requests")  # fmt: skip

    # security
    psc = "object.spec.?securityContext"
    if sec.on_root != "Allow":
        add("security.root", f"{psc}.?runAsUser.orValue(1) != 0 && {psc}.?runAsGroup.orValue(1) "
            f"!= 0 && {psc}.?fsGroup.orValue(1) != 0 && !{psc}.?supplementalGroups.orValue([])"
            f".exists(g, g == 0) && {C}.all(c, c.?securityContext.?runAsUser.orValue(1) != 0 && "
            "c.?securityContext.?runAsGroup.orValue(1) != 0)",
            "a user or group id 0")  # fmt: skip
        add("security.root", f"{C}.all(c, c.?securityContext.?runAsNonRoot.orValue("
            f"{psc}.?runAsNonRoot.orValue(false)) == true)",
            "runAsNonRoot is not true for every container")  # fmt: skip
        add("security.defaults", f"{psc}.?runAsNonRoot == optional.of(true)",
            "the pod's runAsNonRoot is not set")  # fmt: skip
    add("security.privileged", f"{C}.all(c, c.?securityContext.?privileged.orValue(false) == "
        "false && c.?securityContext.?allowPrivilegeEscalation == optional.of(false) && "
        "c.?securityContext.?windowsOptions.?hostProcess.orValue(false) == false) && "
        f"{psc}.?windowsOptions.?hostProcess.orValue(false) == false",
        "a privileged container, privilege escalation not disabled, or a host process")  # fmt: skip
    allowed_caps = sorted(sec.allowed_capabilities)
    drop = list(sec.drop_capabilities) or (["ALL"] if restricted else [])
    add("security.capabilities", f"{C}.all(c, c.?securityContext.?capabilities.?add.orValue([])"
        f".all(a, a in {_cel(allowed_caps)}) && "
        + " && ".join(f"c.?securityContext.?capabilities.?drop.orValue([]).exists(d, d == "
                      f"{_cel(d)})" for d in drop) + ")",
        f"capabilities added, or {', '.join(drop)} not dropped")  # fmt: skip
    add("security.host-namespace", "!object.spec.?hostNetwork.orValue(false) && "
        "!object.spec.?hostPID.orValue(false) && !object.spec.?hostIPC.orValue(false)",
        "host network, PID or IPC namespace")  # fmt: skip
    add("security.host-ports", f"{C}.all(c, c.?ports.orValue([]).all(p, "
        "p.?hostPort.orValue(0) == 0))", "a hostPort")  # fmt: skip
    add("security.sysctls", f"{psc}.?sysctls.orValue([]).all(s, s.name in "
        f"{_cel(sorted(SAFE_SYSCTLS))})", "an unsafe sysctl")  # fmt: skip
    selinux = _cel(sorted(SELINUX_TYPES))
    add("security.selinux", f"{psc}.?seLinuxOptions.?type.orValue('') in {selinux} && "
        f"!{psc}.?seLinuxOptions.?user.hasValue() && !{psc}.?seLinuxOptions.?role.hasValue() && "
        f"{C}.all(c, c.?securityContext.?seLinuxOptions.?type.orValue('') in {selinux} && "
        "!c.?securityContext.?seLinuxOptions.?user.hasValue() && "
        "!c.?securityContext.?seLinuxOptions.?role.hasValue())",
        "an SELinux user, role or type outside the standard's list")  # fmt: skip
    add("security.apparmor", f"{psc}.?appArmorProfile.?type != optional.of('Unconfined') && "
        f"{C}.all(c, c.?securityContext.?appArmorProfile.?type != optional.of('Unconfined')) && "
        "object.metadata.?annotations.orValue({}).all(k, "
        "!k.startsWith('container.apparmor.security.beta.kubernetes.io/') || "
        "object.metadata.annotations[k] != 'unconfined')",
        "AppArmor Unconfined")  # fmt: skip
    seccomp = f"{psc}.?seccompProfile.?type.orValue('') in ['RuntimeDefault', 'Localhost']"
    add("security.seccomp", f"{seccomp} && {C}.all(c, "
        "c.?securityContext.?seccompProfile.?type.orValue('') != 'Unconfined')",
        "no pod seccomp profile, or Unconfined")  # fmt: skip
    add("security.proc-mount", f"{C}.all(c, c.?securityContext.?procMount.orValue('Default') "
        "!= 'Unmasked')", "procMount Unmasked")  # fmt: skip
    handlers = [f"c.?{p}" for p in PROBES] + [
        f"c.?lifecycle.?{h}" for h in ("postStart", "preStop")
    ]
    no_host = " && ".join(
        f"{h}.?httpGet.?host.orValue('') == '' && {h}.?tcpSocket.?host.orValue('') == ''"
        for h in handlers
    )
    add("security.probe-host", f"{C}.all(c, {no_host})", "a probe or handler with a host")

    # volumes
    allowed_types = set(vol.allowed_types)
    if restricted:
        allowed_types &= RESTRICTED_VOLUME_TYPES
    forbidden = [t for t in VOLUME_TYPES if t not in allowed_types]
    add("volumes.forbidden-type", "variables.volumes.all(v, "
        + " && ".join(f"!has(v.{t})" for t in forbidden) + ")",
        f"a volume type outside {', '.join(sorted(allowed_types))}")  # fmt: skip
    config_map_ok = _name_matches("v.configMap.?name.orValue('')", vol.platform_config_maps)
    add("volumes.pre-existing", "variables.volumes.all(v, "
        f"(!has(v.persistentVolumeClaim) || "
        f"{_name_matches('v.persistentVolumeClaim.claimName', vol.platform_claims)}) && "
        f"(!has(v.configMap) || "
        f"{config_map_ok}) && "
        "v.?projected.?sources.orValue([]).all(s, !has(s.configMap))"
        " && (!has(v.ephemeral) || !has(v.ephemeral.volumeClaimTemplate) || ("
        "!has(v.ephemeral.volumeClaimTemplate.spec.dataSource) && "
        "!has(v.ephemeral.volumeClaimTemplate.spec.dataSourceRef) && "
        "!has(v.ephemeral.volumeClaimTemplate.spec.volumeName) && "
        "!has(v.ephemeral.volumeClaimTemplate.spec.selector))))",
        "a claim or configMap the platform did not create for this run")  # fmt: skip

    def ok(name: str) -> str:
        return _name_matches(name, policy.secrets.allowed)

    env_secret = "e.?valueFrom.?secretKeyRef.?name.orValue('')"
    add("secrets.forbidden", f"{C}.all(c, c.?env.orValue([]).all(e, "
        f"!e.?valueFrom.?secretKeyRef.hasValue() || {ok(env_secret)}) && "
        "c.?envFrom.orValue([]).all(e, "
        f"!has(e.secretRef) || {ok('e.secretRef.?name.orValue(EMPTY)')})) && "
        f"variables.volumes.all(v, (!has(v.secret) || {ok('v.secret.?secretName.orValue(EMPTY)')})"
        " && v.?projected.?sources.orValue([]).all(s, !has(s.secret) || "
        f"{ok('s.secret.?name.orValue(EMPTY)')})) && "
        f"object.spec.?imagePullSecrets.orValue([]).all(r, {ok('r.?name.orValue(EMPTY)')})"
        .replace("EMPTY", "''"),
        "a secret outside secrets.allowed")  # fmt: skip
    if policy.platform.identities:
        users = [i for i in policy.platform.identities if not i.startswith("group:")]
        groups = [i[len("group:") :] for i in policy.platform.identities if i.startswith("group:")]
        add("volumes.pre-existing", f"!variables.usesPlatformObjects || "
            f"request.userInfo.username in {_cel(users)} || "
            f"request.userInfo.?groups.orValue([]).exists(g, g in {_cel(groups)})",
            "the platform's objects in a run the platform did not create "
            "(also secrets.forbidden)")  # fmt: skip

    # scheduling
    classes = policy.scheduling.priority_classes.allowed
    if classes is not None:
        add("scheduling.priority-class", "!has(object.spec.priorityClassName) || "
            f"object.spec.priorityClassName in {_cel(sorted(classes))}",
            "a priority class not allowed")  # fmt: skip
    return rules


def vap_variables(policy: RunPolicy) -> list[dict[str, str]]:
    label = policy.profiles_config.label
    vol, sec = policy.volumes, policy.secrets
    any_claim = _cel(name_regex(vol.platform_claims) or "^$.")
    any_config_map = _cel(name_regex(vol.platform_config_maps) or "^$.")
    any_secret = _cel(name_regex(sec.allowed) or "^$.")
    uses = (
        f"variables.volumes.exists(v, v.?persistentVolumeClaim.?claimName.orValue('')"
        f".matches({any_claim}) || v.?configMap.?name.orValue('').matches({any_config_map}) || "
        f"v.?secret.?secretName.orValue('').matches({any_secret}) || "
        "v.?projected.?sources.orValue([]).exists(s, "
        f"s.?configMap.?name.orValue('').matches({any_config_map}) || "
        f"s.?secret.?name.orValue('').matches({any_secret}))) || "
        "variables.containers.exists(c, c.?env.orValue([]).exists(e, "
        f"e.?valueFrom.?secretKeyRef.?name.orValue('').matches({any_secret}) || "
        f"e.?valueFrom.?configMapKeyRef.?name.orValue('').matches({any_config_map})) || "
        "c.?envFrom.orValue([]).exists(e, "
        f"e.?secretRef.?name.orValue('').matches({any_secret}) || "
        f"e.?configMapRef.?name.orValue('').matches({any_config_map}))) || "
        f"object.spec.?imagePullSecrets.orValue([]).exists(r, "
        f"r.?name.orValue('').matches({any_secret}))"
    )
    main = "object.metadata.?annotations[?'runguard.io/main-container']"
    return [
        {"name": "containers",
         "expression": "object.spec.containers + object.spec.?initContainers.orValue([])"},
        {"name": "runContainers",
         "expression": "object.spec.containers + object.spec.?initContainers.orValue([])"
                       ".filter(c, c.?restartPolicy.orValue('') == 'Always')"},
        {"name": "volumes", "expression": "object.spec.?volumes.orValue([])"},
        {"name": "main",
         "expression": f"object.spec.containers.exists(c, optional.of(c.name) == {main}) ? "
                       f"object.spec.containers.filter(c, optional.of(c.name) == {main})[0] : "
                       "object.spec.containers[0]"},
        {"name": "profile",
         "expression": f"object.metadata.?labels[?{_cel(label)}].orValue("
                       f"object.metadata.?annotations[?{_cel(label)}].orValue(''))"},
        {"name": "maximums",  # parsed once per request
         "expression": "{" + ", ".join(f"{_cel(k)}: quantity({_cel(str(v))})"
                                       for k, v in policy.resources.maximums.items()) + "}"},
        {"name": "usesPlatformObjects", "expression": uses},
    ]  # fmt: skip


def vap_documents(full: Policy, namespaces: Sequence[str] = (NS["vap"],)) -> list[JSON]:
    """The ValidatingAdmissionPolicy and its binding: the RunPolicy's validation rules in
    CEL, for run Pods (its selector, not an earlier RunPolicy's) at CREATE in
    ``namespaces``."""
    ordered = list(full.run_policies)
    policy = run_policy(full)
    earlier_policies = ordered[: ordered.index(policy)]
    selector = policy.selector.to_dict()
    conditions = []
    for earlier in earlier_policies:  # tried first by name (docs/policy-reference.md): not ours
        expression = selector_expression(earlier.selector, "object.metadata.?labels.orValue({})")
        if expression is not None:
            conditions.append({"name": f"not-{earlier.name}", "expression": f"!({expression})"})
    validations = [
        {"expression": expression, "message": message}
        for _, expression, message in vap_rules(policy)
    ]
    vap: JSON = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": VAP_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": selector,
            },
            "matchConditions": conditions,
            "variables": vap_variables(policy),
            "validations": validations,
        },
    }
    if not conditions:
        del vap["spec"]["matchConditions"]
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": VAP_NAME},
        "spec": {
            "policyName": VAP_NAME,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": NAMESPACE_LABEL, "operator": "In", "values": list(namespaces)}
                    ]
                }
            },
        },
    }
    return [vap, binding]


def trivial_vap_documents(full: Policy) -> list[JSON]:
    """A VAP matching the same Pods with one validation that always holds, bound to
    ``bench-vap-trivial``: what the VAP machinery costs before any rule."""
    vap, binding = copy.deepcopy(vap_documents(full, (NS["vap_trivial"],)))
    vap["metadata"]["name"] = binding["metadata"]["name"] = TRIVIAL_VAP_NAME
    binding["spec"]["policyName"] = TRIVIAL_VAP_NAME
    vap["spec"].pop("matchConditions", None)
    vap["spec"].pop("variables", None)
    vap["spec"]["validations"] = [{"expression": "true", "message": "never"}]
    return [vap, binding]


def vap_text(policy: Policy) -> str:
    """bench/vap/policy.yaml: the documents, and which runguard rules they carry."""
    rules = sorted({rule for rule, _, _ in vap_rules(run_policy(policy))})
    header = (
        "# Generated by bench/bench_create.py --write-vap from policies/ (RunPolicy "
        f"{RUN_POLICY!r}): do not edit.\n"
        "# A ValidatingAdmissionPolicy carrying, in CEL, the validation rules runguard's\n"
        "# /validate applies to a run Pod, for bench_create.py's create-latency comparison.\n"
        "# runguard rule ids covered (one or more validations each):\n"
        + "".join(f"#   {rule}\n" for rule in rules)
        + "# Not covered: scope.labels and ownership.stamp (UPDATE only), ownership.unknown\n"
        "# and claims shared with a project (runguard's cluster cache), pods created by\n"
        "# controllers on behalf of the platform (owner stamps, by uid), pod-level\n"
        "# resources, the init-container sequence of the run totals, the exact mutation\n"
        "# backstop (runguard re-runs every mutation step: here only its outcome's fields).\n"
    )
    return header + yaml.dump_all(vap_documents(policy), Dumper=_Dumper, sort_keys=False, width=100)


class _Dumper(yaml.SafeDumper):
    """Long CEL expressions as folded blocks, which an admin can read."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if len(value) > 80 and "\n" not in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


# --- the cluster, runguard, and the registrations --------------------------------------


def floor_documents(policy: Policy) -> list[JSON]:
    """runguard's floor (``runguard manifests``' ValidatingAdmissionPolicies), each
    binding also limited to ``bench-pair-floor``."""
    out = copy.deepcopy(floor_policies(policy))
    for obj in out:
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            selector = obj["spec"]["matchResources"]["namespaceSelector"]
            selector.setdefault("matchExpressions", []).append(
                {"key": NAMESPACE_LABEL, "operator": "In", "values": [NS["pair_floor"]]}
            )
    return out


def _with_namespaces(configuration: JSON, namespaces: Sequence[str]) -> JSON:
    """runguard's configuration, each webhook also limited to ``namespaces``."""
    configuration = copy.deepcopy(configuration)
    for hook in configuration["webhooks"]:
        selector = hook.setdefault("namespaceSelector", {})
        selector.setdefault("matchExpressions", []).append(
            {"key": NAMESPACE_LABEL, "operator": "In", "values": list(namespaces)}
        )
    return configuration


def _webhook_connections(port: int) -> set[int]:
    """Local ports of the established TCP connections to 127.0.0.1:``port`` (the
    apiserver's connections to runguard, seen from its side)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                found.add(int(local.rsplit(":", 1)[1], 16))
    return found


# A connection idle this long is opened again before the next request (Go's servers close
# idle keep-alive connections after a while; a reconnect must not be timed as a create).
IDLE_REOPEN = 20.0


class Client:
    """One keep-alive HTTPS connection to a server, reconnecting if it is closed."""

    def __init__(self, port: int, context: ssl.SSLContext, headers: dict[str, str]) -> None:
        self.port = port
        self.context = context
        self.headers = {"Content-Type": "application/json", **headers}
        self.conn: http.client.HTTPSConnection | None = None
        self.connects = 0
        self.used = 0.0  # monotonic time of the last answer

    def post(self, path: str, body: bytes) -> tuple[int, bytes, float, http.client.HTTPMessage]:
        """Status, body, seconds from sending to the last byte, headers."""
        return self._request("POST", path, body)

    def get(self, path: str) -> bytes:
        """``GET path``, timed by no one (metrics scrapes)."""
        status, data, _, _ = self._request("GET", path, None)
        if status != 200:
            raise ClusterError(f"GET {path} answered {status}")
        return data

    def _request(
        self, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes, float, http.client.HTTPMessage]:
        """A kept-alive connection the server closed while idle (between rounds, the other
        benchmarks ran) is opened again and the request sent once more: dry-run creates
        and scrapes can be repeated."""
        if self.conn is not None and time.monotonic() - self.used > IDLE_REOPEN:
            self.close()  # the apiserver closes idle connections: do not time a reconnect
        fresh = self.conn is None
        try:
            return self._send(method, path, body)
        except (OSError, http.client.HTTPException):
            if fresh:
                raise
            return self._send(method, path, body)

    def _send(
        self, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes, float, http.client.HTTPMessage]:
        if self.conn is None:
            self.conn = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.context, timeout=30
            )
            self.conn.connect()
            assert self.conn.sock is not None
            self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connects += 1
        started = time.perf_counter()
        try:
            self.conn.request(method, path, body, self.headers)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        elapsed = time.perf_counter() - started
        self.used = time.monotonic()
        if response.will_close:
            self.close()
        return response.status, data, elapsed, response.headers

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# Histograms read around a batch of one case's creates: where the time goes, per create.
#   apiserver: the request, the admit (mutating) and validate steps, the webhook and
#   policy plugins, each webhook call as the apiserver times it, the matchConditions
#   of runguard's other webhooks; runguard: its own time per review.
APISERVER_HISTOGRAMS = (
    "apiserver_request_duration_seconds",
    "apiserver_admission_step_admission_duration_seconds",
    "apiserver_admission_controller_admission_duration_seconds",
    "apiserver_admission_webhook_admission_duration_seconds",
    "apiserver_admission_match_condition_evaluation_seconds",
)
RUNGUARD_HISTOGRAMS = ("runguard_admission_review_duration_seconds",)
PLUGINS = (
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "MutatingAdmissionPolicy",
    "ValidatingAdmissionPolicy",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*?)_sum(\{[^}]*\})? (\S+)$")


def histogram_sums(text: str, names: Sequence[str]) -> dict[str, float]:
    """``{"<name>{labels}": sum}`` of the named histograms, one key per series."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in names:
            out[f"{match.group(1)}{match.group(2) or ''}"] = float(match.group(3))
    return out


def _label(series: str, key: str) -> str:
    found = re.search(key + r'="([^"]*)"', series)
    return found.group(1) if found else ""


def _part(series: str) -> str | None:
    """What a series times, as the breakdown names it (None: not reported)."""
    name = series.partition("{")[0]
    if name == "apiserver_request_duration_seconds":
        pods = _label(series, "resource") == "pods" and _label(series, "subresource") == ""
        return "apiserver request" if pods and _label(series, "verb") == "POST" else None
    if name == "apiserver_admission_step_admission_duration_seconds":
        return f"admission step {_label(series, 'type')}"
    if name == "apiserver_admission_controller_admission_duration_seconds":
        plugin = _label(series, "name")
        return f"plugin {plugin}" if plugin in PLUGINS else None
    if name == "apiserver_admission_webhook_admission_duration_seconds":
        return f"webhook call {_label(series, 'name')}"
    if name == "apiserver_admission_match_condition_evaluation_seconds":
        return f"matchConditions {_label(series, 'name')}"
    return f"runguard server /{_label(series, 'endpoint')}"


def breakdown(before: dict[str, float], after: dict[str, float], creates: int) -> dict[str, float]:
    """ms per create of each part between two scrapes around ``creates`` creates."""
    out: dict[str, float] = {}
    for series, total in after.items():
        part = _part(series)
        spent = total - before.get(series, 0.0)
        if part is not None and spent > 0:
            out[part] = out.get(part, 0.0) + spent * 1000 / creates
    return out


class CreateLatency:
    """The e2e apiserver with runguard's webhooks and the VAP registered per namespace.

    ``start()``, then ``round(creates)`` as often as wanted (each returns the medians of
    that round, in ms, and the added figures), then ``stop()`` (always: it stops every
    process started). runguard is ``runguard serve --workers WORKERS SERVE_ARGS...``;
    with ``echo=True`` its application also answers ``POST /bench/echo``
    (``trivial_app.main``: the same command line, its application wrapped)."""

    def __init__(
        self,
        policy_dir: Path = POLICY_DIR,
        workdir: Path | None = None,
        log: Callable[[str], None] = print,
        workers: int = 2,
        serve_args: Sequence[str] = (),
        echo: bool = False,
    ) -> None:
        self.policy_dir = Path(policy_dir)
        self.workers = workers
        self.serve_args = tuple(serve_args)  # more `runguard serve` options (--threads ...)
        self.echo = echo
        self.log = log
        self._tmp = None if workdir else tempfile.mkdtemp(prefix="runguard-bench-create-")
        self.workdir = Path(workdir or self._tmp or ".")
        self.policy = load_policy(self.policy_dir)
        self.chosen = run_policy(self.policy)
        self.pods = pods(self.chosen)
        self.cluster: Cluster | None = None
        self.runguard: Runguard | None = None
        self.client: Client | None = None
        self.admin: Client | None = None
        self.direct: Client | None = None
        self.connections_seen: set[int] = set()
        self.rounds_done = 0
        # The cases of a round and the added figures; another admission controller in the
        # same cluster adds its own (bench_kyverno.py), and the namespaces whose answers
        # must carry the requester's stamp.
        self.cases = dict(CASES)
        self.added = dict(ADDED)
        self.stamped_namespaces = {NS["pair"], NS["pair_floor"]}
        self._bodies = {name: json.dumps(pod).encode() for name, pod in self.pods.items()}
        user = platform_requester().username
        self._reviews = {
            name: slow_clients.review_of(self.pods[name], user=user)
            for name in ("valid", "stamped", "full")
        }

    # -- lifecycle --

    def start(self) -> None:
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.log(f"cluster, runguard, webhooks and VAP ready in {time.monotonic() - started:.1f}s")

    def _start(self) -> None:
        cluster = self.cluster = Cluster(self.workdir / "cluster", build_binaries())
        cluster.start()
        runguard = self.runguard = Runguard(
            self.workdir / "runguard",
            self.policy_dir,
            workers=self.workers,
            serve_args=self.serve_args,
            command=trivial_app.serve_command() if self.echo else (),
        )
        runguard.start()
        prepare_cluster(cluster)
        unlisted = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": UNLISTED_PRIORITY}, "value": 1}  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=json.dumps(unlisted), check=True)
        # cluster-admin: "edit" is an aggregated role, empty without the controller-manager
        identity = cluster.service_account(*PLATFORM, cluster_role="cluster-admin")
        for namespace in NS.values():
            cluster.kubectl("create", "namespace", namespace, check=True)
        configurations = json.loads(runguard.manifests("json"))
        items = configurations.get("items", configurations)
        registered = [_with_namespaces(item, WEBHOOK_NAMESPACES[item["kind"]]) for item in items]
        documents = [
            *registered,
            *vap_documents(self.policy),
            *trivial_vap_documents(self.policy),
            *floor_documents(self.policy),
        ]
        listed = {"apiVersion": "v1", "kind": "List", "items": documents}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        runguard.registered = True
        token = yaml.safe_load(identity.kubeconfig.read_text())["users"][0]["user"]["token"]
        context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        self.client = Client(cluster.port, context, {"Authorization": f"Bearer {token}"})
        admin_context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        admin_context.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
        self.admin = Client(cluster.port, admin_context, {})
        self.direct = Client(
            runguard.port, ssl.create_default_context(cafile=str(runguard.ca_file)), {}
        )
        self._wait_for_admission()
        self.check_enforcement()
        self._check_vap_typing()

    def stop(self) -> None:
        for client in (self.client, self.admin, self.direct):
            if client is not None:
                client.close()
        if self.runguard is not None:
            self.runguard.stop()
            self.runguard = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> CreateLatency:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests --

    def create(
        self, namespace: str, body: bytes, as_admin: bool = False
    ) -> tuple[int, JSON, float]:
        client = self.admin if as_admin else self.client
        assert client is not None
        status, data, elapsed, _ = client.post(
            f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body
        )
        return status, json.loads(data) if data else {}, elapsed

    def _wait_for_admission(self, timeout: float = 60.0) -> None:
        """Until each namespace answers as registered: the webhooks and the binding are
        seen through informers, a moment after they are created."""
        bad = json.dumps(noncompliant_pods(self.pods["stamped"])["hostNetwork"]).encode()
        deadline = time.monotonic() + timeout
        while True:
            denied = {
                key: self.create(NS[key], bad)[0] != 201
                for key in ("validate", "pair", "vap", "pair_floor")
            }
            # the floor's binding seen too: it refuses first, naming itself
            refusal = self.create(NS["pair_floor"], bad)[1].get("message", "")
            denied["floor"] = FLOOR_PREFIX in str(refusal)
            status, answer, _ = self.create(NS["pair"], self._bodies["valid"])
            stamped = status == 201 and self._stamped(answer)
            if all(denied.values()) and stamped:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"admission not active after {timeout:.0f}s: denied {denied}, "
                    f"valid pod in {NS['pair']}: {status} {_reason(answer)}"
                )
            time.sleep(0.2)

    @staticmethod
    def _stamped(answer: JSON) -> bool:
        annotations = answer.get("metadata", {}).get("annotations", {})
        return bool(annotations.get(REQUESTED_BY) == platform_requester().username)

    def _check_vap_typing(self) -> None:
        """The apiserver's type check of the VAP's CEL against the Pod schema: warnings
        mean an expression reads a field that does not exist."""
        assert self.cluster is not None
        vap = self.cluster.get_json(
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{VAP_NAME}"
        )
        warnings = vap.get("status", {}).get("typeChecking", {}).get("expressionWarnings", [])
        for warning in warnings:
            self.log(f"VAP type check: {warning.get('fieldRef')}: {warning.get('warning')}")

    def check_enforcement(self) -> dict[str, tuple[bool, bool]]:
        """Each non-compliant Pod to bench-validate and bench-vap: both must deny it (the
        valid Pod is allowed by both). Printed; raises if one is let through."""
        results: dict[str, tuple[bool, bool]] = {}
        rows = []
        for name, pod in {"valid (control)": self.pods["stamped"],
                          **noncompliant_pods(self.pods["stamped"])}.items():  # fmt: skip
            body = json.dumps(pod).encode()
            as_admin = name == "not-platform"
            answers = [self.create(NS[key], body, as_admin) for key in ("validate", "vap")]
            denied = (answers[0][0] != 201, answers[1][0] != 201)
            results[name] = denied
            reasons = [_reason(a[1]) if a[0] != 201 else "allowed" for a in answers]
            rows.append((name, *reasons))
        width = max(len(r[0]) for r in rows)
        self.log("enforcement check (denied by runguard /validate | by the VAP):")
        for name, validate_reason, vap_reason in rows:
            self.log(f"  {name:<{width}}  {validate_reason[:60]:<60} | {vap_reason[:70]}")
        wrong = [
            name for name, denied in results.items()
            if denied != ((False, False) if name == "valid (control)" else (True, True))
        ]  # fmt: skip
        if wrong:
            raise ClusterError(f"enforcement differs from expected for: {wrong}")
        return results

    # -- measurement --

    def round(self, creates: int = 200, seconds: float = 30.0) -> dict[str, float]:
        """``creates`` dry-run creates per case, the cases alternating create by create
        (their order rotated each round), bounded by ``seconds``; then as many reviews
        sent straight to runguard. Medians in ms, and the added figures (each also as
        ``<figure>_p99``: the p99 of each create minus its baseline's create of the same
        iteration)."""
        assert self.client is not None and self.runguard is not None and self.direct is not None
        creates = max(1, min(creates, MAX_CREATES))
        cases = list(self.cases)
        shift = self.rounds_done % len(cases)
        cases = cases[shift:] + cases[:shift]
        self.rounds_done += 1
        times: dict[str, list[float]] = {case: [] for case in cases}
        for case in cases:  # warm: connections, caches, compiled CEL
            self._one(case)
        load_before = os.getloadavg()[0]
        deadline = time.monotonic() + seconds
        for _ in range(creates):
            if time.monotonic() > deadline:
                break
            for case in cases:
                times[case].append(self._one(case))
        where: dict[str, float] = {}
        batch = max(1, min(creates // 4, 50))
        for case in cases:  # each case alone between two scrapes: where its time goes
            before = self._scrape()
            for _ in range(batch):
                self._one(case)
            for part, ms in breakdown(before, self._scrape(), batch).items():
                where[f"{case}: {part}"] = ms
        direct: dict[str, list[float]] = {"validate": [], "mutate": []}
        for _ in range(max(1, creates // 2)):
            if time.monotonic() > deadline + seconds / 2:
                break
            for path in direct:
                review = self._reviews["stamped" if path == "validate" else "valid"]
                status, _, elapsed, _ = self.direct.post(f"/{path}", review)
                if status != 200:
                    raise ClusterError(f"runguard /{path} answered {status}")
                direct[path].append(elapsed * 1000)
        self.connections_seen |= _webhook_connections(self.runguard.port)
        out = {f"create_ms_{case}": statistics.median(values) for case, values in times.items()}
        for case, values in times.items():
            out[f"create_p99_ms_{case}"] = _p99(values)
        for key, (case, base) in self.added.items():
            out[key] = out[f"create_ms_{case}"] - out[f"create_ms_{base}"]
            # paired: each create minus its baseline's create of the same iteration
            paired = [a - b for a, b in zip(times[case], times[base], strict=False)]
            out[f"{key}_p99"] = _p99(paired)
        for path, values in direct.items():
            out[f"runguard_direct_{path}_ms"] = statistics.median(values)
        out.update(where)
        out["creates"] = float(min(len(values) for values in times.values()))
        out["load_1m"] = (load_before + os.getloadavg()[0]) / 2
        return out

    def _scrape(self) -> dict[str, float]:
        assert self.admin is not None and self.direct is not None
        totals = histogram_sums(self.admin.get("/metrics").decode(), APISERVER_HISTOGRAMS)
        totals.update(histogram_sums(self.direct.get("/metrics").decode(), RUNGUARD_HISTOGRAMS))
        return totals

    def _one(self, case: str) -> float:
        namespace, variant = self.cases[case]
        status, answer, elapsed = self.create(namespace, self._bodies[variant])
        if status != 201:
            raise ClusterError(f"{case}: create answered {status}: {_reason(answer)}")
        if namespace in self.stamped_namespaces and not self._stamped(answer):
            raise ClusterError(f"{case}: the mutation is not in the created object")
        if case == "pair_full_patch" and answer["spec"]["securityContext"].get("runAsUser") == 0:
            raise ClusterError(f"{case}: the full patch was not applied")
        return elapsed * 1000


def _p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank) of a round's creates of one case."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _reason(answer: JSON) -> str:
    message = str(answer.get("message", answer))
    rules = sorted(set(re.findall(r"\[([a-z]+\.[a-z-]+)\]", message)))
    where = "VAP" if "ValidatingAdmissionPolicy" in message else "webhook"
    return f"denied ({where}): {', '.join(rules) or message[:50]}"


# --- report ---------------------------------------------------------------------------


def summarize(
    rounds: Sequence[dict[str, float]],
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median of each figure over rounds, and its [min, max]."""
    keys = [key for key in rounds[0] if all(key in r for r in rounds)]
    medians = {key: round(statistics.median(r[key] for r in rounds), 3) for key in keys}
    ranges = {key: [round(min(r[key] for r in rounds), 3), round(max(r[key] for r in rounds), 3)]
              for key in keys}  # fmt: skip
    return medians, ranges


def table(medians: dict[str, float], ranges: dict[str, list[float]]) -> str:
    lines = []
    for key in medians:
        if key in ("creates", "load_1m") or ": " in key or "p99" in key:
            continue
        low, high = ranges[key]
        lines.append(f"  {key:<36} {medians[key]:8.2f} ms  [{low:.2f} - {high:.2f}]")
    vap = medians["create_added_ms_vap"]
    for key, factor in TARGETS.items():
        ratio = medians[key] / vap if vap > 0 else float("inf")
        verdict = "met" if ratio <= factor else "MISSED"
        lines.append(f"  target {key} <= {factor} x vap: {ratio:.2f} x  {verdict}")
    where = breakdown_table(medians)
    parts = sorted({part for per_case in where.values() for part in per_case})
    cases = [*(case for case in CASES if case in where), *(c for c in where if c not in CASES)]
    width = max((len(part) for part in parts), default=10)
    lines.append("\nwhere the time goes: ms per create, each case alone (apiserver and runguard "
                 "histograms), median over rounds")  # fmt: skip
    lines.append(f"  {'':<{width}} " + " ".join(f"{case[:11]:>11}" for case in cases))
    for part in parts:
        cells = [where[case].get(part) for case in cases]
        lines.append(
            f"  {part:<{width}} "
            + " ".join(f"{cell:11.2f}" if cell is not None else f"{'-':>11}" for cell in cells)
        )
    return "\n".join(lines)


def breakdown_table(medians: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{case: {part: ms per create}}`` from the ``"case: part"`` figures."""
    where: dict[str, dict[str, float]] = {}
    for key, value in medians.items():
        case, sep, part = key.partition(": ")
        if sep:
            where.setdefault(case, {})[part] = value
    return where


def vap_file_problems(policy: Policy, text: str) -> list[str]:
    """What is wrong with the VAP file, against ``text`` rendered from ``policy`` now:
    stale, or not saying exactly the rules it carries (``tests/test_bench_files.py``)."""
    shipped = VAP_FILE.read_text() if VAP_FILE.is_file() else ""
    if shipped != text:
        return ["differs from what policies/ renders: run bench/bench_create.py --write-vap"]
    documents = list(yaml.safe_load_all(shipped))
    kinds = sorted(d["kind"] for d in documents)
    if kinds != ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]:
        return [f"holds {kinds}, not one policy and its binding"]
    said = {line.strip("# \n") for line in shipped.splitlines() if line.startswith("#   ")}
    carried = {rule for rule, _, _ in vap_rules(run_policy(policy))}
    validations = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
    problems = []
    if said != carried:
        problems.append(
            f"says rules {sorted(said ^ carried)} wrongly (it carries {sorted(carried)})"
        )
    if len(validations["spec"]["validations"]) < len(carried):
        problems.append("has fewer validations than the rules it carries")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help=f"rounds (<= {MAX_ROUNDS})")
    parser.add_argument("--creates", type=int, default=200,
                        help=f"creates per case per round (<= {MAX_CREATES})")  # fmt: skip
    parser.add_argument("--round-seconds", type=float, default=25.0,
                        help="time bound of one round's creates")  # fmt: skip
    parser.add_argument(
        "--write-vap", action="store_true", help="write bench/vap/policy.yaml and exit"
    )
    parser.add_argument(
        "--check-vap",
        action="store_true",
        help="exit 1 unless bench/vap/policy.yaml is what policies/ renders now",
    )
    args = parser.parse_args(argv)
    policy = load_policy(POLICY_DIR)
    text = vap_text(policy)
    if args.check_vap:
        problems = vap_file_problems(policy, text)
        for problem in problems:
            print(f"{VAP_FILE.relative_to(REPO)}: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.write_vap:
        VAP_FILE.parent.mkdir(exist_ok=True)
        VAP_FILE.write_text(text)
        print(f"wrote {VAP_FILE}")
        return 0
    if not VAP_FILE.is_file() or VAP_FILE.read_text() != text:
        print(f"note: {VAP_FILE.relative_to(REPO)} differs from policies/ (run --write-vap); "
              "measuring with the one rendered now", file=sys.stderr)  # fmt: skip
    rounds_wanted = max(1, min(args.rounds, MAX_ROUNDS))
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)", flush=True)  # fmt: skip
    rounds = []
    with CreateLatency(log=lambda line: print(line, flush=True)) as bench:
        for i in range(rounds_wanted):
            result = bench.round(args.creates, args.round_seconds)
            rounds.append(result)
            print(f"round {i + 1}: validate +{result['create_added_ms_validate']:.2f} ms, "
                  f"pair +{result['create_added_ms_pair']:.2f} ms, "
                  f"vap +{result['create_added_ms_vap']:.2f} ms "
                  f"(none {result['create_ms_none']:.2f} ms, {result['creates']:.0f} creates "
                  f"each, load {result['load_1m']:.2f})", flush=True)  # fmt: skip
        connections = len(bench.connections_seen)
        reconnects = bench.client.connects if bench.client else 0
    load_after = os.getloadavg()
    medians, ranges = summarize(rounds)
    print(f"\nPod create (server-side dry run) through the e2e kube-apiserver, "
          f"median [min - max] over {len(rounds)} rounds:")  # fmt: skip
    print(table(medians, ranges))
    print(f"  apiserver -> runguard TCP connections seen: {connections}; "
          f"bench client connects: {reconnects}")  # fmt: skip
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    summary = {
        **{key: medians[key] for key in ADDED},
        "create_ms_none": medians["create_ms_none"],
        "create_ms": {case: medians[f"create_ms_{case}"] for case in CASES},
        "runguard_direct_validate_ms": medians["runguard_direct_validate_ms"],
        "runguard_direct_mutate_ms": medians["runguard_direct_mutate_ms"],
        "ranges": {key: ranges[key] for key in ADDED},
        "breakdown_ms": breakdown_table(medians),
        "rounds": len(rounds),
        "creates_per_case": medians["creates"],
        "webhook_connections": connections,
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
