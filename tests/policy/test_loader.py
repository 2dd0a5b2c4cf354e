"""Loading policy directories: every error with its file and line, all at once."""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from harness import REPO, write
from jsonschema import Draft202012Validator

from webhook.cli import main
from webhook.policy import PolicyError, PolicyIssue, load_policy, policy_schema, read_policy
from webhook.policy.declare import Section
from webhook.policy.model import ProfileSpec, ResourcesConfig

RUN_POLICY = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {name: platform}
spec:
  selector:
    matchLabels: {app.kubernetes.io/managed-by: dhcore}
    matchExpressions: [{key: dhcore/run, operator: Exists}]
  profiles: {label: dhcore/template, default: small}
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


def keys_of(section: type[Section]) -> str:
    """The keys of a section as an unknown-key message lists them (a new key adds itself)."""
    return ", ".join(sorted(f.alias or n for n, f in section.model_fields.items()))


def errors_of(directory: str | Path = "pol") -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(directory)
    return [str(e) for e in info.value.errors]


def valid(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    write(pol, "profiles.yaml", PROFILE)


# --- good policies -------------------------------------------------------------------


def test_shipped_policy_loads() -> None:
    builds, policy = load_policy(REPO / "policies").run_policies
    assert (builds.name, policy.name) == ("builds", "digitalhub")  # tried in name order
    assert builds.security.on_root == "Allow" and builds.security.level == "baseline"
    assert policy.selector.match_labels == {"app.kubernetes.io/managed-by": "dhcore"}
    assert policy.profiles_config.label == "dhcore/template"
    # DigitalHub's charts define no default template: a run naming none keeps its resources
    # (docs/dev/platforms.md, D5)
    assert policy.profiles_config.default is None
    assert {"1xa100", "1xt4", "cpu-large"} <= set(policy.profiles)
    assert policy.profiles["1xa100"].requests["nvidia.com/gpu"] == "1"
    # a sidecar's room
    assert policy.resources.maximum_values["memory"] == Decimal(66 * 1024**3)
    labels = {"dhcore/run": "r1"}
    assert any(p.matches("v-r1-data", labels) for p in policy.volumes.platform_claims)


def test_mlrun_example_loads() -> None:
    policy = load_policy(REPO / "policies" / "examples" / "mlrun")
    assert policy.first.scheduling.default_priority_class == "igz-workload-medium"
    assert policy.first.scheduling.allowed_priority_classes == frozenset(
        {"igz-workload-low", "igz-workload-medium", "igz-workload-high"}
    )
    preemption = policy.first.scheduling.preemption
    assert preemption is not None and preemption.default == "prevent"
    assert preemption.node_selector == {"app.iguazio.com/lifecycle": "preemptible"}


def test_minimal_policy_loads_with_gpu_resolved(pol: Path) -> None:
    valid(pol)
    policy = load_policy("pol")
    assert policy.first.resources.maximums == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert list(policy.first.profiles) == ["small"]


def test_many_documents_per_file_and_yml_files(pol: Path) -> None:
    write(pol, "all.yml", "---\n" + RUN_POLICY + "---\n" + PROFILE + "---\n")
    write(pol, "more.yaml", PROFILE.replace("name: small", "name: other"))
    assert set(load_policy("pol").first.profiles) == {"small", "other"}


def test_hidden_files_other_suffixes_and_subdirectories_are_ignored(pol: Path) -> None:
    valid(pol)
    write(pol, ".hidden.yaml", "not: [valid")
    write(pol, "README.md", "not: [valid")
    write(pol, "runpolicy.yaml.bak", "not: [valid")
    (pol / "examples").mkdir()
    write(pol / "examples", "x.yaml", "not: [valid")
    assert list(load_policy("pol").first.profiles) == ["small"]


def test_configmap_volume_layout_loads(tmp_path: Path) -> None:
    # What the kubelet writes for a mounted ConfigMap: a timestamped directory, a ..data
    # symlink to it, and one visible symlink per key pointing through ..data.
    mount = tmp_path / "mount"
    stamped = mount / "..2024_05_01_12_00_00.123456789"
    stamped.mkdir(parents=True)
    write(stamped, "runpolicy.yaml", RUN_POLICY)
    write(stamped, "profiles.yaml", PROFILE)
    os.symlink(stamped.name, mount / "..data")
    for name in ("runpolicy.yaml", "profiles.yaml"):
        os.symlink(f"..data/{name}", mount / name)
    policy = load_policy(mount)
    assert list(policy.first.profiles) == ["small"]


def test_odd_but_valid_quantities(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY.replace(
            'maximums: {cpu: "16", memory: 64Gi, gpu: "2"}',
            "maximums: {cpu: 0.5, memory: 1G, ephemeral-storage: 1e3, example.com/fpga: 2,"
            " hugepages-2Mi: 1Gi}\n"
            "    defaults: {requests: {cpu: 500m, memory: +.5Gi}}",
        ),
    )
    write(pol, "profiles.yaml", PROFILE.replace("cpu: 500m, memory: 1Gi", "cpu: 100m"))
    policy = load_policy("pol")
    assert policy.first.resources.maximum_values["cpu"] == Decimal("0.5")
    assert policy.first.resources.maximum_values["memory"] == Decimal(10**9)
    assert policy.first.resources.maximum_values["ephemeral-storage"] == Decimal(1000)


def test_anchors_and_merge_keys(pol: Path) -> None:
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
            requests: &small {cpu: 500m, memory: 1Gi}
            limits:
              <<: *small
              memory: 2Gi
        """,
    )
    profile = load_policy("pol").first.profiles["small"]
    assert profile.limits == {"cpu": "500m", "memory": "2Gi"}


# --- each kind of error, with its file and line ----------------------------------------


def test_bad_quantity_names_file_line_and_key(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace('cpu: "16", ', ""))
    write(
        pol,
        "gpu.yaml",
        """\
        # GPU profiles
        apiVersion: runguard.io/v1
        kind: Profile
        metadata: {name: small}
        spec:
          resources:
            requests: {cpu: 500m}
        ---
        apiVersion: runguard.io/v1
        kind: RunPolicy
        metadata: {name: second}
        spec:
          selector: {matchLabels: {a: b}}
          resources:
            maximums:
              cpu: lots
        """,
    )
    errors = errors_of()
    assert 'pol/gpu.yaml:16: spec.resources.maximums.cpu: "lots" is not a quantity' in errors


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"-1"', '"-1" is negative'),
        ("-2", "-2 is negative"),
        ("1.5.5", '"1.5.5" is not a quantity'),
        ("2Ki2", '"2Ki2" is not a quantity'),
        ('"1 Gi"', '"1 Gi" is not a quantity'),
        ("1_000", None),  # YAML reads 1_000 as the integer 1000
        ("true", "expected a string or a number, got true"),
        ("[1]", "expected a string or a number, got a list"),
    ],
)
def test_quantity_errors(pol: Path, value: str, message: str | None) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace('memory: 64Gi, gpu: "2"', f"memory: {value}"))
    write(pol, "profiles.yaml", PROFILE.replace(", memory: 1Gi", ""))
    if message is None:
        load_policy("pol")
        return
    assert errors_of() == [f"pol/runpolicy.yaml:10: spec.resources.maximums.memory: {message}"]


def test_yaml_syntax_error_has_its_line(pol: Path) -> None:
    valid(pol)
    write(pol, "broken.yaml", "apiVersion: runguard.io/v1\nkind: Profile\nmetadata: {name: x\n")
    (error,) = errors_of()
    assert error.startswith("pol/broken.yaml:4: YAML syntax error: ")


def test_yaml_syntax_error_keeps_the_documents_before_it(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    write(pol, "profiles.yaml", PROFILE + "---\nkind: [\n")
    (error,) = errors_of()  # "small" was read: profiles.default is not reported missing
    assert error.startswith("pol/profiles.yaml:9: YAML syntax error")


def test_unknown_keys_each_on_its_own_line(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY + "    mem: 3Gi\n" + "  securty: {onRoot: Deny}\n",
    )
    write(pol, "profiles.yaml", PROFILE + "  nodeselector: {a: b}\n")
    assert errors_of() == [
        'pol/profiles.yaml:7: spec.nodeselector: unknown key "nodeselector" '
        '(did you mean "nodeSelector"?)',
        'pol/runpolicy.yaml:11: spec.resources.mem: unknown key "mem" '
        f"(expected one of {keys_of(ResourcesConfig)})",
        'pol/runpolicy.yaml:12: spec.securty: unknown key "securty" (did you mean "security"?)',
    ]


def test_unknown_resource_name(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace('gpu: "2"', "mem: 2Gi, disks: 1"))
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        'pol/runpolicy.yaml:10: spec.resources.maximums.disks: unknown key "disks" '
        "(cpu, memory, gpu, ephemeral-storage or an extended resource domain/name)",
        'pol/runpolicy.yaml:10: spec.resources.maximums.mem: unknown key "mem" '
        '(did you mean "memory"?)',
    ]


def test_wrong_types(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY
        + "  excludeNamespaces: kube-system\n"
        + "  security:\n"
        + '    runAsUser: "8877"\n'
        + "    dropCapabilities: ALL\n",
    )
    write(pol, "profiles.yaml", PROFILE + "  env: [{name: DEBUG, value: yes}]\n")
    assert errors_of() == [
        "pol/profiles.yaml:7: spec.env[0].value: expected a string, got true; "
        'quote it ("yes") to mean text',
        'pol/runpolicy.yaml:11: spec.excludeNamespaces: expected a list, got "kube-system"',
        'pol/runpolicy.yaml:13: spec.security.runAsUser: expected an integer, got "8877"',
        'pol/runpolicy.yaml:14: spec.security.dropCapabilities: expected a list, got "ALL"',
    ]


def test_missing_required_keys(pol: Path) -> None:
    write(pol, "runpolicy.yaml", "apiVersion: runguard.io/v1\nkind: RunPolicy\nspec: {}\n")
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        "pol/runpolicy.yaml:1: metadata: required key is missing",
        "pol/runpolicy.yaml:3: spec.selector: required key is missing",
    ]


def test_wrong_api_version_and_kind(pol: Path) -> None:
    valid(pol)
    write(pol, "x.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nspec: {}\n")
    assert errors_of() == [
        'pol/x.yaml:1: apiVersion: must be runguard.io/v1, not "v1"',
        'pol/x.yaml:2: kind: "ConfigMap" is not one of RunPolicy, Profile, ProjectProfile, '
        "Platform",
    ]


def test_a_document_that_is_not_a_mapping(pol: Path) -> None:
    valid(pol)
    write(pol, "x.yaml", "- a\n- b\n")
    assert errors_of() == [
        "pol/x.yaml:1: a policy document must be a mapping (apiVersion, kind, ...)"
    ]


def test_duplicate_profile_names_report_both_locations(pol: Path) -> None:
    valid(pol)
    write(pol, "gpu.yaml", "# again\n" + PROFILE)
    assert errors_of() == [
        'pol/gpu.yaml:4: metadata.name: duplicate profile name "small" '
        "(also at pol/profiles.yaml:3)",
        'pol/profiles.yaml:3: metadata.name: duplicate profile name "small" '
        "(also at pol/gpu.yaml:4)",
    ]


def test_no_run_policy(pol: Path) -> None:
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == ["pol: no RunPolicy document (at least one is required)"]


def test_two_run_policies_with_one_name_report_both(pol: Path) -> None:
    """Several RunPolicies are tried in name order (docs/policy-reference.md): names must differ."""
    valid(pol)
    write(pol, "other.yaml", RUN_POLICY)
    assert errors_of() == [
        'pol/other.yaml:3: metadata.name: duplicate RunPolicy name "platform" (also at '
        "pol/runpolicy.yaml:2): RunPolicies are tried in name order",
        'pol/runpolicy.yaml:3: metadata.name: duplicate RunPolicy name "platform" (also at '
        "pol/other.yaml:2): RunPolicies are tried in name order",
    ]


def test_several_run_policies_load_in_name_order(pol: Path) -> None:
    valid(pol)
    write(pol, "builds.yaml", RUN_POLICY.replace("{name: platform}", "{name: builds}"))
    policy = load_policy("pol")
    assert [p.name for p in policy.run_policies] == ["builds", "platform"]
    assert policy.run_policies[1].profiles == policy.first.profiles  # profiles are shared


def test_several_run_policies_must_agree_on_gpu(pol: Path) -> None:
    valid(pol)
    other = RUN_POLICY.replace("{name: platform}", "{name: amd}").replace(
        "  resources:\n", "  resources:\n    gpuResourceName: amd.com/gpu\n"
    )
    write(pol, "amd.yaml", other)
    assert any("every RunPolicy must name the same gpu resource" in e for e in errors_of())


def test_default_profile_must_exist(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace("default: small", "default: medium"))
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        'pol/runpolicy.yaml:8: spec.profiles.default: profile "medium" is not defined '
        "(profiles: small)"
    ]


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("  enforcement: Block", "spec.enforcement", '"Block" is not one of Deny, Warn, Audit'),
        ("  enforcement: deny", "spec.enforcement", '"deny" is not one of Deny, Warn, Audit'),
        (
            "  security: {onRoot: Clamp}",
            "spec.security.onRoot",
            '"Clamp" is not one of Strip, Deny, Allow',
        ),
        (
            "  volumes: {onPreExisting: Keep}",
            "spec.volumes.onPreExisting",
            '"Keep" is not one of Strip, Deny',
        ),
        (
            "  secrets: {onForbidden: Allow}",
            "spec.secrets.onForbidden",
            '"Allow" is not one of Strip, Deny',
        ),
        (
            "  scheduling: {preemption: {default: maybe}}",
            "spec.scheduling.preemption.default",
            '"maybe" is not one of allow, constrain, prevent, none',
        ),
    ],
)
def test_unknown_enumeration_values(pol: Path, line: str, key: str, message: str) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + line + "\n")
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [f"pol/runpolicy.yaml:11: {key}: {message}"]


def test_on_exceed_values(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + "    onExceed: Strip\n")
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        'pol/runpolicy.yaml:11: spec.resources.onExceed: "Strip" is not one of Clamp, Deny'
    ]


def test_profile_over_the_maximums(pol: Path) -> None:
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
            requests: {cpu: "32", memory: 1Gi}
            limits:
              memory: 65Gi
              nvidia.com/gpu: 4
        """,
    )
    assert errors_of() == [
        'pol/profiles.yaml:6: spec.resources.requests.cpu: "32" is above the maximum "16" '
        "(pol/runpolicy.yaml:10)",
        'pol/profiles.yaml:8: spec.resources.limits.memory: "65Gi" is above the maximum '
        '"64Gi" (pol/runpolicy.yaml:10)',
        'pol/profiles.yaml:9: spec.resources.limits["nvidia.com/gpu"]: 4 is above the '
        'maximum "2" (pol/runpolicy.yaml:10)',
    ]


