"""What every container image needs, written once for every target that builds one (local
Docker, Modal, and the AWS targets): the backend each model will serve on and the extras
that install it, the package's dependencies pinned to the tested versions, a copy of the
package itself, where local model folders go, the refusal of keys that would land in a
file, and concurrency and queue sizing from the batcher.

This runs on the deploying machine; `runtime.py` is its counterpart inside the container.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infinity_cloud.backends.registry import (
    backend_entry,
    backend_extra,
    converter_extra,
    device_kind,
    resolve_auto,
)
from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.families import input_kinds
from infinity_cloud.models.model_source import folder_model_name, local_model_dir
from infinity_cloud.targets.base import IMAGE_DEVICE_ENV
from infinity_cloud.targets.platforms import ImagePlatform

if TYPE_CHECKING:
    from packaging.requirements import Requirement

# The torch release the tests ran on; an image pins the installed one, or this without it.
TESTED_TORCH = "2.13.0"
# PyTorch's own index has a wheel of each torch release per CUDA build (cu126, cu130, ...);
# PyPI has only the newest CUDA's, which may need a newer driver than a platform's hosts run.
TORCH_INDEX = "https://download.pytorch.org/whl/{build}"
TORCH_CPU_INDEX = TORCH_INDEX.format(build="cpu")
# The CUDA builds PyTorch's index publishes for each torch release (RFC pytorch/pytorch#178665:
# 2.12 dropped CUDA 12.8; pytorch/FBGEMM#5976 counted torch 2.13's wheels on the index: cu126
# and cu130, no cu128). Kept here because this machine cannot reach that index to ask.
TORCH_CUDA_BUILDS = {
    "2.11": ("cu126", "cu128", "cu130"), "2.12": ("cu126", "cu130"), "2.13": ("cu126", "cu130"),
}
PACKAGE = "infinity_cloud"
REQUIREMENTS_FILE = "requirements.txt"
# What a CPU image's run stage installs once its exports are built: no torch (`serving_requirements`).
SERVING_REQUIREMENTS_FILE = "requirements-serving.txt"


def installed_version(package: str) -> str | None:
    """A package's version here, less any local build label (torch's +cpu), so an image's own
    index picks the build for its hardware; None when it is not installed."""
    try:
        return importlib.metadata.version(package).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_version() -> str:
    """The torch version an image installs: this machine's, else the tested one."""
    return installed_version("torch") or TESTED_TORCH


def image_env(device: str) -> dict[str, str]:
    """Variables an image sets for what runs in it: a GPU image names its device, so that it
    refuses to start where it finds no usable GPU (`runtime.check_image_device`)."""
    return {IMAGE_DEVICE_ENV: device} if device == "cuda" else {}


def serving_backend(model: ModelSpec, device: str) -> str:
    """The backend a container on `device` (cpu, cuda, neuron) will run `model` with: `auto`
    resolves to its first choice there, which the image installs."""
    return resolve_auto(model.backend, device)


def check_backends(spec: DeploymentSpec, device: str, where: str) -> None:
    """Every model's backend runs on the container's device, takes its dtype, and has an
    extra that installs it there; refused before anything is built."""
    for model in spec.models:
        name = serving_backend(model, device)
        entry = backend_entry(name)
        if model.device != "auto" and device_kind(model.device) != device:
            raise ConfigError(f"model {model.name}: device {model.device} in a {device} container ({where})")
        if backend_extra(name, device) is None:
            runs_on = list(entry.devices)
            raise ConfigError(
                f"model {model.name}: the {name} backend is packaged for {' and '.join(runs_on)} "
                f"containers only, and {where} runs on {device}"
            )
        if model.dtype not in ("auto", "fastest") and model.dtype not in entry.dtypes:
            raise ConfigError(
                f"model {model.name}: the {name} backend takes {', '.join(entry.dtypes)} (or auto), "
                f"not {model.dtype}"
            )


def media_extras() -> tuple[str, ...]:
    """What the kinds of input the families declare need decoded (image and audio: Pillow,
    httpx, soundfile, soxr, a few MB): every image gets them, since whether a hub model reads
    images is only known from its files."""
    return input_kinds().extras()


