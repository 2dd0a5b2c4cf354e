"""What the engine returns: changes, violations and the decision built from them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from webhook.engine.rule import Declarations

RULES = Declarations(__name__)
INPUT_INVALID = RULES.rule(
    "input.invalid",
    mutation="",
    violation="the object cannot be understood (always denied)",
)

JSON = dict[str, Any]
INVALID = INPUT_INVALID  # the object cannot be understood: always denied
# A denial's message lists violations up to about this many characters, then counts the
# rest by rule (``Decision.message``).
MESSAGE_LIMIT = 8192


@dataclass(frozen=True)
class Change:
    """One mutation step that changed something: its rule id and a short warning (<120 chars)."""

    rule: str
    warning: str


@dataclass(frozen=True)
class Violation:
    """A reason to deny: rule id, dotted JSON path into the object, human message."""

    rule: str
    path: str
    message: str
    # The quantity judged, for rules about amounts: on UPDATE an excess already present
    # may stay or shrink, never grow (``pods/resize``).
    amount: Decimal | None = field(default=None, compare=False, repr=False)
    # Found on an object runguard admitted before the policy changed (``runguard audit``):
    # what the current policy would change, not a bypass of the webhook.
    drift: bool = field(default=False, compare=False, repr=False)
    # A step of ``/mutate`` the object lacks (``/validate``'s backstop): made by no
    # ``/mutate`` at all, or by one still serving the policy of a moment ago.
    backstop: bool = field(default=False, compare=False, repr=False)

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "path": self.path, "message": self.message}

    def __str__(self) -> str:
        return f"[{self.rule}] {self.path}: {self.message}"


@dataclass
class Decision:
    """The answer for one object, shared by the webhook endpoints and ``runguard apply``.

    ``applies`` is False for objects outside the selector or in an excluded namespace:
    they are allowed untouched. ``object`` is the object after mutation (the input
    itself for pod controllers, which are judged but never patched). ``patch`` is a
    JSON Patch from the input to ``object``.
    """

    kind: str
    namespace: str
    name: str
    applies: bool
    allowed: bool
    object: JSON
    patch: list[JSON] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mutations: list[Change] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    profile: str | None = None
    enforcement: str = "Deny"
    # The exception of an engine bug (rule ``engine.error``), for the caller to log with
    # its traceback and count; never part of the answer sent to the apiserver.
    error: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def audit_annotations(self) -> dict[str, str]:
        """Keys that the kube-apiserver audit log shows as ``<webhook>/<key>``."""
        if not self.applies:
            return {}
        out: dict[str, str] = {}
        if self.profile:
            out["profile"] = self.profile
        if self.mutations:
            out["mutations"] = ",".join(dict.fromkeys(c.rule for c in self.mutations))
        if self.violations:
            out["violations"] = ",".join(dict.fromkeys(v.rule for v in self.violations))
            out["enforcement"] = self.enforcement
        return out

    def message(self, limit: int = MESSAGE_LIMIT) -> str:
        """One clear message listing every violation, for ``status.message`` on denial.

        Past ``limit`` characters the violations not listed are counted by rule id
        (``... and 100203 more: security.root x25000, ...``): a Pod of 25k containers
        bypassing mutation would otherwise be denied with 13 MB that kubectl prints and
        the apiserver's audit log keeps; ``runguard apply -o json`` still lists each."""
        if not self.violations:
            return ""
        count = len(self.violations)
        noun = "violation" if count == 1 else "violations"
        text = f"runguard denied {self.kind} {self.name or '(unnamed)'}: {count} {noun}: "
        shown: list[str] = []
        used = len(text)
        for v in self.violations:
            item = str(v)[:limit]
            if used + len(item) + 2 > limit and shown:
                break
            shown.append(item)
            used += len(item) + 2
        text += "; ".join(shown)
        rest = self.violations[len(shown) :]
        if rest:
            by_rule = Counter(v.rule for v in rest)
            counts = ", ".join(f"{rule} x{n}" for rule, n in by_rule.most_common())
            text += f"; ... and {len(rest)} more: {counts}"
        return text

    def to_dict(self) -> JSON:
        """The ``runguard apply -o json`` entry."""
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "allowed": self.allowed,
            "object": self.object,
            "patch": self.patch,
            "warnings": self.warnings,
            "violations": [v.to_dict() for v in self.violations],
            "auditAnnotations": self.audit_annotations,
        }
