"""Rule ``scope.labels``: a run cannot leave runguard's sight by editing its own labels.

Pod labels are mutable, and the selector, the profile and the name patterns all read
them. On UPDATE of a run, the labels that decide *whether* and *how* it is governed
(the selector's keys, the profile label, every label a name pattern uses) are frozen:
otherwise removing ``managed-by`` would take a running run out of the webhooks'
``objectSelector`` and open it to a privileged debug container.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.engine.rule import Declarations
from webhook.engine.types import Violation
from webhook.keys import POLICY_LABEL
from webhook.policy.model import RunPolicy

RULES = Declarations(__name__)
SCOPE_LABELS = RULES.rule(
    "scope.labels",
    mutation="",
    violation=(
        "on UPDATE of a run (a Pod, or a controller's pod template), a label any RunPolicy's "
        "selector, profile label or name pattern uses added, removed or changed (so no run moves "
        "into, out of or between RunPolicies); the `runguard.io/policy` label not what `/mutate` "
        "writes"
    ),
)


def scope_label_keys(policy: RunPolicy) -> list[str]:
    """Every label key that decides whether and how a pod is governed, in a stable order."""
    keys: list[str] = [*policy.selector.match_labels]
    keys.extend(e["key"] for e in policy.selector.match_expressions)
    keys.append(policy.profiles_config.label)
    for patterns in (
        policy.volumes.platform_claims,
        policy.volumes.platform_config_maps,
        policy.secrets.allowed,
        policy.resources.platform_device_claims,
    ):
        for pattern in patterns:
            keys.extend(pattern.label_keys)
    return list(dict.fromkeys(keys))


def check_scope_labels(
    old: Mapping[str, str], new: Mapping[str, str], keys: list[str], meta_path: str
) -> list[Violation]:
    """A violation per scope label (``keys``, and runguard's own RunPolicy label) a
    governed object's update adds, removes or changes."""
    out: list[Violation] = []
    for key in dict.fromkeys([*keys, POLICY_LABEL]):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if after is None:
            what = f"removing label {key} ({before!r})"
        elif before is None:
            what = f"adding label {key} ({after!r})"
        else:
            what = f"changing label {key} from {before!r} to {after!r}"
        out.append(
            Violation(
                SCOPE_LABELS,
                f"{meta_path}.labels[{key}]",
                f"{what} of a run is not allowed: it decides whether and how runguard "
                "governs it; delete it and create a new one instead",
            )
        )
    return out


def check_scope_annotations(
    old: Mapping[str, str], new: Mapping[str, str], keys: list[str], meta_path: str
) -> list[Violation]:
    """A violation per annotation of ``keys`` (the profile label's key, which a run may
    write as an annotation instead) a governed object's update adds, removes or changes:
    the annotation names its profile as the label would."""
    out: list[Violation] = []
    for key in dict.fromkeys(keys):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        out.append(
            Violation(
                SCOPE_LABELS,
                f"{meta_path}.annotations[{key}]",
                f"changing annotation {key} ({before!r} to {after!r}) of a run is not allowed: "
                "it names the run's profile; delete it and create a new one instead",
            )
        )
    return out
