# Every target installs what it needs on a fresh Debian machine, then does its job.
SWIFT ?= swift
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND := noninteractive

.PHONY: deps deps-test build demo test bench clean

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

build: deps
	$(SWIFT) build

demo: deps
	$(SWIFT) build --product stash
	$$($(SWIFT) build --show-bin-path)/stash demo

test: deps-test
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build

clean:
	rm -rf .build
