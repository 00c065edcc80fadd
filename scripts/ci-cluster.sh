#!/usr/bin/env bash
# The chart on a real cluster, stage by stage: what .github/workflows/cluster.yml runs (each of its
# steps is one stage here, so that the workflow holds no logic of its own and a developer with Docker
# and kind runs the same thing: `bash scripts/ci-cluster.sh all`). docs/deploy.md, "What CI proves".
#
#   build-images     the three images (controller, acl, worker on torch's CPU wheel), tagged ci
#   create-cluster   a kind cluster with Calico (a CNI that enforces NetworkPolicies), images loaded
#   install-deps     KEDA 2.13, prometheus-operator's CRDs, MinIO (the S3 server) and the Secrets
#   install          helm install --wait with scripts/ci/values.yaml (a CPU pool KEDA scales)
#   helm-test        helm test: doctor in the cluster, and doctor --api through the server with a token
#   first-sweep      the first sweep through the server, from the controller pod, to its report
#   upgrade          helm upgrade --wait with a changed value; the first sweep's results still read
#   pin-digests      (release) write the pushed images' digests into the chart's values.yaml:
#                    pin-digests CONTROLLER_DIGEST WORKER_DIGEST VLLM_DIGEST ACL_DIGEST [EXPORTER_DIGEST]
#
# Env: CLUSTER (kind cluster name, default decodebench-ci), NAMESPACE (default decodebench),
#      KEDA_VERSION (2.13.2), CALICO_VERSION (v3.28.2), PROM_CRDS_VERSION (chart version, 17.0.2)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-decodebench-ci}"
NAMESPACE="${NAMESPACE:-decodebench}"
RELEASE="${RELEASE:-db}"
KEDA_VERSION="${KEDA_VERSION:-2.13.2}"
CALICO_VERSION="${CALICO_VERSION:-v3.28.2}"
PROM_CRDS_VERSION="${PROM_CRDS_VERSION:-17.0.2}"
CHART=charts/decodebench
VALUES=scripts/ci/values.yaml
IMAGES=(decodebench-controller decodebench-acl decodebench-worker)

need() { for tool in "$@"; do command -v "$tool" >/dev/null || { echo "ci-cluster: $tool is required" >&2; exit 2; }; done; }
kc() { kubectl -n "${NAMESPACE}" "$@"; }

build_images() {
  need docker
  docker build -f Dockerfile.controller -t ghcr.io/decodebench/decodebench-controller:ci .
  docker build -f Dockerfile.controller --target acl -t ghcr.io/decodebench/decodebench-acl:ci .
  docker build -f Dockerfile.worker --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
    -t ghcr.io/decodebench/decodebench-worker:ci .
}

create_cluster() {
  need kind kubectl docker
  kind create cluster --name "${CLUSTER}" --config scripts/ci/kind.yaml --wait 0s
  # kindnet ignores NetworkPolicies: Calico enforces them, as the chart's policies are meant to be.
  kubectl apply -f "https://raw.githubusercontent.com/projectcalico/calico/${CALICO_VERSION}/manifests/calico.yaml"
  kubectl -n kube-system rollout status daemonset/calico-node --timeout=300s
  kubectl wait --for=condition=Ready nodes --all --timeout=300s
  for image in "${IMAGES[@]}"; do kind load docker-image --name "${CLUSTER}" "ghcr.io/decodebench/${image}:ci"; done
}

install_deps() {
  need helm kubectl
  helm repo add kedacore https://kedacore.github.io/charts
  helm repo add prometheus-community https://prometheus-community.github.io/helm-charts
  helm repo update
  helm install keda kedacore/keda --version "${KEDA_VERSION}" -n keda --create-namespace --wait
  helm install prometheus-operator-crds prometheus-community/prometheus-operator-crds --version "${PROM_CRDS_VERSION}" --wait
  kubectl create namespace "${NAMESPACE}" --dry-run=client -o yaml | kubectl apply -f -
  kubectl apply -f scripts/ci/minio.yaml
  kubectl -n minio rollout status deployment/minio --timeout=300s
  kc create secret generic minio-credentials --from-literal=AWS_ACCESS_KEY_ID=ci-access \
    --from-literal=AWS_SECRET_ACCESS_KEY=ci-secret-key --dry-run=client -o yaml | kubectl apply -f -
}

