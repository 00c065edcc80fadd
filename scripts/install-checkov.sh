#!/usr/bin/env bash
# Install checkov (PyPI) into its own virtualenv, .tools/checkov, and print the path of its binary.
#
# Its own virtualenv because checkov pins many packages (boto3, networkx, packaging) to versions
# older than the project's: in the project's .venv it would downgrade them. Idempotent.
#
# Usage: scripts/install-checkov.sh      Env: PYTHON (default: .venv/bin/python, else python3),
#                                             CHECKOV_VERSION (default: 3.3.30)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${repo_root}/.tools/checkov"
version="${CHECKOV_VERSION:-3.3.30}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "${repo_root}/.venv/bin/python" ]]; then PYTHON="${repo_root}/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -x "${venv}/bin/checkov" ]] && "${venv}/bin/checkov" --version >/dev/null 2>&1; then
  echo "${venv}/bin/checkov"
  exit 0
fi
"${PYTHON}" -m venv "${venv}"
"${venv}/bin/pip" install --quiet "checkov==${version}" >&2
echo "${venv}/bin/checkov"
