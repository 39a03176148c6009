"""Typed configuration, read from the environment (or a ``.env`` / YAML file setting the same names).

Every process builds one ``Config`` at start-up and passes it down; nothing reads the environment later.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from polar.errors import ValidationError

EMBEDDED_DIR = ".polar"


def harness_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the harness CLIs are installed: ``POLAR_HARNESS_CACHE`` or ``~/.cache/polar/harnesses``."""
    env = os.environ if env is None else env
    configured = env.get("POLAR_HARNESS_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "polar" / "harnesses"


def deployment_id(database_url: str) -> str:
    """A short stable id of a deployment: a digest of its database URL without the password."""
    from sqlalchemy.engine import make_url

    try:
        identity = make_url(database_url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: the digest of the text is as stable
        identity = database_url
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def default_work_root(deployment: str) -> Path:
    """The work root when ``POLAR_WORK_ROOT`` is not set: this deployment's own, under the system's temporary
    directory, outside every project (``polar.runtimes.work_root`` says why)."""
    return Path(tempfile.gettempdir()) / f"polar-{deployment}" / "sessions"


@dataclass(frozen=True)
class Config:
    database_url: str
    broker_url: str
    redis_url: str | None
    proxy_url: str = "http://127.0.0.1:8100"
    # ``http://…`` (vLLM's protocol) or ``sglang+http://…`` (SGLang's native one): polar.fleet.engines.
    engine_urls: tuple[str, ...] = ("http://127.0.0.1:8000",)
    # The model's tokenizer directory, which prompts for SGLang engines are rendered with (polar.fleet.renderers).
    engine_tokenizer: str | None = None
    # How often each proxy process checks its engines' /health and load (0: only when a call fails).
    engine_health_interval_s: float = 2.0
    api_token: str | None = None
    # A second, read-only API token for trainers and viewers (web.api.auth).
    api_read_token: str | None = None
    run_concurrency: int = 4
    ready_buffer: int = 8
    state_dir: str = field(default_factory=lambda: str(Path(EMBEDDED_DIR).resolve()))
    # Where session directories live; default: outside every project (polar.runtimes.work_root).
    work_root: str = ""
    api_url: str = "http://127.0.0.1:8200"
    node: str = field(default_factory=socket.gethostname)
    served_model: str | None = None
    sampling_overrides: Mapping[str, Any] = field(default_factory=dict)
    engine_timeout_s: float = 600.0
    # The most new tokens a call may ask of the engine (polar.proxy.sampling); None: what the engine can decode
    # within ``engine_timeout_s`` at ``min_decode_rate`` (``max_tokens_cap``).
    max_tokens: int | None = None
    # The decode rate (tokens/s, one sequence) the deployment's engines keep even at their fullest batch: 20 is a
    # dense model of ~30B parameters on one H100-class GPU at a batch of 256; smaller models decode faster.
    min_decode_rate: float = 20.0
    engine_wait_s: float = 600.0  # how long a run waits for an engine to answer before its harness starts (0: not)
    # The longest a weight-sync pause may hold calls: the reconciler resumes one held longer (a trainer that died
    # paused), and no harness's budget is given back more than this for one pause (polar.lifecycle.budget).
    max_pause_s: float = 1800.0
    heartbeat_interval_s: float = 5.0
    stale_after_s: float = 30.0
    requeue_after_s: float = 300.0
    reconcile_interval_s: float = 5.0
    # How long work that is done (a captured call, a finished harness) waits out an unreachable database.
    db_outage_s: float = 60.0
    # Connections per process (polar.storage.database says how they add up).
    db_pool_size: int = 8
    db_max_overflow: int = 4
    max_body_bytes: int = 32 * 1024 * 1024
    # The largest body a count-tokens call may have (polar.proxy.body_limits): it is tokenised whole by the engine.
    max_count_tokens_bytes: int = 4 * 1024 * 1024
    # The most JSON values a proxied body may hold, so parsing one has a memory bound (polar.proxy.body_limits).
    max_json_values: int = 1_000_000
    # The bytes of bodies one proxy process parses at once, across sessions (polar.proxy.parse_budget).
    proxy_parse_bytes: int = 256 * 1024 * 1024
    # Images a call may carry (polar.proxy.images): bytes and pixels of one, how many in one call (its whole
    # conversation), how many different ones in a session; whether URLs may be sent for the engine to fetch (off: a
    # sandboxed policy must not make Polar's engines fetch for it); the image token when the engine's is not probed.
    max_image_bytes: int = 10 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_images_per_call: int = 32
    max_images_per_session: int = 256
    image_urls: bool = False
    image_token_id: int | None = None
    # Module prefixes whose ``module:attr`` import paths tasks may name (polar.codec.import_path); none by default.
    plugin_modules: tuple[str, ...] = ()
    # The ``chat_template_kwargs`` keys clients may send the engine (polar.proxy.template_kwargs).
    chat_template_kwargs: tuple[str, ...] = ("enable_thinking", "thinking", "reasoning_effort")
    # host[:port] or CIDR entries a batch's callback_url may reach although private (polar.contract.callback_targets).
    callback_allow: tuple[str, ...] = ()
    # Long-polls one process holds at once: feed ``wait`` requests (API) and calls held by a ``wait`` pause (proxy).
    feed_max_waiters: int = 4
    pause_max_waiters: int = 32
    # Per-session proxy limits for tasks that set none (polar.proxy.limits).
    session_max_concurrent_calls: int = 16
    session_max_calls: int = 2000
    # Count-tokens calls (Anthropic count_tokens, Gemini countTokens) a session may make in all, beside max_calls.
    session_max_count_tokens: int = 2000
    # The runtime backend of tasks that name none (local | bwrap | docker); ``local`` does not isolate.
    default_runtime: str = "local"
    # Host directories copy steps may read (``{"copy": src, "to": dst}``; polar.runtimes.copy_steps): none by default,
    # and then copy steps are refused.
    copy_roots: tuple[str, ...] = ()
    # A Docker sandbox's limits where its task sets none (0: no limit).
    sandbox_cpus: float = 2.0
    sandbox_memory_mb: int = 4096
    sandbox_pids: int = 1024
    # The size bound of a sandbox's private /tmp (a tmpfs, i.e. host memory): bwrap's, and Docker's with
    # read_only_root (0: unbounded).
    sandbox_tmp_mb: int = 1024
    # The size bound of a bwrap / docker session's directory: a filesystem of its own, loop-mounted there (needs a
    # root worker; polar.runtimes.session_disk). 0: unbounded.
    sandbox_disk_mb: int = 10240
    # What a bwrap / docker sandbox may hold open through its sockets (polar.runtimes.bounds): connections at once
    # to each of its proxy and egress sockets, and seconds to send one request (head and body) to the proxy.
    sandbox_max_connections: int = 24
    sandbox_request_send_s: float = 30.0
    # Seconds an egress tunnel may carry no byte either way before it is closed (polar.runtimes.egress).
    sandbox_tunnel_idle_s: float = 300.0
    # Prometheus metrics (docs/metrics.md): where each process group keeps its values (default <state_dir>/metrics;
    # local to the machine), whether the API's /metrics answers without a token, and the port (0: none) and address
    # a Celery worker serves its own /metrics on.
    metrics_dir: str = ""
    metrics_public: bool = False
    worker_metrics_port: int = 0
    worker_metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not self.work_root:
            object.__setattr__(self, "work_root", str(default_work_root(self.deployment)))
        if not self.metrics_dir:
            object.__setattr__(self, "metrics_dir", str(Path(self.state_dir) / "metrics"))

    @property
    def deployment(self) -> str:
        """Which Polar installation this is, as a short stable id (a digest of the database URL without its
        password): containers carry it, so two deployments on one Docker engine never reap each other's."""
        return deployment_id(self.database_url)

    @property
    def max_tokens_cap(self) -> int:
        """The most new tokens a call may ask of the engine: ``max_tokens``, or the tokens the engine decodes within
        ``engine_timeout_s`` at ``min_decode_rate``, so a call that outlives the timeout on a healthy engine is one
        decoding slower than the deployment guarantees (12,000 at the defaults)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return max(1, int(min(self.engine_timeout_s * self.min_decode_rate, 2**31 - 1)))

    @property
    def reconcile_tick_s(self) -> float:
        """How often a worker's reconciler wakes: ``reconcile_interval_s``, or a quarter of the stale window if that
        is shorter. The reconciler judges leases only after passes a fraction of a stale window apart
        (``polar.stages.reconciler.LeaseJudge``), so a short ``POLAR_STALE_AFTER`` beside a longer interval
        would leave a lost run worker's sessions running forever."""
        return min(self.reconcile_interval_s, self.stale_after_s / 4)

    @property
    def embedded(self) -> bool:
        """True when running on the embedded defaults (SQLite + an in-process broker)."""
        return self.database_url.startswith("sqlite")

    def with_overrides(self, **changes: Any) -> Config:
        return replace(self, **changes)


def _read_file_settings(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    text = path.read_text()
    if path.suffix in {".yaml", ".yml"}:
        loaded = yaml.safe_load(text) or {}
        return {str(k): str(v) for k, v in loaded.items()}
    settings: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip().strip("'\"")
    return settings


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValidationError(f"{name} must be a number, got {raw!r}", field=name) from exc


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{name} must be a JSON object: {exc}", field=name) from exc
    if not isinstance(value, dict):
        raise ValidationError(f"{name} must be a JSON object", field=name)
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValidationError(f"{name} must be a whole number, got {raw!r}", field=name) from exc
    if value < 1:
        raise ValidationError(f"{name} must be at least 1, got {value}", field=name)
    return value


def _whole_number(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number of at least 0 (0 turning a bound off)."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    if not raw.strip().isdigit():
        raise ValidationError(f"{name} must be a whole number of at least 0, got {raw!r}", field=name)
    return int(raw)


def _optional_positive_int(env: Mapping[str, str], name: str) -> int | None:
    """A whole number of at least 1, or None when unset."""
    return None if env.get(name) in (None, "") else _positive_int(env, name, 1)


def _positive_number(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, default)
    if not (value > 0 and math.isfinite(value)):
        raise ValidationError(f"{name} must be a finite number above 0, got {env.get(name)!r}", field=name)
    return value


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValidationError(f"{name} must be true or false, got {env.get(name)!r}", field=name)


def _port(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return 0
    if not raw.isdigit() or int(raw) > 65535:
        raise ValidationError(f"{name} must be a TCP port (0-65535; 0: off), got {raw!r}", field=name)
    return int(raw)


def _names(env: Mapping[str, str], name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A comma-separated list; unset means ``default``, an empty value means none."""
    raw = env.get(name)
    if raw is None:
        return default
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _callback_allow(env: Mapping[str, str]) -> tuple[str, ...]:
    from polar.contract.callback_targets import parse_allow

    entries = _names(env, "POLAR_CALLBACK_ALLOW")
    parse_allow(entries)  # a typo fails at start-up, not at the first submission
    return entries


# A node's name becomes part of queue names (``run.<node>``) and container labels.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _node_name(value: str) -> str:
    if not _NODE_NAME.fullmatch(value):
        raise ValidationError(
            f"POLAR_NODE must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit; got {value!r}",
            field="POLAR_NODE",
        )
    return value


def _copy_roots(env: Mapping[str, str]) -> tuple[str, ...]:
    """``POLAR_COPY_ROOTS``: absolute directories, separated by ``os.pathsep`` or commas."""
    raw = env.get("POLAR_COPY_ROOTS") or ""
    roots = tuple(item.strip() for item in re.split(f"[,{re.escape(os.pathsep)}]", raw) if item.strip())
    relative = [root for root in roots if not os.path.isabs(root)]
    if relative:
        raise ValidationError(
            f"POLAR_COPY_ROOTS must hold absolute directories; got {relative[0]!r}", field="POLAR_COPY_ROOTS"
        )
    return roots


def _engine_urls(urls: tuple[str, ...]) -> tuple[str, ...]:
    """``POLAR_ENGINE_URLS`` entries, each checked for a known kind (a typo fails at start-up)."""
    from polar.contract.engine_addresses import parse_engine_url

    for url in urls:
        try:
            parse_engine_url(url)
        except ValidationError as exc:
            raise ValidationError(f"POLAR_ENGINE_URLS: {exc}", field="POLAR_ENGINE_URLS") from exc
    return urls


RUNTIME_BACKENDS = ("local", "bwrap", "docker")


def _runtime_backend(value: str) -> str:
    if value not in RUNTIME_BACKENDS:
        raise ValidationError(
            f"POLAR_DEFAULT_RUNTIME must be one of {', '.join(RUNTIME_BACKENDS)}; got {value!r}",
            field="POLAR_DEFAULT_RUNTIME",
        )
    return value


def embedded_urls(root: Path) -> tuple[str, str]:
    """The SQLite database and filesystem broker an embedded deployment uses under ``root``."""
    return f"sqlite:///{(root / 'polar.db').resolve()}", "filesystem://"


def load_config(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Config:
    """Build the configuration from ``env`` (default: the process environment plus ``.env``/``polar.yaml``)."""
    cwd = cwd or Path.cwd()
    if env is None:
        merged = {**_read_file_settings(cwd / "polar.yaml"), **_read_file_settings(cwd / ".env")}
        merged.update(os.environ)
        env = merged
    state_dir = Path(env.get("POLAR_STATE_DIR") or cwd / EMBEDDED_DIR).resolve()
    default_db, default_broker = embedded_urls(state_dir)
    broker = env.get("POLAR_BROKER_URL") or default_broker
    redis_url = env.get("POLAR_REDIS_URL") or (broker if broker.startswith("redis") else None)
    run_concurrency = int(_number(env, "POLAR_RUN_CONCURRENCY", 4))
    engines = tuple(u.strip().rstrip("/") for u in env.get("POLAR_ENGINE_URLS", "").split(",") if u.strip())
    base = Config(database_url=default_db, broker_url=broker, redis_url=redis_url)
    return Config(
        database_url=env.get("POLAR_DATABASE_URL") or default_db,
        broker_url=broker,
        redis_url=redis_url,
        proxy_url=(env.get("POLAR_PROXY_URL") or base.proxy_url).rstrip("/"),
        engine_urls=_engine_urls(engines) or base.engine_urls,
        engine_tokenizer=env.get("POLAR_ENGINE_TOKENIZER") or None,
        engine_health_interval_s=_number(env, "POLAR_ENGINE_HEALTH_INTERVAL", base.engine_health_interval_s),
        api_token=env.get("POLAR_API_TOKEN") or None,
        api_read_token=env.get("POLAR_API_READ_TOKEN") or None,
        run_concurrency=run_concurrency,
        ready_buffer=int(_number(env, "POLAR_READY_BUFFER", 2 * run_concurrency)),
        state_dir=str(state_dir),
        work_root=env.get("POLAR_WORK_ROOT") or "",
        api_url=(env.get("POLAR_API_URL") or base.api_url).rstrip("/"),
        node=_node_name(env.get("POLAR_NODE") or socket.gethostname()),
        served_model=env.get("POLAR_SERVED_MODEL") or None,
        sampling_overrides=_json_object(env, "POLAR_SAMPLING_OVERRIDES"),
        engine_timeout_s=_number(env, "POLAR_ENGINE_TIMEOUT", base.engine_timeout_s),
        max_tokens=_optional_positive_int(env, "POLAR_MAX_NEW_TOKENS"),
        min_decode_rate=_positive_number(env, "POLAR_MIN_DECODE_RATE", base.min_decode_rate),
        engine_wait_s=_number(env, "POLAR_ENGINE_WAIT", base.engine_wait_s),
        max_pause_s=_positive_number(env, "POLAR_MAX_PAUSE", base.max_pause_s),
        heartbeat_interval_s=_number(env, "POLAR_HEARTBEAT_INTERVAL", base.heartbeat_interval_s),
        stale_after_s=_number(env, "POLAR_STALE_AFTER", base.stale_after_s),
        requeue_after_s=_number(env, "POLAR_REQUEUE_AFTER", base.requeue_after_s),
        reconcile_interval_s=_number(env, "POLAR_RECONCILE_INTERVAL", base.reconcile_interval_s),
        db_outage_s=_number(env, "POLAR_DB_OUTAGE", base.db_outage_s),
        db_pool_size=int(_number(env, "POLAR_DB_POOL_SIZE", base.db_pool_size)),
        db_max_overflow=int(_number(env, "POLAR_DB_MAX_OVERFLOW", base.db_max_overflow)),
        max_body_bytes=int(_number(env, "POLAR_MAX_BODY_BYTES", base.max_body_bytes)),
        max_count_tokens_bytes=_positive_int(env, "POLAR_MAX_COUNT_TOKENS_BYTES", base.max_count_tokens_bytes),
        max_json_values=_positive_int(env, "POLAR_MAX_JSON_VALUES", base.max_json_values),
        proxy_parse_bytes=_positive_int(env, "POLAR_PROXY_PARSE_BYTES", base.proxy_parse_bytes),
        max_image_bytes=_positive_int(env, "POLAR_MAX_IMAGE_BYTES", base.max_image_bytes),
        max_image_pixels=_positive_int(env, "POLAR_MAX_IMAGE_PIXELS", base.max_image_pixels),
        max_images_per_call=_positive_int(env, "POLAR_MAX_IMAGES_PER_CALL", base.max_images_per_call),
        max_images_per_session=_positive_int(env, "POLAR_MAX_IMAGES_PER_SESSION", base.max_images_per_session),
        image_urls=_flag(env, "POLAR_IMAGE_URLS", base.image_urls),
        image_token_id=_optional_positive_int(env, "POLAR_IMAGE_TOKEN_ID"),
        plugin_modules=_names(env, "POLAR_PLUGIN_MODULES"),
        chat_template_kwargs=_names(env, "POLAR_CHAT_TEMPLATE_KWARGS", base.chat_template_kwargs),
        callback_allow=_callback_allow(env),
        feed_max_waiters=int(_number(env, "POLAR_FEED_MAX_WAITERS", base.feed_max_waiters)),
        pause_max_waiters=int(_number(env, "POLAR_PAUSE_MAX_WAITERS", base.pause_max_waiters)),
        session_max_concurrent_calls=_positive_int(
            env, "POLAR_SESSION_MAX_CONCURRENT_CALLS", base.session_max_concurrent_calls
        ),
        session_max_calls=_positive_int(env, "POLAR_SESSION_MAX_CALLS", base.session_max_calls),
        session_max_count_tokens=_positive_int(env, "POLAR_SESSION_MAX_COUNT_TOKENS", base.session_max_count_tokens),
        default_runtime=_runtime_backend(env.get("POLAR_DEFAULT_RUNTIME") or base.default_runtime),
        copy_roots=_copy_roots(env),
        sandbox_cpus=_number(env, "POLAR_SANDBOX_CPUS", base.sandbox_cpus),
        sandbox_memory_mb=int(_number(env, "POLAR_SANDBOX_MEMORY_MB", base.sandbox_memory_mb)),
        sandbox_max_connections=_positive_int(env, "POLAR_SANDBOX_MAX_CONNECTIONS", base.sandbox_max_connections),
        sandbox_request_send_s=_number(env, "POLAR_SANDBOX_REQUEST_SEND_S", base.sandbox_request_send_s),
        sandbox_pids=int(_number(env, "POLAR_SANDBOX_PIDS", base.sandbox_pids)),
        sandbox_tmp_mb=int(_number(env, "POLAR_SANDBOX_TMP_MB", base.sandbox_tmp_mb)),
        sandbox_disk_mb=_whole_number(env, "POLAR_SANDBOX_DISK_MB", base.sandbox_disk_mb),
        sandbox_tunnel_idle_s=_positive_number(env, "POLAR_SANDBOX_TUNNEL_IDLE_S", base.sandbox_tunnel_idle_s),
        metrics_dir=env.get("POLAR_METRICS_DIR") or "",
        metrics_public=_flag(env, "POLAR_METRICS_PUBLIC"),
        worker_metrics_port=_port(env, "POLAR_WORKER_METRICS_PORT"),
        worker_metrics_host=env.get("POLAR_WORKER_METRICS_HOST") or base.worker_metrics_host,
    )
