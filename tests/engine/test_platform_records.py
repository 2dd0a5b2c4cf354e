"""Whose record: with two platforms in one cluster, the platform record names the
RunPolicy whose platform wrote it (``runguard.io/platform-policy``), and everything that
reads a record reads it as that RunPolicy's (``scope.recorder`` of a stored object,
``ownership.recorded_for``); a platform's Pod token opens only what its platform's
identities may themselves (``scope.may_open``).

The policy is the Core's RunPolicies first, then MLRun's (``mlrun``: MLRun's API;
``nuclio``: MLRun's API and Nuclio's controller), as in ``harness.attack_chains.TWO``.
"""

from __future__ import annotations

import copy
from typing import Any

from harness.attack_chains import (
    LAUNCHER,
    MLRUN_API,
    TWO,
    _updated,
    admitted,
    deployment,
    door,
    judged_by,
    mlrun_run,
    nuclio_function,
)
from harness.cluster_state import State
from harness.shipped import ALICE, CORE, pod, rules

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.rules import ownership
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, REQUESTED_BY

CORE_SECRET = "digitalhub-common-creds"  # the Core's credentials, named by its policy


def helper(secret: str | None, image: str = "mlrun/helper:1") -> dict[str, Any]:
    """A Deployment outside every RunPolicy's selector, reading ``secret``."""
    container: dict[str, Any] = {"name": "m", "image": image}
    if secret:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    return deployment({"app": "helper"}, {"containers": [container]})


def mlruns_helper() -> dict[str, Any]:
    """MLRun's Deployment, recorded for MLRun, whose template no longer names anything of
    MLRun's (the Secret it read was dropped by MLRun's API)."""
    made = judged_by(helper("mlrun-auth-secrets.abc"), MLRUN_API, TWO).object
    return _updated(helper(None), made, MLRUN_API)


