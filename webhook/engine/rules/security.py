"""Step 5 and rules ``security.*``: no root, no privileges, hardening fields filled.

The checks are those of the Pod Security Standards at ``security.level`` for root,
privileges, capabilities and seccomp (ported from ``k8s.io/pod-security-admission``
v0.36.2, ``policy/check_*.go``, named beside each), plus runguard's own: gid,
fsGroup and supplemental group 0. The rest of the standard is ``pod_security.py``.
What the level requires and the policy leaves out (``seccompProfile: null``,
``dropCapabilities: []``) is filled anyway: the level is a floor the policy's keys add
to (what is filled: ``hardening.py``, which also hardens ``kubectl debug``'s
containers). A Windows Pod gets only the fields the apiserver accepts for Windows.

The standard's root and privilege checks with the mutation step repairing exactly what
they refuse, side by side so the two cannot drift (the rule every module of ``rules/``
keeps); its other half is ``pod_security``.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.engine.pod import CONTAINER_LISTS, Pod, kept_change, set_list, warning
from webhook.engine.rule import Declarations
from webhook.engine.rules.hardening import RUNTIME_DEFAULT, Hardening, fill_container, hardening
from webhook.engine.rules.operators import operator_capabilities
from webhook.engine.rules.pod_security import (
    CONFINED_PROFILES,
    HINTED_LISTS,
    SECURITY_PRIVILEGED,
    allowed_capabilities,
    is_windows,
)
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import RunPolicy, SecurityConfig

RULES = Declarations(__name__)
SECURITY_ROOT = RULES.rule(
    "security.root",
    mutation=(
        "uid/gid/fsGroup 0 replaced or removed, supplemental group 0 removed, `runAsNonRoot` set"
    ),
    violation="root ids, `runAsNonRoot` false or (restricted) missing",
)
SECURITY_DEFAULTS = RULES.rule(
    "security.defaults",
    mutation="absent hardening filled (runAsNonRoot, seccomp, drop ALL, no escalation)",
    violation="a Pod created without `/mutate` lacking it",
)
SECURITY_CAPABILITIES = RULES.rule(
    "security.capabilities",
    mutation=(
        "unlisted added capabilities removed (listed under `security.root`); a `NET_ADMIN` "
        "removed is named here, with what to do instead (a mesh's CNI mode)"
    ),
    violation=(
        "added capabilities outside `allowedCapabilities` within the level; (restricted) drop "
        "lacks ALL"
    ),
)
SECURITY_HOST_NAMESPACE = RULES.rule(
    "security.host-namespace",
    mutation="",
    violation="hostNetwork, hostPID, hostIPC",
)
SECURITY_SECCOMP = RULES.rule(
    "security.seccomp",
    mutation="seccomp `Unconfined` to `RuntimeDefault`",
    violation="`Unconfined`; (restricted) no profile",
)

# The SecurityConfig setting that replaces an id 0, by securityContext key.
_ID_SETTINGS = {"runAsUser": "run_as_user", "runAsGroup": "run_as_group", "fsGroup": "fs_group"}


def strip_root(pod: Pod) -> Change | None:
    """Harden the pod. Explicit root settings are fixed only with ``onRoot: Strip``
    (``security.root``); fields the user left out (runAsNonRoot, seccomp, dropped
    capabilities, no privilege escalation) are always filled (``security.defaults``)."""
    policy = pod.policy
    if policy.security.on_root == "Allow":
        return _confine_only(pod)
    strip = policy.security.on_root == "Strip"
    spec = pod.spec
    linux = not is_windows(spec)
    fill = hardening(policy)
    stripped: list[str] = []
    filled: list[str] = []
    _harden_pod_context(spec, policy, fill, strip, linux, stripped, filled)
    # Ephemeral containers are hardened when added (hardening.py), never here:
    # a running Pod's spec is immutable, and /mutate on UPDATE must find it unchanged.
    for list_name in CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            sc = container.get("securityContext")
            if sc is None:
                sc = container["securityContext"] = {}
            name = container["name"]
            if strip:
                _strip_container_root(sc, name, policy, linux, stripped)
            if not linux:
                continue
            if strip:
                _strip_container_privileges(pod, sc, name, fill.seccomp, stripped)
            fill_container(sc, fill.drop, filled, fill.drop_label)
    if stripped:
        return kept_change(SECURITY_ROOT, "root and privileges stripped", tuple(stripped))
    if filled:
        return kept_change(SECURITY_DEFAULTS, "security defaults set", tuple(dict.fromkeys(filled)))
    return None


def _harden_pod_context(
    spec: JSON,
    policy: RunPolicy,
    fill: Hardening,
    strip: bool,
    linux: bool,
    stripped: list[str],
    filled: list[str],
) -> None:
    """The pod's securityContext: root ids and group 0 stripped, a uid assigned,
    runAsNonRoot and the seccomp profile filled or fixed."""
    sec = policy.security
    psc = spec.get("securityContext")
    if psc is None:
        psc = spec["securityContext"] = {}
    if strip and linux and psc:  # an empty context has nothing to strip
        _strip_root_ids(psc, _POD_IDS, sec, "pod", stripped)
        groups = psc.get("supplementalGroups")
        if groups and 0 in groups:
            set_list(psc, "supplementalGroups", [g for g in groups if g != 0])
            stripped.append("pod supplementalGroups 0")
    if linux and sec.assign_run_as_user and sec.run_as_user and psc.get("runAsUser") is None:
        # No uid at all: an image that defaults to root would be refused by the kubelet
        # under runAsNonRoot; the policy's uid is assigned instead (a container's own
        # runAsUser still wins over the pod's).
        psc["runAsUser"] = sec.run_as_user
        filled.append(f"runAsUser {sec.run_as_user}")
    if psc.get("runAsNonRoot") is None:
        psc["runAsNonRoot"] = True
        filled.append("runAsNonRoot")
    elif strip and psc["runAsNonRoot"] is False:
        psc["runAsNonRoot"] = True
        stripped.append("runAsNonRoot false")
    if linux:
        _harden_pod_seccomp(psc, fill, strip, stripped, filled)


def _harden_pod_seccomp(
    psc: JSON, fill: Hardening, strip: bool, stripped: list[str], filled: list[str]
) -> None:
    """A Linux pod's seccomp profile: the policy's where it has none, confined where it
    is Unconfined."""
    current = (psc.get("seccompProfile") or {}).get("type")
    if current is None and fill.seccomp is not None:
        psc["seccompProfile"] = {"type": fill.seccomp}
        filled.append(fill.seccomp_label)
    elif strip and current == "Unconfined":
        psc["seccompProfile"] = {"type": fill.seccomp or RUNTIME_DEFAULT}
        stripped.append("seccomp Unconfined")


def _strip_container_root(
    sc: JSON, name: str, policy: RunPolicy, linux: bool, stripped: list[str]
) -> None:
    """A container's root ids and ``runAsNonRoot: false``."""
    if linux and (sc.get("runAsUser") == 0 or sc.get("runAsGroup") == 0):
        _strip_root_ids(sc, _CONTAINER_IDS, policy.security, name, stripped)
    if sc.get("runAsNonRoot") is False:
        sc["runAsNonRoot"] = True
        stripped.append(f"{name} runAsNonRoot false")


