"""The project's metadata builds without a setuptools warning (issue 13: the `project.license`
table form was deprecated and warned on every install)."""

from __future__ import annotations

import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_applies_without_a_setuptools_warning(monkeypatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # package discovery and the readme are relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # setuptools reports deprecations as warnings
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
