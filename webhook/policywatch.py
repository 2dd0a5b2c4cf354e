"""The policy watch: RunPolicy and Profile objects mirrored into the policy directory.

``runguard serve --policy-objects in-cluster|FILE`` runs it as its own process (a fresh
interpreter, ``python -m webhook.policywatch``, supervised like the cluster-state watch:
``PolicyWatch``), started before the first load, so that the server stays what it is:
a directory of policy files, reloaded when they change, the last good policy kept when
they do not load. The process

* lists both kinds, writes each object as a file (``objects.mirror``: what a file in
  ``policies/`` holds, the same YAML) and marks the first sync (``.synced``, a hidden
  file the loader skips);
* watches both kinds from the listed resourceVersion, mirroring each change as it comes
  (a 410 Gone, or a watch that ends, lists again);
* after each change loads the directory as the server will (``objects.conditions``) and
  writes every object's ``status``: a ``Loaded`` condition, True, or False with the
  errors naming the key, while the server keeps the last good policy. Only a condition
  that changed is written, so its own status writes (which come back as watch events)
  settle at once.

It exits when its parent (the server) is gone; the ``kubernetes`` package is imported
here only, never in the server's processes.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from webhook.clusterstate.process import WatchProcess
from webhook.policy.crd import GROUP, LOADED, PLURALS, VERSION
from webhook.policy.objects import conditions, mirror
from webhook.settings import IN_CLUSTER

__all__ = ["PolicyWatch", "SYNCED", "wait_synced"]

log = logging.getLogger("runguard.server")

SYNCED = ".synced"  # written in the directory once the first list is mirrored
WATCH_SECONDS = 300  # a watch request's timeoutSeconds: then the watch starts again
SETTLE = 0.2  # seconds of quiet before a burst of events is mirrored and judged
FIELD_MANAGER = "runguard"


class PolicyWatch(WatchProcess):
    """The policy watch process of a server, mirroring into ``directory``."""

    label = "policy objects"

    module = "webhook.policywatch"

    def arguments(self) -> list[str]:
        return []


def wait_synced(directory: Path, timeout: float, alive: Callable[[], bool]) -> bool:
    """Wait until the watch mirrored its first list into ``directory``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (directory / SYNCED).exists():
            return True
        if not alive():
            return False
        time.sleep(0.1)
    return False


# --- the process -----------------------------------------------------------------------


def condition_of(
    loaded: bool, message: str, generation: int | None, previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A ``Loaded`` condition; its transition time kept while its status stays."""
    status = "True" if loaded else "False"
    if previous is not None and previous.get("status") == status:
        when = previous.get("lastTransitionTime")
    else:
        when = None
    out: dict[str, Any] = {
        "type": LOADED,
        "status": status,
        "reason": "Loaded" if loaded else "Invalid" if ": " in message else "NotLoaded",
        "message": message,
        "lastTransitionTime": when or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def _current(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    status = obj.get("status") or {}
    for condition in status.get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == LOADED:
            return condition
    return None


def status_updates(
    objects: Mapping[tuple[str, str], Mapping[str, Any]],
    judged: Mapping[tuple[str, str], tuple[bool, str]],
) -> dict[tuple[str, str], dict[str, Any]]:
    """The ``status`` to write for each object whose ``Loaded`` condition changed."""
    updates = {}
    for key, obj in objects.items():
        if key not in judged:
            continue
        loaded, message = judged[key]
        generation = (obj.get("metadata") or {}).get("generation")
        previous = _current(obj)
        wanted = condition_of(loaded, message, generation, previous)
        if previous is not None and all(previous.get(k) == v for k, v in wanted.items()):
            continue
        updates[key] = {"observedGeneration": generation, "conditions": [wanted]}
    return updates


class Mirror:
    """The objects as last seen, by (kind, name), and what is done with them."""

    def __init__(self, directory: Path, write_status: Callable[[str, str, Any], None]):
        self.directory = directory
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.write_status = write_status

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        self.objects = {k: v for k, v in self.objects.items() if k[0] != kind}
        for item in items:
            item.setdefault("kind", kind)
            self.objects[kind, item["metadata"]["name"]] = item

    def event(self, kind: str, kind_of_event: str, obj: dict[str, Any]) -> None:
        key = (kind, obj["metadata"]["name"])
        if kind_of_event == "DELETED":
            self.objects.pop(key, None)
        else:
            obj.setdefault("kind", kind)
            self.objects[key] = obj

    def sync(self) -> None:
        if mirror(self.objects.values(), self.directory):
            log.info("policy objects: %d mirrored into %s", len(self.objects), self.directory)
        updates = status_updates(self.objects, conditions(self.directory))
        for (kind, name), status in updates.items():
            try:
                self.write_status(kind, name, status)
            except Exception as exc:  # a 403 or a conflict: said, tried again next change
                log.error("policy objects: status of %s %s not written: %s", kind, name, exc)


def _api(source: str) -> Any:
    from kubernetes import client, config

    if source == IN_CLUSTER:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(config_file=source)  # type: ignore[no-untyped-call]
    return client.CustomObjectsApi(client.ApiClient())


def run(directory: Path, source: str, parent: int) -> int:
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    api = _api(source)
    events: queue.Queue[tuple[str, str, dict[str, Any]] | tuple[str, str, None]] = queue.Queue()

    def write_status(kind: str, name: str, status: Any) -> None:
        api.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            PLURALS[kind],
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    state = Mirror(directory, write_status)

    def follow(kind: str) -> None:
        """List, then watch from there; list again on a 410 or an error."""
        plural = PLURALS[kind]
        while True:
            try:
                listed = api.list_cluster_custom_object(GROUP, VERSION, plural)
                events.put(("LIST", kind, listed))
                version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    api.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    plural,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                )
                for event in stream:
                    if event["type"] == "ERROR":
                        break
                    events.put((event["type"], kind, event["object"]))
            except ApiException as exc:
                log.error("policy objects: %s: %s %s", plural, exc.status, exc.reason)
                time.sleep(2.0)
            except Exception as exc:  # a dropped connection: list again
                log.error("policy objects: %s: %s", plural, exc)
                time.sleep(2.0)

    for kind in PLURALS:
        threading.Thread(target=follow, args=(kind,), name=f"watch-{kind}", daemon=True).start()
    listed: set[str] = set()
    while os.getppid() == parent:
        try:
            what, kind, obj = events.get(timeout=1.0)
        except queue.Empty:
            continue
        batch = [(what, kind, obj)]
        while True:  # a burst (a kubectl apply -f of a directory) is judged once
            try:
                batch.append(events.get(timeout=SETTLE))
            except queue.Empty:
                break
        for what, kind, obj in batch:
            if what == "LIST" and obj is not None:
                state.replace(kind, list(obj.get("items") or []))
                listed.add(kind)
            elif obj is not None:
                state.event(kind, what, obj)
        if listed == set(PLURALS):
            state.sync()
            (directory / SYNCED).touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.policywatch")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    return run(args.dir, args.source, args.parent)


if __name__ == "__main__":
    sys.exit(main())
