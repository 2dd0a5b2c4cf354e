"""The Pod Security Standards as upstream checks them, and Pods to check.

``upstream_failures`` is an oracle written from the upstream checks, not from runguard's
code: a port of ``k8s.io/pod-security-admission`` v0.36.2 (Kubernetes 1.36)
``policy/check_*.go``, each check at the version the ``latest`` policy evaluates, with
Go's reading of JSON (an absent or null pointer is nil, an absent bool is false, an
absent string is ""). ``run_pods`` and ``containers`` are Hypothesis strategies for the
Pods it judges (``tests/engine/test_pod_security.py`` through the engine,
``tests/e2e/test_pod_security.py`` through the real apiserver).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st

JSON = dict[str, Any]


def _containers(spec: JSON) -> Iterator[JSON]:
    """visitor.go visitContainers: init containers, containers, ephemeral containers."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def _nil(value: Any) -> bool:
    return value is None


def _windows(spec: JSON) -> bool:
    """``podSpec.OS != nil && podSpec.OS.Name == corev1.Windows``."""
    return not _nil(spec.get("os")) and spec["os"].get("name") == "windows"


def _sc(obj: JSON) -> Any:
    """A securityContext, None when absent (Go: nil)."""
    return obj.get("securityContext")


def check_windows_host_process(meta: JSON, spec: JSON) -> bool:
    """check_windowsHostProcess.go windowsHostProcess_1_0."""

    def host_process(sc: Any) -> bool:
        if _nil(sc) or _nil(sc.get("windowsOptions")):
            return False
        value = sc["windowsOptions"].get("hostProcess")
        return value is True

    if host_process(_sc(spec)):
        return False
    return not any(host_process(_sc(c)) for c in _containers(spec))


def check_host_namespaces(meta: JSON, spec: JSON) -> bool:
    """check_hostNamespaces.go hostNamespaces_1_0."""
    return not any(spec.get(key) is True for key in ("hostNetwork", "hostPID", "hostIPC"))


def check_privileged(meta: JSON, spec: JSON) -> bool:
    """check_privileged.go privileged_1_0."""
    for c in _containers(spec):
        sc = _sc(c)
        if not _nil(sc) and sc.get("privileged") is True:
            return False
    return True


CAPABILITIES_ALLOWED_1_0 = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def check_capabilities_baseline(meta: JSON, spec: JSON) -> bool:
    """check_capabilities_baseline.go capabilitiesBaseline_1_0."""
    for c in _containers(spec):
        sc = _sc(c)
        if _nil(sc) or _nil(sc.get("capabilities")):
            continue
        for cap in sc["capabilities"].get("add") or ():
            if cap not in CAPABILITIES_ALLOWED_1_0:
                return False
    return True


def check_host_path_volumes(meta: JSON, spec: JSON) -> bool:
    """check_hostPathVolumes.go hostPathVolumes_1_0."""
    return all(_nil(v.get("hostPath")) for v in spec.get("volumes") or ())


def check_host_ports(meta: JSON, spec: JSON) -> bool:
    """check_hostPorts.go hostPorts_1_0: any ``HostPort != 0``."""
    for c in _containers(spec):
        for port in c.get("ports") or ():
            if (port.get("hostPort") or 0) != 0:
                return False
    return True


def check_app_armor(meta: JSON, spec: JSON) -> bool:
    """check_appArmorProfile.go appArmorProfile_1_0: fields and annotations."""

    def allowed_type(profile: JSON) -> bool:
        return (profile.get("type") or "") in ("RuntimeDefault", "Localhost")

    sc = _sc(spec)
    if not _nil(sc) and not _nil(sc.get("appArmorProfile")):
        if not allowed_type(sc["appArmorProfile"]):
            return False
    for c in _containers(spec):
        csc = _sc(c)
        if not _nil(csc) and not _nil(csc.get("appArmorProfile")):
            if not allowed_type(csc["appArmorProfile"]):
                return False
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/"):
            allowed = (
                len(value) == 0 or value == "runtime/default" or value.startswith("localhost/")
            )
            if not allowed:
                return False
    return True


SELINUX_ALLOWED_TYPES_1_31 = {
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
}


