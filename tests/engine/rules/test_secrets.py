"""``webhook/engine/rules/secrets.py`` on its own: step 7 ``drop_forbidden_secrets`` and
``check_secrets`` on a ``Pod`` built directly, through each Secret door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.pods import NOT_PLATFORM, container, pod_of, policy_of

from webhook.engine.context import Ownership
from webhook.engine.rules.secrets import SECRETS_FORBIDDEN, check_secrets, drop_forbidden_secrets
from webhook.policy.model import Policy

RUN = {"dhcore/run": "r1"}
OURS = "sec-db-r1"  # a name of secrets.allowed for run r1


def policy(tmp_path: Path, on_forbidden: str = "Strip") -> Policy:
    return policy_of(
        tmp_path,
        {"secrets": {"allowed": ["sec-*-{labels[dhcore/run]}"], "onForbidden": on_forbidden}},
    )


def env_secret(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


def every_door(secret: str) -> dict[str, Any]:
    """A spec naming ``secret`` by env, envFrom, a volume and a pull secret, beside ours."""
    main = container(
        env=[env_secret("MINE", OURS), env_secret("THEIRS", secret)],
        envFrom=[{"secretRef": {"name": secret}}],
        volumeMounts=[{"name": "creds", "mountPath": "/c"}, {"name": "ok", "mountPath": "/o"}],
    )
    return {
        "containers": [main],
        "volumes": [
            {"name": "creds", "secret": {"secretName": secret}},
            {"name": "ok", "secret": {"secretName": OURS}},
        ],
        "imagePullSecrets": [{"name": secret}],
    }


def test_strip_removes_each_door_to_a_foreign_secret_and_keeps_the_platforms(
    tmp_path: Path,
) -> None:
    run = pod_of(policy(tmp_path), every_door("admin-token"), labels=RUN)
    change = drop_forbidden_secrets(run)
    assert change is not None and change.rule == SECRETS_FORBIDDEN
    assert "admin-token" in change.warning
    assert run.spec == {
        "containers": [
            container(
                env=[env_secret("MINE", OURS)],
                volumeMounts=[{"name": "ok", "mountPath": "/o"}],
            )
        ],
        "volumes": [{"name": "ok", "secret": {"secretName": OURS}}],
    }
    assert check_secrets(run) == []
    assert drop_forbidden_secrets(run) is None  # a fixed point


def test_strip_leaves_a_pod_naming_only_the_platforms_secrets(tmp_path: Path) -> None:
    spec = {"containers": [container(env=[env_secret("MINE", OURS)])]}
    run = pod_of(policy(tmp_path), spec, labels=RUN)
    assert drop_forbidden_secrets(run) is None
    assert run.spec == spec
    assert check_secrets(run) == []


def test_another_runs_secret_is_foreign(tmp_path: Path) -> None:
    spec = {"containers": [container(env=[env_secret("X", "sec-db-r2")])]}
    run = pod_of(policy(tmp_path), spec, labels=RUN)
    assert [(v.rule, v.path) for v in check_secrets(run)] == [
        (SECRETS_FORBIDDEN, "spec.containers[0].env[0]")
    ]


def test_deny_strips_nothing_and_the_check_names_every_door(tmp_path: Path) -> None:
    spec = every_door("admin-token")
    run = pod_of(policy(tmp_path, "Deny"), spec, labels=RUN)
    assert drop_forbidden_secrets(run) is None
    assert run.spec == spec
    found = check_secrets(run)
    assert {v.rule for v in found} == {SECRETS_FORBIDDEN}
    assert {v.path for v in found} == {
        "spec.containers[0].env[1]",
        "spec.containers[0].envFrom[0]",
        "spec.volumes[0]",
        "spec.imagePullSecrets[0]",
    }


def test_the_platforms_secret_in_a_run_it_did_not_create_is_removed_and_denied(
    tmp_path: Path,
) -> None:
    spec = {"containers": [container(env=[env_secret("MINE", OURS)])]}
    checked = pod_of(policy(tmp_path), spec, labels=RUN, ownership=NOT_PLATFORM)
    [violation] = check_secrets(checked)
    assert violation.rule == SECRETS_FORBIDDEN
    assert "only runs the platform creates" in violation.message
    stripped = pod_of(policy(tmp_path), spec, labels=RUN, ownership=NOT_PLATFORM)
    assert drop_forbidden_secrets(stripped) is not None
    assert "env" not in stripped.spec["containers"][0]


def test_while_the_creator_is_unknown_mutation_keeps_the_platforms_secret(
    tmp_path: Path,
) -> None:
    spec = {"containers": [container(env=[env_secret("MINE", OURS)])]}
    undecided = Ownership(False, unknown="the owner Job is not synced")
    run = pod_of(policy(tmp_path), spec, labels=RUN, ownership=undecided)
    assert drop_forbidden_secrets(run) is None  # left for validation (ownership.unknown)
    assert run.spec == spec
    assert [v.rule for v in check_secrets(run)] == [SECRETS_FORBIDDEN]
