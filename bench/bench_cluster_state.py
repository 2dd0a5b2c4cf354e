"""Cluster state benchmark: memory, load and lookup time of the watch cache; not a test.

Synthesized (default 100k ReplicaSets + 100k PersistentVolumeClaims, metadata as a
busy ML platform's look): the list pages are built as the apiserver sends them
(``PartialObjectMetadataList`` JSON, 500 items a page), then decoded and published by
the writer exactly as the watch process does; a fresh reader process (a gunicorn worker's
side) maps the publication and looks objects up. Printed: bytes per object (published
files, the writer's and a reader's memory), load time, lookup times, catching up with
a burst of watch events; and, for comparison, the same objects held as Python ``Meta``
objects in a dict (what one cache per worker would cost each worker).

``--kubeconfig FILE`` adds a run against a real apiserver (e.g. ``python
tests/e2e/cluster.py up --dir /tmp/rg``): ``--objects`` ConfigMaps, Secrets, PVCs and
ReplicaSets are created in a fresh namespace (deleted at the end), then the time from
nothing to every kind synced is measured, in-process and as the watch process the
server starts; and the bytes a list of ReplicaSets costs as metadata vs whole objects.

Bounded: sizes are capped (``--count`` at most 500k per kind, ``--objects`` at most
20k), every wait has a deadline. Ends with one JSON line of the figures.

    python bench/bench_cluster_state.py [--count 100000] [--kubeconfig FILE --objects 4000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bench_config  # noqa: F401  (the import path: webhook)
import orjson

from webhook.clusterstate import KINDS, meta_from_object
from webhook.clusterstate.publication import PUT, create_directory
from webhook.clusterstate.reader import SharedClusterState
from webhook.clusterstate.table import encode_record
from webhook.clusterstate.watch import _release_memory as release_memory
from webhook.clusterstate.writer import Publisher

PAGE = 500
NAMESPACES = 200
MAX_COUNT = 500_000
MAX_OBJECTS = 20_000


# --- memory of this process ------------------------------------------------------------


def memory() -> dict[str, int]:
    """Bytes resident (Rss), proportional (Pss) and anonymous (the process's own: the
    mapped publication is shared file memory, counted once per pod), from smaps_rollup."""
    fields: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"], "anonymous": fields["Anonymous"]}


# --- synthesized metadata ---------------------------------------------------------------


def replica_set(i: int) -> dict[str, Any]:
    run = f"{i:08x}"
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "name": f"serve-{run}-7f9c8d6b5",
            "namespace": f"team-{i % NAMESPACES}",
            "uid": str(uuid.UUID(int=random.getrandbits(128), version=4)),
            "resourceVersion": str(1000 + i),
            "generation": 1,
            "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": run,
                "pod-template-hash": "7f9c8d6b5",
            },
            "annotations": {
                "deployment.kubernetes.io/desired-replicas": "1",
                "deployment.kubernetes.io/max-replicas": "2",
                "deployment.kubernetes.io/revision": "1",
                "runguard.io/requested-by": "system:serviceaccount:digitalhub:core",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": f"serve-{run}",
                    "uid": str(uuid.UUID(int=random.getrandbits(128), version=4)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update",
                 "apiVersion": "apps/v1", "time": "2026-11-22T10:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}}}}
            ],
        },
    }  # fmt: skip


def claim(i: int) -> dict[str, Any]:
    run = f"{i:08x}"
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "name": f"v-{run}-data",
            "namespace": f"team-{i % NAMESPACES}",
            "uid": str(uuid.UUID(int=random.getrandbits(128), version=4)),
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {"dhcore/project": f"project-{i % 50}", "dhcore/run": run},
            "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.beta.kubernetes.io/storage-provisioner": "rancher.io/local-path",
                "volume.kubernetes.io/selected-node": f"node-{i % 40}",
                "volume.kubernetes.io/storage-provisioner": "rancher.io/local-path",
            },
            "finalizers": ["kubernetes.io/pvc-protection"],
        },
    }


def pages(make: Any, count: int) -> Iterator[bytes]:
    """The list as the apiserver sends it: JSON pages of ``PAGE`` items."""
    for start in range(0, count, PAGE):
        items = [make(i) for i in range(start, min(count, start + PAGE))]
        yield orjson.dumps({"kind": "PartialObjectMetadataList", "items": items})


def records(kind: str, raw_pages: list[bytes]) -> Iterator[bytes]:
    """What the watch does with each page: decode, keep the metadata, encode."""
    for raw in raw_pages:
        for item in orjson.loads(raw)["items"]:
            yield encode_record(meta_from_object(item, kind))


# --- the synthesized run -----------------------------------------------------------------


def synthesized(count: int, directory: Path) -> dict[str, Any]:
    random.seed(7)
    sources = {"ReplicaSet": replica_set, "PersistentVolumeClaim": claim}
    raw = {kind: list(pages(make, count)) for kind, make in sources.items()}
    wire = {kind: sum(map(len, p)) / count for kind, p in raw.items()}
    gc.collect()
    before = memory()
    writer = Publisher(directory)
    load, load_cpu = {}, {}
    for kind in sources:
        started, cpu = time.perf_counter(), time.process_time()
        writer.kinds[kind].replace(records(kind, raw[kind]), "1000", relist=False)
        load[kind] = time.perf_counter() - started
        load_cpu[kind] = time.process_time() - cpu
    release_memory()  # as the watch does after a list
    gc.collect()
    after = memory()
    files = {kind: sum(p.stat().st_size for p in directory.glob(f"{kind}.*")) for kind in sources}
    # A burst of watch events: 10k ReplicaSets changed (labels), then a reader catches up.
    started = time.perf_counter()
    batch = []
    for i in range(10_000):
        meta = meta_from_object(replica_set(i), "ReplicaSet")
        batch.append((PUT, encode_record(meta)))
        if len(batch) == 100:
            writer.kinds["ReplicaSet"].apply(batch, str(2000 + i))
            batch = []
    events = time.perf_counter() - started
    reader = run_reader(directory, count)
    writer.close()
    peak = load_peak(raw["ReplicaSet"])
    del raw
    gc.collect()
    naive = naive_dict(min(count, 50_000))
    return {
        "objects": 2 * count,
        "wire_bytes_per_object": {k: round(v) for k, v in wire.items()},
        "published_bytes_per_object": {k: round(v / count) for k, v in files.items()},
        "load_seconds": {k: round(v, 2) for k, v in load.items()},
        "load_cpu_seconds": {k: round(v, 2) for k, v in load_cpu.items()},
        "writer_bytes_per_object": round((after["anonymous"] - before["anonymous"]) / (2 * count)),
        "writer_load_peak": {"MB": peak[0], "bytes_per_object": peak[1]},
        "events_per_second_published": round(10_000 / events),
        "reader": reader,
        "naive_dict_bytes_per_object": naive,
    }


def load_peak(raw_pages: list[bytes]) -> tuple[float, int]:
    """(MB, bytes per object): what Python holds at most while a list is published, a
    fixed part (a page decoded) and a part per object (the indexes being sorted); traced
    on two parts of the list (tracing slows allocation ~10x)."""
    small, large = _traced_peak(raw_pages[:20]), _traced_peak(raw_pages[:80])
    per_object = (large[0] - small[0]) / (large[1] - small[1])
    return round((small[0] - per_object * small[1]) / 2**20, 1), round(per_object)


def _traced_peak(raw_pages: list[bytes]) -> tuple[int, int]:
    import tracemalloc

    directory = create_directory()
    writer = Publisher(directory)
    try:
        tracemalloc.start()
        count = writer.kinds["ReplicaSet"].replace(
            records("ReplicaSet", raw_pages), "1", relist=False
        )
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        writer.close()
        shutil.rmtree(directory, ignore_errors=True)
    return peak, count


def run_reader(directory: Path, count: int) -> dict[str, Any]:
    """A fresh process maps the publication, as a worker does, and looks objects up."""
    done = subprocess.run(
        [sys.executable, __file__, "--reader", str(directory), "--count", str(count)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def reader_main(directory: Path, count: int) -> None:
    gc.collect()
    before = memory()
    state = SharedClusterState(directory)
    started = time.perf_counter()
    state.refresh()  # maps both bases, reads the 10k events of the delta log
    first = time.perf_counter() - started
    random.seed(11)
    names = [
        (f"team-{i % NAMESPACES}", f"serve-{i:08x}-7f9c8d6b5")
        for i in random.sample(range(count), 2000)
    ]
    uids = []
    timings: dict[str, list[float]] = {"get": [], "by_uid": [], "miss": []}
    for namespace, name in names:
        started = time.perf_counter()
        meta = state.get("ReplicaSet", namespace, name)
        timings["get"].append(time.perf_counter() - started)
        assert meta is not None
        uids.append(meta.uid)
    for uid in uids:
        started = time.perf_counter()
        found = state.by_uid(uid)
        timings["by_uid"].append(time.perf_counter() - started)
        assert found is not None
    for namespace, name in names:
        started = time.perf_counter()
        assert state.get("ReplicaSet", namespace, name + "-x") is None
        timings["miss"].append(time.perf_counter() - started)
    # Touch every page (a worker that served long enough): shared, not private.
    for kind_table in state.tables().values():
        sum(kind_table._keys.hashes[::512])
        sum(kind_table._uids.hashes[::512])
        for _ in kind_table.records():
            pass
    gc.collect()
    after = memory()
    print(
        json.dumps(
            {
                "catch_up_ms": round(first * 1e3, 1),
                "get_us": round(statistics.median(timings["get"]) * 1e6, 1),
                "by_uid_us": round(statistics.median(timings["by_uid"]) * 1e6, 1),
                "miss_us": round(statistics.median(timings["miss"]) * 1e6, 1),
                "get_p99_us": round(sorted(timings["get"])[int(len(names) * 0.99)] * 1e6, 1),
                "rss_bytes_per_object": round((after["rss"] - before["rss"]) / (2 * count)),
                "own_bytes_per_object": round(
                    (after["anonymous"] - before["anonymous"]) / (2 * count)
                ),
            }
        )
    )


def naive_dict(count: int) -> int:
    """Bytes per object of ``{(kind, namespace, name): Meta}`` plus a uid dict."""
    import tracemalloc

    random.seed(3)
    tracemalloc.start()
    by_key: dict[Any, Any] = {}
    by_uid: dict[str, Any] = {}
    for i in range(count):
        for kind, make in (("ReplicaSet", replica_set), ("PersistentVolumeClaim", claim)):
            meta = meta_from_object(orjson.loads(orjson.dumps(make(i))), kind)
            by_key[(kind, meta.namespace, meta.name)] = meta
            by_uid[meta.uid] = meta
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return round(size / (2 * count))


# --- the real apiserver --------------------------------------------------------------------


def real_apiserver(kubeconfig: str, objects: int) -> dict[str, Any]:
    from webhook.clusterstate.api import LIST_ACCEPT, Api, api_client, resource_path
    from webhook.clusterstate.process import WatchProcess
    from webhook.clusterstate.watch import Watcher

    env = {**os.environ, "KUBECONFIG": kubeconfig}
    namespace = f"rg-bench-{os.urandom(3).hex()}"

    def kubectl(*args: str, data: Any = None) -> None:
        subprocess.run(
            ["kubectl", *args],
            input=json.dumps(data) if data is not None else None,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )

    template = {"metadata": {"labels": {"app": "b"}},
                "spec": {"containers": [{"name": "m", "image": "busybox:1.36"}]}}  # fmt: skip
    per = objects // 4
    makers: dict[str, Callable[[int], dict[str, Any]]] = {
        "ConfigMap": lambda i: {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": f"cm-{i}", "labels": {"i": str(i)}},
                                "data": {"payload": "x" * 512}},
        "Secret": lambda i: {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": f"sec-{i}"},
                             "stringData": {"token": "y" * 512}},
        "PersistentVolumeClaim": lambda i: {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"v-{i}-data", "labels": {"dhcore/run": str(i)}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}},
        "ReplicaSet": lambda i: {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"rs-{i}", "annotations":
                         {"runguard.io/requested-by": "system:serviceaccount:dh:core"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "b"}},
                     "template": template}},
    }  # fmt: skip
    kubectl("create", "namespace", namespace)
    directory = create_directory()
    try:
        started = time.perf_counter()
        for make in makers.values():
            for start in range(0, per, 500):
                items = [make(i) for i in range(start, min(per, start + 500))]
                kubectl(
                    "create",
                    "-n",
                    namespace,
                    "-f",
                    "-",
                    data={"apiVersion": "v1", "kind": "List", "items": items},
                )
        created = time.perf_counter() - started

        client = api_client(kubeconfig)
        api = Api(client)
        sizes = {}
        for accept in (LIST_ACCEPT, "application/json"):
            response = api.get(resource_path("ReplicaSet"), {"limit": "500"}, accept, 60)
            body = response.read()
            response.release_conn()
            sizes[accept] = len(body) / max(1, len(orjson.loads(body)["items"]))

        def sync_time(start_watch: Callable[[], Callable[[], None]]) -> float:
            shutil.rmtree(directory)
            directory.mkdir()
            state = SharedClusterState(directory)
            started = time.perf_counter()
            stop = start_watch()
            deadline = started + 120
            while not all(state.synced(k) for k in KINDS):
                if time.perf_counter() > deadline:
                    raise TimeoutError("not synced within 120 s")
                time.sleep(0.01)
            took = time.perf_counter() - started
            stop()
            return took

        def in_process() -> Callable[[], None]:
            publisher = Publisher(directory)
            watcher = Watcher(api, publisher, resume=False)
            watcher.start()

            def stop() -> None:
                watcher.stop()
                publisher.close()

            return stop

        def watch_process() -> Callable[[], None]:
            process = WatchProcess(directory, kubeconfig, output=subprocess.DEVNULL)
            process.start()
            return process.stop

        in_process_s = [sync_time(in_process) for _ in range(3)]
        process_s = [sync_time(watch_process) for _ in range(3)]
        client.close()
        return {
            "objects": 4 * per,
            "create_seconds": round(created, 1),
            "sync_seconds_in_process": round(min(in_process_s), 2),
            "sync_seconds_watch_process": round(min(process_s), 2),
            "replicaset_list_bytes_per_object": {
                "metadata": round(sizes[LIST_ACCEPT]),
                "whole": round(sizes["application/json"]),
            },
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        kubectl("delete", "namespace", namespace, "--wait=false")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="objects per kind (RS, PVC)")
    parser.add_argument("--kubeconfig", help="also measure the first sync against this cluster")
    parser.add_argument("--objects", type=int, default=4000, help="created there (4 kinds)")
    parser.add_argument("--reader", help=argparse.SUPPRESS)
    args = parser.parse_args()
    count = max(1000, min(args.count, MAX_COUNT))
    if args.reader:
        reader_main(Path(args.reader), count)
        return

    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = create_directory(parent)
    try:
        synth = synthesized(count, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    reader = synth["reader"]
    rs_pvc = ("ReplicaSet", "PersistentVolumeClaim")
    rows: list[tuple[str, Any]] = [
        ("list JSON from the apiserver, B/object", synth["wire_bytes_per_object"]),
        ("published (shared files), B/object", synth["published_bytes_per_object"]),
        ("load: decode + publish, wall s", synth["load_seconds"]),
        ("load: decode + publish, CPU s", synth["load_cpu_seconds"]),
        ("writer (watch process) own memory, B/object", synth["writer_bytes_per_object"]),
        ("writer peak while loading: MB + B/object", tuple(synth["writer_load_peak"].values())),
        ("reader (a worker) own memory, B/object", reader["own_bytes_per_object"]),
        ("reader resident, shared map incl., B/object", reader["rss_bytes_per_object"]),
        ("reader first catch-up (10k events), ms", reader["catch_up_ms"]),
        ("get median / p99, us", (reader["get_us"], reader["get_p99_us"])),
        ("by_uid median, us", reader["by_uid_us"]),
        ("miss median, us", reader["miss_us"]),
        ("events published per second", synth["events_per_second_published"]),
        ("a dict of Meta per worker instead, B/object", synth["naive_dict_bytes_per_object"]),
    ]
    print(f"runguard cluster state: {count} ReplicaSets + {count} PVCs, synthesized")
    print(f"{'':<46} {'ReplicaSet':>10} {'PVC':>10}")
    for label, value in rows:
        if isinstance(value, dict):
            value = tuple(value[kind] for kind in rs_pvc)
        cells = value if isinstance(value, tuple) else (value,)
        print(f"{label:<46} " + " ".join(f"{cell:>10}" for cell in cells))
    result: dict[str, Any] = {"synthesized": synth}
    if args.kubeconfig:
        real = real_apiserver(args.kubeconfig, max(400, min(args.objects, MAX_OBJECTS)))
        result["apiserver"] = real
        sizes = real["replicaset_list_bytes_per_object"]
        print(f"\nreal apiserver: {real['objects']} objects of 4 kinds")
        for label, value in (
            ("first sync of all 11 kinds, in-process, s", real["sync_seconds_in_process"]),
            ("first sync, watch process started, s", real["sync_seconds_watch_process"]),
            ("ReplicaSet list B/object: metadata, whole", (sizes["metadata"], sizes["whole"])),
        ):
            cells = value if isinstance(value, tuple) else (value,)
            print(f"{label:<46} " + " ".join(f"{cell:>10}" for cell in cells))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
