"""A Platform's keys: who the platform is (identities, controllers, operators, queues,
installers, project label), and what the engine derives from them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field

from webhook.policy.declare import UNIQUE, Section
from webhook.policy.formats import LabelKey
from webhook.policy.model.fields import (
    Capability,
    Identity,
    NamePatterns,
    ReservedLabel,
)

_KCM = "system:serviceaccount:kube-system:"
# The identity of each kube-controller-manager controller that creates Pods or pod
# controllers (``--use-service-account-credentials``), and the kind it owns them through.
KCM_CONTROLLERS: Mapping[str, str] = {
    f"{_KCM}job-controller": "batch/Job",
    f"{_KCM}cronjob-controller": "batch/CronJob",
    f"{_KCM}replicaset-controller": "apps/ReplicaSet",
    f"{_KCM}deployment-controller": "apps/Deployment",
    f"{_KCM}statefulset-controller": "apps/StatefulSet",
    f"{_KCM}daemon-set-controller": "apps/DaemonSet",
    f"{_KCM}replication-controller": "ReplicationController",
}
# ``GROUP/Kind`` as in an ownerReferences' apiVersion (without version) and kind. Of the
# core group only ``Pod`` (a Spark driver Pod owns its executors): the one core kind
# runguard's cache keeps for operators (``webhook.clusterstate.model.OPERATOR_CORE_KINDS``).
GroupKind = Annotated[
    str, Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Z][A-Za-z0-9]*|Pod)$")
]


# Where a field is in an operator's object: keys joined by ".", ``[KEY]`` for a map key
# that holds dots or slashes (a label key), ``[*]`` for every item of a list.
ReferencePath = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*|\[[^\[\]]+\])*$",
        max_length=512,
    ),
]
_PATH_STEP = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_-]*)|\[([^\[\]]+)\]")


def _steps(path: str) -> tuple[str, ...]:
    """The keys of a ``ReferencePath`` in order, ``*`` for every item."""
    return tuple(m.group(1) or m.group(2) for m in _PATH_STEP.finditer(path))


class OperatorReference(Section):
    """A field of an operator's objects that names or selects another object, which the
    operator then acts on for the object (KubeRay submits a RayJob's entrypoint to the
    RayCluster its ``spec.clusterSelector`` names)."""

    kind: GroupKind = Field(
        description="GROUP/Kind of the objects that hold the field: one of the operator's kinds."
    )
    path: ReferencePath = Field(
        description="Where the field is: keys joined by '.', [KEY] for a map key with dots or "
        "slashes (spec.clusterSelector[ray.io/cluster]), [*] for every item of a list.",
    )
    names: GroupKind = Field(
        description="GROUP/Kind of the objects it names or selects: a kind of the platform's "
        "operators (runguard records who created those and its cache keeps them).",
    )
    by: Literal["name", "selector"] = Field(
        description="name: the field's value is the object's name; selector: a label selector "
        "(matchLabels/matchExpressions, or a plain map of labels) over those objects.",
    )

    @cached_property
    def steps(self) -> tuple[str, ...]:
        """The keys of ``path`` in order, ``*`` for every item of a list."""
        return _steps(self.path)


class OperatorTemplates(Section):
    """Where one of an operator's kinds holds the pod templates its Pods are made from, and
    the flag that suspends it: ``/mutate`` applies the profile to each template at CREATE,
    since a queue (Kueue) counts the object by them before any Pod exists."""

    kind: GroupKind = Field(description="GROUP/Kind of the objects: one of the operator's kinds.")
    paths: Annotated[tuple[ReferencePath, ...], UNIQUE] = Field(
        min_length=1,
        description="Each pod template (metadata and spec): keys joined by '.', [*] for every "
        "item of a list or value of a map (spec.rayClusterSpec.workerGroupSpecs[*].template, "
        "spec.pytorchReplicaSpecs[*].template).",
    )
    suspend: ReferencePath | None = Field(
        default=None,
        description="The boolean that holds the object back for a queue (spec.suspend, Kubeflow's "
        "spec.runPolicy.suspend): set true with a queue profile's label.",
    )

    @cached_property
    def steps(self) -> tuple[tuple[str, ...], ...]:
        """The keys of each path in order, ``*`` for every item or value."""
        return tuple(_steps(path) for path in self.paths)

    @cached_property
    def suspend_steps(self) -> tuple[str, ...] | None:
        return _steps(self.suspend) if self.suspend is not None else None


class Operator(Section):
    """A controller that creates the platform's Pods (or pod controllers) from its own
    objects: its identity, and the kinds it owns them through (by ownerReferences)."""

    identity: Identity = Field(description="Who the operator acts as.")
    kinds: Annotated[tuple[GroupKind, ...], UNIQUE] = Field(
        min_length=1,
        description="GROUP/Kind of the objects whose Pods it creates (argoproj.io/Workflow); "
        "Pod for Pods that create Pods (a Spark driver its executors, as the sparkapp account): "
        "runguard's cache then keeps the metadata of the Pods it governs.",
    )
    config_maps: NamePatterns = Field(
        default=(),
        description="ConfigMaps the operator makes for the Pods it creates (the mpi-operator's "
        "{labels[mlrun/job]}-config): used only by Pods it creates for the platform's objects; "
        "not reserved names, since the operator, not the platform, creates them.",
    )
    allowed_capabilities: frozenset[Capability] = Field(
        default=frozenset(),
        description="Capabilities the containers of Pods it creates for the platform's objects "
        "may add (MLRun's IPC_LOCK for MPI), besides security.allowedCapabilities and beyond "
        "the Pod Security level; nobody else's Pods.",
    )
    reserved_labels: Annotated[tuple[ReservedLabel, ...], UNIQUE] = Field(
        default=(),
        description="Labels the operator keys on to find an object's owner (the spark-operator's "
        "sparkoperator.k8s.io/app-name): a label key, or a prefix ending in '/'. Only the "
        "platform and the operator may write them anywhere in a custom resource of its kinds "
        "(labels maps, and keys that end with them, e.g. a sparkConf "
        "spark.kubernetes.driver.label.KEY); anyone else's is ownership.reserved-label.",
    )
    templates: tuple[OperatorTemplates, ...] = Field(
        default=(),
        description="Where its kinds hold pod templates: a run's get the profile at CREATE, "
        "as a Job's template does (what a queue counts); the Pods made from them then have "
        "nothing left to change, and are judged as any Pod.",
    )
    references: tuple[OperatorReference, ...] = Field(
        default=(),
        description="Fields of its objects that name or select another object it then acts on "
        "for them (KubeRay's RayJob spec.clusterSelector, a RayCluster by name): anyone but "
        "the platform and the operator naming an object the platform created through one is "
        "ownership.reference.",
    )


class QueueController(Section):
    """A queue controller (Kueue) that admits the platform's runs: it starts and stops
    them and places them on the flavor it chose, and nothing else of what they run."""

    identity: Identity = Field(description="Who the queue controller acts as.")
    queue_label: LabelKey = Field(
        default="kueue.x-k8s.io/queue-name",
        description="The label naming a run's queue: once it is set, only the queue starts "
        "the run (unsuspends it) or lifts its scheduling gates, and nobody changes the label.",
    )
    prefixes: Annotated[tuple[ReservedLabel, ...], UNIQUE] = Field(
        default=("kueue.x-k8s.io/",),
        min_length=1,
        description="Keys of the labels, annotations and scheduling gates the queue writes on "
        "the objects it starts (a key, or a prefix ending in '/'): it may add, change and remove "
        "them in pod templates; removing such a gate is the queue's alone.",
    )
    reserved_labels: Annotated[tuple[ReservedLabel, ...], UNIQUE] = Field(
        default=("kueue.x-k8s.io/podset", "kueue.x-k8s.io/prebuilt-workload-name"),
        description="Labels only the queue, the platform and its controllers may write on a run "
        "or its pod templates (Kueue finds a run's Workload by them).",
    )


class PlatformConfig(Section):
    """Who the platform is: ownership of its volumes and secrets. A Platform document's
    spec, written once for every RunPolicy that names it (``platform: NAME``)."""

    identities: Annotated[tuple[Identity, ...], UNIQUE] = Field(
        default=(),
        description="Who the platform acts as: a user name, group:NAME or "
        "serviceaccount:NAMESPACE:NAME. Set: only runs they create use platform-named claims, "
        "configMaps and secrets; absent: names decide.",
    )
    controllers: Annotated[tuple[Identity, ...], UNIQUE] = Field(
        default=tuple(KCM_CONTROLLERS),
        description="Kubernetes controllers whose objects are the platform's when their "
        "controller owner, found by uid, was the platform's when it was created.",
    )
    operators: tuple[Operator, ...] = Field(
        default=(),
        description="Operators (Argo, KubeRay, ...): an identity and the kinds it owns Pods "
        "through; their objects are stamped at creation like pod controllers.",
    )
    queues: tuple[QueueController, ...] = Field(
        default=(),
        description="Queue controllers (Kueue) that start and stop the platform's runs: they may "
        "unsuspend and suspend them, add the flavor's node selector and tolerations to their pod "
        "templates, and write their own labels, annotations and scheduling gates; never what "
        "the runs run.",
    )
    installers: Annotated[tuple[Identity, ...], UNIQUE] = Field(
        default=("group:system:masters",),
        description="Who else may create objects with installation-wide platform names "
        "(the platform's chart): besides the identities.",
    )
    project_label: LabelKey | None = Field(
        default=None,
        description="Label naming a run's project: a claim with the run's value is a "
        "project-shared volume of the project's platform runs.",
    )

    @cached_property
    def owner_kinds(self) -> Mapping[str, frozenset[str]]:
        """identity -> the GROUP/Kinds it owns objects through."""
        out: dict[str, set[str]] = {}
        for identity in self.controllers:
            default = KCM_CONTROLLERS.get(_username(identity))
            out.setdefault(_username(identity), set()).update(
                [default] if default else set(KCM_CONTROLLERS.values())
            )
        for operator in self.operators:
            out.setdefault(_username(operator.identity), set()).update(operator.kinds)
        return {k: frozenset(v) for k, v in out.items()}

    @cached_property
    def operator_kinds(self) -> frozenset[str]:
        return frozenset(k for o in self.operators for k in o.kinds)

    @cached_property
    def templates(self) -> Mapping[str, OperatorTemplates]:
        """GROUP/Kind -> where its objects hold pod templates (the first entry naming it)."""
        out: dict[str, OperatorTemplates] = {}
        for operator in self.operators:
            for entry in operator.templates:
                out.setdefault(entry.kind, entry)
        return out

    @cached_property
    def references(self) -> Mapping[str, tuple[tuple[Operator, OperatorReference], ...]]:
        """GROUP/Kind -> (operator, reference) of each field of that kind's objects that
        names or selects another object."""
        out: dict[str, list[tuple[Operator, OperatorReference]]] = {}
        for operator in self.operators:
            for reference in operator.references:
                out.setdefault(reference.kind, []).append((operator, reference))
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def operators_by_user(self) -> Mapping[str, Operator]:
        """user name -> the operator acting as it (a group identity names no creator)."""
        return {
            _username(o.identity): o for o in self.operators if not o.identity.startswith("group:")
        }


def _username(identity: str) -> str:
    """The user name an identity of a user or a service account is."""
    if identity.startswith("serviceaccount:"):
        return "system:" + identity
    return identity
