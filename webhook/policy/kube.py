"""Kubernetes objects that policies contain: resource lists, selectors, tolerations, affinity, env.

These are Kubernetes' shapes, declared here as far as runguard checks them (the JSON
Schema is generated from them). Pods get tolerations, affinities and env vars exactly
as the admin wrote them, so the policy keeps those as plain dicts (``AsWritten``);
``LabelSelector`` is the one the engine matches pods with.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationInfo,
)
from pydantic_core import core_schema

from webhook.inputs.quantity import parse
from webhook.policy.declare import AsWritten, Section, Shape
from webhook.policy.formats import (
    DEFS,
    QUANTITY,
    REF,
    RESOURCE_NAME,
    LabelKey,
    LabelMap,
    LabelValue,
    Quantity,
)

__all__ = [
    "RESOURCE_LIST",
    "RESOURCE_RANGE_LIST",
    "AffinityDict",
    "EnvVarDict",
    "LabelSelector",
    "Metadata",
    "QuantityRange",
    "ResourceList",
    "ResourceRangeList",
    "ProfileResources",
    "ResourceRequirements",
    "TolerationDict",
    "resolve_resource_name",
]


def resolve_resource_name(name: str, gpu_resource_name: str) -> str:
    """Policy files say ``gpu`` for the cluster's gpu resource (``nvidia.com/gpu``)."""
    return gpu_resource_name if name == "gpu" else name


class _ResourceListType:
    """A resource list: resource name -> quantity text, ``gpu`` resolved.

    The gpu resource name comes from the validation context (``{"gpu": name}``, given by
    ``build_run_policy``): profiles say ``gpu`` for the RunPolicy's ``gpuResourceName``.
    """

    ref = "resourceList"

    def definition(self) -> dict[str, Any]:
        quantity = {"$ref": DEFS + QUANTITY.ref}
        return {
            "type": "object",
            "description": (
                "Resource name to quantity. `gpu` means the cluster's gpu resource "
                "(`resources.gpuResourceName`); extended resources are written domain/name."
            ),
            "properties": {
                "cpu": {**quantity, "description": "CPU cores: 500m, 2, 0.5."},
                "memory": {**quantity, "description": "Memory bytes: 256Mi, 32Gi, 1G."},
                "gpu": {
                    **quantity,
                    "description": "GPUs, counted in `resources.gpuResourceName`: 1, 2.",
                },
                "ephemeral-storage": {**quantity, "description": "Local disk: 10Gi."},
            },
            "patternProperties": {"^hugepages-": quantity, "/": quantity},
            "propertyNames": {
                "description": (
                    "cpu, memory, gpu, ephemeral-storage, hugepages-SIZE or domain/name."
                ),
                "if": {"pattern": "/"},
                "then": {"$ref": DEFS + RESOURCE_NAME.ref},
            },
            "additionalProperties": False,
        }

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        values = core_schema.dict_schema(
            core_schema.str_schema(), handler.generate_schema(Quantity)
        )
        return core_schema.with_info_after_validator_function(_resolve_gpu, values)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {REF: self.ref}


