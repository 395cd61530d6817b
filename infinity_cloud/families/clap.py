"""CLAP: a RoBERTa text tower and an HTSAT audio tower into one space, normalised. Unfused
models only: a fused one reads random crops of long audio."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import Example, Graph, ModelInfo
from infinity_cloud.core.input_kind import InputKind
from infinity_cloud.families.base import AUDIO_INPUTS, TEXT_INPUTS, Family, TowerEncoders, graphs_of, pooled
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.two_tower import text_embeds

if TYPE_CHECKING:
    from infinity_cloud.text.tokenization import TextTokenizer


@dataclass(frozen=True)
class ClapFacts:
    """The audio feature extractor's settings (preprocessor_config.json, or inside
    processor_config.json)."""

    audio_processor: dict[str, Any] = field(repr=False)


def _audio_example(info: ModelInfo, names: tuple[str, ...]) -> Example:
    """Log-mel frames x bins of CLAP's window."""
    import torch

    audio = info.facts(ClapFacts).audio_processor
    frames = int(float(audio.get("max_length_s", 10)) * int(audio.get("sampling_rate", 48_000)))
    frames = frames // int(audio.get("hop_length", 480)) + 1
    example = torch.randn(2, 1, frames, int(audio.get("feature_size", 64))) * 10 - 40
    return (example,), {"input_features": {0: "batch"}}


AUDIO_EMBEDS = Graph(  # unfused CLAP: `is_longer` is not read
    "audio_embeds", "vectors", lambda model, feed: pooled(model.get_audio_features(**feed)),
    inputs=lambda model: AUDIO_INPUTS, example=_audio_example,
)


# Audio clips, as URLs or data URIs, decoded with soundfile and resampled with soxr
# (`media/audio.py`).
AUDIO = InputKind("audio", fetched=True, extra="audio", modules=("soundfile", "soxr"),
                  needs="soundfile and soxr")


class Clap(Family):
    name = "clap"
    graphs = graphs_of(text_embeds(TEXT_INPUTS[:2]), AUDIO_EMBEDS)
    kinds = (AUDIO,)

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.model_type == "clap"

    def read(self, folder: ModelFolder) -> ModelInfo:
        config = folder.config
        text, audio = config.get("text_config") or {}, config.get("audio_config") or {}
        if audio.get("enable_fusion"):
            raise UnsupportedError(
                f"{folder.path.name} is a fused CLAP model (random crops of long audio); unfused CLAP "
                "models are served"
            )
        positions = int(text.get("max_position_embeddings") or 514) - 2  # RoBERTa offsets by padding
        limit = folder.tokenizer_config.get("model_max_length")
        if isinstance(limit, int | float) and limit < 1e6:  # transformers' sentinel for "no limit" is huge
            positions = min(positions, int(limit))
        return ModelInfo(
            path=folder.path, family=self, capability=Capability.EMBED, model_type="clap",
            architectures=folder.architectures, max_length=positions,
            hidden_size=int(config.get("projection_dim") or 512), vocab_size=text.get("vocab_size"),
            pad_token=folder.pad_token, normalize=True,
            towers={"text": "text_embeds", "audio": "audio_embeds"},
            own_facts=ClapFacts(folder.preprocessor("feature_extractor")), raw=config,
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        from infinity_cloud.media.audio import AudioEncoder

        audio = AudioEncoder(info.facts(ClapFacts).audio_processor)
        return {**super().encoders(info, tokenizer), "audio": audio}
