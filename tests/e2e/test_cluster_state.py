"""The cluster state watch against the real kube-apiserver: the first sync, changes seen,
a resume from a version too old relisted (410 Gone) or replayed (as the apiserver answers
it), and a Secret's data never fetched."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from webhook.clusterstate import KINDS, Meta, OwnerRef, controller_chain
from webhook.clusterstate.api import Api, api_client
from webhook.clusterstate.process import WatchProcess
from webhook.clusterstate.publication import create_directory
from webhook.clusterstate.reader import SharedClusterState
from webhook.clusterstate.watch import Watcher
from webhook.clusterstate.writer import Publisher

from .cluster import Cluster
from .devcluster import Runguard
from .runs import poll, until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WATCH_SECONDS = (20, 30)  # short server-side watches: the tests also see them renewed


def create(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listed), check=True)


def uid(cluster: Cluster, namespace: str, kind: str, name: str) -> str:
    done = cluster.kubectl("get", "-n", namespace, kind, name, "-o", "jsonpath={.metadata.uid}")
    return done.stdout.strip()


def workload(namespace: str) -> list[dict[str, Any]]:
    template: dict[str, Any] = {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "v-r1-data", "labels": {"dhcore/project": "p1"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "init-config-map-r1"},
            "data": {"k": "v"},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "r1",
                "annotations": {"runguard.io/requested-by": "system:serviceaccount:dh:core"},
            },
            "spec": {"template": template},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve"},
            "spec": {
                "selector": {"matchLabels": {"app": "train"}},
                "template": {**template, "spec": {**template["spec"], "restartPolicy": "Always"}},
            },
        },
    ]


@pytest.fixture
def publication(tmp_path: Path) -> Path:
    return create_directory(str(tmp_path))


class Running:
    """An in-process watcher of every kind, stopped at the end of the test."""

    def __init__(self, cluster: Cluster, directory: Path) -> None:
        self.client = api_client(str(cluster.kubeconfig))
        self.directory = directory
        self.publisher: Publisher | None = None
        self.watcher: Watcher | None = None

    def start(self) -> Watcher:
        self.publisher = Publisher(self.directory)
        self.watcher = Watcher(Api(self.client), self.publisher, watch_seconds=WATCH_SECONDS)
        self.watcher.start()
        return self.watcher

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.publisher is not None:
            self.publisher.close()
        self.watcher = self.publisher = None


@pytest.fixture
def running(cluster: Cluster, publication: Path) -> Iterator[Running]:
    watch = Running(cluster, publication)
    try:
        yield watch
    finally:
        watch.stop()
        watch.client.close()


def synced(state: SharedClusterState) -> bool:
    return all(state.synced(kind) for kind in KINDS)


def test_first_sync_then_additions_updates_deletions(
    cluster: Cluster, namespace: str, running: Running, publication: Path
) -> None:
    create(cluster, namespace, *workload(namespace))
    deployment = uid(cluster, namespace, "deployment", "serve")
    replica_set = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "serve-5d4f",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve",
                 "uid": deployment, "controller": True}
            ],
        },
        "spec": workload(namespace)[3]["spec"],
    }  # fmt: skip
    create(cluster, namespace, replica_set)
    state = SharedClusterState(publication)
    running.start()
    poll("every kind synced", lambda: synced(state), timeout=30)  # fails after 30 s

    claim = state.get("PersistentVolumeClaim", namespace, "v-r1-data")
    assert claim is not None and claim.labels == {"dhcore/project": "p1"}
    job = state.get("Job", namespace, "r1")
    assert job is not None
    assert job.annotations["runguard.io/requested-by"] == "system:serviceaccount:dh:core"
    assert state.has_priority_class("system-node-critical")  # the apiserver's own
    assert not state.has_runtime_class("no-such-runtime")  # (other modules create nvidia)
    rs = state.get("ReplicaSet", namespace, "serve-5d4f")
    assert rs is not None
    assert rs.owners == (OwnerRef("Deployment", "serve", deployment, True),)
    pod = Meta(
        "Pod",
        namespace,
        "serve-5d4f-x",
        "u",
        owners=(OwnerRef("ReplicaSet", rs.name, rs.uid, True),),
    )
    assert [(m.kind, m.name) for m in controller_chain(state, pod)] == [
        ("ReplicaSet", "serve-5d4f"),
        ("Deployment", "serve"),
    ]
    assert state.by_uid(deployment) == state.get("Deployment", namespace, "serve")

    # A change of each sort is seen within a second or two.
    cluster.kubectl(
        "label", "-n", namespace, "pvc", "v-r1-data", "dhcore/project=p2", "--overwrite", check=True
    )
    cluster.kubectl("delete", "-n", namespace, "configmap", "init-config-map-r1", check=True)
    create(
        cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}
    )
    cluster.kubectl("create", "priorityclass", f"rg-{namespace[-6:]}", "--value=10", check=True)
    poll(
        "the label, the deletion, the new configMap and the new class seen",
        lambda: (
            (c := state.get("PersistentVolumeClaim", namespace, "v-r1-data")) is not None
            and c.labels == {"dhcore/project": "p2"}
            and state.get("ConfigMap", namespace, "init-config-map-r1") is None
            and state.get("ConfigMap", namespace, "late") is not None
            and state.has_priority_class(f"rg-{namespace[-6:]}")
        ),
        timeout=10,
    )
    stats = state.stats()
    assert stats["ConfigMap"].events >= 2 and stats["ConfigMap"].relists == 0
    assert sum(s.watch_errors for s in stats.values()) == 0


def test_a_resume_from_an_old_version_relists_or_replays(
    cluster: Cluster, namespace: str, running: Running, publication: Path
) -> None:
    maps = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}} for i in range(3)
    ]
    create(cluster, namespace, *maps)
    state = SharedClusterState(publication)
    running.start()
    poll("every kind synced", lambda: synced(state), timeout=30)
    assert state.get("ConfigMap", namespace, "cm-0") is not None
    running.stop()

    # While nobody watches: one deleted, one changed, one created.
    cluster.kubectl("delete", "-n", namespace, "configmap", "cm-0", check=True)
    cluster.kubectl("label", "-n", namespace, "configmap", "cm-1", "changed=yes", check=True)
    create(
        cluster,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-new"}},
    )
    # The next watch resumes from resourceVersion 1, older than anything the test wrote.
    publisher = Publisher(publication)
    slot = publisher.kinds["ConfigMap"].slot
    assert slot.resource_version and int(slot.resource_version) > 1
    slot.resource_version = b"1"
    slot.write(publisher.control, "ConfigMap")
    publisher.close()
    # The apiserver answers such a watch from its watch cache: 410 Gone ("too old resource
    # version: 1 (2)") when the cache's first list of ConfigMaps came after etcd's second
    # revision, as on 1.33; every event since when it came before, as on 1.30 and 1.37,
    # whose caches start at revision 1. The same request, asked here, says which.
    first = cluster.kubectl(
        "get", "--raw", "/api/v1/configmaps?watch=1&resourceVersion=1&timeoutSeconds=1",
        check=True,
    ).stdout.splitlines()[0]  # fmt: skip
    event = json.loads(first)
    gone = event["type"] == "ERROR"
    assert not gone or event["object"]["code"] == 410, event

    watcher = running.start()

    def caught_up() -> bool:
        changed = state.get("ConfigMap", namespace, "cm-1")
        return (
            state.get("ConfigMap", namespace, "cm-0") is None
            and changed is not None
            and changed.labels == {"changed": "yes"}
            and state.get("ConfigMap", namespace, "cm-new") is not None
        )

    if gone:  # listed again into a new base
        poll("a relist of ConfigMaps", lambda: state.stats()["ConfigMap"].relists == 1, timeout=20)
        assert caught_up()
    else:  # the replayed events applied in order, no relist
        poll("the replayed ConfigMap events", caught_up, timeout=20)
        assert state.stats()["ConfigMap"].relists == 0
    assert state.stats()["Secret"].relists == 0  # the others resumed where they were
    # And it goes on watching after the relist.
    cluster.kubectl("delete", "-n", namespace, "configmap", "cm-new", check=True)
    poll(
        "the deletion after the relist",
        lambda: state.get("ConfigMap", namespace, "cm-new") is None,
        10,
    )
    assert watcher.synced()


def _process_memory(pid: int) -> Iterator[bytes]:
    """Every readable mapping of process ``pid`` (our child: ptrace rules allow it)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            match = re.match(r"([0-9a-f]+)-([0-9a-f]+) (r)", line)
            if not match or "[vvar]" in line or "[vsyscall]" in line:
                continue
            start, end = int(match[1], 16), int(match[2], 16)
            try:
                mem.seek(start)
                yield mem.read(end - start)
            except OSError:
                continue


