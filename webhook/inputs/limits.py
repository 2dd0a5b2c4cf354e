"""Limits on what runguard reads from files: bytes, nesting, aliases and numbers.

Policy files (``runguard lint``, the server's reload), object files (``runguard apply``)
and case files (``runguard test``) come from people, and a few hundred hostile bytes
used to crash, hang or flood the output. Each file is now refused, with ``file:line:
message`` and no work done on it, when it is:

- larger than its byte limit (``OBJECT_FILES``: 3 MiB, the apiserver's request limit,
  so any object the cluster could be sent; ``POLICY_FILES`` and ``CASE_FILES``: 1 MiB,
  the most a ConfigMap can hold), read no further than the limit;
- nested deeper than ``MAX_DEPTH`` levels, checked before anything recursive reads it:
  PyYAML's composer and constructor recurse (in libyaml's C composer a deep file
  overflows the stack and kills the process), ``json.loads`` recurses, and so do the
  engine and the output writers. YAML is checked on libyaml's event stream, which is
  iterative; JSON on its brackets outside strings;
- expanded by aliases past ``MAX_ALIAS_VALUES`` values (a billion-laughs file of a few
  hundred bytes would otherwise be written out as hundreds of megabytes), or holding a
  recursive alias;
- holding an integer outside 64 bits (Kubernetes integers are int64, and Python's
  ``int()`` refuses over 4300 digits) or, in an object, a float that is not finite
  (JSON has no infinity; in a policy the model says "must be a finite number"). Each
  reader checks numbers as it builds them, since the line is known there.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

__all__ = [
    "CASE_FILES",
    "CLUSTER_STATE_FILES",
    "MAX_ALIAS_VALUES",
    "MAX_DEPTH",
    "OBJECT_FILES",
    "POLICY_FILES",
    "LimitError",
    "Limits",
    "check_size",
    "check_yaml",
    "float_problem",
    "int_problem",
    "int_text_problem",
    "load_json",
    "read_bounded",
    "read_path",
    "without_lone_surrogates",
]

MiB = 1024 * 1024
MAX_DEPTH = 100  # a Pod nests about 20 deep (a CronJob's pod affinity terms)
MAX_ALIAS_VALUES = 10_000  # values aliases may add to a file, all documents together
INT64 = (-(2**63), 2**63 - 1)
# An int64 has at most 19 digits, 64 in binary: with a sign and a base prefix, a longer
# text (YAML's ``_`` separators left out) is out of range, refused before ``int()``.
_MAX_INT_TEXT = 70


@dataclass(frozen=True)
class Limits:
    """What one kind of file may hold."""

    what: str  # how messages name the files: "object files"
    max_bytes: int
    max_depth: int = MAX_DEPTH
    max_alias_values: int = MAX_ALIAS_VALUES


OBJECT_FILES = Limits("object files (the apiserver's request limit)", 3 * MiB)
POLICY_FILES = Limits("policy files", 1 * MiB)
CASE_FILES = Limits("case files", 1 * MiB)
# ``--cluster-state``: many objects' metadata in one file, an admin's own export.
CLUSTER_STATE_FILES = Limits("cluster state files", 256 * MiB)


class LimitError(ValueError):
    """A file past a limit: ``line`` (1-based) where it was found, when there is one."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message

    def where(self, name: str) -> str:
        """``name:line: message`` (``name: message`` without a line)."""
        line = f":{self.line}" if self.line is not None else ""
        return f"{name}{line}: {self.message}"


def _size(count: int) -> str:
    return f"{count // MiB} MiB" if count % MiB == 0 else f"{count} bytes"


def _too_large(limits: Limits, size: int | None) -> LimitError:
    found = f"{size} bytes" if size is not None else f"more than {_size(limits.max_bytes)}"
    return LimitError(None, f"{found}: over the {_size(limits.max_bytes)} limit for {limits.what}")


def read_bounded(stream: IO[bytes], limits: Limits, size: int | None = None) -> str:
    """The UTF-8 text of ``stream``, read no further than the limit; raises LimitError
    past it, UnicodeDecodeError for text that is not UTF-8."""
    data = stream.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise _too_large(limits, size)
    return data.decode("utf-8")


