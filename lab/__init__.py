"""sluice lab: reproduces the field experiments (../shared/EXPERIMENTS.md, E1-E5) on one machine.

Run it from the repository root as `python3 -m lab <scenario> [--quick] [--out DIR]`
(`python3 -m lab --list` lists the scenarios).  Every scenario starts its own throwaway
PostgreSQL cluster(s) with the testkit, the poolers it compares (sluice, and PgBouncer and
Pgpool-II when installed), runs pgbench, stops everything, and prints a table; `--out DIR`
also writes JSON and SVG (and PNG when rsvg-convert is installed) plots.

The process plumbing (cleanup registry, pgbench output parser, /proc readers) is shared with
scripts/bench.py through scripts/pglab.py, which this package imports as `pglab`.
"""

import sys
from pathlib import Path

_SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
if str(_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(_SCRIPTS))
