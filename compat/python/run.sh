#!/usr/bin/env bash
# Python driver compatibility suite: psycopg 3 (+ psycopg_pool) and asyncpg.
#   run.sh build   creates .venv here with the pinned requirements (idempotent)
#   run.sh test    runs the scenarios against $PGHOST:$PGPORT / $COMPAT_DSN
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
STAMP=$VENV/.requirements.sha256

build() {
    local want
    want=$(sha256sum requirements.txt | cut -d' ' -f1)
    if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        echo "compat/python: .venv up to date"
        return 0
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input --no-deps -r requirements.txt
    # --no-deps above: `pip check` fails if requirements.txt misses a dependency.
    "$VENV/bin/python" -m pip check
    echo "$want" >"$STAMP"
    echo "compat/python: .venv built"
}

run_tests() {
    build
    : "${COMPAT_DSN:?COMPAT_DSN is not set}"
    : "${COMPAT_DIRECT_PORT:?COMPAT_DIRECT_PORT is not set}"
    : "${COMPAT_RESTART_CMD:?COMPAT_RESTART_CMD is not set}"
    # The restart test goes last: it restarts PostgreSQL under everything.
    # Outer guard so a wedged run can never hang the runner.
    # COMPAT_PYTEST_ARGS (e.g. "-k s5 -s") passes through the cargo runner.
    # shellcheck disable=SC2086
    timeout -k 10 240 "$VENV/bin/python" -m pytest -v ${COMPAT_PYTEST_ARGS:-} "$@" \
        test_psycopg.py test_asyncpg.py test_restart.py
}

case "${1:-}" in
    build) build ;;
    test) shift; run_tests "$@" ;;
    *) echo "usage: $0 build|test [pytest args]" >&2; exit 2 ;;
esac
