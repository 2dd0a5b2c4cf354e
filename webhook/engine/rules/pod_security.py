"""Rules ``security.*`` of the Pod Security Standards beyond step 5 (``security.level``).

Every run Pod runguard admits meets ``security.level`` (``restricted``, the default, or
``baseline``) of the Pod Security Standards as the upstream PodSecurity admission plugin
judges them at its latest version. The checks are ported from
``k8s.io/pod-security-admission`` v0.36.2 (Kubernetes 1.36), ``policy/check_*.go``, each
at its newest ``VersionedCheck``; the file is named beside each constant and check.
Step 5 (``security.py``) holds root, privileges, capabilities and seccomp; this module
holds the rest: AppArmor, SELinux, ``/proc`` mount, host ports, sysctls, Windows
HostProcess, probe and lifecycle hosts, and the volume types of the level.

What only takes privileges away is fixed under ``onRoot: Strip`` (AppArmor
``Unconfined`` to ``RuntimeDefault``, ``procMount`` to ``Default``, SELinux user, role
and unlisted types removed); what changes what the workload does is denied. Linux-only
fields are never written into a Windows Pod (``spec.os.name: windows``): the apiserver
refuses them there.
"""

from __future__ import annotations

from webhook.engine.pod import ALL_CONTAINER_LISTS, CONTAINER_LISTS, Pod, warning
from webhook.engine.rule import Declarations
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import RunPolicy

RULES = Declarations(__name__)
SECURITY_PRIVILEGED = RULES.rule(
    "security.privileged",
    mutation="`privileged` / `allowPrivilegeEscalation` true set false",
    violation="privileged, escalation, Windows `hostProcess`",
)
SECURITY_HOST_PORTS = RULES.rule(
    "security.host-ports",
    mutation="",
    violation="a container port with a `hostPort`",
)
SECURITY_SYSCTLS = RULES.rule(
    "security.sysctls",
    mutation="",
    violation="a sysctl outside the standard's safe set",
)
SECURITY_SELINUX = RULES.rule(
    "security.selinux",
    mutation="SELinux user/role and types outside the standard's list removed",
    violation="the same, with `onRoot: Deny`",
)
SECURITY_APPARMOR = RULES.rule(
    "security.apparmor",
    mutation="AppArmor `Unconfined` to `RuntimeDefault`",
    violation="`Unconfined` (field or annotation)",
)
SECURITY_PROC_MOUNT = RULES.rule(
    "security.proc-mount",
    mutation="`procMount` to `Default`",
    violation="`Unmasked`",
)
SECURITY_PROBE_HOST = RULES.rule(
    "security.probe-host",
    mutation="",
    violation="a probe or lifecycle handler with a `host`",
)

