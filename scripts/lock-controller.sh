#!/usr/bin/env bash
# Regenerate the controller image's locks (Dockerfile.controller), for its Python 3.12 (the worker
# image's) on x86_64 Linux, every package pinned with its sha256 hashes:
#   requirements/controller.lock.txt  the project's dependencies (no extra): the controller image
#   requirements/acl.lock.txt         the few `decodebench tenants acl` imports, at the same pins:
#                                     the light image of Redis's ACL init container (target `acl`)
# Re-run it whenever pyproject.toml's dependencies change (tests/repo/test_dockerfiles.py says when), after
# scripts/lock-worker.sh: the packages both images hold take the worker lock's versions.
#
# Usage: scripts/lock-controller.sh     (needs uv: pip install uv, or UV=/path/to/uv; PyPI access)
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-$(command -v uv || echo .tools/uv/bin/uv)}"
common=(--generate-hashes --python-version 3.12 --python-platform x86_64-manylinux_2_28)
pins() { sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' "$1"; }
acl_in=$(mktemp --suffix=.in)
constraints=$(mktemp --suffix=.txt)
trap 'rm -f "${acl_in}" "${constraints}"' EXIT
# The packages both images hold (rq, redis, pydantic, ...) at the worker lock's versions: the
# controller and the workers share RQ's data in Redis. A new dependency is resolved freely.
pins requirements/worker.lock.txt > "${constraints}"
"${uv}" pip compile pyproject.toml --constraint "${constraints}" "${common[@]}" \
  --custom-compile-command scripts/lock-controller.sh -o requirements/controller.lock.txt
sed -i '/^    #   -c /d' requirements/controller.lock.txt  # the temporary constraints file's name
# What `decodebench tenants acl` imports (tests/repo/test_dockerfiles.py runs it with nothing else),
# at the controller lock's versions.
printf '%s\n' click pydantic pyyaml structlog > "${acl_in}"
pins requirements/controller.lock.txt > "${constraints}"
"${uv}" pip compile "${acl_in}" --constraint "${constraints}" "${common[@]}" --no-annotate \
  --custom-compile-command scripts/lock-controller.sh -o requirements/acl.lock.txt
