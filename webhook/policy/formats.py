"""Kubernetes strings in policies (quantities, label keys, names, patterns): a ``Format`` each.

A ``Format`` is declared once and serves everywhere: as ``Annotated`` metadata it makes
pydantic check (and convert) the value, and it is the JSON Schema definition
``$defs/<name>`` that keys of that type refer to. Its ``problem`` function is the exact
check behind the schema's custom ``format`` (``runguard`` checks it; editors, which ignore
unknown formats, get an approximate ``pattern``) and says what is wrong in words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from webhook.inputs.quantity import is_quantity, parse
from webhook.policy import patterns
from webhook.policy.patterns import NamePattern

if TYPE_CHECKING:  # jsonschema is the loader's, not the model's the engine reads
    from jsonschema import FormatChecker

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "FORMATS",
    "FORMAT_PROBLEMS",
    "LABEL_KEY",
    "LABEL_VALUE",
    "NAME_PATTERN",
    "QUANTITY",
    "RESOURCE_NAME",
    "DnsLabel",
    "DnsSubdomain",
    "Format",
    "HOST_PATH",
    "HOST_PATH_PLACEHOLDER",
    "HostPath",
    "LabelKey",
    "LabelMap",
    "LabelValue",
    "NamePatternText",
    "Quantity",
    "ResourceName",
    "format_checker",
    "quantity_problem",
]

DEFS = "#/$defs/"
# What a type's JSON Schema hook returns for "$ref: #/$defs/<name>": pydantic follows every
# "$ref" it sees into its own definitions, so ``schema.py`` writes these after it is done.
REF = "x-runguard-ref"

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_QUALIFIED_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(_DNS_SUBDOMAIN)
_NAME_PART_RE = re.compile(_QUALIFIED_NAME_PART)
_LABEL_VALUE_RE = re.compile(rf"({_QUALIFIED_NAME_PART})?")
# Kubernetes quantity grammar (apimachinery resource.Quantity), non-negative only.
_QUANTITY_RE = re.compile(
    r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?"
)


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


# --- the checks ------------------------------------------------------------------------


def quantity_problem(value: object) -> str | None:
    """Why ``value`` is not a non-negative Kubernetes quantity (``500m``, ``32Gi``, ``2``)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None  # the type keyword reports it
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a quantity"
    if isinstance(value, str) and not _QUANTITY_RE.fullmatch(value):
        if value.startswith("-") and is_quantity(value):
            return f"{_show(value)} is negative"
        return f"{_show(value)} is not a quantity"
    if not is_quantity(value):
        return f"{_show(value)} is not a quantity"
    if parse(value) < 0:
        return f"{_show(value)} is negative"
    return None


def dns_label_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 63 or not _DNS_LABEL_RE.fullmatch(value):
        return (
            f"{_show(value)} is not a valid name (at most 63 lowercase letters, digits "
            'and "-", starting and ending with a letter or digit)'
        )
    return None


def dns_subdomain_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(value):
        return (
            f"{_show(value)} is not a valid name (lowercase letters, digits, "
            '"-" and ".", starting and ending with a letter or digit)'
        )
    return None


def label_key_problem(value: object) -> str | None:
    """Why ``value`` is not a Kubernetes label/annotation key (``[prefix/]name``)."""
    if not isinstance(value, str):
        return None
    if value.count("/") > 1:
        return f'invalid label key {_show(value)}: at most one "/"'
    prefix, _, name = value.rpartition("/")
    if "/" in value and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return (
            f"invalid label key {_show(value)}: the prefix must be a DNS subdomain "
            '(lowercase letters, digits, "-" and ".")'
        )
    if not name or len(name) > 63 or not _NAME_PART_RE.fullmatch(name):
        return (
            f"invalid label key {_show(value)}: the name must be at most 63 letters, "
            'digits, "-", "_" or ".", starting and ending with a letter or digit'
        )
    return None


def label_value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (
            f"invalid label value {_show(value)}: at most 63 letters, digits, "
            '"-", "_" or ".", starting and ending with a letter or digit'
        )
    return None


def resource_name_problem(value: object) -> str | None:
    """Why ``value`` is not an extended resource name (``nvidia.com/gpu``)."""
    if not isinstance(value, str):
        return None
    prefix, slash, name = value.partition("/")
    if (
        not slash
        or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)
        or not _NAME_PART_RE.fullmatch(name)
        or len(name) > 63
    ):
        return f"{_show(value)} is not an extended resource name (domain/name, e.g. nvidia.com/gpu)"
    return None


def name_pattern_problem(value: object) -> str | None:
    return patterns.name_pattern_problem(value, label_key_problem)


HOST_PATH_PLACEHOLDER = "{namespace}"
_HOST_STEP = re.compile(r"([A-Za-z0-9._-]|\{namespace\})+")


def host_path_problem(value: object) -> str | None:
    """Why ``value`` is not one node directory: absolute, steps of letters, digits, "-",
    "_", "." (never "." or ".." alone) and ``{namespace}``, no trailing "/"."""
    if not isinstance(value, str):
        return None
    if not value.startswith("/") or value == "/":
        return f'"{value}" is not an absolute path below "/"'
    for step in value[1:].split("/"):
        if step in ("", ".", ".."):
            return f'"{value}": an empty, "." or ".." step (write the path itself)'
        if not _HOST_STEP.fullmatch(step):
            return (
                f'"{value}": only letters, digits, "-", "_", "." and {HOST_PATH_PLACEHOLDER} '
                "in a step (no wildcard: the exact path)"
            )
    return None


