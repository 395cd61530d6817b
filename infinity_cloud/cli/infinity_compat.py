"""Infinity's command line (`infinity_emb v2`) in infinity-cloud's terms: its flags, its
`INFINITY_*` variables and their `;`-separated per-model lists, translated into the spec's flat
options (what `serve` takes), with the infinity-cloud command line that means the same and a
note for each flag that has no counterpart. `infinity-cloud v2` (cli/serve.py) runs the result;
docs/migrating-from-infinity.md is the same table for readers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infinity_cloud.backends.registry import auto_backends, installed
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError
from infinity_cloud.core.install_hint import install_command

ENV_PREFIX = "INFINITY_"


def _refuse(reason: str) -> Callable[[Any], Any]:
    def refuse(value: Any) -> Any:
        raise ConfigError(reason.format(value=value))

    return refuse


def _engine(value: str) -> str:
    engines = {"torch": "torch", "optimum": "onnx", "ctranslate2": "ctranslate2", "neuron": "neuron"}
    if value not in engines:
        raise ConfigError(f"--engine {value} has no counterpart: it is Infinity's test engine; "
                          "use torch, optimum (ONNX Runtime), ctranslate2 or neuron")
    if value == "optimum" and not installed("onnx"):
        return "auto"  # the optimized path this install has: `_optimum_without_onnx` says so
    return engines[value]


def _optimum_without_onnx() -> str:
    """What `--engine optimum` (ONNX Runtime) on an install without it says: the README's
    install is [openvino,export], and a migration's first command must serve, on the fastest
    installed backend, loudly, with the command that adds ONNX Runtime."""
    try:
        fastest = auto_backends("auto")[0]
    except BackendUnavailableError:
        fastest = "none is installed"
    return (f"--engine optimum means ONNX Runtime, which is not installed: serving on the fastest "
            f"installed backend instead (--backend auto: {fastest}). For ONNX Runtime: "
            f"{install_command('onnx')}")


def _device(value: str) -> str:
    if value in ("tensorrt", "xla"):
        raise ConfigError(f"--device {value} has no counterpart: serve on cuda (TensorRT through "
                          "--backend onnx with onnxruntime-gpu installed) or cpu")
    return value


def _dtype(value: str) -> str:
    if value == "fp8":
        raise ConfigError("--dtype fp8 has no counterpart: use float16, bfloat16 or auto (int8 on CPU)")
    return value


# Infinity's --vector-disk-cache, as an in-process cache of this size (MB).
VECTOR_CACHE_MB = 1024


@dataclass(frozen=True)
class Flag:
    """One of Infinity's v2 options: its name (`--NAME`, variable INFINITY_NAME), what it takes,
    and what it becomes here: a flat spec option, through `convert`, or `note` alone."""

    name: str
    kind: type = str  # str, int or bool (a --x/--no-x pair)
    per_model: bool = False  # repeatable, and `;`-separated in its variable
    ours: str | None = None  # the spec's flat option
    convert: Callable[[Any], Any] | None = None
    note: str = ""  # why it has no counterpart, or how it differs

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


FLAGS = (
    Flag("model_id", per_model=True, ours="model_id"),
    Flag("served_model_name", per_model=True, ours="served_model_name"),
    Flag("batch_size", int, True, "max_batch_size"),
    Flag("revision", per_model=True, ours="revision"),
    Flag("trust_remote_code", bool, True, "trust_remote_code",
         note="Infinity trusts a repository's code by default; here only when the flag is given"),
    Flag("engine", per_model=True, ours="backend", convert=_engine,
         note="optimum is ONNX Runtime (--backend onnx), or where it is not installed the fastest "
              "installed backend, said loudly; not given: auto, the fastest installed"),
    Flag("model_warmup", bool, True, "warmup"),
    Flag("vector_disk_cache", bool, True,
         note=f"becomes the in-process result cache (--cache-mb {VECTOR_CACHE_MB}), not on disk: it is "
              "empty after a restart; --cache-url redis://... keeps rows across restarts and shares "
              "them between replicas"),
    Flag("device", per_model=True, ours="device", convert=_device),
    Flag("device_id", per_model=True,
         note="becomes --device cuda:N; several ids (one model on several GPUs) have no counterpart: "
              "run one server per GPU"),
    Flag("lengths_via_tokenize", bool, True,
         note="always so here: usage counts the model's own tokens"),
    Flag("dtype", per_model=True, ours="dtype", convert=_dtype),
    Flag("embedding_dtype", per_model=True, ours="embedding_dtype"),
    Flag("pooling_method", per_model=True, ours="pooling",
         convert=lambda value: None if value == "auto" else value),
    Flag("compile", bool, True, note="no effect: the backends compile their own graphs (OpenVINO, ONNX)"),
    Flag("bettertransformer", bool, True,
         note="no effect: torch runs SDPA attention, which is what BetterTransformer gave"),
    Flag("preload_only", bool, note="becomes `infinity-cloud download`: fetch and build, then exit"),
    Flag("host", ours="host", note="Infinity's default 0.0.0.0 is kept (infinity-cloud serve: 127.0.0.1)"),
    Flag("port", int, ours="port"),
    Flag("url_prefix", ours="url_prefix"),
    Flag("redirect_slash", note="no effect: GET / answers the served models and links"),
    Flag("log_level", ours="log_level",
         convert=lambda value: {"critical": "error", "trace": "debug"}.get(value, value)),
    Flag("permissive_cors", bool, ours="cors_origins",
         convert=lambda value: ["*"] if value else None),
    Flag("api_key", ours="api_keys", convert=lambda value: [value]),
    Flag("proxy_root_path", convert=_refuse(
        "--proxy-root-path has no counterpart: serve the routes under the prefix with --url-prefix "
        "{value}, or have the proxy keep the prefix")),
    Flag("onnx_disable_optimize", bool, True,
         note="no effect: ONNX Runtime's graph optimisations always run"),
    Flag("onnx_do_not_prefer_quantized", bool, True,
         note="no effect: int8 is only served when asked for (--dtype int8)"),
)
BY_NAME = {flag.name: flag for flag in FLAGS}


@dataclass(frozen=True)
class Translation:
    options: dict[str, Any]  # the spec's flat options, as `serve` takes them
    command: str  # the same as an infinity-cloud command line
    notes: tuple[str, ...]  # flags given that have no counterpart, or mean something else
    preload_only: bool
    warnings: tuple[str, ...] = ()  # a flag served otherwise than it asks, on this install


def translate(given: Mapping[str, Any], environ: Mapping[str, str]) -> Translation:
    """Infinity's options as given on its command line (None or [] where not given), with its
    variables filling the rest, in infinity-cloud's terms."""
    values = {flag.name: _value(flag, given.get(flag.name), environ) for flag in FLAGS}
    options: dict[str, Any] = {"host": "0.0.0.0"}  # Infinity's default, kept
    notes = []
    for flag in FLAGS:
        value = values[flag.name]
        if flag.name == "vector_disk_cache" and any(_as_list(value)):  # one cache for all models
            options["cache_mb"] = VECTOR_CACHE_MB
        if value is None or value == [] or flag.name in ("device_id", "preload_only"):
            continue
        if flag.ours is None:
            if flag.convert is not None:
                flag.convert(value)  # refuses, saying why
            if flag.kind is not bool or any(_as_list(value)):  # a --no-x changes nothing here
                notes.append(f"--{_dashed(flag.name)}: {flag.note}")
            continue
        convert = flag.convert or (lambda v: v)
        converted = [convert(v) for v in value] if isinstance(value, list) else convert(value)
        if converted is not None:
            options[flag.ours] = converted
    options = _with_device_ids(options, values["device_id"])
    preload_only = bool(values["preload_only"])
    engines = _as_list(values["engine"])
    warnings = (_optimum_without_onnx(),) if "optimum" in engines and not installed("onnx") else ()
    return Translation(options, command_line(options, preload_only), tuple(notes), preload_only, warnings)


