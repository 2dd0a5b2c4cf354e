"""The doors admission cannot see, each with the RBAC grants that open it.

Some verbs reach the platform's objects without any admission request: reading a
Secret, changing a ConfigMap's data, the kubelet's API through ``nodes/proxy``, a
token, impersonation. Each door (``DOORS``) is declared here with its id, which is what
``runguard audit --rbac`` reports it under (``docs/threat-model.md`` says what each
grants), and the resources and verbs that open it; ``webhook.audit.rbacreport`` finds
who holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.rule import Declarations

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_API = f"{RBAC_GROUP}/v1"

RULES = Declarations(__name__)
RBAC_READ_SECRETS = RULES.report("rbac.read-secrets", "read Secrets")
RBAC_READ_CONFIG_MAPS = RULES.report("rbac.read-config-maps", "read platform-named ConfigMaps")
RBAC_PLATFORM_DATA = RULES.report(
    "rbac.platform-data", "change the data of platform-named ConfigMaps and Secrets"
)
RBAC_NODE_PROXY = RULES.report("rbac.node-proxy", "the kubelet's API of every Pod on a node")
RBAC_CONNECT = RULES.report("rbac.connect", "connect into Pods (exec, attach, port-forward, proxy)")
RBAC_TOKEN = RULES.report("rbac.token", "tokens for ServiceAccounts")
RBAC_SNAPSHOT = RULES.report(
    "rbac.snapshot", "snapshot the platform's volumes into claims of one's own"
)
RBAC_GRANT = RULES.report("rbac.grant", "grant oneself any door (bind or escalate roles)")
RBAC_IMPERSONATE = RULES.report("rbac.impersonate", "impersonate users, groups or ServiceAccounts")
RBAC_EXPOSE = RULES.report(
    "rbac.expose",
    "Services, Ingresses, routes and NetworkPolicies that can expose the platform's Pods",
)

WRITES = frozenset({"update", "patch"})
# Any verb a connection into a Pod is authorized by: exec, attach and port-forward are
# `create` (and `get` over the older websocket path); a proxy is any HTTP method's verb.
CONNECT_VERBS = frozenset({"get", "create", "update", "patch", "delete"})
EXPOSE_VERBS = frozenset({"create", "update", "patch"})
CREATE_OR_WRITE = frozenset({"create", *WRITES})


@dataclass(frozen=True)
class Resource:
    """A resource a door opens through: ``group`` and ``resource`` as RBAC names them
    (``pods/exec``; ``userextras/*`` for any subresource of ``userextras``)."""

    group: str
    resource: str
    verbs: frozenset[str]
    cluster_scoped: bool = False
    # Platform names narrow it: "secrets" or "configmaps" (a grant by resourceNames
    # counts only for names the platform's patterns match); None: any name counts.
    platform_names: str | None = None
    # Only the platform's objects are the door: none when the policy names none.
    platform_only: bool = False
    # A door only in a namespace holding a platform's or operator's ServiceAccount (a
    # token Secret for it is made there).
    account_namespaces: bool = False


@dataclass(frozen=True)
class Door:
    """A way to the platform's objects that no admission request is made for."""

    id: str  # declared above (``RULES``), with its title
    resources: tuple[Resource, ...]
    needs_shells_off: bool = False  # judged by admission when the shells webhook is on
    # Held only when the verbs granted, by resource, open it together (``bind`` is of
    # no use without creating a binding); None: any grant of its resources opens it.
    held: Callable[[Mapping[str, frozenset[str]]], bool] | None = None

    @property
    def title(self) -> str:
        return next(r.description for r in RULES.reported if r.id == self.id)


def _r(group: str, resource: str, verbs: Iterable[str], **kw: Any) -> Resource:
    return Resource(group, resource, frozenset(verbs), **kw)


READ = ("get", "list", "watch")
ROLES = ("roles", "clusterroles")
BINDINGS = ("rolebindings", "clusterrolebindings")


def _grants_itself(held: Mapping[str, frozenset[str]]) -> bool:
    """``bind`` of a role with a binding created or updated, or ``escalate`` of a role
    with a role created or updated: a subject writing its own rules."""

    def verbs(resources: Iterable[str]) -> frozenset[str]:
        return frozenset(v for r in resources for v in held.get(r, ()))

    roles, bindings = verbs(ROLES), verbs(BINDINGS)
    return ("bind" in roles and bool(bindings & CREATE_OR_WRITE)) or (
        "escalate" in roles and bool(roles & CREATE_OR_WRITE)
    )


DOORS = (
    Door(
        RBAC_READ_SECRETS,
        (_r("", "secrets", READ, platform_names="secrets"),),
    ),
    Door(
        RBAC_READ_CONFIG_MAPS,
        (_r("", "configmaps", READ, platform_names="configmaps", platform_only=True),),
    ),
    Door(
        RBAC_PLATFORM_DATA,
        (
            _r("", "configmaps", WRITES, platform_names="configmaps", platform_only=True),
            _r("", "secrets", WRITES, platform_names="secrets", platform_only=True),
        ),
    ),
    Door(
        RBAC_NODE_PROXY,
        (_r("", "nodes/proxy", CONNECT_VERBS, cluster_scoped=True),),
    ),
    Door(
        RBAC_CONNECT,
        tuple(
            _r("", resource, CONNECT_VERBS)
            for resource in (
                "pods/exec",
                "pods/attach",
                "pods/portforward",
                "pods/proxy",
                "services/proxy",
            )
        ),
        needs_shells_off=True,
    ),
    Door(
        RBAC_TOKEN,
        (
            _r("", "serviceaccounts/token", ["create"]),
            # a Secret of type kubernetes.io/service-account-token, which the token
            # controller fills, where a platform's account lives
            _r("", "secrets", ["create"], account_namespaces=True),
        ),
    ),
    Door(
        RBAC_SNAPSHOT,
        (
            _r("snapshot.storage.k8s.io", "volumesnapshots", ["create"]),
            _r(
                "snapshot.storage.k8s.io", "volumesnapshotcontents", ["create"], cluster_scoped=True
            ),
        ),
    ),
    Door(
        RBAC_GRANT,
        (
            _r(RBAC_GROUP, "roles", ["bind", "escalate", *CREATE_OR_WRITE]),
            _r(RBAC_GROUP, "clusterroles", ["bind", "escalate"]),
            _r(RBAC_GROUP, "rolebindings", CREATE_OR_WRITE),
            _r(RBAC_GROUP, "clusterroles", CREATE_OR_WRITE, cluster_scoped=True),
            _r(RBAC_GROUP, "clusterrolebindings", CREATE_OR_WRITE, cluster_scoped=True),
        ),
        held=_grants_itself,
    ),
    Door(
        RBAC_IMPERSONATE,
        (
            _r("", "users", ["impersonate"], cluster_scoped=True),
            _r("", "groups", ["impersonate"], cluster_scoped=True),
            _r("", "serviceaccounts", ["impersonate"]),
            _r("authentication.k8s.io", "userextras/*", ["impersonate"], cluster_scoped=True),
            _r("authentication.k8s.io", "uids", ["impersonate"], cluster_scoped=True),
        ),
    ),
    Door(
        RBAC_EXPOSE,
        (
            _r("", "services", EXPOSE_VERBS),
            _r("", "endpoints", EXPOSE_VERBS),
            _r("discovery.k8s.io", "endpointslices", EXPOSE_VERBS),
            _r("networking.k8s.io", "ingresses", EXPOSE_VERBS),
            _r("extensions", "ingresses", EXPOSE_VERBS),
            _r("networking.k8s.io", "networkpolicies", EXPOSE_VERBS),
            *(
                _r("gateway.networking.k8s.io", route, EXPOSE_VERBS)
                for route in ("httproutes", "grpcroutes", "tcproutes", "tlsroutes", "udproutes")
            ),
        ),
    ),
)
