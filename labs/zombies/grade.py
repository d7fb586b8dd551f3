#!/usr/bin/env python3
"""Grader for the zombies lab (labs/zombies/README.md).

Each check probes one way a reaper goes wrong: exits that pile up under
one SIGCHLD (a reaper that does not loop), exits under concurrent load, a
reaper that waits for a child still serving (it blocks every other client),
children collected some other way than by waitpid() (the exit statuses
are lost), a stop that signals its launcher's whole process group or
leaves a process serving, and a handler that changes errno. Counts, never
speeds; every wait is generous."""

import contextlib
import ctypes
import errno
import mmap
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from grading import (C_WORDS, Grader, HeldClients,  # labs/grading.py
                     attach_strace, build_shim, detach_strace,
                     Unmet, _strace, ab_said, asking_clients, code_only,
                     cpu_seconds, descriptors, function_body, get,
                     idle_clients,
                     live_children, review_handlers, seconds,
                     signal_handlers, slowed, source_text, stop_now,
                     stopped, wait_for, wait_stopped, zombie_children)
from rawhttp import Connection  # tests/rawhttp.py

BURST = 1100  # children that exit while the server cannot run: one SIGCHLD
# (past any cap on reaps a pass plausibly holds: 256, 512, 1024)
# An idle server's child, once it has answered and exited, is reaped within
# this many seconds (not stretched by TIMEOUT): SIGCHLD interrupts accept()
# at once; a server deaf to it waits for accept()'s 1 s timeout.
IDLE_REAP_S = 0.5
IDLE_ROUNDS = 3
# waitpid() calls that return no PID, in one turn of the loop, at most: the
# one that ends a pass says 0 or -1 (a handler that reaps too, or a second
# pass, may add one or two); a call per child polls every live one.
FRUITLESS = 4
LOAD = ["-n", "1500", "-c", "50"]  # ab: 50 connections at a time (past a
# fixed table of 1,024 statuses with a margin; 3,000 cost twice the CPU)
PILED = 300  # zombies at once during that load, at most
# Bytes of heap in use (malloc less free) in the server process itself (not
# its children), counted by a preloaded library, that the load may add: the
# parent allocates nothing per child; a record kept of every child (a
# growing array of statuses) is 8 bytes and more for each of the 1,500.
HEAP_SLACK = 4096
# A cap on live children, if a server keeps one, is at least CAP_LEAST
# (KILL_BATCH children are held at once) and at most CAP_MOST (the counts
# below go past it); the handout says both.
CAP_LEAST, CAP_MOST = 2200, 8192
# Children killed by a signal (SIGKILL), in batches of KILL_BATCH at once,
# over one server's life: past any count of live children (a cap of
# CAP_MOST) that only a normal exit would bring down; and KILL_BATCH live at
# once: past any cap below it, and any that waits for a child (back-pressure
# with a blocking waitpid() stalls the accept loop).
KILLED = 8800
KILL_BATCH = CAP_LEAST
KILL_REAPED_S = 6  # no zombie left this long after the kills (a loaded
# machine is slow to run 2,200 exits)
# Of the KILLED, the first KILL_BATCH and the last KILL_LAST are real
# children killed by SIGKILL; those between, KILL_BATCH at a time, are
# children that fork() claims (fork_steered: each the PID of a process of
# the grader's, no child of the server's) and that waitpid() then reports
# killed by SIGKILL: to the server the same (a PID from fork(), then that
# PID from waitpid(), WIFSIGNALED), without thousands of real forks.
KILL_LAST = 100
# Clients that connect while every fork() fails (EAGAIN, as at the process
# limit: ulimit -u, pid_max), FAIL_BATCH at a time: enough for a node
# allocated per child and kept when fork() fails (24 bytes and more each)
# to grow the heap past HEAP_SLACK. Each must be closed by the server
# within FAIL_CLOSE_S (stretched by TIMEOUT), with one fork() call and no
# pause (PAUSERS) each: no retry.
FORK_FAILS = 1000
FAIL_BATCH = 100
FAIL_CLOSE_S = 5
# Then clients for whom fork() returns a PID but makes no child (strace):
# past any cap on live children (CAP_MOST), each let go within FAIL_CLOSE_S.
FAKED = 9000  # past CAP_MOST, in whole batches of FAIL_BATCH
# By then every cap up to CAP_MOST is reached (with the keep-alive child):
# the clients after it are dropped at the cap, and if the server calls no
# fork() for them, its heap may not grow (HEAP_SLACK) over them.
CAP_FULL = 8300
# Clients for whom fork() fails with ENOMEM (memory, a memory cgroup's
# limit) rather than EAGAIN, the server's own malloc() failing as well:
# dropped all the same, the server lives on; one by one (a server that
# exits at the first refuses the rest).
ENOMEM_CLIENTS = 10
# Once every cap is reached (FAKED), CAP_SLACK of the children fork()
# claimed exit: any cap is that far off. Then NEAR_FAILS clients for whom
# fork() fails with EAGAIN, then as many with ENOMEM: a count of live
# children that a fork() failing with that error raises all the same
# reaches its cap again and drops every client (a GET / after each).
CAP_SLACK = 200
NEAR_FAILS = 300
# Out of descriptors (RLIMIT_NOFILE lowered to the server's lowest free
# one, a client waiting in the backlog): accept() fails with EMFILE, and
# the loop must pause (the starter's nanosleep) between tries: at most one
# EMFILE in EMFILE_PER_PAUSE without a pause between, over EMFILE_SEEN.
EMFILE_SEEN = 30
EMFILE_PER_PAUSE = 2
SLEEPERS = ["nanosleep", "clock_nanosleep"]  # what a pause may call
# ... and what else a pause after a failed fork() may call: any wait with a
# timeout, on nothing or on a signal (the reference calls none of them in
# its loop)
PAUSERS = SLEEPERS + ["poll", "ppoll", "select", "pselect6", "epoll_wait",
                      "epoll_pwait", "epoll_pwait2", "pause",
                      "rt_sigsuspend", "rt_sigtimedwait"]
PAUSED = re.compile(rf"^(?:{'|'.join(PAUSERS)})\(", re.M)
# Bytes the server may write to stderr over the failed fork()s: the servers
# are quiet by default (docs/DESIGN.md); a line per failed fork() fills a
# stderr pipe that nobody drains (64 KiB) and blocks the loop in write().
QUIET = 1024
FORKERS = ["clone", "clone3", "fork", "vfork"]  # what fork() may call
SERIAL = 40  # requests one after another
ROUNDS = 3  # a child exits while the reaper's waitpid() is under way
SLOWED = 0.5  # seconds added to the return of each waitpid() (strace)
WATCH = ("watch them: ./forking 8000 & ab -n 1000 -c 50 "
         "http://127.0.0.1:8000/; ps -o pid,stat --ppid $!")
REQUEST = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
grader = Grader("zombies")
# SIGTERMs that reached this grader: it leads the process group its servers
# run in (see __main__), as a script or make that starts a server does, so
# a server that stops with kill(0, ...) signals it too.
launcher_hit = []