def test_gpu_and_its_resource_name_in_one_list(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    write(pol, "profiles.yaml", PROFILE.replace("memory: 1Gi", 'gpu: "1", nvidia.com/gpu: 1'))
    assert errors_of() == [
        'pol/profiles.yaml:6: spec.resources.requests["nvidia.com/gpu"]: "gpu" and '
        '"nvidia.com/gpu" name the same resource; keep one'
    ]


def test_invalid_label_keys(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY.replace("label: dhcore/template", "label: dhcore/tem/plate").replace(
            "key: dhcore/run", "key: -run"
        ),
    )
    write(pol, "profiles.yaml", PROFILE + "  nodeSelector: {Example.com/gpu: a100}\n")
    assert errors_of() == [
        'pol/profiles.yaml:7: spec.nodeSelector["Example.com/gpu"]: invalid label key '
        '"Example.com/gpu": the prefix must be a DNS subdomain (lowercase letters, digits, '
        '"-" and ".")',
        'pol/runpolicy.yaml:7: spec.selector.matchExpressions[0].key: invalid label key "-run": '
        'the name must be at most 63 letters, digits, "-", "_" or ".", starting and ending '
        "with a letter or digit",
        'pol/runpolicy.yaml:8: spec.profiles.label: invalid label key "dhcore/tem/plate": '
        'at most one "/"',
    ]


def test_invalid_label_value_and_profile_name(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY.replace("managed-by: dhcore", "managed-by: dh core"))
    write(pol, "profiles.yaml", PROFILE.replace("name: small", "name: small gpu"))
    errors = errors_of()
    assert errors[0].startswith('pol/profiles.yaml:3: metadata.name: invalid label value "small')
    assert errors[1].startswith(
        'pol/runpolicy.yaml:6: spec.selector.matchLabels["app.kubernetes.io/managed-by"]: '
        'invalid label value "dh core"'
    )


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (
            "v-{labels[dhcore/run}-*",
            'pattern "v-{labels[dhcore/run}-*": a brace must be part of a placeholder '
            "{labels[KEY]}",
        ),
        (
            "v-{label[dhcore/run]}",
            'pattern "v-{label[dhcore/run]}": a brace must be part of a placeholder {labels[KEY]}',
        ),
        (
            "V_*",
            'pattern "V_*" can never match a Kubernetes name (only lowercase letters, digits, '
            '"-", "." and "*" besides {labels[KEY]})',
        ),
        (
            "v-{labels[a/b/c]}",
            'pattern "v-{labels[a/b/c]}": invalid label key "a/b/c": at most one "/"',
        ),
        ("", "an empty pattern matches no name"),
    ],
)
def test_invalid_name_patterns(pol: Path, pattern: str, message: str) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + f"  secrets:\n    allowed: ['{pattern}']\n")
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [f"pol/runpolicy.yaml:12: spec.secrets.allowed[0]: {message}"]


