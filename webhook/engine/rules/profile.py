"""Step 1 and rules ``profile.unknown``, ``profile.not-allowed`` and
``profile.project-invalid``: the profile the run names (its project's own first, else the
installation-wide one) wins over the user's values, where its namespace may use it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.engine.context import cluster_lacks, namespace_labels, project_profile_names
from webhook.engine.pod import (
    Pod,
    copy_value,
    kept_change,
    main_container,
    warning,
)
from webhook.engine.rule import Declarations
from webhook.engine.types import JSON, Change, Violation
from webhook.inputs.quantity import parse
from webhook.policy.kube import QuantityRange
from webhook.policy.model import Profile

RULES = Declarations(__name__)
PROFILE_APPLIED = RULES.rule(
    "profile.applied",
    mutation=(
        "the profile's values set (main container), in a Pod and at CREATE in a run Job's, "
        "CronJob's or operator object's pod templates; a queue profile's queue label (and "
        "`suspend: true` on a Job-like object, Kueue's admission gate on a Pod)"
    ),
    violation=(
        "a Pod, or an operator object's run template, created without `/mutate` whose "
        "profile is not applied (or, a queue profile's, not queued)"
    ),
)
PROFILE_UNKNOWN = RULES.rule(
    "profile.unknown",
    mutation="an unknown profile fell back to the default (`unknown: Default`)",
    violation=(
        "the named profile does not exist (`unknown: Deny`); another project's own profile "
        "(a ProjectProfile of another namespace) does not exist outside its namespace"
    ),
)
PROFILE_NOT_ALLOWED = RULES.rule(
    "profile.not-allowed",
    mutation="",
    violation=(
        "the named profile is kept to other namespaces (its `namespaceSelector`), or the "
        "cluster state lacks the run's Namespace to tell; the message lists the profiles "
        "the namespace may use"
    ),
)
PROFILE_PROJECT_INVALID = RULES.rule(
    "profile.project-invalid",
    mutation="",
    violation=(
        "the run names its project's profile (ProjectProfile), which does not load or "
        "gives more than the governing RunPolicy allows (a maximum, a device family, a "
        "priority class it does not allow, a device variable, another namespace's Pods); "
        "the message says which key, the profile is not applied"
    ),
)
PROFILE_RANGE = RULES.rule(
    "profile.range",
    mutation=(
        "a request or limit outside the profile's range {min, default, max} set to the "
        "nearest bound (`onExceed: Clamp`)"
    ),
    violation="a request or limit outside the profile's range (`onExceed: Deny`)",
)

# Set by the apiserver's Priority plugin from priorityClassName; it refuses a Pod whose
# values disagree with the class, and re-runs after a webhook changed the object.
PRIORITY_COMPUTED = ("priority", "preemptionPolicy")


def forget_computed_priority(spec: JSON) -> None:
    """After changing the class: let the Priority plugin compute these again."""
    for key in PRIORITY_COMPUTED:
        spec.pop(key, None)


def note_profile_fallback(pod: Pod) -> Change | None:
    """An unknown profile name fell back to the default (``unknown: Default``)."""
    if not pod.profile_fallback or pod.profile is None:
        return None
    return Change(
        PROFILE_UNKNOWN,
        warning(f"unknown profile {pod.profile_asked!r}, using {pod.profile.name!r}"),
    )


def apply_profile(pod: Pod) -> Change | None:
    """Step 1: the profile's values win over the run's, key by key: the main container's
    resources and env, the node selector, tolerations and the keys that replace the
    run's (affinity, priority and runtime classes)."""
    profile = pod.profile
    if profile is None:
        return None
    changed: list[str] = []
    spec = pod.spec
    main = main_container(pod)
    if profile.resource_values:
        _set_resources(pod, main, profile, changed)
    if profile.range_values:
        changed.extend(fill_range_defaults(pod, main, profile.range_values))
    if profile.node_selector_values:
        _set_node_selector(spec, profile, changed)
    if profile.env_values:
        _set_env(main, profile, changed)
    if profile.tolerations and merge_tolerations(spec, profile.tolerations):
        changed.append("tolerations")
    lacking = _set_overrides(pod, spec, profile, changed)
    if lacking:  # first, so the warning's 120 characters never hide it
        changed[:0] = [f"not set: the cluster has no {what}" for what in lacking]
    if not changed:
        return None
    return kept_change(PROFILE_APPLIED, f"profile {profile.title} applied", tuple(changed))