# Counts the bytes of heap in use (malloc_usable_size of every block
# allocated, less every block freed) in the process that loaded it, into
# word 0 of a file the grader maps; a child (fork) counts into a private word
# instead. While word 1 is not 0, every allocation of the process itself
# (not of a child) fails with ENOMEM, as when memory is short; word 2 counts
# them.
HEAP_BYTES = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
static long early, mine, *live = &early, *refusing;
static int refused(void)
{
    if (!refusing || !__atomic_load_n(refusing, __ATOMIC_RELAXED))
        return 0;
    __atomic_add_fetch(&refusing[1], 1, __ATOMIC_RELAXED);
    errno = ENOMEM;
    return 1;
}
static void add(void *p, long sign)
{
    if (p)
        __atomic_add_fetch(live, sign * (long)malloc_usable_size(p),
                           __ATOMIC_RELAXED);
}
static void in_child(void)
{
    live = &mine;
    refusing = NULL;
}
__attribute__((constructor)) static void share(void)
{
    pthread_atfork(NULL, NULL, in_child);
    const char *path = getenv("LAB_HEAP_BYTES");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0)
        return;
    long *shared = mmap(NULL, 3 * sizeof *shared, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    close(fd);
    if (shared != MAP_FAILED) {
        *shared = early;
        live = shared;
        refusing = &shared[1];
    }
}
void *malloc(size_t n)
{
    if (refused())
        return NULL;
    void *p = __libc_malloc(n);
    add(p, 1);
    return p;
}
void *calloc(size_t k, size_t n)
{
    if (refused())
        return NULL;
    void *p = __libc_calloc(k, n);
    add(p, 1);
    return p;
}
void free(void *p) { add(p, -1); __libc_free(p); }
void *realloc(void *p, size_t n)
{
    if (n && refused())
        return NULL;
    long was = p ? (long)malloc_usable_size(p) : 0;
    void *q = __libc_realloc(p, n);
    if (q || n == 0) {
        __atomic_sub_fetch(live, was, __ATOMIC_RELAXED);
        add(q, 1);
    }
    return q;
}
void *memalign(size_t a, size_t n)
{
    if (refused())
        return NULL;
    void *p = __libc_memalign(a, n);
    add(p, 1);
    return p;
}
void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n)
{
    if (refused())
        return 12;
    void *p = __libc_memalign(a, n);
    if (!p)
        return 12;
    add(p, 1);
    *out = p;
    return 0;
}
"""


def heap_flat(lab, grown, over, why, whose="in the server itself"):
    """The server's heap in use (heap_bytes()) grew by at most HEAP_SLACK
    over `over`; else what was kept, and why it must not be."""
    lab.expect(grown <= HEAP_SLACK, f"the server's heap grew by {grown} "
               f"bytes in use (malloc less free, {whose}; at most "
               f"{HEAP_SLACK}) over {over}: {why}")


def heap_bytes(lab):
    """A library to preload that counts the server's heap bytes in use
    (its own, not its children's): (env to start it with, a function that
    reads the count)."""
    shim = build_shim(lab, "heap_bytes", HEAP_BYTES, "-lpthread")
    counter = lab.workdir / "heap_bytes.count"
    counter.write_bytes(bytes(mmap.PAGESIZE))
    with counter.open("r+b") as file:
        view = mmap.mmap(file.fileno(), mmap.PAGESIZE)

    def heap():
        return struct.unpack_from("q", view)[0]

    def refuse(on):  # the server's own allocations fail (ENOMEM), or not
        struct.pack_into("q", view, 8, int(on))
    heap.refuse = refuse
    heap.refused = lambda: struct.unpack_from("q", view, 16)[0]
    return ({"LD_PRELOAD": str(shim), "LAB_HEAP_BYTES": str(counter)},
            heap)


# fork() (and vfork()) as the server calls them, steered by the grader
# through a file it maps: word 0 is 0 for the real fork(), a PID to return
# without making a child, or -errno to fail with; word 1 counts the calls
# steered. Cheaper than strace's fault injection, which stops the server
# at every system call: for thousands of clients.
FORK_CTL = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
static long *ctl;
__attribute__((constructor)) static void share(void)
{
    const char *path = getenv("LAB_FORK_CTL");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0)
        return;
    void *p = mmap(NULL, 8 * sizeof(long), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        ctl = p;
}
pid_t fork(void)
{
    static pid_t (*real)(void);
    long how = ctl ? __atomic_load_n(&ctl[0], __ATOMIC_RELAXED) : 0;
    if (how) {
        __atomic_add_fetch(&ctl[1], 1, __ATOMIC_RELAXED);
        if (how < 0) {
            errno = (int)-how;
            return -1;
        }
        return (pid_t)how;
    }
    if (!real)
        real = (pid_t(*)(void))dlsym(RTLD_NEXT, "fork");
    return real();
}
pid_t vfork(void) { return fork(); }
/* Exits that never happened, for children fork() claimed (word 2: how many
 * are pending, word 3: the PID to report, word 4: how many were reported,
 * word 5: accept() calls made once one was reported and before the last,
 * word 6: the signal that killed them, or 0: exited with status 0): a
 * waitpid() for any child reports an exit while any is pending, whatever
 * its flags; waitid() likewise. */
static int exited(void)
{
    long n = ctl ? __atomic_load_n(&ctl[2], __ATOMIC_RELAXED) : 0;
    while (n > 0)
        if (__atomic_compare_exchange_n(&ctl[2], &n, n - 1, 0,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            __atomic_add_fetch(&ctl[4], 1, __ATOMIC_RELAXED);
            return 1;
        }
    return 0;
}
#define REAL(name) \
    static __typeof__(name) *real; \
    if (!real) \
        real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)
pid_t wait4(pid_t pid, int *status, int options, struct rusage *usage)
{
    REAL(wait4);
    if ((pid == -1 || pid == 0) && exited()) {
        if (status)
            *status = (int)(ctl[6] & 0x7f); /* WIFSIGNALED, or exit 0 */
        if (usage)
            memset(usage, 0, sizeof *usage);
        return (pid_t)ctl[3];
    }
    return real(pid, status, options, usage);
}
pid_t waitpid(pid_t pid, int *status, int options)
{
    return wait4(pid, status, options, NULL);
}
pid_t wait(int *status) { return wait4(-1, status, 0, NULL); }
pid_t wait3(int *status, int options, struct rusage *usage)
{
    return wait4(-1, status, options, usage);
}
int waitid(idtype_t idtype, id_t id, siginfo_t *info, int options)
{
    REAL(waitid);
    if ((idtype == P_ALL || (idtype == P_PGID && id == 0)) &&
        (options & WEXITED) && exited()) {
        memset(info, 0, sizeof *info);
        info->si_signo = SIGCHLD;
        info->si_code = ctl[6] ? CLD_KILLED : CLD_EXITED;
        info->si_pid = (pid_t)ctl[3];
        info->si_status = (int)ctl[6];
        return 0;
    }
    return real(idtype, id, info, options);
}
static void turn(void) /* word 7: how many were reported at the first */
{
    if (ctl && __atomic_load_n(&ctl[4], __ATOMIC_RELAXED) > 0 &&
        __atomic_load_n(&ctl[2], __ATOMIC_RELAXED) > 0 &&
        __atomic_add_fetch(&ctl[5], 1, __ATOMIC_RELAXED) == 1)
        __atomic_store_n(&ctl[7], __atomic_load_n(&ctl[4], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
}
struct sockaddr;
int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(
            RTLD_NEXT, "accept4");
    turn();
    return real(fd, addr, len, flags);
}
int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(
            RTLD_NEXT, "accept");
    turn();
    return real(fd, addr, len);
}
"""


def fork_steered(lab):
    """A library to preload that steers the server's fork(): (env to start
    it with, a function steer(how) that sets word 0 (see FORK_CTL), a
    function that reads the calls steered). steer.exits(pid, count) makes
    the server's waitpid() (or waitid()) for any child report count exits
    of pid (the children fork() claimed), each killed by signal killed_by
    if given; steer.exited() reads (exits
    reported, exits still pending, accept() calls made between the first
    reported and the last)."""
    shim = build_shim(lab, "fork_ctl", FORK_CTL, "-ldl")
    path = lab.workdir / "fork_ctl"
    path.write_bytes(bytes(mmap.PAGESIZE))
    with path.open("r+b") as file:
        view = mmap.mmap(file.fileno(), mmap.PAGESIZE)

    def word(k, value=None):
        if value is None:
            return struct.unpack_from("q", view, 8 * k)[0]
        struct.pack_into("q", view, 8 * k, value)
        return value

    def steer(how):
        word(0, how)

    def exits(pid, count, killed_by=0):
        word(3, pid), word(4, 0), word(5, 0), word(6, killed_by), word(7, 0)
        word(2, count)
    steer.exits = exits
    steer.exited = lambda: (word(4), word(2), word(5))
    steer.first_pass = lambda: word(7)  # reported before the first accept()
    return ({"LD_PRELOAD": str(shim), "LAB_FORK_CTL": str(path)}, steer,
            lambda: word(1))


# The reaping calls: waitpid(), wait() and wait3() are wait4 to the kernel;
# waitid() collects an exit status as well, and counts the same.
REAPERS = ["wait4", "waitid"]


def reaped_pid(line):
    """The PID that one reaping call in strace's output collected (0 for
    none, -1 for an error), or None if the line is no such call (a signal,
    another call, one that strace cut short). waitid() returns 0 and puts
    the PID in its siginfo (si_pid; strace prints {} when none)."""
    call = re.match(r"(wait4|waitid)\((.*)\)\s+=\s+(-?\d+)", line)
    if not call:
        return None
    value = int(call[3])
    if call[1] == "waitid" and value == 0:
        found = re.search(r"si_pid=(\d+)", call[2])
        return int(found[1]) if found else 0
    return value


def turns(pid, during):
    """Runs during() while strace watches pid's main thread accept and
    reap: [accept's return, waitpid() (or waitid()) calls, PIDs they
    returned] for each accept4()/accept() call, counting the calls after
    it and before the next accept, in order (the first entry, None, holds
    what came before the first accept)."""
    found = [[None, 0, 0]]
    for line in _strace(pid, [*REAPERS, "accept4", "accept"],
                        during).splitlines():
        reaped = reaped_pid(line)
        if reaped is not None:
            found[-1][1] += 1
            found[-1][2] += reaped > 0
            continue
        call = re.match(r"accept4?\(.*\)\s+=\s+(-?\d+)", line)
        if call:
            found.append([int(call[1]), 0, 0])
    return found


def launcher_spared(lab, before):
    """Stopping the server sent no SIGTERM to the grader that launched it
    (launcher_hit grew from `before`)."""
    lab.expect(len(launcher_hit) == before, "stopping the server (SIGTERM) "
               "sent SIGTERM to the grader that started it as well (it "
               "shares the server's process group, as a script, make or a "
               "shell without job control does): kill(0, ...) or killpg() "
               "signals the whole group, not only the server's children; "
               "watch: setsid bash -c './forking 8000 & sleep 2; kill $!; "
               "sleep 1; echo launcher survived'")


