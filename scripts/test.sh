#!/usr/bin/env bash
# The README's test command: install everything, check the import contracts and the types
# (scripts/lint.sh --contracts), run the whole suite, then make sure no java, minio or toxiproxy
# process started from this checkout's cache outlived it.
#
# The suite runs in two parts (tests/conftest.py, --part): the pure tests (unit, property,
# fuzz: no Kafka, MinIO or Spark) on TIERPROXY_TEST_WORKERS pytest-xdist workers (default
# 2), then the shared part (tests/integration and anything using the session's Kafka,
# MinIO or Spark) in one process that starts them once. Arguments go to both runs, e.g.
# `make test ARGS="tests/unit -k wal"`; a part that the arguments leave empty is skipped
# (pytest's exit 5), so only when neither part has a test is the exit 5. The output ends
# with a summary of both parts in pytest's format; the exit code is the first failing
# part's (0 when both pass).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --minio --toxiproxy || exit $?
# The import contracts and mypy first: seconds, and a broken one fails before the suite.
scripts/lint.sh --contracts || { echo "[test] not running the tests: fix the above first" >&2; exit 1; }
cache=${TIERPROXY_CACHE:-$PWD/.cache}
workers=${TIERPROXY_TEST_WORKERS:-2}
# Test modules are compiled (and their asserts rewritten) once, not in every process.
unset PYTHONDONTWRITEBYTECODE
logs=$(mktemp -d "${TMPDIR:-/tmp}/tierproxy-test.XXXXXX")
trap 'rm -rf "$logs"' EXIT
color=()
[ -t 1 ] && color=(--color=yes)
# Each test's time, for finding what makes the suite slow: .cache/test-times/*.xml
mkdir -p "$cache/test-times"

start=$(date +%s)
# Every process the suite starts inherits this mark (see the leftover check below).
export TIERPROXY_SUITE_RUN="suite-$$-$start"
# A test stuck past its timeout where pytest-timeout cannot stop it ends its process, with
# every thread's stack in these files (tests/conftest.py, pytest_runtest_protocol).
export TIERPROXY_HANG_LOG="$logs/hang"
.venv/bin/python -m pytest --part pure -n "$workers" --dist worksteal "${color[@]}" \
  --junitxml="$cache/test-times/pure.xml" "$@" | tee "$logs/pure"
pure=${PIPESTATUS[0]}
shared=$pure  # interrupted (2), an internal (3) or usage error (4): no second run
if [ "$pure" = 0 ] || [ "$pure" = 1 ] || [ "$pure" = 5 ]; then
  .venv/bin/python -m pytest --part shared "${color[@]}" \
    --junitxml="$cache/test-times/shared.xml" "$@" | tee "$logs/shared"
  shared=${PIPESTATUS[0]}
fi
took=$(( $(date +%s) - start ))
for hang in "$logs"/hang.*; do
  if [ -s "$hang" ]; then
    echo "[test] a test hung and its pytest process was ended: $(head -1 "$hang")" >&2
    tail -n +2 "$hang" >&2
  fi
done

# Only what this run started (it inherited TIERPROXY_SUITE_RUN): a `make run` or another
# checkout's services using the same cache are not the suite's to kill.
leftover=$(for pid in $(pgrep -f -- "$cache/(kafka-|bin/minio|bin/toxiproxy-server)"); do
  grep -qzx "TIERPROXY_SUITE_RUN=$TIERPROXY_SUITE_RUN" "/proc/$pid/environ" 2>/dev/null && echo "$pid"
done)
if [ -n "$leftover" ]; then
  echo "[test] processes left behind by the suite (killing them):" >&2
  ps -o pid,args -p "$(echo "$leftover" | paste -sd,)" >&2 || true
  kill -9 $leftover 2>/dev/null || true
fi

status=0
for part in "$pure" "$shared"; do
  if [ "$part" != 0 ] && [ "$part" != 5 ] && [ "$status" = 0 ]; then status=$part; fi
done
if [ "$pure" = 5 ] && [ "$shared" = 5 ]; then status=5; fi
if [ -n "$leftover" ] && [ "$status" = 0 ]; then status=1; fi

echo "[test] pure part ($workers workers): exit $pure; shared part: exit $shared; suite took ${took}s"
.venv/bin/python scripts/test_summary.py "$took" "$logs/pure" "$logs/shared"
exit $status
