#!/usr/bin/env bash
# The demo `make demo` runs: write a small trajectory log through the CLI, read it
# back, export it to a self-contained .steno file and verify it.
set -euo pipefail
out="${DEMO_OUT:-demo-out}"
rm -rf "$out"
mkdir -p "$out"
store="$out/store"
s() { echo "+ stenograph $*" >&2; stenograph "$@"; }

s log append "$store" --traj demo-1 --kind TaskStarted \
  --body '{"task": "list the repo", "model": "scripted-1", "sampling": {"temperature": 0}}'
s log append "$store" --traj demo-1 --kind ModelReplied \
  --body '{"text": "I will list the directory.", "tool_calls": [{"id": "c1", "name": "ls", "args": {"path": "."}}], "stop": "tool_use"}'
s log append "$store" --traj demo-1 --kind ToolIntent \
  --body '{"tool": "ls", "args": {"path": "."}, "idempotency_key": "demo-1/c1"}'
s log append "$store" --traj demo-1 --kind ToolResult --body '{"call": "c1", "status": "ok", "output": "README.md\nsrc\n"}'
s log append "$store" --traj demo-2 --kind Note --body '{"text": "a second trajectory shares the store"}'
s log ls "$store"
s log cat "$store" --traj demo-1
s log export "$store" demo-1 -o "$out/demo-1.steno"
s log verify "$out/demo-1.steno"
s log verify "$store"
echo "demo: ok (store in $store, trajectory file $out/demo-1.steno)"
