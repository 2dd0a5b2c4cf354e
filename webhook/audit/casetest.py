"""Declarative policy tests (``runguard test``), in the spirit of ``kyverno test``.

A case is a folder holding ``case.yaml``; folders whose name starts with ``_`` or ``.``
are skipped (shared policies live there)::

    description: a root pod is made non-root
    policy: ../_policies/platform   # policy directory, relative to the case (default: policy/)
    namespace: ml                   # admission namespace (default: the object's)
    mode: evaluate                  # evaluate (mutate then validate) | mutate | validate
    input: input.yaml               # one or more objects (default: input.yaml)
    old: old.yaml                   # validate as an UPDATE from this object
    expect:                         # one mapping for every object, or a list, one per object
      allowed: true
      applies: true                 # false: outside the selector / excluded namespace
      profile: 1xa100
      violations: [security.root]   # rule ids, compared as a sorted list
      mutations: [resources.clamped]
      warnings: [clamped]           # substrings, each found in some warning
      patch: empty                  # empty | nonempty
      object: expected.yaml         # the whole result object (file or inline)
      objectSubset: {spec: {...}}   # or only these keys (file or inline)
      absent: [spec.securityContext.runAsUser]   # dotted paths that must not exist
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.engine import Decision, evaluate, mutate, validate
from webhook.inputs.documents import InputError, load_documents, read_objects, read_text
from webhook.inputs.limits import CASE_FILES
from webhook.policy.model import Policy

CASE_FILE = "case.yaml"
CASE_KEYS = frozenset({"description", "policy", "namespace", "mode", "input", "old", "expect"})


@dataclass
class CaseResult:
    name: str
    description: str
    failures: list[str] = field(default_factory=list)
    # The case could not be run: a file unreadable or past the input limits, a malformed
    # case.yaml, a bad policy (``runguard test`` exits 2, as for any bad input).
    bad_input: bool = False

    @property
    def passed(self) -> bool:
        return not self.failures


def find_cases(root: Path) -> list[Path]:
    """Case folders under ``root`` (itself included), sorted."""
    if (root / CASE_FILE).is_file():
        return [root]
    return sorted(
        p.parent
        for p in root.rglob(CASE_FILE)
        if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts[:-1])
    )


class _PolicyCache:
    def __init__(self) -> None:
        self._policies: dict[Path, Policy] = {}

    def get(self, directory: Path) -> Policy:
        from webhook.policy.loader import load_policy

        key = directory.resolve()
        if key not in self._policies:
            self._policies[key] = load_policy(key)
        return self._policies[key]


_cache = _PolicyCache()


def run_case(folder: Path, root: Path | None = None) -> CaseResult:
    """Run one case folder; every problem, including a broken case file, is a failure."""
    from webhook.policy.errors import PolicyError

    name = str(folder.relative_to(root)) if root else folder.name
    result = CaseResult(name=name, description="")
    try:
        case = _read_case(folder, result)
        objects = case.objects
        for i, (obj, expect) in enumerate(zip(objects, case.expects, strict=True)):
            decision = _judge(case, i, obj)
            prefix = f"object {i}: " if len(objects) > 1 else ""
            result.failures += [prefix + f for f in check(decision, expect, folder)]
    except (CaseError, InputError) as exc:
        result.failures.append(str(exc))
        result.bad_input = True
    except PolicyError as exc:
        result.failures += [f"policy: {e}" for e in exc.errors]
        result.bad_input = True
    return result


@dataclass
class _Case:
    """A case file read: what to judge, how, and what to expect of each object."""

    policy: Policy
    objects: list[Any]
    old: list[Any] | None
    expects: list[Any]
    mode: Any
    namespace: str | None


def _read_case(folder: Path, result: CaseResult) -> _Case:
    """``case.yaml`` checked and its files read, in the order a broken one is reported
    (the description is kept in ``result`` as soon as it is read)."""
    case = _load_yaml(folder / CASE_FILE)
    if not isinstance(case, dict):
        raise CaseError("case.yaml must be a mapping")
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise CaseError(f"case.yaml: unknown keys {sorted(map(str, unknown))}")
    result.description = str(case.get("description", ""))
    policy = _cache.get(folder / _file_name(case.get("policy", "policy"), "policy"))
    objects = _objects(folder, case.get("input", "input.yaml"))
    old = _objects(folder, case["old"], "old") if "old" in case else None
    if old is not None and len(old) != len(objects):
        raise CaseError(f"old must hold as many objects as input ({len(objects)})")
    expects = case.get("expect")
    if isinstance(expects, dict):
        expects = [expects] * len(objects)
    if not isinstance(expects, list) or len(expects) != len(objects):
        raise CaseError(f"expect must be a mapping or a list of {len(objects)} mappings")
    namespace = case.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise CaseError("namespace must be a string")
    return _Case(policy, objects, old, expects, case.get("mode", "evaluate"), namespace)


def _judge(case: _Case, i: int, obj: Any) -> Decision:
    """The decision on the case's ``i``-th object, in the case's mode."""
    if case.mode == "mutate":
        return mutate(obj, case.policy, namespace=case.namespace)
    if case.mode == "validate":
        previous = case.old[i] if case.old else None
        return validate(obj, case.policy, namespace=case.namespace, old=previous)
    if case.mode == "evaluate":
        return evaluate(obj, case.policy, namespace=case.namespace)
    raise CaseError(f"mode {case.mode!r} is not evaluate, mutate or validate")


class CaseError(Exception):
    """A case folder that cannot be run as written."""


def _load_yaml(path: Path) -> Any:
    """The one YAML document of a case file, read within ``CASE_FILES``' limits."""
    name, text = read_text(str(path), CASE_FILES)
    docs = load_documents(text, name, CASE_FILES)
    if len(docs) > 1:
        raise CaseError(f"{name}: expected one YAML document, found {len(docs)}")
    return docs[0] if docs else None


