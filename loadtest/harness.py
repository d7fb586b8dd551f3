"""What the load tests (loadtest/sweep, loadtest/soak) and the benches
(bench/*) need around the processes they run: where they run, the clients'
reports, the command line.

The process primitives are tests/processes.py's, the one module that starts
and stops processes for the whole suite, and are importable from here under
their names (harness.spawn, harness.stop, ...):

  - spawn() starts a process in its own session and remembers it; stop()
    stops one by PID (then SIGKILLs its process group, which catches
    workers that outlived their parent); stop_all() stops whatever is left.
    Only processes started here are ever signalled, never anything by name.
  - free_port(), wait_until(), wait_for_port(), accepts(): ports and
    waiting for something to come up, bounded by START_TIMEOUT.
  - raise_open_file_limit(), describe_exit(), StartError.

Load-test specific, here:

  - Redis: processes.RedisServer at a Place (pinned, or on another host).
  - start_server(): one zerohttpd server, up once it prints its listening
    line; start_nginx(): nginx with a config the caller writes.
  - parse_ab(), parse_wrk(), parse_httperf(): ApacheBench's, wrk's or
    httperf's report as a dict, or into a record.
  - IdleConnections: keep-alive connections held open, idle, beside a run.
  - RunCost: what one client run cost the server's process tree (CPU,
    context switches, peak memory and tasks, from /proc, with a sampler
    thread), Redis and the client; tree_pids(), cpu_and_switches(),
    look(), Sampler.
  - Place: where a process runs, on which CPUs (taskset) and on which host;
    SSHHost: a host reached over ssh, where processes are started and
    stopped by PID as here (RemoteProcess).
  - stop_signals(), build(), pick_servers(), require_tools(), fail(),
    command_output(), first_match(), tool_version().

Python 3 standard library only. The scripts import it with
`sys.path.insert(0, <this folder>)`, so they run from anywhere; it finds
tests/processes.py the same way.
"""

import dataclasses
import io
import os
import re
import resource
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repo: binaries, public/
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
import processes  # noqa: E402  (the process primitives)
from processes import (LOCAL_ADDRESS, START_TIMEOUT, STARTED,  # noqa: E402,F401
                       StartError, accepts, describe_exit, forget,
                       raise_open_file_limit, spawn, spawn_logged, stop,
                       stop_all, wait_for_port, wait_until)

STOP_GRACE = processes.STOP_TIMEOUT  # seconds after the stop signal before
#                                      SIGKILL
BUILD_TIMEOUT = 600  # seconds for `make all`
SSH_TIMEOUT = 20.0  # seconds for one command over ssh (most take a few ms
#                     over the master connection)
REMOTE_POLL = 0.05  # seconds between looks at a remote process


# ===== Processes: what tests/processes.py does not =====