install() {
  need helm kubectl
  helm install "${RELEASE}" "${CHART}" -n "${NAMESPACE}" -f "${VALUES}" --wait --timeout 15m
  kc get pods -o wide
}

helm_test() {
  need helm
  helm test "${RELEASE}" -n "${NAMESPACE}" --logs --timeout 10m
}

first_sweep() {
  need kubectl
  local pod
  pod=$(kc get pods -l app.kubernetes.io/component=controller -o jsonpath='{.items[0].metadata.name}')
  # The same commands NOTES.txt prints: submit through the server, wait for the jobs, build the report.
  local out sweep
  out=$(kc exec "${pod}" -- decodebench submit /etc/decodebench-first-sweep/first-sweep.yaml)
  echo "${out}"
  sweep=$(echo "${out}" | sed -n 's/.*decodebench status \([0-9a-f]*\) --watch.*/\1/p' | head -n1)
  [ -n "${sweep}" ] || { echo "ci-cluster: no sweep id in the submit's output" >&2; exit 1; }
  echo "${sweep}" > .ci-first-sweep
  timeout 1800 kubectl -n "${NAMESPACE}" exec "${pod}" -- decodebench status "${sweep}" --watch
  kc exec "${pod}" -- decodebench report "${sweep}"
}

upgrade() {
  need helm kubectl
  helm upgrade "${RELEASE}" "${CHART}" -n "${NAMESPACE}" -f "${VALUES}" --set server.replicas=3 --wait --timeout 15m
  local pod
  pod=$(kc get pods -l app.kubernetes.io/component=controller -o jsonpath='{.items[0].metadata.name}')
  kc exec "${pod}" -- decodebench status "$(cat .ci-first-sweep)"  # the queue and the store survived the upgrade
  helm test "${RELEASE}" -n "${NAMESPACE}" --logs --timeout 10m
}

# The pushed images' digests into the chart's values (the release job), each under its repository.
pin_digests() {
  [ "$#" -ge 4 ] || { echo "usage: ci-cluster.sh pin-digests CONTROLLER WORKER VLLM ACL [EXPORTER]" >&2; exit 2; }
  python3 - "${CHART}/values.yaml" "$@" <<'PY'
import re, sys
path, *digests = sys.argv[1:]
repos = ["ghcr.io/decodebench/decodebench-controller", "ghcr.io/decodebench/decodebench-worker",
         "ghcr.io/decodebench/decodebench-worker-vllm", "ghcr.io/decodebench/decodebench-acl",
         "docker.io/oliver006/redis_exporter"]
text = open(path).read()
for repo, digest in zip(repos, digests):
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        sys.exit(f"pin-digests: {digest!r} is not a sha256 digest (for {repo})")
    pattern = re.compile(r"(repository: " + re.escape(repo) + r"\n(?:.*\n){0,4}?\s*digest: )\"[^\"]*\"")
    text, n = pattern.subn(lambda m: m.group(1) + f'"{digest}"', text, count=1)
    if n != 1:
        sys.exit(f"pin-digests: no digest line under repository {repo} in {path}")
open(path, "w").write(text)
PY
}

stage="${1:?usage: scripts/ci-cluster.sh build-images|create-cluster|install-deps|install|helm-test|first-sweep|upgrade|pin-digests|all}"
shift
case "${stage}" in
  build-images) build_images ;;
  create-cluster) create_cluster ;;
  install-deps) install_deps ;;
  install) install ;;
  helm-test) helm_test ;;
  first-sweep) first_sweep ;;
  upgrade) upgrade ;;
  pin-digests) pin_digests "$@" ;;
  all) build_images; create_cluster; install_deps; install; helm_test; first_sweep; upgrade ;;
  *) echo "ci-cluster: unknown stage ${stage}" >&2; exit 2 ;;
esac
