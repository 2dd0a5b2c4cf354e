"""The watch: each kind listed, then watched, on the apiserver, metadata only, into a
``Publisher``. With ``api.py`` (the requests, metadata only; discovery; errors), the
only modules of runguard that talk to Kubernetes; here the backoff and relists, so a
reader sees at a glance that nothing else is asked and nothing else is read.

Runs in a process of its own (``python -m webhook.watches.clusterstate --dir DIR``),
started and restarted by the gunicorn master (``process.py``): the ``kubernetes``
package costs ~33 MB per process that imports it, so neither the master nor the
workers ever do.

Per kind, one thread, as client-go's reflector does:

* **list** in pages (``limit``/``continue``), then **watch** from the list's
  ``resourceVersion`` (bookmarks on; the server ends each watch after 5-10 minutes and
  the next one resumes where it stopped);
* **410 Gone** (on a watch, an expired ``continue``, or a resume from a version the
  apiserver no longer has) lists again into a new base;
* any other error (connection, timeout, a 5xx, a 403 while RBAC is missing) backs off
  (0.5 s doubling to 30 s) and resumes the watch from the last version seen; three in a
  row list again;
* a restarted watch process resumes from the version the previous one published.

Operators' custom resources (``--operator-kinds argoproj.io/Workflow,...``, the
publication's operator slots) are watched the same way once found through discovery
(``api.discover``: ``GET /apis/GROUP`` for the preferred version, ``GET /apis/GROUP/VERSION``
for the resource of that kind). A kind the apiserver does not serve (its CRD not
installed yet), or that runguard may not list (403: RBAC not granted), is said in the
log, marked in its slot (it does not hold ``/readyz`` back; decisions needing it fail
closed) and looked up again with the same backoff; once it is there it is listed and
watched. A 404 later (the CRD removed) looks it up again. A core kind an operator owns
Pods through (``Pod``, ``OPERATOR_CORE_KINDS``) needs no discovery, and only the objects
with runguard's RunPolicy label are listed and watched (``labelSelector``): the Pods
runguard governs, not every Pod of the cluster.

Every request asks for ``PartialObjectMetadata`` (list: ``PartialObjectMetadataList``)
and for nothing else, so the apiserver answers with metadata or with an error, never
with a Secret's ``data`` (but for ``SPEC_KINDS``, read whole: runguard's own
ProjectProfiles and the ResourceClaimTemplates, whose spec the engine decides with, and
run Pods and ResourceClaims, of which only the devices they ask for are kept,
``model.device_spec``); the JSON is decoded straight into records
(``meta_from_object``), which drop the ``last-applied-configuration`` annotation where
``kubectl apply`` copies a whole manifest. Logs name kinds, counts and versions, never
an object's content.
"""

from __future__ import annotations

import ctypes
import logging
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from webhook.clusterstate.api import (
    LIST_ACCEPT,
    MAX_MESSAGE,
    READ_TIMEOUT,
    WATCH_ACCEPT,
    Api,
    ApiError,
    Gone,
    NotInstalled,
    Resource,
    discover,
    resource_path,
)
from webhook.clusterstate.model import (
    DEVICE_CLAIMS,
    KINDS,
    OPERATOR_CORE_KINDS,
    PROJECT_PROFILES,
    SPEC_KINDS,
    ClusterStateError,
    meta_from_object,
    split_group_kind,
)
from webhook.clusterstate.publication import (
    DELETE,
    FAILING,
    FORBIDDEN,
    NOT_INSTALLED,
    PUT,
)
from webhook.clusterstate.table import Record, encode_record
from webhook.clusterstate.writer import KindPublisher, Publisher

__all__ = ["KindWatch", "Watcher"]

log = logging.getLogger("runguard.clusterstate")

PAGE_SIZE = 500
WATCH_SECONDS = (300, 600)  # the server ends a watch after a random time in this range
BACKOFF = (0.5, 30.0)
ERRORS_BEFORE_RELIST = 3
MAX_LINE = 16 * 1024 * 1024  # one watch event; more is a broken stream


