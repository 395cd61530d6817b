"""What every target is (a name, a spec section, the verbs it offers) and what they share:
template rendering, the spec file they write, logging, and calling a deployed endpoint."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from infinity_cloud.core.capability import ROUTE_NAMES
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import InfinityCloudError

# The verbs a target may offer, each a CLI command family (`infinity-cloud VERB TARGET`).
VERBS = {
    "build": "Render deployment files for a target.",
    "deploy": "Render and deploy to a target.",
    "invoke": "Send a request to a deployed endpoint and print the answer.",
    "status": "Show a deployment's state and URL.",
    "delete": "Stop a deployment.",
    "smoke": "Deploy (or take a deployed endpoint), check its answers against a local run, time it, "
             "and delete what it made.",
    "policy": "Print an IAM policy a first deployment needs: trust, execution or deployer (JSON).",
}
# How a caller picks the route of /invocations (SageMaker passes it through as is).
ROUTE_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
ROUTES = tuple(ROUTE_NAMES.values())
# The client-side variable holding the key an endpoint checks (its bearer token).
CLIENT_KEY_ENV = "INFINITY_CLOUD_ENDPOINT_KEY"
# The variable a platform secret sets in a container to protect its endpoint: one key, or
# several separated by spaces. Not the CLI's INFINITY_CLOUD_API_KEY, which a deploying
# shell may hold for itself.
ENDPOINT_KEYS_ENV = "INFINITY_CLOUD_ENDPOINT_KEYS"
# Set in a GPU image (to "cuda"): it stops at start when it finds no usable GPU (backends/cuda_check.py).
IMAGE_DEVICE_ENV = "INFINITY_CLOUD_IMAGE_DEVICE"
# How much of an answer that is not JSON an error shows.
ANSWER_SHOWN = 300


class TargetError(InfinityCloudError):
    """A target's platform is missing, not logged in, refused a call, or did not answer."""


@dataclass(frozen=True)
class Deployment:
    """Where a deploy went: `url` when the platform told us, and whether calls need a key."""

    target: str
    name: str
    url: str | None
    api_key: bool = False
    notes: tuple[str, ...] = ()
    # Headers the platform itself checks, as shell text for the printed examples.
    headers: dict[str, str] = field(default_factory=dict)
    # How to call it, where the plain curl and OpenAI examples would not do (a signed API).
    examples: str | None = None


@dataclass(frozen=True)
class JobOptions:
    """What `infinity-cloud embed --runner TARGET` passes a target that runs batch jobs."""

    model_name: str | None = None  # the platform's model the job runs (one a deploy made)
    instance_type: str | None = None
    instance_count: int = 1
    staging: str | None = None  # where the job's input and output go (s3://...)
    region: str | None = None
    secret: str | None = None  # the platform's secret its workers reach the data with (Modal)
    detach: bool = False  # start the job and return: it outlives this process (Modal)


@dataclass(frozen=True)
class Endpoint:
    url: str
    headers: dict[str, str] = field(default_factory=dict)


Settings = TypeVar("Settings", bound=BaseModel)


