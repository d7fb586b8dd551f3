#!/usr/bin/env python3
"""Grader for the supervisor lab (labs/supervisor/README.md).

Each check probes one way a supervisor goes wrong: deaths that pile up
under one SIGCHLD (it replaces one), a replacement that is not recorded in
its slot (it is not replaced in turn, nor stopped), a replacement forked
unlike the first workers (a different signal mask, or one that does not
serve), a supervisor that blocks (it never takes SIGTERM, or forks
inside its reap loop while each new worker dies at once), and one that
loses a death: behind a stopped worker, during a fork, behind a failed
fork, when its replacement fails as it starts, or on its way back to its
wait; and one whose memory grows with every death. Counts, never speeds;
every wait is generous, but a supervisor never sleeps: SIGTERM is taken
within 1 s while fork() fails or workers fail as they start, a death is
reaped while fork() fails, and a failed fork is not retried in a
near-spin."""

import contextlib
import fcntl
import mmap
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

from grading import (Grader, HeldClients, Unmet, _strace,  # labs/
                     build_shim,
                     cpu_seconds, failing, get, heap_blocks, live_children,
                     seconds, slowed, status_field, stopped, wait_for,
                     zombie_children)
from processes import SUMMARY_RE, descendants  # tests/, on grading's path

WORKERS = 4
# A bigger pool, most of it dying at once: more deaths behind one SIGCHLD
# than a fixed batch of 32, 64, 128, 256, 512 or 1024 holds (the pool may
# be up to 4096, MAX_WORKERS: every dead one must be reaped).
CROWD = 2200
DYING = 2100  # more than a fixed batch of 2048 too
# many_die last: the biggest pool, MAX_WORKERS, all of it dead behind one
# SIGCHLD while every fork() fails (an LD_PRELOAD shim: no refill, so no
# 4096 more lives to fork and stop): every one must be reaped in that call
# (a 0-terminated list of MAX_WORKERS, reaping capped at 4095 for its
# terminator, left one zombie; 2100 of 2200 passed any cap from 2101 up).
ALL_DIE = 4096
# ...at most CROWDS_AT_ONCE such pools on the machine at once (a file lock
# per slot in the temp dir, across gradings): make test grades 8 at once,
# and 8 pools of 4096 are pid_max (32768) on the CI machine (2 of 4096
# and 6 of CROWD, 2200, are 21,400).
CROWDS_AT_ONCE = 2
# many_die then makes this many starts fail in a row in one slot (each a
# SIGCHLD, each a call with n = CROWD): a call that leaks its array of n
# dead (4 * 2200 bytes) leaks 3.5 MB; the supervisor's data (VmData) may
# grow by LEAK_SLACK_KB at most (the reference: 0). (400 starts and a slack
# of 1024 kB cost 250 lives more in every grading for the same verdicts.)
LEAK_STARTS = 150
LEAK_SLACK_KB = 512
# ...and the heap blocks it holds (counted by grading.heap_blocks' shim)
# may grow by LEAK_SLACK_BLOCKS at most: a list of the dead realloc()ed on
# each call and never freed is one block a call, 32 bytes, 150 blocks over
# the 150 calls (5 kB: far under LEAK_SLACK_KB; the reference: 0 blocks).
LEAK_SLACK_BLOCKS = 50
# ...then LEAK_BURSTS bursts of LEAK_BURST deaths, each behind one SIGCHLD
# (more than a list of the dead kept on the stack for 64 or 128 holds):
# the blocks held may grow by LEAK_BURST_SLACK at most (the reference: 0;
# a list malloc()ed for a big burst and never freed: one a burst).
LEAK_BURSTS = 2  # (the blocks are counted exactly: 2 leaked > 1)
LEAK_BURST = 130
LEAK_BURST_SLACK = 1
CROWD_REFILL = 8  # s for the 2100 forks: 2 s was too few at 8 gradings at
# once (1,230 of 2,200 back); a cap or batch leaves its dead for ever
ROUNDS = 8  # generations of replacements, each killed in turn
# The server inherits a blocked signal, as from a shell or a supervisor of
# its own: the first workers get that mask back, and so must replacements
# (an empty mask would only match the first workers' under a clean start).
INHERITED = (signal.SIGUSR2,)
# like_first also starts it with SIGCHLD blocked: a replacement mask built
# from the supervisor's own mask minus SIGCHLD, SIGINT and SIGTERM (not the
# saved one) then differs from the first workers'.
LIKE_FIRST_BLOCKED = (signal.SIGUSR2, signal.SIGCHLD)
MASK_SET = 10  # s a child may take to set its mask after its fork (a wait
# that ends as soon as it has)
DEATHS = {"SIGTERM (it exits normally, status 0)": signal.SIGTERM,
          "SIGSEGV (a crash)": signal.SIGSEGV,
          "SIGKILL": signal.SIGKILL}
WATCH = ("watch: ZEROHTTPD_WORKERS=4 ./preforked 8000 & kill -9 "
         "$(pgrep -P $! | head -3); ps -o pid,stat --ppid $!")
STARTS_FAIL = 15  # replacements in a row that fail as they start (more
# than a crash-loop guard that gives a slot up after 10 young deaths)
START_DELAY = 0.15  # s each fork() of the supervisor returns late then
STARTS_FAIL_RUN = 5000  # last, at full speed, this many in a row in one
# slot (more than a guard that gives a slot up after 20, 50, 100, 1000,
# 2000, 2048 or MAX_WORKERS, 4096: "never" has no number, and a guard
# above the number the check once drove, 1500, then 4000, passed it; the
# reference takes about 1.5 s for 4000; a guard that counts a death as
# young under 1 s may miss one at a load of 60 (a failing start not run
# for a second), which ends its run: 5000 leaves a run of 2500 in a row
# on one side of any one such miss)
STARTS_FAIL_STALL = 5  # s without one more failing start: the slot is
# given up (the wait for the STARTS_FAIL_RUN ends there)
# Meanwhile /proc/PID/wchan of the supervisor is looked at every 0.05 s:
# seen asleep in a pause (nanosleep, poll or select with a timeout: a
# crash-loop "breath" before each replacement of a worker that died
# young, 5 ms of every 5.1) SLEPT_SEEN times, it fails (the reference: 0).
PAUSES = ("nanosleep", "poll", "select")
SLEPT_SEEN = 5
STARTS_FAIL_MANY = 60  # then, every worker dead, this many fail in a row
# SIGTERM is taken within this many seconds while fork() fails and while
# workers fail as they start: a supervisor never sleeps (a pause before a
# replacement, a retry of a failed fork after a pause): it would be deaf
# to SIGTERM meanwhile, and leave the other dead unreaped.
STOP_WHILE_FAILING = 1
# slow_fork_deaths: every new worker fails as it starts while each fork()
# of the supervisor returns this many seconds late (each dead long before
# its fork() returns): a supervisor that forks inside its waitpid() loop
# reaps it at the next waitpid() and forks again, for ever, never back in
# sigwait() to take SIGTERM. The reference takes SIGTERM once the fork
# under way returns: within SLOW_FORK + STOP_WHILE_FAILING.
SLOW_FORK = 0.5
EVERY_START = 10 ** 6  # failing starts asked for there: all of them
# sigint_stops then: fork() fails with ENOMEM (not EAGAIN: memory or
# cgroup pressure) for this many seconds with every worker dead before
# SIGINT, which must stop the server within STOP_WHILE_FAILING: longer than
# the 1.5 s a retry backoff doubling from 0.1 s takes to reach 1.6 s, whose
# timespec {0, 1600 ms} is invalid (sigtimedwait() fails with EINVAL at
# once: a spin of failed forks, deaf to every signal).
FORK_FAIL_LONG = 3
# fork_fails: a pool of this many, all killed while fork() fails, so that a
# pause per empty slot (a retry of a failed fork after 50 ms) adds up.
FORK_FAIL_POOL = 60
# no_orphans: each prctl() of a replacement enters this many seconds late,
# and the supervisor is killed meanwhile: the replacement must see that its
# parent is gone (getppid()) and exit.
PRCTL_DELAY = 1
# While fork() fails, the supervisor may try an empty slot again, but not
# in a loop: at most this many fork() calls in the second that fork()
# fails with every worker dead (a retry per slot at most every 0.1 s).
FORKS_WHILE_FAILING = 50
# stopped_worker: a worker stopped and continued this many times, each stop
# and each continue a SIGCHLD that brings no death (the supervisor's
# disposition of SIGCHLD is SIG_DFL, without SA_NOCLDSTOP): the heap blocks
# the supervisor holds may grow by STOP_LEAK_SLACK at most (the reference:
# 0; a list of the dead malloc()ed on each call and not freed on the
# early return of a call that reaped nobody: one a call, up to 40).
STOP_CYCLES = 20
STOP_LEAK_SLACK = 4
# ...and its data (VmData) by STOP_DATA_SLACK_KB at most: a list mmap()ed
# on each call (not the heap: the block count misses it) and not unmapped
# on that early return is a page a call: 88 to 136 kB seen, 80 if the
# stop and continue of each cycle came as one SIGCHLD (the reference: 0).
STOP_DATA_SLACK_KB = 32
# fork_fails: after the first three deaths, this many more workers die one
# at a time while fork() fails, each its own call of replace_workers():
# the heap blocks held may grow by FORK_FAIL_LEAK_SLACK at most over those
# 2 + FORK_FAIL_SINGLES calls (the reference: 0; a list freed on the
# normal path but not on a return after a failed fork(): one a call, 14).
FORK_FAIL_SINGLES = 12
FORK_FAIL_LEAK_SLACK = 4
# replaced: then the supervisor's malloc() fails (an LD_PRELOAD shim, while
# a flag file exists: memory pressure, the moment fork() fails with ENOMEM
# too) and a worker is killed: it must still be reaped and replaced.
MALLOC_FAILS = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static pid_t first;  /* the supervisor: the process that loaded us */
static const char *flag;
__attribute__((constructor)) static void init(void)
{
    first = getpid();
    flag = getenv("MALLOC_FAILS");
}
static int failing(void)
{
    if (flag && getpid() == first && access(flag, F_OK) == 0) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}