def stop_signals(handler):
    """Ctrl-C (SIGINT) and kill (SIGTERM) both get handler: with
    signal.default_int_handler both raise KeyboardInterrupt, so that every
    `finally` runs and every process we started is stopped."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def free_port(place=None):
    """A port nobody listens on right now (the kernel picks it). For a
    remote place, one that nothing there accepts on either."""
    remote = place is not None and place.host is not None
    return processes.free_port(place.address if remote else None)


# ===== Where a process runs: CPUs and hosts =====

def cpu_list(text):
    """"0-2,5" (the kernel's and taskset's syntax) as [0, 1, 2, 5];
    ValueError if it is not such a list."""
    cpus = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        first, last = int(low), int(high) if dash else int(low)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def cpu_text(cpus):
    """[0, 1, 2, 5] as "0-2,5"."""
    ranges = []
    for cpu in sorted(cpus):
        if ranges and ranges[-1][1] == cpu - 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in ranges)


def online_cpus():
    """The CPUs this machine has online, as the kernel lists them."""
    return cpu_list(Path("/sys/devices/system/cpu/online").read_text())


class Place:
    """Where one process runs: on this machine (host None) or on an SSHHost,
    on the given CPUs (taskset -c; None: wherever the kernel likes).
    Processes at every place are started with start() and stopped with
    stop(), by PID."""

    def __init__(self, cpus=None, host=None):
        self.cpus = cpus
        self.host = host

    def argv(self, argv):
        """argv pinned to the CPUs: taskset execs it, so the PID is its."""
        pin = ["taskset", "-c", cpu_text(self.cpus)] if self.cpus else []
        return pin + [str(arg) for arg in argv]

    @property
    def address(self):
        """Where this machine reaches a process here."""
        return self.host.address if self.host else LOCAL_ADDRESS

    def address_from(self, other):
        """Where a process at Place `other` reaches a process here."""
        if self.host:
            return self.host.address
        return other.host.our_address if other.host else LOCAL_ADDRESS

    def folder(self, local):
        """Where its files go: `local` here, the host's scratch folder
        there."""
        return self.host.workdir if self.host else str(local)

    def where(self):
        """" on user@host" for messages, or nothing here."""
        return f" on {self.host.target}" if self.host else ""

    def describe(self):
        where = self.host.target if self.host else "this machine"
        pinned = (f"CPU {cpu_text(self.cpus)} (taskset -c)" if self.cpus
                  else "any CPU")
        return f"{where}, {pinned}"

    def start(self, argv, log_path, banner="", unset=()):
        """Start argv from the repo root, its output appended to log_path
        (here) or to the file of that name in the host's folder (there),
        after the banner line; variables in `unset` removed from its
        environment. Returns the process (a RemoteProcess there)."""
        if self.host:
            return self.host.start(self.argv(argv), Path(log_path).name,
                                   banner, unset)
        return spawn_logged(self.argv(argv), log_path, banner, unset)


class RemoteError(RuntimeError):
    """A command over ssh failed; the message says which and why."""


# What SSHHost.probe() runs there: facts as `key=value` lines. Its
# scratch folder is made here too (mktemp), and removed by close().
PROBE = r"""
printf 'connection=%s\n' "$SSH_CONNECTION"
printf 'online=%s\n' "$(cat /sys/devices/system/cpu/online)"
printf 'kernel=%s\n' "$(uname -r)"
printf 'cpu=%s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
printf 'workdir=%s\n' "$(mktemp -d /tmp/zerohttpd-sweep.XXXXXX)"
for tool in $TOOLS; do
    command -v "$tool" >/dev/null || printf 'missing=%s\n' "$tool"
done
for name in $FILES; do
    test -e "$DIR/$name" || printf 'absent=%s\n' "$name"
