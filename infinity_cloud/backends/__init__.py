"""Backends run a batch of token arrays through a model; everything around that is shared."""

from infinity_cloud.backends.base import Backend
from infinity_cloud.backends.registry import available_backends, backend_class

__all__ = ["Backend", "available_backends", "backend_class"]
