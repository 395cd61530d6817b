"""The deployment spec: one frozen, typed description of what to serve and how.

Built once at the edge (a YAML file, then `INFINITY_CLOUD_*` variables and CLI flags, which
the CLI merges in that order) and passed down unchanged to the engine, the HTTP app and
every target.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infinity_cloud.core.errors import ConfigError

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_PORT = 7997  # Infinity's port, so its clients work without changes.

Dtype = Literal["auto", "fastest", "float32", "float16", "bfloat16", "int8"]
# "splade": serve a bare masked-LM folder as a SPLADE sparse embedder.
Pooling = Literal["mean", "cls", "lasttoken", "max", "mean_sqrt_len", "splade"]
TokenIds = Literal["openai", "model", "refuse"]
EmbeddingDtype = Literal["float32", "int8", "uint8", "binary", "ubinary"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _flag(flag: str | None = None, env: str | None = None, off: str | None = None) -> dict[str, str]:
    """A field's CLI flag, variable or boolean off-switch when they are not its name's
    (`cli.spec_flags.field_option` reads them): `--api-key` for `api_keys`, `--throughput` for
    `--no-latency`."""
    return {key: value for key, value in (("flag", flag), ("env", env), ("off", off)) if value}


class ModelSpec(_Frozen):
    """One model to serve. Each field's description is its flag's help (`infinity-cloud serve
    --help`), its default shown after it."""

    model_id: str = Field(DEFAULT_MODEL_ID, max_length=4096, description="Hub id or local folder of a model.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    served_model_name: str | None = Field(
        None, description="Name clients send as 'model'; a comma-separated list names aliases after it "
        "(minilm,text-embedding-3-small)."
    )
    aliases: tuple[str, ...] = Field(
        (), description="More names clients may send for this model (text-embedding-3-small, tei, ...)."
    )
    default: bool = Field(
        False, description="Where a request that names no model goes when several served models do its "
        "task (else the first listed of them)."
    )
    backend: str = Field(
        "auto", description="auto (the fastest installed), openvino, onnx, torch, ctranslate2 or neuron."
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or neuron.")
    device_ids: tuple[int, ...] | None = Field(
        None, description="Data parallel: a replica of the model (its own backend, queue and batch worker) "
        "on each of these devices, each request sent to the one with the least queued work. With cuda (or "
        "auto on a GPU machine): GPU indices, default every visible GPU; with cpu: that many replicas "
        "sharing the cores (default one). Not with cuda:N or neuron.",
    )
    dtype: Dtype = Field(
        "auto", description="auto, fastest, float32, float16, bfloat16 or int8 (auto: bfloat16 on a CPU with "
        "AMX or AVX512-BF16 where it agrees with float32; fastest: each precision the backend has, int8 "
        "included, timed at load, and the fastest that agrees with float32 to --min-agreement served)."
    )
    min_agreement: float | None = Field(
        None, gt=0, le=1, description="With --dtype fastest: the worst cosine to float32 on fixed probe "
        "texts a precision must reach to be served (default 0.99, int8's bar).",
    )
    batch_tokens: int = Field(16384, ge=64, description="Padded tokens (longest x count) per batch.")
    max_batch_size: int | None = Field(
        None, ge=1, description="Inputs per batch (default: the backend's, 16 openvino, 64 others)."
    )
    batch_wait_ms: float = Field(
        0.0, ge=0, le=1000,
        description="When the queue holds less than a full batch, wait this long for more inputs.",
    )
    length_buckets: tuple[int, ...] = Field(
        (), description="Static shapes: pad each batch's length up to the next of these "
        "(e.g. 64,128,256,512)."
    )
    batch_buckets: tuple[int, ...] = Field(
        (), description="Static shapes: pad each batch's rows up to the next of these (e.g. 1,8,32)."
    )
    queue_size: int = Field(16384, ge=1, description="Queued inputs before answering 429.")
    deadline_s: float | None = Field(
        10.0, gt=0, description="The longest a request may wait for the work ahead of it (taking turns, at "
        "the model's recent throughput): past it, 429 at once with a Retry-After for when it would fit, its "
        "place in line kept. A request's own work does not count: a large one is batched and takes turns. "
        "null (in a file): queue while there is room.",
    )
    request_limit_s: float | None = Field(
        None, gt=0, description="The platform's own limit on one request, in seconds (each cloud target sets "
        "its own; none locally): a request whose own work alone would pass it on an idle server is a 413 "
        "naming what fits; one that would pass it behind others, a 429.",
    )
    pooling: Pooling | None = Field(
        None, description="Override the pooling the model's files name: mean, cls, lasttoken, max, "
        "mean_sqrt_len; splade serves a masked-LM model as SPLADE (sparse)."
    )
    instruction: str | None = Field(
        None, description="An LLM reranker's instruction (what to rank for), in place of the model's own; a "
        "request's `instruction` overrides it."
    )
    normalize: bool | None = Field(
        None, description="Unit-length embeddings or not, whatever the model's own files say "
        "(default: as they say)."
    )
    max_length: int | None = Field(None, ge=1, description="Cap on the model's input tokens.")
    trust_remote_code: bool = Field(
        False, description="Run the model repository's own Python code (custom architectures): it is "
        "code from the internet."
    )
    warmup: bool = Field(True, description="Run one short batch at load so the first request is fast.")
    latency: bool = Field(
        False,
        description="Latency mode: every core on each batch, for one request at a time (OpenVINO's "
        "LATENCY hint, one batch in flight), instead of parallel streams for throughput; targets "
        "whose containers take one request at a time turn it on.",
        json_schema_extra=_flag(off="--throughput"),
    )
    token_ids: TokenIds = Field(
        "openai",
        description="What a list of token ids sent to /embeddings means: openai, ids of OpenAI's "
        "cl100k_base vocabulary, which OpenAI clients send (langchain-openai's OpenAIEmbeddings does "
        "by default), decoded to text and tokenized by the model; model, ids of the model's own "
        "vocabulary (OpenAI SDK clients are then refused: their ids would mean other text); refuse, a 400.",
    )
    embedding_dtype: EmbeddingDtype = Field(
        "float32",
        description="What every embedding route returns: float32, int8 or uint8 (each dimension's range, "
        "calibrated offline on standard-library docstrings, in 256 steps), binary or ubinary "
        "(sign bits, packed).",
    )
    export_into_folder: bool = Field(
        False,
        description="Write the backend's exports (ONNX, OpenVINO IR and compiled blobs) into the model's "
        "own folder (<model>/.infinity-cloud), so a copy of the folder carries them, instead of the "
        "export cache ($INFINITY_CLOUD_CACHE, else the user cache); images are baked so.",
    )
    backend_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Settings only one backend reads."
    )

    @property
    def name(self) -> str:
        return self.served_model_name or self.model_id

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        """Refused here, at once: a backend would import torch (seconds) before saying so."""
        if not re.fullmatch(r"auto|cpu|neuron|mps|(cuda|xpu)(:\d+)?", value):
            hint = " (an NVIDIA GPU is cuda)" if value.lower() in {"gpu", "nvidia"} else ""
            raise ValueError(f"unknown device {value!r}{hint}: use auto, cpu, cuda, cuda:N or neuron")
        return value

    @property
    def names(self) -> tuple[str, ...]:
        """Every name clients may send for this model: its name, then its aliases."""
        return (self.name, *self.aliases)

    @model_validator(mode="before")
    @classmethod
    def _listed_names(cls, data: Any) -> Any:
        """`served_model_name: "minilm,text-embedding-3-small"`: a name and its aliases."""
        if isinstance(data, dict) and isinstance(data.get("served_model_name"), str):
            first, *more = [n.strip() for n in data["served_model_name"].split(",") if n.strip()] or [None]
            data = {**data, "served_model_name": first, "aliases": (*more, *data.get("aliases", ()))}
        return data

    @field_validator("model_id", "revision")
    @classmethod
    def _readable_ids(cls, value: str | None) -> str | None:
        """A hub id, folder or revision never holds a control character; one with a NUL byte
        would reach the file system as a path (`embedded null byte`, a 500 from the admin API)."""
        if value is not None and any(not ch.isprintable() for ch in value):
            bad = next(ch for ch in value if not ch.isprintable())
            raise ValueError(f"{value[:80]!r} holds the control character {bad!r}: a hub id, a folder or "
                             "a revision is printable text")
        return value

    @field_validator("served_model_name", "aliases")
    @classmethod
    def _addressable_names(cls, value: Any) -> Any:
        """A name is a path segment of /models/NAME and /admin/models/NAME: one that a URL
        cannot carry as sent ("../x", "a//b", control characters) could never be unloaded."""
        for name in [value] if isinstance(value, str) else value or ():
            parts = name.split("/")
            if (len(name) > 256 or any(part in ("", ".", "..") for part in parts)
                    or any(ch.isspace() or not ch.isprintable() for ch in name)):
                raise ValueError(
                    f"model name {name[:80]!r} cannot be addressed in a URL: use up to 256 printable "
                    "characters without spaces, in '/'-separated parts that are not empty, '.' or '..'"
                )
        return value

    @model_validator(mode="after")
    def _agreement_for_fastest(self) -> ModelSpec:
        if self.min_agreement is not None and self.dtype != "fastest":
            raise ValueError(f"min_agreement chooses among precisions for dtype fastest; dtype {self.dtype} "
                             "serves one precision: drop min_agreement, or use dtype fastest")
        return self

    @model_validator(mode="after")
    def _replicable_device(self) -> ModelSpec:
        if self.device_ids is not None and re.fullmatch(r"neuron|mps|(cuda|xpu):\d+", self.device):
            whole = self.device.split(":")[0]
            raise ValueError(f"device_ids picks the devices to replicate on; device {self.device} names one "
                             f"device: use device {whole if whole != self.device else 'cuda or cpu'} with "
                             "device_ids, or drop device_ids")
        return self

    @field_validator("device_ids")
    @classmethod
    def _distinct_ids(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or min(value) < 0 or len(set(value)) < len(value)):
            raise ValueError("device_ids are distinct device indices, 0 or more, at least one")
        return value

    @field_validator("length_buckets", "batch_buckets", "device_ids", mode="before")
    @classmethod
    def _parse_buckets(cls, value: Any) -> Any:
        """Accept "128,256,512" (a flag or env value) as well as a list."""
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]
        return value

    @field_validator("length_buckets", "batch_buckets")
    @classmethod
    def _sorted_buckets(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(v < 1 for v in value):
            raise ValueError("bucket sizes must be positive")
        return tuple(sorted(set(value)))


class LimitsSpec(_Frozen):
    """Limits enforced before any work is queued."""

    # langchain sends batches of 128
    max_inputs_per_request: int = Field(2048, ge=128, description="Inputs per request.")
    max_chars_per_text: int = Field(200_000, ge=1, description="Characters per text input.")
    max_payload_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Body size limit, in bytes.")
    max_response_bytes: int | None = Field(
        None, ge=64 * 1024, description="The largest answer the platform passes back (a cloud "
        "function's, often 6 MB): a request whose answer could be larger is a 413 before any work "
        "(default: none; cloud functions set theirs)."
    )
    memory_budget_mb: int | None = Field(
        None, ge=64, description="Memory the process may take; requests past it get 429, or 413 if "
        "alone (default: 90% of the container's limit, else of the machine's memory)."
    )
    max_media_per_request: int = Field(64, ge=1, description="Image/audio inputs per request.")
    media_max_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Bytes per image/audio input.")
    # 4096 x 4096 by default, above a 12 MP photo and a 300 dpi A4 scan (media/images.py says why).
    media_max_pixels: int = Field(
        4096 * 4096, ge=64, description="Pixels per image (width x height), read from its header before "
        "decoding."
    )
    media_timeout_s: float = Field(10.0, gt=0, description="Seconds to fetch one media URL.")
    media_allowed_hosts: tuple[str, ...] = Field(
        (), description="Let media URLs reach this non-public host, address or network (e.g. "
        "10.0.0.0/8); repeatable. Loopback, private and metadata addresses are refused otherwise (SSRF).",
        json_schema_extra=_flag("--media-allow-host", "MEDIA_ALLOW_HOST"),
    )


class ServerSpec(_Frozen):
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="Port.")
    url_prefix: str = Field("", description="Serve every route under this path.")
    api_keys: tuple[str, ...] = Field(
        (), description="Require 'Authorization: Bearer KEY'; repeat for several keys. A flag shows in "
        "`ps`: prefer --api-key-file or the variable.", json_schema_extra=_flag("--api-key", "API_KEY"),
    )
    # A file (a mounted secret) keeps them out of `ps`.
    api_key_file: Path | None = Field(
        None, description="Require one of the keys in this file (one per line; # comments), read at start."
    )
    admin_keys: tuple[str, ...] = Field(
        (), description="Open the admin API (load and unload models while serving: /admin/models) to "
        "'Authorization: Bearer KEY'; repeatable. Without an admin key there is no admin API. An API "
        "key does not open it. Prefer --admin-key-file or the variable.",
        json_schema_extra=_flag("--admin-key", "ADMIN_KEY"),
    )
    admin_key_file: Path | None = Field(
        None, description="Admin keys, one per line (# comments), read at start."
    )
    admin_model_roots: tuple[Path, ...] = Field(
        (), description="A folder the admin API may load local model folders from (repeatable); a path "
        "outside every such folder is refused with one answer, whether it exists or not. Hub ids need none.",
        json_schema_extra=_flag("--admin-model-root", "ADMIN_MODEL_ROOT"),
    )
    admin_trust_remote_code: bool = Field(
        False, description="Let the admin API load models with trust_remote_code (their repository's own "
        "Python runs inside this server); without it such a load is refused."
    )
    cors_origins: tuple[str, ...] = Field(
        (), description="Allow browser calls from this origin ('*' for any); repeatable.",
        json_schema_extra=_flag("--cors-origin", "CORS_ORIGIN"),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="debug, info, warning or error."
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text, or json: one object a line, with the request id."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="408 for a client slower than this to send its headers, in seconds."
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="408 for a client slower than this to send its body, in seconds."
    )
    drain_s: float | None = Field(
        None, gt=0, description="On SIGTERM the server stops taking connections and answers what it "
        "admitted: for at most this many seconds, then it closes what is left (default: until done).",
    )
    cache_mb: int = Field(
        0, ge=0, description="The in-process result cache: the most memory its rows take, held inside "
        "the memory budget; a repeated input (a re-indexed chunk, a frequent query) is answered from it "
        "without the model (0: off).",
    )
    cache_url: str | None = Field(
        None, description="The shared result cache: a Redis URL (redis://HOST:6379/0, rediss:// with "
        "TLS) that every replica naming it reads and writes. Down or slow, requests are served uncached.",
    )
    cache_ttl_s: int | None = Field(
        7 * 24 * 3600, ge=1, description="How long Redis keeps a cached row, in seconds (null in a "
        "file: until Redis evicts it).",
    )
    cache_secret_file: Path | None = Field(
        None, description="A secret every replica sharing --cache-url holds (a file, its first line): rows "
        "are stored with a tag keyed by it, and a row read back without the right tag is recomputed, so "
        "that nobody else who can write to the Redis can change an answer.",
    )
    cache_timeout_ms: float = Field(
        50.0, gt=0, le=10_000, description="The longest one Redis call may take; past it its rows are "
        "computed instead.",
    )
    otlp_endpoint: str | None = Field(
        None, description="Export OpenTelemetry traces over OTLP/HTTP to this collector (http://HOST:4318; "
        "/v1/traces is added to a URL without a path): a span per request, its queue wait, each batch "
        "and forward pass that held its inputs, and its response, with model and route attributes. "
        "Needs the tracing extra. Off: nothing is traced and the SDK is not imported.",
    )
    limits: LimitsSpec = LimitsSpec()

    @field_validator("url_prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            value = "/" + value
        return value

    @property
    def keys(self) -> tuple[str, ...]:
        """Every accepted API key: those given, and those in `api_key_file`."""
        return _keys(self.api_keys, self.api_key_file, "API key")

    @property
    def admin(self) -> tuple[str, ...]:
        """Every admin key: those given, and those in `admin_key_file`."""
        return _keys(self.admin_keys, self.admin_key_file, "admin key")

    @property
    def cache_secret(self) -> bytes | None:
        """The shared result cache's secret, read from `cache_secret_file`."""
        if self.cache_secret_file is None:
            return None
        return _keys((), self.cache_secret_file, "cache secret")[0].encode()


