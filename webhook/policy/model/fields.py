"""The value types keys share: identities, capabilities, label keys, name patterns, ..."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from webhook.policy.declare import UNIQUE
from webhook.policy.formats import NamePatternText

StripOrDeny = Literal["Strip", "Deny"]
PreemptionMode = Literal["allow", "constrain", "prevent", "none"]
PREEMPTION_MODES: tuple[str, ...] = get_args(PreemptionMode)
VolumeType = Literal[
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
    "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk",
    "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim",
    "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret",
    "storageos", "vsphereVolume",
]  # fmt: skip
Id = Annotated[int, Field(ge=1, le=2147483647)]
Capability = Annotated[str, Field(min_length=1)]
# A label key, or a label prefix ending in "/" (every key under it).
ReservedLabel = Annotated[
    str,
    Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$|^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        max_length=317,
    ),
]
EnvName = Annotated[str, Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
NamePatterns = Annotated[tuple[NamePatternText, ...], UNIQUE]
# The apiserver puts this ConfigMap (the cluster's CA bundle) in every namespace and
# projects it into every Pod's service account token volume.
ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
# A user name, ``group:NAME`` (a group of the requester) or ``serviceaccount:NS:NAME``.
Identity = Annotated[str, Field(min_length=1)]
