"""The Modal target: render a Modal app from the spec, then deploy, inspect or stop it with
the Modal client. Rendering is a pure function of the spec; only `deploy`, `status` and
`delete` talk to Modal."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pprint
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from infinity_cloud.config import DeploymentSpec
from infinity_cloud.errors import ConfigError, InfinityCloudError
from infinity_cloud.model_source import local_model_dir
from targets.base import render_templates, spec_yaml
from targets.modal.entry import API_KEY_ENV

APP_FILE = "modal_app.py"
CLASS_NAME = "Server"
WEB_METHOD = "serve"
# Where local model folders go in the image, and the hub cache the build step fills.
IMAGE_MODELS = "/models"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# A batch of this many inputs when the spec leaves the size to the backend (the torch
# backend's default on a GPU).
DEFAULT_BATCH = 64


class ModalError(InfinityCloudError):
    """Modal is missing, not logged in, or refused a call."""


NO_CREDENTIALS = (
    "no Modal credentials: run `modal token new` (it writes ~/.modal.toml), or set "
    "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (from https://modal.com/settings/tokens), then run this again"
)


def import_modal() -> ModuleType:
    try:
        import modal
    except ImportError:
        raise ModalError("the Modal client is not installed: pip install 'infinity-cloud[modal]'") from None
    return modal


def require_credentials() -> None:
    """Refuse early, before building anything, when the Modal client has no token to send."""
    modal = import_modal()
    config = modal.config.config
    if not (config.get("token_id") and config.get("token_secret")):
        raise ModalError(NO_CREDENTIALS)


def concurrency(spec: DeploymentSpec) -> tuple[int, int]:
    """(max_inputs, target_inputs) for `@modal.concurrent`, from the batcher's limits.

    The autoscaler aims for two batches' worth of requests per container (one running, one
    forming: beyond that, requests only wait) and lets a container queue eight while new
    ones start, never more than its queue holds.
    """
    batch = max(m.max_batch_size or DEFAULT_BATCH for m in spec.models)
    queue = min(m.queue_size for m in spec.models)
    given_limit, given_target = spec.modal.max_inputs, spec.modal.target_inputs
    limit = given_limit or max(given_target or 0, min(queue, 8 * batch))
    # Both given and crossed is refused by the spec; one given bounds the other's default.
    target = given_target or min(2 * batch, limit)
    return limit, target


def pinned_requirements(extras: tuple[str, ...]) -> list[str]:
    """The package's dependencies (core and `extras`), each pinned to the version installed
    here, so the image runs the versions the tests ran; a missing one keeps its range."""
    from packaging.requirements import Requirement

    pins = []
    for line in importlib.metadata.requires("infinity-cloud") or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        if req.name == "torch":
            continue  # installed on its own, from the index that fits the hardware
        try:
            version = importlib.metadata.version(req.name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            pins.append(f"{req.name}{_extras(req)}{req.specifier}")
            continue
        pins.append(f"{req.name}{_extras(req)}=={version}")
    return pins


def _extras(req: Any) -> str:
    return f"[{','.join(sorted(req.extras))}]" if req.extras else ""


def torch_requirement() -> str:
    try:
        return "torch==" + importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "torch"


def local_model_dirs(spec: DeploymentSpec) -> dict[str, str]:
    """Model ids that are folders on this machine -> where the image holds their copy."""
    dirs: dict[str, str] = {}
    for i, model in enumerate(spec.models):
        path = local_model_dir(model.model_id)
        if path is not None:
            dirs[model.model_id] = f"{IMAGE_MODELS}/local/{i}-{path.name}"
    return dirs


def check_deployable(spec: DeploymentSpec) -> None:
    if spec.server.api_keys:
        raise ConfigError(
            "API keys given in the spec would be written into the Modal app file; put them in a "
            f"Modal secret instead (modal secret create NAME {API_KEY_ENV}=KEY) and pass --secret NAME"
        )
    local_model_dirs(spec)  # a path-like model id that is not a folder raises here


def python_literal(value: Any) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def render_context(spec: DeploymentSpec) -> dict[str, Any]:
    modal_spec = spec.modal
    gpu = list(modal_spec.gpu)
    max_inputs, target_inputs = concurrency(spec)
    extras = ("torch",) if gpu else ("torch", "openvino")
    # The container's copy of the spec: what it serves, not how it is deployed.
    served = spec.model_dump(mode="json", exclude_defaults=True, exclude={"modal"})
    model_dirs = local_model_dirs(spec)
    return {
        "spec": spec,
        "modal": modal_spec,
        "spec_literal": python_literal(served),
        "model_dirs_literal": python_literal(model_dirs),
        "model_dirs_items": list(model_dirs.items()),
        "gpu_literal": repr(gpu[0] if len(gpu) == 1 else gpu or None),
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": torch_requirement(),
        "torch_index": None if gpu else TORCH_CPU_INDEX,
        "requirements": pinned_requirements(extras),
        "max_inputs": max_inputs,
        "target_inputs": target_inputs,
        # GPUs are only reachable during a snapshot with Modal's GPU snapshots (alpha).
        "gpu_snapshot": bool(gpu) and modal_spec.memory_snapshot,
        "class_name": CLASS_NAME,
        "web_method": WEB_METHOD,
        "image_models": IMAGE_MODELS,
    }


def load_app_module(path: Path) -> ModuleType:
    """Import a rendered app file with the real Modal client (which validates it)."""
    import_modal()
    name = f"infinity_cloud_modal_app_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ModalError(f"the rendered Modal app {path} does not load: {type(exc).__name__}: {exc}") from exc
    return module


@dataclass(frozen=True)
class Deployment:
    app_name: str
    environment: str | None
    url: str | None


def usage_examples(url: str, model: str, *, api_key: bool) -> str:
    """A ready `curl` and `openai` call against a deployed endpoint."""
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if api_key else ""
    key = f'os.environ["{API_KEY_ENV}"]' if api_key else '"unused"'
    return f"""curl {url}/embeddings{auth} -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "input": ["Hello from Modal"]}}'