def _keys(given: tuple[str, ...], file: Path | None, what: str) -> tuple[str, ...]:
    if file is None:
        return given
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {file}: {exc.strerror}") from exc
    from_file = tuple(k for k in (line.strip() for line in lines) if k and not k.startswith("#"))
    if not from_file:
        raise ConfigError(f"the {what} file {file} holds no key")
    return (*given, *from_file)


class TargetSections(Protocol):
    """What the spec asks the target registry (`targets/registry.py`), which the caller hands
    to `load_spec(targets=...)`: the targets import the spec, so it cannot import them. A
    target's section model (None: it has none; a ConfigError for an unknown name), and the
    names it knows."""

    def section_class(self, name: str) -> type[BaseModel] | None: ...

    def target_names(self) -> list[str]: ...


Section = TypeVar("Section", bound=BaseModel)


class DeploymentSpec(_Frozen):
    """Everything a target needs to know: the models, the server around them, and how each
    target packages them. Each target's settings are a section of its own (`<target>:` in a
    file), whose model the target registry gives; no target is named here, and the registry is
    handed to validation by its caller (`load_spec(targets=...)`, pydantic's validation
    context), never imported: the targets import the spec."""

    # Sections are the only extra keys allowed: `_target_sections` refuses any other.
    model_config = ConfigDict(frozen=True, extra="allow")

    models: tuple[ModelSpec, ...] = (ModelSpec(),)
    server: ServerSpec = ServerSpec()

    @model_validator(mode="before")
    @classmethod
    def _target_sections(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        registry: TargetSections | None = (info.context or {}).get("targets")
        for key in set(data) - set(cls.model_fields):
            value = data[key]
            if isinstance(value, BaseModel):  # a section validated before (a spec copied)
                continue
            if registry is None:
                raise ValueError(f"unknown key {key!r}; a spec holds models and server (and target "
                                 "sections where the target registry reads it: load_spec(targets=...))")
            try:
                section = registry.section_class(key)
            except ConfigError:
                raise ValueError(
                    f"unknown key {key!r}; a spec holds models, server and target sections "
                    f"({', '.join(registry.target_names())})"
                ) from None
            if section is None:
                raise ValueError(f"target {key!r} has no settings of its own")
            try:
                data[key] = section.model_validate(value or {})
            except ValidationError as exc:  # keep the section in each place named
                raise ValueError("; ".join(error_lines(exc, prefix=(key,)))) from None
        return data

    def section(self, target: str, kind: type[Section]) -> Section:
        """A target's settings (`kind`, its section model): as given, or its defaults."""
        given = (self.model_extra or {}).get(target)
        return given if given is not None else kind()  # type: ignore[return-value]

    def sections(self) -> dict[str, BaseModel]:
        """The target sections given (by the file, env or flags)."""
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _unique_names(self) -> DeploymentSpec:
        if not self.models:
            raise ValueError("at least one model is required")
        names = [n for m in self.models for n in m.names]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"served model names and aliases must be unique; repeated: {', '.join(dupes)}")
        return self


