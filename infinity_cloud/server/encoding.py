"""Response bodies: orjson (numpy arrays serialised natively) and base64 vectors."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def json_response(content: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content, option=_OPTIONS), status, headers, media_type="application/json")


def vector_base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes, as the OpenAI SDK decodes them; a quantised vector's own
    bytes (int8, uint8, packed bits)."""
    dtype = "<f4" if vector.dtype.kind == "f" else vector.dtype
    return base64.b64encode(np.ascontiguousarray(vector, dtype=dtype).tobytes()).decode("ascii")


def by_type_json(value: Any) -> Any:
    """One input's embedding of one type as JSON takes it: a vector or a matrix as it is, a
    sparse vector as its `indices` and `values`."""
    if hasattr(value, "indices") and hasattr(value, "values"):  # results.SparseVector
        return {"indices": value.indices, "values": value.values}
    return value
