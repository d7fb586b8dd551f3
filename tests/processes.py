"""Real processes: redis-server, the server under test, and a look at the
process table through /proc. Nothing is mocked.

This is the one place that starts and stops processes for the whole suite:
the tests, the labs' graders (labs/grading.py), tools/trace, and through
loadtest/harness.py the load tests (loadtest/sweep, loadtest/soak) and the
benches (bench/*). What it gives them:

  - free_port(), accepts(), wait_until(), wait_for_port(): ports, and
    waiting for something to come up, bounded and noticing a process that
    died meanwhile (StartError).
  - spawn() starts a process in its own session and remembers it; stop()
    stops one by PID (sig, a grace period, then SIGKILL to its process
    group, which catches workers that outlived their parent; reaped);
    stop_all() stops whatever is left; kill_pids() SIGKILLs by PID.
  - RedisServer: a private redis-server on a free port, restartable on that
    port, with command() speaking RESP2 (one encoder, one reader).
  - ServerProcess: the server under test, with the exit checks the tests
    hold it to (exit 0, summary line, no sanitizer report, no worker left).
  - raise_open_file_limit(); process_table(), descendants(),
    stat_fields(), ... from /proc.

Every process started here is stopped by PID, and every wait is bounded.
Only processes started here are ever signalled, never anything by name.
Python 3 standard library only (the labs' instructor pack copies this file).
"""

import contextlib
import os
import random
import re
import resource
import select
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCAL_ADDRESS = "127.0.0.1"  # where this machine's processes listen
MODELS = ("iterative", "forking", "preforked", "threaded", "prethreaded",
          "poll", "epoll", "io_uring", "reuseport", "fibers")
START_TIMEOUT = 10.0  # seconds for a server, redis or nginx to come up
PORT_ATTEMPTS = 3  # a server whose free port was taken meanwhile: again
STOP_TIMEOUT = 10.0  # seconds for a process to exit after SIGTERM (ASan is slow)
CHILD_EXIT_TIMEOUT = 3.0  # seconds for workers to go after their parent
REQUEST_TIMEOUT = 10  # seconds from a request's first byte to its end
DEFER_ACCEPT = 1  # event servers: seconds the kernel holds a silent client back
# The event servers wait before reconnecting to a Redis that failed, from
# 100 ms doubling up to REDIS_BACKOFF_MAX_MS (2 s), and answer 503 meanwhile.
# With one loop, its first page served again means its link is back; 09
# runs a loop per CPU, each with its own link and its own backoff, so a
# loop may still wait up to that long after another one has recovered.
REDIS_BACKOFF_MAX = 2.0  # seconds
SEPARATE_REDIS_LINKS = ("reuseport",)
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error")
SUMMARY_RE = re.compile(
    r"^(\S+): served (\d+) requests "
    r"\(2xx (\d+), 3xx (\d+), 4xx (\d+), 5xx (\d+)\)$", re.M)


# ---- which binaries to test ----

class Binary:
    """One server executable: path, model (iterative, ...) and test id
    (iterative, asan-iterative, ...)."""

    def __init__(self, path):
        self.path = Path(path).resolve()
        self.model = self.path.name
        self.asan = self.path.parent.name == "asan"
        self.id = ("asan-" if self.asan else "") + self.model

    def __repr__(self):
        return self.id

    def unavailable(self):
        """Why this server cannot run on this machine, or None. Only
        io_uring can say so: where the kernel refuses io_uring it prints
        `io_uring: unavailable: <reason>` and exits 1 before it parses its
        arguments, so an invalid port (which otherwise exits 2) probes it."""
        if not hasattr(self, "_unavailable"):
            probe = subprocess.run([str(self.path), "0"], capture_output=True,
                                   text=True, timeout=START_TIMEOUT)
            said = probe.stderr.strip()
            self._unavailable = (said if probe.returncode == 1 and
                                 said.startswith(f"{self.model}: unavailable:")
                                 else None)
        return self._unavailable