class Target(Generic[Settings]):
    """A deployment target. Subclasses set `name`, `spec_class` (their spec section, or
    None) and `verbs`, and implement those verbs; `register_target` or the
    `infinity_cloud.targets` entry-point group makes them known to the spec and the CLI."""

    name: ClassVar[str]
    spec_class: ClassVar[type[BaseModel] | None] = None
    verbs: ClassVar[tuple[str, ...]] = ()
    default_out: ClassVar[str | None] = None  # where `build` writes by default: build/<name>
    # Whether `infinity-cloud embed --runner <name>` runs a bulk job on the platform (`embed_job`).
    runs_jobs: ClassVar[bool] = False
    # Whether `embed --detach` may start its job and return (the job outlives the process).
    detaches_jobs: ClassVar[bool] = False
    # How `infinity-cloud plan` sizes this target's section: "module:attribute" of a
    # `sizing.plan.Planner` (imported only when a plan asks), or None: plan does not size it.
    planner: ClassVar[str | None] = None

    def settings(self, spec: DeploymentSpec) -> Settings:
        """This target's section of the spec."""
        return spec.section(self.name, self.spec_class)  # type: ignore[return-value,arg-type]

    def describe(self, spec: DeploymentSpec) -> str:
        """How messages name a deployment ("Modal app 'rag'")."""
        return f"{self.name} deployment"

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """Render the target's files from the spec; return the paths written."""
        raise NotImplementedError

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        raise NotImplementedError

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        raise NotImplementedError

    def exists(self, spec: DeploymentSpec) -> bool:
        """Whether the deployment the spec names is there now (asked before `smoke` deploys,
        which deletes only what it created)."""
        raise NotImplementedError

    def delete(self, spec: DeploymentSpec) -> None:
        raise NotImplementedError

    def embed_job(self, spec: DeploymentSpec, job: Any, options: JobOptions) -> dict[str, Any]:
        """Run a bulk embedding job (`bulk.job.EmbedJob`) on the platform; its summary."""
        raise NotImplementedError

    def policies(self, spec: DeploymentSpec) -> dict[str, dict[str, Any]]:
        """IAM policy documents by name (trust, execution, deployer)."""
        raise NotImplementedError

    def endpoint(self, spec: DeploymentSpec, api_key: str | None) -> Endpoint:
        """The deployed endpoint's base URL (with the spec's prefix) and auth headers."""
        raise NotImplementedError

    def invoke(
        self, spec: DeploymentSpec, body: dict[str, Any], *,
        api_key: str | None = None, route: str | None = None,
    ) -> Any:
        """POST `body` to the endpoint's /invocations, which routes it by `route` (SageMaker's
        custom attribute) or by its shape; returns the decoded answer."""
        import httpx

        endpoint = self.endpoint(spec, api_key)
        url = f"{endpoint.url.rstrip('/')}/invocations"
        headers = {**endpoint.headers, **({ROUTE_HEADER: f"route={route}"} if route else {})}
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=120)
        except httpx.HTTPError as exc:
            raise TargetError(f"could not reach {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise TargetError(f"{url} answered {response.status_code}: {_error_message(response)}")
        return response_json(response)


def response_json(response: Any) -> Any:
    """An httpx response's body as JSON (see `json_answer`)."""
    return json_answer(response.content, str(response.url), response.status_code,
                       response.headers.get("content-type"))


def json_answer(body: bytes | str, where: str, status: int | str, content_type: str | None) -> Any:
    """An endpoint's answer decoded as JSON. Anything else (a proxy's HTML page, plain text)
    raises a TargetError saying what came back, where a JSONDecodeError would be a traceback."""
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        shown = " ".join(text.split())
        if len(shown) > ANSWER_SHOWN:
            shown = shown[: ANSWER_SHOWN - 1] + "…"
        raise TargetError(
            f"{where} answered {status} ({content_type or 'no content type'}), not JSON: "
            + (repr(shown) if shown else "an empty body")
        ) from None


def _error_message(response: Any) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return one_line(response.text)


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_XML_CODE = re.compile(r"<Code>(.*?)</Code>", re.S)
_XML_MESSAGE = re.compile(r"<Message>(.*?)</Message>", re.S)
_SCRIPT = re.compile(r"<(script|style)[^>]*>.*?</\1>", re.I | re.S)


def one_line(text: str, limit: int = 300) -> str:
    """What a platform answered, as one readable line: an HTML error page (a proxy's, a load
    balancer's) as its title or text, whitespace collapsed, at most `limit` characters."""
    text = str(text)
    code, message = _XML_CODE.search(text), _XML_MESSAGE.search(text)
    if message:  # an AWS XML error document: its code and message
        text = f"{code.group(1)}: {message.group(1)}" if code else message.group(1)
    elif "<" in text and ">" in text and _TAG.search(text):
        title = _TITLE.search(text)
        text = title.group(1) if title else _TAG.sub(" ", _SCRIPT.sub(" ", text))
        text = f"{' '.join(text.split())} (an HTML page, not an API error: a proxy or the wrong endpoint?)"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_templates(target: str, out_dir: Path, context: dict[str, Any]) -> list[Path]:
    """Render templates/<target>/*.j2 into out_dir (dropping .j2); copy other files as they are."""
    import jinja2

    root = resources.files("infinity_cloud.templates").joinpath(target)
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text(encoding="utf-8")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.is_file() or entry.name.startswith(("_", ".")):
            continue
        if entry.name.endswith(".j2"):
            path = out_dir / entry.name.removesuffix(".j2")
            path.write_text(env.get_template(entry.name).render(**context), encoding="utf-8")
        else:
            path = out_dir / entry.name
            path.write_bytes(entry.read_bytes())
        written.append(path)
    return written


def spec_yaml(spec: DeploymentSpec) -> str:
    """The spec as a YAML file: only what differs from the defaults, sections included."""
    import yaml

    return yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False)


# What a first call sends, by the route a model's task answers on.
FIRST_CALLS = {
    "embeddings": '{{"model": "{model}", "input": ["Hello from the cloud"]}}',
    "rerank": '{{"model": "{model}", "query": "What is a cloud?", "documents": ["Water", "A rock"]}}',
    "classify": '{{"model": "{model}", "input": ["Hello from the cloud"]}}',
}


def curl_example(
    url: str, model: str, route: str = "embeddings", *, api_key: bool = False,
    headers: dict[str, str] | None = None,
) -> str:
    """A ready `curl` of `route` (a key of FIRST_CALLS) at `url` (with its prefix); with
    `api_key`, the key is read from CLIENT_KEY_ENV in the caller's shell, never written here."""
    extra = {**(headers or {})}
    if api_key:
        extra["Authorization"] = f"Bearer ${CLIENT_KEY_ENV}"
    curl_headers = "".join(f' -H "{k}: {v}"' for k, v in extra.items())
    body = FIRST_CALLS[route].format(model=model)
    return f"""curl {url.rstrip('/')}/{route}{curl_headers} -H "Content-Type: application/json" \\
  -d '{body}'"""


def usage_examples(
    url: str, model: str, *, api_key: bool = False, headers: dict[str, str] | None = None
) -> str:
    """A ready `curl` and `openai` call against a deployed endpoint (`url` with its prefix)."""
    base = url.rstrip("/")
    extra = {**(headers or {})}
    if api_key:
        extra["Authorization"] = f"Bearer ${CLIENT_KEY_ENV}"
    key = f'os.environ["{CLIENT_KEY_ENV}"]' if api_key else '"unused"'
    other = {k: v for k, v in extra.items() if k != "Authorization"}
    default_headers = (
        ", default_headers={" + ", ".join(f'"{k}": os.path.expandvars("{v}")' for k, v in other.items()) + "}"
        if other else ""
    )
    return f"""{curl_example(base, model, api_key=api_key, headers=headers)}

python - <<'PY'
import os
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key={key}{default_headers})
result = client.embeddings.create(model="{model}", input=["Hello from the cloud"])
print(len(result.data[0].embedding))
PY"""
