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
import contextlib
import hashlib
import mmap
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from processes import (Binary, RedisServer, ServerProcess,  # noqa: E402
                       child_stats, proc_stat,
                       raise_open_file_limit)  # graders take it from here
from rawhttp import Connection  # noqa: E402

SLOW = float(os.environ.get("TIMEOUT", "1") or 1)  # wait multiplier


def seconds(s):
    """A wait of s seconds on a normal machine, stretched by TIMEOUT."""
    return s * SLOW


class Unmet(Exception):
    """A check's condition did not hold: the message says what was seen."""


class Lab:
    """One check's world: where the server runs, its Redis, its process."""

    def __init__(self, binary, workdir, source=None):
        self.binary = Binary(binary)
        self.source = Path(source) if source else None  # for a review
        self.workdir = Path(workdir)
        self.site = self.workdir / "site"  # copies of public/, templates/
        for name in ("public", "templates"):  # (a few KiB; a check may add)
            shutil.copytree(REPO / name, self.site / name)
        self.redis = RedisServer(self.workdir / "redis").start()
        self.servers = []
        self.stalled = False

    def start(self, env=None, nofile=None, binary=None, blocked=()):
        """Start the server (or another binary, e.g. the reference); its
        stderr is kept in the work dir, and it is stopped, its processes
        killed, when the check ends. It is among self.servers before it is
        seen listening, so that death(lab) can say how a server died that
        died as it started."""
        which = Binary(binary) if binary else self.binary
        return ServerProcess(which, self.site, self.redis.port, env=env,
                             nofile=nofile, spawned=self.servers.append,
                             blocked=blocked)

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


def ab_ok(done):
    """Whether an ab run served every request: exit 0, no non-2xx answer
    and no failure but "Length" (a page whose length changes, as the
    guestbook's visitor count does, is one to ab)."""
    failed = re.search(r"Connect: (\d+), Receive: (\d+), Length: \d+, "
                       r"Exceptions: (\d+)", done.stdout)
    return (done.returncode == 0 and "Non-2xx" not in done.stdout and
            ("Failed requests:        0" in done.stdout or failed is not None
             and not any(int(n) for n in failed.groups())))


def ab_said(done):
    """ab's report on one line, without its banner."""
    return " ".join((done.stdout.split("(be patient)...")[-1][-300:] +
                     done.stderr[-300:]).split())


