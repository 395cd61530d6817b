"""This copy's version (pyproject.toml's), which every layer may name: the cache keys and the
bulk job's manifest record it, the HTTP app reports it. The package root re-exports it."""

__version__ = "0.1.0"
