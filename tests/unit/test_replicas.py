"""Which devices a model is replicated onto (`models.replicas`), from its spec and the device
its first backend opened on; no backend runs here (a stand-in says what it opened on)."""

from __future__ import annotations

import pytest

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.hardware import usable_cores
from infinity_cloud.models import replicas


class Opened:
    """What `replica_devices` reads of an open backend: its device, and how many of that kind
    its class sees."""

    seen = 4

    def __init__(self, device: str) -> None:
        self.device = device

    @classmethod
    def visible_devices(cls, kind: str) -> int:
        return cls.seen if kind == "cuda" else 1


@pytest.mark.parametrize(("device", "ids", "opened", "want"), [
    ("cuda", None, "cuda", ["cuda", "cuda:1", "cuda:2", "cuda:3"]),  # every GPU seen
    ("auto", None, "cuda", ["cuda", "cuda:1", "cuda:2", "cuda:3"]),
    ("cuda", (1, 3), "cuda:1", ["cuda:1", "cuda:3"]),  # the ones named
    ("cuda:2", None, "cuda:2", ["cuda:2"]),  # one named
    ("cpu", None, "cpu", ["cpu"]),
    ("cpu", (0, 1, 2), "cpu", ["cpu:0", "cpu:1", "cpu:2"]),
    ("auto", None, "cpu", ["cpu"]),  # auto that found no GPU
])
def test_the_devices_a_model_is_replicated_onto(
    device: str, ids: tuple[int, ...] | None, opened: str, want: list[str]
) -> None:
    spec = ModelSpec(device=device, device_ids=ids)
    assert replicas.replica_devices(spec, Opened(opened)) == want  # type: ignore[arg-type]


def test_the_first_replica_opens_on_the_first_id_or_with_its_share_of_the_cores() -> None:
    assert replicas.first_spec(ModelSpec(device="cuda", device_ids=(2, 3))).device == "cuda:2"
    assert replicas.first_spec(ModelSpec(device="cuda")) == ModelSpec(device="cuda")
    split = replicas.first_spec(ModelSpec(device="cpu", device_ids=(0, 1)))
    assert split.backend_options["threads"] == max(1, usable_cores() // 2)
    mine = ModelSpec(device="cpu", device_ids=(0, 1), backend_options={"threads": 3})
    assert replicas.first_spec(mine).backend_options["threads"] == 3  # the user's word stands
