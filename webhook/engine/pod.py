"""The pod under judgement, and the small helpers every rule module shares.

``Pod`` is built once per review: its profile is resolved here, once, and every
mutation step and validation check reads it from there.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from webhook.engine import sizes
from webhook.engine.context import (
    NO_CONTEXT,
    OWNERSHIP_OFF,
    Context,
    Ownership,
    namespace_labels,
    project_profile_spec,
)
from webhook.engine.types import JSON, Change
from webhook.inputs.quantity import parse
from webhook.keys import MAIN_CONTAINER_ANNOTATION
from webhook.policy.model import Policy, Profile, RunPolicy
from webhook.policy.project import (
    ProjectProfileError,
    above_other_maximums,
    beyond,
    read_project_profile,
)
from webhook.policy.source import format_key

DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
WARNING_LIMIT = 120

CONTAINER_LISTS = ("initContainers", "containers")
# Ephemeral containers (``kubectl debug``) are added to a running Pod through the
# ``pods/ephemeralcontainers`` subresource. They carry no resources, but they are judged
# and hardened like the others.
ALL_CONTAINER_LISTS = (*CONTAINER_LISTS, "ephemeralContainers")


@dataclass
class Pod:
    """The pod spec being judged (mutated in place by steps), its identity and its profile.

    ``profile_asked`` is the name the run gives (label, else annotation, else the
    policy's default); ``profile`` the profile applied (None when unknown or none);
    ``profile_fallback`` is True when an unknown name fell back to the default.
    """

    spec: JSON
    labels: dict[str, str]
    annotations: dict[str, str]
    policy: RunPolicy
    spec_path: str = "spec"
    # (path, claim template) of a StatefulSet's volumeClaimTemplates: outside the pod spec,
    # judged with it
    claim_templates: tuple[tuple[str, JSON], ...] = ()
    namespace: str = ""
    context: Context = NO_CONTEXT
    ownership: Ownership = OWNERSHIP_OFF  # whether the platform created this run
    # the object's metadata.ownerReferences (a Pod's, or the pod controller's being judged)
    owner_references: tuple[Any, ...] = ()
    # every RunPolicy (``root.run_policies``): a driver's map value naming any platform's
    # Secret is a Secret reference (None: the governing RunPolicy alone)
    root: Policy | None = None
    profile_asked: str | None = field(init=False, default=None)
    profile: Profile | None = field(init=False, default=None)
    profile_fallback: bool = field(init=False, default=False)
    # the profile the run names (or fell back to) when its namespace may not use it: not
    # applied (``profile`` is None), denied by ``profile.not-allowed``
    profile_refused: Profile | None = field(init=False, default=None)
    # (name, why) of the project's profile the run names when it does not load or gives
    # more than the RunPolicy allows: not applied, denied by ``profile.project-invalid``
    profile_invalid: tuple[str, str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        cfg = self.policy.profiles_config
        name = self.labels.get(cfg.label) or self.annotations.get(cfg.label) or cfg.default
        self.profile_asked = name
        if name is None:
            return
        self.profile = self.resolve(name)
        if (
            self.profile is None
            and self.profile_invalid is None
            and cfg.unknown == "Default"
            and cfg.default is not None
        ):
            self.profile = self.resolve(cfg.default)
            self.profile_fallback = self.profile is not None
        if self.profile is not None and not self.may_use(self.profile):
            self.profile_refused, self.profile = self.profile, None
        recorded = sizes.recorded_profile(self, name)
        if recorded is not None:  # sized once, when its template was: judged against that
            self.profile, self.profile_fallback = recorded, False
            self.profile_invalid = self.profile_refused = None

    def resolve(self, name: str) -> Profile | None:
        """The profile ``name`` means in this run's namespace: its project's own
        (ProjectProfile) first, as a namespaced object wins over a cluster-wide one of the
        same name in its namespace, else the installation-wide one. A project's profile
        that does not load or gives more than this RunPolicy allows is None, and why is
        kept (``profile_invalid``)."""
        spec = project_profile_spec(self.context, self.namespace, name)
        if spec is None:
            return self.policy.profiles.get(name)
        gpu = self.policy.resources.gpu_resource_name
        try:
            profile = read_project_profile(spec, self.namespace, name, gpu)
        except ProjectProfileError as exc:
            self.profile_invalid = (name, f"it does not load: {exc}")
            return None
        found, bound = beyond(profile, self.policy, self.namespace), self.policy
        if not found and not self.policy.resources.maximums and self.root is not None:
            bound, found = above_other_maximums(profile, self.root, self.policy, self.namespace)
        if found:
            problems = "; ".join(f"{format_key(('spec', *at))}: {why}" for at, why in found)
            self.profile_invalid = (name, f"beyond RunPolicy {bound.name}: {problems}")
            return None
        return profile

    def may_use(self, profile: Profile) -> bool:
        """Whether this run's namespace may use ``profile`` (its ``namespaceSelector``);
        False when the cluster view lacks the Namespace's labels to tell."""
        selector = profile.namespace_selector
        if selector is None:
            return True
        labels = namespace_labels(self.context, self.namespace)
        return labels is not None and selector.matches(labels)

    @property
    def meta_path(self) -> str:
        """The pod metadata path next to the spec (``spec.template.spec`` -> ``...metadata``)."""
        return spec_prefix(self.spec_path) + "metadata"

    def containers(
        self, lists: tuple[str, ...] = CONTAINER_LISTS
    ) -> Iterator[tuple[str, int, JSON]]:
        return iter_containers(self.spec, lists)

    def short(self, resource: str) -> str:
        """How warnings name a resource: ``gpu`` for the policy's gpu resource."""
        return self.policy.resources.short(resource)


def spec_prefix(spec_path: str) -> str:
    """What comes before ``spec`` in a pod spec's path (``spec.template.spec`` ->
    ``spec.template.``): where the pod's metadata and the spec's relative paths start."""
    return spec_path[: -len("spec")]


def iter_containers(
    spec: JSON, lists: tuple[str, ...] = CONTAINER_LISTS
) -> Iterator[tuple[str, int, JSON]]:
    """(list name, index, container) for init containers then containers (then ``lists``)."""
    for list_name in lists:
        for i, container in enumerate(spec.get(list_name) or ()):
            yield list_name, i, container


def warning(summary: str, details: Iterable[str] = ()) -> str:
    """``runguard: summary: a, b, c`` cut to fit kubectl's 120 characters, with ``+N more``."""
    items = details if isinstance(details, list | tuple) else list(details)
    text = f"runguard: {summary}"
    if not items:
        return text[:WARNING_LIMIT]
    whole = f"{text}: {', '.join(items)}"
    if len(whole) + len(f" (+{len(items)} more)") <= WARNING_LIMIT:
        return whole  # every item fits, with room for any "(+N more)" the loop below weighs
    shown = 0
    out = f"{text}: "
    for i, item in enumerate(items):
        rest = len(items) - i - 1
        tail = len(f" (+{rest} more)") if rest else 0
        added = item if i == 0 else f", {item}"
        if len(out) + len(added) + tail > WARNING_LIMIT:
            break
        out += added
        shown += 1
    if not shown:
        out = text
    hidden = len(items) - shown
    if hidden:
        out += f" (+{hidden} more)"
    return out[:WARNING_LIMIT]


# (rule, summary, items) -> its Change (``kept_change``)
_KEPT_CHANGES: dict[tuple[str, str, tuple[str, ...]], Change] = {}
_KEPT = 1024  # bounded: the items hold a user's names


def kept_change(rule: str, summary: str, items: tuple[str, ...] = ()) -> Change:
    """``Change(rule, warning(summary, items))``, made once per list: a step's items are
    the policy's labels and the names of a run's containers, volumes and secrets, the same
    few on every run of a template, and a Change is frozen (one serves every review)."""
    key = (rule, summary, items)
    change = _KEPT_CHANGES.get(key)
    if change is None:
        change = Change(rule, warning(summary, items))
        if len(_KEPT_CHANGES) >= _KEPT:
            _KEPT_CHANGES.clear()
        _KEPT_CHANGES[key] = change
    return change


C = TypeVar("C")
V = TypeVar("V")


def made_once(store: dict[int, tuple[C, V]], config: C, make: Callable[[C], V]) -> V:
    """``make(config)``, made once per policy object ``config`` and kept in ``store``
    beside it (so that its id is not reused while there); bounded, since policies are
    reloaded and each reload makes new objects."""
    known = store.get(id(config))
    if known is not None and known[0] is config:
        return known[1]
    if len(store) >= 64:
        store.clear()
    made = make(config)
    store[id(config)] = (config, made)
    return made


def main_container(pod: Pod) -> JSON:
    """The container the profile applies to: named by runguard's annotation, else by
    kubectl's default-container one (which Istio sets to the run's container), else the
    first that is not an injected sidecar (``profiles.sidecarContainers``: Linkerd puts
    its proxy first), else the first."""
    containers: list[JSON] = pod.spec["containers"]
    annotations = pod.annotations
    for key in (MAIN_CONTAINER_ANNOTATION, DEFAULT_CONTAINER_ANNOTATION):
        wanted = annotations.get(key)
        if wanted is not None:
            for c in containers:
                if c["name"] == wanted and (
                    key == MAIN_CONTAINER_ANNOTATION or not _sidecar(pod, c)
                ):
                    return c
    for c in containers:
        if not _sidecar(pod, c):
            return c
    return containers[0]


def _sidecar(pod: Pod, container: JSON) -> bool:
    return container["name"] in pod.policy.profiles_config.sidecar_containers


def resources_of(container: JSON, part: str) -> dict[str, Any]:
    """``container.resources[part]``, created empty when absent (pruned again after)."""
    res = container.get("resources")
    if res is None:
        res = container["resources"] = {}
    values = res.get(part)
    if values is None:
        values = res[part] = {}
    out: dict[str, Any] = values
    return out


def same_quantity(a: Any, b: Any) -> bool:
    """Both set, to the same amount. The same text is the same amount: parsed only when
    the texts differ (the shape check admitted only quantities into a pod's resources)."""
    return a is not None and b is not None and (a == b or parse(a) == parse(b))


def set_list(parent: JSON, key: str, items: list[Any]) -> None:
    """Replace a list a step filtered; an emptied one is removed, as the apiserver stores it."""
    if len(items) == len(parent[key]):
        return
    if items:
        parent[key] = items
    else:
        del parent[key]


# orjson refuses (instead of converting) every value JSON does not carry exactly: those go
# to marshal. NaN and infinities it writes as null, so any null sends the value there too.
_JSON_ONLY = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def copy_json(value: Any) -> Any:
    """Deep copy of a JSON document (a tuple, which JSON does not have, comes back a list):
    an orjson round trip (C speed, half marshal's), else a ``marshal`` round trip (exact
    types: non-string keys, big integers, NaN, dates from YAML), falling back to a
    recursive copy for values marshal cannot carry."""
    try:
        encoded = orjson.dumps(value, default=_refuse, option=_JSON_ONLY)
    except (orjson.JSONEncodeError, TypeError):
        encoded = b"null"
    if b"null" not in encoded:
        return orjson.loads(encoded)
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return _copy_tree(value)


def _copy_tree(value: Any) -> Any:
    if type(value) is dict:
        return {k: _copy_tree(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy_tree(v) for v in value]
    return value


def copy_value(value: Any) -> Any:
    """A deep copy of policy data (tuples become lists) before it goes into a pod."""
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [copy_value(v) for v in value]
    return value


def remove_volumes(spec: JSON, names: set[str]) -> None:
    """Drop the named volumes and every mount or device of them, in every container."""
    kept = [v for v in spec.get("volumes") or () if v["name"] not in names]
    if kept:
        spec["volumes"] = kept
    else:
        spec.pop("volumes", None)
    for list_name in ALL_CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            for key in ("volumeMounts", "volumeDevices"):
                mounts = container.get(key)
                if mounts and any(m["name"] in names for m in mounts):
                    set_list(container, key, [m for m in mounts if m["name"] not in names])


def remove_items(spec: JSON, items: Iterable[tuple[str | int, ...]]) -> None:
    """Remove the list entries at ``items``, each the keys and indexes from the pod spec to
    an entry (``("volumes", 2)``, ``("containers", 0, "env", 3)``, a ``doors.Reference``'s
    ``item``): a volume goes with its mounts (``remove_volumes``), and so does a projected
    volume left without sources; an emptied list is removed (``set_list``)."""
    by_list: dict[tuple[str | int, ...], set[int]] = {}
    for item in items:
        index = item[-1]
        if isinstance(index, int):
            by_list.setdefault(item[:-1], set()).add(index)
    volumes: set[str] = set()
    for where in sorted(by_list, key=len, reverse=True):  # inner lists before the volumes
        parent: Any = spec
        for step in where[:-1]:
            parent = parent[step]
        key, gone = where[-1], by_list[where]
        entries = parent[key]
        if where == ("volumes",):
            volumes.update(entries[i]["name"] for i in gone)
            continue
        set_list(parent, str(key), [e for i, e in enumerate(entries) if i not in gone])
        if where[0] == "volumes" and where[2:] == ("projected", "sources") and key not in parent:
            volumes.add(spec["volumes"][where[1]]["name"])
    if volumes:
        remove_volumes(spec, volumes)
