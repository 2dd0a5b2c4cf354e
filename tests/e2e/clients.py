"""Talking to the e2e cluster: kubectl, the ``kubernetes`` client and plain GETs as
cluster-admin (or as the user of a kubeconfig), the kubeconfigs themselves, and the
apiserver's audit log.

``Clients`` is the part of ``Cluster`` that does it.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .build import ClusterError
from .pki import Pki, issue_client_cert, write_kubeconfig
from .processes import Processes

__all__ = ["Clients"]


class Clients(Processes):
    """Clients of a ``Cluster``: as cluster-admin (``kubeconfig``, the admin certificate
    of ``pki``) unless given another kubeconfig."""

    kubectl_path: str
    pki: Pki
    audit_log: Path

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        """``GET path`` from the apiserver as cluster-admin, decoded (no kubectl: fast
        enough to poll)."""
        with urllib.request.urlopen(
            f"{self.server}{path}", context=self._admin_context(), timeout=timeout
        ) as response:
            return json.loads(response.read())

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for a kubectl (or any client) talking to this cluster, as
        cluster-admin or as the user of ``kubeconfig``."""
        return {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "KUBECACHEDIR": str(self.directory / "kube-cache"),
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # as in subprocess.run
        check: bool = False,
        timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the system kubectl against this cluster (as cluster-admin unless
        ``kubeconfig`` says otherwise); stdout and stderr captured as text."""
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(kubeconfig),
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster, as cluster-admin unless
        ``kubeconfig`` says otherwise."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))  # type: ignore[no-untyped-call]

    # -- kubeconfigs --

    def _user_kubeconfig(
        self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default"
    ) -> None:
        """A kubeconfig for this cluster whose one user presents ``credentials``."""
        write_kubeconfig(path, self.server, self.pki.ca_cert, user, credentials, namespace)

    def _client_kubeconfig(
        self, path: Path, stem: str, user: str, groups: Sequence[str] = ()
    ) -> None:
        """A client certificate for ``user`` in ``groups`` (in ``pki/``) and a kubeconfig
        presenting it."""
        cert, key = self.pki.ca_cert.parent / f"{stem}.crt", self.pki.ca_cert.parent / f"{stem}.key"
        issue_client_cert(self.pki, cert, key, user, groups)
        self._user_kubeconfig(path, stem, {"client-certificate": str(cert), "client-key": str(key)})

    # -- audit --

    def audit_events(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        stage: str | None = "ResponseComplete",
    ) -> list[dict[str, Any]]:
        """Audit events in the apiserver's log, oldest first, filtered by what is given."""
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        events = []
        for line in text.splitlines():
            if not line.strip():
                continue
            event: dict[str, Any] = json.loads(line)
            ref = event.get("objectRef", {})
            if (
                (verb is None or event.get("verb") == verb)
                and (stage is None or event.get("stage") == stage)
                and (resource is None or ref.get("resource") == resource)
                and (namespace is None or ref.get("namespace") == namespace)
                and (name is None or ref.get("name") == name)
            ):
                events.append(event)
        return events

    def wait_for_audit_event(
        self,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        *,
        timeout: float = 30.0,
        **match: str,
    ) -> dict[str, Any]:
        """The first audit event matching ``match`` and ``predicate``, polling the log."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.audit_events(**match):
                if predicate is None or predicate(event):
                    return event
            if time.monotonic() > deadline:
                raise ClusterError(f"no audit event matching {match} within {timeout:.0f}s")
            time.sleep(0.1)
