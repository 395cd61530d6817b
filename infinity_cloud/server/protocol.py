"""Wire schemas: what clients send. Responses are built in `responses.py`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class _Request(BaseModel):
    # Clients send fields we do not use (OpenAI's `user`, Cohere's `max_tokens_per_doc`):
    # accept and ignore them rather than break those clients.
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="served model name; optional with one model")


class EmbeddingRequest(_Request):
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]] = Field(
        ..., description="a text, a list of texts, a list of token ids, or a list of such lists"
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, description="Matryoshka truncation; 0 = full")
    modality: Literal["text", "image", "audio"] = "text"
    truncate: bool = Field(True, description="cut inputs to the model's limit instead of a 400")
    user: str | None = None

    def inputs(self) -> list[str] | list[list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]  # type: ignore[list-item]  # one pre-tokenized input
        return self.input  # type: ignore[return-value]


class TextDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: StrictStr


class RerankRequest(_Request):
    query: StrictStr
    documents: list[StrictStr | TextDocument]
    top_n: StrictInt | None = Field(None, description="how many results; absent or 0 = all")
    return_documents: bool = False
    raw_scores: bool = Field(False, description="logits instead of sigmoid scores")
    truncate: bool = True

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ClassifyRequest(_Request):
    input: StrictStr | list[StrictStr]
    raw_scores: bool = Field(False, description="logits instead of softmax scores")
    truncate: bool = True

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input
