"""Loading a policy directory: YAML with line numbers, schema, cross-document checks.

Objects are built from PyYAML's node tree (``yaml.compose_all``) rather than from
``yaml.safe_load`` so that every key keeps the line it was written on: schema errors
(``jsonschema``'s ``absolute_path``) and cross-document checks are reported as
``file:line: key: message``. Every problem in every file is collected before anything
is raised, so an admin sees them all at once.
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError

from webhook.policy import model
from webhook.policy.declare import iter_keys
from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.formats import FORMAT_PROBLEMS, quantity_problem
from webhook.policy.kube import RESOURCE_LIST, resolve_resource_name
from webhook.policy.model import KINDS, Policy, build_policy
from webhook.policy.schema import validator
from webhook.quantity import parse

__all__ = [
    "POLICY_SUFFIXES",
    "PolicySource",
    "SourceDocument",
    "format_key",
    "load_policy",
    "policy_files",
    "read_policy",
]

POLICY_SUFFIXES = (".yaml", ".yml")
_MAX_NODES = 100_000  # an alias bomb expands past this long before memory runs out

Path_ = tuple[str | int, ...]


@dataclass
class SourceDocument:
    """One YAML document: its data and, for each key path, the line it is written on."""

    file: str
    line: int
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    raw: dict[Path_, str] = field(default_factory=dict)  # scalar source text, for hints

    def line_of(self, path: Path_) -> int:
        """The line of ``path``, else of its closest ancestor written in the file."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return self.line

    def issue(self, path: Path_, message: str) -> PolicyIssue:
        return PolicyIssue(self.file, self.line_of(path), format_key(path), message)

    def get(self, *path: str | int) -> Any:
        """The value at ``path``, or None when any step is missing or of the wrong type."""
        node = self.data
        for step in path:
            if isinstance(step, str) and isinstance(node, dict):
                node = node.get(step)
            elif isinstance(step, int) and isinstance(node, list) and step < len(node):
                node = node[step]
            else:
                return None
        return node

    @property
    def kind(self) -> str | None:
        kind = self.get("kind")
        return kind if kind in KINDS else None

    @property
    def name(self) -> str | None:
        name = self.get("metadata", "name")
        return name if isinstance(name, str) else None

    @property
    def where(self) -> str:
        """``file:line`` of the document's ``kind``, to point at it from another issue."""
        return f"{self.file}:{self.line_of(('kind',))}"


@dataclass
class PolicySource:
    """Everything read from a policy directory, good or bad.

    ``policy`` is set only when ``errors`` is empty. ``lint`` reads the documents to
    add warnings; ``load_policy`` raises on errors.
    """

    directory: str
    documents: list[SourceDocument] = field(default_factory=list)
    errors: list[PolicyIssue] = field(default_factory=list)
    policy: Policy | None = None

    @property
    def run_policies(self) -> list[SourceDocument]:
        return [d for d in self.documents if d.kind == "RunPolicy"]

    @property
    def profiles(self) -> list[SourceDocument]:
        return [d for d in self.documents if d.kind == "Profile"]

    @property
    def run_policy(self) -> SourceDocument | None:
        found = self.run_policies
        return found[0] if len(found) == 1 else None


def load_policy(directory: str | Path) -> Policy:
    """Load and check every policy file in ``directory``; raise PolicyError listing all issues."""
    source = read_policy(directory)
    if source.policy is None:
        raise PolicyError(source.errors)
    return source.policy


def policy_files(directory: Path) -> list[Path]:
    """The visible ``*.yaml``/``*.yml`` names in ``directory``, sorted; not recursive.

    A mounted ConfigMap holds ``..data`` and ``..2024_...`` entries and one visible
    symlink per key (``file -> ..data/file``): the hidden entries are skipped, the
    symlinks are followed.
    """
    return sorted(
        p
        for p in directory.iterdir()
        if not p.name.startswith(".") and p.suffix in POLICY_SUFFIXES and not p.is_dir()
    )


