"""The shape check: every field the engine reads or writes, type-checked before any step.

One declaration (``POD_SPEC`` below) says what each field must look like. From it come
two checkers that cannot disagree: a yes/no function compiled from the declaration
(``Shape.compile``: straight-line Python, as fast as a hand-written check, for the
common well-formed case) and a walker that reports each problem as an ``input.invalid``
violation naming its path (run only when the compiled check says no). Steps and checks
can then index freely: a malformed object is denied, never an exception. A new field the
engine reads is one line in the declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.engine.types import INVALID, JSON, Violation
from webhook.inputs.quantity import PARSED, QuantityError, parse

Path = tuple[str | int, ...]


def invalid(path: str, message: str) -> Violation:
    return Violation(INVALID, path, message)


def format_path(path: Path) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


class _Code:
    """Source lines under construction, with indentation and fresh variable names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1
        self.count = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def var(self) -> str:
        self.count += 1
        return f"v{self.count}"


def _quantities_ok(values: Any) -> bool:
    if type(values) is not dict:
        return False
    for value in values.values():
        if type(value) is str and value in PARSED:
            continue  # parsed before (PARSED holds only quantities): no call
        try:
            parse(value)
        except QuantityError:
            return False
    return True


class Shape:
    """What one value must look like; ``None`` (absent) is always fine."""

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        raise NotImplementedError

    def emit(self, var: str, code: _Code) -> None:
        """Lines that ``return False`` when ``var`` (not None) does not have this shape."""
        raise NotImplementedError

    def compile(self) -> Callable[[Any], bool]:
        """A yes/no check of this shape, generated as straight-line Python."""
        code = _Code()
        code.line("if v is None: return True")
        self.emit("v", code)
        source = "def ok(v):\n" + "\n".join(code.lines) + "\n    return True\n"
        namespace: dict[str, Any] = {"quantities_ok": _quantities_ok}
        exec(compile(source, f"<shape {type(self).__name__}>", "exec"), namespace)  # noqa: S102
        fn: Callable[[Any], bool] = namespace["ok"]
        return fn

    @staticmethod
    def problem(path: Path, message: str, out: list[Violation]) -> None:
        out.append(invalid(format_path(path), message))


