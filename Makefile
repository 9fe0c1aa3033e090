PY ?= .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: install run test lint tools proto bench perf-check clean model-long chaos

# Create the virtualenv and install the project with its dev extra (once per pyproject change).
$(VENV_STAMP): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[dev]'
	touch $(VENV_STAMP)

install: $(VENV_STAMP)

# The main job: the node, gRPC on 127.0.0.1:19530 (loopback: no authentication needed; see
# docs/security.md for anything wider), data in ./data (or $$STREAMINGNODE_DATA_DIR); Ctrl-C drains.
run: $(VENV_STAMP)
	.venv/bin/streamingnode serve

# ruff (with SLF001: no private member across packages), mypy strict, and the import layers of DESIGN.md
# (lint-imports reads the contracts in pyproject.toml's [tool.importlinter]).
lint: $(VENV_STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(dir $(PY))lint-imports

# Everything CI runs: lint, types, the whole test suite (unit, conformance, crash) once in a random
# order (pytest-randomly, a dev dependency, orders every run; the header prints "Using
# --randomly-seed=N", which replays it), and the instruction budget of the append path.
test: lint tools
	$(PY) -m pytest
	$(PY) bench/append_instructions.py --check
	$(PY) bench/write_amp.py --check

# Instructions per appended message (callgrind; about a minute) against bench/append_budget.json:
# fails when a case grew more than 10%; and the bytes RocksDB's compactions write per appended byte
# (bench/write_amp.py, about 5 s), which the instruction count cannot see.  Refreshing the budget on purpose: bench/README.md.
perf-check: $(VENV_STAMP)
	@command -v valgrind >/dev/null 2>&1 || { echo "perf-check needs valgrind (apt-get install valgrind)" >&2; exit 1; }
	$(PY) bench/append_instructions.py --check
	$(PY) bench/write_amp.py --check

# The tests run a real Prometheus and promtool (Debian's prometheus package), the Node.js example
# (Debian's nodejs and npm, then the packages examples/node's lock file pins) and local Spark (a Java
# runtime: Debian's default, OpenJDK 17 on Debian 12), and perf-check runs valgrind; each installed
# when missing.
tools:
	@if ! command -v valgrind >/dev/null 2>&1; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "the instruction budget needs valgrind on PATH" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind; \
	fi
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "the tests need prometheus and promtool on PATH (Prometheus 2.x)" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi
	@if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "the tests need node and npm on PATH (Node.js 18+)" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; \
	fi
	@if ! command -v java >/dev/null 2>&1; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "the Spark tests need a Java runtime (17 or newer) on PATH" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends default-jre-headless; \
	fi
	@[ -d examples/node/node_modules ] || (cd examples/node && npm ci --no-audit --no-fund)
	@# The chaos runs (tests/chaos) build network namespaces with iproute2 and drop packets with nftables.
	@if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "the chaos tests need ip and tc (iproute2) and nft (nftables) on PATH" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 nftables; \
	fi

# The compaction model walk (tests/compaction_model.py) for 20 minutes: fresh seeds one after another,
# pyarrow and DuckDB against the model; prints its figures (walks, steps, compactions, reads compared).
model-long: $(VENV_STAMP)
	STREAMINGNODE_MODEL_SECONDS=$${STREAMINGNODE_MODEL_SECONDS:-1200} $(PY) -m pytest \
	  tests/unit/test_compaction_model.py -q --capture=sys -p no:cacheprovider -o timeout=0

# The long chaos run (tests/chaos/README.md): the cluster in network namespaces under random faults of
# every kind for CHAOS_SECONDS (default 30 minutes), then the history checker; prints the seed (replay
# with CHAOS_SEED=...) and the table of faults, acknowledged messages, unknown outcomes and takeovers.
# Needs root (namespaces).
chaos: $(VENV_STAMP) tools
	$(PY) -m tests.chaos.runner

# Regenerate streamingnode/v1/ from proto/streamingnode/v1/*.proto (commit the result).
proto: $(VENV_STAMP)
	$(PY) proto/generate.py

bench: $(VENV_STAMP)
	$(PY) bench/append_instructions.py --check --node
	$(PY) bench/write_amp.py --check
	$(PY) bench/wal_append.py
	$(PY) bench/append_chain.py
	$(PY) bench/produce_consume.py
	$(PY) bench/flush.py

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache
