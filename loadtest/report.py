"""A sweep's results: the Run record (a row of runs.csv), the tables of
results.md and of the console, runs.csv written and read back, and the
charts (chart.png: req/s; chart-cpu.png, chart-p99.png: what it cost).

loadtest/sweep measures and writes through these; loadtest/results-readme
renders kept sweeps with the same tables, from their runs.csv, so that
RESULTS.md shows a point as the sweep's own results.md did.
"""

import csv
import dataclasses
import statistics
import sys
import textwrap
import typing

import harness  # online CPUs, CPU lists (loadtest/ is on sys.path: sweep's)

WIDE_VARIATION = 0.20  # (max - min) / median above this: marked with ~


@dataclasses.dataclass
class Run:
    """One client run: one server, one concurrency level, one repetition."""
    server: str
    concurrency: int
    run: int  # 1..runs
    n: int | None  # requests asked of ab (wrk runs for a time instead)
    status: str = "not run"  # ok | fail | skipped | not run
    rps: float | None = None  # "Requests per second" (ab), "Requests/sec"
    complete: int = 0
    failed: int = 0  # error events counted: the kinds below
    connect: int = 0  # ab and wrk
    receive: int = 0  # ab; wrk's "read"
    length: int = 0  # ab only
    exceptions: int = 0  # ab only
    write: int = 0  # wrk only
    timeouts: int = 0  # wrk only (ab gives up instead)
    non2xx: int = 0  # ab: not 2xx; wrk: status 400 or more
    mean_ms: float | None = None  # mean time per request, per client
    p50_ms: float | None = None
    p99_ms: float | None = None
    client_exit: int | None = None
    seconds: float = 0.0  # wall time of the client run
    note: str = ""  # why it failed or was skipped; short, shown in the table
    client_stderr: str = ""  # the client's last words, for the curious
    # What the run cost (harness.RunCost): None where it was not measured
    # (the server or Redis on another host, ab's p99.9, an older runs.csv)
    server_us_per_req: float | None = None  # CPU of the server's processes
    #   and threads, reaped children too, per completed request
    switches_per_req: float | None = None  # their context switches (a lower
    #   bound where tasks exit: harness.cpu_and_switches)
    peak_rss_kib: int | None = None  # resident set of the server's tree
    kib_per_conn: float | None = None  # (peak - idle before) / concurrency
    peak_tasks: int | None = None  # processes + threads, at most
    server_cpu_pct: float | None = None  # % of one core over the run
    redis_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    p999_ms: float | None = None  # wrk only: ab's percentiles stop at 99%

    def errors(self):
        return self.failed + self.non2xx


def duration(seconds):
    """1m05s, or 42s: how long a sweep took."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def ok_rates(runs):
    """req/s of the runs that went well."""
    return [run.rps for run in runs if run.status == "ok"]


def median_rps(runs):
    """Median req/s of a point's runs, or None if one failed or none ran."""
    rates = ok_rates(runs)
    if not rates or any(run.status == "fail" for run in runs):
        return None
    return statistics.median(rates)


def wide(runs):
    """Did the runs disagree by more than WIDE_VARIATION of their median?"""
    rates = ok_rates(runs)
    if len(rates) < 2:
        return False
    return max(rates) - min(rates) > WIDE_VARIATION * statistics.median(rates)


def cell(runs):
    """One table cell: the median, `fail (reason)`, or why it was not run."""
    failed = [run for run in runs if run.status == "fail"]
    if failed:
        return f"fail ({failed[0].note})"
    middle = median_rps(runs)
    if middle is None:
        return runs[0].note if runs and runs[0].note else "not run"
    text = f"{middle:.0f}"
    if wide(runs):
        text += "~"
    if any(run.errors() for run in runs if run.status == "ok"):
        text += "!"
    return text


def points(results):
    """{(server, concurrency): [runs]}"""
    grouped = {}
    for run in results:
        grouped.setdefault((run.server, run.concurrency), []).append(run)
    return grouped


def markdown_table(header, rows):
    """A Markdown table with padded, right-aligned columns (readable as text
    too)."""
    widths = [max(len(str(row[i])) for row in [header] + rows)
              for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(str(c).rjust(w)
                                 for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule] + [line(row) for row in rows])