def test_duplicate_keys_in_a_mapping(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY + "  enforcement: Deny\n  enforcement: Warn\n")
    write(pol, "profiles.yaml", PROFILE + "  description: a\n  description: b\n")
    assert errors_of() == [
        "pol/profiles.yaml:8: spec.description: duplicate key (first at line 7)",
        "pol/runpolicy.yaml:12: spec.enforcement: duplicate key (first at line 11)",
    ]


def test_toleration_and_affinity_shapes(pol: Path) -> None:
    write(pol, "runpolicy.yaml", RUN_POLICY)
    write(
        pol,
        "profiles.yaml",
        PROFILE
        + "  tolerations: [{key: nvidia.com/gpu, operator: Exists, value: x, effect: Never}]\n"
        + "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {}}}\n"
        + "  env: [{value: x}]\n",
    )
    assert errors_of() == [
        'pol/profiles.yaml:7: spec.tolerations[0].effect: "Never" is not one of NoSchedule, '
        "PreferNoSchedule, NoExecute",
        'pol/profiles.yaml:7: spec.tolerations[0].value: must be empty with operator "Exists"',
        "pol/profiles.yaml:8: spec.affinity.nodeAffinity."
        "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: "
        "required key is missing",
        "pol/profiles.yaml:9: spec.env[0].name: required key is missing",
    ]


