"""CLIP: text and images into one space; its image tower reads a class token and the patches."""

from __future__ import annotations

from infinity_cloud.families.base import TEXT_INPUTS, graphs_of
from infinity_cloud.families.two_tower import IMAGE_EMBEDS, TwoTower, text_embeds


class Clip(TwoTower):
    name = "clip"
    graphs = graphs_of(text_embeds(TEXT_INPUTS[:2]), IMAGE_EMBEDS)
    class_token = True
