"""The submission server in the chart (docs/deploy.md, "The submission server"): a Deployment that
serves on 8080 with health and readiness probes, a Service, a PodDisruptionBudget; its tokens file
and the signing key as Secret files (the key also in every worker pool, nowhere else); a generated
single-team token whose tokens.yaml holds only its sha256, both kept across upgrades.
"""

from __future__ import annotations

import base64
import hashlib

import yaml

from tests.support.chart import VALUES_BY_NAME, env_of, find, pod_specs, render, workers


def server(docs) -> dict:
    (dep,) = find(docs, "Deployment", "db-decodebench-server")
    return dep


def mounted_secret(spec: dict, container: dict, path: str) -> dict:
    """The Secret volume behind a file path of the container: {secretName, items}."""
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert "subPath" not in mount  # a changed Secret reaches the file
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]


def test_server_deployment_service_and_disruption_budget():
    docs = render(None)
    dep = server(docs)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8080"] and "decodebench-controller" in c["image"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080}]
    assert spec["automountServiceAccountToken"] is False
    env = env_of(c)
    assert env["DECODEBENCH_REDIS_URL"]["value"] == "redis://db-decodebench-redis.ml.svc:6379/0"
    assert env["DECODEBENCH_STORE"]["value"] == "s3://decodebench/runs"
    tokens = env["DECODEBENCH_TOKENS_FILE"]["value"]
    assert tokens == "/etc/decodebench-tokens/tokens.yaml"
    assert mounted_secret(spec, c, tokens)["secretName"] == "db-decodebench-server-tokens"
    signing = env["DECODEBENCH_SIGNING_KEY_FILE"]["value"]
    assert signing == "/etc/decodebench-signing/key"
    assert mounted_secret(spec, c, signing) == {
        "secretName": "db-decodebench-signing-key",
        "defaultMode": 0o440,
        "items": [{"key": "key", "path": "key"}],
    }
    (svc,) = find(docs, "Service", "db-decodebench-server")
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http"}
    ]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    (pdb,) = find(docs, "PodDisruptionBudget", "db-decodebench-server")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert server(render(None, {"server": {"replicas": 3}}))["spec"]["replicas"] == 3


def test_the_signing_key_reaches_the_server_and_the_workers_only():
    docs = render(VALUES_BY_NAME["gpu-two-pools"])
    holders = set()
    for name, spec in pod_specs(docs):
        if any(v.get("secret", {}).get("secretName") == "db-decodebench-signing-key" for v in spec["volumes"]):
            holders.add(name)
            c = spec["containers"][0]
            assert mounted_secret(spec, c, env_of(c)["DECODEBENCH_SIGNING_KEY_FILE"]["value"])
    pools = {d["metadata"]["name"] for d in workers(docs).values()}
    assert holders == {"db-decodebench-server", *pools}
    existing = render(None, {"signingKey": {"existingSecret": "my-signing"}})
    assert "db-decodebench-signing-key" not in {s["metadata"]["name"] for s in find(existing, "Secret")}
    spec = server(existing)["spec"]["template"]["spec"]
    assert mounted_secret(spec, spec["containers"][0], "/etc/decodebench-signing/key")["secretName"] == "my-signing"


def test_single_team_token_is_generated_and_tokens_yaml_holds_only_its_hash():
    docs = render(None)
    secrets = {s["metadata"]["name"]: s for s in find(docs, "Secret")}
    tokens = secrets["db-decodebench-server-tokens"]
    token = base64.b64decode(tokens["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    assert yaml.safe_load(base64.b64decode(tokens["data"]["tokens.yaml"])) == {
        "tokens": [{"id": "default", "tenant": "default", "sha256": hashlib.sha256(token.encode()).hexdigest()}]
    }
    key = base64.b64decode(secrets["db-decodebench-signing-key"]["data"]["key"]).decode()
    assert len(key) == 64
    for s in (tokens, secrets["db-decodebench-signing-key"]):  # kept on uninstall; `lookup` keeps them on upgrade
        assert s["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    # The server reads tokens.yaml only; the controller pod the token only.
    spec = server(docs)["spec"]["template"]["spec"]
    assert mounted_secret(spec, spec["containers"][0], "/etc/decodebench-tokens/tokens.yaml")["items"] == [
        {"key": "tokens.yaml", "path": "tokens.yaml"}
    ]
    # Real teams bring their own tokens file: nothing generated.
    own = render(None, {"server": {"tokens": {"existingSecret": "team-tokens"}}})
    assert "db-decodebench-server-tokens" not in {s["metadata"]["name"] for s in find(own, "Secret")}


def test_server_is_reachable_from_its_namespace_and_the_allowed_peers():
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
    docs = render(None, {"server": {"allowedFrom": [peer]}})
    (policy,) = find(docs, "NetworkPolicy", "db-decodebench-server")
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}, peer], "ports": [{"protocol": "TCP", "port": 8080}]}
    ]
    (redis_policy,) = find(docs, "NetworkPolicy", "db-decodebench-redis")
    (expr,) = redis_policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert expr == {"key": "app.kubernetes.io/component", "operator": "In", "values": ["server", "worker", "test"]}