def _value(flag: Flag, given: Any, environ: Mapping[str, str]) -> Any:
    if given is not None and given != []:
        return given
    raw = environ.get(flag.env)
    if raw is None or raw == "":
        return None
    parts = [part for part in raw.split(";") if part != ""] if flag.per_model else [raw]
    try:
        parsed = [_parse(flag, part) for part in parts]
    except ValueError:
        raise ConfigError(f"{flag.env}={raw!r} is not a valid {flag.kind.__name__}") from None
    return parsed if flag.per_model else parsed[0]


def _parse(flag: Flag, text: str) -> Any:
    if flag.kind is bool:
        lowered = text.strip().lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(text)
        return lowered in ("1", "true", "yes", "on")
    return flag.kind(text.strip())


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _with_device_ids(options: dict[str, Any], ids: list[str] | None) -> dict[str, Any]:
    if not ids:
        return options
    devices = list(options.get("device") or ["auto"])
    if any("," in i for i in ids):
        raise ConfigError(f"--device-id {','.join(ids)}: one model on several GPUs has no counterpart; "
                          "run one server per GPU (each with --device cuda:N)")
    count = max(len(ids), len(devices))
    ids = ids * count if len(ids) == 1 else ids
    devices = devices * count if len(devices) == 1 else devices
    if len(ids) != len(devices):
        raise ConfigError("--device-id and --device must be given once, or once per model")
    pairs = zip(devices, ids, strict=True)
    options["device"] = [f"cuda:{i}" if d in ("cuda", "auto") else d for d, i in pairs]
    return options


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def command_line(options: Mapping[str, Any], preload_only: bool = False) -> str:
    """The infinity-cloud command that means `options` (API keys shown as ***)."""
    words = ["infinity-cloud", "download" if preload_only else "serve"]
    for name, value in options.items():
        if preload_only and name in ("host", "port", "url_prefix", "cors_origins", "api_keys", "log_level"):
            continue
        flag = "--api-key" if name == "api_keys" else "--cors-origin" if name == "cors_origins" else \
            f"--{_dashed(name)}"
        for item in _as_list(value):
            if isinstance(item, bool):
                words.append(flag if item else f"--no-{flag[2:]}")
            elif item is not None:
                words += [flag, "***" if name == "api_keys" else _quoted(str(item))]
    return " ".join(words)


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)
