#!/usr/bin/env bash
# `make test` after its set-up (the venv, the Debian packages): the static checks and every test.
#
# From an empty cache, what the tests need takes minutes of CPU to build (the test control plane,
# scripts/envtest.sh, about 8; helm, scripts/tools.sh, about 2; cert-manager's controllers,
# scripts/certmanager.sh), while most of the suite waits on sockets
# rather than computes. So when those are not built yet, three things run side by side:
#   - the builds at the lowest CPU priority, then the tests that need them (those using the `control_plane`
#     or `helm` fixtures, marked `envtest` or `helm` by tests/conftest.py) in a pytest of their own;
#   - the type check and the import contracts (`make typecheck contracts`);
#   - every other test.
# With everything built, or with PYTEST_ARGS given, it is the checks and then one pytest run.
#
# The tests needing the builds each start a control plane and mostly wait on it, so they run in twice as
# many processes as the others (234 of them: 366 s in 2, 254 s in 4, on 2 cores).
#
#   scripts/test.sh [pytest args]     PYTEST_WORKERS (default 2; 0 = one process), CACHE as in the Makefile
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CACHE="${CACHE:-$HOME/.cache/fleetmq}"
workers="${PYTEST_WORKERS:-2}"
pytest=(.venv/bin/pytest -q -p no:cacheprovider --dist loadfile --durations=20)
BUILT="envtest or helm" # the marks of the tests that need the builds

built() {
  bash scripts/envtest.sh --check && [[ -x "$(bash scripts/tools.sh --path helm)" ]] &&
    bash scripts/certmanager.sh --check
}
build() {
  bash scripts/envtest.sh >/dev/null && bash scripts/tools.sh helm >/dev/null &&
    bash scripts/certmanager.sh >/dev/null
}

if [[ "${1:-}" == "--after-builds" ]]; then # (internal) the builds, then the tests that need them
  nice -n 19 bash -c "$(declare -f build); build" || exit 90
  exec "${pytest[@]}" -n "$2" -m "$BUILT"
fi

if (($#)) || built; then
  build
  make -s typecheck contracts
  exec "${pytest[@]}" -n "$workers" "$@"
fi

mkdir -p "$CACHE/test"
later_log="$CACHE/test/after-builds.log" checks_log="$CACHE/test/checks.log"
echo "test: building the control plane and helm in the background; the tests needing them run once they are" \
  "built (log: $later_log), beside the others" >&2
# own process groups (setsid), so that stopping them stops their Go builds and pytest workers too
setsid bash scripts/test.sh --after-builds "$((workers * 2))" >"$later_log" 2>&1 &
later=$!
setsid make -s typecheck contracts >"$checks_log" 2>&1 &
checks=$!
trap 'kill -- "-$later" "-$checks" 2>/dev/null || true' EXIT

first=0
"${pytest[@]}" -n "$workers" -m "not ($BUILT)" || first=$?
check=0
wait "$checks" || check=$?
second=0
wait "$later" || second=$?
trap - EXIT
cat "$checks_log" >&2
cat "$later_log"
if ((second == 90)); then
  echo "test: building the control plane or helm failed (above)" >&2
fi
echo "test: type check and contracts exited $check; tests without the builds $first, with them $second" >&2
((check == 0 && first == 0 && second == 0)) || exit 1
