"""The documentation site builds offline with --strict (every page in the nav, every link
and anchor found), with the README as its front page; every example states its install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_site_builds_strictly_offline_with_the_readme_as_its_front_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    environ = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    run = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, encoding="utf-8",
                         errors="replace", timeout=300)
    assert run.returncode == 0, run.stderr
    front = (site / "index.html").read_text(encoding="utf-8")
    assert "Two commands" in front and 'href="migrating-from-infinity/"' in front
    for page in ("models", "clients", "under-load", "backends", "targets/modal", "benchmarks"):
        assert (site / page / "index.html").is_file(), page
    assert "fonts.googleapis.com" not in front  # nothing fetched by a reader's browser either


def test_every_example_says_what_it_needs_installed() -> None:
    examples = list((ROOT / "examples").rglob("*.py"))
    assert examples
    for example in examples:
        head = example.read_text(encoding="utf-8")[:1500]
        imports = {line.split()[1].split(".")[0] for line in head.splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        # Beside the standard library, numpy and infinity-cloud itself, each import's install is said.
        said = " ".join(line for line in head.splitlines() if "pip install" in line)
        for module in imports - set(sys.stdlib_module_names) - {"numpy", "infinity_cloud"}:
            assert module in said, (example, module)
        if "infinity_cloud.targets.sagemaker" in head:  # boto3 comes with the aws extra
            assert ".[aws]" in said, example


def test_pointers_to_the_readme_and_the_examples_lead_somewhere() -> None:
    """A file that sends a reader to "the README's X section" finds such a heading there (the
    deployment sections moved to docs/targets/), and the examples' index names every example."""
    import re

    headings = [line.lower() for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("#")]
    files = [p for folder in ("examples", "templates", "docs", "targets") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in {".md", ".j2", ".yaml", ".py", ".txt", ""}]
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for section in re.findall(r"README's ([\w-]+) section", text):
            assert any(section.lower() in heading for heading in headings), (path, section)
    index = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for example in (ROOT / "examples").iterdir():
        if example.name != "README.md" and not example.name.startswith((".", "__")):
            assert f"`{example.name}" in index, example.name
