"""The AWS Lambda target: a container image for a Lambda function (on AWS's Python base
image) serving the same API through mangum, and a SAM template to deploy it. The models and
their ONNX Runtime (or OpenVINO) exports are made here, on the deploying machine, so the
image holds no torch and the function converts nothing."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from infinity_cloud.backends import exports
from infinity_cloud.backends.exports import CACHE_ENV
from infinity_cloud.backends.registry import backend_entry
from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.content_digest import PINNED_FINGERPRINT
from infinity_cloud.core.errors import ConfigError, InfinityCloudError
from infinity_cloud.targets import container
from infinity_cloud.targets.aws import AwsError, aws_calls, check_known, clients, require_image_and_role
from infinity_cloud.targets.aws_lambda import lambda_api
from infinity_cloud.targets.aws_lambda.limits import ENVELOPE_SHARE, PAYLOAD_BYTES
from infinity_cloud.targets.aws_lambda.spec import LambdaSpec
from infinity_cloud.targets.base import ENDPOINT_KEYS_ENV, Deployment, Target, render_templates
from infinity_cloud.targets.platforms import required_platform
from infinity_cloud.targets.resolution import Unresolvable

SPEC_FILE = "infinity-cloud.yaml"
HANDLER = "infinity_cloud.targets.aws_lambda.handler.handler"
# What serves on Lambda without torch: ONNX Runtime by default (it writes nothing at run time,
# where the image is read-only), OpenVINO when asked.
LAMBDA_BACKENDS = ("onnx", "openvino")
# The adapter from Lambda's events to the ASGI app (the aws extra's).
MANGUM = "mangum>=0.17"


class LambdaTarget(Target[LambdaSpec]):
    name = "aws_lambda"
    spec_class = LambdaSpec
    verbs = ("build", "deploy", "invoke", "status", "delete", "smoke", "policy")
    planner = "infinity_cloud.targets.aws_lambda.plan:PLANNER"

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
        spec = container.with_served_names(spec)
        models = tuple(self._lambda_model(m, settings) for m in spec.models)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for folder in ("models", "exports"):
            shutil.rmtree(out_dir / folder, ignore_errors=True)
        folders = [f"models/{i}-{Path(model.model_id).name or 'model'}" for i, model in enumerate(models)]
        served = [model.model_copy(update={"model_id": folder, "served_model_name": model.name})
                  for model, folder in zip(models, folders, strict=True)]
        # Lambda's 6 MB each way; the handler lowers the answers' bound for an ALB's events.
        limits = spec.server.limits.model_copy(update={
            "max_payload_bytes": PAYLOAD_BYTES, "max_response_bytes": int(PAYLOAD_BYTES * ENVELOPE_SHARE),
        })
        served_spec = container.within_platform(spec.model_copy(update={
            "models": tuple(served), "server": spec.server.model_copy(update={"limits": limits}),
        }), settings.timeout_s, settings.memory_mb)
        # Resolved first: a backend with no wheel for the function's CPU is refused before the
        # models are exported.
        requirements = container.write_requirements(out_dir, self._requirements(served_spec, settings))
        for model, folder in zip(models, folders, strict=True):
            self._stage_model(model, out_dir / folder, out_dir / "exports")
        exports.prune(out_dir / "exports")  # what the runtime exports were built from
        served_data = container.served_spec_data(served_spec)
        import yaml  # only here: not on every start of the CLI

        (out_dir / SPEC_FILE).write_text(yaml.safe_dump(served_data, sort_keys=False), encoding="utf-8")
        package = container.stage_package(out_dir)
        written = render_templates("aws_lambda", out_dir, {
            "spec": served_spec, "aws_lambda": settings, "handler": HANDLER, "spec_file": SPEC_FILE,
            "requirements_file": requirements.name, "package_dir": package.name,
        })
        return [*written, out_dir / SPEC_FILE, requirements, package, out_dir / "models", out_dir / "exports"]

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        """Render the image's files, then create the function from --image-uri (or update its
        image and configuration), wait until it is Active, and give it its URL. The image is
        built and pushed with your own Docker."""
        settings = self.settings(spec)
        require_image_and_role("aws-lambda", settings.image_uri, settings.role)
        if dry_run:  # the calls, checked and printed; no export (the image is built already)
            for model in spec.models:
                self._lambda_model(model, settings)
            self._print_plan(settings)
            return None
        self.build(spec, out_dir)
        client = clients(settings.region)
        name = settings.function_name
        with lambda_api.Rollback(client) as rollback, aws_calls(f"deploy function {name!r}"):
            exists = lambda_api.describe(client, name) is not None
            check_known(client, [*lambda_api.function_calls(settings, exists=exists),
                                 *lambda_api.url_calls(settings)])
            aliased = self._function(client, settings, exists, rollback)
            qualifier = lambda_api.ALIAS if aliased else None
            url, revoked = (lambda_api.ensure_url(client, settings, rollback, qualifier)
                            if settings.function_url else (None, []))
        # Last, outside the rollback: a URL an earlier deploy left where this one serves none
        # (the function's own, once deploys serve through the alias; any, without a URL) is
        # deleted, so the function is not still reachable there. Its deletion cannot be taken
        # back, so nothing may fail after it; a refusal leaves the deploy done and that URL as
        # it was, and says so.
        removed = []
        for place in lambda_api.unwanted_url_places(settings, aliased):
            where = lambda_api.place_of(name, place)
            done = f"the deploy itself is done{f', its URL {url}' if url else ''}"
            with aws_calls(f"remove the URL an earlier deploy left on {where} ({done}; that URL stays as it "
                           "was until a deploy removes it)"):
                gone = lambda_api.remove_url(client, name, place)
            if gone:
                removed.append(f"removed what an earlier deploy left on {where}, where this deploy serves no "
                               f"URL: {', '.join(gone)}")
        notes = []
        if settings.function_url and settings.auth == "NONE":
            notes.append(f"the function URL is public (auth NONE): anyone can call it unless "
                         f"{ENDPOINT_KEYS_ENV} is set in the function's environment")
        if revoked:
            notes.append(f"removed the public grants an earlier deploy gave the URL ({', '.join(revoked)})")
        notes += removed
        if not settings.function_url:
            notes.append(f"no function URL (--no-function-url): call it with `infinity-cloud invoke "
                         f"aws-lambda --function-name {name}` (lambda.invoke, IAM-signed)")
        if aliased:
            notes.append(f"served through alias {name}:{lambda_api.ALIAS} with "
                         f"{settings.provisioned_concurrency} provisioned environment(s)")
        examples = None
        if url and settings.auth == "AWS_IAM":  # an unsigned curl or OpenAI call would get a 403
            region = client("lambda").meta.region_name
            examples = signed_examples(url, region, container.served_name(spec.models[0]))
        return Deployment(self.name, name, url, notes=tuple(notes), examples=examples)

    @staticmethod
    def _function(
        client: Callable[[str], Any], settings: LambdaSpec, exists: bool, rollback: lambda_api.Rollback
    ) -> bool:
        """Create or update the function; publish it behind the alias where deploys serve
        through one. Returns whether they do."""
        name = settings.function_name
        with Console(stderr=True).status(f"deploying {name}") as shown:
            def report(state: str) -> None:
                shown.update(f"{name}: {state}")

            lambda_api.apply_function(client, settings, exists, report, rollback)
            # Provisioned concurrency lives on a version: once asked for, deploys serve through
            # the alias, which follows each new version.
            aliased = bool(settings.provisioned_concurrency or lambda_api.alias_version(client, name))
            if aliased:
                lambda_api.publish(client, name, report, rollback)
                lambda_api.provision(client, name, settings.provisioned_concurrency, report)
        return aliased

    @staticmethod
    def _print_plan(settings: LambdaSpec) -> None:
        for call in lambda_api.function_calls(settings, exists=False):
            print(call.describe())
        print("(update_function_code and update_function_configuration when the function exists)")
        qualifier = None
        if settings.provisioned_concurrency:
            qualifier = lambda_api.ALIAS
            print(f"lambda.publish_version, then alias {lambda_api.ALIAS!r} to it, then lambda."
                  f"put_provisioned_concurrency_config({settings.provisioned_concurrency}) on the alias")
        if settings.function_url:
            for call in lambda_api.url_calls(settings, qualifier):
                print(call.describe())
            if settings.auth != "NONE":
                print("(where an earlier --auth NONE deploy granted them, its two statements are removed:)")
                names = (lambda_api.PUBLIC_URL_STATEMENT, lambda_api.PUBLIC_INVOKE_STATEMENT)
                for call in lambda_api.revoke_calls(settings.function_name, names, qualifier):
                    print(call.describe())
        print("(if a step fails, what this deploy created is deleted again)")
        unwanted = lambda_api.unwanted_url_places(settings, aliased=qualifier is not None)
        if unwanted:
            print("(last, where an earlier deploy left a URL that this one does not serve, it is deleted, "
                  "then the two public statements there; a deleted URL cannot be brought back:)")
            names = (lambda_api.PUBLIC_URL_STATEMENT, lambda_api.PUBLIC_INVOKE_STATEMENT)
            for place in unwanted:
                for call in [lambda_api.delete_url_call(settings.function_name, place),
                             *lambda_api.revoke_calls(settings.function_name, names, place)]:
                    print(call.describe())

    def policies(self, spec: DeploymentSpec) -> dict[str, dict[str, Any]]:
        """The execution role's trust policy and permissions, and what the deploying user needs:
        `infinity-cloud policy aws-lambda trust|execution|deployer` prints each."""
        from infinity_cloud.targets.aws_lambda.policies import policies

        return policies(self.settings(spec))

    def exists(self, spec: DeploymentSpec) -> bool:
        settings = self.settings(spec)
        with aws_calls(f"describe function {settings.function_name!r}"):
            return lambda_api.describe(clients(settings.region), settings.function_name) is not None

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """The function's state, configuration and URL, from Lambda; its alias and provisioned
        concurrency where a deploy made them."""
        settings = self.settings(spec)
        client = clients(settings.region)
        name = settings.function_name
        with aws_calls(f"describe function {name!r}"):
            config = lambda_api.describe(client, name)
            if config is None:
                raise AwsError(f"no Lambda function named {name!r}")
            version = lambda_api.alias_version(client, name)
            qualifier = lambda_api.ALIAS if version else None
            facts = {
                "function": config["FunctionName"], "state": config.get("State"),
                "last_update": config.get("LastUpdateStatus"), "memory_mb": config.get("MemorySize"),
                "timeout_s": config.get("Timeout"),
                "architectures": ",".join(config.get("Architectures", [])),
                "url": lambda_api.url_of(client, name, qualifier),
            }
            if version:
                facts["alias"] = f"{lambda_api.ALIAS} -> version {version}"
                facts["provisioned_concurrency"] = lambda_api.provisioned_summary(
                    lambda_api.provisioned(client, name))
        return facts

    def delete(self, spec: DeploymentSpec) -> None:
        """Delete the function, its URL and its log group."""
        settings = self.settings(spec)
        client = clients(settings.region)
        with aws_calls(f"delete function {settings.function_name!r}"):
            if lambda_api.describe(client, settings.function_name) is None:
                raise AwsError(f"no Lambda function named {settings.function_name!r}")
            lambda_api.delete(client, settings.function_name)

    def invoke(
        self, spec: DeploymentSpec, body: dict[str, Any], *,
        api_key: str | None = None, route: str | None = None,
    ) -> Any:
        """A direct invocation (lambda.invoke, IAM-signed) of `route`, else /invocations,
        which routes by the body's shape."""
        settings = self.settings(spec)
        with aws_calls(f"invoke function {settings.function_name!r}"):
            return lambda_api.invoke(clients(settings.region), settings.function_name, body, route, api_key)

    @staticmethod
    def _requirements(spec: DeploymentSpec, settings: LambdaSpec) -> list[str]:
        """The serving pins, resolved for the base image's Python on the function's CPU. Each
        backend's runtime must install there at the version that made the exports here."""
        platform = required_platform(settings.base_image, settings.architecture,
                                     example="public.ecr.aws/lambda/python:X.Y")
        exact = frozenset(pkg for m in spec.models for pkg in backend_entry(m.backend).serving_packages)
        try:
            return container.serving_requirements(spec, "cpu", platform, exact=exact, more=(MANGUM,))
        except Unresolvable as exc:
            others = [b for b in LAMBDA_BACKENDS if b not in {m.backend for m in spec.models}]
            other_arch = "x86_64" if settings.architecture == "arm64" else "arm64"
            raise Unresolvable(
                f"{exc.message}: this backend cannot serve a Lambda {settings.architecture} function from "
                f"{settings.base_image}; use --backend {' or '.join(others)}, or --architecture {other_arch}"
            ) from None

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
        if model.dtype == "fastest":
            raise ConfigError(
                f"model {model.name}: dtype fastest times each precision where the model is served, and a "
                "Lambda image is read-only: name one (--dtype float32 or int8)"
            )
        dtype = "float32" if model.dtype == "auto" else model.dtype
        options = {"threads": settings.vcpus, **model.backend_options}
        # An environment serves one invocation at a time: every core on it.
        return model.model_copy(
            update={"backend": backend, "dtype": dtype, "backend_options": options, "latency": True}
        )

    @staticmethod
    def _stage_model(model: ModelSpec, folder: Path, exports_dir: Path) -> None:
        """Copy the model's files (fetched from the hub when needed), build its exports here,
        then leave out its weights, which only building them read, and the exports it does not
        serve (the float32 one int8 was measured against: the verdict is kept): the image holds
        one copy. Loaded again from what is left to be sure; where that fails, all stay."""
        from infinity_cloud.models.model_source import resolve_model_dir
        from infinity_cloud.models.served_model import prepare_model

        source = resolve_model_dir(model.model_id, model.revision)
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".infinity-cloud"), symlinks=False)
        staged = model.model_copy(update={"model_id": str(folder), "revision": None})
        previous = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = str(exports_dir)
        try:
            before = _built(exports_dir)
            prepare_model(staged)
            # Only what this model's build made: an earlier model may serve the same export.
            unserved = [e for e in _built(exports_dir) - before if _dtype_of(e) not in (None, staged.dtype)]
            with tempfile.TemporaryDirectory(dir=exports_dir.parent) as aside:
                moved = [export.rename(Path(aside) / export.name) for export in unserved]
                why = _loads_without_weights(staged, source, exports_dir)
                if why:
                    for export, away in zip(unserved, moved, strict=True):
                        away.rename(export)
                    print(f"warning: {model.name} does not load from its exports alone ({why}), so the "
                          "image keeps its weights too", file=sys.stderr)
        finally:
            if previous is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = previous