def test_secret_data_never_reaches_the_watch(
    cluster: Cluster, namespace: str, publication: Path, tmp_path: Path
) -> None:
    value = f"rg-secret-{os.urandom(12).hex()}"
    applied_value = f"rg-applied-{os.urandom(12).hex()}"
    name = f"sec-{os.urandom(6).hex()}"
    cluster.kubectl(
        "create", "secret", "generic", name, "-n", namespace, f"--from-literal=password={value}",
        check=True,
    )  # fmt: skip
    # kubectl apply copies the whole manifest, data included, into an annotation the
    # apiserver sends with the metadata: it arrives, and must go no further.
    applied = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "applied"},
               "stringData": {"password": applied_value}}  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(applied), check=True)

    log = tmp_path / "watch.log"
    with open(log, "wb") as output:
        watch = WatchProcess(publication, str(cluster.kubeconfig), ("Secret",), output=output)
        watch.start()
        try:
            state = SharedClusterState(publication)
            until("both secrets in the state", lambda: state.get("Secret", namespace, "applied")
                  and state.get("Secret", namespace, name), timeout=30)  # fmt: skip
            applied_meta = state.get("Secret", namespace, "applied")
            assert applied_meta is not None and applied_meta.annotations == {}
            pid = watch.pid
            assert pid is not None
            found = {needle: False for needle in (name, value, _b64(value))}
            for region in _process_memory(pid):
                for needle in found:
                    found[needle] = found[needle] or needle.encode() in region
        finally:
            watch.stop()
    assert found[name], "the scan does not see the objects the watch received"
    assert not found[value] and not found[_b64(value)], "a secret's data reached the watch"
    # The applied one's data came inside the annotation: kept nowhere, logged nowhere.
    for path in [*publication.iterdir(), log]:
        content = path.read_bytes()
        for secret in (value, applied_value, _b64(value), _b64(applied_value)):
            assert secret.encode() not in content, path.name


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _parent(pid: int) -> int | None:
    try:  # the field after ``(comm)``, which may itself hold spaces and parentheses
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):  # bounded: a process tree is never this deep here
        parent = _parent(pid)
        if parent is None or parent <= 1:
            return False
        if parent == ancestor:
            return True
        pid = parent
    return False


