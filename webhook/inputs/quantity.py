"""Kubernetes quantities: parsing (cached) and rendering.

Parsing is the kubernetes client's ``kubernetes.utils.quantity.parse_quantity``, kept
here as ``parse_quantity`` (Apache-2.0, The Kubernetes Authors) so that the engine loads
no kubernetes client (``import kubernetes`` costs 0.3 s and the HTTP stack);
``tests/inputs/test_quantity.py`` holds it equal to the client's. The cache matters because the
same few strings ("500m", "32Gi") are parsed on every review.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, DecimalException, InvalidOperation
from functools import lru_cache

__all__ = ["QuantityError", "parse", "is_quantity", "format_bytes_ceil_mi"]


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


@lru_cache(maxsize=4096)
def _parse_str(text: str) -> Decimal:
    try:
        value = parse_quantity(text)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise QuantityError(f"{text!r} is not a quantity") from exc
    if not isinstance(value, Decimal) or not value.is_finite():
        raise QuantityError(f"{text!r} is not a quantity")
    if value and value.adjusted() > _MAX_EXPONENT:
        # No resource comes near; arithmetic on such a value (x memoryLimitFactor) would
        # otherwise fail deep in a step instead of being named here as bad input.
        raise QuantityError(f"{text[:40]!r} is out of range (above 1e{_MAX_EXPONENT})")
    return value


_MAX_EXPONENT = 30

# kubernetes.utils.quantity's (v37.0.2), unchanged but for types and names
_EXPONENTS = {"n": -3, "u": -2, "m": -1, "K": 1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_BINARY_PREFIXES = "KMGTPE"  # only these exist in base 1024 (Ki, Mi, Gi, Ti, Pi, Ei)


def parse_quantity(quantity: object) -> Decimal:
    """A quantity (``200Mi``) as a Decimal; ValueError when it is none. The kubernetes
    client's function: base 1024 ``Ki Mi Gi Ti Pi Ei``, base 1000 ``n u m k M G T P E``."""
    if isinstance(quantity, int | float | Decimal):
        return Decimal(quantity)
    text = str(quantity)
    number, suffix = text, None
    if len(text) >= 2 and text[-1] == "i":
        if text[-2] in _EXPONENTS:
            number, suffix = text[:-2], text[-2:]
    elif len(text) >= 1 and text[-1] in _EXPONENTS:
        number, suffix = text[:-1], text[-1:]
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"Invalid number format: {number}") from None
    if suffix is None:
        return value
    if suffix.endswith("i"):
        # "ki", "mi", "ni" and "ui" are not binary suffixes
        if suffix[0] not in _BINARY_PREFIXES:
            raise ValueError(f"{text} has unknown suffix")
        base = 1024
    elif len(suffix) == 1:
        base = 1000
    else:
        raise ValueError(f"{text} has unknown suffix")
    if suffix[0] not in _EXPONENTS:
        raise ValueError(f"{text} has unknown suffix")
    exponent = Decimal(_EXPONENTS[suffix[0]])
    try:
        return value * (base**exponent)
    except DecimalException as exc:
        raise ValueError(f"Invalid quantity: {text}") from exc


_seen: dict[str, Decimal] = {}
# The strings parsed so far (every one a quantity), for a check that needs only to know
# that a string parses (``shape.Quantities``): a lookup here instead of a call.
PARSED: Mapping[str, Decimal] = _seen


def parse(value: object) -> Decimal:
    """Parse a quantity given as a string or a number (YAML ``cpu: 2``); raise QuantityError.

    A string seen before costs one lookup, the commonest call of a review: only strings
    are keys, and no other JSON value equals one (an unhashable value raises TypeError)."""
    try:
        return _seen[value]  # type: ignore[index]
    except (KeyError, TypeError):
        pass
    if type(value) is str:
        if len(_seen) < 4096:  # bounded: quantities come from users
            parsed = _seen[value] = _parse_str(value)
            return parsed
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise QuantityError(f"{type(value).__name__} is not a quantity")
    return _parse_str(value)


def is_quantity(value: object) -> bool:
    try:
        parse(value)
    except QuantityError:
        return False
    return True


_MI = Decimal(1024**2)
_GI = Decimal(1024**3)


def format_bytes_ceil_mi(value: Decimal) -> str:
    """Render a byte count rounded up to a whole Mi, as ``NGi`` when exact, else ``NMi``."""
    mebibytes = (value / _MI).to_integral_value(rounding=ROUND_CEILING)
    if mebibytes <= 0:
        return "0"
    if mebibytes % 1024 == 0:
        return f"{int(mebibytes // 1024)}Gi"
    return f"{int(mebibytes)}Mi"
