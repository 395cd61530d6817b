"""Which backend and precision a model runs with: `auto` resolved, reduced precision verified."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from infinity_cloud.backends import Backend, backend_class, exports
from infinity_cloud.backends.base import Calibration
from infinity_cloud.backends.cuda_check import require_usable_gpu
from infinity_cloud.backends.registry import auto_backends, device_kind
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelLoadError,
    PrecisionCrashError,
)
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import cpu_has_fast_bf16, int8_kernels
from infinity_cloud.numerics.fidelity import MAX_SCORE_DIFFERENCE, MIN_AGREEMENT, Check, measure, shortfall
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import ModelInputs

log = logging.getLogger(__name__)


def open_backend(
    info: ModelInfo, spec: ModelSpec, graph: GraphOutput, probes: ModelInputs, head: Head,
    calibration: Callable[[], Calibration], check: Check = "cosine",
) -> Backend:
    """The backend `spec` asks for to run `graph`; for `auto`, the first installed one that
    loads it. `probes` (fixed inputs) and `head` measure a reduced precision against float32,
    as the task's `check` says (`numerics.fidelity`); `calibration` makes the inputs a
    precision built by measuring (int8) is built with. A model asked onto a GPU torch cannot
    use refuses to load, saying why, rather than serve on the CPU."""
    if device_kind(spec.device) == "cuda" and spec.backend in ("auto", "torch"):
        require_usable_gpu(asked=f"model {spec.name} asks for device {spec.device}")
    if spec.backend != "auto":
        return _verified(backend_class(spec.backend), info, spec, graph, probes, head, calibration, check)
    failures: list[tuple[str, Exception]] = []
    for name in auto_backends(spec.device):
        try:
            chosen = spec.model_copy(update={"backend": name})
            return _verified(backend_class(name), info, chosen, graph, probes, head, calibration, check)
        # A ConfigError too: one backend lacking the dtype or device (int8 on OpenVINO) is
        # no reason to stop before another that has it.
        except (ModelLoadError, ConfigError) as exc:
            # Loud: the next backend in the order is slower, and the message names the fix.
            log.warning(
                "backend %s cannot serve %s, so a slower one is tried next: %s", name, info.path, exc
            )
            failures.append((name, exc))
    reasons = "; ".join(f"{name}: {exc}" for name, exc in failures)
    # Every backend refused the configuration (or is not installed): keep that error class.
    kind: type[ConfigError | ModelLoadError] = ModelLoadError
    for cls in (ConfigError, BackendUnavailableError):
        if all(isinstance(exc, cls) for _, exc in failures):
            kind = cls
    raise kind(f"no installed backend could load {info.path}: {reasons}")


def _verified(
    cls: type[Backend], info: ModelInfo, spec: ModelSpec, graph: GraphOutput, probes: ModelInputs,
    head: Head, calibration: Callable[[], Calibration], check: Check,
) -> Backend:
    """Load; for a precision below float32, measure how far its outputs are from float32's.

    `dtype auto` keeps a reduced precision only if it agrees with float32 as the task needs
    (`fidelity.shortfall`: a scorer's order and scores, an embedder's cosine; else serves
    float32, and says why in the log and `/models`); a
    precision asked for by name is served as asked, with a loud warning when it disagrees
    (int8 can, where its kernels lose more: CTranslate2's without VNNI). The verdict is cached
    with the model's exports (keyed by its files, backend and precision), so only the first
    start pays for loading the float32 reference.
    """
    if spec.dtype == "fastest":
        floor = MIN_AGREEMENT["int8"] if spec.min_agreement is None else spec.min_agreement
        candidates, bar = cls.fastest_dtypes(spec), floor
    elif spec.dtype == "auto" and cls.auto_dtypes(spec):
        candidates, bar = cls.auto_dtypes(spec), None
    else:
        candidates, bar = (), None
    if candidates:
        return _fastest(cls, info, spec, graph, probes, head, calibration, candidates, bar, check)
    calibrated = spec.dtype in cls.calibrated_dtypes
    try:
        backend = cls(info, spec, graph, calibration=calibration) if calibrated else cls(info, spec, graph)
    except PrecisionCrashError as exc:
        if spec.dtype != "auto":
            raise
        log.warning("%s; serving float32 instead", exc)
        backend = cls(info, spec.model_copy(update={"dtype": "float32"}), graph)
    if backend.dtype not in MIN_AGREEMENT:
        return backend
    floor = MIN_AGREEMENT[backend.dtype]
    reference_spec = spec.model_copy(update={"dtype": "float32"})
    loaded: list[Backend] = []

    def measure_once(_: object) -> dict[str, float]:
        loaded.append(cls(info, reference_spec, graph))

        def outputs(b: Backend) -> np.ndarray:
            return head(b.forward(probes), probes.attention_mask)

        return measure(check, outputs(backend), outputs(loaded[0]))

    verdict = exports.cached_export(
        info.path, "fidelity",
        # The CPU's integer kernels too: int8 that holds with VNNI may not without it; and its
        # bfloat16, which OpenVINO's int8 runs its unquantised rest in where the CPU has it.
        {"backend": cls.name, "graph": graph, "dtype": backend.dtype, "device": backend.device, "min": floor,
         "kernels": int8_kernels() if backend.device == "cpu" else None, "export": backend.export_name,
         **({"bf16": True} if backend.device == "cpu" and cpu_has_fast_bf16() else {}),
         # A scorer's verdict is its order and scores (embedders' keys are as they were).
         **({"check": check, "bound": MAX_SCORE_DIFFERENCE.get(backend.dtype)} if check != "cosine" else {})},
        measure_once, f"checking {cls.name} {backend.dtype} against float32", beside=spec.export_into_folder,
    )
    measured = exports.export_metadata(verdict)
    score, short = measured["agreement"], shortfall(measured, backend.dtype, floor)
    if short is None or spec.dtype != "auto":
        for reference in loaded:
            reference.close()
        backend.agreement = score
        if short is None:
            log.info("%s %s agrees with float32 (%.5f)", cls.name, backend.dtype, score)
        else:
            backend.precision_note = f"{backend.dtype}, asked for, disagrees with float32: {short}"
            log.warning(
                "%s %s, asked for, disagrees with float32 on %s: %s, so search and ranking quality "
                "will suffer. Serve it with --dtype float32 (or auto) instead",
                cls.name, backend.dtype, info.path, short,
            )
        return backend
    log.warning("%s %s disagrees with float32 on %s: %s; serving float32 instead",
                cls.name, backend.dtype, info.path, short)
    dtype = backend.dtype
    backend.close()
    reference = loaded[0] if loaded else cls(info, reference_spec, graph)
    reference.agreement = 1.0
    reference.precision_note = f"float32, as {dtype} disagrees with float32: {short}"
    return reference


# What `dtype auto` times each precision on: a full batch of passage-sized inputs.
TIMING_ROWS = 32
TIMING_LENGTH = 256
TIMING_RUNS = 3


def _fastest(
    cls: type[Backend], info: ModelInfo, spec: ModelSpec, graph: GraphOutput, probes: ModelInputs, head: Head,
    calibration: Callable[[], Calibration], candidates: tuple[str, ...], floor: float | None, check: Check,
) -> Backend:
    """Each of `candidates` (float32 first) is loaded, compared with float32 on the probes and
    timed on a full batch with its head fused, and the fastest that agrees is served: to
    `floor` (`dtype fastest --min-agreement`), else to each precision's own bar (`dtype
    auto` where the backend measures, `Backend.auto_dtypes`: torch on CUDA). Which is fastest
    depends on the model and the device (a small model on a large GPU is bound by launches,
    not arithmetic; int8 is fast only with VNNI or AMX), so it is measured, once per model
    files, backend, graph and device (cached). A precision that cannot be built (int8 that
    cannot hold its own bar) is left out, with its reason."""
    timing = timing_batch(probes, info.max_length)

    def measure_all(_: object) -> dict[str, object]:
        measured: dict[str, dict[str, float]] = {}
        left_out: dict[str, str] = {}
        reference: np.ndarray | None = None
        for dtype in candidates:
            chosen = spec.model_copy(update={"dtype": dtype, "min_agreement": None})
            try:
                backend = (cls(info, chosen, graph, calibration=calibration) if dtype in cls.calibrated_dtypes
                           else cls(info, chosen, graph))
            except (ModelLoadError, ConfigError) as exc:
                if dtype == "float32":
                    raise
                left_out[dtype] = str(exc)
                continue
            try:
                out = head(backend.forward(probes), probes.attention_mask)
                reference = out if reference is None else reference
                backend.fuse(head)
                measured[dtype] = {**measure(check, out, reference), "seconds": _seconds(backend, timing)}
            finally:
                backend.close()

        # float32 is the reference itself; what falls short is left out, with why
        shorts = {d: shortfall(measured[d], d, MIN_AGREEMENT.get(d, 0.0) if floor is None else floor)
                  for d in measured if d != "float32"}
        left_out.update({d: f"disagrees with float32: {why}" for d, why in shorts.items() if why})
        agreeing = [d for d in measured if not shorts.get(d)]
        return {"dtype": min(agreeing, key=lambda d: measured[d]["seconds"]), "measured": measured,
                "left_out": left_out}

    verdict = exports.export_metadata(exports.cached_export(
        info.path, "dtype-choice",
        {"backend": cls.name, "graph": graph, "device": cls.device_name(spec), "candidates": list(candidates),
         "timing": [TIMING_ROWS, TIMING_LENGTH], "floor": floor,
         # On a CPU, what decides between float32, bfloat16 and int8: its matrix kernels.
         "kernels": int8_kernels(), **({"bf16": True} if cpu_has_fast_bf16() else {}),
         **({"check": check, "bound": MAX_SCORE_DIFFERENCE} if check != "cosine" else {})},
        measure_all, f"timing {cls.name} in {', '.join(candidates)} on {cls.device_name(spec)}",
        beside=spec.export_into_folder,
    ))
    chosen, measured = verdict["dtype"], verdict["measured"]
    log.info(
        "dtype %s on %s: %s serves %s (seconds per %dx%d batch, worst cosine to float32: %s)%s", spec.dtype,
        cls.device_name(spec), cls.name, chosen, TIMING_ROWS, TIMING_LENGTH,
        ", ".join(f"{d} {m['seconds']:.4f} {m['agreement']:.5f}" for d, m in measured.items()),
        "".join(f"; {d} left out: {why}" for d, why in verdict.get("left_out", {}).items()),
    )
    served = spec.model_copy(update={"dtype": chosen, "min_agreement": None})
    backend = (cls(info, served, graph, calibration=calibration) if chosen in cls.calibrated_dtypes
               else cls(info, served, graph))
    backend.agreement = None if chosen == "float32" else measured[chosen]["agreement"]
    # Why the others were not served: each left out, with its reason.
    if verdict.get("left_out"):
        backend.precision_note = f"{chosen}; " + "; ".join(
            f"{d} left out: {why}" for d, why in verdict["left_out"].items())
    return backend


def timing_batch(probes: ModelInputs, max_length: int) -> ModelInputs:
    """The probes repeated to TIMING_ROWS rows and (text) TIMING_LENGTH positions: shapes of
    a busy server's batches, for timing only (the repeats are not meaningful text)."""
    width = min(TIMING_LENGTH, max_length)
    arrays = {}
    for name, array in probes.arrays.items():
        text = name in ("input_ids", "attention_mask", "token_type_ids")
        reps = [-(-TIMING_ROWS // len(array)), -(-width // array.shape[1]) if text else 1][: array.ndim]
        tiled = np.tile(array, reps + [1] * (array.ndim - len(reps)))[:TIMING_ROWS]
        arrays[name] = tiled[:, :width] if text else tiled
    return ModelInputs(arrays)


def _seconds(backend: Backend, batch: ModelInputs) -> float:
    """The fastest of a few runs after a warm-up, as served (submitted, then waited for)."""
    backend.submit(batch)()
    runs = []
    for _ in range(TIMING_RUNS):
        started = time.perf_counter()
        backend.submit(batch)()
        runs.append(time.perf_counter() - started)
    return min(runs)
