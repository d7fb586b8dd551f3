"""The instructor pack (`make handout LAB=zombies`, labs/README.md): built,
unpacked in a temporary directory, it holds no file with the lab's answer,
and `make grade` works inside it, quietly: the starter scores short, the
reference source (given from outside) full.

Run: python3 -m pytest tests/test_lab_pack.py -v
"""

import os
import re
import subprocess
import tarfile

import pytest

from processes import REPO
from test_handouts import run_blocks

LAB = "zombies"
TOP = f"{LAB}-lab"
GRADE_TIMEOUT = 300  # seconds for one `make grade` (the grader takes ~10)
# All that `make grade` may print: the grader's lines, and make's own note
# that the recipe failed when the score is short.
GRADER_LINE = re.compile(r"^(Grading lab |  (PASS|FAIL) |Score: \d+/\d+$)")
MAKE_ERROR = re.compile(r"^make: \*\*\* \[Makefile:\d+: grade\] Error 1$")


def make(where, *args, timeout=GRADE_TIMEOUT):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-C", str(where), "--no-print-directory",
                           *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / f"{TOP}.tar.gz"
    done = make(REPO, "handout", f"LAB={LAB}", f"OUT={out}")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def unpack(tarball, into):
    """The pack unpacked in a directory of its own: its top directory."""
    into.mkdir()
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(into)], check=True)
    return into / TOP


@pytest.fixture(scope="module")
def pack(tarball, tmp_path_factory):
    """(member names, the unpacked pack's directory)."""
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    return names, unpack(tarball, tmp_path_factory.mktemp("unpacked") / "x")


def test_pack_holds_no_answer(pack):
    names, _ = pack
    others = [p.parent.name for p in (REPO / "labs").glob("*/lab.toml")
              if p.parent.name != LAB]
    starter = f"{TOP}/labs/work/{LAB}/main.c"
    assert starter in names
    answers = [n for n in names if
               (n.endswith(".c") and n != starter) or n.endswith(".patch")
               or "/wrong" in n or "solution" in n
               or any(n.startswith(f"{TOP}/labs/{o}") for o in others)
               or re.match(rf"{TOP}/\d\d_", n)]  # a server's directory
    assert answers == []


def test_pack_reference_is_prebuilt_and_stripped(pack):
    _, top = pack
    binary = top / "forking"
    assert os.access(binary, os.X_OK)
    sections = subprocess.run(["readelf", "-S", "-W", str(binary)],
                              capture_output=True, text=True, check=True)
    assert ".symtab" not in sections.stdout
    assert ".debug_info" not in sections.stdout


def grade(top, *args):
    """`make grade` in the pack: (exit status, its score, every line that
    is not the grader's)."""
    done = make(top, "grade", f"LAB={LAB}", *args)
    score = re.search(r"^Score: (\d+)/(\d+)$", done.stdout, re.M)
    noise = [line for line in done.stdout.splitlines()
             if not GRADER_LINE.match(line)]
    noise += [line for line in done.stderr.splitlines()
              if not MAKE_ERROR.match(line)]
    assert score, done.stdout + done.stderr
    return done.returncode, (int(score[1]), int(score[2])), noise


def test_pack_grades_the_starter_short(pack):
    _, top = pack
    code, (got, total), noise = grade(top)
    assert (code, total, noise) == (2, 100, [])
    assert got < total


def test_pack_grades_the_reference_full(pack):
    _, top = pack
    code, score, noise = grade(top, f"SRC={REPO / '02_forking' / 'main.c'}")
    assert (code, score, noise) == (0, (100, 100), [])


def test_pack_handout_blocks_run_as_written(tarball, tmp_path):
    """The handout's blocks in the pack as a student has it, ./forking
    prebuilt and no server source: `tools/lab blocks` there."""
    top = unpack(tarball, tmp_path / "x")
    done = run_blocks(LAB, tool=top / "tools" / "lab")
    assert done.returncode == 0, done.stdout + done.stderr
