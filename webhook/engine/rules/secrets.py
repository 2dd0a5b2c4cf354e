"""Step 7 and rule ``secrets.forbidden``: only secrets the platform manages.

Every door of ``webhook.engine.doors`` that names a Secret counts, and each the same way:
env ``secretKeyRef``, ``envFrom.secretRef``, secret volumes, projected secret sources,
the secret references of csi, flexVolume, cephfs, rbd, iscsi, cinder, scaleIO, storageos
and azureFile volumes, a value of a csi volume's ``volumeAttributes`` (or a flexVolume's
``options``) that is a Secret name of the platform, or of any platform looking at the
namespace (a driver reading ``secretName`` there opens that Secret with its own
rights), and ``imagePullSecrets``
(a registry credential is a secret too; the ServiceAccount admission plugin adds the
service account's pull secrets before runguard sees the pod, so admins list those as
allowed). Mutation removes what holds a forbidden reference (the env entry, the
projected source, the pull secret entry, the volume with its mounts); validation denies
it.
"""

from __future__ import annotations

from webhook.engine import scope
from webhook.engine.doors import Reference, item_text, located
from webhook.engine.pod import Pod, kept_change, remove_items
from webhook.engine.rule import Declarations
from webhook.engine.rules.ownership import platform_named
from webhook.engine.types import Change, Violation
from webhook.policy.model import matches_any

RULES = Declarations(__name__)
SECRETS_FORBIDDEN = RULES.rule(
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

SECRET = frozenset({"Secret"})


def secret_allowed(name: str, pod: Pod, *, undecided: bool = False) -> bool:
    """A secret the platform manages, used by a run the platform created (``undecided``:
    or by a run whose creator runguard's cache cannot tell yet, which mutation leaves
    for validation to deny with ``ownership.unknown``, a denial its controller retries)."""
    creator = pod.ownership.platform or (undecided and pod.ownership.unknown is not None)
    return creator and matches_any(pod.policy.secrets.allowed, name, pod.labels)


def secret_references(pod: Pod) -> list[Reference]:
    """Every secret the pod spec names, through every Secret door: the one list both the
    step and the check walk; a value of a driver's map only when it is a platform name
    (of the governing RunPolicy's, or of any platform looking at the namespace: a run
    of one platform reads another's Secret through a driver as well)."""
    return [
        ref
        for ref in located(pod.spec, SECRET)
        if not ref.door.by_pattern or _any_platforms(pod, ref.name)
    ]


def _any_platforms(pod: Pod, name: str) -> bool:
    """``name`` is a Secret name of the governing RunPolicy or of a platform looking at
    the pod's namespace (only by-pattern values, rare, come here)."""
    if platform_named(pod.policy, "Secret", name):
        return True
    others = () if pod.root is None else scope.platforms(pod.root, pod.namespace)
    return any(platform_named(p, "Secret", name) for p in others)


def drop_forbidden_secrets(pod: Pod) -> Change | None:
    if pod.policy.secrets.on_forbidden != "Strip":
        return None
    removed: dict[str, None] = {}  # ordered, and linear however many references repeat
    items = []
    for ref in secret_references(pod):
        if not secret_allowed(ref.name, pod, undecided=True):
            removed[ref.name] = None
            items.append(ref.item)
    if not items:
        return None
    remove_items(pod.spec, items)
    return kept_change(
        SECRETS_FORBIDDEN, "secrets not managed by the platform removed", tuple(removed)
    )


def check_secrets(pod: Pod) -> list[Violation]:
    return [
        Violation(SECRETS_FORBIDDEN, item_text(ref.item, pod.spec_path), _why(ref, pod))
        for ref in secret_references(pod)
        if not secret_allowed(ref.name, pod)
    ]


def _why(ref: Reference, pod: Pod) -> str:
    name = ref.name
    if matches_any(pod.policy.secrets.allowed, name, pod.labels):
        return f"secret {name!r} is the platform's: only runs the platform creates may use it"
    return f"secret {name!r} is not managed by the platform"
