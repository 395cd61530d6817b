"""The version every layer names (core/version.py) is the one the package is built with."""

import re
from pathlib import Path

import infinity_cloud
from infinity_cloud.core.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_pyprojects_and_the_roots() -> None:
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared is not None and __version__ == declared.group(1)
    assert infinity_cloud.__version__ == __version__