done
"""


class SSHHost:
    """A host reached with ssh. connect() opens one master connection that
    every later command shares (ControlMaster: a command then costs a few
    milliseconds, not a new login); probe() learns its addresses and CPUs
    and makes a scratch folder there; start() runs a process there by PID;
    close() fetches that folder into a local one, removes it there and
    closes the connection. Processes are started from suite_dir, the repo
    on that host."""

    def __init__(self, target, ssh_options, suite_dir, control_path):
        self.target = target  # [user@]host, as given
        self.ssh_options = list(ssh_options)  # -p PORT, -F FILE, -o K=V ...
        self.suite_dir = str(suite_dir)
        self.control_path = str(control_path)  # the master's socket, here
        self.master = None  # the `ssh -M -N` process, here
        self.address = None  # the host, as this machine reaches it
        self.our_address = None  # this machine, as the host sees it
        self.workdir = None  # scratch folder there: logs, nginx.conf
        self.facts = {}  # what probe() found

    def ssh_argv(self, command):
        return (["ssh"] + self.ssh_options +
                ["-o", f"ControlPath={self.control_path}",
                 "-o", "ControlMaster=no", self.target, command])

    def run(self, command, data=b"", timeout=SSH_TIMEOUT):
        """Run a shell command there, with data on its stdin; the
        CompletedProcess (bytes). A connection that hangs counts as ssh's
        own failure (255)."""
        try:
            return subprocess.run(self.ssh_argv(command), input=data,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(command, 255, b"",
                                               b"ssh: timed out")

    def output(self, command, data=b""):
        """stdout of a command there; RemoteError if it fails."""
        done = self.run(command, data)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()
            raise RemoteError(f"ssh {self.target} {command.strip()[:60]!r}: "
                              f"exit {done.returncode}: {said[-300:]}")
        return done.stdout.decode(errors="replace")

    def connect(self, log_path):
        """Open the master connection (BatchMode: never a password prompt);
        StartError with ssh's own words if it cannot."""
        with open(log_path, "ab") as log:
            self.master = spawn(
                ["ssh"] + self.ssh_options +
                ["-M", "-N", "-o", "ControlMaster=yes", "-o",
                 f"ControlPath={self.control_path}", "-o", "ControlPersist=no",
                 self.target], stdout=log, stderr=subprocess.STDOUT)
        forget(self.master)  # close() stops it, after what runs through it
        try:
            wait_until(lambda: os.path.exists(self.control_path),
                       self.master, f"ssh {self.target}", SSH_TIMEOUT)
        except StartError as e:
            said = Path(log_path).read_text(errors="replace").strip()
            raise StartError(f"{e}: {said[-300:]}") from None

    def probe(self, tools, files):
        """Addresses (from $SSH_CONNECTION), online CPUs, kernel, CPU model;
        a scratch folder; which of `tools` are missing and which of `files`
        (paths in suite_dir) are absent. Returns the facts as a dict of
        lists."""
        script = (f"DIR={shlex.quote(self.suite_dir)}; "
                  f"TOOLS={shlex.quote(' '.join(tools))}; "
                  f"FILES={shlex.quote(' '.join(files))}\n" + PROBE)
        facts = {}
        for line in self.output("sh -s", script.encode()).splitlines():
            key, _, value = line.partition("=")
            facts.setdefault(key, []).append(value)
        self.facts = facts
        self.workdir = facts["workdir"][0]
        self.our_address, _, self.address, _ = facts["connection"][0].split()
        return facts

    def online_cpus(self):
        return cpu_list(self.facts["online"][0])

    def describe(self):
        f = self.facts
        return (f"{self.target}: address {self.address}, "
                f"{f['cpu'][0] or 'CPU unknown'}, CPUs online "
                f"{f['online'][0]}, Linux {f['kernel'][0]}; suite at "
                f"{self.suite_dir}; this machine seen from there as "
                f"{self.our_address}")

    def write(self, name, text):
        """A file in the scratch folder there."""
        self.output(f"cat > {shlex.quote(self.workdir + '/' + name)}",
                    text.encode())

    def start(self, argv, log_name, banner="", unset=()):
        """argv from suite_dir, in a session of its own (setsid), its
        output appended to log_name in the scratch folder, the open-file
        limit raised to the hard limit as here. Returns a RemoteProcess."""
        q = shlex.quote
        log = q(f"{self.workdir}/{log_name}")
        command = " ".join(["env"] + [f"-u{name}" for name in unset] +
                           [q(arg) for arg in argv])
        script = (f"cd {q(self.suite_dir)} || exit 1\n"
                  'ulimit -n "$(ulimit -Hn)" 2>/dev/null\n'
                  f"printf %s {q(banner)} >> {log}\n"
                  # in the background of a non-interactive shell the child
                  # leads no process group, so setsid does not fork: $! is
                  # the PID of what argv runs
                  f"setsid {command} >> {log} 2>&1 < /dev/null &\n"
                  "echo $!\n")
        pid = self.output(script).strip()
        if not pid.isdigit():
            raise StartError(f"{argv[0]} on {self.target}: no PID ({pid!r})")
        proc = RemoteProcess(self, int(pid))
        STARTED.append(proc)
        return proc

    def close(self, local_folder):
        """Fetch the scratch folder's files into local_folder, remove it
        there, stop the master connection. Never raises: it runs while
        cleaning up."""
        if self.workdir:
            done = self.run(f"tar -C {shlex.quote(self.workdir)} -cf - .")
            if done.returncode == 0:
                untar_files(done.stdout, Path(local_folder))
            else:
                print(f"warning: could not fetch the logs from "
                      f"{self.target}: {done.stderr.decode().strip()}")
            self.run(f"rm -rf {shlex.quote(self.workdir)}")
            self.workdir = None
        if self.master is not None:
            stop(self.master, grace=STOP_GRACE)
            self.master = None


