#!/usr/bin/env bash
# The README's test command: install everything, run the whole suite, then make sure no
# java or minio process started from this checkout's cache outlived it.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --minio || exit $?
cache=${TIERPROXY_CACHE:-$PWD/.cache}
start=$(date +%s)
.venv/bin/python -m pytest "$@"
status=$?
echo "[test] suite took $(( $(date +%s) - start ))s"
leftover=$(pgrep -f -- "$cache/(kafka-|bin/minio)" || true)
if [ -n "$leftover" ]; then
  echo "[test] processes left behind by the suite (killing them):" >&2
  ps -o pid,args -p "$(echo "$leftover" | paste -sd,)" >&2 || true
  kill -9 $leftover 2>/dev/null || true
  [ "$status" = 0 ] && status=1
fi
exit $status