def check_size(text: str, limits: Limits) -> None:
    """Raise LimitError when ``text`` takes more than the limit's bytes in UTF-8, or is no
    UTF-8 text at all (a lone surrogate, which no file read as UTF-8 holds)."""
    if len(text) > limits.max_bytes:
        raise _too_large(limits, None)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise LimitError(None, f"not UTF-8 text ({exc.reason})") from None
    if size > limits.max_bytes:
        raise _too_large(limits, size)


def read_path(path: str | Path, limits: Limits) -> str:
    """``read_bounded`` of a file (a FIFO or ``/dev/zero`` too: never read past the
    limit). Raises OSError, UnicodeDecodeError or LimitError."""
    with open(path, "rb") as stream:
        info = os.fstat(stream.fileno())
        size = info.st_size if info.st_size > limits.max_bytes else None
        return read_bounded(stream, limits, size)


# --- YAML: libyaml's events, before any composer ------------------------------------

_PARSER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml(text: str, limits: Limits) -> int:
    """Raise LimitError when ``text`` nests too deep (aliases included), expands past the
    alias budget or holds a recursive alias; else the number of values aliases add (0:
    no alias, nothing shared). Iterative, on libyaml's event stream when present. A
    syntax error ends the check: the loader reports it, with its own line."""
    count = _Count(limits)
    try:
        for event in yaml.parse(text, Loader=_PARSER):
            step = _STEPS.get(type(event))
            if step is not None:
                step(count, event)
    except yaml.MarkedYAMLError as error:
        # PyYAML 6.0.4's scanner refuses deep flow nesting itself, ahead of the events
        # counted here: the same refusal, in runguard's words, at the parser's line.
        if _DEPTH_REFUSAL.search(error.problem or "") and error.problem_mark is not None:
            raise LimitError(
                error.problem_mark.line + 1, f"nested deeper than {limits.max_depth} levels"
            ) from None
    except yaml.YAMLError:
        pass
    return count.added


