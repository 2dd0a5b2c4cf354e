"""Fixtures registration and shared constants; the harness itself is ``tests/harness/``.

``harness.server`` provides ``start_runguard`` and ``runguard_server`` (a real
``runguard serve`` over TLS); ``pol`` below is an empty policy directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("harness")  # before pytest_plugins: its asserts are tests'

pytest_plugins = ["harness.server"]


@pytest.fixture
def pol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty policy directory ``pol``; the test runs next to it, so files print as pol/x."""
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "pol"
    directory.mkdir()
    return directory
