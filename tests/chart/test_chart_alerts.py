# ruff: noqa: E501  (PromQL series selectors, one per line, are read whole)
"""The chart's alerts fire, checked with promtool (Debian's `prometheus` package, installed by
scripts/setup-test-deps.sh): the rendered PrometheusRule's groups through `promtool check rules`,
then `promtool test rules` feeding each alert the series that should make it fire (and some that
should not), with the labels and annotations the values configure. Without promtool these tests
fail, never skip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.chart import find, render

SCRAPERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
ALL_ON = {
    "metrics": {
        "enabled": True,
        "allowedFrom": SCRAPERS,
        "serverMonitor": {"enabled": True},
        "prometheusRule": {
            "enabled": True,
            "runbookUrl": "https://runbooks.example.com/decodebench/",
            "additionalLabels": {"team": "ml-platform"},
        },
    },
    "redis": {"metrics": {"enabled": True}},
    "worker": {"pools": [{"name": "h100", "gpus": 1, "queues": ["nlp", "safety"], "autoscaling": {"enabled": True}}]},
}
WORKER = 'namespace="ml", pod="db-decodebench-worker-h100-7d9f-abcde"'
SERVER = 'namespace="ml", service="db-decodebench-server", pod="db-decodebench-server-5c-xyz"'
REDIS = 'namespace="ml", pod="db-decodebench-redis-0"'


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool is required: run scripts/setup-test-deps.sh (Debian's prometheus package)", pytrace=False)
    return found


def rules_of(values: dict) -> list[dict]:
    (rule,) = find(render(values), "PrometheusRule")
    return rule["spec"]["groups"]


def write_rules(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules_of(values)}, sort_keys=False))
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


def test_the_rules_pass_promtool_check(tmp_path):
    proc = run_promtool("check", "rules", str(write_rules(tmp_path, ALL_ON)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 rules found" in proc.stdout  # every alert, each where its metrics exist


def case_pool_at_zero_with_work(ann: dict) -> dict:
    """The pool stays at 0 pods while its tenants' jobs wait (a failing KEDA trigger)."""
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": 'kube_deployment_spec_replicas{namespace="ml", deployment="db-decodebench-worker-h100"}',
                "values": "0x40",
            },
            {
                "series": f'decodebench_server_queue_jobs{{{SERVER}, tenant="nlp", engine="decodebench", state="waiting"}}',
                "values": "3x40",
            },
            # another tenant's, or another engine's, waiting jobs are not this pool's
            {
                "series": f'decodebench_server_queue_jobs{{{SERVER}, tenant="other", engine="decodebench", state="waiting"}}',
                "values": "9x40",
            },
        ],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "DecodebenchPoolStuckAtZero", "exp_alerts": []},
            {
                "eval_time": "20m",
                "alertname": "DecodebenchPoolStuckAtZero",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical", "team": "ml-platform", "pool": "h100"},
                        "exp_annotations": ann["DecodebenchPoolStuckAtZero"],
                    }
                ],
            },
        ],
    }


def case_pool_not_at_zero_for_others(ann: dict) -> dict:
    """A pool at zero is not alerted for another tenant's waiting jobs, nor for another engine's."""
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": 'kube_deployment_spec_replicas{namespace="ml", deployment="db-decodebench-worker-h100"}',
                "values": "0x40",
            },
            {
                "series": f'decodebench_server_queue_jobs{{{SERVER}, tenant="other", engine="decodebench", state="waiting"}}',
                "values": "9x40",
            },
            {
                "series": f'decodebench_server_queue_jobs{{{SERVER}, tenant="nlp", engine="vllm", state="waiting"}}',
                "values": "9x40",
            },
        ],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "DecodebenchPoolStuckAtZero", "exp_alerts": []}],
    }


def case_server_errors_and_throttling(ann: dict) -> dict:
    """10% of the server's answers are 500s; 30% are 429s."""
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": f'decodebench_server_requests_total{{{SERVER}, route="/v1/sweeps", method="POST", code="201"}}',
                "values": "0+60x40",
            },
            {
                "series": f'decodebench_server_requests_total{{{SERVER}, route="/v1/sweeps", method="POST", code="500"}}',
                "values": "0+10x40",
            },
            {
                "series": f'decodebench_server_requests_total{{{SERVER}, route="/v1/sweeps", method="POST", code="429"}}',
                "values": "0+30x40",
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "DecodebenchServerErrors",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical", "team": "ml-platform"},
                        "exp_annotations": ann["DecodebenchServerErrors"]
                        | {"summary": "decodebench: the submission server answers 10% of requests with 5xx"},
                    }
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "DecodebenchServerThrottling",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "team": "ml-platform"},
                        "exp_annotations": ann["DecodebenchServerThrottling"]
                        | {"summary": "decodebench: the submission server refuses 30% of requests with 429"},
                    }
                ],
            },
        ],
    }


def case_healthy_server(ann: dict) -> dict:
    """A healthy server: 1% errors, no 429s."""
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": f'decodebench_server_requests_total{{{SERVER}, route="/v1/sweeps", method="GET", code="200"}}',
                "values": "0+99x40",
            },
            {
                "series": f'decodebench_server_requests_total{{{SERVER}, route="/v1/sweeps", method="GET", code="503"}}',
                "values": "0+1x40",
            },
        ],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "DecodebenchServerErrors", "exp_alerts": []},
            {"eval_time": "30m", "alertname": "DecodebenchServerThrottling", "exp_alerts": []},
        ],
    }


