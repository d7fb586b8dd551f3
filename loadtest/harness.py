"""Process plumbing shared by loadtest/sweep, loadtest/soak and
bench/event-bench: starting and stopping what they run, by PID, and the
little things each of them needs around that.

  - spawn() starts a process in its own session and remembers it; stop()
    stops one by PID (then SIGKILLs its process group, which catches
    workers that outlived their parent); stop_all() stops whatever is left.
    Only processes started here are ever signalled, never anything by name.
  - free_port(), wait_until(), accepts(): ports and
    waiting for something to come up, bounded by START_TIMEOUT.
  - Redis: a private redis-server on a free port, restartable on that port,
    with command() for seeding.
  - start_server(): one zerohttpd server, up once it prints its listening
    line; start_nginx(): nginx with a config the caller writes.
  - parse_ab(): ApacheBench's report as a dict, or into a record.
  - raise_open_file_limit(), stop_signals(), build(), pick_servers(),
    require_tools(), fail(), command_output(), first_match(), tool_version().

Python 3 standard library only. The scripts import it with
`sys.path.insert(0, <this folder>)`, so they run from anywhere.
"""

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repo: binaries, public/
START_TIMEOUT = 10.0  # seconds for a server, redis or nginx to come up
STOP_GRACE = 10.0  # seconds after the stop signal before SIGKILL
BUILD_TIMEOUT = 600  # seconds for `make all`


class StartError(RuntimeError):
    """A server, redis or nginx did not come up; the message says why."""


# ===== Processes: start, wait, stop by PID =====

STARTED = []  # every process we started and have not stopped yet


def spawn(argv, **kwargs):
    """Start a process from the repo root (unless cwd= says otherwise) in its
    own session: Ctrl-C reaches only us, and we stop it (and anything it
    forked) ourselves, by its process group."""
    kwargs.setdefault("cwd", ROOT)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            start_new_session=True, **kwargs)
    STARTED.append(proc)
    return proc


def kill_group(proc):
    """SIGKILL the process group of a process we started (its session, so
    its pgid is its PID): workers that outlived their parent too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop(proc, sig=signal.SIGTERM, grace=STOP_GRACE):
    """sig by PID and wait up to grace seconds, then SIGKILL the process
    group. Closes our ends of its pipes. Returns the exit code of a process
    that left by itself, or None if it had to be killed."""
    code = proc.poll()
    if code is None:
        proc.send_signal(sig)
        try:
            code = proc.wait(grace)
        except subprocess.TimeoutExpired:
            code = None
    kill_group(proc)
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


def stop_all(grace=STOP_GRACE):
    """Stop every process still running that we started, newest first."""
    for proc in reversed(STARTED[:]):
        stop(proc, grace=grace)


def describe_exit(code):
    """An exit code as stop() returns it, in words."""
    if code is None:
        return f"still running {STOP_GRACE:.0f} s after SIGTERM"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def stop_signals(handler):
    """Ctrl-C (SIGINT) and kill (SIGTERM) both get handler: with
    signal.default_int_handler both raise KeyboardInterrupt, so that every
    `finally` runs and every process we started is stopped."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def free_port():
    """A port nobody listens on right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, proc, what, timeout=START_TIMEOUT):
    """Poll ready() until it is true; StartError if proc exits or time runs
    out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            raise StartError(f"{what} did not start: "
                             f"{describe_exit(proc.returncode)}")
        time.sleep(0.02)
    raise StartError(f"{what} did not start in {timeout:.0f} s")


