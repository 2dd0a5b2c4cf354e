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
from functools import cached_property
from typing import Annotated, Any

from pydantic import Field

from webhook.policy.declare import Section
from webhook.policy.formats import ResourceName

__all__ = [
    "IMPLICIT_EXTENDED_PREFIX",
    "VALUE",
    "CountsAs",
    "DeviceAttribute",
    "DeviceClassConfig",
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
