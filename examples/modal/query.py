"""Embed and rerank against a deployed Modal app, with the same clients as the local server.

    pip install openai httpx                 # the clients (no extra of infinity-cloud installs them)
    export INFINITY_CLOUD_URL=...            # what `infinity-cloud status modal --app-name rag-models` prints
    export INFINITY_CLOUD_ENDPOINT_KEY=...   # a key from the `rag-api-keys` Modal secret
    python examples/modal/query.py
"""

import os

import httpx
from openai import OpenAI

url = os.environ.get("INFINITY_CLOUD_URL", "http://127.0.0.1:7997")
key = os.environ.get("INFINITY_CLOUD_ENDPOINT_KEY", "unused")

documents = [
    "Modal bakes the model weights into the image at build time.",
    "A cold container restores from a memory snapshot.",
    "Paris is the capital of France.",
]
query = "How does the deployment avoid downloading weights at start-up?"

client = OpenAI(base_url=url, api_key=key)
vectors = client.embeddings.create(model="bge-m3", input=documents).data
print(f"{len(vectors)} embeddings of {len(vectors[0].embedding)} dimensions")

ranked = httpx.post(
    f"{url}/rerank",
    json={"model": "reranker", "query": query, "documents": documents, "return_documents": True},
    headers={"Authorization": f"Bearer {key}"},
    timeout=60,
).json()
for result in ranked["results"]:
    print(f"{result['relevance_score']:.3f}  {result['document']}")