def _file_name(value: Any, key: str) -> str:
    """A relative file or directory name given in case.yaml."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise CaseError(f"{key} must be a file or directory name")
    return value


def _objects(folder: Path, spec: Any, key: str = "input") -> list[Any]:
    """Objects named by a file (read as ``runguard apply`` reads them) or written inline."""
    if isinstance(spec, str):
        return read_objects(str(folder / _file_name(spec, key)))
    return spec if isinstance(spec, list) else [spec]


def _expected_object(folder: Path, value: Any) -> Any:
    if isinstance(value, str):
        objects = _objects(folder, value, "object")
        if len(objects) != 1:
            raise CaseError(f"{value}: expected exactly one object")
        return objects[0]
    return value


def check(decision: Decision, expect: Any, folder: Path) -> list[str]:
    """Every way ``decision`` differs from ``expect``."""
    if not isinstance(expect, dict):
        raise CaseError("each expect entry must be a mapping")
    unknown = set(expect) - EXPECT_KEYS
    if unknown:
        raise CaseError(f"expect: unknown keys {sorted(map(str, unknown))}")
    for key in ("violations", "mutations", "warnings", "absent"):
        value = expect.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise CaseError(f"expect.{key} must be a list of strings")
    return [
        failure
        for key, compare in _EXPECTATIONS.items()
        if key in expect
        for failure in compare(decision, expect[key], folder)
    ]


def _allowed(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    if decision.allowed != want:
        detail = f": {decision.message()}" if decision.violations else ""
        yield f"allowed is {decision.allowed}, expected {want}{detail}"


def _applies(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    if decision.applies != want:
        yield f"applies is {decision.applies}, expected {want}"


def _profile(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    if decision.profile != want:
        yield f"profile is {decision.profile!r}, expected {want!r}"


def _violations(decision: Decision, want: list[str], folder: Path) -> Iterator[str]:
    got = sorted(v.rule for v in decision.violations)
    if got != sorted(want):
        shown = "; ".join(str(v) for v in decision.violations) or "none"
        yield f"violations {got}, expected {sorted(want)} ({shown})"


def _mutations(decision: Decision, want: list[str], folder: Path) -> Iterator[str]:
    got = [c.rule for c in decision.mutations]
    if sorted(got) != sorted(want):
        yield f"mutations {got}, expected {want}"


def _warnings(decision: Decision, want: list[str] | None, folder: Path) -> Iterator[str]:
    for text in want or ():
        if not any(text in w for w in decision.warnings):
            yield f"no warning contains {text!r} (warnings: {decision.warnings})"


def _patch(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    if (want == "empty") != (not decision.patch):
        yield f"patch is {decision.patch!r}, expected {want}"


def _object(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    expected = _expected_object(folder, want)
    if decision.object != expected:
        yield "object differs: " + "; ".join(differences(expected, decision.object)[:5])


def _object_subset(decision: Decision, want: Any, folder: Path) -> Iterator[str]:
    diffs = differences(_expected_object(folder, want), decision.object, subset=True)
    if diffs:
        yield "object subset differs: " + "; ".join(diffs[:5])


def _absent(decision: Decision, want: list[str] | None, folder: Path) -> Iterator[str]:
    for path in want or ():
        if _exists(decision.object, path):
            yield f"{path} should be absent, is {_get(decision.object, path)!r}"


# Each key of ``expect`` and how a decision is held to it, in the order failures are told.
_EXPECTATIONS: dict[str, Callable[[Decision, Any, Path], Iterator[str]]] = {
    "allowed": _allowed,
    "applies": _applies,
    "profile": _profile,
    "violations": _violations,
    "mutations": _mutations,
    "warnings": _warnings,
    "patch": _patch,
    "object": _object,
    "objectSubset": _object_subset,
    "absent": _absent,
}
EXPECT_KEYS = frozenset(_EXPECTATIONS)


def differences(want: Any, got: Any, path: str = "", *, subset: bool = False) -> list[str]:
    """Human-readable differences; with ``subset``, keys missing from ``want`` are ignored."""
    where = path or "(root)"
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for key, value in want.items():
            sub = f"{path}.{key}" if path else key
            if key not in got:
                out.append(f"{sub} missing (want {value!r})")
            else:
                out += differences(value, got[key], sub, subset=subset)
        if not subset:
            out += [f"{path}.{k}" if path else k for k in got if k not in want]
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, want {len(want)}: {got!r}"]
        return [
            d
            for i, (w, g) in enumerate(zip(want, got, strict=True))
            for d in differences(w, g, f"{path}[{i}]", subset=subset)
        ]
    if want != got or type(want) is not type(got):
        return [f"{where}: {got!r}, want {want!r}"]
    return []


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _segments(path: str) -> Iterator[str | int]:
    for key, index in _SEGMENT.findall(path):
        yield int(index) if index else key


def _get(obj: Any, path: str) -> Any:
    for seg in _segments(path):
        obj = obj[seg]
    return obj


def _exists(obj: Any, path: str) -> bool:
    try:
        _get(obj, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True
