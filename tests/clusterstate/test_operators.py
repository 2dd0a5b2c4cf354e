"""Operators' custom resources in the cluster state: where discovery finds a kind, the
publication's operator slots as writer and readers see them, a kind whose CRD is not
installed yet, and the engine following an operator's Pod through the shared state."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import REPO

from webhook.clusterstate import KINDS, Meta, OwnerRef, StaticClusterState, controller_chain
from webhook.clusterstate.api import (
    LIST_ACCEPT,
    WATCH_ACCEPT,
    ApiError,
    NotInstalled,
    Resource,
    discover,
)
from webhook.clusterstate.model import MAX_OPERATOR_KINDS
from webhook.clusterstate.process import WatchProcess, operator_kinds
from webhook.clusterstate.publication import (
    FORBIDDEN,
    NOT_INSTALLED,
    PUT,
    create_directory,
)
from webhook.clusterstate.reader import SharedClusterState
from webhook.clusterstate.table import encode_record
from webhook.clusterstate.watch import KindWatch
from webhook.clusterstate.writer import Publisher
from webhook.engine import evaluate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD
from webhook.policy.loader import load_policy
from webhook.policy.model import Operator, Policy

WORKFLOW = "argoproj.io/Workflow"
RAYJOB = "ray.io/RayJob"

# --- discovery ---------------------------------------------------------------------------

ARGO_GROUP = {
    "kind": "APIGroup",
    "name": "argoproj.io",
    "versions": [{"groupVersion": "argoproj.io/v1alpha1", "version": "v1alpha1"}],
    "preferredVersion": {"groupVersion": "argoproj.io/v1alpha1", "version": "v1alpha1"},
}
VERBS = ["delete", "get", "list", "patch", "create", "update", "watch"]


def resources(*entries: tuple[str, str, bool]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "resources": [
            {"name": name, "kind": kind, "namespaced": namespaced, "verbs": VERBS}
            for name, kind, namespaced in entries
        ],
    }


class Discovery:
    """An apiserver's discovery documents by path (a missing path: 404)."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents
        self.asked: list[str] = []

    def get_json(self, path: str) -> Any:
        self.asked.append(path)
        found = self.documents.get(path)
        if isinstance(found, Exception):
            raise found
        if found is None:
            raise ApiError(404, "the server could not find the requested resource")
        return found


def test_discovery_takes_the_preferred_version_and_skips_subresources() -> None:
    versions = [{"version": "v1"}, {"version": "v1alpha1"}]  # v1alpha1 preferred
    api = Discovery({
        "/apis/argoproj.io": {**ARGO_GROUP, "versions": versions},
        "/apis/argoproj.io/v1alpha1": resources(
            ("workflows/status", "Workflow", True),
            ("workflows", "Workflow", True),
            ("cronworkflows", "CronWorkflow", True),
        ),
    })  # fmt: skip
    found = discover(api, WORKFLOW)  # type: ignore[arg-type]
    assert found == Resource("argoproj.io", "v1alpha1", "workflows", True)
    assert found.path == "/apis/argoproj.io/v1alpha1/workflows"
    assert api.asked == ["/apis/argoproj.io", "/apis/argoproj.io/v1alpha1"]


def test_discovery_tries_the_other_versions_then_says_not_installed() -> None:
    group = {**ARGO_GROUP, "versions": [{"version": "v1alpha1"}, {"version": "v1"}]}
    api = Discovery({
        "/apis/argoproj.io": group,
        "/apis/argoproj.io/v1alpha1": resources(("cronworkflows", "CronWorkflow", True)),
        "/apis/argoproj.io/v1": resources(("clusterworkflowtemplates", "Workflow", False)),
    })  # fmt: skip
    found = discover(api, WORKFLOW)  # type: ignore[arg-type]
    assert found == Resource("argoproj.io", "v1", "clusterworkflowtemplates", False)
    # a resource that cannot be watched is no use
    api.documents["/apis/argoproj.io/v1"]["resources"][0]["verbs"] = ["get", "list"]
    with pytest.raises(NotInstalled, match="serves no Workflow"):
        discover(api, WORKFLOW)  # type: ignore[arg-type]


