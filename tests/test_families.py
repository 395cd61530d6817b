"""Model families (`infinity_cloud/families/`): each built folder is read by the family meant
for it, and a family written here, in the test, is served and exported with nothing else
changed: its module (below) and its line in the registry are all it takes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_process, spec_of

from infinity_cloud import families
from infinity_cloud.capability import Capability
from infinity_cloud.config import ModelSpec
from infinity_cloud.families import Family, ModelFolder, read_model_info
from infinity_cloud.families.base import TextFacts, graphs_of, text_graph
from infinity_cloud.family import ModelInfo


@pytest.mark.parametrize(("kind", "options", "family"), [
    ("bert_embedder", {}, "text-encoder"),
    ("decoder_embedder", {}, "text-encoder"),
    ("bert_reranker", {}, "cross-encoder"),
    ("bert_classifier", {}, "classifier"),
    ("splade", {}, "splade"),
    ("colbert", {}, "colbert"),
    ("clip", {}, "clip"),
    ("clip", {"model_type": "siglip"}, "siglip"),
    ("clap", {}, "clap"),
    ("colpali", {}, "colpali"),
    ("colqwen2", {}, "colqwen2"),
])
def test_each_folder_is_read_by_its_family(
    build_model: Callable[..., Path], kind: str, options: dict[str, Any], family: str
) -> None:
    info = read_model_info(build_model(kind, **options))
    assert info.family.name == family
    assert set(info.towers.values()) <= set(info.family.graphs), "every tower runs one of the family's graphs"


def test_a_bare_masked_lm_is_splade_only_when_told(build_model: Callable[..., Path]) -> None:
    bare = build_model("splade", sentence_transformers=False)
    assert read_model_info(bare).family.name == "text-encoder"
    assert read_model_info(bare, pooling="splade").family.name == "splade"


# -- a family written in the test ---------------------------------------------------------

POOLER = text_graph("pooler_output", "vectors", lambda model, feed: model(**feed).pooler_output)


class BertPooler(Family):
    """Models whose sentence vector is BERT's pooler (tanh of a dense layer over [CLS]),
    marked in their config.json by "embedding": "pooler_output"."""

    name = "bert-pooler"
    graphs = graphs_of(POOLER)

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.config.get("embedding") == "pooler_output"

    def read(self, folder: ModelFolder) -> ModelInfo:
        facts = TextFacts.of(folder)
        return facts.info(folder, self, capability=Capability.EMBED, towers={"text": "pooler_output"})


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry line: the test family first, before the text encoder that would claim it."""
    monkeypatch.setattr(families, "FAMILIES", [BertPooler(), *families.FAMILIES])
    yield


@pytest.fixture
def pooler_folder(tiny_embedder: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "pooler"
    shutil.copytree(tiny_embedder, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["embedding"] = "pooler_output"
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def pooler_outputs(folder: Path, texts: list[str]) -> np.ndarray:
    """transformers' own BertModel pooler output for `texts`: the reference."""
    import torch
    from transformers import AutoTokenizer, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = BertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(**tokenizer(texts, padding=True, return_tensors="pt")).pooler_output.numpy()


TEXTS = ["a short one", "a somewhat longer text, so that the batch is padded", "x"]


@pytest.mark.parametrize(("backend", "atol"), [("torch", 1e-5), ("onnx", 1e-4), ("openvino", 1e-4)])
async def test_a_family_written_here_is_served_and_exported(
    registered: None, pooler_folder: Path, backend: str, atol: float
) -> None:
    """Served by the torch backend from its graph, and by ONNX Runtime and OpenVINO from that
    graph's export (the folder ships no ONNX file), over HTTP, equal to transformers' pooler."""
    assert read_model_info(pooler_folder).family.name == "bert-pooler"
    spec = ModelSpec(model_id=str(pooler_folder), served_model_name="pooler", backend=backend,
                     dtype="float32")
    async with serve_in_process(spec_of(spec)) as client:
        response = await client.post("/v1/embeddings", json={"model": "pooler", "input": TEXTS})
        assert response.status_code == 200, response.text
        ours = np.array([row["embedding"] for row in response.json()["data"]])
        model = next(m for m in (await client.get("/v1/models")).json()["data"] if m["id"] == "pooler")
    assert model["backend"] == backend and model["dimensions"] == ours.shape[1]
    theirs = pooler_outputs(pooler_folder, TEXTS)
    assert np.abs(ours - theirs).max() < atol
    assert not np.allclose(ours[0], ours[1]), "different texts, different vectors"


def test_without_its_registry_line_the_folder_is_a_text_encoder(pooler_folder: Path) -> None:
    assert read_model_info(pooler_folder).family.name == "text-encoder"
