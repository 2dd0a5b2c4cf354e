"""Growth after admission (``resources.grown``): what a run was admitted at is what it keeps.

A queue counted the run at the size its template or Pod had when it was admitted. The
API then offers ways to grow it: ``pods/resize`` of a running Pod, the resources of a
suspended Job's template (editable while it waits, for the queue's own resize), pod-level
``spec.resources`` and an ``emptyDir``'s ``sizeLimit``. Each is judged here against the
run's profile (an exact value and a range alike: a value may stay or come closer, never
move away) and the RunPolicy's maximums; a Pod's other containers and sidecars, which the
profile does not size but the queue counted, may keep or lower theirs, and the main
container named at admission stays the main one. The queue's own identity resizes a suspended Job
freely (its partial admission): it counts what it sets.

A range of a Pod's main container is also ``profile.range``'s (with its amount, so an
excess may shrink); here a Pod's exact values, and a template's values, which
``/validate`` otherwise judges only after the profile is applied again.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from webhook.engine import sizes, templates
from webhook.engine.pod import DEFAULT_CONTAINER_ANNOTATION, Pod, main_container, spec_prefix
from webhook.engine.podspec import Target
from webhook.engine.rule import Declarations
from webhook.engine.rules.queue import queue_of
from webhook.engine.rules.resources import effective_totals
from webhook.engine.shape import check_shape
from webhook.engine.subject import Review
from webhook.engine.types import JSON, Violation
from webhook.inputs.quantity import QuantityError, parse
from webhook.keys import MAIN_CONTAINER_ANNOTATION, SIZE_RECORD

RULES = Declarations(__name__)
RESOURCES_GROWN = RULES.rule(
    "resources.grown",
    mutation="",
    violation=(
        "a run grown past what it was admitted at: on UPDATE (`pods/resize`, a suspended Job's "
        "template edited by someone else than the queue) a value of the main container moved "
        "away from its profile's exact value or range, another container's or sidecar's value "
        "grown, another container named the main one, a template's total above a maximum, "
        "an `emptyDir`'s `sizeLimit` grown past the run's bound; and on any request a pod-level "
        "`spec.resources` value above its containers' total for a resource the profile sets"
    ),
)

RESOURCES_SIZE_RECORD = RULES.rule(
    "resources.size-record",
    mutation=(
        "at CREATE, a Pod's size record (`runguard.io/size`) that runguard did not write removed"
    ),
    violation=(
        "a size record (`runguard.io/size`) on a Pod at CREATE that runguard did not write "
        "(only a controller's Pod of a template runguard sized carries one), or changed or "
        "removed on UPDATE of a run or of its pod templates"
    ),
)

# The kinds whose size the queue counted and that the API lets grow after admission.
_GROWN_KINDS = frozenset({"Pod", "Job"})
_FAR = Decimal("Infinity")


def check_growth(r: Review) -> list[Violation]:
    """``resources.grown`` of a run's Pod or Job (see the module doc)."""
    if r.governing is None or r.target is None or r.target.kind not in _GROWN_KINDS:
        return []
    if r.old_target is None and "resources" not in r.target.spec:
        return []  # at CREATE only pod-level resources are judged here
    if not _judged(r.target, r.old_target):
        return []
    pod = r.pod(r.target, r.governing, r.target.spec)
    if pod.profile is None or not pod.spec.get("containers"):
        return []
    old = _old_pod(r)
    found = list(_pod_level(pod, old))
    if old is None or not old.spec.get("containers"):
        return found
    if r.target.kind != "Pod" and queue_of(r.governing, r.context.requester) is not None:
        return found  # the queue's own resize of the run it holds
    if r.target.kind == "Pod" and (renamed := _main_renamed(pod, old)) is not None:
        return [*found, renamed]  # the values below are judged against another container
    found.extend(_moved_away(pod, old, ranges=r.target.kind != "Pod"))
    found.extend(_volumes_grown(pod, old))
    if r.target.kind != "Pod":
        found.extend(_totals_grown(pod, old))
    else:
        found.extend(_others_grown(pod, old))
    return found


