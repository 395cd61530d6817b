"""A text model's token-states tower: its text graph with no pooling head, each input's token
states as its rows (late chunking pools them per chunk, `tasks.late_chunking`). Built on the
first call that needs it, not at load: most servers never get one, and it is a second backend
(compiled graph, weights on torch) with its own queue and worker."""

from __future__ import annotations

from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.models.tower_builder import Tower, TowerBuilder
from infinity_cloud.tasks.late_chunking import LATE_CHUNKED, TOKEN_STATES_TOWER
from infinity_cloud.text.input_encoder import TextInputEncoder


def token_states_graph(info: ModelInfo, name: str) -> str:
    """The model's text graph, where it returns token states (a 400 otherwise: CLIP's text
    tower pools inside its graph)."""
    graph = info.towers.get("text")
    if graph is None or info.family.graph(graph).returns != "token_states":
        raise UnsupportedError(f"model {name!r} pools inside its graph, so its chunks cannot be pooled from "
                               "its token states: late_chunking is not served by it", param="late_chunking")
    return graph


def build_token_states(builder: TowerBuilder, info: ModelInfo, encoder: TextInputEncoder, name: str) -> Tower:
    """The token-states tower, its worker started (slow: a backend opened and warmed up)."""
    return builder.build(TOKEN_STATES_TOWER, token_states_graph(info, name), encoder, LATE_CHUNKED)
