"""Embed with the OpenAI SDK against a running `infinity-cloud serve`.

    pip install openai                # the client (no extra of infinity-cloud installs it)
    infinity-cloud serve &            # serves all-MiniLM-L6-v2 on port 7997
    python examples/openai_client.py
"""

from __future__ import annotations

import os

import numpy as np
from openai import OpenAI

url = os.environ.get("INFINITY_CLOUD_URL", "http://127.0.0.1:7997")
client = OpenAI(base_url=f"{url}/v1", api_key="unused-without---api-key")
texts = ["A panda is a bear native to China.", "Pandas eat bamboo.", "The stock market fell today."]
response = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)
vectors = np.array([item.embedding for item in response.data])
print(f"{len(vectors)} vectors of {vectors.shape[1]} dims, {response.usage.prompt_tokens} tokens")
print("similarity of text 0 to the others:", np.round(vectors[1:] @ vectors[0], 3))