class KindWatch:
    """List and watch one kind into its ``KindPublisher``, in a thread, until stopped;
    an operator's kind ("GROUP/Kind") once discovery finds where it is served."""

    def __init__(
        self,
        api: Api,
        publisher: KindPublisher,
        stop: threading.Event,
        *,
        page_size: int = PAGE_SIZE,
        watch_seconds: tuple[int, int] = WATCH_SECONDS,
        resume: bool = True,
    ) -> None:
        self.api = api
        self.publisher = publisher
        self.kind = publisher.kind
        self.operator = self.kind not in KINDS
        self.path = "" if self.operator else resource_path(self.kind)  # "": discover first
        self.selector = ""  # a labelSelector narrowing what is listed and watched
        # metadata only, but of a kind whose spec the engine reads (a project's profile,
        # the devices a run Pod or a claim asks for)
        full = publisher.table_kind in SPEC_KINDS
        self.list_accept = "application/json" if full else LIST_ACCEPT
        self.watch_accept = "application/json" if full else WATCH_ACCEPT
        if self.kind in OPERATOR_CORE_KINDS:
            self.find()
        self.page_size = page_size
        self.watch_seconds = watch_seconds
        self.resume = resume
        self._stop = stop
        self._response: Any = None  # the watch being read, shut down by interrupt()
        self.version: str | None = None  # the resourceVersion published last (None: list)
        self.thread = threading.Thread(target=self.run, name=f"watch-{self.kind}", daemon=True)

    def run(self) -> None:
        self.version = self.publisher.resume() if self.resume else None
        if self.version is not None:
            log.info("%s: resuming the watch at resourceVersion %s", self.kind, self.version)
        errors = 0
        while not self._stop.is_set():
            try:
                if not self.path:
                    self.find()
                if self.version is None:
                    self.version = self.list_all()
                self.watch(self.version)
                errors = 0
            except Gone as exc:
                log.info("%s: %s; listing again", self.kind, exc)
                self.version = None
            except Exception as exc:  # noqa: BLE001  # every failure is retried, never fatal
                if self._stop.is_set():
                    break
                errors += 1
                doing = "list" if self.version is None else "watch"
                if not self.path:
                    doing = "discovery"
                problem = self._problem(exc) if doing != "watch" else 0
                self.publisher.count_error(problem)
                if self.operator and isinstance(exc, ApiError) and exc.status == 404:
                    self.path = ""  # its CRD removed, or not there yet: look it up again
                if errors >= ERRORS_BEFORE_RELIST:
                    self.version = None
                pause = min(BACKOFF[1], BACKOFF[0] * 2 ** (errors - 1)) * random.uniform(0.8, 1.2)
                log.log(
                    logging.ERROR if problem == FORBIDDEN else logging.WARNING,
                    "%s: %s: %s (error %d in a row, retrying in %.1fs%s)%s",
                    self.kind,
                    doing,
                    exc if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}",
                    errors,
                    pause,
                    ", listing again" if errors >= ERRORS_BEFORE_RELIST and self.path else "",
                    self._consequence(problem),
                )
                self._stop.wait(pause)

    def find(self) -> None:
        """Where the apiserver serves this operator kind (``discover``; a core kind's is
        known, and so is the selector of what runguard keeps of it)."""
        core = OPERATOR_CORE_KINDS.get(self.kind)
        if core is not None:
            version, resource, self.selector = core
            self.path = Resource("", version, resource, namespaced=True).path
            return
        found = discover(self.api, self.kind)
        self.path = found.path
        log.info(
            "%s: served as %s.%s/%s (%s)",
            self.kind,
            found.resource,
            found.group,
            found.version,
            "namespaced" if found.namespaced else "cluster-scoped",
        )

    def _problem(self, exc: Exception) -> int:
        """Why an operator kind cannot be listed (0: a built-in kind, or no reason)."""
        if not self.operator:
            return 0
        if isinstance(exc, NotInstalled) or (isinstance(exc, ApiError) and exc.status == 404):
            return NOT_INSTALLED
        if isinstance(exc, ApiError) and exc.status == 403:
            return FORBIDDEN
        return FAILING

    def _consequence(self, problem: int) -> str:
        """What a problem of an operator kind means, for the log line."""
        if not problem:
            return ""
        name = self.publisher.table_kind
        fails = f"; Pods owned by {name} objects fail closed (ownership.unknown) until it is listed"
        if self.kind == DEVICE_CLAIMS:
            fails = "; Pods naming an existing ResourceClaim fail closed (ownership.unknown)"
            if problem == NOT_INSTALLED:  # no Pod names one on such an apiserver
                return f" (dynamic resource allocation off, or before 1.34){fails}"
        if self.kind == PROJECT_PROFILES:
            fails = "; runs name installation-wide profiles only"
            if problem == NOT_INSTALLED:  # the policy-objects component is not installed
                return f" (its CRD not installed){fails}"
        if problem == NOT_INSTALLED:
            return f"; is its CustomResourceDefinition installed?{fails}"
        if problem == FORBIDDEN:
            group = split_group_kind(self.kind)[0] or 'core ("")'
            resource = self.path.rsplit("/", 1)[-1] or f"<plural of {name}>"
            return (
                f"; grant runguard's ServiceAccount get, list, watch on {resource} in API group "
                f"{group} (docs/operations.md, operators' kinds){fails}"
            )
        return fails

    def list_all(self) -> str:
        """List every object into a new base; the list's resourceVersion."""
        started = time.monotonic()
        relist = bool(self.publisher.slot.synced)
        pages = _Pages(self)
        count = self.publisher.replace(pages, lambda: pages.version, relist=relist)
        _release_memory()
        log.info(
            "%s: %d listed in %.2fs (%d pages) at resourceVersion %s",
            self.kind,
            count,
            time.monotonic() - started,
            pages.count,
            pages.version,
        )
        return pages.version

    def watch(self, version: str) -> None:
        """Watch from ``version`` until the server ends the watch (or ``interrupt()``);
        ``self.version`` follows what is published, so a failure resumes from there."""
        seconds = random.randint(*self.watch_seconds)
        query = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        if self.selector:
            query["labelSelector"] = self.selector
        response = self.api.get(self.path, query, self.watch_accept, seconds + 30)
        self._response = response
        try:
            pending = b""
            for chunk in response.stream(65536, decode_content=True):
                if self._stop.is_set():
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > MAX_LINE:
                    raise ApiError(0, f"a watch event over {MAX_LINE} bytes")
                version = self._take(lines, version)
                self.version = version
        finally:
            self._response = None
            response.release_conn()

    def _take(self, lines: list[bytes], version: str) -> str:
        """Apply the events of ``lines`` as one batch; the resourceVersion after them."""
        changes: list[tuple[int, Record]] = []
        error: ApiError | None = None
        for line in lines:
            if not line.strip():
                continue
            event = orjson.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                message = str(obj.get("message", ""))[:MAX_MESSAGE]
                code = int(obj.get("code") or 0)
                error = (Gone if code == 410 else ApiError)(code, message)
                break
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                record = self._record(obj)
                if record is not None:
                    changes.append((DELETE if kind == "DELETED" else PUT, record))
        if changes:
            self.publisher.apply(changes, version)
        elif lines:
            self.publisher.bookmark(version)
        if error is not None:
            raise error
        return version

    def _record(self, obj: Any) -> Record | None:
        try:
            return encode_record(meta_from_object(obj, self.publisher.table_kind))
        except ClusterStateError as exc:
            log.warning("%s: an object skipped: %s", self.kind, exc)
            return None

    def interrupt(self) -> None:
        """Unblock a watch waiting for the next event (on stop)."""
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # noqa: BLE001  # already closed: nothing to unblock
                pass


