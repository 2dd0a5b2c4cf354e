"""A run's size, recorded once (``runguard.io/size``): what its queue counted is what runs.

When ``/mutate`` applies a profile to a pod template at CREATE (a Job's, a CronJob's job
template, an operator's declared templates), it records on the template what it gave:
the profile, a digest of it, and the main container's resources for each resource the
profile sets. A queue counts that template; the Pods its controller makes copy the
record, and their profile's resources are the record's, not the profile's as it is now
(a project profile edited or deleted since changes new runs only).

A record is believed on a Pod at CREATE only from the controller or operator that owns
its kind making it for a controller owner runguard recorded (its stored object carries
runguard's RunPolicy label): anyone else's record is removed. On UPDATE it is frozen
(``resources.grown``'s module judges that), so the record a stored Pod carries is the
one believed at its CREATE.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from webhook.engine.context import Context
from webhook.engine.types import JSON
from webhook.keys import POLICY_LABEL, SIZE_RECORD
from webhook.policy.model import Profile, RunPolicy


class Pod(Protocol):
    """What is read of ``webhook.engine.pod.Pod`` here (which resolves its profile here)."""

    @property
    def spec_path(self) -> str: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def context(self) -> Context: ...
    @property
    def policy(self) -> RunPolicy: ...
    @property
    def owner_references(self) -> tuple[Any, ...]: ...
    @property
    def profile(self) -> Profile | None: ...
    @property
    def profile_refused(self) -> Profile | None: ...


__all__ = ["SIZE_RECORD", "believed", "digest", "record", "recorded_profile", "with_record"]

_PARTS = ("requests", "limits")


def digest(profile: Profile) -> str:
    """A short digest of everything the profile gives: it names the profile's version."""
    return hashlib.sha256(profile.model_dump_json(warnings=False).encode()).hexdigest()[:16]


def record(profile: Profile, main: JSON) -> str:
    """The record of ``main`` (the main container, the profile applied) under ``profile``:
    its resources for each resource the profile sets, exactly or as a range."""
    res = main.get("resources")
    res = res if isinstance(res, dict) else {}
    given = profile.resources
    out: dict[str, Any] = {"profile": profile.title, "digest": digest(profile)}
    for part in _PARTS:
        values = res.get(part)
        names = getattr(given, part)
        if isinstance(values, dict):
            kept = {k: v for k, v in values.items() if k in names and isinstance(v, str)}
            if kept:
                out[part] = kept
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()


def with_record(obj: JSON, keys: tuple[str | int, ...], text: str) -> JSON:
    """A copy of ``obj`` whose pod template at ``keys`` carries the record ``text`` (each
    level copied); ``obj`` itself when it carries it already."""
    node: Any = obj
    for key in keys:
        node = node[key]
    metadata = node.get("metadata") if isinstance(node, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if isinstance(annotations, dict) and annotations.get(SIZE_RECORD) == text:
        return obj
    out = dict(obj)
    node = out
    for key in keys:
        child = node[key]
        node[key] = list(child) if isinstance(child, list) else dict(child)
        node = node[key]
    meta = dict(node.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), SIZE_RECORD: text}
    node["metadata"] = meta
    return out


def read(text: str) -> dict[str, Any] | None:
    """A record's fields, None when it cannot be read."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("profile"), str):
        return None
    for part in _PARTS:
        values = data.get(part, {})
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            return None
    return data


def believed(pod: Pod) -> bool:
    """Whether the record ``pod`` carries is believed (see the module doc): on UPDATE the
    stored Pod's (frozen since its CREATE); at CREATE only from the controller that owns
    its controller owner's kind, for an owner runguard recorded."""
    if pod.spec_path != "spec" or SIZE_RECORD not in pod.annotations:
        return False
    context = pod.context
    if context.operation == "UPDATE":
        return True
    requester, cluster = context.requester, context.state
    if requester is None or cluster is None:
        return False
    kinds = pod.policy.platform.owner_kinds.get(requester.username)
    if not kinds:
        return False
    names = {k.rpartition("/")[2] for k in kinds}
    for ref in pod.owner_references:
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        if ref.get("kind") not in names:
            continue
        stored = cluster.by_uid(str(ref.get("uid")))
        if stored is not None and stored.labels.get(POLICY_LABEL):
            return True
    return False


def recorded_profile(pod: Pod, name: str) -> Profile | None:
    """The profile the record of ``pod`` gives for the profile ``name`` it asks for: the
    profile as it is now (or, deleted since, only its name), with the recorded resources
    as exact values. None when there is no believed record for that profile."""
    if not believed(pod):
        return None
    data = read(pod.annotations[SIZE_RECORD])
    if data is None or data["profile"].rpartition("/")[2] != name:
        return None
    live = pod.profile or pod.profile_refused
    base: dict[str, Any] = (
        live.model_dump(by_alias=True, exclude_none=True, exclude={"resources"}, warnings=False)
        if live is not None
        else {"name": name, "project": data["profile"].rpartition("/")[0]}
    )
    base["resources"] = {part: data.get(part, {}) for part in _PARTS}
    gpu = pod.policy.resources.gpu_resource_name
    return Profile.model_validate(base, context={"gpu": gpu})
