"""``runguard whatif``: the runs that exist, judged under a proposed policy beside the
current one.

No I/O of its own. ``compare`` takes one run (a Pod or a pod controller, as stored) and
asks the engine twice, as the cluster would admit it now (``evaluate``: mutate, then
validate) under the current policy and under the proposed one, then says what the edit
does to it:

- ``denied``: the proposal refuses it for a reason the current policy does not give
  (the rule ids of those new violations);
- ``changed``: admitted differently: ``moved`` to another profile, ``clamped`` (a value
  brought inside a maximum or a profile's range), ``warned`` (new violations that
  ``enforcement`` only warns about) or ``changed`` (any other step, its rule ids);
- ``unchanged``: the same object, the same changes, the same violations.

Only what the edit does is reported: what the current policy already refuses is
``runguard audit``'s (``now`` says it). Whatever both policies see alike (a cluster view
lacking a claim, a stamp) cancels out.

``Tally`` keeps counts per namespace and project (the governing RunPolicy's
``platform.projectLabel``, when it has one) and a few examples, never the runs: memory
stays flat however many runs are judged; rows are written as they come.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from webhook.audit.clusteraudit import pod_labels
from webhook.engine import Decision, Violation, evaluate, scope
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.rules.profile import PROFILE_RANGE
from webhook.engine.rules.resources import RESOURCES_CLAMPED
from webhook.policy.model import Policy

OUTCOMES = ("denied", "changed", "unchanged")
CLAMPS = frozenset({PROFILE_RANGE, RESOURCES_CLAMPED})
EXAMPLES = 10  # of each outcome, in the markdown summary
DETAIL = 160  # characters of a row's detail


@dataclass(frozen=True, slots=True)
class Verdict:
    """One run's fate under the proposal: what the reports need, not the object."""

    kind: str
    namespace: str
    name: str
    project: str  # "" when the RunPolicy names no project label, or the run carries none
    run_policy: str
    outcome: str  # denied | changed | unchanged
    how: str  # changed: moved | clamped | warned | changed; else ""
    now: str  # allowed | denied: under the current policy
    profile: str | None  # the profile it gets now
    proposed_profile: str | None
    rules: tuple[str, ...]  # of the new violations (denied) or the new changes (changed)
    detail: str  # the first of them, in words

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "project": self.project or None,
            "kind": self.kind,
            "name": self.name,
            "runPolicy": self.run_policy,
            "outcome": self.outcome,
            "how": self.how or None,
            "now": self.now,
            "profile": self.profile,
            "proposedProfile": self.proposed_profile,
            "rules": list(self.rules),
            "detail": self.detail,
        }


def compare(
    obj: Any, current: Policy, proposed: Policy, context: Context = NO_CONTEXT
) -> Verdict | None:
    """``obj``'s fate under ``proposed`` beside ``current``; None when neither policy
    takes it for a run."""
    now = evaluate(obj, current, context=context)
    then = evaluate(obj, proposed, context=context)
    if not now.applies and not then.applies:
        return None
    outcome, how, rules, detail = _what_the_edit_does(now, then)
    chooser = current if now.applies else proposed
    kind, namespace, name = then.kind, then.namespace, then.name
    labels = pod_labels(obj) if isinstance(obj, dict) else {}
    governing = scope.choose(chooser, labels, namespace) or chooser.first
    project_label = governing.platform.project_label
    return Verdict(
        kind=sys.intern(kind),
        namespace=sys.intern(namespace),
        name=name,
        project=sys.intern(labels.get(project_label, "")) if project_label else "",
        run_policy=sys.intern(governing.name),
        outcome=outcome,
        how=how,
        now="allowed" if now.allowed else "denied",
        profile=now.profile,
        proposed_profile=then.profile,
        rules=rules,
        detail=detail[:DETAIL],
    )


