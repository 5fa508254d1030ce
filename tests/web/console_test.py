"""Browser test of sluice's web console (run by tests/tests/web_console.rs).

Drives the page at / with Playwright and Debian's chromium, as an operator
would: logs in, creates a database through the form, watches live numbers
while pgbench runs through sluice against it, resizes, pauses and resumes it,
takes a screenshot, removes it. Checks the JSON API next to the page (what
the page did is what the API says) and its access rules: no credentials 401,
a stats_users user 403 on changes.

Every step prints one line; the first failed check ends the run with exit
status 1 and says what was expected and what was seen.
"""

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect, sync_playwright

DB = "webdb"
STEP_TIMEOUT_MS = 10_000


class Failed(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def check(cond, what):
    if not cond:
        raise Failed(what)


# --- the JSON API, with urllib ------------------------------------------------


class Api:
    def __init__(self, base):
        self.base = base.rstrip("/")

    def call(self, method, path, creds=None, body=None):
        """Returns (status, headers, parsed JSON or raw text or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if creds is not None:
            token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                status, headers, raw = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            status, headers, raw = e.code, e.headers, e.read()
        text = raw.decode("utf-8", "replace")
        try:
            parsed = json.loads(text) if text.strip() else None
        except ValueError:
            parsed = text
        return status, headers, parsed

    def expect(self, method, path, creds, want, body=None):
        status, headers, parsed = self.call(method, path, creds, body)
        check(
            status == want,
            f"{method} {path} as {creds[0] if creds else 'nobody'}: "
            f"expected {want}, got {status} {parsed!r}",
        )
        return parsed, headers

    def rows(self, what, creds):
        parsed, _ = self.expect("GET", f"/api/{what}", creds, 200)
        check(isinstance(parsed, list), f"/api/{what} is not a JSON array: {parsed!r}")
        return parsed

    def database(self, creds, name):
        for row in self.rows("databases", creds):
            if row.get("name") == name:
                return row
        return None

    def pool(self, creds, db, user):
        for row in self.rows("pools", creds):
            if row.get("database") == db and row.get("user") == user:
                return row
        return None


def expect_error_body(parsed, what):
    check(
        isinstance(parsed, dict) and isinstance(parsed.get("error"), str) and parsed["error"],
        f"{what}: the body is not {{\"error\": \"...\"}}: {parsed!r}",
    )


# --- the page -------------------------------------------------------------------


def number(text):
    m = re.search(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(m.group(0)) if m else None


def cell(page, table, selector, column):
    return page.locator(f"table#{table} {selector} td.{column}").first


def cell_number(page, table, selector, column):
    loc = cell(page, table, selector, column)
    if loc.count() == 0:
        return None
    try:
        return number(loc.inner_text(timeout=1000))
    except PlaywrightError:
        return None


def status_text(page):
    loc = page.locator("div#status")
    try:
        return loc.inner_text(timeout=1000).strip() if loc.count() else "(no div#status)"
    except PlaywrightError:
        return "(div#status unreadable)"


def wait_until(what, timeout_s, probe, interval=0.1):
    """Calls probe() until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise Failed(f"{what}: not within {timeout_s}s (last seen: {last!r})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="http://127.0.0.1:METRICS_PORT")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--admin", required=True, help="user:password from admin_users")
    ap.add_argument("--stats", required=True, help="user:password from stats_users")
    ap.add_argument("--pg-host", required=True, help="the PostgreSQL the new database points at")
    ap.add_argument("--pg-port", required=True)
    ap.add_argument("--sluice-port", required=True)
    ap.add_argument("--app", required=True, help="user:password pgbench logs in with")
    ap.add_argument("--pgbench", default="pgbench")
    ap.add_argument("--screenshot", required=True)
    ap.add_argument("--docs-screenshot", default="")
    args = ap.parse_args()

    admin = tuple(args.admin.split(":", 1))
    stats = tuple(args.stats.split(":", 1))
    app = tuple(args.app.split(":", 1))
    api = Api(args.url)
    bench = None
    step = 0

    def say(msg):
        nonlocal step
        step += 1
        log(f"step {step:2}: {msg}")

    started = time.monotonic()
    try:
        # -- access rules, before the browser ----------------------------------
        for path in ("/", "/api/pools"):
            status, headers, _ = api.call("GET", path)
            check(status == 401, f"GET {path} without credentials: expected 401, got {status}")
            challenge = headers.get("WWW-Authenticate", "")
            check(
                challenge.startswith("Basic") and 'realm="sluice"' in challenge,
                f"GET {path} without credentials: WWW-Authenticate is {challenge!r}",
            )
        status, _, _ = api.call("GET", "/api/pools", (admin[0], "wrong-password"))
        check(status == 401, f"GET /api/pools with a wrong password: expected 401, got {status}")
        say('no credentials and a wrong password get 401 with WWW-Authenticate: Basic realm="sluice"')

        spec, _ = api.expect("GET", "/api/openapi.json", admin, 200)
        check(
            isinstance(spec, dict) and str(spec.get("openapi", "")).startswith("3"),
            f"/api/openapi.json is not an OpenAPI 3 document: {str(spec)[:200]!r}",
        )
        paths = spec.get("paths", {})
        for p in ("/api/pools", "/api/databases", "/api/stats", "/api/clients", "/api/hosts"):
            check(p in paths, f"/api/openapi.json has no path {p}: {sorted(paths)}")
        say(f"/api/openapi.json: OpenAPI {spec['openapi']}, {len(paths)} paths")

        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=args.chromium,
                headless=True,
                args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            )
            context = browser.new_context(
                http_credentials={"username": admin[0], "password": admin[1]},
                viewport={"width": 1280, "height": 900},
            )
            page = context.new_page()
            page.on("dialog", lambda d: d.accept())
            console_errors = []
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            failed_loads = []
            page.on(
                "response",
                lambda r: failed_loads.append(f"{r.status} {r.url}") if r.status >= 400 else None,
            )

            def on_console(m):
                if m.type != "error":
                    return
                url = (m.location or {}).get("url", "")
                # Chromium asks for /favicon.ico by itself; the page links none.
                if m.text.startswith("Failed to load resource") and url.endswith("/favicon.ico"):
                    return
                console_errors.append(f"{m.text} ({url})" if url else m.text)

            page.on("console", on_console)
            page.set_default_timeout(STEP_TIMEOUT_MS)

            try:
                # -- the page loads -------------------------------------------------
                resp = page.goto(args.url + "/")
                check(resp is not None and resp.status == 200, f"GET / as admin: {resp and resp.status}")
                expect(page.locator("table#pools")).to_be_visible()
                expect(page.locator("table#databases")).to_be_visible()
                expect(page.locator('table#pools tr[data-db="postgres"][data-user]').first).to_be_attached()
                expect(page.locator('table#databases tr[data-db="postgres"]')).to_be_attached()
                pools_rows = page.locator("table#pools tr[data-db]").count()
                db_rows = page.locator("table#databases tr[data-db]").count()
                say(
                    f"page {page.title()!r} loaded as {admin[0]}: table#pools has {pools_rows} row(s), "
                    f"table#databases {db_rows} row(s)"
                )
                check(
                    page.locator('table#databases tr[data-db="postgres"] button.remove').count() == 0,
                    "the configured database postgres (not managed) has a Remove button",
                )
                say("database postgres (from the ini) shows no controls")

                # -- create through the form ------------------------------------------
                form = page.locator("form#create-db")
                form.locator('input[name="name"]').fill(DB)
                form.locator('input[name="host"]').fill(args.pg_host)
                form.locator('input[name="port"]').fill(str(args.pg_port))
                form.locator('input[name="dbname"]').fill("postgres")
                form.locator('select[name="pool_mode"]').select_option("transaction")
                form.locator('input[name="pool_size"]').fill("3")
                form.locator("button#create").click()
                row = page.locator(f'table#databases tr[data-db="{DB}"]')
                expect(row).to_be_attached()
                expect(row.locator("td.pool_size")).to_have_text("3")
                expect(row.locator("button.remove")).to_be_visible()
                say(f"created {DB} through form#create-db; its row shows pool_size 3; status: {status_text(page)!r}")
                got = api.database(admin, DB)
                check(got is not None, f"/api/databases has no {DB} after the form created it")
                check(got.get("managed") is True, f"/api/databases {DB}: managed is {got.get('managed')!r}")
                check(got.get("pool_size") == 3, f"/api/databases {DB}: pool_size is {got.get('pool_size')!r}")
                check(
                    got.get("pool_mode") == "transaction",
                    f"/api/databases {DB}: pool_mode is {got.get('pool_mode')!r}",
                )
                check(
                    str(got.get("port")) == str(args.pg_port) and got.get("database") == "postgres",
                    f"/api/databases {DB}: port/database are {got.get('port')!r}/{got.get('database')!r}",
                )
                say(f"/api/databases: {DB} managed=true pool_size=3 pool_mode=transaction")

                # -- load through sluice, watched on the page --------------------------
                script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
                script.write("select pg_sleep(0.005);\n")
                script.close()
                env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
                env.update(PGPASSWORD=app[1], PGCONNECT_TIMEOUT="10", LC_ALL="C")
                bench_cmd = [
                    args.pgbench, "-n", "-f", script.name, "-c", "6", "-j", "2", "-T", "20",
                    "-h", "127.0.0.1", "-p", str(args.sluice_port), "-U", app[0], DB,
                ]
                bench = subprocess.Popen(
                    bench_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
                bench_started = time.monotonic()
                say(f"pgbench started: 6 clients, select pg_sleep(0.005), 20 s, on {DB} through sluice")

                pool_sel = f'tr[data-db="{DB}"][data-user="{app[0]}"]'

                def busy():
                    cl = cell_number(page, "pools", pool_sel, "cl_active")
                    tps = number(page.locator("span#tps").inner_text())
                    return (cl, tps) if cl and cl > 0 and tps and tps > 0 else None

                cl, tps = wait_until("td.cl_active and span#tps above 0", 10, busy)
                for column in ("cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait_us"):
                    check(
                        cell(page, "pools", pool_sel, column).count() == 1,
                        f"table#pools row {DB}/{app[0]} has no td.{column}",
                    )
                say(f"under load the page shows td.cl_active={cl:g}, span#tps={tps:g}")

                # sv_active never above pool_size 3 (JSON API, polled for ~1.5 s)
                most = 0
                for _ in range(15):
                    p = api.pool(admin, DB, app[0])
                    check(p is not None, f"/api/pools has no {DB}/{app[0]} row under load")
                    check(
                        isinstance(p.get("sv_active"), int) and isinstance(p.get("cl_active"), int),
                        f"/api/pools numbers are not JSON numbers: {p!r}",
                    )
                    most = max(most, p["sv_active"])
                    time.sleep(0.1)
                check(0 < most <= 3, f"pool_size 3: sv_active peaked at {most}")
                say(f"/api/pools: sv_active peaks at {most} with pool_size 3 (6 clients)")

                # -- resize to 5 through the UI ------------------------------------------
                row.locator("input.pool-size").fill("5")
                row.locator("button.resize").click()
                expect(row.locator("td.pool_size")).to_have_text("5")
                say(f"resized to 5 in the UI: td.pool_size shows 5; status: {status_text(page)!r}")
                got = api.database(admin, DB)
                check(got and got.get("pool_size") == 5, f"/api/databases {DB} after resize: {got!r}")

                def wider():
                    p = api.pool(admin, DB, app[0])
                    return p["sv_active"] if p and p.get("sv_active", 0) > 3 else None

                wide = wait_until("sv_active above the old pool_size 3 after the resize", 8, wider, 0.05)
                say(f"/api/databases pool_size=5, and /api/pools sv_active reaches {wide} (> 3)")

                # -- pause and resume ---------------------------------------------------------
                row.locator("button.pause").click()
                expect(row.locator("td.paused")).to_have_text(re.compile(r"^\s*(1|true|yes)\s*$", re.I))
                say(f"paused in the UI: td.paused shows {row.locator('td.paused').inner_text()!r}; status: {status_text(page)!r}")
                got = api.database(admin, DB)
                check(got and got.get("paused") in (1, True), f"/api/databases {DB} after pause: {got!r}")
                time.sleep(1.2)  # whatever was under way finishes
                before = next((r for r in api.rows("stats", admin) if r.get("database") == DB), None)
                time.sleep(1.5)
                after = next((r for r in api.rows("stats", admin) if r.get("database") == DB), None)
                check(before and after, f"/api/stats has no {DB} row: {before!r}")
                check(
                    after["total_xact_count"] == before["total_xact_count"],
                    f"paused, yet transactions went on: total_xact_count "
                    f"{before['total_xact_count']} -> {after['total_xact_count']}",
                )
                tps_paused = wait_until(
                    "span#tps at 0 while paused", 5,
                    lambda: (lambda t: "0" if t == 0 else None)(number(page.locator("span#tps").inner_text())),
                )
                say(f"while paused no transaction runs (/api/stats total_xact_count stays {after['total_xact_count']}), span#tps={tps_paused}")
                row.locator("button.resume").click()
                expect(row.locator("td.paused")).to_have_text(re.compile(r"^\s*(0|false|no)\s*$", re.I))
                cl, tps = wait_until("span#tps above 0 after resume", 10, busy)
                say(f"resumed in the UI: td.paused shows {row.locator('td.paused').inner_text()!r}, load is back (span#tps={tps:g}); status: {status_text(page)!r}")

                # -- the chart, and the screenshot ---------------------------------------------
                chart = page.locator("svg#tps-chart")
                expect(chart).to_be_visible()
                time.sleep(2)  # a few more points on the chart

                def drawn():
                    # a line (polyline points or path d) with several distinct heights
                    for shape in chart.locator("polyline, path").all():
                        coords = shape.get_attribute("points") or shape.get_attribute("d") or ""
                        nums = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", coords)]
                        ys = nums[1::2]
                        if len(ys) >= 3 and len(set(ys)) >= 2:
                            return (len(ys), min(ys), max(ys))
                    return None

                points, top, bottom = wait_until("svg#tps-chart draws a line that moves", 5, drawn)
                os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
                page.screenshot(path=args.screenshot, full_page=True)
                say(
                    f"svg#tps-chart draws {points} points (y {top:g}..{bottom:g}); "
                    f"full-page screenshot at {args.screenshot}"
                )
                if args.docs_screenshot:
                    shutil.copyfile(args.screenshot, args.docs_screenshot)
                    say(f"copied to {args.docs_screenshot}")

                # -- pgbench ends cleanly --------------------------------------------------------
                out, err = bench.communicate(timeout=max(5, 40 - (time.monotonic() - bench_started)))
                bench_ok = bench.returncode == 0 and "number of failed transactions: 0" in out
                tps_line = next((l for l in out.splitlines() if l.startswith("tps")), "")
                xacts = next((l for l in out.splitlines() if "transactions actually processed" in l), "")
                bench = None
                check(bench_ok, f"pgbench exited {bench_ok}:\n{out}\n{err}")
                say(f"pgbench done, no failed transaction: {xacts.strip()}; {tps_line.strip()}")

                stats_row = next((r for r in api.rows("stats", admin) if r.get("database") == DB), None)
                check(
                    stats_row and isinstance(stats_row.get("total_xact_count"), int)
                    and stats_row["total_xact_count"] > 0,
                    f"/api/stats {DB}: {stats_row!r}",
                )
                say(f"/api/stats: {DB} total_xact_count={stats_row['total_xact_count']}")
                hosts = api.rows("hosts", admin)
                clients = api.rows("clients", admin)
                say(f"/api/hosts: {len(hosts)} row(s); /api/clients: {len(clients)} row(s)")

                # -- what a stats_users user may and may not do --------------------------------
                api.rows("pools", stats)
                api.rows("databases", stats)
                parsed, _ = api.expect(
                    "POST", "/api/databases", stats, 403,
                    {"name": "nope", "host": args.pg_host, "port": int(args.pg_port),
                     "dbname": "postgres", "pool_mode": "session", "pool_size": 1},
                )
                expect_error_body(parsed, "POST /api/databases as stats user")
                parsed, _ = api.expect("PATCH", f"/api/databases/{DB}", stats, 403, {"pool_size": 1})
                expect_error_body(parsed, "PATCH as stats user")
                parsed, _ = api.expect("POST", f"/api/databases/{DB}/pause", stats, 403)
                parsed, _ = api.expect("DELETE", f"/api/databases/{DB}", stats, 403)
                check(api.database(admin, DB).get("pool_size") == 5, "a 403 changed the database")
                say(f"stats user {stats[0]}: GET 200; POST, PATCH, pause, DELETE 403 with {{\"error\"}}: {parsed!r}")

                # -- what the API refuses an admin -----------------------------------------------
                parsed, _ = api.expect("PATCH", "/api/databases/postgres", admin, 409, {"pool_size": 7})
                expect_error_body(parsed, "PATCH on a database from the ini")
                api.expect("DELETE", "/api/databases/postgres", admin, 409)
                status, _, parsed = api.call(
                    "POST", "/api/databases", admin,
                    {"name": DB, "host": args.pg_host, "port": int(args.pg_port),
                     "dbname": "postgres", "pool_mode": "session", "pool_size": 1},
                )
                check(400 <= status < 500, f"POST of an existing name: {status} {parsed!r}")
                expect_error_body(parsed, "POST of an existing name")
                seen = [f"duplicate POST {status}"]
                status, _, parsed = api.call("POST", "/api/databases", admin, {"name": "x"})
                check(400 <= status < 500, f"POST with no host/port: {status} {parsed!r}")
                expect_error_body(parsed, "POST with no host/port")
                seen.append(f"POST without host/port {status}")
                status, _, parsed = api.call("PATCH", "/api/databases/nosuchdb", admin, {"pool_size": 2})
                check(400 <= status < 500, f"PATCH of an unknown database: {status} {parsed!r}")
                seen.append(f"PATCH of an unknown name {status}")
                status, _, parsed = api.call("PATCH", f"/api/databases/{DB}", admin, {"pool_size": "many"})
                check(400 <= status < 500, f"PATCH with pool_size \"many\": {status} {parsed!r}")
                seen.append(f"PATCH pool_size \"many\" {status}")
                base = {"host": args.pg_host, "port": int(args.pg_port), "dbname": "postgres",
                        "pool_mode": "session", "pool_size": 1}
                for label, override in [
                    ("name pgbouncer (the admin console)", {"name": "pgbouncer"}),
                    ("name postgres (in the ini)", {"name": "postgres"}),
                    ("a name with a space", {"name": "a b"}),
                    ("a name with a newline", {"name": "a\n[pgbouncer]\nlisten_port = 1"}),
                    ("a host with key=value after it", {"name": "inj", "host": "127.0.0.1 user=postgres"}),
                    ("a dbname with key=value after it", {"name": "inj", "dbname": "postgres user=postgres"}),
                    ("pool_mode bogus", {"name": "inj", "pool_mode": "bogus"}),
                    ("pool_size -1", {"name": "inj", "pool_size": -1}),
                    ("port 0", {"name": "inj", "port": 0}),
                ]:
                    status, _, parsed = api.call("POST", "/api/databases", admin, {**base, **override})
                    check(400 <= status < 500, f"POST with {label}: {status} {parsed!r}")
                    expect_error_body(parsed, f"POST with {label}")
                    seen.append(f"{label} {status}")
                check(api.database(admin, "inj") is None, "a refused POST created database inj")
                say(f"admin: PATCH/DELETE of ini database postgres 409; {', '.join(seen)}, each with {{\"error\"}}")
                status, _, _ = api.call("GET", "/api/pools", app)
                check(status in (401, 403), f"GET /api/pools as {app[0]} (neither admin nor stats user): {status}")
                say(f"{app[0]}, in the auth file but neither admin_users nor stats_users: {status}")

                # -- remove through the UI ------------------------------------------------------
                row.locator("button.remove").click()
                expect(row).to_have_count(0)
                check(api.database(admin, DB) is None, f"/api/databases still lists {DB} after Remove")
                say(f"removed {DB} in the UI: its row is gone, /api/databases no longer lists it; status: {status_text(page)!r}")

                if failed_loads:
                    say(f"requests the browser made that failed: {failed_loads!r}")
                if console_errors:
                    say(f"browser console errors: {console_errors[:5]!r}")
                check(not console_errors, f"the page logged errors: {console_errors[:5]!r}")
                browser.close()
            except Exception:
                failed = os.path.splitext(args.screenshot)[0] + "-failed.png"
                try:
                    page.screenshot(path=failed, full_page=True)
                    log(f"page at the failure: {failed}")
                except Exception:
                    pass
                raise
        log(f"web console test passed in {time.monotonic() - started:.1f}s")
        return 0
    except (Failed, PlaywrightError, AssertionError) as e:
        log(f"FAILED after step {step}: {e}")
        return 1
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait()


if __name__ == "__main__":
    sys.exit(main())