def swap_image(obj: dict[str, Any], image: str) -> dict[str, Any]:
    swapped = copy.deepcopy(obj)
    swapped["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return swapped


def update(new: dict[str, Any], old: dict[str, Any], who: Requester) -> Any:
    context = Context(who, State([]), "UPDATE")
    return validate(new, TWO, namespace="ml", old=old, context=context)


def test_the_record_names_the_run_policy_whose_platform_wrote_it() -> None:
    """At CREATE ``/mutate`` writes the record with the RunPolicy that recorded the
    object; nothing recorded, no name."""
    mlruns = judged_by(helper("mlrun-auth-secrets.abc"), MLRUN_API, TWO).object
    records = {k: v for k, v in mlruns["metadata"]["annotations"].items() if k != REQUESTED_BY}
    assert records == {PLATFORM_RECORD: "true", PLATFORM_POLICY: "mlrun"}
    cores = judged_by(helper(CORE_SECRET, "core/helper:1"), CORE, TWO).object
    assert cores["metadata"]["annotations"][PLATFORM_POLICY] == "builds"  # the Core's first
    hers = judged_by(helper(None, "python:3.11"), ALICE, TWO).object
    assert PLATFORM_POLICY not in hers["metadata"].get("annotations", {})
    # kept on UPDATE, whatever the update sends
    dropped = mlruns_helper()
    assert dropped["metadata"]["annotations"][PLATFORM_POLICY] == "mlrun"


def test_the_name_is_runguards_to_write() -> None:
    """A name sent at CREATE, or changed by an update, is refused by the validating
    backstop (``ownership.stamp``) and put right by ``/mutate``."""
    forged = helper(None, "python:3.11")
    forged["metadata"]["annotations"] = {PLATFORM_RECORD: "true", PLATFORM_POLICY: "mlrun"}
    context = Context(ALICE, State([]))
    assert "ownership.stamp" in rules(validate(forged, TWO, namespace="ml", context=context))
    mutated = mutate(forged, TWO, namespace="ml", context=context).object
    assert PLATFORM_RECORD not in mutated["metadata"]["annotations"]
    assert PLATFORM_POLICY not in mutated["metadata"]["annotations"]
    stored = mlruns_helper()
    renamed = copy.deepcopy(stored)
    renamed["metadata"]["annotations"][PLATFORM_POLICY] = "digitalhub"
    assert "ownership.stamp" in rules(update(renamed, stored, MLRUN_API))
    assert "ownership.stamp" in rules(update(renamed, stored, CORE))
    context = Context(MLRUN_API, State([]), "UPDATE")
    kept = mutate(renamed, TWO, namespace="ml", old=stored, context=context).object
    assert kept["metadata"]["annotations"][PLATFORM_POLICY] == "mlrun"


def test_a_record_from_before_the_name_is_read_as_the_platform_that_stamped_it() -> None:
    """A record written by a version that kept no name ("true" alone): read as the
    platform whose identity stamped the object (``runguard.io/requested-by``), here
    MLRun's API, not as the first platform's; the update keeps it without a name."""
    legacy = mlruns_helper()
    del legacy["metadata"]["annotations"][PLATFORM_POLICY]
    assert legacy["metadata"]["annotations"][REQUESTED_BY] == MLRUN_API.username
    swapped = swap_image(legacy, "core/other:1")
    assert "ownership.changed" in rules(update(swapped, legacy, CORE))
    assert update(swapped, legacy, MLRUN_API).allowed
    kept = _updated(swapped, legacy, MLRUN_API)
    assert PLATFORM_POLICY not in kept["metadata"]["annotations"]


def test_another_platforms_record_makes_nothing_this_platforms() -> None:
    """MLRun's record does not make an object the Core's: MLRun's API may not add the
    Core's Secret to its own Deployment by an update (``ownership.not-a-run`` by the
    Core's RunPolicies), as it may not at CREATE; the Core's record alike for MLRun."""
    stored = mlruns_helper()
    with_cores = copy.deepcopy(stored)
    with_cores["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
        {"secretRef": {"name": CORE_SECRET}}
    ]
    assert "ownership.not-a-run" in rules(update(with_cores, stored, MLRUN_API))
    assert "ownership.not-a-run" in rules(judged_by(helper(CORE_SECRET), MLRUN_API, TWO))
    cores = judged_by(helper(CORE_SECRET, "core/helper:1"), CORE, TWO).object
    with_mlruns = copy.deepcopy(cores)
    with_mlruns["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
        {"secretRef": {"name": "mlrun-auth-secrets.abc"}}
    ]
    assert "ownership.not-a-run" in rules(update(with_mlruns, cores, CORE))


def test_an_owner_recorded_by_another_platform_is_not_this_platforms() -> None:
    """``recorded_for``: an owner's record counts for the RunPolicy it names, and for
    every RunPolicy whose identities include all of that one's (MLRun's API is also
    Nuclio's); a record without a name counts as before; without every RunPolicy to
    read the name in, any name counts."""
    mlrun, nuclio = TWO.named("mlrun"), TWO.named("nuclio")
    builds, digitalhub = TWO.named("builds"), TWO.named("digitalhub")
    assert mlrun and nuclio and builds and digitalhub
    by_mlrun = {PLATFORM_RECORD: "true", PLATFORM_POLICY: "mlrun"}
    assert ownership.recorded_platform(mlrun, by_mlrun, TWO)
    assert ownership.recorded_platform(nuclio, by_mlrun, TWO)
    assert not ownership.recorded_platform(digitalhub, by_mlrun, TWO)
    by_nuclio = {PLATFORM_RECORD: "true", PLATFORM_POLICY: "nuclio"}
    assert not ownership.recorded_platform(mlrun, by_nuclio, TWO)
    by_builds = {PLATFORM_RECORD: "true", PLATFORM_POLICY: "builds"}
    assert ownership.recorded_platform(digitalhub, by_builds, TWO)  # one platform
    gone = {PLATFORM_RECORD: "true", PLATFORM_POLICY: "removed"}
    assert not ownership.recorded_platform(mlrun, gone, TWO)
    assert ownership.recorded_platform(mlrun, {PLATFORM_RECORD: "true"}, TWO)
    assert ownership.recorded_platform(digitalhub, by_mlrun)  # no root: as before


def test_a_pod_token_opens_only_what_its_platforms_identities_may() -> None:
    """``scope.may_open``: the token of MLRun's run Pod opens Nuclio's function Pod, as
    MLRun's API (one of Nuclio's identities) may itself; the token of Nuclio's function
    Pod does not open MLRun's run, as Nuclio's controller may not; the Core's opens
    neither."""
    function = nuclio_function()
    assert function["metadata"]["annotations"][PLATFORM_POLICY] == "nuclio"
    run = mlrun_run()
    assert run["metadata"]["annotations"][PLATFORM_POLICY] == "mlrun"
    assert door(function, TWO, MLRUN_API).allowed  # the identity
    assert door(function, TWO, LAUNCHER, by=run).allowed  # so its Pod's token
    assert rules(door(run, TWO, LAUNCHER, by=function)) == {"ownership.debug"}
    core_run = admitted(pod(), TWO, CORE)
    assert rules(door(function, TWO, LAUNCHER, by=core_run)) == {"ownership.debug"}
