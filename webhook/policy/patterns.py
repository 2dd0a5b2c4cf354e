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
        """True when ``name`` matches; a pod lacking a label the pattern uses matches nothing.

        Matched as a glob, with no regex compiled per label value (each run brings a new
        one); a value holding ``*`` (not a valid label value, but ``/mutate`` sees objects
        before the apiserver validates them) is literal, through an escaped regex."""
        keys = self.label_keys
        if not keys:
            return _glob_match(name, self._parts)
        literals = self._literals
        if len(keys) == 1:  # the usual pattern, v-{labels[run]}-*: no list to build
            value = labels.get(keys[0])
            if not isinstance(value, str) or value == "":
                return False
            if "*" in value:
                return _regex(self.text, (value,)).fullmatch(name) is not None
            return _glob_match(name, (literals[0] + value + literals[1]).split("*"))
        values = []
        for key in keys:
            value = labels.get(key)
            if not isinstance(value, str) or value == "":
                return False
            values.append(value)
        if any("*" in value for value in values):
            return _regex(self.text, tuple(values)).fullmatch(name) is not None
        text = literals[0] + "".join(v + lit for v, lit in zip(values, literals[1:], strict=True))
        return _glob_match(name, text.split("*"))

    @cached_property
    def _parts(self) -> list[str]:
        """A pattern without placeholders, split at its ``*``s once."""
        return self.text.split("*")

    @cached_property
    def _literals(self) -> list[str]:
        """The text around the placeholders (``split``), once."""
        return split(self.text)[0]


def _glob_match(name: str, parts: list[str]) -> bool:
    """Whether ``name`` is ``parts`` joined by runs of any characters (a ``*`` glob)."""
    if len(parts) == 1:
        return name == parts[0]
    first, last = parts[0], parts[-1]
    end = len(name) - len(last)
    if end < len(first) or not name.startswith(first) or not name.endswith(last):
        return False
    pos = len(first)
    for part in parts[1:-1]:  # each as early as it fits: leaves the most room for the rest
        if part:
            found = name.find(part, pos, end)
            if found < 0:
                return False
            pos = found + len(part)
    return True


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
