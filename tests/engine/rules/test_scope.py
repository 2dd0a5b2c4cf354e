"""``webhook/engine/rules/scope.py`` on its own: which label keys decide a run's scope,
and the violations an update that edits them (as labels or as the profile annotation)
gets, called directly on label maps."""

from __future__ import annotations

from pathlib import Path

from harness.pods import policy_of

from webhook.engine.rules.scope import (
    SCOPE_LABELS,
    check_scope_annotations,
    check_scope_labels,
    scope_label_keys,
)
from webhook.keys import POLICY_LABEL

RUN = {"app": "run", "dhcore/template": "small", "dhcore/run": "r1"}


def test_the_scope_keys_are_the_selectors_the_profile_label_and_the_patterns(
    tmp_path: Path,
) -> None:
    policy = policy_of(
        tmp_path,
        {
            "selector": {
                "matchLabels": {"app": "run"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}],
            },
            "profiles": {"label": "dhcore/template"},
            "volumes": {"platformClaims": ["v-{labels[dhcore/run]}-*"]},
            "secrets": {"allowed": ["sec-{labels[dhcore/project]}"]},
        },
    )
    assert scope_label_keys(policy.first) == [
        "app",
        "tier",
        "dhcore/template",
        "dhcore/run",
        "dhcore/project",
    ]


def test_a_key_is_listed_once_however_many_patterns_use_it(tmp_path: Path) -> None:
    policy = policy_of(
        tmp_path,
        {
            "volumes": {"platformClaims": ["v-{labels[app]}", "w-{labels[app]}"]},
            "secrets": {"allowed": ["s-{labels[app]}"]},
        },
    )
    keys = scope_label_keys(policy.first)
    assert keys.count("app") == 1


def test_removing_adding_and_changing_a_scope_label_are_each_denied() -> None:
    new = {"dhcore/template": "large", "dhcore/run": "r1", "extra": "x"}
    found = check_scope_labels(RUN, new, ["app", "dhcore/template", "extra"], "metadata")
    assert [(v.rule, v.path) for v in found] == [
        (SCOPE_LABELS, "metadata.labels[app]"),
        (SCOPE_LABELS, "metadata.labels[dhcore/template]"),
        (SCOPE_LABELS, "metadata.labels[extra]"),
    ]
    assert found[0].message.startswith("removing label app ('run')")
    assert found[1].message.startswith("changing label dhcore/template from 'small' to 'large'")
    assert found[2].message.startswith("adding label extra ('x')")


def test_runguards_policy_label_is_a_scope_label_even_when_not_listed() -> None:
    old = {**RUN, POLICY_LABEL: "test"}
    found = check_scope_labels(old, RUN, [], "spec.template.metadata")
    assert [(v.rule, v.path) for v in found] == [
        (SCOPE_LABELS, f"spec.template.metadata.labels[{POLICY_LABEL}]")
    ]


def test_other_labels_and_unchanged_scope_labels_pass() -> None:
    new = {**RUN, "note": "anything", "dhcore/run": "r2"}
    assert check_scope_labels(RUN, new, ["app", "dhcore/template"], "metadata") == []


def test_changing_the_profile_annotation_is_denied() -> None:
    found = check_scope_annotations(
        {"dhcore/template": "small"}, {"dhcore/template": "large"}, ["dhcore/template"], "metadata"
    )
    assert [(v.rule, v.path) for v in found] == [
        (SCOPE_LABELS, "metadata.annotations[dhcore/template]")
    ]


def test_other_annotations_may_change() -> None:
    old = {"dhcore/template": "small", "note": "a"}
    new = {"dhcore/template": "small", "note": "b"}
    assert check_scope_annotations(old, new, ["dhcore/template"], "metadata") == []
