"""What this CPU can do at most: its flags, and measured GEMM throughput in float32, bfloat16
and int8 on a model's own layer shapes, as a bound in tokens/s for that model.

    python benchmarks/roofline.py [--model-id <model folder>] [--tokens 160] [--threads N]

float32 and bfloat16 are torch's matmul (oneDNN/MKL); int8 is ONNX Runtime's MatMulInteger
(u8 x s8, the kernel `--dtype int8` runs). The GEMMs are an encoder layer's four (QKV,
attention output, feed-forward up and down) at batch 32 x `--tokens`; attention scores,
softmax and layer norms are left out, so the bound is an upper one. Other benchmarks call
`measure()` to print it beside their results.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from infinity_cloud.core.hardware import cpu_flags, int8_kernels, usable_cores

# The flags that decide which kernels run.
FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8",
)


def layer_shapes(config: dict[str, Any], rows: int) -> list[tuple[int, int, int]]:
    """(rows, inputs, outputs) of one encoder layer's GEMMs."""
    hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    return [(rows, hidden, 3 * hidden), (rows, hidden, hidden), (rows, hidden, inner), (rows, inner, hidden)]


def _timed(run: Any, flops: float, windows: int = 5, seconds: float = 0.4) -> float:
    """GFLOP/s in the best of several short windows: a bound, so the least disturbed one."""
    started = time.perf_counter()
    run()  # first-call set-up
    first = time.perf_counter() - started
    if first > seconds:  # a slow path (emulated bf16: 35 s a call on mpnet's shapes): its rate
        return flops / first / 1e9
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or count < 2:
            run()
            count += 1
        best = max(best, flops * count / elapsed / 1e9)
    return best


def torch_gflops(shapes: list[tuple[int, int, int]], dtype: str, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    kind = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    # Outputs written in place: allocating 30 MB a product would time page faults, not GEMMs.
    triples = [
        (torch.randn(m, k, dtype=kind), torch.randn(k, n, dtype=kind), torch.empty(m, n, dtype=kind))
        for m, k, n in shapes
    ]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    return _timed(lambda: [torch.mm(a, b, out=c) for a, b, c in triples], flops)


def int8_gflops(shapes: list[tuple[int, int, int]], threads: int) -> float:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inputs, outputs, weights, feed = [], [], [], [], {}
    rng = np.random.default_rng(0)
    for i, (m, k, n) in enumerate(shapes):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.UINT8, [m, k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.INT32, [m, n]))
        weights.append(numpy_helper.from_array(rng.integers(-127, 127, (k, n), dtype=np.int8), f"w{i}"))
        nodes.append(helper.make_node("MatMulInteger", [f"x{i}", f"w{i}"], [f"y{i}"]))
        feed[f"x{i}"] = rng.integers(0, 255, (m, k), dtype=np.uint8)
    graph = helper.make_graph(nodes, "gemms", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()  # inputs and outputs in place, as for torch
    for name, array in feed.items():
        binding.bind_cpu_input(name, array)
    for i, (m, _, n) in enumerate(shapes):
        out = ort.OrtValue.ortvalue_from_numpy(np.empty((m, n), dtype=np.int32))
        binding.bind_ortvalue_output(f"y{i}", out)
    flops = sum(2 * m * k * n for m, k, n in shapes)
    return _timed(lambda: session.run_with_iobinding(binding), flops)


def measure(config: dict[str, Any], tokens: int = 160, threads: int | None = None) -> dict[str, Any]:
    threads = threads or usable_cores()
    shapes = layer_shapes(config, 32 * tokens)
    # A token's GEMM work through every layer (the bound's denominator).
    per_token = sum(2 * k * n for _, k, n in shapes) * int(config["num_hidden_layers"])
    flags = cpu_flags()
    result: dict[str, Any] = {
        "flags": [f for f in FLAGS if f in flags], "int8_kernels": int8_kernels(), "threads": threads,
        "tokens_per_text": tokens, "gflop_per_token": per_token / 1e9,
    }
    for dtype, measure_one in (
        ("float32", lambda: torch_gflops(shapes, "float32", threads)),
        ("bfloat16", lambda: torch_gflops(shapes, "bfloat16", threads)),
        ("int8", lambda: int8_gflops(shapes, threads)),
    ):
        gflops = measure_one()
        result[dtype] = {"gflops": round(gflops, 1), "tokens_per_s_bound": round(gflops * 1e9 / per_token)}
    return result


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(names, platform.processor() or platform.machine())


def cpu_summary() -> dict[str, Any]:
    """The CPU a figure came from: its name, usable cores, the flags of note."""
    flags = cpu_flags()
    return {"cpu": cpu_name(), "cores": usable_cores(), "flags": [f for f in FLAGS if f in flags],
            "int8_kernels": int8_kernels()}


def describe(result: dict[str, Any]) -> str:
    """One line to print beside a benchmark's results."""
    bounds = ", ".join(
        f"{d} {result[d]['gflops']:.0f} GFLOP/s ({result[d]['tokens_per_s_bound']:,} tokens/s)"
        for d in ("float32", "bfloat16", "int8")
    )
    return (
        f"CPU flags: {' '.join(result['flags']) or 'none of note'} (int8 kernels: {result['int8_kernels']}); "
        f"GEMM roofline on {result['threads']} threads: {bounds}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-id", type=Path, default=None, help="model folder (default: packaged MiniLM)")
    parser.add_argument("--tokens", type=int, default=160, help="tokens per text")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.model_id is None:
        from infinity_cloud.models.model_source import packaged_default_model

        args.model_id = packaged_default_model()
    config = json.loads((Path(args.model_id) / "config.json").read_text())
    result = measure(config, args.tokens, args.threads)
    print(describe(result))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