class _Count:
    """What ``check_yaml`` keeps of the events so far: a step per kind of event."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.frames: list[list[Any]] = []  # per open collection: [values, height, anchor]
        self.anchors: dict[str, tuple[int, int]] = {}  # done: (values, height)
        self.open_anchors: set[str] = set()
        self.added = 0  # values aliases add

    def scalar(self, event: yaml.ScalarEvent) -> None:
        if event.anchor is not None:
            self.anchors[event.anchor] = (1, 0)
        if self.frames:
            self.frames[-1][0] += 1

    def start(self, event: yaml.CollectionStartEvent) -> None:
        if len(self.frames) >= self.limits.max_depth:
            raise _too_deep(event, self.limits)
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        self.frames.append([1, 0, event.anchor])

    def end(self, event: yaml.CollectionEndEvent) -> None:
        values, height, anchor = self.frames.pop()
        if anchor is not None:
            self.anchors[anchor] = (values, height + 1)
            self.open_anchors.discard(anchor)
        self._nest(values, height + 1)

    def alias(self, event: yaml.AliasEvent) -> None:
        name = event.anchor
        if name in self.open_anchors:
            raise LimitError(_line(event), f"recursive alias *{name}")
        if name not in self.anchors:
            return  # undefined: the loader says so
        values, height = self.anchors[name]
        self.added += values
        if self.added > self.limits.max_alias_values:
            raise LimitError(
                _line(event),
                f"aliases expand to more than {self.limits.max_alias_values} values "
                "(an alias bomb?)",
            )
        if len(self.frames) + height > self.limits.max_depth:
            raise _too_deep(event, self.limits)
        self._nest(values, height)

    def document_end(self, event: yaml.DocumentEndEvent) -> None:
        self.anchors.clear()  # anchors are per document
        self.open_anchors.clear()

    def _nest(self, values: int, height: int) -> None:
        """A finished value of ``values`` values, ``height`` deep, in the open collection."""
        if self.frames:
            self.frames[-1][0] += values
            self.frames[-1][1] = max(self.frames[-1][1], height)


_STEPS: dict[type[yaml.Event], Callable[[_Count, Any], None]] = {
    yaml.ScalarEvent: _Count.scalar,
    yaml.MappingStartEvent: _Count.start,
    yaml.SequenceStartEvent: _Count.start,
    yaml.MappingEndEvent: _Count.end,
    yaml.SequenceEndEvent: _Count.end,
    yaml.AliasEvent: _Count.alias,
    yaml.DocumentEndEvent: _Count.document_end,
}


# How a parser words its own depth limit (PyYAML >= 6.0.4: "exceeded maximum nesting
# depth"); any other syntax error is the loader's to report.
_DEPTH_REFUSAL = re.compile(r"nesting|depth|too deep", re.IGNORECASE)


def _line(event: yaml.Event) -> int | None:
    mark = event.start_mark
    return mark.line + 1 if mark is not None else None


def _too_deep(event: yaml.Event, limits: Limits) -> LimitError:
    return LimitError(_line(event), f"nested deeper than {limits.max_depth} levels")


# --- JSON: brackets outside strings, then json.loads with checked numbers ----------

_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"[\[{][\]}]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|-?[0-9][0-9.eE+-]*|NaN|-?Infinity')


def _json_depth_ok(text: str, max_depth: int) -> bool:
    """Whether the brackets outside strings nest at most ``max_depth`` deep (C-speed
    string operations; True for unbalanced text, which json.loads reports)."""
    # Escaped backslashes, then escaped quotes, cannot end a string: drop them, and what
    # is left alternates outside / inside at each quote.
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    brackets = _NOT_BRACKET.sub("", "".join(unescaped.split('"')[::2]))
    for _ in range(max_depth):
        brackets, removed = _INNERMOST.subn("", brackets)
        if not brackets or not removed:
            return True
    return False


class _BadNumber(ValueError):
    pass


INT_RANGE = "integer out of range (Kubernetes integers are 64-bit)"
FLOAT_RANGE = "number out of range (not a finite float)"


def int_problem(value: int) -> str | None:
    return None if INT64[0] <= value <= INT64[1] else INT_RANGE


def float_problem(value: float) -> str | None:
    return None if math.isfinite(value) else FLOAT_RANGE


def int_text_problem(text: str) -> str | None:
    """Out of range judged from the text alone, before ``int()`` reads it."""
    return INT_RANGE if len(text) > _MAX_INT_TEXT else None


def _json_int(text: str) -> int:
    if int_text_problem(text) or int_problem(int(text)):
        raise _BadNumber(INT_RANGE)
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if float_problem(value):
        raise _BadNumber(FLOAT_RANGE)
    return value


def _json_constant(text: str) -> Any:
    raise _BadNumber(FLOAT_RANGE)


def load_json(text: str, limits: Limits) -> Any:
    """``json.loads`` after the depth check, numbers checked as they are read. Raises
    LimitError (with the line) or json.JSONDecodeError."""
    if not _json_depth_ok(text, limits.max_depth):
        deep = _first_json_problem(text, limits, deep=True)
        if deep is not None:
            raise deep
    try:
        return json.loads(
            text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
        )
    except _BadNumber as exc:
        found = _first_json_problem(text, limits, deep=False)
        raise found or LimitError(None, str(exc)) from None


def _first_json_problem(text: str, limits: Limits, *, deep: bool) -> LimitError | None:
    """Where the first too deep bracket or bad number is, token by token: only run on a
    file already found to hold one."""
    depth, line, counted = 0, 1, 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        line += text.count("\n", counted, match.start())
        counted = match.start()
        if token in "[{":
            depth += 1
            if deep and depth > limits.max_depth:
                return LimitError(line, f"nested deeper than {limits.max_depth} levels")
        elif token in "]}":
            depth -= 1
        elif not deep:
            number = _json_int if token.lstrip("-").isdigit() else _json_float
            try:
                number(token) if token[-1].isdigit() else _json_constant(token)
            except _BadNumber as exc:
                return LimitError(line, str(exc))
            except ValueError:
                continue  # not a number json.loads would read: it reports that itself
    return None


# --- text JSON cannot carry -----------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """``text`` with lone UTF-16 surrogates (from ``"\\ud800"`` escapes) replaced by U+FFFD,
    as Kubernetes decodes them; a pair written as two escapes becomes its character.
    Unchanged (and cheap) for the usual text."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
