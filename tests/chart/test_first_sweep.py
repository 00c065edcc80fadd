"""The first sweep NOTES.txt tells a new user to paste works: the chart's first-sweep ConfigMap,
as the controller pod mounts it, submitted with the command NOTES.txt prints through a real
`decodebench serve` (token, tenants file, signing key) and run to the end by a real
`decodebench-worker` on a redis-server. The model is the bundled tiny one at an absolute path,
standing in for a models claim the workers mount (the Hub download needs a network).
"""

from __future__ import annotations

import re
import subprocess

import pytest
import redis
import yaml

from controller.server.service import SubmitRequest, parse_submission
from tests.support.chart import find, render, render_notes
from tests.support.server import BIN, deployment
from worker import sweepstate

MOUNT = "/etc/decodebench-first-sweep/"
pytestmark = pytest.mark.slow


def first_sweep(values: dict) -> str:
    (cm,) = find(render(values), "ConfigMap", "db-decodebench-first-sweep")
    return cm["data"]["first-sweep.yaml"]


def test_the_default_first_sweep_names_a_hub_model_and_inline_prompts():
    spec = yaml.safe_load(first_sweep({}))
    assert spec["models"] == [{"path": "openai-community/gpt2", "name": "first"}]
    assert len(spec["prompts"]["inline"]) == 8 and "path" not in spec["prompts"]
    parse_submission(SubmitRequest(spec=spec))  # what the server checks: it reads no file
    (pod,) = [d for d in render({}) if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("controller")]
    (mount,) = [
        m for m in pod["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "first-sweep"
    ]
    assert mount["mountPath"] + "/" == MOUNT


def helm_test_script(values: dict) -> str:
    """The script of helmTest.firstSweep's pod, rendered where a CPU pool serves the tenant."""
    (pod,) = find(render(values), "Pod", "db-decodebench-first-sweep")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    assert "--remote-paths" in container["args"][0]  # the model is a path on the workers' volume
    # no CPU pool for the tenant: no such test (a GPU pool's first sweep is helmTest.gpuDoctor's business)
    gpu_only = values | {"worker": {"pools": [{"name": "gpu", "gpus": 1}]}}
    assert not find(render(gpu_only), "Pod", "db-decodebench-first-sweep")
    return container["args"][0]


def test_the_pasted_recipe_and_the_helm_test_run_the_first_sweep_to_the_end(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    """One deployment, one CPU worker, one run of the first sweep (each sweep on a CPU is the cost of this
    test): the command NOTES.txt prints, pasted in the controller pod, submits it; then helmTest.firstSweep's
    pod, where a CPU pool serves the tenant, runs its own script against the same server, which submits the
    same sweep through the server (nothing enqueued twice) and exits 0 once every job is done."""
    pasted = {"controller": {"firstSweep": {"model": tiny_model}}}
    notes = render_notes(pasted, tmp_path=tmp_path / "notes")
    (command,) = [line.split(" -- ", 1)[1] for line in notes.splitlines() if "decodebench submit " + MOUNT in line]
    assert command.endswith("--remote-paths")  # a path on the workers' volume
    values = {
        "tenant": "team-a",
        "controller": {"firstSweep": {"model": tiny_model}, "tokenSecret": "team-a-token"},
        "server": {"tokens": {"existingSecret": "tokens"}},
        "worker": {"pools": [{"name": "cpu", "gpus": 0, "queues": ["team-a"]}]},
        "helmTest": {"firstSweep": True},
    }
    pod_files = tmp_path / "pod"
    pod_files.mkdir()
    (pod_files / "first-sweep.yaml").write_text(first_sweep(values))
    assert first_sweep(values) == first_sweep(pasted)  # the one sweep, whoever submits it
    args = command.replace(MOUNT, str(pod_files) + "/").split()
    script = helm_test_script(values).replace(MOUNT, str(pod_files) + "/")
    tenants = "tenants:\n  - {{name: team-a, models: [{model}], rate_limit: 100000}}\n  - {{name: team-b}}\n"
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=tenants) as dep:
        token = tmp_path / "token"
        token.write_text(dep.tokens["alice"])  # the controller pod's token file (team-a)
        env = dep.env | {
            "DECODEBENCH_API_URL": dep.url,
            "DECODEBENCH_TOKEN_FILE": str(token),
            "PATH": f"{BIN}:/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
        }
        out = subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        sweep_id = re.search(r"sweep (\S+)", out.stdout).group(1)
        assert sweepstate.read_status(redis.Redis.from_url(redis_url), "team-a", sweep_id).total("queued") == 6
        worker_log = tmp_path / "worker.log"  # its lines, should the sweep not end
        with worker_log.open("w") as log:
            cmd = [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "team-a"]
            worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
            try:
                script = script.replace("--interval 15", "--interval 1")
                out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=480)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the sweep did not end; the worker's last lines:\n{worker_log.read_text()[-3000:]}")
            finally:
                worker.terminate()
                worker.wait(timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:] + worker_log.read_text()[-2000:]
    assert re.search(r"decodebench status (\S+) --watch", out.stdout).group(1) == sweep_id
    status = sweepstate.read_status(redis.Redis.from_url(redis_url), "team-a", sweep_id)
    assert status.total("done") == 6 and status.total("failed") == 0  # 3 strategies x 2 shards of 4 prompts
