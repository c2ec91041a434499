#!/usr/bin/env bash
# The previous release (e2e/previous-release) for the upgrade test: its tree exported from git into
# $CACHE/previous/<commit> (its chart is installed from there) and its broker image built by its own
# scripts/image.sh from its own Dockerfile, saved for the node. Prints the tree, then the image archive.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
read -r version commit < <(grep -v '^#' "$ROOT/e2e/previous-release")
tree="$CACHE/previous/$commit"
if [[ ! -f "$tree/.complete" ]]; then
  git -C "$ROOT" cat-file -e "$commit^{commit}" 2>/dev/null ||
    { echo "previous: commit $commit ($version) is not in this clone's history (a shallow clone?)" >&2; exit 1; }
  rm -rf "$tree"
  mkdir -p "$tree"
  git -C "$ROOT" archive "$commit" | tar -x -C "$tree"
  touch "$tree/.complete"
fi
got="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$tree/pyproject.toml" | head -1)"
[[ "$got" == "$version" ]] || { echo "previous: $commit is version $got, not $version" >&2; exit 1; }
echo "$tree"
IMAGE_SAVE="$CACHE/images/archives" CACHE="$CACHE" bash "$tree/scripts/image.sh" broker
