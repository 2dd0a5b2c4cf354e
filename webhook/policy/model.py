"""The policy model: each key of a RunPolicy and a Profile declared once; the Policy built of them.

Each key is one field below (type, default, description, constraints); the JSON Schema,
the defaults, lint's lists of keys and ``docs/policy-reference.md`` are generated from
these fields (``docs/dev/contributing.md``). The engine reads the result, ``Policy``, as
plain attributes: snake_case names, values precomputed at load (resource lists with
``gpu`` resolved, maximums parsed to Decimal, name patterns compiled).

Documents reach ``build_policy`` after the JSON Schema generated from this model has
checked them (``loader.py``, which reports problems as ``file:line: key: message``);
pydantic then builds the typed model from the valid data.

Longer than 400 lines on purpose: one job, the keys. Every key of both kinds is here,
one field each, so that they are read and added in one place; the module grows by a
field per key. What is not a key lives elsewhere (Kubernetes shapes in ``kube.py``,
string formats in ``formats.py``, how keys are declared in ``declare.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Field

from webhook.inputs.quantity import parse
from webhook.keys import PREEMPTION_MODE_ANNOTATION, PROFILE_LABEL
from webhook.policy.declare import UNIQUE, Section, key_path
from webhook.policy.formats import (
    HOST_PATH_PLACEHOLDER,
    LABEL_VALUE,
    DnsLabel,
    DnsSubdomain,
    HostPath,
    LabelKey,
    LabelMap,
    NamePatternText,
    ResourceName,
)
from webhook.policy.kube import (
    AffinityDict,
    EnvVarDict,
    LabelSelector,
    Metadata,
    ProfileResources,
    QuantityRange,
    ResourceList,
    ResourceRequirements,
    TolerationDict,
    resolve_resource_name,
)
from webhook.policy.patterns import NamePattern, matches_any

__all__ = [
    "API_VERSION",
    "KINDS",
    "PREEMPTION_MODES",
    "Document",
    "LabelSelector",
    "NamePattern",
    "Policy",
    "Profile",
    "POLICY_KINDS",
    "PlatformConfig",
    "PlatformName",
    "ProfileSpec",
    "ProfileValues",
    "ProjectProfileSpec",
    "RunPolicySpec",
    "build_policy",
    "with_alternatives",
    "gpu_resource_name",
    "profile_path",
    "run_policy_path",
    "matches_any",
    "resolve_resource_name",
]

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


# --- RunPolicy -------------------------------------------------------------------------


class ProfilesConfig(Section):
    """How a run names its hardware profile."""

    label: LabelKey = Field(
        default=PROFILE_LABEL, description="Label (else annotation) naming the profile."
    )
    default: str | None = Field(
        default=None, description="Profile for a run that names none; omit for none."
    )
    unknown: Literal["Deny", "Default"] = Field(
        default="Deny", description="A run naming an unknown profile: Deny it, or use the default."
    )
    sidecar_containers: Annotated[tuple[DnsLabel, ...], UNIQUE] = Field(
        default=("istio-proxy", "linkerd-proxy"),
        description="Containers add-ons inject beside a run's own (a mesh's proxy, which "
        "Linkerd puts first): never the main container the profile applies to, unless "
        "runguard.io/main-container names one.",
    )


# A device resource (domain/name) or a pattern of them, ``*`` any run of characters.
DeviceResource = Annotated[
    str,
    Field(pattern=r"^[a-z0-9*][-a-z0-9.*]*/[A-Za-z0-9*][-A-Za-z0-9_.*]*$", max_length=253),
]
Weight = Annotated[Decimal, Field(ge=0, allow_inf_nan=False)]


class DeviceFamily(Section):
    """Device resources one run may ask for together up to a maximum, each weighted (every
    MIG profile of a GPU and its shared replicas, counted in one unit: compute slices)."""

    name: DnsLabel = Field(description="How messages name the family, e.g. nvidia.")
    max: Weight = Field(
        description="Highest weighted total one run may ask for (all its containers, as the "
        "scheduler counts them), e.g. 14 compute slices; 0: none of its members."
    )
    members: Mapping[DeviceResource, Weight] = Field(
        min_length=1,
        description="Resource name, or pattern with *, to what one of it counts for "
        "(nvidia.com/gpu: 7, nvidia.com/mig-3g.40gb: 3). A resource counts with its most "
        "specific member: its exact name, else the pattern with the most characters.",
    )

    @cached_property
    def patterns(self) -> tuple[tuple[re.Pattern[str], Decimal], ...]:
        """The members with ``*``, compiled, the most specific first."""
        found = [(k, w) for k, w in self.members.items() if "*" in k]
        found.sort(key=lambda kw: -len(kw[0].replace("*", "")))
        return tuple(
            (re.compile(".*".join(re.escape(part) for part in k.split("*"))), w) for k, w in found
        )

    def weight(self, resource: str) -> Decimal | None:
        """What one of ``resource`` counts for in this family; None: not a member."""
        exact = self.members.get(resource)
        if exact is not None:
            return exact
        known = self._weights
        if resource in known:
            return known[resource]
        found = next((w for regex, w in self.patterns if regex.fullmatch(resource)), None)
        if len(known) < 1024:  # resource names are the user's: bounded
            known[resource] = found
        return found

    @cached_property
    def _weights(self) -> dict[str, Decimal | None]:
        """The answers for names matched against the patterns, kept with the family."""
        return {}


class ResourcesConfig(Section):
    """Resource defaults and limits, per container."""

    gpu_resource_name: ResourceName = Field(
        default="nvidia.com/gpu", description="What `gpu` means in profiles and maximums."
    )
    defaults: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Per container, only where the key is absent.",
    )
    memory_limit_factor: Decimal | None = Field(
        default=None, ge=1, description="No memory limit: limit = ceil(request x factor)."
    )
    maximums: ResourceList = Field(
        default_factory=dict, description="Highest request or limit allowed, per container."
    )
    on_exceed: Literal["Clamp", "Deny"] = Field(
        default="Clamp", description="Above a maximum: clamp to it, or deny."
    )
    families: tuple[DeviceFamily, ...] = Field(
        default=(),
        description="Device families, each capped per run by its weighted total: every MIG "
        "profile and shared replica of a GPU vendor, however the run spreads them.",
    )
    device_env: Annotated[tuple[EnvName, ...], UNIQUE] = Field(
        default=("NVIDIA_VISIBLE_DEVICES",),
        description="Environment variables that select devices on the node: removed where "
        "users set them (denied with security.onRoot Deny); a profile may still set them.",
    )
    platform_device_claims: NamePatterns = Field(
        default=(),
        description="Name patterns of the ResourceClaims the platform creates: only its runs "
        "may name one (resourceClaimName); any other existing claim is removed (denied with "
        "volumes.onPreExisting Deny). A run's own claims come from its templates.",
    )

    @cached_property
    def default_requests(self) -> Mapping[str, str]:
        return self.defaults.requests

    @cached_property
    def default_limits(self) -> Mapping[str, str]:
        return self.defaults.limits

    @cached_property
    def maximum_values(self) -> Mapping[str, Decimal]:
        return {name: parse(text) for name, text in self.maximums.items()}

    @cached_property
    def default_values(self) -> tuple[tuple[str, tuple[tuple[str, str, str, Decimal], ...]], ...]:
        """(part, ((resource, quantity, its warning label, amount), ...)) for the default
        requests then limits, those set: labels and amounts are the same on every run."""
        return tuple(
            (
                part,
                tuple(
                    (name, text, f"{self.short(name)} {part[:-1]} {text}", parse(text))
                    for name, text in values.items()
                ),
            )
            for part, values in (
                ("requests", self.default_requests),
                ("limits", self.default_limits),
            )
            if values
        )

    def short(self, resource: str) -> str:
        """How warnings name a resource: ``gpu`` for the gpu resource."""
        return "gpu" if resource == self.gpu_resource_name else resource


class SecurityConfig(Section):
    """No root, no privilege."""

    on_root: Literal["Strip", "Deny", "Allow"] = Field(
        default="Strip",
        description="Root: replace it, or deny; Allow (level baseline only, for the "
        "platform's image builds) leaves root and runguard's own hardening out, the Pod "
        "Security level still applies.",
    )
    run_as_user: Id | None = Field(
        default=None, description="Replaces uid 0; absent: field removed."
    )
    run_as_group: Id | None = Field(
        default=None, description="Replaces gid 0; absent: field removed."
    )
    fs_group: Id | None = Field(default=None, description="Replaces fsGroup 0; absent: removed.")
    assign_run_as_user: bool = Field(
        default=False,
        description="Set runAsUser (the pod's) to runAsUser where the run sets no uid at all, "
        "as OpenShift's restricted SCC assigns one: an image that defaults to root then starts "
        "as that user instead of being refused by the kubelet.",
    )
    seccomp_profile: Literal["RuntimeDefault", "Unconfined", "Unchanged", None] = Field(
        default="RuntimeDefault",
        description="Seccomp profile type set on the pod; Unchanged (or null): left alone. "
        "In a RunPolicy object write Unchanged: kubectl apply drops a null.",
    )
    drop_capabilities: Annotated[tuple[Capability, ...], UNIQUE] = Field(
        default=("ALL",), description="Capabilities dropped from every container."
    )
    allowed_capabilities: frozenset[Capability] = Field(
        default=frozenset(),
        description="Capabilities a container may add; others are stripped or denied.",
    )
    level: Literal["restricted", "baseline"] = Field(
        default="restricted",
        description="Pod Security Standards level every admitted run meets, as the "
        "PodSecurity admission plugin judges its latest version; a floor under the keys above.",
    )


class VolumesConfig(Section):
    """Volume types and pre-existing volumes."""

    allowed_types: frozenset[VolumeType] = Field(
        default=frozenset(
            {
                "persistentVolumeClaim",
                "emptyDir",
                "ephemeral",
                "configMap",
                "secret",
                "downwardAPI",
                "projected",
                "image",  # an OCI image, read-only (Kubernetes 1.31+; restricted allows it)
            }
        ),
        description="Volume types a run may use; others are denied.",
    )
    platform_claims: NamePatterns = Field(
        default=(), description="claimName patterns of the PVCs the platform creates."
    )
    platform_config_maps: NamePatterns = Field(
        default=(), description="ConfigMap name patterns the platform creates."
    )
    on_pre_existing: StripOrDeny = Field(
        default="Strip",
        description="A PVC/ConfigMap outside the patterns: drop it and its mounts, or deny.",
    )
    shared_config_maps: NamePatterns = Field(
        default=(ROOT_CA_CONFIG_MAP,),
        validate_default=True,
        description="Public, non-secret ConfigMaps any Pod may use, as a volume, a projected "
        "source or in its environment (a mesh's CA bundle, the cluster's kube-root-ca.crt): "
        "name patterns (* only, the same for every Pod); neither platform names nor "
        "pre-existing data, and anyone may create one.",
    )
    allowed_host_paths: Annotated[tuple[HostPath, ...], UNIQUE] = Field(
        default=(),
        description="Node paths a run the platform created may mount as hostPath volumes, "
        "exactly these ({namespace}: the run's namespace), e.g. a storage daemon's socket "
        "directory; an exception to allowedTypes and the Pod Security level, which forbid "
        "hostPath. Any other hostPath, and any in a run the platform did not create, is denied.",
    )

    def shared_config_map(self, name: str) -> bool:
        """Whether ConfigMap ``name`` is one of ``sharedConfigMaps``."""
        return matches_any(self.shared_config_maps, name, {})

    def host_path_allowed(self, path: str, namespace: str) -> bool:
        """Whether ``path`` is one of ``allowedHostPaths`` in ``namespace`` (exactly; a
        trailing "/" aside, as the kubelet mounts the same directory)."""
        wanted = path.rstrip("/") if path != "/" else path
        return any(
            allowed.replace(HOST_PATH_PLACEHOLDER, namespace) == wanted
            for allowed in self.allowed_host_paths
        )


class SecretsConfig(Section):
    """Only platform-managed secrets."""

    allowed: NamePatterns = Field(
        default=(), description="Secret name patterns (env, envFrom, volumes, projected)."
    )
    on_forbidden: StripOrDeny = Field(
        default="Strip", description="Another secret: remove the reference, or deny."
    )


class PriorityClasses(Section):
    """Allowed priority classes."""

    default: DnsSubdomain | None = Field(
        default=None, description="Set when a run has none or a disallowed one."
    )
    allowed: frozenset[DnsSubdomain] | None = Field(
        default=None, description="Allowed classes; absent: any."
    )


class PreemptionConfig(Section):
    """MLRun's preemption modes, on spot/preemptible nodes."""

    annotation: LabelKey = Field(
        default=PREEMPTION_MODE_ANNOTATION, description="Annotation holding a run's mode."
    )
    default: PreemptionMode | None = Field(
        default=None, description="Mode of a run that names none."
    )
    node_selector: LabelMap = Field(default_factory=dict, description="Node labels of spot nodes.")
    tolerations: tuple[TolerationDict, ...] = Field(
        default=(), description="Tolerations for the spot nodes' taints."
    )
    infer: bool = Field(
        default=False,
        description="A run that states no mode gets the one its scheduling shows MLRun applied "
        "(MLRun writes no annotation), else the default; prevent then relies on the spot taint, "
        "as MLRun does. Read only from runs the platform created (platform.identities).",
    )

    @cached_property
    def spot_requirements(self) -> Mapping[str, tuple[dict[str, Any], ...]]:
        """Per operator (``In``, ``NotIn``), one node requirement per spot label in the
        policy's order (MLRun's k8s_utils.py L39-61). Read-only: copied into a pod."""
        return {
            op: tuple(
                {"key": k, "operator": op, "values": [v]} for k, v in self.node_selector.items()
            )
            for op in ("In", "NotIn")
        }

    @cached_property
    def compared_tolerations(self) -> tuple[dict[str, Any], ...]:
        """The tolerations as MLRun compares them: a null field the same as an absent one."""
        return tuple({k: v for k, v in t.items() if v is not None} for t in self.tolerations)


