#!/usr/bin/env bash
# compat/go: pgx v5 (+ pgxpool) against sluice in transaction mode.
#   run.sh build   fetch the pinned modules and compile the test binary
#   run.sh test    run the suite against PGHOST/PGPORT (COMPAT_DSN), offline
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)

# Everything Go downloads or compiles stays in this directory.
export GOPATH="$here/.gopath"
export GOMODCACHE="$here/.gopath/pkg/mod"
export GOCACHE="$here/.gocache"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -modcacherw"
export CGO_ENABLED=0

case "${1:-}" in
build)
    go mod download
    go vet ./...
    # Compiles the test binary (kept in GOCACHE, so `go test` is quick).
    go test -c -o "$GOCACHE/compat_go.test" .
    ;;
test)
    # No network here: modules come from the cache filled by `build`.
    export GOPROXY=off GOFLAGS="-mod=readonly -modcacherw"
    exec go test -count=1 -timeout 5m -v ./...
    ;;
*)
    echo "usage: $0 build|test" >&2
    exit 2
    ;;
esac