def test_helm_test_goes_through_the_server_with_a_token():
    """`helm test` runs doctor --api against the server's Service as a tenant's CLI does (helmTest.api)."""
    docs = render(None)
    (pod,) = find(docs, "Pod", "db-decodebench-doctor-api")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["args"] == ["doctor", "--api", "http://db-decodebench-server:8080"]
    env = env_of(c)
    assert env["DECODEBENCH_TOKEN_FILE"]["value"] == "/run/secrets/decodebench-token/token"
    assert "DECODEBENCH_REDIS_URL" not in env  # a tenant's view: no Redis credentials
    assert mounted_secret(pod["spec"], c, "/run/secrets/decodebench-token/token")["secretName"] == (
        "db-decodebench-server-tokens"  # the generated single-team token
    )
    (policy,) = find(docs, "NetworkPolicy", "db-decodebench-test-api")
    assert policy["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    mine = render(None, {"helmTest": {"tokenSecret": "ops-token"}})
    (pod,) = find(mine, "Pod", "db-decodebench-doctor-api")
    (c,) = pod["spec"]["containers"]
    assert mounted_secret(pod["spec"], c, "/run/secrets/decodebench-token/token")["secretName"] == "ops-token"
    assert not find(render(None, {"helmTest": {"api": False}}), "Pod", "db-decodebench-doctor-api")


def test_tls_at_the_door_ingress_and_the_servers_own_https():
    values = {
        "server": {
            "tls": {"existingSecret": "server-tls"},
            "ingress": {
                "enabled": True,
                "host": "decodebench.example.com",
                "className": "nginx",
                "tls": {"certManager": {"issuer": "letsencrypt"}},
            },  # fmt: skip
        }
    }
    docs = render(values)
    (ing,) = find(docs, "Ingress", "db-decodebench-server")
    assert ing["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    assert ing["spec"]["tls"] == [{"hosts": ["decodebench.example.com"], "secretName": "db-decodebench-server-tls"}]
    assert ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {
        "name": "db-decodebench-server", "port": {"name": "http"}}  # fmt: skip
    spec = server(docs)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = env_of(c)
    assert mounted_secret(spec, c, env["DECODEBENCH_TLS_CERT_FILE"]["value"])["secretName"] == "server-tls"
    assert mounted_secret(spec, c, env["DECODEBENCH_TLS_KEY_FILE"]["value"])["secretName"] == "server-tls"
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS" and c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for name in ("db-decodebench-controller", "db-decodebench-doctor-api"):
        (spec,) = [s for n, s in pod_specs(docs) if n == name]
        (c,) = spec["containers"]
        env = env_of(c)
        assert env["DECODEBENCH_API_URL"]["value"] == "https://db-decodebench-server.ml.svc:8080"
        ca = mounted_secret(spec, c, env["DECODEBENCH_CA_BUNDLE"]["value"])
        assert ca["secretName"] == "server-tls" and ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    from tests.support.chart import render_error

    assert "server.ingress.host" in render_error({"server": {"ingress": {"enabled": True}}})
    no_tls = {"server": {"ingress": {"enabled": True, "host": "decodebench.example.com"}}}
    assert "bearer tokens must not cross the door in clear" in render_error(no_tls)


def test_an_external_rediss_redis_is_verified_with_its_ca_everywhere():
    external = {"url": "rediss://redis.example.com:6380/0", "caSecret": "redis-ca"}
    values = {
        "redis": {"enabled": False, "external": external, "auth": {"existingSecret": "redis-auth"}},
        "worker": {"pools": [{"name": "gpu", "queues": ["default"], "autoscaling": {"enabled": True}}]},
    }
    docs = render(values)
    clients = 0
    for _, spec in pod_specs(docs):
        for c in spec["containers"]:
            env = env_of(c)
            if "DECODEBENCH_REDIS_URL" in env:
                clients += 1
                assert env["DECODEBENCH_REDIS_URL"]["value"].startswith("rediss://redis.example.com:6380/")
                assert mounted_secret(spec, c, env["DECODEBENCH_REDIS_CA_FILE"]["value"])["secretName"] == "redis-ca"
    assert clients >= 3  # server, workers, helm test's doctor
    (auth,) = find(docs, "TriggerAuthentication")
    assert {"parameter": "ca", "name": "redis-ca", "key": "ca.crt"} in auth["spec"]["secretTargetRef"]
    (so,) = find(docs, "ScaledObject")
    assert all(t["metadata"]["enableTLS"] == "true" for t in so["spec"]["triggers"])
