"""`python3 -m lab <scenario> [options]`: parse, plan, run, print, save.

One entry point for every scenario, the `demo` meta-scenario (what `make demo` runs: three
scenarios in quick mode, ending with their tables) and `all`.  The whole plan is estimated
before anything starts so the progress line can say how long is left; tables go to stdout,
progress and warnings to stderr; with --out DIR each scenario also writes DIR/<name>.json and
DIR/<name>*.svg (+ .png when rsvg-convert is installed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

import pglab
from pglab import LabError

from lab.options import Options
from lab.progress import Progress, fmt_duration
from lab.report import Report
from lab.scenarios import DEMO, SCENARIOS
from lab.scenarios.common import Context
from lab.targets import KINDS, OTHER_KINDS, Skipped


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a comma list of numbers, got {text!r}")


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS + OTHER_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown target(s) {bad}: choose from "
                                         f"{', '.join(KINDS + OTHER_KINDS)}")
    return kinds


def parser() -> argparse.ArgumentParser:
    names = ", ".join(list(SCENARIOS) + ["demo", "all"])
    ap = argparse.ArgumentParser(
        prog="python3 -m lab",
        description="sluice lab: the field experiments of EXPERIMENTS.md on throwaway "
                    "PostgreSQL clusters, sluice, PgBouncer and Pgpool-II.",
        epilog="`python3 -m lab --list` describes the scenarios.  Full mode takes minutes per "
               "scenario; --quick takes seconds per run.")
    ap.add_argument("scenario", nargs="?", help=f"one of: {names}")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--quick", action="store_true", help="seconds per run (demo, CI)")
    ap.add_argument("--out", type=Path, help="also write JSON and SVG/PNG plots into this dir")
    ap.add_argument("--scale", type=int, help="pgbench scale factor")
    ap.add_argument("--duration", type=float, help="seconds per pgbench run")
    ap.add_argument("--clients", type=_int_list, help="client counts, comma list")
    ap.add_argument("--pool-size", type=_int_list, dest="pool_sizes",
                    help="pool size(s), comma list (pool-size sweeps them)")
    ap.add_argument("--targets", type=_kinds, help=f"comma list of {', '.join(KINDS)} "
                    "(failover: sluice, haproxy)")
    ap.add_argument("--script", help="pgbench workload: tpcb, select, write, read5000")
    ap.add_argument("--p99-bound", type=float, dest="p99_bound_ms",
                    help="pool-size: latency bound (p99, ms) for the recommendation")
    ap.add_argument("--idle", type=int, help="idle: how many idle connections (default 1000)")
    ap.add_argument("--modes", help="compare: query modes, comma list (simple,extended)")
    ap.add_argument("--logical", action=argparse.BooleanOptionalAction, default=None,
                    help="replication-throughput: add the logical subscriber (default: full "
                         "mode only)")
    ap.add_argument("--rounds", type=int, help="pool-size: rounds over all sizes (median)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                    help="read-replica: pin the primary and the replica to a core each")
    ap.add_argument("--render", type=Path, metavar="DIR",
                    help="redraw tables and plots from the JSON files in DIR (no runs)")
    ap.add_argument("--jobs", type=int, default=2, help="pgbench -j (default 2)")
    ap.add_argument("--nice", type=int, default=0,
                    help="renice the lab and everything it starts by this much (e.g. 19)")
    return ap


def list_scenarios() -> str:
    lines = ["scenario                experiment  quick     full      what"]
    for name, mod in SCENARIOS.items():
        q = sum(e for _, e in mod.plan(mod.settings(Options(quick=True))))
        f = sum(e for _, e in mod.plan(mod.settings(Options(quick=False))))
        lines.append(f"{name:<23} {mod.EXPERIMENT:<11} ~{fmt_duration(q):<8} "
                     f"~{fmt_duration(f):<8} {mod.TITLE}")
    q = sum(sum(e for _, e in SCENARIOS[n].plan(SCENARIOS[n].settings(Options(quick=True))))
            for n in DEMO)
    lines.append(f"{'demo':<23} {'E1,E4,E5':<11} ~{fmt_duration(q):<8} {'':<9} "
                 f"{', '.join(DEMO)} in quick mode (make demo)")
    lines.append(f"{'all':<23} {'':<11} {'':<9} {'':<9} every scenario in turn")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.list:
        print(list_scenarios())
        return 0
    if a.render:
        return render_saved(a.render, a.out or a.render)
    if not a.scenario:
        ap.print_usage()
        print("\n" + list_scenarios())
        return 2
    if a.scenario == "demo":
        names, quick = list(DEMO), True
    elif a.scenario == "all":
        names, quick = list(SCENARIOS), a.quick
    elif a.scenario in SCENARIOS:
        names, quick = [a.scenario], a.quick
    else:
        ap.error(f"unknown scenario {a.scenario!r}; try --list")
    opts = Options(quick=quick, scale=a.scale, duration=a.duration, clients=a.clients,
                   pool_sizes=a.pool_sizes, targets=a.targets, script=a.script,
                   p99_bound_ms=a.p99_bound_ms, jobs=a.jobs, out=a.out)
    if a.idle is not None:
        opts.extra["idle"] = a.idle
    if a.modes:
        opts.extra["modes"] = [m.strip() for m in a.modes.split(",") if m.strip()]
    if a.rounds:
        opts.extra["rounds"] = a.rounds
    if a.pin is not None:
        opts.extra["pin"] = a.pin
    if a.logical is not None:
        opts.extra["logical"] = a.logical
    problem = missing_binaries(testkit=any(getattr(SCENARIOS[n], "USES_TESTKIT", True)
                                           for n in names))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1

    if a.nice:
        os.nice(a.nice)
    pglab.raise_nofile(20000)
    pglab.install_signal_handlers()
    os.environ["PGSSLMODE"] = "disable"  # loopback; and Pgpool-II's refusals stay readable
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)

    progress = Progress()
    plans = {}
    for name in names:
        mod = SCENARIOS[name]
        s = mod.settings(opts)
        s["mode"] = "quick" if quick else "full"
        plans[name] = s
        progress.add_plan(mod.plan(s))
    total = progress.left_seconds()
    print(f"sluice lab {a.scenario}: {', '.join(names)} ({'quick' if quick else 'full'} mode), "
          f"about {fmt_duration(total)} ...", file=sys.stderr, flush=True)

    ctx = Context(options=opts, progress=progress)
    failed, reports = [], []
    t0 = time.monotonic()
    try:
        for name in names:
            mod = SCENARIOS[name]
            started = time.monotonic()
            load_start = _loadavg()
            try:
                report = mod.run(plans[name], ctx)
            except (LabError, Skipped) as e:
                failed.append(name)
                progress.note(f"error in {name}: {e}")
                continue
            report.wall_seconds = round(time.monotonic() - started, 1)
            report.settings["date"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            report.settings["loadavg"] = {"start": load_start, "end": _loadavg()}
            report.settings["machine"] = {k: v for k, v in pglab.machine_info().items()
                                          if k in ("nproc", "cpu_model", "mem_total_kb",
                                                   "kernel")}
            reports.append(report)
            if a.out:
                written = save(report, a.out)
                progress.note("wrote " + ", ".join(str(p) for p in written))
            if len(names) > 1:
                progress.note(f"{name} done in {fmt_duration(report.wall_seconds)}; its "
                              "table follows at the end")
    except KeyboardInterrupt:
        progress.close()
        print_reports(reports)
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        return 130
    progress.close()
    print_reports(reports)
    print(f"(lab {a.scenario}: {fmt_duration(time.monotonic() - t0)} in all; everything it "
          "started was stopped" + (f"; FAILED: {', '.join(failed)}" if failed else "") + ")",
          file=sys.stderr)
    return 1 if failed else 0


def _loadavg() -> str | None:
    """The machine's load when a scenario starts and ends: the lab shares its cores."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