def _what_the_edit_does(now: Decision, then: Decision) -> tuple[str, str, tuple[str, ...], str]:
    """The outcome, how, rule ids and detail of a verdict: denied for new violations
    that refuse it, else changed (moved, warned, clamped or changed), else unchanged."""
    known = {(v.rule, v.path) for v in now.violations}
    fresh = [v for v in then.violations if (v.rule, v.path) not in known]
    if fresh and not then.allowed:
        return "denied", "", _rules_of(fresh), _detail_of(fresh)
    if now.profile != then.profile:
        moved = f"profile {now.profile or '(none)'} -> {then.profile or '(none)'}"
        return "changed", "moved", _new_changes(now, then), moved
    if fresh:
        return "changed", "warned", _rules_of(fresh), _detail_of(fresh)
    if now.object != then.object or now.mutations != then.mutations:
        rules = _new_changes(now, then)
        added = [c for c in then.mutations if c not in now.mutations]
        return (
            "changed",
            "clamped" if CLAMPS.intersection(rules) else "changed",
            rules,
            added[0].warning.removeprefix("runguard: ") if added else "admitted differently",
        )
    return "unchanged", "", (), ""


def _rules_of(violations: list[Violation]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.rule for v in violations))


def _detail_of(violations: list[Violation]) -> str:
    return f"{violations[0].path}: {violations[0].message}"


def _new_changes(now: Decision, then: Decision) -> tuple[str, ...]:
    """The rule ids of the proposal's changes the current policy does not make (else of
    every change that differs)."""
    added = [c.rule for c in then.mutations if c not in now.mutations]
    return tuple(dict.fromkeys(added or [c.rule for c in now.mutations if c not in then.mutations]))


def compare_all(
    objects: Iterable[Any], current: Policy, proposed: Policy, context: Context = NO_CONTEXT
) -> Iterable[Verdict]:
    for obj in objects:
        verdict = compare(obj, current, proposed, context)
        if verdict is not None:
            yield verdict


# --- tally and rendering ---------------------------------------------------------------


class Tally:
    """Counts per (namespace, project) and outcome, and the first few examples of each
    outcome but ``unchanged``: what the summary needs, never the runs."""

    def __init__(self, examples: int = EXAMPLES) -> None:
        self.counts: dict[tuple[str, str], Counter[str]] = {}
        self.totals: Counter[str] = Counter()
        self.examples: dict[str, list[Verdict]] = {"denied": [], "changed": []}
        self.limit = examples

    def add(self, verdicts: Iterable[Verdict]) -> None:
        for v in verdicts:
            self.counts.setdefault((v.namespace, v.project), Counter())[v.outcome] += 1
            self.totals[v.outcome] += 1
            kept = self.examples.get(v.outcome)
            if kept is not None and len(kept) < self.limit:
                kept.append(v)

    @property
    def affected(self) -> int:
        return self.totals["denied"] + self.totals["changed"]

    def rows(self) -> list[dict[str, Any]]:
        """A row per namespace and project, in order."""
        return [
            {"namespace": ns, "project": project or None, **{o: c[o] for o in OUTCOMES}}
            for (ns, project), c in sorted(self.counts.items())
        ]

    def describe(self) -> str:
        t = self.totals
        return (
            f"{t.total():,} runs: {t['denied']:,} would be denied, {t['changed']:,} changed, "
            f"{t['unchanged']:,} unchanged"
        )


ROW_HEADER = ("NAMESPACE", "PROJECT", "KIND", "NAME", "OUTCOME", "RULES", "DETAIL")


def row_cells(v: Verdict) -> tuple[str, ...]:
    outcome = f"{v.outcome} ({v.how})" if v.how and v.how != v.outcome else v.outcome
    return (v.namespace, v.project or "-", v.kind, v.name, outcome, ",".join(v.rules) or "-",
            v.detail)  # fmt: skip


