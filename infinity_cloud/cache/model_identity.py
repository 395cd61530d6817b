"""The result cache's identity of a model: what its rows are cached under. The model's files
by their content (`content_digest.model_fingerprint`, not its served name: the same weights
under two names share rows, new weights under an old name never do), and what else changes
its numbers: its graph, backend, precision, device model, backend options, pooling,
normalisation, and this package's version."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infinity_cloud.core.hardware import cpu_model, kernel_flags
from infinity_cloud.core.version import __version__


def namespace(identity: str, facts: Iterable[Any]) -> str:
    """A model's key prefix: its files' digest and what else changes its rows."""
    digest = hashlib.blake2b(identity.encode(), digest_size=12)
    for fact in facts:
        digest.update(b"\0" + repr(fact).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelIdentity:
    """One tower of a served model, as the cache tells models apart."""

    fingerprint: str  # its files by their content
    family: str
    graph: str
    backend: str
    dtype: str
    device: str  # where its backend runs (`cpu`, `cuda:0`)
    device_model: str  # that device by its model (a GPU's name: `Backend.device_name`)
    pooling: str
    normalize: bool
    trust_remote_code: bool
    backend_options: Mapping[str, Any]

    @property
    def namespace(self) -> str:
        # The device by its model (a GPU's name; a CPU's, and the flags its kernels pick):
        # replicas on other hardware compute other last digits, so they keep rows apart.
        device = f"{cpu_model()} {kernel_flags()}" if self.device.startswith("cpu") else self.device_model
        facts = (__version__, self.family, self.graph, self.backend, self.dtype, device, self.pooling,
                 self.normalize, "rows before Normalize", self.trust_remote_code,
                 sorted(self.backend_options.items()))
        return namespace(self.fingerprint, facts)
