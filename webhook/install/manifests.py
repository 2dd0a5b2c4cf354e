"""The objects that put runguard in the admission path, rendered from a Policy.

``webhook_configurations(policy)`` returns the ``MutatingWebhookConfiguration`` and
``ValidatingWebhookConfiguration`` as dicts. They route to runguard only what it must
judge (fail closed, narrowly), and every webhook fails closed:

- Pods by ``objectSelector``, the policy's ``selector``;
- pod controllers (Jobs, CronJobs, Deployments, StatefulSets, ReplicaSets, DaemonSets,
  ReplicationControllers), whose run labels are in their pod *template*, where an
  ``objectSelector`` cannot look, by a CEL ``matchConditions`` rendered from the
  selector: the template's labels match it, or (ownership on, ``platform.identities``
  set) the template names one of the platform's claims, configMaps or secrets;
- with ownership on, Pods outside the selector that name the platform's objects
  (``ownership.not-a-run``), and the creation of a PVC, Secret or ConfigMap with a
  platform name (``ownership.reserved-name``), by CEL again.

Runguard's own namespace and the policy's ``excludeNamespaces`` are left out by
``namespaceSelector``. ``matchConditions`` are GA in Kubernetes 1.30: the configurations
need 1.30 or later. ``policy_config_map(files)`` is the ConfigMap the Deployment mounts
as its policy directory.

``generated_files`` renders both into the two files of the kustomize base in
``manifests/`` that are generated (``runguard manifests -p policies --write
manifests``), so what the apiserver routes and the policy runguard loads come from the
same ``policies/`` and a test fails when they disagree.

The rendering is split by concern, every name importable from here: ``names`` (what
the objects are called, paths, files, labels), ``cel`` (the CEL expressions),
``conditions`` (the webhooks' matchConditions and rules from the policy), ``webhooks``
(the configurations), ``files`` (the generated files and their YAML), ``floor`` (the
ValidatingAdmissionPolicies that hold while runguard is unreachable).
"""

from __future__ import annotations

from webhook.engine.rules.operators import plural
from webhook.install.cel import (
    OLD_TEMPLATE,
    TEMPLATE,
    name_regex,
    references_expression,
    selector_expression,
)
from webhook.install.conditions import (
    controller_condition,
    namespace_selector,
    operator_condition,
    reserved_name_condition,
    reserved_rules,
    status_condition,
)
from webhook.install.files import (
    OPERATORS_RBAC_FILE,
    OPERATORS_ROLE,
    REQUIRES,
    RUN_USER_ROLE,
    RUN_USER_ROLE_FILE,
    RUN_USER_RULES,
    YamlDumper,
    available_mode,
    generated_files,
    operators_watch_rbac,
    policy_config_map,
    policy_object_files,
    read_policy_files,
    run_user_role,
    to_yaml,
)
from webhook.install.floor import FLOOR_LABELS, floor_policies, floor_rules
from webhook.install.names import (
    ADMISSION_LABELS,
    AVAILABLE_MODE_FILE,
    CONFIG_MAP_FILE,
    CONFIG_MAP_NAME,
    CONFIGURATION_NAME,
    CONTROLLERS_WEBHOOK,
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    FLOOR_FILE,
    LABELS,
    MIN_KUBERNETES,
    MUTATE_PATH,
    MUTATING_CONTROLLERS_WEBHOOK,
    MUTATING_OPERATORS_WEBHOOK,
    MUTATING_REFERENCES_WEBHOOK,
    MUTATING_WEBHOOK,
    NAMESPACE_LABEL,
    OPERATORS_WEBHOOK,
    PLATFORM_OBJECT_GROUPS,
    PLATFORM_OBJECTS,
    POD_CONTROLLERS,
    POD_SPEC_SUBRESOURCES,
    POD_STATUS,
    POD_TOKENS_WEBHOOK,
    POLICY_CONFIGURATION_NAME,
    POLICY_OBJECTS_DIR,
    POLICY_WEBHOOK,
    POLICY_WEBHOOK_FILE,
    RESERVED_NAMES_WEBHOOK,
    SERVICE_PORT,
    SHELL_SUBRESOURCES,
    SHELLS_CONFIGURATION_NAME,
    SHELLS_WEBHOOK,
    SHELLS_WEBHOOK_FILE,
    STATUS,
    STATUS_METADATA,
    TIMEOUT_SECONDS,
    TOKEN_SUBRESOURCE,
    VALIDATE_PATH,
    VALIDATE_POLICY_PATH,
    VALIDATING_REFERENCES_WEBHOOK,
    VALIDATING_WEBHOOK,
    WEBHOOKS_FILE,
    ManifestError,
)
from webhook.install.webhooks import (
    mutating_webhook_configuration,
    policy_object_webhook,
    shells_webhook_configuration,
    validating_webhook_configuration,
    webhook_configurations,
)

__all__ = [
    "ADMISSION_LABELS",
    "AVAILABLE_MODE_FILE",
    "FLOOR_FILE",
    "FLOOR_LABELS",
    "CONFIGURATION_NAME",
    "CONFIG_MAP_FILE",
    "CONFIG_MAP_NAME",
    "CONTROLLERS_WEBHOOK",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "LABELS",
    "MIN_KUBERNETES",
    "MUTATE_PATH",
    "MUTATING_CONTROLLERS_WEBHOOK",
    "MUTATING_OPERATORS_WEBHOOK",
    "MUTATING_REFERENCES_WEBHOOK",
    "MUTATING_WEBHOOK",
    "ManifestError",
    "NAMESPACE_LABEL",
    "OLD_TEMPLATE",
    "OPERATORS_RBAC_FILE",
    "OPERATORS_ROLE",
    "OPERATORS_WEBHOOK",
    "PLATFORM_OBJECTS",
    "PLATFORM_OBJECT_GROUPS",
    "POD_CONTROLLERS",
    "POD_SPEC_SUBRESOURCES",
    "POD_STATUS",
    "POD_TOKENS_WEBHOOK",
    "POLICY_CONFIGURATION_NAME",
    "POLICY_OBJECTS_DIR",
    "POLICY_WEBHOOK",
    "POLICY_WEBHOOK_FILE",
    "REQUIRES",
    "RESERVED_NAMES_WEBHOOK",
    "RUN_USER_ROLE",
    "RUN_USER_ROLE_FILE",
    "RUN_USER_RULES",
    "SERVICE_PORT",
    "SHELLS_CONFIGURATION_NAME",
    "SHELLS_WEBHOOK",
    "SHELLS_WEBHOOK_FILE",
    "SHELL_SUBRESOURCES",
    "STATUS",
    "STATUS_METADATA",
    "TEMPLATE",
    "TIMEOUT_SECONDS",
    "TOKEN_SUBRESOURCE",
    "VALIDATE_PATH",
    "VALIDATE_POLICY_PATH",
    "VALIDATING_REFERENCES_WEBHOOK",
    "VALIDATING_WEBHOOK",
    "WEBHOOKS_FILE",
    "YamlDumper",
    "available_mode",
    "controller_condition",
    "floor_policies",
    "floor_rules",
    "generated_files",
    "mutating_webhook_configuration",
    "name_regex",
    "namespace_selector",
    "operator_condition",
    "operators_watch_rbac",
    "plural",
    "policy_config_map",
    "policy_object_files",
    "policy_object_webhook",
    "read_policy_files",
    "references_expression",
    "reserved_name_condition",
    "reserved_rules",
    "run_user_role",
    "selector_expression",
    "shells_webhook_configuration",
    "status_condition",
    "to_yaml",
    "validating_webhook_configuration",
    "webhook_configurations",
]
