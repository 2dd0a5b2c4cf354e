"""Step 7 and rule ``secrets.forbidden``: only secrets the platform manages.

Every way a pod names a secret counts: env ``secretKeyRef``, ``envFrom.secretRef``,
secret volumes, projected secret sources, and ``imagePullSecrets`` (a registry
credential is a secret too; the ServiceAccount admission plugin adds the service
account's pull secrets before runguard sees the pod, so admins list those as allowed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from webhook.engine.pod import (
    ALL_CONTAINER_LISTS,
    CONTAINER_LISTS,
    Pod,
    kept_change,
    remove_volumes,
    set_list,
)
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
    value_from = env.get("valueFrom")
    if not value_from:
        return None
    ref = value_from.get("secretKeyRef")
    return ref["name"] if ref else None


def secret_references(pod: Pod, *, paths: bool = True) -> Iterator[tuple[str, str]]:
    """Every (secret name, path) the pod spec references: the one list both sides walk
    (``paths`` False: the path is "", for a caller that needs only the names)."""
    base = pod.spec_path
    for list_name, i, container in pod.containers(ALL_CONTAINER_LISTS):
        cpath = f"{base}.{list_name}[{i}]" if paths else ""
        for j, env in enumerate(container.get("env") or ()):
            name = env_secret(env)
            if name is not None:
                yield name, f"{cpath}.env[{j}].valueFrom.secretKeyRef" if paths else ""
        for j, env_from in enumerate(container.get("envFrom") or ()):
            if "secretRef" in env_from:
                path = f"{cpath}.envFrom[{j}].secretRef" if paths else ""
                yield env_from["secretRef"]["name"], path
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        if "secret" in volume:
            path = f"{base}.volumes[{i}].secret" if paths else ""
            yield volume["secret"]["secretName"], path
        projected = volume.get("projected")
        if isinstance(projected, dict):
            for j, source in enumerate(projected.get("sources") or ()):
                if "secret" in source:
                    path = f"{base}.volumes[{i}].projected.sources[{j}]" if paths else ""
                    yield source["secret"]["name"], path
    for i, ref in enumerate(pod.spec.get("imagePullSecrets") or ()):
        if ref.get("name"):  # DigitalHub's Core sends [{name: ""}]: names no secret
            yield ref["name"], f"{base}.imagePullSecrets[{i}]" if paths else ""


def drop_forbidden_secrets(pod: Pod) -> Change | None:
    secrets = pod.policy.secrets
    if secrets.on_forbidden != "Strip":
        return None
    spec = pod.spec
    removed: dict[str, None] = {}  # ordered, and linear however many references repeat

    def ok(name: str) -> bool:
        if secret_allowed(name, pod, undecided=True):
            return True
        removed[name] = None
        return False

    # Plain loops that build a list only where a reference goes: every run Pod passes here
    for list_name in CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            env = container.get("env")
            if env:
                _filter(container, "env", env, ok, env_secret)
            env_from = container.get("envFrom")
            if env_from:
                _filter(container, "envFrom", env_from, ok, _env_from_secret)
    volumes = spec.get("volumes")
    if volumes:
        dropped_volumes: set[str] = set()
        for volume in volumes:
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
            remove_volumes(spec, dropped_volumes)
    if spec.get("imagePullSecrets"):
        kept = [r for r in spec["imagePullSecrets"] if not r.get("name") or ok(r["name"])]
        set_list(spec, "imagePullSecrets", kept)
    if not removed:
        return None
    return kept_change(
        SECRETS_FORBIDDEN, "secrets not managed by the platform removed", tuple(removed)
    )


def _env_from_secret(env_from: JSON) -> str | None:
    return env_from["secretRef"]["name"] if "secretRef" in env_from else None


def _filter(
    container: JSON,
    key: str,
    entries: list[JSON],
    ok: Callable[[str], bool],
    secret: Callable[[JSON], str | None],
) -> None:
    """Drop the entries of ``container[key]`` naming a secret not ``ok``; the list is
    copied only when one goes (``set_list``), as most Pods' references are all allowed."""
    for i, entry in enumerate(entries):
        name = secret(entry)
        if name is not None and not ok(name):
            kept = entries[:i]
            for entry in entries[i + 1 :]:
                name = secret(entry)
                if name is None or ok(name):
                    kept.append(entry)
            set_list(container, key, kept)
            return


def check_secrets(pod: Pod) -> list[Violation]:
    if _all_allowed(pod):  # the usual Pod: no path to format
        return []
    return [
        Violation(SECRETS_FORBIDDEN, path, _why(name, pod))
        for name, path in secret_references(pod)
        if not secret_allowed(name, pod)
    ]


def _all_allowed(pod: Pod) -> bool:
    """Whether every secret the pod references is allowed: check_secrets formats paths
    only for a Pod that has a violation."""
    return all(secret_allowed(name, pod) for name, _ in secret_references(pod, paths=False))


def _why(name: str, pod: Pod) -> str:
    if matches_any(pod.policy.secrets.allowed, name, pod.labels):
        return f"secret {name!r} is the platform's: only runs the platform creates may use it"
    return f"secret {name!r} is not managed by the platform"
