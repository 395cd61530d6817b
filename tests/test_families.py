"""Model families (`infinity_cloud/families/`): each built folder is read by the family meant
for it, and a family written here, in the test, is served and exported with nothing else
changed: its module (below) and its line in the registry are all it takes; so is one whose
tower reads a kind of input of its own (a sensor's readings), which it declares
(`input_kind.InputKind`): served through the engine, over HTTP and by the bulk job."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FAKE, fake, serve_in_process, spec_of

from infinity_cloud import Engine, families
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec, ModelSpec
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.core.input_kind import InputKind
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.families import Family, ModelFolder, read_model_info
from infinity_cloud.families.base import TOKEN_STATES, TextFacts, TowerEncoders, graphs_of, text_graph
from infinity_cloud.numerics.inputs import Encoded, ModelInputs
from infinity_cloud.text.input_encoder import TextInputEncoder
from infinity_cloud.text.tokenization import TextTokenizer


@pytest.mark.parametrize(("kind", "options", "family"), [
    ("bert_embedder", {}, "text-encoder"),
    ("decoder_embedder", {}, "text-encoder"),
    ("t5_encoder", {}, "text-encoder"),
    ("gemma3_embedder", {}, "bidirectional-decoder"),
    ("gemma3_embedder", {"bidirectional": False}, "text-encoder"),
    ("bert_reranker", {}, "cross-encoder"),
    ("bert_classifier", {}, "classifier"),
    ("qwen3_reranker", {}, "llm-reranker"),
    ("gemma_reranker", {}, "llm-reranker"),
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


def variant(model: Path, folder: Path, **config: object) -> Path:
    """A copy of `model` in `folder`, its config.json with `config` laid over it: what tells a
    test family's folder from the plain one it was copied from."""
    shutil.copytree(model, folder)
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**data, **config}), encoding="utf-8")
    return folder


@pytest.fixture
def pooler_folder(tiny_embedder: Path, tmp_path: Path) -> Path:
    return variant(tiny_embedder, tmp_path / "pooler", embedding="pooler_output")


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


# -- a family with its own kind of input, written in the test --------------------------------
# Its readings tower reads a sensor's readings (a list of numbers, or a text of them: "0.5 1.25"),
# which no module of the package knows of, and its text tower reads notes its own way: the
# kind it declares (`READINGS`), the family's own facts (`SensorFacts`) and its towers' input
# encoders (`ReadingsEncoder`, `NotesEncoder`) are all it adds, with its registry line.

# Sent inline (not fetched), needing no extra: the wire, the command line and the bulk job
# take it once the family that declares it is registered.
READINGS = InputKind("readings")


@dataclass(frozen=True)
class SensorFacts:
    """What the folder says of its readings: they are read in steps of 1 / `steps_per_unit`,
    each step one token id from `first_id` on, `steps` of them."""

    steps_per_unit: int
    first_id: int = 5
    steps: int = 50


def readings_of(item: Any) -> list[Any]:
    """An input's readings: a list of numbers as it is, or a text of them ("0.5 1.25") parsed;
    [] when it is neither."""
    if isinstance(item, list | tuple):
        return list(item)
    try:
        return [float(x) for x in item.split()] if isinstance(item, str) else []
    except ValueError:
        return []


class ReadingsEncoder:
    """A readings tower's input encoder: each reading to the token id of its step, a list of
    them one model input (`numerics.inputs.InputEncoder`)."""

    kind = "readings"
    fetched = False  # sent in the call itself: encoded in the tokenizer pool
    cost = 16  # readings an input holds, as estimated before it is read

    def __init__(self, facts: SensorFacts, pad_id: int) -> None:
        self.facts, self.pad_id = facts, pad_id

    def check(self, inputs: Sequence[Any], limits: LimitsSpec) -> None:
        for index, item in enumerate(inputs):
            if not (values := readings_of(item)) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in values
            ):
                raise InvalidInputError(f"'input' item {index} must be a list of readings", param="input")

    def encode(self, inputs: Sequence[Any], truncate: bool = True) -> list[Encoded]:
        items = [readings_of(item) for item in inputs]
        return [Encoded([self.token_id(x) for x in item], [0] * len(item)) for item in items]

    def token_id(self, reading: float) -> int:
        facts = self.facts
        return facts.first_id + min(max(round(reading * facts.steps_per_unit), 0), facts.steps - 1)

    def collate(self, items: Sequence[Encoded], rows: int | None = None) -> ModelInputs:
        return ModelInputs.collate(items, self.pad_id, rows=rows)

    def probes(self) -> list[Encoded]:
        return self.encode([[0.0, 1.5, 3.0], [2.5] * 8])


