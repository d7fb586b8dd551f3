"""What every lab's grader shares: a private Redis, the student's server
started from the repo root's public/ and templates/, checks with points, and
the `Score: X/Y` line.

A grader (labs/<lab>/grade.py) is a list of checks:

    grader = Grader("zombies")

    @grader.check(60, "no zombies after 300 requests")
    def no_zombies(lab):
        server = lab.start()              # the server under grading
        ...
        lab.expect(zombies == 0, f"{zombies} zombies")

    grader.still_serves(20)               # the usual last check
    grader.main()                         # runs them, prints, exits

Each check gets a fresh server (lab.start()) and a fresh Redis; a check
passes when it returns without an Unmet (lab.expect) or any other
exception, and its points count. Checks measure counts, orderings and
timeouts with wide margins, never requests per second; every wait is
multiplied by the TIMEOUT environment variable (default 1) for slow machines.

Run through `make grade LAB=<lab> [SRC=path/to/main.c]`, which builds the
file first; `tools/lab grade --help` says more.
"""

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from processes import (Binary, RedisServer, ServerProcess,  # noqa: E402
                       proc_stat, process_table)

SLOW = float(os.environ.get("TIMEOUT", "1") or 1)  # wait multiplier


def seconds(s):
    """A wait of s seconds on a normal machine, stretched by TIMEOUT."""
    return s * SLOW


class Unmet(Exception):
    """A check's condition did not hold: the message says what was seen."""


class Lab:
    """One check's world: where the server runs, its Redis, its process."""

    def __init__(self, binary, workdir):
        self.binary = Binary(binary)
        self.workdir = Path(workdir)
        self.site = self.workdir / "site"  # copies of public/, templates/
        for name in ("public", "templates"):  # (a few KiB; a check may add)
            shutil.copytree(REPO / name, self.site / name)
        self.redis = RedisServer(self.workdir / "redis").start()
        self.servers = []
        self.stalled = False

    def start(self, env=None, nofile=None, binary=None):
        """Start the server (or another binary, e.g. the reference); its
        stderr is kept in the work dir, and it is stopped, its processes
        killed, when the check ends."""
        which = Binary(binary) if binary else self.binary
        server = ServerProcess(which, self.site, self.redis.port, env=env,
                               nofile=nofile)
        self.servers.append(server)
        return server

    def stall_redis(self):
        """SIGSTOP the lab's own Redis: connections stay open, nothing is
        answered. It resumes when the check ends."""
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        self.stalled = True

    @staticmethod
    def expect(condition, seen):
        if not condition:
            raise Unmet(seen)

    def close(self):
        for server in self.servers:
            try:
                server.terminate(timeout=seconds(10))
            except AssertionError:
                pass  # the check already failed or did not care
            finally:
                server.cleanup()
        if self.stalled:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.redis.stop()


# ---- what checks look at ----

def get(port, path="/", keep=None, timeout=5.0):
    """One HTTP/1.0 GET on a new connection: (status, body). keep: a list
    that receives the socket instead of closing it (an idle client)."""
    sock = socket.create_connection(("127.0.0.1", port),
                                    timeout=seconds(timeout))
    sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def big_file(lab, size=8 << 20):
    """A file under the lab's public/ larger than any socket buffer, so
    that sending it needs the socket to drain many times: its URL path."""
    (lab.site / "public" / "big.bin").write_bytes(os.urandom(size))
    return "/big.bin"


def keepalive_load(lab, port, requests, concurrency=50):
    """`ab -k` for / with `requests` over `concurrency` connections; every
    request must succeed."""
    done = subprocess.run(
        ["ab", "-q", "-k", "-n", str(requests), "-c", str(concurrency), "-s",
         str(int(seconds(30))), f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, timeout=seconds(120))
    lab.expect(done.returncode == 0 and "Failed requests:        0"
               in done.stdout, "ab failed: " + done.stdout[-300:] +
               done.stderr[-300:])


def asking_clients(port, count, raw):
    """count connections that each send `raw` at once, answers unread."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=seconds(5))
        s.sendall(raw)
        socks.append(s)
    return socks


def idle_clients(port, count):
    """`count` connections that connect and send nothing (an idle
    keep-alive client, or a slowloris before its first byte)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5)
            for _ in range(count)]


def kept_clients(port, count):
    """`count` keep-alive clients that have each asked for a small file
    (answers left unread) and now idle: the server holds and watches every
    one, under its 5 s idle timeout. An event server (06-10) accepts a
    client only once its first bytes are in (TCP_DEFER_ACCEPT), so
    idle_clients' silent ones are not yet its own."""
    return asking_clients(port, count,
                          b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")


def zombie_children(pid):
    """Children of pid that have exited and were never reaped."""
    table = process_table()
    return [p for p, (state, ppid, *_) in table.items()
            if ppid == pid and state == "Z"]


def live_children(pid):
    table = process_table()
    return [p for p, (state, ppid, *_) in table.items()
            if ppid == pid and state != "Z"]


def status_field(pid, name):
    """A number from /proc/PID/status (e.g. Threads, VmSize in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return int(value.split()[0])
    raise KeyError(name)


def user_ticks(pid):
    """utime alone: the CPU a process spent in its own code, in ticks."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[11])


def build(src, binary, model):
    """Build src into binary as server `model` (its libraries), with the
    Makefile's flags: (ok, what the compiler said)."""
    Path(binary).parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "lab-bin",
         f"LAB_SRC={Path(src).resolve()}", f"LAB_BIN={binary}",
         f"LAB_MODEL={model}"], capture_output=True, text=True)
    return done.returncode == 0, done.stdout + done.stderr