def image_extras(spec: DeploymentSpec, device: str) -> tuple[str, ...]:
    """The package extras the image needs: each model's serving backend's, on its device, and
    the media extras, and each backend's converter, which builds the exports at build time
    (an image's run stage leaves it out: `serving_requirements`)."""
    backends = {serving_backend(m, device) for m in spec.models}
    extras = {backend_extra(name, device) for name in backends} | {converter_extra(name) for name in backends}
    if spec.server.cache_url:  # the shared result cache's client
        extras.add("cache")
    if spec.server.otlp_endpoint:  # traces' SDK (server/tracing.py)
        extras.add("tracing")
    return tuple(sorted({extra for extra in extras if extra} | set(media_extras())))


def declared_requirements(extras: tuple[str, ...], more: tuple[str, ...] = ()) -> list[Requirement]:
    """The package's dependencies (core and `extras`) as it declares them, and `more`; torch
    is left out: it is installed on its own, from the index that fits the hardware."""
    from packaging.requirements import Requirement

    try:
        declared = importlib.metadata.requires("infinity-cloud") or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "infinity-cloud is not installed as a package here, so its pinned dependencies are "
            "unknown: pip install . (or -e .) first"
        ) from None
    found: dict[str, Requirement] = {}
    for line in [*declared, *more]:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        if req.name != "torch" and req.name not in found:
            req.marker = None
            found[req.name] = req
    return list(found.values())


def _pin(req: Requirement, version: str | None) -> str:
    extras_of = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras_of}" + (f"=={version}" if version else str(req.specifier))


def pinned_requirements(
    extras: tuple[str, ...], platform: ImagePlatform | None = None, *,
    exact: frozenset[str] = frozenset(), more: tuple[str, ...] = (),
) -> list[str]:
    """The package's dependencies (core, `extras` and `more`) pinned for an image on
    `platform`: each at the version the tests ran here where a wheel of it installs there,
    else the newest below it that does (an older Python, another CPU), resolved from the
    package index. `exact` packages must install at the tested version (what `build` made
    with them must load there), or the build is refused. Packages the base image ships stay
    as it has them. Without a platform, or without the index: the tested versions, as is."""
    from packaging.utils import canonicalize_name

    from infinity_cloud.targets import resolution

    reqs = declared_requirements(extras, more)
    tested = {req.name: installed_version(req.name) for req in reqs}
    shipped = {canonicalize_name(name) for name, _ in platform.shipped} if platform else set()
    as_tested = [_pin(req, tested[req.name]) for req in reqs if canonicalize_name(req.name) not in shipped]
    if platform is None or not resolution.enabled():
        return as_tested
    wanted = []
    for req in reqs:
        version = tested[req.name]
        if version is None or canonicalize_name(req.name) in shipped:  # the image's own, if in range
            wanted.append(str(req))
        elif req.name in exact:
            wanted.append(_pin(req, version))
        else:  # the tested version, or the newest before it that installs there
            wanted.append(f"{_pin(req, None)}{',' if req.specifier else ''}<={version}")
    try:
        resolved = resolution.resolve(wanted, platform)
    except resolution.IndexUnreachable as exc:
        _warn_unchecked(platform, str(exc))
        return as_tested
    pins = []
    for req in reqs:
        name = canonicalize_name(req.name)
        if name in shipped:
            continue
        version = resolved[name]
        if tested[req.name] not in (None, version):
            print(f"note: {req.name} {version} in the image, not {tested[req.name]} as here: the newest that "
                  f"installs on {platform}", file=sys.stderr)
        pins.append(_pin(req, version))
    return pins


def check_installs(requirement: str, platform: ImagePlatform | None) -> None:
    """A package installed on its own (torch, from its own index) has a wheel for `platform`."""
    from infinity_cloud.targets import resolution

    if platform is None or not resolution.enabled():
        return
    try:
        resolution.resolve([requirement], platform, deps=False)
    except resolution.IndexUnreachable as exc:
        _warn_unchecked(platform, str(exc))


@functools.cache
def _warn_unchecked(platform: ImagePlatform, why: str) -> None:
    print(
        f"warning: could not ask the package index ({why}), so the image's requirements are the "
        f"versions tested here, unchecked for {platform}: build where the index is reachable to "
        "check them (pip's own configuration names the index)", file=sys.stderr,
    )


