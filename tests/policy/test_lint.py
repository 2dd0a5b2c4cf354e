"""``lint`` and ``runguard lint``: loader errors, warnings, output and exit codes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from harness import REPO, write

from webhook.cli import main
from webhook.policy.lint import lint
from webhook.policy.model import ProfileSpec

RUN_POLICY = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {name: platform}
spec:
  selector:
    matchLabels: {app.kubernetes.io/managed-by: dhcore}
  profiles: {label: dhcore/template}
  resources:
    maximums: {cpu: "16", memory: 64Gi, gpu: "2"}
"""

PROFILE = """\
apiVersion: runguard.io/v1
kind: Profile
metadata: {name: small}
spec:
  resources:
    requests: {cpu: 500m, memory: 1Gi}
"""


# Every test policy below names platform objects without platform.identities: lint
# says names alone can be forged, on the line of ``spec:``.
PLATFORM = """\
apiVersion: runguard.io/v1
kind: Platform
metadata: {{name: {name}}}
spec: {spec}
"""
NAMES_ALONE = (
    "spec: no platform.identities: platform names alone decide what a run may use, and "
    "names and labels are written by whoever writes the manifest (a Pod labelled with "
    "another run's id gets that run's volumes and secrets); list the platform's user"
)


def write_run_policy(directory: Path, spec: str) -> None:
    """``runpolicy.yaml``: the RunPolicy ``platform`` whose spec is ``spec`` (its first line
    is line 5 of the file)."""
    header = "apiVersion: runguard.io/v1\nkind: RunPolicy\nmetadata: {name: platform}\nspec:\n"
    write(directory, "runpolicy.yaml", header + textwrap.indent(textwrap.dedent(spec), "  "))


def keys_of(section: type[ProfileSpec]) -> str:
    """The keys of a section as an unknown-key message lists them (a new key adds itself)."""
    return ", ".join(sorted(f.alias or n for n, f in section.model_fields.items()))


def warnings_of(directory: str = "pol") -> list[str]:
    report = lint(directory)
    assert report.errors == []
    return [str(w) for w in report.warnings]


@pytest.mark.parametrize("directory", ["policies", "policies/examples/mlrun"])
def test_shipped_policies_lint_clean(directory: str) -> None:
    report = lint(REPO / directory)
    assert report.errors == []
    assert report.warnings == []
    assert report.ok and report.policy is not None