# Fields a flat source (CLI flags, env) does not set: names and the default model are the
# model list's own, backend options a mapping, limits options of their own (LIMIT_OPTIONS).
FILE_ONLY = ("model_id", "aliases", "default", "backend_options", "limits")
# Per-model options that a flat source may give once for all models or once per model, in
# the order of the model ids: every other field of ModelSpec.
MODEL_OPTIONS = tuple(field for field in ModelSpec.model_fields if field not in FILE_ONLY)
SERVER_OPTIONS = tuple(field for field in ServerSpec.model_fields if field not in FILE_ONLY)
LIMIT_OPTIONS = tuple(LimitsSpec.model_fields)


def _given(value: Any) -> bool:
    return value is not None and value != [] and value != ()


def _split_models(values: list[Any] | tuple[Any, ...]) -> list[Any]:
    """Per-model values as a variable lists them: "a;b" (Infinity's separator; no model id,
    name or setting holds a ';') is two."""
    return [part for v in values for part in (v.split(";") if isinstance(v, str) else [v]) if part != ""]


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read an `infinity-cloud.yaml` (or .json) file into a plain dict."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _per_model(values: list[Any], n_models: int, option: str) -> list[Any]:
    if len(values) == 1:
        return values * n_models
    if len(values) != n_models:
        raise ConfigError(
            f"--{option.replace('_', '-')} was given {len(values)} times for {n_models} models: "
            "give it once (for all models) or once per --model-id, in the same order"
        )
    return values


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Lay flat options (CLI flags or env, `None` meaning "not given") over a spec dict.

    `model_id` replaces the file's model list; other per-model options apply to every model
    when given once, or pairwise with the model ids when given once per model. A target's
    section comes as `sections={TARGET: {...}}`, each laid over the file's.
    """
    given = {k: v for k, v in overrides.items() if k != "sections" and _given(v)}
    data = {k: v for k, v in base.items()}
    data["models"] = _models_with(data.get("models"), given)
    server = {**(data.get("server") or {}), **_taken(given, SERVER_OPTIONS)}
    limits = {**(server.get("limits") or {}), **_taken(given, LIMIT_OPTIONS)}
    if limits:
        server["limits"] = limits
    data["server"] = server
    for section, options in (overrides.get("sections") or {}).items():
        options = {k: v for k, v in options.items() if _given(v)}
        if options:
            data[section] = {**(data.get(section) or {}), **options}
    if given:
        raise ConfigError(f"unknown options: {', '.join(sorted(given))}")
    return data


def _taken(given: dict[str, Any], options: Iterable[str]) -> dict[str, Any]:
    """The options of `options` that were given, taken out of `given` (what is left over is
    unknown)."""
    return {option: given.pop(option) for option in options if option in given}


def _models_with(models: list[dict[str, Any]] | None, given: dict[str, Any]) -> list[dict[str, Any]]:
    """The file's models (or the models `model_id` names instead) with the per-model options
    given, each given once for all or once per model, taken out of `given`."""
    merged = [dict(m) for m in models or [{}]]
    if "model_id" in given:
        merged = [{"model_id": mid} for mid in _split_models(given.pop("model_id"))]
    for option, value in _taken(given, MODEL_OPTIONS).items():
        values = _split_models(value if isinstance(value, list | tuple) else [value])
        for model, v in zip(merged, _per_model(list(values), len(merged), option), strict=True):
            model[option] = v
    return merged


def build_spec(data: dict[str, Any], targets: TargetSections | None = None) -> DeploymentSpec:
    """Validate a spec dict (its target sections by `targets`, the target registry), turning
    pydantic's errors into one readable ConfigError."""
    try:
        return DeploymentSpec.model_validate(data, context={"targets": targets})
    except ValidationError as exc:
        lines = [f"  {line}" for line in error_lines(exc)]
        raise ConfigError("invalid deployment spec:\n" + "\n".join(lines)) from None


def error_lines(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    """"where: what" for each of pydantic's errors."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (*prefix, *err["loc"])) or "spec"
        lines.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
    return lines


def load_spec(config_file: str | Path | None = None, *, targets: TargetSections | None = None,
              **overrides: Any) -> DeploymentSpec:
    """The merged spec: the config file (if any), then the given overrides. Its target
    sections are read by `targets` (the target registry; without it, a section is refused)."""
    base = read_config_file(config_file) if config_file else {}
    return build_spec(merge_overrides(base, overrides), targets)
