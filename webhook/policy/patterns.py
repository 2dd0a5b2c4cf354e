"""Name patterns: ``*`` and ``{labels[KEY]}`` in a Kubernetes name; the one place of their grammar.

``split`` is the grammar: a pattern is literal text and placeholders. Everything else
reads patterns through it: ``NamePattern`` (what the engine matches names with),
``name_pattern_problem`` (the ``name-pattern`` format of the schema) and the lint rule
about labels a pattern uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property

__all__ = ["PLACEHOLDER", "NamePattern", "label_keys", "matches_any", "patterns_overlap", "split"]

PLACEHOLDER = re.compile(r"\{labels\[([^\]{}]*)\]\}")
_LITERAL = re.compile(r"[a-z0-9.*-]*")  # what can stand in a Kubernetes name, plus *


def split(text: str) -> tuple[list[str], list[str]]:
    """``(literals, keys)``: the text around placeholders, and each placeholder's label key.

    There is one more literal than keys: ``"v-{labels[run]}-*"`` -> ``(["v-", "-*"], ["run"])``.
    """
    literals: list[str] = []
    keys: list[str] = []
    pos = 0
    for match in PLACEHOLDER.finditer(text):
        literals.append(text[pos : match.start()])
        keys.append(match.group(1))
        pos = match.end()
    literals.append(text[pos:])
    return literals, keys


def label_keys(text: str) -> list[str]:
    """The label keys a pattern's placeholders name, in order."""
    return split(text)[1]


@dataclass(frozen=True)
class NamePattern:
    """A name pattern: ``*`` matches any run of characters, ``{labels[KEY]}`` the pod's label."""

    text: str
    label_keys: tuple[str, ...]

    @classmethod
    def compile(cls, text: str) -> NamePattern:
        return cls(text, tuple(label_keys(text)))

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when ``name`` matches; a pod lacking a label the pattern uses matches nothing."""
        keys = self.label_keys
        if not keys:
            return self._fixed.fullmatch(name) is not None
        if len(keys) == 1:  # the usual pattern, v-{labels[run]}-*: no tuple to build
            value = labels.get(keys[0])
            if not isinstance(value, str) or value == "":
                return False
            regex = self._by_value.get(value)
            if regex is None:
                regex = self._remember(value, (value,))
            return regex.fullmatch(name) is not None
        values = []
        for key in keys:
            value = labels.get(key)
            if not isinstance(value, str) or value == "":
                return False
            values.append(value)
        found = tuple(values)
        regex = self._by_value.get(found)
        if regex is None:
            regex = self._remember(found, found)
        return regex.fullmatch(name) is not None

    @cached_property
    def _fixed(self) -> re.Pattern[str]:
        """The regex of a pattern without placeholders, compiled once."""
        return _regex(self.text, ())

    @cached_property
    def _by_value(self) -> dict[str | tuple[str, ...], re.Pattern[str]]:
        """The regexes for label values seen (one value: the string, else the tuple), kept
        with the pattern, so that a review looks one up instead of hashing the text too."""
        return {}

    def _remember(self, key: str | tuple[str, ...], values: tuple[str, ...]) -> re.Pattern[str]:
        cache = self._by_value
        if len(cache) >= _CACHED_VALUES:  # label values are the user's: bounded
            cache.clear()
        regex = cache[key] = _regex(self.text, values)
        return regex


_CACHED_VALUES = 4096  # regexes kept per pattern, one per run (label value) seen


def _regex(text: str, label_values: tuple[str, ...]) -> re.Pattern[str]:
    """The regex of pattern ``text`` for given label values (one per placeholder, in order)."""
    literals, _ = split(text)
    regex = [_literal_regex(literals[0])]
    for value, literal in zip(label_values, literals[1:], strict=True):
        regex.append(re.escape(value))
        regex.append(_literal_regex(literal))
    return re.compile("".join(regex), re.DOTALL)


def _literal_regex(literal: str) -> str:
    return ".*".join(re.escape(chunk) for chunk in literal.split("*"))


def matches_any(patterns: tuple[NamePattern, ...], name: str, labels: Mapping[str, str]) -> bool:
    for pattern in patterns:  # a loop, not any(generator): this runs several times a review
        if pattern.matches(name, labels):
            return True
    return False


def name_pattern_problem(
    value: object, label_key_problem: Callable[[object], str | None]
) -> str | None:
    """Why ``value`` is not a name pattern (``*`` and ``{labels[KEY]}`` in a Kubernetes name)."""
    if not isinstance(value, str):
        return None
    if not value:
        return "an empty pattern matches no name"
    literals, keys = split(value)
    for key in keys:
        problem = label_key_problem(key)
        if problem:
            return f'pattern "{value}": {problem}'
    for part in literals:
        if "{" in part or "}" in part:
            return f'pattern "{value}": a brace must be part of a placeholder {{labels[KEY]}}'
        if not _LITERAL.fullmatch(part):
            return (
                f'pattern "{value}" can never match a Kubernetes name '
                '(only lowercase letters, digits, "-", "." and "*" besides {labels[KEY]})'
            )
    return None


def patterns_overlap(a: str, b: str) -> bool:
    """Whether some name matches both patterns, for some label values (a placeholder
    stands for any non-empty value, like ``*`` for any run of characters)."""
    x, y = _glob(a), _glob(b)

    @cache
    def meet(i: int, j: int) -> bool:
        if i == len(x) and j == len(y):
            return True
        if i < len(x) and x[i] is None:  # a's * takes nothing, or y's next character
            return meet(i + 1, j) or (j < len(y) and meet(i, j + 1))
        if j < len(y) and y[j] is None:
            return meet(i, j + 1) or (i < len(x) and meet(i + 1, j))
        return i < len(x) and j < len(y) and x[i] == y[j] and meet(i + 1, j + 1)

    return meet(0, 0)


def _glob(text: str) -> tuple[str | None, ...]:
    """A pattern as characters and ``None`` for each ``*`` or placeholder."""
    literals, _ = split(text)
    out: list[str | None] = []
    for n, literal in enumerate(literals):
        if n:
            out.append(None)
        out.extend(None if c == "*" else c for c in literal)
    return tuple(out)
