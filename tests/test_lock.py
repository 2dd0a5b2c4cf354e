"""The lock: every Python package at one version, chosen in one place.

``requirements.lock`` pins every package the venv, the tests and ``make lock`` use (the
build backend included); ``requirements-image.lock`` is its runtime subset, what the
image installs. Both come from ``pyproject.toml`` through ``make lock``. These tests fail
when the three disagree: a range in pyproject.toml the lock does not satisfy, a package
the dependency graph no longer needs, one it needs and the lock lacks, a version or a
hash that differs between the two locks, or an installed version that is not the lock's.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def read_lock(name: str) -> dict[str, tuple[Version, frozenset[str]]]:
    """{canonical name: (version, hashes)} of a pip-compile file with hashes."""
    pins: dict[str, tuple[Version, frozenset[str]]] = {}
    current: str | None = None
    for line in (REPO / name).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match[1])
            assert current not in pins, f"{name}: {current} pinned twice"
            pins[current] = (Version(match[2]), frozenset())
        elif line.lstrip().startswith("--hash=") and current is not None:
            version, hashes = pins[current]
            pins[current] = (version, hashes | set(_HASH.findall(line)))
        elif line.strip() and not line.lstrip().startswith("#"):
            assert line.startswith("    "), f"{name}: unexpected line {line!r}"
    return pins


LOCK = read_lock("requirements.lock")
IMAGE_LOCK = read_lock("requirements-image.lock")


def closure(roots: list[Requirement]) -> set[str]:
    """Every distribution ``roots`` need, through the installed distributions' metadata
    (the venv is installed from the lock, so this is the locked versions' graph)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, extras) in done:
            continue
        done.add((name, extras))
        seen.add(name)
        for text in metadata.requires(name) or []:
            child = Requirement(text)
            wanted = [""] + sorted(extras)
            if child.marker is None or any(
                child.marker.evaluate({**default_environment(), "extra": extra}) for extra in wanted
            ):
                todo.append((child, frozenset(child.extras)))
    return seen


def runtime_roots() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def all_roots() -> list[Requirement]:
    extras = PYPROJECT["project"]["optional-dependencies"]
    return runtime_roots() + [Requirement(r) for group in extras.values() for r in group]


def build_roots() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]


def test_every_pin_has_hashes() -> None:
    for name, (version, hashes) in {**LOCK, **IMAGE_LOCK}.items():
        assert hashes, f"{name}=={version}: no --hash (pip --require-hashes would refuse)"


@pytest.mark.parametrize("source", ["dependencies", "optional-dependencies", "build-system"])
def test_the_lock_satisfies_every_range_of_pyproject(source: str) -> None:
    roots = {
        "dependencies": runtime_roots(),
        "optional-dependencies": all_roots(),
        "build-system": build_roots(),
    }[source]
    for requirement in roots:
        name = canonicalize_name(requirement.name)
        assert name in LOCK, f"{requirement} (pyproject.toml): not in requirements.lock"
        version = LOCK[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"pyproject.toml asks {requirement}, requirements.lock pins {version}: run make lock"
        )


def test_the_lock_holds_exactly_the_dependency_graph() -> None:
    # pip and setuptools: pip-tools needs pip; setuptools builds runguard (no isolation).
    wanted = closure(all_roots()) | closure(build_roots())
    assert set(LOCK) - wanted == set(), "pinned but needed by nothing: run make lock"
    assert wanted - set(LOCK) == set(), "needed but not pinned: run make lock"


def test_the_image_lock_is_the_runtime_subset_at_the_same_versions() -> None:
    wanted = closure(runtime_roots()) | closure(build_roots())
    assert set(IMAGE_LOCK) == wanted
    for name, pin in IMAGE_LOCK.items():
        assert pin == LOCK[name], f"{name}: the image's pin differs from the tests' pin"


def test_the_venv_is_exactly_the_lock() -> None:
    """What `make venv` installed is what the lock names (runguard itself aside)."""
    installed = {
        canonicalize_name(d.metadata["Name"]): Version(d.version) for d in metadata.distributions()
    }
    installed.pop("runguard")
    assert installed == {name: version for name, (version, _) in LOCK.items()}


def test_every_install_goes_through_a_lock_with_hashes() -> None:
    makefile, dockerfile = (
        "\n".join(
            line
            for line in (REPO / f).read_text().replace("\\\n", " ").splitlines()
            if not line.lstrip().startswith("#")
        )
        for f in FILES
    )
    assert re.search(r"pip install .*--require-hashes --no-deps .*-r requirements\.lock", makefile)
    assert re.search(r"--require-hashes --no-deps .*-r requirements-image\.lock", dockerfile)
    # Nothing else installs a package by name: every other pip call builds runguard alone.
    for text in (makefile, dockerfile):
        for call in re.findall(r"pip (?:--python \S+ )?install[^\n&]*", text):
            assert "-r requirements" in call or call.rstrip().endswith((" .", "-e .")), call


FILES = ("Makefile", "Dockerfile")