def accepts(port):
    """Does something accept connections on 127.0.0.1:port?"""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def raise_open_file_limit():
    """Soft open-file limit up to the hard one; the processes we start
    inherit it. Returns it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ===== Redis =====

class Redis:
    """A private redis-server on a free port, nothing saved to disk, its log
    in workdir/redis.log. start() (again after kill(), on the same port),
    command(), stop()."""

    def __init__(self, workdir, maxclients=None, backlog=None):
        self.port = free_port()
        self.workdir = Path(workdir)
        self.options = []
        if maxclients is not None:
            self.options += ["--maxclients", str(maxclients)]
        if backlog is not None:
            self.options += ["--tcp-backlog", str(backlog)]
        self.proc = None

    def start(self):
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = spawn(
                ["redis-server", "--port", str(self.port),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir)] + self.options,
                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self.answers, self.proc, "redis-server")
        except StartError:
            self.stop()
            raise
        return self

    def command(self, *args, timeout=2.0):
        """Send one command in RESP and return the reply's first line, e.g.
        "+PONG" or ":3". Enough for PING, SET, RPUSH and LLEN."""
        request = f"*{len(args)}\r\n"
        for arg in map(str, args):
            request += f"${len(arg.encode())}\r\n{arg}\r\n"
        with socket.create_connection(("127.0.0.1", self.port),
                                      timeout=timeout) as s:
            s.sendall(request.encode())
            return s.recv(4096).decode(errors="replace").split("\r\n")[0]

    def answers(self):
        try:
            return self.command("PING") == "+PONG"
        except OSError:
            return False

    def kill(self):
        stop(self.proc, signal.SIGKILL)

    def stop(self, grace=STOP_GRACE):
        if self.proc is not None:
            stop(self.proc, grace=grace)


# ===== The servers and nginx =====

def server_env():
    env = dict(os.environ)
    env.pop("ZEROHTTPD_LOG", None)  # logging must never be what we measure
    return env


def start_server(name, redis_port, log_path, label=None):
    """./NAME port 127.0.0.1 redis-port from the repo root, its output
    appended to log_path (after a line `--- label, port N ---` if label is
    given); returns (process, port) once it has printed its listening line.
    The servers print it after listen(): it accepts from then on. If it
    does not come up it is stopped, and StartError says why."""
    port = free_port()
    with open(log_path, "ab") as log:
        if label:
            log.write(f"--- {label}, port {port} ---\n".encode())
            log.flush()
        start = log.tell()  # read only what this instance prints
        proc = spawn([f"./{name}", str(port), "127.0.0.1", str(redis_port)],
                     env=server_env(), stdout=log, stderr=subprocess.STDOUT)
    line = f"listening on port {port}\n".encode()

    def listening():
        with open(log_path, "rb") as log:
            log.seek(start)
            return line in log.read()

    try:
        wait_until(listening, proc, f"./{name}")
    except StartError:
        stop(proc)
        raise
    return proc, port


def start_nginx(prefix, config, logs):
    """nginx -p prefix, never the system config: config(port) is the text of
    prefix/nginx.conf, listening on port; nginx's output goes to
    logs/nginx.log and its early errors to logs/nginx-error.log. Returns
    (process, port) once it accepts."""
    port = free_port()
    conf = Path(prefix) / "nginx.conf"
    conf.write_text(config(port))
    with open(Path(logs) / "nginx.log", "ab") as log:
        proc = spawn(["nginx", "-p", str(prefix), "-c", str(conf),
                      "-e", str(Path(logs) / "nginx-error.log")],
                     stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: accepts(port), proc, "nginx")
    except StartError:
        stop(proc)
        raise
    return proc, port


# ===== ApacheBench =====

AB_FIELDS = {  # field: (pattern in ab's output, type)
    "complete": (r"^Complete requests:\s+(\d+)", int),
    "failed": (r"^Failed requests:\s+(\d+)", int),
    "connect": (r"\(Connect: (\d+),", int),
    "receive": (r" Receive: (\d+),", int),
    "length": (r" Length: (\d+),", int),
    "exceptions": (r" Exceptions: (\d+)\)", int),
    "non2xx": (r"^Non-2xx responses:\s+(\d+)", int),
    "rps": (r"^Requests per second:\s+([\d.]+)", float),
    "mean_ms": (r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$", float),
    "p50_ms": (r"^\s+50%\s+(\d+)", int),
    "p99_ms": (r"^\s+99%\s+(\d+)", int),
}


def parse_ab(text, into=None):
    """The AB_FIELDS that ab's report holds, as a dict; a run ab stopped
    early counts what it completed. With `into`, set them as its attributes
    and return it instead."""
    found = {}
    for field, (pattern, kind) in AB_FIELDS.items():
        match = re.search(pattern, text, re.M)
        if match:
            found[field] = kind(match.group(1))
    aborted = re.search(r"^Total of (\d+) requests completed", text, re.M)
    if aborted:
        found["complete"] = int(aborted.group(1))
    if into is None:
        return found
    for field, value in found.items():
        setattr(into, field, value)
    return into


# ===== The command line: build, servers, tools =====

def fail(message):
    """`PROG: message` on stderr, exit 1 (PROG: sweep, soak, event-bench)."""
    print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    sys.exit(1)


def build():
    print("+ make all", flush=True)
    try:
        done = subprocess.run(["make", "all"], cwd=ROOT, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail(f"make all: {e}")
    if done.returncode != 0:
        fail("make all failed; fix the build (or use --no-build)")


def is_built(name):
    return (ROOT / name).is_file() and os.access(ROOT / name, os.X_OK)


def pick_servers(requested, choices):
    """The servers named in `requested` (comma-separated), or every built
    one of `choices`; fail() on an unknown or unbuilt name."""
    built = [name for name in choices if is_built(name)]
    if not requested:
        return built or fail(f"none of {', '.join(choices)} is built at the "
                             "repo root; run `make all`")
    names = [name for name in requested.split(",") if name]
    for name in names:
        if name not in choices:
            fail(f"unknown server {name!r}; choose from {', '.join(choices)}")
        if name not in built:
            fail(f"{name} is not built; run `make all`")
    return names


def require_tools(needed):
    """needed: {tool: package}; fail() on the first one not installed."""
    for tool, package in needed.items():
        if not shutil.which(tool):
            fail(f"{tool} not found: install {package} (`make deps` does)")


def command_output(argv):
    """stdout + stderr of a short command, or "" if it cannot run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def first_match(pattern, text, default="not found"):
    found = re.search(pattern, text, re.M)
    return found.group(1) if found else default


def tool_version(argv, pattern, default="not found"):
    """e.g. tool_version(["redis-server", "--version"], r"v=(\\S+)")."""
    return first_match(pattern, command_output(argv), default)
