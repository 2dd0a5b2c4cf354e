"""The floor (``webhook/install/floor.py``) and the engine never disagree: its rendered CEL,
evaluated with cel-expr-python, denies a Pod only when runguard's /validate denies it too
(as a Pod that skipped /mutate), and admits every Pod runguard admits after mutating it.
Over the case corpus and generated Pods, under every case policy."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO, TESTS
from harness.pod_strategies import SETTINGS, pods
from hypothesis import given
from hypothesis import strategies as st

from webhook.audit.casetest import find_cases
from webhook.engine import evaluate, shape, validate
from webhook.inputs.quantity import parse
from webhook.install import floor, manifests
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

CASES = TESTS / "cases"
POLICIES = {p.name: load_policy(p) for p in sorted((CASES / "_policies").iterdir())}
NAMESPACE = "ml"


class Floor:
    """The rendered floor as the apiserver runs it: a binding's selectors, the policy's
    matchConditions, its variables, then each validation. Kubernetes' CEL extensions the
    C++ library lacks are shimmed here: ``quantity()`` (a quantity is carried as its exact
    decimal text behind a ``Q``), its ``isGreaterThan`` and ``asApproximateFloat``, and the
    lists library's ``sum``."""

    def __init__(self) -> None:
        cel = pytest.importorskip("cel_expr_python.cel")
        optional = pytest.importorskip("cel_expr_python.ext.ext_optional")
        strings = pytest.importorskip("cel_expr_python.ext.ext_strings")
        text, boolean, double = cel.Type.STRING, cel.Type.BOOL, cel.Type.DOUBLE
        kubernetes = cel.CelExtension(
            "kubernetes",
            [
                cel.FunctionDecl(
                    "quantity",
                    [cel.Overload("quantity_string", text, [text], impl=_quantity)],
                ),
                cel.FunctionDecl(
                    "isGreaterThan",
                    [
                        cel.Overload(
                            "quantity_greater", boolean, [text, text], is_member=True,
                            impl=lambda a, b: _amount(a) > _amount(b),
                        )
                    ],
                ),
                cel.FunctionDecl(
                    "asApproximateFloat",
                    [
                        cel.Overload(
                            "quantity_float", double, [text], is_member=True,
                            impl=lambda a: float(_amount(a)),
                        )
                    ],
                ),
                cel.FunctionDecl(
                    "sum",
                    [
                        cel.Overload(
                            "list_sum", double, [cel.Type.List(double)], is_member=True,
                            impl=lambda values: float(sum(values)),
                        )
                    ],
                ),
            ],
        )  # fmt: skip
        self.cel = cel
        self.env = cel.NewEnv(
            variables={name: cel.Type.DYN for name in ("object", "request", "variables")},
            extensions=[optional.ExtOptional(), strings.ExtStrings(), kubernetes],
        )
        self.programs: dict[str, Any] = {}

    def eval(self, expression: str, data: dict[str, Any]) -> Any:
        if expression not in self.programs:
            self.programs[expression] = self.env.compile(expression)
        value = self.programs[expression].eval(data=data)
        # An error fails the request (failurePolicy Fail): never expected.
        assert value.type() != self.cel.Type.ERROR, (expression, value.value())
        return value.plain_value()

    def denials(
        self,
        objects: list[dict[str, Any]],
        pod: dict[str, Any],
        namespace: str,
        action: str = "Deny",
    ) -> list[str]:
        """The messages of the validations that deny ``pod`` (bindings acting Deny; or
        those that would warn, ``action`` Warn)."""
        pod = _as_served(pod)
        policies = {o["metadata"]["name"]: o for o in objects if o["kind"].endswith("Policy")}
        out = []
        for binding in (o for o in objects if o["kind"].endswith("Binding")):
            spec = binding["spec"]
            match = spec["matchResources"]
            labels = pod["metadata"].get("labels") or {}
            if not (
                _selects(match["objectSelector"], labels)
                and _selects(match["namespaceSelector"], {manifests.NAMESPACE_LABEL: namespace})
                and action in spec["validationActions"]
            ):
                continue
            vap = policies[spec["policyName"]]["spec"]
            data: dict[str, Any] = {
                "object": pod,
                "request": {"namespace": namespace, "operation": "CREATE"},
                "variables": {},
            }
            if not all(self.eval(c["expression"], data) for c in vap.get("matchConditions", [])):
                continue
            for variable in vap.get("variables", []):
                data["variables"][variable["name"]] = self.eval(variable["expression"], data)
            out += [
                v["message"] for v in vap["validations"] if not self.eval(v["expression"], data)
            ]
        return out


def _quantity(text: str) -> str:
    return f"Q{parse(text)}"


def _amount(quantity: str) -> Decimal:
    return Decimal(quantity[1:])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector as the apiserver matches it."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for requirement in selector.get("matchExpressions", []):
        key, operator, values = (
            requirement["key"],
            requirement["operator"],
            requirement.get("values"),
        )
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if (operator == "Exists") != present and operator in ("Exists", "DoesNotExist"):
            return False
    return True


