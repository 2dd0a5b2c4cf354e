"""The cluster state runguard decides with: metadata of claims, secrets, configMaps,
priority and runtime classes, and pod controllers.

The interface (``ClusterState``, ``Meta``) and the offline state (``StaticClusterState``)
are pure and cheap to import; the engine needs nothing else. Online, a watch process
keeps the state (``watch.py``, over ``api.py``, the only module that talks to Kubernetes)
and publishes it in shared files every gunicorn worker maps (``publication.py`` their
protocol, ``writer.py`` and ``reader.py`` its two sides); ``docs/dev/server.md`` says why.
"""

from webhook.clusterstate.model import (
    CLUSTER_SCOPED,
    CONTROLLER_KINDS,
    KINDS,
    ClusterState,
    ClusterStateError,
    KindStats,
    Meta,
    OwnerRef,
    controller_chain,
    meta_from_object,
)
from webhook.clusterstate.static import StaticClusterState

__all__ = [
    "CLUSTER_SCOPED",
    "CONTROLLER_KINDS",
    "KINDS",
    "ClusterState",
    "ClusterStateError",
    "KindStats",
    "Meta",
    "OwnerRef",
    "StaticClusterState",
    "controller_chain",
    "meta_from_object",
]