class SchedulingConfig(Section):
    """Priority classes and spot-node preemption."""

    priority_classes: PriorityClasses = Field(default_factory=PriorityClasses)
    preemption: PreemptionConfig | None = Field(
        default=None,
        description="MLRun's preemption modes, on spot/preemptible nodes; absent: off.",
    )

    @cached_property
    def default_priority_class(self) -> str | None:
        return self.priority_classes.default

    @cached_property
    def allowed_priority_classes(self) -> frozenset[str] | None:  # None: any
        return self.priority_classes.allowed


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
# A user name, ``group:NAME`` (a group of the requester) or ``serviceaccount:NS:NAME``.
Identity = Annotated[str, Field(min_length=1)]
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


# A Platform document's name, as a RunPolicy names it (``spec.platform: digitalhub``).
PlatformName = DnsSubdomain


class RunPolicySpec(Section):
    """What runguard enforces on platform runs."""

    # A document must say which Pods are runs; a Policy built by a program may omit it.
    model_config = ConfigDict(json_schema_extra={"required": ["selector"]})

    selector: LabelSelector = Field(
        default_factory=LabelSelector,
        description=(
            "Which Pods are platform runs (a LabelSelector); the webhook "
            "configurations' objectSelector is rendered from it."
        ),
    )
    exclude_namespaces: frozenset[DnsLabel] = Field(
        default=frozenset(), description="Namespaces whose Pods are never touched."
    )
    enforcement: Literal["Deny", "Warn", "Audit"] = Field(
        default="Deny",
        description="What a violation does: Deny rejects, Warn admits with warnings, Audit only "
        "records it.",
    )
    # A section's description is its docstring.
    profiles_config: ProfilesConfig = Field(default_factory=ProfilesConfig, alias="profiles")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    volumes: VolumesConfig = Field(default_factory=VolumesConfig)
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    # The engine reads a PlatformConfig (``Policy.platform``): the loader puts the named
    # Platform document's spec here (``platforms.resolved``) before the Policy is built.
    platform: PlatformName | PlatformConfig = Field(
        default_factory=PlatformConfig,
        description="The Platform document this RunPolicy reads (its metadata.name): who the "
        "platform is, for the ownership checks. Absent: no platform (no identities: names "
        "alone decide). A mapping written here (the platform's keys inline) is the older "
        "form, still read; runguard lint says to move it to a Platform document.",
    )
    requesters: Annotated[tuple[Identity, ...], UNIQUE] = Field(
        default=(),
        description="Set: this RunPolicy governs only objects these identities create "
        "(directly, or through controllers from an object it governs); anyone else's go on "
        "to the next RunPolicy whose selector matches.",
    )


