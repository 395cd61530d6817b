"""A Python client for a deployed SageMaker endpoint, shaped like the OpenAI and Cohere
clients but calling sagemaker-runtime's invoke_endpoint (IAM-signed by boto3):

    from infinity_cloud.targets.sagemaker.client import SageMakerClient

    client = SageMakerClient("my-endpoint", region_name="us-east-1")
    vectors = client.embeddings.create(input=["hello"], model="bge-m3").data[0].embedding
    ranked = client.rerank(query="what is a panda?", documents=["a bear", "a car"], top_n=1)
    labels = client.classify(input=["great!"]).data[0][0].label
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from pydantic import BaseModel

from infinity_cloud.targets.aws import aws_calls, import_boto3
from infinity_cloud.targets.sagemaker import sagemaker_api


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    object: str = "embedding"
    index: int
    embedding: list[float]


class EmbeddingsResponse(BaseModel):
    """OpenAI's `CreateEmbeddingResponse` shape."""

    object: str = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: str | None = None


class RerankResponse(BaseModel):
    """Results sorted by score, highest first, as Cohere's and Infinity's rerank give them."""

    results: list[RerankResult]
    model: str
    usage: Usage


class Label(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    data: list[list[Label]]
    model: str
    usage: Usage


class SageMakerClient:
    def __init__(self, endpoint_name: str, *, region_name: str | None = None, runtime: Any = None) -> None:
        """`runtime`: a boto3 sagemaker-runtime client of your own (credentials, retries)."""
        if runtime is None:
            runtime = import_boto3().client("sagemaker-runtime", region_name=region_name)
        self.endpoint_name = endpoint_name
        self._runtime = runtime
        self.embeddings = _Embeddings(self)

    def invoke(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """One invoke_endpoint call to the endpoint's /invocations; failures raise SageMakerError."""
        with aws_calls(f"invoke endpoint {self.endpoint_name!r}"):
            return sagemaker_api.invoke(lambda _: self._runtime, self.endpoint_name, body, route)

    def rerank(
        self, query: str, documents: list[str], *, model: str | None = None, top_n: int | None = None,
        return_documents: bool = False, raw_scores: bool = False,
    ) -> RerankResponse:
        body = {"query": query, "documents": documents, "model": model, "top_n": top_n,
                "return_documents": return_documents, "raw_scores": raw_scores}
        return RerankResponse.model_validate(self.invoke("rerank", body))

    def classify(
        self, input: str | list[str], *, model: str | None = None, raw_scores: bool = False
    ) -> ClassifyResponse:
        body = {"input": input, "model": model, "raw_scores": raw_scores}
        return ClassifyResponse.model_validate(self.invoke("classify", body))


class _Embeddings:
    def __init__(self, client: SageMakerClient) -> None:
        self._client = client

    def create(
        self, input: str | list[str] | list[int] | list[list[int]], *, model: str | None = None,
        dimensions: int | None = None, **_: Any,
    ) -> EmbeddingsResponse:
        """Vectors travel as base64 float32 (a quarter of the JSON, under SageMaker's payload
        limit for longer) and come back as lists of floats, as the OpenAI client does."""
        body = {"input": input, "model": model, "dimensions": dimensions, "encoding_format": "base64"}
        answer = self._client.invoke("embeddings", body)
        for row in answer["data"]:
            row["embedding"] = np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4").tolist()
        return EmbeddingsResponse.model_validate(answer)