def asked(server, path):
    """GET path: (status or None, what happened, for a message)."""
    try:
        status, _ = get(server.port, path)
    except (socket.timeout, ConnectionError) as error:
        return None, f"got no answer ({type(error).__name__})"
    return status, (f"answered {status}" if status else
                    "was closed unanswered")


def served(lab, server, path="/", limit=5, beside=""):
    """GET path, which must answer 200 within limit s. A server that does
    not answer is told apart from one that spins (a reaper that loops
    forever) by the CPU it burns meanwhile. beside: what else went on,
    for the message."""
    before = cpu_seconds(server.pid)
    try:
        status, _ = get(server.port, path, timeout=limit)
    except (socket.timeout, ConnectionError) as error:
        spent = cpu_seconds(server.pid) - before
        raise Unmet(f"GET {path}: no answer within {seconds(limit):.0f} s "
                    f"({type(error).__name__}){beside}; the server used "
                    f"{spent:.1f} s of CPU meanwhile: it waits for "
                    "something (near 0 s: a child that has not exited? "
                    "waitpid without WNOHANG) or spins (a loop that never "
                    "ends); watch: strace -p PID while curl -m 5 "
                    f"http://127.0.0.1:8000{path}") from None
    lab.expect(status == 200, f"GET {path} answered {status}; watch: curl "
               f"-i http://127.0.0.1:8000{path}")


def zombies_gone(lab, server, what, limit=2):
    """Every child reaped within limit s of `what`; else say how many.
    Waited for until no child is left, live or not: one still exiting
    when the wait begins is no zombie yet, and a count of zombies alone
    would say 0 before the server had to reap it."""
    left = wait_for(lambda: len(children(server.pid)), lambda n: n == 0,
                    limit=limit) and len(zombie_children(server.pid))
    lab.expect(left == 0, f"{left} zombies {seconds(limit):.0f} s after "
               f"{what}; {WATCH}")


@grader.check(15, f"{BURST} children exit at once (one SIGCHLD): all reaped "
              "in one pass")
def bursts(lab):
    server = lab.start()
    piled = [0]

    def burst():
        # a child each, waiting for the rest of its request (10 s, where an
        # idle client is dropped after 5 s: a busy machine is slow to fork)
        clients = asking_clients(server.port, BURST, b"GET / HTTP/1.1\r\n")
        # counted from /proc/PID/task/*/children, one file, not a stat per
        # child every 50 ms (none has exited yet: each waits for its request)
        alive = wait_for(lambda: len(children(server.pid)),
                         lambda n: n >= BURST, limit=8)  # as signal_deaths:
        # a loaded machine is slow to fork 1,100; still short of the 10 s
        # a child waits for the rest of its request (a loop that waits for
        # a child gets one child by then)
        lab.expect(alive >= BURST, f"{alive} children for {BURST} clients "
                   "connected at once: does the accept loop wait for a "
                   "child? (a child of a child is not the server's to "
                   "reap) watch: ps -o pid,stat,wchan --ppid PID while they "
                   "connect")
        serving = live_children(server.pid)
        killed = serving[::10]
        with stopped(server.pid):  # the exits pile up; signals do not queue
            for pid in killed:  # a few die of a signal instead: first, so
                with contextlib.suppress(ProcessLookupError):  # that none
                    os.kill(pid, signal.SIGKILL)  # has exited already
            wait_for(lambda: len(zombie_children(server.pid)),
                     lambda n: n >= len(killed), limit=5)
            for client in clients:
                client.close()
            piled[0] = wait_for(lambda: len(zombie_children(server.pid)),
                                lambda n: n >= BURST, limit=5)
        zombies_gone(lab, server, f"{BURST} children exited at once, every "
                     "tenth killed by SIGKILL (one SIGCHLD stood for all of "
                     "them: a fixed batch or table, or a loop that stops at "
                     "a child killed by a signal?)")

    seen = turns(server.pid, burst)
    one_pass = max(reaped for _, _, reaped in seen)
    lab.expect(one_pass >= piled[0], f"{piled[0]} children had exited when "
               f"the server resumed, but it reaped at most {one_pass} of "
               "them between two accept()s (the rest waited for a later "
               "turn): collect until waitpid() says nothing more (0 or -1), "
               "not a fixed batch or table; watch: strace -e "
               "trace=wait4,accept4 -p PID")
    fruitless = max(calls - reaped for _, calls, reaped in seen)
    lab.expect(fruitless <= FRUITLESS, f"{fruitless} waitpid() calls that "
               "collected nothing in one turn of the loop (between two "
               f"accept()s) while {BURST} children were serving (at most "
               f"{FRUITLESS}): a call per child, a table of PIDs polled one "
               "by one? That costs every turn a call per live child, and a "
               "table full holds no more: waitpid(-1, ...) asks for any "
               "child at once; watch: strace -c -e trace=wait4 -p PID")
    return (f"{one_pass} of {piled[0]} zombies reaped in one pass; at most "
            f"{fruitless} fruitless waitpid() calls a turn")


def children(pid):
    """pid's children, zombies too, as /proc/PID/task/*/children lists them
    (no stat read per child: cheap for thousands)."""
    listed = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                listed += (task / "children").read_text().split()
    except FileNotFoundError:
        return []
    return sorted(set(map(int, listed)))


@grader.check(5, f"{KILLED} children killed by a signal, {KILL_BATCH} at a "
              f"time, over one server's life (the first {KILL_BATCH} while it "
              "is stopped: reaped in one pass): it still serves, keeps no "
              "heap for them, and signals none of them at its stop")
def signal_deaths(lab):
    env, heap = heap_bytes(lab)
    forks, steer, steered = fork_steered(lab)
    env = {**forks, **env,
           "LD_PRELOAD": f"{env['LD_PRELOAD']} {forks['LD_PRELOAD']}"}
    server = lab.start(env=env)
    decoy = subprocess.Popen(["sleep", "600"])
    try:
        return deaths(lab, server, heap, steer, steered, decoy.pid)
    except BaseException:  # no SIGTERM at the end: a server that signals
        with contextlib.suppress(ProcessLookupError):  # the PIDs of its
            os.kill(server.pid, signal.SIGKILL)  # dead children would
        raise  # reach other processes now (PIDs reused)
    finally:
        decoy.kill()
        decoy.wait()


def forking(lab, server, count, killed, batch):
    """count clients connect at once, each sending the start of a request:
    a child each, all there within 8 s. Returns the clients."""
    # a child each, waiting for the rest of its request (10 s, where an
    # idle client is dropped after 5 s: a busy machine is slow to fork);
    # none is left from the batch before (all reaped), so each child
    # listed is one of these
    clients = asking_clients(server.port, count, b"GET / HTTP/1.1\r\n")
    alive = wait_for(lambda: len(children(server.pid)),
                     lambda n: n >= count, limit=8)
    lab.expect(alive >= count, f"{alive} children for {count} clients "
               f"connected at once, after {killed} children killed by "
               f"SIGKILL (batch {batch}): the server forks no more. A count "
               "of live children that a death by a signal never brings "
               "down (only WIFEXITED counted?) reaches its cap; a cap "
               f"below {CAP_LEAST} drops clients it must serve; one that "
               "waits for a child to exit (waitpid without WNOHANG) stalls "
               "the accept loop; watch: kill -9 a child, then ps -o "
               "pid,stat --ppid PID; and ps -o wchan -p PID with "
               f"{KILL_BATCH:,} clients connected")
    return clients


def none_left(lab, server, killed, batch):
    """No child left KILL_REAPED_S after the kills; else how many zombies."""
    left = wait_for(lambda: len(children(server.pid)), lambda n: n == 0,
                    limit=KILL_REAPED_S)
    if left:  # say how many of them are zombies
        zombies = len(zombie_children(server.pid))
        lab.expect(not zombies, f"{zombies} zombies "
                   f"{seconds(KILL_REAPED_S):.0f} s after {killed} children "
                   f"killed by SIGKILL (batch {batch}); {WATCH}")