def _resolve_gpu(values: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    gpu = (info.context or {}).get("gpu")
    if gpu is None or "gpu" not in values:
        return values
    return {resolve_resource_name(k, gpu): v for k, v in values.items()}


RESOURCE_LIST = _ResourceListType()
ResourceList = Annotated[Mapping[str, str], RESOURCE_LIST]


class QuantityRange(Shape):
    """What a run may ask for of one resource: kept inside ``min``..``max``, ``default``
    when it asks for nothing."""

    min: Quantity = Field(description="The least a run may ask for.")
    default: Quantity = Field(description="What a run asking for nothing gets.")
    max: Quantity = Field(description="The most a run may ask for.")

    @cached_property
    def amounts(self) -> tuple[Decimal, Decimal, Decimal]:
        """min, default and max, parsed."""
        return parse(self.min), parse(self.default), parse(self.max)

    def model_post_init(self, context: Any) -> None:
        low, default, high = self.amounts
        if not low <= default <= high:
            raise ValueError(
                f"needs min <= default <= max, not {self.min}, {self.default}, {self.max}"
            )


class _ResourceRangeListType(_ResourceListType):
    """A profile's resource list: resource name -> a quantity (exactly that) or a range
    (``{min, default, max}``), ``gpu`` resolved."""

    ref = "resourceRangeList"

    def definition(self) -> dict[str, Any]:
        quantity = {"$ref": DEFS + QUANTITY.ref}
        either = {
            "anyOf": [
                quantity,
                {
                    "type": "object",
                    "description": "A range a run picks from.",
                    "properties": {
                        name: {**quantity, "description": field.description}
                        for name, field in QuantityRange.model_fields.items()
                    },
                    "required": ["min", "default", "max"],
                    "additionalProperties": False,
                },
            ]
        }
        plain = super().definition()
        return {
            **plain,
            "description": (
                "Resource name to a quantity (exactly that) or a range {min, default, max} "
                "(min <= default <= max: a run's value inside is kept, none gets the default, "
                "one outside is clamped or denied as resources.onExceed says). `gpu` means "
                "the cluster's gpu resource (`resources.gpuResourceName`); extended resources "
                "are written domain/name."
            ),
            "properties": {
                name: {**either, "description": value["description"]}
                for name, value in plain["properties"].items()
            },
            "patternProperties": {key: either for key in plain["patternProperties"]},
        }

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        values = core_schema.dict_schema(
            core_schema.str_schema(),
            core_schema.union_schema(
                [handler.generate_schema(Quantity), handler.generate_schema(QuantityRange)]
            ),
        )
        return core_schema.with_info_after_validator_function(_resolve_gpu, values)


RESOURCE_RANGE_LIST = _ResourceRangeListType()
ResourceRangeList = Annotated[Mapping[str, str | QuantityRange], RESOURCE_RANGE_LIST]


class ResourceRequirements(Section):
    """Requests and limits, per resource name."""

    requests: ResourceList = Field(default_factory=dict, description="Requested resources.")
    limits: ResourceList = Field(default_factory=dict, description="Resource limits.")


class ProfileResources(Section):
    """Requests and limits, per resource name: each a quantity, or a range a run picks from."""

    requests: ResourceRangeList = Field(default_factory=dict, description="Requested resources.")
    limits: ResourceRangeList = Field(default_factory=dict, description="Resource limits.")


class LabelSelectorRequirement(Shape):
    """A label selector requirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
                    "then": {"required": ["values"], "properties": {"values": {"minItems": 1}}},
                },
                {
                    "if": {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}}},
                    "then": {"properties": {"values": {"maxItems": 0}}},
                },
            ]
        }
    )

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How key and values relate."
    )
    values: list[LabelValue] | None = Field(
        default=None, description="Values for In and NotIn; empty for Exists and DoesNotExist."
    )


RequirementDict = Annotated[dict[str, Any], AsWritten(LabelSelectorRequirement)]


class LabelSelector(Shape):
    """A Kubernetes LabelSelector."""

    match_labels: LabelMap = Field(default_factory=dict, description="Labels a Pod must carry.")
    match_expressions: tuple[RequirementDict, ...] = Field(
        default=(), description="Requirements a Pod's labels must meet (ANDed)."
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for expr in self.match_expressions:
            key, op = expr["key"], expr["operator"]
            values = expr.get("values") or []
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [dict(e) for e in self.match_expressions]
        return out


class Toleration(Shape):
    """A Kubernetes Toleration."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {
                        "properties": {"operator": {"const": "Exists"}},
                        "required": ["operator"],
                    },
                    "then": {"properties": {"value": {"const": ""}}},
                }
            ]
        }
    )

    key: LabelKey | None = Field(default=None, description="The taint key; empty with Exists: all.")
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Exists or Equal (default)."
    )
    value: str | None = Field(default=None, description="The taint value (Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty: all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="NoExecute only: how long the pod stays bound after the taint."
    )


