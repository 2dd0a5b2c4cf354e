"""Hostile files: each failure measured in issue 13, reproduced, now a refusal.

A deeply nested YAML used to kill the process inside libyaml's composer; a huge integer
or deep JSON gave a traceback; a 342-byte billion-laughs file became 170 MB of output;
a 50 MB file hung ``lint``. Each is now ``file:line: message`` and exit 2, for ``runguard
apply``, ``lint``, ``test`` and the server's policy reload (``read_policy``).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO

from webhook.cli import main
from webhook.inputs.documents import InputError, parse_objects
from webhook.inputs.limits import MAX_ALIAS_VALUES, MAX_DEPTH, OBJECT_FILES, POLICY_FILES
from webhook.policy.loader import read_policy

POLICY = str(REPO / "policies")
RUN = (
    "kind: Pod\n"
    "metadata: {name: p, labels: {app.kubernetes.io/managed-by: dhcore, dhcore/run: r}}\n"
)
# 342 bytes: 9 levels of 9 aliases, a billion "lol"s once expanded
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)

HOSTILE = {
    "deep flow YAML": "kind: Pod\nx: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "deep flow mapping": "kind: Pod\nx: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n",
    "deep block YAML": "kind: Pod\nx:\n" + "- " * 5000 + "a\n",
    "deep indented YAML": "kind: Pod\nx:\n" + "".join(" " * i + "-\n" for i in range(1, 400)),
    "deep JSON": '{"kind": "Pod",\n"x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "huge integer (YAML)": "kind: Pod\nspec: {priority: " + "9" * 5000 + "}\n",
    "huge integer (JSON)": '{"kind": "Pod",\n"spec": {"priority": ' + "9" * 5000 + "}}",
    "integer past 64 bits": "kind: Pod\nspec: {priority: 9223372036854775808}\n",
    "float overflow (YAML)": "kind: Pod\nspec: {x: 1.0e+999}\n",
    "float overflow (JSON)": '{"kind": "Pod",\n"x": 1e999}',
    "NaN (JSON)": '{"kind": "Pod",\n"x": NaN}',
    "billion laughs": LAUGHS,
    "recursive alias": "kind: Pod\nx: &a [1, *a]\n",
}
EXPECTED = {  # (line, message)
    "deep flow YAML": (2, "nested deeper than 100 levels"),
    "deep flow mapping": (2, "nested deeper than 100 levels"),
    "deep block YAML": (3, "nested deeper than 100 levels"),
    "deep indented YAML": (102, "nested deeper than 100 levels"),
    "deep JSON": (2, "nested deeper than 100 levels"),
    "huge integer (YAML)": (2, "integer out of range (Kubernetes integers are 64-bit)"),
    "huge integer (JSON)": (2, "integer out of range (Kubernetes integers are 64-bit)"),
    "integer past 64 bits": (2, "integer out of range (Kubernetes integers are 64-bit)"),
    "float overflow (YAML)": (2, "number out of range (not a finite float)"),
    "float overflow (JSON)": (2, "number out of range (not a finite float)"),
    "NaN (JSON)": (2, "number out of range (not a finite float)"),
    "billion laughs": (5, "aliases expand to more than 10000 values (an alias bomb?)"),
    "recursive alias": (2, "recursive alias *a"),
}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_laughs_are_the_measured_342_bytes() -> None:
    assert len(LAUGHS) == 342


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_apply_refuses_with_the_line_and_exit_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ("input.json" if "JSON" in name else "input.yaml")
    path.write_text(HOSTILE[name])
    code, out, err = run(["apply", "-p", POLICY, "-o", "json", str(path)], capsys)
    assert (code, out) == (2, "")
    line, message = EXPECTED[name]
    assert err == f"runguard: {path}:{line}: {message}\n"


@pytest.mark.parametrize("name", sorted(n for n in HOSTILE if "JSON" not in n and "float" not in n))
def test_lint_and_the_reload_refuse_with_the_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    for source in Path(POLICY).glob("*.yaml"):
        (policies / source.name).write_text(source.read_text())
    (policies / "zz.yaml").write_text(HOSTILE[name])
    line, message = EXPECTED[name]
    where = f"{policies / 'zz.yaml'}:{line}: "  # then the key, for a value

    def found(errors: list[str]) -> bool:
        return any(e.startswith(where) and e.endswith(message) for e in errors)

    assert found([str(e) for e in read_policy(policies).errors])
    code, out, _ = run(["lint", "-p", str(policies)], capsys)
    assert code == 2 and found(out.splitlines())


def test_the_deep_file_that_crashed_the_process_is_refused(tmp_path: Path) -> None:
    """In a child process: were the check gone, libyaml's composer would take pytest down."""
    path = tmp_path / "deep.yaml"
    path.write_text(HOSTILE["deep flow YAML"])
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", POLICY, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"runguard: {path}:2: nested deeper than 100 levels\n"