def _watch_processes(under: int | None = None) -> dict[int, list[str]]:
    """The running cluster state watch processes: pid -> command line; with ``under``,
    only those descending from that process (another runguard on the machine, a
    developer's or another test run's, has its own)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "webhook.watches.clusterstate" in argv:
                if under is None or _descends_from(int(entry.name), under):
                    found[int(entry.name)] = argv
    return found


def test_served_workers_share_one_watch(
    cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNGUARD_CLUSTER_STATE", str(cluster.kubeconfig))
    server = Runguard(tmp_path / "runguard", REPO / "policies", workers=2)
    server.start()  # ready: the policy loaded and every kind listed once
    try:
        watches = _watch_processes(under=server.pid)  # this server's, whatever else runs
        assert len(watches) == 1, watches  # one for the server, not one per worker
        ((pid, argv),) = watches.items()
        directory = Path(argv[argv.index("--dir") + 1])
        assert argv[argv.index("--parent") + 1] == str(server.pid)
        status, body = server.readyz()
        assert status == 200 and body["clusterState"]["waiting"] == []
        base = body["clusterState"]["objects"]["ConfigMap"]
        create(cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "seen-by-all"}})  # fmt: skip
        seen: dict[int, int] = {}

        def every_worker_sees_it() -> bool:
            status, body = server.readyz()  # a new connection each time: any worker
            seen[body["worker"]] = body["clusterState"]["objects"]["ConfigMap"]
            return len(seen) == 2 and all(count == base + 1 for count in seen.values())

        poll("both workers count the new configMap", every_worker_sees_it, timeout=20)
    finally:
        server.stop()
    until("the watch process gone with the server", lambda: pid not in _watch_processes(), 10)
    assert not directory.exists()