def claimed_killed(lab, server, steer, steered, decoy, count, killed, batch):
    """count clients, FAIL_BATCH at a time, for each of whom fork() claims a
    child (decoy's PID: fork_steered); each is let go at once (the parent
    closes its copy); then waitpid() reports every child so claimed killed
    by SIGKILL, one SIGCHLD for them all, and the server must collect them
    within KILL_REAPED_S. Returns how many were claimed."""
    before, sent, hung = steered(), 0, 0
    steer(decoy)
    try:
        while sent < count and not hung:
            batch_of = idle_clients(server.port, min(FAIL_BATCH,
                                                     count - sent))
            sent += len(batch_of)
            hung = unclosed(batch_of, FAIL_CLOSE_S)
    finally:
        steer(0)
    lab.expect(not hung, f"{hung} of {FAIL_BATCH} clients (after "
               f"{killed} children killed by SIGKILL, batch {batch}) neither "
               f"answered nor closed within {seconds(FAIL_CLOSE_S):.0f} s: "
               "the accept loop waits for a child to exit (at a cap?); "
               "watch: ps -o wchan -p PID with "
               f"{KILL_BATCH:,} clients connected")
    claimed = steered() - before
    steer.exits(decoy, claimed, signal.SIGKILL)
    try:
        os.kill(server.pid, signal.SIGCHLD)
        reported, pending, _ = wait_for(steer.exited, lambda seen: not seen[1],
                                        limit=KILL_REAPED_S)
    finally:
        steer.exits(decoy, 0)
    lab.expect(not pending, f"{pending} of {claimed} children killed by "
               f"SIGKILL (batch {batch}, after {killed} others) not "
               f"collected {seconds(KILL_REAPED_S):.0f} s after (waitpid() "
               f"reported {reported} of them); {WATCH}")
    return claimed


