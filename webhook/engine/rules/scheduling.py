"""Step 8 and rules ``scheduling.*``: priority classes and MLRun's preemption modes.

The modes are MLRun's own algorithm, ``enrich_function_preemption_spec``
(``mlrun/runtimes/pod.py``, transcribed in docs/dev/platforms.md section 2.2), on the
policy's spot ``nodeSelector`` (``S``) and ``tolerations`` (``T``):

- ``prevent``: drop the spot tolerations, the spot ``In`` requirements and the spot
  nodeSelector entries; without ``T``, the required node affinity becomes one term of
  ``NotIn`` requirements. With ``T``, MLRun relies on the spot taint; runguard adds the
  ``NotIn`` requirements to every required term anyway unless the policy follows MLRun
  (``infer``) and no toleration left on the pod tolerates a spot taint.
- ``constrain``: merge ``T``; the required node affinity becomes one ``In`` term per
  spot label (ORed).
- ``allow``: drop the spot ``In`` and ``NotIn`` requirements and the spot nodeSelector
  entries; merge ``T``.
- ``none``: nothing.

The mode is the annotation (else label) ``preemption.annotation``; else, with
``preemption.infer``, the mode MLRun's output shows (``inferred_mode``); else
``preemption.default``. docs/dev/choices.md "Preemption modes" says why each choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from webhook.engine.context import cluster_lacks
from webhook.engine.pod import Pod, copy_value, made_once, warning
from webhook.engine.rule import Declarations
from webhook.engine.rules.profile import forget_computed_priority
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import PREEMPTION_MODES, PreemptionConfig

RULES = Declarations(__name__)
SCHEDULING_PRIORITY_CLASS = RULES.rule(
    "scheduling.priority-class",
    mutation="defaulted or replaced",
    violation="a class not allowed",
)
SCHEDULING_PREEMPTION_MODE = RULES.rule(
    "scheduling.preemption-mode",
    mutation="the mode applied as MLRun does",
    violation="an unknown mode; a Pod created without `/mutate` whose mode is not applied",
)

SCHEDULING = ("tolerations", "affinity", "nodeSelector")  # what a mode may change
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# Modes that leave a trace MLRun's output can be read from, in no particular order: on a
# given pod at most one of them changes nothing (docs/dev/choices.md, "Preemption modes").
INFERABLE = ("constrain", "allow", "prevent")


def default_priority_class(pod: Pod) -> Change | None:
    cfg = pod.policy.scheduling
    current = pod.spec.get("priorityClassName")
    allowed = cfg.allowed_priority_classes
    if current is not None and (allowed is None or current in allowed):
        return None
    if cfg.default_priority_class is None:
        return None  # nothing to put instead: validation denies a disallowed class
    if cluster_lacks(pod.context, "PriorityClass", cfg.default_priority_class):
        # The apiserver would refuse every run: leave the class to validation.
        return None
    pod.spec["priorityClassName"] = cfg.default_priority_class
    forget_computed_priority(pod.spec)
    if current is None:
        return Change(
            SCHEDULING_PRIORITY_CLASS,
            warning(f"priority class defaulted to {cfg.default_priority_class}"),
        )
    return Change(
        SCHEDULING_PRIORITY_CLASS,
        warning(f"priority class {current} not allowed, set to {cfg.default_priority_class}"),
    )


# --- which mode -----------------------------------------------------------------------


def stated_mode(pod: Pod, cfg: PreemptionConfig) -> tuple[str, str] | None:
    """(mode, where) when the run states one: its annotation, else its label."""
    mode = pod.annotations.get(cfg.annotation)
    if mode:
        return mode, "annotations"
    mode = pod.labels.get(cfg.annotation)
    if mode:
        return mode, "labels"
    return None


def preemption_mode(pod: Pod) -> str | None:
    """The run's mode: stated, else read from MLRun's output (``infer``), else the default.

    Inference reads only a run the platform created (``pod.ownership``; with no
    ``platform.identities`` names decide, as everywhere else).
    """
    cfg = pod.policy.scheduling.preemption
    if cfg is None:
        return None
    return _mode(pod, cfg)


def _mode(pod: Pod, cfg: PreemptionConfig) -> str | None:
    """``preemption_mode`` under ``cfg``: the stated mode, else the inferred one, else the
    default."""
    stated = stated_mode(pod, cfg)
    if stated is not None:
        return stated[0]
    if cfg.infer and pod.ownership.platform:
        inferred = inferred_mode(cfg, scheduling_of(pod.spec))
        if inferred is not None:
            return inferred
    return cfg.default


def inferred_mode(cfg: PreemptionConfig, scheduling: JSON) -> str | None:
    """The mode whose output ``scheduling`` already is, among those that leave a trace.

    A mode leaves a trace when it writes something on every pod: constrain its ``In``
    terms (spot labels configured), allow its tolerations (tolerations configured),
    prevent its ``NotIn`` term (labels and no tolerations configured). Anything else,
    including what no mode writes (a hand-written toleration, a spot nodeSelector,
    mixed terms), states no mode: None.
    """
    spot = Spot(cfg)
    for mode in INFERABLE:
        if spot.leaves_trace(mode) and spot.enriched(mode, scheduling) == scheduling:
            return mode
    return None


def scheduling_of(spec: JSON) -> JSON:
    """The fields a mode may change, the pod's own (``Spot.enriched`` copies them); null
    ones are absent (as stored)."""
    out = {}
    for key in SCHEDULING:  # a loop, not a comprehension: every run passes here
        value = spec.get(key)
        if value is not None:
            out[key] = value
    return out


# --- applying it ----------------------------------------------------------------------


def apply_preemption_mode(pod: Pod) -> Change | None:
    """MLRun's modes: prevent keeps runs off spot nodes, constrain keeps them on, allow permits."""
    cfg = pod.policy.scheduling.preemption
    if cfg is None:
        return None
    mode = _mode(pod, cfg)
    if mode is None or mode not in _APPLIED:
        return None  # "none", no mode, or an unknown one (denied by validation)
    spec = pod.spec
    before = scheduling_of(spec)
    after = _spot(cfg).enriched(mode, before)
    if after == before:
        return None
    for key in SCHEDULING:
        if key in after:
            spec[key] = after[key]
        else:
            spec.pop(key, None)
    return _APPLIED[mode]


