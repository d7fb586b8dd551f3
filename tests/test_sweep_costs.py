"""What each run cost, as loadtest/sweep measures it: server CPU per request
(the whole process tree: threads, and children reaped during the run),
context switches, peak memory and tasks, who was busy, p99.9 with wrk; the
cost summary table (--costs: beside idle connections, nginx in it) and the
open-loop mode (--rate, httperf).

Real processes: one small sweep of forking and threaded with ab, one of
epoll with wrk, one --costs and one --rate sweep of epoll (a few seconds
each), and the sampler on a process with threads. The tests that measure
time or rate are marked serial: they run alone, not beside the parallel
tests (see conftest.py). The others hold under load (CPU per request and
tasks only grow with it) and run beside them, on one xdist worker
(conftest.py's ONE_WORKER), so each sweep runs once.
"""

import csv
import subprocess
import sys
import time

import pytest

from processes import REPO, python_with, spawn, stop

sys.path.insert(0, str(REPO / "loadtest"))
import harness  # noqa: E402
import report  # noqa: E402

SWEEP_TIMEOUT = 120  # seconds; each client run is bounded by the sweep too
COST_COLUMNS = ["server_us_per_req", "switches_per_req", "peak_rss_kib",
                "kib_per_conn", "peak_tasks", "server_cpu_pct",
                "redis_cpu_pct", "client_cpu_pct", "p999_ms"]
MODE_COLUMNS = ["offered_rps", "achieved_rps", "idle_conns", "idle_held"]
LEVEL = 50  # clients: enough for threaded to hold many threads at once
BUSY_US = 20  # µs of server CPU per request: clearly more than nothing
THREADS = 5  # the sampler's test process: main thread + these
SLACK = 2.0  # seconds for the sampler's first ten looks
IDLE = 200  # --costs test: idle keep-alive connections beside the load
RATE = 300  # --rate test: requests a second, well within epoll's reach
RATE_SHARE = 0.05  # the rate held within 5%


def sweep_rows(out, *options, table="runs.csv"):
    """loadtest/sweep with one run per level into out; the rows of its
    runs.csv (or another table) by server, and what it printed."""
    done = subprocess.run(
        [python_with("matplotlib"), "loadtest/sweep", "--no-build", "--runs",
         "1", "--out", str(out), *options],
        cwd=REPO, capture_output=True, text=True, timeout=SWEEP_TIMEOUT)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    with open(out / table, newline="") as f:
        rows = list(csv.DictReader(f))
    by_server = {}
    for row in rows:
        by_server.setdefault(row["server"], []).append(row)
    return {name: found[0] if len(found) == 1 else found
            for name, found in by_server.items()}, done.stdout


@pytest.fixture(scope="module")
def ab_sweep(tmp_path_factory):
    """forking and threaded at c=50 on /guestbook (Redis round trips keep
    each connection's process or thread alive a while)."""
    return sweep_rows(tmp_path_factory.mktemp("ab"), "--servers",
                      "forking,threaded", "--concurrency", str(LEVEL),
                      "--requests", "3000")


@pytest.fixture(scope="module")
def wrk_sweep(tmp_path_factory):
    return sweep_rows(tmp_path_factory.mktemp("wrk"), "--servers", "epoll",
                      "--concurrency", "10", "--client", "wrk",
                      "--duration", "1", "--path", "/")


def number(row, column):
    return float(row[column])


def test_forking_cpu_counts_reaped_children(ab_sweep):
    """Each request is a child process that exits: its CPU reaches us only
    through the parent's cutime/cstime."""
    row = ab_sweep[0]["forking"]
    assert row["status"] == "ok", row
    assert number(row, "server_us_per_req") > BUSY_US, row


def test_threaded_cpu_counts_threads(ab_sweep):
    """Each request is a thread, most gone by the end of the run."""
    row = ab_sweep[0]["threaded"]
    assert row["status"] == "ok", row
    assert number(row, "server_us_per_req") > BUSY_US, row
    assert int(row["peak_tasks"]) > 10, row