def untar_files(data, folder):
    """The regular files at the top of a tar archive (bytes), into folder;
    anything else (folders, links, paths with /) is left out."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name and "/" not in name:
                (folder / name).write_bytes(tar.extractfile(member).read())


class RemoteProcess:
    """A process started on an SSHHost, known by its PID there. It answers
    the part of subprocess.Popen that stop() uses. It is not our child, so
    its exit code is unknown: poll() says where it was once it is gone."""

    stdout = stderr = None  # no pipes to close

    def __init__(self, host, pid):
        self.host, self.pid = host, pid
        self.returncode = None

    def poll(self):
        """None while it runs (or while the host cannot be asked)."""
        if self.returncode is None:
            # status 0: it runs; 1: a zombie; 2: no such process
            done = self.host.run(
                f"grep -q '^State:[[:space:]]*[^Z]' /proc/{self.pid}/status")
            if done.returncode in (1, 2):
                self.returncode = f"exited on {self.host.target}"
        return self.returncode

    def send_signal(self, sig):
        self.host.run(f"kill -s {signal.Signals(sig).name[3:]} {self.pid}")

    def wait(self, timeout=SSH_TIMEOUT):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(REMOTE_POLL)
        return self.returncode

    def kill_group(self):
        """SIGKILL its process group (setsid made its PID the group's)."""
        self.host.run(f"kill -s KILL -- -{self.pid} 2>/dev/null")


# ===== What a run cost: CPU, switches, memory and tasks, from /proc =====
#
# Only for processes on this machine: /proc here says nothing of another
# host's (the sweep leaves those columns empty, see loadtest/README.md).

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat's unit of CPU time
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024  # its unit of rss
SAMPLE_MIN_GAP = 0.01  # seconds between two looks at a tree, at least...
SAMPLE_DUTY = 3  # ...and 3 x what the last look took: a large tree (forking
#                  at c=10000: thousands of processes) costs the sampler at
#                  most a quarter of a core, taken from what it measures


def tree_pids(pids, tasks=0):
    """pids and every process below them (zombies too), each before its
    children. Read in that order, a child reaped between two reads is
    missed by this look (its parent's cutime did not have it yet) but never
    counted twice.

    tasks: how many processes + threads the tree had at the last look.
    Children are listed per thread (/proc/PID/task/TID/children), so a
    threaded server at c=10000 costs 10,000 reads a look; when the tree has
    more tasks than the machine has processes, one pass over those
    (processes.process_table()) is cheaper."""
    if tasks <= len([name for name in os.listdir("/proc") if name.isdigit()]):
        found = []
        for pid in pids:
            found += [pid] + list(processes.descendants(pid))
        return found
    below = {}
    for pid, (_, ppid, *_) in processes.process_table().items():
        below.setdefault(ppid, []).append(pid)
    found, todo = [], list(pids)
    while todo:
        found.append(todo.pop(0))
        todo += below.get(found[-1], [])
    return found


def ticks(fields, *indexes):
    """Seconds of CPU time from stat_fields() (in clock ticks there)."""
    return sum(int(fields[i]) for i in indexes) / CLOCK_TICKS


SWITCHES = re.compile(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", re.M)


def read_task(pid, tid):
    """(voluntary + involuntary context switches, ns on a CPU) of one
    thread, or None once it has ended. The ns (schedstat) are exact, where
    stat's ticks are 10 ms steps; 0 on a kernel without schedstat
    (CONFIG_SCHED_INFO)."""
    task = Path(f"/proc/{pid}/task/{tid}")
    try:
        status = (task / "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        ns = int((task / "schedstat").read_text().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        ns = 0
    return sum(map(int, SWITCHES.findall(status))), ns


def read_tasks(pid):
    """{tid: read_task()} of the live threads of a process."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return {}
    found = {tid: read_task(pid, tid) for tid in tids}
    return {tid: seen for tid, seen in found.items() if seen}


def cpu_and_switches(pids):
    """(CPU seconds, {(pid, tid): switches}) of the processes pids
    (tree_pids()), read before and after a run.

    CPU: per process, what its threads ran, as the larger of stat's utime +
    stime (the whole thread group, also threads that have exited: a
    threaded server's finished threads; in 10 ms steps, so 32 preforked
    workers would blur a run by up to 0.3 s) and the exact sum of its live
    threads' schedstat; plus its cutime + cstime: the children it reaped
    (forking's workers exit during the run).

    Switches: of the live threads only. /proc keeps none for threads that
    exited or children that were reaped (the kernel adds them up only for
    getrusage() in the process and wait4() in its parent, neither of which
    we are), so where a task lives for one connection (forking's processes,
    threaded's threads) this is a lower bound, little more than the
    switches of the tasks that stay; pools and event loops lose nothing."""
    cpu, switches = 0.0, {}
    for pid in pids:
        fields = processes.stat_fields(pid)
        if fields is None:
            continue
        tasks = read_tasks(pid)
        live = sum(ns for _, ns in tasks.values()) / 1e9
        cpu += max(ticks(fields, 11, 12), live) + ticks(fields, 13, 14)
        switches.update({(pid, tid): n for tid, (n, _) in tasks.items()})
    return cpu, switches


def switches_between(before, after):
    """Switches of the threads alive at the end, since the start (all of a
    thread's if it is new, or a later one reusing its ID)."""
    return sum(n - before.get(task, 0) if n >= before.get(task, 0) else n
               for task, n in after.items())


@dataclasses.dataclass
class Look:
    """Memory and tasks of process trees at one moment."""
    rss_kib: int = 0  # resident set, summed over the processes: pages they
    #                   share (a forked worker's, until it writes them) count
    #                   in each, as top adds them up
    tasks: int = 0  # processes + threads


def look(pids):
    """A Look at the processes pids (tree_pids()); gone ones count 0."""
    seen = Look()
    for fields in filter(None, map(processes.stat_fields, pids)):
        seen.rss_kib += int(fields[21]) * PAGE_KIB
        seen.tasks += int(fields[17])
    return seen


class Sampler:
    """Peak resident memory and tasks of process trees while a run lasts.
    The first look (at once, before the run) is the idle baseline; then a
    thread looks again every SAMPLE_MIN_GAP seconds or SAMPLE_DUTY times as
    long as a look takes, whichever is longer; stop() takes the last look.
    `samples` counts the looks."""

    def __init__(self, pids):
        self.pids = pids
        self.baseline = look(tree_pids(pids))
        self.peak = dataclasses.replace(self.baseline)
        self.samples = 1
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self):
        now = look(tree_pids(self.pids, self.peak.tasks))
        self.peak.rss_kib = max(self.peak.rss_kib, now.rss_kib)
        self.peak.tasks = max(self.peak.tasks, now.tasks)
        self.samples += 1

    def _loop(self):
        while not self._done.is_set():
            began = time.monotonic()
            self.sample()
            took = time.monotonic() - began
            self._done.wait(max(SAMPLE_MIN_GAP, SAMPLE_DUTY * took))

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._done.set()
        self._thread.join()
        self.sample()


def reaped_children_cpu():
    """CPU seconds (user + system) of every child we have reaped: taken
    around one client run, the client's own (ab, or wrk with all its
    threads), which is our child and reaped when it ends."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class RunCost:
    """What one client run cost, measured around it:

        with RunCost(server_pids, redis_pid) as cost:
            ...run the client...
        deliver(cost.results(complete, concurrency), run)

    server_pids: the server's processes here (each instance's), measured
    with their trees; redis_pid: Redis's, if here. Either may be left out
    (empty, None) when it runs on another host: its results are then None.
    The client's CPU is that of the children reaped meanwhile, so only the
    client may be reaped inside the `with`."""

    def __init__(self, server_pids, redis_pid=None):
        self.server_pids = list(server_pids)
        self.redis_pid = redis_pid
        self.sampler = None

    def __enter__(self):
        if self.server_pids:
            self.server = cpu_and_switches(tree_pids(self.server_pids))
            self.sampler = Sampler(self.server_pids).start()
        self.redis_cpu = self.redis_so_far()
        self.client_cpu = reaped_children_cpu()
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.began
        self.client_cpu = reaped_children_cpu() - self.client_cpu
        if self.redis_cpu is not None:
            now = self.redis_so_far()
            self.redis_cpu = None if now is None else now - self.redis_cpu
        if self.sampler:
            self.sampler.stop()
            cpu, switches = cpu_and_switches(
                tree_pids(self.server_pids, self.sampler.peak.tasks))
            self.server = (cpu - self.server[0],  # < 0: the server died
                           switches_between(self.server[1], switches))

    def redis_so_far(self):
        """Redis's CPU seconds so far (threads included); None if it is not
        here or has gone."""
        if not self.redis_pid or not processes.stat_fields(self.redis_pid):
            return None
        return cpu_and_switches([self.redis_pid])[0]

    def percent(self, seconds):
        """CPU seconds over the run as % of one core."""
        if seconds is None or seconds < 0 or self.seconds <= 0:
            return None
        return round(100 * seconds / self.seconds, 1)

    def results(self, complete, concurrency):
        """runs.csv's cost columns for a run that completed `complete`
        requests at `concurrency` clients; None where not measured."""
        found = {"client_cpu_pct": self.percent(self.client_cpu),
                 "redis_cpu_pct": self.percent(self.redis_cpu)}
        if not self.sampler:
            return found
        cpu, switches = self.server
        peak, baseline = self.sampler.peak, self.sampler.baseline
        found.update(peak_rss_kib=peak.rss_kib, peak_tasks=peak.tasks,
                     kib_per_conn=round((peak.rss_kib - baseline.rss_kib)
                                        / concurrency, 1),
                     server_cpu_pct=self.percent(cpu))
        if complete and cpu >= 0:
            found.update(server_us_per_req=round(1e6 * cpu / complete, 1),
                         switches_per_req=round(switches / complete, 2))
        return found


# ===== Idle keep-alive connections beside the load =====

IDLE_WAIT = 5.0  # seconds for the idle connections' replies, at most: the
#                  servers close a connection idle for 5 s, so the run must
#                  start soon after
IDLE_BATCH = 500  # connections opened before looking at the replies


class IdleConnections:
    """count keep-alive connections to address:port, each of which has sent
    one request (`GET path HTTP/1.1`) and then stays silent, as a browser's
    between two pages. Held while the `with` lasts:

        with IdleConnections(address, port, 10000, "/") as idle:
            ...run the client...
        idle.answered, idle.held

    The replies are read (for at most IDLE_WAIT seconds) so that the server
    has accepted and served them before the run. answered: connections that
    got a reply; held: those the server had not closed when the `with`
    ended. Sockets are non-blocking and never inherited by the client."""

    def __init__(self, address, port, count, path):
        self.where = (address, port)
        self.count = count
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {address}:{port}\r\n"
                        "\r\n").encode()
        self.socks = {}  # fd: socket
        self.answered = self.held = 0

    def __enter__(self):
        with selectors.DefaultSelector() as sel:
            deadline = time.monotonic() + IDLE_WAIT
            while len(self.socks) < self.count:
                self.open(sel, min(IDLE_BATCH, self.count - len(self.socks)))
                self.serve(sel, 0)
            while self.answered < len(self.socks) and \
                    time.monotonic() < deadline:
                self.serve(sel, deadline - time.monotonic())
        return self

    def open(self, sel, n):
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(self.where)  # EINPROGRESS; writable once connected
            self.socks[s.fileno()] = s
            sel.register(s, selectors.EVENT_WRITE)

    def serve(self, sel, timeout):
        """Send each connected socket its request, read what replies."""
        for key, events in sel.select(max(timeout, 0)):
            s = key.fileobj
            if events & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sel.unregister(s)  # refused: never opened
                    continue
                s.send(self.request)  # a few bytes: the buffer takes them
                sel.modify(s, selectors.EVENT_READ)
            elif self.drain(s):
                self.answered += 1
                sel.unregister(s)  # the rest stays in its buffer

    @staticmethod
    def drain(s):
        """Read what is there: True if anything was, None if closed."""
        got = False
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return None
                got = True
        except BlockingIOError:
            return got
        except OSError:
            return None

    def __exit__(self, *exc):
        self.held = sum(1 for s in self.socks.values()
                        if self.drain(s) is not None)
        for s in self.socks.values():
            s.close()
        self.socks.clear()


# ===== Redis =====

class Redis(processes.RedisServer):
    """processes.RedisServer at a place: on its CPUs, or on its host (its
    log and files in the place's folder there), listening on the bind
    addresses: those its clients reach it at. command() is sent to it
    wherever it is."""

    def __init__(self, workdir, maxclients=None, backlog=None, place=None,
                 bind=(LOCAL_ADDRESS,)):
        self.place = place or Place()
        super().__init__(workdir, maxclients, backlog, bind,
                         port=free_port(self.place))
        self.address = self.place.address

    def launch(self, argv):
        return self.place.start(argv, self.workdir / "redis.log")

    def folder(self):
        return self.place.folder(self.workdir)

    def where(self):
        return self.place.where()


# ===== The servers and nginx =====

def start_server(name, redis_port, log_path, label=None, place=None,
                 redis_address=LOCAL_ADDRESS):
    """./NAME port redis-address redis-port from the repo root, its output
    appended to log_path (after a line `--- label, port N ---` if label is
    given); returns (process, port) once it has printed its listening line
    (on another host: once its port accepts). The servers print it after
    listen(): it accepts from then on. If it does not come up it is stopped,
    and StartError says why."""
    place = place or Place()
    port = free_port(place)
    banner = f"--- {label}, port {port} ---\n" if label else ""
    before = log_path.stat().st_size if log_path.exists() else 0
    proc = place.start([f"./{name}", str(port), redis_address,
                        str(redis_port)], log_path, banner,
                       unset=["ZEROHTTPD_LOG"])  # logging must never be
    #                                                what we measure
    line = f"listening on port {port}\n".encode()

    def listening():
        if place.host:
            return accepts(port, place.address)
        with open(log_path, "rb") as log:
            log.seek(before)  # read only what this instance prints
            return line in log.read()

    try:
        wait_until(listening, proc, f"./{name}" + place.where())
    except StartError:
        stop(proc)
        raise
    return proc, port


def start_nginx(prefix, config, logs, place=None):
    """nginx -p prefix, never the system config: config(port) is the text of
    prefix/nginx.conf, listening on port; nginx's output goes to
    logs/nginx.log and its early errors to logs/nginx-error.log. With a
    remote place, the same files live in the place's folder there (the
    config is also kept in prefix, for the record). Returns (process, port)
    once it accepts."""
    place = place or Place()
    port = free_port(place)
    text = config(port)
    (Path(prefix) / "nginx.conf").write_text(text)
    prefix, logs = place.folder(prefix), place.folder(logs)
    if place.host:
        place.host.write("nginx.conf", text)
    proc = place.start(["nginx", "-p", prefix, "-c", f"{prefix}/nginx.conf",
                        "-e", f"{logs}/nginx-error.log"],
                       Path(logs) / "nginx.log")
    try:
        wait_for_port(port, proc, "nginx" + place.where(),
                      address=place.address)
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


def deliver(found, into):
    """A parser's fields: as a dict, or set as attributes of `into`."""
    if into is None:
        return found
    for field, value in found.items():
        setattr(into, field, value)
    return into


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
    return deliver(found, into)


# ===== wrk =====

WRK_FIELDS = {  # field: pattern in wrk's report
    "complete": r"^\s*(\d+) requests in ",
    "connect": r"^\s*Socket errors: connect (\d+),",
    "receive": r"^\s*Socket errors: .* read (\d+),",
    "write": r"^\s*Socket errors: .* write (\d+),",
    "timeouts": r"^\s*Socket errors: .* timeout (\d+)$",
    "non2xx": r"^\s*Non-2xx or 3xx responses: (\d+)$",
}
WRK_TIMES = {  # field: pattern of a latency, with its unit
    "mean_ms": r"^\s*Latency\s+([\d.]+)(us|ms|s|m|h)\s",
    "p50_ms": r"^\s*50%\s+([\d.]+)(us|ms|s|m|h)$",
    "p99_ms": r"^\s*99%\s+([\d.]+)(us|ms|s|m|h)$",
    "p999_ms": r"^\s*99\.9%\s+([\d.]+)(us|ms|s|m|h)$",  # WRK_P999_SCRIPT's
}
# wrk -s FILE: --latency stops at 99%; this prints 99.9% after the report,
# in the same form. It only adds done(): the requests are wrk's own.
WRK_P999_SCRIPT = """\
done = function(summary, latency, requests)
  io.write(string.format("    99.9%%  %.2fus\\n", latency:percentile(99.9)))
end
"""
WRK_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_wrk(text, into=None):
    """wrk's report (run with --latency) as a dict with parse_ab()'s names:
    complete, rps, non2xx ("Non-2xx or 3xx responses": in fact status 400
    and above), the socket errors connect, receive (wrk's "read"), write
    and timeouts, failed (their sum), and the latencies in ms (p999_ms
    if run with -s and WRK_P999_SCRIPT). With `into`, set them as its
    attributes and return it instead."""
    found = {"failed": 0}
    for field, pattern in WRK_FIELDS.items():
        match = re.search(pattern, text, re.M)
        if match:
            found[field] = int(match.group(1))
    for field in ("connect", "receive", "write", "timeouts"):
        found["failed"] += found.get(field, 0)
    for field, pattern in WRK_TIMES.items():
        match = re.search(pattern, text, re.M)
        if match:
            value, unit = match.groups()
            found[field] = round(float(value) * WRK_UNIT_MS[unit], 3)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    if rate:
        found["rps"] = float(rate.group(1))
    return deliver(found, into)


# ===== httperf: a fixed offered rate (open loop) =====

HTTPERF_FIELDS = {  # field: pattern in httperf's report (run with -v -v)
    "created": r"^Total: connections (\d+) ",
    "complete": r"^Total: .* replies (\d+) ",
    "ok": r"^Reply status: .*2xx=(\d+) ",
    "timeouts": r"^Errors: total \d+ client-timo (\d+) ",
    "socket_timeouts": r"^Errors: .* socket-timo (\d+) ",
    "refused": r"^Errors: .* connrefused (\d+) ",
    "receive": r"^Errors: .* connreset (\d+)$",
    "no_descriptor": r"^Errors: fd-unavail (\d+) ",
    "no_port": r"^Errors: .* addrunavail (\d+) ",
    "table_full": r"^Errors: .* ftab-full (\d+) ",
    "exceptions": r"^Errors: .* other (\d+)$",
}
HTTPERF_BIN = re.compile(r"^\s+([\d.]+)\s+(\d+)$", re.M)  # histogram line
PERCENTILES = {"p50_ms": 0.50, "p99_ms": 0.99, "p999_ms": 0.999}


def lifetime_histogram(text):
    """httperf -v -v's "Connection lifetime histogram": [(ms, count)],
    fastest first (1 ms bins, each written at its middle: 0.5, 1.5, ...)."""
    part = text.partition("Connection lifetime histogram")[2]
    part = part.partition("\nTotal:")[0]
    return sorted((float(ms), int(n)) for ms, n in HTTPERF_BIN.findall(part))


def percentile(bins, good, total, q, slower_ms):
    """The q-quantile of `total` requests: the `good` fastest of the bins
    (replies), the rest (failed, or never sent) as slower_ms."""
    rank, seen = q * total, 0
    for ms, n in bins:
        seen += min(n, good - seen)
        if seen >= rank:
            return ms
        if seen >= good:
            break
    return slower_ms


# The client's own failures: what no server can cause. A run that ends in
# one of these measured httperf, not the server (loadtest/README.md).
CLIENT_SLACK = 3.0  # seconds past --duration + --timeout: httperf stalled


def httperf_client_trouble(text, duration, timeout, seconds=None):
    """Why a run of httperf failed for the client's reasons, or None.

    Open loop, httperf should end within --duration + --timeout whatever
    the server does: it opens connections on its schedule and gives each
    at most --timeout. A run that took longer stalled in httperf itself
    (seen here: with --hog, its own port allocator spun in bind() on a
    port in TIME_WAIT for up to 60 s, then timed out every open
    connection at once). addrunavail (no local port) and ftab-full (its
    table of descriptors) are the client's limits too. fd-unavail is not:
    it means the --concurrency cap of open connections was reached, rate
    x latency, which is the server's latency."""
    raw = {field: int(match.group(1)) for field, pattern in
           HTTPERF_FIELDS.items()
           if (match := re.search(pattern, text, re.M))}
    if "created" not in raw:
        return "no report from httperf"
    if raw.get("no_port"):
        return f"client out of local ports (addrunavail {raw['no_port']})"
    if raw.get("table_full"):
        return f"client's table full (ftab-full {raw['table_full']})"
    took = first_match(r"^Total: .* test-duration ([\d.]+) s", text, None)
    took = float(took) if took else seconds
    if took is not None and took > duration + timeout + CLIENT_SLACK:
        return (f"client stalled: {took:.1f} s for a {duration} s run "
                f"(--timeout {timeout:g})")
    return None


def parse_httperf(text, timeout, offered, into=None):
    """httperf's report of a run that offered `offered` requests (one a
    connection) as a dict with parse_ab()'s names: complete (replies),
    non2xx, the errors
    (connect: refused, or no descriptor, port or table entry for a new
    connection: the client was at its cap of open connections; receive:
    reset; timeouts; exceptions: other) and failed (their sum); rps and
    achieved_rps (2xx replies per second of the run), mean_ms, and p50,
    p99, p99.9 over every request offered, a failed one counting as
    `timeout` seconds (slower than any reply). With `into`, set them as
    its attributes and return it instead."""
    raw = {}
    for field, pattern in HTTPERF_FIELDS.items():
        match = re.search(pattern, text, re.M)
        if match:
            raw[field] = int(match.group(1))
    found = {key: raw[key] for key in ("complete", "receive", "exceptions")
             if key in raw}
    found["connect"] = sum(raw.get(key, 0) for key in (
        "refused", "no_descriptor", "no_port", "table_full"))
    found["timeouts"] = raw.get("timeouts", 0) + raw.get("socket_timeouts", 0)
    found["failed"] = sum(found[key] for key in (
        "connect", "receive", "timeouts")) + found.get("exceptions", 0)
    found["non2xx"] = found.get("complete", 0) - raw.get("ok", 0)
    seconds = first_match(r"^Total: .* test-duration ([\d.]+) s", text, None)
    if seconds and float(seconds) > 0 and "ok" in raw:
        found["rps"] = found["achieved_rps"] = round(
            raw["ok"] / float(seconds), 1)
    mean = first_match(r"^Connection time \[ms\]: min \S+ avg ([\d.]+)",
                       text, None)
    if mean:
        found["mean_ms"] = float(mean)
    # a request not sent (no descriptor: at the cap) may be left out of
    # httperf's count of connections; it was offered all the same
    bins, total = lifetime_histogram(text), max(offered, raw.get("created", 0))
    if bins and total:
        for field, q in PERCENTILES.items():
            found[field] = percentile(bins, raw.get("ok", 0), total, q,
                                      1000.0 * timeout)
    return deliver(found, into)


# ===== The command line: build, servers, tools =====

def fail(message, status=1):
    """`PROG: message` on stderr, exit 1 (PROG: sweep, soak, event-bench);
    2 for a usage error found after the options were read."""
    print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    sys.exit(status)


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
