"""`plan`'s model of a deployment: properties that must hold whatever the numbers (more load
never fewer replicas, a tighter p95 never a larger batch), the estimate's calibration, and
a measured profile taking the estimate's place on its own hardware class."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infinity_cloud.sizing import plan
from infinity_cloud.sizing.estimate import Calibration, Shape, calibrations, estimate, kernel_class, offers
from infinity_cloud.sizing.profile import Hardware, Point, Profile

MINILM = Shape(layers=6, hidden=384, inner=1536, max_tokens=512)
MPNET = Shape(layers=12, hidden=768, inner=3072, max_tokens=514)
POINTS = calibrations()
loads = st.builds(
    plan.Load,
    qps=st.floats(0.01, 5000),
    tokens_per_request=st.integers(8, 8192),
    texts_per_request=st.just(1),
    p95_ms=st.one_of(st.none(), st.floats(20, 60_000)),
)


@settings(max_examples=150, deadline=None)
@given(load=loads, more=st.floats(1.0, 50.0), target=st.sampled_from(plan.planned_targets()))
# Lambda's instances came from a replica's queued p95, which falls as replicas are added: 16
# instances at 1 request/s, 15 at 1.25 (hypothesis found it).
@example(load=plan.Load(1.0, 2124, 1, None), more=1.25, target="aws_lambda")
def test_more_load_never_means_fewer_replicas(load: plan.Load, more: float, target: str) -> None:
    busier = plan.Load(load.qps * more, load.tokens_per_request, 1, load.p95_ms)
    for offer in offers(target):
        one = plan.plan_offer(
            offer, MINILM, load, estimate(offer, MINILM, load.tokens_per_text, POINTS), True
        )
        two = plan.plan_offer(
            offer, MINILM, busier, estimate(offer, MINILM, busier.tokens_per_text, POINTS), True
        )
        assert two.replicas >= one.replicas
        assert two.monthly_usd >= one.monthly_usd


@settings(max_examples=150, deadline=None)
@given(load=loads, p95=st.floats(20, 60_000), tighter=st.floats(0.05, 1.0), rate=st.floats(10, 2e6))
def test_a_tighter_p95_never_means_larger_batches(
    load: plan.Load, p95: float, tighter: float, rate: float
) -> None:
    loose = plan.Load(load.qps, load.tokens_per_request, 1, p95)
    tight = plan.Load(load.qps, load.tokens_per_request, 1, p95 * tighter)
    assert plan.batch_for(tight, rate) <= plan.batch_for(loose, rate)
    assert plan.SMALLEST_BATCH <= plan.batch_for(tight, rate) <= plan.LARGEST_BATCH


def test_a_batch_chosen_for_a_p95_is_predicted_within_it() -> None:
    load = plan.Load(qps=10, tokens_per_request=256, p95_ms=500)
    batch = plan.batch_for(load, 20_000)
    assert plan.predicted_p95_ms(batch, 20_000, plan.UTILISATION) <= 500
    assert plan.predicted_p95_ms(batch * 2, 20_000, plan.UTILISATION) > 500  # the largest that fits


def test_the_cheapest_offer_that_meets_the_p95_is_chosen() -> None:
    load = plan.Load(qps=200, tokens_per_request=256, p95_ms=300)
    best, every = plan.choose("modal", MPNET, load, POINTS)
    meeting = [c for c in every if c.meets_p95]
    assert best.meets_p95 and best.monthly_usd == min(c.monthly_usd for c in meeting)
    assert {"hardware", "replicas", "batch_tokens", "cost", "deadline_s", "autoscaling"} <= set(best.reasons)


def test_every_estimate_says_what_it_was_calibrated_on() -> None:
    gpu = next(o for o in offers("modal") if o.device == "L4")
    cpu = next(o for o in offers("kubernetes") if o.device == "cpu")
    for offer in (gpu, cpu):
        found = estimate(offer, MPNET, 128, POINTS)
        assert found.tokens_per_s > 0
        # neither an L4 nor an AMX CPU was measured here: the estimate says so
        assert "no profile of" in found.basis and "is assumed" in found.basis
    same = estimate(
        gpu,
        MPNET,
        128,
        [
            *POINTS,
            Calibration(
                label="L4 run",
                hardware_class="L4",
                peak_flops=121e12,
                shape=vars(MPNET),
                tokens_per_text=128,
                tokens_per_s=50_000,
                source="a test",
            ),
        ],
    )
    assert "the one profile of this class" in same.basis
    assert same.tokens_per_s == pytest.approx(50_000)  # the same model and length as measured


def test_a_profile_of_the_same_hardware_takes_the_estimates_place() -> None:
    offer = next(o for o in offers("kubernetes") if o.name == "c7i.xlarge")
    profile = Profile(
        created="2026-12-04T00:00:00+00:00",
        package_version="0",
        url="http://x",
        model="m",
        corpus="built-in",
        hardware=Hardware(device="cpu", cpu="Intel Xeon", cores=2, kernel_flags=["amx_bf16", "avx512f"]),
        tokens_per_text={"passage": 160.0},
        points=[Point(kind="passage", per_request=32, concurrency=16, tokens_per_s=9_000, requests=10)],
    )
    load = plan.Load(qps=5, tokens_per_request=160)
    found = plan.capacity_of(offer, MINILM, load, POINTS, profile)
    assert found.tokens_per_s == pytest.approx(9_000)
    assert found.basis.startswith("measured") and "from it" in found.basis
    other = plan.capacity_of(
        next(o for o in offers("kubernetes") if o.device == "L4"), MINILM, load, POINTS, profile
    )
    assert not other.basis.startswith("measured")  # another class: the estimate


def test_kernel_classes_from_flags() -> None:
    assert kernel_class({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}) == "amx"
    assert kernel_class({"avx2", "avx512f", "avx512_bf16"}) == "avx512_bf16"
    assert kernel_class({"avx2", "avx512f"}) == "avx512"
    assert kernel_class({"avx2"}) == "avx2"


def test_the_price_table_says_where_each_price_came_from() -> None:
    every = offers()
    assert {o.target for o in every} == set(plan.planned_targets())
    for offer in every:
        assert offer.usd_per_hour > 0 and offer.source and offer.as_of[:4].isdigit()
        assert offer.peak_flops() > 0