def _strip_container_privileges(
    pod: Pod, sc: JSON, name: str, seccomp: str | None, stripped: list[str]
) -> None:
    """A Linux container's unconfined seccomp, privileges and added capabilities
    beyond the level."""
    profile = sc.get("seccompProfile")
    if profile and profile.get("type") == "Unconfined":
        sc["seccompProfile"] = {"type": seccomp or RUNTIME_DEFAULT}
        stripped.append(f"{name} seccomp Unconfined")
    if sc.get("privileged") is True:
        sc["privileged"] = False
        stripped.append(f"{name} privileged")
    if sc.get("allowPrivilegeEscalation") is True:
        sc["allowPrivilegeEscalation"] = False
        stripped.append(f"{name} allowPrivilegeEscalation")
    caps = sc.get("capabilities")
    add = caps.get("add") if caps is not None else None
    if caps is not None and add:
        # beyond the level: the platform's operator's Pods (validation decides an
        # undecided one); looked up only for a container that adds any
        allowed = allowed_capabilities(pod.policy) | operator_capabilities(pod, undecided=True)
        kept = [c for c in add if c in allowed]
        if kept != add:
            gone = ",".join(c for c in add if c not in allowed)
            stripped.append(f"{name} add {gone}")
            set_list(caps, "add", kept)


# What a mesh's init container (istio-init, linkerd-init) adds to redirect the Pod's
# traffic; without it the container fails and the Pod never starts.
NETWORK_CAPABILITY = "NET_ADMIN"
MESH_HINT = "a mesh's init container cannot redirect traffic without NET_ADMIN: use its CNI mode"


def network_capability_users(pod: Pod) -> list[str]:
    """The containers adding NET_ADMIN that the policy does not let them add."""
    names: list[str] = []
    for list_name in CONTAINER_LISTS:
        for container in pod.spec.get(list_name) or ():
            caps = (container.get("securityContext") or {}).get("capabilities") or {}
            if NETWORK_CAPABILITY in (caps.get("add") or ()):
                names.append(container["name"])
    if not names or is_windows(pod.spec):
        return []
    allowed = allowed_capabilities(pod.policy) | operator_capabilities(pod, undecided=True)
    return [] if NETWORK_CAPABILITY in allowed else names