def deaths(lab, server, heap, steer, steered, decoy):
    """signal_deaths on a started server; heap reads its heap in use,
    steer and steered steer its fork() and waitpid() (fork_steered),
    decoy is the PID that fork() claims."""
    for _ in range(3):  # what the server allocates once, at its first
        served(lab, server)
    wait_for(lambda: len(live_children(server.pid)), lambda n: n == 0,
             limit=3)
    first = heap()
    # while the server is stopped: one SIGCHLD for KILL_BATCH real deaths
    clients = forking(lab, server, KILL_BATCH, 0, 1)
    killed = killed_in_one_pass(lab, server, clients)
    none_left(lab, server, killed, 1)
    real, batch, claimed = killed, 1, 0
    while claimed < KILLED - KILL_BATCH - KILL_LAST:
        batch += 1
        count = min(KILL_BATCH, KILLED - KILL_BATCH - KILL_LAST - claimed)
        got = claimed_killed(lab, server, steer, steered, decoy, count,
                             killed, batch)
        killed += got
        claimed += count
    batch += 1  # the last, real again: the server still forks
    clients = forking(lab, server, KILL_LAST, killed, batch)
    for pid in children(server.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
            real += 1
    for client in clients:
        client.close()
    none_left(lab, server, killed, batch)
    for path in ("/", "/style.css"):
        served(lab, server, path, beside=f" (after {killed} children "
               "killed by SIGKILL: a count of live children that only a "
               "normal exit brings down drops every client once it "
               "reaches its cap)")
    grown = heap() - first
    heap_flat(lab, grown, f"{killed} children killed by SIGKILL",
              "something kept for each child (a list node, a record) is "
              "freed only when it exits normally (WIFEXITED); a child "
              "killed by a signal has exited all the same (WIFSIGNALED), "
              "and its entry stays for the server's whole life (and its "
              "stale PID, soon another process's, with it); watch: grep "
              "VmData /proc/PID/status before and after killing 10,000 "
              "children with kill -9")
    # No child is left: a stop that signals any PID signals a stranger's
    # process (a dead child's PID, reused). Each kill() is counted and
    # made to fail (ESRCH), not run: the strangers are spared.
    stop_kills = [int(pid) for pid in re.findall(
        r"^kill\((-?\d+),", _strace(server.pid, ["kill"], server.stop, "-e",
                                     "inject=kill:error=ESRCH"), re.M)]
    strangers = [pid for pid in stop_kills if pid != server.pid]
    lab.expect(not strangers, f"with no child left (all {killed} killed by "
               f"SIGKILL and reaped), the stop sent {len(strangers)} "
               f"signals (kill() to PID {strangers[0] if strangers else 0}, "
               "...): PIDs of children long gone, which the kernel gives to "
               "other processes: signal only children not yet reaped "
               "(forget a child when waitpid() returns it, however it "
               "died); watch: strace -e trace=kill -p PID, then kill -TERM "
               "PID")
    return (f"{killed} children killed by a signal ({real} real, "
            f"{killed - real} that fork() claimed and waitpid() reported "
            f"killed), the first {KILL_BATCH} reaped in one pass; still "
            "serving; heap "
            f"{grown:+} bytes; no signal sent at the stop")


def killed_in_one_pass(lab, server, clients):
    """With the server stopped, every child (one per client) is killed by
    SIGKILL and the clients close: the server resumes to one SIGCHLD for
    them all, and must reap all of them between two accept()s (strace).
    Returns how many were killed."""
    pids = children(server.pid)
    stop_now(server.pid)
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for client in clients:
            client.close()
        piled = wait_for(lambda: len(zombie_children(server.pid)),
                         lambda n: n >= len(pids), limit=8)
    except BaseException:
        os.kill(server.pid, signal.SIGCONT)
        raise

    def resume():
        os.kill(server.pid, signal.SIGCONT)
        wait_for(lambda: len(children(server.pid)), lambda n: n == 0,
                 limit=KILL_REAPED_S)

    seen = turns(server.pid, resume)
    one_pass = max(reaped for _, _, reaped in seen)
    lab.expect(one_pass >= piled, f"{piled} children killed by SIGKILL "
               "while the server was stopped (one SIGCHLD for them all), "
               f"but it reaped at most {one_pass} of them between two "
               "accept()s: the rest waited for a later turn (accept()'s "
               "1 s timeout, or the next client); collect until waitpid() "
               "says nothing more (0 or -1), not a fixed batch per turn; "
               "watch: strace -e trace=wait4,accept4 -p PID")
    return len(pids)


def unclosed(socks, limit):
    """How many of socks the server has neither answered nor closed within
    limit s (stretched by TIMEOUT): each is waited for, not slept on."""
    deadline = time.monotonic() + seconds(limit)
    left = 0
    for sock in socks:
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.recv(1)  # b"" (closed) or a byte: the server let it go
        except socket.timeout:
            left += 1
        except OSError:
            pass  # reset: closed all the same
        finally:
            sock.close()
    return left


@grader.check(10, f"fork() fails for {FORK_FAILS} clients, then works "
              "again: each is closed at once, one fork() each, no "
              "descriptor or heap kept; then the server serves and reaps "
              f"at once again; then, fork() claiming {FAKED} children that "
              "never exit, no client waits; then, just short of any cap, a "
              "failed fork() counts no child; then all of them exit: "
              "collected in one pass")
def fork_fails(lab):
    env, heap = heap_bytes(lab)
    forks, steer, steered = fork_steered(lab)
    env = {**forks, **env,
           "LD_PRELOAD": f"{env['LD_PRELOAD']} {forks['LD_PRELOAD']}"}
    server = lab.start(env=env)
    for _ in range(3):  # what the server allocates once, at its first
        served(lab, server)
    wait_for(lambda: len(live_children(server.pid)), lambda n: n == 0,
             limit=3)
    held, first = len(descriptors(server.pid)), heap()
    logged = server.stderr_path.stat().st_size
    hung, sent = [], [0]
    inject = ("-e", f"inject={','.join(FORKERS)}:error=EAGAIN")
    forked = re.compile(r"^(?:clone3?|v?fork)\(", re.M)

    def refuse(clients):
        def refused():
            while sent[0] < clients and not hung:
                batch = idle_clients(server.port, FAIL_BATCH)
                sent[0] += len(batch)
                left = unclosed(batch, FAIL_CLOSE_S)
                if left:
                    hung.append(left)
        return refused

    # the first batch alone, its fork() calls and pauses counted: a retry
    # (or a pause) is seen at once, not after 88 slow batches
    traced = _strace(server.pid, FORKERS + PAUSERS, refuse(FAIL_BATCH),
                     *inject)
    calls = len(forked.findall(traced))
    pauses = PAUSED.findall(traced)
    failed = len(re.findall(r"^(?:clone3?|v?fork)\(.*= -1 EAGAIN", traced,
                            re.M))
    if not hung and calls <= FAIL_BATCH and not pauses:
        # the rest with fork() failing in a preloaded library, not strace
        # (which stops the server at every system call: 8,700 clients)
        steer(-errno.EAGAIN)
        try:
            refuse(FORK_FAILS)()
        finally:
            steer(0)
        failed += steered()
    now = wait_for(lambda: len(descriptors(server.pid)),
                   lambda n: n <= held, limit=0 if hung else 3)
    lab.expect(not hung, f"{hung[0] if hung else 0} of {FAIL_BATCH} "
               f"clients (after {sent[0] - FAIL_BATCH} others) neither "
               f"answered nor closed within {seconds(FAIL_CLOSE_S):.0f} s "
               "while every fork() failed (EAGAIN, as at the process "
               f"limit); the server holds {now} descriptors, {held} before: "
               "when fork() fails, the parent must still close its copy of "
               "the client (the client learns at once, and the descriptors "
               "do not pile up until accept() fails with EMFILE); watch: "
               "strace -e inject=clone:error=EAGAIN -p PID, then curl -m 5 "
               "http://127.0.0.1:8000/; ls /proc/PID/fd | wc -l")
    lab.expect(calls <= FAIL_BATCH and not pauses, f"{calls} fork() calls "
               f"and {len(pauses)} pauses ("
               f"{', '.join(sorted(set(p[:-1] for p in pauses))) or 'none'}"
               f"; any of {', '.join(PAUSERS)} counts) for {FAIL_BATCH} "
               "clients while every fork() failed (EAGAIN, as at the process "
               "limit): a failed fork() is retried or waited on. Drop the "
               "client at once, one fork() each: at the limit a retry "
               "seldom succeeds, and while the loop pauses or retries no "
               "other client is accepted (it took a retrying server 2 s "
               "for 100 refusals that take the reference 0.02 s); watch: "
               "strace -e trace=clone,nanosleep,poll -e inject=clone:"
               "error=EAGAIN -p PID, then curl http://127.0.0.1:8000/")
    wrote = server.stderr_path.stat().st_size - logged
    lab.expect(wrote <= QUIET, f"the server wrote {wrote} bytes to stderr "
               f"over {failed} failed fork()s (at most {QUIET}; it was "
               "started with ZEROHTTPD_LOG unset): a line per failed fork() "
               "(one per client dropped) where the servers are quiet by "
               "default (docs/DESIGN.md: logging must never be what limits "
               "a load test); on a stderr pipe that nobody drains, the "
               "server blocks in write() once 64 KiB are written, and "
               "accepts no one; log only when server.log is set, or once; "
               "watch: mkfifo f; sleep 1000 <f & ./forking 8000 2>f & then "
               "10,000 clients with strace -e inject=clone:error=EAGAIN")
    lab.expect(now <= held, f"the server holds {now} descriptors after "
               f"{sent[0]} clients whose fork() failed, {held} before: each "
               "failed fork() must still close the client's descriptor; "
               "watch: ls /proc/PID/fd | wc -l")
    grown = heap() - first
    heap_flat(lab, grown, f"{failed} failed fork()s",
              "something allocated for a child before fork() (a record of "
              "it, a list node) is never freed when fork() fails and there "
              "is no child; free it on that path too; watch: grep VmData "
              "/proc/PID/status before and after 10,000 clients with "
              "strace -e inject=clone:error=EAGAIN -p PID")
    for path in ("/", "/style.css"):  # fork() works again
        status, said = asked(server, path)
        lab.expect(status == 200, f"GET {path} {said} once "
                   f"fork() worked again, after {failed} failed "
                   f"fork()s (EAGAIN) for {sent[0]} clients, with "
                   f"{len(live_children(server.pid))} children running: a "
                   "count of live children raised even when fork() failed "
                   "(it returned -1: no child, no exit to bring it down) "
                   "reaches its cap and drops every client for good; count "
                   "only a fork() that returned a PID; watch: strace -e "
                   "inject=clone:error=EAGAIN:when=1..9000 -p PID, then "
                   "9,000 clients and curl http://127.0.0.1:8000/")
    enomem_survived(lab, server, steer, heap)
    slowest = reaps_when_idle(lab, server, f", after {failed} failed "
                              "fork()s; SIGCHLD still blocked? SigBlk in "
                              "/proc/PID/status: a sigprocmask() restore "
                              "that the failed fork()'s return skips")
    let_go, claimed, after = at_the_cap(lab, server, steer, steered, heap)
    return (f"{sent[0]} clients closed at once while {failed} fork()s "
            f"failed, {calls} calls for the first {FAIL_BATCH}; "
            f"descriptors {held} then {now}; heap {grown:+} bytes; serving "
            f"again, a child reaped {slowest:.2f} s after its answer; then "
            f"{let_go} clients let go at once while fork() claimed a "
            f"child for each; all {claimed} exits collected in one pass, "
            f"then a child reaped {after:.2f} s after its answer")


def enomem_survived(lab, server, steer, heap):
    """fork() fails with ENOMEM (memory, a memory cgroup's limit), not
    EAGAIN, and so does every allocation of the server itself (heap.refuse:
    memory is short), for ENOMEM_CLIENTS clients, one by one: each is
    closed within FAIL_CLOSE_S, and the server serves on (a GET / right
    after answers 200)."""
    steer(-errno.ENOMEM)
    heap.refuse(True)
    socks = []
    try:
        for _ in range(ENOMEM_CLIENTS):  # one by one: a server that exits
            try:  # at the first refuses the rest
                socks.append(socket.create_connection(
                    ("127.0.0.1", server.port), timeout=5))
            except ConnectionError:
                break
        left = unclosed(socks, FAIL_CLOSE_S)
    finally:
        steer(0)
        heap.refuse(False)
    refused = heap.refused()
    status, said = asked(server, "/")
    code = server.proc.poll()
    lab.expect(status == 200 and not left, f"{len(socks)} clients for "
               "whom fork() failed with ENOMEM (not EAGAIN: memory short, "
               "a memory cgroup's limit; the server's own malloc() failing "
               f"too, {refused} times): {left} not closed within "
               f"{seconds(FAIL_CLOSE_S):.0f} s, and GET / right after, "
               f"memory back, {said}" + (f"; the server exited (status "
                                         f"{code})" if code is not None
                                         else "") + ": whatever fork()'s "
               "error (EAGAIN, ENOMEM), drop the client and serve on, and "
               "as much when malloc() fails (no client can stop a server: "
               "only EAGAIN handled, any other error, or a failed malloc(), "
               "sent to die()?); watch: strace -e inject=clone:"
               "error=ENOMEM:when=1 -p PID, then curl twice")


def short_of_the_cap(lab, server, steer, heap, decoy, claimed):
    """Every cap reached (at_the_cap), CAP_SLACK of the `claimed` children
    that fork() claimed (each of PID decoy) exit: any cap is CAP_SLACK off.
    Then NEAR_FAILS clients for whom fork() fails with EAGAIN, then as
    many with ENOMEM (and the server's malloc() too): each must be closed
    within FAIL_CLOSE_S, and a GET / after each error must answer 200 (a
    count of live children raised by a fork() that failed with it reaches
    its cap again and drops every client). Returns how many exited."""
    freed = min(claimed, CAP_SLACK)
    steer.exits(decoy, freed)
    try:
        os.kill(server.pid, signal.SIGCHLD)
        _, pending, _ = wait_for(steer.exited, lambda seen: not seen[1],
                                 limit=5)
    finally:
        steer.exits(decoy, 0)
    lab.expect(not pending, f"{pending} of {freed} children (that fork() "
               f"claimed) not collected {seconds(5):.0f} s after they "
               f"exited, one SIGCHLD for them all; {WATCH}")
    for error in (errno.EAGAIN, errno.ENOMEM):
        steer(-error)
        heap.refuse(error == errno.ENOMEM)
        sent, left = 0, 0
        try:
            while sent < NEAR_FAILS and not left:
                batch = idle_clients(server.port, FAIL_BATCH)
                sent += len(batch)
                left = unclosed(batch, FAIL_CLOSE_S)
        finally:
            steer(0)
            heap.refuse(False)
        name = errno.errorcode[error]
        status, said = asked(server, "/")
        lab.expect(status == 200 and not left, f"{sent} clients for whom "
                   f"fork() failed with {name}" + (
                       " (memory short: the server's own malloc() failing "
                       "too)" if error == errno.ENOMEM else "") + ", once "
                   f"{freed} of the {claimed} children that fork() had "
                   "claimed (past any cap on live children) had exited: "
                   f"{left} not closed within {seconds(FAIL_CLOSE_S):.0f} "
                   f"s, and GET / right after {said}: a count of live "
                   f"children raised by a fork() that failed with {name} "
                   "(it returned -1: no child, no exit to bring it down) "
                   "reaches its cap and drops every client for good; count "
                   "only a fork() that returned a PID, whatever fork()'s "
                   "error; watch: strace -e inject=clone:error="
                   f"{name}:when=1..9000 -p PID with 9,000 clients, then "
                   "curl http://127.0.0.1:8000/")
    return freed


def at_the_cap(lab, server, steer, steered, heap):
    """Every fork() of the server "succeeds" without making a child (it
    returns the PID of a `sleep` of the grader's, no child of the server's,
    which never exits: fork_steered) for FAKED clients, FAIL_BATCH at a
    time, while one real child serves a keep-alive client: any count of
    live children up to CAP_MOST reaches its cap, and stays there. Each
    client must still be let go (answered or closed) within FAIL_CLOSE_S:
    at the cap the loop drops the client, it never waits for a child to
    exit. Once every cap is reached (CAP_FULL clients), if the server
    calls fork() for none of the rest (it drops them at its cap), its heap
    (heap()) may not grow over them. Then every child fork() claimed
    exits at once (waitpid() says so: steer.exits), one SIGCHLD for them
    all: the server must collect them all between two accept()s, and,
    its cap no longer reached, serve and reap an idle child at once again
    (reaps_when_idle). (First CAP_SLACK of them exit, and fork() fails for
    a while: short_of_the_cap.) Returns (how many clients were let go, how many
    claimed children exited, the slowest reap after)."""
    decoy = subprocess.Popen(["sleep", "600"])
    hung, sent, before, full = [], [0], steered(), None
    try:
        with HeldClients(server.port, 1) as held:  # a child that lives on
            lab.expect(held.answered, "; ".join(held.errors[:1]))
            steer(decoy.pid)
            try:
                while sent[0] < FAKED and not hung:
                    if sent[0] == CAP_FULL:
                        full = (heap(), steered())
                    batch = idle_clients(server.port, FAIL_BATCH)
                    sent[0] += len(batch)
                    left = unclosed(batch, FAIL_CLOSE_S)
                    if left:
                        hung.append(left)
            finally:
                steer(0)
            lab.expect(not hung, f"{hung[0] if hung else 0} of "
                       f"{FAIL_BATCH} clients (after "
                       f"{sent[0] - FAIL_BATCH} others, each with a child "
                       f"by fork()'s word, {steered() - before} fork()s, none of "
                       "whose children exits) neither answered nor closed "
                       f"within {seconds(FAIL_CLOSE_S):.0f} s, while one "
                       "child still served a keep-alive client: at its cap "
                       "on live children the accept loop waits for a child "
                       "to exit (waitpid without WNOHANG?) and accepts no "
                       "one meanwhile; at the cap, drop the client as when "
                       "fork() fails, never wait; watch: hold CAP clients "
                       "(nc 127.0.0.1 8000), then curl -m 5 "
                       "http://127.0.0.1:8000/")
            forked = steered() - full[1]
            if not forked:  # at its cap: each client dropped, no fork()
                heap_flat(lab, heap() - full[0], f"{FAKED - CAP_FULL} "
                          "clients dropped at the server's cap on live "
                          "children (no fork() called for them; fork() had "
                          f"claimed a child, never exiting, for {CAP_FULL} "
                          "before)", "something allocated for each client "
                          "before the cap test (a list node) is not freed "
                          "when the client is dropped at the cap; a server "
                          "held at its cap by slow clients grows without "
                          "bound; allocate after the cap test, or free it "
                          "on that path too; watch: grep VmData "
                          "/proc/PID/status while 30,000 clients connect "
                          "at the cap")
            claimed = steered() - before
            freed = short_of_the_cap(lab, server, steer, heap, decoy.pid,
                                     claimed)
            all_exit(lab, server, steer, decoy.pid, claimed - freed)
        wait_for(lambda: len(children(server.pid)), lambda n: n == 0,
                 limit=3)  # the keep-alive client's child, gone
        slowest = reaps_when_idle(lab, server, f", after {claimed} children "
                                  "that fork() claimed, past any cap on live "
                                  "children, had all exited: SIGCHLD still "
                                  "blocked? SigBlk in /proc/PID/status: a "
                                  "sigprocmask() restore that the cap "
                                  "path's drop (continue) skips")
    finally:  # the server first: a stop that signals the PIDs fork() gave
        with contextlib.suppress(AssertionError):  # must find the decoy
            server.terminate(timeout=seconds(10))
        decoy.kill()
        decoy.wait()
    return sent[0], claimed, slowest


def all_exit(lab, server, steer, pid, claimed):
    """The `claimed` children that fork() claimed (each of PID pid) all
    exit at once: waitpid() (or waitid()) for any child reports them, one
    SIGCHLD for them all. The server must collect every one between two
    accept()s, as it would real children (a fixed batch per pass leaves
    the rest to accept()'s 1 s timeout)."""
    steer.exits(pid, claimed)
    try:
        os.kill(server.pid, signal.SIGCHLD)
        reported, pending, turned = wait_for(
            steer.exited, lambda seen: not seen[1] or seen[2], limit=5)
        first = steer.first_pass() if turned else reported
    finally:
        steer.exits(pid, 0)
    lab.expect(not pending and not turned, f"{claimed} children (that "
               "fork() claimed) exited at once, one SIGCHLD for them all: "
               f"the server collected {first} of them" + (
                   f", then called accept() with {claimed - first} still "
                   "uncollected" if turned else
                   f", and {pending} were still uncollected "
                   f"{seconds(5):.0f} s later") + ": not all in one "
               "pass; collect until waitpid() says nothing more (0 or -1), "
               "not a fixed batch per pass (the rest wait for accept()'s "
               "1 s timeout or the next client); watch: strace -e "
               "trace=wait4,accept4 -p PID while 10,000 children exit at "
               "once")


@grader.check(10, f"ab {' '.join(LOAD)}: every request served, no zombie "
              "and no child left; the server's heap does not grow")
def under_load(lab):
    env, heap = heap_bytes(lab)
    server = lab.start(env=env, blocked=(signal.SIGCHLD,))
    for _ in range(3):  # what the server allocates once, at its first
        served(lab, server)
    wait_for(lambda: len(live_children(server.pid)), lambda n: n == 0,
             limit=3)
    first = heap()
    most, done_loading = [0], threading.Event()

    def count_zombies():  # while the load runs, not only after it
        while not done_loading.wait(0.05):
            most[0] = max(most[0], len(zombie_children(server.pid)))

    counter = threading.Thread(target=count_zombies, daemon=True)
    counter.start()
    done = []

    def load():
        done.append(subprocess.run(
            ["ab", "-q", *LOAD, "-s", str(int(seconds(30))),
             f"http://127.0.0.1:{server.port}/"],
            capture_output=True, text=True, timeout=seconds(120)))

    try:
        seen = turns(server.pid, load)[1:]
    finally:
        done_loading.set()
        counter.join()
    done = done[0]
    lab.expect(done.returncode == 0 and "Failed requests:        0"
               in done.stdout, "ab failed: " + ab_said(done) +
               (f" (the server exited, status {server.proc.poll()})"
                if server.proc.poll() is not None else ""))
    zombies_gone(lab, server, f"ab {' '.join(LOAD)} ended (the server "
                 "was started with SIGCHLD blocked, as a parent may start "
                 "it: the loop reaps each turn, signal or not)")
    lab.expect(most[0] <= PILED, f"{most[0]} zombies at once during ab "
               f"{' '.join(LOAD)}: reap on every turn of the loop, not only "
               "when accept() was interrupted")
    # each accept that returned a client, but the last, is a turn of the
    # loop: a waitpid() before the next accept, whatever the signal did
    turned = [calls for fd, calls, _ in seen[:-1] if fd >= 0]
    skipped = sum(not calls for calls in turned)
    lab.expect(not skipped, f"{skipped} of {len(turned)} turns of the "
               "accept loop (an accept() that returned a client, then the "
               "next accept()) called no waitpid() (nor waitid()) during ab "
               f"{' '.join(LOAD)} with SIGCHLD blocked: the zombies pile up "
               "between reaps (each holds a PID); reap on every turn, not "
               "every Nth or only when accept() fails; watch: strace -e "
               "trace=wait4,accept4 -p PID")
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n == 0, limit=3)
    lab.expect(alive == 0, f"{alive} children still running 3 s after the "
               "last client (ps -o pid,stat,wchan --ppid PID)")
    grown = heap() - first
    heap_flat(lab, grown, f"ab {' '.join(LOAD)}",
              "something kept for every child (a growing array of PIDs or "
              "statuses) is never freed, and a server runs for months; "
              "keep nothing per child, or free it when it is reaped; "
              "watch: grep VmData /proc/PID/status before and after ab "
              "-n 100000 -c 50", whose="in the server itself, not its "
              "children")
    return (f"at most {most[0]} zombies at once; a waitpid() on each of "
            f"{len(turned)} turns; heap {grown:+} bytes")


