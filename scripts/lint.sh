#!/usr/bin/env bash
# `make lint`: ruff (style), then the architecture's contracts (import-linter) and the types
# (mypy), both configured in pyproject.toml (docs/ARCHITECTURE.md, "Contracts").
# `scripts/lint.sh --contracts` runs only the last two: scripts/test.sh does, before the
# suite, so a broken contract fails in seconds rather than after the tests.
# Caches: .import_linter_cache/ and .mypy_cache/ in the checkout (ignored); warm, both
# checks take a few seconds, the first mypy run about a minute.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's proxy/, whatever is installed
[ $# = 0 ] || [ "$*" = --contracts ] || { echo "usage: scripts/lint.sh [--contracts]" >&2; exit 2; }
fail() { echo "[lint] $1 (docs/ARCHITECTURE.md, \"Contracts\")" >&2; exit 1; }

if [ $# = 0 ]; then
  .venv/bin/ruff check . || fail "ruff check failed"
  .venv/bin/ruff format --check . || fail "ruff format --check failed: run .venv/bin/ruff format ."
fi
out=$(.venv/bin/lint-imports --no-logo 2>&1) || {
  echo "$out" >&2
  fail "an import contract is broken (above): the import graph must follow the layers"
}
echo "[lint] import contracts kept"
.venv/bin/mypy || fail "mypy found type errors (above)"
