"""Wire schemas: what clients send. Responses are built in `responses.py`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from infinity_cloud.errors import UnsupportedError
from infinity_cloud.server.openapi import Checked, Limit
from infinity_cloud.tasks.quantization import EMBEDDING_TYPES

# TEI's truncation side (only "right" is served; "left" is refused, not ignored).
Direction = Literal["right", "left", "Right", "Left"]

# What validation.py checks after parsing, stated for the OpenAPI document (server/openapi.py).
# A text: not empty (400), not longer than the limit (413).
Text = Annotated[StrictStr, Checked(minLength=1, maxLength=Limit("max_chars_per_text"))]
# A string that may be a text or a media URL (modality image or audio): not empty; its length
# is checked only when it is a text.
Item = Annotated[StrictStr, Checked(minLength=1)]
# Inputs of one request: at least one (400), no more than the limit (413).
_INPUTS = Checked(minItems=1, maxItems=Limit("max_inputs_per_request"))
Texts = Annotated[list[Text], _INPUTS]
Items = Annotated[list[Item], _INPUTS]
# A token id outside the vocabulary is a 400; a negative one always is.
TokenId = Annotated[StrictInt, Checked(minimum=0)]
TokenIdList = Annotated[list[TokenId], Checked(minItems=1)]
# dimensions, top_n: 0 means all; a negative one is a 400.
NonNegative = Annotated[StrictInt, Checked(minimum=0)]


def _one_list_of(*fields: str) -> dict[str, Any]:
    """A model's JSON-schema rule for its validator: exactly one of `fields` is a list (null
    is the same as absent)."""
    return {"oneOf": [{"required": [field], "properties": {field: {"type": "array"}}} for field in fields]}


# Fields of the dialects we speak that no request model serves, the values that mean what
# the server does anyway, and why any other is refused: a 400 naming the field, never an
# answer that silently is not what was asked.
UNSERVED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "max_tokens_per_doc": ((), "Cohere's per-document token cap; documents are cut at the model's own "
                           "limit (truncate): omit it"),
    "rank_fields": ((), "Cohere's fields of structured documents; send each document's text"),
    "task": ((), "Jina's task adapters; say what texts are for with input_type (the model's "
             "query/document prompts)"),
    "late_chunking": ((False,), "Jina's late chunking"),
    "normalized": ((True,), "Jina's normalized=false; embeddings are as the model makes them"),
    "truncate_prompt_tokens": ((), "vLLM's per-input token cap; inputs are cut at the model's limit "
                               "(truncate)"),
}


class _Request(BaseModel):
    # Fields no dialect we speak defines are ignored (clients add their own); those some
    # dialect defines are served, or refused (UNSERVED_FIELDS).
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`null` for a field means its default (litellm sends `encoding_format: null`); a
        required field sent as null is then reported missing. A dialect's field that is not
        served is a 400 naming it."""
        if not isinstance(data, dict):
            return data
        for name, (harmless, reason) in UNSERVED_FIELDS.items():
            value = data.get(name)
            if value is not None and name not in cls.model_fields and value not in harmless:
                raise UnsupportedError(f"'{name}' is not served: {reason}", param=name)
        return {k: v for k, v in data.items() if v is not None}

    model: str | None = Field(None, description="served model name; optional with one model")


class EmbeddingRequest(_Request):
    input: Item | Items | TokenIdList | Annotated[list[TokenIdList], _INPUTS] = Field(
        ..., description="a text, a list of texts, a list of token ids, or a list of such lists; with "
        "modality image or audio, URLs or data URIs (fewer per request: the server's media limit)"
    )
    encoding_format: Literal["float", "base64", "sparse"] = Field(
        "float", description="sparse: {indices, values} per input, for SPLADE models"
    )
    dimensions: NonNegative | None = Field(None, description="Matryoshka truncation; 0 = full")
    modality: Literal["text", "image", "audio"] = "text"
    embedding_type: Literal["float32", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None, description="quantised output for this request; default: the model's --embedding-dtype"
    )
    input_type: Literal["query", "document"] | None = Field(
        None, description="what the texts are for (Voyage): a multi-vector (ColBERT) model reads them as "
        "queries or documents; an embedder puts its sentence-transformers prompt for that use before "
        "them, where it declares one (none: the texts as they are)"
    )
    truncate: bool = Field(True, description="cut inputs to the model's limit instead of a 400")
    user: str | None = None
    # Voyage's names for embedding_type, dimensions and truncate.
    output_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None, description="Voyage's embedding_type (float: float32)"
    )
    output_dimension: NonNegative | None = Field(None, description="Voyage's dimensions")
    truncation: bool | None = Field(None, description="Voyage's truncate")

    @model_validator(mode="after")
    def _one_name_each(self) -> EmbeddingRequest:
        for ours, voyage in (("embedding_type", "output_dtype"), ("dimensions", "output_dimension"),
                             ("truncate", "truncation")):
            if voyage in self.model_fields_set and ours in self.model_fields_set:
                raise ValueError(f"send '{ours}' or Voyage's '{voyage}', not both")
        return self

    @property
    def kind(self) -> str | None:
        """The embedding type asked for (None: the model's --embedding-dtype)."""
        if self.output_dtype is not None:
            return "float32" if self.output_dtype == "float" else self.output_dtype
        return self.embedding_type

    @property
    def dims(self) -> int | None:
        return self.output_dimension if self.output_dimension is not None else self.dimensions

    @property
    def truncates(self) -> bool:
        return self.truncate if self.truncation is None else self.truncation

    def inputs(self) -> list[str] | list[list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]  # type: ignore[list-item]  # one pre-tokenized input
        return self.input  # type: ignore[return-value]


class TextDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: Item


class RerankRequest(_Request):
    """Every dialect's rerank: Infinity, Jina and Cohere send `documents`, TEI `texts`, Voyage
    `top_k` and `truncation`; TEI and Voyage are answered in their own shapes."""

    model_config = ConfigDict(json_schema_extra=_one_list_of("documents", "texts"))

    query: Text
    documents: Annotated[list[Item | TextDocument], _INPUTS] | None = None
    texts: Items | None = Field(None, description="TEI's name for the documents")
    top_n: NonNegative | None = Field(None, description="how many results; absent or 0 = all")
    top_k: NonNegative | None = Field(None, description="Voyage's name for top_n")
    return_documents: bool = False
    return_text: bool = Field(False, description="TEI's return_documents")
    raw_scores: bool = Field(False, description="logits instead of sigmoid scores")
    truncate: bool = True
    truncation: bool | None = Field(None, description="Voyage's truncate")
    truncation_direction: Direction = "right"
    modality: Literal["text", "image"] = Field(
        "text", description="what the documents are: image URLs or data URIs for a multi-vector model "
        "(ColPali)"
    )

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("send the documents to rank as 'documents' (or TEI's 'texts'), not both")
        return self

    @property
    def tei(self) -> bool:
        return self.texts is not None

    @property
    def voyage(self) -> bool:
        return self.top_k is not None or self.truncation is not None

    @property
    def truncates(self) -> bool:
        return self.truncate if self.truncation is None else self.truncation

    def docs(self) -> list[str]:
        if self.texts is not None:
            return self.texts
        return [d if isinstance(d, str) else d.text for d in self.documents or ()]

    @property
    def limit(self) -> int | None:
        return self.top_n if self.top_n is not None else self.top_k


class ClassifyRequest(_Request):
    input: Text | Texts
    raw_scores: bool = Field(False, description="logits instead of softmax scores")
    truncate: bool = True

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class CohereEmbedRequest(_Request):
    """Cohere's embed (v1 and v2): texts, and how they will be used."""

    model_config = ConfigDict(json_schema_extra=_one_list_of("texts", "images"))

    texts: Texts | None = Field(None, description="the texts to embed (or images)")
    input_type: (
        Literal["search_document", "search_query", "classification", "clustering", "image"] | None
    ) = Field(None, description="mapped to the model's matching prompt when it declares one")
    embedding_types: list[Annotated[StrictStr, Checked(enum=list(EMBEDDING_TYPES))]] | None = Field(
        None, description="float, int8, uint8 (calibrated per model, offline), binary, ubinary"
    )
    truncate: Literal["NONE", "START", "END"] = Field("END", description="NONE: too long is a 400")
    output_dimension: NonNegative | None = Field(None, description="Matryoshka truncation")
    images: Annotated[
        list[Item], Checked(minItems=1, maxItems=Limit("max_inputs_per_request", "max_media_per_request"))
    ] | None = Field(None, description="data URIs, for a model that embeds images")

    @model_validator(mode="after")
    def _texts_or_images(self) -> CohereEmbedRequest:
        if (self.texts is None) == (self.images is None):
            raise ValueError("send either 'texts' or 'images'")
        return self


# -- TEI (text-embeddings-inference) ---------------------------------------------------------


class _TeiInputs(_Request):
    inputs: Text | Texts

    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else self.inputs


class _TeiTruncation(_TeiInputs):
    truncate: bool = Field(True, description="cut inputs to the model's limit (TEI's default is a 4xx)")
    truncation_direction: Direction = "right"


class TeiEmbedRequest(_TeiTruncation):
    normalize: bool = True
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")
    dimensions: NonNegative | None = None


class TeiEmbedSparseRequest(_TeiTruncation):
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")


class TeiPredictRequest(_TeiTruncation):
    raw_scores: bool = False


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source_sentence: Text
    sentences: Texts


class TeiSimilarityRequest(_TeiTruncation):
    """TEI's `/similarity` (huggingface_hub's `sentence_similarity`): the cosine of the source
    sentence's embedding to each sentence's."""

    inputs: SimilarityInputs  # type: ignore[assignment]  # TEI's shape for this route
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")


class TeiAnyRequest(TeiEmbedRequest):
    """`POST /`: embed's fields, and predict's for a classifier; a sentence-similarity body
    (`inputs: {source_sentence, sentences}`) is answered as `/similarity` answers it."""

    inputs: Text | Texts | SimilarityInputs  # type: ignore[assignment]
    raw_scores: bool = False


class TeiTokenizeRequest(_TeiInputs):
    add_special_tokens: bool = True
    prompt_name: str | None = None


class TeiDecodeRequest(_Request):
    ids: list[TokenId] | list[list[TokenId]]
    skip_special_tokens: bool = True
