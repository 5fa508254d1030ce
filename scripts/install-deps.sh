#!/usr/bin/env bash
# Installs what sluice's demo, tests and benchmarks need on a fresh Debian
# machine: PostgreSQL's server and pgbench, Patroni and etcd for the
# switchover test, Debian's chromium and a Playwright venv for the web
# console's browser test, and the peers the benchmark
# compares with (PgBouncer, Pgpool-II, and HAProxy for the lab's failover
# scenario; with --peers also what building PgBouncer 1.25 from ../shared/tools
# takes, and valgrind and strace for the benchmark's --profile). Idempotent; quiet
# when all is there.
set -euo pipefail

need=()
pg_bindir=""
if command -v pg_config >/dev/null 2>&1; then
  pg_bindir=$(pg_config --bindir)
fi
if [ -z "$pg_bindir" ] || [ ! -x "$pg_bindir/initdb" ]; then
  pg_bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi
if [ -z "$pg_bindir" ] || [ ! -x "$pg_bindir/initdb" ] || [ ! -x "$pg_bindir/pgbench" ]; then
  need+=(postgresql postgresql-contrib)
fi
command -v psql >/dev/null 2>&1 || need+=(postgresql-client)
# The routing tests run a Patroni + etcd cluster (tests/tests/patroni.rs).
command -v patroni >/dev/null 2>&1 || need+=(patroni)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# The TLS tests make their certificates with the openssl CLI.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The web console's browser test (tests/tests/web_console.rs) drives Debian's
# chromium through Playwright, from a venv that tests/web/setup.sh builds.
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if [ "${1:-}" = "--peers" ]; then
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
  command -v pgpool >/dev/null 2>&1 || [ -x /usr/sbin/pgpool ] || need+=(pgpool2)
  # The lab's failover scenario puts HAProxy in front of Patroni, as the seed did.
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
  # The bench's --profile mode: instructions per transaction under valgrind's callgrind,
  # syscalls per transaction with strace -c.
  command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
  command -v strace >/dev/null 2>&1 || need+=(strace)
  # The bench's pgbouncer125 target: Debian's PgBouncer (1.18) predates
  # max_prepared_statements, so scripts/bench.py builds 1.25.2 from the source in
  # ../shared/tools into target/peers/; its build needs these, unless a 1.25 is
  # already on PATH or built there.
  root=$(cd "$(dirname "$0")/.." && pwd)
  built="$root/target/peers/pgbouncer-1.25.2/pgbouncer"
  if [ -f "$root/../shared/tools/pgbouncer-1.25.2-13a344f.tar.gz" ]; then
    case "$(pgbouncer -V 2>/dev/null || true) / $("$built" -V 2>/dev/null || true)" in
      *"PgBouncer 1.25"*) ;;
      *)
        for p in gcc make autoconf automake libtool pkg-config libevent-dev libssl-dev; do
          dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
        done
        ;;
    esac
  fi
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts a default cluster on install; sluice's tests use their own.
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | while read -r v n; do
      $sudo_cmd pg_ctlcluster "$v" "$n" stop 2>/dev/null || true
    done
  fi
  # Peers started by their packages would hold ports; the lab starts its own.
  $sudo_cmd systemctl stop pgbouncer pgpool2 etcd patroni haproxy 2>/dev/null || true
  $sudo_cmd service etcd stop 2>/dev/null || true
  $sudo_cmd service pgbouncer stop 2>/dev/null || true
  $sudo_cmd service pgpool2 stop 2>/dev/null || true
  $sudo_cmd service haproxy stop 2>/dev/null || true
fi
# Playwright for the browser test, in target/web-venv (quiet when up to date).
bash "$(dirname "$0")/../tests/web/setup.sh"
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust (rustup) first" >&2
  exit 1
fi
