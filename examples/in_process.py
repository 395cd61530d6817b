"""Use the engine without a server: the same batching, models and maths as the HTTP API."""

from __future__ import annotations

import asyncio

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.engine.asks import EmbedAsk


async def main() -> None:
    async with Engine(ModelSpec()) as engine:  # all-MiniLM-L6-v2 by default
        result = await engine.embeddings(EmbedAsk(["hello world", "goodbye world"], dimensions=128))
        print(result.embeddings.shape, "tokens:", result.prompt_tokens)


if __name__ == "__main__":
    asyncio.run(main())
