#!/usr/bin/env python3
"""Grader for the fibers lab (labs/fibers/README.md).

The switch is graded by serving: a stack laid out wrong (a register too
many, the return address misplaced, misaligned for fiber_main) kills the
server as its first fiber runs. The guard is graded in /proc/PID/maps: a
PROT_NONE page right below each fiber's stack, and gone with it."""

import errno
import mmap
import os
import resource
import select
import selectors
import socket
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

from grading import (Grader, asking_clients, build,  # labs/grading.py
                     build_shim,
                     build_reference, death_telling, failing, get,
                     heap_blocks, idle_clients, raise_open_file_limit,
                     seconds, status_field, stopped,
                     wait_for, wait_stopped)
from processes import (fd_count, free_port,  # tests/processes.py
                       guarded_stacks, settled)

CLIENTS = 200  # kept connections served at once: a fiber each
REFUSED = 1000  # clients that come while every mprotect() fails (strace)
REFUSED_KIB = 64  # address space they may leave behind, all of them (a page
# kept per refusal: 4,000 KiB)
REFUSED_BLOCKS = 200  # malloc'd blocks they may leave behind (1 each: 1000)
HELD = 50  # clients served before mprotect() fails, that leave while it
# fails: their fibers are freed then, and each guard must go with its stack
ERRORS = ("EACCES", "ENOMEM")  # mprotect's errors, half the clients each
BATCH_S = 10  # a hundred clients each answered or closed within this
PACE = 5  # hundreds of clients timed for each error, mprotect() failing by
# a preloaded shim (no tracer: strace's stops would be most of the time)
REFUSE_S = 0.05  # the median hundred refused within this (0.5 ms a client;
# queued while it is stopped; the reference: about 0.003 s, 0.02 on a
# machine many times overloaded; any
# pause of 1 ms a refusal, usleep(1000) or fiber_sleep(1), takes 0.1 s at
# least, however idle the machine)
QUIET_BYTES = 1024  # what the server may write to stderr meanwhile (a line
# per refused client: 70,000 bytes)
ASAN_FLAGS = ("-O0 -fno-omit-frame-pointer -fsanitize=address,undefined "
              "-fno-sanitize-recover=undefined"  # the Makefile's make asan
              " -g0")  # (no debug info: a third of its compiling; the
# reports this check reads name no file:line), but -O0, not -O1: the same
# instrumentation (more: nothing optimized away), the same hand-written
# switch and stacks, in half the compiling (0.35 CPU-s, not 0.65)
START_S = 10  # mprotect failing from the start: dead or serving by then
START_CPU = 0.5  # ...or stopped once it has spent this much CPU (s) without
# either (a spinning retry; the reference dies within a few ms of CPU)
IDLE = 4500  # kept clients whose stacks' resident memory is counted, all
# served at once (more than MAX_EVENTS, 1,024, and than 4,096, 05's
# MAX_THREADS: fibers have no cap of their own; only a stack or a guard
# that cannot be had refuses a client)
IDLE_KIB = 40  # resident memory per kept client (the reference: about 17)
PTE_BYTES = 1024  # page tables per kept client (VmPTE; the reference:
# about 190 bytes, its stacks side by side; stacks 1 MiB apart, as
# MAP_GROWSDOWN's stack_guard_gap leaves them, cost about 2,100)
SILENT = 50  # clients that connect and say nothing: a fiber each, in its
# first read, its stack touched at the top only (the reference: one page,
# and no stack may have more resident than the reference's most)
RUN = ("gdb -ex run --args ./fibers 8000, then curl http://127.0.0.1:8000/ "
       "from another shell; bt and info registers rsp show where it was")
MAPS = "watch /proc/$(pgrep -x fibers)/maps under 100 kept clients"
grader = Grader("fibers")
check = death_telling(grader, RUN)


