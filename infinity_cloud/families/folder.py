"""A model folder's own files, read once each: the JSON a family recognises it by and reads
its facts from. Imports no ML framework."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from infinity_cloud.core.errors import ModelLoadError

T = TypeVar("T")

# Keys of a config.json whose model reads images or audio besides text.
_MEDIA_CONFIGS = ("vision_config", "audio_config", "vlm_config")


def read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    """A JSON file's content; None when there is no such file."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class ModelFolder:
    """What families look at to recognise a folder and read it. `pooling` is the caller's
    override (`--pooling`), which can change what a folder is ("splade"); `instruction`, the
    caller's default instruction for a model that reads one (an LLM reranker)."""

    def __init__(self, path: Path, pooling: str | None = None, instruction: str | None = None) -> None:
        config = read_json(path / "config.json")
        if not isinstance(config, dict):
            raise ModelLoadError(f"{path} holds no readable config.json")
        self.path, self.pooling, self.instruction, self.config = path, pooling, instruction, config
        self.model_type = str(config.get("model_type", ""))
        self.architectures = tuple(str(a) for a in config.get("architectures") or ())
        self._memo: dict[str, Any] = {}

    @property
    def reads_media(self) -> bool:
        """Whether the model has an image or audio side (CLIP, CLAP, ColPali, ...)."""
        return any(key in self.config for key in _MEDIA_CONFIGS)

    def has_architecture(self, suffix: str) -> bool:
        return any(a.endswith(suffix) for a in self.architectures)

    @cached_property
    def tokenizer_config(self) -> dict[str, Any]:
        return _object(read_json(self.path / "tokenizer_config.json"))

    @cached_property
    def modules(self) -> list[dict[str, Any]] | None:
        """sentence-transformers' modules.json, if the folder is one."""
        modules = read_json(self.path / "modules.json")
        return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else None

    @cached_property
    def sentence_bert_config(self) -> dict[str, Any]:
        return _object(read_json(self.path / "sentence_bert_config.json"))

    @cached_property
    def sentence_transformers_config(self) -> dict[str, Any]:
        return _object(read_json(self.path / "config_sentence_transformers.json"))

    @cached_property
    def processor_config(self) -> dict[str, Any]:
        return _object(read_json(self.path / "processor_config.json"))

    def preprocessor(self, kind: str = "image_processor") -> dict[str, Any]:
        """The image processor's (or feature extractor's: `kind`) settings. Hub folders keep
        them in preprocessor_config.json; transformers 5 saves them inside processor_config.json."""
        own = read_json(self.path / "preprocessor_config.json")
        if isinstance(own, dict):
            return own
        return _object(self.processor_config.get(kind))

    def token(self, name: str, default: str) -> str:
        """A special token the tokenizer config names (`bos_token`, ...), as its text."""
        value = self.tokenizer_config.get(name) or default
        return str(value.get("content", default)) if isinstance(value, dict) else str(value)

    @property
    def pad_token(self) -> str | None:
        pad = self.tokenizer_config.get("pad_token")
        return pad.get("content") if isinstance(pad, dict) else pad

    def once(self, key: str, make: Callable[[ModelFolder], T]) -> T:
        """`make(self)`, computed once per folder (several families may ask for it)."""
        if key not in self._memo:
            self._memo[key] = make(self)
        return self._memo[key]
