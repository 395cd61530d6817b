"""What the container tells SageMaker's Batch Transform agent to send (`/execution-parameters`),
from the memory budget, within SageMaker's bounds: MaxPayloadInMB at most 100, and
MaxConcurrentTransforms x MaxPayloadInMB at most 100; 6 MB is its default payload
(docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html, MaxPayloadInMB).
And how a mini-batch's body is cut into engine-sized batches of whole lines."""

from __future__ import annotations

import pytest

from infinity_cloud.server.dialects.batch_transform import (
    HELD_PER_PAYLOAD_BYTE,
    TransformSettings,
    records,
    transform_settings,
)

MB = 2**20


@pytest.mark.parametrize(("room_mb", "limit_mb", "want"), [
    (None, 16, TransformSettings(6, 4)),  # no budget: SageMaker's default payload, four at once
    (1536, 6, TransformSettings(6, 4)),  # a 2 GB container, 1.5 GB free for requests
    (100, 6, TransformSettings(6, 2)),  # room for two 6 MB mini-batches (42 MB each)
    (40, 6, TransformSettings(5, 1)),  # not one: a smaller mini-batch, one at a time
    (1, 6, TransformSettings(1, 1)),  # the least SageMaker takes
    (4096, 2, TransformSettings(2, 4)),  # the body limit bounds the payload
])
def test_settings_fit_the_budget_and_sagemakers_bounds(
    room_mb: int | None, limit_mb: int, want: TransformSettings
) -> None:
    got = transform_settings(None if room_mb is None else room_mb * MB, limit_mb * MB)
    assert got == want
    assert 1 <= got.payload_mb <= 100 and got.payload_mb * got.concurrent <= 100
    if room_mb is not None and room_mb >= HELD_PER_PAYLOAD_BYTE:
        assert got.payload_mb * got.concurrent * HELD_PER_PAYLOAD_BYTE <= room_mb
    assert got.as_execution_parameters() == {
        "MaxConcurrentTransforms": want.concurrent, "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": want.payload_mb,
    }


def test_a_body_is_cut_into_batches_of_whole_lines_in_order() -> None:
    body = b"".join(b'{"text": "r%d"}\n' % i for i in range(7))
    batches = list(records(body, 3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [line for b in batches for line in b] == body.splitlines()
    # An empty line is a record; the last needs no newline.
    assert list(records(b"a\n\nb", 10)) == [[b"a", b"", b"b"]]
    assert list(records(b"", 10)) == []
