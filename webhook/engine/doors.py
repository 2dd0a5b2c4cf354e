"""Every field of a Pod spec that names another object: the doors.

One table, read by the engine (``ownership.platform_references``: which of the
platform's objects a pod spec uses; ``secrets.forbidden``: every Secret door, stripped
or denied alike; ``resources.device-claim``: existing device claims) and by the webhook
configurations' CEL
(``webhook.install.manifests``: which pods reach runguard), so what the engine judges and what
the apiserver sends cannot drift. ``tests/engine/test_doors.py`` walks the Kubernetes API schema
(the ``kubernetes`` client's models of the newest supported release) and fails on any
field that names a Secret, ConfigMap, PersistentVolumeClaim, ServiceAccount or device
that is neither here nor in ``NOT_DOORS`` with the reason.

A path starts at the pod spec; ``*`` is every item of a list, ``{*}`` every value of a
map; ``CONTAINERS`` stands for the three container lists (init, regular and ephemeral
containers). A door through the values of a map (a CSI driver's ``volumeAttributes``,
read by the driver, which may open a Secret named there with its own rights) names an
object only by one of the platform's names for that kind: any other value is the
driver's business (``Door.by_pattern``). Each door has its judge, the rule that
strips or denies what a run may not use through it (``webhook.engine.rules.judge``,
beside the rules, which read this table): ``tests/engine/test_doors.py`` feeds every door
the platform's name (and a foreign one) and fails unless that rule strips or denies
it, so a door listed but judged by nothing is caught, as well as a field neither
listed nor explained.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "CONTAINERS",
    "DOORS",
    "MAP_VALUES",
    "NOT_DOORS",
    "Door",
    "Item",
    "Reference",
    "item_text",
    "located",
    "references",
]

CONTAINERS = "CONTAINERS"
MAP_VALUES = "{*}"  # a path step: every value of a map
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class Door:
    """A field naming an object of ``kind``; ``when`` a
    sibling key and the value it must have for the field to name that kind (a typed
    reference: ``dataSource.kind``)."""

    kind: str
    path: tuple[str, ...]
    when: tuple[str, str] | None = None

    @property
    def text(self) -> str:
        return ".".join(self.path)

    @property
    def by_pattern(self) -> bool:
        """A door through a free map's values: a value names an object of ``kind`` only
        when it is one of the platform's names for that kind (the readers filter)."""
        return MAP_VALUES in self.path


def _door(kind: str, path: str, when: tuple[str, str] | None = None) -> Door:
    return Door(kind, tuple(path.split(".")), when)


def _secret(path: str) -> Door:
    """A Secret door: every one is judged by ``secrets.forbidden``, which reads this table."""
    return _door("Secret", path)


_CLAIM = ("kind", "PersistentVolumeClaim")
DOORS: tuple[Door, ...] = (
    # Secrets: stripped or denied alike, whatever the door (secrets.forbidden)
    _secret("volumes.*.secret.secretName"),
    _secret("volumes.*.projected.sources.*.secret.name"),
    _secret("volumes.*.csi.nodePublishSecretRef.name"),
    _secret("volumes.*.csi.volumeAttributes.{*}"),  # secretName and the like, by pattern
    _secret("volumes.*.flexVolume.options.{*}"),
    _secret("volumes.*.flexVolume.secretRef.name"),
    _secret("volumes.*.cephfs.secretRef.name"),
    _secret("volumes.*.rbd.secretRef.name"),
    _secret("volumes.*.iscsi.secretRef.name"),
    _secret("volumes.*.cinder.secretRef.name"),
    _secret("volumes.*.scaleIO.secretRef.name"),
    _secret("volumes.*.storageos.secretRef.name"),
    _secret("volumes.*.azureFile.secretName"),
    _secret("CONTAINERS.*.env.*.valueFrom.secretKeyRef.name"),
    _secret("CONTAINERS.*.envFrom.*.secretRef.name"),
    _secret("imagePullSecrets.*.name"),
    # ConfigMaps: as volumes, pre-existing data; read into the environment, ownership's
    _door("ConfigMap", "volumes.*.configMap.name"),
    _door("ConfigMap", "volumes.*.projected.sources.*.configMap.name"),
    _door("ConfigMap", "CONTAINERS.*.env.*.valueFrom.configMapKeyRef.name"),
    _door("ConfigMap", "CONTAINERS.*.envFrom.*.configMapRef.name"),
    # Claims, and claims cloned into a new one by a generic ephemeral volume
    _door("PersistentVolumeClaim", "volumes.*.persistentVolumeClaim.claimName"),
    _door(
        "PersistentVolumeClaim",
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSource.name",
        _CLAIM,
    ),
    _door(
        "PersistentVolumeClaim",
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSourceRef.name",
        _CLAIM,
    ),
    # Who the Pod runs as
    _door("ServiceAccount", "serviceAccountName"),
    _door("ServiceAccount", "serviceAccount"),
    # Devices by an existing claim (dynamic resource allocation), shared with its Pods
    _door("ResourceClaim", "resourceClaims.*.resourceClaimName"),
)

