"""The interactive API docs (Swagger UI) with its assets served by the server itself, from
the swagger-ui-bundle package, so /docs works where no CDN can be reached."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_ASSETS = "/docs/assets"


def add_docs(app: FastAPI, prefix: str) -> None:
    import swagger_ui_bundle

    assets = f"{prefix}{DOCS_ASSETS}"
    app.mount(assets, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get(f"{prefix}/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or f"{prefix}/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js", swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
        )
