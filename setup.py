"""The packages, found: `infinity_cloud/` and, installed inside it, the repository's top-level
`targets/` and `templates/` (so no generic top-level name lands in site-packages). The rest of
the project's metadata is in pyproject.toml; pyproject alone cannot find packages under
another name, and a hand-kept list missed each new target."""

from setuptools import find_namespace_packages, setup

INSIDE = ("targets", "templates")  # top-level folders installed as infinity_cloud.<name>


def found(top: str, prefix: str = "") -> list[str]:
    return [prefix + name for name in find_namespace_packages(include=[top, f"{top}.*"])
            if "__pycache__" not in name]


setup(
    packages=found("infinity_cloud") + [p for top in INSIDE for p in found(top, "infinity_cloud.")],
    package_dir={"infinity_cloud": "infinity_cloud", **{f"infinity_cloud.{top}": top for top in INSIDE}},
)
