#!/usr/bin/env bash
# The README's test command: install everything, check the import contracts and the types
# (scripts/lint.sh --contracts), run the whole suite, then make sure no java, minio or toxiproxy
# process started from this checkout's cache outlived it.
#
# The suite runs in two parts (tests/conftest.py, --part): the pure tests (unit, property,
# fuzz: no Kafka, MinIO or Spark) on TIERPROXY_TEST_WORKERS pytest-xdist workers (default
# 2), then the shared part (tests/integration and anything using the session's Kafka,
# MinIO or Spark) in one process that starts them once, or with
# TIERPROXY_TEST_SHARED_WORKERS=N on N xdist workers (default 0: in one process; with 3
# the part took 35 min instead of 52, the 2 cores 96 % busy, and tests with tight time
# bounds failed: docs/devstack.md "Times"), in groups that must share a process
# (tests/support/schedule.py), all on one Kafka and one MinIO started here
# (proxy/devstack/shared.py) while the pure part runs. Arguments go to both runs, e.g.
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
shared_workers=${TIERPROXY_TEST_SHARED_WORKERS:-0}
# Test modules are compiled (and their asserts rewritten) once, not in every process.
unset PYTHONDONTWRITEBYTECODE
logs=$(mktemp -d "${TMPDIR:-/tmp}/tierproxy-test.XXXXXX")
services=""
stop_services() {
  if [ -n "$services" ]; then
    kill -TERM "$services" 2>/dev/null
    wait "$services" 2>/dev/null
    services=""
  fi
}
trap 'stop_services; rm -rf "$logs"' EXIT
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
# The shared part's Kafka and MinIO start while the pure part runs (unless external ones
# are named, tests/conftest.py): TIERPROXY_TEST_SERVICES tells its workers where they are.
if [ "$shared_workers" -gt 0 ] && [ -z "${TIERPROXY_TEST_BOOTSTRAP:-}${TIERPROXY_TEST_SERVICES:-}" ]; then
  .venv/bin/python -m proxy.devstack.shared "$logs/services.json" >"$logs/services.log" 2>&1 &
  services=$!
fi
.venv/bin/python -m pytest --part pure -n "$workers" --dist worksteal "${color[@]}" \
  --junitxml="$cache/test-times/pure.xml" "$@" | tee "$logs/pure"
pure=${PIPESTATUS[0]}
shared=$pure  # interrupted (2), an internal (3) or usage error (4): no second run
if [ "$pure" = 0 ] || [ "$pure" = 1 ] || [ "$pure" = 5 ]; then
  spread=()
  if [ "$shared_workers" -gt 0 ]; then
    spread=(-n "$shared_workers" --dist loadscope)
  fi
  if [ -n "$services" ]; then
    for _ in $(seq 600); do  # Kafka's start takes 10-30 s; give up after 5 min
      [ -s "$logs/services.json" ] || ! kill -0 "$services" 2>/dev/null && break
      sleep 0.5
    done
    if [ -s "$logs/services.json" ]; then
      export TIERPROXY_TEST_SERVICES="$logs/services.json"
    else
      echo "[test] the shared Kafka and MinIO did not start; each worker starts its own:" >&2
      tail -30 "$logs/services.log" >&2
      stop_services
    fi
  fi
  .venv/bin/python -m pytest --part shared "${spread[@]}" "${color[@]}" \
    --junitxml="$cache/test-times/shared.xml" "$@" | tee "$logs/shared"
  shared=${PIPESTATUS[0]}
fi
stop_services
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

echo "[test] pure part ($workers workers): exit $pure; shared part ($shared_workers workers): exit $shared; suite took ${took}s"
.venv/bin/python scripts/test_summary.py "$took" "$logs/pure" "$logs/shared"
exit $status
