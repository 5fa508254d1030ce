#!/usr/bin/env bash
# node-postgres (pg) compatibility suite for sluice.
#   run.sh build   install the pinned dependencies (npm ci) into node_modules/
#   run.sh test    run the scenarios against PGHOST/PGPORT (see README.md)
set -euo pipefail
cd "$(dirname "$0")"

case "${1:-}" in
build)
    # npm ci is not incremental: skip it when node_modules already matches
    # package-lock.json (npm writes node_modules/.package-lock.json).
    if [ -f node_modules/.package-lock.json ] &&
        [ node_modules/.package-lock.json -nt package-lock.json ] &&
        [ -d node_modules/pg ] && [ -d node_modules/pg-copy-streams ]; then
        echo "compat/node: node_modules up to date"
    else
        npm ci --no-audit --no-fund --loglevel=error
    fi
    ;;
test)
    if [ ! -d node_modules/pg ]; then
        echo "compat/node: run 'run.sh build' first" >&2
        exit 2
    fi
    # Files run one after another (the restart scenario must not overlap the
    # others); tests inside a file run in order. The outer timeout is a last
    # resort: every wait inside the tests has its own deadline.
    shopt -s nullglob
    files=(test/*.test.js)
    if [ -n "${COMPAT_NODE_ONLY:-}" ]; then
        files=(test/*${COMPAT_NODE_ONLY}*.test.js)
    fi
    exec timeout -k 10 300 node --test --test-concurrency=1 --test-timeout=120000 \
        --test-force-exit --test-reporter=spec "${files[@]}"
    ;;
*)
    echo "usage: $0 build|test" >&2
    exit 2
    ;;
esac