def check_selinux_options(meta: JSON, spec: JSON) -> bool:
    """check_seLinuxOptions.go seLinuxOptions1_31."""

    def valid(opts: JSON) -> bool:
        return (
            (opts.get("type") or "") in SELINUX_ALLOWED_TYPES_1_31
            and len(opts.get("user") or "") == 0
            and len(opts.get("role") or "") == 0
        )

    contexts = [_sc(spec), *(_sc(c) for c in _containers(spec))]
    for sc in contexts:
        if not _nil(sc) and not _nil(sc.get("seLinuxOptions")):
            if not valid(sc["seLinuxOptions"]):
                return False
    return True


def check_proc_mount(meta: JSON, spec: JSON) -> bool:
    """check_procMount_baseline.go procMount_1_0 (1.35's version relaxes it only for
    ``hostUsers: false`` with the alpha gate on) and check_procMount_restricted.go."""
    for c in _containers(spec):
        sc = _sc(c)
        if _nil(sc) or _nil(sc.get("procMount")):
            continue
        if sc["procMount"] != "Default":
            return False
    return True


def _valid_seccomp(profile: JSON) -> bool:
    """check_seccompProfile_baseline.go validSeccomp."""
    return (profile.get("type") or "") in ("Localhost", "RuntimeDefault")


def check_seccomp_baseline(meta: JSON, spec: JSON) -> bool:
    """check_seccompProfile_baseline.go seccompProfileBaseline_1_19."""
    contexts = [_sc(spec), *(_sc(c) for c in _containers(spec))]
    for sc in contexts:
        if not _nil(sc) and not _nil(sc.get("seccompProfile")):
            if not _valid_seccomp(sc["seccompProfile"]):
                return False
    return True


SYSCTLS_ALLOWED_V1_32 = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
}

SYSCTLS_ALLOWED_V1_37 = SYSCTLS_ALLOWED_V1_32 | {
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
}


def check_sysctls(meta: JSON, spec: JSON) -> bool:
    """check_sysctls.go sysctlsV1Dot37 (the newest version, 1.37)."""
    sc = _sc(spec)
    if _nil(sc):
        return True
    return all(s.get("name") in SYSCTLS_ALLOWED_V1_37 for s in sc.get("sysctls") or ())


def check_host_probes_and_lifecycle(meta: JSON, spec: JSON) -> bool:
    """check_hostProbesAndhostLifecycle.go hostProbesAndHostLifecycleV1Dot34."""

    def bad(handler: Any) -> bool:
        if _nil(handler):
            return False
        for action in ("httpGet", "tcpSocket"):
            target = handler.get(action)
            if not _nil(target) and (target.get("host") or "") != "":
                return True
        return False

    for c in _containers(spec):
        if any(bad(c.get(p)) for p in ("livenessProbe", "readinessProbe", "startupProbe")):
            return False
        lifecycle: Any = c.get("lifecycle")
        if not _nil(lifecycle) and (
            bad(lifecycle.get("postStart")) or bad(lifecycle.get("preStop"))
        ):
            return False
    return True


RESTRICTED_VOLUME_SOURCES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)


def check_restricted_volumes(meta: JSON, spec: JSON) -> bool:
    """check_restrictedVolumes.go restrictedVolumes_1_0. A volume with no source at all
    is an emptyDir by the time PodSecurity sees it (the apiserver's SetDefaults_Volume)."""
    for volume in spec.get("volumes") or ():
        sources = [k for k, v in volume.items() if k != "name" and not _nil(v)]
        if not sources:
            continue
        if any(not _nil(volume.get(s)) for s in RESTRICTED_VOLUME_SOURCES):
            continue
        return False
    return True


def check_allow_privilege_escalation(meta: JSON, spec: JSON) -> bool:
    """check_allowPrivilegeEscalation.go allowPrivilegeEscalation_1_25."""
    if _windows(spec):
        return True
    for c in _containers(spec):
        sc = _sc(c)
        if _nil(sc) or _nil(sc.get("allowPrivilegeEscalation")):
            return False
        if sc["allowPrivilegeEscalation"]:
            return False
    return True


