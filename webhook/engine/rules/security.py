"""Step 5 and rules ``security.*``: no root, no privileges, hardening fields filled."""

from __future__ import annotations

from webhook.engine.pod import ALL_CONTAINER_LISTS, Pod, warning
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import SecurityConfig


def strip_root(pod: Pod) -> Change | None:
    """Harden the pod. Explicit root settings are fixed only with ``onRoot: Strip``
    (``security.root``); fields the user left out (runAsNonRoot, seccomp, dropped
    capabilities, no privilege escalation) are always filled (``security.defaults``)."""
    sec = pod.policy.security
    strip = sec.on_root == "Strip"
    stripped: list[str] = []
    filled: list[str] = []
    spec = pod.spec
    psc = spec.get("securityContext")
    if psc is None:
        psc = spec["securityContext"] = {}
    if strip:
        _strip_root_ids(psc, ("runAsUser", "runAsGroup", "fsGroup"), sec, "pod", stripped)
    if psc.get("runAsNonRoot") is None:
        psc["runAsNonRoot"] = True
        filled.append("runAsNonRoot")
    elif strip and psc["runAsNonRoot"] is False:
        psc["runAsNonRoot"] = True
        stripped.append("runAsNonRoot false")
    if sec.seccomp_profile:
        current = (psc.get("seccompProfile") or {}).get("type")
        if current is None:
            psc["seccompProfile"] = {"type": sec.seccomp_profile}
            filled.append(f"seccomp {sec.seccomp_profile}")
        elif strip and current == "Unconfined":
            psc["seccompProfile"] = {"type": sec.seccomp_profile}
            stripped.append("seccomp Unconfined")

    for _, _, container in pod.containers():
        name = container["name"]
        sc = container.get("securityContext")
        if sc is None:
            sc = container["securityContext"] = {}
        if strip:
            _strip_root_ids(sc, ("runAsUser", "runAsGroup"), sec, name, stripped)
            if sc.get("runAsNonRoot") is False:
                sc["runAsNonRoot"] = True
                stripped.append(f"{name} runAsNonRoot false")
            if sec.seccomp_profile and (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
                sc["seccompProfile"] = {"type": sec.seccomp_profile}
                stripped.append(f"{name} seccomp Unconfined")
        for key in ("privileged", "allowPrivilegeEscalation"):
            if sc.get(key) is None:
                sc[key] = False
                filled.append(f"{key} false")
            elif strip and sc[key] is True:
                sc[key] = False
                stripped.append(f"{name} {key}")
        caps: JSON | None = sc.get("capabilities")
        if caps is None:
            caps = sc["capabilities"] = {}
        drop = caps.get("drop") or []
        missing = [c for c in sec.drop_capabilities if c not in drop]
        if missing:
            caps["drop"] = [*drop, *missing]
            filled.append(f"drop {','.join(missing)}")
        add = caps.get("add")
        if strip and add:
            kept = [c for c in add if c in sec.allowed_capabilities]
            if kept != add:
                stripped.append(f"{name} add {','.join(c for c in add if c not in kept)}")
                if kept:
                    caps["add"] = kept
                else:
                    del caps["add"]
    if stripped:
        return Change("security.root", warning("root and privileges stripped", stripped))
    if filled:
        return Change("security.defaults", warning("security defaults set", dict.fromkeys(filled)))
    return None


def _strip_root_ids(
    sc: JSON, keys: tuple[str, ...], sec: SecurityConfig, where: str, stripped: list[str]
) -> None:
    """Replace uid/gid/fsGroup 0 by the policy's id for that key, or drop the field."""
    replacements = {
        "runAsUser": sec.run_as_user,
        "runAsGroup": sec.run_as_group,
        "fsGroup": sec.fs_group,
    }
    for key in keys:
        if sc.get(key) == 0:
            replacement = replacements[key]
            if replacement is None:
                del sc[key]
            else:
                sc[key] = replacement
            stripped.append(f"{where} {key} 0")


def check_security(pod: Pod) -> list[Violation]:
    base = pod.spec_path
    allowed_caps = pod.policy.security.allowed_capabilities
    out: list[Violation] = []
    psc = pod.spec.get("securityContext") or {}
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if psc.get(key) == 0:
            out.append(
                Violation("security.root", f"{base}.securityContext.{key}", f"{key} 0 is root")
            )
    if psc.get("runAsNonRoot") is False:
        out.append(
            Violation("security.root", f"{base}.securityContext.runAsNonRoot", "must not be false")
        )
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.spec.get(key) is True:
            out.append(
                Violation("security.host-namespace", f"{base}.{key}", f"{key} is not allowed")
            )
    for list_name, i, container in pod.containers(ALL_CONTAINER_LISTS):
        sc = container.get("securityContext") or {}
        path = f"{base}.{list_name}[{i}].securityContext"
        for key in ("runAsUser", "runAsGroup"):
            if sc.get(key) == 0:
                out.append(Violation("security.root", f"{path}.{key}", f"{key} 0 is root"))
        if sc.get("runAsNonRoot") is False:
            out.append(Violation("security.root", f"{path}.runAsNonRoot", "must not be false"))
        for key in ("privileged", "allowPrivilegeEscalation"):
            if sc.get(key) is True:
                out.append(
                    Violation("security.privileged", f"{path}.{key}", f"{key} is not allowed")
                )
        added = [
            c for c in (sc.get("capabilities") or {}).get("add") or () if c not in allowed_caps
        ]
        if added:
            out.append(
                Violation(
                    "security.capabilities",
                    f"{path}.capabilities.add",
                    f"capabilities {', '.join(added)} are not allowed",
                )
            )
    return out
