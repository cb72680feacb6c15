# The two set-up commands: `make run` (install everything, run the main job on SQLite) and `make test`.
VENV ?= .venv
PYTHON ?= python3.11
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test deps venv cc bench-accuracy-quick clean

deps:
	@bash scripts/install-system-deps.sh

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# The main job: the advice service (HTTP API + SQLite store in ./tame.sqlite3 + local probe worker).
run: deps venv
	$(BIN)/tame serve --host 127.0.0.1 --port 8080

# The tame congestion control (probes/bpf/tame_cc.bpf.c) for the running kernel, cached outside git
# (probes.delayline.cache_dir); `tame cc load` builds it too when missing.
cc: deps venv
	@$(BIN)/python -m probes.cc >/dev/null

test: deps venv cc
	$(BIN)/python -m pytest -q -ra

bench-accuracy-quick: deps venv
	$(BIN)/python -m benchmarks.accuracy --quick

clean:
	rm -rf $(VENV) .pytest_cache