# --- Profile ---------------------------------------------------------------------------


def _none_if_empty(value: Any) -> Any:
    return value or None


class ProfileQueue(Section):
    """Where a queue profile sends its runs: a Kueue LocalQueue, whose flavors place them."""

    name: DnsLabel = Field(
        description="The LocalQueue, in the run's namespace: written in the run's queue label "
        "(the queue's queueLabel, kueue.x-k8s.io/queue-name by default)."
    )
    priority_class: DnsLabel | None = Field(
        default=None,
        description="A Kueue WorkloadPriorityClass, written in the run's "
        "kueue.x-k8s.io/priority-class label.",
    )


class ProfileValues(Section):
    """What a hardware profile sets: its values win over the run's, key by key (the keys
    an installation-wide Profile and a project's ProjectProfile share). It places the run
    by node (nodeSelector, tolerations, affinity) or by queue (its queue), never both."""

    description: str = Field(default="", description="Shown to users choosing a profile.")
    resources: ProfileResources = Field(
        default_factory=ProfileResources,
        description="Requests and limits of the main container: a quantity is set as is, a "
        "range {min, default, max} keeps the run's value inside it and sets the default "
        "where the run has none.",
    )
    node_selector: LabelMap = Field(default_factory=dict, description="Node labels, per key.")
    tolerations: tuple[TolerationDict, ...] = Field(
        default=(), description="Added; replaces a run's toleration with the same key and effect."
    )
    affinity: Annotated[AffinityDict | None, BeforeValidator(_none_if_empty)] = Field(
        default=None, description="Replaces the run's affinity."
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="Replaces the run's priority class."
    )
    runtime_class_name: DnsSubdomain | None = Field(
        default=None, description="Replaces the run's runtime class."
    )
    env: tuple[EnvVarDict, ...] = Field(
        default=(), description="Environment of the main container, per name."
    )
    queue: ProfileQueue | None = Field(
        default=None,
        description="Schedule by queue: the run gets the queue's label (a Job, a CronJob's "
        "jobs and the operators' objects also spec.suspend true, for the queue to start) and "
        "the profile's other values; its placement is the queue's flavors', so a queue "
        "profile sets no nodeSelector, tolerations or affinity.",
    )

    @cached_property
    def requests(self) -> Mapping[str, str]:  # gpu already resolved
        """The exact requests (a quantity, not a range): they win over the run's."""
        return {k: v for k, v in self.resources.requests.items() if isinstance(v, str)}

    @cached_property
    def limits(self) -> Mapping[str, str]:
        """The exact limits (a quantity, not a range)."""
        return {k: v for k, v in self.resources.limits.items() if isinstance(v, str)}

    @cached_property
    def range_values(self) -> tuple[tuple[str, tuple[tuple[str, QuantityRange], ...]], ...]:
        """(part, ((resource, range), ...)) for the requests then the limits the profile
        gives as ranges, those it has."""
        found = (
            (part, tuple((k, v) for k, v in values.items() if isinstance(v, QuantityRange)))
            for part, values in (
                ("requests", self.resources.requests),
                ("limits", self.resources.limits),
            )
        )
        return tuple((part, ranges) for part, ranges in found if ranges)

    @cached_property
    def resource_values(
        self,
    ) -> tuple[tuple[str, tuple[tuple[str, str, Decimal, str, str], ...]], ...]:
        """(part, ((resource, quantity, amount, label, gpu label), ...)) for the requests
        then the limits, those the profile sets: the engine compares a run's values with
        the amounts, parsed here once, and names a change by its warning label (the gpu
        label where the resource is the policy's gpu resource), written here once."""
        return tuple(
            (
                part,
                tuple(
                    (
                        name,
                        text,
                        parse(text),
                        f"{name} {part[:-1]} {text}",
                        f"gpu {part[:-1]} {text}",
                    )
                    for name, text in values.items()
                ),
            )
            for part, values in (("requests", self.requests), ("limits", self.limits))
            if values
        )

    @cached_property
    def unlimited_requests(self) -> tuple[tuple[str, str, Decimal], ...]:
        """(resource, quantity, amount) of each request the profile sets without a limit:
        a limit the run carried below it is raised to it, so the profile's request wins."""
        return tuple(
            (name, text, parse(text))
            for name, text in self.requests.items()
            if name not in self.resources.limits
        )

    @cached_property
    def node_selector_values(self) -> tuple[tuple[str, str, str], ...]:
        """(key, value, warning label) of each node label the profile sets."""
        return tuple((k, v, f"nodeSelector {k}") for k, v in self.node_selector.items())

    @cached_property
    def env_values(self) -> tuple[tuple[str, Mapping[str, Any], str], ...]:
        """(name, variable, warning label) of each environment variable the profile sets."""
        return tuple((var["name"], var, f"env {var['name']}") for var in self.env)

    @cached_property
    def overrides(self) -> tuple[tuple[str, Any], ...]:
        """(pod spec key, value) of the keys that replace the run's, those the profile sets,
        in the order the engine applies them."""
        return tuple(
            (key, value)
            for key, value in (
                ("affinity", self.affinity),
                ("priorityClassName", self.priority_class_name),
                ("runtimeClassName", self.runtime_class_name),
            )
            if value is not None
        )


