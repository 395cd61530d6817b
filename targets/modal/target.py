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

from infinity_cloud.backends.registry import auto_order, backend_extra
from infinity_cloud.config import DeploymentSpec, ModelSpec
from infinity_cloud.errors import ConfigError, InfinityCloudError
from infinity_cloud.model_source import local_model_dir
from infinity_cloud.served_model import max_batch_size
from targets.base import installed_version, render_templates, spec_yaml, torch_version
from targets.modal.entry import ENDPOINT_KEYS_ENV

APP_FILE = "modal_app.py"
CLASS_NAME = "Server"
WEB_METHOD = "serve"
# Where local model folders go in the image, and the hub cache the build step fills.
IMAGE_MODELS = "/models"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What the image can run on a GPU: their pip packages bring CUDA. ONNX Runtime (which would
# need onnxruntime-gpu) and OpenVINO are packaged for the CPU variant only.
GPU_BACKENDS = ("torch", "ctranslate2")
# Client-side variable in the printed examples, for the key the endpoint checks.
CLIENT_KEY_ENV = "INFINITY_CLOUD_ENDPOINT_KEY"


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


def serving_backend(model: ModelSpec, gpu: bool) -> str:
    """The backend a container will run `model` with: `auto` resolves to its first choice,
    which the image installs."""
    return auto_order(gpu)[0] if model.backend == "auto" else model.backend


def image_extras(spec: DeploymentSpec) -> tuple[str, ...]:
    """The package extras the image needs: torch (to export models at build time, and to
    serve on a GPU) and each model's backend."""
    extras = {"torch"}
    for model in spec.models:
        extra = backend_extra(serving_backend(model, bool(spec.modal.gpu)))
        if extra:
            extras.add(extra)
    return tuple(sorted(extras))


def concurrency(spec: DeploymentSpec) -> tuple[int, int]:
    """(max_inputs, target_inputs) for `@modal.concurrent`, from the batcher's limits.

    Sized for query traffic (a few inputs per request): the autoscaler aims for two batches'
    worth of requests per container (one running, one forming; beyond that requests only
    wait), and a container takes up to eight batches' worth while new ones start.
    """
    gpu = bool(spec.modal.gpu)
    batch = max(max_batch_size(m, serving_backend(m, gpu)) for m in spec.models)
    given_limit, given_target = spec.modal.max_inputs, spec.modal.target_inputs
    limit = given_limit or max(given_target or 0, 8 * batch)
    # Both given and crossed is refused by the spec; one given bounds the other's default.
    target = given_target or min(2 * batch, limit)
    return limit, target


def pinned_requirements(extras: tuple[str, ...]) -> list[str]:
    """The package's dependencies (core and `extras`), each pinned to the version installed
    here, so the image runs the versions the tests ran; a missing one keeps its range."""
    from packaging.requirements import Requirement

    try:
        requirements = importlib.metadata.requires("infinity-cloud") or []
    except importlib.metadata.PackageNotFoundError:
        raise ModalError(
            "infinity-cloud is not installed as a package here, so its pinned dependencies are "
            "unknown: pip install . (or -e .) first"
        ) from None
    pins = []
    for line in requirements:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        if req.name == "torch":
            continue  # installed on its own, from the index that fits the hardware
        version = installed_version(req.name)
        pins.append(f"{req.name}{_extras(req)}" + (f"=={version}" if version else str(req.specifier)))
    return pins


def _extras(req: Any) -> str:
    return f"[{','.join(sorted(req.extras))}]" if req.extras else ""


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
            f"Modal secret instead (modal secret create NAME {ENDPOINT_KEYS_ENV}=KEY) and pass "
            "--api-key-secret NAME"
        )
    if spec.modal.gpu:
        for model in spec.models:
            if serving_backend(model, gpu=True) not in GPU_BACKENDS:
                raise ConfigError(
                    f"model {model.name}: the {model.backend} backend is packaged for Modal's CPU "
                    f"containers only; on a GPU use --backend {' or '.join(GPU_BACKENDS)} (or auto)"
                )
    local_model_dirs(spec)  # a path-like model id that is not a folder raises here


def python_literal(value: Any) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def render_context(spec: DeploymentSpec) -> dict[str, Any]:
    modal_spec = spec.modal
    gpu = list(modal_spec.gpu)
    max_inputs, target_inputs = concurrency(spec)
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
        # One GPU of the first type builds the exports: the fallbacks share its software.
        "build_gpu_literal": repr(gpu[0].split(":")[0] if gpu else None),
        "secrets": list(modal_spec.secrets),
        "serving_secrets": [*modal_spec.secrets, *filter(None, [modal_spec.api_key_secret])],
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": f"torch=={torch_version()}",
        "torch_index": None if gpu else TORCH_CPU_INDEX,
        "requirements": pinned_requirements(image_extras(spec)),
        "max_inputs": max_inputs,
        "target_inputs": target_inputs,
        # GPUs are only reachable during a snapshot with Modal's GPU snapshots (alpha).
        "gpu_snapshot": bool(gpu) and modal_spec.memory_snapshot,
        "class_name": CLASS_NAME,
        "web_method": WEB_METHOD,
        "image_models": IMAGE_MODELS,
    }


def load_app_module(path: Path) -> ModuleType:
    """Import a rendered app file with the real Modal client (which validates it).

    It is imported under its file's name and registered in `sys.modules`, as `modal deploy`
    does: Modal then ships the file itself and imports it by that name in the container,
    instead of pickling the class.
    """
    import_modal()
    name = path.stem
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ModalError(f"the rendered Modal app {path} does not load: {type(exc).__name__}: {exc}") from exc
    return module


@dataclass(frozen=True)
class Deployment:
    app_name: str
    environment: str | None
    url: str | None


def usage_examples(url: str, model: str, *, url_prefix: str = "", api_key: bool = False) -> str:
    """A ready `curl` and `openai` call against a deployed endpoint."""
    base = url.rstrip("/") + url_prefix
    auth = f' -H "Authorization: Bearer ${CLIENT_KEY_ENV}"' if api_key else ""
    key = f'os.environ["{CLIENT_KEY_ENV}"]' if api_key else '"unused"'
    return f"""curl {base}/embeddings{auth} -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "input": ["Hello from Modal"]}}'

python - <<'PY'
import os
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key={key})
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
            url = _deployed_url(module)
        except modal.exception.AuthError:
            raise ModalError(NO_CREDENTIALS) from None
        except modal.exception.Error as exc:
            raise ModalError(f"Modal refused the deployment: {exc}") from exc
        return Deployment(spec.modal.app_name, spec.modal.environment, url)

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