def build_reference(server_dir, into):
    """The reference server of a lab (e.g. "06_poll"), built with the same
    flags as the student's, to measure both in one run."""
    model = server_dir.split("_", 1)[1]
    binary = Path(into) / "reference" / model
    ok, said = build(REPO / server_dir / "main.c", binary, model)
    if not ok:
        raise RuntimeError(f"the reference {server_dir} did not build: {said}")
    return binary


def raise_open_file_limit():
    """Soft RLIMIT_NOFILE up to the hard limit, for this grader and the
    servers it starts (thousands of idle clients)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def wait_for(measure, wanted, limit):
    """Poll measure() until wanted(value) or `limit` seconds (stretched by
    TIMEOUT) pass; returns the last value."""
    deadline = time.monotonic() + seconds(limit)
    value = measure()
    while not wanted(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = measure()
    return value


def _strace(pid, syscalls, during, *options):
    """Runs during() with strace (options, e.g. -c) attached to pid, every
    thread and child, tracing syscalls: what strace wrote."""
    out = tempfile.NamedTemporaryFile(suffix=".strace", delete=False)
    out.close()
    tracer = subprocess.Popen(
        ["strace", "-f", *options, "-q", "-o", out.name, "-e",
         "trace=" + ",".join(syscalls), "-p", str(pid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        time.sleep(seconds(0.5))  # attached to every thread by now
        during()
    finally:
        tracer.send_signal(2)  # SIGINT: detach and write the table
        tracer.wait(timeout=seconds(10))
    text = Path(out.name).read_text()
    os.unlink(out.name)
    return text


def strace_count(pid, syscalls, during):
    """Runs during() while strace counts the server's calls (every thread
    and child); returns {syscall: calls}."""
    counts = {}
    for line in _strace(pid, syscalls, during, "-c").splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in syscalls:
            counts[fields[-1]] = int(fields[3])
    return counts


def strace_calls(pid, syscall, during):
    """Runs during() while strace logs each of the server's calls to
    syscall (every thread): a list with each call's arguments as strace
    prints them, e.g. ["3, 5, 1, IORING_ENTER_GETEVENTS, ...", ...]."""
    calls = []
    for line in _strace(pid, [syscall], during).splitlines():
        start = line.find(syscall + "(")
        if start >= 0:  # a call (or its first half, if <unfinished ...>)
            calls.append(line[start + len(syscall) + 1:])
    return calls


def descriptors(pid):
    """{fd: what it is} for pid's open descriptors, as /proc/PID/fd links
    name them (e.g. "anon_inode:[io_uring]", "socket:[123]"); one closed
    while listed is left out."""
    found = {}
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found[int(link.name)] = os.readlink(link)
        except FileNotFoundError:
            pass
    return found


# ---- the grader ----

class Grader:
    def __init__(self, lab):
        self.lab = lab
        self.checks = []  # (points, title, function)

    def check(self, points, title):
        def register(function):
            self.checks.append((points, title, function))
            return function
        return register

    def still_serves(self, points, env=None):
        """The check most labs end with: the pages and the guestbook are
        still served, and the server stops cleanly (exit 0, its summary, no
        process left, no sanitizer report)."""
        @self.check(points, "pages and the guestbook still served; a clean "
                    "stop")
        def still_serves(lab):
            server = lab.start(env=env)
            for path in ("/", "/guestbook", "/style.css"):
                status, _ = get(server.port, path)
                lab.expect(status == 200, f"GET {path} answered {status}")
            server.stop()

    def main(self):
        parser = argparse.ArgumentParser(
            description=f"Grade the {self.lab} lab: run each check against "
            "BINARY and print its points and the total.")
        parser.add_argument("binary", help="the server built from the "
                            "student's main.c")
        parser.add_argument("-v", "--verbose", action="store_true",
                            help="print the traceback of a failed check")
        parser.add_argument("--only", metavar="CHECK[,CHECK]",
                            help="run only these checks (their function "
                            "names): tools/lab check runs a wrong answer's "
                            "expected failure alone")
        parser.add_argument("--total", action="store_true",
                            help="print the lab's total points and exit "
                            "(BINARY is not run)")
        args = parser.parse_args()
        checks = self.checks
        if args.total:
            print(sum(points for points, _, _ in checks))
            sys.exit(0)
        if args.only:
            names = args.only.split(",")
            unknown = set(names) - {f.__name__ for _, _, f in checks}
            if unknown:
                sys.exit(f"grade: no check named {', '.join(sorted(unknown))}"
                         f" (checks: "
                         f"{', '.join(f.__name__ for _, _, f in checks)})")
            checks = [c for c in checks if c[2].__name__ in names]
        got = total = 0
        print(f"Grading lab {self.lab}: {args.binary}")
        for points, title, function in checks:
            total += points
            ok, note = self.run_one(function, args)
            got += points if ok else 0
            print(f"  {'PASS' if ok else 'FAIL'} {points if ok else 0:>3}/"
                  f"{points:<3} {title}" + (f": {note}" if note else "")
                  + f" [{function.__name__}]", flush=True)
        print(f"Score: {got}/{total}")
        sys.exit(0 if got == total else 1)

    @staticmethod
    def run_one(function, args):
        workdir = tempfile.mkdtemp(prefix="zerohttpd-lab-")
        lab = None
        try:
            lab = Lab(args.binary, workdir)
            note = function(lab)
            return True, note
        except Unmet as unmet:
            return False, str(unmet)
        except Exception as error:  # a crash of the server or the check
            if args.verbose:
                traceback.print_exc()
            return False, f"{type(error).__name__}: {error}"[:300]
        finally:
            if lab:
                lab.close()
            shutil.rmtree(workdir, ignore_errors=True)
