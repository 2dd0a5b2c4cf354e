"""Loading a policy directory: YAML with lines, schema, cross-document checks, the model.

Every problem in every file is collected before anything is raised, so an admin sees
them all at once, each as ``file:line: key: message``: the files are read with lines
(``source.py``), each document is checked against the JSON Schema generated from the
model (``schema_issues.py``), then the documents together (``consistency.py``); only
then is the ``Policy`` built (``model.build_run_policy``), each RunPolicy with the Platform
it names in place of the name (``platforms.resolved``).
"""

from __future__ import annotations

from pathlib import Path

from webhook.policy.consistency import cross_document_issues
from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.model import Policy, RunPolicy, build_run_policy
from webhook.policy.platforms import by_name, resolved
from webhook.policy.schema_issues import schema_issues
from webhook.policy.source import PolicySource, SourceDocument, format_key, read_documents

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

    for path in files:
        docs, issues = read_documents(path)
        source.errors.extend(issues)
        for doc in docs:
            source.documents.append(doc)
            source.errors.extend(schema_issues(doc))
    source.errors.extend(cross_document_issues(source))
    source.errors.sort(key=lambda i: (i.file, i.line or 0, i.key))

    if not source.errors:
        profiles = [p.data for p in source.profiles]
        platforms = by_name(source)
        built: list[RunPolicy] = []
        for run_policy in sorted(source.run_policies, key=lambda d: d.name or ""):
            try:
                built.append(build_run_policy(resolved(run_policy.data, platforms), profiles))
            except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
                # Schema-valid documents the model cannot build are a bug in the schema.
                source.errors.append(
                    PolicyIssue(run_policy.file, run_policy.line, "", f"cannot build policy: {exc}")
                )
        if built and not source.errors:
            source.policy = Policy.of(*built)
    return source