@grader.check(15, "a client is served while another client's child is busy; "
              "a child stopped and continued by an operator counts as one")
def never_blocks(lab):
    server = lab.start()
    with HeldClients(server.port, 1) as held:  # its child lives on
        lab.expect(held.answered, "; ".join(held.errors[:1]))
        for k in range(3):  # each new client's child exits in turn
            # once every other child has exited and been reaped, the
            # server waiting in accept(): the last exit's SIGCHLD
            # interrupted it (EINTR), and the reaper ran with a child
            # still serving
            wait_for(lambda: (len(live_children(server.pid)),
                              len(zombie_children(server.pid))),
                     lambda n: n == (1, 0), limit=3)
            served(lab, server, limit=3, beside=f" (new client {k + 1} of "
                   "3, one after another, each once the other children "
                   "had exited and been reaped, the last one's SIGCHLD "
                   "interrupting accept(), which leaves EINTR in errno) "
                   "while one keep-alive client was being served by its "
                   "child")
    lab.expect(not held.errors, "; ".join(held.errors[:1]))
    stopped_and_continued(lab, server)


def stopped_and_continued(lab, server):
    """An operator stops one child (SIGSTOP) while it serves a keep-alive
    client, a request is served meanwhile (a turn of the loop, whose reaper
    may see the stop), the child is continued (SIGCONT), then its client
    closes and it exits: the server must serve on. A count of live children
    brought down by every PID waitpid() returns (WUNTRACED, WCONTINUED
    report stops and continues too) goes below zero (an unsigned one wraps,
    past any cap) and drops every client."""
    wait_for(lambda: len(children(server.pid)), lambda n: n == 0, limit=3)
    with HeldClients(server.port, 1, every=3600) as held:  # asks once
        lab.expect(held.answered, "; ".join(held.errors[:1]))
        kids = wait_for(lambda: live_children(server.pid),
                        lambda found: len(found) == 1, limit=3)
        lab.expect(len(kids) == 1, f"{len(kids)} children for one "
                   "keep-alive client")
        os.kill(kids[0], signal.SIGSTOP)
        try:
            wait_stopped(kids[0])
            served(lab, server, limit=3, beside=" (one other child, "
                   "serving a keep-alive client, stopped by SIGSTOP)")
            wait_for(lambda: (len(live_children(server.pid)),
                              len(zombie_children(server.pid))),
                     lambda n: n == (1, 0), limit=3)
        finally:
            os.kill(kids[0], signal.SIGCONT)
    wait_for(lambda: len(children(server.pid)), lambda n: n == 0, limit=3)
    for path in ("/", "/style.css"):
        status, said = asked(server, path)
        lab.expect(status == 200, f"GET {path} {said} after one child, "
                   "serving a keep-alive client, was stopped (SIGSTOP) and "
                   "continued (SIGCONT), as an operator may, then exited "
                   "(its client closed), with "
                   f"{len(children(server.pid))} children left: a count of "
                   "live children brought down by every PID waitpid() "
                   "returns, with WUNTRACED or WCONTINUED (which report a "
                   "stop and a continue too), counts that child 3 times "
                   "and goes below zero (an unsigned count wraps past any "
                   "cap, and every client is dropped); count down only an "
                   "exit (WIFEXITED or WIFSIGNALED), or ask only for exits "
                   "(no WUNTRACED/WCONTINUED); watch: kill -STOP then -CONT "
                   "a child serving nc 127.0.0.1 8000, close nc, then curl "
                   "http://127.0.0.1:8000/")