class ProfileSpec(ProfileValues):
    """A hardware profile for the whole installation: its values win over the run's, key
    by key."""

    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="The namespaces whose runs may use this profile, by the Namespace's "
        "labels (a LabelSelector; kubernetes.io/metadata.name is each one's name); absent: "
        "every namespace. A run naming it elsewhere is denied (profile.not-allowed).",
    )


class ProjectProfileSpec(ProfileValues):
    """A project's own hardware profile, in its namespace: for the runs of that namespace
    only, bounded by the RunPolicy that governs them (its maximums, device families and
    allowed priority classes); where its name is also an installation-wide profile's,
    this one wins in its namespace."""


class Profile(ProfileSpec):
    """A profile as the engine reads it: its spec and its name; ``project`` is the
    namespace of a project's profile (ProjectProfile), "" for an installation-wide one."""

    name: str
    project: str = ""

    @property
    def title(self) -> str:
        """How messages name it: ``1xt4``, or ``team-a/2xt4-small`` for a project's."""
        return f"{self.project}/{self.name}" if self.project else self.name


# --- documents -------------------------------------------------------------------------

Kind = Literal["RunPolicy", "Profile", "ProjectProfile", "Platform"]


class Document(Section):
    """A RunPolicy (one or more per directory, tried in name order), Profile,
    ProjectProfile or Platform."""

    api_version: Literal["runguard.io/v1"] = Field(description="Always runguard.io/v1.")
    kind: Kind = Field(description="RunPolicy, Profile, ProjectProfile or Platform.")
    metadata: Metadata = Field(description="The document's name.")
    spec: dict[str, Any] = Field(description="Depends on kind.")


