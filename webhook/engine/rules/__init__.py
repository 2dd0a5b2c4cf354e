"""The rules, one module per concern; each holds its mutation steps and its checks.

A concern's fix and its check live side by side, so what mutation repairs and what
validation refuses cannot drift apart. The order of ``MUTATION_STEPS`` is the
documented mutation order; adding a step or a check is one line here and a function in its
module, beside the declaration of the rule id it emits (``webhook.engine.rule``).
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.engine.doors import Door
from webhook.engine.pod import Pod
from webhook.engine.rules import (
    devices,
    dra,
    not_a_run,
    pod_security,
    profile,
    reserved,
    resources,
    runtime,
    scheduling,
    secrets,
    security,
    volumes,
)
from webhook.engine.types import Change, Violation

Step = Callable[[Pod], Change | None]
Check = Callable[[Pod], list[Violation]]

MUTATION_STEPS: tuple[Step, ...] = (
    profile.note_profile_fallback,
    profile.apply_profile,  # 1
    profile.clamp_to_profile_ranges,  # 1, a run's value outside the profile's range
    runtime.apply_run_time,  # 1, the profile's run time
    resources.fill_defaults,  # 2
    resources.derive_memory_limits,  # 3
    resources.clamp_to_maximums,  # 4
    security.note_network_capability,  # 5, why a mesh's init container will fail
    security.strip_root,  # 5
    devices.drop_device_env,  # 5, devices only through requests
    pod_security.confine_apparmor,  # 5, Pod Security Standards
    pod_security.confine_selinux,
    pod_security.default_proc_mount,
    volumes.drop_preexisting_volumes,  # 6
    devices.drop_device_claims,  # 6, devices only through the run's own claims
    secrets.drop_forbidden_secrets,  # 7
    scheduling.default_priority_class,  # 8a
    scheduling.apply_preemption_mode,  # 8b
)

CHECKS: tuple[Check, ...] = (
    profile.check_profile,
    profile.check_profile_ranges,
    runtime.check_run_time,
    resources.check_resources,
    resources.check_run_totals,
    resources.check_device_families,
    devices.check_device_env,
    security.check_security,
    pod_security.check_pod_security,
    volumes.check_volumes,
    secrets.check_secrets,
    devices.check_device_claims,
    dra.check_device_requests,
    scheduling.check_scheduling,
    not_a_run.check_ownership,  # the platform's objects and accounts, a run's too
)


def run_steps(pod: Pod) -> list[Change]:
    """Every mutation step in order; the changes of those that changed something."""
    changes = []
    for step in MUTATION_STEPS:
        change = step(pod)
        if change is not None:
            changes.append(change)
    return changes


def run_checks(pod: Pod) -> list[Violation]:
    """Every violation of the pod, from every check."""
    out: list[Violation] = []
    for check in CHECKS:
        out.extend(check(pod))
    return out


def judge(door: Door) -> str:
    """The rule that strips or denies what a run may not use through ``door`` (a field
    of ``webhook.engine.doors``): ``tests/engine/test_doors.py`` holds every door to it."""
    if door.kind == "ConfigMap":  # as a volume, pre-existing data; in the env, ownership's
        if door.path[0] == "volumes":
            return volumes.VOLUMES_PRE_EXISTING
        return not_a_run.OWNERSHIP_NOT_A_RUN
    return _JUDGES[door.kind]


_JUDGES = {
    "Secret": secrets.SECRETS_FORBIDDEN,  # stripped or denied alike, whatever the door
    "PersistentVolumeClaim": volumes.VOLUMES_PRE_EXISTING,
    "ServiceAccount": reserved.OWNERSHIP_SERVICE_ACCOUNT,
    "ResourceClaim": devices.RESOURCES_DEVICE_CLAIM,
}
