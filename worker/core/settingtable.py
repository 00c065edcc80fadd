"""The table of every `DECODEBENCH_*` setting: its name, default, help and the values it takes.

`worker.core.settings` resolves a setting (flag > environment > default) and builds its click option from
this table; docs/settings.md lists every row (a test keeps it complete). The table also lists the variables
that are read only by the Helm chart's launcher (`scope="chart"`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PREFIX = "DECODEBENCH_"
DEFAULT_STORE = "./runs"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_TENANT = "default"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def _float_list(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x.strip()]


@dataclass(frozen=True)
class Setting:
    """One setting: `DECODEBENCH_<NAME>`, its default (None: unset) and its meaning."""

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    scope: str = "both"  # "controller", "worker", "both" or "chart" (read by the chart's launcher only)
    env: str | None = None  # a variable named otherwise than DECODEBENCH_<NAME> (Kubernetes' downward API)
    low: int | None = None  # the least value it takes (a limit of -5 would refuse everything, or nothing); 0
    # where unset for a number: no count, size or time is negative (settings.get)
    choices: tuple[str, ...] = ()  # the only values it takes (any case)

    @property
    def envvar(self) -> str:
        return self.env or PREFIX + self.name.upper()


_SETTINGS = [
    # where results and jobs live
    Setting("store", DEFAULT_STORE, "Store: a directory, file:// or s3:// URL."),
    Setting("tenant", DEFAULT_TENANT, "Tenant (team) that owns the sweeps.", scope="controller"),
    Setting("redis_url", DEFAULT_REDIS_URL, "Redis URL (a password in it is never logged)."),
    Setting(
        "redis_password_file",
        None,
        "File holding the Redis password; it replaces the URL's password, the URL's user stays (the chart mounts it).",
    ),
    Setting(
        "redis_ca_file",
        None,
        "CA bundle (PEM) that verifies a rediss:// Redis's certificate; empty: the system's CAs.",
    ),
    Setting(
        "tenants_file",
        None,
        "Tenants file (YAML): the weights, quotas and model policy the workers and the submission server enforce.",
        scope="both",
    ),
    Setting(
        "signing_key_file",
        None,
        "File holding the key (32+ bytes) that signs job payloads; shared by the submission server and the "
        "workers (the chart mounts a Secret). Workers refuse to start without it.",
    ),
    Setting(
        "max_job_mb",
        16,
        "Largest job payload a worker inflates, in MiB (decompressed); a larger one fails for good.",
        int,
        scope="worker",
        low=1,
    ),
    # per-job cost limits (worker.core.policy), applied by validate, the submission server and the workers
    Setting("max_num_beams", 64, "Most beams a job may keep (beam, diverse_beam num_beams).", int, low=1),
    Setting("max_candidates", 64, "Most candidate tokens per step of contrastive search (k).", int, low=1),
    Setting("max_beam_groups", 16, "Most beam groups of diverse beam search (num_beam_groups).", int, low=1),
    Setting("max_assistant_tokens", 64, "Most tokens an assisted job's draft model proposes per step.", int, low=1),
    Setting("max_samples", 64, "Most generations per prompt a job may ask for (a strategy's samples).", int, low=1),
    # logging
    Setting("log_format", "console", "Log format: console or json.", choices=("console", "json")),
    Setting("log_level", "info", "Console log level (a job's log.jsonl keeps its info lines).", choices=LOG_LEVELS),
    # the worker process
    Setting("device", None, "Device: cpu or cuda:N; never falls back silently.", scope="worker"),
    Setting(
        "queues", "*", "Tenants, queue names decodebench.<tenant>.<priority>, or '*' (comma-separated).", scope="worker"
    ),
    Setting(
        "engine",
        "decodebench",
        "Engine the worker runs, decodebench or vllm: it takes only that engine's queues (docs/engines.md).",
        scope="worker",
    ),
    Setting(
        "stop_grace",
        None,
        "On SIGTERM, seconds to let the running job finish before requeueing it (default: its timeout).",
        float,
        scope="worker",
    ),
    Setting(
        "heartbeat_ttl", 60.0, "Seconds without a heartbeat after which a running job counts as lost.", float, low=1
    ),
    Setting("reaper_interval", 15.0, "Seconds between a worker's searches for lost jobs.", float, scope="worker"),
    Setting(
        "max_lost",
        3,
        "A job lost with its worker this many times fails instead of being requeued.",
        int,
        scope="worker",
    ),
    Setting("model_cache_size", 2, "Loaded models a worker keeps (LRU).", int, scope="worker"),
    Setting(
        "model_cache_mb",
        None,
        "Parameter memory (MB) a worker's model cache may hold (default: no limit).",
        int,
        scope="worker",
    ),
    Setting("auto_batch_max", 256, "Largest batch size that `batch_size: auto` tries.", int, scope="worker"),
    Setting(
        "sdpa_cudnn",
        False,
        "Let attention use cuDNN's fused kernel on CUDA; off: it builds a plan per new shape (docs/performance.md).",
        _flag,
        scope="worker",
    ),
    Setting("image", None, "Image reference recorded in every result's provenance (set by the chart).", scope="worker"),
    Setting("pod", None, "Pod name, recorded in provenance (set by the chart).", scope="worker", env="POD_NAME"),
    Setting("node", None, "Node name, recorded in provenance (set by the chart).", scope="worker", env="NODE_NAME"),
    Setting(
        "metrics_port",
        0,
        "Port the worker (or the submission server) serves Prometheus metrics on (/metrics, all interfaces); 0: none.",
        int,
        scope="both",
    ),
    Setting(
        "heartbeat_file",
        None,
        "File the worker touches on every heartbeat, busy or idle (the chart's probes read it).",
        scope="worker",
    ),
    # submission
    Setting(
        "retry_intervals",
        [30, 120, 600],
        "Seconds before each retry of a transiently failed job (comma-separated).",
        _float_list,
        scope="controller",
    ),
    # limits on what a user hands decodebench (docs/sweeps.md, "Limits")
    Setting(
        "max_jobs",
        100_000,
        "Most jobs a sweep may plan; counted before anything is expanded.",
        int,
        scope="controller",
        low=1,
    ),
    Setting("spec_max_kb", 256, "Largest sweep file read, in KiB.", int, scope="controller", low=1),
    Setting(
        "prompt_file_max_mb", 100, "Largest prompt file (JSONL or CSV) read, in MiB.", int, scope="controller", low=1
    ),
    Setting(
        "rating_sheet_max_mb",
        20,
        "Largest returned rating sheet read by `rate import`, in MiB.",
        int,
        scope="controller",
        low=1,
    ),
    Setting(
        "prompt_line_max_chars",
        1_000_000,
        "Longest line (JSONL) or field (CSV) of a prompt file, in characters.",
        int,
        scope="controller",
        low=1,
    ),
    Setting("debug", False, "Print the traceback of an error too (for maintainers).", _flag, scope="controller"),
    Setting("job_timeout", None, "Cap on any job's timeout in seconds (the cluster's limit).", int, scope="controller"),
    Setting(
        "sweep_ttl_days",
        30.0,
        "Days a sweep's Redis keys live after its last submit or retry.",
        float,
        scope="controller",
    ),
    # the submission server (`decodebench serve`) and its clients (`--api`)
    Setting(
        "api_url",
        None,
        "URL of the submission server; with it, submit/status/cancel/retry/failures/logs/report go through it.",
        scope="controller",
    ),
    Setting(
        "token",
        None,
        "Bearer token for the submission server (prefer DECODEBENCH_TOKEN_FILE); never logged.",
        scope="controller",
    ),
    Setting("token_file", None, "File holding the bearer token for the submission server.", scope="controller"),
    Setting(
        "ca_bundle",
        None,
        "CA bundle (PEM) that verifies an https:// submission server's certificate; empty: the system's CAs.",
        scope="controller",
    ),
    Setting(
        "tls_cert_file",
        None,
        "Certificate chain (PEM) the submission server serves TLS with (with DECODEBENCH_TLS_KEY_FILE).",
        scope="controller",
    ),
    Setting("tls_key_file", None, "Private key (PEM) of DECODEBENCH_TLS_CERT_FILE.", scope="controller"),
    Setting(
        "tokens_file",
        None,
        "The server's tokens file (YAML: id, tenant or admin, sha256 of each token); re-read when it changes.",
        scope="controller",
    ),
    Setting(
        "api_retries",
        5,
        "Retries of a request the submission server could not answer (backoff 0.5 s, doubling).",
        int,
        scope="controller",
    ),
    Setting("api_max_request_mb", 64.0, "Largest request body the server reads, in MiB.", float, scope="controller"),
    Setting(
        "submit_lock_s",
        30.0,
        "Seconds a submit holds its tenant's quota lock at most (a killed server's lock frees itself then).",
        float,
        scope="controller",
    ),
    Setting(
        "api_max_request_items",
        2_000_000,
        "Most JSON values (objects, arrays, their members) a request body may hold, counted before it is parsed.",
        int,
        scope="controller",
    ),
    Setting(
        "api_header_timeout_s",
        10.0,
        "Seconds a connection has to send a request's headers (from its first byte); slower ones are closed.",
        float,
        scope="controller",
    ),
    Setting("api_body_timeout_s", 60.0, "Seconds a request has to send its body (408).", float, scope="controller"),
    Setting(
        "api_max_connections",
        256,
        "Connections the server serves at once; past it a request is answered 503 at once.",
        int,
        scope="controller",
    ),
    Setting(
        "api_openapi",
        False,
        "Serve the API's OpenAPI schema at /openapi.json (to a valid token only); off by default.",
        _flag,
        scope="controller",
    ),
    Setting(
        "api_max_log_mb",
        4.0,
        "Largest job log (log.jsonl) the server reads for one request, in MiB; a larger one is refused (413).",
        float,
        scope="controller",
    ),
    # bounded reads of what a client could have written
    Setting(
        "store_max_read_mb",
        1024.0,
        "Largest store object any reader reads, in MiB (checked before reading it).",
        float,
    ),
    Setting(
        "report_snapshot_max_mb",
        1024.0,
        "Most bytes a report load inflates from a sweep's results snapshot, in MiB; entries past it are read "
        "from the store.",
        float,
        scope="controller",
    ),
    # S3
    Setting("s3_endpoint_url", None, "S3 endpoint for non-AWS services (MinIO, Ceph, ...)."),
    Setting("s3_profile", None, "AWS profile of the S3 credentials."),
    Setting("s3_retry_s", 120.0, "Seconds to keep retrying a transient S3 failure.", float),
    Setting("s3_retry_base_s", 0.5, "First backoff delay of those retries (doubles each time).", float),
    Setting("s3_max_attempts", 5, "botocore attempts per S3 request (standard retry mode).", int),
    Setting("s3_conditional_put", True, "Use conditional PUT (If-None-Match) for create-only writes.", _flag),
    # cluster commands
    Setting(
        "namespace",
        None,
        "Kubernetes namespace of `decodebench cluster` (default: the pod's or the context's).",
        scope="controller",
    ),
    Setting("release", None, "Helm release of the worker pools (default: every release).", scope="controller"),
    # read only by the chart's launcher (charts/decodebench/files/launch-workers.sh)
    Setting("worker_processes", 1, "Worker processes in a pod (the pod's GPU count).", int, scope="chart"),
    Setting(
        "worker_device",
        "cuda",
        "cuda or mig: process i sees only the GPU or MIG slice i by UUID (--device cuda:0); cpu: --device cpu.",
        scope="chart",
    ),
    Setting(
        "heartbeat_dir", "/tmp/decodebench", "Folder of the processes' heartbeat files (worker-<i>).", scope="chart"
    ),
    Setting(
        "restart_backoff",
        5,
        "Seconds before restarting a crashed worker process; doubles per crash.",
        int,
        scope="chart",
    ),
    Setting("restart_backoff_max", 300, "Longest wait before restarting a crashed worker process.", int, scope="chart"),
    Setting("pool", None, "Name of the worker pool (labels and logs).", scope="chart"),
]
SETTINGS: dict[str, Setting] = {s.name: s for s in _SETTINGS}
