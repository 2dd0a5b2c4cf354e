"""The Helm chart with a real helm (tests/e2e/build-helm.sh: built from the Go module
proxy, cached) and the real kube-apiserver: ``helm lint`` clean, ``helm template`` giving
the objects ``kubectl kustomize`` gives for the same choices (the chart cannot drift
from manifests/), accepted by a server-side dry run, and installed: its webhook
configurations (by URL, on loopback) send a run Pod to runguard, which mutates it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .build import E2E_DIR, ClusterError
from .cluster import Cluster
from .devcluster import Runguard, runguard_command
from .runs import Webhook, kubectl_warnings, run_pod, until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "runguard"
KUBE_VERSION = "1.33.0"  # helm template's default (1.20) is below the chart's kubeVersion
# (kustomize components, chart values) that choose the same objects
CHOICES = [
    ((), ()),
    (
        ("cluster-state", "audit-cronjob", "policyreport-crd", "policy-objects"),
        (
            "clusterState.enabled=true",
            "audit.enabled=true",
            "audit.reportCRDs=true",
            "policies.objects=true",
        ),
    ),
    (("available-mode",), ("webhooks.available=true",)),
]


@pytest.fixture(scope="module")
def helm() -> str:
    done = subprocess.run(
        ["bash", str(E2E_DIR / "build-helm.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/e2e/build-helm.sh failed with exit code {done.returncode}")
    return done.stdout.strip().splitlines()[-1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=120, check=False, env=env
    )


# Cluster-scoped kinds newer than the schema kubectl's kustomize carries: its namespace
# transformer sets their metadata.namespace, which kubectl apply then ignores (discovery
# says they are cluster-scoped); the chart renders none.
CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE = frozenset(
    {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)


def comparable(text: str) -> dict[tuple[str, str], Any]:
    """Objects by kind and name, without what differs by construction: the certificate
    (each renders its own), the order of a set (a namespace selector's values), and the
    Namespace, which a release's namespace exists before."""
    out = {}
    for obj in yaml.safe_load_all(text):
        if not obj or obj["kind"] == "Namespace":
            continue
        if obj["kind"] == "Secret":
            obj.pop("data", None)
        if obj["kind"] in CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE:
            obj["metadata"].pop("namespace", None)
        for hook in obj.get("webhooks", []):
            hook["clientConfig"].pop("caBundle", None)
        # webhooks' and the floor's bindings' namespace selectors
        selectors = [h.get("namespaceSelector") for h in obj.get("webhooks", [])]
        selectors.append(obj.get("spec", {}).get("matchResources", {}).get("namespaceSelector"))
        for selector in selectors:
            for expr in (selector or {}).get("matchExpressions", []):
                expr["values"] = sorted(expr.get("values", []))
        out[obj["kind"], obj["metadata"]["name"]] = obj
    return out


def kustomized(tmp_path: Path, components: tuple[str, ...]) -> str:
    base = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", base, ignore=shutil.ignore_patterns("certs"))
    done = run(runguard_command(), "certs", "--out", str(base / "certs"))
    assert done.returncode == 0, done.stderr
    if components:
        with (base / "kustomization.yaml").open("a") as kustomization:
            kustomization.write("components:\n" + "".join(f"  - {c}\n" for c in components))
    done = run("kubectl", "kustomize", str(base))
    assert done.returncode == 0, done.stderr
    return done.stdout


def template(helm: str, *sets: str) -> str:
    args = [helm, "template", "runguard", str(CHART), "--namespace", "runguard"]
    args += ["--kube-version", KUBE_VERSION, *(a for s in sets for a in ("--set", s))]
    done = run(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("sets", [(), CHOICES[1][1], ("mtls.clientCA=pem",)])
def test_helm_lint_is_clean(helm: str, sets: tuple[str, ...]) -> None:
    done = run(helm, "lint", "--strict", str(CHART), *(a for s in sets for a in ("--set", s)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize(("components", "sets"), CHOICES)
def test_the_chart_renders_what_the_base_builds(
    helm: str, tmp_path: Path, components: tuple[str, ...], sets: tuple[str, ...]
) -> None:
    assert comparable(template(helm, *sets)) == comparable(kustomized(tmp_path, components))


def test_mtls_sets_the_client_ca(helm: str) -> None:
    objects = comparable(template(helm, "mtls.clientCA=pem"))
    (container,) = objects["Deployment", "runguard"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RUNGUARD_CLIENT_CA"] == "/etc/runguard/tls/client-ca.crt"
    rendered = template(helm, "mtls.clientCA=pem")
    (secret,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Secret"]
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key", "client-ca.crt"}


def test_the_template_passes_a_server_side_dry_run(helm: str, cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "runguard")
    for _, sets in CHOICES:
        rendered = template(helm, *sets)
        done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
        assert done.returncode == 0, done.stderr


def admitted(cluster: Cluster) -> bool:
    """A server-side dry run of a run Pod is mutated and denied by runguard, or by the
    chart's floor (on by default), which the apiserver runs before the webhooks."""
    probe = json.dumps(run_pod("admission-probe", hostNetwork=True))
    done = cluster.kubectl(
        "create", "-n", "default", "--dry-run=server", "-f", "-", input=probe
    )  # fmt: skip
    mutated = any(w.startswith("runguard:") for w in kubectl_warnings(done.stderr))
    denied = '.runguard.io" denied' in done.stderr or "'runguard-floor-" in done.stderr
    return mutated and done.returncode != 0 and denied


@pytest.fixture
def installed(helm: str, cluster: Cluster, runguard: Webhook, tmp_path: Path) -> Iterator[Runguard]:
    """The chart installed in namespace runguard, its webhooks calling a runguard that
    serves the chart's policy on loopback (the session's is unregistered meanwhile: the
    chart's configurations have the same names); uninstalled after."""
    server = Runguard(tmp_path / "server", REPO / "policies")
    server.start()
    runguard.unregister(cluster)
    values = {
        "certificates": {
            "generate": False,
            "caCrt": server.ca_file.read_text(),
            "tlsCrt": (server.certs / "tls.crt").read_text(),
            "tlsKey": (server.certs / "tls.key").read_text(),
        },
        "webhooks": {"url": server.url},
        "replicas": 1,
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    cluster.kubectl("create", "namespace", "runguard")
    kubeconfig = {"KUBECONFIG": str(cluster.kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin"}
    done = run(
        helm, "install", "runguard", str(CHART), "--namespace", "runguard",
        "--values", str(tmp_path / "values.yaml"), "--take-ownership",
        env=kubeconfig,
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        until("the chart's webhooks calling runguard", lambda: admitted(cluster))
        yield server
    finally:
        run(helm, "uninstall", "runguard", "--namespace", "runguard", "--wait", env=kubeconfig)
        server.stop()


def test_the_installed_chart_sends_runs_to_runguard(
    cluster: Cluster, installed: Runguard, namespace: str
) -> None:
    listed = cluster.kubectl("get", "mutatingwebhookconfiguration", "runguard", "-o", "json")
    config = json.loads(listed.stdout)
    assert config["metadata"]["annotations"]["meta.helm.sh/release-name"] == "runguard"
    assert {h["clientConfig"]["url"].rsplit("/", 1)[0] for h in config["webhooks"]} == {
        installed.url
    }
    pod = run_pod("through-the-chart", "1xt4")
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))
    assert done.returncode == 0, done.stderr
    assert "runguard: profile 1xt4 applied" in done.stderr
    live = json.loads(
        cluster.kubectl("get", "pod", "through-the-chart", "-n", namespace, "-o", "json").stdout
    )
    assert live["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
