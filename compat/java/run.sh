#!/usr/bin/env bash
# Java driver compatibility suite: pgjdbc + HikariCP (see README.md).
#   run.sh build   resolves the pinned dependencies into .m2/ here and compiles (idempotent)
#   run.sh test    runs the scenarios (offline) against $PGHOST:$PGPORT
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD

# The Maven local repository lives here (gitignored), so a fresh machine only
# needs Maven Central. -B -q: no output unless something fails.
mvn_quiet() {
    local out
    if ! out=$(mvn -B -q -Dmaven.repo.local="$HERE/.m2/repository" "$@" 2>&1); then
        printf '%s\n' "$out" >&2
        echo "compat/java: mvn $* failed" >&2
        return 1
    fi
}

build() {
    mvn_quiet compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
    echo "compat/java: built"
}

run_tests() {
    : "${PGHOST:?PGHOST is not set}"
    : "${COMPAT_DIRECT_PORT:?COMPAT_DIRECT_PORT is not set}"
    : "${COMPAT_RESTART_CMD:?COMPAT_RESTART_CMD is not set}"
    if [ ! -f target/classpath.txt ]; then
        echo "compat/java: not built; run 'bash compat/java/run.sh build' first" >&2
        exit 1
    fi
    # Offline: recompiles only if the sources changed since `build`.
    mvn_quiet -o compile
    # Outer guard so a wedged run can never hang the runner; the suite
    # itself times out each scenario and stops starting new ones after ~3 min.
    timeout -k 10 300 java \
        -Dorg.slf4j.simpleLogger.defaultLogLevel=error \
        -cp "target/classes:$(cat target/classpath.txt)" \
        compat.Main
}

case "${1:-}" in
    build) build ;;
    test) run_tests ;;
    *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac
