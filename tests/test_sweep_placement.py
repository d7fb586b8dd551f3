"""Where loadtest/sweep runs things (issue 16): components pinned to CPUs
(--cpus), the server, Redis and nginx on another host over ssh (--host), and
wrk as the client (--client wrk).

The ssh tests need no other machine: they start a private sshd on
127.0.0.1 and a free port, with a throwaway host key and client key in a
temporary folder, and point --host at it. The system sshd, its config and
~/.ssh are never used (the client runs with `-F /dev/null`).
"""

import csv
import getpass
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from processes import REPO, free_port
from test_loadtest_smoke import (assert_numbers, built_servers, run_sweep,
                                 sweep_process, table_rows)

sys.path.insert(0, str(REPO / "loadtest"))
import harness  # noqa: E402  (Place: the pinning under test)

SSHD = Path("/usr/sbin/sshd")
SSHD_START = 10.0  # seconds for sshd to accept
SSHD_CHILDREN_GONE = 10.0  # seconds for its per-connection children to go
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
SCRATCH = "/tmp/zerohttpd-sweep.*"  # the sweep's folders on other hosts
EXEC_TIMEOUT = 5.0  # seconds for a started process to exec its program


def cpus_allowed(pid, program):
    """The CPUs a process may run on, once taskset has exec'd `program`
    under the same PID."""
    deadline = time.monotonic() + EXEC_TIMEOUT
    while Path(f"/proc/{pid}/comm").read_text().strip() != program:
        assert time.monotonic() < deadline, f"{program} not started"
        time.sleep(0.01)
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(l for l in status.splitlines()
                if l.startswith("Cpus_allowed_list:"))
    return harness.cpu_list(line.split(":")[1].strip())


def usable_cpus():
    return sorted(os.sched_getaffinity(0))


def results_md(out):
    return (out / "results.md").read_text()


# ---- pinning ----

def test_place_pins_a_process_to_its_cpus(tmp_path):
    cpu = usable_cpus()[-1]
    proc = harness.Place(cpus=[cpu]).start(["sleep", "30"],
                                           tmp_path / "sleep.log")
    try:
        assert cpus_allowed(proc.pid, "sleep") == [cpu]
    finally:
        harness.stop(proc, grace=1)
    unpinned = harness.Place().start(["sleep", "30"], tmp_path / "sleep.log")
    try:
        assert cpus_allowed(unpinned.pid, "sleep") == usable_cpus()
    finally:
        harness.stop(unpinned, grace=1)


def test_sweep_pinned_records_the_cpus(tmp_path):
    server = built_servers(1)[0]
    first, last = usable_cpus()[0], usable_cpus()[-1]
    spec = f"server={last},client={first},redis={first},nginx={first}"
    run_sweep(tmp_path, "--servers", server, "--concurrency", "5,10",
              "--requests", "200", "--cpus", spec)

    text = results_md(tmp_path)
    header, rows = table_rows(text)
    assert header == ["concurrency", server]
    for level, cells in rows.items():
        assert_numbers(cells, f"c={level} pinned")
    assert f"- server: this machine, CPU {last} (taskset -c)" in text
    assert f"- client (ab): this machine, CPU {first} (taskset -c)" in text
    assert f"- redis: this machine, CPU {first} (taskset -c)" in text
    assert "- nginx: not used" in text


def test_sweep_unpinned_says_so(tmp_path):
    server = built_servers(1)[0]
    run_sweep(tmp_path, "--servers", server, "--concurrency", "5",
              "--requests", "100")
    text = results_md(tmp_path)
    assert "- server: this machine, any CPU" in text
    assert "- client (ab): this machine, any CPU" in text


@pytest.mark.parametrize("spec, said", [
    ("server=1,bogus=0", "unknown component 'bogus'"),
    ("server=4096", "CPU 4096 is not online here"),
    ("server=one", "expected CPU numbers or ranges"),
    ("0,1", "expected COMPONENT=CPUS"),
])
def test_sweep_rejects_a_bad_cpu_spec(tmp_path, spec, said):
    done = sweep_process(tmp_path, "--cpus", spec)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "results.md").exists()


# ---- wrk ----