# Fields that name something yet are no door, and why (the schema test reads these).
NOT_DOORS: dict[str, str] = {
    "volumes.*.ephemeral.volumeClaimTemplate.spec.volumeName": (
        "a PersistentVolume, not a claim: any volumeName of a claim template is a "
        "pre-existing reference for the volumes rules, whatever its name"
    ),
    "volumes.*.ephemeral.volumeClaimTemplate.spec.storageClassName": (
        "a StorageClass provisions new, empty storage"
    ),
    "volumes.*.ephemeral.volumeClaimTemplate.spec.volumeAttributesClassName": (
        "a VolumeAttributesClass: storage parameters, no data"
    ),
    "volumes.*.scaleIO.volumeName": "a volume of the ScaleIO system: a forbidden volume type",
    "volumes.*.storageos.volumeName": "a volume of StorageOS: a forbidden volume type",
    "volumes.*.projected.sources.*.clusterTrustBundle.name": (
        "a ClusterTrustBundle: public CA certificates, readable by every Pod"
    ),
    "CONTAINERS.*.env.*.valueFrom.fileKeyRef.volumeName": (
        "names a volume of the Pod itself, which is judged as a volume"
    ),
    "volumes.*.projected.sources.*.podCertificate.userAnnotations.{*}": (
        "what a pod certificate's signer reads with the request: the signer decides what "
        "it issues, and opens no object for the Pod"
    ),
    "runtimeClassName": "a RuntimeClass: the profile's and scheduling's (cluster_lacks)",
    "priorityClassName": "a PriorityClass: judged by scheduling.priority-class",
    "resourceClaims.*.resourceClaimTemplateName": (
        "a ResourceClaimTemplate: the claim made from it is new and owned by the Pod, the "
        "run's own (what it may allocate is the device classes' and the quota's)"
    ),
}


Item = tuple[str | int, ...]  # keys and list indexes from the pod spec to a value


class Reference(NamedTuple):
    """An object a pod spec names through ``door``; ``item`` locates what holds the
    reference: the list entry (a volume, a projected source, an env entry, an
    ``imagePullSecrets`` entry, a ``resourceClaims`` entry), else the field itself."""

    door: Door
    name: str
    item: Item


class _Trie:
    """The doors as a tree of their paths: a step's key (``*``: every item of a list) to
    the tree below it, and the doors ending there."""

    __slots__ = ("children", "doors")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.doors: list[int] = []  # indexes in DOORS


def _trie(kinds: frozenset[str] | None) -> _Trie:
    """The tree of the doors of ``kinds`` (None: all); the three container lists share
    one subtree."""
    root = _Trie()
    for index, door in enumerate(DOORS):
        if kinds is not None and door.kind not in kinds:
            continue
        node, path = root, door.path
        if path[0] == CONTAINERS:
            node = root.children.get(CONTAINER_LISTS[0]) or _Trie()
            for name in CONTAINER_LISTS:
                root.children[name] = node
            path = path[1:]
        for key in path:
            node = node.children.setdefault(key, _Trie())
        node.doors.append(index)
    return root


_Hit = tuple[int, str, Item]  # index of the door, name, item
_Collect = Callable[[Any, list[_Hit]], None]