def test_cross_document_consistency(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY
        + "    memoryLimitFactor: .nan\n"
        + "  scheduling:\n"
        + "    priorityClasses: {default: medium, allowed: [low, high]}\n",
    )
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        "pol/runpolicy.yaml:11: spec.resources.memoryLimitFactor: must be a finite number",
        'pol/runpolicy.yaml:13: spec.scheduling.priorityClasses.default: "medium" is not in '
        "the allowed priority classes (low, high)",
    ]


# --- all at once, never a traceback -------------------------------------------------


def test_all_errors_are_reported_at_once(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY.replace("default: small", "default: gone").replace('"16"', "lots")
        + "  enforcement: Block\n",
    )
    write(pol, "profiles.yaml", PROFILE + "  colour: blue\n---\n" + PROFILE)
    write(pol, "broken.yaml", "a: [\n")
    errors = errors_of()
    # the parser's own words after runguard's prefix are the library's, not asserted
    assert errors[0].startswith("pol/broken.yaml:2: YAML syntax error: ")
    assert errors[1:] == [
        'pol/profiles.yaml:3: metadata.name: duplicate profile name "small" '
        "(also at pol/profiles.yaml:11)",
        'pol/profiles.yaml:7: spec.colour: unknown key "colour" '
        f"(expected one of {keys_of(ProfileSpec)})",
        'pol/profiles.yaml:11: metadata.name: duplicate profile name "small" '
        "(also at pol/profiles.yaml:3)",
        'pol/runpolicy.yaml:8: spec.profiles.default: profile "gone" is not defined '
        "(profiles: small)",
        'pol/runpolicy.yaml:10: spec.resources.maximums.cpu: "lots" is not a quantity',
        'pol/runpolicy.yaml:11: spec.enforcement: "Block" is not one of Deny, Warn, Audit',
    ]


