"""The generated parts of the documentation site, filled in at build time (an MkDocs hook).

A page asks for a generated part with a marker on a line of its own::

    <!-- generated: cli -->                  every ``aiobk`` command, from the click commands
    <!-- generated: config bookie -->        a settings table (bookie, client, switches,
                                             autorecovery), from the config dataclasses
    <!-- generated: errors -->               the client's error classes, from their docstrings
    <!-- generated: metrics bookie -->       the exported figures (bookie, autorecovery,
                                             client), from the collectors and their help texts

Settings are documented where they are defined: each field of a config dataclass has a comment
on its own line (one line) or, failing that, the comment block right above it. A field with
neither stops the build (``GenerationError``); ``tests/docs/test_reference.py`` runs the same
functions, so the suite fails too. Nothing here imports MkDocs: the tests call these functions
directly.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import click

from aiobk import metrics as exported
from aiobk.bookie.stats import BookieStats
from aiobk.cli import cli
from aiobk.client import BookKeeper
from aiobk.client import errors as client_errors

MARKER = re.compile(r"^<!-- generated: ([a-z]+)(?: ([a-z]+))? -->$", re.M)


class GenerationError(Exception):
    """A generated part cannot be made: an undocumented setting, an unknown marker."""


# --------------------------------------------------------------------------- settings


class Setting(NamedTuple):
    """One field of a config dataclass, as the reference shows it."""

    name: str
    type: str
    default: str
    description: str


CONFIGS: dict[str, tuple[str, str]] = {
    "bookie": ("aiobk.bookie.config", "BookieConfig"),
    "client": ("aiobk.client.config", "ClientConfig"),
    "switches": ("aiobk.client.config", "ProtocolSwitches"),
    "autorecovery": ("aiobk.metadata.autorecovery_config", "AutoRecoveryConfig"),
}


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Each line's comment text, and the lines that hold nothing but a comment."""
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    alone = {line for line in comments if line not in code_lines}
    return comments, alone


@functools.cache
def field_descriptions(cls: type) -> dict[str, str]:
    """Each dataclass field's description, read from the comments of its class's source:
    the comment on the field's own lines, else the block of comment lines right above it."""
    source = Path(inspect.getfile(cls)).read_text()
    comments, alone = _comments(source)
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    found: dict[str, str] = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        first, last = statement.lineno, statement.end_lineno or statement.lineno
        own = [comments[n] for n in range(first, last + 1) if n in comments and n not in alone]
        if own:
            found[statement.target.id] = " ".join(own)
            continue
        block: list[str] = []
        line = first - 1
        while line in alone:
            block.insert(0, comments[line])
            line -= 1
        if block:
            found[statement.target.id] = " ".join(block)
    return found


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return str(text).replace("None | ", "").replace(" | None", " (optional)")


def _default(field: dataclasses.Field[Any], toml: bool = False) -> str:
    """``field``'s default as the reference shows it; ``toml``: the class is read from a TOML
    file, where a field holding settings of its own is a table."""
    if field.default is dataclasses.MISSING:
        if field.default_factory is not dataclasses.MISSING:
            made = field.default_factory()
            if toml and dataclasses.is_dataclass(made):
                return f"`[{field.name}]` table"
            return f"`{type(made).__name__}()`"
        return "(required)"
    value = field.default
    if isinstance(value, enum.Enum):
        return f"`{type(value).__name__}.{value.name}`"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"`{value}` ({value // size} {unit})"
    return f"`{value!r}`"


def settings(kind: str) -> list[Setting]:
    """The settings of one config class, each with its description; ``GenerationError`` names
    every field that has none."""
    module, name = CONFIGS[kind]
    cls = getattr(importlib.import_module(module), name)
    descriptions = field_descriptions(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not descriptions.get(f.name)]
    if missing:
        raise GenerationError(
            f"{module}.{name}: no comment describes {', '.join(missing)} (a comment on the "
            "field's line, or a block right above it)"
        )
    toml = kind == "bookie"  # the one read from a file
    return [
        Setting(f.name, _type_name(f.type), _default(f, toml), descriptions[f.name])
        for f in dataclasses.fields(cls)
    ]