def case_redis_memory_and_keda(ann: dict) -> dict:
    """Redis at 90% of maxmemory; KEDA's triggers failing."""
    return {
        "interval": "1m",
        "input_series": [
            {"series": f"redis_memory_used_bytes{{{REDIS}}}", "values": "900x30"},
            {"series": f"redis_memory_max_bytes{{{REDIS}}}", "values": "1000x30"},
            {
                "series": 'keda_scaled_object_errors{namespace="keda", scaledObject="db-decodebench-worker-h100"}',
                "values": "0+1x30",
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "15m",
                "alertname": "DecodebenchRedisMemoryHigh",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical", "team": "ml-platform", **_labels(REDIS)},
                        "exp_annotations": ann["DecodebenchRedisMemoryHigh"]
                        | {"summary": "decodebench: Redis uses 90% of its maxmemory"},
                    }
                ],
            },
            {
                "eval_time": "25m",
                "alertname": "DecodebenchKedaScalerErrors",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "team": "ml-platform",
                            "scaledObject": "db-decodebench-worker-h100",
                        },
                        "exp_annotations": ann["DecodebenchKedaScalerErrors"]
                        | {
                            "summary": "decodebench: KEDA cannot read the queues of db-decodebench-worker-h100",
                            "description": ann["DecodebenchKedaScalerErrors"]["description"].replace(
                                "{{ $labels.scaledObject }}", "db-decodebench-worker-h100"
                            ),
                        },
                    }
                ],
            },
        ],
    }


def case_stuck_queue_and_crash_loop(ann: dict) -> dict:
    """Jobs wait, none runs or starts; a worker process restarts again and again."""
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": f'decodebench_queue_jobs{{{WORKER}, pool="h100", tenant="nlp", state="waiting"}}',
                "values": "5x60",
            },
            {
                "series": f'decodebench_queue_jobs{{{WORKER}, pool="h100", tenant="nlp", state="running"}}',
                "values": "0x60",
            },
            {
                "series": f'decodebench_worker_jobs_started_total{{{WORKER}, pool="h100", tenant="nlp"}}',
                "values": "0x60",
            },
            {"series": f"process_start_time_seconds{{{WORKER}}}", "values": "1+1x60"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "40m",
                "alertname": "DecodebenchQueueStuck",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "team": "ml-platform",
                            "namespace": "ml",
                            "tenant": "nlp",
                        },
                        "exp_annotations": {
                            k: v.replace("{{ $labels.tenant }}", "nlp").replace("{{ $labels.namespace }}", "ml")
                            for k, v in ann["DecodebenchQueueStuck"].items()
                        },
                    }
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "DecodebenchWorkerCrashLooping",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "team": "ml-platform", **_labels(WORKER)},
                        "exp_annotations": {
                            k: v.replace("{{ $labels.pod }}", "db-decodebench-worker-h100-7d9f-abcde")
                            for k, v in ann["DecodebenchWorkerCrashLooping"].items()
                        },
                    }
                ],
            },
        ],
    }


def test_each_alert_fires_on_the_series_that_should_fire_it(tmp_path):
    rules = write_rules(tmp_path, ALL_ON)
    by_name = {r["alert"]: r for g in rules_of(ALL_ON) for r in g["rules"]}
    ann = {name: r["annotations"] for name, r in by_name.items()}
    assert ann["DecodebenchPoolStuckAtZero"]["runbook_url"].endswith("#decodebenchpoolstuckatzero")
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            case_pool_at_zero_with_work(ann),
            case_pool_not_at_zero_for_others(ann),
            case_server_errors_and_throttling(ann),
            case_healthy_server(ann),
            case_redis_memory_and_keda(ann),
            case_stuck_queue_and_crash_loop(ann),
        ],
    }
    test_file = tmp_path / "alerts.test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = run_promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_promtool_fails_an_alert_that_would_fire_later_than_expected(tmp_path):
    """The check can fail: with poolAtZeroFor 30m the alert is still pending at 20 minutes."""
    late = ALL_ON | {
        "metrics": ALL_ON["metrics"]
        | {"prometheusRule": ALL_ON["metrics"]["prometheusRule"] | {"poolAtZeroFor": "30m"}}
    }
    ann = {r["alert"]: r["annotations"] for g in rules_of(late) for r in g["rules"]}
    tests = {"rule_files": [str(write_rules(tmp_path, late))], "evaluation_interval": "1m",
             "tests": [case_pool_at_zero_with_work(ann)]}  # fmt: skip
    (tmp_path / "late.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = run_promtool("test", "rules", str(tmp_path / "late.test.yaml"))
    assert proc.returncode != 0 and "DecodebenchPoolStuckAtZero" in proc.stdout + proc.stderr


def _labels(selector: str) -> dict[str, str]:
    return dict((k.strip(), v.strip().strip('"')) for k, v in (p.split("=", 1) for p in selector.split(",")))


def test_alerts_can_be_disabled_and_carry_no_runbook_without_a_url():
    values = {
        **ALL_ON,
        "metrics": ALL_ON["metrics"]
        | {"prometheusRule": {"enabled": True, "disabled": {"DecodebenchServerThrottling": True}}},
    }
    rules = [r for g in rules_of(values) for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert "DecodebenchServerThrottling" not in names and "DecodebenchServerErrors" in names
    assert all("runbook_url" not in r["annotations"] and "team" not in r["labels"] for r in rules)


def test_a_typo_in_disabled_is_refused_by_the_schema():
    from tests.support.chart import render_error

    err = render_error({"metrics": {"prometheusRule": {"enabled": True, "disabled": {"DecodebenchQueueStuk": True}}}})
    assert "disabled" in err
