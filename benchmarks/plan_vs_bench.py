"""How far `plan`'s estimate is from what `bench` measured, per model: each model's estimate for
the hardware its profile was measured on (the profile's cores and kernel class, the clock its
peak was computed at), made with that model LEFT OUT of the calibration, so the comparison is
not circular; the other cases' profiles stand in as calibration points of their class.

    infinity-cloud bench --model-id M1 --out bench-m1/ ...
    python benchmarks/plan_vs_bench.py \\
        --case all-MiniLM-L6-v2=PATH/TO/minilm:bench-m1/profile.json \\
        --case all-mpnet-base-v2=PATH/TO/mpnet:bench-m2/profile.json --out result.json

A case is NAME=MODEL_FOLDER:PROFILE[@GHZ] (GHZ: the clock of the machine a profile without a
peak was measured on; default this machine's); NAME is the model's id as calibration.json's `model` gives
it (its points are the ones left out). PROFILE is a `bench` profile or a point written by
benchmarks/cpu_seconds_calibration.py. `--unmeasured CLASS` drops every point of a class, to
show how far the rule for a class never measured is from a measurement. Not a test: it reads
timings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from http_load import print_json

from infinity_cloud.core.hardware import cpu_clock_ghz
from infinity_cloud.sizing.estimate import (
    FLOP_PER_CYCLE,
    Calibration,
    Calibrations,
    Offer,
    Shape,
    calibrations,
    estimate,
    kernel_class,
)
from infinity_cloud.sizing.profile import Hardware, Point, Profile


def _offer(profile: Profile) -> Offer:
    """The hardware the profile was measured on, as plan would price it."""
    hardware = profile.hardware
    kernels = kernel_class(hardware.kernel_flags)
    cores = hardware.cores or 1
    precision = profile.dtype if profile.dtype in FLOP_PER_CYCLE[kernels] else "float32"
    clock = (
        profile.peak_gflops / cores / FLOP_PER_CYCLE[kernels][precision]
        if profile.peak_gflops
        else cpu_clock_ghz() or 2.5
    )
    return Offer(
        target="bench",
        name=hardware.kind,
        device="cpu",
        memory_gib=0,
        usd_per_hour=0,
        source="-",
        as_of="-",
        cores=cores,
        kernel_class=kernels,
        clock_ghz=clock,
    )


def _best(profile: Profile) -> tuple[float, float, str]:
    best = max(profile.points, key=lambda p: p.tokens_per_s)
    length = profile.tokens_per_text.get(best.kind, 128.0)
    return best.tokens_per_s, length, f"{best.kind} x{best.per_request} at {best.concurrency} clients"


def _point(name: str, shape: Shape, profile: Profile) -> Calibration:
    offer = _offer(profile)
    rate, length, where = _best(profile)
    return Calibration(
        label=f"{profile.hardware.kind}, {name}, {profile.dtype}",
        hardware_class=offer.hardware_class,
        peak_flops=offer.peak_flops(),
        shape=vars(shape),
        tokens_per_text=length,
        tokens_per_s=rate,
        source=f"{where} (a case of this comparison)",
        model=name,
    )


def read(path: Path) -> Profile:
    """A bench profile, or a point of benchmarks/cpu_seconds_calibration.py as one: its tokens
    per server CPU-second x the cores (what the machine does with its cores to itself)."""
    data = json.loads(path.read_text())
    if "tokens_per_cpu_s" not in data.get("passage", {}):
        return Profile.model_validate(data)
    passage, cores = data["passage"], data["cores"]
    return Profile(
        created=data["created"],
        package_version="-",
        url="-",
        model=str(path),
        dtype="float32",
        corpus="built-in",
        hardware=Hardware(device="cpu", cpu=data["cpu"], cores=cores, kernel_flags=data["kernel_flags"]),
        tokens_per_text={"passage": passage["tokens"] / (passage["requests"] * passage["per_request"])},
        points=[
            Point(
                kind="passage",
                per_request=passage["per_request"],
                concurrency=passage["clients"],
                tokens_per_s=passage["tokens_per_cpu_s"] * cores,
                requests=passage["requests"],
            )
        ],
        conditions=data["conditions"],
        contended=data["conditions"]["load_avg_before"] > cores,
        peak_gflops=cores * data["clock_ghz"] * 32,
    )


def compare(
    cases: list[tuple[str, Path, Path, float | None]], unmeasured: str | None = None
) -> list[dict[str, Any]]:
    loaded = []
    for name, folder, path, clock in cases:
        shape = Shape.of(json.loads((folder / "config.json").read_text()))
        profile = read(path)
        if clock and not profile.peak_gflops:  # the clock the profile's machine ran at
            kernels = kernel_class(profile.hardware.kernel_flags)
            per_cycle = FLOP_PER_CYCLE[kernels].get(
                profile.dtype or "float32", FLOP_PER_CYCLE[kernels]["float32"]
            )
            profile = profile.model_copy(
                update={"peak_gflops": (profile.hardware.cores or 1) * clock * per_cycle}
            )
        loaded.append((name, shape, profile))
    shipped = calibrations()
    out = []
    for name, shape, profile in loaded:
        others = [_point(n, s, p) for n, s, p in loaded if n != name]
        # the cases' own profiles stand for their models: the shipped points of every case's
        # model are left out, and those of this one's model not put back
        table: Calibrations = shipped
        for case_name, _, _ in loaded:
            table = table.without(case_name)
        points = [p for p in [*table.points, *others] if p.hardware_class != unmeasured]
        table = table.model_copy(update={"points": points})
        offer = _offer(profile)
        measured, length, where = _best(profile)
        predicted = estimate(offer, shape, length, table)
        out.append(
            {
                "model": name,
                "cpu": profile.hardware.kind,
                "hardware_class": offer.hardware_class,
                "clock_ghz": round(offer.clock_ghz or 0, 3),
                "dtype": profile.dtype,
                "measured_point": where,
                "tokens_per_text": length,
                "measured_tokens_per_s": round(measured),
                "predicted_tokens_per_s": round(predicted.tokens_per_s),
                "predicted_over_measured": round(predicted.tokens_per_s / measured, 3),
                "range": predicted.spread,
                "basis": predicted.basis,
                "conditions": profile.conditions,
                "contended": profile.contended,
                "profile_created": profile.created,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", action="append", required=True, help="NAME=MODEL_FOLDER:PROFILE")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--unmeasured",
        default=None,
        help="A class to treat as never measured (e.g. cpu/avx2): its points are dropped, so its cases are "
        "estimated by calibration.json's rule from the nearest class, and the rule's error shows",
    )
    args = parser.parse_args()
    cases = []
    for case in args.case:
        name, rest = case.split("=", 1)
        folder, profile = rest.rsplit(":", 1)
        profile, _, clock = profile.partition("@")
        cases.append((name, Path(folder), Path(profile), float(clock) if clock else None))
    result = compare(cases, args.unmeasured)
    print_json(result, args.out)


if __name__ == "__main__":
    main()
