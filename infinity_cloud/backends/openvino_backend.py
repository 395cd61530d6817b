"""OpenVINO backend (Intel CPUs): bfloat16 on AMX, several inference requests in flight.

Converts the model's ONNX file (`onnx_export.OnnxSource`) to OpenVINO IR once and caches it,
or takes the IR the model folder ships (`openvino/openvino_model.xml`); compiled blobs are
cached beside it, so later starts skip compilation too: those of the configurations last
compiled only (`KEPT_BLOB_CONFIGS`).

Each batch is split into length-sorted slices that run as parallel inference requests, one
per stream, so every core is busy and each slice pads only to its own longest input, rounded
up to a multiple of `LENGTH_GRAIN` tokens. A batch
alone on the machine whose slices cannot keep every stream busy (one passage) runs instead
as one request on every core, on a second compilation with OpenVINO's LATENCY hint: latency
or throughput is chosen per batch, without a flag.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov

from infinity_cloud.backends import exports
from infinity_cloud.backends.base import Backend, Calibration
from infinity_cloud.backends.onnx_export import OWN_OPENVINO_FILES, OnnxSource, own_export
from infinity_cloud.backends.openvino_attention import attention_path
from infinity_cloud.backends.openvino_probe import crash_of
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ConfigError, PrecisionCrashError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import cpu_has_fast_bf16, int8_kernels, usable_cores
from infinity_cloud.numerics.fidelity import MIN_AGREEMENT
from infinity_cloud.numerics.inputs import INPUT_NAMES, ModelInputs

log = logging.getLogger(__name__)

IR_FILE = "model.xml"
# What OpenVINO computes in. int8 is the IR's own (its quantised matrix products); the rest of
# it (attention, the products kept unquantised) runs in bfloat16 where the CPU has it in
# hardware, else float32 (`_int8_rest`), as its fidelity is measured when it is built: on mpnet
# here the six products kept in float32 and the attention took a fifth of a passage's time.
_PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "f32"}
# One request on N cores against N streams of one core: a lone batch goes to every core
# when its slices' time on the streams is above its time on all cores divided by this.
# Measured 0.92 on 2 cores (one 157-token MiniLM passage: 28 ms against 52 ms); taken lower
# because one request scales worse on more cores.
SOLO_EFFICIENCY = 0.8
# Slices a batch is cut into per stream: each pads only to its own longest, and OpenVINO runs
# them on whichever stream is free. Passages of the benchmarks' corpus (mpnet tokens, batches
# of 16 to 128) are 63-68 % real tokens when cut in two for two streams, 77-83 % in four and
# 87-91 % in eight; the backend alone on unpadded batches ran at 96 % of the bfloat16 GEMM bound.
SLICES_PER_STREAM = 4
# OpenVINO's CPU plugin keeps what it compiles for each input shape (its runtime cache, 5,000
# entries by default, and oneDNN's primitive cache, 1,024): with a shape per input length,
# a server's memory grew with every new input (MiniLM, 4 clients: 1.1 GB to 2.8 GB in ten
# minutes, never given back). Lengths rounded up to 8 tokens make at most rows x length/8
# shapes (512 for MiniLM's 16 rows x 256 tokens; the same throughput, measured), and both
# caches are bounded, so what they hold stays within a few tens of MB.
LENGTH_GRAIN = 8
SHAPE_CACHE_ENTRIES = 256
# Read by oneDNN when it makes its cache, the first compilation: set before any, unless the
# operator chose a size.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(SHAPE_CACHE_ENTRIES))
# A compiled blob is the weights again, in the form one configuration runs (MiniLM float32:
# 87 MB; mpnet: about 420 MB), and a folder of them per configuration grew with every
# configuration any start had compiled (each precision `--dtype auto` timed, the hints, a
# thread count): mpnet's reached 2.1 GB. A server reuses two, its streams' and its lone
# batches' (LATENCY), so an export keeps the blobs of the two configurations compiled last.
KEPT_BLOB_CONFIGS = 2
BLOB_SUFFIX = ".blob"


def input_names(ports: list[ov.Output]) -> list[str]:
    """The graph's inputs by the names the ONNX file gave them: a port has several (a traced
    image graph's pixel input also carries its first cast's)."""
    return [next((n for n in port.get_names() if n in INPUT_NAMES), port.any_name) for port in ports]


def compiled_cache(folder: Path) -> Path:
    """Where OpenVINO keeps compiled blobs: beside the export, or, where that is read-only (a
    Lambda image's task root), a copy of them in the temp dir, so a blob compiled elsewhere
    for another CPU is replaced there instead of failing to be written."""
    cache = folder / exports.MACHINE_CACHE
    if os.access(folder, os.W_OK):
        return cache
    copy = Path(tempfile.gettempdir()) / "infinity-cloud-openvino" / folder.name
    if not copy.exists():
        if cache.is_dir():
            shutil.copytree(cache, copy, dirs_exist_ok=True)
        copy.mkdir(parents=True, exist_ok=True)
    return copy


def _blob_cache(folder: Path, config: dict[str, object]) -> Path:
    """A folder per configuration: OpenVINO 2026.4 keys a blob by the model alone (f32, bf16,
    f16, LATENCY, THROUGHPUT and any thread count: one key, measured), so a bf16 compilation
    loaded the f32 blob, and on an AMX CPU answered zeros and corrupted the heap."""
    return compiled_cache(folder) / "-".join(str(value).lower() for _, value in sorted(config.items()))


def keep_recent_blobs(used: Path, kept: int = KEPT_BLOB_CONFIGS) -> None:
    """Mark `used` (a configuration's blob folder, just compiled from) as the latest, and drop
    the blobs of all but the `kept` configurations used last (their probe verdicts stay: a few
    bytes). Another process's blob removed under it only costs it a compilation."""
    used.mkdir(parents=True, exist_ok=True)
    os.utime(used)  # reading a blob does not change the folder's time
    folders = [f for f in used.parent.iterdir() if f.is_dir() and any(f.glob(f"*{BLOB_SUFFIX}"))]
    folders.sort(key=lambda f: f.stat().st_mtime, reverse=True)
    for stale in (f for f in folders[kept:] if f != used):
        for blob in stale.glob(f"*{BLOB_SUFFIX}"):
            blob.unlink(missing_ok=True)


class OpenVinoBackend(Backend):
    name = "openvino"
    traced = True  # it starts from the ONNX trace; graphs that do not trace are torch's
    length_grain = LENGTH_GRAIN
    calibrated_dtypes = frozenset({"int8"})

    def __init__(
        self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None,
        calibration: Callable[[], Calibration] | None = None,
    ) -> None:
        super().__init__(info, spec, graph)
        if spec.device not in ("auto", "cpu"):
            raise ConfigError(f"the openvino backend runs on cpu, not {spec.device!r}")
        self.core = ov.Core()
        self.dtype = self._resolve_dtype(spec.dtype)
        label, convert = self._source(info)

        def converted() -> Path:
            folder = exports.cached_export(
                info.path, "openvino", {"source": label, "openvino": ov.__version__},
                lambda out: ov.save_model(convert(), str(out / IR_FILE), False),
                f"converting {info.path.name} to OpenVINO IR", intermediate=self.dtype == "int8",
                beside=spec.export_into_folder,
            )
            return folder if self.dtype != "int8" else self._int8(folder, calibration)

        folder: list[Path] = []

        def compiled(found: Path) -> ov.CompiledModel:
            folder[:] = [found]
            return self._compile(found, latency=spec.latency)

        self.compiled = exports.load_cached(converted, compiled)
        self.export_name, self.export_folder = folder[0].name, folder[0]
        self.streams = max(1, int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        # Said once at load: which attention kernel this CPU runs it with (a long input's cost).
        self.attention = attention_path(self.compiled, folder[0] / IR_FILE)
        log.info("%s: attention on OpenVINO (%s): %s", info.path.name, self.dtype, self.attention.describe())
        self.slots = self.streams * int(spec.backend_options.get("slices_per_stream", SLICES_PER_STREAM))
        # Lone batches run on every core on a second compilation (from its cached blob: 0.12 s
        # and 145 MB on MiniLM), made in the background so it adds nothing to a cold start;
        # until it is ready they run on the streams. Under a memory budget the load waits
        # for it (`settle`), so the budget counts it.
        self.solo: ov.CompiledModel | None = None
        self._solo_request: ov.InferRequest | None = None
        self.solo_ready = threading.Event()
        self._solo_compiling: threading.Thread | None = None
        self._closed = False
        # One set of requests (one per stream) per batch in flight: while a finished batch is
        # collected, the next one already runs, so no stream idles between batches. Latency
        # mode (targets that take one request at a time): one batch at a time.
        self._in_flight = 1 if spec.latency else int(spec.backend_options.get("batches_in_flight", 2))
        self._free: queue.Queue[list[ov.InferRequest]] = queue.Queue()
        for _ in range(self._in_flight):
            self._free.put([self.compiled.create_infer_request() for _ in range(self.slots)])
        self.solo_batches = 0  # batches that ran on every core as one request
        self._inputs = input_names(self.compiled.inputs)
        if self.streams > 1 and not spec.latency:  # last: nothing after it may fail
            self._solo_compiling = threading.Thread(
                target=self._compile_solo, args=(folder[0],), name=f"{info.path.name}-solo", daemon=True
            )
            self._solo_compiling.start()
        else:
            self.solo_ready.set()  # one stream already runs on every core

    def _source(self, info: ModelInfo) -> tuple[str, Callable[[], ov.Model]]:
        """What the IR is made from, named without its absolute path: the folder's own IR
        (sentence-transformers' `openvino/`, read as is: no torch), else its ONNX file."""
        own = own_export(info, OWN_OPENVINO_FILES, self.graph)
        if own is not None:
            return own.relative_to(info.path).as_posix(), lambda: self.core.read_model(str(own))
        spec = self.spec
        source = OnnxSource(info, self.graph, spec.trust_remote_code, self.name, spec.export_into_folder)
        return source.label, lambda: ov.convert_model(str(source.path()))

    @classmethod
    def device_name(cls, spec: ModelSpec) -> str:
        return "cpu"

    @classmethod
    def fastest_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        bf16 = ("bfloat16",) if cpu_has_fast_bf16() and "BF16" in capabilities else ()
        return ("float32", *bf16, "int8")

    def _int8(self, floats: Path, calibration: Callable[[], Calibration] | None) -> Path:
        """The int8 IR built from the float one (`openvino_int8`), cached beside it."""
        from infinity_cloud.backends import openvino_int8

        if calibration is None:
            raise ConfigError("int8 on the openvino backend is built by calibration: load it with the engine")
        if int8_kernels() not in ("vnni", "amx"):
            log.warning(
                "%s: int8 will not be faster than float32 on this CPU: it has no VNNI or AMX int8 "
                "kernels (%s); serve --dtype float32 here, int8 on a CPU with them (Ice Lake, "
                "Sapphire Rapids, Zen 4 and later)", self.info.path.name, int8_kernels(),
            )
        floor = MIN_AGREEMENT["int8"]

        rest = self._int8_rest()

        def compile_as_served(model: ov.Model) -> ov.CompiledModel:
            return self.core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": rest})

        def build(out: Path) -> dict[str, object]:
            floating = self.core.read_model(str(floats / IR_FILE))
            model, facts = openvino_int8.quantize_holding(
                floating, input_names(floating.inputs), compile_as_served, calibration(), floor,
            )
            ov.save_model(model, str(out / IR_FILE), False)
            return facts

        return exports.cached_export(
            self.info.path, "openvino",
            # Not keyed by `rest`: the IR is the same wherever it runs (an image built on a CPU with
            # bfloat16 serves on one without); the load's fidelity verdict is keyed by the CPU's.
            {"source": floats.name, "openvino": ov.__version__, "int8": openvino_int8.SCHEME, "floor": floor},
            build, f"quantising {self.info.path.name} to int8 (calibrated on built-in texts)",
            beside=self.spec.export_into_folder,
        )

    def _fast_bf16(self) -> bool:
        return cpu_has_fast_bf16() and "BF16" in self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")

    def _int8_rest(self) -> str:
        """What an int8 IR's unquantised operations compute in (see `_PRECISIONS`)."""
        return "bf16" if self._fast_bf16() else "f32"

    def _resolve_dtype(self, dtype: str) -> str:
        if dtype == "auto":
            return "bfloat16" if self._fast_bf16() else "float32"
        if dtype not in _PRECISIONS:
            raise ConfigError(f"the openvino backend runs float32, bfloat16, float16 or int8, not {dtype}")
        return dtype

    def _compile_solo(self, folder: Path) -> None:
        try:
            if self._closed:  # closed before it began (a candidate `--dtype auto` timed): no blob
                return
            solo = self._compile(folder, latency=True)
            request = solo.create_infer_request()
            if not self._closed:  # a backend closed meanwhile (a reference for a check) drops it
                self.solo, self._solo_request = solo, request
        except Exception as exc:  # the streams still serve every batch, only a lone one slower
            log.warning(
                "could not compile %s for lone batches (%s: %s); one request at a time runs on "
                "one stream, not every core. Fix: clear the compiled cache at %s, or serve with "
                "--latency", self.info.path.name, type(exc).__name__, exc, compiled_cache(folder),
            )
        finally:
            self.solo_ready.set()

    def _compile(self, folder: Path, latency: bool) -> ov.CompiledModel:
        options = self.spec.backend_options
        precision = self._int8_rest() if self.dtype == "int8" else _PRECISIONS[self.dtype]
        config: dict[str, object] = {
            "INFERENCE_PRECISION_HINT": precision,
            "PERFORMANCE_HINT": "LATENCY" if latency
            else str(options.get("performance_hint", "THROUGHPUT")).upper(),
            "INFERENCE_NUM_THREADS": int(options.get("threads", usable_cores())),
            "CPU_RUNTIME_CACHE_CAPACITY": int(options.get("shape_cache_entries", SHAPE_CACHE_ENTRIES)),
        }
        if "streams" in options and not latency:
            config["NUM_STREAMS"] = int(options["streams"])
        if self.dtype != "float32":
            config = self._surviving(folder, config)
        blobs = _blob_cache(folder, config)
        config["CACHE_DIR"] = str(blobs)
        compiled = self.core.compile_model(self.core.read_model(str(folder / IR_FILE)), "CPU", config)
        with contextlib.suppress(OSError):  # a cache it cannot tidy still serves
            keep_recent_blobs(blobs)
        return compiled

    def _surviving(self, folder: Path, config: dict[str, object]) -> dict[str, object]:
        """`config`, or one stream on every core where OpenVINO's kernels for this precision
        kill the process with one thread a stream (seen: SIGFPE, bf16 on AMX); tried in a
        child (`openvino_probe`). Raises PrecisionCrashError where nothing survives."""
        def crash(tried: dict[str, object]) -> str | None:
            return crash_of(folder / IR_FILE, tried, _blob_cache(folder, tried))

        how = crash(config)
        if how is None:
            return config
        single = {**config, "NUM_STREAMS": 1}
        if config.get("NUM_STREAMS") != 1 and crash(single) is None:
            log.warning(
                "OpenVINO %s %s crashes on this CPU (%s) on several streams; %s runs as one stream "
                "on every core instead, which serves many clients more slowly. Fix: --dtype float32 "
                "for throughput, or an OpenVINO release without the bug",
                ov.__version__, self.dtype, how, self.info.path.name,
            )
            return single
        raise PrecisionCrashError(
            f"OpenVINO {ov.__version__} in {self.dtype} crashes on this CPU for {self.info.path.name} "
            f"({how}); serve it with --dtype float32"
        )

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        return self.submit(inputs)()

    def submit(self, inputs: ModelInputs) -> Callable[[], np.ndarray]:
        mask = inputs.attention_mask
        # Token inputs are cut to each slice's longest, where the graph masks padding; images
        # are all one size, and a graph without a mask (SigLIP's text) sees every position.
        cut = mask is not None and "attention_mask" in self._inputs
        if not cut:
            lengths = np.ones(inputs.rows, dtype=np.int64)
        else:
            lengths = inputs.lengths if inputs.lengths is not None else mask.sum(axis=1)
        feed = inputs.feed(self._inputs)
        width = mask.shape[1] if mask is not None else 0
        slices = balanced_slices(lengths, self.slots)
        # Only this (the forward) thread takes sets of requests: all of them free means no
        # other batch is in flight.
        alone = self._free.qsize() == self._in_flight
        solo = self._solo_request
        if solo is not None and alone and self._solo_is_faster(lengths, slices):
            held = [self._free.get() for _ in range(self._in_flight)]  # later batches wait for it
            self.solo_batches += 1
            return self._run([solo], [np.arange(inputs.rows)], feed, cut, lengths, width,
                             lambda: [self._free.put(requests) for requests in held])
        requests = self._free.get()
        return self._run(requests, slices, feed, cut, lengths, width, lambda: self._free.put(requests))

    @property
    def batches_in_flight(self) -> int:
        return self._in_flight

    def _solo_is_faster(self, lengths: np.ndarray, slices: list[np.ndarray]) -> bool:
        """Whether the batch takes less time as one request on every core than its slices
        take on the streams (costs in padded tokens; see SOLO_EFFICIENCY)."""
        costs = sorted((len(rows) * int(lengths[rows].max()) for rows in slices), reverse=True)
        streams = [0] * self.streams
        for cost in costs:  # longest first, each onto the least loaded stream
            streams[streams.index(min(streams))] += cost
        whole = len(lengths) * int(lengths.max())
        return whole / (self.streams * SOLO_EFFICIENCY) < max(streams)

    def _run(
        self,
        requests: list[ov.InferRequest],
        slices: list[np.ndarray],
        feed: dict[str, np.ndarray],
        cut: bool,
        lengths: np.ndarray,
        width: int,
        release: Callable[[], None],
    ) -> Callable[[], np.ndarray]:
        """Start each slice on its own request; return the function that waits for them."""
        started: list[ov.InferRequest] = []
        try:
            for request, rows in zip(requests, slices, strict=False):
                longest = min(width, -(-int(lengths[rows].max()) // LENGTH_GRAIN) * LENGTH_GRAIN)
                request.start_async(
                    {name: array[rows, :longest] if cut else array[rows] for name, array in feed.items()}
                )
                started.append(request)
        except BaseException:
            _settle(started)
            release()
            raise

        def wait() -> np.ndarray:
            try:
                parts = []
                for request in started:
                    request.wait()
                    parts.append(request.get_output_tensor(0).data.copy())
            finally:
                _settle(started)
                release()
            return _reassemble(parts, slices, width)

        return wait

    def settle(self) -> None:
        self.solo_ready.wait()

    def close(self) -> None:
        self._closed = True
        # Waited for (0.12 s from a cached blob): a process that exits while OpenVINO still
        # compiles dies of SIGABRT ("terminate called without an active exception").
        if self._solo_compiling is not None:
            self._solo_compiling.join()
        del self._free, self.compiled, self.solo, self._solo_request


def _settle(started: list[ov.InferRequest]) -> None:
    """Wait for requests still running (a request may only be reused once it has finished);
    their errors were the batch's, already raised or moot."""
    for request in started:
        with contextlib.suppress(Exception):
            request.wait()


def balanced_slices(lengths: np.ndarray, count: int) -> list[np.ndarray]:
    """Split rows into at most `count` groups of similar length with about equal padded cost.

    The groups run in parallel and the batch waits for the slowest, so equal work matters
    more than equal rows: halving by rows gives the long half most of the work.
    """
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order]

    def cut(limit: int) -> list[np.ndarray] | None:
        groups, end = [], len(order)
        while end > 0:  # the longest rows first: each group takes rows while under the limit
            start = end - 1
            while start > 0 and int(ordered[end - 1]) * (end - start + 1) <= limit:
                start -= 1
            groups.append(order[start:end])
            end = start
            if len(groups) > count:
                return None
        return groups[::-1]

    lo, hi = int(ordered[-1]), int(ordered[-1]) * len(order)
    while lo < hi:  # the smallest limit that needs no more than `count` groups
        mid = (lo + hi) // 2
        if cut(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return cut(lo) or [order]


def _reassemble(parts: list[np.ndarray], slices: list[np.ndarray], width: int) -> np.ndarray:
    """Put slice outputs back in the batch's row order; token states padded back to `width`."""
    rows = sum(len(s) for s in slices)
    first = parts[0]
    shape = (rows, width, first.shape[2]) if first.ndim == 3 else (rows, *first.shape[1:])
    out = np.zeros(shape, dtype=np.float32)
    for part, index in zip(parts, slices, strict=True):
        if part.ndim == 3:
            out[index, : part.shape[1]] = part
        else:
            out[index] = part
    return out
