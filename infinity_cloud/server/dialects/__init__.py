"""The wire dialects the app speaks, a module each: its request models, routes and answers.
What they share is in `common`; how a dialect is mounted, and how dialects that share a path
are told apart, in `registry`.

Adding a dialect: its module (requests, routes, answers, and its `DIALECT`) and its line in
`DIALECTS`; `create_app(dialects=...)` serves another list."""

from __future__ import annotations

from infinity_cloud.server.dialects import cohere, infinity, jina, openai, sagemaker, tei, voyage
from infinity_cloud.server.dialects.registry import Dialect

DIALECTS: tuple[Dialect, ...] = (
    openai.DIALECT,
    infinity.DIALECT,
    cohere.DIALECT,
    jina.DIALECT,
    voyage.DIALECT,
    tei.DIALECT,
    sagemaker.DIALECT,
)

__all__ = ["DIALECTS", "Dialect"]