def _bookie_flags() -> set[str]:
    """The settings ``aiobk bookie start`` also takes as flags."""
    start = _cli().commands["bookie"]
    assert isinstance(start, click.Group)
    command = start.commands["start"]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--")}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_table(kind: str) -> str:
    rows = settings(kind)
    if kind == "bookie":
        flags = _bookie_flags()
        lines = ["| setting | flag | default | meaning |", "|---|---|---|---|"]
        for s in rows:
            flag = "--" + s.name.replace("_", "-")
            shown = f"`{flag}`" if flag in flags else ""
            lines.append(f"| `{s.name}` | {shown} | {s.default} | {_cell(s.description)} |")
        return "\n".join(lines)
    lines = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{s.name}` | `{_cell(s.type)}` | {s.default} | {_cell(s.description)} |" for s in rows
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the CLI


def _cli() -> click.Group:
    return cli


def commands(
    group: click.Group | None = None, path: tuple[str, ...] = ("aiobk",)
) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context]]:
    """Every command under ``group`` (the ``aiobk`` group by default), depth first, in name
    order, with its context: asked through ``list_commands``/``get_command``, so commands a
    group loads only when named are listed too."""
    group = group or _cli()
    parent = click.Context(group, info_name=" ".join(path))
    yield path, group, parent
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            ctx = click.Context(command, info_name=name, parent=parent)
            yield (*path, name), command, ctx


@functools.cache
def _setting_descriptions() -> dict[str, str]:
    """Every bookie and autorecovery setting's description, by name: the meaning of a flag of
    the same name that has no help text of its own."""
    found = {s.name: s.description for s in settings("autorecovery")}
    found.update({s.name: s.description for s in settings("bookie")})
    return found


def _option_row(param: click.Parameter, ctx: click.Context) -> str | None:
    record = param.get_help_record(ctx)
    if record is None or isinstance(param, click.Argument):
        return None
    names, help_text = record
    setting = (param.name or "").replace("-", "_")
    described = _setting_descriptions().get(setting)
    if described and not re.sub(r"\s*\[[^\]]*\]\s*$", "", help_text).strip():
        help_text = f"{described} {help_text}".strip()
    envvar = getattr(param, "envvar", None)
    if isinstance(envvar, str) and envvar not in help_text:
        help_text = f"{help_text} (env `{envvar}`)".strip()
    return f"| `{_cell(names)}` | {_cell(help_text)} |"


def cli_reference() -> str:
    out: list[str] = []
    for path, command, ctx in commands():
        level = "#" * max(2, min(len(path), 4))
        title = " ".join(path)
        out.append(f"{level} `{title}`\n")
        help_text = inspect.cleandoc(command.help or command.short_help or "")
        usage = " ".join(command.collect_usage_pieces(ctx))
        out.append(f"```text\n{title} {usage}\n```\n")
        if help_text:
            out.append(textwrap.dedent(help_text).replace("\b\n", "") + "\n")
        rows = [row for p in command.params if (row := _option_row(p, ctx)) is not None]
        if rows:
            out.append("| option | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


# --------------------------------------------------------------------------- errors


def error_classes() -> list[type[BaseException]]:
    found = []
    for name in client_errors.__all__:
        value = getattr(client_errors, name)
        if inspect.isclass(value) and issubclass(value, client_errors.BKError):
            found.append(value)
    return sorted(found, key=lambda c: (c is not client_errors.BKError, c.__name__))


def errors_table() -> str:
    lines = ["| error | code | retriable | meaning, and what to do |", "|---|---|---|---|"]
    for cls in error_classes():
        doc = inspect.cleandoc(vars(cls).get("__doc__") or "")
        if not doc:
            raise GenerationError(f"{cls.__name__} has no docstring")
        name = f"[`{cls.__name__}`][aiobk.client.errors.{cls.__name__}]"
        code = getattr(cls, "code", "")
        retriable = "yes" if getattr(cls, "retriable", False) else "no"
        meaning = " ".join(doc.split("\n\n")[:2])
        lines.append(f"| {name} | `{int(code)}` | {retriable} | {_cell(meaning)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- metrics


class Metric(NamedTuple):
    name: str
    kind: str
    label: str
    help: str


def metrics(subsystem: str) -> list[Metric]:
    """Every figure a process exports, by its exported name, kind and help text."""
    found: list[Metric] = []
    if subsystem == "bookie":
        stats = BookieStats()
        counters = set(stats.as_dict())
        histograms = {exported.histogram_name(k) for k in stats.histograms.as_dict()}
        for name, help_text in exported.BOOKIE_HELP.items():
            if name in counters:
                found.append(Metric(f"aiobk_bookie_{name}_total", "counter", "bookie", help_text))
            elif name in histograms:
                found.append(Metric(f"aiobk_bookie_{name}", "histogram", "bookie", help_text))
            else:
                label = "bookie, dir" if name.startswith("disk_") else "bookie"
                found.append(Metric(f"aiobk_bookie_{name}", "gauge", label, help_text))
    elif subsystem == "autorecovery":
        for name, help_text in exported.AUTORECOVERY_HELP.items():
            labels = "node, bookie"
            if name in exported.AUTORECOVERY_GAUGES:
                found.append(Metric(f"aiobk_autorecovery_{name}", "gauge", labels, help_text))
            else:
                found.append(
                    Metric(f"aiobk_autorecovery_{name}_total", "counter", labels, help_text)
                )
    elif subsystem == "client":
        collector = exported.client_collector(BookKeeper("memory://docs-reference"), "docs")
        for family in collector.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            found.append(Metric(name, family.type, "client", family.documentation))
    elif subsystem == "process":
        found += [
            Metric("aiobk_build_info", "gauge", "version, python", exported.BUILD_INFO_HELP),
            Metric("aiobk_event_loop_lag_seconds", "histogram", "", exported.LOOP_LAG_HELP),
            Metric(
                "aiobk_metadata_connected",
                "gauge",
                "bookie (and node, in autorecovery)",
                exported.METADATA_CONNECTED_HELP,
            ),
        ]
    else:
        raise GenerationError(f"no metrics subsystem {subsystem!r}")
    return found


def metrics_table(subsystem: str) -> str:
    lines = ["| name | kind | labels | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{m.name}` | {m.kind} | {f'`{m.label}`' if m.label else 'none'} | {_cell(m.help)} |"
        for m in metrics(subsystem)
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the hook


def generated(kind: str, argument: str | None) -> str:
    """The Markdown a marker stands for."""
    if kind == "cli":
        return cli_reference()
    if kind == "config" and argument in CONFIGS:
        return config_table(argument)
    if kind == "errors":
        return errors_table()
    if kind == "metrics" and argument is not None:
        return metrics_table(argument)
    raise GenerationError(f"unknown marker: generated: {kind} {argument or ''}")


def expand(markdown: str) -> str:
    """``markdown`` with each marker replaced by what it stands for."""
    return MARKER.sub(lambda m: generated(m.group(1), m.group(2)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: expand the markers of every page."""
    return expand(markdown)