def discover_binaries():
    """ZEROHTTPD_BINARIES (space-separated paths) if set, else every built
    ./NAME and asan/NAME at the repo root, in model order."""
    listed = os.environ.get("ZEROHTTPD_BINARIES", "").split()
    if listed:
        return [Binary(p) for p in listed]
    found = []
    for prefix in ("", "asan/"):
        for model in MODELS:
            path = REPO / (prefix + model)
            if path.is_file() and os.access(path, os.X_OK):
                found.append(Binary(path))
    return found


class StartError(RuntimeError, AssertionError):
    """A server, redis or nginx did not come up; the message says why. An
    AssertionError too: a test or a grader counts it as a failed check."""


# ---- ports and waiting ----

def ephemeral_ports():
    """The range the kernel picks a connecting socket's own port from."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range") \
            .read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port(remote=None):
    """A port nobody listens on right now. Below the ephemeral range where
    there is room (as on a stock kernel, 32768-60999): there no client's
    connect() can take it before the server binds it, which under many
    parallel tests it otherwise now and then does. With a remote address:
    one that nothing there accepts on either."""
    low = ephemeral_ports()[0]
    while True:
        with socket.socket() as s:
            if low > 11000:
                try:
                    s.bind((LOCAL_ADDRESS, random.randrange(10000, low)))
                except OSError:
                    continue  # taken: another pick
            else:
                s.bind((LOCAL_ADDRESS, 0))
            port = s.getsockname()[1]
        if remote is None or not accepts(port, remote):
            return port


def accepts(port, address=LOCAL_ADDRESS):
    """Does something accept connections on address:port?"""
    try:
        socket.create_connection((address, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until(ready, proc, what, timeout=START_TIMEOUT):
    """Poll ready() every 20 ms until it is true; StartError if proc (a
    Popen, or anything with poll() and returncode) exits first or timeout
    seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if proc.poll() is not None:
            raise StartError(f"{what} did not start: "
                             f"{describe_exit(proc.returncode)}")
        if time.monotonic() >= deadline:
            raise StartError(f"{what} did not start in {timeout:.0f} s")
        time.sleep(0.02)


def wait_for_port(port, proc, what, timeout=START_TIMEOUT,
                  address=LOCAL_ADDRESS):
    """Wait until something accepts on address:port (see wait_until)."""
    wait_until(lambda: accepts(port, address), proc, what, timeout)


# ---- starting and stopping, by PID and process group ----

STARTED = []  # every process spawn() started and stop() has not stopped


def spawn(argv, **kwargs):
    """Start a process from the repo root (unless cwd= says otherwise) in its
    own session: Ctrl-C reaches only us, and we stop it (and anything it
    forked) ourselves, by its process group."""
    kwargs.setdefault("cwd", REPO)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            start_new_session=True, **kwargs)
    STARTED.append(proc)
    return proc


