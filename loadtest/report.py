"""A sweep's results: the Run record (a row of runs.csv), the tables of
results.md and of the console, runs.csv written and read back, and the
charts (chart.png: req/s; chart-cpu.png, chart-p99.png: what it cost);
for --costs the cost summary table (and costs.csv) with a sentence per
column read from its numbers, for --rate p99 against offered rate, the
knees and chart-rate.png.

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
    status: str = "not run"  # ok | fail | skipped | not run | client
    #   (client: --rate, the client failed, not the server: sweep's
    #   judge_client(); it counts for neither)
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
    # --rate (open loop, httperf): the rate offered and the 2xx replies a
    # second that came back; --costs: idle keep-alive connections held open
    # beside the load (asked for, and still open at the end of the run)
    offered_rps: int | None = None
    achieved_rps: float | None = None
    idle_conns: int | None = None
    idle_held: int | None = None

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


def points(results, key="concurrency"):
    """{(server, concurrency): [runs]}, or keyed by another Run field."""
    grouped = {}
    for run in results:
        grouped.setdefault((run.server, getattr(run, key)), []).append(run)
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


def grid(results, show, servers, levels, key="concurrency",
         label="concurrency"):
    """table() for given servers and levels: also for runs read back from a
    kept runs.csv (loadtest/results-readme). key: the Run field the rows
    are (offered_rps: a row per rate, headed `label`)."""
    grouped = points(results, key)
    rows = [[str(c)] + [show(grouped.get((server, c), [])) or "" for server
                        in servers] for c in levels]
    return markdown_table([label] + servers, rows)


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
            "nginx": "nginx" if sweep.args.behind_nginx else
            "nginx (serving the static file, 1 worker)"
            if sweep.args.nginx_static else None}
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
    if sweep.args.client == "httperf":
        text = ("httperf is single-threaded and busy-polls one core "
                "whatever the rate offered (client_cpu_pct near 100); ")
    elif sweep.args.client == "wrk":
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


def load_average(sweep, info):
    """`, load average 0.1-0.4`: the 1-min load average here before each
    point, lowest and highest; `busy` above the cores (other work shared
    them: compare within this sweep only)."""
    loads = getattr(sweep, "loads", None)
    if not loads:
        return ""
    low, high = min(loads), max(loads)
    text = f", load average {low:.1f}-{high:.1f} before its points"
    if high > float(info.get("cores") or 0):
        text += f", above the {info['cores']} cores: busy with other work"
    return text


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
        + (", interrupted" if report["interrupted"] else "")
        + load_average(sweep, info) + ")",
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
              f"- Command: `{report['command']}`", ""]
    if args.rates:
        parts += rate_markdown(sweep, results)
    elif args.costs:
        parts += summary_markdown(sweep, results)
    else:
        parts += ["## Requests per second", "",
                  table(sweep, results, cell), "", CELL_LEGEND, ""]
        parts += cost_tables(sweep, results) + [not_measured(sweep), ""]
    if args.runs > 1 and not (args.rates or args.costs):
        parts += ["## Spread (min-max req/s over the runs)", "",
                  table(sweep, results, spread), ""]
    if has_errors and not (args.rates or args.costs):
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


@dataclasses.dataclass
class Axis:
    """A chart's x axis: the Run field, its values, its label."""
    key: str
    values: list
    label: str


def level_axis(sweep):
    return Axis("concurrency", sweep.args.levels,
                f"concurrent clients ({sweep.args.client} -c)")


def point_value(column):
    """What a chart shows of a point's runs: median req/s (column None) or
    the median of a runs.csv column."""
    if column is None:
        return median_rps
    return lambda runs: median_of(runs, column)


