"""What the engine reads: a ``Policy``, the RunPolicies loaded, each a ``RunPolicy`` (its
spec with its name, profiles and digest) built from schema-valid documents
(``build_run_policy``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


class RunPolicy(RunPolicySpec):
    """One RunPolicy as the engine reads it: its spec, its name, the Platform it names
    (resolved at load), the profiles by name and a digest of its sources."""

    platform: PlatformConfig = Field(default_factory=PlatformConfig)  # resolved at load
    name: str = "runguard"
    profiles: Mapping[str, Profile] = Field(default_factory=dict)
    digest: str = ""  # sha256 of the source documents


@dataclass(frozen=True)
class Policy:
    """The policy (docs/glossary.md): every RunPolicy loaded from a directory or the
    cluster, in the order they are tried (by name). Which of them governs a run only
    ``webhook.engine.scope.choose`` decides."""

    run_policies: tuple[RunPolicy, ...]
    digest: str = ""  # of every RunPolicy's sources, for /readyz and the audit log

    def __post_init__(self) -> None:
        if not self.run_policies:
            raise ValueError("a policy holds at least one RunPolicy")

    @classmethod
    def of(cls, *run_policies: RunPolicy) -> Policy:
        """The policy of these RunPolicies, tried in this order; one digest for all."""
        if len(run_policies) == 1:
            return cls(run_policies, run_policies[0].digest)
        digest = hashlib.sha256("".join(p.digest for p in run_policies).encode()).hexdigest()
        return cls(run_policies, digest[:16])

    @property
    def first(self) -> RunPolicy:
        """The RunPolicy tried first: the one whose settings hold for the policy as a whole
        where one must (the server's, the rendered webhooks')."""
        return self.run_policies[0]

    def named(self, name: str) -> RunPolicy | None:
        """The RunPolicy called ``name``, if there is one."""
        return next((p for p in self.run_policies if p.name == name), None)

    def names(self) -> list[str]:
        """Every RunPolicy's name, in the order they are tried."""
        return [p.name for p in self.run_policies]

    def profile_names(self) -> list[str]:
        """Every profile's name, whichever RunPolicy holds it, sorted."""
        return sorted({name for p in self.run_policies for name in p.profiles})

    def describe(self) -> str:
        """What is loaded, as the log and ``runguard lint`` count it:
        ``RunPolicies builds, runs; 4 profiles``."""
        names, count = self.names(), len(self.profile_names())
        kind = "RunPolicy" if len(names) == 1 else "RunPolicies"
        return f"{kind} {', '.join(names)}; {count} profile{'s' if count != 1 else ''}"


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


def build_run_policy(
    run_policy: Mapping[str, Any], profiles: Sequence[Mapping[str, Any]]
) -> RunPolicy:
    """Build a RunPolicy from schema-valid ``RunPolicy`` and ``Profile`` documents.

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
    return RunPolicy.model_validate(
        {
            **{name: getattr(spec, name) for name in RunPolicySpec.model_fields},
            "name": (run_policy.get("metadata") or {}).get("name", "runguard"),
            "profiles": by_name,
            "digest": digest,
        },
        by_alias=False,
        by_name=True,
    )
