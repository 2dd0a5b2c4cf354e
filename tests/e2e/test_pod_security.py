"""runguard against the real PodSecurity admission plugin (docs/dev/guarantees.md, "Every admitted
object").

Every run Pod runguard admits must also pass the apiserver's own PodSecurity check at
``restricted``. Two namespaces: the test's own (runguard only) and one labelled
``pod-security.kubernetes.io/enforce: restricted`` (runguard and PodSecurity; the
apiserver runs its built-in validating plugins on the object its mutating webhooks
produced). A generated run Pod that runguard admits in the first (server-side dry run,
so runguard's verdict is not hidden behind PodSecurity's) is sent to the second, where a
PodSecurity rejection is a failure. Debug containers likewise, through the
``pods/ephemeralcontainers`` subresource of a running run.

The Pods come from the generators of ``tests/engine/test_pod_security.py`` (all container
kinds, no OS / linux / windows, valid and invalid values of every field the standard
reads), derandomized and bounded in number and time. Pods the apiserver refuses as
invalid (a Windows Pod with Linux-only fields) reach neither verdict; each is sent once
more where runguard does not act, to prove it was invalid as sent, not made invalid.

runguard ports the 1.37 checks (the generators leave out the two sysctls 1.37 added).
The e2e apiserver's ``latest`` is its own release: on
1.33 and 1.37 they admit nothing PodSecurity refuses (the same safe sysctls and SELinux
types, and 1.34's probe-host check on top). 1.30's ``restricted`` does not allow the
SELinux type ``container_engine_t`` yet (1.31 added it): there a Pod runguard admitted
with it is refused by PodSecurity, and must pass once that type is ``container_t``.
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from harness.pod_security import containers, run_pods, upstream_failures
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook.policy.loader import load_policy

from .build import ClusterError, kubernetes_version
from .cluster import Cluster
from .runs import EXCLUDED_NAMESPACE, Webhook, pod, run_pod

pytestmark = pytest.mark.e2e

ENFORCE = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
PODS = 150  # generated run Pods per test
DEBUG_CONTAINERS = 40
BUDGET_SECONDS = 150.0  # past this, the remaining examples are not sent
# Before 1.31, restricted allows the SELinux types container_t, container_init_t and
# container_kvm_t only; 1.31 added container_engine_t.
ENGINE_TYPE_REFUSED = kubernetes_version() < (1, 31)

JSON = dict[str, Any]


def submit(send: Callable[[], Any]) -> tuple[str, str]:
    """("admitted" | "pod-security" | "runguard" | "invalid", the apiserver's message)."""
    try:
        send()
    except ApiException as exc:
        message = str(json.loads(exc.body).get("message", "")) if exc.body else str(exc)
        if "violates PodSecurity" in message:
            return "pod-security", message
        if "validate.runguard.io" in message:
            return "runguard", message
        if exc.status == 422:
            return "invalid", message
        raise
    return "admitted", ""


def wait_for_pod_security(core: client.CoreV1Api, namespace: str, timeout: float = 30.0) -> None:
    """Until PodSecurity enforces the namespace's label, seen by a bare Pod that is no run
    (runguard lets it through) being refused. Never refused: the apiserver does not run
    the PodSecurity plugin (on by default since 1.25; it must not be in
    ``--disable-admission-plugins``)."""
    probe = pod("pss-probe", {"app": "probe"})
    deadline = time.monotonic() + timeout
    while True:
        outcome, _ = submit(
            lambda: core.create_namespaced_pod(
                namespace, probe, dry_run="All", _preload_content=False
            )
        )
        if outcome == "pod-security":
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"PodSecurity does not enforce {ENFORCE} in {namespace} after {timeout:.0f}s "
                f"(the probe was {outcome}): is the PodSecurity admission plugin enabled?"
            )
        time.sleep(0.2)


@pytest.fixture
def enforced(cluster: Cluster, api_client: Any, namespace: str) -> str:
    """A namespace where PodSecurity enforces the restricted level."""
    name = f"{namespace}-pss"
    cluster.kubectl("create", "namespace", name, check=True)
    labels = [f"{key}={value}" for key, value in ENFORCE.items()]
    cluster.kubectl("label", "namespace", name, *labels, check=True)
    wait_for_pod_security(client.CoreV1Api(api_client), name)
    return name


def bounded(count: int) -> Any:
    return settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


def on_root(runguard: Webhook, mode: str) -> None:
    """Serve the session policy with ``security.onRoot: mode`` (the ``runguard`` fixture
    puts the session policy back after the test)."""
    if mode == runguard.policy()[0]["spec"]["security"]["onRoot"]:
        return
    documents = runguard.policy()
    documents[0]["spec"]["security"]["onRoot"] = mode
    runguard.write_policy(documents)
    runguard.wait_for_policy(load_policy(runguard.policy_dir).digest)


