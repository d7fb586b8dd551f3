"""The mutant lists of `make mutate` (tools/mutate) stay usable: every
tests/mutants/*.txt parses, and every mutant's `-` text still occurs
exactly once in its file, so a server edit that breaks a mutant fails
`make test` rather than the next mutation run. And the tool refuses a
mutant it cannot apply, as an error, never as a survivor. Fast: nothing is
built and no server runs."""

import subprocess
import sys

import pytest

from processes import REPO
from scripts import load

TOOL = REPO / "tools" / "mutate"


mutate = load(TOOL, "mutate_tool")
try:
    MUTANTS = mutate.load()
except mutate.MutantError:
    MUTANTS = []  # test_lists_parse says why


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_lists_parse():
    mutants = mutate.load()  # raises with the list, line and reason
    assert len([m for m in mutants if "project.txt" in m.where]) >= 45


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_applies_once(mutant):
    """Its `-` lines occur exactly once in its file (apply() says how many
    times they do otherwise), and applying it changes the file."""
    assert (REPO / mutant.file).read_text() != mutate.apply(mutant)


def test_format():
    text = ("# a comment\n\n"
            "name: one\nfile: 07_epoll/main.c\nwhy: a change\n"
            "-    a\n-    b\n+    c\n\n"
            "# between mutants\n"
            "name: two\nfile: 01_iterative/main.c\nwhy: a deletion\n-x\n")
    one, two = mutate.parse_text(text, "t.txt")
    assert (one.name, one.file, one.model) == ("one", "07_epoll/main.c",
                                               "epoll")
    assert (one.minus, one.plus) == (["    a", "    b"], ["    c"])
    assert (two.minus, two.plus, two.model) == (["x"], [], "iterative")
    for broken in ("name: x\nfile: 07_epoll/main.c\nwhy: w\n+y\n",
                   "name: x\nfile: 07_epoll/main.c\n-y\n",
                   "name: x\nfile: epoll.c\nwhy: w\n-y\n",
                   "name: x\nfile: 07_epoll/main.c\nwhy: w\n-y\n+y\n"):
        with pytest.raises(mutate.MutantError):
            mutate.parse_text(broken, "t.txt")


def test_refuses_text_not_found_once(tmp_path):
    """A mutant whose `-` text is absent, or occurs twice, is REFUSED and
    the tool exits 1 (before building anything or running a test)."""
    (tmp_path / "refused.txt").write_text(
        "name: absent\nfile: 07_epoll/main.c\nwhy: no such line\n"
        "-    this line is in no server at all();\n+    x();\n\n"
        "name: twice\nfile: 07_epoll/main.c\nwhy: a line found many times\n"
        "-}\n+};\n")
    done = run_tool("--mutants", str(tmp_path), "--check")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    absent = next(line for line in lines if line.startswith("absent"))
    assert "REFUSED" in absent and "occurs 0 times" in absent
    twice = next(line for line in lines if line.startswith("twice"))
    assert "REFUSED" in twice and "not once" in twice
    assert "builds" not in done.stdout


def test_refuses_a_list_that_does_not_parse(tmp_path):
    (tmp_path / "bad.txt").write_text("name: x\nwhat: y\n")
    done = run_tool("--mutants", str(tmp_path), "--list")
    assert done.returncode == 2
    assert "bad.txt:2" in done.stderr
