"""`infinity-cloud models list|load|unload --url`: the admin API (`server/admin_routes.py`)
from the command line."""

from __future__ import annotations

import time
from typing import Any

from infinity_cloud.core.errors import InfinityCloudError


class AdminError(InfinityCloudError):
    """The server refused or could not be reached."""


class AdminClient:
    def __init__(self, url: str, key: str | None, timeout_s: float = 30.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._errors = (httpx.HTTPError,)

    def _call(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, f"/admin{path}", **options)
        except self._errors as exc:
            raise AdminError(f"cannot reach {self._http.base_url}: {exc}") from None
        json = response.headers.get("content-type", "").startswith("application/json")
        body = response.json() if json else {}
        if response.status_code == 404 and path == "/models" and method == "GET":
            raise AdminError(f"{self._http.base_url} has no admin API: start it with --admin-key-file "
                             "(or --admin-key)")
        if response.status_code >= 400:
            message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
            raise AdminError(f"{response.status_code}: {message or response.text}")
        return body

    def models(self) -> list[dict[str, Any]]:
        return self._call("GET", "/models")["data"]

    def load(self, spec: dict[str, Any], wait_s: float | None = None) -> dict[str, Any]:
        """Load a model; with `wait_s`, poll until it is ready (or failed, or the time is up)."""
        model = self._call("POST", "/models", json=spec)
        if wait_s is None:
            return model
        deadline = time.monotonic() + wait_s
        while model.get("state") == "loading" and time.monotonic() < deadline:
            time.sleep(0.5)
            model = next((m for m in self.models() if m["id"] == model["id"]), model)
        if model.get("state") == "failed":
            raise AdminError(f"model {model['id']} failed to load: {model.get('error')}")
        return model

    def unload(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/models/{name}")
