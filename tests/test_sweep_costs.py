"""What each run cost, as loadtest/sweep measures it: server CPU per request
(the whole process tree: threads, and children reaped during the run),
context switches, peak memory and tasks, who was busy, p99.9 with wrk.

Real processes: one small sweep of forking and threaded with ab and one of
epoll with wrk (a few seconds each), and the sampler on a process with
threads. The tests that measure CPU or count samples in time are marked
serial: they run alone, not beside the parallel tests (see conftest.py).
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
LEVEL = 50  # clients: enough for threaded to hold many threads at once
BUSY_US = 20  # µs of server CPU per request: clearly more than nothing
THREADS = 5  # the sampler's test process: main thread + these
SLACK = 2.0  # seconds for the sampler's first ten looks


def sweep_rows(out, *options):
    """loadtest/sweep with one run per level into out; runs.csv's rows."""
    done = subprocess.run(
        [python_with("matplotlib"), "loadtest/sweep", "--no-build", "--runs",
         "1", "--out", str(out), *options],
        cwd=REPO, capture_output=True, text=True, timeout=SWEEP_TIMEOUT)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    with open(out / "runs.csv", newline="") as f:
        return {row["server"]: row for row in csv.DictReader(f)}, done.stdout


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


@pytest.mark.serial
def test_forking_cpu_counts_reaped_children(ab_sweep):
    """Each request is a child process that exits: its CPU reaches us only
    through the parent's cutime/cstime."""
    row = ab_sweep[0]["forking"]
    assert row["status"] == "ok", row
    assert number(row, "server_us_per_req") > BUSY_US, row


@pytest.mark.serial
def test_threaded_cpu_counts_threads(ab_sweep):
    """Each request is a thread, most gone by the end of the run."""
    row = ab_sweep[0]["threaded"]
    assert row["status"] == "ok", row
    assert number(row, "server_us_per_req") > BUSY_US, row
    assert int(row["peak_tasks"]) > 10, row


@pytest.mark.serial
def test_cost_columns_present_and_numeric(ab_sweep):
    rows, stdout = ab_sweep
    for row in rows.values():
        assert list(row)[-len(COST_COLUMNS):] == COST_COLUMNS
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


@pytest.mark.serial
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