def read_policy(directory: str | Path) -> PolicySource:
    """Read ``directory`` into a PolicySource; never raises for anything in the files."""
    root = Path(directory)
    source = PolicySource(str(directory))
    if not root.is_dir():
        reason = "does not exist" if not root.exists() else "is not a directory"
        source.errors.append(PolicyIssue(str(directory), None, "", f"policy directory {reason}"))
        return source
    try:
        files = policy_files(root)
    except OSError as exc:
        source.errors.append(PolicyIssue(str(directory), None, "", f"cannot list: {exc.strerror}"))
        return source
    if not files:
        source.errors.append(
            PolicyIssue(str(directory), None, "", "no policy files (*.yaml, *.yml)")
        )
        return source

    check = validator()
    for path in files:
        docs, issues = _read_file(path)
        source.errors.extend(issues)
        for doc in docs:
            source.documents.append(doc)
            source.errors.extend(_schema_issues(check, doc))
    source.errors.extend(_cross_document_issues(source))
    source.errors.sort(key=lambda i: (i.file, i.line or 0, i.key))

    if not source.errors:
        run_policy = source.run_policy
        assert run_policy is not None  # no errors: exactly one RunPolicy
        try:
            source.policy = build_policy(run_policy.data, [p.data for p in source.profiles])
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            # Schema-valid documents the model cannot build are a bug in the schema.
            source.errors.append(
                PolicyIssue(run_policy.file, run_policy.line, "", f"cannot build policy: {exc}")
            )
    return source


# --- YAML with lines ----------------------------------------------------------------


def _read_file(path: Path) -> tuple[list[SourceDocument], list[PolicyIssue]]:
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [PolicyIssue(name, None, "", "cannot read: broken symlink or file removed")]
    except UnicodeDecodeError as exc:
        return [], [PolicyIssue(name, None, "", f"not UTF-8 text ({exc.reason})")]
    except OSError as exc:
        return [], [PolicyIssue(name, None, "", f"cannot read: {exc.strerror}")]

    docs: list[SourceDocument] = []
    issues: list[PolicyIssue] = []
    try:
        for node in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
                continue  # an empty document (a trailing ---)
            builder = _Builder(name)
            doc = SourceDocument(name, node.start_mark.line + 1, None)
            doc.data = builder.build(node, (), doc)
            issues.extend(builder.issues)
            if not isinstance(doc.data, dict):
                issues.append(
                    PolicyIssue(
                        name,
                        doc.line,
                        "",
                        "a policy document must be a mapping (apiVersion, kind, ...)",
                    )
                )
                continue
            docs.append(doc)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or "invalid YAML"
        if exc.context:
            problem = f"{problem} ({exc.context}"
            if exc.context_mark is not None:
                problem += f" at line {exc.context_mark.line + 1}"
            problem += ")"
        issues.append(PolicyIssue(name, line, "", f"YAML syntax error: {problem}"))
    except yaml.YAMLError as exc:
        issues.append(PolicyIssue(name, None, "", f"YAML error: {exc}"))
    return docs, issues


_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Builder:
    """Builds plain data from a node tree, recording lines and reporting what JSON cannot hold."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.issues: list[PolicyIssue] = []
        self._constructor = yaml.SafeLoader("")  # only its scalar constructors are used
        self._active: set[int] = set()
        self._count = 0

    def _issue(self, node: yaml.Node, path: Path_, message: str) -> None:
        self.issues.append(
            PolicyIssue(self.file, node.start_mark.line + 1, format_key(path), message)
        )

    def build(self, node: yaml.Node, path: Path_, doc: SourceDocument) -> Any:
        self._count += 1
        if self._count > _MAX_NODES:
            if self._count == _MAX_NODES + 1:
                self._issue(node, path, f"document too large (over {_MAX_NODES} values)")
            return None
        if id(node) in self._active:
            self._issue(node, path, "recursive alias")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path, doc)
            if isinstance(node, yaml.SequenceNode):
                if node.tag != _SEQ_TAG:
                    self._issue(node, path, f"unsupported YAML tag {node.tag}")
                out = []
                for i, item in enumerate(node.value):
                    doc.lines.setdefault((*path, i), item.start_mark.line + 1)
                    out.append(self.build(item, (*path, i), doc))
                return out
            return self._scalar(node, path, doc)
        finally:
            self._active.discard(id(node))

    def _scalar(self, node: yaml.Node, path: Path_, doc: SourceDocument) -> Any:
        doc.raw[path] = str(node.value)
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self._issue(node, path, f"invalid value: {problem}")
            return str(node.value)
        if isinstance(value, datetime.date | bytes):
            return str(node.value)  # JSON has no timestamps or binary: keep the text
        return value

    def _mapping(self, node: yaml.MappingNode, path: Path_, doc: SourceDocument) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            self._issue(node, path, f"unsupported YAML tag {node.tag}")
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            # YAML merge keys (<<: *anchor): merged first, so explicit keys win.
            parts = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for part in parts:
                value = self.build(part, path, doc)
                if isinstance(value, dict):
                    out.update(value)
                else:
                    self._issue(value_node, path, "a merge key (<<) needs a mapping")
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._issue(key_node, path, "a key must be a plain scalar")
                continue
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                first = f" (first at line {seen[key]})" if seen[key] != line else ""
                self._issue(key_node, (*path, key), f"duplicate key{first}")
            seen[key] = line
            doc.lines[(*path, key)] = line
            out[key] = self.build(value_node, (*path, key), doc)
        return out


# --- schema errors ------------------------------------------------------------------

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}
# Keywords that only approximate a runguard format for editors: the format says it better.
_SHADOWED_BY_FORMAT = {"pattern", "maxLength", "minLength", "minimum"}


def format_key(path: Path_) -> str:
    """``("spec", "tolerations", 0, "key")`` -> ``spec.tolerations[0].key``."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif step.replace("-", "").replace("_", "").isalnum():
            out += f".{step}" if out else step
        else:
            out += f'["{step}"]'
    return out


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _show_list(values: Any) -> str:
    return ", ".join("null" if v is None else str(v) for v in values)


