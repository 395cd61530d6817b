"""Backends run a batch of token arrays through a model; everything around that is shared."""

from infinity_cloud.backends.base import Backend, ModelInputs
from infinity_cloud.backends.registry import available_backends, backend_class

__all__ = ["Backend", "ModelInputs", "available_backends", "backend_class"]
