"""The cluster, as the commands that read it share it (``runguard audit``, ``explain``
and ``whatif`` with ``--kubeconfig``/``--context``, or in a Pod its ServiceAccount).

The ``kubernetes`` client's connection (``connect``), one list request per page with
its body left undecoded (``kube_fetch``: raw JSON, ``_preload_content=False``, no
typed-model round trip), the policy the cluster's RunPolicy, Platform and Profile objects make
(``policy_from_objects``), and a failure in a line that says what to do
(``failure_reason``, ``config_reason``), all four in ``on_cluster``, the block every
command that reads the cluster runs its work in; and what ``runguard audit`` and ``audit
--rbac`` both write with: server-side apply as ``runguard-audit``, reports as YAML, a
line on stderr under the progress line. The client is imported inside the functions:
a command that never reaches the cluster never loads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO, TypeVar

from webhook.audit.clusteraudit import ContinueExpired, Fetch, Listing
from webhook.audit.policyreport import REPORT_GROUP, REPORT_VERSION
from webhook.cli import load_policy_or_report
from webhook.policy.model import Policy

T = TypeVar("T")
REQUEST_TIMEOUT = (10, 300)  # seconds: to connect, then to read one page or one write


def connect(args: argparse.Namespace) -> Any:
    from kubernetes import client, config

    if args.kubeconfig or not in_cluster():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig, context=args.context
        )
    else:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ


def kube_fetch(api_client: Any) -> Fetch:
    """One list request through the ``kubernetes`` client, its body left undecoded."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    apis: dict[str, Any] = {}

    def fetch(listing: Listing, namespace: str | None, query: Mapping[str, str]) -> bytes:
        api = apis.get(listing.api_class) or getattr(client, listing.api_class)(api_client)
        apis[listing.api_class] = api
        kwargs: dict[str, Any] = {
            "limit": int(query["limit"]),
            "_preload_content": False,
            "_request_timeout": REQUEST_TIMEOUT,
        }
        for key, arg in (
            ("continue", "_continue"),
            ("labelSelector", "label_selector"),
            ("fieldSelector", "field_selector"),
        ):
            if query.get(key):
                kwargs[arg] = query[key]
        try:
            if namespace:
                response = getattr(api, listing.list_namespaced)(namespace, **kwargs)
            else:
                response = getattr(api, listing.list_all)(**kwargs)
        except ApiException as exc:
            if exc.status == 410 and "continue" in query:
                raise ContinueExpired(str(exc.reason)) from exc
            raise
        try:
            return bytes(response.data)
        finally:
            response.release_conn()

    return fetch


def mirror_policy_objects(api_client: Any, directory: str) -> None:
    """The cluster's RunPolicy, Platform and Profile objects as policy files in ``directory``."""
    from kubernetes import client

    from webhook.policy.crd import GROUP, MIRRORED, PLURALS, VERSION
    from webhook.policy.mirror.objects import mirror

    api: Any = client.CustomObjectsApi(api_client)
    items: list[dict[str, Any]] = []
    for kind in MIRRORED:
        plural = PLURALS[kind]
        listed: dict[str, Any] = api.list_cluster_custom_object(
            GROUP, VERSION, plural, _request_timeout=REQUEST_TIMEOUT
        )
        items += [{**item, "kind": kind} for item in listed.get("items") or ()]
    mirror(items, directory)


def policy_from_objects(api_client: Any, scratch: str) -> Policy | None:
    """The policy the cluster's RunPolicy, Platform and Profile objects make (None:
    errors printed)."""
    mirror_policy_objects(api_client, scratch)
    return load_policy_or_report(scratch)


class Session:
    """One command's time on the cluster: the connection, the policy chosen (``-p``'s
    files, or with ``--policy-objects`` the cluster's objects mirrored into
    ``directory``), and the step under way, which an error message names."""

    api_client: Any
    policy: Policy
    directory: str  # where the policy's files are: -p's, or the mirror's scratch

    def __init__(self, doing: str) -> None:
        self.doing = doing


