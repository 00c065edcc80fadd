"""Operations commands: doctor (CUDA, NVML, Redis, store) and cluster status|scale."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from controller.cli import options
from worker.core import settings
from worker.core.errors import ServiceError, UsageError
from worker.core.safetext import terminal


@click.command()
@options.tenant
@click.option("--require-gpu", is_flag=True, help="Fail when CUDA or NVML is not available (on GPU workers).")
@click.option("--local", is_flag=True, help="Local mode only: Redis is not required.")
@options.api
@options.redis_url
@options.store
def doctor(tenant: str, require_gpu: bool, local: bool, api: str | None, redis_url: str, store: str) -> None:
    """Check torch/CUDA, NVML, GPUs and their free memory, Redis (or the submission server) and the store."""
    from controller.ops.doctor import FAIL, NOTE, check_nvml, check_redis, check_store, check_torch

    results = [*check_torch(require_gpu), *check_nvml(require_gpu)]
    redis_check = _check_server(api) if api else check_redis(redis_url, tenant)
    if local and redis_check[0] == FAIL:
        redis_check = (NOTE, "redis", redis_check[2] + " (not needed with --local)")
    results += [redis_check, check_store(store)]
    width = max(len(name) for _, name, _ in results)
    for level, name, detail in results:
        click.echo(f"{level}  {name:<{width}}  {terminal(detail)}")
    failed = [name for level, name, _ in results if level == FAIL]
    hint = " (`decodebench run` alone needs no Redis: doctor --local)" if "redis" in failed and not api else ""
    click.echo(f"{len(failed)} check(s) failed: {', '.join(failed)}{hint}" if failed else "all required checks passed")
    if failed:
        sys.exit(1)


def _check_server(api: str) -> tuple[str, str, str]:
    """With --api a tenant has no Redis credentials: the server must answer and know the token."""
    from controller.ops.doctor import FAIL, PASS
    from controller.server.client import connect
    from worker.core.errors import DecodebenchError

    try:
        with connect(api) as client:
            who = client.call("GET", "/v1/whoami")
            client.call("GET", "/readyz")
    except DecodebenchError as err:
        return FAIL, "server", str(err)
    acts = f"tenant {who['tenant']}" if who.get("tenant") else "no tenant"
    return PASS, "server", f"{api} ready; token {who['token_id']} acts for {acts}{' (admin)' if who['admin'] else ''}"


_namespace = settings.option("namespace", "--namespace", "-n")
_context = click.option("--context", default=None, help="kubeconfig context (default: in-cluster, else current).")
_release = settings.option("release")


@click.group("cluster")
def cluster() -> None:
    """Worker pools on Kubernetes: pods, GPUs, queue depth; scale a pool.

    The pools are the chart's GPU pools (worker.pools[]) and, where the chart's reportWorkers is on,
    the report workers: the pool `report-workers` (engine `report`, no GPU), whose queued count is
    the tenants' report jobs (`report --distributed`)."""


@cluster.command("status")
@_namespace
@_context
@_release
@options.redis_url
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(namespace: str | None, context: str | None, release: str | None, redis_url: str, output: str) -> None:
    """Worker pods per pool (report-workers included), their GPUs and readiness, queue depth, idle/busy workers,
    and the tenants file each pod's workers run under (a line when they differ)."""
    from controller.ops.cluster import KubeClient, queue_stats, render, summarise

    kube = KubeClient(context, namespace)
    pools, pods = kube.pools(release), kube.pods(release)
    stats, note = None, None
    try:
        stats = queue_stats(redis_url)
    except ServiceError as exc:
        note = str(exc)
    rows = summarise(pools, pods, stats)
    if output == "json":
        doc = {
            "namespace": kube.namespace,
            "queue_depth_unavailable": note,
            "pools": [
                {
                    **asdict(r.pool),
                    "queued": r.queued,
                    "idle": r.idle,
                    "busy": r.busy,
                    "queues": r.queues,
                    "tenants_files": r.tenants_files,
                    "pods": [asdict(p) | {"tenants_files": r.pod_tenants.get(p.name, [])} for p in r.pods],
                }
                for r in rows
            ],
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render(rows, kube.namespace, note))


@cluster.command("scale")
@click.argument("pool")
@click.option("--replicas", type=click.IntRange(min=0), required=True, help="Pods the pool should run.")
@_namespace
@_context
@_release
def scale(pool: str, replicas: int, namespace: str | None, context: str | None, release: str | None) -> None:
    """Set the number of pods of worker pool POOL (a GPU pool's name, or report-workers)."""
    from controller.ops.cluster import REPORT_ENGINE, KubeClient

    kube = KubeClient(context, namespace)
    pools = kube.pools(release)
    matches = [p for p in pools if p.name == pool]
    where = f"namespace {kube.namespace}" + (f", release {release}" if release else "")
    if not matches:
        names = ", ".join(sorted({p.name for p in pools})) or "none"
        raise UsageError(f"no worker pool {pool!r} in {where} (pools: {names})")
    if len(matches) > 1:
        releases = ", ".join(sorted(p.release for p in matches))
        raise UsageError(f"pool {pool!r} exists in several releases ({releases}); choose one with --release")
    target = matches[0]
    if target.autoscaled:
        values = "reportWorkers.autoscaling" if target.engine == REPORT_ENGINE else "worker.pools[].autoscaling"
        raise UsageError(
            f"pool {pool!r} is autoscaled by KEDA; change {values} (minReplicas/maxReplicas) in the Helm values instead"
        )
    kube.scale(target.deployment, replicas)
    click.echo(
        f"pool {pool}: {target.replicas} -> {replicas} replicas (deployment {target.deployment} in {kube.namespace})"
    )
    values = "reportWorkers.replicas" if target.engine == REPORT_ENGINE else "worker.pools[].replicas"
    click.echo(f"note: the next `helm upgrade` resets it to {values} from the values")


COMMANDS = [doctor, cluster]