python - <<'PY'
import os
from openai import OpenAI
client = OpenAI(base_url="{url}", api_key={key})
result = client.embeddings.create(model="{model}", input=["Hello from Modal"])
print(len(result.data[0].embedding))
PY"""


class ModalTarget:
    name = "modal"

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """The Modal app file and, for reading or redeploying with --config, the spec."""
        check_deployable(spec)
        out_dir = Path(out_dir)
        written = render_templates("modal", out_dir, render_context(spec))
        (out_dir / "infinity-cloud.yaml").write_text(spec_yaml(spec))
        return [*written, out_dir / "infinity-cloud.yaml"]

    def load(self, out_dir: Path) -> ModuleType:
        return load_app_module(Path(out_dir) / APP_FILE)

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        """Render, import with the Modal client, and (unless a dry run) deploy; returns where."""
        if not dry_run:
            require_credentials()
        self.build(spec, out_dir)
        module = self.load(out_dir)
        if dry_run:
            return None
        modal = import_modal()
        try:
            with modal.enable_output():
                module.app.deploy(name=spec.modal.app_name, environment_name=spec.modal.environment)
        except modal.exception.AuthError:
            raise ModalError(NO_CREDENTIALS) from None
        except modal.exception.Error as exc:
            raise ModalError(f"Modal refused the deployment: {exc}") from exc
        return Deployment(spec.modal.app_name, spec.modal.environment, _deployed_url(module))

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """The deployed app's state and endpoint URL, from Modal."""
        modal = import_modal()
        require_credentials()
        name, environment = spec.modal.app_name, spec.modal.environment
        try:
            app = modal.App.lookup(name, environment_name=environment)
            info = app.info()
            server = modal.Cls.from_name(name, CLASS_NAME, environment_name=environment)()
            url = getattr(server, WEB_METHOD).get_web_url()
        except modal.exception.NotFoundError:
            raise ModalError(f"no Modal app named {name!r}{_in(environment)}") from None
        except modal.exception.Error as exc:
            raise ModalError(f"Modal did not answer: {exc}") from exc
        return {
            "app": name, "app_id": info.app_id, "state": info.lifecycle.state.value,
            "deployed_at": str(info.lifecycle.deployed_at), "url": url,
        }

    def delete(self, spec: DeploymentSpec) -> None:
        """Stop the deployed app: its containers end and its URL stops answering."""
        modal = import_modal()
        require_credentials()
        name, environment = spec.modal.app_name, spec.modal.environment
        try:
            modal.App.lookup(name, environment_name=environment).stop()
        except modal.exception.NotFoundError:
            raise ModalError(f"no Modal app named {name!r}{_in(environment)}") from None
        except modal.exception.Error as exc:
            raise ModalError(f"Modal did not answer: {exc}") from exc


def _in(environment: str | None) -> str:
    return f" in environment {environment!r}" if environment else ""


def _deployed_url(module: ModuleType) -> str | None:
    """The endpoint's URL, which a real deployment leaves on the objects it hydrated (and
    their app then has an id)."""
    if module.app.app_id is None:
        return None
    return getattr(getattr(module, CLASS_NAME)(), WEB_METHOD).get_web_url()

