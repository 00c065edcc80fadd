"""A Kubernetes API stand-in for `decodebench cluster` (tests/unit/controller/ops/test_cluster.py): a real HTTP
server on loopback serving the paths the commands call (pods, Deployments, deployments/scale of one namespace),
holding the Deployments the chart renders and pods made from their templates."""

from __future__ import annotations

import copy
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from tests.support.chart import render, workers

NS = "ml"


class KubeStandIn:
    """Serves pods, Deployments and deployments/scale of one namespace; records every request."""

    def __init__(self):
        self.deployments: dict[str, dict] = {}
        self.pods: list[dict] = []
        self.forbidden: set[tuple[str, str]] = set()  # (method, resource), e.g. ("PATCH", "deployments/scale")
        self.requests: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def add_release(self, values, release: str = "db", pods: dict[str, list[dict]] | None = None) -> None:
        """The release's worker Deployments as the chart renders them; `pods` gives each pool's pod states."""
        for pool, dep in workers(render(values, release=release, namespace=NS)).items():
            dep["metadata"]["namespace"] = NS
            states = (pods or {}).get(pool, [])
            dep["status"] = {"replicas": len(states), "readyReplicas": sum(s.get("ready", True) for s in states)}
            self.deployments[dep["metadata"]["name"]] = dep
            for i, state in enumerate(states):
                self.pods.append(make_pod(dep, f"{dep['metadata']['name']}-7d9c6b5f4-{i:05d}", **state))

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                self._serve("GET")

            def do_PATCH(self):
                self._serve("PATCH")

            def _serve(self, method):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stand_in.requests.append(
                    {
                        "method": method,
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "content_type": self.headers.get("Content-Type"),
                        "body": body,
                        "auth": self.headers.get("Authorization"),
                    }
                )
                code, doc = stand_in.answer(method, url.path, parse_qs(url.query), body)
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def answer(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        # /api/v1/namespaces/ml/pods, /apis/apps/v1/namespaces/ml/deployments[/NAME/scale]
        ns, rest = (parts[3], parts[4:]) if parts[0] == "api" else (parts[4], parts[5:])
        resource = rest[0] + ("/" + rest[2] if len(rest) == 3 else "")
        if (method, resource) in self.forbidden:
            verb = {"GET": "list", "PATCH": "patch"}[method]
            user = f"system:serviceaccount:{ns}:db-decodebench-controller"
            return 403, status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "{user}" cannot {verb} resource "{resource}" in the namespace "{ns}"',
            )
        terms = label_terms(query.get("labelSelector", [""])[0])

        def selected(obj):
            labels = obj["metadata"]["labels"]
            return obj["metadata"].get("namespace") == ns and all(labels.get(k) in allowed for k, allowed in terms)

        if method == "GET" and rest == ["pods"]:
            return 200, {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {},
                "items": [p for p in self.pods if selected(p)],
            }
        if method == "GET" and rest == ["deployments"]:
            return 200, {
                "kind": "DeploymentList",
                "apiVersion": "apps/v1",
                "metadata": {},
                "items": [d for d in self.deployments.values() if selected(d)],
            }
        if method == "PATCH" and len(rest) == 3 and rest[0] == "deployments" and rest[2] == "scale":
            dep = self.deployments.get(rest[1])
            if dep is None or dep["metadata"]["namespace"] != ns:
                return 404, status(404, "NotFound", f'deployments.apps "{rest[1]}" not found')
            dep["spec"]["replicas"] = body["spec"]["replicas"]
            return 200, {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {"name": rest[1], "namespace": ns},
                "spec": {"replicas": dep["spec"]["replicas"]},
                "status": {"replicas": dep["status"]["replicas"]},
            }
        return 404, status(404, "NotFound", f"the server could not find the requested resource ({path})")


def label_terms(selector: str) -> list[tuple[str, set[str]]]:
    """A label selector's terms as the API server reads them: `k=v` and set-based `k in (a,b)`."""
    terms = []
    for m in re.finditer(r"([\w./-]+)\s+in\s+\(([^)]*)\)|([\w./-]+)=([^,]*)", selector):
        if m.group(1):
            terms.append((m.group(1), {v.strip() for v in m.group(2).split(",")}))
        else:
            terms.append((m.group(3), {m.group(4)}))
    return terms


def status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def make_pod(
    dep: dict,
    name: str,
    ready: bool = True,
    waiting: str | None = None,
    restarts: int = 0,
    node: str | None = "gpu-node-1",
) -> dict:
    """A pod of the Deployment, from its template, in the state a kubelet would report."""
    template = copy.deepcopy(dep["spec"]["template"])
    phase = "Running" if node else "Pending"
    container = {
        "name": "worker",
        "ready": ready,
        "restartCount": restarts,
        "image": "x",
        "imageID": "",
        "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": dep["metadata"]["namespace"], **template["metadata"]},
        "spec": {**template["spec"], **({"nodeName": node} if node else {})},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": str(ready)},
                {"type": "PodScheduled", "status": str(bool(node)), **({} if node else {"reason": "Unschedulable"})},
            ],
            "containerStatuses": [container] if node else [],
        },
    }
