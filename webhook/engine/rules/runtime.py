"""Rule ``profile.run-time``: time is part of a profile.

A profile's ``runTime`` bounds how long one run holds its devices: the Pod's
``activeDeadlineSeconds`` (for a Job, a CronJob or an operator's object, that of the
pod template, so each of its Pods) is set to the profile's default where the run sets
none, and lowered to its maximum where the run asks for more, the smaller of the run's
and the maximum winning. A run whose value is absent or above the maximum is denied at
``/validate``: a Pod that skipped ``/mutate``, and on UPDATE a run's value removed or
raised (the apiserver lets a Pod's only shrink; a suspended Job's template is the
user's to edit until it starts).

A run's Job (a CronJob's ``jobTemplate``) also gets its own ``activeDeadlineSeconds``,
the profile's maximum (else its default): each of its Pods is bounded, and so are its
retries (``backoffLimit``), which would otherwise hold the devices once per Pod. The same
bound holds at ``/validate`` (absent or above: denied, on UPDATE as at CREATE).

A queued run (a queue profile's) also carries Kueue's maximum execution time label,
``kueue.x-k8s.io/max-exec-time-seconds`` (the profile's maximum, else its default),
written with the queue's labels; an UPDATE removing or raising it is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from webhook.engine.pod import Pod
from webhook.engine.rule import Declarations
from webhook.engine.types import Change, Violation
from webhook.policy.model import Profile

if TYPE_CHECKING:
    from webhook.engine.subject import Review

__all__ = [
    "MAX_EXEC_TIME",
    "PROFILE_RUN_TIME",
    "apply_run_time",
    "bound_job",
    "check_exec_time_kept",
    "check_job_run_time",
    "check_run_time",
    "max_exec_time_label",
]

RULES = Declarations(__name__)
PROFILE_RUN_TIME = RULES.rule(
    "profile.run-time",
    mutation=(
        "`activeDeadlineSeconds` set to the profile's `runTime` default where absent, lowered "
        "to its maximum where above; a run's Job's own set to the maximum"
    ),
    violation=(
        "`activeDeadlineSeconds` (a Pod's, a run's Job's) absent (removed) or above the "
        "profile's `runTime` maximum; a queued run's `kueue.x-k8s.io/max-exec-time-seconds` "
        "removed or raised on UPDATE"
    ),
)

DEADLINE = "activeDeadlineSeconds"


def _wanted(pod: Pod) -> tuple[int | None, int | None] | None:
    """(what a run setting none gets, the maximum) of the run's profile; None: no run time."""
    profile = pod.profile
    run_time = profile.run_time if profile is not None else None
    if run_time is None or run_time.given is None:
        return None
    return run_time.given, run_time.maximum


def apply_run_time(pod: Pod) -> Change | None:
    wanted = _wanted(pod)
    if wanted is None:
        return None
    given, maximum = wanted
    asked = pod.spec.get(DEADLINE)
    if not isinstance(asked, int) or isinstance(asked, bool):
        pod.spec[DEADLINE] = given
        return Change(PROFILE_RUN_TIME, f"runguard: run time set: {DEADLINE} {given}")
    if maximum is not None and asked > maximum:
        pod.spec[DEADLINE] = maximum
        return Change(
            PROFILE_RUN_TIME, f"runguard: run time lowered: {DEADLINE} {asked} -> {maximum} (max)"
        )
    return None


def check_run_time(pod: Pod) -> list[Violation]:
    wanted = _wanted(pod)
    if wanted is None:
        return []
    given, maximum = wanted
    asked = pod.spec.get(DEADLINE)
    path = f"{pod.spec_path}.{DEADLINE}"
    title = pod.profile.title if pod.profile is not None else ""
    if not isinstance(asked, int) or isinstance(asked, bool):
        return [
            Violation(
                PROFILE_RUN_TIME,
                path,
                f"profile {title} gives runs a run time: {DEADLINE} must be set (at most "
                f"{maximum if maximum is not None else given} seconds), not removed",
            )
        ]
    if maximum is not None and asked > maximum:
        return [
            Violation(
                PROFILE_RUN_TIME,
                path,
                f"{DEADLINE} {asked} is above profile {title}'s maximum run time {maximum} seconds",
            )
        ]
    return []


# --- a run's Job: its retries bounded too -----------------------------------------------

_JOBS = frozenset({"Job", "CronJob"})