# check_seccompProfile_baseline.go validSeccomp, check_appArmorProfile.go allowedProfileType
CONFINED_PROFILES = frozenset({"RuntimeDefault", "Localhost"})
# check_capabilities_baseline.go capabilities_allowed_1_0
BASELINE_CAPABILITIES = frozenset(
    {
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
)
# check_capabilities_restricted.go capabilityNetBindService
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# check_sysctls.go sysctlsAllowedV1Dot37 (the latest: 1.32's and two from 1.37)
SAFE_SYSCTLS = frozenset(
    {
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
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
# check_seLinuxOptions.go selinuxAllowedTypes1_31 ("" is an unset type)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# check_restrictedVolumes.go restrictedVolumes_1_0: the inline volume sources allowed
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# check_appArmorProfile.go: the deprecated per-container annotation and its allowed values
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HANDLERS = ("postStart", "preStop")
DEBUG_HINT = "; for a debug container use kubectl debug --profile=restricted"


def is_windows(spec: JSON) -> bool:
    """``spec.os.name: windows``, the only OS signal the apiserver and PodSecurity use."""
    os = spec.get("os")
    return os is not None and os.get("name") == "windows"


def allowed_capabilities(policy: RunPolicy) -> frozenset[str]:
    """What a container may add: the policy's list within the level's."""
    level_set = (
        RESTRICTED_CAPABILITIES if policy.security.level == "restricted" else BASELINE_CAPABILITIES
    )
    return policy.security.allowed_capabilities & level_set


def hint(list_name: str) -> str:
    """What to do instead, for a violation in an ephemeral (debug) container."""
    return DEBUG_HINT if list_name == "ephemeralContainers" else ""


# (list name, hint) of every container list: the checks' walk, without a call per list
HINTED_LISTS = tuple((name, hint(name)) for name in ALL_CONTAINER_LISTS)


def _carrying(pod: Pod, key: str, pod_level: bool = True) -> list[tuple[str, JSON]]:
    """(``pod`` or container name, securityContext) of the pod (unless ``pod_level`` is
    False), init containers and containers whose securityContext sets ``key``; ephemeral
    containers are only ever added, see ``hardening.harden_debug_containers``. Plain loops:
    this runs for every pod, which almost never sets any of these keys."""
    spec = pod.spec
    out = []
    if pod_level:
        psc = spec.get("securityContext")
        if psc is not None and psc.get(key) is not None:
            out.append(("pod", psc))
    for list_name in CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            sc = container.get("securityContext")
            if sc is not None and sc.get(key) is not None:
                out.append((container["name"], sc))
    return out


def _fixes(pod: Pod) -> bool:
    """Steps here fix only with ``onRoot: Strip``, and never write into a Windows Pod."""
    return pod.policy.security.on_root == "Strip" and not is_windows(pod.spec)


# --- steps: what only takes privileges away ------------------------------------------


def confine_apparmor(pod: Pod) -> Change | None:
    """AppArmor ``Unconfined`` (pod or container field) becomes ``RuntimeDefault``. Not
    beside an ``unconfined`` annotation: the apiserver refuses a field and an annotation
    that disagree (with a message that would hide runguard's), and the annotation is
    denied anyway."""
    if not _fixes(pod):
        return None
    carrying = _carrying(pod, "appArmorProfile")
    if not carrying:  # the usual pod: no profile set anywhere
        return None
    unconfined = [
        (where, sc) for where, sc in carrying if sc["appArmorProfile"].get("type") == "Unconfined"
    ]
    if not unconfined or any(
        key.startswith(APPARMOR_ANNOTATION) and value == "unconfined"
        for key, value in pod.annotations.items()
    ):
        return None
    for _, sc in unconfined:
        sc["appArmorProfile"] = {"type": "RuntimeDefault"}
    fixed = [where for where, _ in unconfined]
    return Change(SECURITY_APPARMOR, warning("AppArmor Unconfined set to RuntimeDefault", fixed))


def confine_selinux(pod: Pod) -> Change | None:
    """SELinux ``user`` and ``role``, and a ``type`` outside the standard's list, removed
    (``level`` stays); an emptied ``seLinuxOptions`` is removed."""
    if not _fixes(pod):
        return None
    fixed = []
    for where, sc in _carrying(pod, "seLinuxOptions"):
        options = sc["seLinuxOptions"]
        removed = [key for key in ("user", "role") if options.get(key)]
        if (options.get("type") or "") not in SELINUX_TYPES:
            removed.append("type")
        if removed:
            kept = {k: v for k, v in options.items() if k not in removed}
            if kept:
                sc["seLinuxOptions"] = kept
            else:
                del sc["seLinuxOptions"]
            fixed.append(f"{where} {'/'.join(removed)}")
    if not fixed:
        return None
    return Change(SECURITY_SELINUX, warning("SELinux options removed", fixed))


def default_proc_mount(pod: Pod) -> Change | None:
    """A ``procMount`` other than ``Default`` (``Unmasked``) becomes ``Default``."""
    if not _fixes(pod):
        return None
    fixed = []
    for where, sc in _carrying(pod, "procMount", False):
        if sc["procMount"] != "Default":
            sc["procMount"] = "Default"
            fixed.append(where)
    if not fixed:
        return None
    return Change(SECURITY_PROC_MOUNT, warning("procMount set to Default", fixed))


# --- check: everything of the level that step 5's check does not cover ---------------


def check_pod_security(pod: Pod) -> list[Violation]:
    out: list[Violation] = []
    base = pod.spec_path
    psc = pod.spec.get("securityContext")
    if psc is not None:
        path = f"{base}.securityContext"
        for i, sysctl in enumerate(psc.get("sysctls") or ()):
            if sysctl["name"] not in SAFE_SYSCTLS:  # check_sysctls.go
                out.append(
                    Violation(
                        SECURITY_SYSCTLS,
                        f"{path}.sysctls[{i}].name",
                        f"sysctl {sysctl['name']} is not in the Pod Security Standards' safe "
                        f"set: remove it (safe: {', '.join(sorted(SAFE_SYSCTLS))})",
                    )
                )
        _check_context(psc, path, "", out)
    for key, value in pod.annotations.items():  # check_appArmorProfile.go, annotations
        if key.startswith(APPARMOR_ANNOTATION) and not _allowed_apparmor_annotation(value):
            out.append(
                Violation(
                    SECURITY_APPARMOR,
                    f"{pod.meta_path}.annotations[{key}]",
                    f"AppArmor profile {value!r} is not allowed: remove the annotation "
                    "(the runtime's default applies) or set runtime/default or localhost/NAME",
                )
            )
    for list_name, more in HINTED_LISTS:
        for i, container in enumerate(pod.spec.get(list_name) or ()):
            path = f"{base}.{list_name}[{i}]"
            sc = container.get("securityContext")
            if sc is not None:
                _check_context(sc, f"{path}.securityContext", more, out)
                proc_mount = sc.get("procMount")
                if proc_mount not in (None, "Default"):  # check_procMount_restricted.go
                    out.append(
                        Violation(
                            SECURITY_PROC_MOUNT,
                            f"{path}.securityContext.procMount",
                            f"procMount {proc_mount} unmasks /proc: remove it or set Default{more}",
                        )
                    )
            for j, port in enumerate(container.get("ports") or ()):
                if port.get("hostPort"):  # check_hostPorts.go: any non-zero hostPort
                    out.append(
                        Violation(
                            SECURITY_HOST_PORTS,
                            f"{path}.ports[{j}].hostPort",
                            f"hostPort {port['hostPort']} binds a port of the node: remove "
                            "hostPort and reach the run through a Service",
                        )
                    )
            _check_probe_hosts(container, path, out)
    # volume types: volumes.check_volumes judges the policy's list and the level at once
    return out


def _check_context(sc: JSON, path: str, more: str, out: list[Violation]) -> None:
    """A pod or container securityContext: AppArmor, SELinux, HostProcess."""
    profile = sc.get("appArmorProfile")
    if profile is not None and profile.get("type") not in CONFINED_PROFILES:
        out.append(  # check_appArmorProfile.go, fields
            Violation(
                SECURITY_APPARMOR,
                f"{path}.appArmorProfile.type",
                f"AppArmor profile {profile.get('type')!r} is not allowed: "
                f"set RuntimeDefault or Localhost{more}",
            )
        )
    options = sc.get("seLinuxOptions")
    if options is not None:  # check_seLinuxOptions.go
        selinux_type = options.get("type") or ""
        if selinux_type not in SELINUX_TYPES:
            out.append(
                Violation(
                    SECURITY_SELINUX,
                    f"{path}.seLinuxOptions.type",
                    f"SELinux type {selinux_type} is not allowed: remove it or use one of "
                    f"{', '.join(sorted(SELINUX_TYPES - {''}))}{more}",
                )
            )
        for key in ("user", "role"):
            if options.get(key):
                out.append(
                    Violation(
                        SECURITY_SELINUX,
                        f"{path}.seLinuxOptions.{key}",
                        f"a SELinux {key} may not be set: remove it{more}",
                    )
                )
    windows_options = sc.get("windowsOptions")
    if windows_options is not None and windows_options.get("hostProcess") is True:
        out.append(  # check_windowsHostProcess.go
            Violation(
                SECURITY_PRIVILEGED,
                f"{path}.windowsOptions.hostProcess",
                "a HostProcess container runs on the host, outside any isolation: "
                f"remove hostProcess{more}",
            )
        )


def _check_probe_hosts(container: JSON, path: str, out: list[Violation]) -> None:
    """check_hostProbesAndhostLifecycle.go (1.34+): probes and lifecycle handlers reach
    the pod itself, never a ``host`` of the user's choosing (through the kubelet)."""
    for key in PROBES:
        handler = container.get(key)
        if handler is not None:
            _check_handler(handler, f"{path}.{key}", out)
    lifecycle = container.get("lifecycle")
    if lifecycle is not None:
        for key in LIFECYCLE_HANDLERS:
            handler = lifecycle.get(key)
            if handler is not None:
                _check_handler(handler, f"{path}.lifecycle.{key}", out)


def _check_handler(handler: JSON, path: str, out: list[Violation]) -> None:
    for action in ("httpGet", "tcpSocket"):
        target = handler.get(action)
        if target is not None and target.get("host"):
            out.append(
                Violation(
                    SECURITY_PROBE_HOST,
                    f"{path}.{action}.host",
                    f"host {target['host']} makes the kubelet connect to another machine: "
                    "remove host (the pod's own IP is used)",
                )
            )


def _allowed_apparmor_annotation(value: str) -> bool:
    return value in ("", "runtime/default") or value.startswith("localhost/")