def rendered(note: str) -> str:
    """A note of readings ("temp=21.5, humidity=40", its fields in any order) as the model
    was trained on them: "field: value" per field, in the fields' order."""
    pairs = sorted(part.strip().partition("=")[::2] for part in note.split(","))
    return "; ".join(f"{field.strip()}: {value.strip()}" for field, value in pairs)


class NotesEncoder(TextInputEncoder):
    """A text tower that reads notes of readings, each rendered as the model was trained on."""

    def encode(self, texts: Sequence[str], truncate: bool = True, role: str | None = None) -> list[Encoded]:
        return super().encode([rendered(text) for text in texts], truncate, role)


class Sensor(Family):
    """Models that embed a sensor's readings and texts about them into one space, marked in
    their config.json by "reads": "readings" with their "steps_per_unit"."""

    name = "sensor"
    graphs = graphs_of(TOKEN_STATES)
    kinds = (READINGS,)

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.config.get("reads") == "readings"

    def read(self, folder: ModelFolder) -> ModelInfo:
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.EMBED, normalize=True,
            towers={"text": "token_states", "readings": "token_states"},
            own_facts=SensorFacts(int(folder.config["steps_per_unit"])),
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        readings = ReadingsEncoder(info.own_facts, tokenizer.pad_id)
        return {"text": NotesEncoder(tokenizer), "readings": readings}


@pytest.fixture
def sensor_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry line: the test family first, before the text encoder that would claim it."""
    monkeypatch.setattr(families, "FAMILIES", [Sensor(), *families.FAMILIES])
    yield


@pytest.fixture
def sensor_folder(tiny_embedder: Path, tmp_path: Path) -> Path:
    return variant(tiny_embedder, tmp_path / "sensor", reads="readings", steps_per_unit=10)


SENT = [[0.0, 0.5, 1.25], [3.0, 2.9, 2.8, 2.7, 0.1], [0.0, 0.5, 1.25]]


def readings_vectors(folder: Path, items: list[list[float]]) -> np.ndarray:
    """What the sensor model served by the fake backend makes of `items`: its token states are
    rows of its table, so a readings vector is the mean of its readings' steps' rows,
    normalised, as the family's facts make them."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    table = np.random.default_rng(0).standard_normal((config["vocab_size"], config["hidden_size"]))
    steps = [[5 + min(max(round(x * 10), 0), 49) for x in item] for item in items]
    want = np.stack([table[ids].astype(np.float32).mean(0) for ids in steps])
    return want / np.linalg.norm(want, axis=1, keepdims=True)


async def test_a_family_with_its_own_kind_of_input_is_served_through_the_engine(
    sensor_registered: None, sensor_folder: Path
) -> None:
    """Readings go through the real engine (checked, costed, encoded in the tokenizer pool,
    batched on their own tower's queue, finished by the embedding task) as the family's
    encoder reads them; its text tower still reads text."""
    async with Engine(fake(sensor_folder, "sensor")) as engine:
        served = engine.model("sensor")
        assert served.loaded.info.family.name == "sensor" and served.towers == ("text", "readings")
        result = await engine.embeddings(EmbedAsk(SENT, "sensor", modality="readings"))  # type: ignore[arg-type]
        text = await engine.embeddings(EmbedAsk(["temp=21.5, humidity=40"], "sensor"))
        with pytest.raises(InvalidInputError, match="list of readings"):
            await engine.embeddings(EmbedAsk(["not readings"], "sensor", modality="readings"))  # type: ignore[arg-type]
        info = served.loaded.info
    np.testing.assert_allclose(result.embeddings, readings_vectors(sensor_folder, SENT), atol=1e-5)
    assert result.prompt_tokens == sum(map(len, SENT))
    assert np.array_equal(result.embeddings[0], result.embeddings[2])
    assert not np.allclose(result.embeddings[0], result.embeddings[1])
    assert text.embeddings.shape == (1, info.hidden_size)


