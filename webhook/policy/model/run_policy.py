"""A RunPolicy's keys: its sections (profiles, resources, security, volumes, secrets,
scheduling) and ``RunPolicySpec``, which names the Platform it reads."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from webhook.inputs.quantity import parse
from webhook.keys import PREEMPTION_MODE_ANNOTATION, PROFILE_LABEL
from webhook.policy.declare import UNIQUE, Section
from webhook.policy.formats import (
    HOST_PATH_PLACEHOLDER,
    DnsLabel,
    DnsSubdomain,
    HostPath,
    LabelKey,
    LabelMap,
    ResourceName,
)
from webhook.policy.kube import (
    LabelSelector,
    ResourceList,
    ResourceRequirements,
    TolerationDict,
)
from webhook.policy.model.devices import DeviceClassConfig, DeviceCounting
from webhook.policy.model.fields import (
    ROOT_CA_CONFIG_MAP,
    Capability,
    EnvName,
    Id,
    Identity,
    NamePatterns,
    PreemptionMode,
    StripOrDeny,
    VolumeType,
)
from webhook.policy.model.platform import PlatformConfig
from webhook.policy.patterns import matches_any


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
        """What one of ``resource`` counts for in this family; None: not a member. A name
        with ``*`` (a device whose MIG profile no selector pins) counts as the heaviest
        member it may be."""
        exact = self.members.get(resource)
        if exact is not None:
            return exact
        if "*" in resource:
            return self._heaviest(resource)
        known = self._weights
        if resource in known:
            return known[resource]
        found = next((w for regex, w in self.patterns if regex.fullmatch(resource)), None)
        if len(known) < 1024:  # resource names are the user's: bounded
            known[resource] = found
        return found

    def _heaviest(self, pattern: str) -> Decimal | None:
        """The heaviest member a name of ``pattern`` may be: a member key it matches
        (nvidia.com/mig-* matches nvidia.com/mig-1g.*), or a member pattern matching it."""
        regex = re.compile(".*".join(re.escape(part) for part in pattern.split("*")))
        found = [w for k, w in self.members.items() if regex.fullmatch(k)]
        found.extend(w for member, w in self.patterns if member.fullmatch(pattern))
        return max(found, default=None)

    @cached_property
    def _weights(self) -> dict[str, Decimal | None]:
        """The answers for names matched against the patterns, kept with the family."""
        return {}


class ResourcesConfig(DeviceCounting, Section):
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

    device_classes: Mapping[DnsSubdomain, DeviceClassConfig] = Field(
        default_factory=dict,
        description="The DeviceClasses runs may name in their device claims (dynamic resource "
        "allocation), each with what one device counts as against the maximums and device "
        "families; a request of any other class, allocationMode All or adminAccess is refused "
        "for runs.",
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
    workload_priority_classes: frozenset[DnsLabel] | None = Field(
        default=None,
        description="The Kueue WorkloadPriorityClasses a run may name in its "
        "kueue.x-k8s.io/priority-class label, and a profile (installation-wide or a "
        "project's) in queue.priorityClass; absent: any.",
    )

    @cached_property
    def default_priority_class(self) -> str | None:
        return self.priority_classes.default

    @cached_property
    def allowed_priority_classes(self) -> frozenset[str] | None:  # None: any
        return self.priority_classes.allowed


# A Platform document's name, as a RunPolicy names it (``spec.platform: digitalhub``).
PlatformName = DnsSubdomain


class RunTimeConfig(Section):
    """How long runs may run, whatever their profile gives."""

    maximum: Annotated[int, Field(ge=1, le=2147483647)] | None = Field(
        default=None,
        description="The most seconds a profile may give a run (its runTime default and "
        "maximum): a project's profile above it is not applied (profile.project-invalid).",
    )


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
    run_time: RunTimeConfig = Field(default_factory=RunTimeConfig)
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
