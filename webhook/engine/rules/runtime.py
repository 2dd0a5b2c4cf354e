"""Rule ``profile.run-time``: time is part of a profile.

A profile's ``runTime`` bounds how long one run holds its devices: the Pod's
``activeDeadlineSeconds`` (for a Job, a CronJob or an operator's object, that of the
pod template, so each of its Pods) is set to the profile's default where the run sets
none, and lowered to its maximum where the run asks for more, the smaller of the run's
and the maximum winning. A run whose value is absent or above the maximum is denied at
``/validate``: a Pod that skipped ``/mutate``, and on UPDATE a run's value removed or
raised (the apiserver lets a Pod's only shrink; a suspended Job's template is the
user's to edit until it starts).
"""

from __future__ import annotations

from webhook.engine.pod import Pod
from webhook.engine.rule import Declarations
from webhook.engine.types import Change, Violation

__all__ = ["PROFILE_RUN_TIME", "apply_run_time", "check_run_time"]

RULES = Declarations(__name__)
PROFILE_RUN_TIME = RULES.rule(
    "profile.run-time",
    mutation=(
        "`activeDeadlineSeconds` set to the profile's `runTime` default where absent, lowered "
        "to its maximum where above"
    ),
    violation=("`activeDeadlineSeconds` absent (removed) or above the profile's `runTime` maximum"),
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
