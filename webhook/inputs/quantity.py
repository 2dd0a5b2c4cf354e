"""Kubernetes quantities: parsing (cached) and rendering.

Parsing is ``kubernetes.utils.parse_quantity``; the cache matters because the same few
strings ("500m", "32Gi") are parsed on every review.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity

__all__ = ["QuantityError", "parse", "is_quantity", "format_bytes_ceil_mi"]


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


@lru_cache(maxsize=4096)
def _parse_str(text: str) -> Decimal:
    try:
        value = parse_quantity(text)  # type: ignore[no-untyped-call]
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
