"""The pip command that adds one of this package's extras, for how this copy was installed.

Every message that says what to install asks here: `pip install 'infinity-cloud[vision]'` installs
nothing for a copy installed from a clone (the name is not on PyPI). pip records how it
installed a package in its `direct_url.json` (PEP 610): a clone's folder, editable or not, a
wheel or archive, or a VCS URL; none for a package from an index. Read only when a message is
made: importing the package stays cheap (tests/test_cold_start.py).
"""

from __future__ import annotations

import functools
import json
import shlex
from typing import Any

DISTRIBUTION = "infinity-cloud"


def install_command(*extras: str, upgrade: bool = False) -> str:
    """`pip install ...` that adds `extras` to this installation (`upgrade`: `-U`, for a newer
    dependency); tests/unit/test_install_hint.py checks each extra a message names is declared."""
    command = command_for(_direct_url(), extras)
    return command.replace("pip install ", "pip install -U ", 1) if upgrade else command


def command_for(direct_url: dict[str, Any] | None, extras: tuple[str, ...]) -> str:
    """The command for an installation pip described by `direct_url` (PEP 610), None for one
    from an index."""
    wanted = f"[{','.join(extras)}]" if extras else ""
    url = str((direct_url or {}).get("url") or "")
    if url.startswith("file://"):
        from urllib.parse import unquote, urlparse

        path = unquote(urlparse(url).path)
        editable = bool(direct_url.get("dir_info", {}).get("editable")) if direct_url else False
        return f"pip install {'-e ' if editable else ''}{shlex.quote(path + wanted)}"
    if direct_url and "vcs_info" in direct_url:
        vcs = direct_url["vcs_info"].get("vcs", "git")
        return f"pip install {shlex.quote(f'{DISTRIBUTION}{wanted} @ {vcs}+{url}')}"
    if url:  # an archive from a URL
        return f"pip install {shlex.quote(f'{DISTRIBUTION}{wanted} @ {url}')}"
    return f"pip install {shlex.quote(DISTRIBUTION + wanted)}"


@functools.cache
def _direct_url() -> dict[str, Any] | None:
    """pip's record of this installation. Every distribution of the name on the path is asked,
    not only the first: run from a clone, the `infinity_cloud.egg-info` that the editable build
    leaves in it comes first on the path and has no record."""
    from importlib.metadata import distributions

    for found in distributions(name=DISTRIBUTION):
        text = found.read_text("direct_url.json")
        if not text:
            continue
        try:
            return json.loads(text)
        except ValueError:
            return None
    return None