# --- Format: a check, a conversion and a schema definition ------------------------------


def _quantity_text(value: Any) -> str:
    return str(value)


@dataclass(frozen=True, eq=False)  # eq=False: hashable by identity, as Annotated metadata must be
class Format:
    """A Kubernetes string type: its JSON Schema ``format`` name, check, and ``$defs`` entry.

    ``convert`` turns a valid value into what the model keeps (a quantity's text, a
    compiled pattern); ``types`` are the JSON types accepted.
    """

    name: str  # the JSON Schema "format"
    ref: str  # its definition: $defs/<ref>
    description: str
    problem: Callable[[object], str | None]
    types: tuple[type, ...] = (str,)
    convert: Callable[[Any], Any] | None = None
    keywords: Mapping[str, Any] = field(default_factory=dict)  # approximations for editors

    def definition(self) -> dict[str, Any]:
        json_types = ["string" if t is str else "number" for t in self.types if t is not int]
        return {
            "type": json_types[0] if len(json_types) == 1 else json_types,
            "format": self.name,
            **self.keywords,
            "description": self.description,
        }

    def check(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, self.types):
            raise PydanticCustomError("format_type", "not a {format}", {"format": self.name})
        problem = self.problem(value)
        if problem:
            raise PydanticCustomError("format", "{problem}", {"problem": problem})
        return value if self.convert is None else self.convert(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # A plain str keeps the constraints written before the format (min_length).
        text = source is str and self.types == (str,)
        given = handler(source) if text else core_schema.any_schema()
        return core_schema.no_info_after_validator_function(self.check, given)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        constraints = {k: v for k, v in handler(schema).items() if k in _LENGTHS}
        return {REF: self.ref, **constraints}


_LENGTHS = ("minLength", "maxLength")


QUANTITY = Format(
    "quantity",
    "quantity",
    "A Kubernetes quantity: 500m, 2, 0.5, 32Gi, 1G, 1e3.",
    quantity_problem,
    types=(str, int, float),
    convert=_quantity_text,
    keywords={"pattern": _QUANTITY_RE.pattern.join("^$"), "minimum": 0},
)
LABEL_KEY = Format(
    "label-key",
    "labelKey",
    "A Kubernetes label key: [prefix/]name, e.g. dhcore/run.",
    label_key_problem,
    keywords={"pattern": rf"^({_DNS_SUBDOMAIN}/)?{_QUALIFIED_NAME_PART}$", "maxLength": 317},
)
LABEL_VALUE = Format(
    "label-value",
    "labelValue",
    "A Kubernetes label value.",
    label_value_problem,
    keywords={"pattern": rf"^({_QUALIFIED_NAME_PART})?$", "maxLength": 63},
)
DNS_LABEL = Format(
    "dns-label",
    "dnsLabel",
    "A Kubernetes name (RFC 1123 label): a namespace name.",
    dns_label_problem,
    keywords={"pattern": rf"^{_DNS_LABEL}$", "maxLength": 63},
)
DNS_SUBDOMAIN = Format(
    "dns-subdomain",
    "dnsSubdomain",
    "A Kubernetes object name (RFC 1123 subdomain).",
    dns_subdomain_problem,
    keywords={"pattern": rf"^{_DNS_SUBDOMAIN}$", "maxLength": 253},
)
RESOURCE_NAME = Format(
    "resource-name",
    "resourceName",
    "An extended resource name: domain/name, e.g. nvidia.com/gpu.",
    resource_name_problem,
)
NAME_PATTERN = Format(
    "name-pattern",
    "namePattern",
    "A name pattern: `*` matches any run of characters, `{labels[KEY]}` is the pod's value "
    "of label KEY (a pod lacking it matches nothing), e.g. `v-{labels[dhcore/run]}-*`.",
    name_pattern_problem,
    convert=NamePattern.compile,
    keywords={"minLength": 1},
)

HOST_PATH = Format(
    "host-path",
    "hostPath",
    "A node directory, exactly: an absolute path, `{namespace}` standing for the run's "
    "namespace, e.g. `/var/run/iguazio/dayman/{namespace}`.",
    host_path_problem,
    keywords={"pattern": r"^(/([A-Za-z0-9._-]|\{namespace\})+)+$", "maxLength": 4096},
)

FORMATS = (
    QUANTITY, LABEL_KEY, LABEL_VALUE, DNS_LABEL, DNS_SUBDOMAIN, RESOURCE_NAME, NAME_PATTERN,
    HOST_PATH,
)  # fmt: skip
FORMAT_PROBLEMS: dict[str, Callable[[object], str | None]] = {f.name: f.problem for f in FORMATS}

Quantity = Annotated[str, QUANTITY]  # kept as its text ("2", "500m"): parsed where compared
LabelKey = Annotated[str, LABEL_KEY]
LabelValue = Annotated[str, LABEL_VALUE]
LabelMap = Mapping[LabelKey, LabelValue]
DnsLabel = Annotated[str, DNS_LABEL]
DnsSubdomain = Annotated[str, DNS_SUBDOMAIN]
ResourceName = Annotated[str, RESOURCE_NAME]
NamePatternText = Annotated[NamePattern, NAME_PATTERN]
HostPath = Annotated[str, HOST_PATH]


def format_checker() -> FormatChecker:
    """A checker knowing only runguard's formats (the standard ones are not used)."""
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    for name, problem in FORMAT_PROBLEMS.items():
        checker.checks(name)(_is_ok(problem))
    return checker


def _is_ok(problem: Callable[[object], str | None]) -> Callable[[object], bool]:
    return lambda value: problem(value) is None