def spawn_logged(argv, log_path, banner="", unset=()):
    """spawn() with stdout and stderr appended to log_path, after the
    banner line; the variables in `unset` removed from its environment."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(banner.encode())
        log.flush()
        return spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def kill_group(proc):
    """SIGKILL the process group of a process spawn() started (its session,
    so its pgid is its PID): workers that outlived their parent too. A
    process elsewhere (loadtest/harness.py's RemoteProcess) does it itself."""
    if hasattr(proc, "kill_group"):
        proc.kill_group()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop(proc, sig=signal.SIGTERM, grace=STOP_TIMEOUT):
    """sig by PID and wait up to grace seconds, then SIGKILL the process
    group; reaped. Closes our ends of its pipes. Returns the exit code of a
    process that left by itself, or None if it had to be killed."""
    code = proc.poll()
    if code is None:
        proc.send_signal(sig)
        try:
            code = proc.wait(grace)
        except subprocess.TimeoutExpired:
            code = None
    kill_group(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):  # a host gone
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    forget(proc)
    return code


def forget(proc):
    """A process the caller has waited for itself: nothing left to stop."""
    if proc in STARTED:
        STARTED.remove(proc)


def stop_all(grace=STOP_TIMEOUT):
    """Stop every process still running that spawn() started, newest
    first."""
    for proc in reversed(STARTED[:]):
        stop(proc, grace=grace)


def describe_exit(code):
    """An exit code as stop() returns it, in words."""
    if code is None:
        return f"still running {STOP_TIMEOUT:.0f} s after SIGTERM"
    if isinstance(code, str):  # a process elsewhere: its exit code unknown
        return code
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def kill_pids(pids):
    """SIGKILL each process of a {pid: starttime} map that still runs (the
    start time makes sure a PID reused meanwhile is left alone)."""
    for pid in still_running(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def raise_open_file_limit():
    """Soft RLIMIT_NOFILE up to the hard limit, for this process and those
    it starts (thousands of clients); returns it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def limit_descriptors(soft):
    """RLIMIT_NOFILE's soft limit becomes `soft` (in a forked child before
    exec: for the program and its children); the hard limit stays."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---- the process table ----

def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name, as strings, or
    None if it is gone: [0] is proc(5)'s field 3 (state), [1] ppid, [11]
    utime, [12] stime, [13] cutime, [14] cstime, [17] num_threads, [19]
    starttime, [21] rss (pages). loadtest/harness.py reads a server's costs
    from them."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2:].split()


def proc_stat(pid):
    """(state, ppid, starttime, cputime) of a process, or None if it is gone.
    The start time tells a process apart from a later one reusing its PID;
    cputime is utime + stime in clock ticks, all its threads included."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return (fields[0], int(fields[1]), int(fields[19]),
            int(fields[11]) + int(fields[12]))


def process_table():
    """{pid: proc_stat(pid)} for every process, read in one pass over
    /proc/*/stat."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(entry.name)
            if stat:
                table[int(entry.name)] = stat
    return table


def child_stats(pid):
    """{child: proc_stat(child)} for the children of pid, zombies too. Read
    from /proc/PID/task/*/children (each thread's own) and then only those
    children's stat: a pass over all of /proc costs ~20 ms of CPU for each
    thousand processes on the machine (a busy grader asks ten times a
    second, beside other graders' thousands of workers). A kernel without
    CONFIG_PROC_CHILDREN: the whole table, filtered."""
    listed, found = [], False
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                listed += (task / "children").read_text().split()
                found = True
            except (FileNotFoundError, ProcessLookupError):  # thread gone
                continue
    except (FileNotFoundError, ProcessLookupError):  # pid has gone
        return {}
    if not found:
        return {p: stat for p, stat in process_table().items()
                if stat[1] == pid}
    stats = {}
    for child in sorted(set(map(int, listed))):
        stat = proc_stat(child)
        if stat and stat[1] == pid:  # not reaped and reused since
            stats[child] = stat
    return stats


def children(pid):
    """PIDs whose parent is pid, in order."""
    return sorted(child_stats(pid))


def descendants(pid):
    """{pid: starttime} for every process below pid."""
    found, todo = {}, [pid]
    while todo:
        for child, stat in child_stats(todo.pop()).items():
            if child not in found:
                found[child] = stat[2]
                todo.append(child)
    return found


def still_running(pids):
    """The processes of a {pid: starttime} map that still exist, zombies
    excepted (a zombie re-parented to init is init's to reap)."""
    alive = []
    for pid, start in pids.items():
        stat = proc_stat(pid)
        if stat and stat[2] == start and stat[0] != "Z":
            alive.append(pid)
    return alive


# ---- redis-server ----

class RedisServer:
    """A private redis-server on a free port, nothing saved to disk, its log
    in workdir/redis.log: start() (again after kill(), on the same port),
    command(), stop(); `with RedisServer(...).start() as redis:` stops it
    on leaving. It listens on the bind addresses. loadtest/harness.py
    runs it on chosen CPUs or another host by overriding launch(),
    folder(), where() and address."""

    address = LOCAL_ADDRESS  # where command() reaches it

    def __init__(self, workdir, maxclients=None, backlog=None,
                 bind=(LOCAL_ADDRESS,), port=None):
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.options = ["--bind", *bind]
        if maxclients is not None:
            self.options += ["--maxclients", str(maxclients)]
        if backlog is not None:
            self.options += ["--tcp-backlog", str(backlog)]
        self.proc = None

    def launch(self, argv):
        return spawn_logged(argv, self.workdir / "redis.log")

    def folder(self):
        """Its working folder, where it runs."""
        return str(self.workdir)

    def where(self):
        """" on user@host" for messages, or nothing here."""
        return ""

    def start(self):
        self.proc = self.launch(
            ["redis-server", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--daemonize", "no",
             "--dir", self.folder()] + self.options)
        try:
            wait_until(self.answers, self.proc, "redis-server" + self.where())
        except StartError as e:
            self.stop()
            log = self.workdir / "redis.log"
            said = log.read_text(errors="replace")[-2000:] if log.exists() \
                else ""
            raise StartError(f"{e}; its log: {said}") from None
        return self

    def answers(self):
        try:
            return self.command("PING") == "PONG"
        except (OSError, RedisError):  # not up yet, or still loading
            return False

    def command(self, *args, timeout=2.0):
        """Send one command as RESP2 and return the reply (str, int, None,
        or list); an error reply raises RedisError."""
        with socket.create_connection((self.address, self.port),
                                      timeout=timeout) as s:
            s.sendall(resp_command(*args))
            return read_reply(s.makefile("rb"))

    def kill(self):
        """SIGKILL: gone at once, as in a crash; start() brings it back."""
        stop(self.proc, signal.SIGKILL)

    def stop(self, grace=STOP_TIMEOUT):
        if self.proc is not None:
            stop(self.proc, grace=grace)

    def __enter__(self):  # with RedisServer(...).start() as redis:
        return self

    def __exit__(self, *exc):
        self.stop()


class RedisError(RuntimeError):
    """Redis answered a command with an error reply."""


def resp_command(*args):
    """One command as RESP2: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def read_reply(f):
    """One RESP2 reply from a binary file object."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError(f"Redis closed the connection ({line!r})")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RedisError(rest)
    if kind == b":":
        return int(rest)
    if kind == b"$":
        return None if rest == "-1" else f.read(int(rest) + 2)[:-2].decode()
    if kind == b"*":
        return None if rest == "-1" else [read_reply(f) for _ in range(int(rest))]
    raise RedisError(f"bad RESP reply {line!r}")


# ---- the server under test ----

class ServerProcess:
    """One running server. stop() sends SIGTERM and checks the exit: code 0,
    the summary line printed, no sanitizer report, no worker left behind.
    Unlike spawn(), it starts the server in our own process group, as a
    shell script or make would (labs/zombies checks that stopping it spares
    its launcher), so cleanup() kills its workers by PID, not by group."""

    def __init__(self, binary, site, redis_port, env=None, nofile=None,
                 spawned=None, blocked=()):
        """spawned(self), if given, is called once the process exists and
        before it is waited for: an owner can then account for a server
        that dies as it starts. blocked: signals the server inherits
        blocked (a shell or a supervisor may start it so)."""
        self.binary = binary
        self.name = binary.id
        self.model = binary.model
        self.stdout = b""
        self.result = None  # exit code, set by stop()
        self.workers = {}  # {pid: starttime} below the server at stop()
        full_env = dict(os.environ)
        full_env.pop("ZEROHTTPD_LOG", None)  # quiet: stderr is for sanitizers
        # Leak checking is a later issue; UB aborts are compiled in.
        full_env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        full_env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        full_env.update(env or {})
        # nofile: the server's open-file soft limit (None: this process's).
        def inherited():  # in the forked child, before exec
            if nofile is not None:
                limit_descriptors(nofile)
            if blocked:
                signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        for attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            self.stderr_path = (Path(site).parent /
                                f"{binary.id}-{self.port}.stderr")
            with open(self.stderr_path, "wb") as err:
                self.proc = subprocess.Popen(
                    [str(binary.path), str(self.port), "127.0.0.1",
                     str(redis_port)], cwd=site, env=full_env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=err, preexec_fn=inherited
                    if nofile is not None or blocked else None)
            self.pid = self.proc.pid
            if spawned:
                spawned(self)
            try:
                self._wait_listening()
                return
            except StartError:
                # the free port was taken before the server bound it (a
                # client's connect() where no port is kept out of the
                # ephemeral range): another port, not a failed test
                if (attempt + 1 == PORT_ATTEMPTS or
                        "Address already in use" not in self.stderr()):
                    raise
                self.stdout = b""

    def stderr(self):
        return self.stderr_path.read_bytes().decode("utf-8", "replace")

    def _read_stdout(self, until, deadline):
        """Append stdout bytes until the regex `until` matches, the server has
        exited with nothing left to read, or the deadline. Never reads to EOF
        alone: forked workers share the pipe and may hold it open."""
        fd = self.proc.stdout.fileno()
        while not until.search(self.stdout.decode("utf-8", "replace")):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not select.select([fd], [], [], min(left, 0.05))[0]:
                if self.proc.poll() is not None:
                    return
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return
            self.stdout += chunk

    def _wait_listening(self):
        deadline = time.monotonic() + START_TIMEOUT
        line = re.compile(rf"listening on port {self.port}\n")
        self._read_stdout(line, deadline)
        if not line.search(self.stdout.decode("utf-8", "replace")):
            self.cleanup()
            raise StartError(
                f"{self.name} did not print 'listening on port {self.port}' "
                f"within {START_TIMEOUT} s; stdout {self.stdout!r}, "
                f"stderr {self.stderr()[-3000:]}")
        try:
            wait_for_port(self.port, self.proc, self.name,
                          max(deadline - time.monotonic(), 0))
        except StartError as e:
            self.cleanup()
            raise StartError(f"{e}: it printed its listening line but port "
                             f"{self.port} does not accept") from None

    def stop(self):
        """SIGTERM, then the exit checks: exit code 0, the summary printed,
        no sanitizer report, no worker left behind. Idempotent."""
        self.terminate()
        self.check_exit()

    def terminate(self, timeout=STOP_TIMEOUT):
        """SIGTERM and wait for the exit, at most timeout seconds; returns
        the exit code. Does nothing the second time."""
        if self.result is not None:
            return self.result
        crashed = self.proc.poll()
        assert crashed is None, (
            f"{self.name} died during the test with status {crashed}; "
            f"stderr: {self.stderr()[-4000:]}")
        self.workers = descendants(self.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.result = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running {timeout} s after SIGTERM")
        self._read_stdout(SUMMARY_RE, time.monotonic() + 2)
        return self.result

    def check_exit(self):
        stderr = self.stderr()
        assert self.result == 0, (
            f"{self.name} exited {self.result}; stderr: {stderr[-4000:]}")
        assert SUMMARY_RE.search(self.stdout.decode("utf-8", "replace")), (
            f"{self.name} printed no summary line; stdout {self.stdout!r}")
        for mark in SANITIZER_MARKS:
            assert mark not in stderr, f"{self.name} stderr:\n{stderr[-6000:]}"
        self.assert_workers_gone(self.workers)

    def assert_workers_gone(self, workers):
        """Workers recorded before SIGTERM must not outlive the server."""
        deadline = time.monotonic() + CHILD_EXIT_TIMEOUT
        while still_running(workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = still_running(workers)
        assert not left, f"{self.name} left processes behind: {left}"

    def summary(self):
        """The summary line's numbers: (name, total, 2xx, 3xx, 4xx, 5xx)."""
        m = SUMMARY_RE.search(self.stdout.decode("utf-8", "replace"))
        return (m.group(1),) + tuple(int(g) for g in m.groups()[1:])

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        """Leaving a `with`: stopped with its exit checks unless the block
        failed, then cleaned up either way."""
        try:
            if kind is None:
                self.stop()
        finally:
            self.cleanup()

    def cleanup(self):
        """Always called last: SIGKILL whatever is left of the server and its
        workers, by PID (nothing, after a clean stop), and close the pipe."""
        workers = dict(self.workers)
        if self.proc.poll() is None:  # only then is self.pid surely ours
            workers.update(descendants(self.pid))
            self.proc.kill()
        kill_pids(workers)
        self.proc.wait()
        self.proc.stdout.close()


def run_to_exit(binary, args, cwd, timeout=5.0, env=None):
    """Run a server that should exit by itself (bad arguments or settings,
    port taken): (exit code, stdout, stderr). `env` adds to the environment.
    Still running after timeout: it and its workers are killed by PID and
    the code is None."""
    proc = subprocess.Popen([str(binary.path), *args], cwd=cwd,
                            env={**os.environ, **(env or {})},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(), err.decode()
    except subprocess.TimeoutExpired:
        kill_pids(descendants(proc.pid))
        proc.kill()
        out, err = proc.communicate(timeout=timeout)
        return None, out.decode(), err.decode()


# ---- looking at a server from outside ----

def redis_settle(model):
    """Seconds after a server's first guestbook page following a Redis
    outage until every one of its Redis links is back (see
    REDIS_BACKOFF_MAX): 0 for the servers with a single link, or a link per
    worker that reconnects at once."""
    return REDIS_BACKOFF_MAX if model in SEPARATE_REDIS_LINKS else 0.0


def python_with(*modules):
    """A Python that can import the modules, when the one running the tests
    may not (tools/python picks .venv, python3 or /usr/bin/python3)."""
    proc = subprocess.run([str(REPO / "tools" / "python"), *modules],
                          capture_output=True, text=True)
    assert proc.returncode == 0, \
        f"no Python with {', '.join(modules)}: run `make deps`"
    return proc.stdout.strip()


def token():
    """A unique tag, to find this test's remark among everyone else's."""
    return "t" + uuid.uuid4().hex[:11]


def guarded_stacks(pid):
    """How many rw-p mappings sit right above a one-page ---p mapping: a
    stack and its guard. (Shared libraries' ---p gaps are counted too, the
    same before and after, so tests compare differences.)"""
    page = resource.getpagesize()
    maps = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        maps.append((start, end, fields[1]))
    return sum(1 for (s1, e1, p1), (s2, _, p2) in zip(maps, maps[1:])
               if p1 == "---p" and e1 - s1 == page and e1 == s2
               and p2 == "rw-p")


def need_descriptors(wanted):
    """In a test: skip it when the open-file limit is below `wanted`."""
    import pytest  # only tests call this; the lab graders import the rest
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < wanted:
        pytest.skip(f"open-file limit {soft}: {wanted} are needed")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for_fds(pid, baseline, timeout=5.0, count_fds=fd_count):
    """Poll until the server holds at most `baseline` descriptors again
    (closed connections take a moment to leave); returns the last count.
    count_fds(pid) counts them (default: the process's own)."""
    deadline = time.monotonic() + timeout
    count = count_fds(pid)
    while count > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
        count = count_fds(pid)
    return count


def settled(measure, what, quiet=0.3, limit=5.0):
    """measure()'s value once it has not changed for `quiet` seconds (a
    pool may still be forking, a closed connection still leaving); the
    test fails if it is still changing after `limit` seconds."""
    deadline = time.monotonic() + limit
    last, stable_since = measure(), time.monotonic()
    while time.monotonic() - stable_since < quiet:
        assert time.monotonic() < deadline, f"{what} never settled"
        time.sleep(0.05)
        now = measure()
        if now != last:
            last, stable_since = now, time.monotonic()
    return last
