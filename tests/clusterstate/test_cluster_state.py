"""The cluster state model, its tables, the offline state and the publication the
workers read; the watch's protocol handling against a scripted apiserver (the real one is
in tests/e2e/test_cluster_state.py)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import REPO, eventually

from webhook.clusterstate import (
    KINDS,
    ClusterState,
    ClusterStateError,
    Meta,
    OwnerRef,
    StaticClusterState,
    controller_chain,
    meta_from_object,
    publication,
    table,
)
from webhook.clusterstate.api import LIST_ACCEPT, WATCH_ACCEPT, ApiError, Gone
from webhook.clusterstate.model import LAST_APPLIED, MAX_ANNOTATION_VALUE
from webhook.clusterstate.publication import DELETE, PUT, create_directory
from webhook.clusterstate.reader import SharedClusterState
from webhook.clusterstate.table import Table, decode_record, encode_record
from webhook.clusterstate.watch import KindWatch
from webhook.clusterstate.writer import Publisher

SECRET_VALUE = "aHVudGVyMg-never-kept"


def obj(
    kind: str, name: str, uid: str, namespace: str | None = "ml", **meta: Any
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": uid, **meta}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"kind": kind, "metadata": metadata}


def owner(kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller}


# --- the model ------------------------------------------------------------------------


def test_meta_keeps_metadata_only() -> None:
    secret = obj(
        "Secret",
        "sec-a-r1",
        "u1",
        labels={"dhcore/run": "r1"},
        annotations={LAST_APPLIED: f'{{"data":{{"k":"{SECRET_VALUE}"}}}}', "a": "b"},
        managedFields=[{"manager": "kubectl"}],
    )
    secret["data"] = {"k": SECRET_VALUE}
    secret["stringData"] = {"k": SECRET_VALUE}
    meta = meta_from_object(secret)
    assert meta == Meta("Secret", "ml", "sec-a-r1", "u1", {"dhcore/run": "r1"}, {"a": "b"})
    assert SECRET_VALUE not in repr(meta)
    assert SECRET_VALUE.encode() not in encode_record(meta)


def test_meta_defaults_and_scopes() -> None:
    assert meta_from_object(obj("ConfigMap", "c", "u", namespace=None)).namespace == "default"
    assert meta_from_object(obj("PriorityClass", "high", "u", namespace="x")).namespace == ""
    long = meta_from_object(
        obj("Job", "j", "u", annotations={"big": "x" * (MAX_ANNOTATION_VALUE + 1)})
    )
    assert dict(long.annotations) == {}
    job = meta_from_object(
        obj(
            "Job",
            "j",
            "u",
            ownerReferences=[owner("CronJob", "c", "u0"), owner("X", "y", "z", False)],
        )
    )
    assert job.owners == (OwnerRef("CronJob", "c", "u0", True), OwnerRef("X", "y", "z", False))
    assert job.controller() == OwnerRef("CronJob", "c", "u0", True)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"metadata": {"name": "p"}}, "an object without a kind"),
        ({"kind": "Secret"}, "Secret without metadata"),
        (obj("Secret", "", "u"), "without metadata.name"),
        (obj("Secret", "s", "u", labels={"a": 1}), "labels must map strings to strings"),
        (obj("Job", "j", "u", ownerReferences=[{"kind": "CronJob"}]), "need kind, name and uid"),
        (obj("Job", "j", "u", ownerReferences={}), "must be a list"),
        ("text", "must be a mapping"),
    ],
)
def test_meta_refuses_what_it_cannot_read(given: Any, message: str) -> None:
    with pytest.raises(ClusterStateError, match=message):
        meta_from_object(given)


def test_records_round_trip_and_are_canonical() -> None:
    meta = Meta(
        "ReplicaSet",
        "ml",
        "train-7f9c",
        "u2",
        {"b": "2", "a": "1"},
        {"runguard.io/requested-by": "system:serviceaccount:digitalhub:core"},
        (OwnerRef("Deployment", "train", "u3", True),),
    )
    assert decode_record("ReplicaSet", encode_record(meta)) == meta
    reordered = Meta(
        "ReplicaSet", "ml", "train-7f9c", "u2", {"a": "1", "b": "2"}, meta.annotations, meta.owners
    )
    assert encode_record(reordered) == encode_record(meta)


# --- the offline state ----------------------------------------------------------------

CLUSTER = [
    obj("Deployment", "train", "u-deploy", annotations={"runguard.io/requested-by": "core"}),
    obj(
        "ReplicaSet", "train-1", "u-rs", ownerReferences=[owner("Deployment", "train", "u-deploy")]
    ),
    obj("CronJob", "nightly", "u-cron"),
    obj("Job", "nightly-1", "u-job", ownerReferences=[owner("CronJob", "nightly", "u-cron")]),
    {"kind": "PriorityClass", "metadata": {"name": "high", "uid": "u-pc"}, "value": 1000},
    {"kind": "RuntimeClass", "metadata": {"name": "nvidia", "uid": "u-rc"}, "handler": "nvidia"},
    {
        "kind": "SecretList",
        "apiVersion": "v1",
        "items": [
            {
                "metadata": {"name": "sec-x", "namespace": "ml", "uid": "u-s"},
                "data": {"k": SECRET_VALUE},
            }
        ],
    },
    {
        "kind": "List",
        "items": [
            obj("PersistentVolumeClaim", "v-r1-data", "u-pvc", labels={"dhcore/project": "p"}),
            {**obj("ConfigMap", "cm", "u-cm"), "binaryData": {"k": SECRET_VALUE}},
        ],
    },
]


@pytest.fixture
def cluster() -> StaticClusterState:
    return StaticClusterState.from_documents(CLUSTER)


def test_static_state_answers_lookups(cluster: StaticClusterState) -> None:
    assert isinstance(cluster, ClusterState)
    rs = cluster.get("ReplicaSet", "ml", "train-1")
    assert rs is not None and rs.uid == "u-rs"
    assert cluster.by_uid("u-rs") == rs
    assert cluster.get("ReplicaSet", "other", "train-1") is None
    assert cluster.get("Secret", "ml", "sec-x") == Meta("Secret", "ml", "sec-x", "u-s")
    assert cluster.by_uid("u-pvc") == Meta(
        "PersistentVolumeClaim", "ml", "v-r1-data", "u-pvc", {"dhcore/project": "p"}
    )
    assert cluster.get("PriorityClass", "ignored", "high") is not None
    assert cluster.has_priority_class("high") and not cluster.has_priority_class("low")
    assert cluster.has_runtime_class("nvidia") and not cluster.has_runtime_class("high")
    assert cluster.by_uid("nope") is None and cluster.by_uid("") is None
    assert cluster.get("Pod", "ml", "x") is None
    # a fixed state is complete: any kind it holds nothing of has nothing (docs/dev/guarantees.md,
    # "Trust over time")
    assert all(cluster.synced(kind) for kind in (*KINDS, "Pod", "Workflow"))
    stats = cluster.stats()
    assert stats["ReplicaSet"].objects == 1 and stats["ReplicaSet"].synced
    assert sum(s.objects for s in stats.values()) == 9
    for kind_table in cluster.tables().values():
        assert SECRET_VALUE.encode() not in bytes(kind_table._view)


def test_controller_chain_follows_uids_and_checks_each_link(cluster: StaticClusterState) -> None:
    pod = Meta(
        "Pod", "ml", "train-1-x", "u-pod", owners=(OwnerRef("ReplicaSet", "train-1", "u-rs", True),)
    )
    assert [m.name for m in controller_chain(cluster, pod)] == ["train-1", "train"]
    job_pod = Meta("Pod", "ml", "p", "u", owners=(OwnerRef("Job", "nightly-1", "u-job", True),))
    assert [m.kind for m in controller_chain(cluster, job_pod)] == ["Job", "CronJob"]
    # A reference that names the wrong kind or name for the uid, another namespace, or no
    # controller flag proves nothing.
    for ref, namespace in [
        (OwnerRef("ReplicaSet", "other", "u-rs", True), "ml"),
        (OwnerRef("Job", "train-1", "u-rs", True), "ml"),
        (OwnerRef("ReplicaSet", "train-1", "u-rs", True), "elsewhere"),
        (OwnerRef("ReplicaSet", "train-1", "u-rs", False), "ml"),
    ]:
        assert controller_chain(cluster, Meta("Pod", namespace, "p", "u", owners=(ref,))) == ()
    looped = StaticClusterState.from_documents(
        [
            obj("ReplicaSet", "a", "ua", ownerReferences=[owner("ReplicaSet", "b", "ub")]),
            obj("ReplicaSet", "b", "ub", ownerReferences=[owner("ReplicaSet", "a", "ua")]),
        ]
    )
    pod = Meta("Pod", "ml", "p", "up", owners=(OwnerRef("ReplicaSet", "a", "ua", True),))
    assert [m.name for m in controller_chain(looped, pod)] == ["a", "b"]


def test_static_state_from_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: ml, uid: u1}\n"
        f"stringData: {{password: {SECRET_VALUE}}}\n---\n"
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: low}\nvalue: 1\n"
    )
    state = StaticClusterState.from_file(path)
    assert state.get("Secret", "ml", "s") == Meta("Secret", "ml", "s", "u1")
    assert state.has_priority_class("low")
    path.write_text("kind: Pod\nmetadata: {name: p}\n---\nmetadata: {name: q}\n")
    with pytest.raises(ClusterStateError, match=r"cluster.yaml: object 2: an object without"):
        StaticClusterState.from_file(path)
    path.write_text("kind: [\n")
    with pytest.raises(ClusterStateError, match="invalid YAML"):
        StaticClusterState.from_file(path)
    with pytest.raises(ClusterStateError, match="cannot read"):
        StaticClusterState.from_file(tmp_path / "missing.yaml")


def test_a_name_given_twice_keeps_the_last() -> None:
    state = StaticClusterState.from_documents([obj("Job", "j", "u1"), obj("Job", "j", "u2")])
    assert state.get("Job", "ml", "j") == Meta("Job", "ml", "j", "u2")
    assert state.stats()["Job"].objects == 1


# --- tables ---------------------------------------------------------------------------


def record(name: str, uid: str, namespace: str = "ml", **labels: str) -> bytes:
    return encode_record(Meta("Job", namespace, name, uid, labels))


def test_table_overlay_over_base() -> None:
    t = table.table_from_records("Job", [record("a", "ua"), record("b", "ub")])
    assert t.count == 2 and t.get("ml", "a") == Meta("Job", "ml", "a", "ua")
    assert not t.put(record("a", "ua"))  # the same: no change
    assert t.put(record("a", "ua", x="1")) and t.get("ml", "a").labels == {"x": "1"}  # type: ignore[union-attr]
    assert t.put(record("b", "ub2"))  # deleted and created again under the same name
    assert t.by_uid("ub") is None and t.by_uid("ub2") is not None
    assert t.remove("ml", "a") and not t.remove("ml", "a")
    assert t.get("ml", "a") is None and t.by_uid("ua") is None
    assert t.put(record("c", "uc")) and t.count == 2
    assert sorted(decode_record("Job", r).name for r in t.records()) == ["b", "c"]


def test_table_survives_hash_collisions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "key_hash", lambda namespace, name: 7)
    monkeypatch.setattr(table, "uid_hash", lambda uid: 9)
    t = table.table_from_records("Job", [record(f"j{i}", f"u{i}") for i in range(50)])
    for i in range(50):
        assert t.get("ml", f"j{i}") == Meta("Job", "ml", f"j{i}", f"u{i}")
        assert t.by_uid(f"u{i}") == Meta("Job", "ml", f"j{i}", f"u{i}")
    assert t.get("ml", "j50") is None and t.by_uid("u50") is None


def test_empty_table() -> None:
    t = Table("Job")
    assert t.count == 0 and t.get("ml", "a") is None and t.by_uid("u") is None
    assert list(t.records()) == []


# --- the publication ------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Publisher, SharedClusterState]]:
    directory = create_directory(str(tmp_path))
    writer = Publisher(directory)
    yield writer, SharedClusterState(directory)
    writer.close()


def test_readers_follow_bases_and_deltas(shared: tuple[Publisher, SharedClusterState]) -> None:
    writer, reader = shared
    assert not reader.synced("Job") and reader.get("Job", "ml", "a") is None
    jobs = writer.kinds["Job"]
    jobs.replace([record("a", "ua"), record("b", "ub")], "10", relist=False)
    assert reader.synced("Job") and not reader.synced("Secret")
    assert reader.get("Job", "ml", "a") == Meta("Job", "ml", "a", "ua")
    assert (
        jobs.apply(
            [
                (PUT, record("a", "ua", x="1")),
                (DELETE, record("b", "ub")),
                (PUT, record("c", "uc")),
            ],
            "11",
        )
        == 3
    )
    assert jobs.apply([(PUT, record("a", "ua", x="1"))], "12") == 0  # unchanged: not published
    assert reader.get("Job", "ml", "a").labels == {"x": "1"}  # type: ignore[union-attr]
    assert reader.get("Job", "ml", "b") is None and reader.by_uid("uc") is not None
    stats = reader.stats()["Job"]
    assert (stats.objects, stats.events, stats.relists) == (2, 3, 0)
    assert jobs.slot.resource_version == b"12"
    jobs.replace([record("z", "uz")], "20", relist=True)
    assert reader.get("Job", "ml", "a") is None and reader.get("Job", "ml", "z") is not None
    assert reader.stats()["Job"].relists == 1
    assert sorted(p.name for p in writer.directory.iterdir()) == [
        "Job.2.base",
        "Job.2.delta",
        "control",
    ]
    assert reader.writer()[0] > 0


def test_compaction_writes_a_new_base(
    shared: tuple[Publisher, SharedClusterState], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook.clusterstate.writer.MIN_COMPACTION", 4)
    writer, reader = shared
    jobs = writer.kinds["Job"]
    jobs.replace([record(f"j{i}", f"u{i}") for i in range(8)], "1", relist=False)
    assert reader.stats()["Job"].objects == 8
    for i in range(6):
        jobs.apply([(PUT, record(f"new{i}", f"n{i}"))], str(i + 2))
    assert jobs.slot.generation == 2 and jobs.table.changes == 1
    assert reader.stats()["Job"].relists == 0
    assert {reader.get("Job", "ml", f"new{i}") is not None for i in range(6)} == {True}
    assert reader.stats()["Job"].objects == 14


def test_a_restarted_writer_resumes(
    shared: tuple[Publisher, SharedClusterState], request: pytest.FixtureRequest
) -> None:
    writer, reader = shared
    jobs = writer.kinds["Job"]
    assert jobs.resume() is None
    jobs.replace([record("a", "ua")], "5", relist=False)
    jobs.apply([(PUT, record("b", "ub"))], "6")
    delta = writer.directory / "Job.1.delta"
    with open(delta, "ab") as file:  # written, never announced: the writer died here
        file.write(b"\x10\x00\x00\x00\x01{half")
    writer.close()
    again = Publisher(writer.directory)
    request.addfinalizer(again.close)
    assert again.kinds["Job"].resume() == "6"
    assert delta.stat().st_size == again.kinds["Job"].slot.delta_size
    again.kinds["Job"].apply([(DELETE, record("a", "ua"))], "7")
    assert reader.get("Job", "ml", "a") is None and reader.get("Job", "ml", "b") is not None
    assert again.kinds["Secret"].resume() is None


def test_a_reader_of_a_removed_generation_waits_for_the_next(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    writer, reader = shared
    jobs = writer.kinds["Job"]
    jobs.replace([record("a", "ua")], "1", relist=False)
    (writer.directory / "Job.1.base").unlink()  # as if replaced between two reads
    assert reader.get("Job", "ml", "a") is None
    jobs.replace([record("b", "ub")], "2", relist=True)
    assert reader.get("Job", "ml", "b") is not None


def test_lookups_while_the_writer_publishes(shared: tuple[Publisher, SharedClusterState]) -> None:
    writer, reader = shared
    jobs = writer.kinds["Job"]
    jobs.replace([record("stable", "us")], "1", relist=False)
    failures: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            if reader.get("Job", "ml", "stable") is None:
                failures.append("stable object missing")

    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in readers:
        thread.start()
    try:
        for i in range(300):
            jobs.apply([(PUT, record(f"j{i}", f"u{i}"))], str(i + 2))
            if i % 100 == 99:
                jobs.replace(jobs.table.records(), str(i + 2), relist=False)
    finally:
        done.set()
        for thread in readers:
            thread.join(10)
    assert not failures
    assert reader.stats()["Job"].objects == 301 and reader.get("Job", "ml", "j299") is not None


def test_an_entry_being_written_is_read_once_complete(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    writer, reader = shared
    jobs = writer.kinds["Job"]
    jobs.replace([], "1", relist=False)
    assert reader.get("Job", "ml", "a") is None
    entry = publication.ENTRY.pack(len(record("a", "ua")), PUT) + record("a", "ua")
    delta = writer.directory / "Job.1.delta"
    with open(delta, "ab") as file:
        file.write(entry[:9])  # the writer is mid-write; the control block moved on
        file.flush()
        jobs.bookmark("2")
        assert reader.get("Job", "ml", "a") is None
        file.write(entry[9:])
        file.flush()
        jobs.bookmark("3")
    assert reader.get("Job", "ml", "a") == Meta("Job", "ml", "a", "ua")


def test_a_failed_write_publishes_nothing_and_forgets_nothing(
    shared: tuple[Publisher, SharedClusterState], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = shared
    jobs = writer.kinds["Job"]
    jobs.replace([record("a", "ua")], "1", relist=False)
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:3]))
    with pytest.raises(OSError, match="delta log full"):
        jobs.apply([(PUT, record("b", "ub")), (DELETE, record("a", "ua"))], "2")
    monkeypatch.setattr(os, "write", real_write)
    assert jobs.table.get("ml", "b") is None and jobs.table.get("ml", "a") is not None
    assert jobs.slot.resource_version == b"1"
    assert reader.get("Job", "ml", "b") is None and reader.get("Job", "ml", "a") is not None
    # The same events again (the watch resumes from version 1) are not taken as known.
    assert jobs.apply([(PUT, record("b", "ub")), (DELETE, record("a", "ua"))], "2") == 2
    assert reader.get("Job", "ml", "b") is not None and reader.get("Job", "ml", "a") is None


def test_reader_without_a_control_block(tmp_path: Path) -> None:
    reader = SharedClusterState(tmp_path / "nothing")
    assert reader.get("Job", "ml", "a") is None and not reader.synced("Job")
    assert reader.writer() == (0, 0.0)
    assert reader.stats()["Job"].objects == 0


# --- the watch, against a scripted apiserver -------------------------------------------


class Response:
    def __init__(self, body: bytes, chunks: list[bytes] | None = None) -> None:
        self.body = body
        self.chunks = chunks or []

    def read(self, amount: int | None = None) -> bytes:
        return self.body

    def stream(self, amount: int, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        pass


class ScriptedApi:
    """Answers GETs from a script of (expected query subset, response or exception)."""

    def __init__(self, script: list[tuple[dict[str, str], Any]], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop
        self.requests: list[tuple[str, dict[str, str], str]] = []

    def get(self, path: str, query: dict[str, str], accept: str, read_timeout: float) -> Response:
        self.requests.append((path, query, accept))
        if not self.script:
            self.stop.set()
            raise ApiError(0, "script over")
        expected, answer = self.script.pop(0)
        assert expected.items() <= query.items(), (expected, query)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Response)
        return answer


def page(items: list[dict[str, Any]], version: str, token: str = "") -> Response:
    metadata = {"resourceVersion": version, **({"continue": token} if token else {})}
    return Response(
        orjson.dumps({"kind": "PartialObjectMetadataList", "metadata": metadata, "items": items})
    )


def item(name: str, uid: str, version: str, **meta: Any) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": version,
            **meta,
        },
    }


def events(*pairs: tuple[str, dict[str, Any]], split: int = 7) -> Response:
    text = b"".join(orjson.dumps({"type": t, "object": o}) + b"\n" for t, o in pairs)
    return Response(b"", [text[i : i + split] for i in range(0, len(text), split)])


def run_watch(
    tmp_path: Path, script: list[tuple[dict[str, str], Any]], **options: Any
) -> tuple[ScriptedApi, SharedClusterState]:
    directory = create_directory(str(tmp_path))
    writer = Publisher(directory)
    stop = threading.Event()
    api = ScriptedApi(script, stop)
    watch = KindWatch(api, writer.kinds["Secret"], stop, page_size=2, **options)  # type: ignore[arg-type]
    try:
        watch.run()  # ends when the script is over
    finally:
        writer.close()
    return api, SharedClusterState(directory)


def test_list_pages_then_watch_then_relist_on_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook.clusterstate.watch.BACKOFF", (0.001, 0.001))
    script: list[tuple[dict[str, str], Any]] = [
        ({"limit": "2"}, page([item("a", "ua", "5"), item("b", "ub", "5")], "10", "tok")),
        ({"limit": "2", "continue": "tok"}, page([item("c", "uc", "5")], "10")),
        (
            {"watch": "1", "resourceVersion": "10", "allowWatchBookmarks": "true"},
            events(
                ("ADDED", item("d", "ud", "11")),
                ("MODIFIED", item("a", "ua", "12", labels={"x": "y"})),
                ("DELETED", item("b", "ub", "13")),
                (
                    "BOOKMARK",
                    {"kind": "PartialObjectMetadata", "metadata": {"resourceVersion": "20"}},
                ),
            ),
        ),
        (
            {"watch": "1", "resourceVersion": "20"},
            events(("ERROR", {"kind": "Status", "code": 410, "message": "too old"})),
        ),
        ({"limit": "2"}, page([item("z", "uz", "30")], "30")),
        ({"watch": "1", "resourceVersion": "30"}, Gone(410, "too old resource version")),
        ({"limit": "2"}, page([item("z", "uz", "30"), item("y", "uy", "31")], "31")),
    ]
    api, reader = run_watch(tmp_path, script)
    assert [q.get("watch", "list") for _, q, _ in api.requests][:7] == [
        "list",
        "list",
        "1",
        "1",
        "list",
        "1",
        "list",
    ]
    assert {accept for _, q, accept in api.requests if "watch" in q} == {WATCH_ACCEPT}
    assert {accept for _, q, accept in api.requests if "watch" not in q} == {LIST_ACCEPT}
    assert all(path == "/api/v1/secrets" for path, _, _ in api.requests)
    assert reader.get("Secret", "ml", "a") is None  # gone with the relist
    assert {m.name for m in map(lambda n: reader.get("Secret", "ml", n), ["z", "y"]) if m} == {
        "z",
        "y",
    }
    stats = reader.stats()["Secret"]
    assert stats.relists == 2 and stats.synced and stats.objects == 2


def test_watch_errors_resume_then_relist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("webhook.clusterstate.watch.BACKOFF", (0.001, 0.001))
    boom = ApiError(500, "etcd is sad")
    script: list[tuple[dict[str, str], Any]] = [
        ({"limit": "2"}, ApiError(403, "secrets is forbidden")),  # RBAC not there yet
        ({"limit": "2"}, page([item("a", "ua", "5")], "10")),
        ({"watch": "1", "resourceVersion": "10"}, events(("ADDED", item("b", "ub", "11")))),
        ({"watch": "1", "resourceVersion": "11"}, boom),  # resumes where it was
        ({"watch": "1", "resourceVersion": "11"}, boom),
        ({"watch": "1", "resourceVersion": "11"}, boom),  # third in a row: list again
        ({"limit": "2"}, page([item("a", "ua", "5"), item("c", "uc", "12")], "12")),
    ]
    api, reader = run_watch(tmp_path, script)
    assert len(api.requests) == 8
    assert reader.get("Secret", "ml", "b") is None and reader.get("Secret", "ml", "c") is not None
    assert reader.stats()["Secret"].watch_errors == 4  # the end of the script (stopped) is not


def test_an_object_that_cannot_be_read_is_skipped(tmp_path: Path) -> None:
    script: list[tuple[dict[str, str], Any]] = [
        ({"limit": "2"}, page([item("a", "ua", "5"), {"metadata": {"namespace": "ml"}}], "10")),
    ]
    _, reader = run_watch(tmp_path, script)
    assert reader.stats()["Secret"].objects == 1


# --- the server's side: settings, readiness, metrics, the handlers' object --------------


def readyz(answer: Any) -> dict[str, Any]:
    body: dict[str, Any] = answer.json
    return body


def test_app_hands_the_state_to_its_handlers_and_waits_for_the_first_sync(
    shared: tuple[Publisher, SharedClusterState],
) -> None:
    from webhook.serving.app import create_app

    writer, reader = shared
    app = create_app({"policy_dir": REPO / "policies", "cluster": reader})
    assert app.extensions["runguard"].cluster_state is reader
    client = app.test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert readyz(answer)["message"] == "cluster state not synced yet: " + ", ".join(KINDS)
    for kind in KINDS[:-1]:
        writer.kinds[kind].replace([], "1", relist=False)
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert readyz(answer)["clusterState"]["waiting"] == [KINDS[-1]]
    writer.kinds[KINDS[-1]].replace(
        [encode_record(Meta(KINDS[-1], "ml", "d", "u"))], "1", relist=False
    )
    answer = client.get("/readyz")
    assert answer.status_code == 200 and readyz(answer)["status"] == "ready"
    assert readyz(answer)["clusterState"]["objects"][KINDS[-1]] == 1
    # Without a cluster state nothing changes.
    plain = create_app({"policy_dir": REPO / "policies"})
    assert plain.extensions["runguard"].cluster_state is None
    assert "clusterState" not in readyz(plain.test_client().get("/readyz"))


def test_the_setting_starts_a_watch_process_that_reports_in_metrics(tmp_path: Path) -> None:
    from webhook.serving.app import create_app

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"  # nobody there
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    app = create_app({"policy_dir": REPO / "policies", "cluster_state": str(kubeconfig)})
    watch = app.extensions["runguard"].cluster_watch
    assert watch is not None and app.extensions["runguard"].cluster_state is watch.state
    try:
        client = app.test_client()
        assert client.get("/readyz").status_code == 503
        errors = re.compile(r'runguard_cluster_state_watch_errors_total\{kind="Secret"\} (\S+)')

        def counted() -> str | None:
            text = client.get("/metrics").get_data(as_text=True)
            found = errors.search(text)
            return text if found and float(found[1]) >= 1 else None

        text = eventually("a Secret watch error counted in /metrics", counted, 30)
        assert 'runguard_cluster_state_synced{kind="Secret"} 0.0' in text
        assert "runguard_cluster_state_watch_heartbeat_age_seconds " in text
        assert watch.process.pid is not None
    finally:
        watch.stop()
    assert not watch.directory.exists()
    assert watch.process._process is not None and watch.process._process.poll() is not None


def test_the_setting_is_in_cluster_or_a_kubeconfig(tmp_path: Path) -> None:
    from webhook.serving.settings import ServeSettings, SettingsError

    (tmp_path / "tls.crt").write_text("x")
    base = {
        "policy_dir": tmp_path,
        "cert_file": tmp_path / "tls.crt",
        "key_file": tmp_path / "tls.crt",
    }
    assert ServeSettings.resolve(base, env={}).cluster_state is None
    given = ServeSettings.resolve({**base, "cluster_state": "in-cluster"}, env={})
    assert given.cluster_state == "in-cluster"
    env = {"RUNGUARD_CLUSTER_STATE": str(tmp_path / "tls.crt")}
    assert ServeSettings.resolve(base, env=env).cluster_state == str(tmp_path / "tls.crt")
    with pytest.raises(SettingsError, match="kubeconfig .*missing does not exist"):
        ServeSettings.resolve({**base, "cluster_state": str(tmp_path / "missing")}, env={})