def _set_resources(pod: Pod, main: JSON, profile: Profile, changed: list[str]) -> None:
    """The profile's exact requests and limits on the main container; a limit the run
    set below a request the profile sets without a limit is raised to it."""
    gpu = pod.policy.resources.gpu_resource_name  # warnings say gpu (Pod.short)
    res = main.get("resources")
    if res is None:
        res = main["resources"] = {}
    for part, values in profile.resource_values:
        current: JSON | None = res.get(part)  # created empty when absent (pruned after)
        if current is None:
            current = res[part] = {}
        for resource, value, amount, label, gpu_label in values:
            asked = current.get(resource)
            # the same text is the same amount: parsed only when it differs
            if asked is None or (asked != value and parse(asked) != amount):
                current[resource] = value
                changed.append(gpu_label if resource == gpu else label)
    limits = res.get("limits")
    if limits and profile.unlimited_requests:
        # first: a limit the run set and lost is what its user must read
        changed[:0] = raise_limits_to_requests(pod, limits, profile.unlimited_requests)


def _set_node_selector(spec: JSON, profile: Profile, changed: list[str]) -> None:
    """The profile's node labels, per key."""
    selector = spec.get("nodeSelector")
    if selector is None:
        selector = spec["nodeSelector"] = {}
    for key, value, label in profile.node_selector_values:
        if selector.get(key) != value:
            selector[key] = value
            changed.append(label)


def _set_env(main: JSON, profile: Profile, changed: list[str]) -> None:
    """The profile's environment on the main container: the first variable of each
    name replaced, or the variable added."""
    env = main.get("env")
    if env is None:
        env = main["env"] = []
    for name, var, label in profile.env_values:
        for i, current_var in enumerate(env):
            if current_var["name"] == name:  # the first of that name
                if current_var != var:
                    env[i] = dict(var)
                    changed.append(label)
                break
        else:
            env.append(dict(var))
            changed.append(label)


def _set_overrides(pod: Pod, spec: JSON, profile: Profile, changed: list[str]) -> list[str]:
    """The keys that replace the run's; the classes the cluster view says do not exist
    are not set (the apiserver would refuse the run), and returned."""
    lacking: list[str] = []
    state = pod.context.state  # none: no cluster view, nothing known to be lacking
    for key, value in profile.overrides:
        if state is not None:
            kind = _CLUSTER_KINDS.get(key)
            if kind and cluster_lacks(pod.context, kind, value):
                lacking.append(f"{kind} {value}")
                continue
        if spec.get(key) != value:
            spec[key] = value if type(value) is str else copy_value(value)
            if key == "priorityClassName":
                forget_computed_priority(spec)
            changed.append(key)
    return lacking


def fill_range_defaults(
    pod: Pod, main: JSON, ranges: tuple[tuple[str, tuple[tuple[str, QuantityRange], ...]], ...]
) -> list[str]:
    """A resource the profile gives a range for and the run does not ask for gets the
    range's default (a limit: at least the run's request); a value the run asked for is
    judged by ``clamp_to_profile_ranges``."""
    filled: list[str] = []
    res = main.get("resources")
    if res is None:
        res = main["resources"] = {}
    for part, values in ranges:
        current: JSON | None = res.get(part)  # created empty when absent (pruned after)
        if current is None:
            current = res[part] = {}
        for resource, bounds in values:
            if current.get(resource) is None:
                value = bounds.default
                if part == "limits":  # never below the run's request: up to the range's max
                    value = _limit_for(res.get("requests") or {}, resource, bounds)
                current[resource] = value
                filled.append(f"{pod.short(resource)} {part[:-1]} {value}")
    return filled


def _limit_for(requests: JSON, resource: str, bounds: QuantityRange) -> str:
    """The limit a run without one gets: the default, or its request when that is above
    the default (a default never shrinks what was asked). A request above the range is
    left to the range's rule (clamped or denied as ``onExceed`` says), not hidden by a
    limit that would lower it quietly."""
    asked = requests.get(resource)
    if asked is None or parse(asked) <= bounds.amounts[1]:
        return bounds.default
    return str(asked)


def outside(asked: Any, bounds: QuantityRange) -> str | None:
    """The bound a run's value ``asked`` is beyond (min or max), None when inside."""
    amount = parse(asked)
    low, _, high = bounds.amounts
    if amount < low:
        return bounds.min
    if amount > high:
        return bounds.max
    return None


def _beyond(pod: Pod) -> list[tuple[str, str, Any, str, QuantityRange]]:
    """(part, resource, asked, bound, range) of each value of the main container outside
    the profile's range for it."""
    profile = pod.profile
    if profile is None or not profile.range_values:
        return []
    res = main_container(pod).get("resources") or {}
    found = []
    for part, values in profile.range_values:
        current = res.get(part) or {}
        for resource, bounds in values:
            asked = current.get(resource)
            if asked is not None and (bound := outside(asked, bounds)) is not None:
                found.append((part, resource, asked, bound, bounds))
    return found


