"""The webhook configurations: the mutating and validating configurations of the runs,
the policy objects' and the doors into a running Pod, each webhook with its rules,
conditions and namespaces (``conditions.py``, ``cel.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from webhook.install.cel import (
    _join,
)
from webhook.install.conditions import (
    _any_ownership,
    _condition,
    _controller_rules,
    _operator_rules,
    _pod_reference_conditions,
    controller_condition,
    namespace_selector,
    operator_condition,
    reserved_name_condition,
    reserved_rules,
    shared_namespace_selector,
    status_condition,
)
from webhook.install.names import (
    ADMISSION_LABELS,
    CONFIGURATION_NAME,
    CONTROLLERS_WEBHOOK,
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    MUTATE_PATH,
    MUTATING_CONTROLLERS_WEBHOOK,
    MUTATING_OPERATORS_WEBHOOK,
    MUTATING_REFERENCES_WEBHOOK,
    MUTATING_WEBHOOK,
    OPERATORS_WEBHOOK,
    POD_SPEC_SUBRESOURCES,
    POD_STATUS,
    POD_TOKENS_WEBHOOK,
    POLICY_CONFIGURATION_NAME,
    POLICY_WEBHOOK,
    RESERVED_NAMES_WEBHOOK,
    SHELL_SUBRESOURCES,
    SHELLS_CONFIGURATION_NAME,
    SHELLS_WEBHOOK,
    TIMEOUT_SECONDS,
    TOKEN_SUBRESOURCE,
    VALIDATE_PATH,
    VALIDATE_POLICY_PATH,
    VALIDATING_REFERENCES_WEBHOOK,
    VALIDATING_WEBHOOK,
    ManifestError,
    _client_config,
    _rule,
)
from webhook.policy.model import Policy, RunPolicy


class _Target:
    """Where the webhooks call runguard, and which namespaces they leave out."""

    def __init__(
        self,
        policy: Policy,
        namespace: str,
        service: str,
        ca_bundle: bytes | None,
        url: str | None,
        available: bool = False,
    ) -> None:
        _check_inputs(ca_bundle, url)
        self.available = available
        self.policy = policy
        self.namespace = namespace
        self.service = service
        self.ca_bundle = ca_bundle
        self.url = url

    def webhook(
        self,
        name: str,
        path: str,
        rules: list[dict[str, Any]],
        *,
        object_selector: RunPolicy | None = None,
        conditions: Sequence[Mapping[str, str]] = (),
        mutating: bool = False,
        run: bool = False,
    ) -> dict[str, Any]:
        """``run``: a webhook that judges runs, which the available mode lets through
        while runguard is unreachable (the floor still judges them)."""
        hook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": _client_config(
                path, self.namespace, self.service, self.ca_bundle, self.url
            ),
            "rules": rules,
            # what reaches runguard waits for it; in the available mode a run does not
            "failurePolicy": "Ignore" if run and self.available else "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "namespaceSelector": (
                namespace_selector(object_selector, self.namespace)
                if object_selector is not None
                else shared_namespace_selector(self.policy, self.namespace)
            ),
        }
        if object_selector is not None:
            hook["objectSelector"] = object_selector.selector.to_dict()
        if conditions:
            hook["matchConditions"] = [dict(c) for c in conditions]
        if mutating:
            # Mutation is idempotent, so running again after other mutating webhooks is safe.
            hook["reinvocationPolicy"] = "IfNeeded"
        return hook


def _check_inputs(ca_bundle: bytes | None, url: str | None) -> None:
    if url is not None:
        parts = urlsplit(url)
        # The apiserver only calls https URLs, and rejects user info, queries and fragments.
        if parts.scheme != "https" or not parts.hostname:
            raise ManifestError(f"--url must be an https:// URL with a host, not {url!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ManifestError(f"--url must have no user, query or fragment: {url!r}")
    if ca_bundle is not None and b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        raise ManifestError("the CA bundle holds no PEM certificate")


def _per_run_policy(name: str, run_policy: RunPolicy, index: int) -> str:
    """The Pod webhook of each RunPolicy (an objectSelector cannot OR selectors): the first
    keeps the plain name, the others carry their RunPolicy's (``mutate-NAME.runguard.io``)."""
    if index == 0:
        return name
    first, _, rest = name.partition(".")
    return f"{first}-{run_policy.name}.{rest}"


