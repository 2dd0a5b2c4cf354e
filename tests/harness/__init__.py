"""The test harness: one way to do each thing.

* certificates: ``TestCA`` (``harness.certs``, built on ``webhook.install.certs``);
* waiting: ``eventually(what, probe, timeout)`` (``harness.polling``);
* a real server: ``RunguardServer``, ``Traffic``, ``AtomicDir`` and the fixtures
  ``start_runguard`` / ``runguard_server`` (``harness.server``, registered by
  ``tests/conftest.py``);
* inputs: ``admission_review``, ``run_pod``, ``sample_policy``, ``write``,
  ``written_policy`` (``harness.inputs``).

What the test modules share, each imported by its module (no test module imports
another): ``harness.shipped`` (the shipped policies, who asks, the engine called as the
webhooks call it), ``harness.cluster_state``, ``harness.routing``, ``harness.references``,
``harness.templates``, ``harness.shells``, ``harness.profiles``, ``harness.team_policies``,
``harness.pod_strategies``, ``harness.pod_security`` (upstream's PodSecurity checks, ported,
and the Pods they judge; ``tests/e2e`` uses them too), ``harness.apiserver``,
``harness.openreports`` (the OpenReports CRDs and their schemas), ``harness.manifests_base``
and ``harness.attack_chains``.

Shared with the benchmarks (``bench/`` imports them; no test imports ``bench/``), each
imported by its module: ``harness.workloads`` (the Pods they send, a process's memory),
``harness.fuzz`` (fuzz inputs and checks), ``harness.slow_clients``, ``harness.soak``
and ``harness.decisions`` (the record of every decision).
"""

from .certs import TestCA, peer_certificate
from .inputs import REPO, TESTS, admission_review, run_pod, sample_policy, write, written_policy
from .polling import eventually
from .server import STOP_TIMEOUT, AtomicDir, RunguardServer, Traffic, free_port

__all__ = [
    "REPO",
    "STOP_TIMEOUT",
    "TESTS",
    "AtomicDir",
    "RunguardServer",
    "TestCA",
    "Traffic",
    "admission_review",
    "eventually",
    "free_port",
    "peer_certificate",
    "run_pod",
    "sample_policy",
    "write",
    "written_policy",
]