def clamp_to_profile_ranges(pod: Pod) -> Change | None:
    """Step 1b, ``onExceed: Clamp``: a value outside the profile's range is set to the
    bound it is beyond (``onExceed: Deny``: ``check_profile_ranges`` denies it)."""
    if pod.policy.resources.on_exceed != "Clamp":
        return None
    beyond = _beyond(pod)
    if not beyond or pod.profile is None:
        return None
    res = main_container(pod)["resources"]
    for part, resource, _, bound, _ in beyond:
        res[part][resource] = bound
    return Change(
        PROFILE_RANGE,
        warning(
            f"outside profile {pod.profile.name}'s range",
            [
                f"{pod.short(r)} {part[:-1]} {asked} -> {bound}"
                for part, r, asked, bound, _ in beyond
            ],
        ),
    )


def check_profile_ranges(pod: Pod) -> list[Violation]:
    """``profile.range``: a value of the main container outside the profile's range."""
    beyond = _beyond(pod)
    if not beyond or pod.profile is None:
        return []
    main = main_container(pod)
    index = next(i for i, c in enumerate(pod.spec["containers"]) if c is main)
    return [
        Violation(
            PROFILE_RANGE,
            f"{pod.spec_path}.containers[{index}].resources.{part}.{resource}",
            f"{pod.short(resource)} {part[:-1]} {asked} is outside profile "
            f"{pod.profile.name}'s range {bounds.min}..{bounds.max}",
            # how far outside: on UPDATE (pods/resize) it may stay or come closer, not grow
            amount=abs(parse(asked) - parse(bound)),
        )
        for part, resource, asked, bound, bounds in beyond
    ]


def raise_limits_to_requests(
    pod: Pod, limits: JSON, requests: Iterable[tuple[str, str, Any]]
) -> list[str]:
    """A limit the run carried (a user's, a vertical autoscaler's) below a request the
    profile sets is raised to that request: the clamp step would otherwise lower the
    profile's request to it. The profile's own limits were applied just before."""
    raised: list[str] = []
    for resource, value, amount in requests:
        limit = limits.get(resource)
        if limit is not None and limit != value and parse(limit) < amount:
            limits[resource] = value
            raised.append(f"{pod.short(resource)} limit {limit} -> {value} (its request)")
    return raised


_CLUSTER_KINDS = {"priorityClassName": "PriorityClass", "runtimeClassName": "RuntimeClass"}


def merge_tolerations(spec: JSON, wanted: Iterable[Any]) -> bool:
    """Add each wanted toleration, replacing user tolerations with the same key and effect."""
    before: list[JSON] = spec.get("tolerations") or []
    tolerations = before  # replaced, never changed in place: ``before`` stays as it was
    for t in wanted:
        key, effect = t.get("key"), t.get("effect")
        same: JSON | None = None  # the one toleration with that key and effect, if one
        count = 0
        for u in tolerations:
            if u.get("key") == key and u.get("effect") == effect:
                same = u
                count += 1
        if count == 1 and same == t:
            continue
        tolerations = [u for u in tolerations if u.get("key") != key or u.get("effect") != effect]
        tolerations.append(dict(t))
    if tolerations != before:
        spec["tolerations"] = tolerations
        return True
    return False


def check_profile(pod: Pod) -> list[Violation]:
    cfg = pod.policy.profiles_config
    where = f"{pod.meta_path}.labels[{cfg.label}]"
    if pod.profile_invalid is not None:
        invalid, why = pod.profile_invalid
        return [
            Violation(
                PROFILE_PROJECT_INVALID,
                where,
                f"project profile {invalid!r} of namespace {pod.namespace!r} is not applied: {why}",
            )
        ]
    if pod.profile_refused is not None:
        return [not_allowed(pod, pod.profile_refused.name)]
    name = pod.profile_asked
    if name is None or pod.profile is not None or cfg.unknown == "Default":
        return []
    if name in pod.policy.profiles:
        return []
    return [
        Violation(
            PROFILE_UNKNOWN,
            where,
            f"profile {name!r} does not exist (known: {usable_profiles(pod)})",
        )
    ]


def usable_profiles(pod: Pod) -> str:
    """The profiles the run's namespace may use: the installation-wide ones open to it
    and its project's own; "none" when there are none."""
    names = {n for n, p in pod.policy.profiles.items() if pod.may_use(p)}
    names.update(project_profile_names(pod.context, pod.namespace))
    return ", ".join(sorted(names)) or "none"


def not_allowed(pod: Pod, name: str) -> Violation:
    """``profile.not-allowed``: the run's namespace may not use profile ``name``; the
    message names the profiles it may use (only those open to every namespace when the
    cluster view lacks the Namespace)."""
    labels = namespace_labels(pod.context, pod.namespace)
    usable = usable_profiles(pod)
    if labels is None:
        why = (
            f"profile {name!r} is kept to some namespaces, and the cluster state holds no "
            f"Namespace {pod.namespace or '(none)'!r} to tell"
        )
    else:
        why = f"profile {name!r} is not for namespace {pod.namespace!r}"
    return Violation(
        PROFILE_NOT_ALLOWED,
        f"{pod.meta_path}.labels[{pod.policy.profiles_config.label}]",
        f"{why} (it may use: {usable})",
    )