@pytest.mark.parametrize(
    "text",
    [
        "just a string\n",
        "42\n",
        "a: !!binary aGk=\nb: !custom x\n",
        "a: &x [*x]\n",
        "? [complex, key]\n: v\n",
        "a:\n\tb: 1\n",
        "kind: RunPolicy\nspec: 3\n",
        "kind: Profile\nmetadata: []\nspec: {resources: {requests: 5}}\n",
        "kind: RunPolicy\nmetadata: {name: x}\nspec: {resources: {maximums: [1]}}\n",
        "kind: RunPolicy\nspec: {profiles: {default: 7}, scheduling: {priorityClasses: []}}\n",
        "\x00\x01",
        "<<: 5\n",
        "date: 2024-01-01\nkind: Profile\n",
    ],
)
def test_malformed_input_is_a_policy_error(pol: Path, text: str) -> None:
    write(pol, "x.yaml", text)
    errors = errors_of()
    assert errors
    assert all(e.startswith("pol") for e in errors)


def test_undecodable_and_unreadable_files(pol: Path) -> None:
    valid(pol)
    (pol / "latin1.yaml").write_bytes(b"description: caf\xe9\n")
    os.symlink("missing.yaml", pol / "dangling.yaml")
    errors = errors_of()
    assert errors == [
        "pol/dangling.yaml: cannot read: broken symlink or file removed",
        "pol/latin1.yaml: not UTF-8 text (invalid continuation byte)",
    ]


