"""The policy model: one declaration per key, and the Policy the engine reads built from it."""

from __future__ import annotations

import pickle
from decimal import Decimal
from typing import Any

import pytest
from harness import REPO
from pydantic import ValidationError

from webhook.policy.declare import Section, iter_keys, key_path, section_of
from webhook.policy.formats import NAME_PATTERN
from webhook.policy.loader import load_policy
from webhook.policy.model import (
    KINDS,
    NamePattern,
    RunPolicy,
    RunPolicySpec,
    build_run_policy,
    gpu_resource_name,
)
from webhook.policy.patterns import label_keys, split
from webhook.policy.schema import policy_schema

RUN_POLICY: dict[str, Any] = {
    "apiVersion": "runguard.io/v1",
    "kind": "RunPolicy",
    "metadata": {"name": "p"},
    "spec": {
        "selector": {"matchLabels": {"a": "b"}},
        "resources": {
            "gpuResourceName": "amd.com/gpu",
            "maximums": {"cpu": "4", "gpu": 2},
            "defaults": {"requests": {"gpu": "0"}},
        },
        "secrets": {"allowed": ["sec-{labels[run]}-*"]},
    },
}
PROFILE: dict[str, Any] = {
    "apiVersion": "runguard.io/v1",
    "kind": "Profile",
    "metadata": {"name": "gpu"},
    "spec": {"resources": {"requests": {"gpu": "1"}, "limits": {"gpu": "1"}}, "affinity": {}},
}


def sections() -> list[type[Section]]:
    found: list[type[Section]] = []
    for spec, _ in KINDS.values():
        found.append(spec)
        found += [s for key in iter_keys(spec) if (s := section_of(key.field.annotation))]
    return found


def as_json(value: Any) -> Any:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return [as_json(v) for v in value]
    if isinstance(value, NamePattern):
        return value.text
    return value


def test_every_key_has_a_description() -> None:
    for section in sections():
        for name, field in section.model_fields.items():
            held = section_of(field.annotation)  # a section: its docstring, if not the field's
            assert field.description or (held and held.__doc__), f"{section.__name__}.{name}"


def test_the_defaults_a_policy_gets_are_the_ones_the_schema_publishes() -> None:
    """One statement of each default: an empty spec builds to the schema's defaults."""
    policy = build_run_policy({"spec": {}}, [])
    defs = policy_schema()["$defs"]
    checked = 0
    for key in iter_keys(RunPolicySpec):
        prop = defs[key.owner.__name__]["properties"][key.path[-1]]
        if "default" not in prop:
            continue
        owner: Any = policy
        for step in key.path[:-1]:
            owner = next(
                getattr(owner, n)
                for n, f in type(owner).model_fields.items()
                if (f.alias or n) == step
            )
            if owner is None:  # a section off by default (preemption)
                break
        if owner is None:
            continue
        assert as_json(getattr(owner, key.name)) == prop["default"], key.path
        checked += 1
    assert checked >= 15
    assert "hostPath" not in policy.volumes.allowed_types
    assert policy.volumes.allowed_types >= {"persistentVolumeClaim", "emptyDir", "projected"}


def test_gpu_is_resolved_everywhere_and_maximums_parsed_once() -> None:
    policy = build_run_policy(RUN_POLICY, [PROFILE])
    assert policy.resources.maximums == {"cpu": "4", "amd.com/gpu": "2"}
    assert policy.resources.maximum_values == {"cpu": Decimal(4), "amd.com/gpu": Decimal(2)}
    assert policy.resources.default_requests == {"amd.com/gpu": "0"}
    assert policy.profiles["gpu"].requests == {"amd.com/gpu": "1"}
    assert policy.profiles["gpu"].affinity is None  # {} sets nothing
    assert gpu_resource_name(RUN_POLICY["spec"]) == "amd.com/gpu"
    assert gpu_resource_name({"resources": 3}) == "nvidia.com/gpu"


def test_derived_values_are_plain_attributes_computed_at_build() -> None:
    policy = load_policy(REPO / "policies")
    for derived in ("maximum_values", "default_requests", "default_limits"):
        assert derived in vars(policy.first.resources)
    assert "allowed_priority_classes" in vars(policy.first.scheduling)


