# Sourced by scripts/install.sh and scripts/setup-vllm.sh: `installer VENV uv|pip` defines `install` and
# `uninstall` (pip's arguments) for VENV. uv (PyPI's `uv`, pip-installed into VENV where none is on the
# PATH) reads none of pip's configuration, so it is given pip's sources: the find-links, index, extra
# indexes and constraints that `pip config list` shows (pip.conf files and PIP_* variables; the CPU torch
# wheel comes from there), chosen among as pip does (UV_INDEX_STRATEGY=unsafe-best-match). Sets UV.
UV_PKG="${UV_PKG:-uv==0.13.9}"

# pip's sources as uv's variables: global < user < site < environment, as pip ranks them.
pip_sources_for_uv() {
  "$1/bin/pip" config list 2>/dev/null | "$1/bin/python" -c '
import shlex, sys
rank = {"global": 0, "user": 1, "site": 2, ":env:": 3}
best = {}
for line in sys.stdin:
    name, _, value = line.strip().partition("=")
    scope, _, key = name.rpartition(".")
    r = rank.get(scope, 0)
    if value and r >= best.get(key, (-1, ""))[0]:
        best[key] = (r, value.strip("\x27\""))
names = {"index-url": "UV_DEFAULT_INDEX", "extra-index-url": "UV_INDEX", "find-links": "UV_FIND_LINKS",
         "constraint": "UV_CONSTRAINT", "cert": "SSL_CERT_FILE"}
for key, var in names.items():
    if key in best:  # pip separates a list by whitespace; uv its find-links by commas
        value = ",".join(best[key][1].split()) if var == "UV_FIND_LINKS" else best[key][1]
        print(f"export {var}={shlex.quote(value)}")
'
}

use_uv() {
  UV="${UV:-$(command -v uv || true)}"
  if [ -z "$UV" ]; then
    "$1/bin/pip" install -q --disable-pip-version-check "$UV_PKG" 2>&1 | grep -v "^WARNING: Location" >&2 || true
    UV="$1/bin/uv"
  fi
  [ -x "$UV" ] || { echo "uv: could not install $UV_PKG into $1 (INSTALLER=pip installs with pip)" >&2; return 1; }
  eval "$(pip_sources_for_uv "$1")"
  export UV_INDEX_STRATEGY=unsafe-best-match
  # Bytecode at install, as pip does: uv writes none by default, and where PYTHONDONTWRITEBYTECODE=1 (this
  # machine, CI) Python writes none either, so every process compiled torch and transformers again (each
  # `decodebench` the tests spawn took ~7 s more; the suite 744 s against 523 s; docs/performance.md).
  export UV_COMPILE_BYTECODE=1
}

installer() {
  if [ "$2" = uv ]; then
    use_uv "$1"
    install() { "$UV" pip install -q --python "$VENV_PY" "$@"; }
    uninstall() { "$UV" pip uninstall -q --python "$VENV_PY" "$@"; }
  else
    "$1/bin/pip" install -q --upgrade pip
    install() { "$VENV_PIP" install -q "$@"; }
    uninstall() { "$VENV_PIP" uninstall -q -y "$@"; }
  fi
  VENV_PY="$1/bin/python" VENV_PIP="$1/bin/pip"
}