def _job_bound(kind: str, keys: tuple[str, ...], profile: Profile | None) -> int | None:
    """The run time of the whole Job whose pod template is at ``keys`` (the profile's
    maximum, else its default); None: not a Job's template, or no run time."""
    if kind not in _JOBS or not keys or keys[-1] != "template" or profile is None:
        return None
    run_time = profile.run_time
    return None if run_time is None else run_time.maximum or run_time.given


def _job_spec(obj: Any, keys: tuple[str, ...]) -> Any:
    node = obj
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def bound_job(
    obj: dict[str, Any], kind: str, keys: tuple[str, ...], profile: Profile | None
) -> tuple[dict[str, Any], Change | None]:
    """At CREATE, a run's Job (``keys``: to its pod template) with its own
    ``activeDeadlineSeconds`` set to the bound where absent, lowered where above."""
    bound = _job_bound(kind, keys, profile)
    spec = _job_spec(obj, keys)
    if bound is None or not isinstance(spec, dict):
        return obj, None
    asked = spec.get(DEADLINE)
    valid = isinstance(asked, int) and not isinstance(asked, bool)
    if isinstance(asked, int) and valid and asked <= bound:
        return obj, None
    out = dict(obj)
    node = out
    for key in keys[:-1]:
        node[key] = dict(node[key])
        node = node[key]
    node[DEADLINE] = bound
    where = ".".join(keys[:-1])
    said = (
        f"{where}.{DEADLINE} {asked} -> {bound} (max)" if valid else f"{where}.{DEADLINE} {bound}"
    )
    return out, Change(PROFILE_RUN_TIME, f"runguard: the Job's run time set: {said}")


def check_job_run_time(
    obj: Any, kind: str, keys: tuple[str, ...], profile: Profile | None
) -> list[Violation]:
    """A run's Job whose own ``activeDeadlineSeconds`` is absent or above the bound."""
    bound = _job_bound(kind, keys, profile)
    spec = _job_spec(obj, keys)
    if bound is None or not isinstance(spec, dict):
        return []
    asked = spec.get(DEADLINE)
    if isinstance(asked, int) and not isinstance(asked, bool) and asked <= bound:
        return []
    title = profile.title if profile is not None else ""
    path = ".".join((*keys[:-1], DEADLINE))
    return [
        Violation(
            PROFILE_RUN_TIME,
            path,
            f"profile {title} gives runs at most {bound} seconds: the Job's {DEADLINE} must "
            f"be set to at most that (its retries hold the devices too), not "
            f"{'removed' if asked is None else asked}",
        )
    ]


# --- queued runs: Kueue's maximum execution time ----------------------------------------

# Kueue deactivates a Workload that has run longer than this label says.
MAX_EXEC_TIME = "kueue.x-k8s.io/max-exec-time-seconds"
# kind -> the keys to the metadata holding the queue's labels (as the queue profile writes)
_LABELLED: dict[str, tuple[str, ...]] = {"CronJob": ("spec", "jobTemplate", "metadata")}


def max_exec_time_label(profile: Profile) -> dict[str, str]:
    """The label a queued run of ``profile`` carries for its run time (the maximum, else
    the default), none without one."""
    run_time = profile.run_time
    seconds = None if run_time is None else run_time.maximum or run_time.given
    return {} if seconds is None else {MAX_EXEC_TIME: str(seconds)}


def _exec_time(obj: Any) -> tuple[str, Any]:
    """(path, value) of the run's Kueue maximum execution time label (None: absent)."""
    keys = _LABELLED.get(obj.get("kind", ""), ("metadata",)) if isinstance(obj, dict) else ()
    node: Any = obj
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    labels = node.get("labels") if isinstance(node, dict) else None
    path = ".".join(keys) + f".labels[{MAX_EXEC_TIME}]"
    return path, labels.get(MAX_EXEC_TIME) if isinstance(labels, dict) else None


def check_exec_time_kept(r: Review) -> list[Violation]:
    """``profile.run-time``: on UPDATE, a queued run's maximum execution time label
    removed or raised (Kueue would let the run hold its devices longer than its
    profile says); lowering it is anyone's."""
    if r.old is None or not isinstance(r.obj, dict):
        return []
    _, before = _exec_time(r.old)
    if not isinstance(before, str) or not before.isdigit():
        return []
    path, after = _exec_time(r.obj)
    if isinstance(after, str) and after.isdigit() and int(after) <= int(before):
        return []
    return [
        Violation(
            PROFILE_RUN_TIME,
            path,
            f"{MAX_EXEC_TIME} was {before}: a run's maximum execution time may be lowered, "
            f"never {'removed' if after is None else 'raised'}",
        )
    ]
