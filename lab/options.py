"""Command-line overrides, quick/full defaults, and time estimates shared by all scenarios.

Each scenario turns an `Options` into its own settings dict with `o.pick(quick, full)` for
every default and the user's `--scale/--duration/--clients/...` on top, so "what does quick
mode run" is visible in one place per scenario.  The estimates feed the progress line; they
were measured on the 2-core development machine and only need to be roughly right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Options:
    quick: bool = False
    scale: int | None = None
    duration: float | None = None
    clients: list[int] | None = None
    pool_sizes: list[int] | None = None
    targets: list[str] | None = None
    script: str | None = None
    p99_bound_ms: float | None = None
    jobs: int = 2
    out: Path | None = None
    extra: dict = field(default_factory=dict)

    def pick(self, quick, full):
        return quick if self.quick else full

    def targets_or(self, default: list[str]) -> list[str]:
        return [t for t in (self.targets or default)]


def cluster_seconds(scale: int, replica: bool = False) -> float:
    """testkit start + pgbench -i (about 0.13 s per scale unit here) + base backup."""
    return 2 + 0.13 * scale + ((2 + 0.05 * scale) if replica else 0)


def run_seconds(duration: float, clients: int = 10, connect_each: bool = False) -> float:
    """One pgbench run: its duration plus connection setup, log parsing, teardown."""
    return duration + 0.4 + clients / 400


def refused_run_seconds(duration: float, clients: int) -> float:
    """A run whose clients are refused: the aborted try, a probe, the admitted clients' run."""
    return run_seconds(duration, clients) + 2


def idle_open_seconds(n: int, direct: bool) -> float:
    """Opening n idle connections that each read information_schema."""
    return 1 + n * (0.02 if direct else 0.004)