def test_discovery_of_an_unknown_group_is_not_installed_other_errors_are_errors() -> None:
    with pytest.raises(NotInstalled, match="no API group argoproj.io"):
        discover(Discovery({}), WORKFLOW)  # type: ignore[arg-type]
    failing = Discovery({"/apis/argoproj.io": ApiError(503, "the server is busy")})
    with pytest.raises(ApiError) as raised:
        discover(failing, WORKFLOW)  # type: ignore[arg-type]
    assert raised.value.status == 503 and not isinstance(raised.value, NotInstalled)


# --- the kinds a policy names -----------------------------------------------------------

SHIPPED = load_policy(REPO / "policies")
CORE = Requester("system:serviceaccount:digitalhub:core", ("system:serviceaccounts",))
ALICE = Requester("alice", ("developers", "system:authenticated"))
ARGO = Requester("system:serviceaccount:digitalhub:argo-workflow-controller")


def with_operators(*operators: Operator) -> Policy:
    """The shipped digitalhub RunPolicy, naming ``operators``."""
    run = SHIPPED.named("digitalhub")
    assert run is not None
    platform = run.platform.model_copy(update={"operators": operators})
    return Policy.of(run.model_copy(update={"platform": platform}))


def test_operator_kinds_of_every_run_policy_in_order_each_once() -> None:
    first, second = SHIPPED.run_policies
    ray = Operator(identity="serviceaccount:ray:kuberay", kinds=(RAYJOB, "ray.io/RayCluster"))
    argo = Operator(identity=ARGO.username, kinds=(WORKFLOW, RAYJOB, "apps/Deployment"))
    one = first.model_copy(
        update={"platform": first.platform.model_copy(update={"operators": (argo,)})}
    )
    two = second.model_copy(
        update={"platform": second.platform.model_copy(update={"operators": (ray,)})}
    )
    policy = Policy.of(one, two)
    assert operator_kinds(policy) == (WORKFLOW, RAYJOB, "ray.io/RayCluster")
    # the shipped digitalhub RunPolicy's operators: Argo Workflows, KubeAI, KubeRay
    assert operator_kinds(SHIPPED) == (WORKFLOW, "kubeai.org/Model", RAYJOB, "ray.io/RayCluster")
    assert operator_kinds(None) == ()


def test_the_watch_process_is_told_its_operator_kinds(tmp_path: Path) -> None:
    process = WatchProcess(tmp_path, "in-cluster", ("Secret",), (WORKFLOW, RAYJOB))
    command = process.command()
    assert command[command.index("--operator-kinds") + 1] == f"{WORKFLOW},{RAYJOB}"
    assert "--operator-kinds" not in WatchProcess(tmp_path, "in-cluster").command()


# --- the publication ---------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Publisher, SharedClusterState]]:
    directory = create_directory(str(tmp_path), (WORKFLOW, RAYJOB))
    writer = Publisher(directory)
    try:
        yield writer, SharedClusterState(directory)
    finally:
        writer.close()


def wf(name: str, uid: str, namespace: str = "ml", **annotations: str) -> bytes:
    return encode_record(Meta("Workflow", namespace, name, uid, {}, annotations))