def reaps_when_idle(lab, server, after=""):
    """On the idle server, a request whose child exits once it has
    answered, IDLE_ROUNDS times: no child left IDLE_REAP_S after each
    answer (not stretched by TIMEOUT). Returns the slowest, in seconds.
    after: what came before, for the message."""
    slowest = 0
    for k in range(IDLE_ROUNDS):
        served(lab, server, "/notes.txt")  # HTTP/1.0: its child then exits
        answered = time.monotonic()
        left = wait_for(lambda: len(zombie_children(server.pid)) +
                        len(live_children(server.pid)), lambda n: n == 0,
                        limit=IDLE_REAP_S / seconds(1))
        took = time.monotonic() - answered
        lab.expect(left == 0, f"{left} child (zombie or exiting) still "
                   f"there {IDLE_REAP_S} s after its answer, on an idle "
                   f"server (request {k + 1} of {IDLE_ROUNDS}{after}): the "
                   "exit waits for the next client or accept()'s 1 s "
                   "timeout; SIGCHLD must interrupt accept() (a handler "
                   "installed for it, as the starter's on_child, not SIG_DFL "
                   "or a blocked SIGCHLD) so that the loop reaps at once; "
                   "watch: curl -s -o /dev/null http://127.0.0.1:8000/; ps "
                   "-o pid,stat --ppid PID")
        slowest = max(slowest, took)
        time.sleep(0.2)
    return slowest


@grader.check(5, f"an idle server reaps a child within {IDLE_REAP_S} s of "
              f"its answer ({IDLE_ROUNDS} times): SIGCHLD interrupts "
              "accept(); out of descriptors, it pauses between accept()s")
def idle_reap(lab):
    server = lab.start()
    slowest = reaps_when_idle(lab, server)
    failed, paused = pauses_at_emfile(lab, server)
    return (f"reaped within {slowest:.2f} s of the answer; {failed} "
            f"accept()s failed with EMFILE, {paused} pauses")


def pauses_at_emfile(lab, server):
    """The idle server (no child left) runs out of descriptors: its
    RLIMIT_NOFILE lowered to its lowest free descriptor, so that accept()
    fails with EMFILE. strace watches until
    it has seen EMFILE_SEEN such failures: the loop must pause (nanosleep)
    between them (the starter's EMFILE_PAUSE_MS), not spin. Then the limit
    is put back and the server serves again. Returns (failures, pauses)."""
    wait_for(lambda: len(children(server.pid)), lambda n: n == 0, limit=3)
    held = descriptors(server.pid)
    lowest = min(set(range(len(held) + 1)) - set(held))
    limits = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
    out = lab.workdir / "emfile.strace"
    # accept() takes its descriptor before it waits for a client: with the
    # limit lowered, the next accept() (once the one under way times out,
    # SO_RCVTIMEO) fails with EMFILE, client or not. No client: one
    # accepted by the accept() under way would leave a child alive, and
    # waitpid() would say 0, not ECHILD.
    def counted():
        text = out.read_text(errors="replace")
        return (len(re.findall(r"^accept4?\(.*= -1 EMFILE", text, re.M)),
                len(re.findall(r"^(?:clock_)?nanosleep\(", text, re.M)))

    tracer = _attached(server.pid, out)
    try:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE,
                         (lowest, limits[1]))
        wait_for(counted, lambda n: n[0] >= EMFILE_SEEN, limit=5)
    finally:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, limits)
        detach_strace(tracer)
    failed, paused = counted()
    lab.expect(failed > 0, "accept() never failed with EMFILE with "
               f"RLIMIT_NOFILE lowered to {lowest}, the lowest descriptor "
               "free")
    lab.expect(failed <= EMFILE_PER_PAUSE * (paused + 1), f"{failed} "
               f"accept()s failed with EMFILE and the loop paused "
               f"(nanosleep) {paused} times in between, out of descriptors "
               "(RLIMIT_NOFILE lowered to the lowest free one) on an idle "
               "server, no child left: it spins, retrying at once, where "
               "the starter pauses EMFILE_PAUSE_MS. Is errno changed "
               "between accept() and its EMFILE test (a waitpid() with no "
               "child left fails with ECHILD, and sets errno)? Reap in the "
               "loop, not between accept() and that test, or keep errno; "
               "watch: prlimit --nofile=5 -p PID, then strace -c -e "
               "trace=accept4,nanosleep,clock_nanosleep -p PID")
    served(lab, server, beside=" (once RLIMIT_NOFILE was put back, after "
           "accept() had failed with EMFILE)")
    return failed, paused


def _attached(pid, out):
    """strace attached to pid, logging its accepts and pauses into out."""
    return attach_strace(pid, "-q", "-o", str(out), "-e",
                         "trace=accept4,accept," + ",".join(SLEEPERS))


@grader.check(10, f"waitpid() collects each of {SERIAL} children's exit "
              "status")
def collects_statuses(lab):
    server = lab.start()

    def serve_serially():
        for _ in range(SERIAL):
            served(lab, server)
        wait_for(lambda: len(live_children(server.pid)),
                 lambda n: n == 0, limit=3)
        served(lab, server)  # one more turn of the loop after the last exit

    returned = [pid for pid in map(reaped_pid, _strace(
        server.pid, REAPERS, serve_serially).splitlines()) if pid is not None]
    reaped = [pid for pid in returned if pid > 0]
    left = len(zombie_children(server.pid))
    lab.expect(len(reaped) >= SERIAL, f"waitpid() (or waitid()) returned "
               f"{len(reaped)} "
               f"children's PIDs for {SERIAL + 1} children" + (
                   f", failed {returned.count(-1)} times, and {left} are "
                   "still zombies: it asks for none of the server's "
                   "children (-PID means process group PID, not the "
                   "children of PID)" if left else ": the rest were never "
                   "collected by waitpid() or waitid() (SIGCHLD ignored, or "
                   "SA_NOCLDWAIT: their exit statuses are lost)")
               + "; watch: strace -e trace=wait4,waitid,rt_sigaction -p PID")


@grader.check(10, f"a child that exits while waitpid() is under way is "
              f"reaped ({ROUNDS} times, each waitpid() slowed by {SLOWED} s)")
def no_lost_wakeup(lab):
    server = lab.start()
    stranded = []

    def exit_while_reaping():
        """Two children each round: the first exits, and the second
        while the reaper's last waitpid() (the one that finds nothing
        more) is under way: its SIGCHLD comes while the reaper runs."""
        for _ in range(ROUNDS):
            first, second = idle_clients(server.port, 2)
            two = wait_for(lambda: live_children(server.pid),
                           lambda kids: len(kids) >= 2, limit=5)
            first.close()
            # The window is timed from the first child's exit, not from
            # the close: on a busy machine that child may take a while to
            # see its client gone and exit.
            wait_for(lambda: live_children(server.pid),
                     lambda kids: not set(two) <= set(kids), limit=5)
            time.sleep(SLOWED * 1.5)  # inside the waitpid() that finds 0
            second.close()
            # Children live or not: at the close the second is still alive
            # (it has yet to see its client gone), and a count of zombies
            # alone, read at once, would say 0.
            left = wait_for(lambda: len(children(server.pid)),
                            lambda n: n == 0, limit=2 + 4 * SLOWED)
            if left:
                stranded.append(left)
                return

    slowed(server.pid, ",".join(REAPERS), SLOWED, exit_while_reaping)
    lab.expect(not stranded, f"a zombie {seconds(2 + 4 * SLOWED):.0f} s "
               "after a child exited while the reaper ran (each waitpid() "
               f"returned {SLOWED} s late: strace -e inject=wait4:"
               f"delay_exit={int(SLOWED * 1e6)} -p PID widens the window): "
               "its SIGCHLD was lost (a flag cleared after the loop it "
               "guards?)")


