# One command each for a fresh machine: the venv, the install (C shim included),
# then the job. Re-running only reinstalls when the package sources changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all demo test bench lint clean

all: test

$(STAMP): pyproject.toml $(wildcard setup.py) $(wildcard shim_c/*.c shim_c/*.h)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh

test: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/wal.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples

clean:
	rm -rf $(VENV) build src/*.egg-info demo-out
