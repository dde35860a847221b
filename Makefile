# One command each for a fresh machine: the venv, the install (C shim included),
# then the job. Re-running only reinstalls when the package sources changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all demo test bench soak lint clean

all: test

$(STAMP): pyproject.toml $(wildcard setup.py) $(wildcard shim_c/*.c shim_c/*.h shim_c/*.def)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
# frameworks: what tests/test_frameworks.py replays (+430 MB, +15-30 s)
	$(BIN)/pip install -q -e '.[test,frameworks]'
	touch $(STAMP)

# an ordinary user's install (tests/test_as_a_user.py runs it as nobody, who cannot reach
# a root-only interpreter): a venv of the system Python, the package installed, not linked
UVENV := .venv-user
USTAMP := $(UVENV)/.installed
$(USTAMP): pyproject.toml $(wildcard setup.py) $(wildcard shim_c/*.c shim_c/*.h shim_c/*.def) \
		$(shell find src -name '*.py')
	@test -x /usr/bin/python3 && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || \
	    (apt-get install -y python3-venv >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y python3-venv >/dev/null))
	/usr/bin/python3 -m venv $(UVENV)
	$(UVENV)/bin/pip install -q .
	touch $(USTAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh

test: $(STAMP) $(USTAMP)
	$(BIN)/ruff check src tests bench examples golden_logs
# chromium: tests/test_view.py opens the `stenograph view` pages in it (headless);
# redis-server and redis-cli: tests/test_socket_tape.py replays redis-cli (the test starts
# its own server on a free port; PostgreSQL 15 is on the machine, its cluster likewise);
# age: tests/test_whole_children.py records Debian's age-keygen, a Go program
	@command -v chromium >/dev/null || \
	    (apt-get install -y chromium >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y chromium >/dev/null))
	@command -v redis-server >/dev/null || \
	    (apt-get install -y redis-server >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y redis-server >/dev/null))
	@command -v age-keygen >/dev/null || \
	    (apt-get install -y age >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y age >/dev/null))
# golang-go: tests/test_ways_out.py builds a static Go payment tool (CGO_ENABLED=0)
	@command -v go >/dev/null || \
	    (apt-get install -y golang-go >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y golang-go >/dev/null))
# four workers, a test file each (its module fixtures recorded once): the suite waits on
# disks and children as much as on either core (three: 658 s here against 605 s for four,
# unloaded). `-m soak` is make soak's.
	$(BIN)/pytest -n 4 --dist loadfile -m "not soak" --durations=25

bench: $(STAMP) $(USTAMP)
	$(BIN)/python bench/wal.py
	@test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || \
	    (apt-get install -y faketime >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y faketime >/dev/null))
	$(BIN)/python bench/shim.py
	$(BIN)/python bench/agent_run.py
	$(BIN)/pip install -q 'vcrpy>=7,<10' && $(BIN)/python bench/http_capture.py
	$(BIN)/python bench/mcp_session.py
	$(BIN)/python bench/toolbox.py
	$(BIN)/python bench/redact.py
	$(BIN)/python bench/workspace.py
	$(UVENV)/bin/pip install -q 'openai>=3,<4' && $(BIN)/python bench/seal.py
	$(BIN)/pip install -q 'dbos>=3.4,<4' && $(BIN)/python bench/effects.py
	$(BIN)/python bench/host.py
	$(BIN)/python bench/ship.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/settle.py
	$(BIN)/python bench/build_replay.py
	$(BIN)/python bench/bisect_run.py
	$(BIN)/python bench/view.py
	$(BIN)/python bench/socket_tape.py
	$(BIN)/python bench/commands.py

soak: $(STAMP)
	STENO_SOAK=1 $(BIN)/pytest -q -m soak
	STENO_SOAK=1 $(BIN)/pytest -q tests/test_sealed_tmp.py -k mktemp
	STENO_FUZZ_EXAMPLES=5000 $(BIN)/pytest -q tests/test_fuzz_readers.py
	STENO_FRAMEWORK_RUNS=3x10 STENO_FRAMEWORK_RESUME=langgraph,openai_agents,pydantic_ai,litellm,smolagents \
	    $(BIN)/pytest -q tests/test_frameworks.py
	STENO_SNAPSHOT_EXAMPLES=500 $(BIN)/pytest -q tests/test_snapshots.py
	STENO_CRASH_TRIALS=1000 $(BIN)/pytest -q tests/test_resume.py -k crash_anywhere
	STENO_KILL_TRIALS=100 $(BIN)/pytest -q tests/test_kill.py
	STENO_THREAD_RUNS=3x10 $(BIN)/pytest -q tests/test_threads.py
	STENO_ASYNC_RUNS=3x10 $(BIN)/pytest -q tests/test_asyncio_loop.py
	STENO_MCP_RUNS=3x3 $(BIN)/pytest -q tests/test_mcp.py tests/test_mcp_effects.py
	STENO_DRAIN_AGENTS=8 $(BIN)/pytest -q tests/test_fleet.py
# the property tests at three times their written counts (make test runs a quarter)
	STENO_SCALE=3 $(BIN)/pytest -q tests/test_log_robust.py tests/test_recovery.py \
	    tests/test_crash.py tests/test_http_streaming.py
# the toolbox sweep, every tool (go and rg from Debian's golang-go and ripgrep)
	@command -v go >/dev/null && command -v rg >/dev/null || \
	    (apt-get install -y golang-go ripgrep >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y golang-go ripgrep >/dev/null))
	STENO_TOOLBOX=all $(BIN)/pytest -q tests/test_toolbox_sweep.py
	STENO_SOCKET_REPLAYS=10 $(BIN)/pytest -q tests/test_socket_tape.py
	STENO_NET_CRASH_TRIALS=60 $(BIN)/pytest -q tests/test_net_effects.py -k crash_anywhere
	STENO_PSQL_CRASH_TRIALS=30 $(BIN)/pytest -q tests/test_psql_effects.py -k crash_anywhere
# every way out (requests, curl, urllib, node, go, psql, a Node agent): 7 x 100 trials
	STENO_WAYS_TRIALS=100 $(BIN)/pytest -q tests/test_ways_out.py
# a run of 100 million clock reads in the same memory bounds as 20 million
	STENO_LONG_READS=100000000 $(BIN)/pytest -q tests/test_chunks.py -k bounded_memory
	STENO_PAY_TRIALS=150 STENO_PAY_BOUNDARIES=all $(BIN)/pytest -q tests/test_payments_agent.py
# the host recorder at the issue's sizes: 64 agents at once, 10,000 short-lived execs
	STENO_HOST_AGENTS=64 STENO_HOST_EXECS=10000 $(BIN)/pytest -q tests/test_host_recorder.py
	STENO_SHIP_KILLS=40 $(BIN)/pytest -q tests/test_ship.py -k killed
	for i in 1 2 3 4 5 6 7 8 9 10; do STENO_SIGNAL_SOAK=1 $(BIN)/pytest -q tests/test_signals.py -k itimer || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples golden_logs

clean:
	rm -rf $(VENV) $(UVENV) build src/*.egg-info demo-out
