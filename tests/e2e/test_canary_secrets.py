"""Canary secrets over a full distributed run (issue 9, "Audit and secrets").

Random canaries are planted in every credential: the Redis passwords of the server, worker and
keda ACL users (in the URLs the programs get, and the worker's also in a password file), the S3
access key and secret key of the moto endpoint, and a Hugging Face token. Then, as real
subprocesses, `decodebench submit`, a `decodebench-worker --burst`, `status`, `report`, `logs`,
`doctor`, and two failures (a wrong Redis password, an unreachable S3 endpoint) run; not one
canary may appear in any console output, log line, or object the run left in the bucket.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.repo import REPO
from tests.support.services import free_port, redis_server, s3_server

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
BUCKET = "canary-bucket"


def canary(what: str) -> str:
    return f"CANARY{what}{secrets.token_hex(10)}"


CANARIES = {
    "server": canary("serverpw"),
    "worker": canary("workerpw"),
    "keda": canary("kedapw"),
    "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
    "AWS_SECRET_ACCESS_KEY": canary("awssecret"),
    "HF_TOKEN": "hf_" + canary("token"),
    "SIGNING_KEY": canary("jobsigningkey"),
}
TENANTS = """
tenants:
  - {name: team-a, max_running: 2}
server: {redis_password_env: SERVER_PW}
worker: {redis_password_env: WORKER_PW}
keda: {redis_password_env: KEDA_PW}
"""


def run(args: list[str], env: dict[str, str], ok: bool = True) -> str:
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    else:
        assert proc.returncode != 0, f"{args} should have failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def base_env(tmp: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECODEBENCH_", "AWS_", "HF_"))}
    env.update(
        PYTHONPATH=str(REPO),
        DECODEBENCH_STORE=f"s3://{BUCKET}/runs",
        DECODEBENCH_S3_ENDPOINT_URL=endpoint,
        DECODEBENCH_TENANT="team-a",
        DECODEBENCH_LOG_FORMAT="json",
        DECODEBENCH_S3_RETRY_S="2",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ACCESS_KEY_ID=CANARIES["AWS_ACCESS_KEY_ID"],
        AWS_SECRET_ACCESS_KEY=CANARIES["AWS_SECRET_ACCESS_KEY"],
        HF_TOKEN=CANARIES["HF_TOKEN"],
        DECODEBENCH_SIGNING_KEY_FILE=str(tmp / "signing-key"),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def acl_file(tmp: Path) -> Path:
    (tmp / "tenants.yaml").write_text(TENANTS)
    env = {"SERVER_PW": CANARIES["server"], "WORKER_PW": CANARIES["worker"], "KEDA_PW": CANARIES["keda"]}
    r = CliRunner().invoke(cli, ["tenants", "acl", str(tmp / "tenants.yaml")], env=env)
    assert r.exit_code == 0, r.output
    (tmp / "users.acl").write_text(r.output)
    return tmp / "users.acl"


def write_spec(tmp: Path, model: str, prompts: str) -> Path:
    spec = {
        "name": "canary",
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"path": prompts, "limit": 2, "shard_size": 2},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 4, "batch_size": 2, "seeds": [1]},
        "metrics": ["mean_length", "distinct_1"],
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    return tmp / "spec.json"


def bucket_objects(endpoint: str) -> dict[str, bytes]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


def test_no_canary_in_any_output_log_or_stored_object(tmp_path, tiny_model, prompts_file, monkeypatch):
    import boto3

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, CANARIES[k])
    outputs: dict[str, str] = {}
    with s3_server() as endpoint, redis_server(aclfile=str(acl_file(tmp_path))) as (url, _):
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        hostport = url.removeprefix("redis://")
        env = base_env(tmp_path, endpoint)
        (tmp_path / "signing-key").write_text(CANARIES["SIGNING_KEY"] + "\n")
        ctl = {**env, "DECODEBENCH_REDIS_URL": f"redis://server:{CANARIES['server']}@{hostport}"}
        (tmp_path / "worker-pw").write_text(CANARIES["worker"] + "\n")
        wrk = {
            **env,
            "DECODEBENCH_REDIS_URL": f"redis://worker:{CANARIES['worker']}@{hostport}",
            "DECODEBENCH_TENANTS_FILE": str(tmp_path / "tenants.yaml"),
        }
        outputs["submit"] = run(["decodebench", "submit", str(write_spec(tmp_path, tiny_model, prompts_file))], ctl)
        sweep_id = outputs["submit"].split()[1]
        outputs["worker"] = run(["decodebench-worker", "--device", "cpu", "--queues", "team-a", "--burst"], wrk)
        pwfile = {**wrk, "DECODEBENCH_REDIS_URL": f"redis://worker@{hostport}"}
        pwfile["DECODEBENCH_REDIS_PASSWORD_FILE"] = str(tmp_path / "worker-pw")
        outputs["worker-pwfile"] = run(
            ["decodebench-worker", "--device", "cpu", "--queues", "team-a", "--burst"], pwfile
        )
        outputs["status"] = run(["decodebench", "status", sweep_id], ctl)
        assert "complete" in outputs["status"], outputs["status"]
        outputs["status-all"] = run(["decodebench", "status", "--all-tenants"], pwfile)
        outputs["report"] = run(
            ["decodebench", "report", sweep_id, "--n-boot", "0", "--output", str(tmp_path / "r.md")], ctl
        )
        job = json.loads(bucket_objects(endpoint)[f"runs/team-a/sweeps/{sweep_id}/plan.json"])["jobs"][0]["job_id"]
        outputs["logs"] = run(["decodebench", "logs", job, "--json"], ctl)
        outputs["doctor"] = run(["decodebench", "doctor"], ctl)
        wrong = {**ctl, "DECODEBENCH_REDIS_URL": f"redis://server:{CANARIES['worker']}@{hostport}"}
        outputs["wrong-password"] = run(["decodebench", "status", sweep_id], wrong, ok=False)
        no_s3 = {**ctl, "DECODEBENCH_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
        outputs["no-s3"] = run(["decodebench", "report", sweep_id, "--n-boot", "0"], no_s3, ok=False)
        debug = {**wrong, "DECODEBENCH_DEBUG": "1"}
        outputs["debug-traceback"] = run(["decodebench", "status", sweep_id], debug, ok=False)
        stored = bucket_objects(endpoint)
    kinds = {k.rsplit("/", 1)[-1] for k in stored}
    assert {"result.json", "log.jsonl", "plan.json"} <= kinds and any("generations" in k for k in kinds), kinds
    assert '"event"' in outputs["worker"] and "audit" in outputs["submit"]  # the logs ran and were captured
    texts = {f"console:{k}": v for k, v in outputs.items()}
    texts.update({f"s3:{k}": v.decode("utf-8", "replace") for k, v in stored.items()})
    texts["report-file"] = (tmp_path / "r.md").read_text()
    hits = [(where, name) for where, text in texts.items() for name, value in CANARIES.items() if value in text]
    assert hits == [], f"canary secrets leaked: {hits}"