Weight = Annotated[int, Field(ge=1, le=100)]


class NodeSelectorRequirement(Shape):
    """A node selector requirement."""

    key: str = Field(description="Node label key or field name.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How key and values relate."
    )
    values: list[str] | None = Field(default=None, description="Values to compare with.")


class NodeSelectorTerm(Shape):
    """A node selector term (its requirements are ANDed)."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, description="By node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, description="By node fields."
    )


class NodeSelector(Shape):
    """Node selector terms (ORed) that must hold."""

    node_selector_terms: list[NodeSelectorTerm] = Field(description="ORed terms.")


class PreferredSchedulingTerm(Shape):
    """A preferred node selector term."""

    weight: Weight = Field(description="1 to 100.")
    preference: NodeSelectorTerm = Field(description="Nodes preferred.")


class NodeAffinity(Shape):
    """Node affinity."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Node selector terms (ORed) that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(default=None, description="Terms preferred, by weight.")
    )


class PodAffinityTerm(Shape):
    """A pod (anti-)affinity term."""

    label_selector: LabelSelector | None = Field(default=None, description="Pods to (not) be near.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces whose pods labelSelector applies to."
    )
    namespaces: list[str] | None = Field(
        default=None, description="Namespaces the selector applies to."
    )
    topology_key: str = Field(description="Node label key defining the topology domain.")
    match_label_keys: list[str] | None = Field(
        default=None, description="Pod label keys merged into labelSelector."
    )
    mismatch_label_keys: list[str] | None = Field(
        default=None, description="Pod label keys negated into labelSelector."
    )


class WeightedPodAffinityTerm(Shape):
    """A preferred pod (anti-)affinity term."""

    weight: Weight = Field(description="Preference weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(Shape):
    """Pod (anti-)affinity."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, description="Terms that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(default=None, description="Terms preferred, by weight.")
    )


class Affinity(Shape):
    """A Kubernetes Affinity."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Near pods like these.")
    pod_anti_affinity: PodAffinity | None = Field(
        default=None, description="Away from pods like these."
    )


class ObjectFieldSelector(Shape):
    """A pod field."""

    field_path: str = Field(description="e.g. metadata.name")
    api_version: str | None = Field(default=None, description="Schema version of fieldPath.")


class ResourceFieldSelector(Shape):
    """A container resource."""

    resource: str = Field(description="e.g. limits.memory")
    container_name: str | None = Field(default=None, description="Container, for volumes.")
    divisor: Quantity | None = Field(default=None, description="Unit, e.g. 1Mi.")


class KeySelector(Shape):
    """A key of a ConfigMap or Secret."""

    name: str | None = Field(default=None, description="Object name.")
    key: str = Field(description="Key in the object.")
    optional: bool | None = Field(default=None, description="Whether the object may be missing.")


class EnvVarSource(Shape):
    """Where the value comes from."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A container resource."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap key.")
    secret_key_ref: KeySelector | None = Field(default=None, description="A Secret key.")


class EnvVar(Shape):
    """A container environment variable."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(
        default=None, description="Literal value (quote numbers and booleans)."
    )
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from.")


TolerationDict = Annotated[dict[str, Any], AsWritten(Toleration)]
AffinityDict = Annotated[dict[str, Any], AsWritten(Affinity)]
EnvVarDict = Annotated[dict[str, Any], AsWritten(EnvVar)]


class Metadata(Shape):
    """Document metadata."""

    name: str = Field(description="The document's name.")
    labels: LabelMap = Field(default_factory=dict, description="Free-form labels.")
    annotations: Mapping[LabelKey, str] = Field(
        default_factory=dict, description="Free-form annotations."
    )
