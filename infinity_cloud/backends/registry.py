"""Backend names to lazily imported classes; a missing dependency names its pip extra."""

from __future__ import annotations

import importlib
from typing import NamedTuple

from infinity_cloud.backends.base import Backend
from infinity_cloud.errors import BackendUnavailableError, ConfigError


class _Entry(NamedTuple):
    module: str
    cls: str
    extra: str | None


_BACKENDS: dict[str, _Entry] = {
    "torch": _Entry("infinity_cloud.backends.torch_backend", "TorchBackend", "torch"),
    "fake": _Entry("infinity_cloud.backends.fake", "FakeBackend", None),
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[Backend]:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(available_backends())}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        hint = f" (pip install 'infinity-cloud[{entry.extra}]')" if entry.extra else ""
        raise BackendUnavailableError(
            f"backend {name!r} cannot be used: {exc.name or exc} is not installed{hint}"
        ) from exc
    return getattr(module, entry.cls)
