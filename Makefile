# Larder: `make demo` and `make test` are the two set-up commands.
# Both install what a fresh machine lacks first (scripts/setup, idempotent).
export PATH := $(HOME)/.cargo/bin:$(PATH)

BENCHES := $(sort $(wildcard bench/*_bench.exs))
BENCH_ARGS ?=

.PHONY: setup demo test bench bench-quick bench-http bench-startup serve check format release-check report

PRICE_SEARCH := examples/price_search

setup:
	@scripts/setup

demo: setup
	mix compile
	cd $(PRICE_SEARCH) && mix compile
	mix run examples/demo.exs

test: setup
	mix test
	cd $(PRICE_SEARCH) && mix test

# The price search service on port 8091, or PORT. exec: the VM replaces the
# shell, so make's SIGTERM (which make passes to its child) stops it.
# The soft file descriptor limit is raised to the hard one: each held
# connection takes a descriptor.
serve: setup
	cd $(PRICE_SEARCH) && mix compile
	cd $(PRICE_SEARCH) && { ulimit -n $$(ulimit -Hn) 2>/dev/null || true; } && exec mix run --no-halt

# The service on core 0 with one scheduler, then on both cores, wrk on core 1;
# DURATION=2s for a short run, ROUNDS=3 for the best of three. GO_BIN=<the Go
# reference binary you built> measures it in the same run, interleaved.
# Writes bench/results/http_bench.json.
bench-http: setup
	@mkdir -p bench/results
	cd $(PRICE_SEARCH) && mix compile
	cd $(PRICE_SEARCH) && { ulimit -n $$(ulimit -Hn) 2>/dev/null || true; } && mix run --no-start bench/http_bench.exs --json ../../bench/results/http_bench.json

# The service's start-up, cold (CSV) and warm (snapshot), to the first 200
# on /health, its RSS then, and Larder.Table.load/2 of the catalogue.
bench-startup: setup
	@mkdir -p bench/results
	cd $(PRICE_SEARCH) && mix compile
	cd $(PRICE_SEARCH) && mix run --no-start bench/startup_bench.exs --json ../../bench/results/startup_bench.json

# Builds examples/release_check as a release and boots it (also part of `make test`).
release-check: setup
	mix test test/release_test.exs

# Each benchmark prints its side-by-side table and accepts --quick and --json PATH.
bench: setup
	@mkdir -p bench/results
	@set -e; for f in $(BENCHES); do \
	  name=$$(basename $$f .exs); \
	  echo "### $$f"; \
	  mix run $$f --json bench/results/$$name.json $(BENCH_ARGS); \
	done

bench-quick:
	@$(MAKE) --no-print-directory bench BENCH_ARGS=--quick

# bench/results/*.json -> bench/report/index.html (one SVG chart per table, by
# gnuplot) and the README's charts in docs/charts/.
report: setup
	elixir bench/report/report.exs --results bench/results --out bench/report --charts docs/charts

# What CI checks besides the tests.
check: setup
	mix format --check-formatted
	mix compile --warnings-as-errors --force
	cd $(PRICE_SEARCH) && mix compile --warnings-as-errors --force
	cd native/larder_native && cargo fmt --check && cargo clippy --release -- -D warnings
