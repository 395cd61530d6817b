"""The `infinity-cloud` command: serve, show the merged spec, download models, embed a corpus,
bench and plan, and for each registered target the verbs it offers (`build|deploy|invoke|
status|delete TARGET`), with flags made from its spec section. A module per verb; `app.py`
assembles them."""

import sys

from infinity_cloud.cli.app import build_cli
from infinity_cloud.cli.spec_flags import SPEC_OPTIONS

__all__ = ["SPEC_OPTIONS", "app", "build_cli", "main"]

app = build_cli()


def main() -> None:
    sys.exit(app())
