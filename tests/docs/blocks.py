"""The fenced code blocks of the documentation site's pages (docs/**/*.md)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
SKIPPED_DIRS = {"hooks"}
# Walked top to bottom, as a new user reads them, by tests/test_readme.py.
WALKED_AS_A_NEW_USER = {"getting-started.md", "benchmarks/index.md"}


@dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[Path]:
    """Every page of the site (not docs/README.md, which explains the build)."""
    return sorted(
        path
        for path in DOCS.rglob("*.md")
        if path != DOCS / "README.md"
        and not SKIPPED_DIRS & set(path.relative_to(DOCS).parts)
        and not path.name.startswith("_")
        and str(path.relative_to(DOCS)) not in WALKED_AS_A_NEW_USER
    )


def blocks(language: str) -> list[Block]:
    found = []
    for path in pages():
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                page = str(path.relative_to(DOCS))
                found.append(Block(page, line, language, match.group(2)))
    return found


def shell_commands() -> list[tuple[str, str]]:
    """(where, command) of each ``aiobk`` line of the ``sh`` blocks: continuation lines
    joined, comments dropped."""
    out = []
    for block in blocks("sh"):
        joined = block.code.replace("\\\n", " ")
        for offset, line in enumerate(joined.splitlines()):
            command = line.split(" #", 1)[0].strip()
            words = shlex.split(command) if command else []
            if words and Path(words[0]).name == "aiobk":
                out.append((f"docs/{block.page}:{block.line + offset + 1}", command))
    return out
