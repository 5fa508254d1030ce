#!/usr/bin/env bash
# Fetches and compiles every driver suite under compat/ (run by `make test`
# before the suites run, so downloads and compiles do not overlap the timed
# parts of the integration tests). One suite at a time: 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
for suite in python go java node rust; do
    if [ -f "$suite/run.sh" ]; then
        echo "== compat/$suite: build"
        bash "$suite/run.sh" build
    fi
done
