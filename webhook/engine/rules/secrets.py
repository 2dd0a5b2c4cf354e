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
    remove_volumes,
    set_list,
    warning,
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
    secrets = pod.policy.secrets
    if secrets.on_forbidden != "Strip":
        return None
    spec = pod.spec
    removed: dict[str, None] = {}  # ordered, and linear however many references repeat
    ownership = pod.ownership
    creator = ownership.platform or ownership.unknown is not None  # undecided too
    patterns = secrets.allowed
    labels = pod.labels

    def ok(name: str) -> bool:
        if creator and matches_any(patterns, name, labels):
            return True
        removed[name] = None
        return False

    # Plain loops that build a list only where a reference goes: every run Pod passes here
    for list_name in CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            env = container.get("env")
            if env:
                _filter_env(container, env, ok)
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
    return _removed_change(tuple(removed))


# the secrets removed -> their Change: the same few names on every run of a platform, and
# a Change is frozen (one serves every run); bounded, since the names are a user's
_REMOVED_CHANGES: dict[tuple[str, ...], Change] = {}


def _removed_change(names: tuple[str, ...]) -> Change:
    change = _REMOVED_CHANGES.get(names)
    if change is None:
        text = warning("secrets not managed by the platform removed", names)
        change = Change(SECRETS_FORBIDDEN, text)
        if len(_REMOVED_CHANGES) >= 1024:
            _REMOVED_CHANGES.clear()
        _REMOVED_CHANGES[names] = change
    return change


def _filter_env(container: JSON, entries: list[JSON], ok: Callable[[str], bool]) -> None:
    """``_filter`` of ``container["env"]``, ``env_secret`` inlined where no entry goes
    (every run Pod's env passes here; most entries are a value, no reference)."""
    for i, entry in enumerate(entries):
        value_from = entry.get("valueFrom")
        if not value_from:
            continue
        ref = value_from.get("secretKeyRef")
        if ref and not ok(ref["name"]):
            kept = entries[:i]
            for entry in entries[i + 1 :]:
                name = env_secret(entry)
                if name is None or ok(name):
                    kept.append(entry)
            set_list(container, "env", kept)
            return


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
    """Whether every secret the pod references is allowed (``secret_references``' walk,
    names only): check_secrets formats paths only for a Pod that has a violation."""
    spec = pod.spec
    if not pod.ownership.platform:
        return next(secret_references(pod), None) is None
    patterns = pod.policy.secrets.allowed
    labels = pod.labels
    for list_name in ALL_CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            for env in container.get("env") or ():
                if "valueFrom" not in env:  # most entries: a value, no reference
                    continue
                name = env_secret(env)
                if name is not None and not matches_any(patterns, name, labels):
                    return False
            for env_from in container.get("envFrom") or ():
                if "secretRef" in env_from and not matches_any(
                    patterns, env_from["secretRef"]["name"], labels
                ):
                    return False
    for volume in spec.get("volumes") or ():
        if "secret" in volume and not matches_any(patterns, volume["secret"]["secretName"], labels):
            return False
        projected = volume.get("projected")
        if isinstance(projected, dict):
            for source in projected.get("sources") or ():
                if "secret" in source and not matches_any(
                    patterns, source["secret"]["name"], labels
                ):
                    return False
    for ref in spec.get("imagePullSecrets") or ():
        if ref.get("name") and not matches_any(patterns, ref["name"], labels):
            return False
    return True


def _why(name: str, pod: Pod) -> str:
    if matches_any(pod.policy.secrets.allowed, name, pod.labels):
        return f"secret {name!r} is the platform's: only runs the platform creates may use it"
    return f"secret {name!r} is not managed by the platform"