def test_a_reader_finds_an_operators_object_by_uid_once_its_kind_is_synced(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    writer, reader = shared
    assert reader.operator_kinds == (WORKFLOW, RAYJOB)
    assert list(writer.kinds) == [*KINDS, WORKFLOW, RAYJOB]
    assert not reader.synced("Workflow") and not reader.synced(WORKFLOW)
    assert set(reader.stats()) == {*KINDS, WORKFLOW, RAYJOB}  # /readyz waits for them

    writer.kinds[WORKFLOW].replace([wf("pipeline", "wf-1")], "10", relist=False)
    assert reader.synced("Workflow") and reader.synced(WORKFLOW)
    assert not reader.synced("RayJob") and not reader.synced("Argo")  # never watched: no
    found = reader.by_uid("wf-1")
    assert found == Meta("Workflow", "ml", "pipeline", "wf-1")
    assert reader.get("Workflow", "ml", "pipeline") == found
    assert reader.get(WORKFLOW, "ml", "pipeline") == found
    assert reader.get("Workflow", "other", "pipeline") is None
    assert reader.stats()[WORKFLOW].objects == 1
    assert sorted(p.name for p in writer.directory.glob("Workflow.*")) == [
        "Workflow.argoproj.io.1.base",
        "Workflow.argoproj.io.1.delta",
    ]
    # Changes reach the reader; a Pod's controller chain goes through the Workflow.
    writer.kinds[WORKFLOW].apply([(PUT, wf("second", "wf-2"))], "11")
    step = Meta("Pod", "ml", "step", "p-1", owners=(OwnerRef("Workflow", "second", "wf-2", True),))
    assert [m.uid for m in controller_chain(reader, step)] == ["wf-2"]
    # The built-in kinds are where they were.
    writer.kinds["Secret"].replace([encode_record(Meta("Secret", "ml", "s", "u-s"))], "12",
                                   relist=False)  # fmt: skip
    assert reader.get("Secret", "ml", "s") is not None and reader.by_uid("u-s") is not None


def test_a_kind_that_cannot_be_listed_is_unsynced_and_does_not_hold_readiness(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    writer, reader = shared
    writer.kinds[WORKFLOW].count_error(NOT_INSTALLED)
    writer.kinds[RAYJOB].count_error(FORBIDDEN)
    assert reader.problems() == {WORKFLOW: "not installed", RAYJOB: "forbidden"}
    assert set(reader.stats()) == set(KINDS)
    assert set(reader.all_stats()) == {*KINDS, WORKFLOW, RAYJOB}
    assert reader.all_stats()[WORKFLOW].watch_errors == 1
    assert not reader.synced("Workflow")
    # The CRD appears: listed, synced, no problem any more.
    writer.kinds[WORKFLOW].replace([], "20", relist=False)
    assert reader.problems() == {RAYJOB: "forbidden"}
    assert reader.synced("Workflow") and reader.stats()[WORKFLOW].synced


def test_the_operator_slots_are_fixed_where_the_directory_is_made(tmp_path: Path) -> None:
    directory = create_directory(str(tmp_path), (WORKFLOW,))
    with pytest.raises(ValueError, match="operator kinds"):
        Publisher(directory, (RAYJOB,))
    Publisher(directory, (WORKFLOW,)).close()
    plain = Publisher(create_directory(str(tmp_path)))
    assert list(plain.kinds) == list(KINDS) and plain.operator_kinds == ()
    plain.close()
    too_many = tuple(f"g{i}.io/K" for i in range(MAX_OPERATOR_KINDS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_OPERATOR_KINDS}"):
        create_directory(str(tmp_path), too_many)
    with pytest.raises(ValueError, match="GROUP/Kind"):
        create_directory(str(tmp_path), ("Workflow",))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [directory.name, plain.directory.name]
    )


# --- the watch of an operator kind whose CRD comes later ----------------------------------


class Response:
    def __init__(self, body: bytes, chunks: list[bytes] | None = None) -> None:
        self.body, self.chunks = body, chunks or []

    def read(self, amount: int | None = None) -> bytes:
        return self.body

    def stream(self, amount: int, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class ScriptedCluster:
    """An apiserver without the Workflow CRD, then with it: discovery answers by path;
    lists and watches as scripted; the watch is stopped when the script is over."""

    def __init__(self, stop: threading.Event, reader: SharedClusterState) -> None:
        self.stop, self.reader = stop, reader
        self.installed = False
        self.seen_problems: list[dict[str, str]] = []
        self.requests: list[tuple[str, str]] = []

    def get_json(self, path: str) -> Any:
        self.seen_problems.append(dict(self.reader.problems()))
        if not self.installed:
            self.installed = len(self.seen_problems) >= 2  # found on the second look
            raise ApiError(404, "the server could not find the requested resource")
        return Discovery({
            "/apis/argoproj.io": ARGO_GROUP,
            "/apis/argoproj.io/v1alpha1": resources(("workflows", "Workflow", True)),
        }).get_json(path)  # fmt: skip

    def get(self, path: str, query: dict[str, str], accept: str, timeout: float) -> Response:
        self.requests.append((path, accept))
        item = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": "pipeline", "namespace": "ml", "uid": "wf-1",
                             "resourceVersion": "5"}}  # fmt: skip
        if "watch" not in query:
            page = {"metadata": {"resourceVersion": "10"}, "items": [item]}
            return Response(orjson.dumps(page))
        self.stop.set()
        return Response(b"", [orjson.dumps({"type": "MODIFIED", "object": item}) + b"\n"])


def test_a_kind_not_installed_is_looked_up_again_then_listed_and_watched(
    shared: tuple[Publisher, SharedClusterState],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("webhook.clusterstate.watch.BACKOFF", (0.001, 0.001))
    writer, reader = shared
    stop = threading.Event()
    api = ScriptedCluster(stop, reader)
    watch = KindWatch(api, writer.kinds[WORKFLOW], stop)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="runguard.clusterstate"):
        watch.run()  # ends when the script is over
    assert api.seen_problems[:3] == [{}, {WORKFLOW: "not installed"}, {WORKFLOW: "not installed"}]
    assert api.requests == [
        ("/apis/argoproj.io/v1alpha1/workflows", LIST_ACCEPT),
        ("/apis/argoproj.io/v1alpha1/workflows", WATCH_ACCEPT),
    ]
    assert reader.problems() == {} and reader.synced("Workflow")
    assert reader.by_uid("wf-1") == Meta("Workflow", "ml", "pipeline", "wf-1")
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "argoproj.io/Workflow: discovery" in m and "CustomResourceDefinition installed" in m
        and "Pods owned by Workflow objects fail closed (ownership.unknown)" in m
        for m in said
    ), said  # fmt: skip