def _conditions(condition: Mapping[str, str] | None) -> list[Mapping[str, str]]:
    """``condition`` (if any) and the status condition: every webhook below routes a
    ``status`` subresource."""
    return [*([condition] if condition is not None else []), status_condition()]


def _configuration(
    kind: str, hooks: list[dict[str, Any]], name: str = CONFIGURATION_NAME
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": dict(ADMISSION_LABELS)},
        "webhooks": hooks,
    }


def mutating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
    available: bool = False,
) -> dict[str, Any]:
    """Run Pods are mutated on CREATE; on UPDATE runguard only puts back the running spec
    (``kubectl apply`` re-sending the user's manifest), since a Pod's spec is immutable.
    Run controllers, and Pods outside the selector naming the platform's objects, are
    only stamped (``runguard.io/requested-by``), at CREATE."""
    target = _Target(policy, namespace, service, ca_bundle, url, available)
    hooks = [
        target.webhook(
            _per_run_policy(MUTATING_WEBHOOK, run_policy, i),
            MUTATE_PATH,
            # ephemeralcontainers: a debug container added with `kubectl debug` is hardened;
            # status: runguard's records put back
            [_rule("", ["pods", "pods/ephemeralcontainers", POD_STATUS], ["CREATE", "UPDATE"])],
            object_selector=run_policy,
            conditions=_conditions(None),
            mutating=True,
            run=True,
        )
        for i, run_policy in enumerate(policy.run_policies)
    ]
    hooks += [
        target.webhook(
            MUTATING_CONTROLLERS_WEBHOOK,
            MUTATE_PATH,
            # UPDATE: runguard's records are put back (a controller copying its parent's
            # annotations cannot change them)
            _controller_rules(["CREATE", "UPDATE"]),
            conditions=_conditions(controller_condition(policy)),
            mutating=True,
            run=True,
        ),
    ]
    operators = _operator_rules(policy)
    if operators:
        hooks.append(
            target.webhook(
                MUTATING_OPERATORS_WEBHOOK,
                MUTATE_PATH,
                operators,
                conditions=_conditions(operator_condition(policy)),
                mutating=True,
                run=True,
            )
        )
    references = _pod_reference_conditions(policy)
    if references is not None:
        hooks.append(
            target.webhook(
                MUTATING_REFERENCES_WEBHOOK,
                MUTATE_PATH,
                [_rule("", ["pods", POD_STATUS], ["CREATE", "UPDATE"])],
                conditions=[*references, status_condition()],
                mutating=True,
            )
        )
    return _configuration("MutatingWebhookConfiguration", hooks)


def validating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
    available: bool = False,
) -> dict[str, Any]:
    """Run Pods (objectSelector), the controllers whose template is a run's or names the
    platform's objects, and with ownership on, Pods outside the selector naming them and
    objects created with a platform name (CEL matchConditions). All fail closed."""
    target = _Target(policy, namespace, service, ca_bundle, url, available)
    ops = ["CREATE", "UPDATE"]
    hooks = [
        target.webhook(
            _per_run_policy(VALIDATING_WEBHOOK, run_policy, i),
            VALIDATE_PATH,
            [_rule("", ["pods", *POD_SPEC_SUBRESOURCES, POD_STATUS], ops)],
            object_selector=run_policy,
            conditions=_conditions(None),
            run=True,
        )
        for i, run_policy in enumerate(policy.run_policies)
    ]
    hooks += [
        # On UPDATE the condition reads the new object: an object entering the scope is
        # judged (ownership.stamp); one leaving it no longer matters to runguard.
        target.webhook(
            CONTROLLERS_WEBHOOK,
            VALIDATE_PATH,
            _controller_rules(ops),
            conditions=_conditions(controller_condition(policy)),
            run=True,
        ),
    ]
    operators = _operator_rules(policy)
    if operators:
        hooks.append(
            target.webhook(
                OPERATORS_WEBHOOK,
                VALIDATE_PATH,
                operators,
                conditions=_conditions(operator_condition(policy)),
                run=True,
            )
        )
    references = _pod_reference_conditions(policy)
    if references is not None:
        # UPDATE too: the stamp must not change, and `kubectl debug` must not add a
        # container naming the platform's objects to a Pod that is not the platform's.
        hooks.append(
            target.webhook(
                VALIDATING_REFERENCES_WEBHOOK,
                VALIDATE_PATH,
                [_rule("", ["pods", *POD_SPEC_SUBRESOURCES, POD_STATUS], ops)],
                conditions=[*references, status_condition()],
            )
        )
    reserved = reserved_name_condition(policy)
    if reserved is not None:
        hooks.append(
            target.webhook(
                RESERVED_NAMES_WEBHOOK,
                VALIDATE_PATH,
                reserved_rules(policy),  # a name never changes: CREATE only, but tokens
                conditions=[reserved],
            )
        )
    return _configuration("ValidatingWebhookConfiguration", hooks)


