"""Which attention kernel OpenVINO runs for a compiled graph, read from the compiled model
itself (its runtime graph's layers), so the log says what runs, not what was hoped for.

The ONNX trace's MatMul-Softmax-MatMul becomes a `ScaledDotProductAttention` op in the IR
where OpenVINO's conversion recognises it. The CPU plugin then runs it as its own SDPA kernel,
or as a Snippets subgraph that fuses the whole of multi-head attention (Q x K^T, scale, mask,
Softmax, x V) into one JIT kernel per layer (seen on an AVX2 EPYC with OpenVINO 2026.4:
`jit_avx2_f32`), or, with neither, as separate MatMul and Softmax layers that hold the whole
(heads, length, length) scores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SDPA_OP = "ScaledDotProductAttention"


@dataclass(frozen=True)
class AttentionPath:
    in_ir: int  # ScaledDotProductAttention ops in the IR
    sdpa_kernels: int  # run by the CPU plugin's SDPA kernel
    snippets: int  # fused multi-head attention subgraphs (Snippets)
    softmax: int  # Softmax layers left on their own
    primitive: str = ""  # the fused kernel's implementation (jit_avx2_f32, ...)

    @property
    def kernel(self) -> str:
        if self.sdpa_kernels:
            return "sdpa"
        if self.snippets:
            return "snippets"
        return "matmul-softmax" if self.softmax else "none"

    def describe(self) -> str:
        ir = f"{self.in_ir} ScaledDotProductAttention op(s) in the IR"
        if self.sdpa_kernels:
            return f"OpenVINO's SDPA kernel ({self.sdpa_kernels} layer(s); {ir})"
        if self.snippets:
            return (f"fused multi-head attention: Q x K^T, scale, mask, Softmax and x V in one Snippets "
                    f"kernel per layer ({self.primitive}; {self.snippets} layer(s); {ir})")
        if self.softmax:
            return f"unfused MatMul, Softmax, MatMul ({self.softmax} Softmax layer(s); {ir})"
        return f"no attention layer found ({ir})"


def attention_path(compiled: Any, ir_xml: Path) -> AttentionPath:
    """What `compiled` (an `ov.CompiledModel`) runs for attention; `ir_xml` its IR's graph
    file, whose op types are counted from its text (the weights are in the .bin beside it)."""
    try:
        in_ir = ir_xml.read_text(encoding="utf-8").count(f'type="{SDPA_OP}"')
    except OSError:
        in_ir = 0
    sdpa = snippets = softmax = 0
    primitive = ""
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else ""
        if kind == SDPA_OP:
            sdpa += 1
        elif kind == "Subgraph" and _is_attention(op):
            snippets += 1
            primitive = info["primitiveType"].astype(str) if "primitiveType" in info else ""
        elif kind == "Softmax":
            softmax += 1
    return AttentionPath(in_ir, sdpa, snippets, softmax, primitive)


def _is_attention(op: Any) -> bool:
    """A Snippets subgraph that is attention: it takes Q, K^T, the mask and V, each per head
    (rank 4: batch, heads and length in some order, and the head's width or length), where an
    element-wise chain takes (batch, length, width) states. Its fused layers' names are not
    kept in a compiled blob read back from the cache, so its inputs are what tell."""
    ranks = [source.get_partial_shape().rank for source in op.inputs()]
    return sum(rank.is_static and rank.get_length() == 4 for rank in ranks) >= 3