def _loads_without_weights(staged: ModelSpec, source: Path, exports_dir: Path) -> str | None:
    """Leave the staged model folder without its weights and load it again: None when it
    loads, else why not, with the weights put back."""
    from infinity_cloud.models.served_model import prepare_model

    folder = Path(staged.model_id)
    failures = set(exports_dir.glob("*.failed.json"))
    dropped = exports.serve_from_exports(folder)
    try:
        prepare_model(staged)
    except Exception as exc:  # whatever it is, the weights come back
        for name in dropped:
            shutil.copy2(source / name, folder / name)
        (folder / PINNED_FINGERPRINT).unlink()
        for failed in set(exports_dir.glob("*.failed.json")) - failures:
            failed.unlink()
        return exc.message if isinstance(exc, InfinityCloudError) else f"{type(exc).__name__}: {exc}"
    return None


def _built(exports_dir: Path) -> set[Path]:
    """The finished exports under `exports_dir` (a manifest is written last)."""
    return {manifest.parent for manifest in exports_dir.glob(f"*/{exports.MANIFEST}")}


def _dtype_of(export: Path) -> str | None:
    """The precision an export was built for, where its options name one."""
    return json.loads((export / exports.MANIFEST).read_text(encoding="utf-8"))["options"].get("dtype")


def signed_examples(url: str, region: str, model: str) -> str:
    """Calls of a function URL whose auth is AWS_IAM: each request signed with SigV4 for the
    `lambda` service, with awscurl and with botocore's signer (the caller's AWS credentials
    need lambda:InvokeFunctionUrl on the function)."""
    base = url.rstrip("/")
    body = json.dumps({"model": model, "input": ["Hello from the cloud"]})
    return f"""awscurl --service lambda --region {region} -X POST {base}/embeddings \\
  -H "Content-Type: application/json" -d '{body}'

python - <<'PY'
import json, urllib.request
import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
body = json.dumps({body})
signed = AWSRequest("POST", "{base}/embeddings", data=body, headers={{"Content-Type": "application/json"}})
SigV4Auth(boto3.Session().get_credentials(), "lambda", "{region}").add_auth(signed)
call = urllib.request.Request(signed.url, data=body.encode(), headers=dict(signed.headers), method="POST")
print(len(json.loads(urllib.request.urlopen(call).read())["data"][0]["embedding"]))
PY"""
