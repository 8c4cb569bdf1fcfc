"""The user's guide stays a guide: README.md under 8 KB, and every relative link in it and in the
other documents resolves (the file exists; a #fragment names a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def _links(doc: Path) -> list[str]:
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # relative only


def test_readme_is_a_short_guide() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < 8 * 1024, f"README.md is {size} bytes: move detail into docs/"
    assert len(_links(ROOT / "README.md")) >= 5  # the guide links onward


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert doc.exists(), doc
    broken = []
    for target in _links(doc):
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


# -- citations in source files ---------------------------------------------------------------------
# No source file cites a document outside the repository (the original design notes and behaviour
# reference lived beside it, not in it). The one outside source named is the user's seeds
# (shared/seeds/): the contract was written from them and tests/contract's seed-coverage tests read
# them at test time on purpose.
CITED_DIRS = ("kiln", "kiln_kernels", "codegen", "tests", "bench", "contract", "docs")
CITED_SUFFIXES = {".py", ".c", ".h", ".md", ".json", ".toml"}
OUTSIDE = re.compile(
    r"(?-i:\bDESIGN\b)|\breference\s*§|kiln-behavior|\breference/|codegen-notes"
    r"|default-model\.md|\bshared/(?!seeds\b)", re.I)
DOC_PATH = re.compile(r"\bdocs/[\w./-]*?\.md\b")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
BEHAVIOR = ROOT / "docs" / "behavior.md"


def _cited_files() -> list[Path]:
    out = []
    for top in CITED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if (path.suffix in CITED_SUFFIXES and path.is_file() and "_generated" not in rel
                    and path != Path(__file__).resolve() and ".venv" not in rel):
                out.append(path)
    return out


def _behavior_sections() -> set[str]:
    text = BEHAVIOR.read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3}\s+§(\d+(?:\.\d+)*)\s", text, re.M))


def citation_problems(rel: str, text: str, sections: set[str]) -> list[str]:
    """What is wrong with the citations of one file (``rel``: its path from the repository root):
    a document outside the repository, a ``docs/*.md`` that does not exist, or a ``§N`` that is
    not a section of docs/behavior.md (every § in a source file cites that document)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        hit = OUTSIDE.search(line)
        if hit:
            problems.append(f"{rel}:{n}: cites {hit.group(0)!r} outside the repository")
        for doc in DOC_PATH.findall(line):
            if not (ROOT / doc).is_file():
                problems.append(f"{rel}:{n}: {doc} does not exist")
        if rel == "docs/behavior.md":
            continue
        for number in SECTION.findall(line):
            if number not in sections:
                problems.append(f"{rel}:{n}: docs/behavior.md has no §{number}")
    if SECTION.search(text) and rel != "docs/behavior.md" and "behavior.md" not in text:
        problems.append(f"{rel}: cites a § without naming docs/behavior.md")
    return problems


def test_behavior_sections_are_numbered() -> None:
    sections = _behavior_sections()
    assert {"3.1", "3.6", "4", "5.3", "8", "13", "15"} <= sections, sorted(sections)


def test_source_files_cite_only_documents_in_the_repository() -> None:
    sections = _behavior_sections()
    problems = []
    for path in _cited_files():
        rel = path.relative_to(ROOT).as_posix()
        problems += citation_problems(rel, path.read_text(encoding="utf-8", errors="replace"),
                                      sections)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line", [
    '"""Scoring (DESIGN §6)."""', "# see reference §8", "(kiln-behavior.md §5.3)",
    "# shared/reference/codegen-notes.md", "(DESIGN.md)", "(docs/no-such-page.md)",
    "(docs/behavior.md §99)",
])
def test_a_citation_outside_the_repository_is_caught(line: str) -> None:
    assert citation_problems("kiln/x.py", line + "\ndocs/behavior.md", _behavior_sections())


def test_a_citation_that_resolves_passes() -> None:
    text = '"""Scoring (docs/behavior.md §8, docs/decisions.md); the checks (§3.3)."""'
    assert citation_problems("kiln/x.py", text, _behavior_sections()) == []
