# Larder: `make demo` and `make test` are the two set-up commands.
# Both install what a fresh machine lacks first (scripts/setup, idempotent).
# Mix projects: the core (this folder), the Kafka adapter (larder_kafka/)
# and the Postgres client (larder_postgres/), which depend on the core by
# path, the price catalogue (examples/price_catalogue/, which the core's
# benches, demo and tests and the price search example depend on by path)
# and the price search example (examples/price_search/).
export PATH := $(HOME)/.cargo/bin:$(PATH)

KAFKA := larder_kafka
BENCHES := $(sort $(wildcard bench/*_bench.exs)) examples/session_registry/sessions_bench.exs
KAFKA_BENCHES := $(sort $(wildcard $(KAFKA)/bench/*_bench.exs))
POSTGRES := larder_postgres
POSTGRES_BENCHES := $(sort $(wildcard $(POSTGRES)/bench/*_bench.exs))
BENCH_ARGS ?=

.PHONY: setup demo test bench bench-quick bench-http bench-startup serve check format release-check report

PRICE_SEARCH := examples/price_search
PRICE_CATALOGUE := examples/price_catalogue

setup:
	@scripts/setup

demo: setup
	mix compile
	cd $(PRICE_SEARCH) && mix compile
	mix run examples/demo.exs
	cd $(KAFKA) && mix run ../examples/kafka_demo.exs
	cd $(POSTGRES) && mix run ../examples/postgres_demo.exs

test: setup
	mix test
	cd $(KAFKA) && mix test
	cd $(POSTGRES) && mix test
	cd $(PRICE_CATALOGUE) && mix test
	cd $(PRICE_SEARCH) && mix test

# The price search service on port 8091, or PORT. It is compiled by mix
# only when a source changed (the stamp below), then started without mix:
# elixir on the compiled ebin directories, as a release would, since mix's
# own boot (about 0.25 s, twice with a separate `mix compile`) was a large
# share of a restart. exec: the VM replaces the shell, so make's SIGTERM
# (which make passes to its child) stops it. The soft file descriptor limit
# is raised to the hard one: each held connection takes a descriptor.
# +MMmcs 2: at most 2 freed memory segments cached (10 by default), which
# otherwise kept the catalogue load's freed heaps mapped: about 300 MB of
# RSS after a CSV load. 0 (none cached) saves 60 MB more but makes a CSV
# load about 1.5 s slower (every heap growth a fresh mapping to fault in).
PS_ENV := $(or $(MIX_ENV),dev)
PS_BUILD := $(PRICE_SEARCH)/_build/$(PS_ENV)
PS_SOURCES := $(shell find $(PRICE_SEARCH)/lib $(PRICE_SEARCH)/config $(PRICE_CATALOGUE)/lib lib config native/larder_native/src -type f 2>/dev/null) \
  $(wildcard $(PRICE_SEARCH)/mix.exs $(PRICE_SEARCH)/mix.lock $(PRICE_CATALOGUE)/mix.exs mix.exs mix.lock native/larder_native/Cargo.toml native/larder_native/Cargo.lock)

$(PS_BUILD)/.compiled: $(PS_SOURCES)
	cd $(PRICE_SEARCH) && MIX_ENV=$(PS_ENV) mix compile
	touch $@

serve: setup $(PS_BUILD)/.compiled
	cd $(PRICE_SEARCH) && { ulimit -n $$(ulimit -Hn) 2>/dev/null || true; } && \
	  exec elixir --erl '+MMmcs 2' --no-halt -pa '_build/$(PS_ENV)/lib/*/ebin' -pa _build/$(PS_ENV)/lib/price_search/consolidated \
	  -e '{:ok, _} = Application.ensure_all_started(:price_search)'

# The service on core 0 with one scheduler, then on both cores, wrk on core 1;
# DURATION=2s for a short run, ROUNDS=3 for the best of three. GO_BIN=<the Go
# reference binary you built> measures it in the same run, interleaved.
# Writes bench/results/http_bench.json.
bench-http: setup
	@mkdir -p bench/results
	cd $(PRICE_SEARCH) && mix compile
	cd $(PRICE_SEARCH) && { ulimit -n $$(ulimit -Hn) 2>/dev/null || true; } && mix run --no-start bench/http_bench.exs --json ../../bench/results/http_bench.json

# The service's start-up by `make serve`, cold (CSV) and warm (snapshot), to
# the first 200 on /health, its RSS then, and Larder.Table.load/2 of the
# catalogue.
bench-startup: setup $(PS_BUILD)/.compiled
	@mkdir -p bench/results
	cd $(PRICE_SEARCH) && mix run --no-start bench/startup_bench.exs --json ../../bench/results/startup_bench.json

# Builds examples/release_check as a release and boots it (also part of `make test`).
release-check: setup
	mix test test/release_test.exs

# Each benchmark prints its side-by-side table and accepts --quick and --json PATH;
# it writes bench/results/<name>.json, which records the run's date (UTC), the
# machine (CPU, cores online, memory, OS), the VM and the command that ran it
# (read from the VM's command line, with `cd larder_kafka &&` for the Kafka
# benches, which run from there), for `make report`.
# ANE_PATH=<a checkout of github.com/gyson/ane> adds Ane to
# bench/register_vs_ane_bench.exs (compiled into that bench's VM only);
# without it that bench runs the Register alone and says Ane was not measured.
bench: setup
	@mkdir -p bench/results
	@set -e; for f in $(BENCHES); do \
	  name=$$(basename $$f .exs); \
	  echo "### $$f"; \
	  mix run $$f --json bench/results/$$name.json $(BENCH_ARGS); \
	done; \
	for f in $(KAFKA_BENCHES); do \
	  name=$$(basename $$f .exs); \
	  echo "### $$f"; \
	  (cd $(KAFKA) && mix run $${f#$(KAFKA)/} --json ../bench/results/$$name.json $(BENCH_ARGS)); \
	done; \
	for f in $(POSTGRES_BENCHES); do \
	  name=$$(basename $$f .exs); \
	  echo "### $$f"; \
	  (cd $(POSTGRES) && mix run $${f#$(POSTGRES)/} --json ../bench/results/$$name.json $(BENCH_ARGS)); \
	done

bench-quick:
	@$(MAKE) --no-print-directory bench BENCH_ARGS=--quick

# bench/results/*.json -> docs/benchmarks.md (per results file: command,
# machine, date, quick or not, targets, and each table's medians and ratios
# to the anchor; generated, not edited), the charts it links in docs/charts/,
# and bench/report/index.html (one SVG chart per table, by gnuplot).
report: setup
	elixir bench/report/report.exs --results bench/results --out bench/report \
	  --charts docs/charts --markdown docs/benchmarks.md

# What CI checks besides the tests.
check: setup
	mix format --check-formatted
	mix compile --warnings-as-errors --force
	cd $(KAFKA) && mix format --check-formatted && mix compile --warnings-as-errors --force
	cd larder_postgres && mix format --check-formatted && mix compile --warnings-as-errors --force
	cd $(PRICE_CATALOGUE) && mix format --check-formatted && mix compile --warnings-as-errors --force
	cd $(PRICE_SEARCH) && mix compile --warnings-as-errors --force
	cd native/larder_native && cargo fmt --check && cargo clippy --release -- -D warnings
	cd $(KAFKA)/native/larder_kafka && cargo fmt --check && cargo clippy --release -- -D warnings
