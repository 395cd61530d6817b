"""What every target offers, and the template rendering they share."""

from __future__ import annotations

import logging
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from infinity_cloud.config import DeploymentSpec

# The torch release the tests ran on; an image pins the installed one, or this without it.
TESTED_TORCH = "2.13.0"


def installed_version(package: str) -> str | None:
    """A package's version here, less any local build label (torch's +cpu), so an image's own
    index picks the build for its hardware; None when it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_version() -> str:
    """The torch version an image installs: this machine's, else the tested one."""
    return installed_version("torch") or TESTED_TORCH


def configure_logging(level: str) -> None:
    """One log format for every process a target runs (local server, container)."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


class Target(Protocol):
    name: str

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """Render the target's files from the spec; return the paths written."""
        ...


def render_templates(target: str, out_dir: Path, context: dict[str, Any]) -> list[Path]:
    """Render templates/<target>/*.j2 into out_dir (dropping .j2); copy other files as they are."""
    import jinja2

    root = resources.files("templates").joinpath(target)
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.is_file() or entry.name.startswith(("_", ".")):
            continue
        if entry.name.endswith(".j2"):
            path = out_dir / entry.name.removesuffix(".j2")
            path.write_text(env.get_template(entry.name).render(**context))
        else:
            path = out_dir / entry.name
            path.write_bytes(entry.read_bytes())
        written.append(path)
    return written


def project_source() -> Path | None:
    """The project's source tree when running from a checkout (pyproject.toml beside it)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "infinity_cloud").is_dir() else None


def copy_source(out_dir: Path) -> Path | None:
    """Copy the package's source into out_dir/src, so an image runs exactly this code."""
    root = project_source()
    if root is None:
        return None
    dest = out_dir / "src"
    if dest.exists():
        shutil.rmtree(dest)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("infinity_cloud", "targets", "templates"):
        shutil.copytree(root / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, dest / name)
    return dest


def spec_yaml(spec: DeploymentSpec) -> str:
    import yaml

    return yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