def matplotlib_pyplot():
    """(pyplot, None), or (None, why there is no chart)."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None, (f"matplotlib is not installed for {sys.executable}: "
                      "no chart (use /usr/bin/python3, or `make sweep`)")
    return plt, None


def write_charts(sweep, results, info):
    """The CHARTS, one line per server against concurrency; a chart with
    nothing to show (the server on another host: no CPU) is left out.
    Returns (the files written, None) or ([], why there are none)."""
    plt, why = matplotlib_pyplot()
    if plt is None:
        return [], why
    written = []
    for name, column, label, log_y in CHARTS:
        if draw_chart(plt, sweep, results, info, point_value(column), label,
                      log_y, sweep.out / name, level_axis(sweep),
                      always=column is None):
            written.append(name)
    return written, None


def chart_values(sweep, results, value, log_y, axis):
    """{server: (xs, values)} where a point has a value (above 0 on a log
    axis)."""
    grouped, series = points(results, axis.key), {}
    for server in sweep.args.servers:
        pairs = []
        for x in axis.values:
            y = value(grouped.get((server, x), []))
            if y is not None and (y > 0 or not log_y):
                pairs.append((x, y))
        if pairs:
            series[server] = tuple(zip(*pairs))
    return series


def draw_chart(plt, sweep, results, info, value, label, log_y, path, axis,
               always=False):
    """One chart of chart_values() into path; False if it has none (unless
    always)."""
    from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                                   ScalarFormatter)
    series = chart_values(sweep, results, value, log_y, axis)
    if not series and not always:
        return False
    args = sweep.args
    fig, ax = plt.subplots(figsize=(10, 6))
    for server in args.servers:
        xs, ys = series.get(server, ((), ()))
        ax.plot(xs, ys, marker="o", label=server)
    ax.set_xscale("log")
    ax.set_xticks([x for x in axis.values
                   if len(axis.values) <= 12 or round_number(x)])
    ax.xaxis.set_major_formatter(ScalarFormatter())  # 1000, not 10^3
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:  # ticks at 1, 2, 5 x 10^n, written 20, not 2x10^1
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(axis.label)
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


# ===== --costs: the cost summary table =====
# One row per server (and nginx for a static file), at one concurrency, once
# alone and once beside idle keep-alive connections: what an instructor puts
# on a slide. The sentences under it are read from its numbers.

SUMMARY_COLUMNS = [  # (header, Run field)
    ("req/s", "rps"), ("p99 ms", "p99_ms"),
    ("server µs/req", "server_us_per_req"),
    ("switches/req", "switches_per_req"), ("KiB/conn", "kib_per_conn"),
    ("tasks", "peak_tasks"),
]
SUMMARY_CSV = ["server", "concurrency", "idle_conns"] + [
    field for _, field in SUMMARY_COLUMNS] + ["peak_rss_kib", "idle_held",
                                              "note"]


def summary_rows(results, servers, idle, alone=None):
    """[{server, field: median or None, note}] for the point of each server
    with `idle` idle connections; a failed point has only its note. Beside
    idle connections (alone: the rows without), kib_per_conn is what one
    idle connection adds: (peak memory beside them - peak alone) / idle."""
    grouped = points(results, "idle_conns")
    before = {row["server"]: row["peak_rss_kib"] for row in alone or []}
    rows = []
    for server in servers:
        runs = grouped.get((server, idle), [])
        row = {"server": server, "idle_conns": idle,
               "concurrency": runs[0].concurrency if runs else None,
               "note": "" if median_rps(runs) else cell(runs)}
        for field in [f for _, f in SUMMARY_COLUMNS] + ["peak_rss_kib",
                                                        "idle_held"]:
            row[field] = (median_rps(runs) if field == "rps"
                          else median_of(runs, field))
        if alone:
            row["kib_per_conn"] = per_idle(row["peak_rss_kib"],
                                           before.get(server), idle)
        rows.append(row)
    return rows


def per_idle(peak, peak_alone, idle):
    """KiB one idle connection adds (0 where the peak was lower: noise, or
    a server that closed them), or None."""
    if peak is None or peak_alone is None or not idle:
        return None
    return round(max(peak - peak_alone, 0) / idle, 2)


def summary_table(rows, idle):
    """The rows as Markdown: a failed point shows why in its req/s cell."""
    header = ["server"] + [h for h, _ in SUMMARY_COLUMNS]
    if idle:
        header.append("idle open")
    lines = []
    for row in rows:
        cells = [row["server"]] + [figure(row[f]) for _, f in SUMMARY_COLUMNS]
        if row["note"]:
            cells[1] = row["note"]
        if idle:
            cells.append(figure(row["idle_held"]))
        lines.append(cells)
    return markdown_table(header, lines)


def measured(rows, field):
    """[(value, server)] of the rows that have that value, smallest first."""
    return sorted((row[field], row["server"]) for row in rows
                  if row[field] is not None)


def times(big, small):
    """How many times: 2.5x, 17x; "far more than" a zero."""
    if not small:
        return "far more than"
    ratio = big / small
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


def spread_sentence(rows, field, most, least, unit=""):
    """`X ... most (N), Kx Y's M ... least` for one column, or None."""
    values = measured(rows, field)
    if len(values) < 2:
        return None
    (low, low_name), (high, high_name) = values[0], values[-1]
    if figure(low) == figure(high):
        return f"the same for every server ({figure(high)}{unit})"
    return (f"{high_name} {most} ({figure(high)}{unit}), "
            f"{times(high, low)} {low_name}'s {figure(low)}{unit}, {least}")


def surprises(rows, alone=None):
    """One sentence per column of a summary table, from its numbers. alone:
    the rows without idle connections, when these are beside them."""
    out = []
    rps = spread_sentence(rows, "rps", "served the most requests a second",
                          "the fewest")
    failed = [f"{row['server']} ({row['note']})" for row in rows
              if row["note"]]
    if rps:
        out.append("**req/s**: " + rps + (
            "; failed: " + ", ".join(failed) if failed else "") + ".")
    if alone:
        out += lost_sentence(rows, alone)
    sentences = [
        ("p99_ms", "**p99**", "made its slowest 1% wait longest",
         "the shortest wait", " ms"),
        ("server_us_per_req", "**server µs/request**",
         "burned the most CPU per request", "the least", " µs"),
        ("switches_per_req", "**switches/request**",
         "switched context most per request", "the fewest", ""),
        ("kib_per_conn", "**KiB/connection**",
         "grew the most per connection", "the least", " KiB"),
        ("peak_tasks", "**tasks**", "ran the most processes + threads at "
         "once", "the fewest", ""),
    ]
    for field, title, most, least, unit in sentences:
        text = spread_sentence(rows, field, most, least, unit)
        if text:
            out.append(f"{title}: {text}.")
    out += nginx_sentence(rows)
    return out


def changes(rows, alone, field):
    """[(now / alone, server, alone, now)] of a column, smallest first."""
    before = {row["server"]: row[field] for row in alone if row[field]}
    return sorted((row[field] / before[row["server"]], row["server"],
                   before[row["server"]], row[field])
                  for row in rows if row[field] and row["server"] in before)


def lost_sentence(rows, alone):
    """Which server lost the most req/s to the idle connections, and whose
    CPU per request grew the most."""
    out = []
    rps = changes(rows, alone, "rps")
    if rps:
        share, name, before, now = rps[0]
        out.append(f"**beside the idle connections** {name} kept the least "
                   f"of its req/s: {figure(before)} alone, {figure(now)} "
                   f"now ({100 * share:.0f}%).")
    cpu = changes(rows, alone, "server_us_per_req")
    if cpu and cpu[-1][0] > 1:
        grew, name, before, now = cpu[-1]
        out.append(f"**the idle connections' CPU**: {name}'s µs/request "
                   f"grew the most, {figure(before)} alone to {figure(now)} "
                   f"({times(now, before)}).")
    return out


def nginx_sentence(rows):
    """nginx against the cheapest of ours, in CPU per request."""
    by_name = {row["server"]: row for row in rows}
    nginx = by_name.get("nginx", {}).get("server_us_per_req")
    ours = measured([row for row in rows if row["server"] != "nginx"],
                    "server_us_per_req")
    if not nginx or not ours:
        return []
    cheapest, name = ours[0]
    return [f"**nginx** (1 worker) needed {figure(nginx)} µs a request, "
            f"{nginx / cheapest:.2f}x {name}'s {figure(cheapest)} µs, the "
            "cheapest of ours."]


def summary_sections(sweep, results):
    """[(title, rows, idle, sentences)] of --costs: alone, then beside
    idle."""
    return summary_sections_of(results, summary_servers(sweep),
                               sweep.args.levels[0], sweep.args.idle)


def summary_sections_of(results, servers, c, idle):
    """summary_sections() from the runs alone (also of a kept runs.csv:
    loadtest/results-readme)."""
    alone = summary_rows(results, servers, 0)
    sections = [(f"c = {c:,}", alone, 0, surprises(alone))]
    if idle:
        beside = summary_rows(results, servers, idle, alone)
        sections.append((f"c = {c:,} beside {idle:,} idle keep-alive "
                         "connections", beside, idle,
                         surprises(beside, alone)))
    return sections


def summary_servers(sweep):
    return sweep.args.servers + (["nginx"] if sweep.args.nginx_static
                                 else [])


SUMMARY_LEGEND = """\
Each cell: the median of the runs. req/s and p99 as the client measured
them; server µs/request: CPU time (user + system) of the server's processes
and threads, children it reaped included, per completed request;
switches/request: context switches of its threads alive at the end (a lower
bound for forking and threaded); KiB/conn: alone, peak resident memory over
the memory just before the run, per client (a server that keeps what it
once touched shows its first run only; the median hides it); beside idle
connections, what one idle connection adds: (peak memory beside them - peak
alone) / the idle connections asked for; tasks: processes + threads at
most; idle open: idle connections the server had not closed when the run
ended. `-`: not measured, or the point failed."""


def titled(sections, markdown):
    """[(title, text)] as results.md's sections (markdown) or as the
    console's: lines."""
    parts = []
    for title, text in sections:
        parts += [f"## {title}" if markdown else title, "", text, ""]
    return parts


