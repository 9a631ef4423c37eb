"""The generated reference pages are complete: every setting of ``BookieConfig``,
``ClientConfig`` (with its ``ProtocolSwitches``) and ``AutoRecoveryConfig`` has a description
where it is defined, every command of the ``aiobk`` CLI is listed, every exported figure has a
help text, and every error class says what it means.

The generator is the MkDocs hook of the site (docs/hooks/reference.py); these tests call the
same functions ``make docs`` does, so a field added without a comment fails both.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.bookie import BookieConfig
from aiobk.client import ClientConfig, ProtocolSwitches
from aiobk.client import errors as client_errors

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _load_generator() -> ModuleType:
    name = "aiobk_docs_reference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


reference = _load_generator()


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("bookie", BookieConfig),
        ("client", ClientConfig),
        ("switches", ProtocolSwitches),
        ("autorecovery", AutoRecoveryConfig),
    ],
)
def test_every_setting_is_described(kind: str, cls: type) -> None:
    described = {s.name: s.description for s in reference.settings(kind)}
    fields = [f.name for f in dataclasses.fields(cls)]
    assert list(described) == fields
    for name, text in described.items():
        assert len(text) >= 10, f"{cls.__name__}.{name}: {text!r} says too little"


def test_a_setting_without_a_comment_fails_the_build() -> None:
    @dataclasses.dataclass
    class Settings:
        documented: int = 1  # what it does
        bare: int = 2

    found = reference.field_descriptions(Settings)
    assert found == {"documented": "what it does"}


def test_the_configuration_page_asks_for_every_table() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    for kind in reference.CONFIGS:
        assert f"<!-- generated: config {kind} -->" in page
    table = reference.expand("<!-- generated: config bookie -->")
    assert "`--tls-cert-file`" in table  # flags are shown beside their settings
    assert "| `data_dir` |" in table


def test_every_command_is_in_the_cli_reference() -> None:
    text = reference.cli_reference()
    listed = [path for path, _command, _ctx in reference.commands()]
    assert len(listed) > 30
    for path in listed[1:]:
        assert f"`{' '.join(path)}`" in text
    assert "`aiobk bench add`" in text  # loaded only when named, listed all the same


def test_every_option_of_every_command_is_listed() -> None:
    text = reference.cli_reference()
    for _path, command, _ctx in reference.commands():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in text, f"{command.name}: {param.opts[0]}"


def test_every_error_class_is_in_the_errors_table() -> None:
    table = reference.errors_table()
    for name in client_errors.__all__:
        value = getattr(client_errors, name)
        if isinstance(value, type) and issubclass(value, client_errors.BKError):
            assert f"[`{name}`]" in table


@pytest.mark.parametrize("subsystem", ["bookie", "autorecovery", "client"])
def test_every_metric_has_a_meaning(subsystem: str) -> None:
    found = reference.metrics(subsystem)
    assert found
    for metric in found:
        assert metric.name.startswith(f"aiobk_{subsystem}_")
        assert len(metric.help) >= 10, metric


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(reference.GenerationError):
        reference.expand("<!-- generated: nothing -->")


def test_every_spark_option_is_in_the_spark_guide() -> None:
    source = (Path(__file__).resolve().parents[2] / "pipeline" / "options.py").read_text()
    read = set(
        re.findall(r'(?:options(?:\.get)?[\[(]|_(?:int|bool|bounds)\(options, )"(\w+)"', source)
    )
    read |= set(re.findall(r'\("(?:ca|cert|key)", "(\w+)"\)', source))
    assert {"metadata", "logPattern", "maxTriggerDelay", "tlsCa", "split"} <= read
    guide = (DOCS / "guide" / "spark.md").read_text()
    for option in sorted(read):
        assert f"`{option}`" in guide, option


def test_every_option_says_what_it_does() -> None:
    bare = []
    for line in reference.cli_reference().splitlines():
        match = re.fullmatch(r"\| `(--[^`]+)` \| (.*) \|", line)
        if match and not re.sub(r"\[[^\]]*\]|\(env `[^`]+`\)", "", match.group(2)).strip():
            bare.append(match.group(1))
    assert not bare, f"options without a help text: {bare}"
