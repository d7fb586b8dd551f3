"""make check-sync: the shared blocks agree, and no function is copied
between two servers outside them (a copy outside a block drifts unseen).

Each test copies the ten main.c files, plants one fault and runs
tools/check-sync on the copy.
"""

import re
import shutil
import subprocess
import sys

import pytest

from processes import REPO

CHECK_SYNC = REPO / "tools" / "check-sync"
SERVERS = sorted(p.parent.name for p in REPO.glob("[0-9][0-9]_*/main.c"))


@pytest.fixture
def tree(tmp_path):
    for name in SERVERS:
        (tmp_path / name).mkdir()
        shutil.copy(REPO / name / "main.c", tmp_path / name / "main.c")
    return tmp_path


def check_sync(root):
    done = subprocess.run([sys.executable, str(CHECK_SYNC), str(root)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def function(path, name):
    """The definition of static function `name` in path, with the comment
    above it."""
    text = path.read_text()
    found = re.search(r"(/\*(?:(?!\*/).)*\*/\n)?static [^\n;]*\b" + name +
                      r"\([^;{]*\)\n\{\n.*?\n\}\n", text, re.S)
    assert found, f"{path} has no function {name}()"
    return found[0]


def test_the_tree_as_committed_passes(tree):
    code, said = check_sync(tree)
    assert code == 0, said
    assert "lingering" in said and "epoll_backend" in said


def test_a_copied_function_outside_the_blocks_fails(tree):
    # 02's loop, renamed and planted in 03 outside every block
    copy = function(tree / "02_forking" / "main.c", "serve_forever")
    target = tree / "03_preforked" / "main.c"
    text = target.read_text()
    anchor = "/* ===== main ===== */"
    target.write_text(text.replace(anchor, copy.replace(
        "serve_forever", "serve_again") + "\n" + anchor, 1))
    code, said = check_sync(tree)
    assert code == 1, said
    line = next((line for line in said.splitlines()
                 if "is the same code in" in line), "")
    assert "02_forking/main.c" in line and "03_preforked/main.c" in line, said


def test_a_copy_differing_only_in_comments_and_spacing_fails(tree):
    copy = function(tree / "07_epoll" / "main.c", "wait_for_events")
    copy = copy.replace("wait_for_events", "wait_again").replace(
        "    ", "  ")
    copy = re.sub(r"/\*.*?\*/", "/* reworded */", copy, flags=re.S)
    target = tree / "08_io_uring" / "main.c"
    text = target.read_text()
    anchor = "/* ===== main ===== */"
    target.write_text(text.replace(anchor, copy + "\n" + anchor, 1))
    code, said = check_sync(tree)
    assert code == 1 and "is the same code in" in said, said


def test_a_block_edited_in_one_file_fails(tree):
    path = tree / "06_poll" / "main.c"
    text = path.read_text()
    start = text.index("/* ---- shared: redis_io ---- */")
    edited = text[:start] + text[start:].replace("redis_fail();",
                                                 "redis_fail(); /* x */", 1)
    path.write_text(edited)
    code, said = check_sync(tree)
    assert code == 1 and "block 'redis_io' differs" in said, said


def test_a_malformed_marker_fails(tree):
    path = tree / "01_iterative" / "main.c"
    path.write_text(path.read_text().replace(
        "/* ---- end shared: lingering ---- */",
        "/* ---- end shared lingering ---- */", 1))
    code, said = check_sync(tree)
    assert code == 1 and "malformed marker" in said, said