def check_run_as_non_root(meta: JSON, spec: JSON) -> bool:
    """check_runAsNonRoot.go runAsNonRoot_1_0."""
    pod_run_as_non_root = False
    sc = _sc(spec)
    if not _nil(sc) and not _nil(sc.get("runAsNonRoot")):
        if not sc["runAsNonRoot"]:
            return False
        pod_run_as_non_root = True
    for c in _containers(spec):
        csc = _sc(c)
        if not _nil(csc) and not _nil(csc.get("runAsNonRoot")):
            if not csc["runAsNonRoot"]:
                return False
        elif not pod_run_as_non_root:
            return False
    return True


def check_run_as_user(meta: JSON, spec: JSON) -> bool:
    """check_runAsUser.go runAsUser_1_23."""
    contexts = [_sc(spec), *(_sc(c) for c in _containers(spec))]
    for sc in contexts:
        if not _nil(sc) and sc.get("runAsUser") == 0:
            return False
    return True


def check_seccomp_restricted(meta: JSON, spec: JSON) -> bool:
    """check_seccompProfile_restricted.go seccompProfileRestricted_1_25."""
    if _windows(spec):
        return True
    pod_seccomp_set = False
    sc = _sc(spec)
    if not _nil(sc) and not _nil(sc.get("seccompProfile")):
        if not _valid_seccomp(sc["seccompProfile"]):
            return False
        pod_seccomp_set = True
    for c in _containers(spec):
        csc = _sc(c)
        if not _nil(csc) and not _nil(csc.get("seccompProfile")):
            if not _valid_seccomp(csc["seccompProfile"]):
                return False
        elif not pod_seccomp_set:
            return False
    return True


def check_capabilities_restricted(meta: JSON, spec: JSON) -> bool:
    """check_capabilities_restricted.go capabilitiesRestricted_1_25."""
    if _windows(spec):
        return True
    for c in _containers(spec):
        sc = _sc(c)
        if _nil(sc) or _nil(sc.get("capabilities")):
            return False
        caps = sc["capabilities"]
        if "ALL" not in (caps.get("drop") or ()):
            return False
        if any(cap != "NET_BIND_SERVICE" for cap in caps.get("add") or ()):
            return False
    return True


Check = Callable[[JSON, JSON], bool]

BASELINE: dict[str, Check] = {
    "windowsHostProcess": check_windows_host_process,
    "hostNamespaces": check_host_namespaces,
    "privileged": check_privileged,
    "capabilities_baseline": check_capabilities_baseline,
    "hostPathVolumes": check_host_path_volumes,
    "hostPorts": check_host_ports,
    "appArmorProfile": check_app_armor,
    "seLinuxOptions": check_selinux_options,
    "procMount": check_proc_mount,
    "seccompProfile_baseline": check_seccomp_baseline,
    "sysctls": check_sysctls,
    "hostProbesAndHostLifecycle": check_host_probes_and_lifecycle,
}

RESTRICTED: dict[str, Check] = {
    "restrictedVolumes": check_restricted_volumes,
    "allowPrivilegeEscalation": check_allow_privilege_escalation,
    "runAsNonRoot": check_run_as_non_root,
    "runAsUser": check_run_as_user,
    "seccompProfile_restricted": check_seccomp_restricted,
    "capabilities_restricted": check_capabilities_restricted,
    "procMount_restricted": check_proc_mount,
}

# registry.go: a restricted check's OverrideCheckIDs replace the baseline ones
OVERRIDDEN = {
    "restrictedVolumes": "hostPathVolumes",
    "seccompProfile_restricted": "seccompProfile_baseline",
    "capabilities_restricted": "capabilities_baseline",
    "procMount_restricted": "procMount",
}


def upstream_failures(pod: JSON, level: str = "restricted") -> list[str]:
    """The ids of the checks the Pod fails at ``level``, as the PodSecurity plugin runs them."""
    meta, spec = pod.get("metadata") or {}, pod["spec"]
    checks = dict(BASELINE)
    if level == "restricted":
        for overridden in OVERRIDDEN.values():
            del checks[overridden]
        checks.update(RESTRICTED)
    return sorted(name for name, check in checks.items() if not check(meta, spec))


