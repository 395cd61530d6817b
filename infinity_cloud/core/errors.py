"""One tree of domain errors. The HTTP layer maps each class to a status in one table
(`infinity_cloud.server.errors`); the engine raises these and knows nothing of HTTP."""

from __future__ import annotations


class InfinityCloudError(Exception):
    """Base of every error the engine raises on purpose."""

    def __init__(self, message: str, *, param: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # Which input of the call it is about, where it is about one (a bulk job sets that row
        # aside and goes on with the rest).
        self.index = index


class InvalidInputError(InfinityCloudError):
    """The caller sent something the model cannot take (empty text, bad dimensions, ...)."""


class UnsupportedError(InvalidInputError):
    """The model lacks the capability or modality the caller asked for."""


class InputTooLongError(InvalidInputError):
    """An input is longer than the model's limit and truncation was turned off."""

    REMEDY = "send truncate=true"

    def naming(self, field: str, value: str = "true") -> InputTooLongError:
        """The same error telling the caller's own field (Voyage's `truncation=true`)."""
        return InputTooLongError(self.message.replace(self.REMEDY, f"send {field}={value}"), param=self.param,
                                 index=self.index)


class PayloadTooLargeError(InfinityCloudError):
    """Too many inputs, too many characters, or too many bytes in one request."""


class ModelNotFoundError(InfinityCloudError):
    """No served model has the requested name."""


class ModelConflictError(InfinityCloudError):
    """A model to load takes a name (or alias) another served model has."""


class ModelTooLargeError(PayloadTooLargeError):
    """A model to load would not fit the memory budget beside what is loaded."""


class QueueFullError(InfinityCloudError):
    """The model's queue is at its bound; the caller should retry later."""

    retry_after_s = 1


class ModelNotReadyError(InfinityCloudError):
    """The model is still loading, shutting down, or its worker died."""

    retry_after_s = 5


class MemoryExhaustedError(ModelNotReadyError):
    """Nothing is admitted, and the process holds more memory than the budget leaves a
    request even after giving freed memory back (a leak, fragmentation): not the caller's
    doing, and not over by waiting for other requests."""

    retry_after_s = 1


class DeviceMemoryError(InfinityCloudError):
    """The batch holding this request's inputs did not fit the device's memory (a CUDA
    out-of-memory): the worker lives on, and the request may be retried."""

    retry_after_s = 1


class BatchFailedError(InfinityCloudError):
    """Inference failed for the batch holding this request's inputs."""


class ModelLoadError(InfinityCloudError):
    """A model's files could not be found or read."""


class PrecisionCrashError(ModelLoadError):
    """A reduced precision kills the process on this CPU (a runtime's kernel bug): tried in a
    child first, so the server can serve float32 instead."""


class ConfigError(InfinityCloudError):
    """The deployment spec is invalid."""


class BackendUnavailableError(ConfigError):
    """A backend's optional dependencies are not installed."""
