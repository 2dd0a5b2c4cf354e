"""Fuzzing ``runguard apply``, ``runguard lint`` and the policy loader, in a short form.

The inputs and the checks are ``harness.fuzz``'s (``bench/fuzz_inputs.py`` is the long
form, with its figures): YAML and JSON from run Pods, random values, random edits and hostile
shapes; every command exits 0, 1 or 2 with UTF-8 output of bounded size, the loader
never raises. Here a fixed, bounded set of examples (``derandomize``: the same ones on
every run, so CI never turns red by chance) and no deadline (a shared machine's pauses
are not failures).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.fuzz import SHORT, check_apply, check_lint, check_loader, inputs
from hypothesis import given
from hypothesis import strategies as st


@SHORT
@given(text=inputs, output=st.sampled_from(["json", "yaml", "text"]))
def test_apply_exits_cleanly_with_bounded_output(text: str, output: str) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        check_apply(text, Path(workdir), output)


@SHORT
@given(text=inputs)
def test_lint_and_the_policy_loader_never_raise(text: str) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        check_lint(text, Path(workdir))
        check_loader(text, Path(workdir))
