"""Step 6 and rules ``volumes.*``: allowed volume types, no existing data by any door.

Existing data reaches a pod through a claim or configMap the platform did not create
(by name), through a projected configMap source, or through a claim *template* (an
ephemeral volume, a StatefulSet's ``volumeClaimTemplates``) that clones a claim,
restores a snapshot or binds a chosen volume. All are pre-existing references, except
the public ConfigMaps the policy shares with every Pod (``volumes.sharedConfigMaps``).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.engine.pod import Pod, kept_change, remove_volumes, set_list
from webhook.engine.rule import Declarations
from webhook.engine.rules.operators import operator_config_map
from webhook.engine.rules.pod_security import RESTRICTED_VOLUME_TYPES
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import ROOT_CA_CONFIG_MAP, RunPolicy, matches_any

RULES = Declarations(__name__)
VOLUMES_FORBIDDEN_TYPE = RULES.rule(
    "volumes.forbidden-type",
    mutation="",
    violation="a volume type not in `allowedTypes`, or not allowed at the level",
)
VOLUMES_PRE_EXISTING = RULES.rule(
    "volumes.pre-existing",
    mutation="the volume (or projected source) and its mounts removed",
    violation=(
        "a claim or configMap the platform did not create, a projected configMap (a shared "
        "one, `volumes.sharedConfigMaps`, aside), a claim template bringing data "
        "(`dataSource`, `dataSourceRef`, `volumeName`, `selector`), a platform object used by "
        "a run the platform did not create"
    ),
)

# Keys of a Volume that name its type (everything but ``name``).
_NOT_TYPES = frozenset({"name"})
# Claim template fields that bring existing data instead of a new, empty volume.
CLAIM_DATA_FIELDS = ("dataSource", "dataSourceRef", "volumeName", "selector")


def _platform_config_map(name: str, pod: Pod) -> bool:
    return matches_any(pod.policy.volumes.platform_config_maps, name, pod.labels)


def claim_template_reference(template_spec: object) -> str | None:
    """``"claim template with dataSource"`` when a claim template brings existing data."""
    if not isinstance(template_spec, dict):
        return None
    used = [f for f in CLAIM_DATA_FIELDS if template_spec.get(f) not in (None, {}, "")]
    return f"claim template with {', '.join(used)}" if used else None


NOT_THE_PLATFORMS = "only runs the platform creates may use it"


def project_claim(pod: Pod, claim: str) -> bool | None:
    """Whether ``claim`` is a project-shared volume of this run's project (the claim carries
    the run's ``platform.projectLabel`` value); None when the cache cannot tell yet."""
    key = pod.policy.platform.project_label
    project = pod.labels.get(key) if key else None
    state = pod.context.state
    if not key or not project or not pod.ownership.platform or state is None:
        return False
    found = state.get("PersistentVolumeClaim", pod.namespace, claim)
    if found is None:
        return None if not state.synced("PersistentVolumeClaim") else False
    return found.labels.get(key) == project


def _creator_may(pod: Pod, undecided: bool) -> bool:
    """The platform created the run (``undecided``: or the cache cannot tell yet, which
    mutation leaves for validation to deny with ``ownership.unknown``, retryable)."""
    return pod.ownership.platform or (undecided and pod.ownership.unknown is not None)


def preexisting_reference(volume: JSON, pod: Pod, undecided: bool = False) -> str | None:
    """What existing data the volume (as a whole) reaches, or None for a platform volume.

    A platform-named claim or configMap is the platform's: a run the platform did not
    create may not use it (``platform.identities``; without it names decide)."""
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        if matches_any(pod.policy.volumes.platform_claims, claim, pod.labels):
            if not _creator_may(pod, undecided):
                return f"pvc {claim} ({NOT_THE_PLATFORMS})"
        elif project_claim(pod, claim) is False:
            return f"pvc {claim}"
    if "configMap" in volume:
        name = volume["configMap"]["name"]
        if pod.policy.volumes.shared_config_map(name) or operator_config_map(pod, name, undecided):
            return None
        if not _platform_config_map(name, pod):
            return f"configMap {name}"
        if not _creator_may(pod, undecided):
            return f"configMap {name} ({NOT_THE_PLATFORMS})"
    ephemeral = volume.get("ephemeral")
    if isinstance(ephemeral, dict):
        template = ephemeral.get("volumeClaimTemplate") or {}
        return claim_template_reference(template.get("spec"))
    return None


