"""Long inputs (512, 2,048 and 8,192 tokens a text) on a long-context ModernBERT: our server
against Infinity's, same machine, same model folder, interleaved rounds, one run.

    HF_HUB_OFFLINE=1 DO_NOT_TRACK=1 .venv/bin/python benchmarks/long_inputs_vs_infinity.py \\
        --corpus /work/shared/data/corpus.jsonl --seconds 15 --rounds 2 --texts 6 \\
        --out benchmarks/results/avx2-epyc-modernbert-long-inputs-vs-infinity.json \\
        --markdown benchmarks/results/avx2-epyc-modernbert-long-inputs-vs-infinity.md

The model is built here, seeded, with random weights (cost, not quality, is measured): a
ModernBERT with an 8,192-token window and a real size (hidden 384, 6 layers, 6 heads,
intermediate 1,536; ModernBERT's default attention: global every 3rd layer, a 128-token
sliding window in the others), and a WordPiece tokenizer trained here on the corpus with
`tokenizers` (model_max_length 8,192). It is saved as a plain transformers folder, without
sentence-transformers module files: Infinity's sentence-transformers 3.4.1 cannot read folders
saved by sentence-transformers 6, and mean-pools a bare folder, as ours does.

Texts are exactly N tokens each, the model's [CLS] and [SEP] included (the corpus's passages
joined, cut by the tokenizer and checked by re-encoding). For each length, each side gets a
closed-loop load (benchmarks/http_load.py's `load`) of --concurrency clients (fewer at 8,192),
one text a request, in ABBA order over --rounds rounds (the servers are started and stopped by
benchmarks/vs_infinity.py's machinery; only one is under load at a time).

Tokens/s is counted from the tokens sent. Ours is sent `truncate: false` (a text over its window
is a 400, never cut), and its `usage` is checked to equal the tokens sent. Infinity truncates to
its sentence-transformers `max_seq_length` (min(max_position_embeddings, tokenizer
model_max_length)) and its `usage` counts characters, so where it cuts is found by probing: at
each length L, the L-token text and the same text with --probe-extra more tokens get the same
vector if and only if it cut at L or before. Its tokens/s is reported both as tokens sent and as
tokens computed (min(sent, the cut)). The report has the CPU's name and flags, and the load
average at every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from corpus import add_corpus_argument, describe, load_texts
from http_load import Batch, LoadRun, cosine_rows, load, print_json, print_markdown
from vs_infinity import (
    DEFAULT_INFINITY_PYTHON,
    NO_SHEDDING,
    PRESETS,
    Server,
    Side,
    failure,
    free_port,
    machine_info,
    servers_running,
    start_server,
)

from infinity_cloud.core.hardware import kernel_flags

LENGTHS = (512, 2048, 8192)
WINDOW = 8192
SEED = 0


# -- the model -------------------------------------------------------------------------------


def build_model(folder: Path, passages: Sequence[str], vocab_size: int, global_every: int) -> Path:
    """A seeded random ModernBERT (8,192 window) and a WordPiece tokenizer trained on `passages`,
    saved as a plain transformers folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import ModernBertConfig, ModernBertModel, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(passages, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=WINDOW, unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )
    fast.save_pretrained(str(folder))
    # transformers 5 names its own class ("TokenizersBackend"), which Infinity's transformers 4 lacks.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["model_input_names"] = ["input_ids", "attention_mask"]  # ModernBERT takes no token types
    config_path.write_text(json.dumps(tokenizer_config, indent=1))
    config = ModernBertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
        intermediate_size=1536, max_position_embeddings=WINDOW, global_attn_every_n_layers=global_every,
        pad_token_id=tok.token_to_id("[PAD]"), bos_token_id=cls, eos_token_id=sep, cls_token_id=cls,
        sep_token_id=sep,
    )
    torch.manual_seed(SEED)
    ModernBertModel(config).save_pretrained(str(folder))
    return folder


