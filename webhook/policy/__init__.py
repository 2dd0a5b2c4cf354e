"""Policy files: loading, schema, lint, and the Policy model the engine reads.

Errors (see ``errors``): ``load_policy`` raises only ``PolicyError``, whose ``errors``
lists every ``PolicyIssue(file, line, key, message)`` found; ``lint`` never raises and
returns them in a ``LintReport`` together with warnings.
"""

from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.lint import LintReport, lint
from webhook.policy.loader import PolicySource, load_policy, read_policy
from webhook.policy.model import (
    LabelSelector,
    NamePattern,
    Policy,
    Profile,
    build_policy,
)
from webhook.policy.schema import policy_schema

__all__ = [
    "LabelSelector",
    "LintReport",
    "NamePattern",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PolicySource",
    "Profile",
    "build_policy",
    "lint",
    "load_policy",
    "policy_schema",
    "read_policy",
]