class ProfileMetadata(Metadata):
    """A Profile's metadata: its name is written in a label."""

    name: Annotated[str, Field(min_length=1), LABEL_VALUE] = Field(
        description="The profile's name, as runs name it in the profile label."
    )


class ProjectProfileMetadata(ProfileMetadata):
    """A ProjectProfile's metadata: its name, and the project (namespace) it is for."""

    namespace: DnsLabel = Field(
        description="The project's namespace: only its runs may name this profile."
    )


class PlatformMetadata(Metadata):
    """A Platform's metadata: its name, as RunPolicies name it (platform: NAME)."""

    name: PlatformName = Field(
        description="The platform's name, as a RunPolicy names it (platform: NAME)."
    )


API_VERSION: str = get_args(Document.model_fields["api_version"].annotation)[0]
# kind -> (its spec, its metadata): the schema checks each document against its kind's.
KINDS: dict[str, tuple[type[Section], type[Metadata]]] = {
    "RunPolicy": (RunPolicySpec, Metadata),
    "Profile": (ProfileSpec, ProfileMetadata),
    "ProjectProfile": (ProjectProfileSpec, ProjectProfileMetadata),
    "Platform": (PlatformConfig, PlatformMetadata),
}
# The kinds a policy directory is built of; a ProjectProfile is read from the cluster
# (runguard's cluster-state watch, or ``--cluster-state`` offline) and only checked there.
POLICY_KINDS = ("RunPolicy", "Profile", "Platform")
assert set(KINDS) == set(get_args(Kind))