# mode -> its Change, written once: the same few words on every run the mode changes
# (a Change is frozen: one serves every run)
_APPLIED = {
    mode: Change(SCHEDULING_PREEMPTION_MODE, warning(f"preemption mode {mode} applied"))
    for mode in ("allow", "constrain", "prevent")
}

# id(PreemptionConfig) -> (it, its Spot): a Spot reads only the policy, so one serves
# every review; the config is kept with it, so that its id is not reused while here.
_SPOTS: dict[int, tuple[PreemptionConfig, Spot]] = {}


def _spot(cfg: PreemptionConfig) -> Spot:
    """The ``Spot`` of ``cfg``, made once per policy."""
    return made_once(_SPOTS, cfg, Spot)


class Spot:
    """The policy's spot nodes, and MLRun's enrichment of a pod's scheduling for them."""

    def __init__(self, cfg: PreemptionConfig):
        # the policy's own values, read-only: whatever goes into a pod is copied first
        self.node_selector: Mapping[str, str] = cfg.node_selector
        self.tolerations: Sequence[JSON] = cfg.tolerations
        self.relies_on_taint = cfg.infer and bool(self.tolerations)
        self._tolerations = cfg.compared_tolerations
        self._requirements = cfg.spot_requirements
        self.configured = bool(self.node_selector) or bool(self.tolerations)
        self._in = self._requirements["In"]
        self._not_in = self._requirements["NotIn"]

    def leaves_trace(self, mode: str) -> bool:
        if mode == "constrain":
            return bool(self.node_selector)
        if mode == "allow":
            return bool(self.tolerations)
        return mode == "prevent" and bool(self.node_selector) and not self.tolerations

    def requirements(self, operator: str) -> Sequence[JSON]:
        """One requirement per spot label (``PreemptionConfig.spot_requirements``)."""
        return self._requirements[operator]

    def enriched(self, mode: str, scheduling: JSON) -> JSON:
        """``scheduling`` (``scheduling_of``) as ``mode`` leaves it; the input is not changed
        (``_writable``)."""
        out = _writable(scheduling)
        if not self.configured or mode not in INFERABLE:
            return out  # MLRun: nothing configured, or mode none
        if mode == "prevent":
            _prune_tolerations(out, self._tolerations)
            _prune_requirements(out, self._in)
            _prune_node_selector(out, self.node_selector)
            if self.node_selector and not self.tolerations:
                _set_required(out, [{"matchExpressions": self._not_in}])
            elif self.node_selector and not (
                self.relies_on_taint and not self._tolerated(out.get("tolerations") or ())
            ):
                _require_in_every_term(out, self._not_in)
        elif mode == "constrain":
            _merge_tolerations(out, self.tolerations)
            if self.node_selector:  # MLRun would write an empty, invalid, list of terms
                _set_required(out, [{"matchExpressions": [r]} for r in self._in])
        else:  # allow
            _prune_requirements(out, self._not_in)
            _prune_requirements(out, self._in)
            _prune_node_selector(out, self.node_selector)
            _merge_tolerations(out, self.tolerations)
        affinity = out.get("affinity")
        if (
            affinity is not None
            and affinity.get("nodeAffinity") is None
            and affinity.get("podAffinity") is None
            and affinity.get("podAntiAffinity") is None
        ):
            del out["affinity"]
        if "tolerations" in out and not out["tolerations"]:
            del out["tolerations"]
        return out

    def _tolerated(self, tolerations: Iterable[JSON]) -> bool:
        """Whether some toleration may tolerate a taint a spot toleration is for."""
        return any(_may_tolerate(p, t) for p in tolerations for t in self.tolerations)


