#!/usr/bin/env python3
"""make demo: the lab's three headline experiments in quick mode, ending with their tables.

Runs `python3 -m lab demo` (see lab/ and docs/lab.md): max-connections (E1: 150 clients
against max_connections=100, directly and through sluice, PgBouncer and Pgpool-II),
idle (E4: 1,000 idle connections, direct vs sluice; pool 20 vs 100) and read-replica (E5:
selects moved to a streaming replica).  Each starts its own throwaway PostgreSQL with the
testkit and stops everything at the end.  Extra arguments go to the lab, e.g.
`python3 scripts/demo.py --out demo-results` to also get JSON and SVG plots.

Environment: SLUICE_BIN (default target/release/sluice), SLUICE_TESTKIT (default
target/release/sluice-testkit), PGBOUNCER_BIN, PG_BINDIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["demo"] + sys.argv[1:]))
