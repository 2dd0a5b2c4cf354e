"""Finding the pod spec inside an object, and checking it is shaped well enough to judge.

Every field the engine reads or writes is type-checked here first, so the mutation and
validation steps can index freely: a malformed object becomes ``input.invalid``
violations naming the path, never an exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from webhook.engine.types import JSON, Violation
from webhook.quantity import QuantityError, parse

INVALID = "input.invalid"

# kind -> keys from the object to its pod template (None: the object is the pod)
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
}


class InvalidObject(Exception):
    """The object cannot be judged; carries the ``input.invalid`` violations."""

    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(str(v) for v in violations))
        self.violations = violations


@dataclass
class Target:
    """The pod (or pod template) inside an object: its metadata and spec, and where they are."""

    kind: str
    metadata: JSON  # the pod's (template's) metadata: labels and annotations live here
    spec: JSON
    spec_path: str  # dotted path of ``spec`` inside the object, for violation paths
    keys: tuple[str, ...]  # keys from the object to the pod template (empty for a Pod)

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.metadata.get("labels") or {}
        return labels

    @property
    def annotations(self) -> dict[str, str]:
        annotations: dict[str, str] = self.metadata.get("annotations") or {}
        return annotations


def invalid(path: str, message: str) -> Violation:
    return Violation(INVALID, path, message)


def object_meta(obj: Any) -> tuple[str, str, str]:
    """kind, namespace, name of anything, tolerating garbage."""
    if not isinstance(obj, dict):
        return "", "", ""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kind, ns, name = obj.get("kind"), meta.get("namespace"), meta.get("name")
    if not name and isinstance(meta.get("generateName"), str):
        name = meta["generateName"]
    return (
        kind if isinstance(kind, str) else "",
        ns if isinstance(ns, str) else "",
        name if isinstance(name, str) else "",
    )


def locate(obj: Any) -> Target | None:
    """The pod template of ``obj``; None for kinds that carry no pod. Raises InvalidObject."""
    if not isinstance(obj, dict):
        raise InvalidObject([invalid("", f"expected an object, got {type(obj).__name__}")])
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise InvalidObject([invalid("kind", "kind is missing or not a string")])
    keys = TEMPLATE_PATHS.get(kind)
    if keys is None:
        return None
    node: Any = obj
    path: list[str] = []
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
        path.append(key)
        if not isinstance(node, dict):
            raise InvalidObject([invalid(".".join(path), f"{kind} has no {'.'.join(path)}")])
    metadata = node.get("metadata", {})
    if metadata is None:
        metadata = {}
    prefix = ".".join(path)
    meta_path = f"{prefix}.metadata" if prefix else "metadata"
    if not isinstance(metadata, dict):
        raise InvalidObject([invalid(meta_path, "metadata is not an object")])
    problems: list[Violation] = []
    for field_name in ("labels", "annotations"):
        value = metadata.get(field_name)
        if value is not None and not _is_str_map(value):
            problems.append(invalid(f"{meta_path}.{field_name}", "must map strings to strings"))
    spec = node.get("spec")
    spec_path = f"{prefix}.spec" if prefix else "spec"
    if not isinstance(spec, dict):
        problems.append(invalid(spec_path, f"{kind} has no pod spec"))
    if problems:
        raise InvalidObject(problems)
    return Target(kind, metadata, spec, spec_path, keys)


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


CONTAINER_LISTS = ("initContainers", "containers")
# Ephemeral containers (``kubectl debug``) are added to a running Pod through the
# ``pods/ephemeralcontainers`` subresource. They are judged like the others but never
# mutated: they cannot carry resources, and a Pod's spec is immutable by then.
ALL_CONTAINER_LISTS = (*CONTAINER_LISTS, "ephemeralContainers")
_SPEC_SCALARS: tuple[tuple[str, type, str], ...] = (
    ("priorityClassName", str, "a string"),
    ("runtimeClassName", str, "a string"),
    ("hostNetwork", bool, "a boolean"),
    ("hostPID", bool, "a boolean"),
    ("hostIPC", bool, "a boolean"),
)


def iter_containers(
    spec: JSON, lists: tuple[str, ...] = CONTAINER_LISTS
) -> Iterator[tuple[str, int, JSON]]:
    """(list name, index, container) for init containers then containers (then ``lists``)."""
    for list_name in lists:
        for i, container in enumerate(spec.get(list_name) or ()):
            yield list_name, i, container


def check_shape(spec: JSON, spec_path: str) -> list[Violation]:
    """Every ``input.invalid`` problem of a pod spec, for the fields the engine touches."""
    if _well_formed(spec):
        return []  # the common case, decided without building a single message
    return _shape_problems(spec, spec_path)


# -- fast path: True only when _shape_problems would find nothing ------------------------

_STR_OR_NONE = (str, type(None))


def _is_list_of_named(value: Any) -> bool:
    return type(value) is list and all(
        type(item) is dict and type(item.get("name")) is str for item in value
    )


def _quantities_ok(values: Any) -> bool:
    if values is None:
        return True
    if type(values) is not dict:
        return False
    try:
        for value in values.values():
            parse(value)
    except QuantityError:
        return False
    return True


def _int_or_none(value: Any) -> bool:
    return value is None or (type(value) is int)


def _bool_or_none(value: Any) -> bool:
    return value is None or type(value) is bool


def _security_context_ok(sc: Any, *, container: bool) -> bool:
    if sc is None:
        return True
    if type(sc) is not dict:
        return False
    for key, value in sc.items():
        if value is None:
            continue
        kind = _SECURITY_CONTEXT_TYPES.get(key)
        if kind is not None and (container or key not in _CONTAINER_ONLY):
            if kind[0] is bool or kind[0] is dict:
                if type(value) is not kind[0]:
                    return False
            elif type(value) is not int:  # ids: bool is not an id
                return False
    if container:
        caps = sc.get("capabilities")
        if caps is not None:
            if type(caps) is not dict:
                return False
            for key in ("add", "drop"):
                values = caps.get(key)
                if values is not None and not (
                    type(values) is list and all(type(x) is str for x in values)
                ):
                    return False
    return True


def _container_ok(c: Any) -> bool:
    if type(c) is not dict or type(c.get("name")) is not str:
        return False
    res = c.get("resources")
    if res is not None and (
        type(res) is not dict
        or not _quantities_ok(res.get("requests"))
        or not _quantities_ok(res.get("limits"))
    ):
        return False
    env = c.get("env")
    if env is not None:
        if not _is_list_of_named(env):
            return False
        for e in env:
            vf = e.get("valueFrom")
            if vf is not None:
                if type(vf) is not dict:
                    return False
                ref = vf.get("secretKeyRef")
                if ref is not None and (type(ref) is not dict or type(ref.get("name")) is not str):
                    return False
    env_from = c.get("envFrom")
    if env_from is not None:
        if type(env_from) is not list:
            return False
        for e in env_from:
            if type(e) is not dict:
                return False
            ref = e.get("secretRef")
            if ref is not None and (type(ref) is not dict or type(ref.get("name")) is not str):
                return False
    for key in ("volumeMounts", "volumeDevices"):
        mounts = c.get(key)
        if mounts is not None and not _is_list_of_named(mounts):
            return False
    return _security_context_ok(c.get("securityContext"), container=True)


def _volume_ok(v: Any) -> bool:
    if type(v) is not dict or type(v.get("name")) is not str:
        return False
    for vtype, ref in (
        ("persistentVolumeClaim", "claimName"),
        ("configMap", "name"),
        ("secret", "secretName"),
    ):
        if vtype in v and (type(v[vtype]) is not dict or type(v[vtype].get(ref)) is not str):
            return False
    if "projected" in v:
        projected = v["projected"]
        if type(projected) is not dict:
            return False
        sources = projected.get("sources")
        if sources is not None:
            if type(sources) is not list:
                return False
            for src in sources:
                if type(src) is not dict:
                    return False
                if "secret" in src and (
                    type(src["secret"]) is not dict or type(src["secret"].get("name")) is not str
                ):
                    return False
    return True


def _well_formed(spec: JSON) -> bool:
    containers = spec.get("containers")
    if type(containers) is not list or not containers:
        return False
    for list_name in ALL_CONTAINER_LISTS:
        items = spec.get(list_name)
        if items is None:
            continue
        if type(items) is not list or not all(_container_ok(c) for c in items):
            return False
    if not _security_context_ok(spec.get("securityContext"), container=False):
        return False
    volumes = spec.get("volumes")
    if volumes is not None and (type(volumes) is not list or not all(map(_volume_ok, volumes))):
        return False
    ns = spec.get("nodeSelector")
    if ns is not None and not _is_str_map(ns):
        return False
    tolerations = spec.get("tolerations")
    if tolerations is not None and (
        type(tolerations) is not list or not all(type(t) is dict for t in tolerations)
    ):
        return False
    affinity = spec.get("affinity")
    if affinity is not None and not _affinity_ok(affinity):
        return False
    for key, kind, _ in _SPEC_SCALARS:
        value = spec.get(key)
        if value is not None and type(value) is not kind:
            return False
    return True


def _affinity_ok(affinity: Any) -> bool:
    if type(affinity) is not dict:
        return False
    na = affinity.get("nodeAffinity")
    if na is None:
        return True
    if type(na) is not dict:
        return False
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is None:
        return True
    if type(req) is not dict:
        return False
    terms = req.get("nodeSelectorTerms")
    if terms is None:
        return True
    if type(terms) is not list:
        return False
    for term in terms:
        if type(term) is not dict:
            return False
        exprs = term.get("matchExpressions")
        if exprs is not None and not (
            type(exprs) is list and all(type(e) is dict for e in exprs)
        ):
            return False
    return True


def _shape_problems(spec: JSON, spec_path: str) -> list[Violation]:
    """The slow path: every problem, each with its path and message."""
    out: list[Violation] = []

    def expect(value: Any, types: type | tuple[type, ...], path: str, what: str) -> bool:
        if value is None:
            return False
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            out.append(invalid(path, f"must be {what}, got {value!r}"))
            return False
        if not isinstance(value, types):
            out.append(invalid(path, f"must be {what}, got {type(value).__name__}"))
            return False
        return True

    containers = spec.get("containers")
    if not isinstance(containers, list):
        out.append(invalid(f"{spec_path}.containers", "containers must be a list"))
    elif not containers:
        out.append(invalid(f"{spec_path}.containers", "a pod needs at least one container"))
    for list_name in ("initContainers", "ephemeralContainers"):
        if spec.get(list_name) is not None:
            expect(spec[list_name], list, f"{spec_path}.{list_name}", "a list")

    for list_name in ALL_CONTAINER_LISTS:
        items = spec.get(list_name)
        if not isinstance(items, list):
            continue
        for i, c in enumerate(items):
            cpath = f"{spec_path}.{list_name}[{i}]"
            if not isinstance(c, dict):
                out.append(invalid(cpath, "a container must be an object"))
                continue
            if not isinstance(c.get("name"), str):
                out.append(invalid(f"{cpath}.name", "a container needs a name"))
            _check_resources(c.get("resources"), f"{cpath}.resources", out, expect)
            _check_env(c, cpath, out, expect)
            for key in ("volumeMounts", "volumeDevices"):
                if key in c and expect(c[key], list, f"{cpath}.{key}", "a list"):
                    for j, m in enumerate(c[key]):
                        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                            out.append(invalid(f"{cpath}.{key}[{j}]", "needs a name"))
            sc: Any = c.get("securityContext")
            if expect(sc, dict, f"{cpath}.securityContext", "an object"):
                _check_security_context(sc, f"{cpath}.securityContext", expect, container=True)

    psc: Any = spec.get("securityContext")
    if expect(psc, dict, f"{spec_path}.securityContext", "an object"):
        _check_security_context(psc, f"{spec_path}.securityContext", expect, container=False)

    if expect(spec.get("volumes"), list, f"{spec_path}.volumes", "a list"):
        for i, v in enumerate(spec["volumes"]):
            vpath = f"{spec_path}.volumes[{i}]"
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                out.append(invalid(vpath, "a volume must be an object with a name"))
                continue
            for vtype, ref in (
                ("persistentVolumeClaim", "claimName"),
                ("configMap", "name"),
                ("secret", "secretName"),
            ):
                if vtype in v and (
                    not isinstance(v[vtype], dict) or not isinstance(v[vtype].get(ref), str)
                ):
                    out.append(invalid(f"{vpath}.{vtype}.{ref}", "must be a string"))
            if "projected" in v:
                projected: Any = v["projected"]
                sources: Any = projected.get("sources") if isinstance(projected, dict) else 0
                if sources is not None and not isinstance(sources, list):
                    out.append(invalid(f"{vpath}.projected.sources", "must be a list"))
                for j, src in enumerate(sources or ()):
                    if not isinstance(src, dict):
                        out.append(invalid(f"{vpath}.projected.sources[{j}]", "must be an object"))
                    elif "secret" in src and (
                        not isinstance(src["secret"], dict)
                        or not isinstance(src["secret"].get("name"), str)
                    ):
                        out.append(
                            invalid(
                                f"{vpath}.projected.sources[{j}].secret.name", "must be a string"
                            )
                        )

    ns = spec.get("nodeSelector")
    if ns is not None and not _is_str_map(ns):
        out.append(invalid(f"{spec_path}.nodeSelector", "must map strings to strings"))
    if expect(spec.get("tolerations"), list, f"{spec_path}.tolerations", "a list"):
        for i, t in enumerate(spec["tolerations"]):
            if not isinstance(t, dict):
                out.append(invalid(f"{spec_path}.tolerations[{i}]", "must be an object"))
    affinity: Any = spec.get("affinity")
    if expect(affinity, dict, f"{spec_path}.affinity", "an object"):
        _check_node_affinity(affinity, f"{spec_path}.affinity", out, expect)
    for key, kind, what in _SPEC_SCALARS:
        if key in spec:
            expect(spec[key], kind, f"{spec_path}.{key}", what)
    return out


def _check_resources(res: Any, path: str, out: list[Violation], expect: Any) -> None:
    if not expect(res, dict, path, "an object"):
        return
    for part in ("requests", "limits"):
        values = res.get(part)
        if not expect(values, dict, f"{path}.{part}", "an object"):
            continue
        for name, value in values.items():
            try:
                parse(value)
            except QuantityError as exc:
                out.append(invalid(f"{path}.{part}.{name}", str(exc)))


def _check_env(c: JSON, cpath: str, out: list[Violation], expect: Any) -> None:
    if expect(c.get("env"), list, f"{cpath}.env", "a list"):
        for j, e in enumerate(c["env"]):
            epath = f"{cpath}.env[{j}]"
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                out.append(invalid(epath, "an env var must be an object with a name"))
                continue
            vf: Any = e.get("valueFrom")
            if expect(vf, dict, f"{epath}.valueFrom", "an object"):
                ref: Any = vf.get("secretKeyRef")
                if expect(ref, dict, f"{epath}.valueFrom.secretKeyRef", "an object") and not (
                    isinstance(ref.get("name"), str)
                ):
                    out.append(invalid(f"{epath}.valueFrom.secretKeyRef.name", "must be a string"))
    if expect(c.get("envFrom"), list, f"{cpath}.envFrom", "a list"):
        for j, e in enumerate(c["envFrom"]):
            epath = f"{cpath}.envFrom[{j}]"
            if not isinstance(e, dict):
                out.append(invalid(epath, "must be an object"))
                continue
            ref2: Any = e.get("secretRef")
            if expect(ref2, dict, f"{epath}.secretRef", "an object") and not isinstance(
                ref2.get("name"), str
            ):
                out.append(invalid(f"{epath}.secretRef.name", "must be a string"))


def _check_security_context(sc: Any, path: str, expect: Any, *, container: bool) -> None:
    for key, value in sc.items():  # only the keys present: most contexts set few
        kind = _SECURITY_CONTEXT_TYPES.get(key)
        if kind is not None and (container or key not in _CONTAINER_ONLY):
            expect(value, kind[0], f"{path}.{key}", kind[1])
    if container and expect(sc.get("capabilities"), dict, f"{path}.capabilities", "an object"):
        for key in ("add", "drop"):
            values = sc["capabilities"].get(key)
            if values is not None and not (
                isinstance(values, list) and all(isinstance(x, str) for x in values)
            ):
                expect(0, str, f"{path}.capabilities.{key}", "a list of strings")


_SECURITY_CONTEXT_TYPES: dict[str, tuple[type, str]] = {
    "runAsUser": (int, "an integer"),
    "runAsGroup": (int, "an integer"),
    "fsGroup": (int, "an integer"),
    "runAsNonRoot": (bool, "a boolean"),
    "privileged": (bool, "a boolean"),
    "allowPrivilegeEscalation": (bool, "a boolean"),
    "seccompProfile": (dict, "an object"),
}
_CONTAINER_ONLY = frozenset({"privileged", "allowPrivilegeEscalation"})


def _check_node_affinity(affinity: Any, path: str, out: list[Violation], expect: Any) -> None:
    na: Any = affinity.get("nodeAffinity")
    if not expect(na, dict, f"{path}.nodeAffinity", "an object"):
        return
    req: Any = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    rpath = f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    if not expect(req, dict, rpath, "an object"):
        return
    terms: Any = req.get("nodeSelectorTerms")
    if expect(terms, list, f"{rpath}.nodeSelectorTerms", "a list"):
        for i, term in enumerate(terms):
            tpath = f"{rpath}.nodeSelectorTerms[{i}]"
            if not isinstance(term, dict):
                out.append(invalid(tpath, "must be an object"))
            elif term.get("matchExpressions") is not None and not (
                isinstance(term["matchExpressions"], list)
                and all(isinstance(e, dict) for e in term["matchExpressions"])
            ):
                out.append(invalid(f"{tpath}.matchExpressions", "must be a list of objects"))