def test_an_oversized_file_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # 50 MB (sparse): never read past the limit
    code, out, err = run(["apply", "-p", POLICY, str(big)], capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"runguard: {big}: 52428800 bytes: over the 3 MiB limit for object files "
        "(the apiserver's request limit)\n"
    )
    policies = tmp_path / "policies"
    policies.mkdir()
    os.link(big, policies / "big.yaml")
    code, out, _ = run(["lint", "-p", str(policies)], capsys)
    assert code == 2
    assert f"{policies / 'big.yaml'}: 52428800 bytes: over the 1 MiB limit for policy files" in out


def test_the_limits_are_the_documented_ones() -> None:
    assert OBJECT_FILES.max_bytes == 3 * 1024 * 1024  # the apiserver's request limit
    assert POLICY_FILES.max_bytes == 1024 * 1024  # the most a ConfigMap holds
    assert (MAX_DEPTH, MAX_ALIAS_VALUES) == (100, 10_000)


def test_a_file_exactly_at_the_limits_is_read(tmp_path: Path) -> None:
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_objects(f"x: {deep[1:-1]}\n") == [{"x": json.loads(deep[1:-1])}]
    assert parse_objects(deep) == [json.loads(deep[1:-1])]  # a JSON list of its items
    padded = RUN + "#" * (OBJECT_FILES.max_bytes - len(RUN))
    assert len(parse_objects(padded)) == 1
    with pytest.raises(InputError, match="over the 3 MiB limit"):
        parse_objects(padded + "#")
    ten = "a: &a [" + ",".join(["lol"] * 10) + "]\n"  # each *a adds 11 values

    def aliases(count: int) -> str:
        return ten + "b: [" + ",".join(["*a"] * count) + "]\n"

    assert len(parse_objects(aliases(MAX_ALIAS_VALUES // 11))[0]["b"]) == MAX_ALIAS_VALUES // 11
    with pytest.raises(InputError, match=r"<input>:2: aliases expand to more than 10000 values"):
        parse_objects(aliases(MAX_ALIAS_VALUES // 11 + 1))


def test_stdin_is_bounded_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"#" * (4 * 1024 * 1024))))
    code, out, err = run(["apply", "-p", POLICY, "-"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("runguard: <stdin>: more than 3 MiB: over the 3 MiB limit")


def test_a_case_with_a_hostile_input_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = tmp_path / "hostile"
    case.mkdir()
    (case / "input.yaml").write_text(LAUGHS)
    (case / "case.yaml").write_text(f"policy: {POLICY}\nexpect: {{allowed: true}}\n")
    code, out, _ = run(["test", str(tmp_path)], capsys)
    assert code == 2
    assert out.splitlines() == [
        "ERROR hostile",
        f"    {case / 'input.yaml'}:5: aliases expand to more than 10000 values (an alias bomb?)",
        "0 passed, 1 failed (1 could not run)",
    ]


@pytest.mark.parametrize(
    ("case_yaml", "problem"),
    [
        ("policy: 7\n", "policy must be a file or directory name"),
        ("input: [1, 2]\nold: [1]\nexpect: {}\n", "old must hold as many objects as input (2)"),
        ("input: {}\nnamespace: [x]\nexpect: {}\n", "namespace must be a string"),
        ("input: {}\nexpect: {violations: 3}\n", "expect.violations must be a list of strings"),
        ("input: {}\nexpect: {warnings: [1]}\n", "expect.warnings must be a list of strings"),
        ("x: " + "[" * 200 + "]" * 200, "case.yaml:1: nested deeper than 100 levels"),
    ],
)
def test_a_malformed_case_file_is_a_clear_error(
    case_yaml: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = tmp_path / "broken"
    case.mkdir()
    policy = "" if case_yaml.startswith(("policy:", "x:")) else f"policy: {POLICY}\n"
    (case / "case.yaml").write_text(policy + case_yaml)
    code, out, _ = run(["test", str(tmp_path)], capsys)
    assert code == 2
    assert out.splitlines()[0] == "ERROR broken"
    assert problem in out.splitlines()[1]


def test_objects_are_read_as_kubectl_reads_them() -> None:
    shared = RUN + "spec:\n  containers:\n  - &c {name: a, env: [{name: X}]}\n  - *c\n"
    [pod] = parse_objects(shared)
    first, second = pod["spec"]["containers"]
    assert first == second and first is not second and first["env"] is not second["env"]
    [dated] = parse_objects("kind: Pod\nmetadata: {name: 2024-01-01, uid: !!binary aGk=}\n")
    assert dated["metadata"] == {"name": "2024-01-01", "uid": "aGk="}
    [escaped] = parse_objects('{"kind": "Pod", "metadata": {"name": "a\\ud800b\\ud83d\\ude00"}}')
    assert escaped["metadata"]["name"] == "a\ufffdb\U0001f600"


def test_an_alias_shared_by_two_containers_is_mutated_in_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(
        RUN + "spec:\n  containers:\n  - {name: a, securityContext: &sc {runAsUser: 0}}\n"
        "  - {name: b, securityContext: *sc}\n"
    )
    code, out, _ = run(["apply", "-p", POLICY, "-o", "json", str(path)], capsys)
    [decision] = json.loads(out)
    assert code == 0
    assert any("a runAsUser 0, b runAsUser 0" in w for w in decision["warnings"])
