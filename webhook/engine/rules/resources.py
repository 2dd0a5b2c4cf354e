"""Steps 2-4 and rules ``resources.*``: defaults, memory limits, maximums, gpu request = limit.

Maximums hold per container (clamped) and per run: the run's effective total, as the
scheduler computes it, above a maximum is denied (there is no fair way to clamp a total
across containers the user sized).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from webhook.engine.pod import CONTAINER_LISTS, Pod, resources_of, same_quantity, warning
from webhook.engine.rule import Declarations
from webhook.engine.types import JSON, Change, Violation
from webhook.inputs.quantity import format_bytes_ceil_mi, parse

RULES = Declarations(__name__)
RESOURCES_DEFAULTS = RULES.rule(
    "resources.defaults",
    mutation=(
        "defaults filled where absent; a default limit below the container's own request "
        "is the request (a default never shrinks what was asked)"
    ),
    violation="a Pod created without `/mutate` lacking them",
)
RESOURCES_MEMORY_LIMIT = RULES.rule(
    "resources.memory-limit",
    mutation="memory limit = request x `memoryLimitFactor`",
    violation="idem",
)
RESOURCES_CLAMPED = RULES.rule(
    "resources.clamped",
    mutation="a request or limit clamped to the maximum; request <= limit; gpu request = limit",
    violation="idem",
)
RESOURCES_EXCEEDED = RULES.rule(
    "resources.exceeded",
    mutation="",
    violation=(
        "a request or limit above a maximum (`onExceed: Deny`), or the run's total (containers "
        "and sidecars summed, the largest init container, pod-level resources) above one; on "
        "UPDATE (`pods/resize`) an excess may stay or shrink, never grow"
    ),
)
RESOURCES_GPU_MISMATCH = RULES.rule(
    "resources.gpu-mismatch",
    mutation="",
    violation="gpu request differs from gpu limit",
)


def fill_defaults(pod: Pod) -> Change | None:
    filled: dict[str, int] = {}
    spec = pod.spec
    containers: list[JSON] = []
    for list_name in CONTAINER_LISTS:  # pod.containers(), without its generator
        found = spec.get(list_name)
        if found:
            containers.extend(found)
    for part, defaults in pod.policy.resources.default_values:
        for container in containers:
            current = resources_of(container, part)
            for resource, value, label, amount in defaults:
                if resource not in current:
                    if part == "limits":
                        # A default never shrinks what the container asked: a limit
                        # below its own request is the request instead.
                        asked = (container["resources"].get("requests") or {}).get(resource)
                        if asked is not None and parse(asked) > amount:
                            value, label = asked, f"{pod.short(resource)} limit {asked}"
                    current[resource] = value
                    filled[label] = filled.get(label, 0) + 1
    _prune_empty_resources(containers)
    if not filled:
        return None
    return Change(RESOURCES_DEFAULTS, warning("defaults filled", filled))


def _prune_empty_resources(containers: list[JSON]) -> None:
    """Drop ``{}`` requests/limits this engine may have created, so mutation is idempotent."""
    for container in containers:
        res = container.get("resources")
        if not isinstance(res, dict):
            continue
        for part in ("requests", "limits"):
            if part in res and res[part] == {}:
                del res[part]


def derive_memory_limits(pod: Pod) -> Change | None:
    factor = pod.policy.resources.memory_limit_factor
    if factor is None:
        return None
    set_limits: list[str] = []
    derived: dict[Any, str] = {}  # the same few requests in every container: computed once
    spec = pod.spec
    for list_name in CONTAINER_LISTS:  # pod.containers(), without its generator
        for container in spec.get(list_name) or ():
            res = container.get("resources") or {}
            request = (res.get("requests") or {}).get("memory")
            if request is None or "memory" in (res.get("limits") or {}):
                continue
            limit = derived.get(request)
            if limit is None:
                limit = derived[request] = format_bytes_ceil_mi(parse(request) * factor)
            resources_of(container, "limits")["memory"] = limit
            set_limits.append(f"{container['name']} {limit}")
    if not set_limits:
        return None
    return Change(
        RESOURCES_MEMORY_LIMIT, warning(f"memory limit set to request x {factor}", set_limits)
    )


def clamp_to_maximums(pod: Pod) -> Change | None:
    cfg = pod.policy.resources
    clamp = cfg.on_exceed == "Clamp"
    notes: list[str] = []
    # Equal texts are equal amounts: parsed only where they differ (shape.py admitted
    # only quantities here).
    for list_name in CONTAINER_LISTS:
        for container in pod.spec.get(list_name) or ():
            res = container.get("resources")
            if not res:
                continue
            requests: dict[str, Any] = res.get("requests") or {}
            limits: dict[str, Any] = res.get("limits") or {}
            if clamp:
                _clamp_container(pod, requests, limits, notes)
            if limits:
                _requests_within_limits(pod, requests, limits, notes)
            if cfg.gpu_resource_name in requests or cfg.gpu_resource_name in limits:
                _gpu_request_is_limit(container, cfg.gpu_resource_name, requests, limits, notes)
    if not notes:
        return None
    return Change(RESOURCES_CLAMPED, warning("resources clamped", notes))


def _clamp_container(
    pod: Pod, requests: dict[str, Any], limits: dict[str, Any], notes: list[str]
) -> None:
    """A container's requests and limits above the maximums, set to them."""
    cfg = pod.policy.resources
    for part, values in (("request", requests), ("limit", limits)):
        for resource, value in values.items():
            maximum = cfg.maximum_values.get(resource)
            if maximum is not None and parse(value) > maximum:
                values[resource] = cfg.maximums[resource]
                notes.append(f"{pod.short(resource)} {part} {value} -> {cfg.maximums[resource]}")