# -- texts of exactly N tokens ---------------------------------------------------------------


def exact_texts(folder: Path, passages: Sequence[str], length: int, count: int) -> list[str]:
    """`count` different texts of exactly `length` tokens ([CLS] and [SEP] included): a window of
    the joined passages cut at a token's end, the cut moved until re-encoding gives `length`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    stream, texts, start = " ".join(passages), [], 0
    want = length - 2
    while len(texts) < count:
        piece = stream[start : start + 12 * length]
        if len(piece) < 6 * length:
            raise SystemExit(f"the corpus is too short for {count} texts of {length} tokens")
        offsets = tok.encode(piece, add_special_tokens=False).offsets
        content = want
        for _ in range(20):
            text = piece[: offsets[content - 1][1]]
            got = len(tok.encode(text).ids)
            if got == length:
                texts.append(text)
                break
            content += length - got
        start += len(piece) // 3  # the next text overlaps this one by a third at most
    return texts


def probe_extra(folder: Path, passages: Sequence[str], base: str, extra: int) -> str:
    """`base` and then `extra` more tokens' worth of words (a passage's start)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tail = " ".join(passages[-50:])
    offsets = tok.encode(tail, add_special_tokens=False).offsets
    return base + " " + tail[: offsets[extra - 1][1]]


# -- measuring -------------------------------------------------------------------------------


