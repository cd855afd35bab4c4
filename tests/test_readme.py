"""The README's test command is the one CI runs, and what it installs is what the test run asks for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text("utf-8")


def readme_test_command() -> str:
    """The shell block after "One command installs what the tests need"."""
    after = README[README.index("One command installs what the tests need"):]
    block = re.search(r"```sh\n(.*?)\n```", after, flags=re.DOTALL)
    assert block is not None
    return block.group(1)


def test_ci_ends_with_the_readme_test_command():
    command = readme_test_command()
    assert command.startswith("sudo apt-get update") and command.endswith("python -m pytest"), command
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert ci.rstrip("\n").endswith("\n" + command), "the last lines of .ci/run are not the README's test command"


def test_the_test_extra_brings_what_the_default_options_use():
    """addopts runs pytest-xdist (-n): `pip install -e '.[test]'` must install it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"].split()
    extras = project["project"]["optional-dependencies"]
    assert "-n" in addopts
    assert any(req.startswith("pytest-xdist") for req in extras["test"]), extras["test"]
    assert "pip install -e '.[test]'" in readme_test_command()
    assert "pip install -e '.[test-torch]'" in README
    assert {req.split("=")[0].split(">")[0] for req in extras["test-torch"]} >= {"torch", "transformers"}