def _as_served(pod: dict[str, Any]) -> dict[str, Any]:
    """The Pod as the apiserver hands it to a policy: quantities are strings."""
    pod = copy.deepcopy(pod)
    spec = pod.get("spec") or {}
    holders = [spec, *(c for n in ("containers", "initContainers") for c in spec.get(n) or [])]
    for holder in holders:
        for part in (holder.get("resources") or {}).values():
            if isinstance(part, dict):
                for key, value in part.items():
                    part[key] = str(value)
    return pod


@pytest.fixture(scope="module")
def judge() -> Floor:
    return Floor()


def _agree(judge: Floor, pod: dict[str, Any], policy: Policy, namespace: str) -> None:
    objects = floor.floor_policies(policy)
    denied = judge.denials(objects, pod, namespace)
    if denied:
        # runguard's /validate, on the same Pod as if /mutate had been skipped, denies it.
        assert not validate(pod, policy, namespace=namespace).allowed, denied
    decision = evaluate(pod, policy, namespace=namespace)
    if decision.allowed:
        assert judge.denials(objects, decision.object, namespace) == []


def _corpus() -> list[tuple[str, dict[str, Any], str, str]]:
    out = []
    for folder in find_cases(CASES):
        case = yaml.safe_load((folder / "case.yaml").read_text())
        policy = Path(case.get("policy", "policy")).name
        if policy not in POLICIES or case.get("old"):
            continue
        for obj in yaml.safe_load_all((folder / case.get("input", "input.yaml")).read_text()):
            # A Pod the apiserver would refuse as malformed never reaches a policy.
            if isinstance(obj, dict) and obj.get("kind") == "Pod" and _well_formed(obj):
                namespace = case.get("namespace") or obj["metadata"].get("namespace") or NAMESPACE
                out.append((folder.name, obj, policy, namespace))
    return out


def _well_formed(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, dict) and shape.check_shape(spec, "spec") == []


CORPUS = _corpus()


def test_the_corpus_has_pods_for_the_floor() -> None:
    assert len(CORPUS) >= 40


@pytest.mark.parametrize(("name", "pod", "policy", "namespace"), CORPUS, ids=[c[0] for c in CORPUS])
def test_floor_and_engine_agree_on_the_corpus(
    judge: Floor, name: str, pod: dict[str, Any], policy: str, namespace: str
) -> None:
    _agree(judge, pod, POLICIES[policy], namespace)


@SETTINGS
@given(pod=pods(), policy=st.sampled_from(sorted(POLICIES)))
def test_floor_and_engine_agree_on_generated_pods(
    judge: Floor, pod: dict[str, Any], policy: str
) -> None:
    _agree(judge, pod, POLICIES[policy], NAMESPACE)


# --- what the shipped policy's floor denies, rule by rule -------------------------------

SHIPPED = load_policy(REPO / "policies")
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
BUILD = {**RUN, "dhcore/framework": "k8sbuild"}


def run_pod(labels: dict[str, str] = RUN, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": dict(labels)},
        "spec": {"containers": [container], **spec},
    }


def rules(judge: Floor, pod: dict[str, Any], namespace: str = NAMESPACE) -> list[str]:
    denied = judge.denials(floor.floor_policies(SHIPPED), pod, namespace)
    return sorted({message.split("]")[0].lstrip("[") for message in denied})


def gpus(count: str) -> dict[str, Any]:
    return {"requests": {"nvidia.com/gpu": count}, "limits": {"nvidia.com/gpu": count}}


def test_a_compliant_run_passes_the_floor(judge: Floor) -> None:
    pod = run_pod(
        securityContext={"runAsNonRoot": True},
        containers=[{"name": "main", "image": "x", "resources": gpus("2")}],
    )
    assert rules(judge, pod) == []


