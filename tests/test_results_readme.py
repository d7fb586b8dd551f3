"""RESULTS.md's measured tables come from the kept results, not from hands.

`make results` (loadtest/results-readme) rewrites the regions between
`<!-- results: NAME begin ... -->` and `<!-- results: NAME end -->` from the
result folders in loadtest/results/. These tests run the real command on the
real RESULTS.md and result folders: RESULTS.md must be exactly what it writes, a
figure edited by hand must fail the check, the full sweep pinned must appear
beside the unpinned one once both folders are kept, and loadtest/results/
must hold what the documents cite and nothing else.
"""

import re
import shutil
import subprocess
import sys

import pytest

from processes import REPO
from scripts import load

TOOL = REPO / "loadtest" / "results-readme"
RESULTS = REPO / "loadtest" / "results"
TOOL_TIMEOUT = 60  # seconds; it reads a few CSV files and measures nothing
CITATION = re.compile(r"loadtest/results/([A-Za-z0-9._-]+)")


def results_readme(*options):
    return subprocess.run([sys.executable, str(TOOL), *options], cwd=REPO,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT)


def region(text, name):
    """The lines between a region's markers."""
    found = re.search(rf"<!-- results: {name} begin\b.*?-->\n(.*?)"
                      rf"<!-- results: {name} end -->", text, re.DOTALL)
    assert found, f"no region {name}"
    return found[1]


def median_table(results_md):
    """The table of medians a sweep wrote into its results.md when it ran."""
    text = results_md.read_text().split("## Requests per second\n\n", 1)[1]
    return text.split("\n\n", 1)[0]


def rows(table):
    """{concurrency: [cells]} and the header of a Markdown table."""
    lines = [[c.strip() for c in line.strip("|").split("|")]
             for line in table.splitlines() if line.startswith("|")]
    return lines[0], {line[0]: line[1:] for line in lines[2:]}


def test_readme_is_what_make_results_writes():
    done = subprocess.run(["make", "-s", "results-check"], cwd=REPO,
                          capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["classic", "nginx", "quick-pinned",
                                  "fibers", "event-static", "event-perconn",
                                  "reuseport-scaling", "costs",
                                  "costs-memory", "costs-busy"])
def test_a_figure_edited_by_hand_fails_the_check(tmp_path, name):
    readme = tmp_path / "RESULTS.md"
    text = (REPO / "RESULTS.md").read_text()
    shown = region(text, name)
    first_table = "|" + shown.split("\n|", 1)[1].split("\n\n", 1)[0]
    _, table = rows(first_table)
    figure = next(iter(table.values()))[-1]  # the first row's last cell
    edited = shown.replace(f" {figure} |", f" {figure}0 |", 1)
    assert edited != shown
    readme.write_text(text.replace(shown, edited))
    done = results_readme("--check", "--readme", str(readme))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f" {figure}0 |" in done.stdout and "make results" in done.stdout
    # --check wrote nothing; without it the figure is put back
    assert readme.read_text() != text
    assert results_readme("--readme", str(readme)).returncode == 0
    assert readme.read_text() == text


def test_prose_outside_the_regions_stays_hand_written(tmp_path):
    readme = tmp_path / "RESULTS.md"
    text = (REPO / "RESULTS.md").read_text().replace(
        "What it shows:", "What it shows (edited by hand):", 1)
    readme.write_text(text)
    done = results_readme("--check", "--readme", str(readme))
    assert done.returncode == 0, done.stdout + done.stderr


def classic_folder(text):
    begin = re.search(r"<!-- results: classic begin: .* from "
                      r"loadtest/results/([\w.-]+);", text)
    assert begin, "the classic region's begin marker names no folder"
    return begin[1]


