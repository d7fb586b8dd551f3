"""Every ```sh block of every lab handout runs as written, from a fresh copy
of the repository: `tools/lab blocks LAB` (its docstring has the rules: in
order, `bash -e -o pipefail`, private network and PID namespaces, 240 s,
`<!-- block: exit=N -->`, `<!-- block: skip: why -->`).

A student pastes these blocks first; one that fails teaches that the
handout is wrong. The labs run three at a time, started together when the
first test asks, so `-k zombies` runs only that lab. Each copy starts with
the servers this checkout has built (`--built`: make test built them
first), so a handout's `make all` finds them up to date; building from
scratch in a fresh copy is what the README's first screen checks below.
Their gradings stop at the first FAIL (`--first-fail`): that shows the
command works, and `tools/lab check` grades every starter.

Run: python3 -m pytest tests/test_handouts.py -v
"""

import concurrent.futures
import re
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest

from processes import REPO

LAB_TOOL = REPO / "tools" / "lab"
LABS = sorted(p.parent.name for p in (REPO / "labs").glob("*/lab.toml"))
CANNOT_ISOLATE = 77  # tools/lab blocks: namespaces refused on this machine
# Three at a time: with the servers prebuilt, a handout mostly waits on its
# starter's grading, to the first FAIL (2026-11-27: slowloris 91 s alone,
# 196 s in make test beside tools/lab check; the handouts are the longest
# part of make test's parallel pytest, 615 s)
AT_ONCE = 3
# tools/lab stops each block after 240 s; this bounds a whole lab (its
# copy, a few blocks) should that ever fail.
LAB_TIMEOUT = 900


def run_blocks(handout, *options, tool=LAB_TOOL):
    """`tools/lab blocks` (or another copy's, as in a pack) on a lab or a
    Markdown file; the calling test is skipped, saying why, where this
    machine refuses the namespaces."""
    done = subprocess.run([sys.executable, str(tool), "blocks", *options,
                           str(handout)], capture_output=True, text=True,
                          timeout=LAB_TIMEOUT)
    if done.returncode == CANNOT_ISOLATE:
        pytest.skip(done.stdout.strip())
    return done


@pytest.fixture(scope="module")
def runs(request):
    """{lab: future of its run}, for the labs this session selected."""
    selected = [item.callspec.params["lab"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        yield {lab: pool.submit(run_blocks, lab, "--built", "--first-fail")
               for lab in selected}


@pytest.mark.parametrize("lab", LABS)
def test_handout_blocks_run_as_written(runs, lab):
    done = runs[lab].result()  # a skip in run_blocks is raised here
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line.strip() for line in done.stdout.splitlines()
               if ": SKIPPED: " in line]
    if skipped:  # allowed, but said: nobody checks those blocks
        warnings.warn(f"labs/{lab}/README.md: not run: " + "; ".join(skipped))


# The runner's own rules, on a handout written for them: block by block,
# what it must report.
RULES = """
```sh
test $$ = 1                           # its own PIDs: bash is the first
test "$(ip -o link | wc -l)" = 1      # its own network: loopback alone, up
python3 -m http.server -b 127.0.0.1 8000 >/dev/null 2>&1 &
curl -s -o /dev/null --retry 20 --retry-connrefused --retry-delay 0 \\
     http://127.0.0.1:8000/           # port 8000 is its own
(exec -a {marker} sleep 300) &        # left running: must end with the block
test "$EDITOR" = true && test -f labs/grading.py && test ! -e labs/work
```
<!-- block: exit=3 -->
```sh
exit 3
```

<!-- block: skip: not for this machine -->
```sh
false
```
```sh
false | true                          # pipefail
```
```sh
sleep 30
```
"""
RULES_SAY = [r"ok: exit 0", r"ok: exit 3", r"SKIPPED: not for this machine",
             r"FAIL: exit 1 .*, expected exit 0",
             r"FAIL: still running after 10.0 s"]


def running_with(marker):
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            pass  # it ended as we looked
    return found


def test_blocks_runner_keeps_its_rules(tmp_path):
    marker = f"zerohttpd-block-{uuid.uuid4().hex[:12]}"
    handout = tmp_path / "rules.md"
    handout.write_text(RULES.format(marker=marker))
    # 10 s: block 1 starts a Python server, which took over 3 s under load
    done = run_blocks(handout, "--timeout", "10")
    said = [line for line in done.stdout.splitlines()
            if line.startswith("  block ")]
    assert len(said) == len(RULES_SAY), done.stdout + done.stderr
    for line, wanted in zip(said, RULES_SAY):
        assert re.search(wanted, line), done.stdout + done.stderr
    assert done.returncode == 1
    assert running_with(marker) == []


def test_readme_first_screen_runs_as_written():
    """The README's first block (build, a private Redis, one server, curl,
    stop) runs as pasted into a fresh clone; its other blocks say why not."""
    done = run_blocks(REPO / "README.md")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "block 1 (line" in done.stdout and "ok: exit 0" in done.stdout, \
        done.stdout


def test_readme_counts_the_answers_kept():
    """The README's counts of known wrong answers (in all, from blind
    rounds, per lab in its table) and of right answers are the files in
    labs/*/wrong/ and labs/*/right/: one added without its count fails."""
    readme = (REPO / "README.md").read_text()
    wrong = {lab: sorted((REPO / "labs" / lab / "wrong").glob("*.patch"))
             for lab in LABS}
    right = sum(len(list((REPO / "labs" / lab / "right").glob("*.patch")))
                for lab in LABS)
    blind = [p for patches in wrong.values() for p in patches
             if p.name.startswith("blind")]
    rounds = {p.name.split("_", 1)[0] for p in blind}
    said = re.search(r"`labs/<lab>/wrong/`, (\d+) in all, .*?; (\d+) of them "
                     r"written in (\w+) blind rounds .*?, with (\d+) right "
                     r"answers", readme, re.S)
    assert said, "the README no longer says how many answers are kept"
    words = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
             "seven": 7, "eight": 8, "nine": 9, "ten": 10,
             "eleven": 11, "twelve": 12}
    assert (int(said[1]), int(said[2]), words.get(said[3]), int(said[4])) \
        == (sum(map(len, wrong.values())), len(blind), len(rounds), right)
    for lab, patches in wrong.items():
        row = re.search(rf"^\| {re.escape(lab)} \|.*\| (\d+): ", readme, re.M)
        assert row, f"the README's lab table has no row for {lab}"
        assert int(row[1]) == len(patches), f"{lab}: the README says " \
            f"{row[1]} wrong answers, labs/{lab}/wrong/ has {len(patches)}"
