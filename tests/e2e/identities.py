"""Who the apiserver (and so runguard) sees as the requester: a ServiceAccount with a
token from the TokenRequest API, or a user with a client certificate (CN the name, O
each group), each bound to a ClusterRole and given its own kubeconfig.

``Identities`` is the part of ``Cluster`` that makes them; ``Identity`` is one of them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .clients import Clients
from .pki import issue_client_cert

__all__ = ["Identities", "Identity"]


class Identities(Clients):
    """The identities of a ``Cluster``, kept in its ``identities/`` folder."""

    def service_account(
        self,
        namespace: str,
        name: str,
        *,
        cluster_role: str | None = "edit",
        duration: str = "24h",
    ) -> Identity:
        """``system:serviceaccount:NAMESPACE:NAME``, as a platform running in the cluster
        is seen: the namespace and ServiceAccount are created if missing, ``cluster_role``
        is bound to it cluster-wide, and its kubeconfig carries a token from the
        TokenRequest API (``kubectl create token``)."""
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": name, "namespace": namespace}}  # fmt: skip
        space = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        listed = {"apiVersion": "v1", "kind": "List", "items": [space, account]}
        self.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        username = f"system:serviceaccount:{namespace}:{name}"
        if cluster_role is not None:
            subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
            self._bind(cluster_role, username, subject)
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}", check=True
        ).stdout.strip()
        path = self._identity_dir() / f"{_slug(username)}.kubeconfig"
        self._user_kubeconfig(path, _slug(username), {"token": token}, namespace)
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                  "system:authenticated")  # fmt: skip
        return Identity(self, username, groups, path)

    def user(
        self, name: str, groups: Sequence[str] = (), *, cluster_role: str | None = "edit"
    ) -> Identity:
        """User ``name`` in ``groups``, with a client certificate signed by the cluster's
        CA (CN=name, O=each group); ``cluster_role`` is bound to it cluster-wide."""
        if cluster_role is not None:
            self._bind(cluster_role, name, {"kind": "User", "name": name})
        path = self._identity_dir() / f"{_slug(name)}.kubeconfig"
        issue_client_cert(
            self.pki, path.with_suffix(".crt"), path.with_suffix(".key"), name, groups
        )
        self._user_kubeconfig(
            path,
            _slug(name),
            {"client-certificate": str(path.with_suffix(".crt")),
             "client-key": str(path.with_suffix(".key"))},
        )  # fmt: skip
        return Identity(self, name, (*groups, "system:authenticated"), path)

    def _identity_dir(self) -> Path:
        directory = self.directory / "identities"
        directory.mkdir(exist_ok=True)
        return directory

    def _bind(self, cluster_role: str, username: str, subject: dict[str, str]) -> None:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"runguard-e2e:{cluster_role}:{_slug(username)}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": cluster_role},
            "subjects": [subject if subject["kind"] == "ServiceAccount"
                         else {**subject, "apiGroup": "rbac.authorization.k8s.io"}],
        }  # fmt: skip
        self.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)

    # -- audit --


@dataclass(frozen=True)
class Identity:
    """Someone the apiserver authenticates (``Cluster.service_account`` or
    ``Cluster.user``): the user name and groups it sees, and a kubeconfig to act as them.
    """

    cluster: Clients
    username: str
    groups: tuple[str, ...]
    kubeconfig: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as this identity."""
        return self.cluster.kubectl(
            *args, input=input, check=check, timeout=timeout, kubeconfig=self.kubeconfig
        )

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` acting as this identity (close it after use)."""
        return self.cluster.api_client(self.kubeconfig)


def _slug(name: str) -> str:
    """A user name as a file or object name: ``system:serviceaccount:a:b`` -> ``...-a-b``."""
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")