def _judged(target: Target, old: Target | None) -> bool:
    """Whether an UPDATE changed what is judged here (the spec, or the annotations naming
    the main container; not labels, status or finalizers) and both can be understood
    (what cannot is denied as ``input.invalid``)."""
    if old is not None and old.spec == target.spec and old.annotations == target.annotations:
        return False
    return _understood(target) and (old is None or _understood(old))


def _main_renamed(pod: Pod, old: Pod) -> Violation | None:
    """Another container named the run's main one on UPDATE (its annotations): the profile
    would then hold that one, and the one it sized would be free."""
    now, was = main_container(pod)["name"], main_container(old)["name"]
    if now == was:
        return None
    return Violation(
        RESOURCES_GROWN,
        "metadata.annotations",
        f"the run's main container was {was} when it was admitted (its profile sized it): "
        f"naming {now} instead ({MAIN_CONTAINER_ANNOTATION}, {DEFAULT_CONTAINER_ANNOTATION}) "
        "is refused on UPDATE",
    )


def _understood(target: Target) -> bool:
    return not check_shape(target.spec, target.spec_path)


def _old_pod(r: Review) -> Pod | None:
    old: Target | None = r.old_target
    if old is None or r.governing is None:
        return None
    return r.pod(old, r.governing, old.spec)


def _bounds(pod: Pod) -> Iterator[tuple[str, str, str, Decimal, Decimal]]:
    """(part, resource, how it is written, low, high) of each value the profile gives."""
    profile = pod.profile
    assert profile is not None
    for part, values in profile.resource_values:
        for name, text, amount, _, _ in values:
            yield part, name, text, amount, amount
    for part, ranges in profile.range_values:
        for name, bounds in ranges:
            low, _, high = bounds.amounts
            yield part, name, f"{bounds.min}..{bounds.max}", low, high


def _distance(value: Any, low: Decimal, high: Decimal) -> Decimal:
    """How far ``value`` is outside [low, high]; an absent value is as far as can be."""
    if value is None:
        return _FAR
    amount = parse(value)
    return max(low - amount, amount - high, Decimal(0))


def _value(pod: Pod, part: str, resource: str) -> Any:
    res = main_container(pod).get("resources")
    values = res.get(part) if isinstance(res, dict) else None
    return values.get(resource) if isinstance(values, dict) else None


def _moved_away(pod: Pod, old: Pod, *, ranges: bool) -> Iterator[Violation]:
    """A main container's value farther from the profile's than it was."""
    assert pod.profile is not None
    name = pod.profile.title
    for part, resource, shown, low, high in _bounds(pod):
        if not ranges and low != high:
            continue  # a Pod's range is profile.range's, with its amount
        value = _value(pod, part, resource)
        now = _distance(value, low, high)
        if now and now > _distance(_value(old, part, resource), low, high):
            yield Violation(
                RESOURCES_GROWN,
                f"{pod.spec_path}.containers[{_index(pod)}].resources.{part}.{resource}",
                f"{pod.short(resource)} {part[:-1]} {value} moves away from profile {name}'s "
                f"{shown}: the run was admitted (and its queue counted it) at its profile's "
                "size; resize it within the profile, or create a run of another profile",
                now,
            )


def _others_grown(pod: Pod, old: Pod) -> Iterator[Violation]:
    """A Pod's container other than its main one (a second container, a sidecar) resized
    above what it was admitted at: the profile holds the main container, and the queue
    counted every container (the main one is the same before and after: ``_main_renamed``)."""
    main = main_container(pod)["name"]
    before = {c.get("name"): c for _, _, c in _resizable(old.spec)}
    for where, i, container in _resizable(pod.spec):
        name = container.get("name")
        if name == main or name not in before:
            continue
        for part in ("requests", "limits"):
            was = _container_amounts(before[name], part)
            for resource, amount in _container_amounts(container, part).items():
                admitted = was.get(resource)
                if admitted is None and part == "limits":
                    continue  # a limit set where there was none holds the container more
                if admitted is not None and amount <= admitted:
                    continue
                yield Violation(
                    RESOURCES_GROWN,
                    f"{pod.spec_path}.{where}[{i}].resources.{part}.{resource}",
                    f"container {name}'s {pod.short(resource)} {part[:-1]} "
                    f"{amount.normalize():f} is above the "
                    f"{'none' if admitted is None else f'{admitted.normalize():f}'} it was "
                    "admitted at (and its queue counted): a container other than the run's "
                    "main one may keep or lower its resources, never grow them",
                    amount - (admitted or Decimal(0)),
                )


