"""The documents: their envelope (apiVersion, kind, metadata, spec) and each kind's spec
and metadata (``KINDS``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from webhook.policy.declare import Section
from webhook.policy.formats import (
    LABEL_VALUE,
    DnsLabel,
)
from webhook.policy.kube import Metadata
from webhook.policy.model.platform import PlatformConfig
from webhook.policy.model.profile import (
    ProfileSpec,
    ProjectProfileSpec,
)
from webhook.policy.model.run_policy import (
    PlatformName,
    RunPolicySpec,
)

Kind = Literal["RunPolicy", "Profile", "ProjectProfile", "Platform"]


class Document(Section):
    """A RunPolicy (one or more per directory, tried in name order), Profile,
    ProjectProfile or Platform."""

    api_version: Literal["runguard.io/v1"] = Field(description="Always runguard.io/v1.")
    kind: Kind = Field(description="RunPolicy, Profile, ProjectProfile or Platform.")
    metadata: Metadata = Field(description="The document's name.")
    spec: dict[str, Any] = Field(description="Depends on kind.")


class ProfileMetadata(Metadata):
    """A Profile's metadata: its name is written in a label."""

    name: Annotated[str, Field(min_length=1), LABEL_VALUE] = Field(
        description="The profile's name, as runs name it in the profile label."
    )


class ProjectProfileMetadata(ProfileMetadata):
    """A ProjectProfile's metadata: its name, and the project (namespace) it is for."""

    namespace: DnsLabel = Field(
        description="The project's namespace: only its runs may name this profile."
    )


class PlatformMetadata(Metadata):
    """A Platform's metadata: its name, as RunPolicies name it (platform: NAME)."""

    name: PlatformName = Field(
        description="The platform's name, as a RunPolicy names it (platform: NAME)."
    )


API_VERSION: str = get_args(Document.model_fields["api_version"].annotation)[0]
# kind -> (its spec, its metadata): the schema checks each document against its kind's.
KINDS: dict[str, tuple[type[Section], type[Metadata]]] = {
    "RunPolicy": (RunPolicySpec, Metadata),
    "Profile": (ProfileSpec, ProfileMetadata),
    "ProjectProfile": (ProjectProfileSpec, ProjectProfileMetadata),
    "Platform": (PlatformConfig, PlatformMetadata),
}
# The kinds a policy directory is built of; a ProjectProfile is read from the cluster
# (runguard's cluster-state watch, or ``--cluster-state`` offline) and only checked there.
POLICY_KINDS = ("RunPolicy", "Profile", "Platform")
assert set(KINDS) == set(get_args(Kind))
