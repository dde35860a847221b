#!/usr/bin/env bash
# What `make demo` runs: record a real agent (the official openai SDK, tool calls that list
# a directory, read a file and run a shell command) against the loopback model server,
# stop the server, replay the run offline with networking refused, and compare bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${DEMO_OUT:-demo-out}"
rm -rf "$out"
mkdir -p "$out"
py="$(command -v python)"  # the venv's interpreter (a symlink to the real binary, not a shell script)
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "start the loopback model server (scripted replies, OpenAI and Anthropic APIs)"
python -m stenograph.testing.model_server --port 0 --script examples/agent_script.json \
  --port-file "$out/port" > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$out/port" ] && break; sleep 0.1; done
export OPENAI_BASE_URL="http://127.0.0.1:$(cat "$out/port")/v1"
key="sk-demo-$(date +%s)-not-a-real-key"
export OPENAI_API_KEY="$key"

# the agent works in examples/ (its --workdir): that directory is its workspace
say "record: stenograph record --workspace examples -o $out/agent.steno -- python examples/agent.py"
stenograph record --workspace examples -o "$out/agent.steno" -- "$py" examples/agent.py \
  | tee "$out/recorded.txt"

say "a plain rerun differs (run id, clock, pid)"
"$py" examples/agent.py > "$out/rerun.txt"
diff <(head -1 "$out/recorded.txt") <(head -1 "$out/rerun.txt") || true

say "stop the server; forget the API key"
kill "$server"; wait "$server" 2>/dev/null || true
unset OPENAI_API_KEY

say "replay offline, networking refused: stenograph replay $out/agent.steno"
stenograph replay "$out/agent.steno" | tee "$out/replayed.txt"

say "compare"
cmp "$out/recorded.txt" "$out/replayed.txt" && echo "stdout: bit-identical"
# raw, base64 at any alignment, hex, URL-encoded: in every event, blob and snapshot
if ! stenograph log scan "$out/agent.steno" --secret "$key" > "$out/scan.txt"; then
  cat "$out/scan.txt" >&2; echo "the API key reached the log!" >&2; exit 1
fi
echo "the API key is nowhere in $out/agent.steno"
stenograph log verify "$out/agent.steno"
stenograph log cat "$out/agent.steno" --jsonl | python -c '
import collections, json, sys
kinds = collections.Counter(json.loads(line)["kind"] for line in sys.stdin)
print("events:", dict(kinds))'
