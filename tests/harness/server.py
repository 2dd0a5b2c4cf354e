"""A real ``runguard serve`` (gunicorn over TLS) on a free local port, and its fixtures.

``start_runguard(...)`` starts one with a throwaway CA and serving certificate for
127.0.0.1, a temporary copy of a policy directory (the repository's ``policies/`` by
default) and its own metrics directory; every server is stopped (SIGTERM, then SIGKILL
after a bounded wait) when the test ends. ``runguard_server`` is one such server shared
by a test module.

``AtomicDir`` lays out a directory the way the kubelet mounts a ConfigMap or Secret
(``..data`` symlink to a timestamped directory, one visible symlink per key) and
updates it the same way, by renaming a new ``..data`` over the old one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .certs import TestCA
from .inputs import REPO, admission_review, policy_files
from .polling import eventually

START_TIMEOUT = 30.0
STOP_TIMEOUT = 40.0


# ------------------------------------------------------------ kubelet-style volumes


class AtomicDir:
    """A directory updated the way the kubelet updates ConfigMap and Secret volumes."""

    def __init__(self, path: Path, files: Mapping[str, bytes | str]) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.update(files)

    def update(self, files: Mapping[str, bytes | str]) -> None:
        """Write a new ``..<timestamp>`` directory and swap ``..data`` onto it atomically."""
        stamp = self.path / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
        stamp.mkdir()
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            (stamp / name).write_bytes(data)
        data_link = self.path / "..data"
        old = os.readlink(data_link) if data_link.is_symlink() else None
        tmp_link = self.path / "..data_tmp"
        tmp_link.symlink_to(stamp.name)
        os.replace(tmp_link, data_link)
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        for entry in self.path.iterdir():  # keys that are gone
            if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in files:
                entry.unlink()
        if old is not None:
            shutil.rmtree(self.path / old)


# ------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RunguardServer:
    """A ``runguard serve`` subprocess and the means to talk to it."""

    def __init__(
        self,
        base: Path,
        *,
        policy: Path | Mapping[str, str] | None = None,
        workers: int = 2,
        env: Mapping[str, str] | None = None,
        atomic: bool = False,
        gunicorn_conf: bool = False,
    ) -> None:
        self.base = base
        self.ca = TestCA()
        self.ca_file = base / "ca.crt"
        self.ca_file.write_bytes(self.ca.pem)
        cert, key, self.serial = self.ca.issue()
        files = policy_files(policy)
        if atomic:
            self.policy_volume: AtomicDir | None = AtomicDir(base / "policy", files)
            self.cert_volume: AtomicDir | None = AtomicDir(
                base / "tls", {"tls.crt": cert, "tls.key": key}
            )
        else:
            self.policy_volume = self.cert_volume = None
            (base / "policy").mkdir()
            for name, text in files.items():
                (base / "policy" / name).write_text(text)
            (base / "tls").mkdir()
            (base / "tls" / "tls.crt").write_bytes(cert)
            (base / "tls" / "tls.key").write_bytes(key)
        self.policy_dir = base / "policy"
        self.cert_file = base / "tls" / "tls.crt"
        self.key_file = base / "tls" / "tls.key"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.stdout_path = base / "stdout.log"
        self.stderr_path = base / "stderr.log"
        self.workers = workers
        self.gunicorn_conf = gunicorn_conf
        self._env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self._sessions: list[requests.Session] = []

    # -- lifecycle

    def start(self) -> RunguardServer:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RUNGUARD_") and k != "PROMETHEUS_MULTIPROC_DIR"
        }
        env.update(self._env)
        env["PYTHONPATH"] = str(REPO)
        if self.gunicorn_conf:  # plain gunicorn with the repository's configuration file
            env.update(
                RUNGUARD_POLICY_DIR=str(self.policy_dir),
                RUNGUARD_CERT_FILE=str(self.cert_file),
                RUNGUARD_KEY_FILE=str(self.key_file),
                RUNGUARD_BIND=f"127.0.0.1:{self.port}",
                RUNGUARD_WORKERS=str(self.workers),
            )
            cmd = [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py")]
        else:
            cmd = [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "-p",
                str(self.policy_dir),
                "--cert",
                str(self.cert_file),
                "--key",
                str(self.key_file),
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(self.workers),
            ]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"runguard serve exited {self.proc.returncode}:\n{self.stderr}")
            try:
                with requests.Session() as session:
                    if session.get(self.url + "/healthz", verify=self.ca_file, timeout=5).ok:
                        break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"runguard serve did not start:\n{self.stderr}")
            time.sleep(0.05)
        # every worker booted: the arbiter spawns them one after the other
        self.wait_for(lambda: len(self.worker_pids()) == self.workers, "workers booted")

    def stop(self) -> int | None:
        for session in self._sessions:
            session.close()
        self._sessions.clear()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT)
        return self.proc.returncode

    # -- processes

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> set[int]:
        """Live children of the gunicorn master (from /proc)."""
        pids = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid and fields[0] != "Z":
                pids.add(int(entry.name))
        return pids

    # -- requests

    def session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False  # REQUESTS_CA_BUNDLE would override ``verify``
        session.verify = str(self.ca_file)
        self._sessions.append(session)
        return session

    def post(
        self,
        path: str,
        body: Any,
        *,
        session: requests.Session | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10,
    ) -> requests.Response:
        session = session or self._default_session()
        if isinstance(body, dict | list) or body is None:
            data: Any = json.dumps(body)
            hdrs = {"Content-Type": "application/json", **(headers or {})}
        else:  # bytes, str or an iterator of chunks, sent as they are
            data = body
            hdrs = dict(headers or {})
        return session.post(self.url + path, data=data, headers=hdrs, timeout=timeout)

    def get(self, path: str, *, session: requests.Session | None = None) -> requests.Response:
        return (session or self._default_session()).get(self.url + path, timeout=10)

    def review(self, path: str, obj: Any, **fields: Any) -> dict[str, Any]:
        """POST an AdmissionReview for ``obj``; the ``response`` of the answer."""
        resp = self.post(path, admission_review(obj, **fields))
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
        response: dict[str, Any] = out["response"]
        return response

    def _default_session(self) -> requests.Session:
        if not self._sessions:
            self.session()
        return self._sessions[0]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``/metrics`` samples keyed by (name, sorted labels)."""
        resp = self.get("/metrics")
        assert resp.status_code == 200
        out = {}
        for family in text_string_to_metric_families(resp.text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    # -- output

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def audit_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
        """``eventually`` (every 0.05 s), failing with the server's stderr."""
        try:
            eventually(what, predicate, timeout, interval=0.05)
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{self.stderr[-4000:]}") from None


class Traffic:
    """Requests sent from ``threads`` threads until stopped, bounded in count and time.

    ``send(session)`` makes one request and returns what the test wants to keep (it
    raises, or returns a failed response, for a failure). Each thread keeps its own
    session, so its connection stays alive across requests unless ``fresh`` is set.
    """

    def __init__(
        self,
        server: RunguardServer,
        send: Callable[[requests.Session], Any],
        *,
        threads: int = 4,
        max_requests: int = 20_000,
        max_seconds: float = 60.0,
        fresh: bool = False,
    ) -> None:
        self.server = server
        self.send = send
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.fresh = fresh
        self.results: list[Any] = []
        self.errors: list[BaseException] = []
        self._issued = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.max_seconds + 30)

    @property
    def count(self) -> int:
        return len(self.results) + len(self.errors)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        session = None
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with self._lock:
                    if self._issued >= self.max_requests:
                        break
                    self._issued += 1
                if session is None or self.fresh:
                    if session is not None:
                        session.close()
                    session = requests.Session()
                    session.trust_env = False
                    session.verify = str(self.server.ca_file)
                try:
                    result = self.send(session)
                except Exception as exc:  # recorded for the test to assert on
                    with self._lock:
                        self.errors.append(exc)
                else:
                    with self._lock:
                        self.results.append(result)
        finally:
            if session is not None:
                session.close()


@pytest.fixture
def start_runguard(tmp_path: Path) -> Iterator[Callable[..., RunguardServer]]:
    """Start ``runguard serve`` servers; each is stopped at the end of the test."""
    servers: list[RunguardServer] = []

    def start(**options: Any) -> RunguardServer:
        base = tmp_path / f"server{len(servers)}"
        base.mkdir()
        server = RunguardServer(base, **options)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def runguard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunguardServer]:
    """One ``runguard serve`` (2 workers, the repository's policies) for a test module."""
    server = RunguardServer(tmp_path_factory.mktemp("runguard"))
    server.start()
    yield server
    server.stop()
