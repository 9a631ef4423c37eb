"""Plain-text output of the commands: aligned tables, line-safe bytes, and a progress line on a
terminal.

No terminal-UI library: these are all a command line needs, and the client install stays
small (``aiobk.commands.extras``). Tables never wrap or clip a cell, so piped output keeps
whole values on one line per row.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TextIO

import click


def format_table(rows: Sequence[Sequence[str]], headers: Sequence[str] | None = None) -> str:
    """``rows`` as columns two spaces apart, each as wide as its widest cell, with
    ``headers`` and a rule of dashes first when given. Line breaks in a cell become spaces."""
    lines = [[cell.replace("\n", " ") for cell in row] for row in rows]
    if headers is not None:
        lines[:0] = [list(headers), ["-" * len(h) for h in headers]]
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    if headers is not None:
        lines[1] = ["-" * w for w in widths]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


# What ``printable`` escapes: the backslash itself; C0 controls (newline and tab among them), DEL
# and the C1 controls, which a terminal may act on; the Unicode line and paragraph separators,
# which some readers take as line ends; and the bytes that are not UTF-8 (decoded as lone
# surrogates by "surrogateescape").
_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\udc80-\udcff]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(data: bytes) -> str:
    """``data`` as one line of text: UTF-8 shown as it is, everything else backslash-escaped --
    ``\\\\`` for a backslash, ``\\n``, ``\\t`` and ``\\r``, ``\\xNN`` for another control byte or a
    byte that is not UTF-8, ``\\uNNNN`` for a C1 control or a line or paragraph separator. No
    two inputs print the same, and nothing printed breaks a line or moves a terminal's cursor."""
    return _UNSAFE.sub(_escape, data.decode("utf-8", errors="surrogateescape"))


def echo_table(rows: Sequence[Sequence[str]], headers: Sequence[str] | None = None) -> None:
    """Print ``format_table(rows, headers)`` on stdout."""
    click.echo(format_table(rows, headers))


class ProgressLine:
    """One line of progress on a terminal, rewritten in place at most every ``every`` seconds
    and erased on exit, so that only the command's own output stays. ``note`` prints a line
    that stays, above it."""

    def __init__(self, stream: TextIO, every: float = 0.1) -> None:
        self._stream = stream
        self._every = every
        self._text = ""
        self._at = float("-inf")

    def show(self, text: str, *, now: bool = False) -> None:
        """Show ``text`` (at once with ``now``, else unless the line changed very lately)."""
        self._text = text
        moment = time.monotonic()
        if not now and moment - self._at < self._every:
            return
        self._at = moment
        width = max(10, shutil.get_terminal_size().columns - 1)  # a wrapped line cannot be redrawn
        self._stream.write(f"\r{text[:width]}\x1b[K")
        self._stream.flush()

    def note(self, line: str) -> None:
        self._stream.write(f"\r\x1b[K{line}\n")
        self._stream.flush()
        if self._text:
            self.show(self._text, now=True)

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._at != float("-inf"):
            self._stream.write("\r\x1b[K")
            self._stream.flush()


def format_size(n: int | None) -> str:
    """A byte count for a reader: ``1.5 MiB``, ``512 B``; ``-`` for none."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_duration(seconds: float) -> str:
    """A span of seconds as a command takes it back: ``4h``, ``90m``, ``2d``, ``45s``, ``1.5s``
    (the largest unit that divides it, so the text reads back to the same number)."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def progress_line() -> ProgressLine | None:
    """A progress line on stderr when stderr is a terminal; None otherwise."""
    return ProgressLine(sys.stderr) if sys.stderr.isatty() else None


__all__ = [
    "ProgressLine",
    "echo_table",
    "format_duration",
    "format_size",
    "format_table",
    "printable",
    "progress_line",
]