def _requests_within_limits(
    pod: Pod, requests: dict[str, Any], limits: dict[str, Any], notes: list[str]
) -> None:
    """A request above its limit, lowered to it."""
    for resource in list(requests):
        asked = requests[resource]
        if resource in limits:
            limit = limits[resource]
            if asked != limit and parse(asked) > parse(limit):
                notes.append(f"{pod.short(resource)} request {asked} -> limit")
                requests[resource] = limit


def _gpu_request_is_limit(
    container: JSON, gpu: str, requests: dict[str, Any], limits: dict[str, Any], notes: list[str]
) -> None:
    """A gpu cannot be shared: the request is the limit (the limit, if any, wins)."""
    amount = limits.get(gpu, requests.get(gpu))
    if not (same_quantity(requests.get(gpu), amount) and same_quantity(limits.get(gpu), amount)):
        resources_of(container, "requests")[gpu] = amount
        resources_of(container, "limits")[gpu] = amount
        notes.append(f"gpu request = limit {amount}")


def check_resources(pod: Pod) -> list[Violation]:
    cfg = pod.policy.resources
    gpu = cfg.gpu_resource_name
    maximum_values = cfg.maximum_values
    out: list[Violation] = []
    # Plain loops, not pod.containers(): this runs for every pod.
    for list_name in CONTAINER_LISTS:
        for i, container in enumerate(pod.spec.get(list_name) or ()):
            res: JSON | None = container.get("resources")
            if not res:
                continue
            requests = res.get("requests") or {}
            limits = res.get("limits") or {}
            for part, values in (("requests", requests), ("limits", limits)):
                for resource, value in values.items():
                    maximum = maximum_values.get(resource)
                    if maximum is not None and (amount := parse(value)) > maximum:
                        out.append(
                            Violation(
                                RESOURCES_EXCEEDED,
                                f"{_path(pod, list_name, i)}.{part}.{resource}",
                                f"{value} is above the maximum {cfg.maximums[resource]}",
                                amount,
                            )
                        )
            if (gpu in requests or gpu in limits) and not same_quantity(
                requests.get(gpu), limits.get(gpu)
            ):
                out.append(
                    Violation(
                        RESOURCES_GPU_MISMATCH,
                        f"{_path(pod, list_name, i)}.requests.{gpu}",
                        f"gpu request {requests.get(gpu, 'unset')} must equal gpu limit "
                        f"{limits.get(gpu, 'unset')}",
                    )
                )
    return out


def _path(pod: Pod, list_name: str, i: int) -> str:
    """A container's resources' path, written only for a violation."""
    return f"{pod.spec_path}.{list_name}[{i}].resources"


def effective_totals(spec: JSON, part: str) -> dict[str, Decimal]:
    """The pod's effective ``part`` (requests or limits) per resource, as the scheduler
    computes it: regular containers and sidecars (init containers with ``restartPolicy:
    Always``) summed; each other init container with the sidecars started before it; the
    larger of the two; pod-level ``spec.resources`` where it sets a resource."""
    containers: list[JSON] = spec.get("containers") or []
    if len(containers) == 1 and not spec.get("initContainers") and "resources" not in spec:
        return _values(containers[0], part)  # the usual run: its one container is the run
    totals: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for container in spec.get("initContainers") or ():
        values = _values(container, part)
        if container.get("restartPolicy") == "Always":
            for name, amount in values.items():
                sidecars[name] = sidecars.get(name, Decimal(0)) + amount
            during = dict(sidecars)
        else:
            during = {n: sidecars.get(n, Decimal(0)) + values.get(n, Decimal(0)) for n in values}
            for name, amount in sidecars.items():
                during.setdefault(name, amount)
        for name, amount in during.items():
            init_peak[name] = max(init_peak.get(name, Decimal(0)), amount)
    for container in containers:
        for name, amount in _values(container, part).items():
            totals[name] = totals.get(name, Decimal(0)) + amount
    for name, amount in sidecars.items():
        totals[name] = totals.get(name, Decimal(0)) + amount
    for name, amount in init_peak.items():
        totals[name] = max(totals.get(name, Decimal(0)), amount)
    totals.update(_values(spec, part))  # pod-level resources win where set
    return totals


