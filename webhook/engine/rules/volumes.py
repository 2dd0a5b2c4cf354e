"""Step 6 and rules ``volumes.*``: allowed volume types, no pre-existing claims or configMaps."""

from __future__ import annotations

from webhook.engine.pod import Pod, remove_volumes, warning
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import matches_any

# Keys of a Volume that name its type (everything but ``name``).
_NOT_TYPES = frozenset({"name"})


def preexisting_reference(volume: JSON, pod: Pod) -> str | None:
    """``"pvc NAME"`` or ``"configMap NAME"`` when the volume is not one the platform made."""
    cfg = pod.policy.volumes
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        if not matches_any(cfg.platform_claims, claim, pod.labels):
            return f"pvc {claim}"
    if "configMap" in volume:
        name = volume["configMap"]["name"]
        if not matches_any(cfg.platform_config_maps, name, pod.labels):
            return f"configMap {name}"
    return None


def drop_preexisting_volumes(pod: Pod) -> Change | None:
    if pod.policy.volumes.on_pre_existing != "Strip":
        return None
    dropped = [
        v["name"]
        for v in pod.spec.get("volumes") or ()
        if preexisting_reference(v, pod) is not None
    ]
    if not dropped:
        return None
    remove_volumes(pod.spec, set(dropped))
    return Change("volumes.pre-existing", warning("pre-existing volumes removed", dropped))


def check_volumes(pod: Pod) -> list[Violation]:
    allowed = pod.policy.volumes.allowed_types
    out: list[Violation] = []
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        path = f"{pod.spec_path}.volumes[{i}]"
        forbidden = [t for t in volume if t not in _NOT_TYPES and t not in allowed]
        if forbidden:
            out.append(
                Violation(
                    "volumes.forbidden-type",
                    path,
                    f"volume {volume['name']!r} of type {forbidden[0]} is not allowed",
                )
            )
        reference = preexisting_reference(volume, pod)
        if reference is not None:
            out.append(
                Violation(
                    "volumes.pre-existing",
                    path,
                    f"volume {volume['name']!r} uses pre-existing {reference}",
                )
            )
    return out
