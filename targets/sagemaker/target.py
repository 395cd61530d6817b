"""The SageMaker target: a bring-your-own container for a SageMaker endpoint (GPU, CPU or
serverless), rendered from the spec. The image is built and pushed with the user's own
Docker; `serve.py` is what it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from infinity_cloud.backends.neuron_backend import COMPILE_ENV, buckets_of
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets import container
from infinity_cloud.targets.aws import ApiCall, aws_calls, delete_log_group, require_image_and_role, run
from infinity_cloud.targets.base import Deployment, JobOptions, Target, render_templates, spec_yaml
from infinity_cloud.targets.platforms import ImagePlatform, required_platform
from infinity_cloud.targets.sagemaker import sagemaker_api
from infinity_cloud.targets.sagemaker.spec import NEURON_IMAGE, NEURON_IMAGE_SHIPS, SageMakerSpec

IMAGE_MODELS = "/models"
# Where SageMaker's convention puts the program, and the exports the build stage makes.
PROGRAM_DIR = "/opt/program"
EXPORTS_DIR = "/opt/exports"
SPEC_FILE = "infinity-cloud.yaml"
MODEL_ARCHIVE = "model.tar.gz"
# SageMaker gives an invocation 60 s (real-time and serverless endpoints alike).
INVOCATION_TIMEOUT_S = 60
CONSTRAINTS = "constraints.txt"


def image_platform_of(settings: SageMakerSpec) -> ImagePlatform:
    """The platform the image installs on: the Neuron image's Python and packages, or the
    base image's Python on the instance's CPU."""
    if settings.variant == "inferentia2":
        image = settings.neuron_image.format(region=settings.region or "us-east-1")
        # Another Neuron image ships the same packages, at versions this package does not know.
        known = settings.neuron_image == NEURON_IMAGE
        ships = NEURON_IMAGE_SHIPS if known else dict.fromkeys(NEURON_IMAGE_SHIPS, "")
        return required_platform(image, "x86_64", shipped=ships, example="a Neuron image tagged -pyXY-")
    return required_platform(settings.base_image, settings.arch)


def pack_models(spec: DeploymentSpec, archive: Path) -> Path:
    """model.tar.gz with one folder per model, named as `serve` looks for it in /opt/ml/model
    (the served name, `/` as `--`), without cached exports. Hub models are fetched first
    (from the cache, or the hub when it may be reached)."""
    import tarfile

    from infinity_cloud.models.model_source import resolve_model_dir
    from infinity_cloud.targets.sagemaker.serve import model_data_folder

    def skip_exports(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "/.infinity-cloud" in f"/{info.name}" else info

    # dereference: the hub cache links each file to a blob; the archive holds the files.
    with tarfile.open(archive, "w:gz", dereference=True) as tar:
        for model in spec.models:
            folder = resolve_model_dir(model.model_id, model.revision)
            tar.add(folder, arcname=model_data_folder(model.name), filter=skip_exports)
    return archive


class SageMakerTarget(Target[SageMakerSpec]):
    name = "sagemaker"
    spec_class = SageMakerSpec
    verbs = ("build", "deploy", "invoke", "status", "delete", "smoke", "policy")
    planner = "infinity_cloud.targets.sagemaker.plan:PLANNER"
    runs_jobs = True

    def describe(self, spec: DeploymentSpec) -> str:
        return f"SageMaker endpoint {self.settings(spec).endpoint_name!r}"

    def embed_job(self, spec: DeploymentSpec, job: Any, options: JobOptions) -> dict[str, Any]:
        """A Batch Transform job on a model `deploy` made (`batch.run_batch_transform`)."""
        from infinity_cloud.targets.sagemaker.batch import run_batch_transform

        if not options.model_name:
            raise ConfigError("--runner sagemaker needs --job-model: a SageMaker model `deploy sagemaker` "
                              "made (NAME-YYYYMMDD-HHMMSS)")
        out = job.out.rstrip("/")
        staging = options.staging or (f"{out}/_staging" if out.startswith("s3://") else None)
        if staging is None:
            raise ConfigError("--runner sagemaker needs --staging s3://BUCKET/PREFIX (or an s3:// --out)")
        return run_batch_transform(
            spec, job, model_name=options.model_name, instance_type=options.instance_type or "ml.c7i.xlarge",
            instance_count=options.instance_count, staging=staging,
            region=options.region or self.settings(spec).region,
        )

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """The container for the endpoint: Dockerfile, the `serve` entrypoint, the pinned
        requirements, the package, the spec it serves, and copies of local model folders.
        GPU images carry CUDA torch; CPU and serverless images build the exports in a first
        stage and run OpenVINO or ONNX Runtime without torch; Inferentia2 images start from
        the Neuron container and compile each model for its (batch, length) buckets."""
        settings = self.settings(spec)
        spec = container.with_served_names(spec)
        variant, device = settings.variant, settings.device
        container.refuse_spec_keys(
            spec, "a SageMaker endpoint is reached only through IAM-signed invoke_endpoint, which "
            "carries no bearer key: grant sagemaker:InvokeEndpoint to the callers instead",
        )
        container.check_backends(spec, device, f"a {variant} SageMaker endpoint")
        # The container serves the backend its image installs, named, not left to `auto`; a
        # serverless one takes one request at a time, so every core goes to it (latency mode).
        serverless = {"latency": True} if settings.serverless else {}
        spec = spec.model_copy(update={"models": tuple(
            m.model_copy(update={"backend": container.serving_backend(m, device), **serverless})
            for m in spec.models
        )})
        for model in spec.models:
            if variant in ("cpu", "serverless") and model.backend == "torch":
                raise ConfigError(
                    f"model {model.name}: a {variant} SageMaker image serves without torch; "
                    "use --backend openvino, onnx or ctranslate2 (or auto)"
                )
            if variant == "inferentia2":
                buckets_of(model)  # the static shapes to compile, or a ConfigError naming the flags
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if settings.pack_models:  # SageMaker unpacks them into /opt/ml/model; serve.py finds them
            model_dirs, copies, packed = {}, [], [pack_models(spec, out_dir / MODEL_ARCHIVE)]
        else:
            model_dirs, copies = container.copy_local_models(spec, out_dir, IMAGE_MODELS)
            packed = []
        limits = spec.server.limits.model_copy(update={  # invoke_endpoint's limit, each way
            "max_payload_bytes": settings.payload_limit, "max_response_bytes": settings.payload_limit,
        })
        served = container.image_spec(spec, model_dirs, host="0.0.0.0", port=settings.port, limits=limits)
        memory_mb = settings.memory_mb if variant == "serverless" else None  # instances: their cgroup
        served = container.within_platform(served, INVOCATION_TIMEOUT_S, memory_mb)
        (out_dir / SPEC_FILE).write_text(spec_yaml(served), encoding="utf-8")
        platform = image_platform_of(settings)
        if variant == "inferentia2":  # the Neuron image brings torch, transformers and optimum-neuron
            pins = container.pinned_requirements((), platform)
        else:
            # GPU images run torch; CPU ones convert with it in their first stage.
            container.check_installs(f"torch=={container.torch_version()}", platform)
            pins = container.pinned_requirements(container.image_extras(spec, device), platform)
        requirements = [container.write_requirements(out_dir, pins)]
        if variant == "inferentia2":  # so pip keeps the Neuron SDK's own versions
            requirements.append(container.write_requirements(
                out_dir, [f"{name}{version}" for name, version in platform.shipped], CONSTRAINTS
            ))
        if variant in ("cpu", "serverless"):
            serving = container.serving_requirements(spec, device, platform)
            requirements.append(container.write_requirements(
                out_dir, serving, container.SERVING_REQUIREMENTS_FILE))
        package = container.stage_package(out_dir)
        written = render_templates("sagemaker", out_dir, {
            "spec": served,
            "sagemaker": settings,
            "variant": variant,
            "neuron_image": settings.neuron_image.format(region=settings.region or "us-east-1"),
            "compile_env": COMPILE_ENV,
            "torch": f"torch=={container.torch_version()}",
            # GPU: PyPI's CUDA build, which the endpoint's machine image (GPU_AMI) runs.
            "torch_index": None if variant == "gpu" else container.TORCH_CPU_INDEX,
            "image_env": container.image_env(device),
            "hub_models": [] if settings.pack_models else container.hub_models(spec),
            "model_copies": copies,
            "requirements_file": container.REQUIREMENTS_FILE,
            "serving_requirements_file": container.SERVING_REQUIREMENTS_FILE,
            "constraints_file": CONSTRAINTS,
            "arch": "arm64" if settings.arch == "aarch64" else "amd64",
            "package_dir": package.name,
            "spec_file": SPEC_FILE,
            "program_dir": PROGRAM_DIR,
            "exports_dir": EXPORTS_DIR,
            "image_models": IMAGE_MODELS,
        })
        (out_dir / "serve").chmod(0o755)
        copied = [out_dir / copy for copy, _ in copies]
        return [*written, out_dir / SPEC_FILE, *requirements, package, *copied, *packed]

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        """Render the container's files, then create the model, the endpoint config and the
        endpoint with boto3 (or move an existing endpoint to the new config, blue/green),
        wait for InService, and register autoscaling. The image itself is built and pushed
        with your own Docker (--image-uri). --dry-run prints the API calls and calls nothing."""
        settings = self.settings(spec)
        require_image_and_role("sagemaker", settings.image_uri, settings.role)
        self.build(spec, out_dir)
        if dry_run:
            calls = sagemaker_api.deploy_calls(settings, "<version>", update=False,
                                               archive=self._archive(out_dir))
            for call in calls:
                print(call.describe())
            print("(sagemaker.update_endpoint instead of create_endpoint when the endpoint exists)")
            return None
        client = sagemaker_api.clients(settings)
        name = settings.endpoint_name
        with aws_calls(f"deploy endpoint {name!r}"):
            existing = sagemaker_api.describe_endpoint(client, name)
            calls = sagemaker_api.deploy_calls(
                settings, sagemaker_api.stamp(), update=existing is not None, archive=self._archive(out_dir)
            )
            endpoint_calls = [c for c in calls if c.service != "application-autoscaling"]
            scaling = calls[len(endpoint_calls):]
            # AWS refuses to update an autoscaled variant: its autoscaling goes just before the
            # update, and what --autoscale asks for is registered once the endpoint is InService.
            scaled = sagemaker_api.current_scaling(client, name) if existing else sagemaker_api.Scaling()
            *creations, endpoint_call = endpoint_calls
            made: list[ApiCall] = []  # what this deploy did, undone in reverse if it fails
            try:
                for call in (*creations, *scaled.removal, endpoint_call):
                    run(client, call)
                    made.append(call)
                with Console(stderr=True).status(f"waiting for {name} to be InService") as shown:
                    sagemaker_api.wait_in_service(
                        client, name, lambda state, s: shown.update(f"{name}: {state} ({s:.0f} s)"),
                        # an update that failed is InService again, on the old config
                        config=endpoint_call.params["EndpointConfigName"] if existing else None,
                    )
            except sagemaker_api.StillDeploying as exc:  # it may yet come up: status says
                if scaled.removal:
                    raise sagemaker_api.StillDeploying(
                        f"{exc.message}; its autoscaling was removed for the update: deploy again once it "
                        "is InService to set it"
                    ) from None
                raise
            except Exception:  # not on Ctrl-C either: the endpoint may still come up
                sagemaker_api.roll_back(client, made, scaled)
                raise
            for call in scaling:
                run(client, call)
            if existing is not None:  # the old config and model serve nothing now
                for call in sagemaker_api.resources_of(client, existing["EndpointConfigName"]):
                    run(client, call)
            url = sagemaker_api.invocation_url(client, name)
            region = client("sagemaker-runtime").meta.region_name
        model = container.served_name(spec.models[0])
        return Deployment(
            self.name, name, url, examples=sagemaker_api.usage_example(url, name, region, model),
            notes=(f"call it with `infinity-cloud invoke sagemaker --endpoint-name {name} --input hello`",),
        )

    def _archive(self, out_dir: Path) -> Path | None:
        archive = Path(out_dir) / MODEL_ARCHIVE
        return archive if archive.is_file() else None

    def policies(self, spec: DeploymentSpec) -> dict[str, dict[str, Any]]:
        """The execution role's trust policy and permissions, and what the deploying user needs:
        `infinity-cloud policy sagemaker trust|execution|deployer` prints each."""
        from infinity_cloud.targets.sagemaker.policies import policies

        return policies(self.settings(spec))

    def exists(self, spec: DeploymentSpec) -> bool:
        settings = self.settings(spec)
        with aws_calls(f"describe endpoint {settings.endpoint_name!r}"):
            client = sagemaker_api.clients(settings)
            return sagemaker_api.describe_endpoint(client, settings.endpoint_name) is not None

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """The endpoint's state, its config and its variant, from SageMaker."""
        settings = self.settings(spec)
        client = sagemaker_api.clients(settings)
        with aws_calls(f"describe endpoint {settings.endpoint_name!r}"):
            endpoint = sagemaker_api.describe_endpoint(client, settings.endpoint_name)
            if endpoint is None:
                raise sagemaker_api.SageMakerError(f"no SageMaker endpoint named {settings.endpoint_name!r}")
            config = client("sagemaker").describe_endpoint_config(
                EndpointConfigName=endpoint["EndpointConfigName"]
            )
        facts: dict[str, Any] = {
            "endpoint": endpoint["EndpointName"], "status": endpoint["EndpointStatus"],
            "url": sagemaker_api.invocation_url(client, settings.endpoint_name),
            "config": endpoint["EndpointConfigName"],
        }
        for variant in config.get("ProductionVariants", []):
            serverless = variant.get("ServerlessConfig")
            facts["variant"] = (
                f"serverless {serverless['MemorySizeInMB']} MB x {serverless['MaxConcurrency']}" if serverless
                else f"{variant.get('InitialInstanceCount')} x {variant.get('InstanceType')}"
            )
        if endpoint.get("FailureReason"):
            facts["failure_reason"] = endpoint["FailureReason"]
        facts["last_modified"] = str(endpoint.get("LastModifiedTime"))
        return facts

    def delete(self, spec: DeploymentSpec) -> None:
        """Delete the endpoint, its autoscaling target, every endpoint config and model a
        deploy of it made (earlier ones, and those a failed deploy left, included), and its
        log group."""
        settings = self.settings(spec)
        client = sagemaker_api.clients(settings)
        name = settings.endpoint_name
        with aws_calls(f"delete endpoint {name!r}"):
            endpoint = sagemaker_api.describe_endpoint(client, name)
            if endpoint is None:
                raise sagemaker_api.SageMakerError(f"no SageMaker endpoint named {name!r}")
            calls = sagemaker_api.resources_of(client, endpoint["EndpointConfigName"])
            calls += [c for c in sagemaker_api.leftovers(client, name) if c not in calls]
            for call in sagemaker_api.current_scaling(client, name).removal:
                run(client, call)
            run(client, ApiCall("sagemaker", "delete_endpoint", {"EndpointName": name}))
            for call in calls:
                run(client, call)
            delete_log_group(client, sagemaker_api.log_group(name))

    def invoke(
        self, spec: DeploymentSpec, body: dict[str, Any], *,
        api_key: str | None = None, route: str | None = None,
    ) -> Any:
        """Call the endpoint with sagemaker-runtime's invoke_endpoint (IAM signs it, so no key)."""
        settings = self.settings(spec)
        with aws_calls(f"invoke endpoint {settings.endpoint_name!r}"):
            return sagemaker_api.invoke(sagemaker_api.clients(settings), settings.endpoint_name, body, route)