def print_reports(reports) -> None:
    """The tables, all together at the end (a demo ends with its three tables)."""
    for report in reports:
        print("\n" + report.render(), flush=True)


def render_saved(src: Path, out: Path) -> int:
    """Redraw every saved report in src (after a change to a table or a plot)."""
    import json
    reports = []
    order = list(SCENARIOS)
    docs = [json.loads(p.read_text()) for p in src.glob("*.json")]
    docs.sort(key=lambda d: order.index(d["scenario"]) if d.get("scenario") in order else 99)
    for doc in docs:
        mod = SCENARIOS.get(doc.get("scenario"))
        if mod is None:
            continue
        report = Report.from_json(doc)
        mod.render(report)
        out.mkdir(parents=True, exist_ok=True)
        save(report, out)
        reports.append(report)
    print_reports(reports)
    return 0 if reports else 1


def save(report, out: Path) -> list[Path]:
    path = out / f"{report.scenario}.json"
    report.save_json(path)
    md = out / f"{report.scenario}.md"
    md.write_text(report.markdown())
    written = [path, md]
    for fig in report.figures:
        written += fig.save(out)
    return written


def missing_binaries(testkit: bool = True) -> str | None:
    """What must exist before anything starts (failover starts its clusters with Patroni,
    so it does without the testkit)."""
    tk = pglab.testkit_cmd()
    if testkit and len(tk) == 1 and not Path(tk[0]).exists():
        return (f"{tk[0]} not found: build it first (cargo build --release -p sluice "
                "-p sluice-testkit, or make build)")
    if not Path(pglab.sluice_bin()).exists():
        return f"{pglab.sluice_bin()} not found: cargo build --release -p sluice (or make build)"
    try:
        pglab.pg_bin("pgbench")
    except LabError as e:
        return f"{e} (make deps installs PostgreSQL)"
    return None
