"""Every worker reaps every tenant's lost jobs (worker.rq.worker.reaped_tenants): its log lines about them say whose
they are. Real redis-server."""

from __future__ import annotations

from structlog.testing import capture_logs

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from tests.support.queue import spec_dict
from tests.support.services import SIGNING_KEY as KEY
from worker import sweepstate
from worker.core import keys
from worker.core.contract import JobStatus
from worker.rq.reaper import Timing, reap


def test_a_lost_job_of_another_tenant_is_logged_with_its_tenant(conn, store, tiny_model):
    """A pool of team-a requeued team-b's lost job and logged `job.lost job_id=... sweep_id=...` in team-a's pool's
    log, without a tenant: read there, it was team-a's job (sweep and job ids are no tenant's name)."""
    spec = parse_spec(spec_dict(tiny_model, seeds=(1,)))
    out = cq.submit(conn, store, spec, "team-b", key=KEY)
    job_id, cell = plan(spec, "team-b")[0].job_id, plan(spec, "team-b")[0].cell
    sweepstate.transition(conn, "team-b", out.sweep_id, job_id, cell, JobStatus.RUNNING)
    sweepstate.heartbeat_job(conn, "team-b", out.sweep_id, job_id, cell, -1.0, create=True)  # its worker: silent
    with capture_logs() as lines:
        reap(conn, ["team-a", "team-b"], Timing(heartbeat_ttl=5.0))
    (lost,) = [line for line in lines if line["event"] == "job.lost"]
    assert (lost["tenant"], lost["job_id"], lost["sweep_id"]) == ("team-b", job_id, out.sweep_id)
    assert not conn.hlen(keys.running_ttls("team-b"))