# --- the engine through the shared state ---------------------------------------------------


def workflow(uid: str) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "pipeline", "namespace": "ml", "uid": uid},
            "spec": {"entrypoint": "main"}}  # fmt: skip


def step_pod(uid: str) -> dict[str, Any]:
    """The operator's Pod for the Workflow, reading the run's secret."""
    owner = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "pipeline",
             "uid": uid, "controller": True}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pipeline-step", "namespace": "ml",
                     "labels": {"workflows.argoproj.io/workflow": "pipeline"},
                     "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "main", "image": "python:3.11",
                                 "envFrom": [{"secretRef": {"name": "sec-api-r1"}}]}]},
    }  # fmt: skip


def test_the_engine_follows_an_operators_pod_through_the_shared_state(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    writer, reader = shared
    policy = with_operators(Operator(identity=ARGO.username, kinds=(WORKFLOW,)))
    # Not synced yet: a run Pod of the operator's that uses the platform's secret fails
    # closed, naming the kind: /mutate leaves the secret for /validate to deny (a denial
    # the operator retries, not a run admitted without its secret).
    run = step_pod("wf-1")
    run["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
    waiting = validate(run, policy, namespace="ml", context=Context(ARGO, reader))
    assert "ownership.unknown" in {v.rule for v in waiting.violations}
    assert "has not synced Workflow objects yet" in waiting.message()
    held = evaluate(run, policy, namespace="ml", context=Context(ARGO, reader))
    assert not held.allowed and "ownership.unknown" in {v.rule for v in held.violations}
    assert held.object["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "sec-api-r1"}}
    ]
    records = []
    for uid, creator in (("wf-1", CORE), ("wf-2", ALICE)):
        made = evaluate(workflow(uid), policy, namespace="ml", context=Context(creator))
        annotations = made.object["metadata"].get("annotations", {})
        assert (annotations.get(PLATFORM_RECORD) == "true") is (creator is CORE)
        name = "pipeline" if uid == "wf-1" else "pipeline-2"
        records.append(encode_record(Meta("Workflow", "ml", name, uid, {}, annotations)))
    writer.kinds[WORKFLOW].replace(records, "30", relist=False)
    platform = evaluate(step_pod("wf-1"), policy, namespace="ml", context=Context(ARGO, reader))
    assert platform.allowed, platform.message()
    assert platform.object["metadata"]["annotations"].get(PLATFORM_RECORD) == "true"
    kept = evaluate(run, policy, namespace="ml", context=Context(ARGO, reader)).object
    assert kept["spec"]["containers"][0]["envFrom"] == [{"secretRef": {"name": "sec-api-r1"}}]
    users = step_pod("wf-2")
    users["metadata"]["ownerReferences"][0]["name"] = "pipeline-2"
    decision = evaluate(users, policy, namespace="ml", context=Context(ARGO, reader))
    assert not decision.allowed
    assert "ownership.unknown" not in {v.rule for v in decision.violations}


# --- a core kind an operator owns Pods through: Pod (a Spark driver its executors) ---------


class PodsOnly:
    """An apiserver asked for Pods: no discovery; lists and watches recorded with their
    query, then the watch is stopped."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.requests: list[tuple[str, dict[str, str]]] = []

    def get_json(self, path: str) -> Any:
        raise AssertionError(f"no discovery for a core kind: {path}")

    def get(self, path: str, query: dict[str, str], accept: str, timeout: float) -> Response:
        self.requests.append((path, dict(query)))
        item = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": "etl-driver", "namespace": "ml", "uid": "drv-1",
                             "labels": {"runguard.io/policy": "mlrun"},
                             "annotations": {PLATFORM_RECORD: "true"},
                             "resourceVersion": "5"}}  # fmt: skip
        if "watch" not in query:
            return Response(orjson.dumps({"metadata": {"resourceVersion": "10"}, "items": [item]}))
        self.stop.set()
        return Response(b"", [orjson.dumps({"type": "MODIFIED", "object": item}) + b"\n"])


def test_pods_are_watched_only_when_an_operator_names_them_and_only_runguards(
    tmp_path: Path,
) -> None:
    spark = Operator(identity="serviceaccount:ml:sparkapp", kinds=("Pod",))
    assert operator_kinds(with_operators(spark)) == ("Pod",)
    assert "Pod" not in operator_kinds(SHIPPED)  # not named: no Pod is kept
    directory = create_directory(str(tmp_path), ("Pod",))
    writer, reader = Publisher(directory), SharedClusterState(directory)
    try:
        stop = threading.Event()
        api = PodsOnly(stop)
        KindWatch(api, writer.kinds["Pod"], stop).run()  # type: ignore[arg-type]
        selector = {"labelSelector": "runguard.io/policy"}
        (list_path, listed), (watch_path, watched) = api.requests
        assert list_path == watch_path == "/api/v1/pods"
        assert listed.items() >= selector.items() and watched.items() >= selector.items()
        assert reader.synced("Pod")
        driver = reader.by_uid("drv-1")
        assert driver is not None and driver.annotations[PLATFORM_RECORD] == "true"
    finally:
        writer.close()
    with pytest.raises(ValueError, match="GROUP/Kind names or Pod"):
        create_directory(str(tmp_path), ("Service",))


def test_a_reader_lists_an_operators_objects_of_a_namespace(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    """What a selector reference (``platform.operators[].references``, ``by: selector``)
    is judged on: every object of the kind in the namespace, by GROUP/Kind or its Kind
    alone, the base's and the changes since alike; offline the same from a file."""
    writer, reader = shared
    writer.kinds[WORKFLOW].replace([wf("a", "wf-1"), wf("b", "wf-2", "other")], "10",
                                   relist=False)  # fmt: skip
    writer.kinds[WORKFLOW].apply([(PUT, wf("c", "wf-3"))], "11")
    for kind in (WORKFLOW, "Workflow"):
        assert sorted(m.name for m in reader.in_namespace(kind, "ml")) == ["a", "c"]
    assert reader.in_namespace(RAYJOB, "ml") == []
    offline = StaticClusterState.from_documents(
        [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
          "metadata": {"name": n, "namespace": ns, "uid": n}}
         for n, ns in (("a", "ml"), ("b", "other"))]
    )  # fmt: skip
    assert [m.name for m in offline.in_namespace(WORKFLOW, "ml")] == ["a"]