def table(sweep, results, show):
    """Rows: concurrency; columns: servers; cells: show(runs)."""
    return grid(results, show, sweep.args.servers, sweep.args.levels)


def grid(results, show, servers, levels):
    """table() for given servers and levels: also for runs read back from a
    kept runs.csv (loadtest/results-readme)."""
    grouped = points(results)
    rows = [[str(c)] + [show(grouped.get((server, c), [])) or "" for server
                        in servers] for c in levels]
    return markdown_table(["concurrency"] + servers, rows)


def median_of(runs, column):
    """Median of a runs.csv column over a point's runs that went well, or
    None: a run failed, or the column was not measured."""
    if any(run.status == "fail" for run in runs):
        return None
    values = [getattr(run, column) for run in runs if run.status == "ok"]
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def figure(value):
    """A measured value for a table: 3 digits, or - if there is none."""
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def column_cell(column):
    """A cell function for table(): the median of that runs.csv column."""
    return lambda runs: figure(median_of(runs, column))


# The tables beside req/s, in results.md and on the console: (title,
# runs.csv column, what a cell is)
COST_TABLES = [
    ("Server CPU per request (µs)", "server_us_per_req",
     "user + system time of the server's processes and threads (children "
     "it reaped included) during the run, divided by the requests "
     "completed; median of the runs"),
    ("p99 latency (ms)", "p99_ms",
     "99th percentile of the time per request, as the client measured it "
     "(ab rounds it to whole ms); median of the runs"),
]
COST_NOTE = """\
Per run in runs.csv: context switches per request (`switches_per_req`,
counting only tasks alive at the end of the run, so a lower bound for
forking and threaded), peak resident memory of the server's processes
(`peak_rss_kib`, shared pages counted in each process) and per connection
over the idle baseline (`kib_per_conn`), peak processes + threads
(`peak_tasks`), who was busy (`server_cpu_pct`, `redis_cpu_pct`,
`client_cpu_pct`: % of one core over the run) and, with wrk, `p999_ms`."""


def cost_tables(sweep, results):
    """The COST_TABLES as Markdown sections, with what their cells are."""
    parts = []
    for title, column, meaning in COST_TABLES:
        legend = (f"Each cell: {meaning}; `-`: not measured, or the point "
                  "failed.")
        parts += [f"## {title}", "",
                  table(sweep, results, column_cell(column)), "",
                  textwrap.fill(legend, 76), ""]
    return parts


def spread(runs):
    rates = ok_rates(runs)
    return f"{min(rates):.0f}-{max(rates):.0f}" if rates else "-"


def error_count(runs):
    return str(sum(run.errors() for run in runs))


CELL_LEGEND = """\
- `12345~`: the runs differed by more than 20%: see the spread table.
- `12345!`: the client counted some failed or non-2xx requests (fewer than
  10%): see the errors table.
- `fail (timeout)`: ab saw no progress for --timeout seconds; `reset by peer`
  and `refused`: ab stopped on a connection error; `over N s`: the run was
  cut at its time limit; `server killed by SIGSEGV`, `server exit 1`,
  `server exited on HOST`, `nginx ...`: it died; `server did not start`: no
  listening line; `receive errors`, `timeout errors`, `non-2xx`, ...: more
  than 10% of the requests failed that way; `open-file limit`, `local
  ports`: this machine cannot open that many connections.
- `skipped (after 2 failures)`: two levels in a row failed, so the server's
  higher levels were not tried."""


def placement_lines(sweep):
    """Where each component ran, and on which CPUs: one line each."""
    used = {"client": f"client ({sweep.args.client})",
            "nginx": "nginx" if sweep.args.behind_nginx else None}
    lines = []
    for component, place in sweep.places.items():
        name = used.get(component, component)
        lines.append(f"  - {name}: {place.describe()}" if name else
                     f"  - nginx: not used (no --behind-nginx)")
    lines += [f"  - {host.describe()}" for host in sweep.hosts()]
    if sweep.hosts():
        lines.append("  - on the other hosts the sweep changed no sysctl "
                     "and raised the open-file limit to their hard limit")
    return lines