def _resizable(spec: JSON) -> Iterator[tuple[str, int, JSON]]:
    """(list, index, container) of what ``pods/resize`` may change: the containers and
    the sidecars (init containers that keep running)."""
    for where in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(where) or ()):
            if isinstance(c, dict) and (
                where == "containers" or c.get("restartPolicy") == "Always"
            ):
                yield where, i, c


def _container_amounts(container: JSON, part: str) -> dict[str, Decimal]:
    res = container.get("resources")
    values = res.get(part) if isinstance(res, dict) else None
    amounts = {k: _amount(v) for k, v in values.items()} if isinstance(values, dict) else {}
    return {k: a for k, a in amounts.items() if a is not None}


def _index(pod: Pod) -> int:
    main = main_container(pod)
    return next(i for i, c in enumerate(pod.spec["containers"]) if c is main)


def _containers_total(spec: JSON, part: str) -> dict[str, Decimal]:
    return effective_totals({k: v for k, v in spec.items() if k != "resources"}, part)


def _pod_level(pod: Pod, old: Pod | None) -> Iterator[Violation]:
    """Pod-level ``spec.resources`` above what the containers ask, for a resource the
    profile sets: the scheduler (and the cgroup) would give the run more than its profile.
    On UPDATE only when it grew."""
    res = pod.spec.get("resources")
    if not isinstance(res, dict):
        return
    profiled = {(part, resource) for part, resource, *_ in _bounds(pod)}
    for part in ("requests", "limits"):
        values = res.get(part)
        if not isinstance(values, dict):
            continue
        totals = _containers_total(pod.spec, part)
        for resource, text in values.items():
            if (part, resource) not in profiled and (_other(part), resource) not in profiled:
                continue
            amount = _amount(text)
            if amount is None:
                continue
            excess = amount - totals.get(resource, Decimal(0))
            if excess <= 0 or (
                old is not None and excess <= _pod_level_excess(old, part, resource)
            ):
                continue
            yield Violation(
                RESOURCES_GROWN,
                f"{pod.spec_path}.resources.{part}.{resource}",
                f"pod-level {pod.short(resource)} {part[:-1]} {text} is above its containers' "
                f"total: profile {pod.profile.title if pod.profile else ''} sizes the run by "
                "its main container; leave pod-level resources out or at the containers' total",
                excess,
            )


def _other(part: str) -> str:
    return "limits" if part == "requests" else "requests"


def _pod_level_excess(pod: Pod, part: str, resource: str) -> Decimal:
    res = pod.spec.get("resources")
    values = res.get(part) if isinstance(res, dict) else None
    text = values.get(resource) if isinstance(values, dict) else None
    amount = _amount(text)
    if amount is None:
        return Decimal(0)
    return amount - _containers_total(pod.spec, part).get(resource, Decimal(0))


def _volume_bound(pod: Pod, resource: str) -> Decimal | None:
    """The most ``resource`` the run may have: its profile's value (exact, or a range's
    max) and the RunPolicy's maximum, the smaller; None when neither sets one."""
    found = [
        high for part, name, _, _, high in _bounds(pod) if name == resource and part == "limits"
    ]
    maximum = pod.policy.resources.maximum_values.get(resource)
    if maximum is not None:
        found.append(maximum)
    return min(found) if found else None


def _size_limits(pod: Pod) -> dict[str, tuple[str, Decimal | None]]:
    """name -> (resource it uses, sizeLimit) of each emptyDir volume."""
    out: dict[str, tuple[str, Decimal | None]] = {}
    for volume in pod.spec.get("volumes") or ():
        empty = volume.get("emptyDir") if isinstance(volume, dict) else None
        if not isinstance(empty, dict):
            continue
        resource = "memory" if empty.get("medium") == "Memory" else "ephemeral-storage"
        out[str(volume.get("name"))] = (resource, _amount(empty.get("sizeLimit")))
    return out