def embed(server: Server, model: str, texts: Sequence[str], ours: bool) -> tuple[np.ndarray, int]:
    body: dict[str, Any] = {"input": list(texts), "model": model, "encoding_format": "float"}
    if ours:
        body["truncate"] = False
    with httpx.Client(base_url=server.url, timeout=1800) as client:
        response = client.post("/embeddings", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{server.side.name}: {response.status_code} {response.text[:500]}")
    answer = response.json()
    rows = [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]
    return np.asarray(rows, dtype=np.float64), answer["usage"]["prompt_tokens"]


def probe_truncation(
    servers: Sequence[Server], model: str, folder: Path, passages: Sequence[str],
    texts: dict[int, list[str]], extra: int,
) -> dict[str, Any]:
    """Per side and length L: does L's text with `extra` more tokens embed the same as L's text
    (cosine > 1 - 1e-6: cut at L or before)? Plus ours' usage against the tokens sent."""
    out: dict[str, Any] = {}
    for server in servers:
        ours = server.side.program == "ours"
        rows: dict[str, Any] = {}
        for length, batch in texts.items():
            base, base_usage = embed(server, model, batch[:1], ours=False)
            longer_text = probe_extra(folder, passages, batch[0], extra)
            longer, _ = embed(server, model, [longer_text], ours=False)
            rows[str(length)] = {
                "usage_of_text": base_usage,
                "cosine_text_vs_text_plus_extra": round(float(cosine_rows(base, longer)[0]), 7),
                "cut_at_or_before": bool(cosine_rows(base, longer)[0] > 1 - 1e-6),
            }
            if ours:
                _, strict_usage = embed(server, model, batch[:1], ours=True)
                rows[str(length)]["usage_with_truncate_false"] = strict_usage
        out[server.side.name] = rows
    return out


def fidelity(servers: Sequence[Server], model: str, texts: Sequence[str]) -> float | None:
    """Cosine of the two sides' vectors on the same texts (same weights: should be ~1)."""
    got = [embed(s, model, texts, ours=False)[0] for s in servers]
    return round(float(cosine_rows(got[0], got[1]).min()), 5) if len(got) == 2 else None


def run_load(server: Server, model: str, batches: list[Batch], concurrency: int, seconds: float) -> LoadRun:
    ours = server.side.program == "ours"

    def request(batch: Batch) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"input": batch.texts, "model": model}
        if ours:
            body["truncate"] = False  # never cut: a text over the window would be a 400
        return "/embeddings", body

    return asyncio.run(load(server.url, model, batches, concurrency, seconds, request=request))


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    passages = load_texts(args.corpus, "passage")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="long-inputs-"))
    folder = build_model(workdir / "modernbert-8k", passages, args.vocab_size, args.global_every)
    texts = {n: exact_texts(folder, passages, n, args.texts) for n in args.lengths}
    batches = {n: [Batch([t], n) for t in ts] for n, ts in texts.items()}
    report: dict[str, Any] = {
        "machine": {**machine_info(args.infinity_python), "kernel_flags": kernel_flags()},
        "model": {
            "folder": str(folder), "architecture": "ModernBertModel (random weights, seed 0)",
            "hidden": 384, "layers": 6, "heads": 6, "intermediate": 1536, "window": WINDOW,
            "global_attention_every_n_layers": args.global_every, "local_attention_window": 128,
            "tokenizer": f"WordPiece trained on the corpus, {args.vocab_size} tokens",
            "pooling": "mean (a bare transformers folder on both sides)",
        },
        "corpus": describe(args.corpus),
        "method": {"lengths": list(args.lengths), "concurrency": args.concurrency,
                   "concurrency_at_8192": args.concurrency_long, "seconds": args.seconds,
                   "rounds": args.rounds, "texts_a_request": 1, "order": "ABBA"},
    }
    sides = [Side("ours", "ours", (*NO_SHEDDING, *args.ours_flags)),
             Side("infinity", "infinity", PRESETS["infinity-fp32"])]
    servers = [
        Server(side, side.command(folder, port, args.infinity_python), port, workdir / f"{side.name}.log")
        for side in sides for port in [free_port()]
    ]
    model = str(folder)
    names = [s.side.name for s in servers]
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {name: {n: [] for n in args.lengths} for name in names}
    pooled: dict[str, dict[int, LoadRun]] = {name: {n: LoadRun() for n in args.lengths} for name in names}
    with servers_running(servers):
        for server in servers:
            start_server(server, model, args.startup_timeout)
            print(f"{server.side.name}: answered in {server.first_answer_s} s", flush=True)
            for n in args.lengths:  # warm each length once (compiled shapes, first allocations)
                embed(server, model, texts[n][:1], ours=False)
        report["sides"] = {s.side.name: {"command": s.command, "first_answer_s": s.first_answer_s,
                                         "models": s.models_info} for s in servers}
        report["truncation_probe"] = probe_truncation(
            servers, model, folder, passages, texts, args.probe_extra
        )
        report["fidelity_min_cosine_512"] = fidelity(servers, model, texts[min(args.lengths)][:4])
        for round_no in range(args.rounds):
            order = servers if round_no % 2 == 0 else servers[::-1]
            for n in args.lengths:
                concurrency = args.concurrency_long if n >= WINDOW else args.concurrency
                for server in order:
                    loadavg = round(os.getloadavg()[0], 2)
                    run = run_load(server, model, batches[n], concurrency, args.seconds)
                    pooled[server.side.name][n] += run
                    summary = {**run.summary(), "loadavg_1m_at_start": loadavg}
                    runs[server.side.name][n].append(summary)
                    print(f"round {round_no + 1} {n:>5} tokens {server.side.name:<9} "
                          f"{summary['tokens_per_s']:>7} tok/s  p50 {summary['p50_ms']} ms  "
                          f"requests {summary['requests']}  load {loadavg}", flush=True)
        for server in servers:
            if server.proc is not None and server.proc.poll() is not None:
                report["sides"][server.side.name]["dead"] = failure(server, "died")
        report["infinity_log_lines"] = [
            line for line in (workdir / "infinity.log").read_text(errors="replace").splitlines()
            if "max" in line.lower() or "truncat" in line.lower()
        ][:20]
    report["runs"] = runs
    report["results"] = results(report, pooled, args.lengths)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def infinity_cut(probe: dict[str, Any], lengths: Sequence[int]) -> int | None:
    """The least probed length at which Infinity cut (None: it cut none of them)."""
    cut = [n for n in lengths if probe.get("infinity", {}).get(str(n), {}).get("cut_at_or_before")]
    return min(cut) if cut else None


