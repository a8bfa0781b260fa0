# Larder: `make demo` and `make test` are the two set-up commands.
# Both install what a fresh machine lacks first (scripts/setup, idempotent).
export PATH := $(HOME)/.cargo/bin:$(PATH)

BENCHES := $(sort $(wildcard bench/*_bench.exs))
BENCH_ARGS ?=

.PHONY: setup demo test bench bench-quick check format release-check report

setup:
	@scripts/setup

demo: setup
	mix compile
	mix run examples/demo.exs

test: setup
	mix test

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
	cd native/larder_native && cargo fmt --check && cargo clippy --release -- -D warnings
