"""Nothing a reader cannot follow: no bare ticket numbers, no citation of a file the repository
does not hold.

A comment, docstring or page gives the reason for what it describes, not the number of the
ticket that asked for it: "issue 15" means nothing to someone reading a clone. An upstream
project's tracker named in full can be followed and is fine ("pytest-xdist issue 784",
``apache/bookkeeper#3524``). A document is cited by a path that exists in this repository (the
design pages under ``docs/design/``) or, for BookKeeper's own material, by its public title
(BookKeeper's "The BookKeeper protocol", "BP-46: Running without the journal", ...). The notes
the project was planned from live outside the repository, so naming them (``API.md``,
``DESIGN``, ``RELIABILITY``, ``STYLE``, the ``spec/`` files) leaves a reader nowhere to go.

The scan covers every file git tracks or would track (``git ls-files --cached --others
--exclude-standard``) that reads as text, grouped so that a failure names the part of the tree
it is in. This file is the one exception: it spells out what it looks for.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve()

# The parts of the tree, each its own test, so a failure says where to look.
GROUPS: dict[str, tuple[str, ...]] = {
    "source": (
        "protocol/",
        "metadata/",
        "bookie/",
        "client/",
        "autorecovery/",
        "pipeline/",
        "bench/",
        "aiobk/",
    ),
    "tests": ("tests/",),
    "docs": ("docs/", "mkdocs.yml"),
    "README.md": ("README.md",),
    "CHANGELOG.md": ("CHANGELOG.md",),
    "build and deployment": ("Makefile", "pyproject.toml", "deploy/", ".ci/"),
}

# "issue 15", "Issue 12, finding 4", "(issue\n    # 19)", "issues 12 and 15", "issue #7".
_ISSUE = re.compile(r"\bissues?[ \t]*(?:\r?\n[ \t]*(?:#[ \t]*)?)?#?[0-9]+", re.IGNORECASE)
# What only made sense next to a ticket: "finding 4", "findings 4 and 9", "defect 1".
_TICKET_PART = re.compile(r"\b(?:findings?|defects?) [0-9]+\b", re.IGNORECASE)
# Upstream projects whose trackers a reference may name ("pytest-xdist issue 784"); an
# ``owner/name`` before "issue" passes too. Add a project here when citing its tracker.
UPSTREAM_PROJECTS = frozenset({"pytest-xdist", "bookkeeper", "etcd", "cpython", "uvloop"})
_WORD_BEFORE = re.compile(r"([\w./-]+)[ \t]+$")

# The planning notes by name: API.md and the spec files are caught as missing ``*.md`` paths
# below; these are the names they went by without a suffix.
_NOTES = re.compile(
    r"\b(?:DESIGN|RELIABILITY|STYLE)\b"  # the house notes, always upper case
    r"|\.\./shared\b|\bspec/"  # where they live
    r"|\bbp-?(?:14|46)-[a-z-]+|\breplication-protocol-guide\b"  # the spec files' stems
    r"|\bthe guide's\b"  # the replication protocol guide, left without its title
    r"|\bthe spec's\b|\bspec:? \""  # "the spec", as though there were one here
)
# A section of the README by its heading: README "Securing etcd", README.md "Security".
_README_SECTION = re.compile(r"\bREADME(?:\.md)?,? \"([^\"\n]+)\"")
# A Markdown path: "docs/design/protocol.md", "../guide/client.md#logs", "API.md".
_MD_PATH = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)*\w[\w./-]*\.md)\b")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)>\]\"'`]+")
# Files whose paths are relative to somewhere else than their own directory.
_BASE = {"mkdocs.yml": ROOT / "docs"}  # nav entries are relative to docs_dir


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def ticket_references(text: str) -> Iterator[tuple[int, str]]:
    """(offset, match) of each reference to one of our own tickets."""
    for match in _ISSUE.finditer(text):
        before = _WORD_BEFORE.search(text, 0, match.start())
        word = before.group(1).lower() if before else ""
        if word in UPSTREAM_PROJECTS or re.fullmatch(r"[\w.-]+/[\w.-]+", word):
            continue
        yield match.start(), " ".join(match.group(0).replace("#", " ").split())
    for match in _TICKET_PART.finditer(text):
        yield match.start(), match.group(0)


def missing_documents(text: str, where: Path) -> Iterator[tuple[int, str]]:
    """(offset, name) of each document cited that the repository does not hold: the planning
    notes by name, a README section no heading of README.md starts with, and any ``*.md`` path
    that resolves neither beside ``where`` nor from the repository's root (URLs aside)."""
    for match in _NOTES.finditer(text):
        yield match.start(), match.group(0)
    for match in _README_SECTION.finditer(text):
        if not any(h.startswith(match.group(1).lower()) for h in _readme_headings()):
            yield match.start(), match.group(0)
    text = _URL.sub(lambda m: " " * len(m.group(0)), text)  # offsets kept
    for match in _MD_PATH.finditer(text):
        name = match.group(1)
        relative = name.startswith(("./", "../"))
        base = _BASE.get(where.name, where.parent) if where.parent == ROOT else where.parent
        places = (base,) if relative else (base, ROOT)
        if not any((place / name).exists() for place in places):
            yield match.start(), name