def client_alone(sweep):
    """Did the client have its CPUs to itself (pinned, or the rest on other
    hosts)?"""
    everywhere = harness.online_cpus()
    mine = set(sweep.places["client"].cpus or everywhere)
    others = ["server", "redis"] + (["nginx"] if sweep.args.behind_nginx
                                    else [])
    return not any(mine & set(sweep.places[name].cpus or everywhere)
                   for name in others if not sweep.places[name].host)


def caveat(sweep):
    """What to keep in mind, given the client and where things ran."""
    if sweep.args.client == "wrk":
        text = ("wrk is multi-threaded and keeps up with fast servers "
                "better than ab; ")
    else:
        text = ("ab is single-threaded (one core at most, ~35-45k req/s "
                "here without keep-alive): where many servers show the "
                "same number, that is ab's ceiling, not theirs; ")
    if client_alone(sweep):
        text += "the client had its CPUs to itself. "
    else:
        text += ("it shared CPUs with the server and Redis, so a faster "
                 "server leaves the client less CPU. ")
    return text + "Every run is in runs.csv."


def not_measured(sweep):
    """COST_NOTE, and what /proc here could not see."""
    away = [name for name in ("server", "redis")
            if sweep.places[name].host]
    if not away:
        return COST_NOTE
    return COST_NOTE + (" Not measured (" + ", ".join(
        f"the {name} ran on {sweep.places[name].host.target}"
        for name in away) + "): its columns are empty.")


def console(sweep, results):
    """What the sweep prints at its end: req/s, then the COST_TABLES."""
    parts = ["Requests per second", "", table(sweep, results, cell)]
    for title, column, _ in COST_TABLES:
        parts += ["", title, "", table(sweep, results, column_cell(column))]
    return "\n".join(parts)


def write_markdown(sweep, results, info, report):
    """results.md: how, where and when the sweep ran, then its tables.
    report: date, seconds, interrupted, command, and from the sweep the
    load it put on (load) and the visitor count it seeded (visitors)."""
    args = sweep.args
    has_errors = any(run.errors() for run in results)
    parts = [
        f"# Sweep: GET {args.path}"
        + (f" behind nginx ({args.behind_nginx} instances)"
           if args.behind_nginx else ""),
        "",
        f"- Date: {report['date']} (took {duration(report['seconds'])}"
        + (", interrupted" if report["interrupted"] else "") + ")",
        f"- Machine: {info['cpu']}, {info['cores']} cores, "
        f"Linux {info['kernel']}, {info['os']}",
        f"- Software: {info[args.client]}, {info['redis']}, "
        f"{info['nginx']}, {info['gcc']}",
        "- Limits: " + "; ".join(sweep.limits),
    ]
    parts += [f"- {change}" for change in sweep.changes]
    parts += [f"- Client: {args.client}; placement (where each component "
              "ran, on which CPUs):"] + placement_lines(sweep)
    parts += [f"- Load: {report['load']}",
              f"- Remarks seeded: {'yes' if sweep.seeded else 'no'}; "
              f"visitor count started at {report['visitors']:,}",
              f"- Command: `{report['command']}`",
              "", "## Requests per second", "",
              table(sweep, results, cell), "", CELL_LEGEND, ""]
    parts += cost_tables(sweep, results) + [not_measured(sweep), ""]
    if args.runs > 1:
        parts += ["## Spread (min-max req/s over the runs)", "",
                  table(sweep, results, spread), ""]
    if has_errors:
        parts += ["## Failed + non-2xx requests (sum over the runs)", "",
                  table(sweep, results, error_count), ""]
    parts += [caveat(sweep), ""]
    (sweep.out / "results.md").write_text("\n".join(parts))


def write_csv(sweep, results):
    with open(sweep.out / "runs.csv", "w", newline="") as f:
        fields = [field.name for field in dataclasses.fields(Run)]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for run in results:
            writer.writerow(dataclasses.asdict(run))