def _projected_config_maps(
    volume: JSON, pod: Pod, undecided: bool = False
) -> Iterator[tuple[int, str]]:
    """(index, name) of projected configMap sources the platform did not make."""
    projected = volume.get("projected")
    if not isinstance(projected, dict):
        return
    for j, source in enumerate(projected.get("sources") or ()):
        if "configMap" in source:
            name = source["configMap"]["name"]
            # the apiserver's projected source in every pod, shared even where
            # volumes.sharedConfigMaps leaves it out
            if name != ROOT_CA_CONFIG_MAP and not (
                pod.policy.volumes.shared_config_map(name)
                or (_platform_config_map(name, pod) and _creator_may(pod, undecided))
                or operator_config_map(pod, name, undecided)
            ):
                yield j, name


def drop_preexisting_volumes(pod: Pod) -> Change | None:
    if pod.policy.volumes.on_pre_existing != "Strip":
        return None
    volumes = pod.spec.get("volumes")
    if not volumes:
        return None
    dropped: list[str] = []
    notes: list[str] = []
    for volume in volumes:
        if preexisting_reference(volume, pod, True) is not None:
            dropped.append(volume["name"])
            notes.append(volume["name"])
            continue
        if "projected" not in volume:  # the usual volume: no sources to look through
            continue
        foreign = dict(_projected_config_maps(volume, pod, undecided=True))
        if foreign:
            projected = volume["projected"]
            kept = [s for j, s in enumerate(projected["sources"]) if j not in foreign]
            notes.extend(f"{volume['name']} configMap {name}" for name in foreign.values())
            if kept:
                set_list(projected, "sources", kept)
            else:
                dropped.append(volume["name"])
    if not notes:
        return None
    if dropped:
        remove_volumes(pod.spec, set(dropped))
    return kept_change(VOLUMES_PRE_EXISTING, "pre-existing volumes removed", tuple(notes))


def forbidden_type(kind: str, policy: RunPolicy) -> str | None:
    """Why a volume of type ``kind`` may not be used, or None: the one judgment of volume
    types, the policy's ``volumes.allowedTypes`` and then the Pod Security level, which
    forbids some types even where the list names them (check_hostPathVolumes.go,
    check_restrictedVolumes.go)."""
    if kind not in policy.volumes.allowed_types:
        return "is not allowed"
    level = policy.security.level
    if kind == "hostPath" or (level == "restricted" and kind not in RESTRICTED_VOLUME_TYPES):
        return f"is not allowed at Pod Security level {level}: use a persistentVolumeClaim"
    return None


def host_path_reason(volume: JSON, pod: Pod) -> str | None:
    """Why a hostPath volume may not be used under ``volumes.allowedHostPaths``, or None
    for one of those paths in a run the platform created (nothing else of the node)."""
    source = volume.get("hostPath")
    path = source.get("path") if isinstance(source, dict) else None
    if not isinstance(path, str) or not pod.policy.volumes.host_path_allowed(path, pod.namespace):
        return f"at {path} is not allowed (volumes.allowedHostPaths)"
    if not pod.ownership.platform:
        return f"at {path} is not allowed ({NOT_THE_PLATFORMS})"
    return None


def check_volumes(pod: Pod) -> list[Violation]:
    out: list[Violation] = []
    policy = pod.policy
    host_paths = policy.volumes.allowed_host_paths
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        for kind, source in volume.items():
            if kind == "hostPath" and host_paths:
                reason = host_path_reason(volume, pod)
            else:
                reason = None if kind in _NOT_TYPES else forbidden_type(kind, policy)
            if reason is not None and (source is not None or "level" not in reason):
                out.append(
                    Violation(
                        VOLUMES_FORBIDDEN_TYPE,
                        f"{pod.spec_path}.volumes[{i}]",
                        f"volume {volume['name']!r} of type {kind} {reason}",
                    )
                )
                break
        reference = preexisting_reference(volume, pod)
        if reference is not None:
            out.append(
                Violation(
                    VOLUMES_PRE_EXISTING,
                    f"{pod.spec_path}.volumes[{i}]",
                    f"volume {volume['name']!r} uses pre-existing {reference}",
                )
            )
        if "projected" not in volume:
            continue
        for j, name in _projected_config_maps(volume, pod):
            out.append(
                Violation(
                    VOLUMES_PRE_EXISTING,
                    f"{pod.spec_path}.volumes[{i}].projected.sources[{j}].configMap",
                    f"volume {volume['name']!r} projects pre-existing configMap {name}",
                )
            )
    for path, template in pod.claim_templates:
        reference = claim_template_reference(template.get("spec"))
        if reference is not None:
            out.append(
                Violation(
                    VOLUMES_PRE_EXISTING,
                    f"{path}.spec",
                    f"{reference}: runs get new, empty claims; copy data in from the platform",
                )
            )
    return out