@pytest.mark.parametrize("directory", ["policies", "policies/examples/mlrun"])
def test_runguard_lint_passes_on_shipped_policies(
    directory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lint", "-p", str(REPO / directory)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(": 0 errors, 0 warnings")


def test_pattern_label_the_selector_does_not_guarantee(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY
        + "  volumes:\n"
        + '    platformClaims: ["v-{labels[dhcore/run]}-*"]\n'
        + "  secrets:\n"
        + '    allowed: ["sec-{labels[app.kubernetes.io/managed-by]}-*"]\n',
    )
    write(pol, "profiles.yaml", PROFILE)
    assert warnings_of() == [
        f"pol/runpolicy.yaml:4: {NAMES_ALONE}",
        'pol/runpolicy.yaml:11: spec.volumes.platformClaims[0]: pattern uses label "dhcore/run", '
        "which the selector does not require; a run without it matches no pattern (add a "
        "matchExpressions {key: dhcore/run, operator: Exists})",
    ]


@pytest.mark.parametrize(
    "expression",
    ["{key: dhcore/run, operator: Exists}", "{key: dhcore/run, operator: In, values: [a, b]}"],
)
def test_pattern_label_guaranteed_by_a_match_expression(pol: Path, expression: str) -> None:
    write(pol, "profiles.yaml", PROFILE)
    text = RUN_POLICY.replace(
        "    matchLabels: {app.kubernetes.io/managed-by: dhcore}\n",
        "    matchLabels: {app.kubernetes.io/managed-by: dhcore}\n"
        f"    matchExpressions: [{expression}]\n",
    )
    write(pol, "runpolicy.yaml", text + '  secrets: {allowed: ["sec-{labels[dhcore/run]}"]}\n')
    assert warnings_of() == [f"pol/runpolicy.yaml:4: {NAMES_ALONE}"]


def test_not_in_and_does_not_exist_guarantee_nothing(pol: Path) -> None:
    text = RUN_POLICY.replace(
        "    matchLabels: {app.kubernetes.io/managed-by: dhcore}\n",
        "    matchExpressions:\n"
        "      - {key: dhcore/run, operator: NotIn, values: [x]}\n"
        "      - {key: team, operator: DoesNotExist}\n",
    )
    secrets = '  secrets: {allowed: ["{labels[dhcore/run]}-{labels[team]}"]}\n'
    write(pol, "runpolicy.yaml", text + secrets)
    write(pol, "profiles.yaml", PROFILE)
    names_alone, *warnings = warnings_of()
    assert names_alone == f"pol/runpolicy.yaml:4: {NAMES_ALONE}"
    assert len(warnings) == 2
    assert all(w.startswith("pol/runpolicy.yaml:12: spec.secrets.allowed[0]: ") for w in warnings)


def test_a_request_range_above_its_limit_and_a_kept_default(pol: Path) -> None:
    default = "{label: dhcore/template, default: small}"
    write(pol, "runpolicy.yaml", RUN_POLICY.replace("{label: dhcore/template}", default))
    ranges = (
        "    requests:\n"
        "      memory: {min: 1Gi, default: 2Gi, max: 8Gi}\n"
        '      cpu: {min: "1", default: "1", max: "2"}\n'
        "    limits:\n"
        "      memory: {min: 1Gi, default: 2Gi, max: 4Gi}\n"
        '      cpu: "2"\n'
    )
    kept = PROFILE.replace("spec:\n", "spec:\n  namespaceSelector: {matchLabels: {team: a}}\n")
    write(pol, "profiles.yaml", kept.replace("    requests: {cpu: 500m, memory: 1Gi}\n", ranges))
    assert warnings_of() == [
        "pol/profiles.yaml:5: spec.namespaceSelector: the default profile of RunPolicy "
        "platform is kept to some namespaces: elsewhere a run naming no profile is denied",
        "pol/profiles.yaml:8: spec.resources.requests.memory.max: request up to 8Gi is above "
        "the most the limit allows, 4Gi: runs asking for more get the limit",
    ]


def test_profile_priority_class_not_allowed(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY + "  scheduling:\n    priorityClasses: {default: low, allowed: [low, high]}\n",
    )
    write(pol, "profiles.yaml", PROFILE + "  priorityClassName: urgent\n")
    assert warnings_of() == [
        'pol/profiles.yaml:7: spec.priorityClassName: priority class "urgent" is not allowed '
        "by the RunPolicy (low, high); the scheduling step replaces it"
    ]


def test_profile_requests_above_limits_and_gpu_mismatch(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    write(
        pol,
        "profiles.yaml",
        """\
        apiVersion: runguard.io/v1
        kind: Profile
        metadata: {name: small}
        spec:
          resources:
            requests: {cpu: "2", memory: 2Gi, gpu: "1"}
            limits: {cpu: 1500m, memory: 2Gi, nvidia.com/gpu: "2"}
          env: [{name: A, value: "1"}, {name: A, value: "2"}]
        """,
    )
    assert warnings_of() == [
        "pol/profiles.yaml:6: spec.resources.requests.cpu: request 2 is above the limit 1500m",
        "pol/profiles.yaml:6: spec.resources.requests.gpu: gpu request 1 differs from the gpu "
        "limit 2; runs get the limit",
        'pol/profiles.yaml:8: spec.env[1].name: env "A" is set twice',
    ]


def test_run_policy_warnings(pol: Path) -> None:
    write_run_policy(
        pol,
        """\
        selector: {}
        profiles: {unknown: Default}
        resources:
          maximums: {cpu: "1"}
          defaults: {requests: {cpu: "2", gpu: "1"}, limits: {cpu: "1500m"}}
        security: {seccompProfile: Unconfined}
        volumes: {allowedTypes: [emptyDir, hostPath], platformClaims: ["*"]}
        scheduling: {preemption: {default: prevent}}
        """,
    )
    assert warnings_of() == [
        f"pol/runpolicy.yaml:4: {NAMES_ALONE}",
        "pol/runpolicy.yaml:5: spec.selector: an empty selector makes every Pod outside "
        "excludeNamespaces a platform run",
        "pol/runpolicy.yaml:6: spec.profiles.unknown: unknown: Default without "
        "profiles.default: an unknown profile means no profile",
        "pol/runpolicy.yaml:9: spec.resources.defaults.requests.cpu: default is above the "
        "maximum cpu: 1; every run would be clamped or denied",
        "pol/runpolicy.yaml:9: spec.resources.defaults.requests.gpu: a default gpu gives "
        "every container a GPU",
        "pol/runpolicy.yaml:9: spec.resources.defaults.limits.cpu: default is above the "
        "maximum cpu: 1; every run would be clamped or denied",
        "pol/runpolicy.yaml:9: spec.resources.defaults.requests.cpu: default request is "
        "above the default limit 1500m",
        "pol/runpolicy.yaml:10: spec.security.seccompProfile: Unconfined turns seccomp off "
        "for every run",
        'pol/runpolicy.yaml:11: spec.volumes.platformClaims[0]: pattern "*" matches every '
        "name: the rule is off",
        "pol/runpolicy.yaml:11: spec.volumes.allowedTypes[1]: hostPath lets a run read and "
        "write the node's filesystem",
        "pol/runpolicy.yaml:12: spec.scheduling.preemption: no nodeSelector or tolerations "
        "for spot nodes: preemption modes change nothing",
    ]


def test_lint_reports_loader_errors_with_lines(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace('"16"', "lots"))
    write(pol, "profiles.yaml", PROFILE + "  priorityClassName: 7\n")
    report = lint("pol")
    assert not report.ok and report.policy is None
    assert [str(e) for e in report.errors] == [
        "pol/profiles.yaml:7: spec.priorityClassName: expected a string, got 7; "
        'quote it ("7") to mean text',
        'pol/runpolicy.yaml:9: spec.resources.maximums.cpu: "lots" is not a quantity',
    ]


@pytest.mark.parametrize(
    "text",
    ["- 1\n", "kind: RunPolicy\nspec: {selector: 3, volumes: {platformClaims: 4}}\n", "a: [\n"],
)
def test_lint_never_raises(pol: Path, text: str) -> None:
    write(pol, "x.yaml", text)
    assert lint("pol").errors


# --- the command ---------------------------------------------------------------------


def test_runguard_lint_prints_errors_then_warnings_then_summary(
    pol: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + '  secrets: {allowed: ["s-{labels[run]}"]}\n')
    write(pol, "profiles.yaml", PROFILE + "  colour: red\n")
    assert main(["lint", "-p", "pol"]) == 2
    assert capsys.readouterr().out.splitlines() == [
        'pol/profiles.yaml:7: spec.colour: unknown key "colour" '
        f"(expected one of {keys_of(ProfileSpec)})",
        f"pol/runpolicy.yaml:4: warning: {NAMES_ALONE}",
        'pol/runpolicy.yaml:10: warning: spec.secrets.allowed[0]: pattern uses label "run", '
        "which the selector does not require; a run without it matches no pattern (add a "
        "matchExpressions {key: run, operator: Exists})",
        "pol: 1 RunPolicy, 1 profile: 1 error, 2 warnings",
    ]


def test_runguard_lint_warnings_alone_pass_unless_strict(
    pol: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + '  secrets: {allowed: ["s-{labels[run]}"]}\n')
    write(pol, "profiles.yaml", PROFILE)
    assert main(["lint", "-p", "pol"]) == 0
    assert main(["lint", "-p", "pol", "--strict"]) == 2
    assert "0 errors, 2 warnings" in capsys.readouterr().out


def test_runguard_lint_json(pol: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace("kind: RunPolicy", "kind: Runpolicy"))
    assert main(["lint", "-p", "pol", "-o", "json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert out["errors"][0] == {
        "file": "pol",
        "line": None,
        "key": "",
        "message": "no RunPolicy document (at least one is required)",
    }
    assert out["errors"][1]["line"] == 2 and out["errors"][1]["key"] == "kind"


def test_runguard_lint_missing_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["lint", "-p", str(tmp_path / "nope")]) == 2
    assert "policy directory does not exist" in capsys.readouterr().out


def test_names_alone_are_a_warning_until_the_platform_is_named(pol: Path) -> None:
    """Without platform.identities, platform names decide, and anyone can write names."""
    named = RUN_POLICY + '  secrets: {allowed: ["sec-{labels[app.kubernetes.io/managed-by]}"]}\n'
    write(pol, "runpolicy.yaml", named)
    write(pol, "profiles.yaml", PROFILE)
    assert warnings_of() == [f"pol/runpolicy.yaml:4: {NAMES_ALONE}"]
    write(pol, "runpolicy.yaml", named + "  platform: dhcore\n")
    write(pol, "platform.yaml", PLATFORM.format(name="dhcore", spec="{identities: [core]}"))
    assert warnings_of() == []


def test_lint_cluster_state_names_classes_the_cluster_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """runguard lint --cluster-state (and --cluster): a class a policy names that the
    cluster lacks would make the apiserver refuse every run."""
    state = tmp_path / "state.yaml"
    state.write_text(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
        "metadata: {name: low, uid: u1}\nvalue: 1\n"
    )
    policy = str(REPO / "tests" / "cases" / "_policies" / "platform")
    assert main(["lint", "-p", policy, "--cluster-state", str(state)]) == 2
    out = capsys.readouterr().out
    assert "the cluster has no PriorityClass 'medium'" in out  # the RunPolicy's default
    assert "the cluster has no PriorityClass 'high'" in out  # a profile's
    assert "the cluster has no RuntimeClass 'nvidia'" in out


def test_node_paths_and_operator_patterns_that_give_too_much(pol: Path) -> None:
    """An allowed host path in the node's system directories (at, above or below one)
    and an operator ConfigMap pattern matching every name are warned about; the MLRun
    example's daemon directories are not."""
    write_run_policy(
        pol,
        """\
        selector: {matchLabels: {run: "yes"}}
        volumes:
          allowedHostPaths:
            [/var, /var/lib/kubelet/pods, /etc/ssl, "/var/run/iguazio/dayman/{namespace}"]
        platform: example
        """,
    )
    write(
        pol,
        "platform.yaml",
        """\
        apiVersion: runguard.io/v1
        kind: Platform
        metadata: {name: example}
        spec:
          identities: [platform]
          operators:
            - {identity: op, kinds: [example.com/Job], configMaps: ["*", "{labels[run]}-x"]}
        """,
    )
    assert warnings_of() == [
        'pol/platform.yaml:7: spec.operators[0].configMaps[0]: pattern "*" '
        "matches every name: the operator's Pods could mount any ConfigMap",
        "pol/runpolicy.yaml:8: spec.volumes.allowedHostPaths[0]: /var reaches the node's "
        "own /var/lib/kubelet: a run mounting it can read or change the node",
        "pol/runpolicy.yaml:8: spec.volumes.allowedHostPaths[1]: /var/lib/kubelet/pods "
        "reaches the node's own /var/lib/kubelet: a run mounting it can read or change the node",
        "pol/runpolicy.yaml:8: spec.volumes.allowedHostPaths[2]: /etc/ssl reaches the node's "
        "own /etc: a run mounting it can read or change the node",
    ]


def test_a_profile_schedules_by_queue_or_by_node_not_both(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    queued = PROFILE + "  queue: {name: team-a, priorityClass: research}\n"
    write(pol, "profiles.yaml", queued)
    assert lint("pol").errors == []
    write(pol, "profiles.yaml", queued + "  nodeSelector: {gpu: a100}\n"
          "  tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n")  # fmt: skip
    assert [str(e) for e in lint("pol").errors] == [
        f"pol/profiles.yaml:{line}: spec.{key}: a queue profile (spec.queue) sets no {key}: "
        "the queue's flavors place its runs (schedule by node or by queue, not both)"
        for line, key in ((8, "nodeSelector"), (9, "tolerations"))
    ]


def test_a_device_class_counted_as_nothing_bounded_is_a_warning(pol: Path) -> None:
    write_run_policy(
        pol,
        """\
        selector: {matchLabels: {app: x}}
        resources:
          maximums: {gpu: "2"}
          families: [{name: nvidia, max: 14, members: {"nvidia.com/mig-*": 7}}]
          deviceClasses:
            gpu.nvidia.com: {countsAs: gpu}
            mig.nvidia.com: {countsAs: "nvidia.com/mig-{value}", attribute: gpu.nvidia.com/p}
            fpga.example.com: {countsAs: example.com/fpga}
        """,
    )
    assert warnings_of() == [
        'pol/runpolicy.yaml:12: spec.resources.deviceClasses["fpga.example.com"].countsAs: '
        "example.com/fpga has no maximum and is in no device family: a run may ask for any "
        "number of fpga.example.com devices",
    ]


RUN_TIMES = RUN_POLICY + "  runTime: {maximum: 86400}\n"


def test_a_run_time_default_above_a_maximum_is_a_warning(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_TIMES)
    write(pol, "profiles.yaml", PROFILE + "  runTime: {default: 7200, maximum: 3600}\n---\n"
          + PROFILE.replace("small", "long") + "  runTime: {maximum: 172800}\n")  # fmt: skip
    assert warnings_of() == [
        "pol/profiles.yaml:7: spec.runTime.default: run time default 7200 seconds is above "
        "the profile's maximum 3600: runs setting none get 3600",
        "pol/profiles.yaml:15: spec.runTime.maximum: run time maximum 172800 seconds is above "
        "RunPolicy platform's runTime.maximum 86400 (pol/runpolicy.yaml:10): its runs get "
        "172800, as an installation-wide profile is the admin's own",
    ]
    write(pol, "profiles.yaml", PROFILE + "  runTime: {default: 3600, maximum: 86400}\n")
    assert warnings_of() == []


DRA_RUN_POLICY = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {name: platform}
spec:
  selector: {matchLabels: {app: x}}
  profiles: {label: dhcore/template}
  resources:
    maximums: {gpu: "2"}
    families: [{name: nvidia, max: 14, members: {"nvidia.com/mig-*": 7, nvidia.com/gpu: 7}}]
    deviceClasses:
      gpu.nvidia.com: {countsAs: gpu, extendedResourceName: nvidia.com/gpu}
      mig.nvidia.com: {countsAs: "nvidia.com/mig-{value}", attribute: gpu.nvidia.com/p,
                       extendedResourceName: MIG}
      big.nvidia.com: {countsAs: gpu, extendedResourceName: example.com/big}
      huge.nvidia.com: {countsAs: gpu, extendedResourceName: HUGE}
"""


def test_an_extended_resource_a_class_maps_that_clashes_is_a_warning(pol: Path) -> None:
    """A class mapping a device plugin's resource to other devices, or two classes
    mapping one name; a class mapping the resource its devices count as is not one."""
    for mapped, where in (
        ("nvidia.com/gpu", "resources.maximums gpu"),
        ("nvidia.com/mig-1g.10gb", "a member of device family nvidia"),
    ):
        text = DRA_RUN_POLICY.replace("MIG", mapped).replace("HUGE", "example.com/big")
        write(pol, "runpolicy.yaml", text)
        assert warnings_of() == [
            f'pol/runpolicy.yaml:13: spec.resources.deviceClasses["mig.nvidia.com"].'
            f"extendedResourceName: {mapped} is also a device plugin's resource ({where}): "
            f"runguard counts every {mapped} a run asks for as mig.nvidia.com devices "
            "(nvidia.com/mig-*), on device-plugin nodes too",
            'pol/runpolicy.yaml:15: spec.resources.deviceClasses["huge.nvidia.com"].'
            "extendedResourceName: example.com/big is also the extendedResourceName of "
            "DeviceClass big.nvidia.com: which class the scheduler allocates it from is not "
            "said; map it once",
        ]
    text = DRA_RUN_POLICY.replace("MIG", "example.com/mig").replace("HUGE", "example.com/huge")
    write(pol, "runpolicy.yaml", text)
    assert warnings_of() == []


def test_a_profile_giving_a_class_runs_may_not_use_is_a_warning(pol: Path) -> None:
    text = DRA_RUN_POLICY.replace("MIG", "example.com/mig").replace("HUGE", "example.com/huge")
    write(pol, "runpolicy.yaml", text)
    implicit = "deviceclass.resource.kubernetes.io"
    fpga = PROFILE + f"    limits: {{{implicit}/fpga.example.com: 1}}\n"
    gpu = PROFILE.replace("small", "dra") + f"    limits: {{{implicit}/gpu.nvidia.com: 1}}\n"
    write(pol, "profiles.yaml", fpga + "---\n" + gpu)
    assert warnings_of() == [
        f'pol/profiles.yaml:7: spec.resources.limits["{implicit}/fpga.example.com"]: '
        "DeviceClass fpga.example.com is not in RunPolicy platform's resources.deviceClasses "
        "(big.nvidia.com, gpu.nvidia.com, huge.nvidia.com, mig.nvidia.com): every run of this "
        "profile is refused (resources.device-request)",
    ]