@pytest.mark.parametrize(("mode", "count"), [("Strip", PODS), ("Deny", PODS // 2)])
def test_every_run_pod_runguard_admits_passes_pod_security(
    cluster: Cluster,
    runguard: Webhook,
    api_client: Any,
    namespace: str,
    enforced: str,
    mode: str,
    count: int,
) -> None:
    """Fixed (Strip) or left for validation to deny (Deny): either way, what runguard
    admits passes PodSecurity, and what the apiserver refuses as invalid after runguard
    was invalid as sent."""
    on_root(runguard, mode)
    core = client.CoreV1Api(api_client)
    outcomes: Counter[str] = Counter()
    start = time.monotonic()

    @bounded(count)
    @given(sent=run_pods(ephemeral=False))
    def one(sent: JSON) -> None:
        if time.monotonic() - start > BUDGET_SECONDS:
            outcomes["not sent (time)"] += 1
            return
        body = copy.deepcopy(sent)
        body["metadata"].pop("namespace")
        alone, message = submit(
            lambda: core.create_namespaced_pod(
                namespace, body, dry_run="All", _preload_content=False
            )
        )
        outcomes[alone] += 1
        if alone == "invalid":
            # Valid as sent (where runguard does not act), invalid as runguard left it:
            # runguard wrote what the apiserver refuses (a Linux field into a Windows Pod).
            untouched, _ = submit(
                lambda: core.create_namespaced_pod(
                    EXCLUDED_NAMESPACE, body, dry_run="All", _preload_content=False
                )
            )
            assert untouched == "invalid", (message, sent["spec"])
        if alone != "admitted":
            return
        engine = '"container_engine_t"'
        if ENGINE_TYPE_REFUSED and engine in json.dumps(body):
            refused, message = submit(
                lambda: core.create_namespaced_pod(
                    enforced, body, dry_run="All", _preload_content=False
                )
            )
            assert refused == "pod-security" and "seLinuxOptions" in message, message
            # That type was the only reason: with container_t, PodSecurity admits it.
            body = json.loads(json.dumps(body).replace(engine, '"container_t"'))
            outcomes["pod-security (container_engine_t)"] += 1
        response = core.create_namespaced_pod(enforced, body, dry_run="All", _preload_content=False)
        admitted = json.loads(response.data)
        # Runguard admitted it without PodSecurity: with PodSecurity it must pass too.
        assert upstream_failures(admitted) == [], (admitted["spec"], sent["spec"])

    try:
        one()
    except ApiException as exc:
        raise AssertionError(f"runguard admitted a Pod PodSecurity refuses: {exc.body}") from exc
    assert outcomes["admitted"] >= count // 15, outcomes  # fewer proves little
    assert outcomes["runguard"] > 0, outcomes  # the generated Pods do reach runguard's no


def test_every_debug_container_runguard_admits_passes_pod_security(
    cluster: Cluster, runguard: Webhook, api_client: Any, namespace: str, enforced: str
) -> None:
    """``kubectl debug`` is an UPDATE of ``pods/ephemeralcontainers``: the debug container
    is hardened by /mutate and judged by /validate; PodSecurity judges the whole Pod."""
    core = client.CoreV1Api(api_client)
    # The same run in the excluded namespace, untouched by runguard: where a debug
    # container is invalid after runguard, it must be invalid there too.
    names = {namespace: "train", enforced: "train", EXCLUDED_NAMESPACE: f"train-{namespace[-6:]}"}
    for ns, name in names.items():
        core.create_namespaced_pod(ns, run_pod(name), _preload_content=False)
    running = {ns: core.read_namespaced_pod(name, ns) for ns, name in names.items()}
    outcomes: Counter[str] = Counter()
    start = time.monotonic()

    def add(ns: str, debug: JSON) -> Callable[[], Any]:
        body = api_client.sanitize_for_serialization(running[ns])
        body["spec"]["ephemeralContainers"] = [debug]
        return lambda: core.replace_namespaced_pod_ephemeralcontainers(
            names[ns], ns, body, dry_run="All", _preload_content=False
        )

    @bounded(DEBUG_CONTAINERS)
    @given(debug=containers("debugger", "ephemeral"))
    def one(debug: JSON) -> None:
        if time.monotonic() - start > BUDGET_SECONDS:
            outcomes["not sent (time)"] += 1
            return
        debug["targetContainerName"] = "main"
        alone, message = submit(add(namespace, debug))
        outcomes[alone] += 1
        if alone == "invalid":
            assert submit(add(EXCLUDED_NAMESPACE, debug))[0] == "invalid", (message, debug)
        if alone == "admitted":
            add(enforced, debug)()  # raises ApiException on a PodSecurity refusal

    try:
        one()
    except ApiException as exc:
        raise AssertionError(
            f"runguard admitted a debug container PodSecurity refuses: {exc.body}"
        ) from exc
    assert outcomes["admitted"] >= 5 and outcomes["runguard"] > 0, outcomes


def test_kubectl_debug_without_a_profile_passes_pod_security(
    cluster: Cluster, runguard: Webhook, enforced: str
) -> None:
    """The legacy profile sends a debug container with no securityContext, which
    PodSecurity alone refuses at restricted; runguard's hardening makes it pass."""
    done = cluster.kubectl(
        "create", "-n", enforced, "-f", "-", input=json.dumps(run_pod("train")), check=True
    )
    done = cluster.kubectl(
        "debug", "train", "-n", enforced, "--image=busybox:1.36", "--attach=false",
        "-c", "debugger", "--profile=legacy",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = json.loads(
        cluster.kubectl("get", "pod", "train", "-n", enforced, "-o", "json", check=True).stdout
    )
    debugger = stored["spec"]["ephemeralContainers"][0]
    assert debugger["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert upstream_failures(stored) == []