class TableWriter:
    """A row per run the proposal denies or changes, written as they come (widths set by
    the first ``buffer`` rows), then the counts per namespace and project."""

    def __init__(self, out: TextIO, buffer: int = 1000) -> None:
        self.out, self.buffer = out, buffer
        self.pending: list[tuple[str, ...]] | None = []
        self.widths: list[int] = []

    def write(self, verdicts: Iterable[Verdict]) -> None:
        for v in verdicts:
            if v.outcome == "unchanged":
                continue
            if self.pending is None:
                self._emit(row_cells(v))
            else:
                self.pending.append(row_cells(v))
                if len(self.pending) > self.buffer:
                    self._flush()

    def close(self, tally: Tally) -> None:
        if self.pending == []:
            self.out.write("no run would be denied or changed\n")
            self.pending = None
        self._flush()
        self.out.write("\n" + counts_table(tally) + "\n")

    def _flush(self) -> None:
        if self.pending is None:
            return
        rows, self.pending = [ROW_HEADER, *self.pending], None
        self.widths = [max(len(r[i]) for r in rows) for i in range(len(ROW_HEADER) - 1)]
        for row in rows:
            self._emit(row)

    def _emit(self, row: tuple[str, ...]) -> None:
        cells = "  ".join(cell.ljust(self.widths[i]) for i, cell in enumerate(row[:-1]))
        self.out.write(f"{cells}  {row[-1]}".rstrip() + "\n")


def counts_table(tally: Tally) -> str:
    rows: list[tuple[str, ...]] = [("NAMESPACE", "PROJECT", "DENIED", "CHANGED", "UNCHANGED")]
    for r in tally.rows():
        rows.append((r["namespace"], r["project"] or "-", *(str(r[o]) for o in OUTCOMES)))
    rows.append(("TOTAL", "", *(str(tally.totals[o]) for o in OUTCOMES)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


class JsonWriter:
    """``{"runs": [...], "namespaces": [...], "totals": {...}}``, the runs written as they
    come (every run, unchanged ones too)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.count = out, 0

    def write(self, verdicts: Iterable[Verdict]) -> None:
        for v in verdicts:
            self.out.write(('{\n  "runs": [\n    ' if not self.count else ",\n    ")
                           + json.dumps(v.to_dict()))  # fmt: skip
            self.count += 1

    def close(self, tally: Tally) -> None:
        self.out.write('{\n  "runs": [' if not self.count else "\n  ")
        self.out.write("],\n")
        self.out.write(f'  "namespaces": {json.dumps(tally.rows())},\n')
        totals = {o: tally.totals[o] for o in OUTCOMES}
        self.out.write(f'  "totals": {json.dumps(totals)}\n}}\n')


def markdown(tally: Tally, current: str, proposed: str) -> str:
    """A summary short enough for a pull request: totals, the namespaces and projects
    affected, and a few examples of each outcome."""
    t = tally.totals
    lines = [
        f"### runguard what-if: `{proposed}` beside `{current}`",
        "",
        f"**{t.total():,} runs**: {t['denied']:,} would be denied, {t['changed']:,} "
        f"changed, {t['unchanged']:,} unchanged.",
    ]
    affected = [r for r in tally.rows() if r["denied"] or r["changed"]]
    if affected:
        lines += [
            "",
            "| namespace | project | denied | changed | unchanged |",
            "|---|---|--:|--:|--:|",
        ]
        for r in affected[:20]:
            lines.append(f"| {r['namespace']} | {r['project'] or '-'} | {r['denied']} | "
                         f"{r['changed']} | {r['unchanged']} |")  # fmt: skip
        if len(affected) > 20:
            lines.append(f"| ... {len(affected) - 20} more namespaces | | | | |")
    for outcome in ("denied", "changed"):
        examples = tally.examples[outcome]
        if not examples:
            continue
        lines += ["", f"{outcome.capitalize()} (first {len(examples)}):", ""]
        for v in examples:
            how = f" ({v.how})" if v.how and v.how != v.outcome else ""
            rules = f" `{', '.join(v.rules)}`" if v.rules else ""
            lines.append(f"- {v.kind} `{v.namespace}/{v.name}`{how}{rules}: {_md(v.detail)}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