def test_the_floor_denies_what_a_run_asks_for_beyond_it(judge: Floor) -> None:
    container = {"name": "main", "image": "x"}
    cases = {
        "security.root": run_pod(securityContext={"runAsUser": 0}),
        "security.privileged": run_pod(
            containers=[{**container, "securityContext": {"privileged": True}}]
        ),
        "security.capabilities": run_pod(
            containers=[{**container, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]
        ),
        "security.host-namespace": run_pod(hostPID=True),
        "security.host-ports": run_pod(containers=[{**container, "ports": [{"hostPort": 22}]}]),
        "volumes.forbidden-type": run_pod(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        "resources.exceeded": run_pod(containers=[{**container, "resources": gpus("3")}]),
        "scheduling.priority-class": run_pod(priorityClassName="system-node-critical"),
    }
    assert {rule: rules(judge, pod) for rule, pod in cases.items()} == {
        rule: [rule] for rule in cases
    }


def test_a_runs_total_counts_as_the_scheduler_does(judge: Floor) -> None:
    """Containers and sidecars summed; an init container that runs alone counts alone;
    pod-level resources, where set, are the run's."""

    def container(name: str, count: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "image": "x", "resources": gpus(count), **extra}

    two_containers = run_pod(containers=[container("a", "1"), container("b", "2")])
    init_alone = run_pod(containers=[container("a", "2")], initContainers=[container("i", "2")])
    sidecar = run_pod(
        containers=[container("a", "2")],
        initContainers=[container("s", "1", restartPolicy="Always")],
    )
    pod_level = run_pod(containers=[container("a", "1")], resources=gpus("3"))
    assert rules(judge, two_containers) == ["resources.exceeded"]
    assert rules(judge, init_alone) == []
    assert rules(judge, sidecar) == ["resources.exceeded"]
    assert rules(judge, pod_level) == ["resources.exceeded"]


def test_the_floor_has_the_webhooks_scope(judge: Floor) -> None:
    """The RunPolicy that governs a Pod is the first that selects it (a build is judged by
    "builds", which lets root in); excluded namespaces and other Pods are not judged."""
    root = {"securityContext": {"runAsUser": 0}}
    privileged = {
        "containers": [{"name": "m", "image": "x", "securityContext": {"privileged": True}}]
    }
    assert rules(judge, run_pod(BUILD, **root)) == []
    assert rules(judge, run_pod(BUILD, **privileged)) == ["security.privileged"]
    assert rules(judge, run_pod(RUN, **root)) == ["security.root"]
    assert rules(judge, run_pod(RUN, **root), namespace="kube-system") == []
    assert rules(judge, run_pod(RUN, **root), namespace=manifests.DEFAULT_NAMESPACE) == []
    assert rules(judge, run_pod({"app": "web"}, **root)) == []


MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")


@pytest.mark.parametrize(
    ("path", "namespace", "allowed"),
    [
        ("/var/run/iguazio/dayman/default-tenant", "default-tenant", True),
        ("/var/run/iguazio/dayman/default-tenant/", "default-tenant", True),
        ("/var/run/iguazio/dayman/default-tenant", "other-tenant", False),
        ("/var/run/iguazio/dayman/default-tenant/../..", "default-tenant", False),
        ("//var/run/iguazio/dayman/default-tenant", "default-tenant", False),
        ("/var/run/iguazio/dayman/{namespace}", "default-tenant", False),
        ("/var/run/iguazio/dayman/*", "default-tenant", False),
        ("/var/run/iguazio/daymanXdefault-tenant", "default-tenant", False),
        ("/", "default-tenant", False),
    ],
)
def test_allowed_host_paths_are_the_requests_namespaces_exactly(
    judge: Floor, path: str, namespace: str, allowed: bool
) -> None:
    """The example's RunPolicy warns (enforcement Warn): so does its floor's binding."""
    labels = {"mlrun/class": "job", "mlrun/project": "fraud"}
    pod = run_pod(labels, volumes=[{"name": "d", "hostPath": {"path": path}}])
    warned = judge.denials(floor.floor_policies(MLRUN), pod, namespace, action="Warn")
    assert (warned == []) == allowed, warned
    _agree(judge, pod, MLRUN, namespace)


def test_a_warn_policy_floor_only_warns() -> None:
    (_, binding) = floor.floor_policies(POLICIES["warn"])
    assert binding["spec"]["validationActions"] == ["Warn"]


@SETTINGS
@given(pod=pods(), build=st.booleans())
def test_floor_and_engine_agree_on_the_shipped_policy(
    judge: Floor, pod: dict[str, Any], build: bool
) -> None:
    if build:
        pod["metadata"]["labels"].update({"dhcore/framework": "k8sbuild", "dhcore/run": "r1"})
    _agree(judge, pod, SHIPPED, NAMESPACE)


IMPLICIT = "deviceclass.resource.kubernetes.io/"


def test_an_extended_resource_a_device_class_maps_is_judged_as_the_engine_does(
    judge: Floor,
) -> None:
    """``deviceclass.resource.kubernetes.io/<class>`` of a class runs may not use is
    refused; of one they may, it counts against the gpu maximum with the device
    plugin's GPUs. The floor and runguard agree on each."""

    def asking(**amounts: str) -> dict[str, Any]:
        resources = {"requests": dict(amounts), "limits": dict(amounts)}
        return run_pod(containers=[{"name": "main", "image": "x", "resources": resources}])

    gpu, fpga = f"{IMPLICIT}gpu.nvidia.com", f"{IMPLICIT}fpga.example.com"
    cases = {
        "fpga": (asking(**{fpga: "1"}), ["resources.device-request"]),
        "one and one": (asking(**{"nvidia.com/gpu": "1", gpu: "1"}), []),
        "one and two": (asking(**{"nvidia.com/gpu": "1", gpu: "2"}), ["resources.exceeded"]),
        "three mapped": (asking(**{gpu: "3"}), ["resources.exceeded"]),
        "two mapped": (asking(**{gpu: "2"}), []),
    }
    assert {name: rules(judge, pod) for name, (pod, _) in cases.items()} == {
        name: denied for name, (_, denied) in cases.items()
    }
    for pod, _ in cases.values():
        _agree(judge, pod, SHIPPED, NAMESPACE)
