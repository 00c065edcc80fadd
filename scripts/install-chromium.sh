#!/usr/bin/env bash
# Install headless Chromium (Debian package `chromium`) for the HTML report's browser test, and
# poppler's pdftotext and pdfinfo (package `poppler-utils`), with which the print test reads its PDFs.
#
# Idempotent: when a working chromium is already on PATH (or CHROMIUM names one) and pdftotext
# is there, nothing is installed. Prints the browser's path on stdout.
#
# Usage: scripts/install-chromium.sh
# Env:   CHROMIUM   path of a browser to use instead (checked, never installed)
set -euo pipefail

works() { "$1" --version >/dev/null 2>&1; }

for candidate in "${CHROMIUM:-}" chromium chromium-browser google-chrome; do
  [[ -n "${candidate}" ]] || continue
  path="$(command -v "${candidate}" 2>/dev/null || true)"
  if [[ -n "${path}" ]] && works "${path}" && command -v pdftotext >/dev/null 2>&1; then
    echo "${path}"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no chromium on PATH and no apt-get; install Chromium and set CHROMIUM" >&2
  exit 1
fi
sudo=""
if [[ "$(id -u)" != "0" ]]; then
  sudo="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when the package is not known yet.
if ! apt-cache show chromium poppler-utils >/dev/null 2>&1; then
  ${sudo} apt-get update -qq >&2
fi
${sudo} apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core poppler-utils >&2

path="$(command -v chromium)"
"${path}" --version >&2
echo "${path}"
