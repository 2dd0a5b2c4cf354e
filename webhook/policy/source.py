"""Policy files read as YAML with lines: every key keeps the line it is written on.

Objects are built from PyYAML's node tree (``yaml.compose_all``) rather than from
``yaml.safe_load`` so that every key keeps its line: schema errors (``jsonschema``'s
``absolute_path``) and cross-document checks are reported as ``file:line: key:
message``. What JSON cannot hold (tags, binary, recursive aliases, alias bombs, integers
beyond 64 bits) is reported, never raised; a file past the limits of
``webhook.inputs.limits`` (1 MiB, nesting, aliases) is refused before it is composed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.inputs.limits import (
    POLICY_FILES,
    LimitError,
    check_yaml,
    int_problem,
    int_text_problem,
    read_path,
    without_lone_surrogates,
)
from webhook.policy.errors import PolicyIssue
from webhook.policy.model import KINDS, Policy

__all__ = [
    "Path_",
    "PolicySource",
    "SourceDocument",
    "duplicate_names",
    "format_key",
    "read_documents",
]

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
    def platforms(self) -> list[SourceDocument]:
        """Platform documents: the installation-wide settings RunPolicies name."""
        return [d for d in self.documents if d.kind == "Platform"]

    @property
    def project_profiles(self) -> list[SourceDocument]:
        """ProjectProfiles: checked with the RunPolicies, never part of the Policy built
        (runguard reads them from the cluster)."""
        return [d for d in self.documents if d.kind == "ProjectProfile"]

    @property
    def run_policy(self) -> SourceDocument | None:
        """The first RunPolicy by name (a Pod is judged by the first whose
        selector matches), which also says what ``gpu`` means in profiles."""
        found = sorted(self.run_policies, key=lambda d: d.name or "")
        return found[0] if found else None


def duplicate_names(docs: list[SourceDocument], what: str, why: str = "") -> list[PolicyIssue]:
    """An issue on each of ``docs`` whose name another has: ``duplicate {what} name "x"
    (also at file:line){why}``."""
    named: dict[str, list[SourceDocument]] = {}
    for doc in docs:
        if doc.name is not None:
            named.setdefault(doc.name, []).append(doc)
    issues = []
    for name, same in named.items():
        for doc in same if len(same) > 1 else ():
            others = ", ".join(
                f"{o.file}:{o.line_of(('metadata', 'name'))}" for o in same if o is not doc
            )
            issues.append(
                doc.issue(
                    ("metadata", "name"), f'duplicate {what} name "{name}" (also at {others}){why}'
                )
            )
    return issues


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


def read_documents(path: Path) -> tuple[list[SourceDocument], list[PolicyIssue]]:
    """The mapping documents of one file, and the issues of the file."""
    name = str(path)
    try:
        text = read_path(path, POLICY_FILES)
        check_yaml(text, POLICY_FILES)  # before the composer, which recurses
    except FileNotFoundError:
        return [], [PolicyIssue(name, None, "", "cannot read: broken symlink or file removed")]
    except UnicodeDecodeError as exc:
        return [], [PolicyIssue(name, None, "", f"not UTF-8 text ({exc.reason})")]
    except OSError as exc:
        return [], [PolicyIssue(name, None, "", f"cannot read: {exc.strerror}")]
    except LimitError as exc:
        return [], [PolicyIssue(name, exc.line, "", exc.message)]

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
    except RecursionError:  # only where libyaml's check and PyYAML's parser disagree
        issues.append(PolicyIssue(name, None, "", "nested too deeply"))
    return docs, issues


_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


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
        text = doc.raw[path] = without_lone_surrogates(str(node.value))
        if node.tag == _INT_TAG and (problem := int_text_problem(text.replace("_", ""))):
            self._issue(node, path, problem)  # before int() reads a million digits
            return text
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self._issue(node, path, f"invalid value: {problem}")
            return text
        if isinstance(value, datetime.date | bytes):
            return text  # JSON has no timestamps or binary: keep the text
        if isinstance(value, str):
            return without_lone_surrogates(value)
        # (a float that is not finite is the model's to report: "must be a finite number")
        if type(value) is int and (problem := int_problem(value)):
            self._issue(node, path, problem)
            return text
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
            key = without_lone_surrogates(str(key_node.value))
            line = key_node.start_mark.line + 1
            if key in seen:
                first = f" (first at line {seen[key]})" if seen[key] != line else ""
                self._issue(key_node, (*path, key), f"duplicate key{first}")
            seen[key] = line
            doc.lines[(*path, key)] = line
            out[key] = self.build(value_node, (*path, key), doc)
        return out