def test_cost_columns_present_and_numeric(ab_sweep):
    rows, stdout = ab_sweep
    for row in rows.values():
        columns = list(row)
        first = columns.index(COST_COLUMNS[0])
        assert columns[first:first + len(COST_COLUMNS)] == COST_COLUMNS
        assert columns[-len(MODE_COLUMNS):] == MODE_COLUMNS
        assert all(row[column] == "" for column in MODE_COLUMNS), row
        for column in COST_COLUMNS[:-1]:
            assert number(row, column) >= 0, (column, row)
        assert row["p999_ms"] == "", "ab has no p99.9: left empty"
        assert number(row, "peak_rss_kib") > 0
        assert 0 < number(row, "client_cpu_pct") <= 100
    # the console shows req/s, server CPU and p99 for every server
    for title in ("Requests per second", "Server CPU per request (µs)",
                  "p99 latency (ms)"):
        assert title in stdout
        lines = stdout.split(title)[1].strip().splitlines()
        header, row = ([c.strip() for c in line.strip("|").split("|")]
                       for line in (lines[0], lines[2]))
        assert header == ["concurrency", "forking", "threaded"], lines
        assert row[0] == str(LEVEL) and all(row[1:]), lines


def test_wrk_gives_p999(wrk_sweep):
    row = wrk_sweep[0]["epoll"]
    assert row["status"] == "ok", row
    assert number(row, "p999_ms") >= number(row, "p99_ms") > 0, row
    assert number(row, "server_us_per_req") > 0, row


