"""Every rule id, declared once: its id, what the mutating webhook does under it and what
the validating webhook denies under it.

A rule id is in kubectl warnings, in ``status.message``, in the audit annotations
``mutations`` / ``violations``, in runguard's JSON log and in the metrics; its concern
(the part before the dot) names the module of ``webhook/engine/rules/`` that holds its
mutation step and its check. The engine names rules by these constants only:
``tests/test_rule_ids.py`` fails on a rule id written as a bare string anywhere else in
``webhook/``, on a rule without a test, and when ``docs/rules.md`` is not
``rules_markdown()`` (``runguard rules -o docs/rules.md`` writes it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONCERNS", "REPORT_RULES", "RULES", "Concern", "ReportRule", "Rule", "rules_markdown"]


@dataclass(frozen=True)
class Concern:
    """What a rule id's concern (the part before the dot) is about, as ``runguard audit``
    files its results: a PolicyReport ``category``, and the ``severity`` of a failure (one
    of the three every version of the Policy WG's schema accepts)."""

    category: str
    severity: str


CONCERNS: dict[str, Concern] = {
    "security": Concern("Pod security", "high"),
    "ownership": Concern("Ownership", "high"),
    "secrets": Concern("Secrets", "high"),
    "volumes": Concern("Volumes", "high"),
    "scope": Concern("Scope", "high"),
    "queue": Concern("Queues", "medium"),
    "input": Concern("Input", "medium"),
    "engine": Concern("Engine", "medium"),
    "update": Concern("Updates", "medium"),
    "resources": Concern("Resources", "medium"),
    "scheduling": Concern("Scheduling", "medium"),
    "profile": Concern("Profiles", "medium"),
    # Not the webhooks': the results ``runguard audit`` files about the policy objects
    # and about the doors only RBAC can close.
    "policy": Concern("Policy", "medium"),
    "rbac": Concern("RBAC", "high"),
}


@dataclass(frozen=True)
class Rule:
    """A rule id with what each webhook does under it ("" where it does nothing)."""

    id: str
    mutation: str
    violation: str

    @property
    def concern(self) -> str:
        return self.id.partition(".")[0]

    @property
    def category(self) -> str:
        return CONCERNS[self.concern].category

    @property
    def severity(self) -> str:
        return CONCERNS[self.concern].severity


@dataclass(frozen=True)
class ReportRule:
    """An id no webhook judges under, only ``runguard audit`` reports: the policy
    objects' results, and each door only RBAC can close."""

    id: str
    description: str

    @property
    def concern(self) -> str:
        return self.id.partition(".")[0]


RULES: dict[str, Rule] = {}
REPORT_RULES: dict[str, ReportRule] = {}


def _rule(rule_id: str, *, mutation: str, violation: str) -> str:
    assert rule_id not in RULES, f"rule {rule_id} declared twice"
    assert rule_id.partition(".")[0] in CONCERNS, f"rule {rule_id}: no such concern"
    RULES[rule_id] = Rule(rule_id, mutation, violation)
    return rule_id


def _reported(rule_id: str, description: str) -> str:
    assert rule_id not in REPORT_RULES and rule_id not in RULES, f"{rule_id} declared twice"
    assert rule_id.partition(".")[0] in CONCERNS, f"rule {rule_id}: no such concern"
    REPORT_RULES[rule_id] = ReportRule(rule_id, description)
    return rule_id


PROFILE_APPLIED = _rule(
    "profile.applied",
    mutation=(
        "the profile's values set (main container), in a Pod and at CREATE in a run Job's, "
        "CronJob's or operator object's pod templates; a queue profile's queue label (and "
        "`suspend: true` on a Job-like object)"
    ),
    violation="a Pod created without `/mutate` whose profile is not applied",
)
PROFILE_UNKNOWN = _rule(
    "profile.unknown",
    mutation="an unknown profile fell back to the default (`unknown: Default`)",
    violation="the named profile does not exist (`unknown: Deny`)",
)
PROFILE_NOT_ALLOWED = _rule(
    "profile.not-allowed",
    mutation="",
    violation=(
        "the named profile is kept to other namespaces (its `namespaceSelector`), or the "
        "cluster state lacks the run's Namespace to tell; the message lists the profiles "
        "the namespace may use"
    ),
)
PROFILE_PROJECT_INVALID = _rule(
    "profile.project-invalid",
    mutation="",
    violation=(
        "the run names its project's profile (ProjectProfile), which does not load or "
        "gives more than the governing RunPolicy allows (a maximum, a device family, a "
        "priority class it does not allow, a device variable, another namespace's Pods); "
        "the message says which key, the profile is not applied"
    ),
)
PROFILE_RANGE = _rule(
    "profile.range",
    mutation=(
        "a request or limit outside the profile's range {min, default, max} set to the "
        "nearest bound (`onExceed: Clamp`)"
    ),
    violation="a request or limit outside the profile's range (`onExceed: Deny`)",
)
RESOURCES_DEFAULTS = _rule(
    "resources.defaults",
    mutation=(
        "defaults filled where absent; a default limit below the container's own request "
        "is the request (a default never shrinks what was asked)"
    ),
    violation="a Pod created without `/mutate` lacking them",
)
RESOURCES_MEMORY_LIMIT = _rule(
    "resources.memory-limit",
    mutation="memory limit = request x `memoryLimitFactor`",
    violation="idem",
)
RESOURCES_CLAMPED = _rule(
    "resources.clamped",
    mutation="a request or limit clamped to the maximum; request <= limit; gpu request = limit",
    violation="idem",
)
RESOURCES_EXCEEDED = _rule(
    "resources.exceeded",
    mutation="",
    violation=(
        "a request or limit above a maximum (`onExceed: Deny`), or the run's total (containers "
        "and sidecars summed, the largest init container, pod-level resources) above one; on "
        "UPDATE (`pods/resize`) an excess may stay or shrink, never grow"
    ),
)
RESOURCES_GPU_MISMATCH = _rule(
    "resources.gpu-mismatch",
    mutation="",
    violation="gpu request differs from gpu limit",
)
RESOURCES_DEVICE_ENV = _rule(
    "resources.device-env",
    mutation=(
        "a device-selecting variable (`resources.deviceEnv`) removed from user env (a value "
        "that selects no device, empty, `void` or `none`, is kept), and an `envFrom` whose "
        "`prefix` begins one (`NVIDIA_VISIBLE_`)"
    ),
    violation="the same, with `security.onRoot: Deny`",
)
RESOURCES_DEVICE_CLAIM = _rule(
    "resources.device-claim",
    mutation=(
        "a `resourceClaims` entry naming an existing ResourceClaim "
        "(`resourceClaimName`) removed, with the containers' `resources.claims` of it "
        "(`volumes.onPreExisting: Strip`)"
    ),
    violation=(
        "an existing ResourceClaim named by a run: only a claim of "
        "`resources.platformDeviceClaims` in a run the platform created (a run's own "
        "claims come from `resourceClaimTemplateName`)"
    ),
)
SECURITY_ROOT = _rule(
    "security.root",
    mutation=(
        "uid/gid/fsGroup 0 replaced or removed, supplemental group 0 removed, `runAsNonRoot` set"
    ),
    violation="root ids, `runAsNonRoot` false or (restricted) missing",
)
SECURITY_DEFAULTS = _rule(
    "security.defaults",
    mutation="absent hardening filled (runAsNonRoot, seccomp, drop ALL, no escalation)",
    violation="a Pod created without `/mutate` lacking it",
)
SECURITY_PRIVILEGED = _rule(
    "security.privileged",
    mutation="`privileged` / `allowPrivilegeEscalation` true set false",
    violation="privileged, escalation, Windows `hostProcess`",
)
SECURITY_CAPABILITIES = _rule(
    "security.capabilities",
    mutation=(
        "unlisted added capabilities removed (listed under `security.root`); a `NET_ADMIN` "
        "removed is named here, with what to do instead (a mesh's CNI mode)"
    ),
    violation=(
        "added capabilities outside `allowedCapabilities` within the level; (restricted) drop "
        "lacks ALL"
    ),
)
SECURITY_HOST_NAMESPACE = _rule(
    "security.host-namespace",
    mutation="",
    violation="hostNetwork, hostPID, hostIPC",
)
SECURITY_HOST_PORTS = _rule(
    "security.host-ports",
    mutation="",
    violation="a container port with a `hostPort`",
)
SECURITY_SYSCTLS = _rule(
    "security.sysctls",
    mutation="",
    violation="a sysctl outside the standard's safe set",
)
SECURITY_SELINUX = _rule(
    "security.selinux",
    mutation="SELinux user/role and types outside the standard's list removed",
    violation="the same, with `onRoot: Deny`",
)
SECURITY_APPARMOR = _rule(
    "security.apparmor",
    mutation="AppArmor `Unconfined` to `RuntimeDefault`",
    violation="`Unconfined` (field or annotation)",
)
SECURITY_SECCOMP = _rule(
    "security.seccomp",
    mutation="seccomp `Unconfined` to `RuntimeDefault`",
    violation="`Unconfined`; (restricted) no profile",
)
SECURITY_PROC_MOUNT = _rule(
    "security.proc-mount",
    mutation="`procMount` to `Default`",
    violation="`Unmasked`",
)
SECURITY_PROBE_HOST = _rule(
    "security.probe-host",
    mutation="",
    violation="a probe or lifecycle handler with a `host`",
)
SECURITY_DEBUG_CONTAINER = _rule(
    "security.debug-container",
    mutation=(
        "an ephemeral container added with `kubectl debug` hardened as `--profile=restricted` would"
    ),
    violation="a debug container that is not (Pod Security, like any container)",
)
VOLUMES_FORBIDDEN_TYPE = _rule(
    "volumes.forbidden-type",
    mutation="",
    violation="a volume type not in `allowedTypes`, or not allowed at the level",
)
VOLUMES_PRE_EXISTING = _rule(
    "volumes.pre-existing",
    mutation="the volume (or projected source) and its mounts removed",
    violation=(
        "a claim or configMap the platform did not create, a projected configMap (a shared "
        "one, `volumes.sharedConfigMaps`, aside), a claim template bringing data "
        "(`dataSource`, `dataSourceRef`, `volumeName`, `selector`), a platform object used by "
        "a run the platform did not create"
    ),
)
SECRETS_FORBIDDEN = _rule(
    "secrets.forbidden",
    mutation=(
        "the reference removed: the env or envFrom entry, the projected source, the "
        "imagePullSecrets entry, or the volume (and its mounts) that holds it"
    ),
    violation=(
        "a secret outside `secrets.allowed` through any door (env, envFrom, secret and "
        "projected volumes, the secret references of csi, flexVolume, cephfs, rbd, iscsi, "
        "cinder, scaleIO, storageos and azureFile volumes, a value of a csi volume's "
        "`volumeAttributes` or a flexVolume's `options` that is one of the platform's secret "
        "names, imagePullSecrets), or a platform secret used by a run the platform did not "
        "create"
    ),
)
SCHEDULING_PRIORITY_CLASS = _rule(
    "scheduling.priority-class",
    mutation="defaulted or replaced",
    violation="a class not allowed",
)
SCHEDULING_PREEMPTION_MODE = _rule(
    "scheduling.preemption-mode",
    mutation="the mode applied as MLRun does",
    violation="an unknown mode; a Pod created without `/mutate` whose mode is not applied",
)
SCOPE_LABELS = _rule(
    "scope.labels",
    mutation="",
    violation=(
        "on UPDATE of a run (a Pod, or a controller's pod template), a label any RunPolicy's "
        "selector, profile label or name pattern uses added, removed or changed (so no run moves "
        "into, out of or between RunPolicies); the `runguard.io/policy` label not what `/mutate` "
        "writes"
    ),
)
OWNERSHIP_STAMP = _rule(
    "ownership.stamp",
    mutation=(
        "at CREATE: `runguard.io/requested-by` (the user), `runguard.io/platform` (whether the "
        "platform created it, directly or through its controllers) with "
        "`runguard.io/platform-policy` (the RunPolicy whose platform that is) and the label "
        "`runguard.io/policy` (its RunPolicy) written, anything sent overwritten; on UPDATE: put "
        "back as they were"
    ),
    violation=(
        "at CREATE, records that are not what `/mutate` writes (a Pod that skipped it); on "
        "UPDATE, records changed; an object entering the platform's scope by an update"
    ),
)
OWNERSHIP_OWNER_CHANGED = _rule(
    "ownership.owner-changed",
    mutation="",
    violation=(
        "on UPDATE, `ownerReferences` of an object runguard stamped rewritten or added by someone"
        " else than a platform identity or a controller (removing one, the garbage collector "
        "orphaning, is allowed)"
    ),
)
OWNERSHIP_CHANGED = _rule(
    "ownership.changed",
    mutation="",
    violation=(
        "on UPDATE, what an object the platform created runs changed (a controller's pod "
        "template spec, a Pod's images, an operator's custom resource's spec or its scale "
        "subresource) by someone else than a platform identity, a controller or an operator"
    ),
)
OWNERSHIP_DEBUG = _rule(
    "ownership.debug",
    mutation="",
    violation=(
        "an ephemeral container added to a Pod the platform created or that holds the "
        "platform's objects, or a door opened into one (kubectl exec, attach, "
        "port-forward, pods/proxy, services/proxy, a token bound to it), by someone "
        "else than a platform identity"
    ),
)
OWNERSHIP_SERVICE_ACCOUNT = _rule(
    "ownership.service-account",
    mutation="",
    violation=(
        "a Pod not created by the platform running as a ServiceAccount that is a platform identity"
        "; a Secret of type `kubernetes.io/service-account-token` for such a ServiceAccount (or "
        "an operator's) created, or updated to name it, by someone else than the platform or "
        "`platform.installers`"
    ),
)
OWNERSHIP_RESERVED_NAME = _rule(
    "ownership.reserved-name",
    mutation="",
    violation=(
        "a PVC, Secret, ConfigMap or ResourceClaim created with a platform name (per run, or "
        "installation-wide) "
        "by someone else than the platform (or, for an installation-wide name, "
        "`platform.installers`)"
    ),
)
OWNERSHIP_RESERVED_LABEL = _rule(
    "ownership.reserved-label",
    mutation="",
    violation=(
        "a custom resource of an operator's kinds, created or changed by someone else than the "
        "platform or that operator, that writes a label the operator keys on to find an "
        "object's owner (`platform.operators[].reservedLabels`)"
    ),
)
OWNERSHIP_REFERENCE = _rule(
    "ownership.reference",
    mutation="",
    violation=(
        "a custom resource of an operator's kinds, created or changed by someone else than the "
        "platform or that operator, that names or selects an object the platform created "
        "through a field the operator acts on (`platform.operators[].references`: a RayJob's "
        "`spec.clusterSelector` naming the platform's RayCluster)"
    ),
)
QUEUE_BYPASSED = _rule(
    "queue.bypassed",
    mutation="",
    violation=(
        "on UPDATE of a queued run (it carries a queue's label, `platform.queues`), by someone "
        "else than the queue, the platform, its installers, controllers or operators: the run "
        "unsuspended, its queue label changed or removed, or one of the queue's scheduling "
        "gates removed (Kueue's `kueue.x-k8s.io/admission`)"
    ),
)
QUEUE_RESERVED_LABEL = _rule(
    "queue.reserved-label",
    mutation="",
    violation=(
        "a queue's own label (`platform.queues[].reservedLabels`: Kueue's "
        "`kueue.x-k8s.io/podset`, `kueue.x-k8s.io/prebuilt-workload-name`) written, changed or "
        "removed on a run or in its pod templates by someone else than the queue, the platform, "
        "its installers, controllers or operators"
    ),
)
OWNERSHIP_NOT_A_RUN = _rule(
    "ownership.not-a-run",
    mutation="",
    violation=(
        "a pod outside every selector using the platform's objects through any door (volumes of "
        "every type and their secret references, claim templates' data sources, env, envFrom, "
        "projected sources, imagePullSecrets), not created by the platform (`kubectl debug "
        "--copy-to`); a pod, or a new claim, not created by the platform naming a claim whose "
        "controller owner is a Pod (an ephemeral volume's PersistentVolumeClaim, a "
        "ResourceClaim made from a Pod's template: that Pod's alone) by `claimName`, a data "
        "source or `resourceClaimName`; a platform configMap read into the environment of a "
        "run the platform did not create; a PVC cloning, or a VolumeSnapshot of, a "
        "platform-named claim by someone else than the platform"
    ),
)
OWNERSHIP_UNKNOWN = _rule(
    "ownership.unknown",
    mutation="",
    violation=(
        "a decision needs an object the cluster cache has not synced (fails closed, naming it)"
    ),
)
UPDATE_SPEC_KEPT = _rule(
    "update.spec-kept",
    mutation=(
        "on UPDATE, a Pod's running spec or a Job's or CronJob's stored pod template put back "
        "(`kubectl apply` of the same manifest)"
    ),
    violation="",
)
INPUT_INVALID = _rule(
    "input.invalid",
    mutation="",
    violation="the object cannot be understood (always denied)",
)
ENGINE_ERROR = _rule(
    "engine.error",
    mutation="",
    violation="a bug in runguard (always denied, logged with its traceback, counted)",
)

# What ``runguard audit`` reports beside the webhooks' rules.
POLICY_LOADED = _reported("policy.loaded", "a RunPolicy or Profile object that loads (pass)")
POLICY_LINT = _reported("policy.lint", "a lint warning about a RunPolicy or Profile object")
RBAC_READ_SECRETS = _reported("rbac.read-secrets", "read Secrets")
RBAC_READ_CONFIG_MAPS = _reported("rbac.read-config-maps", "read platform-named ConfigMaps")
RBAC_PLATFORM_DATA = _reported(
    "rbac.platform-data", "change the data of platform-named ConfigMaps and Secrets"
)
RBAC_NODE_PROXY = _reported("rbac.node-proxy", "the kubelet's API of every Pod on a node")
RBAC_CONNECT = _reported("rbac.connect", "connect into Pods (exec, attach, port-forward, proxy)")
RBAC_TOKEN = _reported("rbac.token", "tokens for ServiceAccounts")
RBAC_SNAPSHOT = _reported(
    "rbac.snapshot", "snapshot the platform's volumes into claims of one's own"
)
RBAC_GRANT = _reported("rbac.grant", "grant oneself any door (bind or escalate roles)")
RBAC_IMPERSONATE = _reported("rbac.impersonate", "impersonate users, groups or ServiceAccounts")
RBAC_EXPOSE = _reported(
    "rbac.expose",
    "Services, Ingresses, routes and NetworkPolicies that can expose the platform's Pods",
)


_HEADER = """\
# Rule ids

<!-- Generated from webhook/engine/rule_ids.py by `runguard rules -o docs/rules.md`:
     edit the declarations there, then regenerate (tests/test_rule_ids.py checks it). -->

Every change the mutating webhook makes and every violation the validating webhook
reports carries a rule id: in kubectl warnings, in `status.message`, in the audit
annotations `mutations` / `violations`, in runguard's JSON log and in the metrics.
Where the code lives: `webhook/engine/rules/<concern>.py` (one module per concern, its
mutation step and its check side by side), the concern being the part of the id
before the dot; `runguard audit` files a failure under the concern's category and
severity.

| rule id | mutation (Strip) | violation (validation) | category, severity |
|---|---|---|---|
"""
_FOOTER = """
`enforcement: Warn` turns violations into warnings and `Audit` records them only;
`input.invalid` and `engine.error` always deny, and so do `ownership.*` and `scope.labels`
(who may use the platform's objects and accounts, which RunPolicy governs an object):
a warning would not take back a secret or a token.

## Reported by `runguard audit` only

No webhook judges under these: `runguard audit --policy-objects` files a result per
RunPolicy and Profile object, and `runguard audit --rbac` one per subject holding, in a
run namespace, a door no admission request is made for (`docs/threat-model.md` says
what each grants).

| id | what | category, severity |
|---|---|---|
"""


def rules_markdown() -> str:
    """``docs/rules.md``: every rule, in the order declared, then the report-only ids."""

    def row(*cells: str) -> str:
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|\n"

    def filed(concern: str) -> str:
        return f"{CONCERNS[concern].category}, {CONCERNS[concern].severity}"

    rules = "".join(
        row(f"`{r.id}`", r.mutation, r.violation, filed(r.concern)) for r in RULES.values()
    )
    reported = "".join(
        row(f"`{r.id}`", r.description, filed(r.concern)) for r in REPORT_RULES.values()
    )
    return _HEADER + rules + _FOOTER + reported