def webhook_configurations(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
    available: bool = False,
) -> list[dict[str, Any]]:
    """The mutating then the validating configuration (``ManifestError`` on bad input);
    ``available``: the webhooks that judge runs fail open (``failurePolicy: Ignore``),
    where the floor (``floor.py``) holds while runguard is unreachable."""
    kw: dict[str, Any] = {
        "namespace": namespace,
        "service": service,
        "ca_bundle": ca_bundle,
        "url": url,
        "available": available,
    }
    return [
        mutating_webhook_configuration(policy, **kw),
        validating_webhook_configuration(policy, **kw),
    ]


def policy_object_webhook(
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the policy objects: every RunPolicy,
    Profile and project's ProjectProfile created or updated is checked by runguard as
    ``runguard lint`` checks files (``/validate-policy``), and refused with the errors,
    each naming its key."""
    from webhook.policy.crd import GROUP, NAMESPACED, PLURALS, VERSION

    _check_inputs(ca_bundle, url)
    hook = {
        "name": POLICY_WEBHOOK,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(VALIDATE_POLICY_PATH, namespace, service, ca_bundle, url),
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": ["CREATE", "UPDATE"],
                "resources": [p for k, p in PLURALS.items() if (k in NAMESPACED) == namespaced],
                "scope": "Namespaced" if namespaced else "Cluster",
            }
            for namespaced in (False, True)
        ],
        "failurePolicy": "Fail",  # a policy object nobody checked never reaches the mirror
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
    }
    return _configuration("ValidatingWebhookConfiguration", [hook], POLICY_CONFIGURATION_NAME)


def shells_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the doors into a running Pod: ``kubectl
    exec``, ``attach``, ``port-forward``, ``pods/proxy`` and ``services/proxy`` (CONNECT),
    judged on the Pod, each Pod the Service reaches (``ownership.debug``: a Pod of the
    platform's is the platform's to open), and a token
    bound to a Pod (CREATE of ``serviceaccounts/token`` with a Pod as ``boundObjectRef``;
    the kubelets' own, group ``system:nodes``, never wait on runguard). An objectSelector
    cannot see the Pod (the object is ``PodExecOptions`` or a ``TokenRequest``), so every
    one in the namespaces some platform governs reaches runguard, and waits on it: fail
    closed, as a debug container. No webhook when no RunPolicy has a platform
    (``platform.identities``)."""
    target = _Target(policy, namespace, service, ca_bundle, url)
    hooks = []
    if _any_ownership(policy):
        pod_bound = _condition(
            "token-bound-to-a-pod",
            _join(
                "&&",
                "!('system:nodes' in request.userInfo.groups)",
                "object.?spec.?boundObjectRef.?kind.orValue('') == 'Pod'",
            )
            or "",
        )
        hooks = [
            target.webhook(
                SHELLS_WEBHOOK, VALIDATE_PATH, [_rule("", SHELL_SUBRESOURCES, ["CONNECT"])]
            ),
            target.webhook(
                POD_TOKENS_WEBHOOK,
                VALIDATE_PATH,
                [_rule("", [TOKEN_SUBRESOURCE], ["CREATE"])],
                conditions=[pod_bound],
            ),
        ]
    return _configuration("ValidatingWebhookConfiguration", hooks, SHELLS_CONFIGURATION_NAME)
