"""What can be wrong with a policy directory, and how it is reported.

Exceptions:

* ``PolicyError`` -- the policy directory cannot be loaded. ``.errors`` lists *every*
  problem found (YAML syntax, schema, cross-document checks) as ``PolicyIssue``s, so an
  admin fixes them all in one pass. ``str(error)`` is those issues, one per line.

Nothing else escapes ``load_policy``: a file that cannot be read, a YAML syntax error,
a document of the wrong shape are all issues, never tracebacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PolicyError", "PolicyIssue"]


@dataclass(frozen=True)
class PolicyIssue:
    """One problem: where (file, 1-based line, dotted key) and what.

    ``line`` is None for problems of the directory as a whole (no RunPolicy at all);
    ``key`` is empty when the problem is not about one key (a YAML syntax error).
    """

    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message}


class PolicyError(Exception):
    """A policy directory that cannot be loaded; ``errors`` holds every issue found."""

    def __init__(self, errors: Iterable[PolicyIssue]) -> None:
        self.errors: list[PolicyIssue] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))