def test_missing_or_empty_directory(pol: Path) -> None:
    assert errors_of("nowhere") == ["nowhere: policy directory does not exist"]
    assert errors_of("pol") == ["pol: no policy files (*.yaml, *.yml)"]
    write(pol, "only-comments.yaml", "# nothing yet\n")
    assert errors_of("pol") == ["pol: no RunPolicy document (at least one is required)"]


def test_alias_bomb_is_refused_quickly(pol: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    write(pol, "bomb.yaml", "\n".join(lines) + "\n")
    bomb = "pol/bomb.yaml:4: aliases expand to more than 10000 values (an alias bomb?)"
    assert bomb in errors_of()


def test_read_policy_never_raises_and_keeps_documents(pol: Path) -> None:
    valid(pol)
    write(pol, "bad.yaml", "kind: Profile\n")
    source = read_policy("pol")
    assert source.policy is None
    assert [d.kind for d in source.documents] == ["Profile", "Profile", "RunPolicy"]
    assert source.errors


# --- issues --------------------------------------------------------------------------


def test_issue_formatting() -> None:
    assert str(PolicyIssue("p/a.yaml", 3, "spec.x", "bad")) == "p/a.yaml:3: spec.x: bad"
    assert str(PolicyIssue("p/a.yaml", 3, "", "bad")) == "p/a.yaml:3: bad"
    assert str(PolicyIssue("p", None, "", "empty")) == "p: empty"
    error = PolicyError([PolicyIssue("a", 1, "k", "m"), PolicyIssue("b", 2, "", "n")])
    assert str(error) == "a:1: k: m\nb:2: n"


# --- the published schema ----------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    schema = policy_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_published_schema_file_is_up_to_date() -> None:
    published = REPO / "webhook" / "policy" / "runguard.schema.json"
    assert json.loads(published.read_text(encoding="utf-8")) == policy_schema()


def test_every_schema_property_has_a_description() -> None:
    def walk(node: object, where: str) -> list[str]:
        missing = []
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and "description" not in sub:
                    missing.append(f"{where}.{name}")
            for key, sub in node.items():
                missing += walk(sub, f"{where}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                missing += walk(sub, f"{where}[{i}]")
        return missing

    # Subschemas under if/then only narrow a property already described elsewhere.
    missing = walk(policy_schema(), "")
    assert [m for m in missing if ".then." not in m and ".if." not in m] == []


def test_shipped_policies_validate_against_the_plain_schema() -> None:
    # What an editor does: plain jsonschema, no runguard formats.
    check = Draft202012Validator(policy_schema())
    for path in [*REPO.glob("policies/*.yaml"), *REPO.glob("policies/examples/*/*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert list(check.iter_errors(doc)) == [], path


def test_plain_schema_catches_a_bad_quantity_for_editors() -> None:
    check = Draft202012Validator(policy_schema())
    doc = yaml.safe_load(RUN_POLICY.replace('"16"', "lots"))
    assert [e.validator for e in check.iter_errors(doc)] == ["pattern"]


def test_schema_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == policy_schema()
    out = tmp_path / "schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == policy_schema()
    assert main(["schema", "-o", str(tmp_path / "no" / "such" / "dir.json")]) == 2


def test_a_shared_configmap_is_neither_the_platforms_nor_per_run(pol: Path) -> None:
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY
        + """\
  volumes:
    platformConfigMaps: ["init-{labels[dhcore/run]}", "istio-*"]
    sharedConfigMaps: [kube-root-ca.crt, istio-ca-root-cert, "ca-{labels[dhcore/run]}"]
  platform:
    operators:
      - identity: system:serviceaccount:mpi:mpi-operator
        kinds: [kubeflow.org/MPIJob]
        configMaps: ["*-config"]
""",
    )
    write(pol, "profiles.yaml", PROFILE)
    assert errors_of() == [
        'pol/runpolicy.yaml:13: spec.volumes.sharedConfigMaps[1]: "istio-ca-root-cert" is '
        'also a name of "istio-*" (line 12): a ConfigMap is either shared with every Pod or '
        "the platform's, not both",
        'pol/runpolicy.yaml:13: spec.volumes.sharedConfigMaps[2]: "ca-{labels[dhcore/run]}": '
        "a shared ConfigMap is the same for every Pod; a label placeholder has no place here",
    ]
    write(
        pol,
        "runpolicy.yaml",
        RUN_POLICY + "  volumes:\n    sharedConfigMaps: [mesh-config]\n"
        "  platform:\n    operators:\n      - identity: mpi\n        kinds: [kubeflow.org/MPIJob]\n"
        '        configMaps: ["*-config"]\n',
    )
    assert errors_of() == [
        'pol/runpolicy.yaml:12: spec.volumes.sharedConfigMaps[0]: "mesh-config" is also a '
        'name of "*-config" (line 17): a ConfigMap is either shared with every Pod or the '
        "platform's, not both"
    ]


def test_device_families_names_differ_and_profiles_stay_within(pol: Path) -> None:
    families = (
        "    families:\n"
        "      - {name: nvidia, max: 1, members: {nvidia.com/gpu: 1, 'nvidia.com/mig-*': 0.5}}\n"
        "      - {name: nvidia, max: 2, members: {nvidia.com/gpu: 1}}\n"
    )
    write(pol, "runpolicy.yaml", RUN_POLICY + families)
    write(
        pol,
        "profiles.yaml",
        PROFILE + "    limits: {nvidia.com/mig-3g.40gb: '3'}\n",
    )
    assert errors_of() == [
        "pol/profiles.yaml:7: spec.resources.limits: counts 1.5 of device family nvidia, above "
        "its maximum 1 (pol/runpolicy.yaml:12)",
        'pol/runpolicy.yaml:13: spec.resources.families[1].name: duplicate family name "nvidia" '
        "(also at line 12)",
    ]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ('{countsAs: "nvidia.com/mig-{value}"}', "countsAs: {value} needs attribute"),
        ("{countsAs: gpu, attribute: gpu.nvidia.com/profile}", "attribute is read only for"),
        ('{countsAs: "a.b/{value}-{value}", attribute: a.b/c}', "{value} at most once"),
        ("{countsAs: gpu, allocationMode: All}", "allocationMode"),
    ],
)
def test_a_device_class_that_cannot_count_is_an_error(pol: Path, config: str, said: str) -> None:
    write(
        pol,
        "runpolicy.yaml",
        f"""\
        apiVersion: runguard.io/v1
        kind: RunPolicy
        metadata: {{name: platform}}
        spec:
          selector: {{matchLabels: {{app: x}}}}
          resources:
            deviceClasses:
              mig.nvidia.com: {config}
        """,
    )
    (error,) = errors_of()
    assert error.startswith('pol/runpolicy.yaml:8: spec.resources.deviceClasses["mig.nvidia.com"]')
    assert said in error
