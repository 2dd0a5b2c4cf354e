"""The policy watch: RunPolicy, Profile and Platform objects mirrored into the policy directory.

``runguard serve --policy-objects in-cluster|FILE`` runs it as its own process (a fresh
interpreter, ``python -m webhook.watches.policy``, supervised like the cluster-state
watch: ``process.PolicyWatch``), started before the first load, so that the server stays
what it is: a directory of policy files, reloaded when they change, the last good policy
kept when they do not load. The process

* lists the three kinds (``crd.MIRRORED``), writes each object as a file
  (``objects.mirror``: what a file in ``policies/`` holds, the same YAML) and marks
  the first sync (``.synced``, a hidden file the loader skips);
* watches them from the listed resourceVersion, mirroring each change as it comes
  (a 410 Gone, or a watch that ends, lists again);
* after each change loads the directory as the server will (``objects.conditions``) and
  writes every object's ``status``: a ``Loaded`` condition, True, or False with the
  errors naming the key, while the server keeps the last good policy. Only a condition
  that changed is written, so its own status writes (which come back as watch events)
  settle at once;
* holds an edit that changes what the webhooks route (a selector, a platform name, an
  operator's kind, an excluded namespace: the webhook configurations are rendered from
  the policy) until the cluster's webhook configurations route it: served earlier, the
  policy would rely on objects that never reach runguard (a kind it now stamps, a name
  it now reserves). The objects then say ``held`` and the last mirrored set keeps
  serving, the configurations read again every few seconds until they route it; with no
  configuration registered yet (an install applies them last) nothing is held.

It exits when its parent (the server) is gone; the ``kubernetes`` package is imported
here only, never in the server's processes.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from webhook.inputs.kubeconfig import IN_CLUSTER
from webhook.install import manifests
from webhook.policy.crd import GROUP, LOADED, MIRRORED, PLURALS, VERSION
from webhook.policy.lint import lint
from webhook.policy.mirror.objects import conditions, mirror
from webhook.policy.mirror.process import SYNCED
from webhook.policy.model import Policy

__all__ = ["Mirror", "held_because", "policy_routing", "routing", "run", "status_updates"]

log = logging.getLogger("runguard.server")

WATCH_SECONDS = 300  # a watch request's timeoutSeconds: then the watch starts again
SETTLE = 0.2  # seconds of quiet before a burst of events is mirrored and judged
HELD_RECHECK = 3.0  # seconds between looks at the webhook configurations while held
FIELD_MANAGER = "runguard"


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


Routing = dict[str, Any]  # webhook name -> what decides which requests reach it
# The cluster's routing (None: runguard's configurations are not registered) and the
# namespace they name for runguard.
LiveRouting = Callable[[], tuple["Routing | None", str]]


def routing(configurations: list[dict[str, Any]]) -> Routing:
    """What decides which requests reach each webhook, as the apiserver stores it (its
    defaults filled, a namespace selector's values as a set); not where it calls."""
    out: Routing = {}
    for config in configurations:
        for hook in config.get("webhooks") or ():
            namespaces = copy.deepcopy(hook.get("namespaceSelector") or {})
            for expr in namespaces.get("matchExpressions") or ():
                expr["values"] = sorted(expr.get("values") or ())
            out[f"{config['kind']}/{hook['name']}"] = {
                "rules": [{"scope": "*", **rule} for rule in hook.get("rules") or ()],
                "matchConditions": hook.get("matchConditions") or [],
                "objectSelector": hook.get("objectSelector") or {},
                "namespaceSelector": namespaces,
            }
    return out


def policy_routing(policy: Policy, namespace: str) -> Routing:
    return routing(manifests.webhook_configurations(policy, namespace=namespace))


def held_because(served: Policy | None, candidate: Policy | None, live: LiveRouting) -> str | None:
    """Why ``candidate`` may not be served yet: it routes otherwise than the policy
    served and the cluster's configurations do not route it so (None: it may)."""
    if served is None or candidate is None:
        return None  # the first policy, or one that does not load (the loader says why)
    cluster, namespace = live()
    wanted = policy_routing(candidate, namespace)
    if cluster is None or wanted == policy_routing(served, namespace) or cluster == wanted:
        return None
    differ = sorted(
        name.partition("/")[2]
        for name in set(wanted) | set(cluster)
        if wanted.get(name) != cluster.get(name)
    )
    return (
        f"held: this edit changes what runguard's webhooks route ({', '.join(differ)}); "
        "apply the webhook configurations rendered from it first (runguard manifests -p "
        "DIR --write manifests && kubectl apply -k manifests/, from the same files), then "
        "runguard serves it; until then it keeps serving the policy before the edit"
    )


class Mirror:
    """The objects as last seen, by (kind, name), and what is done with them."""

    def __init__(
        self,
        directory: Path,
        write_status: Callable[[str, str, Any], None],
        live: LiveRouting = lambda: (None, manifests.DEFAULT_NAMESPACE),
    ):
        self.directory = directory
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.write_status = write_status
        self.live = live
        self.served: Policy | None = None  # the last policy mirrored that loaded
        self.held = False  # the objects' policy waits for the webhooks to route it

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
        with tempfile.TemporaryDirectory(prefix="runguard-candidate-") as candidate:
            mirror(self.objects.values(), candidate)
            policy = lint(candidate).policy
        try:
            held = held_because(self.served, policy, self.live)
        except Exception as exc:  # the cluster's configurations unreadable: hold too
            held = f"held: runguard's webhook configurations could not be read ({exc})"
        self.held = held is not None
        if held is not None:
            log.warning("policy objects: %s", held)
            judged = {key: (False, held) for key in self.objects}
        else:
            if mirror(self.objects.values(), self.directory):
                log.info("policy objects: %d mirrored into %s", len(self.objects), self.directory)
            self.served = policy or self.served
            judged = conditions(self.directory)
        updates = status_updates(self.objects, judged)
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


_Event = tuple[str, str, dict[str, Any]] | tuple[str, str, None]  # (type or LIST, kind, object)


class _Cluster:
    """The cluster as the watch uses it: the policy objects listed and watched, their
    status written, runguard's webhook configurations read."""

    def __init__(self, source: str) -> None:
        self.api = _api(source)

    def write_status(self, kind: str, name: str, status: Any) -> None:
        self.api.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            PLURALS[kind],
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def live(self) -> tuple[Routing | None, str]:
        """The routing of runguard's two webhook configurations in the cluster."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        admission: Any = client.AdmissionregistrationV1Api(self.api.api_client)
        configurations = []
        for kind, read in (
            ("MutatingWebhookConfiguration", admission.read_mutating_webhook_configuration),
            ("ValidatingWebhookConfiguration", admission.read_validating_webhook_configuration),
        ):
            try:
                response: Any = read(manifests.CONFIGURATION_NAME, _preload_content=False)
            except ApiException as exc:
                if exc.status == 404:
                    return None, manifests.DEFAULT_NAMESPACE
                raise
            configurations.append({**json.loads(response.data), "kind": kind})
        service = (configurations[0]["webhooks"][0].get("clientConfig") or {}).get("service")
        return routing(configurations), (service or {}).get("namespace") or "runguard"

    def follow(self, kind: str, events: queue.Queue[_Event]) -> None:
        """List, then watch from there; list again on a 410 or an error."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        api, plural = self.api, PLURALS[kind]
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


def run(directory: Path, source: str, parent: int) -> int:
    cluster = _Cluster(source)
    events: queue.Queue[_Event] = queue.Queue()
    state = Mirror(directory, cluster.write_status, cluster.live)
    for kind in MIRRORED:
        threading.Thread(
            target=cluster.follow, args=(kind, events), name=f"watch-{kind}", daemon=True
        ).start()
    listed: set[str] = set()
    while os.getppid() == parent:
        try:
            first = events.get(timeout=HELD_RECHECK if state.held else 1.0)
        except queue.Empty:
            if state.held:  # the webhook configurations may route it by now
                state.sync()
            continue
        for what, kind, obj in _burst(events, first):
            if what == "LIST" and obj is not None:
                state.replace(kind, list(obj.get("items") or []))
                listed.add(kind)
            elif obj is not None:
                state.event(kind, what, obj)
        if listed == set(MIRRORED):
            state.sync()
            (directory / SYNCED).touch()
    return 0


def _burst(events: queue.Queue[_Event], first: _Event) -> list[_Event]:
    """``first`` and the events that follow it closely (a kubectl apply -f of a
    directory), to be judged once."""
    batch = [first]
    while True:
        try:
            batch.append(events.get(timeout=SETTLE))
        except queue.Empty:
            return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.watches.policy")
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