# --- generated Pods ----------------------------------------------------------------------


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Absent half of the time (``None`` is dropped by ``put``)."""
    return st.one_of(st.none(), st.none(), strategy)


def put(target: JSON, key: str, value: Any) -> None:
    if value is not None:
        target[key] = value


profile_types = st.sampled_from(["RuntimeDefault", "RuntimeDefault", "Localhost", "Unconfined"])


@st.composite
def seccomp_profiles(draw: Any) -> JSON:
    kind = draw(profile_types)
    return {"type": kind, "localhostProfile": "p.json"} if kind == "Localhost" else {"type": kind}


@st.composite
def apparmor_profiles(draw: Any) -> JSON:
    kind = draw(profile_types)
    return {"type": kind, "localhostProfile": "p"} if kind == "Localhost" else {"type": kind}


@st.composite
def selinux_options(draw: Any) -> JSON:
    opts: JSON = {}
    put(
        opts,
        "type",
        draw(maybe(st.sampled_from(["container_t", "container_engine_t", "spc_t", ""]))),
    )
    put(opts, "user", draw(maybe(st.sampled_from(["system_u", ""]))))
    put(opts, "role", draw(maybe(st.sampled_from(["system_r", ""]))))
    put(opts, "level", draw(maybe(st.just("s0:c1,c2"))))
    return opts


ids = st.sampled_from([0, 1000])

capability_names = st.sampled_from(
    [
        "ALL",
        "NET_BIND_SERVICE",
        "CHOWN",
        "SYS_ADMIN",
        "CAP_SYS_ADMIN",
        "NET_RAW",
        "SYS_PTRACE",
        "all",
    ]
)


@st.composite
def shared_context(draw: Any, sc: JSON) -> None:
    """Fields a pod and a container securityContext share."""
    put(sc, "runAsUser", draw(maybe(ids)))
    put(sc, "runAsGroup", draw(maybe(ids)))
    put(sc, "runAsNonRoot", draw(maybe(st.booleans())))
    put(sc, "seccompProfile", draw(maybe(seccomp_profiles())))
    put(sc, "appArmorProfile", draw(maybe(apparmor_profiles())))
    put(sc, "seLinuxOptions", draw(maybe(selinux_options())))
    if draw(st.integers(0, 11)) == 0:
        sc["windowsOptions"] = {"hostProcess": draw(st.booleans())}


@st.composite
def container_contexts(draw: Any) -> JSON:
    sc: JSON = {}
    draw(shared_context(sc))
    put(sc, "privileged", draw(maybe(st.booleans())))
    put(sc, "allowPrivilegeEscalation", draw(maybe(st.booleans())))
    put(sc, "procMount", draw(maybe(st.sampled_from(["Default", "Unmasked"]))))
    if draw(st.booleans()):
        caps: JSON = {}
        put(caps, "add", draw(maybe(st.lists(capability_names, max_size=2, unique=True))))
        put(caps, "drop", draw(maybe(st.lists(capability_names, max_size=2, unique=True))))
        sc["capabilities"] = caps
    return sc


@st.composite
def pod_contexts(draw: Any) -> JSON:
    sc: JSON = {}
    draw(shared_context(sc))
    put(sc, "fsGroup", draw(maybe(ids)))
    put(sc, "supplementalGroups", draw(maybe(st.sampled_from([[0], [0, 5], [5]]))))
    if draw(st.booleans()):
        names = st.sampled_from(
            [
                "net.ipv4.tcp_syncookies",
                "kernel.shm_rmid_forced",
                "kernel.msgmax",
                "net.core.somaxconn",
            ]
        )
        sc["sysctls"] = [
            {"name": n, "value": "1"}
            for n in draw(st.lists(names, min_size=1, max_size=2, unique=True))
        ]
    return sc


@st.composite
def handlers(draw: Any) -> JSON:
    action = draw(st.sampled_from(["httpGet", "tcpSocket"]))
    target: JSON = {"port": 8080}
    put(target, "host", draw(maybe(st.sampled_from(["", "10.0.0.1", "metadata.google.internal"]))))
    return {action: target}


@st.composite
def containers(draw: Any, name: str, kind: str) -> JSON:
    c: JSON = {"name": name, "image": "python:3.11"}
    if kind == "sidecar":
        c["restartPolicy"] = "Always"
    if draw(st.booleans()):
        c["securityContext"] = draw(container_contexts())
    if kind != "ephemeral":  # the apiserver allows neither ports nor probes there
        if draw(st.integers(0, 5)) == 0:
            port: JSON = {"containerPort": 8080}
            put(port, "hostPort", draw(maybe(st.sampled_from([0, 8080]))))
            c["ports"] = [port]
        probes = kind != "init"  # a plain init container may not have them either
        if probes and draw(st.integers(0, 5)) == 0:
            c[draw(st.sampled_from(["livenessProbe", "readinessProbe", "startupProbe"]))] = draw(
                handlers()
            )
        if probes and draw(st.integers(0, 7)) == 0:
            c["lifecycle"] = {draw(st.sampled_from(["postStart", "preStop"])): draw(handlers())}
    else:
        c["targetContainerName"] = "c0"
    return c


VOLUME_SOURCES: dict[str, JSON] = {
    "emptyDir": {},
    "configMap": {"name": "init-config-map-r1"},
    "secret": {"secretName": "sec-db-r1"},
    "persistentVolumeClaim": {"claimName": "v-r1-data"},
    "downwardAPI": {"items": []},
    "csi": {"driver": "csi.example.com"},
    "image": {"reference": "registry.example/data:1"},
    "hostPath": {"path": "/var/run"},
    "nfs": {"server": "nfs.example", "path": "/"},
    "gitRepo": {"repository": "https://example/repo"},
}


@st.composite
def volumes(draw: Any) -> list[JSON]:
    kinds = draw(st.lists(st.sampled_from(sorted(VOLUME_SOURCES)), max_size=2))
    return [{"name": f"v{i}", kind: dict(VOLUME_SOURCES[kind])} for i, kind in enumerate(kinds)]


@st.composite
def run_pods(draw: Any, *, ephemeral: bool = True) -> JSON:
    spec: JSON = {
        "containers": [draw(containers(f"c{i}", "main")) for i in range(draw(st.integers(1, 2)))]
    }
    init = [
        draw(containers(f"i{i}", draw(st.sampled_from(["init", "sidecar"]))))
        for i in range(draw(st.integers(0, 2)))
    ]
    if init:
        spec["initContainers"] = init
    if ephemeral and draw(st.integers(0, 3)) == 0:
        spec["ephemeralContainers"] = [draw(containers("e0", "ephemeral"))]
    put(spec, "securityContext", draw(st.one_of(st.none(), pod_contexts())))
    put(spec, "os", draw(maybe(st.sampled_from([{"name": "linux"}, {"name": "windows"}]))))
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if draw(st.integers(0, 11)) == 0:
            spec[key] = draw(st.booleans())
    vols = draw(volumes())
    if vols:
        spec["volumes"] = vols
    meta: JSON = {
        "name": "run",
        "namespace": "ml",
        "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"},
    }
    if draw(st.integers(0, 3)) == 0:
        names = [c["name"] for c in spec["containers"]]
        value = draw(st.sampled_from(["runtime/default", "localhost/p", "unconfined", ""]))
        meta["annotations"] = {
            f"container.apparmor.security.beta.kubernetes.io/{draw(st.sampled_from(names))}": value
        }
    if _windows(spec) and draw(st.integers(0, 2)):
        drop_linux_only(spec)  # mostly what a Windows user really sends: a valid Pod
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# What the apiserver refuses in a Windows Pod (k8s.io/kubernetes pkg/apis/core/validation
# validateWindows, 1.33).
LINUX_ONLY_POD = (
    "appArmorProfile",
    "seLinuxOptions",
    "seccompProfile",
    "fsGroup",
    "fsGroupChangePolicy",
    "sysctls",
    "runAsUser",
    "runAsGroup",
    "supplementalGroups",
    "supplementalGroupsPolicy",
    "seLinuxChangePolicy",
)

LINUX_ONLY_CONTAINER = (
    "appArmorProfile",
    "seLinuxOptions",
    "seccompProfile",
    "capabilities",
    "readOnlyRootFilesystem",
    "privileged",
    "allowPrivilegeEscalation",
    "procMount",
    "runAsUser",
    "runAsGroup",
)


def drop_linux_only(spec: JSON) -> None:
    for key in ("hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"):
        spec.pop(key, None)
    for key in LINUX_ONLY_POD:
        (spec.get("securityContext") or {}).pop(key, None)
    for c in _containers(spec):
        for key in LINUX_ONLY_CONTAINER:
            (c.get("securityContext") or {}).pop(key, None)
