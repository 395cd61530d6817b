"""The AWS Lambda target: a container image for a Lambda function (on AWS's Python base
image) serving the same API through mangum, and a SAM template to deploy it. The models and
their ONNX Runtime (or OpenVINO) exports are made here, on the deploying machine, so the
image holds no torch and the function converts nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from infinity_cloud.backends.exports import CACHE_ENV
from infinity_cloud.config import DeploymentSpec, ModelSpec
from infinity_cloud.errors import ConfigError
from infinity_cloud.targets import container
from infinity_cloud.targets.aws_lambda.spec import LambdaSpec
from infinity_cloud.targets.base import ENDPOINT_KEYS_ENV, Target, render_templates

SPEC_FILE = "infinity-cloud.yaml"
HANDLER = "infinity_cloud.targets.aws_lambda.handler.handler"
# Lambda's synchronous invocation payload limit.
PAYLOAD_BYTES = 6 * 1024 * 1024
# What serves on Lambda without torch: ONNX Runtime by default (it writes nothing at run time,
# where the image is read-only), OpenVINO when asked.
LAMBDA_BACKENDS = ("onnx", "openvino")


class LambdaTarget(Target[LambdaSpec]):
    name = "aws_lambda"
    spec_class = LambdaSpec
    verbs = ("build",)

    def describe(self, spec: DeploymentSpec) -> str:
        return f"Lambda function {self.settings(spec).function_name!r}"

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """The image for the function: Dockerfile, the spec, the pinned serving requirements
        (no torch), the package, the models and their exports (built here), and a SAM
        template. Everything lives under LAMBDA_TASK_ROOT."""
        settings = self.settings(spec)
        container.refuse_spec_keys(
            spec, f"set {ENDPOINT_KEYS_ENV} in the function's environment instead (or use the function "
            "URL's AWS_IAM auth)",
        )
        models = tuple(self._lambda_model(m, settings) for m in spec.models)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for folder in ("models", "exports"):
            shutil.rmtree(out_dir / folder, ignore_errors=True)
        served = []
        for i, model in enumerate(models):
            folder = f"models/{i}-{Path(model.model_id).name or 'model'}"
            self._stage_model(model, out_dir / folder, out_dir / "exports")
            served.append(model.model_copy(update={"model_id": folder, "served_model_name": model.name}))
        limits = spec.server.limits.model_copy(update={"max_payload_bytes": PAYLOAD_BYTES})
        served_spec = spec.model_copy(update={
            "models": tuple(served), "server": spec.server.model_copy(update={"limits": limits}),
        })
        served_data = container.served_spec_data(served_spec)
        (out_dir / SPEC_FILE).write_text(yaml.safe_dump(served_data, sort_keys=False))
        requirements = container.write_requirements(
            out_dir, [*container.serving_requirements(served_spec, "cpu"), *_mangum()]
        )
        package = container.stage_package(out_dir)
        written = render_templates("aws_lambda", out_dir, {
            "spec": served_spec, "aws_lambda": settings, "handler": HANDLER, "spec_file": SPEC_FILE,
            "requirements_file": requirements.name, "package_dir": package.name,
        })
        return [*written, out_dir / SPEC_FILE, requirements, package, out_dir / "models", out_dir / "exports"]

    @staticmethod
    def _lambda_model(model: ModelSpec, settings: LambdaSpec) -> ModelSpec:
        """The model as the function serves it: a backend without torch, an explicit dtype (the
        image is read-only, so no precision check can run there), threads for its vCPUs."""
        backend = "onnx" if model.backend == "auto" else model.backend
        if backend not in LAMBDA_BACKENDS:
            raise ConfigError(
                f"model {model.name}: a Lambda image serves without torch; use --backend "
                f"{' or '.join(LAMBDA_BACKENDS)} (or auto, which is onnx)"
            )
        dtype = "float32" if model.dtype == "auto" else model.dtype
        options = {"threads": settings.vcpus, **model.backend_options}
        return model.model_copy(update={"backend": backend, "dtype": dtype, "backend_options": options})

    @staticmethod
    def _stage_model(model: ModelSpec, folder: Path, exports: Path) -> None:
        """Copy the model's files (fetched from the hub when needed) and build its exports here."""
        from infinity_cloud.model_source import resolve_model_dir
        from infinity_cloud.served_model import prepare_model

        source = resolve_model_dir(model.model_id, model.revision)
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".infinity-cloud"), symlinks=False)
        previous = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = str(exports)
        try:
            prepare_model(model.model_copy(update={"model_id": str(folder), "revision": None}))
        finally:
            if previous is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = previous


def _mangum() -> list[str]:
    version = container.installed_version("mangum")
    return [f"mangum=={version}" if version else "mangum>=0.17"]
