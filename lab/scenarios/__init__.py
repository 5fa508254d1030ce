"""The scenarios, in the order `--list` and `all` show them, and the demo's selection.

Each module has NAME, EXPERIMENT, TITLE, `settings(options) -> dict` (quick/full defaults
plus overrides), `plan(settings) -> [(label, seconds)]` (for the progress line, computed
without starting anything), `run(settings, context) -> Report` (measures, keeps what it
measured in report.data) and `render(report)` (tables, headline, figures from that data -
also used by `--render DIR` to redraw saved results).
"""

from lab.scenarios import (compare, failover, idle, max_connections, pool_size, read_replica,
                           reconnect, replication)

SCENARIOS = {m.NAME: m for m in (max_connections, replication, reconnect, idle, read_replica,
                                 pool_size, compare, failover)}

# `make demo`: what a new user sees first, in quick mode.
DEMO = ("max-connections", "idle", "read-replica")