class Scalar(Shape):
    """A str, int or bool; a bool never counts as an int."""

    def __init__(self, kind: type, what: str) -> None:
        self.kind, self.what = kind, what

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None or type(value) is self.kind:
            return
        got = repr(value) if isinstance(value, bool) else type(value).__name__
        self.problem(path, f"must be {self.what}, got {got}", out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not {self.kind.__name__}: return False")


class Obj(Shape):
    """An object; the listed fields, when present, have their own shapes."""

    def __init__(self, fields: Mapping[str, Shape] | None = None, what: str = "an object") -> None:
        self.fields = dict(fields or {})
        self.what = what

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not dict:
            got = repr(value) if isinstance(value, bool) else type(value).__name__
            self.problem(path, f"must be {self.what}, got {got}", out)
            return
        for key, shape in self.fields.items():
            item = value.get(key)
            if item is not None:
                shape.check(item, (*path, key), out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not dict: return False")
        self.emit_fields(var, code)

    def emit_fields(self, var: str, code: _Code) -> None:
        # ``in`` before indexing: most declared keys are absent from a given object, and
        # the test costs less than a ``.get`` call
        for key, shape in self.fields.items():
            item = code.var()
            code.line(f"if {key!r} in {var}:")
            code.line(f"    {item} = {var}[{key!r}]")
            code.line(f"    if {item} is not None:")
            code.depth += 2
            shape.emit(item, code)
            code.line("pass")
            code.depth -= 2


class Named(Obj):
    """An object that must have a string ``name`` (containers, env vars, volumes, mounts)."""

    def __init__(self, fields: Mapping[str, Shape] | None = None, message: str = "needs a name"):
        super().__init__(fields)
        self.message = message

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if type(value) is not dict or type(value.get("name")) is not str:
            self.problem(path, self.message, out)
            return
        super().check(value, path, out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not dict or type({var}.get('name')) is not str: return False")
        self.emit_fields(var, code)


class Required(Shape):
    """A reference field that must be a string when its parent is present."""

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if type(value) is not str:
            self.problem(path, "must be a string", out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not str: return False")


class Ref(Obj):
    """``{<key>: "name", ...}``: a reference object whose name key must be a string."""

    def __init__(self, key: str, fields: Mapping[str, Shape] | None = None) -> None:
        super().__init__(fields)
        self.key = key

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if type(value) is not dict or type(value.get(self.key)) is not str:
            self.problem((*path, self.key), "must be a string", out)
            return
        super().check(value, path, out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(
            f"if type({var}) is not dict or type({var}.get({self.key!r})) is not str: return False"
        )
        self.emit_fields(var, code)


class ListOf(Shape):
    def __init__(self, item: Shape, what: str = "a list") -> None:
        self.item, self.what = item, what

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not list:
            self.problem(path, f"must be {self.what}, got {type(value).__name__}", out)
            return
        item = self.item
        for i, x in enumerate(value):
            item.check(x, (*path, i), out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not list: return False")
        each = code.var()
        code.line(f"for {each} in {var}:")
        code.depth += 1
        self.item.emit(each, code)
        code.line("pass")
        code.depth -= 1


class ObjectItem(Shape):
    """A list item that must be an object (tolerations, selector terms, sources)."""

    def __init__(self, inner: Obj | None = None) -> None:
        self.inner = inner

    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if type(value) is not dict:
            self.problem(path, "must be an object", out)
        elif self.inner is not None:
            self.inner.check(value, path, out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not dict: return False")
        if self.inner is not None:
            self.inner.emit_fields(var, code)


class Strings(Shape):
    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not list or not all(type(x) is str for x in value):
            self.problem(path, "must be a list of strings", out)

    def emit(self, var: str, code: _Code) -> None:
        # a loop: all() over a generator costs more than the few items it sees
        code.line(f"if type({var}) is not list: return False")
        code.line(f"for x in {var}:")
        code.line("    if type(x) is not str: return False")


class Ints(Shape):
    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not list or not all(type(x) is int for x in value):
            self.problem(path, "must be a list of integers", out)

    def emit(self, var: str, code: _Code) -> None:
        # a loop: all() over a generator costs more than the few items it sees
        code.line(f"if type({var}) is not list: return False")
        code.line(f"for x in {var}:")
        code.line("    if type(x) is not int: return False")


class StrMap(Shape):
    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not dict or not all(
            type(k) is str and type(v) is str for k, v in value.items()
        ):
            self.problem(path, "must map strings to strings", out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if type({var}) is not dict: return False")
        code.line(f"for k, x in {var}.items():")
        code.line("    if type(k) is not str or type(x) is not str: return False")


class Quantities(Shape):
    def check(self, value: Any, path: Path, out: list[Violation]) -> None:
        if value is None:
            return
        if type(value) is not dict:
            self.problem(path, f"must be an object, got {type(value).__name__}", out)
            return
        for name, quantity in value.items():
            try:
                parse(quantity)
            except QuantityError as exc:
                self.problem((*path, name), str(exc), out)

    def emit(self, var: str, code: _Code) -> None:
        code.line(f"if not quantities_ok({var}): return False")


STR = Scalar(str, "a string")
INT = Scalar(int, "an integer")
BOOL = Scalar(bool, "a boolean")

_POD_SECURITY = {
    "runAsUser": INT,
    "runAsGroup": INT,
    "runAsNonRoot": BOOL,
    "seccompProfile": Obj({"type": STR}),
    "appArmorProfile": Obj({"type": STR}),
    "seLinuxOptions": Obj({"type": STR, "user": STR, "role": STR}),
    "windowsOptions": Obj({"hostProcess": BOOL}),
}
# A probe or lifecycle handler: the Pod Security Standards forbid a ``host`` in either.
_HANDLER = Obj({"httpGet": Obj({"host": STR}), "tcpSocket": Obj({"host": STR})})
CONTAINER = Named(
    {
        "resources": Obj({"requests": Quantities(), "limits": Quantities()}),
        "restartPolicy": STR,
        "env": ListOf(
            Named(
                {"valueFrom": Obj({"secretKeyRef": Ref("name")})},
                "an env var must be an object with a name",
            )
        ),
        "envFrom": ListOf(ObjectItem(Obj({"secretRef": Ref("name")}))),
        "volumeMounts": ListOf(Named()),
        "volumeDevices": ListOf(Named()),
        "securityContext": Obj(
            {
                **_POD_SECURITY,
                "privileged": BOOL,
                "allowPrivilegeEscalation": BOOL,
                "capabilities": Obj({"add": Strings(), "drop": Strings()}),
                "procMount": STR,
            }
        ),
        "ports": ListOf(ObjectItem(Obj({"hostPort": INT}))),
        "livenessProbe": _HANDLER,
        "readinessProbe": _HANDLER,
        "startupProbe": _HANDLER,
        "lifecycle": Obj({"postStart": _HANDLER, "preStop": _HANDLER}),
    },
    "a container needs a name",
)
VOLUME = Named(
    {
        "persistentVolumeClaim": Ref("claimName"),
        "configMap": Ref("name"),
        "secret": Ref("secretName"),
        "projected": Obj(
            {"sources": ListOf(ObjectItem(Obj({"secret": Ref("name"), "configMap": Ref("name")})))}
        ),
        "ephemeral": Obj({"volumeClaimTemplate": Obj({"spec": Obj()})}),
    },
    "a volume must be an object with a name",
)
_NODE_SELECTOR_TERMS = ListOf(
    ObjectItem(Obj({"matchExpressions": ListOf(ObjectItem(), "a list of objects")}))
)
POD_SPEC = Obj(
    {
        "initContainers": ListOf(CONTAINER),
        "ephemeralContainers": ListOf(CONTAINER),
        "securityContext": Obj(
            {
                **_POD_SECURITY,
                "fsGroup": INT,
                "supplementalGroups": Ints(),
                "sysctls": ListOf(Named(message="a sysctl must be an object with a name")),
            }
        ),
        "os": Obj({"name": STR}),
        "volumes": ListOf(VOLUME),
        "nodeSelector": StrMap(),
        "tolerations": ListOf(ObjectItem()),
        "affinity": Obj(
            {
                "nodeAffinity": Obj(
                    {
                        "requiredDuringSchedulingIgnoredDuringExecution": Obj(
                            {"nodeSelectorTerms": _NODE_SELECTOR_TERMS}
                        )
                    }
                )
            }
        ),
        "resources": Obj({"requests": Quantities(), "limits": Quantities()}),
        "imagePullSecrets": ListOf(ObjectItem(Obj({"name": STR}))),
        "priorityClassName": STR,
        "runtimeClassName": STR,
        "hostNetwork": BOOL,
        "hostPID": BOOL,
        "hostIPC": BOOL,
    }
)


_CONTAINERS_OK = ListOf(CONTAINER).compile()
_POD_SPEC_OK = POD_SPEC.compile()


def check_shape(spec: JSON, spec_path: str) -> list[Violation]:
    """Every ``input.invalid`` problem of a pod spec, for the fields the engine touches."""
    containers = spec.get("containers")
    if type(containers) is list and containers and _CONTAINERS_OK(containers):
        if _POD_SPEC_OK(spec):
            return []  # the common case, decided without building a single message
    out: list[Violation] = []
    containers = spec.get("containers")
    if type(containers) is not list:
        out.append(invalid(f"{spec_path}.containers", "containers must be a list"))
    elif not containers:
        out.append(invalid(f"{spec_path}.containers", "a pod needs at least one container"))
    else:
        for i, container in enumerate(containers):
            CONTAINER.check(container, (spec_path, "containers", i), out)
    POD_SPEC.check(spec, (spec_path,), out)
    return out
