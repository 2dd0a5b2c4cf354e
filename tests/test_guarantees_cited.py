"""The repository carries its own contract (``docs/dev/guarantees.md``): tests, modules,
policies and docs cite it, or another of the repository's docs, by file and heading, and
never a document the repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUARANTEES = REPO / "docs" / "dev" / "guarantees.md"
# Where a citation can be: everything a contributor reads or runs.
SCANNED = ("webhook", "tests", "policies", "docs", "bench", "manifests", "charts", "examples")
TOP = ("README.md", "Makefile", "pyproject.toml")
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".rego", ".txt", ".toml", ".tpl", ".cfg", ""}
# "SPEC section 8", "SPEC 8", "SPEC §8", "SPEC.md", "the SPEC's": an outside document.
OUTSIDE = re.compile(r"\bSPEC(?:\.md\b|'s\b|\s*§|\s+section\b|\s+[0-9])")
CITED = re.compile(r'docs/dev/guarantees\.md,\s+"([^"]+)"')


def scanned_files() -> list[Path]:
    """Every text file of ``SCANNED`` and ``TOP`` but this one (its examples cite)."""
    files = [REPO / name for name in TOP if (REPO / name).is_file()]
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts:
                files.append(path)
    return [path for path in files if path != Path(__file__).resolve()]


def outside_citations(text: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE.finditer(text)]


def headings() -> set[str]:
    return {
        line.removeprefix("## ").strip()
        for line in GUARANTEES.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }


def cited_headings(text: str) -> set[str]:
    """The headings of the guarantees ``text`` cites, a citation wrapped over comment or
    docstring lines included."""
    flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    return {" ".join(match.group(1).split()) for match in CITED.finditer(flat)}


def test_nothing_cites_a_document_outside_the_repository() -> None:
    files = scanned_files()
    assert REPO / "tests" / "engine" / "test_trust.py" in files and GUARANTEES in files
    found = [
        f"{path.relative_to(REPO)}: {hit}"
        for path in files
        for hit in outside_citations(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, found


def test_the_finder_sees_each_form_of_an_outside_citation() -> None:
    text = 'SPEC section 8; (SPEC 1); SPEC.md; the SPEC\'s policy; SPEC §6; SPEC = {"a": 1}'
    assert outside_citations(text) == ["SPEC section", "SPEC 1", "SPEC.md", "SPEC's", "SPEC §"]


def test_every_citation_of_the_guarantees_names_one_of_its_headings() -> None:
    known = headings()
    assert {"Ownership", "Trust over time", "Every admitted object"} <= known
    cited: dict[str, set[str]] = {}
    for path in scanned_files():
        for heading in cited_headings(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(heading, set()).add(str(path.relative_to(REPO)))
    assert "Trust over time" in cited  # the tests do cite it
    unknown = {heading: sorted(paths) for heading, paths in cited.items() if heading not in known}
    assert not unknown, unknown


def test_a_wrapped_citation_is_read_whole() -> None:
    text = '# judged (docs/dev/guarantees.md, "Trust over\n# time"): and\n'
    assert cited_headings(text) == {"Trust over time"}
