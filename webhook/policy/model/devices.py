"""The device classes of dynamic resource allocation a RunPolicy lets runs use
(``resources.deviceClasses``), and what one device of each counts as.

A device a run gets through a ResourceClaim counts as one of an extended resource
(``countsAs``): ``gpu`` (the RunPolicy's ``gpuResourceName``) for a whole GPU, so the
``gpu`` maximum and the device families hold whichever way the GPU is asked for; a
MIG slice as ``nvidia.com/mig-{value}``, ``{value}`` being the device attribute
(``attribute``) a request's selector pins, weighted by the family that names it, and
the heaviest member of that family when no selector pins it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from webhook.policy.declare import Section
from webhook.policy.formats import ResourceName

__all__ = [
    "IMPLICIT_EXTENDED_PREFIX",
    "VALUE",
    "CountsAs",
    "DeviceAttribute",
    "DeviceClassConfig",
    "DeviceCounting",
    "counts_as_problem",
]

VALUE = "{value}"  # where the pinned attribute's value goes in ``countsAs``
# The extended resource every DeviceClass stands for on Kubernetes 1.37.
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"

# ``gpu``, a resource name, or one with ``{value}`` once (nvidia.com/mig-{value}).
CountsAs = Annotated[
    str,
    Field(
        pattern=r"^gpu$|^[a-z0-9][-a-z0-9.]*/[A-Za-z0-9{][-A-Za-z0-9_.{}]*$",
        max_length=253,
    ),
]
# A device attribute's qualified name, DOMAIN/NAME (gpu.nvidia.com/profile).
DeviceAttribute = Annotated[
    str,
    Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z][A-Za-z0-9_]*$", max_length=96),
]


class DeviceClassConfig(Section):
    """A DeviceClass runs may name in their claims, and what one of its devices counts as
    against the maximums and device families."""

    counts_as: CountsAs = Field(
        description="The resource one device counts as: gpu (the gpuResourceName), or a "
        "resource name; {value} in it is replaced by the attribute's value a request's "
        "selector pins (nvidia.com/mig-{value}), the heaviest member of its family when none "
        "does.",
    )
    attribute: DeviceAttribute | None = Field(
        default=None,
        description="The device attribute (DOMAIN/NAME, e.g. gpu.nvidia.com/profile) whose "
        "value a selector pins, for {value} in countsAs.",
    )
    extended_resource_name: ResourceName | None = Field(
        default=None,
        description="The DeviceClass's extendedResourceName (Kubernetes 1.37): a container "
        "asking for it gets devices of this class through dynamic resource allocation, "
        "counted once, as countsAs.",
    )

    @cached_property
    def pinned(self) -> re.Pattern[str] | None:
        """An equality on the attribute in a CEL selector (``device.attributes["D"].N ==
        "V"`` or ``["N"]``), its value captured; None without an attribute."""
        if self.attribute is None:
            return None
        domain, name = self.attribute.split("/")
        q = "[\"']"
        return re.compile(
            rf"device\.attributes\[\s*{q}{re.escape(domain)}{q}\s*\]\s*"
            rf"(?:\.{re.escape(name)}\b|\[\s*{q}{re.escape(name)}{q}\s*\])"
            rf"\s*==\s*{q}([^\"'\\]*){q}"
        )


def counts_as_problem(counts_as: Any, attribute: Any) -> str | None:
    """What is wrong with a class's ``countsAs`` and ``attribute`` together (a check across
    keys, ``webhook.policy.consistency``); None: nothing."""
    if not isinstance(counts_as, str):
        return None  # the schema says what is wrong with it
    placed = counts_as.count(VALUE)
    if placed > 1 or "{" in counts_as.replace(VALUE, "") or "}" in counts_as.replace(VALUE, ""):
        return f"{VALUE} at most once, and no other braces"
    if placed and attribute is None:
        return f"{VALUE} needs attribute: the device attribute a selector pins"
    if not placed and attribute is not None:
        return f"attribute is read only for {VALUE} in countsAs"
    return None


class DeviceCounting:
    """How a RunPolicy's resources section reads its device classes (``ResourcesConfig``
    mixes it in; the fields are that section's): what a device, or an extended resource a
    class maps, counts as."""

    if TYPE_CHECKING:
        device_classes: Mapping[str, DeviceClassConfig]
        gpu_resource_name: str

    @cached_property
    def device_class_resources(self) -> Mapping[str, str]:
        """Each allowed class's ``countsAs``, ``gpu`` resolved to ``gpuResourceName``."""
        return {
            name: self.gpu_resource_name if c.counts_as == "gpu" else c.counts_as
            for name, c in self.device_classes.items()
        }

    @cached_property
    def extended_device_classes(self) -> Mapping[str, str]:
        """The classes' own extendedResourceName to the class, where it is not already the
        resource its devices count as (that one counts as itself, once)."""
        return {
            c.extended_resource_name: name
            for name, c in self.device_classes.items()
            if c.extended_resource_name is not None
            and c.extended_resource_name != self.device_class_resources[name]
        }

    def mapped_device_class(self, resource: str) -> str | None:
        """The DeviceClass an extended resource is allocated through by dynamic resource
        allocation (Kubernetes 1.37: ``deviceclass.resource.kubernetes.io/<class>``, or a
        class's own extendedResourceName); None: a device plugin's, or one counted as
        itself."""
        if resource.startswith(IMPLICIT_EXTENDED_PREFIX):
            return resource[len(IMPLICIT_EXTENDED_PREFIX) :]
        return self.extended_device_classes.get(resource)

    def counted_as(self, resource: str) -> str:
        """What one of ``resource`` counts as against the maximums and families: the
        resource its allowed class stands for when a class maps it, else itself."""
        device_class = self.mapped_device_class(resource)
        if device_class is None or device_class not in self.device_classes:
            return resource
        return self.device_resource(device_class, None)

    def device_resource(self, device_class: str, value: str | None) -> str:
        """The resource one device of allowed ``device_class`` counts as, given the value a
        selector pins of its attribute (None: unpinned, ``*``, the heaviest)."""
        counts_as = self.device_class_resources[device_class]
        return counts_as.replace(VALUE, "*" if value is None else value)
