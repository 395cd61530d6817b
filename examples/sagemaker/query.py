"""Embed and rerank against a deployed SageMaker endpoint, with IAM-signed invoke_endpoint.

    pip install -e ".[aws]"                  # in the clone: boto3, which signs the calls
    python examples/sagemaker/query.py rag-models us-east-1
"""

import sys

from infinity_cloud.targets.sagemaker.client import SageMakerClient

endpoint, region = sys.argv[1], sys.argv[2]
client = SageMakerClient(endpoint, region_name=region)

documents = [
    "SageMaker runs the container as `<image> serve` on port 8080.",
    "A serverless endpoint takes payloads of up to 4 MB.",
    "Paris is the capital of France.",
]
vectors = client.embeddings.create(input=documents, model="embedder")
print(f"{len(vectors.data)} embeddings of {len(vectors.data[0].embedding)} dimensions")

ranked = client.rerank("How does SageMaker start the container?", documents, model="reranker",
                       return_documents=True)
for result in ranked.results:
    print(f"{result.relevance_score:.3f}  {result.document}")