void *malloc(size_t n) { return failing() ? NULL : __libc_malloc(n); }
void *calloc(size_t k, size_t n)
{
    return failing() ? NULL : __libc_calloc(k, n);
}
void *realloc(void *p, size_t n)
{
    return failing() ? NULL : __libc_realloc(p, n);
}
"""
# replaced last: in a pool of MALLOC_POOL, MALLOC_BURST workers die behind
# one SIGCHLD while malloc() still fails: every one must be reaped and
# replaced in that call (a fallback that handles one death, or a list kept
# on the stack for 64 or 128 that stops reaping when it cannot grow, leaves
# zombies and empty slots until another worker dies).
MALLOC_POOL = 140
MALLOC_BURST = 130
# many_die last: the supervisor's fork() fails (EAGAIN) while a flag file
# exists, in the supervisor alone.
FORK_FAILS = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
static pid_t first;  /* the supervisor: the process that loaded us */
static const char *flag;
static pid_t (*real_fork)(void);
__attribute__((constructor)) static void init(void)
{
    first = getpid();
    flag = getenv("FORK_FAILS");
    real_fork = (pid_t (*)(void))dlsym(RTLD_NEXT, "fork");
}
pid_t fork(void)
{
    if (flag && getpid() == first && access(flag, F_OK) == 0) {
        errno = EAGAIN;
        return -1;
    }
    return real_fork();
}
"""
# bursts then: the next fork() alone fails, and returns this many seconds
# late (a fork under memory pressure is slow to fail)
ONCE_FAILING_DELAY = 0.3
DRAIN_DELAY = 1.5  # s each rt_sigtimedwait() enters late (death_after_reap)
# A shim (LD_PRELOAD) that makes a worker's prctl(PR_SET_PDEATHSIG) fail
# while fewer starts have failed than the grader asked for, so that a
# worker exits with status 1 right after its fork, as a bad setting or a
# full system makes it. Two counters in a page of the file FAIL_STARTS,
# mapped shared by the supervisor (its workers inherit the mapping):
# asked, written by the grader alone, and taken, raised by the workers
# with a compare-and-swap (each count fails exactly one start). (It was a
# file read under flock() at every start, and prctl() found by dlsym() in
# every child: a tenth of the CPU of a worker's life, 4,600 lives in
# many_die, 4,000 in fails_at_start.)
FAIL_STARTS = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
static long none[2], *count = none;  /* asked, taken */
__attribute__((constructor)) static void share(void)
{
    const char *path = getenv("FAIL_STARTS");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0)
        return;
    long *shared = mmap(NULL, 2 * sizeof *shared, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    close(fd);
    if (shared != MAP_FAILED)
        count = shared;
}
static int take_one(void)
{
    long taken = __atomic_load_n(&count[1], __ATOMIC_ACQUIRE);
    while (taken < __atomic_load_n(&count[0], __ATOMIC_ACQUIRE))
        if (__atomic_compare_exchange_n(&count[1], &taken, taken + 1, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    return 0;
}
int prctl(int option, ...)
{
    unsigned long arg[4];
    va_list ap;
    va_start(ap, option);
    for (int k = 0; k < 4; k++)
        arg[k] = va_arg(ap, unsigned long);
    va_end(ap);
    if (option == PR_SET_PDEATHSIG && take_one()) {
        errno = EPERM;
        return -1;
    }
    return (int)syscall(SYS_prctl, option, arg[0], arg[1], arg[2], arg[3]);
}
"""


class FailingStarts:
    """The FAIL_STARTS shim, built in the check's work dir: env for the
    server; fail(n): the next n starts fail; left(): how many are still to
    fail."""

    def __init__(self, lab):
        shim = build_shim(lab, "fail_starts", FAIL_STARTS)
        self.count = lab.workdir / "fail-starts"
        self.count.write_bytes(bytes(mmap.PAGESIZE))
        with self.count.open("r+b") as file:
            self.view = mmap.mmap(file.fileno(), mmap.PAGESIZE)
        self.env = {"LD_PRELOAD": str(shim), "FAIL_STARTS": str(self.count)}

    def _counts(self):
        return struct.unpack_from("qq", self.view)  # asked, taken

    def fail(self, n):
        asked, taken = self._counts()
        # asked is ours alone to write; an aligned 8-byte store
        struct.pack_into("q", self.view, 0, max(asked + n, taken))

    def left(self):
        asked, taken = self._counts()
        return max(asked - taken, 0)


grader = Grader("supervisor")


def pool(lab, workers=WORKERS, env=None, blocked=INHERITED):
    """A server with `workers` workers, all started (3 s, or a second a
    200 for a crowd: 2,200 forks at 8 gradings at once took over 3 s)."""
    server = lab.start(env={"ZEROHTTPD_WORKERS": str(workers), **(env or {})},
                       blocked=blocked)
    started = polled(lambda: pool_now(server.pid, workers),
                     lambda w: len(w) == workers, max(3, workers / 200),
                     workers)
    if len(started) != workers:
        started = live_children(server.pid)
    lab.expect(len(started) == workers, f"{len(started)} workers at start "
               f"(ZEROHTTPD_WORKERS={workers}); watch: ps -o pid,stat --ppid "
               "PID")
    return server, started


def polled(measure, wanted, limit, workers):
    """grading.wait_for() for a pool of `workers`: the first looks 0.05 s
    apart, then, for a crowd, half as far again each time up to 0.5 s (a
    look at 2,200 children costs a few ms of CPU: the 160 looks of a wait
    of 8 s for a pool that never comes back were a fifth of a failing
    grading's CPU)."""
    deadline = time.monotonic() + seconds(limit)
    value, pause = measure(), 0.05
    while not wanted(value) and time.monotonic() < deadline:
        time.sleep(pause)
        if workers > 200:
            pause = min(pause * 1.5, 0.5)
        value = measure()
    return value


def children(pid):
    """pid's children, zombies too, from /proc/PID/task/*/children: one
    read a thread, not one a child (a crowd of 2,200 read ten times a
    second was most of many_die's CPU)."""
    kids = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids += map(int, f.read().split())
    return kids


def last_line(text):
    """The last line of a server's stderr that says something."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def stat_head(pid):
    """/proc/PID/stat after the command name (state, ppid, ...), read with
    a bare os.read(): grading.child_stats() costs three times as much for
    a crowd. None once pid is reaped."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 512).decode()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text[text.rfind(")") + 2:]


def child_states(pid):
    """{child: state letter} for pid's children (zombies: "Z")."""
    states = {}
    for kid in children(pid):
        fields = (stat_head(kid) or "").split(None, 2)
        if len(fields) > 1 and int(fields[1]) == pid:
            states[kid] = fields[0]
    return states


def pool_now(pid, workers, victims=()):
    """live_children(pid), read child by child only once the cheap list
    (zombies too) looks like a pool of `workers` without a victim in it;
    else that list."""
    kids = children(pid)
    if len(kids) != workers or set(kids) & set(victims):
        return kids
    return [p for p, state in child_states(pid).items() if state != "Z"]


def refilled(lab, server, victims, what, workers=WORKERS, limit=2):
    """The pool is `workers` live workers again within `limit` seconds,
    none of them a victim, and no zombie: its workers' PIDs. (Polled on
    the cheap list of children; each child's state is read only once that
    list looks whole.)"""
    deadline = time.monotonic() + seconds(limit)
    victims = set(victims)
    pause = 0.05  # (growing for a crowd: see polled())
    while True:
        kids = children(server.pid)
        whole = len(kids) == workers and not set(kids) & victims
        late = time.monotonic() > deadline
        if whole or late:
            stats = child_states(server.pid)
            alive = [p for p, state in stats.items() if state != "Z"]
            zombies = [p for p, state in stats.items() if state == "Z"]
            if late or (len(alive) == workers and not set(alive) & victims
                        and not zombies):
                break
        time.sleep(min(pause, max(0.01, deadline - time.monotonic())))
        if workers > 200:
            pause = min(pause * 1.5, 0.5)
    lab.expect(len(alive) == workers and not set(alive) & victims,
               f"{len(alive)} live workers of {workers} {limit:g} s after "
               f"{what}; "
               f"{WATCH}")
    lab.expect(not zombies, f"{len(zombies)} zombie workers after {what}; "
               f"{WATCH}")
    return alive


def all_dead(victims):
    """Whether every victim is dead (a zombie, or reaped): read from the
    last killed back, stopping at the first still running."""
    for pid in reversed(victims):
        head = stat_head(pid)
        if head is not None and head[:1] != "Z":  # None: reaped
            return False
    return True


@contextlib.contextmanager
def halted(pid):
    """grading.stopped(pid), once the stop has taken: SIGSTOP is only
    pending until the process next runs, and a supervisor woken from
    sigwait() for it may take a SIGCHLD first, so deaths that come before
    the stop is seen (State T, or t under strace) would not all pile up."""
    with stopped(pid):
        wait_for(lambda: status_field_text(pid, "State")[:1],
                 lambda state: state in ("T", "t"), limit=2)
        yield


def kill(pids, sig=signal.SIGKILL):
    for pid in pids:
        os.kill(pid, sig)


def die_behind_one_sigchld(server, victims):
    """victims killed while the supervisor is halted, each a zombie before
    it runs again: their deaths pile up behind one SIGCHLD (signals do not
    queue)."""
    with halted(server.pid):
        kill(victims)
        wait_for(lambda: len(zombie_children(server.pid)),
                 lambda n: n >= len(victims), limit=5)


def stops(lab, server):
    """SIGTERM: the supervisor must take it and stop cleanly."""
    try:
        server.terminate(timeout=seconds(5))
        server.check_exit()
    except AssertionError as error:
        server.cleanup()  # SIGKILL it and its workers now, not in 10 s
        raise Unmet(f"no clean stop ({str(error)[:120]}): a supervisor stuck "
                    "in a blocking waitpid() never takes SIGTERM, one that "
                    "lost a worker's PID never stops it; watch: strace -p "
                    "PID, then kill -TERM PID") from None


def serves_beside_held(lab, server):
    """WORKERS clients at once, WORKERS - 1 of them busy keep-alive ones
    that hold their workers: every one must be served, each by its own
    worker."""
    with HeldClients(server.port, WORKERS - 1, timeout=3) as held:
        served = held.answered  # each held client's first answer
        try:
            status, _ = get(server.port, "/", timeout=3)
            served += status == 200
        except (socket.timeout, ConnectionError):
            pass
    lab.expect(served == WORKERS, f"{served} of {WORKERS} clients at once "
               f"served (each waited {seconds(3):.0f} s) by a refilled pool "
               f"of {WORKERS} ({WORKERS - 1} of them busy keep-alive): a "
               "replacement that does not accept (forked, but not as a "
               "worker?); watch: curl -m 5 http://127.0.0.1:8000/ with "
               "ZEROHTTPD_WORKERS=1 after kill -9 of the worker")


@grader.check(5, "a worker killed with SIGKILL is replaced within 2 s; "
              "also while the supervisor's malloc() fails, one death or "
              f"{MALLOC_BURST} behind one SIGCHLD")
def replaced(lab):
    flag = lab.workdir / "malloc-fails"
    shim = build_shim(lab, "malloc_fails", MALLOC_FAILS)
    server, workers = pool(lab, MALLOC_POOL, env={"LD_PRELOAD": str(shim),
                                                  "MALLOC_FAILS": str(flag)})
    kill(workers[:1])
    workers = refilled(lab, server, workers[:1], "SIGKILL to one worker",
                       MALLOC_POOL)
    # Then the supervisor's malloc() fails (memory pressure: the moment
    # fork() fails with ENOMEM too), and one more worker is killed: a
    # failed malloc() (of a list of the dead) excuses nothing, the death
    # is reaped and its slot refilled in that call; a call that returns
    # at once has taken the SIGCHLD, and nothing calls it again until
    # another worker dies: a zombie and a short pool meanwhile.
    flag.touch()
    try:
        kill(workers[:1])
        workers = refilled(
            lab, server, workers[:1], "SIGKILL to one worker while the "
            "supervisor's malloc() failed (ENOMEM, an LD_PRELOAD shim: "
            "memory pressure, as when fork() fails with ENOMEM): a "
            "replace_workers() that gives up when malloc() of a list of the "
            "dead fails has taken the SIGCHLD, and nothing calls it again "
            "until another worker dies; without the list, empty each slot "
            "as waitpid() returns its PID, then refill (or use a static "
            "array of MAX_WORKERS); watch: an LD_PRELOAD malloc() that "
            "returns NULL in the supervisor while a file exists, kill -9 a "
            "worker, ps -o pid,stat --ppid PID", MALLOC_POOL)
        # Then, malloc() still failing, MALLOC_BURST die behind one SIGCHLD:
        # a call that cannot have its list must still reap every one.
        victims = workers[:MALLOC_BURST]
        die_behind_one_sigchld(server, victims)
        refilled(lab, server, victims, f"{MALLOC_BURST} workers of "
                 f"{MALLOC_POOL} died behind one SIGCHLD (the supervisor "
                 "stopped meanwhile) while its malloc() failed (ENOMEM, an "
                 "LD_PRELOAD shim): every dead one must be reaped and "
                 "replaced in that call, the list of the dead or not (a "
                 "fallback that handles one death, or a list on the stack "
                 "for 64 that stops reaping when malloc() cannot grow it, "
                 "leaves zombies and empty slots, and that SIGCHLD is "
                 "taken); without the list, empty each slot as waitpid() "
                 "returns its PID; watch: the malloc() shim above with "
                 "ZEROHTTPD_WORKERS=140, kill -STOP PID, kill -9 of 130 "
                 "workers, kill -CONT PID", MALLOC_POOL, 4)
    finally:
        flag.unlink()


@grader.check(10, f"{WORKERS - 1} workers die at once (one SIGCHLD): all "
              "replaced; also when the next fork() fails (EAGAIN, then "
              "ENOMEM), all but its slot")
def bursts(lab):
    server, workers = pool(lab)
    victims = workers[:WORKERS - 1]
    die_behind_one_sigchld(server, victims)
    workers = refilled(lab, server, victims, f"{len(victims)} workers died "
                       "while the supervisor could not run (one SIGCHLD "
                       "stood for all)")
    # Again, but the next fork() alone fails (a transient EAGAIN or
    # ENOMEM), and takes ONCE_FAILING_DELAY s to: the slot whose fork failed
    # may stay empty, every other dead worker's slot must still be tried in
    # that call (a refill loop that stops at the first failure leaves them
    # empty until some later death), and the supervisor must then be idle
    # and take SIGTERM (a retry timeout reckoned from the start of a call
    # that took longer than it is negative: sigtimedwait() fails with
    # EINVAL at once, for ever, a spin deaf to every signal).
    victims = workers[:WORKERS - 1]
    live, zombies = burst_one_fork_failing(
        server, victims, "inject=clone:error=EAGAIN:delay_exit="
        f"{int(seconds(ONCE_FAILING_DELAY) * 1e6)}:when=1",
        ONCE_FAILING_DELAY + 2)
    lab.expect(len(live) >= WORKERS - 1 and not zombies, f"{len(live)} live "
               f"workers of {WORKERS} (and {len(zombies)} zombies) "
               f"{ONCE_FAILING_DELAY + 2:g} s after {len(victims)} died "
               "behind one SIGCHLD while the next fork() alone failed "
               "(EAGAIN, once: strace -e inject=clone:error=EAGAIN:when=1): "
               "a failed fork() excuses its own slot only; every other "
               "empty slot is still tried in that call (a loop that stops "
               "or returns at the first failure leaves them empty until "
               "some later death); watch: strace -e inject=clone:error="
               "EAGAIN:when=1 -p PID, kill -STOP PID, kill -9 three "
               "workers, kill -CONT PID, ps -o pid,stat --ppid PID")
    before, start = cpu_seconds(server.pid), time.monotonic()
    time.sleep(seconds(0.5))
    used = (cpu_seconds(server.pid) - before) / (time.monotonic() - start)
    code = server.proc.poll()
    if code is not None:
        said = last_line(server.stderr())
        raise Unmet(f"the supervisor exited ({code}) before SIGTERM, after "
                    f"{len(victims)} workers died behind one SIGCHLD while "
                    f"the next fork() alone failed (its stderr: {said!r}); "
                    "meanwhile it was stopped and continued (SIGSTOP, "
                    "SIGCONT: the deaths pile up) and traced by strace (the "
                    "failing fork()): a sigtimedwait() woken by either "
                    "returns -1 with EINTR, no signal taken: that is no "
                    "error, wait again (as sigwait() does), and neither is "
                    "a failed fork(); EAGAIN is its timeout; watch: strace "
                    "-e inject=clone:error=EAGAIN:when=1 -p PID, kill -STOP "
                    "PID, kill -9 three workers, kill -CONT PID")
    try:
        server.terminate(timeout=seconds(STOP_WHILE_FAILING))
        server.check_exit()
    except AssertionError as error:
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(f"no clean stop within {seconds(STOP_WHILE_FAILING):.0f}"
                    f" s of SIGTERM ({str(error)[:100]}) after one fork() "
                    f"had failed, taking {ONCE_FAILING_DELAY:g} s (the "
                    f"supervisor used {used:.0%} of a CPU meanwhile): if it "
                    "spun, a "
                    "retry timeout computed as retry_at - now from a "
                    "retry_at taken at the start of that call is negative "
                    "once the call took longer than the retry period; "
                    "sigtimedwait() then fails with EINVAL at once, takes "
                    "no signal, and the loop spins for ever; clamp it (a "
                    "timeout already past is {0, 0}: retry now); watch: "
                    "strace -e inject=clone:error=EAGAIN:delay_exit=300000:"
                    "when=1 -p PID, kill -9 a worker, then top -p PID and "
                    "kill -TERM PID") from None
    # Last, on a fresh server, the same burst while the next fork() alone
    # fails with ENOMEM (memory or a cgroup's limit, for a moment): any
    # error of fork() excuses its own slot only (a loop that stops at an
    # ENOMEM, "memory is gone, more forks are pointless", leaves the
    # others empty until some later death).
    server, workers = pool(lab)
    victims = workers[:WORKERS - 1]
    live, zombies = burst_one_fork_failing(
        server, victims, "inject=clone:error=ENOMEM:when=1", 2)
    lab.expect(len(live) >= WORKERS - 1 and not zombies, f"{len(live)} live "
               f"workers of {WORKERS} (and {len(zombies)} zombies) 2 s after "
               f"{len(victims)} died behind one SIGCHLD while the next fork() "
               "alone failed with ENOMEM (once: strace -e inject=clone:"
               "error=ENOMEM:when=1): whatever its error (EAGAIN, ENOMEM), a "
               "failed fork() excuses its own slot only; every other empty "
               "slot is still tried in that call (ENOMEM may pass at once: a "
               "loop that stops at it leaves the others empty until some "
               "later death); watch: strace -e inject=clone:error=ENOMEM:"
               "when=1 -p PID, kill -STOP PID, kill -9 three workers, kill "
               "-CONT PID, ps -o pid,stat --ppid PID")


def burst_one_fork_failing(server, victims, inject, limit):
    """The victims die behind one SIGCHLD while strace injects `inject`
    into the supervisor's clone(): (the live workers but the victims, the
    zombies) once all but one slot are filled again and no zombie is left,
    or as they were `limit` s later."""
    seen = []

    def burst():
        die_behind_one_sigchld(server, victims)
        seen.append(wait_for(
            lambda: (live_children(server.pid), zombie_children(server.pid)),
            lambda lz: len(lz[0]) >= WORKERS - 1 and not lz[1]
            and not set(lz[0]) & set(victims), limit=limit))

    _strace(server.pid, ["clone"], burst, "-e", inject)
    live, zombies = seen[0]
    return [p for p in live if p not in victims], zombies


@grader.check(5, f"a replacement that dies is replaced in turn, {ROUNDS} "
              "times")
def generations(lab):
    server, workers = pool(lab)
    victim = workers[-1]
    for n in range(ROUNDS):
        kill([victim])
        before = set(workers)
        workers = refilled(lab, server, [victim],
                           f"SIGKILL to worker {victim} (round {n + 1} of "
                           f"{ROUNDS}, each a replacement after the first): "
                           "is each replacement's PID kept in its slot?")
        victim = (set(workers) - before).pop()


@grader.check(10, "replacements are forked like the first workers (signal "
              "mask) and serve")
def like_first(lab):
    server, workers = pool(lab, blocked=LIKE_FIRST_BLOCKED)
    # A first worker's mask, once it has set it: once it sleeps (in
    # accept()). A child just forked has the supervisor's mask until its
    # own sigprocmask(), seconds later on a loaded machine; and the
    # supervisor's SigBlk is no yardstick: while it waits in sigwait() the
    # kernel shows its mask without the signals it waits for.
    wait_for(lambda: settled(workers[-1]), bool, limit=MASK_SET)
    mask = status_field_text(workers[-1], "SigBlk")
    kill(workers[:-1])
    fresh = refilled(lab, server, workers[:-1], f"SIGKILL to {WORKERS - 1} "
                     "workers")
    for pid in set(fresh) - set(workers):
        # A child just forked has the supervisor's mask until its own
        # sigprocmask(), a moment later (seconds on a loaded machine): wait
        # until its mask is the first workers', or it sleeps (in accept():
        # past any sigprocmask() of its own, if it has one, right or wrong)
        # or is gone.
        wait_for(lambda: status_field_text(pid, "SigBlk"),
                 lambda m: m == mask or settled(pid), limit=MASK_SET)
        got = status_field_text(pid, "SigBlk")
        lab.expect(got == mask, f"a replacement blocks signals {got}, the "
                   f"first workers {mask} (the server was started with "
                   "SIGUSR2 and SIGCHLD blocked, as a shell may start it: "
                   "not the supervisor's mask minus its own signals, the "
                   "mask it saved): fork it as "
                   "the first ones, spawn_worker() with the mask it is "
                   "given; watch: grep SigBlk /proc/PID/status")
    serves_beside_held(lab, server)


@grader.check(10, f"whatever the death ({', '.join(DEATHS)}): each worker "
              "is replaced")
def any_death(lab):
    server, workers = pool(lab)
    for (what, sig), victim in zip(DEATHS.items(), workers):
        kill([victim], sig)
        workers = refilled(lab, server, [victim], f"{what} to worker "
                           f"{victim}: replace every worker that is gone, "
                           "however it went")


@grader.check(10, "replacements die with the supervisor, as the first "
              "workers do")
def no_orphans(lab):
    server, workers = pool(lab)
    kill(workers[:2])
    fresh = refilled(lab, server, workers[:2], "SIGKILL to 2 workers")
    # Then one more is killed while every prctl() of a new child enters
    # PRCTL_DELAY s late (strace), and the supervisor is killed before its
    # replacement's prctl(PR_SET_PDEATHSIG) has run: a death signal asked
    # for once the parent is gone never comes, so the replacement must
    # check getppid() after it, as spawn_worker() does.
    late = []

    def killed_before_prctl():
        kill([fresh[0]])
        new = wait_for(lambda: [p for p in live_children(server.pid)
                                if p not in fresh], lambda n: n, limit=2)
        late.extend(new)
        time.sleep(seconds(0.2))
        os.kill(server.pid, signal.SIGKILL)  # no stop: the kernel ends them
        time.sleep(PRCTL_DELAY + 0.3)  # the delayed prctl() has entered

    _strace(server.pid, ["prctl"], killed_before_prctl, "-f", "-e",
            f"inject=prctl:delay_enter={int(PRCTL_DELAY * 1e6)}")
    fresh = list(fresh) + late
    left = wait_for(lambda: [p for p in fresh if alive(p)], lambda w: not w,
                    limit=2)
    for pid in left:  # orphans of the server we started: end them here
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    lab.expect(not left, f"{len(left)} workers still running 2 s after the "
               f"supervisor was killed with SIGKILL (of {len(fresh)}, "
               f"{len(set(fresh) - set(workers))} of them replacements): an "
               "orphan holds the port for ever (fork replacements as the "
               "first: spawn_worker(), with PR_SET_PDEATHSIG); watch: kill "
               "-9 a worker, then the supervisor, then pgrep -x preforked; a "
               "replacement whose prctl(PR_SET_PDEATHSIG) ran after the "
               "supervisor died (each prctl() delayed "
               f"{PRCTL_DELAY} s by strace) must see getppid() changed "
               "and exit)")


def settled(pid):
    """pid sleeps (a worker blocked in accept(), done with its setup) or
    is gone."""
    return status_field_text(pid, "State")[:1] in ("S", "(", "Z")


def alive(pid):
    """pid runs (not gone, not a zombie waiting for its new parent)."""
    return status_field_text(pid, "State")[:1] not in ("Z", "(")


@grader.check(10, f"{CROWD} workers, {DYING} of them die at once "
              f"(one SIGCHLD): all replaced within {CROWD_REFILL} s; "
              f"{LEAK_STARTS} deaths more, one at a time: its memory does "
              f"not grow; {ALL_DIE} workers, all die at once: all reaped")
def many_die(lab):
    try:
        crowd_dies(lab)
        with crowd_slot():
            all_die(lab)
    finally:
        # A crowd left running by a failure is stopped here, by SIGTERM
        # (the supervisor stops and reaps its workers), not by the lab's
        # cleanup, which first lists every worker's own children (2,200
        # reads) and SIGKILLs each that is left, one by one.
        for server in lab.servers:
            if server.result is None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.result = server.proc.wait(timeout=seconds(5))


def all_die(lab):
    """Last, a fresh pool of ALL_DIE (MAX_WORKERS), all of it killed while
    the supervisor is stopped, every fork() failing (FORK_FAILS): one
    SIGCHLD for 4096 deaths, none of them left a zombie."""
    flag = lab.workdir / "forks-fail"
    shim = build_shim(lab, "fork_fails", FORK_FAILS, "-ldl")
    server, workers = pool(lab, ALL_DIE, env={"LD_PRELOAD": str(shim),
                                              "FORK_FAILS": str(flag)})
    flag.touch()  # from now on every fork() of the supervisor fails
    with halted(server.pid):  # the deaths pile up; signals do not queue
        kill(workers)  # (SIGKILL: the other deaths are the crowd's above)
        polled(lambda: all_dead(workers), bool, 15, ALL_DIE)
    left = polled(lambda: children(server.pid), lambda kids: not kids,
                  CROWD_REFILL, ALL_DIE)
    lab.expect(not left, f"{len(left)} of {ALL_DIE} dead workers still "
               f"unreaped (zombies) {CROWD_REFILL} s after all {ALL_DIE} "
               f"(ZEROHTTPD_WORKERS={ALL_DIE}, MAX_WORKERS, the most a pool "
               "may be) died while the supervisor could not run (one SIGCHLD "
               "for all; every fork() failing then, an LD_PRELOAD shim): "
               "every dead worker must be reaped in that call (a list of the "
               "dead one short of MAX_WORKERS for its 0 terminator, or any "
               "other cap, leaves the rest zombies and their slots full of "
               "dead PIDs until another worker dies); watch: "
               "ZEROHTTPD_WORKERS=4096 ./preforked 8000, kill -STOP PID, kill "
               "-9 every worker, kill -CONT PID, ps -o pid,stat --ppid PID")
    server.proc.send_signal(signal.SIGTERM)  # no worker left to stop
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.result = server.proc.wait(timeout=seconds(10))


@contextlib.contextmanager
def crowd_slot(limit=300):
    """One of CROWDS_AT_ONCE slots for a pool of ALL_DIE workers, machine
    wide (a flock()ed file each in the temp dir, across gradings: 8 such
    pools at once are pid_max), waited for (asleep) at most `limit` s."""
    deadline = time.monotonic() + limit
    while True:
        for k in range(CROWDS_AT_ONCE):
            slot = open(os.path.join(tempfile.gettempdir(),
                                     f"zerohttpd-lab-crowd-{k}.lock"), "a")
            try:
                fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                slot.close()
                continue
            try:
                yield
            finally:
                slot.close()  # (and its lock)
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    yield  # waited long enough: go on without a slot


def crowd_dies(lab):
    starts = FailingStarts(lab)
    heap_env, blocks = heap_blocks(lab)  # heap blocks in use, counted
    env = {**starts.env, "LD_PRELOAD": f"{starts.env['LD_PRELOAD']} "
           f"{heap_env['LD_PRELOAD']}", **{k: v for k, v in heap_env.items()
                                          if k != "LD_PRELOAD"}}
    server, workers = pool(lab, CROWD, env=env)
    victims = workers[:DYING]
    with halted(server.pid):  # the deaths pile up; signals do not queue
        for k, victim in enumerate(victims):
            kill([victim], list(DEATHS.values())[k % len(DEATHS)])
        wait_for(lambda: all_dead(victims), bool, limit=5)
    now = refilled(lab, server, victims, f"{len(victims)} of {CROWD} workers "
                   "died while the supervisor could not run (a fixed batch, "
                   "a cap on restarts, or a pause per replacement?)", CROWD,
                   CROWD_REFILL)
    # Then one worker is killed and the next LEAK_STARTS starts fail, one
    # after another in its slot: as many SIGCHLDs, each a call of
    # replace_workers() with a pool of CROWD. Whatever it takes per call
    # (malloc() of an array of n dead) must be given back: a supervisor
    # runs for months.
    before = status_field(server.pid, "VmData")
    held = blocks()  # (the workers share the counter: they allocate none)
    starts.fail(LEAK_STARTS)
    kill(now[:1])
    # (Until all have happened: a pool whole meanwhile may hold a start
    # still to fail, and a leak measured mid-run is short; 150 starts took
    # over 10 s at a load of 200.)
    still = wait_for(starts.left, lambda n: n == 0, limit=30)
    refilled(lab, server, now[:1], f"SIGKILL to one of {CROWD} workers, "
             f"whose replacements then failed as they started, "
             f"{LEAK_STARTS} in a row ({LEAK_STARTS - still} of them "
             "happened)", CROWD, CROWD_REFILL)
    grown = status_field(server.pid, "VmData") - before
    lab.expect(grown <= LEAK_SLACK_KB, f"the supervisor's data grew by "
               f"{grown} kB (VmData; at most {LEAK_SLACK_KB}) over "
               f"{LEAK_STARTS} failing starts in a row, each a SIGCHLD, "
               f"with a pool of {CROWD}: something replace_workers() "
               "allocates on each call (an array of the dead, malloc()ed "
               "for n) is never freed, and a supervisor runs for months; "
               "use a static array, or free() it; watch: grep VmData "
               "/proc/PID/status while you kill -9 workers")
    more = blocks() - held
    lab.expect(more <= LEAK_SLACK_BLOCKS, f"the supervisor holds {more} more "
               f"heap blocks (at most {LEAK_SLACK_BLOCKS}) after "
               f"{LEAK_STARTS} failing starts in a row, each a SIGCHLD, each "
               "a call of replace_workers(): something it allocates on a call "
               "(a list of the dead, malloc()ed or realloc()ed as it grows) "
               "is never freed, a block per death, and a supervisor runs for "
               "months; free() it before returning, or use a static array; "
               "watch: valgrind --leak-check=full ./preforked 8000 while "
               "you kill -9 workers")
    # Last, LEAK_BURSTS bursts of LEAK_BURST deaths, each behind one
    # SIGCHLD (an OOM killer's or an operator's cull): a list of the dead
    # kept on the stack for a few and moved to the heap for a big burst
    # must give that back too (one block a burst, for months).
    held = blocks()
    live = pool_now(server.pid, CROWD)
    culled = []
    for n in range(LEAK_BURSTS):
        victims = live[n * LEAK_BURST:(n + 1) * LEAK_BURST]
        culled += victims
        with halted(server.pid):
            kill(victims)
            wait_for(lambda: all_dead(victims), bool, limit=5)
        wait_for(lambda: children(server.pid),
                 lambda kids: len(kids) == CROWD and not set(kids) & set(
                     victims), limit=CROWD_REFILL)
    refilled(lab, server, culled, f"{LEAK_BURSTS} bursts of {LEAK_BURST} "
             f"deaths, each behind one SIGCHLD, in a pool of {CROWD}", CROWD,
             CROWD_REFILL)
    more = blocks() - held
    lab.expect(more <= LEAK_BURST_SLACK, f"the supervisor holds {more} more "
               f"heap blocks (at most {LEAK_BURST_SLACK}) after "
               f"{LEAK_BURSTS} bursts of {LEAK_BURST} deaths, each behind one "
               "SIGCHLD (each burst one call of replace_workers()): a list "
               "of the dead kept on the stack for a few and malloc()ed for a "
               "big burst is never freed, a block per burst, and a pool is "
               "culled in bursts (the OOM killer, an operator's pkill) for "
               "months; free() it before returning; watch: valgrind "
               "--leak-check=full ./preforked 8000 with "
               "ZEROHTTPD_WORKERS=200, kill -STOP PID, kill -9 of 130 "
               "workers, kill -CONT PID, twice, then kill -TERM PID")
    # Stopped here, not by the lab's cleanup, which lists every worker's
    # own children first (2,200 reads; the clean stop is checked
    # elsewhere): if it does not stop, the cleanup kills it and them.
    server.proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.result = server.proc.wait(timeout=seconds(10))


@grader.check(5, "a worker stopped and continued (SIGSTOP, SIGCONT) is not "
              "dead: not replaced, nor does it hide a dead one; the stop "
              "still works")
def stopped_worker(lab):
    heap_env, blocks = heap_blocks(lab)  # heap blocks in use, counted
    server, workers = pool(lab, env=heap_env)
    os.kill(workers[0], signal.SIGSTOP)
    time.sleep(seconds(0.5))
    lab.expect(stopped_state(workers[0]), f"worker {workers[0]}, stopped "
               "with SIGSTOP, was running again 0.5 s later: the supervisor "
               "continued it (SIGCONT) against the operator's stop (a "
               "debugger's, a job control's); a stopped worker is neither "
               "dead nor the supervisor's to wake: leave it stopped; watch: "
               "kill -STOP a worker, then ps -o pid,stat -p WORKER")
    os.kill(workers[0], signal.SIGCONT)
    time.sleep(seconds(0.5))
    now = live_children(server.pid)
    lab.expect(sorted(now) == sorted(workers), f"{len(now)} workers after "
               f"one was stopped and continued, {len(set(now) - set(workers))}"
               " of them new: a stopped worker was taken for dead (waitpid "
               "with WUNTRACED reports stops too)")
    # Then STOP_CYCLES more stops and continues of that worker, each taken
    # by the supervisor before the next (its SIGCHLD no longer pending): a
    # call of replace_workers() each that reaps nobody; whatever such a
    # call takes it must give back (counted after the stop below, which
    # is checked first).
    held, data = blocks(), status_field(server.pid, "VmData")
    for _ in range(STOP_CYCLES):
        for sig in (signal.SIGSTOP, signal.SIGCONT):
            os.kill(workers[0], sig)
            sigchld_taken(server.pid, workers[0], sig == signal.SIGSTOP)
    cycled = blocks() - held
    mapped = status_field(server.pid, "VmData") - data
    # The oldest three stopped and the youngest killed while the supervisor
    # cannot run: one SIGCHLD, the stops (reported first to a waitpid with
    # WUNTRACED: it goes through the children oldest first) and the death.
    held, victim = sorted(workers)[:-1], sorted(workers)[-1]
    try:
        with halted(server.pid):
            kill(held, signal.SIGSTOP)
            wait_for(lambda: [p for p in held if stopped_state(p)],
                     lambda s: len(s) == len(held), limit=5)
            kill([victim])
            wait_for(lambda: zombie_children(server.pid), lambda z: z,
                     limit=5)
        now = refilled(lab, server, [victim], f"{len(held)} workers were "
                       "stopped (SIGSTOP) and another killed while the "
                       "supervisor could not run (one SIGCHLD for both): a "
                       "stopped worker reported by waitpid (WUNTRACED) must "
                       "not end the loop; watch: kill -STOP the supervisor, "
                       "kill -STOP the oldest worker, kill -9 the youngest, "
                       "kill -CONT the supervisor")
        lab.expect(set(held) <= set(now), f"{len(set(held) - set(now))} of "
                   f"the {len(held)} stopped workers replaced: a stopped "
                   "worker is not dead")
        time.sleep(seconds(0.3))
        woken = [p for p in held if not stopped_state(p)]
        lab.expect(not woken, f"{len(woken)} of the {len(held)} stopped "
                   "workers running again (not continued by the grader) "
                   "after the supervisor refilled the pool: the supervisor "
                   "continued them (SIGCONT) against the operator's stop; "
                   "leave a stopped worker stopped")
    except BaseException:
        kill([p for p in held if alive(p)], signal.SIGCONT)
        raise
    # SIGTERM with the three still stopped: the stop must continue them
    # (the starter's sends SIGCONT after SIGTERM), or it waits for ever.
    try:
        server.terminate(timeout=seconds(5))
        server.check_exit()
    except AssertionError as error:
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(f"no clean stop with {len(held)} workers stopped "
                    f"(SIGSTOP) at SIGTERM ({str(error)[:120]}): a stopped "
                    "worker acts on SIGTERM only once continued, and the "
                    "supervisor waits for it; the starter's stop sends "
                    "SIGCONT after SIGTERM to each worker: keep it; watch: "
                    "kill -STOP a worker, then kill -TERM PID") from None
    lab.expect(cycled <= STOP_LEAK_SLACK, f"the supervisor held {cycled} more "
               f"heap blocks (at most {STOP_LEAK_SLACK}) after a worker was "
               f"stopped and continued {STOP_CYCLES} times: each stop and "
               "each continue is a SIGCHLD (no SA_NOCLDSTOP here) and a call "
               "of replace_workers() that reaps nobody; one that allocates "
               "(a list of the dead) and returns early when nobody died "
               "never frees it; free() on every path, or use a static "
               "array; watch: valgrind --leak-check=full ./preforked 8000, "
               "kill -STOP then kill -CONT a worker, many times")
    lab.expect(mapped <= STOP_DATA_SLACK_KB, f"the supervisor's data grew by "
               f"{mapped} kB (VmData; at most {STOP_DATA_SLACK_KB}) while a "
               f"worker was stopped and continued {STOP_CYCLES} times: each "
               "stop and each continue is a SIGCHLD and a call of "
               "replace_workers() that reaps nobody; one that maps memory "
               "(mmap() of a list of the dead: not the heap) and returns "
               "early when nobody died never unmaps it, a page a call; "
               "munmap() on every path, or use a static array; watch: grep "
               "VmData /proc/PID/status while you kill -STOP and kill -CONT "
               "a worker, many times")


def sigchld_taken(pid, worker, stopping, limit=2):
    """Waits (at most `limit` s) until worker is stopped (or running
    again) and the supervisor pid has taken the SIGCHLD that told it: no
    longer pending (ShdPnd)."""
    deadline = time.monotonic() + seconds(limit)
    while time.monotonic() < deadline:
        state = stopped_state(worker)
        pending = int(status_field_text(pid, "ShdPnd") or "0", 16)
        if state == stopping and not pending & (1 << (signal.SIGCHLD - 1)):
            return True
        time.sleep(0.005)
    return False


def stopped_state(pid):
    """pid is stopped (SIGSTOP): State T in /proc/PID/status."""
    return status_field_text(pid, "State")[:1] == "T"


def fork_order(pid):
    """pid's children, oldest first (the kernel's list): a pool's first
    workers in the order of their slots, whatever their PIDs."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


DEAF_TO_SIGCHLD = (
    "a worker killed while fork() failed (once the 2 killed before it were "
    "reaped, their forks failed) was not reaped within {wait:.0f} s, fork() "
    "still failing ({zombies} zombie(s) then): a supervisor that retries a "
    "failed fork() in a loop (every 100 ms in a sigtimedwait() for SIGTERM "
    "alone, say) is deaf to SIGCHLD and SIGINT until fork() works again; "
    "leave the slot empty and go back to the sigwait() loop; watch: strace "
    "-f -e inject=clone:error=EAGAIN -p PID, kill -9 a worker, 1 s later "
    "another, then ps -o pid,stat --ppid PID")


@grader.check(5, "a fork that fails does not bring the supervisor down, "
              "leaves no zombie, and no dead PID in the pool; nor does it "
              "keep the supervisor from a stop")
def fork_fails(lab):
    heap_env, blocks = heap_blocks(lab)  # heap blocks in use, counted
    server, _ = pool(lab, FORK_FAIL_POOL, env=heap_env)
    workers = fork_order(server.pid)  # slots 0 to 3
    victims = workers[:2]
    third = workers[2]  # killed once the two are reaped, fork() failing
    singles = workers[3:3 + FORK_FAIL_SINGLES]  # then one at a time
    killed = []  # those of them killed
    deaf = []

    def deaths_while_fork_fails():
        die_behind_one_sigchld(server, victims)  # both of them
        unreaped = wait_for(lambda: [p for p in victims
                                     if os.path.exists(f"/proc/{p}")],
                            lambda left: not left, limit=2)
        # Its SIGCHLD must be taken while fork() still fails: a supervisor
        # that retries the failed fork() in a loop (however it waits in
        # between) leaves it a zombie until fork() works again.
        kill([third])
        gone = wait_for(lambda: not os.path.exists(f"/proc/{third}"),
                        lambda g: g, limit=2)
        if not gone and not unreaped:
            deaf.append(len(zombie_children(server.pid)))
        if not gone:
            return  # failed (deaf, or it exited): no more to learn here
        # Then FORK_FAIL_SINGLES more, one at a time, each reaped before
        # the next dies: a call each, every fork failing.
        for single in singles:
            kill([single])
            killed.append(single)
            if not wait_for(lambda: not os.path.exists(f"/proc/{single}"),
                            lambda g: g, limit=2):
                break
        time.sleep(seconds(1))

    held = blocks()
    failing(server.pid, "clone", "EAGAIN", deaths_while_fork_fails)
    if deaf:  # said at once: a supervisor that retries in a loop spins
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(DEAF_TO_SIGCHLD.format(zombies=deaf[0],
                                           wait=seconds(2)))
    time.sleep(seconds(1.5))  # a supervisor that retries may refill now
    lab.expect(server.proc.poll() is None, "the supervisor exited "
               f"({server.proc.poll()}; its stderr: "
               f"{last_line(server.stderr())!r}) when fork() failed for a "
               "replacement, strace attached: a failed fork leaves a slot "
               "empty (or tried again later), never ends the server, nor "
               "does a sigtimedwait() that fails with EINTR (woken by a "
               "stop, a continue or a tracer: wait again); watch: strace -e "
               "inject=clone:error=EAGAIN -p PID, then kill -9 a worker")
    zombies = zombie_children(server.pid)
    lab.expect(not zombies, f"{len(zombies)} zombie workers of "
               f"{len(victims)} that died behind one SIGCHLD while fork() "
               "failed, 1.5 s after fork() works again: a failed fork must "
               "not end the waitpid() loop (the others stay unreaped, and "
               "their slots are never refilled); watch: strace -f -e "
               "inject=clone:error=EAGAIN -p PID, kill -STOP PID, kill -9 two "
               "workers, kill -CONT PID, then ps -o pid,stat --ppid PID")
    leaked = blocks() - held  # (checked last, once it has stopped)
    status = get(server.port, "/", timeout=3)[0]
    lab.expect(status == 200, f"GET / answered {status} after a failed fork")
    # fork() fails again; every live worker dies (slots whose fork failed
    # come before the last), and once the supervisor has reaped one it is
    # told to stop while fork() still fails: it must take SIGTERM at once,
    # not after retrying its failed forks (a pause per slot is seconds).
    # At the stop it signals workers[]: no slot may still hold a reaped
    # worker's PID, which by then may be any other process's (watched:
    # strace -e trace=kill).
    live = [p for p in fork_order(server.pid) if alive(p)]  # slot order
    reaped = list(victims) + [third] + killed
    stop = []

    def deaths_then_stop_while_fork_fails():
        # Every death behind one SIGCHLD: a supervisor that pauses per
        # empty slot has all of them to walk before it can take SIGTERM
        # (killed while it ran, it took a few deaths a call, as they
        # came, and passed 1 time in 3).
        die_behind_one_sigchld(server, live)
        wait_for(lambda: [p for p in live if not os.path.exists(f"/proc/{p}")],
                 lambda gone: gone, limit=2)  # the first reaped
        reaped.extend(p for p in live if not os.path.exists(f"/proc/{p}"))
        try:
            server.terminate(timeout=seconds(STOP_WHILE_FAILING))
        except AssertionError as error:
            stop.append(str(error))
            # Failed: SIGKILL it and its workers now, strace still
            # attached (one that retries in a loop keeps strace and itself
            # busy, two CPUs, until it is gone: 4 CPU-s a grading).
            server.cleanup()

    traced = _strace(server.pid, ["clone", "kill"],
                     deaths_then_stop_while_fork_fails, "-f", "-e",
                     "inject=clone:error=EAGAIN")
    if stop:
        raise Unmet(f"{stop[0][:150]} (SIGTERM sent while fork() failed "
                    f"with EAGAIN, once the first of {len(live)} workers "
                    "killed at once, behind one SIGCHLD, was reaped): a "
                    "supervisor that retries a "
                    "failed fork() (in a loop, or once after a pause: 50 ms "
                    "per empty slot is seconds for a pool this size) "
                    "is deaf to SIGTERM for as long as it retries, for each "
                    "dead slot in turn; leave the slot empty and carry on "
                    "(try it again later from the sigwait loop, with "
                    "sigtimedwait()); watch: strace -f -e inject=clone:error="
                    "EAGAIN -p PID, kill -9 every worker, then kill -TERM PID")
    calls = [line[line.find("kill(") + 5:] for line in traced.splitlines()
             if "kill(" in line]
    stale = [c.split(")")[0] for c in calls if first_number(c) in reaped]
    lab.expect(not stale, f"at the stop the supervisor called kill("
               f"{'), kill('.join(stale)}) on worker(s) it had already "
               "reaped (each died while fork() failed): a PID kept in "
               "workers[] after its worker is reaped is recycled for another "
               "process, which the stop then kills; empty the slot (0) when "
               "the fork fails, and reap with waitpid(-1): waitpid(workers[i]"
               ") on a slot a failed fork left at -1 reaps any child, another "
               "slot's dead worker, whose PID then stays in its own slot; "
               "watch: strace -e trace=kill -p PID, then kill -TERM PID, "
               "after the fork failure above")
    lab.expect(leaked <= FORK_FAIL_LEAK_SLACK, f"the supervisor held {leaked} "
               f"more heap blocks (at most {FORK_FAIL_LEAK_SLACK}) after "
               f"{2 + FORK_FAIL_SINGLES} calls of replace_workers() in which "
               "every fork() failed (2 + "
               f"{FORK_FAIL_SINGLES} deaths, one SIGCHLD for the first 2, "
               "one each after): what a call allocates (a list of the dead) "
               "must be freed on every path, the one taken after a failed "
               "fork() too; watch: valgrind --leak-check=full ./preforked "
               "8000 under strace -f -e inject=clone:error=EAGAIN -p PID, "
               "kill -9 workers one at a time")
    try:
        server.check_exit()
    except AssertionError as error:
        raise Unmet(f"no clean stop while fork() failed: {str(error)[:200]}"
                    ) from None


def first_number(args):
    """The first argument of a call as strace prints it, if a number."""
    try:
        return int(args.split(",")[0])
    except ValueError:
        return None


@grader.check(5, "every worker dies while fork fails: the supervisor stays "
              "up, idle, and stops")
def fork_fails_all(lab):
    server, workers = pool(lab)

    def all_die_while_fork_fails():
        kill(workers)
        time.sleep(seconds(1))

    traced = _strace(server.pid, ["clone"], all_die_while_fork_fails, "-f",
                     "-e", "inject=clone:error=EAGAIN")
    forks = sum("clone(" in line and "resumed>" not in line
                for line in traced.splitlines())
    if forks > FORKS_WHILE_FAILING:
        server.cleanup()
        raise Unmet(f"{forks} fork() calls in the {seconds(1):.0f} s that "
                    f"fork() failed with all {WORKERS} workers dead (at most "
                    f"{FORKS_WHILE_FAILING}: a retry of an empty slot at most "
                    "every 0.1 s): a supervisor that tries an empty slot "
                    "again and again while fork() fails (a short "
                    "sigtimedwait() timeout, a loop) all but spins, and "
                    "makes the process shortage worse; try again rarely, "
                    "or at the next SIGCHLD; watch: strace -f -c -e "
                    "inject=clone:error=EAGAIN -p PID, then kill -9 every "
                    "worker")
    time.sleep(seconds(0.5))
    code = server.proc.poll()
    lab.expect(code is None, f"the supervisor exited ({code}; its stderr: "
               f"{last_line(server.stderr())!r}) when all "
               f"{WORKERS} workers had died while fork() failed: with no "
               "child left, waitpid() fails with ECHILD, which ends the loop "
               "(nothing left to reap), not the server; watch: strace -f -e "
               "inject=clone:error=EAGAIN -p PID, then kill -9 every worker")
    zombies = zombie_children(server.pid)
    lab.expect(not zombies, f"{len(zombies)} zombie workers of {WORKERS} "
               "that died while fork() failed")
    before, start = cpu_seconds(server.pid), time.monotonic()
    time.sleep(seconds(1))
    used = (cpu_seconds(server.pid) - before) / (time.monotonic() - start)
    if used > 0.1:
        server.cleanup()  # it would not take SIGTERM: SIGKILL it now
        raise Unmet(f"the supervisor, with no worker left (all {WORKERS} "
                    f"died while fork() failed), used {used:.0%} of a CPU: "
                    "a waitpid() loop that calls again on -1 (ECHILD: no "
                    "child at all) spins for ever and never takes SIGTERM; "
                    "watch: top -p PID after strace -f -e inject=clone:error="
                    "EAGAIN -p PID and kill -9 of every worker")
    stops(lab, server)


@grader.check(5, "a worker that dies while a replacement is being forked, "
              "or just after the dead were reaped, is replaced too")
def death_during_fork(lab):
    server, workers = pool(lab)
    first, second = workers[:2]

    def death_during_fork():
        kill([first])  # its replacement's fork() now takes 2 s to return
        wait_for(lambda: os.path.exists(f"/proc/{first}"),
                 lambda there: not there, limit=3)  # reaped: forking
        kill([second])
        time.sleep(seconds(0.3))

    slowed(server.pid, "clone", seconds(2), death_during_fork)
    workers = refilled(lab, server, [first, second], "a worker was killed "
                       "while the supervisor forked the replacement of "
                       "another (its fork() slowed to 2 s by strace): a "
                       "SIGCHLD that comes while it is unblocked with its "
                       "default action (ignore), e.g. around the fork, is "
                       "lost, and that death with it; watch: strace -e "
                       "inject=clone:delay_exit=2000000 -p PID, kill -9 one "
                       "worker, then another")
    # A worker that dies after the reap loop's last waitpid() found no one
    # left: its SIGCHLD stays pending for the next sigwait(), and must be
    # taken there. Every rt_sigtimedwait() (sigwait's call) of the
    # supervisor enters DRAIN_DELAY s late, so that the death comes while
    # the supervisor is on its way from the reap loop back to its wait:
    # one that swallows pending SIGCHLDs on the way (sigtimedwait() with
    # no timeout, "they are for deaths already reaped") loses it.
    third, fourth = sorted(set(workers) - {first, second})[:2]

    def death_after_reap():
        kill([third])
        wait_for(lambda: os.path.exists(f"/proc/{third}"),
                 lambda there: not there, limit=4)  # reaped: loop ending
        time.sleep(seconds(0.4))
        kill([fourth])  # before its next wait, while it is on its way
        time.sleep(seconds(DRAIN_DELAY + 0.3))

    _strace(server.pid, ["rt_sigtimedwait"], death_after_reap, "-e",
            "inject=rt_sigtimedwait:delay_enter="
            f"{int(seconds(DRAIN_DELAY) * 1e6)}")
    refilled(lab, server, [third, fourth], "a worker was killed 0.4 s after "
             "the supervisor had reaped another, while it went back to its "
             f"wait (every sigwait()/sigtimedwait() entered {DRAIN_DELAY} s "
             "late by strace): a SIGCHLD pending then stands for a death "
             "not yet reaped; taking it away (sigtimedwait() with a zero "
             "timeout, to drain \"stale\" SIGCHLDs) leaves that worker a "
             "zombie and its slot empty; watch: strace -e inject="
             "rt_sigtimedwait:delay_enter=1500000 -p PID, kill -9 a worker, "
             "0.4 s later another")


@grader.check(5, f"replacements that fail as they start (exit 1, "
              f"{STARTS_FAIL} in a row) are replaced in turn; with "
              f"{STARTS_FAIL_MANY} failing, SIGTERM still stops it within "
              f"{STOP_WHILE_FAILING} s; nor is a slot given up after "
              f"{STARTS_FAIL_RUN} in a row")
def fails_at_start(lab):
    starts = FailingStarts(lab)
    server, workers = pool(lab, env=starts.env)
    left = []

    wait_for(lambda: all(settled(p) for p in workers), bool, limit=MASK_SET)

    def failing_starts():
        starts.fail(STARTS_FAIL)  # the next STARTS_FAIL starts fail
        kill(workers[:1])
        left.append(wait_for(starts.left, lambda n: n == 0,
                             limit=2 + STARTS_FAIL * START_DELAY))

    # Each fork() of the supervisor returns START_DELAY s late (strace),
    # so that each failing worker is dead before the supervisor has even
    # seen its PID: however young it died, its slot must be refilled.
    slowed(server.pid, "clone", seconds(START_DELAY), failing_starts)
    now = refilled(lab, server, workers[:1], f"SIGKILL to one worker, whose "
                   f"replacement then failed as it started "
                   f"({STARTS_FAIL - left[0]} of the {STARTS_FAIL} failing "
                   "starts happened: each exits with status 1 a moment after "
                   "its fork, prctl() having failed): whatever the death, an "
                   "exit with an error or a death at once, the slot is "
                   "refilled; watch: strace -f -e inject=prctl:error=EPERM -p "
                   "PID for a second while you kill -9 a worker, then ps -o "
                   "pid,stat --ppid PID")
    # Then every worker dies, and each replacement fails as it starts,
    # STARTS_FAIL_MANY in a row: the supervisor must still take SIGTERM at
    # once, not after a pause per failed start.
    starts.fail(STARTS_FAIL_MANY)
    for pid in now:  # (one may be a failing start, gone since)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(seconds(0.3))
    started = time.monotonic()
    try:
        server.terminate(timeout=seconds(STOP_WHILE_FAILING))
    except AssertionError:
        left = starts.left()
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(f"still running {seconds(STOP_WHILE_FAILING):.0f} s "
                    f"after SIGTERM, sent 0.3 s after all {WORKERS} workers "
                    f"were killed while their replacements failed as they "
                    f"started ({STARTS_FAIL_MANY - left} of "
                    f"{STARTS_FAIL_MANY} failing starts had happened): a "
                    "supervisor that pauses (sleep, nanosleep) before "
                    "replacing a worker that failed is deaf to SIGTERM all "
                    "that time, and with every slot failing its reap loop "
                    "never ends; never sleep in the supervisor (a backoff, "
                    "if any, is a sigtimedwait() timeout); watch: strace -f "
                    "-e inject=prctl:error=EPERM -p PID, kill -9 every "
                    "worker, then kill -TERM PID") from None
    took = time.monotonic() - started
    try:
        server.check_exit()
    except AssertionError as error:
        raise Unmet(f"no clean stop after failing starts ({took:.1f} s): "
                    f"{str(error)[:200]}") from None
    # Last, on a fresh server: one worker is killed and the next
    # STARTS_FAIL_RUN starts fail, at full speed: its slot sees that many
    # young deaths in a row, and must still be refilled (a crash-loop guard
    # that gives a slot up after 20, 50, 100 or 1000 shrinks the pool for
    # good).
    starts.fail(-starts.left())  # what the stop above left unused
    server, workers = pool(lab, env=starts.env)
    # Each first worker past its own prctl() (asleep in accept()) before
    # starts fail: one that is not yet would take a failing start too, and
    # its slot would share the run (two runs of 2000, no guard reached).
    wait_for(lambda: all(settled(p) for p in workers), bool, limit=MASK_SET)
    starts.fail(STARTS_FAIL_RUN)
    kill(workers[:1])
    naps = []
    still = drained(starts, STARTS_FAIL_STALL, limit=30,
                    watch=lambda: naps.append(asleep(server.pid)) or sum(
                        map(bool, naps)) >= SLEPT_SEEN)
    napping = [n for n in naps if n]
    happened = (f" ({STARTS_FAIL_RUN - still} of them happened, then none "
                f"for {seconds(STARTS_FAIL_STALL):.0f} s)" if still else "")
    if len(napping) >= SLEPT_SEEN:
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(f"the supervisor was seen asleep in {napping[0]} (its "
                    f"/proc/PID/wchan) {len(napping)} times of {len(naps)} "
                    f"looks while the replacements of one worker failed as "
                    f"they started ({STARTS_FAIL_RUN - still} of "
                    f"{STARTS_FAIL_RUN} in a row had): a supervisor that "
                    "pauses before replacing a worker that died young (a "
                    "crash-loop \"breath\" of a few ms) sleeps, deaf to "
                    "SIGTERM meanwhile, and with many young deaths in one "
                    "call (every slot failing) for seconds; never sleep in "
                    "the supervisor; watch: cat /proc/PID/wchan while "
                    "strace -f -e inject=prctl:error=EPERM -p PID runs and "
                    "you kill -9 a worker")
    refilled(lab, server, workers[:1], f"SIGKILL to one worker, whose "
             f"replacements then failed as they started, {STARTS_FAIL_RUN} "
             f"in a row{happened}: a slot is never given up, however many "
             "young deaths in a row (a crash-loop guard that stops "
             "refilling shrinks the pool for good); watch: strace -f -e "
             "inject=prctl:error=EPERM -p PID for 5 s while you kill -9 a "
             "worker, then ps -o pid,stat --ppid PID")


def asleep(pid):
    """What pid sleeps in if it is a pause (nanosleep, poll or select with
    a timeout: /proc/PID/wchan), else ""."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            where = f.read().strip()
    except OSError:
        return ""
    return where if any(w in where for w in PAUSES) else ""


def drained(starts, stall, limit, watch=None):
    """Waits until every failing start asked for has happened, or none
    has for `stall` seconds (a slot given up), at most `limit` seconds
    (both stretched by TIMEOUT): how many are left. watch() is called
    every 0.05 s meanwhile, and ends the wait if it says so."""
    deadline = time.monotonic() + seconds(limit)
    left, moved = starts.left(), time.monotonic()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        if watch and watch():
            break
        now = starts.left()
        if now != left:
            left, moved = now, time.monotonic()
        elif time.monotonic() - moved > seconds(stall):
            break
    return left


@grader.check(5, "while every new worker dies as it starts and each fork() "
              f"returns {SLOW_FORK:g} s late, SIGTERM still stops it")
def slow_fork_deaths(lab):
    starts = FailingStarts(lab)
    server, workers = pool(lab, env=starts.env)
    stop = []

    def deaths_then_stop():
        starts.fail(EVERY_START)  # from now on, every start fails
        kill(workers[:1])
        wait_for(starts.left, lambda n: n <= EVERY_START - 2,
                 limit=5)  # two replacements dead: well under way
        try:
            server.terminate(timeout=seconds(STOP_WHILE_FAILING + SLOW_FORK))
        except AssertionError as error:
            stop.append(str(error))
        stop.append(EVERY_START - starts.left())

    # Each fork() of the supervisor returns SLOW_FORK s late (strace, its
    # main thread alone): each new worker has failed and exited before the
    # supervisor sees its PID.
    slowed(server.pid, "clone", seconds(SLOW_FORK), deaths_then_stop)
    if len(stop) > 1:
        starts.fail(-starts.left())  # starts work again
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(f"{stop[0][:100]}: SIGTERM sent while every new worker "
                    f"failed as it started ({stop[1]} had so far) and each "
                    f"fork() of the supervisor returned {SLOW_FORK:g} s late "
                    "(strace): a replace_workers() that forks inside its "
                    "waitpid() loop finds each new worker dead already at "
                    "the next waitpid() and forks again, for ever, never "
                    "back in sigwait() to take SIGTERM; reap every dead "
                    "worker first, then fork into each empty slot; watch: "
                    "strace -e inject=clone:delay_exit=500000 -p PID and "
                    "strace -f -e inject=prctl:error=EPERM -p PID, kill -9 a "
                    "worker, then kill -TERM PID")
    try:
        server.check_exit()
    except AssertionError as error:
        raise Unmet(f"no clean stop while every new worker failed as it "
                    f"started: {str(error)[:200]}") from None


@grader.check(5, "SIGINT (Ctrl-C) stops it as SIGTERM does, also after "
              f"fork() has failed with ENOMEM for {FORK_FAIL_LONG:g} s with "
              "every worker dead")
def sigint_stops(lab):
    server, workers = pool(lab)
    kill(workers[:1])
    refilled(lab, server, workers[:1], "SIGKILL to one worker")
    server.proc.send_signal(signal.SIGINT)
    try:
        code = server.proc.wait(timeout=seconds(5))
    except subprocess.TimeoutExpired:
        code = None
    seen = "still running after 5 s" if code is None else f"exit {code}"
    lab.expect(code == 0, f"SIGINT: {seen}: the supervisor must stop on "
               "SIGINT as on SIGTERM (both are in the set it waits for)")
    # Then, on a fresh server, every fork() fails with ENOMEM (any error,
    # not only EAGAIN, leaves a slot empty), all the workers die, and
    # FORK_FAIL_LONG s later SIGINT must stop it within STOP_WHILE_FAILING,
    # while fork() still fails: a wait between retries that leaves SIGINT
    # out, or a retry backoff grown past 999 ms in tv_nsec (EINVAL at once:
    # a spin deaf to every signal), keeps it running.
    server, workers = pool(lab)
    seen = []

    def dead_then_sigint():
        kill(workers)
        wait_for(lambda: [p for p in workers if os.path.exists(f"/proc/{p}")],
                 lambda left: not left, limit=2)  # all reaped (or orphaned)
        before, start = cpu_seconds(server.pid), time.monotonic()
        time.sleep(seconds(FORK_FAIL_LONG))
        if server.proc.poll() is not None:
            seen.append(f"the supervisor exited ({server.proc.poll()}) when "
                        "fork() failed with ENOMEM for a replacement: "
                        "EAGAIN is not the only error of fork() (ENOMEM: "
                        "memory or a cgroup's limit); whatever the error, "
                        "leave the slot empty and carry on; watch: strace -f "
                        "-e inject=clone:error=ENOMEM -p PID, then kill -9 a "
                        "worker")
            return
        used = (cpu_seconds(server.pid) - before) / (time.monotonic() - start)
        server.workers = descendants(server.pid)  # for check_exit()
        server.proc.send_signal(signal.SIGINT)
        try:
            server.result = server.proc.wait(
                timeout=seconds(STOP_WHILE_FAILING))
            server._read_stdout(SUMMARY_RE, time.monotonic() + 2)
        except subprocess.TimeoutExpired:
            seen.append(f"still running {seconds(STOP_WHILE_FAILING):.0f} s "
                        f"after SIGINT, sent once fork() had failed (ENOMEM) "
                        f"for {seconds(FORK_FAIL_LONG):g} s with all "
                        f"{WORKERS} workers dead (the supervisor used "
                        f"{used:.0%} of a CPU meanwhile): while a slot is "
                        "empty it must stay awake to SIGINT as to SIGTERM "
                        "and SIGCHLD (a sigtimedwait() between retries "
                        "waits for all three), and a timeout whose tv_nsec "
                        "is over 999999999 (a backoff of 1600 ms written "
                        "{0, ms * 1000000L}) is invalid: sigtimedwait() "
                        "fails with EINVAL at once, taking no signal, and "
                        "the retries spin; watch: strace -f -e inject=clone:"
                        "error=ENOMEM -p PID, kill -9 every worker, 3 s "
                        "later kill -INT PID")

    failing(server.pid, "clone", "ENOMEM", dead_then_sigint)
    if seen:
        server.cleanup()  # SIGKILL it and its workers now
        raise Unmet(seen[0])
    try:
        server.check_exit()
    except AssertionError as error:
        raise Unmet(f"SIGINT while fork() failed: no clean stop: "
                    f"{str(error)[:200]}") from None


@grader.check(5, "every worker killed: the pool comes back, answers and "
              "stops cleanly")
def serves_after(lab):
    server, workers = pool(lab)
    kill(workers)  # a client caught in a dying worker's accept() is lost
    refilled(lab, server, workers, f"SIGKILL to all {WORKERS} workers")
    for _ in range(10):
        status, _ = get(server.port, "/", timeout=3)
        lab.expect(status == 200, f"GET / answered {status or 'nothing'} "
                   "after the pool came back; watch: curl -i after kill -9 "
                   "of every worker")
    stops(lab, server)


def status_field_text(pid, name):
    """A field of /proc/PID/status as text (a signal mask is hex)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except (FileNotFoundError, ProcessLookupError):
        pass
    return "(gone)"


if __name__ == "__main__":
    grader.main()