def note_network_capability(pod: Pod) -> Change | None:
    """Say why a container that adds NET_ADMIN (a mesh's init container without the
    mesh's CNI plugin) will fail once strip_root removes it, and what to do instead."""
    if pod.policy.security.on_root != "Strip":
        return None  # Deny: validation's message says it; Allow: nothing is removed
    names = network_capability_users(pod)
    if not names:
        return None
    return kept_change(
        SECURITY_CAPABILITIES,
        "NET_ADMIN removed, a mesh cannot redirect traffic (use its CNI mode)",
        tuple(names),
    )


_POD_IDS = ("runAsUser", "runAsGroup", "fsGroup")
_CONTAINER_IDS = ("runAsUser", "runAsGroup")


def _confine_only(pod: Pod) -> Change | None:
    """``onRoot: Allow`` (a build that needs root, at level baseline): root and the
    hardening runguard adds of its own are left as written; only what takes nothing
    the workload needs is fixed, seccomp ``Unconfined`` to ``RuntimeDefault``."""
    if is_windows(pod.spec):
        return None
    fixed: list[str] = []
    contexts = [("pod", pod.spec.get("securityContext"))]
    contexts += [(c["name"], c.get("securityContext")) for _, _, c in pod.containers()]
    for where, sc in contexts:
        if sc and (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            sc["seccompProfile"] = {"type": RUNTIME_DEFAULT}
            fixed.append(f"{where} seccomp Unconfined")
    if not fixed:
        return None
    return Change(SECURITY_ROOT, warning("privileges stripped", fixed))


def _strip_root_ids(
    sc: JSON, keys: tuple[str, ...], sec: SecurityConfig, where: str, stripped: list[str]
) -> None:
    """Replace uid/gid/fsGroup 0 by the policy's id for that key, or drop the field."""
    for key in keys:
        if sc.get(key) == 0:
            replacement = getattr(sec, _ID_SETTINGS[key])
            if replacement is None:
                del sc[key]
            else:
                sc[key] = replacement
            stripped.append(f"{where} {key} 0")


def check_security(pod: Pod) -> list[Violation]:
    """Root, host namespaces, privileges, capabilities and seccomp, as the Pod Security
    admission's checks name them (``check_*.go``), at the policy's level."""
    policy = pod.policy
    psc = pod.spec.get("securityContext") or {}
    out = _pod_context_violations(pod, psc)
    pod_seccomp = psc.get("seccompProfile")
    pod_seccomp_ok = pod_seccomp is not None and pod_seccomp.get("type") in CONFINED_PROFILES
    context = _ContainerContext(
        pod=pod,
        restricted=policy.security.level == "restricted",
        linux=not is_windows(pod.spec),
        pod_non_root=psc.get("runAsNonRoot"),
        pod_seccomp_ok=pod_seccomp_ok,
    )
    # Paths are formatted where a violation is found: most Pods here have none.
    for list_name, more in HINTED_LISTS:
        for i, container in enumerate(pod.spec.get(list_name) or ()):
            sc = container.get("securityContext") or {}
            at = f"{pod.spec_path}.{list_name}[{i}].securityContext"
            out += _container_root_violations(context, sc, at, more)
            out += _container_privilege_violations(context, sc, at, more, list_name)
            out += _container_seccomp_violations(context, sc, at, more)
    if policy.security.on_root == "Allow":  # a build's root, at level baseline
        return [v for v in out if v.rule != SECURITY_ROOT]
    return out


@dataclass(frozen=True)
class _ContainerContext:
    """What every container's checks read of the pod."""

    pod: Pod
    restricted: bool
    linux: bool
    pod_non_root: object
    pod_seccomp_ok: bool


def _pod_context_violations(pod: Pod, psc: JSON) -> list[Violation]:
    """The pod's own ids, groups, runAsNonRoot and seccomp, and the host namespaces."""
    base = pod.spec_path
    out: list[Violation] = []
    for key in ("runAsUser", "runAsGroup", "fsGroup"):  # check_runAsUser.go, and runguard's
        if psc.get(key) == 0:
            out.append(
                Violation(
                    SECURITY_ROOT,
                    f"{base}.securityContext.{key}",
                    f"{key} 0 is root: set another id",
                )
            )
    groups = psc.get("supplementalGroups")
    if groups and 0 in groups:
        out.append(
            Violation(
                SECURITY_ROOT,
                f"{base}.securityContext.supplementalGroups",
                "group 0 is root's: remove it",
            )
        )
    if psc.get("runAsNonRoot") is False:  # check_runAsNonRoot.go
        out.append(
            Violation(
                SECURITY_ROOT, f"{base}.securityContext.runAsNonRoot", "must not be false: set true"
            )
        )
    pod_seccomp = psc.get("seccompProfile")
    if pod_seccomp is not None and pod_seccomp.get("type") not in CONFINED_PROFILES:
        out.append(
            _seccomp_violation(f"{base}.securityContext.seccompProfile.type", pod_seccomp, "")
        )
    for key in ("hostNetwork", "hostPID", "hostIPC"):  # check_hostNamespaces.go
        if pod.spec.get(key) is True:
            out.append(
                Violation(
                    SECURITY_HOST_NAMESPACE,
                    f"{base}.{key}",
                    f"{key} shares the node's namespace: remove it",
                )
            )
    return out


def _container_root_violations(
    context: _ContainerContext, sc: JSON, at: str, more: str
) -> list[Violation]:
    """A container's root ids and runAsNonRoot (``check_runAsNonRoot.go``)."""
    out: list[Violation] = []
    for key in ("runAsUser", "runAsGroup"):
        if sc.get(key) == 0:
            out.append(Violation(SECURITY_ROOT, f"{at}.{key}", f"{key} 0 is root: remove it{more}"))
    non_root = sc.get("runAsNonRoot")
    if non_root is False:
        out.append(
            Violation(SECURITY_ROOT, f"{at}.runAsNonRoot", f"must not be false: set true{more}")
        )
    elif context.restricted and non_root is None and context.pod_non_root is not True:
        out.append(
            Violation(
                SECURITY_ROOT,
                f"{at}.runAsNonRoot",
                f"must be true, here or in the pod's securityContext{more}",
            )
        )
    return out


def _container_privilege_violations(
    context: _ContainerContext, sc: JSON, at: str, more: str, list_name: str
) -> list[Violation]:
    """Privileged, privilege escalation (``check_privileged.go``,
    ``check_allowPrivilegeEscalation.go``) and capabilities
    (``check_capabilities_baseline.go``, ``check_capabilities_restricted.go``)."""
    out: list[Violation] = []
    for key in ("privileged", "allowPrivilegeEscalation"):
        if sc.get(key) is True:
            out.append(
                Violation(
                    SECURITY_PRIVILEGED,
                    f"{at}.{key}",
                    f"{key}: true is not allowed: remove it or set false{more}",
                )
            )
    if context.restricted and context.linux and sc.get("allowPrivilegeEscalation") is None:
        out.append(
            Violation(
                SECURITY_PRIVILEGED, f"{at}.allowPrivilegeEscalation", f"must be set to false{more}"
            )
        )
    caps = sc.get("capabilities") or {}
    added = caps.get("add") or []
    if added:
        policy = context.pod.policy
        allowed = allowed_capabilities(policy)
        if list_name != "ephemeralContainers":
            allowed |= operator_capabilities(context.pod)  # looked up only for an add
        added = [c for c in added if c not in allowed]
    if added:
        why = f" ({MESH_HINT})" if NETWORK_CAPABILITY in added and not more else ""
        out.append(
            Violation(
                SECURITY_CAPABILITIES,
                f"{at}.capabilities.add",
                f"capabilities {', '.join(added)} are not allowed at level "
                f"{context.pod.policy.security.level}: remove them{more}{why}",
            )
        )
    if context.restricted and context.linux and "ALL" not in (caps.get("drop") or ()):
        out.append(
            Violation(
                SECURITY_CAPABILITIES,
                f"{at}.capabilities.drop",
                f"must include ALL: drop every capability, add back only what is allowed{more}",
            )
        )
    return out


def _container_seccomp_violations(
    context: _ContainerContext, sc: JSON, at: str, more: str
) -> list[Violation]:
    """``check_seccompProfile_baseline.go``, ``check_seccompProfile_restricted.go``."""
    seccomp = sc.get("seccompProfile")
    if seccomp is not None:
        if seccomp.get("type") not in CONFINED_PROFILES:
            return [_seccomp_violation(f"{at}.seccompProfile.type", seccomp, more)]
        return []
    if context.restricted and context.linux and not context.pod_seccomp_ok:
        return [
            Violation(
                SECURITY_SECCOMP,
                f"{at}.seccompProfile",
                "no seccomp profile: set seccompProfile.type RuntimeDefault here or in "
                f"the pod's securityContext{more}",
            )
        ]
    return []


def _seccomp_violation(path: str, profile: JSON, more: str) -> Violation:
    return Violation(
        SECURITY_SECCOMP,
        path,
        f"seccomp profile {profile.get('type')!r} is not allowed: "
        f"set RuntimeDefault or Localhost{more}",
    )