def keepalive_load(lab, port, requests, concurrency=50, hint="", path="/"):
    """`ab -k` for path with `requests` over `concurrency` connections;
    every request must succeed (else the failure, then `hint`). Returns
    ab's report, its percentile table included."""
    done = subprocess.run(
        ["ab", "-q", "-k", "-n", str(requests), "-c", str(concurrency), "-s",
         str(int(seconds(30))), f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, timeout=seconds(120))
    lab.expect(ab_ok(done), f"ab -k -c {concurrency} {path} failed: "
               + ab_said(done) + hint)
    return done.stdout


def connections(lab, port, count, concurrency=4, paths=("/", "/guestbook")):
    """`count` connections, one request each (no keep-alive), `concurrency`
    at a time, split over `paths` (a page and a Redis-bound one, so both
    code paths run): every one must be answered."""
    for k, path in enumerate(paths):
        share = count // len(paths) + (k < count % len(paths))
        done = subprocess.run(
            ["ab", "-q", "-n", str(share), "-c", str(concurrency), "-s",
             str(int(seconds(30))), f"http://127.0.0.1:{port}{path}"],
            capture_output=True, text=True, timeout=seconds(120))
        lab.expect(ab_ok(done), f"ab -n {share} -c {concurrency} {path} "
                   "failed: " + ab_said(done))


def footprint(pid):
    """What a process holds now: (address space in KiB, mappings, open
    descriptors)."""
    maps = Path(f"/proc/{pid}/maps").read_text().count("\n")
    return status_field(pid, "VmSize"), maps, len(descriptors(pid))


FOOTPRINT = ("KiB of address space", "mappings", "descriptors")


def no_leak(lab, server, count=1000, slack=(8192, 32, 8), watch=""):
    """A per-connection resource that is never freed (a stack, a mapping,
    a descriptor, heap) passes every check that looks at live clients
    only: after `count` connections one after another (connections()),
    the server's footprint must be back within `slack` of where a warm-up
    of a fifth as many left it (caches such as glibc's stack cache are
    full by then). Returns the growth, for the PASS line."""
    connections(lab, server.port, count // 5)
    before = footprint(server.pid)
    connections(lab, server.port, count)
    grown = wait_for(lambda: [a - b for a, b in zip(footprint(server.pid),
                                                    before)],
                     lambda g: all(x <= s for x, s in zip(g, slack)), limit=5)
    over = [f"{x} more {what} (at most {s})"
            for x, s, what in zip(grown, slack, FOOTPRINT) if x > s]
    lab.expect(not over, f"after {count} connections one after another: "
               + ", ".join(over) + ": something each connection takes is "
               "never given back" + (f"; {watch}" if watch else ""))
    return ", ".join(f"{x:+} {what}" for x, what in zip(grown, FOOTPRINT))


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
    return [p for p, (state, *_) in child_stats(pid).items() if state == "Z"]


def live_children(pid):
    return [p for p, (state, *_) in child_stats(pid).items() if state != "Z"]


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


def build(src, binary, model, defines="", nice=0):
    """Build src into binary as server `model` (its libraries), with the
    Makefile's flags and `defines` (e.g. "-DFIBER_UCONTEXT"): (ok, what
    the compiler said). With LAB_BUILD_CACHE set (tools/lab check sets it
    for a run), a source already built the same way is copied from there:
    `tools/lab check` grades hundreds of answers, and each grading that
    measures the reference built it again (a build costs about a CPU
    second). nice > 0: the compiler gives way to every other process (a
    build ahead of its grading, by tools/lab check)."""
    Path(binary).parent.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get("LAB_BUILD_CACHE")
    if cache:
        key = hashlib.sha256(b"\0".join([
            Path(src).read_bytes(), model.encode(), defines.encode(),
            (REPO / "Makefile").read_bytes()])).hexdigest()
        built = Path(cache) / key
        if built.is_file():
            shutil.copy2(built, binary)
            return True, ""
    started = time.monotonic()
    make = subprocess.Popen(
        (["nice", "-n", str(nice)] if nice else []) +
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "lab-bin",
         f"LAB_SRC={Path(src).resolve()}", f"LAB_BIN={binary}",
         f"LAB_MODEL={model}", f"LAB_DEFINES={defines}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = make.stdout.read()
    _, status, usage = os.wait4(make.pid, 0)  # its compiler's CPU too
    make.returncode = os.waitstatus_to_exitcode(status)
    ok = make.returncode == 0
    make.stdout.close()
    if os.environ.get("GRADE_TIMES"):  # tools/lab check --times
        with open(os.environ["GRADE_TIMES"], "a") as times:
            times.write(f"{model}\t(build)\t{time.monotonic() - started:.2f}"
                        f"\t{usage.ru_utime + usage.ru_stime:.2f}\n")
    if cache and ok:  # whole or not at all, for the others
        Path(cache).mkdir(parents=True, exist_ok=True)
        partial = built.with_name(f"{key}.{os.getpid()}.{threading.get_ident()}")
        shutil.copy2(binary, partial)
        os.replace(partial, built)
    return ok, said


def build_reference(server_dir, into):
    """The reference server of a lab (e.g. "06_poll"), built with the same
    flags as the student's, to measure both in one run. An instructor pack
    (tools/lab handout) has no reference source, since it is the answer,
    but the reference prebuilt at its top (./poll): that one, then."""
    model = server_dir.split("_", 1)[1]
    if not (REPO / server_dir / "main.c").is_file():
        prebuilt = REPO / model
        if not prebuilt.is_file():
            raise RuntimeError(f"neither {server_dir}/main.c nor a prebuilt "
                               f"./{model} is here to compare with")
        return prebuilt
    binary = Path(into) / "reference" / model
    ok, said = build(REPO / server_dir / "main.c", binary, model)
    if not ok:
        raise RuntimeError(f"the reference {server_dir} did not build: {said}")
    return binary


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
    """Runs during() with strace (options, e.g. -f for every thread and
    child, -c to count) attached to pid, tracing syscalls: what strace
    wrote. A tracer that cannot attach (ptrace not permitted) says so."""
    out = tempfile.NamedTemporaryFile(suffix=".strace", delete=False)
    out.close()
    tracer = attach_strace(pid, *options, "-q", "-o", out.name, "-e",
                           "trace=" + ",".join(syscalls))
    try:
        during()
    finally:
        detach_strace(tracer)
    text = Path(out.name).read_text()
    os.unlink(out.name)
    return text


def attach_strace(pid, *args):
    """strace args -p pid, returned once it traces every thread of pid
    (a fixed sleep missed the first calls on a busy machine)."""
    tracer = subprocess.Popen(
        ["strace", *args, "-p", str(pid)], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds(20)
    while not traced_by(pid, tracer.pid, every_thread="-f" in args):
        if tracer.poll() is not None:  # e.g. ptrace not permitted
            raise RuntimeError("strace could not attach: "
                               + tracer.stderr.read().strip()[:200])
        if time.monotonic() > deadline:
            detach_strace(tracer)
            raise RuntimeError(f"strace did not attach to {pid} within "
                               f"{seconds(20):.0f} s")
        time.sleep(0.02)
    return tracer


def detach_strace(tracer):
    """SIGINT: strace detaches and writes its table (-c)."""
    tracer.send_signal(2)
    tracer.wait(timeout=seconds(60))
    tracer.stderr.close()


def traced_by(pid, tracer, every_thread):
    """Whether pid (a process, or one thread: strace -p TID without -f
    traces that thread alone) is traced by the process tracer; with
    every_thread, each of its process's threads (strace -f)."""
    try:
        tasks = (list(Path(f"/proc/{pid}/task").iterdir()) if every_thread
                 else [Path(f"/proc/{pid}")])
        return all(f"TracerPid:\t{tracer}\n" in (task / "status").read_text()
                   for task in tasks)
    except FileNotFoundError:  # a thread ended while listed: look again
        return False


def strace_count(pid, syscalls, during):
    """Runs during() while strace counts the server's calls (every thread
    and child); returns {syscall: calls}."""
    counts = {}
    for line in _strace(pid, syscalls, during, "-f", "-c").splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in syscalls:
            counts[fields[-1]] = int(fields[3])
    return counts


class HeldClients:
    """`count` keep-alive clients, each asking for a small file every
    `every` seconds from one thread for as long as the with-block lasts:
    a server never times them out, so each holds its worker (a child, a
    thread) throughout, as a busy client does. Each asks once on entering,
    each answer waited for at most `timeout` s. .answered counts the
    answers; .errors says what went wrong (a client that fails stops)."""

    def __init__(self, port, count, every=0.5, timeout=5.0):
        self.port, self.count, self.every = port, count, every
        self.timeout = seconds(timeout)
        self.answered, self.errors, self.conns = 0, [], []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _ask(self, conn):
        try:
            conn.send(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            status = conn.read_response().status
            if status != 200:
                raise AssertionError(f"answered {status}")
            self.answered += 1
            return True
        except (OSError, AssertionError) as error:
            self.errors.append(f"a held client: {type(error).__name__}: "
                               f"{error}")
            return False

    def _run(self):
        while not self.done.wait(self.every):
            self.conns = [c for c in self.conns if self._ask(c)]

    def __enter__(self):
        for _ in range(self.count):
            conn = Connection(self.port, timeout=self.timeout)
            if self._ask(conn):
                self.conns.append(conn)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=self.timeout + self.every)
        for conn in self.conns:
            conn.close()


@contextlib.contextmanager
def stopped(pid):
    """pid is SIGSTOPped for the with-block and SIGCONTinued after it:
    whatever happens meanwhile (children exiting, workers killed) piles up
    for it and reaches it at once, one pending signal of each kind."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def stop_now(pid):
    """SIGSTOP pid and return once the kernel says it is stopped (on a
    busy machine it may run on a while: it would take a burst, or read a
    body, before the check means it to)."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid)


def wait_stopped(pid):
    """Returns once /proc says pid is stopped (or gone), at most 5 s."""
    def state():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(
                ")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "T"  # gone: nothing to wait for
    wait_for(state, lambda now: now in ("t", "T"), 5)


def strace_bytes(pid, syscall, during):
    """Runs during() while strace watches one syscall of pid (every
    thread): the sum of its positive returns (bytes, for recv or send)."""
    return sum(int(n) for n in re.findall(
        rf"{syscall}\(.*\)\s+=\s+(\d+)", _strace(pid, [syscall], during,
                                                 "-f")))


def strace_returns(pid, syscall, during):
    """Runs during() while strace watches one syscall of pid's main thread
    alone (not its children or other threads); returns the list of its
    return values (-1 for an error), in order."""
    found = re.findall(rf"^{syscall}\(.*\)\s+=\s+(-?\d+)",
                       _strace(pid, [syscall], during), re.M)
    return [int(value) for value in found]


def slowed(pid, syscall, delay, during):
    """Runs during() while every `syscall` of pid's main thread returns
    `delay` seconds late (strace's fault injection): a race whose window
    is a few instructions wide (a signal that comes while the server is
    between two steps) then happens as a rule, not once a month."""
    _strace(pid, [syscall], during, "-e",
            f"inject={syscall}:delay_exit={int(delay * 1e6)}")


def failing(pid, syscall, error, during):
    """Runs during() while every `syscall` of pid (every thread) fails
    with `error` (e.g. "ENOMEM"), by strace's fault injection: what the
    server does when the kernel says no, which no black box reaches."""
    _strace(pid, [syscall], during, "-f", "-e",
            f"inject={syscall}:error={error}")


# What a signal handler may call: signal-safety(7)'s list, the calls a
# server's handler could want. A handler that calls anything must also
# give errno back as it found it: the code it interrupted may be about to
# read it.
SIGNAL_SAFE = {
    "_exit", "_Exit", "abort", "accept", "alarm", "close", "dup", "dup2",
    "fcntl", "fork", "getpid", "getppid", "kill", "raise", "read", "recv",
    "send", "sigaction", "sigaddset", "sigdelset", "sigemptyset",
    "sigfillset", "sigismember", "signal", "sigprocmask", "sigpending",
    "wait", "waitpid", "write", "memcpy", "memset", "strlen", "clock_gettime",
    "time", "shutdown", "pthread_kill", "pthread_self", "sem_post",
    "eventfd_write"}
C_WORDS = {"if", "while", "for", "switch", "return", "sizeof", "do", "else",
           "_Alignof", "alignof", "defined"}


def code_only(text):
    """C source with its comments and string/char literals blanked (line
    numbers kept), for a review that must not be fooled by either."""
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'
                  r"'(?:\\.|[^'\\\n])*'",
                  lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=re.S)


def function_body(code, name):
    """(line number of its opening brace, text after it) of the body of
    function `name`'s definition in code, or None."""
    for m in re.finditer(rf"\b{name}\s*\([^;{{}})]*\)\s*{{", code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                return code.count("\n", 0, m.end()) + 1, code[m.end():i]
            i += 1
    return None


def source_text(lab):
    """The student's file, for a source review (fails if the grader was not
    given it)."""
    lab.expect(lab.source is not None, "the grader was not given the "
               "source to review (tools/lab grade passes --src)")
    return lab.source.read_text(errors="replace")


def signal_handlers(code):
    """The functions code installs as signal handlers (sa_handler,
    sa_sigaction, signal())."""
    handlers = set(re.findall(r"sa_(?:handler|sigaction)\s*=\s*([A-Za-z_]\w*)",
                              code))
    handlers |= set(re.findall(r"\bsignal\s*\(\s*\w+\s*,\s*([A-Za-z_]\w*)"
                               r"\s*\)", code))
    return handlers - {"SIG_IGN", "SIG_DFL", "NULL"}


def review_handlers(lab):
    """A source review, since no black box reaches it: every function the
    student's file installs as a signal handler (sa_handler, sa_sigaction,
    signal()) calls only async-signal-safe functions (signal-safety(7);
    its own helpers are reviewed alike), and one that calls anything saves
    errno and restores it. Fails quoting the line; returns a note."""
    text = source_text(lab)
    code, lines = code_only(text), text.splitlines()
    handlers = signal_handlers(code)
    seen, called = set(), {}
    todo = [(h, h) for h in sorted(handlers)]
    while todo:  # the handlers, and the file's own functions they call
        name, handler = todo.pop()
        found = function_body(code, name) if name not in seen else None
        seen.add(name)
        if not found:
            continue
        first, body = found
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", body):
            callee = m[1]
            if callee in C_WORDS or callee.isupper():  # a macro: WIFEXITED
                continue
            line = first + body.count("\n", 0, m.start())
            called.setdefault(handler, []).append((callee, line))
            if function_body(code, callee):
                todo.append((callee, handler))
            else:
                lab.expect(callee in SIGNAL_SAFE, f"the signal handler "
                           f"{handler}() calls {callee}(), which is not "
                           "async-signal-safe (signal-safety(7)): line "
                           f"{line}: {lines[line - 1].strip()[:80]!r}")
    for handler, calls in called.items():
        body = function_body(code, handler)[1]
        lab.expect(re.search(r"=\s*errno\b", body) and
                   re.search(r"\berrno\s*=[^=]", body),
                   f"the signal handler {handler}() calls {calls[0][0]}() "
                   f"(line {calls[0][1]}) but does not save and restore "
                   "errno: the code it interrupted may read errno next "
                   "(an accept() that failed with EMFILE, say)")
    return (", ".join(f"{h}() calls {', '.join(c for c, _ in calls)}"
                      for h, calls in called.items())
            or f"{', '.join(sorted(handlers)) or 'no handler'}: no calls")


def cpu_seconds(pid):
    """CPU time (user and system, every thread) a process has used so far,
    in seconds: a server that spins shows it."""
    return proc_stat(pid)[3] / os.sysconf("SC_CLK_TCK")


def smaps(pid):
    """pid's mappings from /proc/PID/smaps, in address order: [start, end,
    perms, anonymous, Rss in KiB] each."""
    maps = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            maps.append([start, end, fields[1], len(fields) == 5, 0])
        elif fields[0] == "Rss:":
            maps[-1][4] = int(fields[1])
    return maps


def thread_stacks(pid):
    """The guarded stacks in pid, from /proc/PID/smaps: [(size, touched)]
    in KiB for every anonymous rw-p mapping that has a one-page ---p guard
    right below it, as glibc lays out a thread's stack. touched is its
    resident part: a stack is backed only as deep as it was ever used (the
    deepest call, plus the thread's descriptor at the top). A stack with no
    guard cannot be told from other memory: compare the count with the
    Threads of status_field()."""
    page = resource.getpagesize()
    maps = smaps(pid)
    return [((end - start) // 1024, rss)
            for below, (start, end, perms, anonymous, rss) in zip(maps,
                                                                  maps[1:])
            if perms == "rw-p" and anonymous and below[2] == "---p"
            and below[1] == start and below[1] - below[0] == page]


def death(lab):
    """One line on the first of the lab's servers that is no longer running
    ("died of SIGSEGV", "exited with status 1: <its last stderr line>"), or
    None while all run: a check that saw refused connections says why."""
    for server in lab.servers:
        if server.result is not None:
            continue  # stopped by the check itself
        try:  # a crash closes the sockets a moment before the exit is seen
            code = server.proc.wait(timeout=seconds(0.5))
        except subprocess.TimeoutExpired:
            continue  # still running
        if code < 0:
            return f"the server died of {signal.Signals(-code).name}"
        said = server.stderr().strip().splitlines()
        return (f"the server exited with status {code}"
                + (f": {said[-1][:160]}" if said else ""))
    return None


def death_telling(grader, watch):
    """A check decorator like grader.check(points, title), whose checks,
    when they fail because the server died or never started, say so (see
    death) and how to watch it happen: `watch`, e.g. "gdb --args ./fibers
    8000", rather than the refused connection it left behind."""
    def check(points, title):
        def register(function):
            def run(lab):
                try:
                    return function(lab)
                except Exception as error:
                    dead = death(lab)
                    if dead:
                        raise Unmet(f"{dead}; watch it: {watch}") from error
                    raise
            run.__name__ = function.__name__
            return grader.check(points, title)(run)
        return register
    return check


def strace_calls(pid, syscall, during):
    """Runs during() while strace logs each of the server's calls to
    syscall (every thread): a list with each call's arguments as strace
    prints them, e.g. ["3, 5, 1, IORING_ENTER_GETEVENTS, ...", ...]."""
    calls = []
    for line in _strace(pid, [syscall], during, "-f").splitlines():
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

# Counts the heap blocks in use (every malloc, calloc, realloc and aligned
# allocation that succeeded, less every free) into a file the grader maps
# (heap_blocks): stacks counts a thread's, fibers a refused client's.
HEAP_BLOCKS = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
static long early, *live = &early;
static void *counted(void *p)
{
    if (p)
        __atomic_add_fetch(live, 1, __ATOMIC_RELAXED);
    return p;
}
__attribute__((constructor)) static void share(void)
{
    const char *path = getenv("LAB_BLOCK_COUNTER");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0)
        return;
    long *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    close(fd);
    if (shared != MAP_FAILED) {
        *shared = early;
        live = shared;
    }
}
void *malloc(size_t n) { return counted(__libc_malloc(n)); }
void *calloc(size_t k, size_t n) { return counted(__libc_calloc(k, n)); }
void free(void *p)
{
    if (p)
        __atomic_sub_fetch(live, 1, __ATOMIC_RELAXED);
    __libc_free(p);
}
void *realloc(void *p, size_t n)
{
    void *q = __libc_realloc(p, n);
    if (!p)
        return counted(q);
    if (!q && n == 0) /* freed */
        __atomic_sub_fetch(live, 1, __ATOMIC_RELAXED);
    return q;
}
void *memalign(size_t a, size_t n) { return counted(__libc_memalign(a, n)); }
void *aligned_alloc(size_t a, size_t n)
{
    return counted(__libc_memalign(a, n));
}
void *valloc(size_t n) { return counted(__libc_valloc(n)); }
void *pvalloc(size_t n) { return counted(__libc_pvalloc(n)); }
int posix_memalign(void **out, size_t a, size_t n)
{
    if (a % sizeof(void *) || (a & (a - 1)))
        return EINVAL;
    void *p = counted(__libc_memalign(a, n));
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
"""

def build_shim(lab, name, text, *flags):
    """A library to preload (LD_PRELOAD), compiled from C `text` with
    `flags` (-D..., -l...): its path. Under tools/lab check
    (LAB_BUILD_CACHE) one compile serves every grading that asks the same
    thing; else it is built in lab's workdir."""
    source = lab.workdir / f"{name}.c"
    source.write_text(text)
    cache = os.environ.get("LAB_BUILD_CACHE")
    if cache:
        key = hashlib.sha256("\0".join((text,) + flags).encode()).hexdigest()
        shim = Path(cache) / f"{name}-{key[:16]}.so"
        if shim.is_file():
            return shim
    else:
        shim = lab.workdir / f"{name}.so"
    Path(shim).parent.mkdir(parents=True, exist_ok=True)
    partial = shim.with_name(
        f"{shim.name}.{os.getpid()}.{threading.get_ident()}")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(partial),
                    str(source), *flags], check=True, capture_output=True)
    os.replace(partial, shim)  # whole or not at all, for the others
    return shim


def heap_blocks(lab):
    """A library to preload that counts the heap blocks in use, built in
    lab's workdir: (env to start the server with, a function that reads
    the count). A few bytes lost per connection or per refused client are
    plain in the count long before they are in the address space (glibc
    grows the heap in 128 KiB steps)."""
    shim = build_shim(lab, "heap_blocks", HEAP_BLOCKS)
    counter = lab.workdir / "heap_blocks.count"
    counter.write_bytes(bytes(mmap.PAGESIZE))
    with counter.open("r+b") as file:
        view = mmap.mmap(file.fileno(), mmap.PAGESIZE)
    return ({"LD_PRELOAD": str(shim), "LAB_BLOCK_COUNTER": str(counter)},
            lambda: struct.unpack_from("q", view)[0])


def cpu_spent():
    """CPU seconds (user and system) of the grader and of every process it
    started and reaped: its servers, strace, ab."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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
        parser.add_argument("--src", help="the student's main.c, for the "
                            "checks that review the source")
        parser.add_argument("--first-fail", action="store_true",
                            default=os.environ.get("GRADE_FIRST_FAIL") == "1",
                            help="stop at the first failed check (the score "
                            "is short then; tools/lab check needs no more "
                            "of a starter); GRADE_FIRST_FAIL=1 in the "
                            "environment does the same")
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
        got, total = 0, sum(points for points, _, _ in checks)
        print(f"Grading lab {self.lab}: {args.binary}")
        for k, (points, title, function) in enumerate(checks):
            started, spent = time.monotonic(), cpu_spent()
            ok, note = self.run_one(function, args)
            if os.environ.get("GRADE_TIMES"):  # tools/lab check --times
                with open(os.environ["GRADE_TIMES"], "a") as times:
                    times.write(f"{self.lab}\t{function.__name__}\t"
                                f"{time.monotonic() - started:.2f}\t"
                                f"{cpu_spent() - spent:.2f}\n")
            got += points if ok else 0
            print(f"  {'PASS' if ok else 'FAIL'} {points if ok else 0:>3}/"
                  f"{points:<3} {title}" + (f": {note}" if note else "")
                  + f" [{function.__name__}]", flush=True)
            if not ok and args.first_fail and k + 1 < len(checks):
                print(f"  (stopped at the first FAIL: {len(checks) - k - 1} "
                      "checks not run, none of their points counted)")
                break
        print(f"Score: {got}/{total}")
        sys.exit(0 if got == total else 1)

    @staticmethod
    def run_one(function, args):
        workdir = tempfile.mkdtemp(prefix="zerohttpd-lab-")
        lab = None
        try:
            lab = Lab(args.binary, workdir, args.src)
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
