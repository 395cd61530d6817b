"""OpenTelemetry traces, as TEI offers them (`--otlp-endpoint`): per request that reaches a
model, a `request` span and its children `queue wait` (its inputs' wait in the batch queue),
`batch` (each batch that held some of them, with its `forward` pass) and `response` (the
answer written), every one with the `model` and `route` attributes; exported over OTLP/HTTP
through the OpenTelemetry SDK.

Off by default and then free: `create_app` adds nothing, and this module imports the SDK only
when a `Tracing` is made. The batching layer knows nothing of it: the request's trace is the
`batching.ORIGIN` of the inputs it queues, and each batch's report hands it back here.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from infinity_cloud.batching import BatchReport
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.install_hint import install_command

# The OpenTelemetry packages `--otlp-endpoint` needs (the `tracing` extra).
SDK_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
SERVICE_NAME = "infinity-cloud"
# Where the middleware leaves a request's trace in its ASGI scope, for `engine_calls.answer`.
SCOPE_KEY = "infinity_cloud.trace"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


def sdk_problem() -> str | None:
    """Why `--otlp-endpoint` cannot be served here (the SDK is missing, and how to add it), else None."""
    missing = [m for m in SDK_MODULES if _missing(m)]
    if not missing:
        return None
    return (f"--otlp-endpoint exports through the OpenTelemetry SDK ({', '.join(missing)} is missing): "
            f"{install_command('tracing')}")


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ModuleNotFoundError, ValueError):  # a parent package missing, a module blocked (None)
        return True


def traces_url(endpoint: str) -> str:
    """The collector's traces URL: OTLP/HTTP's `/v1/traces` added to a bare host, as the SDK does
    for its OTEL_EXPORTER_OTLP_ENDPOINT; a URL with a path is used as it is."""
    if urlsplit(endpoint).path.strip("/"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


class Tracing:
    """The tracer provider exporting to `endpoint`, and what the app hooks into: the batch
    observer (`observe_batch`), `shutdown`, and `TraceRequests`, the middleware."""

    def __init__(self, endpoint: str, service: str = SERVICE_NAME) -> None:
        problem = sdk_problem()
        if problem:
            raise ConfigError(problem)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context

        # Our own provider, not the global one: FastAPI's own telemetry reads the global
        # provider, and would export a second request span for every request.
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self.provider.get_tracer("infinity_cloud")
        self.server_kind = SpanKind.SERVER
        self.under = set_span_in_context  # a span -> the context of its children

    def observe_batch(self, report: BatchReport) -> None:
        """A batch observer (the worker's thread): the batch's spans in each request's trace
        whose inputs it held."""
        traces: dict[int, tuple[RequestTrace, int, float]] = {}
        for origin, wait in zip(report.origins, report.queue_wait_s, strict=True):
            if isinstance(origin, RequestTrace):
                _, count, longest = traces.get(id(origin), (origin, 0, 0.0))
                traces[id(origin)] = (origin, count + 1, max(longest, wait))
        if not traces:
            return
        # perf_counter seconds to the epoch nanoseconds spans are timed in
        offset = time.time_ns() - time.perf_counter_ns()
        started = int(report.started_at * 1e9) + offset
        ran = started + int(report.ran_s * 1e9)
        done = started + int(report.forward_s * 1e9)
        for trace, count, longest in traces.values():
            trace.batch(report, count, started - int(longest * 1e9), started, ran, done)

    def shutdown(self) -> None:
        """Export what is still buffered, then stop."""
        self.provider.shutdown()


class TraceRequests:
    """The ASGI middleware that gives each HTTP request a `RequestTrace` in its scope, and ends
    it with the answer's last byte."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app, self.tracing = app, tracing

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace = scope[SCOPE_KEY] = RequestTrace(self.tracing, time.time_ns())

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                trace.status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                trace.end()

        try:
            await self.app(scope, receive, sending)
        finally:
            trace.end()  # an answer never sent (the client left, a crash) ends here


class RequestTrace:
    """One request's spans. The `request` span opens when the request reaches a model
    (`begin`, from `engine_calls.answer`, timed from the request's arrival), `response` when
    its result is back (`answered`); both end with the answer's last byte (`end`)."""

    def __init__(self, tracing: Tracing, arrived_ns: int) -> None:
        self._tracing = tracing
        self._arrived_ns = arrived_ns
        self._lock = threading.Lock()  # batches are traced from the worker threads
        self.span: Any = None
        self._response: Any = None
        self._attributes: dict[str, str] = {}
        self.status = 0

    def begin(self, route: str) -> None:
        """The request reached a model's route; its inputs queued from now on are this trace's."""
        self._attributes = {"route": route}
        self.span = self._tracing.tracer.start_span(
            "request", kind=self._tracing.server_kind, start_time=self._arrived_ns,
            attributes={"route": route, "http.route": route},
        )

    def answered(self, model: str) -> None:
        """The engine's result is back: the response is written from now."""
        if self.span is None:
            return
        self._attributes["model"] = model
        self.span.set_attribute("model", model)
        self._response = self._child("response")

    def batch(self, report: BatchReport, inputs: int, queued: int, started: int, ran: int, done: int) -> None:
        """A batch that held `inputs` of this request's inputs, the longest queued from `queued`."""
        with self._lock:
            if self.span is None:
                return
            attributes = {**self._attributes, "model": report.model, "batch.size": report.size,
                          "batch.inputs_of_request": inputs}
            self._child("queue wait", queued, attributes).end(end_time=started)
            batch = self._child("batch", started, attributes)
            if report.failed:
                batch.set_attribute("error", True)
            context = self._tracing.under(batch)
            self._tracing.tracer.start_span("forward", context, start_time=started,
                                            attributes=attributes).end(end_time=ran)
            batch.end(end_time=done)

    def _child(self, name: str, start: int | None = None, attributes: dict[str, Any] | None = None) -> Any:
        return self._tracing.tracer.start_span(
            name, self._tracing.under(self.span), start_time=start,
            attributes=attributes if attributes is not None else dict(self._attributes),
        )

    def end(self) -> None:
        with self._lock:
            if self.span is None:
                return
            if self._response is not None:
                self._response.end()
            if self.status:
                self.span.set_attribute("http.response.status_code", self.status)
            self.span.end()
            self.span = None