def test_pinned_beside_unpinned_once_both_are_kept(tmp_path):
    """Kept quick rounds stand in for what `make sweep-table` writes: the
    classic region switches to the unpinned sweep and the pinned region
    shows each cell as unpinned → pinned, as the two results.md say."""
    results = tmp_path / "results"
    results.mkdir()
    stand_ins = {"classic-unpinned": RESULTS / "2026-11-23-quick-unpinned-1",
                 "classic-pinned": RESULTS / "2026-11-23-quick-pinned-1"}
    for entry in RESULTS.iterdir():
        if entry.name not in stand_ins:  # a real sweep-table run's, if any
            (results / entry.name).symlink_to(entry)
    for name, folder in stand_ins.items():
        (results / name).symlink_to(folder)
    unpinned, pinned = stand_ins.values()
    readme = tmp_path / "RESULTS.md"
    shutil.copy(REPO / "RESULTS.md", readme)
    done = results_readme("--readme", str(readme), "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    text = readme.read_text()
    assert classic_folder(text) == "classic-unpinned"
    assert median_table(unpinned / "results.md") in region(text, "classic")
    shown = region(text, "classic-pinned")
    for name in ("classic-unpinned", "classic-pinned"):
        assert f"(loadtest/results/{name}/chart.png)" in shown
    assert "CPU 1 (taskset -c)" in shown  # the pinned sweep's placement
    header, before = rows(median_table(unpinned / "results.md"))
    _, after = rows(median_table(pinned / "results.md"))
    compared = shown.split("unpinned → pinned**:\n\n", 1)[1]
    got_header, got = rows(compared.split("\n\n", 1)[0])
    assert got_header == header
    assert got == {c: [f"{b} → {a}" for b, a in zip(before[c], after[c])]
                   for c in before}


def test_results_holds_what_the_documents_cite():
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
        check=True, timeout=TOOL_TIMEOUT).stdout.split("\0")
    kept = {path.split("/")[2] for path in tracked
            if path.startswith("loadtest/results/")}
    documents = [path for path in tracked if path.endswith(".md")
                 and not path.startswith("loadtest/results/")]
    cited = {name for path in documents
             for name in CITATION.findall((REPO / path).read_text())}
    tool = load(TOOL, "results_readme")
    planned = {tool.CLASSIC_UNPINNED, tool.CLASSIC_PINNED}  # sweep-table's
    assert kept, "no kept results"
    assert sorted(kept - cited) == [], "kept but cited by no document"
    assert sorted(cited - kept - planned) == [], "cited but not kept"


def test_readme_summary_is_rows_of_the_classic_table():
    """The README's short table copies rows of RESULTS.md's classic region,
    as they are: a figure typed into it by hand fails here."""
    readme = (REPO / "README.md").read_text()
    summary = readme.split("## Results, in short", 1)[1]
    shown = [line for line in summary.splitlines() if line.startswith("|")]
    classic = region((REPO / "RESULTS.md").read_text(), "classic")
    assert len(shown) >= 3, "the README has no summary table"
    for line in shown:
        assert line in classic.splitlines(), f"not in the classic table: {line}"


def test_anatomy_tables_are_current_and_checked(tmp_path):
    """tools/anatomy --check passes on the repository and fails once a
    main.c grows by a line without the tables being written again."""
    anatomy = REPO / "tools" / "anatomy"
    done = subprocess.run([sys.executable, str(anatomy), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in REPO.glob("[0-9][0-9]_*/main.c"):
        (tmp_path / path.parent.name).mkdir()
        shutil.copy(path, tmp_path / path.parent.name / "main.c")
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    grown = tmp_path / "01_iterative" / "main.c"
    grown.write_text(grown.read_text() + "\n")
    done = subprocess.run([sys.executable, str(anatomy), "--check",
                           str(tmp_path)], capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT)
    assert done.returncode == 1 and "stale" in done.stderr, done.stdout


def test_cost_region_is_the_kept_sweeps_own_tables():
    """The costs region renders the kept --costs sweep's runs.csv with the
    sweep's code: its two summary tables are the ones the sweep wrote into
    its results.md, row for row."""
    tool = load(TOOL, "results_readme")
    kept_md = (RESULTS / tool.COSTS / "results.md").read_text()
    shown = region((REPO / "RESULTS.md").read_text(), "costs")
    tables = [part.split("\n\n", 1)[1].split("\n\n", 1)[0]
              for part in kept_md.split("## Cost summary: ")[1:]]
    assert len(tables) == 2, "alone and beside the idle connections"
    for table in tables:
        assert table in shown


def test_rate_knees_render_a_kept_rate_sweep():
    """rate_knees() (RESULTS.md's `rates` region, from the quiet --rate
    sweep kept) renders a kept runs.csv into the tables its sweep wrote,
    the knee among them, and the chart; where several servers held the
    highest rate, the sentence names them all."""
    tool = load(TOOL, "results_readme")
    name = tool.RATES
    shown = "\n".join(tool.rate_knees(name))
    assert shown in region((REPO / "RESULTS.md").read_text(), "rates")
    kept_md = (RESULTS / name / "results.md").read_text()
    for title in ("p99 latency (ms) against offered rate",
                  "The knee: highest rate held, first rate not held"):
        table = kept_md.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0]
        assert f"**{title}**\n\n{table}" in shown
    assert f"(loadtest/results/{name}/chart-rate.png)" in shown
    assert "- The knee: iterative, prethreaded, epoll and io_uring held " \
        "the highest rate (8,000 req/s), forking the lowest" in shown