def _amount(value: Any) -> Decimal | None:
    """A quantity's amount; None when absent or not a quantity (the apiserver refuses it)."""
    try:
        return parse(value) if isinstance(value, str) else None
    except QuantityError:
        return None


def _volumes_grown(pod: Pod, old: Pod) -> Iterator[Violation]:
    """An emptyDir's ``sizeLimit`` grown (or lifted) past the run's bound for the
    resource it uses (memory for a memory-backed one)."""
    before = _size_limits(old)
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        name = str(volume.get("name")) if isinstance(volume, dict) else ""
        if name not in before or name not in (now := _size_limits(pod)):
            continue
        resource, size = now[name]
        was = before[name][1]
        grew = size is None if was is not None else False
        grew = grew or (size is not None and (was is None or size > was))
        bound = _volume_bound(pod, resource)
        if not grew or bound is None or (size is not None and size <= bound):
            continue
        yield Violation(
            RESOURCES_GROWN,
            f"{pod.spec_path}.volumes[{i}].emptyDir.sizeLimit",
            f"emptyDir {name!r} grown past the run's {resource} ({bound.normalize():f} at "
            "most, its profile's and the RunPolicy's maximum): a volume's size is counted "
            "with the run",
            (size or _FAR) - bound,
        )


def _totals_grown(pod: Pod, old: Pod) -> Iterator[Violation]:
    """A template's total above a maximum, grown by the update (a Pod's totals are
    ``resources.exceeded``'s)."""
    maximums = pod.policy.resources.maximum_values
    for part in ("requests", "limits"):
        now, was = effective_totals(pod.spec, part), effective_totals(old.spec, part)
        for resource, amount in now.items():
            maximum = maximums.get(resource)
            if maximum is None or amount <= maximum or amount <= was.get(resource, Decimal(0)):
                continue
            yield Violation(
                RESOURCES_GROWN,
                f"{pod.spec_path}.resources.{part}.{resource}",
                f"the template's total {pod.short(resource)} {part[:-1]} grew above the "
                f"maximum {pod.policy.resources.maximums[resource]} for one run",
                amount - maximum,
            )


def check_size_record(r: Review) -> list[Violation]:
    """``resources.size-record``: a forged record on a Pod at CREATE (skipping ``/mutate``,
    which removes it), or a record changed on UPDATE (see ``webhook.engine.sizes``)."""
    if r.governing is None and r.old is None:
        return []
    if r.old is None:
        if r.target is None or r.target.kind != "Pod" or SIZE_RECORD not in r.target.annotations:
            return []
        if not _understood(r.target):
            return []
        assert r.governing is not None
        pod = r.pod(r.target, r.governing, r.target.spec)
        if sizes.believed(pod):
            return []
        return [
            Violation(
                RESOURCES_SIZE_RECORD,
                f"metadata.annotations[{SIZE_RECORD}]",
                "not applied: runguard removes a size record it did not write (runguard's "
                "mutating webhook does this: was it bypassed?)",
                backstop=True,
            )
        ]
    before, after = _records(r.old, r.old_target, r), _records(r.obj, r.target, r)
    return [
        Violation(
            RESOURCES_SIZE_RECORD,
            f"{path}.annotations[{SIZE_RECORD}]",
            "runguard's record of the size the run was admitted at: written once, at CREATE",
        )
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]


def _records(obj: Any, target: Target | None, r: Review) -> dict[str, str]:
    """metadata path -> the size record, of the object's pod (template) and of each
    template an operator's entry declares."""
    found: dict[str, str] = {}
    if target is not None and SIZE_RECORD in target.annotations:
        found[spec_prefix(target.spec_path) + "metadata"] = target.annotations[SIZE_RECORD]
    entry = templates.declared(obj, r.root, r.namespace) if isinstance(obj, dict) else None
    if entry is not None and isinstance(obj, dict):
        for _, located in templates.located(obj, entry):
            if SIZE_RECORD in located.annotations:
                path = spec_prefix(located.spec_path) + "metadata"
                found[path] = located.annotations[SIZE_RECORD]
    return found
