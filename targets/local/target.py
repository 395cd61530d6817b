from __future__ import annotations

from pathlib import Path

from infinity_cloud.config import DeploymentSpec
from targets.base import configure_logging, copy_source, render_templates, spec_yaml, torch_version


class LocalTarget:
    name = "local"

    def serve(self, spec: DeploymentSpec) -> None:
        """Load every model (a failure stops here), then serve until interrupted."""
        import uvicorn
        from rich.console import Console

        from infinity_cloud.engine import Engine
        from infinity_cloud.server import create_app

        configure_logging(spec.server.log_level)
        names = ", ".join(m.name for m in spec.models)
        with Console(stderr=True).status(f"loading {names}"):
            engine = Engine.loaded(spec)
        app = create_app(engine)
        uvicorn.run(app, host=spec.server.host, port=spec.server.port, log_level=spec.server.log_level)

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """A Dockerfile, a compose file and the spec; the image bakes the weights in."""
        out_dir = Path(out_dir)
        source = copy_source(out_dir)
        container_spec = spec.model_copy(
            update={"server": spec.server.model_copy(update={"host": "0.0.0.0"})}
        )
        (out_dir / "infinity-cloud.yaml").write_text(spec_yaml(container_spec))
        written = render_templates(
            "local",
            out_dir,
            {
                "spec": container_spec,
                "torch_version": torch_version(),
                "from_source": source is not None,
            },
        )
        return [*written, out_dir / "infinity-cloud.yaml", *([source] if source else [])]
