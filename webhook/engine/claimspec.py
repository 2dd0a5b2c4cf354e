"""What a ResourceClaim's spec asks for, in the devices a RunPolicy counts.

A claim (or the claim a template makes) holds ``devices.requests``; each request asks
``exactly`` (``resource.k8s.io/v1``; its fields directly on the request in ``v1beta1``)
``count`` devices of a DeviceClass, or the first of ``firstAvailable`` alternatives that
can be allocated, counted here at the largest of each resource, since any may be the
one allocated. Each device counts as one of the resource its class stands for
(``resources.deviceClasses``, ``ResourcesConfig.device_resource``). What runs may never
ask for is reported as problems: a class the RunPolicy does not name, ``allocationMode:
All`` (every matching device of the node) and ``adminAccess`` (devices other Pods hold).

Pure, and defensive: the spec is the user's (a template's as runguard's cache kept it,
or a claim under admission), so a value of the wrong type is a problem, never an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from webhook.policy.model import ResourcesConfig

__all__ = ["MAX_REQUESTS", "Asked", "claim_asks"]

# The apiserver allows 32 requests per claim and 8 alternatives per request: anything
# beyond that was never admitted, and is not read (every loop here is bounded).
MAX_REQUESTS = 32
MAX_ALTERNATIVES = 8
MAX_SELECTORS = 32


@dataclass
class Asked:
    """Devices a claim asks for, by the resource each counts as; what runs may not ask."""

    amounts: dict[str, Decimal] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, other: Asked) -> None:
        for resource, amount in other.amounts.items():
            self.amounts[resource] = self.amounts.get(resource, Decimal(0)) + amount
        self.problems.extend(other.problems)


def claim_asks(spec: Any, cfg: ResourcesConfig) -> Asked:
    """The devices the ResourceClaim spec ``spec`` asks for (see module doc)."""
    out = Asked()
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if requests is None:
        return out
    if not isinstance(requests, list):
        out.problems.append("devices.requests is not a list")
        return out
    for i, request in enumerate(requests[:MAX_REQUESTS]):
        if not isinstance(request, dict):
            out.problems.append(f"request {i} is not a mapping")
            continue
        name = str(request.get("name", i))
        alternatives = request.get("firstAvailable")
        if alternatives:
            out.add(_largest(name, alternatives, cfg))
        else:
            exactly = request.get("exactly")
            out.add(_exactly(name, exactly if isinstance(exactly, dict) else request, cfg))
    return out


def _largest(name: str, alternatives: Any, cfg: ResourcesConfig) -> Asked:
    """Of ``firstAvailable``: each resource at its largest over the alternatives, every
    alternative's problems."""
    out = Asked()
    if not isinstance(alternatives, list):
        out.problems.append(f"request {name!r}: firstAvailable is not a list")
        return out
    for alternative in alternatives[:MAX_ALTERNATIVES]:
        if not isinstance(alternative, dict):
            out.problems.append(f"request {name!r}: an alternative is not a mapping")
            continue
        asked = _exactly(f"{name}/{alternative.get('name', '?')}", alternative, cfg)
        for resource, amount in asked.amounts.items():
            out.amounts[resource] = max(out.amounts.get(resource, Decimal(0)), amount)
        out.problems.extend(asked.problems)
    return out


def _exactly(name: str, request: dict[str, Any], cfg: ResourcesConfig) -> Asked:
    """One request of ``count`` devices of one class."""
    out = Asked()
    device_class = request.get("deviceClassName")
    if not isinstance(device_class, str) or device_class not in cfg.device_classes:
        out.problems.append(f"request {name!r}: {class_refused(device_class, cfg)}")
    if request.get("allocationMode", "ExactCount") != "ExactCount":
        out.problems.append(
            f"request {name!r}: allocationMode {request.get('allocationMode')} (every matching "
            "device of the node) is not for runs: ask for a count"
        )
    if request.get("adminAccess"):
        out.problems.append(
            f"request {name!r}: adminAccess (access to devices other Pods hold) is not for runs"
        )
    count = request.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        out.problems.append(f"request {name!r}: count {count!r} is not a whole number above 0")
        return out
    if isinstance(device_class, str) and device_class in cfg.device_classes:
        value = _pinned(device_class, request.get("selectors"), cfg)
        out.amounts[cfg.device_resource(device_class, value)] = Decimal(count)
    return out


def class_refused(device_class: Any, cfg: ResourcesConfig) -> str:
    """Why a device class is refused: it names the classes runs may use."""
    allowed = ", ".join(sorted(cfg.device_classes)) or "none"
    return f"DeviceClass {device_class!r} is not one runs may use (allowed: {allowed})"


def _pinned(device_class: str, selectors: Any, cfg: ResourcesConfig) -> str | None:
    """The one value of the class's attribute the selectors pin (an equality in a CEL
    expression with no ``||``, ``!`` or ``?``, all of them being ANDed); None when none
    or several do, the device then counting as the heaviest it may be."""
    pinned = cfg.device_classes[device_class].pinned
    if pinned is None or not isinstance(selectors, list):
        return None
    values = set(_values(pinned, selectors))
    return values.pop() if len(values) == 1 else None


def _values(pinned: Any, selectors: list[Any]) -> Iterator[str]:
    for selector in selectors[:MAX_SELECTORS]:
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if not isinstance(expression, str) or any(c in expression for c in ("||", "!", "?")):
            continue
        for match in pinned.finditer(expression):
            yield match.group(1)
