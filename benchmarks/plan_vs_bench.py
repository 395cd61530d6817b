"""How far `plan`'s estimate is from what `bench` measured: the estimate for the hardware a
profile was measured on (its cores and kernel class, this machine's clock) against the
profile's best saturated throughput, for the profile's model.

    infinity-cloud bench --model-id M --out bench/ && \\
        python benchmarks/plan_vs_bench.py --profile bench/profile.json --model M

Run it on a model the calibration (infinity_cloud/data/calibration.json) was not measured on,
or the comparison is circular. Not a test: it reads timings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from infinity_cloud.hardware import cpu_clock_ghz
from infinity_cloud.sizing.estimate import Offer, Shape, calibrations, estimate, kernel_class
from infinity_cloud.sizing.profile import Profile


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="the model folder (its config.json)")
    args = parser.parse_args()
    profile = Profile.read(args.profile)
    hardware = profile.hardware
    here = Offer(
        target="local",
        name="this machine",
        device="cpu",
        memory_gib=0,
        usd_per_hour=0,
        source="-",
        as_of="-",
        cores=hardware.cores,
        kernel_class=kernel_class(hardware.kernel_flags),
        clock_ghz=cpu_clock_ghz() or 2.5,
    )
    shape = Shape.of(json.loads((args.model / "config.json").read_text()))
    best = max(profile.points, key=lambda p: p.tokens_per_s)
    length = profile.tokens_per_text.get(best.kind, 128)
    predicted = estimate(here, shape, length, calibrations())
    print(
        json.dumps(
            {
                "hardware": hardware.kind,
                "model": profile.model,
                "measured_point": f"{best.kind} x{best.per_request} at {best.concurrency} clients",
                "tokens_per_text": length,
                "measured_tokens_per_s": best.tokens_per_s,
                "predicted_tokens_per_s": round(predicted.tokens_per_s),
                "predicted_over_measured": round(predicted.tokens_per_s / best.tokens_per_s, 3),
                "basis": predicted.basis,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