# --- MLRun's helpers (mlrun/runtimes/pod.py), on JSON ------------------------------------


def _writable(scheduling: JSON) -> JSON:
    """A copy of ``scheduling`` the helpers below may change, sharing what they do not.

    They change in place only ``scheduling`` itself, its ``nodeSelector``, its ``affinity``
    and that one's ``nodeAffinity``: those maps are copied, one level each. Lists and
    everything below ``nodeAffinity`` they replace, never change, so those are shared:
    cheaper than a deep copy of the pod's scheduling on every review.
    """
    out = dict(scheduling)
    selector = out.get("nodeSelector")
    if type(selector) is dict:
        out["nodeSelector"] = dict(selector)
    affinity = out.get("affinity")
    if type(affinity) is dict:
        affinity = out["affinity"] = dict(affinity)
        node_affinity = affinity.get("nodeAffinity")
        if type(node_affinity) is dict:
            affinity["nodeAffinity"] = dict(node_affinity)
    return out


def _normal(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A toleration or requirement as MLRun compares them: absent and null are the same.
    Only compared, never stored: an item without nulls is its own normal form."""
    if None not in item.values():
        return item
    return {k: v for k, v in item.items() if v is not None}


def _copy_requirement(requirement: JSON) -> JSON:
    """A copy of one of ``PreemptionConfig.spot_requirements`` (a key, an operator and
    a list of values) to put into a pod: ``copy_value`` for that one shape."""
    return {**requirement, "values": list(requirement["values"])}


def _merge_tolerations(scheduling: JSON, spot: Sequence[JSON]) -> None:
    """L539-564: the spot tolerations the pod lacks, appended in order."""
    if not spot:
        return
    current = scheduling.get("tolerations")
    if not current:
        scheduling["tolerations"] = copy_value(spot)
        return
    present = [_normal(t) for t in current]
    scheduling["tolerations"] = [
        *current,
        *(copy_value(t) for t in spot if _normal(t) not in present),
    ]


def _prune_tolerations(scheduling: JSON, spot: Sequence[JSON]) -> None:
    """L864-891: the tolerations equal to a spot one, removed."""
    current = scheduling.get("tolerations")
    if not spot or not current:
        return
    scheduling["tolerations"] = [t for t in current if _normal(t) not in spot]


def _prune_node_selector(scheduling: JSON, spot: Mapping[str, str]) -> None:
    """L893-911: nodeSelector entries equal to a spot label, removed."""
    current = scheduling.get("nodeSelector")
    if not spot or not current:
        return
    for key, value in spot.items():
        if value and current.get(key) and current.get(key) == value:
            del current[key]
    if not current:
        del scheduling["nodeSelector"]  # the apiserver stores no empty map


def _prune_requirements(scheduling: JSON, requirements: Sequence[JSON]) -> None:
    """L769-862: required expressions equal to one of ``requirements`` removed; a term left
    with nothing is dropped, and the node affinity with nothing is removed."""
    affinity = scheduling.get("affinity")
    if affinity is None or not requirements:
        return
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return
    terms: list[JSON] = []
    if node_affinity.get(REQUIRED) is not None:
        for term in node_affinity[REQUIRED].get("nodeSelectorTerms") or ():
            expressions = [
                e for e in term.get("matchExpressions") or () if _normal(e) not in requirements
            ]
            fields = term.get("matchFields")
            if expressions or fields:
                new_term: JSON = {}
                if expressions:
                    new_term["matchExpressions"] = expressions
                if fields:
                    new_term["matchFields"] = fields
                terms.append(new_term)
    if not node_affinity.get(PREFERRED) and not terms:
        del affinity["nodeAffinity"]
        return
    if terms:
        node_affinity[REQUIRED] = {"nodeSelectorTerms": terms}
    else:
        node_affinity.pop(REQUIRED, None)


def _node_affinity(scheduling: JSON) -> JSON:
    """``affinity.nodeAffinity``, created when absent (L566-575's initialisation)."""
    affinity = scheduling.setdefault("affinity", {})
    if affinity.get("nodeAffinity") is None:
        affinity["nodeAffinity"] = {}
    node_affinity: JSON = affinity["nodeAffinity"]
    return node_affinity


def _set_required(scheduling: JSON, terms: list[JSON]) -> None:
    """L566-575: the required node affinity replaced by ``terms``; the rest kept."""
    _node_affinity(scheduling)[REQUIRED] = {"nodeSelectorTerms": copy_value(terms)}


def _require_in_every_term(scheduling: JSON, requirements: Sequence[JSON]) -> None:
    """runguard's anti-affinity where MLRun relies on the taint: ``requirements`` added to
    every required term (terms are ORed), or one term of them; nothing else removed."""
    node_affinity = _node_affinity(scheduling)
    required = node_affinity.get(REQUIRED) or {}
    terms = required.get("nodeSelectorTerms") or _NO_TERMS
    new_terms = []
    for term in terms:
        current = term.get("matchExpressions")
        if current:
            expressions = list(current)
            present = [_normal(e) for e in expressions]
            expressions += [_copy_requirement(r) for r in requirements if r not in present]
        else:  # nothing to compare with: every requirement added
            expressions = [_copy_requirement(r) for r in requirements]
        new_terms.append({**term, "matchExpressions": expressions})
    node_affinity[REQUIRED] = {**required, "nodeSelectorTerms": new_terms}


_NO_TERMS: tuple[JSON, ...] = ({},)  # no required terms: one empty term, read only


def _may_tolerate(toleration: JSON, spot: JSON) -> bool:
    """Whether ``toleration`` tolerates some taint ``spot`` tolerates (the scheduler's
    ``ToleratesTaint``; a value or effect the spot toleration leaves open matches any)."""
    effect, spot_effect = toleration.get("effect") or "", spot.get("effect") or ""
    if effect and spot_effect and effect != spot_effect:
        return False
    key, spot_key = toleration.get("key") or "", spot.get("key") or ""
    if key and spot_key and key != spot_key:
        return False
    if "Exists" in (toleration.get("operator"), spot.get("operator")):
        return True
    return (toleration.get("value") or "") == (spot.get("value") or "")


# --- validation -------------------------------------------------------------------------


def check_scheduling(pod: Pod) -> list[Violation]:
    out: list[Violation] = []
    allowed = pod.policy.scheduling.allowed_priority_classes
    current = pod.spec.get("priorityClassName")
    if allowed is not None and current is not None and current not in allowed:
        out.append(
            Violation(
                SCHEDULING_PRIORITY_CLASS,
                f"{pod.spec_path}.priorityClassName",
                f"priority class {current!r} is not allowed ({', '.join(sorted(allowed))})",
            )
        )
    preemption = pod.policy.scheduling.preemption
    stated = stated_mode(pod, preemption) if preemption is not None else None
    if preemption is not None and stated is not None and stated[0] not in PREEMPTION_MODES:
        mode, where = stated
        out.append(
            Violation(
                SCHEDULING_PREEMPTION_MODE,
                f"{pod.meta_path}.{where}[{preemption.annotation}]",
                f"preemption mode {mode!r} is not one of {', '.join(PREEMPTION_MODES)}",
            )
        )
    return out
