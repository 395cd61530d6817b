from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.server.protocol import ClassifyRequest
from infinity_cloud.server.responses import classify_body

router = APIRouter(tags=["classify"], route_class=JsonRoute, responses=error_responses())


@router.post("/classify", summary="Classify texts: every label's score, highest first")
async def classify(body: ClassifyRequest, request: Request) -> Response:
    inputs = body.inputs()
    result = await answer(request, "classify", body.model, len(inputs), request.app.state.engine.classify(
        inputs, body.model, raw_scores=body.raw_scores, truncate=body.truncate,
    ))
    return json_response(classify_body(result))
