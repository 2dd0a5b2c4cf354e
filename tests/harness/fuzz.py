"""Fuzzing the files runguard reads: the inputs and the checks of ``runguard apply``,
``runguard lint`` and the policy loader.

``tests/inputs/test_fuzz_inputs.py`` runs the checks in a short, fixed form in CI;
``bench/fuzz_inputs.py`` is the long run, with its figures (``FIGURES``). ``inputs``:
YAML and JSON made with hypothesis: run Pods and random values written as JSON or YAML,
the same with random edits, raw YAML punctuation, and hostile shapes (deep nesting,
alias chains, recursive aliases, huge numbers, surrogate escapes, tags). Each input
goes through:

- ``runguard apply -p policies -o json|yaml|text FILE`` (``check_apply``): exit 0, 1 or
  2; exit 2 says ``runguard: FILE...``; the output is UTF-8 and at most a bounded
  multiple of the input;
- ``runguard lint`` of a policy directory holding the input as one more file
  (``check_lint``): exit 0 or 2, output UTF-8;
- ``read_policy`` of that directory (``check_loader``): never raises.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from webhook.cli import main as runguard
from webhook.inputs.limits import MAX_ALIAS_VALUES
from webhook.policy.loader import read_policy

from .inputs import REPO

POLICY = REPO / "policies"
RUN_LABELS = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
# The output may be the mutated objects, their patches and every violation: a few
# kilobytes per container, so a multiple of the input, of what aliases may add, and a
# fixed part; never more.
OUTPUT_FIXED, OUTPUT_PER_INPUT_BYTE, OUTPUT_PER_ALIAS_VALUE = 64 * 1024, 60, 64
OUTPUT_FROM_ALIASES = OUTPUT_PER_ALIAS_VALUE * MAX_ALIAS_VALUES


# --- inputs ---------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["0", "100m", "64Gi", "1e999", "-0", "0x1F", "1:2:3", ".inf", "2024-01-01"]),
)
values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=25,
)
containers = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["main", "side", "c"]), "image": st.just("i")},
        optional={
            "securityContext": st.fixed_dictionaries(
                {},
                optional={
                    "runAsUser": st.sampled_from([0, 1000, 2**70]),
                    "privileged": st.booleans(),
                    "capabilities": st.fixed_dictionaries({"add": st.lists(st.text(max_size=6))}),
                },
            ),
            "resources": st.fixed_dictionaries(
                {"limits": st.dictionaries(st.sampled_from(["cpu", "memory"]), scalars)}
            ),
            "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)}), max_size=3),
            "extra": values,
        },
    ),
    max_size=3,
)
pods = st.fixed_dictionaries(
    {
        "apiVersion": st.just("v1"),
        "kind": st.sampled_from(["Pod", "Pod", "Job", "List", "PodList", "Thing"]),
        "metadata": st.fixed_dictionaries(
            {"name": st.text(max_size=8), "labels": st.just(RUN_LABELS)},
            optional={"annotations": st.dictionaries(st.text(max_size=8), st.text(max_size=8))},
        ),
        "spec": st.fixed_dictionaries({"containers": containers}, optional={"volumes": values}),
    },
    optional={"items": st.lists(values, max_size=2)},
)


def as_yaml(value: Any) -> str:
    return yaml.safe_dump(value, allow_unicode=True)


def as_json(value: Any) -> str:
    return json.dumps(value)


written = st.one_of(pods, values).flatmap(
    lambda v: st.sampled_from([as_json, as_yaml]).map(lambda write: write(v))
)
punctuation = st.text(alphabet="[]{}:,-&*!|>'\"#%@?~ \n\t.0123456789eE+ab_/\\u<", max_size=120)


@st.composite
def edited(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> str:
    """A text with a few random insertions, deletions and repeats."""
    text = draw(texts)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(text)))
        end = draw(st.integers(at, min(len(text), at + 20)))
        how = draw(st.sampled_from(["insert", "delete", "repeat"]))
        if how == "insert":
            text = text[:at] + draw(punctuation) + text[at:]
        elif how == "delete":
            text = text[:at] + text[end:]
        else:
            text = text[:end] + text[at:end] * draw(st.integers(1, 30)) + text[end:]
    return text


def _deep(depth: int, shape: str) -> str:
    """``depth`` levels of one kind of nesting, in a Pod written as YAML or as JSON."""
    opener, closer, json_doc = {
        "yaml list": ("[", "]", False),
        "yaml map": ("{a: ", "}", False),
        "json list": ("[", "]", True),
        "json map": ('{"a": ', "}", True),
    }[shape]
    body = opener * depth + "1" + closer * depth
    return f'{{"kind": "Pod", "x": {body}}}' if json_doc else f"kind: Pod\nx: {body}\n"


def _laughs(fanout: int, levels: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]")
    return "kind: Pod\n" + "\n".join(lines) + "\n"


hostile = st.one_of(
    st.builds(
        _deep,
        st.integers(0, 400),
        st.sampled_from(["yaml list", "yaml map", "json list", "json map"]),
    ),
    st.integers(1, 400).map(lambda d: "kind: Pod\nx:\n" + "- " * d + "a\n"),
    st.integers(1, 300).map(
        lambda d: "kind: Pod\nx:\n" + "".join(" " * i + "- \n" for i in range(1, d))
    ),
    st.builds(_laughs, st.integers(2, 12), st.integers(1, 12)),
    st.integers(15, 6000).map(lambda n: f'{{"kind": "Pod", "spec": {{"priority": {"9" * n}}}}}'),
    st.integers(15, 6000).map(lambda n: f"kind: Pod\nspec: {{priority: {'9' * n}}}\n"),
    st.sampled_from(
        [
            "kind: Pod\nx: 1.0e+999\n",
            '{"kind": "Pod", "x": 1e999}',
            '{"kind": "Pod", "x": NaN}',
            "kind: Pod\nx: &a [*a]\n",
            "kind: Pod\nx: &a {b: *a}\n",
            'kind: Pod\nmetadata: {name: "\\ud800"}\n',
            '{"kind": "Pod", "metadata": {"name": "\\ud800\\udfff\\udc00"}}',
            "kind: Pod\nx: !!python/object/apply:os.system [true]\n",
            "kind: Pod\nmetadata: {name: !!binary aGk=, annotations: {t: 2024-01-01}}\n",
            "kind: Pod\nx: !!set {a, b}\ny: !!omap [{a: 1}]\n? [a]\n: b\n",
            "kind: Pod\nx: 0b" + "1" * 80 + "\n",
            "kind: Pod\nx: " + ":".join(["59"] * 40) + "\n",
            "\ufeffkind: Pod\n",
            "--- \n--- \n...\n" * 50,
        ]
    ),
)
inputs = st.one_of(written, edited(written), punctuation, hostile, edited(hostile))


# --- checks ---------------------------------------------------------------------------


@dataclass
class Figures:
    """What the long run prints per target."""

    examples: Counter[str] = field(default_factory=Counter)
    exits: Counter[tuple[str, int]] = field(default_factory=Counter)
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)

    def note(self, target: str, code: int, seconds: float, ratio: float, text: str) -> None:
        self.examples[target] += 1
        self.exits[(target, code)] += 1
        if seconds > self.slowest.get(target, (0.0, ""))[0]:
            self.slowest[target] = (seconds, f"{len(text)} chars: {text[:60]!r}")
        self.ratio[target] = max(self.ratio.get(target, 0.0), ratio)


FIGURES = Figures()


def _run(args: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        code = runguard(args)
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def _write(path: Path, text: str) -> None:
    # surrogatepass: text hypothesis draws may hold lone surrogates, which no UTF-8 file
    # can; written as such they make the file invalid UTF-8, one more input to refuse
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


def check_apply(text: str, workdir: Path, output: str) -> None:
    suffix = ".json" if text.lstrip().startswith(("{", "[")) else ".yaml"
    path = workdir / f"input{suffix}"
    _write(path, text)
    code, out, err, seconds = _run(["apply", "-p", str(POLICY), "-o", output, str(path)])
    assert code in (0, 1, 2), code
    if code == 2:
        assert err.startswith(f"runguard: {path}"), err
    out.encode("utf-8")  # what a terminal or a pipe can take
    err.encode("utf-8")
    size = len(text.encode("utf-8", "surrogatepass"))
    bound = OUTPUT_FIXED + OUTPUT_PER_INPUT_BYTE * size + OUTPUT_FROM_ALIASES
    assert len(out) <= bound, (len(out), size)
    FIGURES.note(f"apply -o {output}", code, seconds, len(out) / max(size, 1), text)


def _policy_dir(text: str, workdir: Path) -> Path:
    directory = workdir / "policies"
    directory.mkdir(exist_ok=True)
    for source in POLICY.glob("*.yaml"):
        (directory / source.name).write_bytes(source.read_bytes())
    _write(directory / "zz-fuzzed.yaml", text)
    return directory


def check_lint(text: str, workdir: Path) -> None:
    directory = _policy_dir(text, workdir)
    code, out, err, seconds = _run(["lint", "-p", str(directory)])
    assert code in (0, 2), code
    out.encode("utf-8")
    err.encode("utf-8")
    FIGURES.note("lint", code, seconds, len(out) / max(len(text), 1), text)


def check_loader(text: str, workdir: Path) -> None:
    directory = _policy_dir(text, workdir)
    start = time.perf_counter()
    source = read_policy(directory)  # the server's reload: never raises
    for issue in source.errors:
        str(issue).encode("utf-8")
    seconds = time.perf_counter() - start
    FIGURES.note("read_policy", 2 if source.errors else 0, seconds, 0.0, text)


SHORT = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
