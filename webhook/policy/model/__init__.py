"""The policy model: each key of a RunPolicy, a Platform and a Profile declared once; the
Policy built of them.

Each key is one field (type, default, description, constraints); the JSON Schema, the
defaults, lint's lists of keys and ``docs/policy-reference.md`` are generated from these
fields (``docs/dev/contributing.md``). The engine reads the result, ``Policy``, as plain
attributes: snake_case names, values precomputed at load (resource lists with ``gpu``
resolved, maximums parsed to Decimal, name patterns compiled).

Documents reach ``build_run_policy`` after the JSON Schema generated from this model has
checked them (``loader.py``, which reports problems as ``file:line: key: message``);
pydantic then builds the typed model from the valid data.

One module per concern, every name importable from here:

* ``fields``: the value types keys share (identities, capabilities, name patterns, ...),
  imported from there;
* ``platform``: a Platform's keys (identities, controllers, operators, queues,
  installers, project label) and what the engine derives from them;
* ``run_policy``: a RunPolicy's sections and ``RunPolicySpec``;
* ``profile``: a Profile's and a ProjectProfile's keys, and ``Profile``;
* ``documents``: the envelope of a document and each kind's spec and metadata (``KINDS``);
* ``policy``: ``Policy``, what the engine reads (every ``RunPolicy`` loaded), and
  ``build_run_policy``.

What is not a key lives beside it (Kubernetes shapes in ``kube.py``, string formats in
``formats.py``, how keys are declared in ``declare.py``).
"""

from __future__ import annotations

from webhook.policy.kube import LabelSelector, resolve_resource_name
from webhook.policy.model.documents import (
    API_VERSION,
    KINDS,
    POLICY_KINDS,
    Document,
    Kind,
    PlatformMetadata,
    ProfileMetadata,
    ProjectProfileMetadata,
)
from webhook.policy.model.fields import PREEMPTION_MODES, ROOT_CA_CONFIG_MAP
from webhook.policy.model.platform import (
    KCM_CONTROLLERS,
    GroupKind,
    Operator,
    OperatorReference,
    OperatorTemplates,
    PlatformConfig,
    QueueController,
    ReferencePath,
)
from webhook.policy.model.policy import (
    Policy,
    RunPolicy,
    build_run_policy,
    gpu_resource_name,
    profile_path,
    run_policy_path,
)
from webhook.policy.model.profile import (
    Profile,
    ProfileQueue,
    ProfileSpec,
    ProfileValues,
    ProjectProfileSpec,
)
from webhook.policy.model.run_policy import (
    DeviceFamily,
    DeviceResource,
    PlatformName,
    PreemptionConfig,
    PriorityClasses,
    ProfilesConfig,
    ResourcesConfig,
    RunPolicySpec,
    SchedulingConfig,
    SecretsConfig,
    SecurityConfig,
    VolumesConfig,
    Weight,
)
from webhook.policy.patterns import NamePattern, matches_any

__all__ = [
    "API_VERSION",
    "DeviceFamily",
    "DeviceResource",
    "Document",
    "GroupKind",
    "KCM_CONTROLLERS",
    "KINDS",
    "Kind",
    "LabelSelector",
    "NamePattern",
    "Operator",
    "OperatorReference",
    "OperatorTemplates",
    "POLICY_KINDS",
    "PREEMPTION_MODES",
    "PlatformConfig",
    "PlatformMetadata",
    "PlatformName",
    "Policy",
    "PreemptionConfig",
    "PriorityClasses",
    "Profile",
    "ProfileMetadata",
    "ProfileQueue",
    "ProfileSpec",
    "ProfileValues",
    "ProfilesConfig",
    "ProjectProfileMetadata",
    "ProjectProfileSpec",
    "QueueController",
    "ROOT_CA_CONFIG_MAP",
    "ReferencePath",
    "ResourcesConfig",
    "RunPolicy",
    "RunPolicySpec",
    "SchedulingConfig",
    "SecretsConfig",
    "SecurityConfig",
    "VolumesConfig",
    "Weight",
    "build_run_policy",
    "gpu_resource_name",
    "matches_any",
    "profile_path",
    "resolve_resource_name",
    "run_policy_path",
]
