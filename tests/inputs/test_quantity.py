"""``webhook.inputs.quantity.parse_quantity`` is the kubernetes client's ``parse_quantity``,
kept in runguard so that the engine imports no kubernetes client: the same value, or
the same refusal, for every string."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from webhook.inputs.quantity import parse_quantity

SUFFIXES = ["", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti"]
SUFFIXES += ["Pi", "Ei", "ki", "mi", "ni", "ui", "i", "Q", "MM", "e3", "E3"]
quantities = st.one_of(
    st.builds(
        "{}{}".format,
        st.from_regex(r"\A[-+]?[0-9]{0,6}(\.[0-9]{0,4})?([eE][-+]?[0-9]{1,3})?\Z"),
        st.sampled_from(SUFFIXES),
    ),
    st.text(alphabet="0123456789.+-eEinumkKMGTPQ ", max_size=8),
    st.sampled_from(["", "NaN", "Infinity", "-inf", "1e999999999G", "9" * 40 + "Ei", "0x10"]),
)


def outcome(parse: object, text: object) -> tuple[str, str]:
    try:
        value = parse(text)  # type: ignore[operator]
    except ValueError:
        return ("refused", "")
    assert isinstance(value, Decimal)
    return ("value", str(value))


@settings(max_examples=600, derandomize=True, database=None, deadline=None)
@given(text=quantities)
def test_the_same_value_or_refusal_as_the_kubernetes_client(text: str) -> None:
    assert outcome(parse_quantity, text) == outcome(client_parse_quantity, text)


def test_numbers_and_known_quantities() -> None:
    for value in (2, 0.5, Decimal("1.5"), "500m", "32Gi", "1e3", "1.5k", "-3Mi"):
        assert outcome(parse_quantity, value) == outcome(client_parse_quantity, value)
    assert parse_quantity("32Gi") == 32 * 1024**3