@pytest.mark.serial
def test_sampler_sees_threads_and_samples_often():
    """The sampler's peak counts every thread, and it looks at a small tree
    ten times in a moment."""
    proc = spawn([sys.executable, "-c",
                  "import threading, time\n"
                  f"for _ in range({THREADS}):\n"
                  "    threading.Thread(target=time.sleep, args=(30,),"
                  " daemon=True).start()\n"
                  "print('ready', flush=True)\n"
                  "time.sleep(30)\n"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        sampler = harness.Sampler([proc.pid]).start()
        # 10 looks take 0.1 s (SAMPLE_MIN_GAP) of a tree this small; the
        # rest is slack for a machine busy with other work
        began = time.monotonic()
        while sampler.samples < 10 and time.monotonic() - began < SLACK:
            time.sleep(0.01)
        sampler.stop()
        assert sampler.samples >= 10, f"{sampler.samples} in {SLACK} s"
        assert sampler.peak.tasks == THREADS + 1
        assert sampler.peak.rss_kib > 0
    finally:
        stop(proc)


def test_old_runs_csv_still_loads(tmp_path):
    """A runs.csv from before these columns reads back with them empty,
    and its cost tables show `-`."""
    old = [f.name for f in report.dataclasses.fields(report.Run)
           if f.name not in COST_COLUMNS]
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old)
        writer.writeheader()
        writer.writerow({"server": "epoll", "concurrency": 20, "run": 1,
                         "n": 5000, "status": "ok", "rps": 15000.0,
                         "complete": 5000, "p99_ms": 4})
    runs = report.read_csv(path)
    assert runs[0].server_us_per_req is None and runs[0].p999_ms is None
    costs = report.grid(runs, report.column_cell("server_us_per_req"),
                        ["epoll"], [20])
    assert costs.splitlines()[-1].split("|")[2].strip() == "-"
    p99 = report.grid(runs, report.column_cell("p99_ms"), ["epoll"], [20])
    assert p99.splitlines()[-1].split("|")[2].strip() == "4"


def test_wrk_p999_parsed():
    text = ("  Latency Distribution\n     50%    1.00ms\n     99%    3.50ms\n"
            "  100 requests in 1.00s, 1.00MB read\nRequests/sec:    100.00\n"
            "    99.9%  4500.00us\n")
    found = harness.parse_wrk(text)
    assert found["p99_ms"] == 3.5 and found["p999_ms"] == 4.5


# ===== --costs: the cost summary table =====

@pytest.fixture(scope="module")
def costs_sweep(tmp_path_factory):
    """epoll and nginx on /, at c=50 alone and beside IDLE idle
    connections."""
    return sweep_rows(tmp_path_factory.mktemp("costs"), "--costs",
                      "--servers", "epoll", "--concurrency", "50",
                      "--idle", str(IDLE), "--requests", "1000",
                      table="costs.csv")


@pytest.mark.serial
def test_costs_table_has_every_column_and_nginx(costs_sweep):
    rows, stdout = costs_sweep
    assert set(rows) == {"epoll", "nginx"}, rows
    for name, (alone, beside) in rows.items():
        assert (alone["idle_conns"], beside["idle_conns"]) == ("0", str(IDLE))
        for row in (alone, beside):
            assert row["note"] == "", row
            for column in ("rps", "p99_ms", "server_us_per_req",
                           "switches_per_req", "kib_per_conn", "peak_tasks"):
                assert number(row, column) >= 0, (column, row)
            assert number(row, "server_us_per_req") > 0, row
        # an event loop and nginx keep every idle connection open
        assert int(beside["idle_held"]) == IDLE, beside
    assert int(rows["nginx"][0]["peak_tasks"]) == 2  # master + 1 worker
    for title in ("Cost summary: c = 50", f"beside {IDLE} idle"):
        assert title in stdout, stdout
    # the sentences are read from the numbers: nginx against epoll
    assert "nginx (1 worker) needed" in stdout, stdout


def test_surprises_read_the_numbers():
    """Each column's sentence names its largest and smallest and their
    ratio; nginx is compared with the cheapest of ours."""
    def row(server, us, kib, rps=1000.0):
        return {"server": server, "rps": rps, "p99_ms": 10.0,
                "server_us_per_req": us, "switches_per_req": 0.5,
                "kib_per_conn": kib, "peak_tasks": 3, "note": ""}
    rows = [row("forking", 400.0, 120.0), row("epoll", 20.0, 0.5),
            row("nginx", 30.0, 0.7, rps=2000.0)]
    text = "\n".join(report.surprises(rows, alone=[row("forking", 1, 1,
                                                         rps=4000.0)]))
    assert ("forking burned the most CPU per request (400 µs), 20x "
            "epoll's 20 µs") in text, text
    assert "forking grew the most per connection (120 KiB)" in text, text
    assert "forking kept the least of its req/s: 4000 alone, 1000 now " \
        "(25%)" in text, text
    assert "**nginx** (1 worker) needed 30 µs a request, 1.50x epoll's" \
        in text, text
    assert "**tasks**: the same for every server (3)" in text, text


# ===== --rate: open loop with httperf =====

@pytest.fixture(scope="module")
def rate_sweep(tmp_path_factory):
    return sweep_rows(tmp_path_factory.mktemp("rate"), "--servers", "epoll",
                      "--rate", str(RATE), "--duration", "2", "--path", "/")


@pytest.mark.serial
def test_rate_held_within_five_percent(rate_sweep):
    """epoll keeps up with a low rate: the open loop offers it, and the
    2xx replies come back at it, within 5%."""
    row, stdout = rate_sweep[0]["epoll"], rate_sweep[1]
    assert row["status"] == "ok", row
    assert int(row["offered_rps"]) == RATE
    assert int(row["n"]) == 2 * RATE, "--duration 2 at the rate"
    assert abs(number(row, "achieved_rps") - RATE) <= RATE_SHARE * RATE, row
    assert number(row, "p999_ms") >= number(row, "p99_ms") > 0, row
    assert number(row, "server_us_per_req") > 0, row
    knee = stdout.split("The knee")[1].strip().splitlines()[4]
    assert [c.strip() for c in knee.strip("|").split("|")][:2] == [
        "epoll", f"{RATE}"], knee


HTTPERF_REPORT = """\
Connection lifetime histogram (time in ms):
             0.5 90
             1.5 5
            12.5 2

Total: connections 100 requests 100 replies 97 test-duration 1.000 s
Connection time [ms]: min 0.1 avg 0.9 max 12.8 median 0.5 stddev 1.2
Reply status: 1xx=0 2xx=97 3xx=0 4xx=0 5xx=0
Errors: total 3 client-timo 2 socket-timo 0 connrefused 0 connreset 0
Errors: fd-unavail 1 addrunavail 0 ftab-full 0 other 0
"""


def test_httperf_percentiles_count_failures_as_timeout():
    """p50 and p99 come from the lifetime histogram over every request
    offered; the 3 that failed count as the timeout, so p99 is it."""
    found = harness.parse_httperf(HTTPERF_REPORT, timeout=2, offered=100)
    assert found["complete"] == 97
    assert found["achieved_rps"] == found["rps"] == 97.0
    assert found["timeouts"] == 2 and found["connect"] == 1
    assert found["failed"] == 3 and found["non2xx"] == 0
    assert found["p50_ms"] == 0.5 and found["mean_ms"] == 0.9
    assert found["p99_ms"] == 2000.0
    every = {"replies 97": "replies 100", "2xx=97": "2xx=100",
             "12.5 2": "12.5 5"}
    text = HTTPERF_REPORT
    for old, new in every.items():
        text = text.replace(old, new)
    quick = harness.parse_httperf(text, timeout=2, offered=100)
    assert quick["p99_ms"] == 12.5  # no failures: the slowest bin


# ===== --rate: a failure of the client is not the server's =====

# The sweep of 2026-11-29 11:24 (epoll, --rate 3000, run 1): httperf
# --hog ran out of its own ports (~32,000 left in TIME_WAIT by the rates
# before), spun in bind() until one expired, 59 s, and then timed out every
# connection it had open. The same server held 4,000 and 8,000 a minute on.
STALLED = """\
Total: connections 5082 requests 4137 replies 4116 test-duration 58.491 s
Reply status: 1xx=0 2xx=2481 3xx=0 4xx=0 5xx=0
Errors: total 3519 client-timo 1005 socket-timo 0 connrefused 0 connreset 0
Errors: fd-unavail 2514 addrunavail 0 ftab-full 0 other 0
"""
HELD = """\
Total: connections 6000 requests 6000 replies 6000 test-duration 2.004 s
Reply status: 1xx=0 2xx=6000 3xx=0 4xx=0 5xx=0
Errors: total 0 client-timo 0 socket-timo 0 connrefused 0 connreset 0
Errors: fd-unavail 0 addrunavail 0 ftab-full 0 other 0
"""


@pytest.fixture(scope="module")
def sweep_module():
    from scripts import load
    return load(REPO / "loadtest" / "sweep", "sweep_under_test")


def rate_run(text, status="not run", **fields):
    run = report.Run("epoll", 1000, 1, 6000, offered_rps=3000, **fields)
    harness.parse_httperf(text, 2, run.n, run)
    run.status = status
    return run


def test_client_trouble_read_from_httperf():
    """A run longer than --duration + --timeout stalled in httperf; no local
    port (addrunavail) or a full table (ftab-full) are the client's;
    fd-unavail (the --concurrency cap: rate x latency) and a quick run are
    not."""
    assert harness.httperf_client_trouble(HELD, 2, 2) is None
    assert "client stalled: 58.5 s" in harness.httperf_client_trouble(
        STALLED, 2, 2)
    no_port = HELD.replace("addrunavail 0", "addrunavail 7")
    assert "out of local ports" in harness.httperf_client_trouble(
        no_port, 2, 2)
    full = HELD.replace("ftab-full 0", "ftab-full 3")
    assert "table full" in harness.httperf_client_trouble(full, 2, 2)
    capped = HELD.replace("fd-unavail 0", "fd-unavail 900")
    assert harness.httperf_client_trouble(capped, 2, 2) is None
    assert harness.httperf_client_trouble("", 2, 2) == \
        "no report from httperf"


def test_stalled_client_is_not_the_server_failing(sweep_module):
    """The run of STALLED is judged the client's (status `client`), not a
    server's failure, and is measured again; the retry that held stays."""
    args = sweep_module.parse_args(["--servers", "epoll", "--rate", "3000",
                                    "--duration", "2", "--timeout", "2"])
    run = rate_run(STALLED)
    run.seconds, run.client_exit = 58.5, 0
    sweep_module.judge(run, "httperf", False, sweep_module.run_limit(args))
    sweep_module.judge_client(run, STALLED, args, False)
    assert run.status == "client", run
    assert report.held([run]) is None  # says nothing of the server

    texts = iter([STALLED, HELD])

    def measure(sweep, target, run):
        text = next(texts)
        harness.parse_httperf(text, 2, run.n, run)
        run.client_exit, run.seconds = 0, 2.0
        sweep_module.judge(run, "httperf", False, 62)
        sweep_module.judge_client(run, text, args, False)

    class Sweep:
        pass
    sweep = Sweep()
    sweep.args = args
    again = report.Run("epoll", 1000, 1, 6000, offered_rps=3000)
    sweep_module.measured_until_client_ok(sweep, None, again, measure)
    assert again.status == "ok" and again.achieved_rps == 2994.0, again
    assert again.note.startswith("measured again after 1 client failure"), \
        again.note
    assert report.held([again]) is True


def test_rate_held_by_the_median_of_its_runs():
    """One bad run of three does not fail a rate (the old rule: any run
    that was not ok did); two do; a run the client failed is left out, and
    a rate only the client failed is passed over by the knee."""
    good = rate_run(HELD, "ok")
    bad = rate_run(HELD.replace("2xx=6000", "2xx=600"), "fail")
    lost = rate_run(STALLED, "client")
    assert report.held([good, bad, good]) is True
    assert report.held([good, bad, bad]) is False
    assert report.held([good, lost, lost]) is True
    assert report.held([lost, lost]) is None
    assert report.rate_cell([lost, lost]).startswith("client failed"), \
        report.rate_cell([lost, lost])
    assert "✗" not in report.rate_cell([good, bad, good])

    class Sweep:
        pass
    sweep = Sweep()
    sweep.args = type("Args", (), {"servers": ["epoll"],
                                   "rates": [2000, 3000, 4000, 6000]})
    runs = []
    for rate, kinds in ((2000, [good, good]), (3000, [lost, lost]),
                        (4000, [good, bad, good]), (6000, [bad, bad])):
        for i, kind in enumerate(kinds):
            run = report.dataclasses.replace(
                kind, offered_rps=rate, run=i + 1,
                achieved_rps=kind.achieved_rps * rate / 3000)
            runs.append(run)
    row = report.knees(sweep, runs)[0]
    assert (row[0], row[1], row[3]) == ("epoll", "4,000", "6,000"), row


def test_httperf_picks_no_ports_of_its_own(sweep_module):
    """httperf 0.9.0's --hog allocator uses 33 ports of 64 from 1023 up in
    every run and spins in bind() when they are in TIME_WAIT: the kernel
    picks the ports instead."""
    args = sweep_module.parse_args(["--servers", "epoll", "--rate", "300"])

    class Sweep:
        places = {"client": harness.Place()}
    sweep = Sweep()
    sweep.args = args
    target = sweep_module.Target()
    target.port = 8080
    run = report.Run("epoll", 1000, 1, 600, offered_rps=300)
    command = sweep_module.httperf_command(sweep, target, run)
    assert "httperf" in command and "--hog" not in command, command


def test_results_say_how_busy_the_machine_was():
    """results.md's Date line gives the 1-min load average before the
    points, and says when it was above the cores (other work shared them):
    a loaded sweep's knees are the load's as much as the servers'."""
    class Sweep:
        loads = [0.2, 0.6]
    assert report.load_average(Sweep, {"cores": 2}) == \
        ", load average 0.2-0.6 before its points"
    Sweep.loads = [18.4, 45.3]
    assert report.load_average(Sweep, {"cores": 2}).endswith(
        "18.4-45.3 before its points, above the 2 cores: busy with other "
        "work")
    Sweep.loads = []
    assert report.load_average(Sweep, {"cores": 2}) == ""
