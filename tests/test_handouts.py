"""Every ```sh block of every lab handout runs as written, from a fresh copy
of the repository: `tools/lab blocks LAB` (its docstring has the rules: in
order, `bash -e -o pipefail`, private network and PID namespaces, 120 s,
`<!-- block: exit=N -->`, `<!-- block: skip: why -->`).

A student pastes these blocks first; one that fails teaches that the
handout is wrong. The labs run two at a time (each builds the servers in
its own copy, and two cores are what CI has), started together when the
first test asks, so `-k zombies` runs only that lab.

Run: python3 -m pytest tests/test_handouts.py -v
"""

import concurrent.futures
import subprocess
import sys
import warnings

import pytest

from processes import REPO

LAB_TOOL = REPO / "tools" / "lab"
LABS = sorted(p.parent.name for p in (REPO / "labs").glob("*/lab.toml"))
CANNOT_ISOLATE = 77  # tools/lab blocks: namespaces refused on this machine
AT_ONCE = 2
# tools/lab stops each block after 120 s; this bounds a whole lab (its
# copy, a few blocks) should that ever fail.
LAB_TIMEOUT = 900


def run_blocks(lab):
    return subprocess.run([sys.executable, str(LAB_TOOL), "blocks", lab],
                          capture_output=True, text=True, timeout=LAB_TIMEOUT)


@pytest.fixture(scope="module")
def runs(request):
    """{lab: future of its run}, for the labs this session selected."""
    selected = [item.callspec.params["lab"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        yield {lab: pool.submit(run_blocks, lab) for lab in selected}


@pytest.mark.parametrize("lab", LABS)
def test_handout_blocks_run_as_written(runs, lab):
    done = runs[lab].result()
    if done.returncode == CANNOT_ISOLATE:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line.strip() for line in done.stdout.splitlines()
               if ": SKIPPED: " in line]
    if skipped:  # allowed, but said: nobody checks those blocks
        warnings.warn(f"labs/{lab}/README.md: not run: " + "; ".join(skipped))
