"""Schemathesis over the app's own /openapi.json, in-process over ASGI against the fake backend:
bounded, deterministic examples for every route, valid and invalid, with the API key and
without; no 500, every answer in a status, content type and shape the document states, what
the document allows accepted (no 422) and what it forbids refused.

Nothing is left out: /docs, its assets and /openapi.json itself are not in the document, and
/metrics documents its text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from conftest import fake, spec_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from infinity_cloud.server.app import create_app

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# What the document allows is accepted: never a 422 (malformed). A 400 stays possible, for what
# depends on the model named and no schema can state (dimensions wider than its vectors, a token
# id outside its vocabulary, a prompt it lacks, a modality it does not read).
ACCEPTED = ["2xx", "400", "404", "429", "5xx"]
# What the document forbids is refused: 413 is the contract's refusal of a text or a list over
# the server's limits (which the document states as maxLength and maxItems).
REFUSED = ["400", "401", "404", "413", "422"]
EXAMPLES = 25  # per operation and mode: about 20 s in all on 2 cores, 27 s with the set-up
KEY = "fuzz-key"  # with a key, every protected route's 401 is answered and checked too
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def api_schema(
    tiny_embedder, tiny_reranker, tiny_classifier, build_model
) -> Iterator[schemathesis.BaseSchema]:
    colbert = build_model("colbert", strategy="fixed", attend=False)  # multi-vector: a path of its own
    models = (
        fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), fake(tiny_classifier, "cl"),
        fake(colbert, "colbert"),
    )
    app = create_app(spec_of(*models, api_keys=[KEY]))
    # Loading the document starts the app's lifespan on schemathesis' event loop, where it stays
    # until the test ends (schemathesis' pytest plugin stops it); the models load meanwhile.
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    schema.config.checks.positive_data_acceptance.expected_statuses = ACCEPTED
    schema.config.checks.negative_data_rejection.expected_statuses = REFUSED
    health = schema["/health"]["GET"]
    deadline = time.monotonic() + 60
    while health.Case().call().status_code != 200:
        assert time.monotonic() < deadline, "the models did not load"
        time.sleep(0.02)
    # The embedder's int8/uint8 ranges, which the first request asking for them starts (a 503
    # until they are ready, by design): ready before the fuzzing.
    embed = schema["/embeddings"]["POST"]
    while embed.Case(body={"model": "emb", "input": ["x"], "embedding_type": "int8"},
                     headers=AUTH).call().status_code != 200:
        assert time.monotonic() < deadline, "the int8 ranges were not calibrated"
        time.sleep(0.05)
    yield schema


def models_for(path: str, body: dict[str, Any]) -> list[str]:
    """The served models a valid request may name: a random name is a 404 with several models,
    and no request would go past it."""
    if path.endswith(("/classify", "/predict")):
        return ["cl"]
    if path.endswith(("/v1/embed", "/v2/embed")):  # Cohere's embed: a dense model's
        return ["emb"]
    if "rerank" in path or "query" in body:  # /invocations routes a body with a query to rerank
        return ["rr", "colbert"]  # ColBERT ranks by late interaction
    return ["emb", "colbert"]


def fuzz(operation: schemathesis.APIOperation, mode: GenerationMode) -> None:
    # derandomize: the same examples on every run, so CI fails only on a change.
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case, data: st.DataObject) -> None:
        checks = [*CHECKS, negative_data_rejection]
        if mode is GenerationMode.POSITIVE:
            checks = [*CHECKS, positive_data_acceptance]
            if isinstance(case.body, dict):
                case.body["model"] = data.draw(st.sampled_from(models_for(operation.path, case.body)))
        case.call_and_validate(headers=AUTH, checks=checks)

    run()


def test_every_route_answers_as_documented(api_schema: schemathesis.BaseSchema) -> None:
    # One test over every operation (schemathesis' own from_fixture reads a pytest attribute
    # pytest 9 dropped); every failing operation is reported, not only the first.
    failures = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        modes = [GenerationMode.POSITIVE]
        if operation.body or any(operation.iter_parameters()):  # something to make invalid
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            try:
                fuzz(operation, mode)
            except (Exception, FailureGroup) as exc:  # a group of failures is a BaseException
                failures.append(f"{operation.label} ({mode.value}): {exc}")
        keyless = operation.Case(path_parameters={p.name: "emb" for p in operation.path_parameters})
        try:
            keyless.call_and_validate(checks=CHECKS)
        except (Exception, FailureGroup) as exc:
            failures.append(f"{operation.label} (without the key): {exc}")
    assert not failures, "\n\n".join(failures)


def test_the_document_asks_for_a_key_only_where_one_is_set(tiny_embedder: Path) -> None:
    """A client generated from the document sends what it says: no key to a keyless server;
    the API key to the inference routes of a server with one, never to /health; the admin key
    (not the API key) to the admin API."""

    def security(**server: Any) -> dict[str, Any]:
        document = create_app(spec_of(fake(tiny_embedder, "emb"), **server)).openapi()
        return {f"{method.upper()} {path}": op.get("security") for path, item in document["paths"].items()
                for method, op in item.items()} | {"schemes": document.get("components", {}).get(
                    "securitySchemes")}

    keyless = security()
    assert not any(keyless.values()), {k: v for k, v in keyless.items() if v}
    keyed = security(api_keys=[KEY])
    assert keyed["POST /embeddings"] == [{"HTTPBearer": []}] and keyed["GET /models"] == [{"HTTPBearer": []}]
    assert keyed["GET /health"] is None and list(keyed["schemes"]) == ["HTTPBearer"]
    admin_only = security(admin_keys=["admin-secret"])
    assert admin_only["POST /admin/models"] == [{"AdminKey": []}], admin_only
    assert admin_only["POST /embeddings"] is None and list(admin_only["schemes"]) == ["AdminKey"]
