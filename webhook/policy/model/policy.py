"""The Policy the engine reads: a RunPolicy's spec with its name, profiles and digest,
built from schema-valid documents (``build_policy``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from webhook.policy.declare import key_path
from webhook.policy.model.platform import PlatformConfig
from webhook.policy.model.profile import (
    Profile,
    ProfileSpec,
)
from webhook.policy.model.run_policy import (
    ResourcesConfig,
    RunPolicySpec,
)


class Policy(RunPolicySpec):
    """A RunPolicy's spec with its name, the profiles by name, and a digest of the sources.

    The policy loaded from a directory (docs/glossary.md) is its RunPolicies, and the
    one callers hold is the first by name, holding the others as its ``alternatives``
    in name order (``run_policies()``: all of them, as they are tried). Which of them
    governs a Pod only ``webhook.engine.scope.choose`` decides."""

    platform: PlatformConfig = Field(default_factory=PlatformConfig)  # resolved at load
    name: str = "runguard"
    profiles: Mapping[str, Profile] = Field(default_factory=dict)
    digest: str = ""  # sha256 of the source documents, for /readyz and the audit log
    alternatives: tuple[Policy, ...] = ()

    def run_policies(self) -> tuple[Policy, ...]:
        """Every RunPolicy, in the order they are tried."""
        return (self, *self.alternatives)

    def named(self, name: str) -> Policy | None:
        """The RunPolicy called ``name``, if there is one."""
        return next((p for p in (self, *self.alternatives) if p.name == name), None)

    def names(self) -> list[str]:
        """Every RunPolicy's name, in the order they are tried."""
        return [p.name for p in self.run_policies()]

    def profile_names(self) -> list[str]:
        """Every profile's name, whichever RunPolicy holds it, sorted."""
        return sorted({name for p in self.run_policies() for name in p.profiles})

    def describe(self) -> str:
        """What is loaded, as the log and ``runguard lint`` count it:
        ``RunPolicies builds, runs; 4 profiles``."""
        names, count = self.names(), len(self.profile_names())
        kind = "RunPolicy" if len(names) == 1 else "RunPolicies"
        return f"{kind} {', '.join(names)}; {count} profile{'s' if count != 1 else ''}"


def with_alternatives(policies: Sequence[Policy]) -> Policy:
    """The first of ``policies`` (in name order) holding the others; one digest for all."""
    first, *rest = policies
    if not rest:
        return first
    digest = hashlib.sha256("".join(p.digest for p in policies).encode()).hexdigest()[:16]
    return first.model_copy(update={"alternatives": tuple(rest), "digest": digest})


def run_policy_path(*names: str) -> tuple[str, ...]:
    """Where a RunPolicy document holds the key with these attribute names.

    ``run_policy_path("profiles_config", "default")`` is ``("spec", "profiles", "default")``.
    """
    return ("spec", *key_path(RunPolicySpec, *names))


def profile_path(*names: str) -> tuple[str, ...]:
    """Where a Profile document holds the key with these attribute names."""
    return ("spec", *key_path(ProfileSpec, *names))


def gpu_resource_name(spec: object) -> str:
    """The gpu resource name a RunPolicy ``spec`` (as written, maybe invalid) declares."""
    field = ResourcesConfig.model_fields["gpu_resource_name"]
    resources = (
        spec.get(RunPolicySpec.model_fields["resources"].alias)
        if isinstance(spec, Mapping)
        else None
    )
    name = resources.get(field.alias) if isinstance(resources, Mapping) else None
    return name if isinstance(name, str) else str(field.default)


def build_policy(run_policy: Mapping[str, Any], profiles: Sequence[Mapping[str, Any]]) -> Policy:
    """Build a Policy from schema-valid ``RunPolicy`` and ``Profile`` documents.

    Raises pydantic's ``ValidationError`` (a ``ValueError``) for data the schema would
    have refused.
    """
    spec_data = run_policy.get("spec") or {}
    context = {"gpu": gpu_resource_name(spec_data)}
    spec = RunPolicySpec.model_validate(spec_data, context=context)
    by_name = {}
    for doc in profiles:
        name = doc["metadata"]["name"]
        by_name[name] = Profile.model_validate(
            {**(doc.get("spec") or {}), "name": name}, context=context
        )
    digest = hashlib.sha256(
        json.dumps([run_policy, profiles], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    return Policy.model_validate(
        {
            **{name: getattr(spec, name) for name in RunPolicySpec.model_fields},
            "name": (run_policy.get("metadata") or {}).get("name", "runguard"),
            "profiles": by_name,
            "digest": digest,
        },
        by_alias=False,
        by_name=True,
    )
