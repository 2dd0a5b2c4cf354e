"""The paths a request takes through the engine: each webhook chooses one by name from
a small table (the first row whose question the request answers yes), then runs that
path's registered steps (``webhook.engine.mutation.STEPS``) or checks
(``webhook.engine.validation.CHECKS``) in their order.

The two tables differ where the webhooks do: ``/mutate`` tells a Job's or CronJob's
template (written into at CREATE, kept on UPDATE) from a long-lived controller's
(never patched), an operator's object at CREATE from any other object outside the
runs, and ``kubectl debug``'s containers from any other update of a Pod; ``/validate``
judges a run by its (mutated) pod spec, whatever holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from webhook.engine import scope
from webhook.engine.podspec import Target
from webhook.engine.rules.hardening import harden_debug_containers
from webhook.engine.shape import check_shape
from webhook.engine.subject import Review
from webhook.engine.types import JSON, Change, Violation

__all__ = ["MUTATION_PATHS", "VALIDATION_PATHS", "Path", "Request", "choose", "request"]


class Path(StrEnum):
    """What the engine does with a request, by what it is."""

    OUTSIDE = "outside"  # a namespace no RunPolicy looks at: untouched
    NOT_UNDERSTOOD = "not-understood"  # no pod spec found, or one not understood
    POD_CREATED = "pod-created"  # a run's Pod at CREATE
    DEBUG_CONTAINERS = "debug-containers"  # pods/ephemeralcontainers: containers added
    POD_UPDATED = "pod-updated"  # a run's Pod on UPDATE (its spec is immutable)
    TEMPLATE_CREATED = "template-created"  # a run's Job or CronJob at CREATE
    TEMPLATE_REAPPLIED = "template-reapplied"  # a run's Job or CronJob on UPDATE
    TEMPLATE_KEPT = "template-kept"  # a long-lived controller's run template: never patched
    TEMPLATE_UPDATED = "template-updated"  # any run's template on UPDATE (/validate)
    OPERATOR_OBJECT = "operator-object"  # at CREATE, an object outside the runs (/mutate)
    NOT_A_RUN = "not-a-run"  # outside every RunPolicy: only what trust requires


# The kinds whose pod template ``/mutate`` changes at CREATE: what a queue (Kueue) counts
# and what a scheduler reads is the stored template, so the profile goes there, once. Their
# Pods are then a fixed point of the steps (judged, nothing left to change). Long-lived
# controllers (Deployments, StatefulSets...) are judged by their template after mutation
# but never patched: ``kubectl apply`` of their manifest would take runguard's values back
# out of the template and roll every Pod; their Pods get the profile.
TEMPLATES_MUTATED = frozenset({"Job", "CronJob"})


@dataclass
class Request:
    """What the tables ask: the review, and the run it holds (``target``: None outside
    the runs) with what makes its pod spec not understood (``problems``); ``run``: the
    run's pod template, when it is one and understood; ``created``: at CREATE."""

    r: Review
    target: Target | None
    problems: list[Violation]
    run: Target | None
    created: bool

    @cached_property
    def debug_hardened(self) -> tuple[JSON, Change] | None:
        """On UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``), the spec with
        the ephemeral containers added hardened, the only part of a running Pod's spec
        that may change: None when none was added or none needs it."""
        running = self.r.old.get("spec") if self.r.old else None
        if self.target is None or not isinstance(running, dict):
            return None
        return harden_debug_containers(self.target.spec, running, self.r.policy)


def _outside(q: Request) -> bool:
    return not scope.looked_at(q.r.root, q.r.namespace)


def _not_understood(q: Request) -> bool:
    return bool(q.problems)


def _pod(q: Request) -> bool:
    run = q.run
    return run is not None and run.kind == "Pod"


def _template(q: Request) -> bool:
    run = q.run
    return run is not None and run.kind != "Pod"


def _job_template(q: Request) -> bool:
    run = q.run
    return run is not None and run.kind in TEMPLATES_MUTATED


Row = tuple[Path, Callable[[Request], bool]]

MUTATION_PATHS: tuple[Row, ...] = (
    (Path.OUTSIDE, _outside),
    (Path.NOT_UNDERSTOOD, _not_understood),
    (Path.POD_CREATED, lambda q: _pod(q) and q.created),
    (Path.DEBUG_CONTAINERS, lambda q: _pod(q) and q.debug_hardened is not None),
    (Path.POD_UPDATED, _pod),
    (Path.TEMPLATE_CREATED, lambda q: _job_template(q) and q.created),
    (Path.TEMPLATE_REAPPLIED, lambda q: _job_template(q) and q.r.old_target is not None),
    (Path.TEMPLATE_KEPT, _template),
    (Path.OPERATOR_OBJECT, lambda q: q.created and isinstance(q.r.obj, dict)),
    (Path.NOT_A_RUN, lambda q: True),
)

VALIDATION_PATHS: tuple[Row, ...] = (
    (Path.OUTSIDE, _outside),
    (Path.NOT_UNDERSTOOD, _not_understood),
    (Path.POD_CREATED, lambda q: _pod(q) and q.created),
    (Path.POD_UPDATED, _pod),
    (Path.TEMPLATE_CREATED, lambda q: _template(q) and q.created),
    (Path.TEMPLATE_UPDATED, _template),
    (Path.NOT_A_RUN, lambda q: True),
)


def selected(r: Review) -> tuple[Target | None, list[Violation]]:
    """The pod template when the object is a run its RunPolicy governs, else None; and
    what makes the object or its pod spec not understood."""
    if r.invalid:
        return None, r.invalid
    if r.target is None or r.governing is None:
        return None, []
    return r.target, check_shape(r.target.spec, r.target.spec_path)


def request(r: Review) -> Request:
    """What the tables ask of the review ``r``."""
    target, problems = selected(r)
    return Request(r, target, problems, None if problems else target, r.old is None)


def choose(table: tuple[Row, ...], q: Request) -> Path:
    """The path of the first row of ``table`` whose question ``q`` answers yes."""
    for path, applies in table:
        if applies(q):
            return path
    raise AssertionError("the last row of a table takes any request")
