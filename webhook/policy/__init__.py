"""Policy files: loading, schema, lint, and the Policy model the engine reads."""

from webhook.policy.model import (
    LabelSelector,
    NamePattern,
    Policy,
    Profile,
    build_policy,
)

__all__ = ["LabelSelector", "NamePattern", "Policy", "Profile", "build_policy"]
