"""Converted model files (ONNX, OpenVINO IR, CTranslate2): built once, cached, verified.

Exports go to a cache folder, `$INFINITY_CLOUD_CACHE` or the user cache
(`<cache>/<kind>-<digest>/`), never into the model's own folder unless asked
(`--export-into-folder`: `<model>/.infinity-cloud/`, so a model folder copied into an image
carries them); a folder that already holds exports beside it (baked into an image earlier)
serves them as they are. The digest covers the model's files
(`content_digest.model_fingerprint`: names, sizes, checksums; not their path, so a copied
folder keeps its exports) and the export options, so a new revision or option builds a new
export. A manifest, written last, records each file's size and a checksum of its content
(`content_digest.file_record`): a missing manifest (an interrupted build) or a mismatch (a
truncated or overwritten file) makes the export rebuild.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from infinity_cloud.core.content_digest import file_record, model_fingerprint, pin_fingerprint
from infinity_cloud.core.errors import InfinityCloudError, ModelLoadError
from infinity_cloud.core.progress import slow_step

log = logging.getLogger(__name__)

CACHE_ENV = "INFINITY_CLOUD_CACHE"
MANIFEST = "manifest.json"
_FORMAT = 1  # bump when the layout of an export changes
# Inside an export: what a runtime compiled from it for this machine's CPU (OpenVINO's blobs).
MACHINE_CACHE = "compiled"
# What only building an export reads: the weights (a folder's own ONNX or OpenVINO files stay:
# exports are named after them).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")

T = TypeVar("T")


BESIDE = ".infinity-cloud"  # a model folder's own exports, where asked for or baked


def cache_root(model_path: Path, beside: bool = False) -> Path:
    """Where the model's exports go: `$INFINITY_CLOUD_CACHE`; else, `beside` (asked for with
    --export-into-folder) and writable, beside the model; else beside it where exports were
    put there already (baked into an image); else the user cache; else, on a read-only
    machine (a read-only home, as in a hardened container), the temporary folder, said once,
    loudly: its exports are built again at each start."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    folder = model_path / BESIDE
    if beside:
        if writable(folder):
            return folder
        _warn_not_beside(str(model_path))
    # Exports baked beside a model (an image's folder, owned by the root that built it, read by
    # a non-root pod) are served as they are.
    if any(folder.glob(f"*/{MANIFEST}")):
        return folder
    user = user_cache()
    if writable(user) or any(user.glob(f"*/{MANIFEST}")):
        return user
    fallback = temporary_cache()
    _warn_temporary_cache(str(user), str(fallback))
    return fallback


def user_cache() -> Path:
    """The platform's user cache folder for exports ($XDG_CACHE_HOME or ~/.cache on Linux)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "infinity-cloud" / "exports"


def temporary_cache() -> Path:
    """Where exports go when nowhere else can be written: built again at each start."""
    return Path(tempfile.gettempdir()) / "infinity-cloud-exports"


def writable(folder: Path) -> bool:
    """Whether `folder` can be written, or made where it does not exist yet."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK)


@functools.cache
def _warn_read_only_cache(cache: str, fallback: str) -> None:
    log.warning(
        "the export cache %s is read-only: the exports it lacks are built in %s, again at each start",
        cache, fallback,
    )


@functools.cache
def _warn_temporary_cache(user: str, fallback: str) -> None:
    log.warning(
        "the user cache %s is not writable: exports go to %s and are built again at each start; "
        "set %s to a writable folder that persists to keep them", user, fallback, CACHE_ENV,
    )


@functools.cache
def _warn_not_beside(model: str) -> None:
    log.warning("--export-into-folder: the model folder %s is not writable; its exports go to the cache",
                model)


def export_dir(model_path: Path, kind: str, options: Mapping[str, Any], beside: bool = False) -> Path:
    key = json.dumps(
        {"format": _FORMAT, "model": model_fingerprint(model_path), "kind": kind, "options": options},
        sort_keys=True,
    )
    return cache_root(model_path, beside) / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def cached_export(
    model_path: Path,
    kind: str,
    options: Mapping[str, Any],
    build: Callable[[Path], Mapping[str, Any] | None],
    description: str,
    intermediate: bool = False,
    beside: bool = False,
) -> Path:
    """The verified export folder, building it with `build(folder)` first if needed.
    `intermediate`: only other exports are built from it (`prune` may drop it); `beside`: in
    the model's folder (`cache_root`).

    `build` writes its files into an empty folder and may return metadata to keep in the
    manifest (read back with `export_metadata`). Builds go to a private folder that is
    renamed into place, so concurrent processes never see half an export.
    """
    target = export_dir(model_path, kind, options, beside)
    if verify(target):
        return target
    if not writable(target.parent):
        # A cache baked into a read-only image (Lambda's task root, INFINITY_CLOUD_CACHE) serves
        # the exports it holds; one it lacks (a precision verdict for another CPU's kernels) is
        # built in the temporary folder, not refused with an OSError at start.
        spare = temporary_cache() / target.name
        _warn_read_only_cache(str(target.parent), str(spare.parent))
        if verify(spare):
            return spare
        target = spare
    # One build per export across processes (two servers started at once on a fresh cache):
    # the second waits here, then finds the first one's export.
    with _exclusive(target):
        if verify(target):
            return target
        return _build(target, model_path, kind, options, build, description, intermediate)