def test_sweep_with_wrk(tmp_path):
    servers = built_servers(2)
    run_sweep(tmp_path, "--servers", ",".join(servers), "--concurrency",
              "5,10", "--client", "wrk", "--duration", "1")

    text = results_md(tmp_path)
    header, rows = table_rows(text)
    assert header == ["concurrency"] + servers
    for level, cells in rows.items():
        assert_numbers(cells, f"c={level} wrk")
    assert "- Client: wrk;" in text
    assert "-H 'Connection: close'" in text
    with open(tmp_path / "runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * len(servers)
    for run in runs:
        assert run["status"] == "ok" and float(run["rps"]) > 0, run
        assert run["client_exit"] == "0" and int(run["complete"]) > 0, run
        assert run["n"] == "", run  # wrk runs for a time, not a count


def test_parse_wrk_reads_errors_and_non_2xx():
    report = """\
Running 1s test @ http://127.0.0.1:8000/
  2 threads and 10 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.50ms  446.44us   4.93ms   71.43%
  Latency Distribution
     50%  724.00us
     99%    2.00s
  1000 requests in 1.00s, 2.11MB read
  Socket errors: connect 1, read 2, write 3, timeout 4
  Non-2xx or 3xx responses: 5
Requests/sec:   1000.50
Transfer/sec:      2.11MB
"""
    found = harness.parse_wrk(report)
    assert found == {"complete": 1000, "rps": 1000.5, "non2xx": 5,
                     "connect": 1, "receive": 2, "write": 3, "timeouts": 4,
                     "failed": 10, "mean_ms": 1.5, "p50_ms": 0.724,
                     "p99_ms": 2000.0}


# ---- other hosts, over ssh to a private sshd on 127.0.0.1 ----

def children_of(pid):
    """PIDs whose parent is pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                    "zerohttpd-test", "-f", str(path)], check=True,
                   timeout=30)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A private sshd on 127.0.0.1 that lets the current user in with a
    throwaway key. Yields the sweep's ssh options for it."""
    if not SSHD.exists():
        pytest.skip("sshd not installed: `make deps` installs openssh-server")
    folder = tmp_path_factory.mktemp("sshd")
    keygen(folder / "host_key")
    keygen(folder / "id")
    (folder / "authorized_keys").write_text((folder / "id.pub").read_text())
    port = free_port()
    (folder / "sshd_config").write_text(f"""\
ListenAddress 127.0.0.1
Port {port}
HostKey {folder}/host_key
AuthorizedKeysFile {folder}/authorized_keys
PidFile {folder}/sshd.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
""")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    log = open(folder / "sshd.log", "wb")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f",
                             str(folder / "sshd_config")], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SSHD_START
        while not harness.accepts(port):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "sshd did not start:\n" + (folder / "sshd.log").read_text())
            time.sleep(0.05)
        yield types.SimpleNamespace(
            target=f"{getpass.getuser()}@127.0.0.1", folder=folder,
            options=["--ssh-port", str(port), "--ssh-config", "/dev/null",
                     "--ssh-option", f"IdentityFile={folder}/id",
                     "--ssh-option", "IdentitiesOnly=yes",
                     "--ssh-option", "StrictHostKeyChecking=no",
                     "--ssh-option", "UserKnownHostsFile=/dev/null",
                     "--ssh-option", "LogLevel=ERROR"])
        # each connection's sshd goes once the sweep has closed it
        deadline = time.monotonic() + SSHD_CHILDREN_GONE
        while children_of(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not children_of(proc.pid), "ssh sessions left open"
    finally:
        proc.terminate()
        try:
            proc.wait(SSHD_START)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def scratch_folders():
    return set(Path("/tmp").glob(SCRATCH.removeprefix("/tmp/")))


def assert_each_instance_stopped(log, server):
    """Every instance started printed its listening line, and its summary at
    SIGTERM: it was stopped by PID, gently."""
    text = log.read_text()
    started = text.count("listening on port")
    assert started >= 1, text
    assert text.count(f"{server}: served ") == started, text


def test_sweep_server_and_redis_on_another_host(tmp_path, sshd):
    server = built_servers(1)[0]
    before = scratch_folders()
    run_sweep(tmp_path, "--servers", server, "--concurrency", "5,10",
              "--requests", "100", "--path", "/guestbook",
              "--host", f"server={sshd.target}",
              "--host", f"redis={sshd.target}", *sshd.options)

    text = results_md(tmp_path)
    header, rows = table_rows(text)
    assert header == ["concurrency", server]
    for level, cells in rows.items():
        assert_numbers(cells, f"c={level} over ssh")
    for component in ("server", "redis"):
        assert f"- {component}: {sshd.target}, any CPU" in text, text
    assert f"- {sshd.target}: address 127.0.0.1, " in text
    assert "- client (ab): this machine, any CPU" in text
    assert "Remarks seeded: yes" in text  # the server reached Redis
    logs = tmp_path / "logs" / sshd.target  # fetched from the host
    assert_each_instance_stopped(logs / f"{server}.log", server)
    assert "Ready to accept connections" in (logs / "redis.log").read_text()
    # removed there (compared as a difference: a folder another sweep
    # left before may go meanwhile, as one did in CI on 2026-11-26)
    assert not scratch_folders() - before


def test_sweep_nginx_on_another_host(tmp_path, sshd):
    server = built_servers(1)[0]
    run_sweep(tmp_path, "--servers", server, "--concurrency", "5",
              "--requests", "100", "--behind-nginx", "1",
              "--host", f"nginx={sshd.target}", *sshd.options)

    text = results_md(tmp_path)
    assert_numbers(table_rows(text)[1][5], "c=5 nginx over ssh")
    assert f"- nginx: {sshd.target}, any CPU" in text
    assert f"- {sshd.target}: address 127.0.0.1, " in text
    assert "- server: this machine, any CPU" in text
    logs = tmp_path / "logs" / sshd.target
    assert (logs / "nginx.conf").read_text() == \
        (tmp_path / "nginx.conf").read_text()
    assert_each_instance_stopped(tmp_path / "logs" / f"{server}.log", server)


def test_sweep_checks_cpus_on_the_other_host(tmp_path, sshd):
    done = sweep_process(tmp_path, "--servers", built_servers(1)[0],
                         "--host", f"server={sshd.target}",
                         "--cpus", "server=4096", *sshd.options)
    assert done.returncode == 2, done.stderr
    assert f"CPU 4096 is not online on {sshd.target}" in done.stderr


def test_sweep_says_when_a_host_cannot_be_reached(tmp_path, sshd):
    options = list(sshd.options)
    options[options.index("--ssh-port") + 1] = str(free_port())  # no sshd
    done = sweep_process(tmp_path, "--servers", built_servers(1)[0],
                         "--host", f"server={sshd.target}", *options)
    assert done.returncode == 1, done.stderr
    assert f"ssh {sshd.target} did not start" in done.stderr
    assert "Connection refused" in done.stderr