@grader.check(5, "SIGTERM stops it at once while a keep-alive client is "
              "being served and another's child is stopped (SIGSTOP)")
def stops_while_serving(lab):
    server = lab.start()
    kept = Connection(server.port, timeout=seconds(5))  # served, then idle
    hit = len(launcher_hit)
    kept.send(REQUEST)
    lab.expect(kept.read_response().status == 200, "GET /notes.txt on "
               "a keep-alive connection did not answer 200")
    # its child, stopped by an operator (SIGSTOP) as it idles: no signal
    # but SIGKILL and SIGCONT reaches it now, a SIGTERM waits
    paused = live_children(server.pid)
    try:
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        for pid in paused:
            wait_stopped(pid)
        with HeldClients(server.port, 1):  # its child never exits by itself
            started = time.monotonic()
            try:
                server.terminate(timeout=seconds(3))
            except AssertionError:
                raise Unmet(f"still running {seconds(3):.0f} s after "
                            "SIGTERM while one keep-alive client was being "
                            "served and another's child was stopped "
                            "(SIGSTOP, as an operator may): does the stop "
                            "wait for a child still serving, or for one "
                            "that is stopped, which no SIGTERM ends until "
                            "it is continued (waitpid without WNOHANG)? "
                            "Stop at once: PR_SET_PDEATHSIG ends each child; "
                            "watch: kill -STOP a child serving nc "
                            "127.0.0.1 8000, then kill -TERM PID") from None
    finally:  # once the server has exited: the PDEATHSIG SIGTERM pending
        for pid in paused:  # in each, it exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    server.check_exit()
    launcher_spared(lab, hit)
    took = time.monotonic() - started
    try:  # every worker is gone by now (check_exit): nobody may answer
        kept.send_tolerating_reset(REQUEST)
        still = kept.read_response().status
    except (OSError, AssertionError):
        still = None  # closed, reset or silent: nobody serves it
    finally:
        kept.close()
    lab.expect(still is None, f"a keep-alive client was still answered "
               f"({still}) after the server had exited and its children "
               "were gone: a process outside the server's tree serves it "
               "(a double fork's grandchild, adopted by init: no exit "
               "status for the server, no PR_SET_PDEATHSIG, left behind at "
               "stop); watch: ps -eo pid,ppid,cmd | grep forking after "
               "kill -TERM PID while curl keeps a connection")
    return f"stopped in {took:.1f} s"


@grader.check(5, "the signal handler is async-signal-safe (source review, "
              "macros expanded)")
def safe_handler(lab):
    note = reviewed(lab)
    expanded = expanded_source(lab)
    if expanded is not None:  # a call a macro hides is a call all the same
        try:
            reviewed(SimpleNamespace(source=expanded, expect=lab.expect))
        except Unmet as unmet:
            raise Unmet(f"{unmet} (the line as the preprocessor expands "
                        "it, cc -E: a macro that hides a call is reviewed "
                        "as that call)") from None
    return note or "every handler call is async-signal-safe; errno kept"


def reviewed(lab):
    """review_handlers, but errno path by path (keeps_errno)."""
    try:  # the calls; errno is reviewed below, path by path
        note = review_handlers(lab)
    except Unmet as unmet:
        if "does not save and restore errno" not in str(unmet):
            raise
        note = None
    keeps_errno(lab)
    return note


def expanded_source(lab):
    """The student's file as the preprocessor expands it (cc -E), its own
    lines only, each at its line number, errno written as errno: a file
    in the check's work dir, or None if it does not preprocess."""
    done = subprocess.run(["cc", "-E", "-std=gnu11", str(lab.source)],
                          capture_output=True, text=True,
                          cwd=lab.source.parent)
    if done.returncode != 0:
        return None
    lines, current, number = {}, None, 0
    for line in done.stdout.splitlines():
        marker = re.match(r'# (\d+) "(.*)"', line)
        if marker:
            number, current = int(marker[1]), marker[2]
            continue
        if current == str(lab.source):
            lines[number] = (lines.get(number, "") + " " + line).strip()
        number += 1
    count = len(lab.source.read_text(errors="replace").splitlines())
    text = "\n".join(lines.get(n, "") for n in range(1, count + 1)) + "\n"
    text = re.sub(r"[ \t]+", " ", text)  # cc -E spaces out what it expands
    text = text.replace("(*__errno_location ())", "errno")
    text = re.sub(r"\b__extension__\b", "", text)
    path = lab.workdir / "expanded.c"  # removed with the check's work dir
    path.write_text(text)
    return path


def keeps_errno(lab):
    """Every signal handler gives errno back as it found it: it calls
    nothing, or saves errno before its first call and restores it after
    its last and before every return that follows a call, or calls only
    functions of the file that do so themselves. Fails quoting the line."""
    text = source_text(lab)
    code, lines = code_only(text), text.splitlines()
    handlers = signal_handlers(code)

    def line_of(first, body, at):
        number = first + body.count("\n", 0, at)
        return f"line {number}: {lines[number - 1].strip()[:70]!r}"

    def problem(name, handler, seen):
        """None if function `name` keeps errno, else what it does wrong."""
        found = function_body(code, name)
        if not found or name in seen:
            return None
        seen = seen | {name}
        first, body = found
        calls = [m for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", body)
                 if m[1] not in C_WORDS and not m[1].isupper()]
        if not calls:
            return None
        save = re.search(r"\b\w+\s*=\s*errno\b", body)
        restores = [m.start() for m in re.finditer(r"\berrno\s*=[^=]", body)]
        who = (f"the signal handler {name}()" if name == handler else
               f"{name}(), which the signal handler {handler}() runs,")
        if not save or not restores:  # fine if its callees keep errno
            for call in calls:
                if not function_body(code, call[1]):
                    return (f"{who} calls {call[1]}() "
                            f"({line_of(first, body, call.start())}) but "
                            "does not save and restore errno")
                wrong = problem(call[1], handler, seen)
                if wrong:
                    return wrong
            return None
        if save.start() > calls[0].start():
            return (f"{who} calls {calls[0][1]}() "
                    f"({line_of(first, body, calls[0].start())}) before it "
                    f"saves errno ({line_of(first, body, save.start())}): "
                    "a call that fails there sets errno for good")
        if max(restores) < calls[-1].start():
            return (f"{who} calls {calls[-1][1]}() "
                    f"({line_of(first, body, calls[-1].start())}) after it "
                    "restores errno")
        for ret in re.finditer(r"\breturn\b", body):
            called = [c.start() for c in calls if c.start() < ret.start()]
            if called and not any(called[-1] < r < ret.start()
                                  for r in restores):
                return (f"{who} returns "
                        f"({line_of(first, body, ret.start())}) after a "
                        "call without restoring the errno it saved "
                        f"({line_of(first, body, save.start())})")
        return None

    for handler in sorted(handlers):
        wrong = problem(handler, handler, set())
        lab.expect(not wrong, f"{wrong}: the handler leaves errno changed "
                   "for the code it interrupted (an accept() about to test "
                   "EMFILE, say): save errno first thing, restore it on "
                   "every way out")


@grader.check(10, "still serving pages and the guestbook; a clean stop, "
              "in its launcher's process group")
def clean_stop(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        served(lab, server, path)
    group = os.getpgid(server.pid)
    lab.expect(group == os.getpgrp(), f"the server runs in process group "
               f"{group}, not in its launcher's ({os.getpgrp()}): it left "
               "it (setpgid(), setsid()), so a Ctrl-C, SIGINT to the "
               "terminal's foreground group, no longer reaches it; stop "
               "only the server's own children, by their PIDs; watch: ps "
               "-o pid,pgid,cmd -p PID")
    hit = len(launcher_hit)
    server.stop()  # exit 0, summary printed, no process left behind
    launcher_spared(lab, hit)


def lead_own_group():
    """The grader leads a process group of its own, in which its servers
    run (a server started by a script, make or a shell without job control
    shares its launcher's group): a server that signals its whole group
    (kill(0, ...)) then reaches this grader, which notes it, and not
    tools/lab or the shell above. Since a terminal's ^C no longer reaches
    this group, the grader gets SIGINT when its parent dies."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, lambda *_: launcher_hit.append(1))
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PDEATHSIG
    if os.getppid() != parent:  # it died before prctl
        raise KeyboardInterrupt


if __name__ == "__main__":
    lead_own_group()
    grader.main()