# runs.csv columns renamed since (before --client wrk, only ab ran)
OLD_COLUMNS = {"ab_exit": "client_exit", "ab_stderr": "client_stderr"}


def csv_value(kind, text):
    """A runs.csv cell back as the Run field's type (kind: int, float | None,
    str...); an empty cell of an optional number is None."""
    choices = typing.get_args(kind) or (kind,)
    if str in choices:
        return text
    if text == "":
        return None
    return int(text) if int in choices else float(text)


def read_csv(path):
    """The Runs a runs.csv holds: write_csv() read back, so that a kept
    sweep can be rendered again without measuring (loadtest/results-readme).
    Columns it lacks (wrk's and the costs, in older sweeps) keep their
    defaults."""
    kinds = {field.name: field.type for field in dataclasses.fields(Run)}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = []
    for row in rows:
        named = {OLD_COLUMNS.get(key, key): text for key, text in row.items()}
        runs.append(Run(**{key: csv_value(kinds[key], text)
                           for key, text in named.items()}))
    return runs


def round_number(n):
    """1, 2 or 5 followed by zeros: the ticks a long x axis gets."""
    return str(n).rstrip("0") in ("1", "2", "5")


# The charts of a sweep: (file, runs.csv column or None for req/s, y axis
# label, logarithmic y). The first is the one RESULTS.md links.
CHARTS = [
    ("chart.png", None, "requests per second (median of runs)", False),
    ("chart-cpu.png", "server_us_per_req",
     "server CPU per request, µs (median of runs)", True),
    ("chart-p99.png", "p99_ms", "p99 latency, ms (median of runs)", True),
]


def write_charts(sweep, results, info):
    """The CHARTS, one line per server against concurrency; a chart with
    nothing to show (the server on another host: no CPU) is left out.
    Returns (the files written, None) or ([], why there are none)."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return [], (f"matplotlib is not installed for {sys.executable}: no "
                    "chart (use /usr/bin/python3, or `make sweep`)")
    written = []
    for name, column, label, log_y in CHARTS:
        if draw_chart(plt, sweep, results, info, column, label, log_y,
                      sweep.out / name):
            written.append(name)
    return written, None


def chart_values(sweep, results, column, log_y):
    """{server: (levels, medians)} of a column (None: req/s) where there is
    a value (above 0 on a log axis)."""
    grouped, series = points(results), {}
    for server in sweep.args.servers:
        pairs = []
        for c in sweep.args.levels:
            runs = grouped.get((server, c), [])
            value = median_rps(runs) if column is None else \
                median_of(runs, column)
            if value is not None and (value > 0 or not log_y):
                pairs.append((c, value))
        if pairs:
            series[server] = tuple(zip(*pairs))
    return series


def draw_chart(plt, sweep, results, info, column, label, log_y, path):
    """One chart of chart_values() into path; False if it has none."""
    from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                                   ScalarFormatter)
    series = chart_values(sweep, results, column, log_y)
    if not series and column is not None:
        return False
    args = sweep.args
    fig, ax = plt.subplots(figsize=(10, 6))
    for server in args.servers:
        xs, ys = series.get(server, ((), ()))
        ax.plot(xs, ys, marker="o", label=server)
    ax.set_xscale("log")
    ax.set_xticks([c for c in args.levels
                   if len(args.levels) <= 12 or round_number(c)])
    ax.xaxis.set_major_formatter(ScalarFormatter())  # 1000, not 10^3
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:  # ticks at 1, 2, 5 x 10^n, written 20, not 2x10^1
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(f"concurrent clients ({args.client} -c)")
    ax.set_ylabel(label)
    nginx = f" behind nginx ({args.behind_nginx} instances)" \
        if args.behind_nginx else ""
    # pinned and unpinned charts of the same sweep stand side by side in
    # README.md: the title tells them apart
    pinned = "; CPUs " + ", ".join(
        f"{name} {harness.cpu_text(cpus)}"
        for name, cpus in args.cpus.items()) if args.cpus else ""
    ax.set_title(f"GET {args.path}{nginx}: {info['cpu']}, {info['cores']} "
                 f"cores, Linux {info['kernel']}{pinned}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
