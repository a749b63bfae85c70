# Every target installs what it needs on a fresh Debian machine, then does its job.
SWIFT ?= swift
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND := noninteractive

.PHONY: deps deps-test deps-bench deps-relay build demo test bench bench-smoke bench-relay relay-server clean

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

# PostgreSQL's server (Debian's postgresql) for the relay service's tests and benchmark, which
# start a throwaway cluster of their own (initdb in a temporary directory, pg_ctl on a loopback
# port): the package's own cluster is not created (createcluster.conf), nothing is left running.
deps-relay:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		echo "installing postgresql (apt, for the relay service's tests)"; \
		[ -e /etc/postgresql-common/createcluster.conf ] || { $(SUDO) mkdir -p /etc/postgresql-common && \
			echo "create_main_cluster = false" | $(SUDO) tee /etc/postgresql-common/createcluster.conf >/dev/null; }; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq postgresql >/dev/null; }

build: deps
	$(SWIFT) build

# The relay server (RelayService/, a package of its own: an app linking Stash never builds it).
relay-server: deps
	$(SWIFT) build -c release --package-path RelayService --product stash-relay
	@echo "RelayService/.build/release/stash-relay serve --postgres postgres://USER@HOST:5432/DB --port 8080"

demo: deps
	$(SWIFT) build --product stash
	$$($(SWIFT) build --show-bin-path)/stash demo

# The whole test suite, then a build of the benchmark package so it never rots
# (running it is `make bench`; `make bench-smoke` runs a tiny configuration). The last line
# says how many tests ran and how long they took, from swift test's own summary (its output
# is kept in .build/test-output.txt); a failing run still exits with swift test's status.
# The relay service's package (RelayService/) is built and its tests run after the root suite,
# against a PostgreSQL cluster they start and stop themselves; its summary line follows the root's.
TEST_LOG := .build/test-output.txt
RELAY_TEST_LOG := RelayService/.build/test-output.txt
define swift-test
	@mkdir -p $(dir $(2)); start=$$(date +%s); \
	{ $(SWIFT) test $(1) --skip-build; echo $$? > $(2).status; } 2>&1 | tee $(2); \
	status=$$(cat $(2).status); seconds=$$(( $$(date +%s) - start )); \
	run=$$(sed -nE 's/.*Test run with ([0-9]+ tests? in [0-9]+ suites?) (passed|failed) after [0-9.]+ seconds?( with ([0-9]+ issues?))?.*/\1 \2\3/p' $(2) | tail -n 1); \
	if [ -n "$$run" ]; then summary="make test$(3): $$run in $$seconds s"; \
	else summary="make test$(3): swift test stopped before its summary line after $$seconds s (see $(2))"; fi; \
	if [ "$$status" -ne 0 ]; then echo "$$summary; exit status $$status"; exit $$status; fi; \
	echo "$$summary" > $(2).summary
endef

test: deps-test deps-bench deps-relay
	$(SWIFT) build --build-tests
	$(call swift-test,,$(TEST_LOG),)
	$(SWIFT) build --package-path Benchmarks
	$(SWIFT) build --package-path RelayService --build-tests
	$(call swift-test,--package-path RelayService,$(RELAY_TEST_LOG), (relay service))
	@cat $(TEST_LOG).summary $(RELAY_TEST_LOG).summary

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

# The relay service under load: 1,000 simulated devices on loopback against stash-relay and a
# throwaway PostgreSQL cluster (release builds); the report lands in
# Benchmarks/.build/results-relay/report.md (see BENCHMARKS.md).
bench-relay: deps deps-relay
	$(SWIFT) build -c release --package-path RelayService --product stash-relay
	cd Benchmarks && $(SWIFT) build -c release --product RelayBench
	@mkdir -p Benchmarks/.build/results-relay
	Benchmarks/.build/release/RelayBench --server $(CURDIR)/RelayService/.build/release/stash-relay \
		--commit "$$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- Sources RelayService Benchmarks || echo '+uncommitted')" \
		> Benchmarks/.build/results-relay/report.md
	@cat Benchmarks/.build/results-relay/report.md

clean:
	rm -rf .build RelayService/.build