# --- the Policy ------------------------------------------------------------------------


class Policy(RunPolicySpec):
    """The RunPolicy's spec with its name, the profiles by name, and a digest of the sources.

    With several RunPolicies the first by name is the Policy callers hold
    and the others are its ``alternatives``, in name order: a Pod is judged by the first
    of them whose selector matches it (``choose``)."""

    platform: PlatformConfig = Field(default_factory=PlatformConfig)  # resolved at load
    name: str = "runguard"
    profiles: Mapping[str, Profile] = Field(default_factory=dict)
    digest: str = ""  # sha256 of the source documents, for /readyz and the audit log
    alternatives: tuple[Policy, ...] = ()

    def run_policies(self) -> tuple[Policy, ...]:
        """Every RunPolicy, in the order they are tried."""
        return (self, *self.alternatives)

    def choose(
        self,
        labels: Mapping[str, str],
        namespace: str,
        requested: Callable[[Policy], bool] | None = None,
    ) -> Policy | None:
        """The RunPolicy governing a pod with these labels in this namespace, if any: the
        first whose selector matches and, when it names ``requesters``, whose requesters
        created the object (``requested(policy)``; None: no requester is known)."""
        for policy in (self, *self.alternatives):
            if namespace in policy.exclude_namespaces or not policy.selector.matches(labels):
                continue
            if policy.requesters and (requested is None or not requested(policy)):
                continue
            return policy
        return None

    def named(self, name: str) -> Policy | None:
        """The RunPolicy called ``name``, if there is one."""
        return next((p for p in (self, *self.alternatives) if p.name == name), None)

    def names(self) -> list[str]:
        """Every RunPolicy's name, in the order they are tried."""
        return [p.name for p in self.run_policies()]

    def profile_names(self) -> list[str]:
        """Every profile's name, whichever RunPolicy holds it, sorted."""
        return sorted({name for p in self.run_policies() for name in p.profiles})

    def describe(self) -> str:
        """What is loaded, as the log and ``runguard lint`` count it:
        ``RunPolicies builds, runs; 4 profiles``."""
        names, count = self.names(), len(self.profile_names())
        kind = "RunPolicy" if len(names) == 1 else "RunPolicies"
        return f"{kind} {', '.join(names)}; {count} profile{'s' if count != 1 else ''}"