def _release_memory() -> None:
    """Give back to the system what a list freed (glibc keeps freed heap otherwise: at
    100k objects, ~70 bytes an object stay resident, ~27 after this)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


class _Pages:
    """The records of a paged list, fetched as they are consumed; ``version`` is the
    list's resourceVersion once the first page is in."""

    def __init__(self, watch: KindWatch) -> None:
        self.watch = watch
        self.version = ""
        self.count = 0

    def __iter__(self) -> Iterator[Record]:
        token = ""
        while True:
            query = {"limit": str(self.watch.page_size)}
            if self.watch.selector:
                query["labelSelector"] = self.watch.selector
            if token:
                query["continue"] = token
            response = self.watch.api.get(
                self.watch.path, query, self.watch.list_accept, READ_TIMEOUT
            )
            try:
                page = orjson.loads(response.read())
            finally:
                response.release_conn()
            self.count += 1
            metadata = page.get("metadata") or {}
            self.version = self.version or metadata.get("resourceVersion") or ""
            for item in page.get("items") or ():
                record = self.watch._record(item)
                if record is not None:
                    yield record
            del page
            token = metadata.get("continue") or ""
            if not token:
                return
            if self.watch._stop.is_set():
                raise ApiError(0, "stopped while listing")


class Watcher:
    """Every kind of ``kinds`` listed and watched, one thread each, into ``publisher``
    (by default ``KINDS`` and the operator kinds ``publisher`` has slots for)."""

    def __init__(
        self,
        api: Api,
        publisher: Publisher,
        kinds: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        self.publisher = publisher
        self._stop = threading.Event()
        if kinds is None:
            kinds = (*KINDS, *publisher.operator_kinds)
        self.kinds = {
            kind: KindWatch(api, publisher.kinds[kind], self._stop, **options) for kind in kinds
        }

    def start(self) -> None:
        for watch in self.kinds.values():
            watch.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for watch in self.kinds.values():
            watch.interrupt()
        deadline = time.monotonic() + timeout
        for watch in self.kinds.values():
            watch.thread.join(max(0.0, deadline - time.monotonic()))

    def synced(self) -> bool:
        return all(watch.publisher.slot.synced for watch in self.kinds.values())