def serving_requirements(
    spec: DeploymentSpec, device: str, platform: ImagePlatform | None = None, *,
    exact: frozenset[str] = frozenset(), more: tuple[str, ...] = (),
) -> list[str]:
    """The pins an image's run stage needs once the exports are built: the core, the media
    extras, `more`, and only the packages each model's backend serves with (no torch,
    transformers or onnx for OpenVINO and ONNX Runtime). Pinned as the whole image is, so
    the two stages agree."""
    from packaging.requirements import Requirement

    keep = {pkg for m in spec.models for pkg in backend_entry(serving_backend(m, device)).serving_packages}
    keep |= {req.name for req in declared_requirements(media_extras(), more)}
    pins = pinned_requirements(image_extras(spec, device), platform, exact=exact, more=more)
    return [pin for pin in pins if Requirement(pin).name in keep]


def write_requirements(out_dir: Path, requirements: list[str], name: str = REQUIREMENTS_FILE) -> Path:
    path = out_dir / name
    path.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    return path


def stage_package(out_dir: Path) -> Path:
    """Copy the package as it is installed (infinity_cloud/, with its targets and templates
    inside) to out_dir/infinity_cloud, so an image runs exactly this code. Works from an
    editable checkout, where targets/ and templates/ sit beside the package, and from a
    plain install alike."""
    dest = out_dir / PACKAGE
    if dest.exists():
        shutil.rmtree(dest)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    root = Path(importlib.import_module(PACKAGE).__file__).parent  # type: ignore[arg-type]
    shutil.copytree(root, dest, ignore=ignore)
    for sub in ("targets", "templates"):
        folder = Path(importlib.import_module(f"{PACKAGE}.{sub}").__file__).parent  # type: ignore[arg-type]
        if not (dest / sub).exists():
            shutil.copytree(folder, dest / sub, ignore=ignore)
    return dest


def local_model_dirs(spec: DeploymentSpec, image_root: str) -> dict[str, str]:
    """Model ids that are folders on this machine -> where the image holds their copy. A
    path-like id that is not a folder raises here, before anything is built."""
    dirs: dict[str, str] = {}
    for i, model in enumerate(spec.models):
        path = local_model_dir(model.model_id)
        if path is not None:
            dirs[model.model_id] = f"{image_root}/local/{i}-{path.name}"
    return dirs


def copy_local_models(
    spec: DeploymentSpec, out_dir: Path, image_root: str
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Copy each local model folder (less its exports) into out_dir/models for an image's
    build context. Returns model id -> image path, and (copy relative to out_dir, image path)."""
    model_dirs = local_model_dirs(spec, image_root)
    copies = []
    for model_id, image_path in model_dirs.items():
        dest = out_dir / "models" / Path(image_path).name
        if dest.exists():
            shutil.rmtree(dest)
        source = Path(model_id).expanduser().resolve()
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".infinity-cloud"))
        copies.append((dest.relative_to(out_dir).as_posix(), image_path))
    return model_dirs, copies


def served_name(model: ModelSpec) -> str:
    """The name an image serves a model under: its served name, else its hub id, else (a
    local folder) a name that says which model it holds (`folder_model_name`: the default
    model's package folder is the default model's id, not `model`), never where it lies on
    the building machine."""
    if model.served_model_name:
        return model.served_model_name
    path = local_model_dir(model.model_id)
    return folder_model_name(path) if path is not None else model.model_id


def with_served_names(spec: DeploymentSpec) -> DeploymentSpec:
    """The spec with each local folder's model named as `served_name` says."""
    models = tuple(
        m if m.served_model_name or local_model_dir(m.model_id) is None
        else m.model_copy(update={"served_model_name": served_name(m)})
        for m in spec.models
    )
    names = [m.name for m in models]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"two models would be served as {twice[0]!r} (local folders of that name): "
                          "give each a --served-model-name")
    return spec.model_copy(update={"models": models})


def image_spec(spec: DeploymentSpec, model_dirs: dict[str, str], **server: Any) -> DeploymentSpec:
    """The spec an image serves: no target sections, local folders at their copies in the
    image, and the server settings given (host, port, limits)."""
    from infinity_cloud.targets.runtime import container_spec

    served = container_spec(served_spec_data(spec), model_dirs)
    return served.model_copy(update={"server": served.server.model_copy(update=server)})


