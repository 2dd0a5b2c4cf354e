"""The ``kubernetes`` client's configuration for a cluster runguard reads from.

``in-cluster`` (the Pod's ServiceAccount) or the path of a kubeconfig file (its current
context): the two sources ``--cluster-state`` takes, for the watch process
(``webhook.clusterstate.api``) and for the Pod a shell opens into (``webhook.serving.shells``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["IN_CLUSTER", "configuration"]

IN_CLUSTER = "in-cluster"  # a source: the Pod's own ServiceAccount, not a kubeconfig file


def configuration(source: str) -> Any:
    """A ``kubernetes.client.Configuration`` for ``source``."""
    from kubernetes import client, config

    out = client.Configuration()
    if source == IN_CLUSTER:
        config.load_incluster_config(client_configuration=out)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(config_file=source, client_configuration=out)  # type: ignore[no-untyped-call]
    return out