def with_alternatives(policies: Sequence[Policy]) -> Policy:
    """The first of ``policies`` (in name order) holding the others; one digest for all."""
    first, *rest = policies
    if not rest:
        return first
    digest = hashlib.sha256("".join(p.digest for p in policies).encode()).hexdigest()[:16]
    return first.model_copy(update={"alternatives": tuple(rest), "digest": digest})


def run_policy_path(*names: str) -> tuple[str, ...]:
    """Where a RunPolicy document holds the key with these attribute names.

    ``run_policy_path("profiles_config", "default")`` is ``("spec", "profiles", "default")``.
    """
    return ("spec", *key_path(RunPolicySpec, *names))


def profile_path(*names: str) -> tuple[str, ...]:
    """Where a Profile document holds the key with these attribute names."""
    return ("spec", *key_path(ProfileSpec, *names))


def gpu_resource_name(spec: object) -> str:
    """The gpu resource name a RunPolicy ``spec`` (as written, maybe invalid) declares."""
    field = ResourcesConfig.model_fields["gpu_resource_name"]
    resources = (
        spec.get(RunPolicySpec.model_fields["resources"].alias)
        if isinstance(spec, Mapping)
        else None
    )
    name = resources.get(field.alias) if isinstance(resources, Mapping) else None
    return name if isinstance(name, str) else str(field.default)


def build_policy(run_policy: Mapping[str, Any], profiles: Sequence[Mapping[str, Any]]) -> Policy:
    """Build a Policy from schema-valid ``RunPolicy`` and ``Profile`` documents.

    Raises pydantic's ``ValidationError`` (a ``ValueError``) for data the schema would
    have refused.
    """
    spec_data = run_policy.get("spec") or {}
    context = {"gpu": gpu_resource_name(spec_data)}
    spec = RunPolicySpec.model_validate(spec_data, context=context)
    by_name = {}
    for doc in profiles:
        name = doc["metadata"]["name"]
        by_name[name] = Profile.model_validate(
            {**(doc.get("spec") or {}), "name": name}, context=context
        )
    digest = hashlib.sha256(
        json.dumps([run_policy, profiles], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    return Policy.model_validate(
        {
            **{name: getattr(spec, name) for name in RunPolicySpec.model_fields},
            "name": (run_policy.get("metadata") or {}).get("name", "runguard"),
            "profiles": by_name,
            "digest": digest,
        },
        by_alias=False,
        by_name=True,
    )
