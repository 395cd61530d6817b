"""Logging for every process that serves (the local server, a target's container): one
format, text or JSON, each line with its request id; uvicorn's lines in it too."""

from __future__ import annotations

import logging
from typing import Any


def configure_logging(level: str, form: str = "text") -> None:
    """One log format for every process a target runs (local server, container): text, or one
    JSON object a line (`--log-format json`, for log pipelines); both carry the request id."""
    from infinity_cloud.server.request_id import RequestIdFilter

    handler = logging.StreamHandler()
    if form == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        ))
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s%(request_tag)s", datefmt="%H:%M:%S"
        ))
    handler.addFilter(RequestIdFilter())
    # Not forced: a process that configured logging already (a host application, pytest) keeps it.
    # uvicorn is started with log_config=None (`UVICORN_LOGS`), so its lines come here too.
    logging.basicConfig(level=level.upper(), handlers=[handler])


# uvicorn.run/Config's logging arguments for every target: none of its own handlers, so its
# lines (start-up, access) take this format and carry the request id.
UVICORN_LOGS: dict[str, Any] = {"log_config": None}