def summary_texts(sweep, results, markdown):
    """[(title, table and its sentences)] of --costs."""
    def sentence(text):
        return f"- {text}" if markdown else textwrap.fill(
            text.replace("**", ""), 78)
    return [(f"Cost summary: {title}", "\n".join(
        [summary_table(rows, idle), ""] + list(map(sentence, sentences))))
        for title, rows, idle, sentences in summary_sections(sweep, results)]


def summary_markdown(sweep, results):
    return titled(summary_texts(sweep, results, True), True) + [
        SUMMARY_LEGEND, ""]


def summary_console(sweep, results):
    return "\n".join(titled(summary_texts(sweep, results, False),
                            False)).rstrip()


def write_summary_csv(sweep, results):
    """costs.csv: one row per server and idle count, the medians."""
    with open(sweep.out / "costs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_CSV)
        writer.writeheader()
        for _, rows, _, _ in summary_sections(sweep, results):
            writer.writerows({key: round(value, 3) if isinstance(value, float)
                              else value for key, value in row.items()}
                             for row in rows)


# ===== --rate: latency under a fixed offered load =====

HOLD_SHARE = 0.95  # a rate is held: 2xx replies at 95% of it or more...
HOLD_ERRORS = 0.01  # ...and at most 1% of its requests failed
CLIENT_RETRIES = 2  # a run the client failed is measured again, so many
#                     times more (the sweep's measured_until_client_ok())


def server_runs(runs):
    """The runs that measured the server: ok, or failed for its reasons (a
    run the client failed, status `client`, measured httperf)."""
    return [run for run in runs if run.status in ("ok", "fail")]


def all_of(runs, column):
    """Median of a column over every run of the server that has it, failed
    ones too: past the knee the failures are the point."""
    values = [getattr(run, column) for run in server_runs(runs)
              if getattr(run, column) is not None]
    return statistics.median(values) if values else None


def client_cell(runs):
    """A rate no run measured: why (the client failed, or skipped)."""
    if not runs:
        return ""
    failed = [run for run in runs if run.status == "client"]
    if failed and not server_runs(runs):
        return f"client failed ({failed[-1].note.split(':')[0]})"
    return cell(runs)


def rate_cell(runs):
    """p99 of a rate (ms), marked when the rate was not held."""
    p99 = all_of(runs, "p99_ms")
    if p99 is None:
        return client_cell(runs)
    return figure(p99) + ("" if held(runs) else " ✗")


def achieved_cell(runs):
    share = all_of(runs, "achieved_rps")
    return (f"{100 * share / runs[0].offered_rps:.0f}%" if share is not None
            else client_cell(runs))


def held(runs):
    """Did the server keep up with this rate? By the median of its runs:
    2xx replies a second at HOLD_SHARE of the rate or more, and at most
    HOLD_ERRORS of its requests failed; a run that failed (over 10%) counts
    with its numbers, a run the client failed not at all. None when no run
    measured the server."""
    runs = server_runs(runs)
    if not runs:
        return None
    achieved = statistics.median(run.achieved_rps or 0 for run in runs)
    errors = statistics.median(run.errors() / max(run.n or 0, 1)
                               for run in runs)
    return (achieved >= HOLD_SHARE * runs[0].offered_rps
            and errors <= HOLD_ERRORS)


def knees(sweep, results):
    """[[server, highest rate held, its p99, first rate not held, its
    p99]]: where each model falls over."""
    grouped, rows = points(results, "offered_rps"), []
    for server in sweep.args.servers:
        kept, lost = None, None
        for rate in sweep.args.rates:
            runs = grouped.get((server, rate), [])
            if not runs or runs[0].status == "skipped":
                break
            verdict = held(runs)
            if verdict is None:  # the client failed every run: unknown
                continue
            if not verdict:
                lost = rate
                break
            kept = rate
        rows.append([server] + [
            x for rate in (kept, lost) for x in (
                (f"{rate:,}", figure(all_of(grouped[(server, rate)],
                                            "p99_ms")))
                if rate else ("-", "-"))])
    return rows


def rate_tables(sweep, results):
    """[(title, table)] of --rate."""
    rates = sweep.args.rates
    grid_of = lambda show: grid(results, show, sweep.args.servers, rates,
                                "offered_rps", "offered req/s")
    return [
        ("p99 latency (ms) against offered rate", grid_of(rate_cell)),
        ("2xx replies a second, as % of the offered rate",
         grid_of(achieved_cell)),
        ("The knee: highest rate held, first rate not held",
         markdown_table(["server", "held (req/s)", "p99 there (ms)",
                         "not held (req/s)", "p99 there (ms)"],
                        knees(sweep, results))),
    ]


RATE_LEGEND = """\
Open loop: httperf opens one connection per request at the offered rate,
whether the replies keep up or not, so a slow server cannot slow the client
down (no coordinated omission). A cell is the median of the runs; p99 counts
every request offered, a failed one (timed out, reset, or not sent because
the client was at its --concurrency cap of open connections) as --timeout.
`✗`: the rate was not held: by the median of its runs, fewer than 95% of it
came back as 2xx replies a second, or more than 1% of its requests failed.
A run the client failed (httperf stalled past --duration + --timeout, was
cut, or ran out of local ports) is not the server's: it was measured again
(up to twice more) and counts for neither; `client failed` where no run of
a rate was the server's (the knee passes over it)."""


def client_failures(results):
    """A line on the runs the client failed, or none."""
    again = [run for run in results if run.note.startswith("measured again")]
    lost = [run for run in results if run.status == "client"]
    if not (again or lost):
        return []
    return [f"The client failed {len(again)} run(s) that were then measured "
            f"again, and {len(lost)} that stayed its failure after "
            f"{1 + CLIENT_RETRIES} tries (runs.csv: status `client`, "
            "and the note).", ""]


def rate_markdown(sweep, results):
    return (titled(rate_tables(sweep, results), True) + [RATE_LEGEND, ""]
            + client_failures(results))


def rate_console(sweep, results):
    return "\n".join(titled(rate_tables(sweep, results), False)).rstrip()


def write_rate_chart(sweep, results, info):
    """chart-rate.png: p99 against offered rate, both axes log. Returns
    (files, why none)."""
    plt, why = matplotlib_pyplot()
    if plt is None:
        return [], why
    axis = Axis("offered_rps", sweep.args.rates,
                "offered rate, requests per second (httperf --rate)")
    drawn = draw_chart(plt, sweep, results, info,
                       lambda runs: all_of(runs, "p99_ms"),
                       "p99 latency, ms (failed requests as --timeout)",
                       True, sweep.out / "chart-rate.png", axis)
    return (["chart-rate.png"] if drawn else []), None
