#!/usr/bin/env bash
# tokio-postgres + sqlx compatibility suite for sluice.
#   run.sh build   fetch and compile the pinned crates (Cargo.lock) into target/
#   run.sh test    run the checks against COMPAT_DSN (see README.md)
set -euo pipefail
cd "$(dirname "$0")"
# A standalone project ([workspace] in Cargo.toml): its own target dir, never
# the repository's or one inherited from the environment.
export CARGO_TARGET_DIR="$PWD/target"
bin="$CARGO_TARGET_DIR/debug/sluice-compat-rust"

case "${1:-}" in
build)
    # Debug build: much quicker to compile than --release on 2 cores, and
    # fast enough for these checks.
    cargo build --locked --quiet
    ;;
test)
    # Recompiles only if the sources changed since `run.sh build`; never
    # touches the network.
    if ! cargo build --locked --offline --quiet; then
        echo "compat/rust: build failed (run 'run.sh build' first?)" >&2
        exit 2
    fi
    # The outer timeout is a last resort: every check and every wait inside
    # has its own deadline.
    exec timeout -k 10 400 "$bin"
    ;;
*)
    echo "usage: $0 build|test" >&2
    exit 2
    ;;
esac
