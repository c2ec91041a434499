#!/usr/bin/env bash
# `make test`'s pytest run. The test control plane (scripts/envtest.sh) takes about 8 minutes of CPU to
# build from an empty cache, while most of the suite waits on sockets rather than computes. So when the
# control plane is not built yet, it is built in the background at the lowest CPU priority while the tests
# that do not need it run; the tests that do (those using the `control_plane` fixture, marked `envtest` by
# tests/conftest.py) run once it is there. With the control plane built, or with PYTEST_ARGS given, it is
# one pytest run.
#
#   scripts/test.sh [pytest args]     PYTEST_WORKERS (default 2; 0 = one process), CACHE as in the Makefile
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CACHE="${CACHE:-$HOME/.cache/fleetmq}"
pytest=(.venv/bin/pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=20)

if (($#)) || bash scripts/envtest.sh --check; then
  bash scripts/envtest.sh >/dev/null
  exec "${pytest[@]}" "$@"
fi

log="$CACHE/envtest/build.log"
mkdir -p "$CACHE/envtest"
echo "test: building the control plane in the background (log: $log) while the tests without it run" >&2
setsid nice -n 19 bash scripts/envtest.sh >"$log" 2>&1 & # own process group: stopped with its Go build
build=$!
trap 'kill -- "-$build" 2>/dev/null || true' EXIT

first=0
"${pytest[@]}" -m "not envtest" || first=$?
# 5: nothing collected, which a whole suite never is; any other status is a failure to report
if ! wait "$build"; then
  cat "$log" >&2
  echo "test: building the control plane failed" >&2
  exit 1
fi
trap - EXIT
second=0
"${pytest[@]}" -m envtest || second=$?
echo "test: tests without the control plane exited $first, with it $second" >&2
((first == 0 && second == 0)) || exit $((first ? first : second))
