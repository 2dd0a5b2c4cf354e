"""Policy files: loading, schema, lint, and the Policy model the engine reads.

Errors (see ``errors``): ``load_policy`` raises only ``PolicyError``, whose ``errors``
lists every ``PolicyIssue(file, line, key, message)`` found; ``lint.lint`` never raises
and returns them in a ``LintReport`` together with warnings (the function is not
re-exported here: the submodule of the same name would shadow it).

The names below are imported when first used (PEP 562): the engine imports
``webhook.policy.model`` alone, without the loader's jsonschema and YAML.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.policy.errors import PolicyError, PolicyIssue
    from webhook.policy.lint import LintReport
    from webhook.policy.loader import PolicySource, load_policy, read_policy
    from webhook.policy.model import (
        LabelSelector,
        NamePattern,
        Policy,
        Profile,
        RunPolicy,
        build_run_policy,
    )
    from webhook.policy.schema import policy_schema

# each public name and the module it is defined in
_HOMES = {
    "LabelSelector": "model",
    "LintReport": "lint",
    "NamePattern": "model",
    "Policy": "model",
    "PolicyError": "errors",
    "PolicyIssue": "errors",
    "PolicySource": "loader",
    "Profile": "model",
    "RunPolicy": "model",
    "build_run_policy": "model",
    "load_policy": "loader",
    "policy_schema": "schema",
    "read_policy": "loader",
}
__all__ = [
    "LabelSelector",
    "LintReport",
    "NamePattern",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PolicySource",
    "Profile",
    "RunPolicy",
    "build_run_policy",
    "load_policy",
    "policy_schema",
    "read_policy",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