def _source(root: _Trie) -> str:
    """Python source of ``collect(spec, out)``: nested loops over the tree, as one would
    write them by hand for these doors (a walk interpreting the tree costs several
    times more, on every Pod). Every step checks the type it reads: any input."""
    lines = ["def collect(spec, out):"]
    names = iter(range(1_000_000))

    def emit(node: _Trie, var: str, steps: list[str], cut: int, parent: str, depth: int) -> None:
        pad = "    " * depth
        item = steps[:cut] if cut else steps
        for index in node.doors:
            test = f"isinstance({var}, str) and {var}"
            when = DOORS[index].when
            if when is not None:
                test += f" and {parent}.get({when[0]!r}) == {when[1]!r}"
            lines.append(f"{pad}if {test}:")
            lines.append(f"{pad}    out.append(({index}, {var}, ({', '.join(item)},)))")
        values = node.children.get(MAP_VALUES)
        if values is not None:  # every value of a map, located by its key
            n = next(names)
            lines.append(f"{pad}if isinstance({var}, dict):")
            lines.append(f"{pad}    for k{n}, e{n} in {var}.items():")
            emit(values, f"e{n}", [*steps, f"k{n}"], cut, var, depth + 2)
        items = node.children.get("*")
        if items is not None:
            n = next(names)
            lines.append(f"{pad}if isinstance({var}, list):")
            lines.append(f"{pad}    for i{n}, e{n} in enumerate({var}):")
            emit(items, f"e{n}", [*steps, f"i{n}"], len(steps) + 1, var, depth + 2)
        keys: dict[int, tuple[_Trie, list[str]]] = {}  # subtree -> the keys leading to it
        for key, below in node.children.items():
            if key not in ("*", MAP_VALUES):
                keys.setdefault(id(below), (below, []))[1].append(key)
        if not keys:
            return
        lines.append(f"{pad}if isinstance({var}, dict):")
        for below, group in keys.values():
            n = next(names)
            if len(group) == 1:
                lines.append(f"{pad}    v{n} = {var}.get({group[0]!r})")
                step, inner = repr(group[0]), depth + 1
            else:  # the container lists, one subtree
                lines.append(f"{pad}    for k{n} in {tuple(group)!r}:")
                lines.append(f"{pad}        v{n} = {var}.get(k{n})")
                step, inner = f"k{n}", depth + 2
            lines.append(f"{pad}{'    ' * (inner - depth)}if v{n} is not None:")
            emit(below, f"v{n}", [*steps, step], cut, var, inner + 1)

    emit(root, "spec", [], 0, "None", 1)
    return "\n".join(lines) + "\n"


_COLLECTORS: dict[frozenset[str] | None, _Collect] = {}


def _collector(kinds: frozenset[str] | None) -> _Collect:
    """``collect`` for the doors of ``kinds``, compiled once per set of kinds."""
    made = _COLLECTORS.get(kinds)
    if made is None:
        namespace: dict[str, Any] = {}
        exec(compile(_source(_trie(kinds)), f"<doors {sorted(kinds or ())}>", "exec"), namespace)
        made = namespace["collect"]
        if len(_COLLECTORS) < 16:  # a few constant sets of kinds
            _COLLECTORS[kinds] = made
    return made


def located(spec: Any, kinds: frozenset[str] | None = None) -> list[Reference]:
    """Every object the spec names through a door, of ``kinds`` (None: all), in the
    order of ``DOORS`` (and of the spec within one door); one walk of the spec for all
    the doors, reading defensively (any input, however malformed)."""
    out: list[_Hit] = []
    _collector(kinds)(spec, out)
    if not out:
        return []
    out.sort(key=_door_index)  # stable: the spec's order within a door
    return [Reference(DOORS[index], name, item) for index, name, item in out]


def _door_index(hit: _Hit) -> int:
    return hit[0]


def item_text(item: Item, base: str = "spec") -> str:
    """``spec.volumes[2]``: the dotted path of ``item`` below the pod spec at ``base``."""
    out = base
    for step in item:
        out += f"[{step}]" if isinstance(step, int) else f".{step}"
    return out


def references(spec: Any, kinds: frozenset[str] | None = None) -> Iterator[tuple[str, str, str]]:
    """(kind, name, path relative to the pod spec) of every object the spec names through
    a door, of ``kinds`` (None: all); reads defensively (any input, however malformed)."""
    for ref in located(spec, kinds):
        yield ref.door.kind, ref.name, item_text(ref.item)