def open_clients(port, count, limit=30):
    """count keep-alive clients, each answered once and left open. Waits
    on them all at once (epoll) until each is answered or closed, for up to
    `limit` s: a crowd of thousands served on a loaded machine may take
    more than a socket's 5 s timeout to reach the last, and a refused
    client is closed at once, so only the slow wait that long."""
    clients = asking_clients(port, count,
                             b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answered = 0
    with selectors.DefaultSelector() as waiting:
        for s in clients:
            waiting.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds(limit)
        while waiting.get_map() and time.monotonic() < deadline:
            for key, _ in waiting.select(timeout=0.5):
                waiting.unregister(key.fileobj)
                try:
                    if key.fileobj.recv(65536).startswith(b"HTTP/1.1 200"):
                        answered += 1
                except OSError:  # reset: closed with its request unread
                    pass
    return clients, answered


def cpu_seconds(pid):
    """User and system CPU seconds pid has spent (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_page_guards(pid):
    """One-page PROT_NONE (---p) mappings, wherever they are: a guard each,
    and the gaps of shared libraries (the same all along)."""
    page = resource.getpagesize()
    count = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        count += fields[1] == "---p" and end - start == page
    return count


def mappings(pid):
    """How many mappings (VMAs) the process has."""
    return len(Path(f"/proc/{pid}/maps").read_text().splitlines())


def stacks_seen(pid):
    """Every guarded stack (an anonymous rw-p mapping right above a
    one-page ---p one): [(size KiB, resident KiB, its guard's resident KiB,
    whether its lowest page is resident, whether its top page was ever
    touched)], from /proc/PID/maps and /proc/PID/pagemap (bit 63: present,
    what smaps counts as Rss in such a mapping; bit 62: swapped out, for
    the top page: touched all the same). (pagemap, not smaps: with 4,500
    stacks smaps costs the kernel a third of this check's CPU.)"""
    page = resource.getpagesize()
    maps = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        maps.append((start, end, fields[1], len(fields) == 5))
    found = []
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for guard, (start, end, perms, anonymous) in zip(maps, maps[1:]):
            if (perms == "rw-p" and anonymous and guard[2] == "---p"
                    and guard[1] == start and guard[1] - guard[0] == page):
                pages = (end - guard[0]) // page  # the guard's, the stack's
                pagemap.seek(guard[0] // page * 8)
                entries = struct.unpack(f"{pages}Q",
                                        pagemap.read(pages * 8))
                resident = [entry >> 63 & 1 for entry in entries]
                found.append(((end - start) // 1024,
                              sum(resident[1:]) * page // 1024,
                              resident[0] * page // 1024,
                              bool(resident[1]),
                              bool(entries[-1] >> 62 & 3)))
    return found


@check(25, f"fibers switch: {CLIENTS} kept clients at once, pages and the "
       "guestbook")
def switching(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        status, _ = get(server.port, path)
        lab.expect(status == 200, f"GET {path} answered {status}")
    clients, answered = open_clients(server.port, CLIENTS)
    for s in clients:
        s.close()
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")


def at_rest(lab, binary=None, env=None):
    """A server (the student's, or binary) that has served one client and
    holds only its acceptor's fiber: (server, open descriptors, guarded
    stacks, one-page guards, mappings)."""
    server = lab.start(binary=binary, env=env)
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    fds = settled(lambda: fd_count(server.pid), "the open descriptors")
    return (server, fds, guarded_stacks(server.pid),
            one_page_guards(server.pid), mappings(server.pid))


@check(30, f"each of {CLIENTS} fibers' stacks has its own PROT_NONE page "
       "right below it, the acceptor's too, unmapped with the stack")
def guard_pages(lab):
    reference = at_rest(lab, build_reference("10_fibers", lab.workdir))
    before = Counter(size for size, *_ in stacks_seen(reference[0].pid))
    held, _ = open_clients(reference[0].port, 3)
    added = Counter(size for size, *_ in stacks_seen(reference[0].pid))
    stack_kib = (added - before).most_common(1)[0][0]  # FIBER_STACK
    for s in held:
        s.close()
    reference[0].stop()
    server, fds, stacks, guards, vmas = at_rest(lab)
    sizes = Counter(size for size, *_ in stacks_seen(server.pid))
    lab.expect(stacks >= reference[2], f"at rest (only the acceptor's fiber "
               f"left), {stacks} guarded stacks, the reference has "
               f"{reference[2]}: the acceptor's stack has no guard below it "
               f"(every fiber's stack needs one); {MAPS}")
    clients, answered = open_clients(server.port, CLIENTS)
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")
    guarded = guarded_stacks(server.pid) - stacks
    lab.expect(guarded == CLIENTS, f"{guarded} stacks of {CLIENTS} have a "
               f"PROT_NONE (---p) page right below them: {MAPS}")
    short = {size: n for size, n in (Counter(
        size for size, *_ in stacks_seen(server.pid)) - sizes).items()
        if size != stack_kib}
    lab.expect(not short, f"with {CLIENTS} clients open, guarded stacks of "
               + ", ".join(f"{n} x {size} KiB" for size, n in short.items())
               + f", not {stack_kib} KiB (FIBER_STACK) each as the "
               "reference's: the guard is the extra page mapped below the "
               f"stack, not taken from it; {MAPS} (the rw-p above each ---p)")
    # Every other client leaves: the stacks left are apart, so each guard
    # seen below one is its own (a guard on top of each stack, "stacks grow
    # up", sat below its neighbour's stack until the neighbour left).
    for s in clients[::2]:
        s.close()
    kept = clients[1::2]
    wait_for(lambda: fd_count(server.pid), lambda n: n <= fds + len(kept),
             limit=5)
    wait_for(lambda: one_page_guards(server.pid),
             lambda n: n <= guards + len(kept), limit=10)
    own = guarded_stacks(server.pid) - stacks
    lab.expect(own == len(kept), f"with {len(kept)} clients left, {own} "
               "stacks have a PROT_NONE page right below them: each guard "
               f"must be below its own stack (stacks grow down); {MAPS}")
    # Each stack left is one mapping: a guard, then the stack right above
    # it, nothing of it below its guard.
    added = mappings(server.pid) - vmas
    lab.expect(added == 2 * len(kept), f"with {len(kept)} clients left, "
               f"{added} more mappings, not 2 each (a guard, its stack right "
               "above it): nothing of a stack's mapping may lie below its "
               f"guard; {MAPS}")
    for s in kept:
        s.close()
    left = wait_for(lambda: one_page_guards(server.pid) - guards,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} guard pages still mapped after every "
               "client left (each fiber_free must unmap its guard with its "
               f"stack): {MAPS}, then after they leave")


def served_or_refused(lab, port, pid, base, tally):
    """A hundred keep-alive clients ask for / at once; each must be
    answered or closed (refused) within BATCH_S. Those answered are held
    open while the stacks are counted: each must run on a guarded stack.
    (How fast they are refused is refusal_pace()'s: a tracer's stops for
    every system call would be most of the time here.)"""
    began = time.monotonic()
    socks = asking_clients(port, 100, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    pending, served = {s.fileno(): s for s in socks}, []
    deadline = time.monotonic() + seconds(BATCH_S)
    try:
        while pending and time.monotonic() < deadline:
            ready, _, _ = select.select(list(pending), [], [], 0.1)
            for fd in ready:
                s = pending.pop(fd)
                try:
                    data = s.recv(65536)
                except OSError:  # reset: closed with the request unread
                    data = b""
                if data.startswith(b"HTTP/1.1 200"):
                    served.append(s)
        lab.expect(not pending, f"{len(pending)} of 100 clients neither "
                   f"answered nor closed within {seconds(BATCH_S):.0f} s "
                   "while every mprotect() failed: the server stalls (a "
                   "loop retrying mprotect?) instead of refusing the client "
                   "(close it, unmap its stack, free its struct); watch it: "
                   f"strace -f -e inject=mprotect:error=ENOMEM -p PID, then "
                   "curl -v http://127.0.0.1:8000/ and top")
        guarded = guarded_stacks(pid) - base
        lab.expect(guarded >= len(served), f"{len(served)} of 100 clients "
                   "served while every mprotect() failed, held open with "
                   f"{guarded} more guarded stacks: a client served on a "
                   "stack with no guard below it (check mprotect's result "
                   "whatever the error: refuse the client, unmap the "
                   "stack)")
        tally.append((len(served), time.monotonic() - began))
    finally:
        for s in socks:
            s.close()


# mprotect() failing without a tracer, for refusal_pace(): while the first
# int of the file LAB_MPROTECT_ERRNO (mapped shared) is not 0, every
# mprotect() the server calls fails with that errno. And every close() of a
# descriptor (>= 0) that fails with EBADF, one already closed, is counted
# in the long at byte 8 of that file: a refused client closed twice.
FAILING_MPROTECT = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
static volatile int *fail;
static int (*next_close)(int);
static void shared(void)
{
    const char *path = getenv("LAB_MPROTECT_ERRNO");
    if (!next_close)
        next_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    int fd = path ? open(path, O_RDWR) : -1;
    void *m = fd < 0 ? MAP_FAILED
                     : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED,
                            fd, 0);
    if (fd >= 0)
        next_close(fd);
    if (m != MAP_FAILED)
        fail = m;
}
int mprotect(void *addr, size_t len, int prot)
{
    static int (*next)(void *, size_t, int);
    if (!next)
        next = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "mprotect");
    if (!fail)
        shared();
    if (fail && *fail) {
        errno = *fail;
        return -1;
    }
    return next(addr, len, prot);
}
int close(int fd)
{
    if (!next_close)
        next_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    int result = next_close(fd);
    if (result < 0 && errno == EBADF && fd >= 0) {
        int saved = errno;
        if (!fail)
            shared();
        if (fail)
            __atomic_add_fetch((volatile long *)(fail + 2), 1,
                               __ATOMIC_RELAXED);
        errno = saved;
    }
    return result;
}
"""


def refusal_pace(lab, server, flag):
    """PACE hundreds of clients for each of ERRORS while every mprotect()
    fails (the preloaded FAILING_MPROTECT, told by flag(errno)): the median
    hundred must be answered or closed within REFUSE_S. No tracer: what is
    timed is the server's. Then what it wrote to stderr meanwhile."""
    logged = server.stderr_path.stat().st_size
    for error in ERRORS:
        took = []
        flag(getattr(errno, error))
        try:
            for _ in range(PACE):
                # Queued while the server is stopped: timed from SIGCONT,
                # the clients' own connecting (slow on a busy machine) is
                # not; the server then refuses a backlog of 100 in one go.
                with stopped(server.pid):
                    wait_stopped(server.pid)
                    socks = asking_clients(server.port, 100, b"GET / "
                                           b"HTTP/1.1\r\nHost: x\r\n\r\n")
                began = time.monotonic()
                pending = {s.fileno(): s for s in socks}
                deadline = began + seconds(BATCH_S)
                try:
                    while pending and time.monotonic() < deadline:
                        ready, _, _ = select.select(list(pending), [], [],
                                                    0.1)
                        for fd in ready:
                            try:
                                pending.pop(fd).recv(65536)
                            except OSError:  # reset: refused, unread
                                pass
                    took.append(time.monotonic() - began)
                finally:
                    for s in socks:
                        s.close()
                lab.expect(not pending, f"{len(pending)} of 100 clients "
                           "neither answered nor closed within "
                           f"{seconds(BATCH_S):.0f} s while every mprotect() "
                           f"failed with {error}: the server stalls (a loop "
                           "retrying mprotect?) instead of refusing the "
                           "client (close it, unmap its stack, free its "
                           "struct)")
        finally:
            flag(0)
        took.sort()
        median = took[len(took) // 2]
        lab.expect(median <= REFUSE_S, f"{sum(t > REFUSE_S for t in took)} "
                   f"of {len(took)} hundreds of clients took over "
                   f"{REFUSE_S:.2f} s each (the median {median:.3f} s, up "
                   f"to {took[-1]:.2f} s) to be answered or closed while "
                   f"every mprotect() failed with {error}, timed from when "
                   "they were all queued (the reference: about 0.003 s): "
                   f"more than {REFUSE_S * 10:.1f} ms per "
                   "refused client, a pause in each refusal (usleep() or "
                   "sleep() in the acceptor blocks every fiber; a fiber's "
                   "sleep before a retry holds up every client behind it; a "
                   "retry after a failed mprotect() is not needed: refuse "
                   "at once); watch it: strace -f -e "
                   "inject=mprotect:error=ENOMEM -p PID, then ab -n 100 -c "
                   "100 http://127.0.0.1:8000/")
    logged = server.stderr_path.stat().st_size - logged
    lab.expect(logged <= QUIET_BYTES, f"{logged} bytes written to stderr "
               f"while {PACE * 100 * len(ERRORS)} clients were refused (at "
               f"most {QUIET_BYTES}): a line per refused client? The "
               "servers are quiet unless ZEROHTTPD_LOG=1: a stderr that is "
               "a pipe nobody reads yet fills after some 900 such lines, "
               "and the whole loop, every fiber, then blocks in write(); "
               "watch it: ./fibers 8000 2>&1 | sleep 600, with mprotect() "
               "failing")
    return took


def closed_twice(lab, view):
    """No close() of the server's has failed with EBADF so far (counted by
    FAILING_MPROTECT at byte 8 of its shared file): a refused client's
    descriptor is closed once, by its owner."""
    twice = struct.unpack_from("q", view, 8)[0]
    lab.expect(not twice, f"{twice} close() calls failed with EBADF (a "
               "descriptor already closed) while clients were refused "
               "(mprotect() failing): a refused client's descriptor closed "
               "twice, by fiber_spawn() and again by its caller, the "
               "acceptor, which closes it when fiber_spawn() returns false; "
               "the second close() closes whatever descriptor was opened "
               "in between (a Redis reconnect's, the next client's); the "
               "caller owns it: a failing fiber_spawn() leaves it open; "
               "watch it: strace -e trace=close,mprotect -e "
               "inject=mprotect:error=ENOMEM -p PID, then curl "
               "http://127.0.0.1:8000/")


@check(10, f"mprotect() failing: the {REFUSED} clients that came meanwhile "
       f"are refused (no stack without a guard), the {HELD} that leave "
       "meanwhile are freed whole, nothing is leaked")
def guard_fails(lab):
    env, blocks = heap_blocks(lab)  # a preloaded malloc that counts
    shim = build_shim(lab, "failing_mprotect", FAILING_MPROTECT, "-ldl")
    switch = lab.workdir / "mprotect.errno"
    switch.write_bytes(bytes(resource.getpagesize()))
    with switch.open("r+b") as file:
        view = mmap.mmap(file.fileno(), resource.getpagesize())
    env = {**env, "LD_PRELOAD": f"{env['LD_PRELOAD']} {shim}",
           "LAB_MPROTECT_ERRNO": str(switch)}
    server, _, base, guards, _ = at_rest(lab, env=env)
    paced = refusal_pace(lab, server, lambda error: struct.pack_into(
        "i", view, 0, error))
    closed_twice(lab, view)
    holding, answered = open_clients(server.port, HELD)
    lab.expect(answered == HELD, f"{answered} of {HELD} answered")
    before = {}

    def leave():
        """The kept clients leave while mprotect() fails: fiber_free()
        runs for each then (it needs no mprotect(): munmap() takes a
        PROT_NONE page as any other). Then the footprint the refusals are
        measured from (what the heap grew by for them stays)."""
        for s in holding:
            s.close()
        wait_for(lambda: guarded_stacks(server.pid) - base,
                 lambda n: n <= 0, limit=5)
        before.update(size=status_field(server.pid, "VmSize"),  # KiB
                      held=blocks())
    served = []
    for k, error in enumerate(ERRORS):
        failing(server.pid, "mprotect", error, lambda: [
            leave() if k == 0 else None] + [
            served_or_refused(lab, server.port, server.pid, base, served)
            for _ in range(REFUSED // 100 // len(ERRORS))])
    refused = REFUSED - sum(n for n, _ in served)
    if refused:  # (a client served on a guarded stack was not refused)
        kept = wait_for(lambda: blocks() - before["held"],
                        lambda n: n <= REFUSED_BLOCKS, limit=5)
        lab.expect(kept <= REFUSED_BLOCKS, f"{kept} more blocks malloc'd "
                   f"and not freed than before {refused} clients were "
                   "refused (counted by a preloaded malloc): what was taken "
                   "for a fiber that never ran (its struct, its mapping, "
                   "all of it) was not given back")
    left = wait_for(lambda: one_page_guards(server.pid) - guards,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} one-page PROT_NONE (---p) mappings more "
               f"than at rest once every client left, {HELD} of them "
               "served before mprotect() failed and gone while it failed: "
               "fiber_free() left their guards mapped (an mprotect() "
               "before the munmap(), that failed?); munmap() takes the "
               "whole mapping, guard and stack, in one call, whatever its "
               "protection; watch it: 50 kept clients, strace -f -e "
               "inject=mprotect:error=ENOMEM -p PID, then let them go and "
               "grep -c -- '---p' /proc/PID/maps")
    if refused:
        grown = wait_for(lambda: status_field(server.pid, "VmSize")
                         - before["size"], lambda kib: kib <= REFUSED_KIB,
                         limit=5)
        lab.expect(grown <= REFUSED_KIB, f"{grown} KiB more address space "
                   f"than before {refused} clients were refused: what was "
                   "taken for a fiber that never ran (its mapping, all of "
                   "it, its struct) was not given back")
    closed_twice(lab, view)
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed once "
               "mprotect() worked again")
    median = paced[len(paced) // 2]
    return (f"{refused} refused, {REFUSED - refused} served (each on a "
            f"guarded stack); without a tracer, the median hundred refused "
            f"in {median:.3f} s")


# Every mprotect() fails, and so does every mmap() at a fixed address
# (MAP_FIXED): what a process at vm.max_map_count meets, since either
# splits a mapping in two. Other mmap()s are made as asked.
ALWAYS_FAILS = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
int mprotect(void *addr, size_t len, int prot)
{
    (void)addr, (void)len, (void)prot;
    errno = ENOMEM;
    return -1;
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}
"""


@check(5, "mprotect() and MAP_FIXED mmap() failing from the start: the "
       "server dies, or its acceptor's stack is guarded all the same")
def guard_fails_at_start(lab):
    shim = build_shim(lab, "no_mprotect", ALWAYS_FAILS)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ZEROHTTPD_LOG"}
    run = subprocess.Popen(
        [str(lab.binary.path), str(port), "127.0.0.1", str(lab.redis.port)],
        cwd=lab.site, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**env, "LD_PRELOAD": str(shim)})
    accepting, code, stacks, spent = False, None, 0, 0.0

    def spinning():
        """The server has spent START_CPU of its own without dying or
        taking a client (a loop retrying mprotect, spinning): no need to
        watch it burn a CPU for the rest of START_S."""
        nonlocal spent
        spent = cpu_seconds(run.pid)
        return spent >= START_CPU
    try:
        deadline = time.monotonic() + seconds(START_S)
        while (not accepting and run.poll() is None and not spinning()
               and time.monotonic() < deadline):
            try:  # answered, closed or reset: the acceptor runs
                with socket.create_connection(("127.0.0.1", port),
                                              timeout=seconds(1)) as sock:
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    until = time.monotonic() + seconds(1)
                    while (time.monotonic() < until and run.poll() is None
                           and not spinning()):
                        if select.select([sock], [], [], 0.1)[0]:
                            sock.recv(1)
                            accepting = True
                            break
            except ConnectionResetError:
                accepting = True
            except OSError:  # not listening yet
                time.sleep(0.1)
        try:  # a server that dies as it starts its acceptor: a moment
            code = run.wait(timeout=seconds(0.5))
        except subprocess.TimeoutExpired:
            stacks = guarded_stacks(run.pid)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    if code is not None:
        return f"died at start (status {code})"
    lab.expect(accepting, f"with every mprotect() (and MAP_FIXED mmap()) "
               f"failing from the start (LD_PRELOAD), the server neither "
               f"died nor took a client within {seconds(START_S):.0f} s "
               f"or {START_CPU:.1f} CPU-s of its own (it spent "
               f"{spent:.1f}): stuck before its loop (a loop retrying "
               "mprotect?); the acceptor's fiber_spawn() must fail, and the "
               "server die")
    normal = at_rest(lab)[2]  # guarded stacks when mprotect() works
    lab.expect(stacks >= normal, f"with every mprotect() and every "
               f"MAP_FIXED mmap() failing from the start (LD_PRELOAD: what "
               f"vm.max_map_count reached does to both), the server runs "
               f"with {stacks} guarded stacks, {normal} when they work: its "
               "acceptor's stack has no guard below it (a fiber without its "
               "guard, the acceptor's too, is refused, however the guard "
               "was tried: loop_init() dies); watch /proc/PID/maps")
    return "runs, its acceptor's stack guarded"


@check(5, "built with -DFIBER_UCONTEXT (swapcontext), every stack still "
       "has its guard")
def ucontext_guards(lab):
    binary = lab.workdir / "ucontext" / "fibers"
    # -O0: the guards do not care, and it compiles in under half -O1's
    # time (0.13 CPU-s, not 0.29; -O2's: 0.55)
    ok, said = build(lab.source, binary, "fibers", "-O0 -DFIBER_UCONTEXT")
    lab.expect(ok, f"-DFIBER_UCONTEXT does not build: {said.strip()[:150]}")
    server = lab.start(binary=binary)
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    stacks = settled(lambda: guarded_stacks(server.pid), "the stacks")
    clients, answered = open_clients(server.port, 50)
    guarded = guarded_stacks(server.pid) - stacks
    for c in clients:
        c.close()
    lab.expect(answered == 50 and guarded == 50, f"built with "
               f"-DFIBER_UCONTEXT: {answered} of 50 clients answered, "
               f"{guarded} more guarded stacks: the guard belongs to "
               "fiber_spawn(), which every build runs, not to the x86-64 "
               "context_init()")


# Wraps ASan's two calls around each switch (preloaded before ASan's
# runtime): at each switch's end, on the stack it landed on, is that stack
# inside the bounds __sanitizer_start_switch_fiber() was given (the
# context's stack_lo, stack_size)? And at a fiber's first run (fiber_main's
# call, the one that asks for the old bounds), how far below the top of
# those bounds is its frame? counts: [switches, landed outside the bounds,
# first runs, the deepest first frame below the top, in bytes].
ASAN_SWITCHES = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
static volatile long *counts;
static const char *next_lo;
static size_t next_size;
static void tally(int k, long v)
{
    if (!counts) {
        int fd = open(getenv("LAB_SWITCH_COUNTS"), O_RDWR);
        void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return;
        counts = m;
    }
    if (k != 3)
        counts[k] += v;
    else if (v > counts[3])
        counts[3] = v;
}
void __sanitizer_start_switch_fiber(void **save, const void *lo, size_t size)
{
    static void (*real)(void **, const void *, size_t);
    if (!real)
        real = (void (*)(void **, const void *, size_t))dlsym(
            RTLD_NEXT, "__sanitizer_start_switch_fiber");
    next_lo = lo;
    next_size = size;
    real(save, lo, size);
}
void __sanitizer_finish_switch_fiber(void *save, const void **old_lo,
                                     size_t *old_size)
{
    static void (*real)(void *, const void **, size_t *);
    if (!real)
        real = (void (*)(void *, const void **, size_t *))dlsym(
            RTLD_NEXT, "__sanitizer_finish_switch_fiber");
    real(save, old_lo, old_size);
    const char *sp = __builtin_frame_address(0);
    tally(0, 1);
    if (sp < next_lo || sp >= next_lo + next_size)
        tally(1, 1);
    else if (old_lo)
        tally(3, next_lo + next_size - sp);
    if (old_lo)
        tally(2, 1);
}
"""
FIRST_FRAME = 4096  # a fiber's first frame lies within this of its top


@check(5, "built with ASan (make asan: the hand-written switch, larger "
       "stacks), every stack still has its guard, ASan is told each "
       "fiber's stack, and each fiber starts at its stack's top")
def asan_guards(lab):
    binary = lab.workdir / "asan" / "fibers"
    ok, said = build(lab.source, binary, "fibers", ASAN_FLAGS)
    lab.expect(ok, f"the ASan build does not build: {said.strip()[:150]}")
    shim = build_shim(lab, "switches", ASAN_SWITCHES, "-ldl")
    counter = lab.workdir / "switches.count"
    counter.write_bytes(bytes(resource.getpagesize()))
    server = lab.start(binary=binary, env={
        "LD_PRELOAD": str(shim), "LAB_SWITCH_COUNTS": str(counter),
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:"
        "verify_asan_link_order=0"})
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    stacks = settled(lambda: guarded_stacks(server.pid), "the stacks")
    clients, answered = open_clients(server.port, 50)
    guarded = guarded_stacks(server.pid) - stacks
    for c in clients:
        c.close()
    lab.expect(answered == 50 and guarded == 50, f"built as make asan "
               f"builds it (at -O0): {answered} of 50 clients answered, "
               f"{guarded} "
               "more guarded stacks: the guard is fiber_spawn()'s in every "
               "build, ASan's too (its red zones do not catch a stack "
               "overflow into the mapping below); make asan, then watch "
               "/proc/$(pgrep -f asan/fibers)/maps under 50 kept clients")
    switches, outside, first, deepest = struct.unpack_from(
        "4q", counter.read_bytes())
    lab.expect(switches and first, f"{switches} switches seen, {first} "
               "fibers started: __sanitizer_start_switch_fiber() and "
               "__sanitizer_finish_switch_fiber() are context_switch()'s "
               "and fiber_main()'s, in the ASan build")
    lab.expect(not outside, f"{outside} of {switches} switches landed on a "
               "stack outside the bounds ASan was told of "
               "(__sanitizer_start_switch_fiber(), from the context's "
               "stack_lo and stack_size): ASan then takes a fiber's stack "
               "for wild memory (a report on it names no frame; its "
               "use-after-return and noreturn bookkeeping go wrong); "
               "context_init() keeps stack_lo = stack, the lowest address, "
               "and stack_size = size, the whole stack, as the starter has "
               "them")
    lab.expect(deepest <= FIRST_FRAME, f"a fiber's first frame lies "
               f"{deepest} bytes below the top of its stack (the "
               f"reference's: about 50 bytes; at most {FIRST_FRAME}): the "
               "frame the switch pops belongs at stack + size, the top of "
               "the stack context_init() is given, whatever its size (the "
               "ASan build's stacks are 256 KiB, not FIBER_STACK's 64); "
               "a frame laid lower leaves the rest unused, and the fiber "
               "that much closer to its guard")
    return f"its first frames within {deepest} bytes of the top"


def silent_stacks(server, base):
    """stacks_seen() while SILENT clients are connected that send nothing,
    once each has its fiber (TCP_DEFER_ACCEPT hands a silent client over
    after a second or so) and it has run to its first read."""
    clients = idle_clients(server.port, SILENT)
    try:
        wait_for(lambda: guarded_stacks(server.pid) - base,
                 lambda n: n >= SILENT, limit=seconds(8))
        time.sleep(seconds(0.3))
        return stacks_seen(server.pid)
    finally:
        for c in clients:
            c.close()
        wait_for(lambda: guarded_stacks(server.pid) - base,
                 lambda n: n <= 0, limit=seconds(5))


@check(5, f"{SILENT} silent clients' stacks resident at the top only, "
       f"{IDLE} kept clients cost at most {IDLE_KIB} KiB of resident memory "
       "each: a stack is backed only where it is touched")
def touched_only(lab):
    raise_open_file_limit()
    page_kib = resource.getpagesize() // 1024
    reference, _, base, _, _ = at_rest(
        lab, build_reference("10_fibers", lab.workdir))
    quiet = silent_stacks(reference, base)
    shallow = max(rss for _, rss, *_ in quiet)
    topless = sum(not top for *_, top in quiet)  # the reference's: none
    held, _ = open_clients(reference.port, 50)
    deepest = max(rss for _, rss, *_ in stacks_seen(reference.pid))
    for c in held:
        c.close()
    reference.stop()
    server, _, base, _, _ = at_rest(lab)
    silent = silent_stacks(server, base)
    # No page more than the reference's: its silent fibers use well under
    # 1 KiB of their top page (its acceptor 3.3 KiB), so a frame laid out
    # a little lower still fits; a prefault of two pages does not.
    bottom = sum(low for _, _, _, low, _ in silent)
    lab.expect(not bottom, f"{bottom} of {len(silent)} stacks have their "
               f"lowest page resident while {SILENT} silent clients are "
               "connected, each fiber in its first read (it has used a "
               "few hundred bytes at the top): something wrote at the "
               "bottom of the stack (a canary?), and each pays a page for "
               "it; write only the frame the switch pops; watch "
               "/proc/PID/pagemap at the stack's start")
    deep = sum(rss > shallow for _, rss, *_ in silent)
    lab.expect(not deep, f"{deep} of {len(silent)} stacks have more than "
               f"{shallow} KiB resident while {SILENT} silent clients are "
               "connected, each fiber in its first read (the reference's: "
               f"{shallow} KiB at most, {shallow // page_kib} page(s)): a "
               "stack written (prefaulted?) below what its fiber has used is "
               "backed all the same; write only the frame the switch pops; "
               "watch Rss of each stack in /proc/PID/smaps under a few "
               "`nc 127.0.0.1 8000` left silent")
    # The frame the switch pops is written at the top of the rw-p mapping
    # above the guard: its top page is touched first, whatever else is. A
    # stack handed to context_init() from lower down (from the guard, the
    # mapping's start, not map + page) starts its fiber a page or more
    # below that top: never touched, that much less stack above the guard.
    untouched = sum(not top for *_, top in silent)
    lab.expect(untouched <= topless, f"{untouched} of {len(silent)} "
               f"stacks have never touched their top page while {SILENT} "
               "silent clients are connected, each fiber in its first read "
               f"(the reference's: {topless} of {len(quiet)}; its first "
               "frame is in its top page): the fiber starts below the top "
               "of the rw-p mapping above its guard, and that much of the "
               "stack is never used (a deep call faults on the guard a "
               "page or more short of FIBER_STACK); the stack "
               "context_init() is given starts right above the guard, "
               "f->map + page, and ends at the mapping's end; watch "
               "/proc/PID/pagemap at each stack's top page")
    before = status_field(server.pid, "VmRSS")
    tables = status_field(server.pid, "VmPTE")
    clients, answered = open_clients(server.port, IDLE)
    each = (status_field(server.pid, "VmRSS") - before) / IDLE
    tables = (status_field(server.pid, "VmPTE") - tables) * 1024 / IDLE
    stacks = stacks_seen(server.pid)
    for c in clients:
        c.close()
    lab.expect(answered == IDLE, f"{answered} of {IDLE} kept clients, "
               "connected one after another and all held open, were "
               "answered (the others closed unanswered): a fiber server "
               "has no cap of its own on the clients it serves at once "
               "(not MAX_EVENTS, not 05's MAX_THREADS, not any other: a "
               "fiber costs a 64 KiB "
               "stack of address space, of which a page or two is backed); "
               "only a stack or a guard that cannot be had refuses one; "
               f"watch it: {IDLE} keep-alive clients, each GET / once, held "
               "open")
    deep = sum(rss > deepest + page_kib for _, rss, *_ in stacks)
    lab.expect(not deep, f"{deep} of {len(stacks)} stacks under {IDLE} kept "
               f"clients have more than {deepest + page_kib} KiB resident "
               f"(the reference's deepest stack, {deepest} KiB, and a page): "
               "a stack written (prefaulted?) below what the fiber uses is "
               "backed all the same; write only the frame the switch pops; "
               "watch Rss of each stack in /proc/PID/smaps")
    bottom = sum(low for _, _, _, low, _ in stacks)
    lab.expect(not bottom, f"{bottom} of {len(stacks)} stacks under {IDLE} "
               "kept clients have their lowest page resident (a fiber "
               "serving / uses the top few KiB): something wrote at the "
               "bottom of the stack (a canary?), and each pays a page for "
               "it; write only the frame the switch pops; watch "
               "/proc/PID/pagemap at the stack's start")
    guards = sum(rss > 0 for _, _, rss, *_ in stacks)
    lab.expect(not guards, f"{guards} of {len(stacks)} guard pages under "
               f"{IDLE} kept clients are resident: a guard written before "
               "it was protected (a memset, a pattern?) keeps its page; "
               "PROT_NONE does not give it back; watch Rss of the ---p "
               "pages in /proc/PID/smaps")
    lab.expect(answered == IDLE and each <= IDLE_KIB, f"{answered} of {IDLE} "
               f"answered, {each:.0f} KiB resident each: a stack written in "
               "full when it is laid out (a memset?) is backed in full; "
               "write only the frame the switch pops")
    lab.expect(tables <= PTE_BYTES, f"{IDLE} kept clients cost {tables:.0f} "
               f"bytes of page tables each (VmPTE; at most {PTE_BYTES}; the "
               "reference's: about 190, some 30 stacks side by side in the "
               "2 MiB that one page-table page maps): the stacks lie far "
               "apart, each with page-table pages of its own; mapped with "
               "MAP_GROWSDOWN? The kernel keeps its stack_guard_gap, 1 MiB, "
               "free below such a mapping, room for it to grow into (a "
               "fiber's stack does not grow: the PROT_NONE page below it is "
               "its end); map each stack as the starter does; watch VmPTE "
               "in /proc/PID/status and the "
               "stacks' addresses in /proc/PID/maps under 1,000 kept "
               "clients")
    return f"{each:.0f} KiB, {tables:.0f} bytes of page tables each"


grader.still_serves(15)


if __name__ == "__main__":
    grader.main()
