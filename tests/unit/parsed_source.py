"""Source files read and parsed once per test run: the structure tests (layers, dialect
routes, install hints) walk the same modules, and parsing all of them was most of their time.
The trees are shared, so a test only reads them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