def test_a_policy_survives_pickling_as_the_master_publishes_it() -> None:
    policy = build_run_policy(RUN_POLICY, [PROFILE])
    again = pickle.loads(pickle.dumps(policy, pickle.HIGHEST_PROTOCOL))
    assert again == policy
    assert again.resources.maximum_values == policy.resources.maximum_values
    labels = {"run": "r1"}
    assert again.secrets.allowed[0].matches("sec-r1-db", labels)


def test_model_copy_recomputes_what_derives_from_the_updated_fields() -> None:
    resources = build_run_policy(RUN_POLICY, []).resources
    copied = resources.model_copy(update={"maximums": {"cpu": "8"}})
    assert copied.maximum_values == {"cpu": Decimal(8)}
    assert resources.maximum_values["cpu"] == Decimal(4)


def test_a_policy_is_frozen() -> None:
    policy = build_run_policy(RUN_POLICY, [])
    with pytest.raises(ValidationError):
        policy.enforcement = "Warn"  # type: ignore[misc]


def test_build_policy_refuses_what_the_schema_refuses() -> None:
    bad = {**RUN_POLICY, "spec": {**RUN_POLICY["spec"], "enforcement": "Block", "colour": 1}}
    with pytest.raises(ValidationError) as info:
        build_run_policy(bad, [])
    assert {e["loc"][-1] for e in info.value.errors()} == {"enforcement", "colour"}
    with pytest.raises(ValidationError):
        build_run_policy({"spec": {"secrets": {"allowed": ["V_*"]}}}, [])


def test_key_paths_are_the_yaml_names_of_attributes() -> None:
    assert key_path(RunPolicySpec, "profiles_config", "default") == ("profiles", "default")
    assert key_path(RunPolicySpec, "scheduling", "priority_classes", "allowed") == (
        "scheduling",
        "priorityClasses",
        "allowed",
    )
    with pytest.raises(KeyError):
        key_path(RunPolicySpec, "security", "no_such_key")
    patterns = [k.path for k in iter_keys(RunPolicySpec) if k.uses(NAME_PATTERN)]
    assert patterns == [
        ("resources", "platformDeviceClaims"),
        ("volumes", "platformClaims"),
        ("volumes", "platformConfigMaps"),
        ("volumes", "sharedConfigMaps"),
        ("secrets", "allowed"),
    ]


def test_the_placeholder_grammar_is_one() -> None:
    assert split("v-{labels[dhcore/run]}-*") == (["v-", "-*"], ["dhcore/run"])
    assert label_keys("{labels[a]}{labels[b]}") == ["a", "b"]
    pattern = NamePattern.compile("v-{labels[run]}-*")
    assert pattern.matches("v-r.1-data", {"run": "r.1"})
    assert not pattern.matches("v-rx1-data", {"run": "r.1"})  # the value is literal
    assert not pattern.matches("v--data", {})


def test_policy_keeps_the_engine_attributes() -> None:
    policy = build_run_policy(RUN_POLICY, [PROFILE])
    assert isinstance(policy, RunPolicy)
    assert policy.name == "p" and len(policy.digest) == 16
    assert policy.selector.matches({"a": "b"}) and policy.selector.to_dict() == {
        "matchLabels": {"a": "b"}
    }
    assert policy.profiles_config.label == "runguard.io/profile"
    assert policy.security.drop_capabilities == ("ALL",)
    assert policy.scheduling.preemption is None


def test_a_name_pattern_matches_as_its_escaped_regex_would() -> None:
    """``NamePattern.matches`` globs without compiling a regex per label value; it says
    what the escaped regex says, for every pattern, label value (``*`` in a value is a
    literal) and name a small alphabet makes."""
    import random

    from webhook.policy.patterns import NamePattern, _regex

    rng = random.Random(7)

    def word(alphabet: str, low: int, high: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))

    for _ in range(20000):
        keys = rng.randint(0, 2)
        text = word("ab-*.", 0, 4) + "".join(
            f"{{labels[k{i}]}}" + word("ab-*.", 0, 4) for i in range(keys)
        )
        labels = {f"k{i}": word("ab-*", 1, 3) for i in range(keys)}
        name = word("ab-.*", 0, 8)
        values = tuple(labels[f"k{i}"] for i in range(keys))
        expected = _regex(text, values).fullmatch(name) is not None
        assert NamePattern.compile(text).matches(name, labels) == expected, (text, labels, name)
