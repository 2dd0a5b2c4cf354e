"""The hardening a level fills where a securityContext leaves it out (seccomp,
capabilities dropped, no privileges, no escalation), and step ``security.debug-container``.

``security.strip_root`` fills the Pod's containers with it; the containers
``kubectl debug`` adds get only it (``harden_debug_containers``): an ephemeral container
can never be removed, so it is never stripped, and one that asks for privileges is
refused by ``security.check_security`` like any container.
"""

from __future__ import annotations

from webhook.engine.pod import made_once, warning
from webhook.engine.rule import Declarations
from webhook.engine.rules.pod_security import CONFINED_PROFILES, is_windows
from webhook.engine.types import JSON, Change
from webhook.policy.model import RunPolicy, SecurityConfig

RULES = Declarations(__name__)
SECURITY_DEBUG_CONTAINER = RULES.rule(
    "security.debug-container",
    mutation=(
        "an ephemeral container added with `kubectl debug` hardened as `--profile=restricted` would"
    ),
    violation="a debug container that is not (Pod Security, like any container)",
)

RUNTIME_DEFAULT = "RuntimeDefault"


def seccomp_fill(policy: RunPolicy) -> str | None:
    """The seccomp type filled where none is set: the policy's, never ``Unconfined``;
    ``RuntimeDefault`` when the level requires one and the policy names none."""
    wanted = policy.security.seccomp_profile
    if wanted in CONFINED_PROFILES:
        return wanted
    return RUNTIME_DEFAULT if policy.security.level == "restricted" else None


def drop_fill(policy: RunPolicy) -> tuple[str, ...]:
    """The capabilities every container drops: the policy's, and ALL at restricted."""
    drop = policy.security.drop_capabilities
    if policy.security.level == "restricted" and "ALL" not in drop:
        return (*drop, "ALL")
    return drop


class Hardening:
    """What is filled under one SecurityConfig, with its warning labels: the same
    on every review (``seccomp_fill``, ``drop_fill``)."""

    def __init__(self, policy: RunPolicy):
        self.seccomp = seccomp_fill(policy)
        self.seccomp_label = f"seccomp {self.seccomp}"
        self.drop = drop_fill(policy)
        self.drop_label = f"drop {','.join(self.drop)}"  # where a container drops none


# id(SecurityConfig) -> (it, its Hardening): kept with it, so that its id is not reused
_HARDENINGS: dict[int, tuple[SecurityConfig, Hardening]] = {}


def hardening(policy: RunPolicy) -> Hardening:
    """The ``Hardening`` of ``policy.security`` (which alone decides it), made once."""
    return made_once(_HARDENINGS, policy.security, lambda _: Hardening(policy))


def fill_container(sc: JSON, drop: tuple[str, ...], filled: list[str], all_label: str) -> None:
    """What a Linux container left out: no privileges, no escalation, capabilities dropped;
    each added to ``filled`` (``all_label``: the label of ``drop``, where none is dropped).

    Not ``allowPrivilegeEscalation: false`` beside ``privileged: true`` or an added
    ``CAP_SYS_ADMIN`` still there (``onRoot: Deny``, a debug container): the apiserver
    refuses that pair as invalid, with a message that would hide runguard's denial."""
    caps = sc.get("capabilities")
    if sc.get("privileged") is None:
        sc["privileged"] = False
        filled.append("privileged false")
    if sc.get("allowPrivilegeEscalation") is None and not (
        sc["privileged"] is True
        or (caps is not None and "CAP_SYS_ADMIN" in (caps.get("add") or ()))
    ):
        sc["allowPrivilegeEscalation"] = False
        filled.append("allowPrivilegeEscalation false")
    if caps is None:
        caps = sc["capabilities"] = {}
    if not drop:
        return
    have = caps.get("drop")
    if not have:  # the usual container: drops nothing, so all of ``drop`` is missing
        caps["drop"] = list(drop)
        filled.append(all_label)
        return
    missing = [c for c in drop if c not in have]
    if missing:
        caps["drop"] = [*have, *missing]
        filled.append(f"drop {','.join(missing)}")


def harden_debug_containers(
    spec: JSON, running: JSON, policy: RunPolicy
) -> tuple[JSON, Change] | None:
    """``kubectl debug``: the ephemeral containers of ``spec`` not in the ``running`` spec
    get what they left out of their securityContext, at container level where the pod's
    does not already give it (runAsNonRoot, seccomp). Nothing is stripped: an ephemeral
    container can never be removed, so one that asks for privileges is denied (and told
    to use ``--profile=restricted``), not added weakened. The new spec, or None."""
    before = running.get("ephemeralContainers")
    old = {c.get("name") for c in before if type(c) is dict} if type(before) is list else set()
    added = {c["name"] for c in spec.get("ephemeralContainers") or ()} - old
    if not added:
        return None
    hardened, filled = [], []
    for container in spec["ephemeralContainers"]:
        if container["name"] in added:
            sc = _debug_context(container.get("securityContext") or {}, spec, policy)
            if sc is not None:
                filled.append(container["name"])
                container = {**container, "securityContext": sc}
        hardened.append(container)
    if not filled:
        return None
    text = warning("debug container hardened (kubectl debug --profile=restricted)", filled)
    return {**spec, "ephemeralContainers": hardened}, Change(SECURITY_DEBUG_CONTAINER, text)


def _debug_context(context: JSON, spec: JSON, policy: RunPolicy) -> JSON | None:
    """An added debug container's securityContext with what it left out filled in, or
    None when it left out nothing."""
    psc = spec.get("securityContext") or {}
    sc = dict(context)
    if psc.get("runAsNonRoot") is not True and sc.get("runAsNonRoot") is None:
        sc["runAsNonRoot"] = True
    if not is_windows(spec):
        fill = hardening(policy)
        pod_seccomp = (psc.get("seccompProfile") or {}).get("type") in CONFINED_PROFILES
        if not pod_seccomp and sc.get("seccompProfile") is None and fill.seccomp is not None:
            sc["seccompProfile"] = {"type": fill.seccomp}
        if sc.get("capabilities") is not None:
            sc["capabilities"] = dict(sc["capabilities"])
        fill_container(sc, fill.drop, [], fill.drop_label)
    return None if sc == context else sc