@cache
def _readme_headings() -> tuple[str, ...]:
    """README.md's headings, lower case, without their ``#`` marks."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    return tuple(line.lstrip("#").strip().lower() for line in lines if line.startswith("#"))


@cache
def _listed() -> tuple[str, ...]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    return tuple(sorted(filter(None, listed.split("\0"))))


def _texts(group: str) -> Iterator[tuple[str, str]]:
    """(path, text) of the group's files that exist and read as UTF-8 text."""
    prefixes = GROUPS[group]
    for name in _listed():
        if not any(name == p or (p.endswith("/") and name.startswith(p)) for p in prefixes):
            continue
        path = ROOT / name
        if path.is_symlink() or not path.is_file() or path.resolve() == SELF:
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # archives and other binary test data


def prose(source: str) -> str:
    """A Python file's comments and triple-quoted strings (its docstrings), everything else
    blanked with offsets kept: ``DOCS / "reference" / "api.md"`` builds a path, it cites
    nothing. The file itself if it does not tokenize."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    kept = [c if c == "\n" else " " for c in source]
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            text = token.string
            if token.type == tokenize.COMMENT or (
                token.type == tokenize.STRING and text.lstrip("rRbBuUfF")[:3] in ('"""', "'''")
            ):
                start = starts[token.start[0] - 1] + token.start[1]
                kept[start : start + len(text)] = text
    except (tokenize.TokenError, SyntaxError):
        return source
    return "".join(kept)


def findings(group: str) -> list[Finding]:
    found = []
    for name, text in _texts(group):
        for offset, what in ticket_references(text):
            found.append(Finding(name, _line(text, offset), f"ticket reference {what!r}"))
        missing = list(missing_documents(text, ROOT / name))
        if missing and name.endswith(".py"):  # only then is tokenizing worth its time
            missing = list(missing_documents(prose(text), ROOT / name))
        for offset, what in missing:
            found.append(Finding(name, _line(text, offset), f"cites {what!r}, not in the repo"))
    return sorted(found, key=lambda f: (f.path, f.line))


@pytest.mark.parametrize("group", list(GROUPS))
def test_nothing_cited_that_a_reader_cannot_follow(group: str) -> None:
    found = findings(group)
    assert not found, f"{len(found)} in {group}:\n" + "\n".join(map(str, found))


def test_every_group_scans_something() -> None:
    """A renamed directory must not turn its group's test into one that checks nothing."""
    for group in GROUPS:
        assert any(True for _ in _texts(group)), group


def _tickets(text: str) -> list[str]:
    return [what for _, what in ticket_references(text)]


def _missing(text: str) -> list[str]:
    return [what for _, what in missing_documents(text, ROOT / "client" / "add.py")]


def test_ticket_references_are_found_in_every_spelling() -> None:
    assert _tickets("(issue 15)") == ["issue 15"]
    assert _tickets("Issue 12, finding 4: a flood") == ["Issue 12", "finding 4"]
    assert _tickets("costs more (issue\n    # 19).") == ["issue 19"]
    assert _tickets('"""before issue\n    18"""') == ["issue 18"]
    assert _tickets("issues 12 and 15, issue #7") == ["issues 12", "issue 7"]
    assert _tickets("Issue 13, defect 1: it fenced") == ["Issue 13", "defect 1"]


def test_upstream_trackers_and_plain_words_pass() -> None:
    assert _tickets("forever (pytest-xdist issue 784; seen here once)") == []
    assert _tickets("see apache/bookkeeper#3524 and python/cpython issue 1234") == []
    assert _tickets("ca.issue(name); the issue of a certificate; 15 issues") == []


def test_missing_documents_are_found() -> None:
    assert _missing('(API.md "Client API")') == ["API.md"]
    assert _missing('(protocol.md "Write quorums")') == ["protocol.md"]
    assert _missing("(RELIABILITY trap 4); STYLE 2; DESIGN: seams") == [
        "RELIABILITY",
        "STYLE",
        "DESIGN",
    ]
    assert _missing("spec/bp-46-running-without-the-journal.md") == [
        "spec/",
        "bp-46-running-without-the-journal",
        "spec/bp-46-running-without-the-journal.md",
    ]
    assert _missing("""the guide's "Ledger Recovery" """) == ["the guide's"]
    assert _missing("""(spec "Ledger Fragments"); the spec's examples""") == [
        'spec "',
        "the spec's",
    ]
    assert _missing("docs/design/nowhere.md") == ["docs/design/nowhere.md"]
    assert _missing('(README "No such section, ever")') == ['README "No such section, ever"']


def test_in_python_only_comments_and_docstrings_cite() -> None:
    source = '''"""See docs/nowhere.md."""\npage = DOCS / "api.md"  # and STYLE 3\n'''
    cited = prose(source)
    assert len(cited) == len(source)
    assert [what for _, what in missing_documents(cited, ROOT / "x.py")] == [
        "STYLE",
        "docs/nowhere.md",
    ]


def test_mkdocs_nav_paths_are_relative_to_the_docs_directory() -> None:
    nav = "nav:\n  - Design: design/nowhere.md\n"
    found = [what for _, what in missing_documents(nav, ROOT / "mkdocs.yml")]
    assert found == ["design/nowhere.md"]


def test_documents_in_the_repository_and_public_titles_pass() -> None:
    assert _missing("README.md, CHANGELOG.md, bench/README.md, ./quorum.py") == []
    assert _missing("https://bookkeeper.apache.org/docs/x/protocol.md and file:///o/API.md") == []
    assert _missing('BookKeeper\'s "BP-14: Relax durability", "Sync API"; BP-46 phase two') == []
    assert _missing("the HTTP admin API; a reliable design; the style") == []
    heading = _readme_headings()[0]  # whatever README.md opens with
    assert _missing(f'README "{heading[:8]}"') == []
