#!/usr/bin/env bash
# The process-tape golden log's program (golden_logs/record.py records it as "pipeline"):
# no model calls, only coreutils in pipelines, so everything it reads from the world --
# clocks (date), entropy (mktemp), directory listings (ls), pids ($$), pipes and the exit
# statuses of its children -- is on the C tape. Run in its workspace (data.txt beside it).
set -euo pipefail
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
ls -1 . | sort -r > "$scratch/names"
printf 'entries: %s\n' "$(wc -l < "$scratch/names")"
tr -s ' ' '\n' < data.txt | sort | uniq -c | sort -k1,1nr -k2 | head -3
date -u +%Y-%m-%dT%H:%M:%SZ > "$scratch/when"
printf 'at %s in %s, pid %s\n' "$(cat "$scratch/when")" "$(basename "$scratch")" "$$"
wc -w data.txt | cut -d' ' -f1
