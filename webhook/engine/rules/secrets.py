"""Step 7 and rule ``secrets.forbidden``: only secrets the platform manages.

Every way a pod names a secret counts: env ``secretKeyRef``, ``envFrom.secretRef``,
secret volumes, projected secret sources, and ``imagePullSecrets`` (a registry
credential is a secret too; the ServiceAccount admission plugin adds the service
account's pull secrets before runguard sees the pod, so admins list those as allowed).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.engine.pod import ALL_CONTAINER_LISTS, Pod, remove_volumes, set_list, warning
from webhook.engine.rule_ids import SECRETS_FORBIDDEN
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import matches_any


def secret_allowed(name: str, pod: Pod, *, undecided: bool = False) -> bool:
    """A secret the platform manages, used by a run the platform created (``undecided``:
    or by a run whose creator runguard's cache cannot tell yet, which mutation leaves
    for validation to deny with ``ownership.unknown``, a denial its controller retries)."""
    creator = pod.ownership.platform or (undecided and pod.ownership.unknown is not None)
    return creator and matches_any(pod.policy.secrets.allowed, name, pod.labels)


def env_secret(env: JSON) -> str | None:
    ref = (env.get("valueFrom") or {}).get("secretKeyRef")
    return ref["name"] if ref else None


def secret_references(pod: Pod) -> Iterator[tuple[str, str]]:
    """Every (secret name, path) the pod spec references: the one list both sides walk."""
    base = pod.spec_path
    for list_name, i, container in pod.containers(ALL_CONTAINER_LISTS):
        cpath = f"{base}.{list_name}[{i}]"
        for j, env in enumerate(container.get("env") or ()):
            name = env_secret(env)
            if name is not None:
                yield name, f"{cpath}.env[{j}].valueFrom.secretKeyRef"
        for j, env_from in enumerate(container.get("envFrom") or ()):
            if "secretRef" in env_from:
                yield env_from["secretRef"]["name"], f"{cpath}.envFrom[{j}].secretRef"
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        if "secret" in volume:
            yield volume["secret"]["secretName"], f"{base}.volumes[{i}].secret"
        projected = volume.get("projected")
        if isinstance(projected, dict):
            for j, source in enumerate(projected.get("sources") or ()):
                if "secret" in source:
                    yield source["secret"]["name"], f"{base}.volumes[{i}].projected.sources[{j}]"
    for i, ref in enumerate(pod.spec.get("imagePullSecrets") or ()):
        if ref.get("name"):  # DigitalHub's Core sends [{name: ""}]: names no secret
            yield ref["name"], f"{base}.imagePullSecrets[{i}]"


def drop_forbidden_secrets(pod: Pod) -> Change | None:
    if pod.policy.secrets.on_forbidden != "Strip":
        return None
    removed: dict[str, None] = {}  # ordered, and linear however many references repeat

    def ok(name: str) -> bool:
        if secret_allowed(name, pod, undecided=True):
            return True
        removed[name] = None
        return False

    for _, _, container in pod.containers():
        if container.get("env"):
            kept = [e for e in container["env"] if (s := env_secret(e)) is None or ok(s)]
            set_list(container, "env", kept)
        if container.get("envFrom"):
            kept = [
                e
                for e in container["envFrom"]
                if "secretRef" not in e or ok(e["secretRef"]["name"])
            ]
            set_list(container, "envFrom", kept)
    dropped_volumes: set[str] = set()
    for volume in pod.spec.get("volumes") or ():
        if "secret" in volume and not ok(volume["secret"]["secretName"]):
            dropped_volumes.add(volume["name"])
        projected = volume.get("projected")
        if isinstance(projected, dict) and projected.get("sources"):
            sources = projected["sources"]
            kept = [s for s in sources if "secret" not in s or ok(s["secret"]["name"])]
            if len(kept) != len(sources):
                projected["sources"] = kept
                if not kept:
                    dropped_volumes.add(volume["name"])
    if dropped_volumes:
        remove_volumes(pod.spec, dropped_volumes)
    if pod.spec.get("imagePullSecrets"):
        kept = [r for r in pod.spec["imagePullSecrets"] if not r.get("name") or ok(r["name"])]
        set_list(pod.spec, "imagePullSecrets", kept)
    if not removed:
        return None
    return Change(
        SECRETS_FORBIDDEN, warning("secrets not managed by the platform removed", removed)
    )


def check_secrets(pod: Pod) -> list[Violation]:
    return [
        Violation(SECRETS_FORBIDDEN, path, _why(name, pod))
        for name, path in secret_references(pod)
        if not secret_allowed(name, pod)
    ]


def _why(name: str, pod: Pod) -> str:
    if matches_any(pod.policy.secrets.allowed, name, pod.labels):
        return f"secret {name!r} is the platform's: only runs the platform creates may use it"
    return f"secret {name!r} is not managed by the platform"
