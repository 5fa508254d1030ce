# sluice: the two commands of the README, and the benchmark.
.PHONY: demo test bench build lint deps peers clean package

CARGO ?= cargo

deps:
	@bash scripts/install-deps.sh

peers:
	@bash scripts/install-deps.sh --peers

build:
	$(CARGO) build --release -p sluice -p sluice-testkit

# Builds, starts a throwaway PostgreSQL, runs sluice in front of it, shows it.
demo: peers build
	python3 scripts/demo.py

# The whole suite: unit tests, the wire property test, integration tests
# against real PostgreSQL through sluice, and the driver suites under
# compat/ (their dependencies fetched and compiled first).
test: deps
	bash compat/build.sh
	$(CARGO) build -p sluice
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 scripts/import_cycles.py crates/sluice/src crates/wire/src crates/config/src crates/router/src

# The Debian package: target/package/sluice_VERSION_ARCH.deb (docs/packaging.md).
# BIN=path packages that binary instead of building the release one.
package:
	$(if $(BIN),,$(CARGO) build --release -p sluice)
	bash scripts/package.sh $(if $(BIN),--bin $(BIN))

# sluice vs PgBouncer vs PostgreSQL directly, same run, alternating.
# BENCH_ARGS go to scripts/bench.py: e.g. --quick, --scale-clients (many clients) or
# --profile (instructions and syscalls per transaction, under callgrind and strace).
bench: peers build
	python3 scripts/bench.py $(BENCH_ARGS)

clean:
	$(CARGO) clean
