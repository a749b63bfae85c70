# Every target installs what it needs on a fresh Debian machine, then does its job.
SWIFT ?= swift
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND := noninteractive

.PHONY: deps deps-test deps-bench build demo test bench bench-smoke clean

# liblmdb-dev provides lmdb.h, liblmdb.so and the pkg-config file `lmdb`.
deps:
	@pkg-config --exists lmdb 2>/dev/null || { \
		echo "installing liblmdb-dev (apt)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq liblmdb-dev >/dev/null; }

# lmdb-utils provides mdb_stat/mdb_dump, which the tests use to read our stores.
deps-test: deps
	@command -v mdb_stat >/dev/null 2>&1 || { \
		echo "installing lmdb-utils (apt)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq lmdb-utils >/dev/null; }

# libsqlite3-dev (and pkg-config) for GRDB, the SQLite peer of the benchmark suite.
deps-bench: deps
	@command -v pkg-config >/dev/null && pkg-config --exists sqlite3 2>/dev/null || { \
		echo "installing libsqlite3-dev (apt, for GRDB)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq libsqlite3-dev pkg-config >/dev/null; }

build: deps
	$(SWIFT) build

demo: deps
	$(SWIFT) build --product stash
	$$($(SWIFT) build --show-bin-path)/stash demo

# The whole test suite, then a build of the benchmark package so it never rots
# (running it is `make bench`; `make bench-smoke` runs a tiny configuration). The last line
# says how many tests ran and how long they took, from swift test's own summary (its output
# is kept in .build/test-output.txt); a failing run still exits with swift test's status.
TEST_LOG := .build/test-output.txt
test: deps-test deps-bench
	$(SWIFT) build --build-tests
	@start=$$(date +%s); \
	{ $(SWIFT) test --skip-build; echo $$? > $(TEST_LOG).status; } 2>&1 | tee $(TEST_LOG); \
	status=$$(cat $(TEST_LOG).status); seconds=$$(( $$(date +%s) - start )); \
	run=$$(sed -nE 's/.*Test run with ([0-9]+ tests? in [0-9]+ suites?) (passed|failed) after [0-9.]+ seconds?( with ([0-9]+ issues?))?.*/\1 \2\3/p' $(TEST_LOG) | tail -n 1); \
	if [ -n "$$run" ]; then summary="make test: $$run in $$seconds s"; \
	else summary="make test: swift test stopped before its summary line after $$seconds s (see $(TEST_LOG))"; fi; \
	if [ "$$status" -ne 0 ]; then echo "$$summary; exit status $$status"; exit $$status; fi; \
	echo "$$summary" > $(TEST_LOG).summary
	$(SWIFT) build --package-path Benchmarks
	@cat $(TEST_LOG).summary

# Benchmarks: Stash against raw LMDB and GRDB/SQLite in one run (see BENCHMARKS.md).
# The suite is its own package in Benchmarks/ (package-benchmark + GRDB are never built for
# library users). Knobs: STASH_BENCH_1M=1 adds N = 1M; STASH_BENCH_SIZES=10000,100000;
# STASH_BENCH_DIR=/path for fixtures (a real disk, not tmpfs). The report lands in
# Benchmarks/.build/results/report.md.
BENCH_RESULTS := .build/results
define bench-run
	@mkdir -p Benchmarks/$(1)
	@{ echo "date: $$(date -u '+%Y-%m-%d %H:%M UTC')"; \
	   echo "load average before the run: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"; } > Benchmarks/$(1)/run-info.txt
	cd Benchmarks && $(2) $(SWIFT) package --disable-sandbox benchmark --no-progress --format jmh --path $(1)
	@echo "load average after the run: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> Benchmarks/$(1)/run-info.txt
	cd Benchmarks && $(SWIFT) build -c release --product BenchReport >/dev/null && \
		.build/release/BenchReport $(1)/Current_run.jmh.json --info $(1)/run-info.txt \
		--commit "$$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- ../Sources ../Package.swift || echo '+uncommitted')" \
		> $(1)/report.md
endef

bench: deps-bench
	$(call bench-run,$(BENCH_RESULTS),)
	@cat Benchmarks/$(BENCH_RESULTS)/report.md

# Builds the suite and runs every benchmark once on a tiny store (N = 1,000, a few
# iterations each), so that CI notices when the benchmarks stop building or running, or
# when the indexed count through a handle or the gate check starts to allocate.
bench-smoke: deps-bench
	$(call bench-run,$(BENCH_RESULTS)-smoke,STASH_BENCH_SMOKE=1)
	@# Malloc counts are deterministic: the count through an index handle and the gate check must stay at 0.
	cd Benchmarks && .build/release/BenchReport $(BENCH_RESULTS)-smoke/Current_run.jmh.json --check-allocations >/dev/null
	@echo "bench-smoke: ok (Benchmarks/$(BENCH_RESULTS)-smoke/report.md)"

clean:
	rm -rf .build
