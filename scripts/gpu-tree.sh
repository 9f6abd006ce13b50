#!/usr/bin/env bash
# Makes the working tree small enough to travel to the GPU machine beside .gpu-bundle/, and back.
#   bash scripts/gpu-tree.sh slim      (before the device calls)
#   bash scripts/gpu-tree.sh restore   (right after them; before any commit)
# The device call sends the tracked and untracked-not-ignored files with the carried bundle, 64 MiB
# in all, counted in disk blocks: the bundle (~63 MiB) leaves ~2.3 MB, and the tree is ~3 MB.
# The GPU benchmarks need only the packages (compiler/, tuner/, db/, service/, cost_model/,
# examples/, bench/*.py): `slim` takes tests/, docs/ and bench/results/ out of the index and moves
# them to $ASIDE (default /tmp/tunehub-gpu-aside); `restore` moves them back and resets the index.
# Commit nothing between the two: the index says those files are deleted.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
aside=${ASIDE:-/tmp/tunehub-gpu-aside}
paths=(tests docs bench/results)
cd "$root"
case "${1:-}" in
  slim)
    if [ -e "$aside" ]; then echo "$aside exists: restore first" >&2; exit 1; fi
    mkdir -p "$aside/bench"
    git rm -r -q --cached "${paths[@]}"
    for p in "${paths[@]}"; do mv "$p" "$aside/$p"; done
    tree=$( (git ls-files -z; git ls-files -z -o --exclude-standard) \
      | du -c -B1 --apparent-size --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    blocks=$( (git ls-files -z; git ls-files -z -o --exclude-standard) \
      | du -c -k --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    echo "slim: the tree is $tree bytes ($blocks KiB in disk blocks); restore with: $0 restore"
    ;;
  restore)
    if [ ! -d "$aside" ]; then echo "nothing to restore ($aside is missing)" >&2; exit 1; fi
    for p in "${paths[@]}"; do
      if [ -e "$p" ]; then echo "$p exists again: move it away, then restore" >&2; exit 1; fi
    done
    for p in "${paths[@]}"; do
      if [ -e "$aside/$p" ]; then mv "$aside/$p" "$p"; fi
    done
    git reset -q -- "${paths[@]}"
    rm -rf "$aside"
    git status --short | head -20
    ;;
  *)
    echo "usage: $0 slim|restore" >&2
    exit 2
    ;;
esac
