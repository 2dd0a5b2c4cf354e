"""``webhook.cli.cluster.on_cluster``: the one block ``audit``, ``audit --rbac``,
``explain`` and ``whatif`` run their cluster work in (connect, choose the policy, map a
failure to one line naming the step), and what each command says through it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import REPO
from kubernetes.client.exceptions import ApiException

from webhook.cli import EXIT_BAD_INPUT, main
from webhook.cli.cluster import Session, on_cluster
from webhook.policy.loader import load_policy

SHIPPED = REPO / "policies"
# A cluster on this machine that answers nothing: nothing is sent anywhere else.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config


def arguments(tmp_path: Path, policy: Path = SHIPPED, **more: object) -> argparse.Namespace:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    given = {"kubeconfig": str(kubeconfig), "context": None, "policy": str(policy)}
    return argparse.Namespace(**{"policy_objects": False, **given, **more})


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["audit"], "runguard audit: cannot list objects: "),
        (["audit", "--rbac"], "runguard audit: cannot read the roles and bindings: "),
        (["explain", "pod", "x"], "runguard explain: cannot connect: "),
        (["whatif", "--proposed", str(SHIPPED)], "runguard whatif: cannot connect: "),
    ],
)
def test_each_command_says_where_to_put_a_kubeconfig(
    no_kubeconfig: None, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "-p", str(SHIPPED)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{said}no kubeconfig found: set KUBECONFIG or pass --kubeconfig FILE" in err, err
    assert "Traceback" not in err and "Invalid kube-config file" not in err


def test_the_work_gets_the_connection_and_the_policy_of_p(tmp_path: Path) -> None:
    seen: list[tuple[str, list[str]]] = []

    def work(session: Session) -> str:
        seen.append((session.directory, session.policy.names()))
        return "done"

    assert on_cluster(arguments(tmp_path), "t", work) == "done"
    assert seen == [(str(SHIPPED), load_policy(SHIPPED).names())]  # read after connecting


def test_a_policy_given_is_used_and_one_that_does_not_load_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "p.yaml").write_text("apiVersion: runguard.io/v1\nkind: RunPolicy\nspec: 3\n")
    ran: list[Session] = []
    assert on_cluster(arguments(tmp_path, broken), "t", ran.append) is None
    assert not ran and "p.yaml" in capsys.readouterr().err  # the loader's file:line errors
    given = load_policy(SHIPPED)
    assert on_cluster(arguments(tmp_path, broken), "t", lambda s: s.policy, policy=given) is given


def test_the_apiservers_answer_names_the_step_under_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def work(session: Session) -> None:
        session.doing = "read the cluster view"
        refused = ApiException(status=403, reason="Forbidden")
        refused.body = json.dumps(
            {"kind": "Status", "message": 'namespaces is forbidden: user "u"'}
        )
        raise refused

    assert on_cluster(arguments(tmp_path), "t", work) is None
    assert capsys.readouterr().err == (
        'runguard t: cannot read the cluster view: 403: namespaces is forbidden: user "u"\n'
    )


def test_a_missing_report_crd_is_named_only_when_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def step(doing: str) -> Callable[[Session], None]:
        def work(session: Session) -> None:
            session.doing = doing
            raise ApiException(status=404, reason="Not Found")

        return work

    assert on_cluster(arguments(tmp_path), "audit", step("list objects")) is None
    assert capsys.readouterr().err == "runguard audit: cannot list objects: Not Found\n"
    assert on_cluster(arguments(tmp_path), "audit", step("write PolicyReports")) is None
    err = capsys.readouterr().err
    assert err.startswith("runguard audit: cannot write PolicyReports: 404: the cluster serves")
    assert "kubectl apply -k manifests/policyreport-crd" in err


def test_an_unreachable_cluster_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kubernetes import client

    def work(session: Session) -> None:
        session.doing = "list objects"
        client.CoreV1Api(session.api_client).list_namespace(_request_timeout=(2, 2))

    assert on_cluster(arguments(tmp_path), "t", work) is None
    err = capsys.readouterr().err
    assert err.startswith("runguard t: cannot list objects: ") and err.count("\n") == 1, err
    assert "127.0.0.1" in err


def test_a_closed_stdout_is_the_callers(tmp_path: Path) -> None:
    def work(session: Session) -> None:
        raise BrokenPipeError

    with pytest.raises(BrokenPipeError):
        on_cluster(arguments(tmp_path), "t", work)