async def test_its_text_tower_reads_notes_its_own_way_over_http(
    sensor_registered: None, sensor_folder: Path, tiny_embedder: Path
) -> None:
    """Over the real app, a note is embedded as its rendering (the same files served as a
    plain text encoder, given that rendering, answer the same vector), its fields in any
    order."""
    notes = ["temp=21.5, humidity=40", "humidity=40,temp=21.5"]
    spec = spec_of(fake(sensor_folder, "sensor"), fake(tiny_embedder, "plain"))
    async with serve_in_process(spec) as client:
        ours = await client.post("/v1/embeddings", json={"model": "sensor", "input": notes})
        plain = await client.post("/v1/embeddings", json={"model": "plain", "input": [rendered(notes[0])]})
    assert ours.status_code == 200 and plain.status_code == 200, (ours.text, plain.text)
    vectors = np.array([row["embedding"] for row in ours.json()["data"] + plain.json()["data"]])
    assert rendered(notes[0]) == "humidity: 40; temp: 21.5"
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)
    np.testing.assert_allclose(vectors[1], vectors[2], atol=1e-6)


def as_text(item: list[float]) -> str:
    return " ".join(map(str, item))


async def test_its_own_kind_of_input_is_served_over_http(
    sensor_registered: None, sensor_folder: Path
) -> None:
    """The kind the family declares is one the wire takes (`modality: readings`, as text or
    listed in the OpenAPI document), with no module of the package changed; an unknown kind
    is still the 422 naming every kind served, the family's too."""
    async with serve_in_process(spec_of(fake(sensor_folder, "sensor"))) as client:
        served = await client.post("/v1/embeddings", json={
            "model": "sensor", "input": [as_text(item) for item in SENT], "modality": "readings"})
        unknown = await client.post("/v1/embeddings", json={"model": "sensor", "input": "1 2",
                                                            "modality": "smell"})
        document = (await client.get("/openapi.json")).json()
    assert served.status_code == 200, served.text
    vectors = np.array([row["embedding"] for row in served.json()["data"]])
    np.testing.assert_allclose(vectors, readings_vectors(sensor_folder, SENT), atol=1e-5)
    assert served.json()["usage"]["prompt_tokens"] == sum(map(len, SENT))
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "modality", unknown.text
    assert "'readings'" in unknown.text and "'image'" in unknown.text
    modality = document["components"]["schemas"]["EmbeddingRequest"]["properties"]["modality"]
    assert "readings" in next(s for s in modality["anyOf"] if "enum" in s)["enum"]


async def test_without_its_family_its_kind_is_refused_over_http(tiny_embedder: Path) -> None:
    async with serve_in_process(spec_of(fake(tiny_embedder, "plain"))) as client:
        response = await client.post("/v1/embeddings", json={"model": "plain", "input": "1 2",
                                                             "modality": "readings"})
        document = (await client.get("/openapi.json")).json()
    assert response.status_code == 422 and "'readings'" not in response.text, response.text
    modality = document["components"]["schemas"]["EmbeddingRequest"]["properties"]["modality"]
    assert next(s for s in modality["anyOf"] if "enum" in s)["enum"] == ["text", "image", "audio"]


def test_its_own_kind_of_input_is_embedded_by_the_bulk_job(
    sensor_registered: None, sensor_folder: Path, tmp_path: Path
) -> None:
    """`infinity-cloud embed --modality readings`: each row's field is the input as it is
    (not a file to read, as an image's is), embedded as the server embeds it."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from infinity_cloud.cli import app as cli

    rows = [{"id": f"r{i}", "readings": as_text(item)} for i, item in enumerate(SENT)]
    source = tmp_path / "readings.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = CliRunner().invoke(cli, [
        "embed", str(source), "--out", str(tmp_path / "out"), "--model-id", str(sensor_folder),
        "--backend", FAKE, "--modality", "readings", "--text-field", "readings"])
    assert result.exit_code == 0, result.output
    table = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet"))).sort_by("row")
    assert table["id"].to_pylist() == ["r0", "r1", "r2"]
    got = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, readings_vectors(sensor_folder, SENT), atol=1e-5)


def test_without_its_registry_line_the_sensor_folder_is_a_text_encoder(sensor_folder: Path) -> None:
    assert read_model_info(sensor_folder).family.name == "text-encoder"
