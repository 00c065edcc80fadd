"""`decodebench cluster status|scale`: the worker pools of a Helm release (and its report workers, the
pool `report-workers`), through the Kubernetes API.

`KubeClient` is the thin adapter over the kubernetes client, `queue_stats` the one over RQ;
the rest are plain functions of what they return. The chart labels each pool's Deployment
and pods with `decodebench.io/pool` and annotates the Deployment with the tenants it serves.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from worker.core import keys, settings
from worker.core.engines import OWN_ENGINE
from worker.core.errors import ServiceError, UsageError
from worker.core.redisconn import open_redis, redact_url

POOL_LABEL = "decodebench.io/pool"
QUEUES_ANNOTATION = "decodebench.io/queues"
GPUS_ANNOTATION = "decodebench.io/gpus-per-pod"
AUTOSCALING_ANNOTATION = "decodebench.io/autoscaling"
ENGINE_ANNOTATION = "decodebench.io/engine"
# The GPU worker pools and the report workers (reportWorkers: the pool `report-workers`, engine `report`).
WORKER_SELECTOR = "app.kubernetes.io/name=decodebench,app.kubernetes.io/component in (worker,report-worker)"
REPORT_ENGINE = keys.REPORT_QUEUE_SUFFIX  # a report worker's "engine": it takes the report queues
RELEASE_LABEL = "app.kubernetes.io/instance"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TIMEOUT = (5, 30)  # connect, read (seconds)


@dataclass(frozen=True)
class Pool:
    name: str
    release: str
    deployment: str
    replicas: int  # desired
    ready: int
    gpus_per_pod: int
    tenants: tuple[str, ...]
    autoscaled: bool
    engine: str = OWN_ENGINE  # the engine its workers run: they take only its queues


@dataclass(frozen=True)
class Pod:
    name: str
    pool: str
    release: str
    phase: str
    ready: bool
    gpus: int
    node: str
    restarts: int


@dataclass
class QueueStats:
    depth: dict[str, int]  # RQ queue name -> queued jobs
    workers: list  # every registered RQ worker: host, state, the tenants file it runs under (rqadapter.WorkerState)


@dataclass
class PoolStatus:
    pool: Pool
    pods: list[Pod]
    queued: int | None = None  # None: Redis unavailable
    idle: int | None = None
    busy: int | None = None
    queues: list[str] = field(default_factory=list)
    tenants_files: dict[str, int] = field(default_factory=dict)  # SHA-256 of a tenants file -> workers under it
    pod_tenants: dict[str, list[str]] = field(default_factory=dict)  # pod -> the tenants files its workers run


# --- pure core --------------------------------------------------------------------------


def pool_from_deployment(obj: dict) -> Pool:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    tenants = tuple(t for t in notes.get(QUEUES_ANNOTATION, "*").split(",") if t)
    return Pool(
        name=labels.get(POOL_LABEL, meta.get("name", "?")),
        release=labels.get(RELEASE_LABEL, ""),
        deployment=meta.get("name", "?"),
        replicas=int(spec.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        gpus_per_pod=int(notes.get(GPUS_ANNOTATION, "0") or 0),
        tenants=tenants or ("*",),
        autoscaled=notes.get(AUTOSCALING_ANNOTATION) == "keda",
        engine=notes.get(ENGINE_ANNOTATION) or OWN_ENGINE,
    )


def pod_from_object(obj: dict) -> Pod:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    labels = meta.get("labels") or {}
    gpus = 0
    for c in spec.get("containers") or []:
        for resource, amount in ((c.get("resources") or {}).get("limits") or {}).items():
            if resource.startswith("nvidia.com/"):
                gpus += int(amount)
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    phase = status.get("phase") or "Unknown"
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason"):
            phase = c["reason"]  # Unschedulable: no node with a free GPU (or a matching taint)
    if meta.get("deletionTimestamp"):
        phase = "Terminating"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            phase = waiting["reason"]  # CrashLoopBackOff, ImagePullBackOff, ... say more than Pending
    return Pod(
        name=meta.get("name", "?"),
        pool=labels.get(POOL_LABEL, "?"),
        release=labels.get(RELEASE_LABEL, ""),
        phase=phase,
        ready=conditions.get("Ready") == "True",
        gpus=gpus,
        node=spec.get("nodeName") or "-",
        restarts=sum(int(cs.get("restartCount") or 0) for cs in status.get("containerStatuses") or []),
    )


def pool_queues(tenants: tuple[str, ...], known: list[str], engine: str = OWN_ENGINE) -> list[str]:
    """The RQ queues a pool serves: its tenants' queues of its engine, or every such queue for '*'
    (the report workers: the tenants' report queues)."""
    if engine == REPORT_ENGINE:
        if "*" in tenants:
            return sorted(q for q in known if keys.parse_report_queue(q))
        return [keys.report_queue(t) for t in tenants]
    if "*" in tenants:
        return sorted(q for q in known if keys.queue_engine(q) == engine)
    return [q for t in tenants for q in keys.engine_queues(t, engine)]


def pod_hostname(pod_name: str) -> str:
    """The hostname an RQ worker in the pod reports: the pod's name, as the kubelet cuts it to 63."""
    return pod_name[:63].rstrip("-.")


def summarise(pools: list[Pool], pods: list[Pod], stats: QueueStats | None) -> list[PoolStatus]:
    out = []
    for pool in sorted(pools, key=lambda p: (p.release, p.name)):
        mine = [p for p in pods if p.pool == pool.name and p.release == pool.release]
        row = PoolStatus(pool=pool, pods=sorted(mine, key=lambda p: p.name))
        if stats is not None:
            row.queues = pool_queues(pool.tenants, list(stats.depth), pool.engine)
            row.queued = sum(stats.depth.get(q, 0) for q in row.queues)
            pod_of = {pod_hostname(p.name): p.name for p in mine}
            workers = [w for w in stats.workers if w.host in pod_of]
            states = [w.state for w in workers]
            row.idle, row.busy = states.count("idle"), states.count("busy")
            under = [(pod_of[w.host], w.tenants) for w in workers if w.tenants]
            row.tenants_files = dict(Counter(digest for _, digest in under))
            for (pod, digest), _ in _ranked(Counter(under)):  # each pod's files, the most workers' first
                row.pod_tenants.setdefault(pod, []).append(digest)
        out.append(row)
    return out


def _ranked(counts: Counter) -> list:
    """(key, count) by count, most first, then key: the same order whatever order RQ lists its workers in."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def tenants_note(rows: list[PoolStatus]) -> str | None:
    """A line when the workers run under more than one tenants file (a ConfigMap change on its way), else None."""
    counts = sum((Counter(r.tenants_files) for r in rows), Counter())
    if len(counts) < 2:
        return None
    files = ", ".join(f"{d[:12]} on {n} worker{'s' * (n != 1)}" for d, n in _ranked(counts))
    return (
        f"the workers run under {len(counts)} tenants files ({files}): a changed ConfigMap reaches each pod within "
        "about a minute; a worker still behind after that is not reloading (see its log). The file's own: "
        "sha256sum /etc/decodebench/tenants.yaml in a pod"
    )


def render(rows: list[PoolStatus], namespace: str, redis_note: str | None) -> str:
    lines = [f"namespace {namespace}"]
    if not rows:
        return "\n".join([*lines, "no decodebench worker pools found"])
    table = [("POOL", "RELEASE", "READY", "GPUS/POD", "QUEUED", "IDLE", "BUSY", "SCALING")]
    for r in rows:
        p = r.pool
        table.append(
            (
                p.name,
                p.release,
                f"{p.ready}/{p.replicas}",
                str(p.gpus_per_pod),
                _num(r.queued),
                _num(r.idle),
                _num(r.busy),
                "keda" if p.autoscaled else "manual",
            )
        )
    lines += _columns(table)
    if redis_note:
        lines.append(f"queue depth unavailable: {redis_note}")
    pods = [("POD", "POOL", "STATUS", "READY", "GPUS", "NODE", "RESTARTS", "TENANTS FILE")]
    for r in rows:
        pods += [
            (p.name, p.pool, p.phase, "yes" if p.ready else "no", str(p.gpus), p.node, str(p.restarts),
             _tenants_cell(r.pod_tenants.get(p.name, [])))
            for p in r.pods
        ]  # fmt: skip
    lines += ["", *(_columns(pods) if len(pods) > 1 else ["no worker pods"])]
    if note := tenants_note(rows):
        lines += ["", note]
    return "\n".join(lines)


def _tenants_cell(files: list[str]) -> str:
    """The tenants file a pod's workers run under: its SHA-256's first 12 hex digits, `N files` where they differ."""
    if not files:
        return "-"
    return files[0][:12] if len(files) == 1 else f"{len(files)} files"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# --- adapters ---------------------------------------------------------------------------


def queue_stats(redis_url: str) -> QueueStats:
    """Queue lengths and worker states from RQ. Raises ServiceError when Redis is unreachable."""
    from redis.exceptions import RedisError

    from worker.core import rqadapter

    try:
        conn = open_redis(redis_url, socket_connect_timeout=3, socket_timeout=5)
        depth = rqadapter.queue_depths(conn)
        workers = rqadapter.worker_states(conn)
    except (RedisError, OSError, ValueError) as exc:
        raise ServiceError(f"cannot read RQ queues at {redact_url(redis_url)}: {exc}") from exc
    return QueueStats(depth=depth, workers=workers)


class KubeClient:
    """The Kubernetes API calls of the cluster commands; errors become one-line messages."""

    def __init__(self, context: str | None = None, namespace: str | None = None):
        from kubernetes import client, config

        try:
            if context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                api = client.ApiClient(cfg)
                default_ns = _read(SA_NAMESPACE_FILE)
            else:
                # KUBECONFIG read now: the client reads it once, at import.
                path = os.environ.get("KUBECONFIG") or None
                api = config.new_client_from_config(config_file=path, context=context, persist_config=False)
                contexts, active = config.list_kube_config_contexts(config_file=path)
                if context is not None:
                    active = next((c for c in contexts if c.get("name") == context), active)
                default_ns = (active or {}).get("context", {}).get("namespace")
        except (config.ConfigException, OSError) as exc:
            raise UsageError(
                f"no Kubernetes access: {exc} (run in a pod with a service account, "
                "or point KUBECONFIG / --context at a cluster)"
            ) from exc
        self.host = api.configuration.host
        self.namespace = namespace or settings.get("namespace") or default_ns or "default"
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    def _call(self, what: str, method, *args, **kwargs) -> dict:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            resp = method(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
            return json.loads(resp.data or b"{}")
        except ApiException as exc:
            message = _status_message(exc.body) or exc.reason or ""
            if exc.status in (401, 403):
                raise ServiceError(
                    f"Kubernetes API refused to {what} in namespace {self.namespace}: "
                    f"{message} (the release's Role grants this to the controller's "
                    "service account; check controller.rbac.create)"
                ) from exc
            if exc.status == 404:
                raise UsageError(f"cannot {what}: not found in namespace {self.namespace}: {message}") from exc
            raise ServiceError(f"Kubernetes API error ({exc.status}) trying to {what}: {message}") from exc
        except HTTPError as exc:
            raise ServiceError(f"cannot reach the Kubernetes API at {self.host}: {exc}") from exc

    def pools(self, release: str | None) -> list[Pool]:
        body = self._call(
            "list deployments", self.apps.list_namespaced_deployment, self.namespace, label_selector=_selector(release)
        )
        return [pool_from_deployment(d) for d in body.get("items") or []]

    def pods(self, release: str | None) -> list[Pod]:
        body = self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=_selector(release))
        return [pod_from_object(p) for p in body.get("items") or []]

    def scale(self, deployment: str, replicas: int) -> None:
        self._call(
            f"scale deployment {deployment}",
            self.apps.patch_namespaced_deployment_scale,
            deployment,
            self.namespace,
            {"spec": {"replicas": replicas}},
        )


def _selector(release: str | None) -> str:
    return WORKER_SELECTOR + (f",{RELEASE_LABEL}={release}" if release else "")


def _status_message(body: str | bytes | None) -> str:
    try:
        return json.loads(body or "{}").get("message", "")
    except (ValueError, AttributeError):
        return ""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
