"""Smoke test of the load-test harness: loadtest/sweep runs end to end on two
built servers at two tiny concurrency levels, and writes the table, the CSV
and the chart. A second test does the same through nginx.

The sweep needs matplotlib for its chart, which the Python running pytest may
not have: it is run with the interpreter that tools/python finds.
"""

import csv
import re
import subprocess

from processes import MODELS, REPO

SWEEP_TIMEOUT = 180  # seconds; the sweep itself bounds every ab run
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def python_with_matplotlib():
    found = subprocess.run([str(REPO / "tools" / "python"), "matplotlib"],
                           capture_output=True, text=True)
    assert found.returncode == 0, (
        "no Python with matplotlib for loadtest/sweep: " + found.stderr)
    return found.stdout.strip()


def built_servers(count):
    """Up to `count` built servers, in model order."""
    built = [m for m in MODELS if (REPO / m).is_file()]
    assert built, "no server is built at the repo root: run `make all`"
    return built[:count]


def sweep_process(out, *options):
    """loadtest/sweep on `/` (unless options say otherwise) with one run per
    level, to its end; the CompletedProcess."""
    return subprocess.run(
        [python_with_matplotlib(), "loadtest/sweep", "--runs", "1",
         "--path", "/", "--out", str(out), "--no-build", *options],
        cwd=REPO, capture_output=True, text=True, timeout=SWEEP_TIMEOUT)


def run_sweep(out, *options):
    """sweep_process() that must succeed; returns its output."""
    done = sweep_process(out, *options)
    assert done.returncode == 0, (
        f"sweep exited {done.returncode}\nstdout:\n{done.stdout}\n"
        f"stderr:\n{done.stderr}")
    return done.stdout


def table_rows(results_md):
    """{concurrency: [cells]} and the header of the req/s table."""
    lines = results_md.split("## Requests per second")[1].strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[int(cells[0])] = cells[1:]
    return header, rows


def assert_numbers(cells, context):
    for cell in cells:
        # a median in req/s, maybe marked ~ (runs disagree) or ! (errors)
        assert re.fullmatch(r"\d+[~!]*", cell), f"{context}: cell {cell!r}"


def test_sweep_writes_table_csv_and_chart(tmp_path):
    servers = built_servers(2)
    run_sweep(tmp_path, "--servers", ",".join(servers),
              "--concurrency", "5,10", "--requests", "200")

    header, rows = table_rows((tmp_path / "results.md").read_text())
    assert header == ["concurrency"] + servers
    assert sorted(rows) == [5, 10]
    for level, cells in rows.items():
        assert_numbers(cells, f"c={level}")

    with open(tmp_path / "runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * len(servers)
    assert {(r["server"], int(r["concurrency"])) for r in runs} == {
        (s, c) for s in servers for c in (5, 10)}
    for run in runs:
        assert run["status"] == "ok" and float(run["rps"]) > 0, run

    assert (tmp_path / "chart.png").read_bytes().startswith(PNG_MAGIC)


def test_sweep_behind_nginx(tmp_path):
    server = built_servers(1)[0]
    run_sweep(tmp_path, "--servers", server, "--concurrency", "5",
              "--requests", "100", "--behind-nginx", "2")

    header, rows = table_rows((tmp_path / "results.md").read_text())
    assert header == ["concurrency", server]
    assert_numbers(rows[5], "c=5 behind nginx")
    conf = (tmp_path / "nginx.conf").read_text()
    assert len(re.findall(r"^\s*server 127\.0\.0\.1:\d+;", conf, re.M)) == 2
    assert "proxy_http_version 1.1;" in conf
    assert (tmp_path / "chart.png").read_bytes().startswith(PNG_MAGIC)
