"""What a message tells a user to install installs something: the command fits how this copy was
installed (PEP 610's direct_url.json), and every extra it names is one pyproject.toml declares."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from parsed_source import parsed

from infinity_cloud.backends.registry import _BACKENDS
from infinity_cloud.core.install_hint import command_for, install_command
from infinity_cloud.families import input_kinds

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "infinity_cloud", ROOT / "targets"]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def declared_extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def hinted_extras() -> dict[str, set[str]]:
    """Each extra the code names in a hint, with the files naming it: the literal arguments of
    every `install_command(...)` call, and the extras of the tables messages read theirs from."""
    found: dict[str, set[str]] = {}
    # Only a module that names the function can call it: the rest are not walked (walking
    # every node of every module was most of the unit tests' time).
    modules = (p for folder in SOURCES for p in folder.rglob("*.py"))
    naming = (p for p in modules if "install_command" in p.read_text(encoding="utf-8"))
    for path in naming:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_command":
                for arg in node.args:
                    if isinstance(arg, ast.Constant):
                        found.setdefault(arg.value, set()).add(path.name)
    for entry in _BACKENDS.values():
        for extra in [*entry.extras.values(), *([entry.converter] if entry.converter else [])]:
            found.setdefault(extra, set()).add("backends/registry.py")
    for extra in input_kinds().extras():  # each kind's, which preflight and the images name
        found.setdefault(extra, set()).add("families/")
    return found


def test_every_hinted_extra_is_declared() -> None:
    hinted = hinted_extras()
    assert {"vision", "audio", "torch", "export", "modal", "aws"} <= set(hinted), hinted
    unknown = {extra: files for extra, files in hinted.items() if extra not in declared_extras()}
    assert not unknown, f"hints name extras pyproject.toml does not declare: {unknown}"


def test_no_message_names_the_package_by_an_index_name_of_its_own() -> None:
    """`pip install 'infinity-cloud[vision]'` fails for a copy installed from a clone: every
    message asks install_command, which knows how this copy was installed."""
    written = re.compile(r"pip install[^\n]*infinity-cloud\[")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (p for folder in SOURCES for p in folder.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if written.search(line) and path.name != "install_hint.py"
    ]
    assert not offenders, offenders


def test_the_docs_install_extras_from_the_clone() -> None:
    """The README installs from a clone and the name is not on PyPI: a page's install line
    names the clone's folder (`pip install -e ".[modal]"`), not the package."""
    written = re.compile(r"pip install[^\n`]*[\"']infinity-cloud\[")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in DOCS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if written.search(line)
    ]
    assert not offenders, offenders


def test_this_clone_is_named_by_its_folder() -> None:
    """The suite runs on an editable install of this clone (README): the hint installs into it."""
    assert install_command("vision") == f"pip install -e '{ROOT}[vision]'"
    assert install_command("aws", upgrade=True) == f"pip install -U -e '{ROOT}[aws]'"


@pytest.mark.parametrize(("direct_url", "expected"), [
    (None, "pip install 'infinity-cloud[vision]'"),  # from an index: no direct_url.json
    ({"url": "file:///src/infinity%20cloud", "dir_info": {}}, "pip install '/src/infinity cloud[vision]'"),
    ({"url": "file:///src/ic", "dir_info": {"editable": True}}, "pip install -e '/src/ic[vision]'"),
    ({"url": "file:///tmp/infinity_cloud-0.1.0-py3-none-any.whl", "archive_info": {}},
     "pip install '/tmp/infinity_cloud-0.1.0-py3-none-any.whl[vision]'"),
    ({"url": "https://github.com/o/infinity-cloud", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     "pip install 'infinity-cloud[vision] @ git+https://github.com/o/infinity-cloud'"),
])
def test_each_kind_of_installation(direct_url: dict | None, expected: str) -> None:
    assert command_for(direct_url, ("vision",)) == expected

