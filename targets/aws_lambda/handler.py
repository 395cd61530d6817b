"""The Lambda function: `handler` (the image's CMD) serves every invocation through the same
FastAPI app as the local server.

The engine is built when this module is imported, in Lambda's init phase (which runs with a
full CPU burst, before the first request is billed), and mangum runs with `lifespan="off"`:
with "auto" it would run the app's start-up and shut-down around every invocation (mangum
issue 342). Everything is read relative to LAMBDA_TASK_ROOT: the spec, the models and their
exports, which `build` made on the deploying machine, so the image needs no torch.

Besides API Gateway (REST v1, HTTP v2), Function URL and ALB events, a direct invocation
(`boto3 lambda.invoke`) of `{"route": "embeddings", "body": {...}}` is served too, and
answers `{"statusCode": ..., "body": {...}}`.

Each answer is bounded by what its event's source passes back (`limits.py`): 1 MB behind an
ALB, 6 MB otherwise. The engine refuses a request whose answer could pass it before any
work; an answer that still does (one that returns its documents) is replaced by a 413 naming
the limit, where the platform would answer 502 or an error of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from infinity_cloud.backends.exports import CACHE_ENV
from infinity_cloud.targets.aws_lambda.limits import ALB, ENVELOPE_SHARE, LAMBDA, AnswerBound, answer_bound

TASK_ROOT = Path(os.environ.get("LAMBDA_TASK_ROOT", Path.cwd()))
SPEC_FILE = "infinity-cloud.yaml"
# Set before anything reads them: the exports built at `build`, and no hub at run time.
os.environ.setdefault(CACHE_ENV, str(TASK_ROOT / "exports"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _load() -> tuple[Any, Any]:
    from mangum import Mangum

    from infinity_cloud.core.config import build_spec, read_config_file
    from infinity_cloud.targets.runtime import endpoint_keys, http_app, start_engine

    data = read_config_file(TASK_ROOT / SPEC_FILE)
    # Model folders are named relative to the task root, wherever Lambda puts it.
    for model in data.get("models") or []:
        if not Path(model["model_id"]).is_absolute():
            model["model_id"] = str(TASK_ROOT / model["model_id"])
    engine = start_engine(build_spec(data))
    return engine, Mangum(http_app(engine, endpoint_keys(required=False)), lifespan="off")


engine, _http = _load()
# Lambda hands an environment one invocation at a time, so the limits the engine checks
# answers against before any work can follow each event's source.
_limits = {bound: engine.limits.model_copy(update={"max_response_bytes": int(bound.bytes * ENVELOPE_SHARE)})
           for bound in (LAMBDA, ALB)}


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    bound = answer_bound(event)
    engine.limits = _limits[bound]
    if "route" in event and "requestContext" not in event:
        return _direct(event, context, bound)
    return _bounded(event, context, bound)


def _bounded(event: dict[str, Any], context: Any, bound: AnswerBound) -> dict[str, Any]:
    """The app's answer to an HTTP event, or, where it is larger than `bound`, a 413 shaped by
    mangum for the same event."""
    from mangum import Mangum

    from infinity_cloud.core.errors import PayloadTooLargeError
    from infinity_cloud.server.errors import error_response

    answer = _http(event, context)
    # Measured as the oldest runtimes encode it (non-ASCII escaped), the most it can take.
    size = len(json.dumps(answer))
    if size <= bound.bytes:
        return answer
    refused = PayloadTooLargeError(
        f"the answer takes {size / 1e6:.1f} MB, more than {bound.whose}: split the request into at "
        f"least {-(-size // bound.bytes)} (or ask for fewer dimensions, encoding_format base64, or "
        "no documents back)", param="input",
    )
    return Mangum(error_response(refused), lifespan="off")(event, context)


def _direct(event: dict[str, Any], context: Any, bound: AnswerBound) -> dict[str, Any]:
    """A direct invocation, as an HTTP API event for the same app."""
    path = f"{engine.spec.server.url_prefix}/{str(event['route']).strip('/')}"
    method = "POST" if "body" in event else "GET"
    http_event = {
        "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
        "headers": {"content-type": "application/json", **(event.get("headers") or {})},
        "requestContext": {"http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                                    "sourceIp": "127.0.0.1", "userAgent": "lambda-invoke"}},
        "body": json.dumps(event["body"]) if "body" in event else None, "isBase64Encoded": False,
    }
    response = _bounded(http_event, context, bound)
    try:
        body = json.loads(response["body"] or "null")
    except ValueError:  # not JSON (a middleware's plain text): passed on as the text it is
        body = response["body"]
    return {"statusCode": response["statusCode"], "body": body}
