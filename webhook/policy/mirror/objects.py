"""Policy objects in a cluster (RunPolicy, Profile and Platform custom resources)
checked and mirrored with the same loader as the files.

* ``check_object``: what ``runguard lint`` would say if the object joined the others,
  for the validating webhook of policy objects: its errors (and those it causes in the
  others), each ``Kind name: key: message``, and its warnings. A RunPolicy naming a
  Platform not there yet is admitted with a warning: ``kubectl apply -f policies/``
  sends ``builds.yaml`` before ``platform.yaml``; until the Platform comes the objects
  say they are not loaded and runguard keeps the last good policy;
* ``mirror``: the objects written as files, one per object, into the directory the
  server loads (the files stay the offline and GitOps form: the same YAML);
* ``conditions``: each object's ``Loaded`` condition after a load of that directory.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.policy.crd import document_of, object_file_name
from webhook.policy.errors import PolicyIssue
from webhook.policy.lint import LintReport, lint
from webhook.policy.loader import policy_files
from webhook.policy.platforms import is_unknown_platform

__all__ = ["Checked", "check_object", "conditions", "mirror", "object_files"]

MAX_MESSAGE = 4000  # a condition's message, and a denial's, cut past this many characters


@dataclass(frozen=True)
class Checked:
    """What the webhook answers for a policy object: refused when ``errors``; ``label``
    names it (``Profile 1xt4``, ``ProjectProfile team-a/small``)."""

    errors: list[str]
    warnings: list[str]
    label: str = "object"


def object_files(objects: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """File name -> YAML text, one file per policy object."""
    files: dict[str, str] = {}
    for obj in objects:
        doc = document_of(obj)
        name = object_file_name(*_key(doc))
        files[name] = yaml.safe_dump(doc, sort_keys=False)
    return files


def _documents(directory: Path) -> list[dict[str, Any]]:
    """Every document of the policy files in ``directory`` (those YAML can read)."""
    docs: list[dict[str, Any]] = []
    for path in policy_files(directory):
        try:
            loaded = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError):
            continue
        docs.extend(d for d in loaded if isinstance(d, dict))
    return docs


def _key(doc: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name), the name ``namespace/name`` for a namespaced object."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return str(doc.get("kind")), f"{namespace}/{name}" if namespace else str(name)


def _lint(files: Mapping[str, str]) -> tuple[LintReport, dict[str, str]]:
    """Lint ``files`` in a scratch directory; also the label of each file (Kind name)."""
    labels = {}
    with tempfile.TemporaryDirectory(prefix="runguard-check-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
            doc = yaml.safe_load(text)
            kind, obj_name = _key(doc) if isinstance(doc, dict) else ("", name)
            labels[os.path.join(tmp, name)] = f"{kind} {obj_name}"
        return lint(tmp), labels


def _said(issue: PolicyIssue, labels: Mapping[str, str], *, where: bool = True) -> str:
    """``Kind name: key: message``, the files the message points at named as objects."""
    message = issue.message
    for file, label in labels.items():
        if file in message:
            message = re.sub(re.escape(file) + r"(:\d+)?", label, message)
    key = f"{issue.key}: " if issue.key else ""
    if not where:
        return f"{key}{message}"
    return f"{labels.get(issue.file, Path(issue.file).name)}: {key}{message}"


def check_object(obj: Mapping[str, Any], directory: Path | str) -> Checked:
    """The errors and warnings ``obj`` brings to the policy of ``directory`` (the one
    the server loads): its own, and the errors it causes in the other documents (a
    RunPolicy lowering a maximum below a profile's request)."""
    doc = document_of(obj)
    key = _key(doc)
    others = [d for d in _documents(Path(directory)) if _key(d) != key]
    other_files = object_files(others)
    own = object_files([obj])
    before, before_labels = _lint(other_files)
    after, labels = _lint({**other_files, **own})
    (own_label,) = (f"{key[0]} {key[1]}",)
    known = {_said(i, before_labels) for i in before.errors}
    errors = [
        said
        for said in dict.fromkeys(
            _said(i, labels) for i in after.errors if not is_unknown_platform(i)
        )
        if said.startswith(own_label + ":") or said not in known
    ]
    warnings = [
        said
        for said in dict.fromkeys(
            _said(i, labels) for i in [*after.warnings, *filter(is_unknown_platform, after.errors)]
        )
        if said.startswith(own_label + ":")
    ]
    return Checked(errors, warnings, own_label)


def mirror(objects: Iterable[Mapping[str, Any]], directory: Path | str) -> bool:
    """Make ``directory`` hold exactly ``objects``, a file each: changed files are
    replaced whole (written beside, then renamed), files of objects gone are removed.
    True when something changed."""
    root = Path(directory)
    wanted = object_files(objects)
    changed = False
    for name, text in wanted.items():
        path = root / name
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
        except OSError:
            pass
        tmp = root / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        changed = True
    for path in policy_files(root):
        if path.name not in wanted:
            path.unlink(missing_ok=True)
            changed = True
    return changed


def conditions(directory: Path | str) -> dict[tuple[str, str], tuple[bool, str]]:
    """Each mirrored object's ``Loaded`` condition after loading ``directory``: (kind,
    name) -> (loaded, message). With errors anywhere nothing is loaded (the last good
    policy keeps serving): an object with errors of its own lists them, the others say
    which objects hold the errors."""
    root = Path(directory)
    report = lint(root)
    labels: dict[str, str] = {}
    keys: dict[str, tuple[str, str]] = {}
    for path in policy_files(root):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            keys[str(path)] = _key(doc)
            labels[str(path)] = "{} {}".format(*_key(doc))
    by_file: dict[str, list[str]] = {}
    for issue in report.errors:
        by_file.setdefault(issue.file, []).append(_said(issue, labels, where=False))
    out: dict[tuple[str, str], tuple[bool, str]] = {}
    culprits = ", ".join(labels.get(f, Path(f).name) for f in by_file)
    for file, key in keys.items():
        if not report.errors:
            out[key] = (True, f"loaded: {report.summary().split(': ', 1)[1]}")
        elif file in by_file:
            out[key] = (False, "; ".join(by_file[file])[:MAX_MESSAGE])
        else:
            message = f"not loaded: errors in {culprits}; runguard keeps the last good policy"
            out[key] = (False, message[:MAX_MESSAGE])
    return out