def _values(holder: JSON, part: str) -> dict[str, Decimal]:
    res = holder.get("resources")
    values = res.get(part) if isinstance(res, dict) else None
    return {k: parse(v) for k, v in values.items()} if isinstance(values, dict) else {}


def check_run_totals(pod: Pod) -> list[Violation]:
    """``resources.exceeded`` for a run whose total (not one container) is above a maximum."""
    cfg = pod.policy.resources
    if not cfg.maximum_values:
        return []
    spec = pod.spec
    if (
        not spec.get("initContainers")
        and len(spec.get("containers") or ()) <= 1
        and ("resources" not in spec)
    ):
        return []  # the one container holds the whole run: check_resources judges it
    out: list[Violation] = []
    for part in ("requests", "limits"):
        pod_level = _values(pod.spec, part)
        largest: dict[str, Decimal] = {}
        for _, _, container in pod.containers():
            for name, amount in _values(container, part).items():
                largest[name] = max(largest.get(name, Decimal(0)), amount)
        for resource, amount in effective_totals(pod.spec, part).items():
            maximum = cfg.maximum_values.get(resource)
            if resource not in pod_level and amount == largest.get(resource):
                continue  # one container holds it all: check_resources names that container
            if maximum is not None and amount > maximum:
                out.append(
                    Violation(
                        RESOURCES_EXCEEDED,
                        f"{pod.spec_path}.resources.{part}.{resource}",
                        f"the run's total {pod.short(resource)} {part[:-1]} "
                        f"{show_amount(resource, amount)} (all containers, as the scheduler "
                        "counts) is above the maximum "
                        f"{cfg.maximums[resource]} for one run",
                        amount,
                    )
                )
    return out


def show_amount(resource: str, amount: Decimal) -> str:
    """A total as people write it: bytes in Mi/Gi, the rest as a plain number."""
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return format_bytes_ceil_mi(amount)
    return f"{amount.normalize():f}"


def check_device_families(pod: Pod) -> list[Violation]:
    """``resources.exceeded`` for a run whose weighted total of a device family (every MIG
    profile of a GPU, say) is above the family's maximum; never clamped, as run totals."""
    families = pod.policy.resources.families
    if not families or not _asks_for_members(pod, families):
        return []
    out: list[Violation] = []
    for part in ("requests", "limits"):
        totals = effective_totals(pod.spec, part)
        for family in families:
            total, shown = family_total(pod.policy.resources, family, totals)
            if total > family.max:
                out.append(
                    Violation(
                        RESOURCES_EXCEEDED,
                        f"{pod.spec_path}.resources.{part}.family:{family.name}",
                        f"the run's {family.name} devices ({shown}) count "
                        f"{total.normalize():f} {part}, above the family's maximum "
                        f"{family.max.normalize():f} for one run",
                        total,
                    )
                )
    return out


def family_total(cfg: Any, family: Any, totals: dict[str, Decimal]) -> tuple[Decimal, str]:
    """The weighted total of ``family`` in ``totals``, and its members as messages show
    them (``2 gpu x 7, 1 nvidia.com/mig-1g.10gb``)."""
    counted = [
        (resource, amount, weight)
        for resource, amount in sorted(totals.items())
        if amount and (weight := family.weight(resource))
    ]
    total = sum((amount * weight for _, amount, weight in counted), Decimal(0))
    shown = ", ".join(
        f"{show_amount(r, a)} {cfg.short(r)}" + (f" x {w.normalize():f}" if w != 1 else "")
        for r, a, w in counted
    )
    return total, shown


def _asks_for_members(pod: Pod, families: Any) -> bool:
    """Whether any container (or the pod) names a resource of any family: most runs name
    none, and are done without adding anything up."""
    holders: list[Any] = [pod.spec]
    for list_name in CONTAINER_LISTS:
        holders.extend(pod.spec.get(list_name) or ())
    for holder in holders:
        res = holder.get("resources")
        if not isinstance(res, dict):
            continue
        for part in ("requests", "limits"):
            for resource in res.get(part) or ():
                if "/" in resource and any(f.weight(resource) is not None for f in families):
                    return True
    return False