def on_cluster(
    args: argparse.Namespace,
    command: str,
    work: Callable[[Session], T],
    *,
    policy: Policy | None = None,
    doing: str = "connect",
) -> T | None:
    """Connect, choose the policy, run ``work`` (which sets ``session.doing`` as it goes):
    its result, or None once a failure was said in one line, ``runguard COMMAND: cannot
    DOING: REASON`` (a kubeconfig problem with where to put one, the apiserver's answer,
    a missing report CRD when writing). ``policy``: ``-p``'s, loaded by the caller;
    else read after connecting. A policy that does not load is None too, its errors
    printed. A closed stdout (``BrokenPipeError``) is the caller's."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from webhook.audit.clusteraudit import AuditError
    from webhook.clusterstate.api import ApiError

    session = Session(doing)
    try:
        with connect(args) as api_client, tempfile.TemporaryDirectory() as scratch:
            session.api_client, session.directory = api_client, args.policy
            if args.policy_objects:
                session.doing, session.directory = "read the policy objects", scratch
                chosen = policy_from_objects(api_client, scratch)
            else:
                chosen = policy if policy is not None else load_policy_or_report(args.policy)
            if chosen is None:
                return None
            session.policy, session.doing = chosen, doing
            return work(session)
    except BrokenPipeError:
        raise
    except ConfigException as exc:
        reason = config_reason(exc)
    except (ApiException, ApiError, AuditError, HTTPError, OSError) as exc:
        reason = failure_reason(exc, writing=session.doing.startswith("write"))
    print(f"runguard {command}: cannot {session.doing}: {reason}", file=sys.stderr)
    return None


def release(response: Any) -> None:
    """Read what is left of an answer (its connection goes back to the pool, where a
    next request would otherwise read these bytes first) and release it."""
    response.drain_conn()
    response.release_conn()


NO_REPORT_CRD = (
    f"404: the cluster serves no {REPORT_GROUP}/{REPORT_VERSION} PolicyReports or "
    "ClusterPolicyReports: install their CRDs with `kubectl apply -k "
    "manifests/policyreport-crd` (or keep the ones Kyverno or Policy Reporter install), "
    "or run without --write"
)


def failure_reason(exc: BaseException, writing: bool = False) -> str:
    """An exception in a line: for the apiserver's answers, its Status message, and what
    to do when the answer is that the report CRDs are missing."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status", None)
    message = None
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
    if (
        writing
        and status == 404
        and (message is None or "could not find the requested resource" in message)
    ):
        # A group or resource the apiserver does not serve answers a bare 404 Not Found.
        return NO_REPORT_CRD
    if message:
        return f"{status}: {message}"
    text = str(getattr(exc, "reason", None) or exc)
    return text if len(text) <= 300 else text[:300] + "..."


def config_reason(exc: BaseException) -> str:
    """A kubeconfig problem in a line that says where runguard looked and what to do."""
    text = str(exc)
    if "No configuration found" in text or "Invalid kube-config file" in text:
        return (
            "no kubeconfig found: set KUBECONFIG or pass --kubeconfig FILE (and --context "
            "NAME to pick a context); inside a Pod, runguard uses its ServiceAccount's token"
        )
    return f"{text} (check --kubeconfig, KUBECONFIG and --context)"


FIELD_MANAGER = "runguard-audit"


# A report written whole by server-side apply, its answer read raw (``release``).
SERVER_SIDE_APPLY: dict[str, Any] = {
    "field_manager": FIELD_MANAGER,
    "force": True,
    "_content_type": "application/apply-patch+yaml",
    "_preload_content": False,
    "_request_timeout": REQUEST_TIMEOUT,
}


class Progress:
    """One line on a terminal, rewritten in place."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def show(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r\x1b[Krunguard audit: {text} ({elapsed:.0f}s)")
        self.stream.flush()

    def clear(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


def say(progress: Progress | None, message: str) -> None:
    """A line on stderr for the log, under the progress line when there is one."""
    if progress is not None:
        progress.clear()
    print(f"runguard audit: {message}", file=sys.stderr)


def dump_reports(reports: Iterable[dict[str, Any]], out: TextIO) -> None:
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: several times faster
    for i, report in enumerate(reports):
        if i:
            out.write("---\n")
        yaml.dump(report, out, Dumper=dumper, sort_keys=False)
