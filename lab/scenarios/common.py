"""Pieces every scenario repeats: the run context, looping over targets, warm-up, samplers.

`Context` is what the CLI hands a scenario (options, progress line).  `each_target` opens
the targets one after another, records a peer that cannot run as skipped (with the reason,
on the progress output and in the report) and keeps going; `measure` is one recorded pgbench
run with the server-connection sampler around it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab import pgbench, pools
from lab.options import Options
from lab.progress import Progress
from lab.report import Report
from lab.targets import LABELS, Skipped, open_target


@dataclass
class Context:
    options: Options
    progress: Progress


def each_target(ctx: Context, report: Report, stack, cluster, kinds, **target_kw):
    """Yield each started target in turn; skipped peers are noted in the report."""
    for kind in kinds:
        try:
            with open_target(stack, kind, cluster, **target_kw) as target:
                report.data.setdefault("targets", {})[kind] = {
                    "describe": target.describe, "config": target.config or None}
                yield target
        except Skipped as e:
            report.skipped[LABELS.get(kind, kind)] = str(e)
            ctx.progress.note(f"skipped {LABELS.get(kind, kind)}: {e}")


def warm_up(ctx: Context, stack, target, label: str, *, clients: int, duration: float,
            scale: int, workload: str = "select", dbname: str | None = None) -> None:
    """Fill the pool and the caches; not recorded."""
    if duration <= 0:
        return
    with ctx.progress.step(label):
        pgbench.run(stack, target, pgbench.workload(workload), clients=clients,
                    duration=duration, scale=scale, latency_log=False, count_refused=False,
                    dbname=dbname)


def measure(ctx: Context, stack, cluster, target, label: str, wl, *, clients: int,
            duration: float, scale: int, console: bool = False, **kw) -> dict:
    """One recorded run, with PostgreSQL's (and the console's, if asked) view sampled."""
    with ctx.progress.step(label):
        with pools.PoolSampler(stack, target, cluster, console=console,
                               dbname=kw.get("dbname")) as sampler:
            res = pgbench.run(stack, target, wl, clients=clients, duration=duration,
                              scale=scale, jobs=ctx.options.jobs, progress=ctx.progress, **kw)
        res["pool_samples"] = sampler.samples
        res["pools"] = pools.summarize(sampler.samples)
        res["target"] = target.kind
        res["workload"] = wl.key
        if not target.alive():
            res["error"] = f"{target.label} exited with code {target.proc.returncode}"
            if target.log_tail:
                res["log_tail"] = target.log_tail()
            ctx.progress.note(f"{target.label} died during '{label}':\n{res.get('log_tail', '')}")
    return res


def server_peak(res: dict) -> int | None:
    """Peak count of the role's server connections seen by PostgreSQL during a run."""
    totals = [x.get("total") for x in res.get("pool_samples") or ()
              if x.get("source") == "server side" and isinstance(x.get("total"), int)]
    return max(totals) if totals else None


def refresh_pools(rows: list[dict]) -> None:
    """(Re)summarize each run's pool samples, so saved results redraw with today's summary."""
    for r in rows:
        if r.get("pool_samples") is not None:
            r["pools"] = pools.summarize(r["pool_samples"])