def hub_models(spec: DeploymentSpec) -> list[tuple[str, str | None]]:
    """(model id, revision) of each model the image fetches from the hub."""
    return [(m.model_id, m.revision) for m in spec.models if local_model_dir(m.model_id) is None]


def refuse_spec_keys(spec: DeploymentSpec, instead: str) -> None:
    """API keys in the spec would be written into the rendered files; `instead` says where
    this target takes them from (the platform's secret store, the container's environment)."""
    if spec.server.api_keys:
        raise ConfigError(f"API keys given in the spec would be written into the deployment files; {instead}")


def batch_size(spec: DeploymentSpec, device: str) -> int:
    """The largest batch any model's serving backend cuts."""
    from infinity_cloud.models.batch_budget import max_batch_size

    return max(max_batch_size(m, serving_backend(m, device)) for m in spec.models)


def concurrency(
    spec: DeploymentSpec, device: str, limit: int | None, target: int | None, devices: int = 1
) -> tuple[int, int]:
    """(max, target) concurrent requests per container, from the batcher's limits unless given.

    The autoscaler aims for two batches' worth of requests per container (one running, one
    forming; beyond that requests only wait), and a container takes up to eight batches'
    worth while new ones start; with `devices` GPUs, each an engine replica with its own
    batches, that many times as much. One given bounds the other's default.
    """
    batch = batch_size(spec, device) * devices
    limit = limit or max(target or 0, 8 * batch)
    return limit, target or min(2 * batch, limit)


def queue_sized_for(spec: DeploymentSpec, max_requests: int) -> DeploymentSpec:
    """The spec with each model's input queue large enough for every request the platform
    admits at once, each as large as the server allows.

    A platform counts requests, not inputs: with a smaller queue a few bulk requests would
    fill it, and the engine would answer 429 while the platform, seeing few requests, never
    scales out. With this, the platform's own limit is the only one that rejects, and
    requests that wait raise the count it scales on.
    """
    needed = max_requests * spec.server.limits.max_inputs_per_request
    models = tuple(m.model_copy(update={"queue_size": max(m.queue_size, needed)}) for m in spec.models)
    return spec.model_copy(update={"models": models})


def within_platform(
    spec: DeploymentSpec, request_limit_s: float | None, memory_mb: int | None
) -> DeploymentSpec:
    """The spec fitted to the platform's own limits.

    - `request_limit_s`, the platform's limit on one request (SageMaker's 60 s, a Lambda
      function's time-out, Modal's 150 s for a web request), becomes each model's: a request
      whose own work alone passes it on an idle server is a 413 naming what fits (the
      platform would cut it off anyway), one that would pass it behind others a 429.
    - Each model's deadline (for waiting) at most half of it: a request admitted to wait
      longer would be answered after the platform gave up on it (a 429 at once lets the
      client retry, another container or later); the other half is for serving it.
    - The memory budget, unless one is declared, 90 % of the platform's memory setting, which
      the container may not see as a cgroup limit.
    """
    from infinity_cloud.admission.memory import DETECTED_SHARE

    models = spec.models
    if request_limit_s is not None:
        half = request_limit_s / 2
        models = tuple(
            m.model_copy(update={
                "request_limit_s": min(request_limit_s, m.request_limit_s or request_limit_s),
                "deadline_s": half if m.deadline_s is None or m.deadline_s > half else m.deadline_s,
            })
            for m in models
        )
    limits = spec.server.limits
    if memory_mb is not None and limits.memory_budget_mb is None:
        limits = limits.model_copy(update={"memory_budget_mb": int(memory_mb * DETECTED_SHARE)})
    server = spec.server.model_copy(update={"limits": limits})
    return spec.model_copy(update={"models": models, "server": server})


def served_spec_data(spec: DeploymentSpec) -> dict[str, Any]:
    """The container's copy of the spec: what it serves, not how it is deployed (no target
    sections), less defaults."""
    return spec.model_dump(mode="json", exclude_defaults=True, exclude=set(spec.sections()))