def results(
    report: dict[str, Any], pooled: dict[str, dict[int, LoadRun]], lengths: Sequence[int]
) -> list[dict]:
    cut = infinity_cut(report["truncation_probe"], lengths)
    rows = []
    for n in lengths:
        ours, theirs = pooled["ours"][n], pooled["infinity"][n]
        ours_tps = ours.tokens / ours.elapsed_s
        sent_tps = theirs.tokens / theirs.elapsed_s
        computed_tps = sent_tps * min(n, cut) / n if cut else sent_tps
        rows.append({
            "tokens_a_text": n,
            "ours_tokens_per_s": round(ours_tps, 1),
            "infinity_tokens_per_s_sent": round(sent_tps, 1),
            "infinity_tokens_per_s_computed": round(computed_tps, 1),
            "ratio_ours_to_infinity_computed": round(ours_tps / computed_tps, 2),
            "ours_requests": len(ours.latencies_s), "infinity_requests": len(theirs.latencies_s),
            "ours_p50_s": ours.summary().get("p50_ms") and round(ours.summary()["p50_ms"] / 1000, 2),
            "infinity_p50_s": theirs.summary().get("p50_ms") and round(theirs.summary()["p50_ms"] / 1000, 2),
        })
    return rows


def markdown(report: dict[str, Any]) -> list[str]:
    machine = report["machine"]
    cut = infinity_cut(report["truncation_probe"], report["method"]["lengths"])
    ours_models = report["sides"]["ours"]["models"]
    lines = [
        f"Long inputs, ModernBERT 384x6 (8,192 window, global attention every "
        f"{report['model']['global_attention_every_n_layers']} layer(s)), random weights, mean pooling. "
        f"CPU: {machine['cpu']} ({machine['nproc']} cores), flags {', '.join(machine['kernel_flags'])}; "
        f"load average {machine['loadavg_at_start']} at start, {machine['loadavg_at_end']} at end.",
        f"Ours: `{' '.join(report['sides']['ours']['command'][1:])}`; /models: "
        f"`{json.dumps(ours_models)[:300]}`.",
        f"Infinity {machine.get('infinity_emb')} (torch {machine.get('infinity_torch')}, fp32): truncation "
        f"found at {cut or 'none of the lengths'}.",
        "",
        "| tokens a text | ours tok/s | Infinity tok/s (sent) | Infinity tok/s (computed) | ours / Infinity "
        "| p50 ours s | p50 Infinity s | requests ours / Infinity |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['tokens_a_text']:,} | {row['ours_tokens_per_s']:,.0f} "
            f"| {row['infinity_tokens_per_s_sent']:,.0f} | {row['infinity_tokens_per_s_computed']:,.0f} "
            f"| {row['ratio_ours_to_infinity_computed']}x | {row['ours_p50_s']} | {row['infinity_p50_s']} "
            f"| {row['ours_requests']} / {row['infinity_requests']} |"
        )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_corpus_argument(parser)
    parser.add_argument("--infinity-python", type=Path, default=DEFAULT_INFINITY_PYTHON)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--texts", type=int, default=8, help="different texts a length (cycled)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--concurrency-long", type=int, default=2, help="clients at 8,192 tokens")
    parser.add_argument("--seconds", type=float, default=20, help="a run (each client sends one at least)")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA: a multiple of 2")
    parser.add_argument("--global-every", type=int, default=3,
                        help="ModernBERT's global_attn_every_n_layers (3: its default; 1: global everywhere)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--probe-extra", type=int, default=64, help="tokens added to probe truncation")
    parser.add_argument("--ours-flags", nargs="*", default=[], help="more flags for `infinity-cloud serve`")
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", type=Path)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    report = benchmark(args)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    print_json(report, args.out)
    print_markdown(markdown(report), args.markdown)


if __name__ == "__main__":
    sys.exit(main())
