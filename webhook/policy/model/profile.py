"""A Profile's and a ProjectProfile's keys, and ``Profile`` as the engine reads it."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from webhook.inputs.quantity import parse
from webhook.policy.declare import Section
from webhook.policy.formats import (
    DnsLabel,
    DnsSubdomain,
    LabelMap,
)
from webhook.policy.kube import (
    AffinityDict,
    EnvVarDict,
    LabelSelector,
    ProfileResources,
    QuantityRange,
    TolerationDict,
)


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


# A run time in seconds, as activeDeadlineSeconds takes it (at most about 68 years).
Seconds = Annotated[int, Field(ge=1, le=2147483647)]


class ProfileRunTime(Section):
    """How long one run of the profile may run: its Pods' activeDeadlineSeconds (and, for
    a queued run, Kueue's maximum execution time), so GPUs are not held forever."""

    default: Seconds | None = Field(
        default=None,
        description="Seconds a run gets when it sets no activeDeadlineSeconds; absent: the "
        "maximum.",
    )
    maximum: Seconds | None = Field(
        default=None,
        description="The most seconds a run may ask for (activeDeadlineSeconds above it is "
        "lowered to it); never raised or removed on UPDATE.",
    )

    @cached_property
    def given(self) -> int | None:
        """What a run setting none gets: the default (never above the maximum), else the
        maximum."""
        if self.default is None or self.maximum is None:
            return self.default if self.default is not None else self.maximum
        return min(self.default, self.maximum)


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
    run_time: ProfileRunTime | None = Field(
        default=None,
        description="A run's default and maximum run time, in seconds (activeDeadlineSeconds of "
        "its Pods; Kueue's maximum execution time for a queued run).",
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