@contextlib.contextmanager
def _exclusive(target: Path) -> Iterator[None]:
    """An advisory lock (flock) for building `target`, held while it is built. The lock file
    lives in the temporary folder, named by the export's path, not beside the export: a cache
    holds exports only, and may be read-only (a model folder baked into an image)."""
    locks = Path(tempfile.gettempdir()) / "infinity-cloud-locks"
    name = hashlib.sha256(str(target.resolve()).encode()).hexdigest()[:24]
    try:
        locks.mkdir(exist_ok=True)
        lock = open(locks / f"{name}.lock", "a")  # noqa: SIM115 (held across the yield)
    except OSError as exc:  # no writable temporary folder: build unlocked, as before
        log.warning("cannot lock the %s export (%s); concurrent starts may each build it", target.name, exc)
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(
    target: Path, model_path: Path, kind: str, options: Mapping[str, Any],
    build: Callable[[Path], Mapping[str, Any] | None], description: str, intermediate: bool,
) -> Path:
    failure = _failure_record(target)
    recorded = _read_json(failure)
    if recorded and recorded.get("environment") == export_environment():
        # The same files, options and packages failed before: converting again at every start
        # would only fail again, slowly.
        raise ModelLoadError(f"{recorded['message']} (recorded in {failure}; delete it to try again)")
    if target.exists():
        log.warning("the cached %s export at %s is incomplete or corrupt; rebuilding it", kind, target)
        remove(target)
    scratch = target.with_name(f"{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    scratch.mkdir(parents=True)
    try:
        with slow_step(f"{description} (once; cached at {target})"):
            try:
                metadata = build(scratch) or {}
            except ModelLoadError as exc:
                _record_failure(failure, exc.message)
                raise
            except InfinityCloudError:
                raise
            except Exception as exc:  # a converter's own error: the model cannot be served this way
                message = f"{description} failed: {type(exc).__name__}: {exc}"
                _record_failure(failure, message)
                raise ModelLoadError(message) from exc
        _write_manifest(scratch, kind, options, metadata, intermediate)
        try:
            scratch.rename(target)
        except OSError:  # another process finished the same export first
            if not verify(target):
                raise
            remove(scratch)
        failure.unlink(missing_ok=True)
    except BaseException:
        remove(scratch)
        raise
    return target


# The packages whose versions decide whether a conversion can succeed: a failure recorded
# under other versions (say, before `onnx` was installed) is tried again.
_CONVERTERS = ("infinity-cloud", "torch", "transformers", "onnx", "onnxruntime", "openvino", "ctranslate2")


@functools.cache
def export_environment() -> dict[str, str | None]:
    import importlib.metadata

    versions: dict[str, str | None] = {}
    for name in _CONVERTERS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _failure_record(target: Path) -> Path:
    return target.with_name(f"{target.name}.failed.json")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _record_failure(path: Path, message: str) -> None:
    try:
        path.write_text(json.dumps({"message": message, "environment": export_environment()}, indent=1))
    except OSError as exc:  # a read-only cache only loses the shortcut
        log.debug("could not record the failed export at %s: %s", path, exc)


def load_cached(make: Callable[[], Path], load: Callable[[Path], T]) -> T:
    """`load(make())`, rebuilding once when a cached export verifies but does not load."""
    folder = make()
    try:
        return load(folder)
    except Exception as exc:
        log.warning("the cached export at %s does not load (%s); rebuilding it", folder, exc)
        remove(folder)
    folder = make()
    try:
        return load(folder)
    except InfinityCloudError:
        raise
    except Exception as exc:  # a fresh export the runtime cannot load: not this backend's model
        raise ModelLoadError(f"the export at {folder} does not load: {type(exc).__name__}: {exc}") from exc


def verify(folder: Path) -> bool:
    """True when the manifest exists and every file it lists is intact."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        for name, expected in manifest["files"].items():
            if file_record(folder / name) != expected:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def export_metadata(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["metadata"]


def serve_from_exports(model_path: Path) -> list[Path]:
    """Leave a model folder only what serving from its exports reads, for an image that holds
    them: its fingerprint is pinned first (so the exports keep their names), then its weights
    go (top level: a module's own folder, like 2_Dense, stays). Returns what went, relative."""
    dropped = [p for p in sorted(model_path.iterdir())
               if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name.endswith(".index.json"))]
    pin_fingerprint(model_path)
    for path in dropped:
        path.unlink()
    return [p.relative_to(model_path) for p in dropped]


def prune(root: Path) -> list[Path]:
    """Drop what an image that serves the exports under `root` as they are does not need:
    intermediate exports (what others were built from), and what was compiled for the
    building machine's CPU, which the serving one rarely is (a copy of the weights: OpenVINO
    compiles again there, in 0.1-0.2 s for MiniLM). Returns what went."""
    dropped = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")):
        if (_read_json(manifest) or {}).get("intermediate"):
            dropped.append(manifest.parent)
        elif (manifest.parent / MACHINE_CACHE).is_dir():
            dropped.append(manifest.parent / MACHINE_CACHE)
    for path in dropped:
        remove(path)
    return dropped


def size_note(export: Path) -> str:
    """An export's place and size on disk, and its compiled blobs' share, for the load's log line."""
    def size(folder: Path) -> int:
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())

    compiled = export / MACHINE_CACHE
    blobs = f", of which compiled blobs {size(compiled) / 1e6:,.0f} MB" if compiled.is_dir() else ""
    return f"{export} ({size(export) / 1e6:,.0f} MB{blobs})"


def remove(folder: Path) -> None:
    """Drop an export, e.g. one that verified but that its runtime could not load."""
    shutil.rmtree(folder, ignore_errors=True)


def _write_manifest(
    folder: Path, kind: str, options: Mapping[str, Any], metadata: Mapping[str, Any],
    intermediate: bool = False,
) -> None:
    files = {
        str(f.relative_to(folder)): file_record(f) for f in sorted(folder.rglob("*")) if f.is_file()
    }
    manifest = {"kind": kind, "options": dict(options), "metadata": dict(metadata), "files": files,
                "intermediate": intermediate}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