def _schema_issues(check: Draft202012Validator, doc: SourceDocument) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    for error in check.iter_errors(doc.data):
        issues.extend(_translate(error, doc))
    return list(dict.fromkeys(issues))  # one missing key can be reported by several branches


def _translate(error: ValidationError, doc: SourceDocument) -> list[PolicyIssue]:
    path: Path_ = tuple(error.absolute_path)
    keyword = error.validator
    schema = error.schema if isinstance(error.schema, dict) else {}
    fmt = schema.get("format")
    if keyword in _SHADOWED_BY_FORMAT and fmt in FORMAT_PROBLEMS:
        return []
    instance = error.instance
    if "propertyNames" in error.absolute_schema_path:
        path = (*path, str(instance))  # the error is about the key itself

    if keyword == "additionalProperties" and isinstance(instance, dict):
        known = set(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        return [
            doc.issue((*path, key), _unknown_key(key, known, bool(patterns)))
            for key in instance
            if key not in known and not any(re.search(p, key) for p in patterns)
        ]
    if keyword == "required" and isinstance(instance, dict):
        return [
            doc.issue((*path, key), "required key is missing")
            for key in error.validator_value
            if key not in instance
        ]
    if keyword == "type":
        return [doc.issue(path, _type_message(error.validator_value, instance, doc.raw.get(path)))]
    if keyword == "enum":
        message = f"{_describe(instance)} is not one of {_show_list(error.validator_value)}"
    elif keyword == "const":
        message = (
            'must be empty with operator "Exists"'
            if error.validator_value == ""
            else f"must be {error.validator_value}, not {_describe(instance)}"
        )
    elif keyword == "format":
        problem = FORMAT_PROBLEMS.get(str(error.validator_value))
        message = (problem(instance) if problem else None) or error.message
    elif keyword in ("minItems", "minProperties"):
        message = "must not be empty" if error.validator_value == 1 else error.message
    elif keyword == "maxItems" and error.validator_value == 0:
        message = "must be empty with this operator"
    elif keyword == "maxProperties" and error.validator_value == 1:
        message = "set exactly one of its keys"
    elif keyword == "uniqueItems":
        message = "has duplicate items"
    elif keyword == "minimum":
        message = f"{_describe(instance)} is below the minimum {error.validator_value}"
    elif keyword == "maximum":
        message = f"{_describe(instance)} is above the maximum {error.validator_value}"
    elif keyword == "minLength" and error.validator_value == 1:
        message = "must not be empty"
    else:
        message = error.message
    return [doc.issue(path, message)]


def _unknown_key(key: str, known: set[str], resource_list: bool) -> str:
    message = f'unknown key "{key}"'
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    aliases = {"mem": "memory", "disk": "ephemeral-storage", "gpus": "gpu"}
    hint = aliases.get(key) if resource_list else None
    if hint or close:
        message += f' (did you mean "{hint or close[0]}"?)'
    elif resource_list:
        message += " (cpu, memory, gpu, ephemeral-storage or an extended resource domain/name)"
    elif known:
        message += f" (expected one of {', '.join(sorted(known))})"
    return message


def _type_message(expected: Any, instance: Any, raw: str | None) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    wanted = " or ".join(_TYPE_NAMES.get(n, n) for n in names)
    message = f"expected {wanted}, got {_describe(instance)}"
    if names == ["string"] and raw is not None and not isinstance(instance, dict | list):
        message += f'; quote it ("{raw}") to mean text'
    return message


# --- checks across documents --------------------------------------------------------


def resource_values(doc: SourceDocument, path: Path_, gpu: str) -> dict[str, tuple[str, Decimal]]:
    """Valid quantities of the resource list at ``path``: resolved name -> (key, value)."""
    raw = doc.get(*path)
    out: dict[str, tuple[str, Decimal]] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        is_scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
        if is_scalar and quantity_problem(value) is None:
            out[resolve_resource_name(key, gpu)] = (key, parse(value))
    return out


def gpu_resource_name(source: PolicySource) -> str:
    run_policy = source.run_policy
    return model.gpu_resource_name(run_policy.get("spec") if run_policy else None)


def _cross_document_issues(source: PolicySource) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    run_policies = source.run_policies
    if not run_policies:
        issues.append(
            PolicyIssue(
                source.directory, None, "", "no RunPolicy document (exactly one is required)"
            )
        )
    elif len(run_policies) > 1:
        for doc in run_policies:
            others = ", ".join(o.where for o in run_policies if o is not doc)
            issues.append(
                doc.issue(("kind",), f"more than one RunPolicy (also at {others}); keep one")
            )

    by_name: dict[str, list[SourceDocument]] = {}
    for doc in source.profiles:
        if doc.name is not None:
            by_name.setdefault(doc.name, []).append(doc)
    for name, docs in by_name.items():
        for doc in docs if len(docs) > 1 else ():
            others = ", ".join(
                f"{o.file}:{o.line_of(('metadata', 'name'))}" for o in docs if o is not doc
            )
            issues.append(
                doc.issue(
                    ("metadata", "name"), f'duplicate profile name "{name}" (also at {others})'
                )
            )

    gpu = gpu_resource_name(source)
    for doc in source.documents:
        for path in RESOURCE_LISTS.get(doc.kind or "", ()):
            issues.extend(_duplicate_resources(doc, path, gpu))

    for run_policy in run_policies:
        issues.extend(_run_policy_issues(run_policy, source.profiles, set(by_name), gpu))
    return issues


def _run_policy_issues(
    run_policy: SourceDocument, profiles: list[SourceDocument], names: set[str], gpu: str
) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    default = run_policy.get("spec", "profiles", "default")
    if isinstance(default, str) and default not in names:
        known = ", ".join(sorted(names)) or "none"
        issues.append(
            run_policy.issue(
                ("spec", "profiles", "default"),
                f'profile "{default}" is not defined (profiles: {known})',
            )
        )
    factor = run_policy.get("spec", "resources", "memoryLimitFactor")
    if isinstance(factor, float) and not math.isfinite(factor):
        issues.append(
            run_policy.issue(("spec", "resources", "memoryLimitFactor"), "must be a finite number")
        )
    classes = run_policy.get("spec", "scheduling", "priorityClasses")
    if isinstance(classes, dict):
        allowed, pc_default = classes.get("allowed"), classes.get("default")
        if isinstance(allowed, list) and isinstance(pc_default, str) and pc_default not in allowed:
            issues.append(
                run_policy.issue(
                    ("spec", "scheduling", "priorityClasses", "default"),
                    f'"{pc_default}" is not in the allowed priority classes '
                    f"({_show_list(allowed)})",
                )
            )

    maximums_path: Path_ = ("spec", "resources", "maximums")
    maximums = resource_values(run_policy, maximums_path, gpu)
    for doc in profiles:
        for part in ("requests", "limits"):
            path: Path_ = ("spec", "resources", part)
            for name, (key, value) in resource_values(doc, path, gpu).items():
                if name in maximums and value > maximums[name][1]:
                    max_key, _ = maximums[name]
                    where = f"{run_policy.file}:{run_policy.line_of((*maximums_path, max_key))}"
                    issues.append(
                        doc.issue(
                            (*path, key),
                            f"{_describe(doc.get(*path, key))} is above the maximum "
                            f"{_describe(run_policy.get(*maximums_path, max_key))} ({where})",
                        )
                    )
    return issues


# kind -> where its resource lists are: e.g. ("spec", "resources", "maximums")
RESOURCE_LISTS: dict[str, tuple[Path_, ...]] = {
    kind: tuple(("spec", *key.path) for key in iter_keys(spec) if key.uses(RESOURCE_LIST))
    for kind, (spec, _) in KINDS.items()
}


def _duplicate_resources(doc: SourceDocument, path: Path_, gpu: str) -> list[PolicyIssue]:
    raw = doc.get(*path)
    if not isinstance(raw, Mapping) or "gpu" not in raw or gpu not in raw:
        return []
    return [doc.issue((*path, gpu), f'"gpu" and "{gpu}" name the same resource; keep one')]
