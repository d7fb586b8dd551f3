#!/usr/bin/env python3
"""Grader for the stacks lab (labs/stacks/README.md).

Both directions: a stack too large (address space per thread, with many
idle clients) and a stack too small (the deepest requests, many at once,
must not crash the server, and each stack keeps twice the depth they
touched in reserve), with a guard page below every stack (an overflow
must fault, not overwrite). The sizes are read from the server's own
memory map, whatever sets them."""

import mmap
import os
import re
import resource
import socket
import struct
import subprocess
import time
from pathlib import Path

from grading import (Grader, HeldClients, Unmet, _strace,  # labs/grading.py
                     FOOTPRINT, ab_said, build, build_shim, asking_clients, code_only,
                     connections, footprint,
                     function_body, get, heap_blocks, idle_clients,
                     kept_clients,
                     raise_open_file_limit, seconds, source_text,
                     status_field, thread_stacks, wait_for)
from rawhttp import FORM_HEAD, Connection

IDLE = 300  # idle keep-alive clients: a thread (and a stack) each
LIMIT_KB = 1024  # virtual memory per thread: a 64 KiB stack is far below
STACK_KB = 256  # the stack alone: "well under 1 MiB", a quarter at most
# Address space before any client: the reference holds about 3 MiB. Stacks
# reserved ahead of clients (a ring of slots mapped at start) are address
# space all the same; and under this bound a ring has at most 3,276 slots
# (16 KiB stacks, a 4 KiB guard each), which SERIAL connections beside a
# client that stays go round.
IDLE_KB = 64 * 1024
MARGIN = 2  # a stack at least this many times the deepest use seen
DEEP = 20  # clients at once, each through the deepest requests
CROWD = 2500  # clients at once, past any fixed number of stacks kept ready
# Then, fresh, the most clients the handout says a stack size must hold:
# this many at once, each having sent part of a request (a thread each,
# held up to the 10 s request timeout, for the stacks to be read): past a
# pool capped at 4,096 stacks (which then falls back to glibc's default,
# 8 MiB), at no more than the cost of connecting them.
CROWD_MAX = 5000
# Then HOLD clients more, each given a thread that never ends (the preloaded
# thread shim's, no real thread: see THREAD_SHIM), and one more client's GET
# must be answered: the server's limit on clients is the system's (pid_max,
# 32,768 here, or memory), not a count of its own past the 5,000 a stack
# size must hold (a cap at 6,000 or 8,192 is one).
HOLD = 20000
FILES = ("/style.css", "/index.html", "/notes.txt")  # asked for at once
ASKS = 5000  # keep-alive requests for each of FILES, 4 at a time each
# serve_static()'s other ways out, each with a heap block count of its own:
# a missing file (404) and a directory asked for without its slash (301,
# whose Location is built per request). A block lost on either, per
# request, is ERRORS more.
# And a range past a file's end (416, static_response()'s own early return,
# its headers formatted for it).
ERROR_PATHS = (("/no/such/page", 404, None), ("/img", 301, None),
               ("/style.css", 416, "Range: bytes=999999-"))
ERRORS = 2000  # keep-alive requests for each, 4 at a time
# Refused requests one after another: their lingering close must leave
# nothing behind either: the address space within REFUSAL_SLACK_KB, and
# the heap blocks in use within BLOCK_SLACK (a block lost per refusal, its
# drain buffer, is REFUSALS: twice the slack; the reference: +0).
REFUSALS = 500
REFUSAL_SLACK_KB = 4096
# Refused forms, each asking to continue: a POST with `Expect:
# 100-continue` (answered 100 before its body), whose body then has an empty
# remark: refused, 400, the guestbook form page again. These go through the
# ways out the static files do not (expect_answer() answering 100,
# format_refusal() answering the form page): FORMS of them one after
# another on a kept connection, after a warm-up of a fifth as many, and the
# heap blocks in use within BLOCK_SLACK (a block lost per form is FORMS,
# twice the slack; the reference: +0).
FORMS = 500
REFUSED_FORM = b"guest-name=a&guest-remarks="
# The rlimits a server may be started under: the stack size is the
# program's choice, not the shell's (`ulimit -s`).
STACK_RLIMITS = (("unlimited", resource.RLIM_INFINITY), ("1024 KiB", 1 << 20))
# Out of threads: every other pthread_create() fails (strace makes every
# other clone3()/clone() of the main thread fail with EAGAIN, as at the
# thread limit) over SPURNED connections one after another, after a warm-up
# of a fifth as many: the address space and the mappings back within
# SPURN_SLACK of where the warm-up left them (a stack kept for each failed
# thread is 64 KiB and a mapping or two, each).
SPURNED = 400
SPURN_SLACK = (4096, 16)  # KiB of address space, mappings
# ...and the heap blocks in use (malloc less free, counted by a preloaded
# library) back within this: a block allocated for each client refused a
# thread (its argument) and not freed is SPURNED / 2 more (the reference:
# about +1).
SPURN_BLOCKS = 50
# Out of address space: RLIMIT_AS set (prlimit) to what the server holds
# plus STARVED_KB, then STARVED idle clients at once: those it has no stack
# for are dropped, and the server lives on.
STARVED_KB = 16 * 1024
STARVED = 400
# Out of threads, the accept loop stays free: meanwhile two clients send
# the start of a request and stay (one of them is refused a thread), and
# another client's GET must be answered within HELD_UP_S (a few ms in the
# reference, retried if it is the one refused): a server that serves a
# refused client on its accept thread answers no one else until that
# client's request times out (REQUEST_TIMEOUT_MS, 10 s).
HELD_UP_S = 2.5
# Then a limit that stays: every pthread_create() fails (strace, every
# clone3()/clone() of the main thread), and DROPPED clients one after
# another, each asking for a page, must each be dropped (closed, no answer)
# within HELD_UP_S: a server that waits for a thread (retries
# pthread_create() until it succeeds) holds the accept loop on one client
# for as long as the limit lasts, and no one else is even accepted (the
# reference: a few ms each).
DROPPED = 3
# Then a thread limit that lasts: REFUSED_N clients, each refused a thread
# (the thread shim fails their pthread_create(), EAGAIN, at no real
# connection's cost), past pid_max (32,768 here); once it is over,
# /style.css answers 200: a count of live threads taken before
# pthread_create() and not given back when it fails reaches any cap of its
# own and refuses everyone for ever.
REFUSED_N = 40000
SERIAL = 4000  # connections one after another: none may leave memory
# behind, nor take the stack of a client that stays
# ...a quarter of them for the guestbook (its Redis round trips, on a Redis
# connection the thread opens and closes: both code paths run, and a
# resource lost per guestbook connection is still 1,000 of them), the rest
# for the page: a guestbook connection costs the server and Redis some
# three times what a page does.
SERIAL_PATHS = ("/", "/", "/", "/guestbook")
SERIAL_SLACK = (8192, 32, 8)  # KiB of address space, mappings, descriptors
# Heap blocks in use (malloc minus free, counted by a preloaded library)
# after SERIAL connections: a block lost per connection, however small (a
# 4-byte int for the thread's argument), is SERIAL more; what a thread
# keeps cached stays far below this.
BLOCK_SLACK = 250
# One thread's exit() held (strace, on that thread alone) while CHURN
# clients come one after another, as a busy machine may hold a thread
# between the end of its function and its exit: none may be given its
# stack. A stack handed back early is reused at once by a LIFO free list,
# and by a ring only once it has gone round: under IDLE_KB, a ring holds
# fewer than 3,276 slots (16 KiB stacks and a 4 KiB guard each).
CHURN = 3500
EXIT_HELD_S = 120  # longer than the churn: strace lets it go at the end
# One malloc arena for all threads: glibc otherwise reserves 64 MiB of
# address space per arena (up to 8 per core), which would swamp the stacks.
ENV = {"MALLOC_ARENA_MAX": "1"}
# make asan's flags (the Makefile's ASAN_CFLAGS; lab-bin adds -O1 and -g):
# margin measures the ASan build too.
ASAN_FLAGS = ("-fno-omit-frame-pointer -fsanitize=address,undefined "
              "-fno-sanitize-recover=undefined")
LOGGED = {**ENV, "ZEROHTTPD_LOG": "1"}  # the access log: a request goes deeper
# The largest form a browser sends: a 100-character name and a
# 2,000-character remark of 3-byte characters, each percent-encoded.
MAX_FORM = (b"guest-name=" + b"%E4%B8%80" * 100 + b"&guest-remarks=" +
            b"%E4%B8%80" * 2000)
WATCH = ("watch: ./threaded 8000 & then grep -E 'Threads|VmSize' "
         "/proc/$!/status and the stacks' Size and Rss in /proc/$!/smaps")
grader = Grader("stacks")



def start(lab, env=ENV):
    """The server under MALLOC_ARENA_MAX=1; one that does not start, or
    dies as it starts, says why in one line (its stderr's last)."""
    try:
        return lab.start(env=env)
    except AssertionError as error:
        logs = sorted(lab.workdir.glob("*.stderr"),
                      key=lambda log: log.stat().st_mtime)
        said = (logs[-1].read_text(errors="replace") if logs else "") or \
            str(error)
        raise Unmet("the server did not start, or died as it started; its "
                    f"stderr: {said.strip().splitlines()[-1][-150:]}; "
                    "watch: ./threaded 8000") from None


def threads_for(lab, server, clients):
    """Threads once every client has its own: at least clients + 1."""
    threads = wait_for(lambda: status_field(server.pid, "Threads"),
                       lambda n: n > clients, limit=5)
    lab.expect(threads > clients, f"{threads} threads for {clients} clients: "
               "a thread each is the model; watch: grep Threads "
               "/proc/PID/status while they connect")
    return threads


def deep_requests(lab, server):
    """DEEP keep-alive clients, each through the requests that go deepest
    (a form POST, the guestbook page, a large header, an error page), then
    DEEP more for each refusal (413, 431, 414), left open: their threads
    live, their stacks as deep as they ever went."""
    asks = [FORM_HEAD + b"Content-Length: %d\r\n\r\n" % len(MAX_FORM) +
            MAX_FORM,
            b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 6000 +
            b"\r\n\r\n",
            b"GET /no/such/page HTTP/1.1\r\nHost: x\r\n\r\n"]
    # Refusals go deeper still: the close lingers, draining what is left.
    # A body over the limit (413), a header too long (431), a target too
    # long (414): each closes its connection, so each has clients of its
    # own, the last still lingering when the caller looks at the stacks.
    refusals = [FORM_HEAD + b"Content-Length: 60000\r\n\r\n" + b"x" * 100,
                b"GET / HTTP/1.1\r\nX-Pad: " + b"p" * 9000 + b"\r\n\r\n",
                b"GET /" + b"u" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"]
    step = "connecting"
    try:
        conns = [Connection(server.port, timeout=seconds(5))
                 for _ in range(DEEP)]
        for raw in asks:  # each step on every client at once
            step = f"{raw[:16]!r}..."
            for conn in conns:
                conn.send(raw)
            for conn in conns:
                answer = conn.read_response()
                lab.expect(answer.status in (200, 303, 404), f"{step} "
                           f"answered {answer.status}: the largest form a "
                           f"browser sends ({len(MAX_FORM)} bytes) is "
                           "stored (303), whatever the stack or the buffers")
        for raw in refusals:  # each on DEEP more clients at once
            step = f"{raw[:16]!r}... (refused)"
            refused = [Connection(server.port, timeout=seconds(5))
                       for _ in range(DEEP)]
            for conn in refused:
                conn.send_tolerating_reset(raw)
            for conn in refused:
                conn.read_response()
            conns += refused
    except (OSError, AssertionError):
        alive(lab, server, f"{step} on {DEEP} clients at once")
        raise
    return conns


def alive(lab, server, doing):
    """After a request failed: if the server has died, say how."""
    code = wait_for(server.proc.poll, lambda c: c is not None, limit=1)
    said = (server.stderr().strip().splitlines() or ["nothing"])[-1]
    why = " (SIGSEGV: a stack ran into its guard page)" if code == -11 else ""
    lab.expect(code is None, f"the server died, exit status {code}{why}, on "
               f"{doing}; its stderr: {said[:100]}; watch: ./threaded 8000 & "
               "curl -d guest-name=a -d guest-remarks=b http://127.0.0.1:8000"
               "/guestbook")


@grader.check(15, f"at most {IDLE_KB // 1024} MiB of address space before "
              f"any client, {LIMIT_KB} KiB more per thread with {IDLE} idle "
              f"clients, a stack at most {STACK_KB} KiB")
def small_stacks(lab):
    server = start(lab)
    before = status_field(server.pid, "VmSize")
    lab.expect(before <= IDLE_KB, f"{before} KiB of address space before "
               f"any client (at most {IDLE_KB}): stacks reserved ahead of "
               "the clients (a ring of slots mapped at start?) are address "
               "space all the same, and a thread must not outlive its "
               f"slot; {WATCH}")
    clients = idle_clients(server.port, IDLE)
    threads = threads_for(lab, server, IDLE)
    time.sleep(seconds(0.2))
    kb = (status_field(server.pid, "VmSize") - before) / (threads - 1)
    stacks = thread_stacks(server.pid)
    for c in clients:
        c.close()
    lab.expect(kb <= LIMIT_KB, f"{kb:.0f} KiB of address space per thread "
               f"({threads - 1} threads): {WATCH}")
    largest = max((size for size, _ in stacks), default=0)
    lab.expect(largest <= STACK_KB, f"{largest} KiB thread stacks: the stack "
               f"alone must stay well under 1 MiB (at most {STACK_KB} KiB), "
               f"or the buffers a busy connection adds take a thread past "
               f"it; {WATCH}")
    return f"{kb:.0f} KiB per thread, {largest} KiB stacks"


@grader.check(15, f"{DEEP} clients at once through the deepest requests: "
              "the server lives")
def deep(lab):
    server = start(lab)
    for conn in deep_requests(lab, server):
        conn.close()
    server.stop()


@grader.check(15, f"every stack is at least {MARGIN}x as deep as a request "
              "went (the access log on)")
def margin(lab):
    server = start(lab, LOGGED)
    conns = deep_requests(lab, server)
    stacks = thread_stacks(server.pid)
    for conn in conns:
        conn.close()
    lab.expect(stacks, "no thread stack with a guard page found in "
               "/proc/PID/smaps")
    size = min(s for s, _ in stacks)
    touched = max(t for _, t in stacks)
    lab.expect(size >= MARGIN * touched, f"{size} KiB stacks, and a request "
               f"touched {touched} KiB of one: less than {MARGIN}x, no room "
               f"for a deeper path or another libc; {WATCH}")
    server.stop()
    # The same in the ASan build (make asan's flags): red zones around every
    # local take a request deeper (about 36 KiB), so that build's stacks
    # need more (the reference: 1 MiB under __SANITIZE_ADDRESS__).
    binary = lab.workdir / "asan" / "threaded"
    ok, said = build(lab.source, binary, "threaded", ASAN_FLAGS)
    lab.expect(ok, f"the ASan build does not build: {said.strip()[:150]}")
    server = lab.start(binary=binary, env={
        **LOGGED, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"})
    conns = deep_requests(lab, server)
    asan = thread_stacks(server.pid)
    for conn in conns:
        conn.close()
    lab.expect(asan, "no thread stack with a guard page found in "
               "/proc/PID/smaps of the ASan build")
    asan_size = min(s for s, _ in asan)
    asan_touched = max(t for _, t in asan)
    lab.expect(asan_size >= MARGIN * asan_touched, f"built with ASan (make "
               f"asan's flags): {asan_size} KiB stacks, and a request "
               f"touched {asan_touched} KiB of one: less than {MARGIN}x (ASan's "
               "red zones around every local take a request deeper: that "
               "build needs more, as the reference's __SANITIZE_ADDRESS__ "
               "branch gives it); watch: make asan, then ./asan/threaded "
               "8000 and the stacks' Size and Rss in /proc/PID/smaps")
    return (f"{size} KiB stacks, {touched} KiB touched; with ASan "
            f"{asan_size} KiB, {asan_touched} KiB touched")


@grader.check(10, "a guard page below every thread's stack; the same "
              "stacks under any ulimit -s")
def guards(lab):
    server = start(lab)
    clients = idle_clients(server.port, DEEP)
    threads = threads_for(lab, server, DEEP)
    stacks = thread_stacks(server.pid)
    for c in clients:
        c.close()
    lab.expect(len(stacks) >= threads - 1, f"{len(stacks)} stacks with a "
               f"guard page for {threads - 1} threads: an overflow would "
               "overwrite memory instead of faulting; watch: grep -B1 rw-p "
               "/proc/PID/maps | grep -c -- ---p")
    sizes = {size for size, _ in stacks}
    server.stop()
    for said, limit in STACK_RLIMITS:  # as started from another shell
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        resource.setrlimit(resource.RLIMIT_STACK, (limit, hard))
        try:
            server = start(lab)
        except Unmet as unmet:
            raise Unmet(f"under ulimit -s {said}: {unmet}") from None
        finally:
            resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
        clients = idle_clients(server.port, DEEP)
        for c in clients:
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answered = sum(c.recv(12).startswith(b"HTTP/1.1 200")
                           for c in clients)
        except OSError:
            answered = 0
        there = {size for size, _ in thread_stacks(server.pid)}
        for c in clients:
            c.close()
        alive(lab, server, f"{DEEP} clients under ulimit -s {said}")
        lab.expect(answered == DEEP and there == sizes, f"under ulimit -s "
                   f"{said}: {answered} of {DEEP} clients answered, stacks "
                   f"of {sorted(there)} KiB against {sorted(sizes)} KiB "
                   "under the default: the stack size is the program's "
                   "(pthread_attr_setstacksize), whatever RLIMIT_STACK says")
        server.stop()


@grader.check(10, f"{CROWD} clients at once, each answered twice, then "
              f"{CROWD_MAX} clients at once and one more, then "
              f"{len(FILES)} files asked for at once: each thread its own "
              "stack and memory, "
              f"each stack at most {STACK_KB} KiB")
def crowd(lab):
    raise_open_file_limit()
    shim_env, flood = thread_shim(lab)
    server = start(lab, preloaded(ENV, shim_env))
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    partial = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n"  # its end never sent
    try:
        clients = kept_clients(server.port, CROWD)  # a first request each
        threads = threads_for(lab, server, CROWD)
        sizes = sorted(set(stack_sizes(server.pid)))
        lab.expect(sizes and sizes[-1] <= STACK_KB, f"thread stacks of "
                   f"{sizes[-8:]} KiB with {CROWD} clients at once "
                   f"({threads} threads): every thread's stack at most "
                   f"{STACK_KB} KiB, however many clients (stacks kept "
                   "ready run out: a thread then given glibc's default, "
                   f"8 MiB, is the lab's problem back); {WATCH}")
        answered = 0
        for c in clients:  # every thread wakes on the stack it slept on
            c.settimeout(seconds(10))
            data = b""
            while data.count(b"HTTP/1.1 200") < 1:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            c.sendall(ask)
            answered += data.startswith(b"HTTP/1.1 200")
        for c in clients:
            data = b""
            while b"HTTP/1.1 200" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            answered += b"HTTP/1.1 200" in data
            c.sendall(partial)  # kept: a thread each, for the next step
    except OSError:
        alive(lab, server, f"{CROWD} clients at once")
        raise
    alive(lab, server, f"{CROWD} clients at once")
    lab.expect(answered == 2 * CROWD, f"{answered} answers of {2 * CROWD} "
               f"for {CROWD} clients at once, two requests each")
    try:  # the most clients a stack size must hold, at once: the CROWD,
        # each having begun a third request, and as many more beginning one
        clients += asking_clients(server.port, CROWD_MAX - CROWD, partial)
        threads = threads_for(lab, server, CROWD_MAX)
        sizes = sorted(set(stack_sizes(server.pid)))
        try:  # one more, beside them: no cap on clients at CROWD_MAX
            status, _ = get(server.port, "/style.css")
        except OSError as error:
            status = f"nothing ({error.__class__.__name__})"
        for c in clients:
            c.close()
    except OSError:
        alive(lab, server, f"{CROWD_MAX} clients at once")
        raise
    lab.expect(sizes and sizes[-1] <= STACK_KB, f"thread stacks of "
               f"{sizes[-8:]} KiB with {CROWD_MAX} clients at once "
               f"({threads} threads), each having sent part of a request: "
               f"every thread's stack at most {STACK_KB} KiB with up to "
               f"{CROWD_MAX} clients (stacks kept ready ran out, a pool "
               "capped below that?: a thread then given glibc's default, "
               f"8 MiB, is the lab's problem back); {WATCH}")
    lab.expect(status == 200, f"GET /style.css answered {status} beside "
               f"{CROWD_MAX} clients at once ({threads} threads), each "
               "having sent part of a request: a thread per client, however "
               f"many (the stack size must hold for {CROWD_MAX} at once, "
               "not cap them there: the server's limit is the system's, "
               "pid_max or memory); watch: ./threaded 8000 and 5,000 idle "
               "clients, then curl http://127.0.0.1:8000/style.css")
    loads = [subprocess.Popen(
        ["ab", "-q", "-k", "-n", str(ASKS), "-c", "4", "-s",
         str(int(seconds(30))), f"http://127.0.0.1:{server.port}{path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for path in FILES]
    for path, load in zip(FILES, loads):
        out, err = load.communicate(timeout=seconds(120))
        done = subprocess.CompletedProcess(load.args, load.returncode, out,
                                           err)
        lab.expect(load.returncode == 0 and "Non-2xx" not in out and
                   "Failed requests:        0" in out,
                   f"{path}, {ASKS} keep-alive requests while "
                   f"{', '.join(p for p in FILES if p != path)} were asked "
                   f"for at once: {failures(done)} (a Length failure is "
                   "another file's bytes: a buffer the threads share?)")
    alive(lab, server, f"{len(FILES)} keep-alive loads at once")
    left = flood(server.port, HOLD, HELD)
    status = style_status(server.port)
    alive(lab, server, f"{HOLD} clients each given a thread that never ends")
    lab.expect(left <= 0 and status == 200, f"GET /style.css answered "
               f"{status} once {HOLD - max(left, 0)} clients more had each "
               "been given a thread that is still serving them (the "
               "preloaded thread shim's: pthread_create() succeeded, and "
               "the thread never ends): the server's limit on clients is "
               f"the system's (pid_max, {PID_MAX} here, or memory), not a "
               f"count of its own (the stack size must hold {CROWD_MAX} "
               "at once, not cap them there or a little past); watch: "
               "./threaded 8000 and 7,000 idle clients, then curl "
               "http://127.0.0.1:8000/style.css")
    return (f"{threads - 1} threads at most, one more client answered "
            f"beside them, stacks of {sizes} KiB; {HOLD} threads more that "
            "never end, one more client answered")


# Many clients without their cost: a library preloaded (LD_PRELOAD) that,
# while the grader asks (a page it shares with the server), hands the
# accept loop clients of its own (accept4()/accept() return fresh sockets
# at once, no connection behind them) and answers the pthread_create()
# for each: "held" (it reports success, and closes that socket: as a
# thread that is still serving its client, which never ends) or "refused"
# (EAGAIN, as at the thread limit). A thousand of these cost a few ms,
# where a thousand real clients at once cost a thousand threads.
THREAD_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* [0] clients still to hand out, [1] 1: refuse every thread, 2: hold the
 * ones made for those clients, [2] pthread_create() calls answered so */
static int64_t *page;
static __thread int made = -1; /* the last client handed out */

__attribute__((constructor)) static void map_page(void)
{
    const char *path = getenv("LAB_THREAD_CONTROL");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0)
        return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        page = p;
}

static int hand_out(int flags)
{
    if (!page || __atomic_load_n(&page[0], __ATOMIC_SEQ_CST) <= 0)
        return -2;
    int fd = socket(AF_INET, SOCK_STREAM | (flags & SOCK_CLOEXEC), 0);
    if (fd >= 0) {
        made = fd;
        __atomic_sub_fetch(&page[0], 1, __ATOMIC_SEQ_CST);
    }
    return fd;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags)
{
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    int fd = hand_out(flags);
    if (fd != -2)
        return fd;
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(
            RTLD_NEXT, "accept4");
    return real(s, addr, len, flags);
}

int accept(int s, struct sockaddr *addr, socklen_t *len)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    int fd = hand_out(0);
    if (fd != -2)
        return fd;
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(
            RTLD_NEXT, "accept");
    return real(s, addr, len);
}

int pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                   void *(*start)(void *), void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *,
                       void *(*)(void *), void *);
    int64_t mode = page ? __atomic_load_n(&page[1], __ATOMIC_SEQ_CST) : 0;
    if (mode == 1) {
        __atomic_add_fetch(&page[2], 1, __ATOMIC_SEQ_CST);
        return EAGAIN;
    }
    if (mode == 2 && made >= 0) {
        close(made);
        made = -1;
        *thread = pthread_self();
        __atomic_add_fetch(&page[2], 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    made = -1;
    if (!real)
        real = (int (*)(pthread_t *, const pthread_attr_t *,
                        void *(*)(void *), void *))dlsym(RTLD_NEXT,
                                                         "pthread_create");
    return real(thread, attr, start, arg);
}
"""
HELD, REFUSED = 2, 1  # the shim's modes
PID_MAX = Path("/proc/sys/kernel/pid_max").read_text().strip()


def style_status(port):
    """GET /style.css's status, or "nothing (the error)" if no answer."""
    try:
        return get(port, "/style.css")[0]
    except OSError as error:
        return f"nothing ({error.__class__.__name__})"


def thread_shim(lab):
    """(env to start the server with, a function that hands the server
    count clients of the shim's own, each thread held or refused, and
    returns once the accept loop has taken them all (or did not within a
    few seconds: the count left)."""
    shim = build_shim(lab, "thread_shim", THREAD_SHIM, "-ldl")
    control = lab.workdir / "thread_shim.page"
    control.write_bytes(bytes(mmap.PAGESIZE))
    with control.open("r+b") as file:
        view = mmap.mmap(file.fileno(), mmap.PAGESIZE)

    def flood(port, count, mode):
        struct.pack_into("qqq", view, 0, 0, mode, 0)
        struct.pack_into("q", view, 0, count)
        try:  # the accept loop waits in accept(): a client wakes it
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=seconds(5)):
                pass
        except OSError:
            pass
        left = wait_for(lambda: struct.unpack_from("q", view, 0)[0],
                        lambda n: n <= 0, limit=10)
        time.sleep(0.05)  # the last one's pthread_create()
        struct.pack_into("qq", view, 0, 0, 0)
        return left

    return {"LD_PRELOAD": str(shim), "LAB_THREAD_CONTROL": str(control)}, \
        flood


def preloaded(*envs):
    """envs merged, their LD_PRELOAD libraries all kept."""
    merged = {}
    for env in envs:
        for key, value in env.items():
            merged[key] = (f"{merged[key]} {value}" if key == "LD_PRELOAD"
                           and key in merged else value)
    return merged


def guarded_stacks(pid):
    """[(start, end)] of every guarded stack of pid: thread_stacks' rule
    (an anonymous rw-p mapping with a one-page ---p guard right below it),
    read from /proc/PID/maps, the same mappings without their Rss: with
    thousands of threads smaps costs the kernel (a page walk per mapping)
    and the grader (20 lines per mapping) many times more."""
    page = resource.getpagesize()
    maps = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        maps.append((start, end, fields[1], len(fields) == 5))
    return [(start, end) for below, (start, end, perms, anonymous)
            in zip(maps, maps[1:]) if perms == "rw-p" and anonymous and
            below[2] == "---p" and below[1] == start and
            below[1] - below[0] == page]


def stack_sizes(pid):
    """The size in KiB of every guarded stack of pid (thread_stacks' sizes,
    from /proc/PID/maps: see guarded_stacks)."""
    return [(end - start) // 1024 for start, end in guarded_stacks(pid)]


def stack_pointers(pid):
    """{thread id: its stack pointer} for the threads of pid blocked in a
    call (/proc/PID/task/TID/syscall: the last fields are its sp and pc; a
    running thread has none to read). Read with os and open() alone: the
    churn reads it after every one of its thousands of clients."""
    found, tasks = {}, f"/proc/{pid}/task/"
    for name in os.listdir(tasks):
        try:
            with open(tasks + name + "/syscall", "rb", buffering=0) as file:
                fields = file.read().split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) >= 3:
            found[int(name)] = int(fields[-2], 16)
    return found


def in_exit(pid):
    """The threads of pid held at their exit() (syscall 60)."""
    held = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "syscall").read_text().split()[0] == "60":
                held.append(int(task.name))
        except (OSError, IndexError):
            pass
    return held


@grader.check(5, f"a thread slow to exit keeps its stack: {CHURN} clients "
              "that come meanwhile, one after another, run on others")
def handoff(lab):
    server = start(lab)
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    leaving = Connection(server.port, timeout=seconds(5))
    try:
        leaving.send(ask)
        leaving.read_response()
    except (OSError, AssertionError):
        alive(lab, server, "a first client")
        raise
    # its thread: the one blocked on a guarded stack, waiting for more
    def on_stacks():
        sps = stack_pointers(server.pid)
        return [(tid, (lo, hi)) for lo, hi in guarded_stacks(server.pid)
                for tid, sp in sps.items() if lo <= sp < hi]
    users = wait_for(on_stacks, lambda found: len(found) == 1, limit=2)
    lab.expect(len(users) == 1, f"{len(users)} threads on a guarded stack "
               "with one client connected, asleep: a thread each, on a "
               "stack with a guard page below, is the model; watch: grep "
               "-A1 ---p /proc/PID/maps and each thread's sp in "
               "/proc/PID/task/*/syscall")
    tid, (low, high) = users[0]
    shared, step, came = [], "the client that leaves", [0]
    seen = set(stack_pointers(server.pid))

    def churn():
        nonlocal step
        leaving.close()
        held = wait_for(lambda: tid in in_exit(server.pid), bool,
                        limit=5)
        lab.expect(held, f"thread {tid} never reached its exit() within "
                   f"{seconds(5):.0f} s of its client's leaving (strace "
                   f"held it there): a thread per client, ended when its "
                   "client leaves, is the model")
        for k in range(CHURN):
            step = f"client {k + 1} of {CHURN} while a thread was held"
            with Connection(server.port, timeout=seconds(5)) as coming:
                coming.send(ask)
                coming.read_response()
                came[0] = k + 1
                for _ in range(10):  # its thread, asleep waiting for more
                    sps = stack_pointers(server.pid)
                    on = [t for t, sp in sps.items()
                          if low <= sp < high and t != tid]
                    if on or set(sps) - seen:
                        break
                    time.sleep(0.001)
                seen.update(sps)
                if on:
                    shared.extend([tid, *on])
                    return
            if k % 250 == 249 and tid not in in_exit(server.pid):
                return  # let go early (a slow machine): reuse is fair now

    try:
        _strace(tid, ["exit"], churn, "-e",
                f"inject=exit:delay_enter={int(EXIT_HELD_S * 1e6)}")
    except (OSError, AssertionError):
        alive(lab, server, f"{step}, a thread held at its exit")
        raise
    lab.expect(not shared, f"threads {shared} run on one stack: thread "
               f"{tid}, held at its exit (strace), still runs on the stack "
               f"that client {came[0]}, who came meanwhile, was given (a "
               "stack handed back before its thread has exited, to a free "
               "list or a ring: glibc's own exit code still runs on it, and "
               "the kernel clears the thread id in it at exit); watch: grep "
               "-A1 ---p /proc/PID/maps and each thread's sp in "
               "/proc/PID/task/*/syscall")
    alive(lab, server, "clients while a thread was held at its exit")
    server.stop()
    return f"{came[0]} clients while a thread was held at exit, no stack shared"


def spurned(lab, server, count):
    """count connections one after another, each a request (HTTP/1.0)
    read to its end: an answer, or a close if no thread could serve it."""
    for k in range(count):
        try:
            with Connection(server.port, timeout=seconds(5)) as conn:
                conn.send_tolerating_reset(
                    b"GET /notes.txt HTTP/1.0\r\n\r\n")
                while conn.sock.recv(65536):
                    pass
        except ConnectionError:
            pass  # dropped: no thread for it
        except OSError:
            alive(lab, server, f"connection {k + 1} of {count} while every "
                  "other pthread_create() failed")
            raise


def accept_free(lab, server):
    """While every other pthread_create() fails: two clients that send part
    of a request and stay (one of them refused a thread), then GETs until
    one is answered (a GET refused a thread is closed: the next one): the
    seconds the first answer took, or None if none came within
    HELD_UP_S."""
    stalled, began, answer, took = [], time.monotonic(), None, None
    try:
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", server.port),
                                         timeout=seconds(5))
            s.sendall(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n")
            stalled.append(s)
        began = time.monotonic()
        deadline = began + seconds(HELD_UP_S)
        for _ in range(8):
            left = deadline - time.monotonic()
            if left <= 0 or answer is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", server.port),
                                              timeout=left) as c:
                    c.sendall(b"GET /style.css HTTP/1.0\r\n\r\n")
                    data = b""
                    while True:
                        c.settimeout(max(0.01, deadline - time.monotonic()))
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                if data:
                    answer = data.split(b"\r\n", 1)[0]
                    took = time.monotonic() - began
            except ConnectionError:
                continue  # refused a thread, dropped: the next one
            except socket.timeout:
                break
    finally:
        for s in stalled:
            s.close()
    alive(lab, server, "a GET while every other pthread_create() failed and "
          "a client refused a thread had sent part of its request")
    lab.expect(answer is not None, f"GET /style.css not answered within "
               f"{seconds(HELD_UP_S):.1f} s while every other "
               "pthread_create() failed and a client refused a thread had "
               "sent part of its request and waited (strace -e inject=clone,"
               "clone3:error=EAGAIN:when=2+2 -p PID): the accept loop must "
               "never wait on one client; one served on the accept thread "
               "itself stops accept() for everyone until its request times "
               "out (10 s): drop it (close) and keep accepting")
    lab.expect(answer.startswith(b"HTTP/1.") and b" 200 " in answer + b" ",
               f"GET /style.css answered {answer[:40]!r} while "
               "pthread_create() was failing")
    return took


def dropped_at_once(lab, server):
    """While every pthread_create() fails: DROPPED clients one after
    another, each asking for a page, each closed without an answer within
    HELD_UP_S. Returns the longest wait, in seconds."""
    longest = 0.0
    for k in range(DROPPED):
        began = time.monotonic()
        deadline = began + seconds(HELD_UP_S)
        data, closed = b"", False
        try:
            with socket.create_connection(("127.0.0.1", server.port),
                                          timeout=seconds(HELD_UP_S)) as c:
                c.sendall(b"GET /style.css HTTP/1.0\r\n\r\n")
                while time.monotonic() < deadline:
                    c.settimeout(max(0.01, deadline - time.monotonic()))
                    chunk = c.recv(65536)
                    if not chunk:
                        closed = True
                        break
                    data += chunk
        except ConnectionError:
            closed = True  # dropped: reset
        except socket.timeout:
            pass
        took = time.monotonic() - began
        longest = max(longest, took)
        if not closed or data:  # if the server died, say so first
            alive(lab, server, f"client {k + 1} of {DROPPED} while every "
                  "pthread_create() failed")
        lab.expect(closed and not data, f"client {k + 1} of {DROPPED}, "
                   "asking for a page while every pthread_create() failed "
                   "(strace -e inject=clone,clone3:error=EAGAIN -p PID, a "
                   f"thread limit that stays): "
                   f"{'answered ' + repr(data[:30]) if data else 'no close'}"
                   f" within {seconds(HELD_UP_S):.1f} s: a client refused "
                   "a thread is dropped (closed) at once; a server that "
                   "waits for a thread (pthread_create() retried until it "
                   "succeeds) holds the accept loop on that one client for "
                   "as long as the limit lasts, and accepts no one else")
    alive(lab, server, f"{DROPPED} clients while every pthread_create() "
          "failed")
    return longest


@grader.check(10, f"out of threads (every other pthread_create() fails, "
              f"{SPURNED} connections, then a client refused a thread that "
              f"stalls; then every one fails, {DROPPED} clients) and out "
              "of address space (RLIMIT_AS, "
              f"{STARVED} clients at once): clients dropped, nothing kept, "
              "accept never held up, the server lives")
def out_of_threads(lab):
    env, blocks = heap_blocks(lab)
    shim_env, flood = thread_shim(lab)
    server = start(lab, preloaded(ENV, env, shim_env))
    spurned(lab, server, SPURNED // 5)
    before = footprint(server.pid)[:2]
    first = blocks()
    took = []

    def refusing():
        spurned(lab, server, SPURNED)
        took.append(accept_free(lab, server))

    _strace(server.pid, ["clone", "clone3"], refusing, "-e",
            "inject=clone,clone3:error=EAGAIN:when=2+2")
    _strace(server.pid, ["clone", "clone3"],
            lambda: took.append(dropped_at_once(lab, server)), "-e",
            "inject=clone,clone3:error=EAGAIN")
    grown = wait_for(lambda: [a - b for a, b in zip(footprint(server.pid),
                                                    before)],
                     lambda g: all(x <= s for x, s in zip(g, SPURN_SLACK)),
                     limit=5)
    lab.expect(all(x <= s for x, s in zip(grown, SPURN_SLACK)), f"{grown[0]} "
               f"more KiB of address space and {grown[1]} more mappings (at "
               f"most {SPURN_SLACK[0]} and {SPURN_SLACK[1]}) after {SPURNED} "
               "connections one after another while every other "
               "pthread_create() failed (strace -e inject=clone,clone3:"
               "error=EAGAIN:when=2+2 -p PID, as at the thread limit): the "
               "stack made for a thread that never started is never given "
               f"back (munmap it, or reuse it); {WATCH}")
    kept = wait_for(lambda: blocks() - first,
                    lambda n: n <= SPURN_BLOCKS, limit=5)
    lab.expect(kept <= SPURN_BLOCKS, f"{kept:+} heap blocks in use (malloc "
               f"less free, at most {SPURN_BLOCKS}) after {SPURNED} "
               "connections one after another while every other "
               "pthread_create() failed (strace -e inject=clone,clone3:"
               "error=EAGAIN:when=2+2 -p PID): what was allocated for a "
               "thread that never started (its argument?) is never freed "
               "when its client is dropped: free it there; watch: valgrind "
               "--leak-check=full ./threaded 8000")
    status, _ = get(server.port, "/style.css")
    lab.expect(status == 200, f"GET /style.css answered {status} after "
               "pthread_create() failed")
    left = flood(server.port, REFUSED_N, REFUSED)
    status = style_status(server.port)
    alive(lab, server, f"{REFUSED_N} clients refused a thread")
    lab.expect(left <= 0 and status == 200, f"GET /style.css answered "
               f"{status} once a thread limit that refused "
               f"{REFUSED_N - max(left, 0)} clients one after another was "
               "over (the preloaded thread shim failed their "
               "pthread_create(), EAGAIN; past pid_max, "
               f"{PID_MAX} here, as a long stretch at the limit may): "
               "a count of threads taken for a client refused a thread "
               "and never given back refuses everyone for ever once it "
               "reaches a cap; watch: strace -e inject=clone,clone3:"
               "error=EAGAIN -p PID over 40,000 connections, then curl "
               "http://127.0.0.1:8000/style.css")
    held = status_field(server.pid, "VmSize") + STARVED_KB
    resource.prlimit(server.pid, resource.RLIMIT_AS,
                     (held * 1024, resource.RLIM_INFINITY))
    clients = []
    try:
        try:
            for _ in range(STARVED):
                clients.append(socket.create_connection(
                    ("127.0.0.1", server.port), timeout=seconds(5)))
            wait_for(lambda: status_field(server.pid, "Threads"),
                     lambda n: n > STARVED, limit=2)
        except OSError:
            pass  # the server's end: judged below
        for c in clients:
            c.close()
        alive(lab, server, f"{STARVED} idle clients at once with its address "
              f"space limited to {held} KiB (prlimit --as, {STARVED_KB} KiB "
              "more than it held): a stack that could not be mapped (mmap "
              "or mprotect failed, MAP_FAILED used as a stack?) must drop "
              "its client, not the server")
    finally:
        if server.proc.poll() is None:
            resource.prlimit(server.pid, resource.RLIMIT_AS,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    try:
        status, _ = get(server.port, "/style.css")
    except OSError:
        alive(lab, server, "GET /style.css after the address space ran out")
        raise
    lab.expect(status == 200, f"GET /style.css answered {status} once the "
               "address space had run out and the clients had gone")
    server.stop()
    return (f"{grown[0]:+} KiB, {grown[1]:+} mappings, {kept:+} heap "
            f"blocks after {SPURNED} "
            f"connections, half refused a thread; a GET answered in "
            f"{took[0] * 1000:.0f} ms beside a stalled client; with every "
            f"pthread_create() failing, {DROPPED} clients dropped within "
            f"{took[1] * 1000:.0f} ms each; /style.css answered after "
            f"{REFUSED_N} refused; alive past "
            f"{held} KiB")


@grader.check(10, f"{ERRORS} 404s, 301s and 416s, {FORMS} refused forms "
              f"(Expect), {SERIAL} connections one after another, then "
              f"{REFUSALS} refused ones, leave no memory behind, beside a "
              "client that stays")
def no_leaks(lab):
    env, blocks = heap_blocks(lab)
    server = start(lab, {**ENV, **env})
    errors = error_blocks(lab, server, blocks)
    refused_forms(lab, server, FORMS // 5)
    first = blocks()
    refused_forms(lab, server, FORMS)
    forms = wait_for(lambda: blocks() - first,
                     lambda n: n <= BLOCK_SLACK, limit=5)
    lab.expect(forms <= BLOCK_SLACK, f"{forms:+} heap blocks in use (malloc "
               f"less free, at most {BLOCK_SLACK}) after {FORMS} refused "
               "forms one after another, each asking to continue (a POST "
               "with Expect: 100-continue, answered 100, then an empty "
               "remark: 400 and the form page again): a block allocated "
               "per request is not freed on the way out of expect_answer()'s "
               "100 or of format_refusal()'s form page (an early return?); "
               "watch: valgrind --leak-check=full ./threaded 8000, then curl "
               "-H 'Expect: 100-continue' -d guest-name=a -d guest-remarks= "
               "http://127.0.0.1:8000/guestbook")
    with HeldClients(server.port, 1) as held:  # its thread stays, asleep
        first = blocks()
        grown = serial_leak(lab, server)  # on its stack
        more = wait_for(lambda: blocks() - first,
                        lambda n: n <= BLOCK_SLACK, limit=5)
    alive(lab, server, f"{SERIAL * 6 // 5} connections one after another "
          "beside a keep-alive client")
    lab.expect(held.answered and not held.errors, "a keep-alive client "
               f"asking every 0.5 s meanwhile: {'; '.join(held.errors[:1])}"
               " (its thread's stack given to another thread?)")
    lab.expect(more <= BLOCK_SLACK, f"{more:+} heap blocks in use (malloc "
               f"less free, at most {BLOCK_SLACK}) after {SERIAL * 6 // 5} "
               "connections one after another: a block allocated for each "
               "connection (the thread's argument?) is never freed; watch: "
               "valgrind --leak-check=full ./threaded 8000")
    refused(lab, server, REFUSALS // 5)
    before, first = footprint(server.pid)[0], blocks()
    refused(lab, server, REFUSALS)
    grown_kb = wait_for(lambda: footprint(server.pid)[0] - before,
                        lambda kb: kb <= REFUSAL_SLACK_KB, limit=5)
    lab.expect(grown_kb <= REFUSAL_SLACK_KB, f"{grown_kb} more KiB of address "
               f"space after {REFUSALS} refused requests (414) one after "
               f"another (at most {REFUSAL_SLACK_KB}): a lingering close "
               f"leaves something behind; {WATCH}")
    kept = wait_for(lambda: blocks() - first,
                    lambda n: n <= BLOCK_SLACK, limit=5)
    lab.expect(kept <= BLOCK_SLACK, f"{kept:+} heap blocks in use (malloc "
               f"less free, at most {BLOCK_SLACK}) after {REFUSALS} refused "
               "requests (414) one after another: a lingering close leaves "
               "a block behind (a drain buffer not freed on one of its ways "
               "out?); watch: valgrind --leak-check=full ./threaded 8000")
    return (f"{errors}; {forms:+} after {FORMS} refused forms (Expect); "
            f"{grown}, {more:+} heap blocks; {grown_kb:+} KiB, "
            f"{kept:+} heap blocks after {REFUSALS} refusals")


def serial_leak(lab, server):
    """grading.no_leak(lab, server, SERIAL, watch=WATCH), its connections
    split over SERIAL_PATHS: after a warm-up of a fifth as many, the
    address space, the mappings and the descriptors back within
    SERIAL_SLACK. Returns the growth, for the PASS line."""
    connections(lab, server.port, SERIAL // 5, paths=SERIAL_PATHS)
    before = footprint(server.pid)
    connections(lab, server.port, SERIAL, paths=SERIAL_PATHS)
    grown = wait_for(lambda: [a - b for a, b in zip(footprint(server.pid),
                                                    before)],
                     lambda g: all(x <= s for x, s in zip(g, SERIAL_SLACK)),
                     limit=5)
    over = [f"{x} more {what} (at most {s})"
            for x, s, what in zip(grown, SERIAL_SLACK, FOOTPRINT) if x > s]
    lab.expect(not over, f"after {SERIAL} connections one after another: "
               + ", ".join(over) + ": something each connection takes is "
               f"never given back; {WATCH}")
    return ", ".join(f"{x:+} {what}" for x, what in zip(grown, FOOTPRINT))


def error_blocks(lab, server, blocks):
    """ERRORS keep-alive requests (ab -k, 4 at a time) for each of
    ERROR_PATHS, after a warm-up of a fifth as many: each answered with its
    status, and the heap blocks in use back within BLOCK_SLACK of where the
    warm-up left them. Returns the growth, for the PASS line."""
    said = []
    for path, status, header in ERROR_PATHS:
        asked = f"{path} with {header}" if header else path
        def load(count):
            done = subprocess.run(
                ["ab", "-q", "-k", "-n", str(count), "-c", "4", "-s",
                 str(int(seconds(30))), *(["-H", header] if header else []),
                 f"http://127.0.0.1:{server.port}{path}"],
                capture_output=True, text=True, timeout=seconds(120))
            lab.expect(done.returncode == 0 and re.search(
                rf"Complete requests: +{count}\n", done.stdout) and
                "Failed requests:        0" in done.stdout,
                f"ab -k -n {count} -c 4 {asked} (a {status}) failed: "
                f"{failures(done)}")
        load(ERRORS // 5)
        first = blocks()
        load(ERRORS)
        more = wait_for(lambda: blocks() - first,
                        lambda n: n <= BLOCK_SLACK, limit=5)
        alive(lab, server, f"{ERRORS} keep-alive requests for {asked}")
        with Connection(server.port, timeout=seconds(5)) as conn:
            conn.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n"
                      f"{header + chr(13) + chr(10) if header else ''}"
                      "Connection: close\r\n\r\n".encode())
            code = conn.read_response().status
        lab.expect(code == status, f"GET {asked} answered {code}, not "
                   f"{status}")
        lab.expect(more <= BLOCK_SLACK, f"{more:+} heap blocks in use "
                   f"(malloc less free, at most {BLOCK_SLACK}) after "
                   f"{ERRORS} requests for {asked} (a {status}, ab -k -c 4):"
                   f" a block allocated per request is not freed on the way "
                   f"out of a {status} (an early return?); watch: valgrind "
                   "--leak-check=full ./threaded 8000, then curl "
                   f"{'-H ' + repr(header) + ' ' if header else ''}"
                   f"http://127.0.0.1:8000{path}")
        said.append(f"{more:+} after {ERRORS} x {status}")
    return ", ".join(said)


def refused_forms(lab, server, count):
    """count refused forms one after another on a kept connection (a new
    one if the server closes): each a POST with Expect: 100-continue, its
    body sent once the 100 came, then answered 400 (an empty remark)."""
    head = (FORM_HEAD + b"Expect: 100-continue\r\nContent-Length: %d\r\n"
            b"\r\n" % len(REFUSED_FORM))
    conn = None
    try:
        for k in range(count):
            if conn is None or conn.eof:
                if conn:
                    conn.close()
                conn = Connection(server.port, timeout=seconds(5))
            conn.send(head)
            interim = conn.read_response()
            lab.expect(interim.status == 100, f"a form POST with Expect: "
                       f"100-continue answered {interim.status}, not 100 "
                       "Continue")
            conn.send(REFUSED_FORM)
            answer = conn.read_response()
            lab.expect(answer.status == 400, f"a form with an empty remark "
                       f"answered {answer.status}, not 400")
            if answer.headers.get("Connection", "").lower() == "close":
                conn.close()
                conn = None
    except (OSError, AssertionError):
        alive(lab, server, f"refused form {k + 1} of {count}")
        raise
    finally:
        if conn:
            conn.close()


def failures(done):
    """ab's failed requests and their kinds, or its report's end."""
    found = re.search(r"Failed requests: +(\d+)\n\s*(\(.*?\))?", done.stdout)
    non_2xx = re.search(r"Non-2xx responses: +\d+", done.stdout)
    said = " ".join(filter(None, [found and f"{found[1]} failed requests "
                                  f"{found[2] or ''}".strip(),
                                  non_2xx and non_2xx[0]]))
    return said or ab_said(done)


def refused(lab, server, count):
    """count connections one after another, each a request whose target is
    too long (414): the server answers, then lingers before it closes."""
    ask = b"GET /" + b"u" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    for k in range(count):
        try:
            with Connection(server.port, timeout=seconds(5)) as conn:
                conn.send_tolerating_reset(ask)
                status = conn.read_response().status
        except (OSError, AssertionError):
            alive(lab, server, f"refused request {k + 1} of {count}")
            raise
        lab.expect(status == 414, f"a 5,000-byte target answered {status}")


# Writable static arrays the starter itself keeps in a function (a
# constant one in truth, never written): (function, name).
STARTER_STATICS = {("format_form_page", "uncounted")}


FUNCTIONS = {}  # code: function_names(code), worked out once per grading


def function_names(code):
    """{name: (first line, body)} of every function defined in code (the
    same dict for the same code: the review asks four times; read only)."""
    if code in FUNCTIONS:
        return FUNCTIONS[code]
    found = FUNCTIONS[code] = {}
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\([^;{}()]*(?:\([^()]*\)"
                         r"[^;{}()]*)*\)\s*\{", code):
        if m[1] not in ("if", "while", "for", "switch") and m[1] not in found:
            body = function_body(code, m[1])
            if body:
                found[m[1]] = body
    return found


# Writable arrays the starter itself declares at file scope: none (its
# one, placeholders[], is const).
STARTER_GLOBALS = set()
# Static structs with a byte pointer that the starter itself hands by address
# to a function: (function or None, name).
STARTER_HANDED = set()
# Structs holding a byte array the starter itself keeps in static storage:
# none (its date caches are thread-local): (function or None, name).
STARTER_AGGREGATES = set()


def file_scope(code):
    """[(offset, text)] of each declaration at file scope in code (C with
    comments and literals blanked): what ends in a ';' outside any brace,
    with the insides of its braces (a struct's members, an initializer)
    blanked; function definitions and preprocessor lines left out."""
    code = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*",
                  lambda m: re.sub(r"[^\n]", " ", m[0]), code)
    found, start, i, parts = [], 0, 0, []
    while i < len(code):
        if code[i] == ";":
            found.append((start, "".join(parts) + code[start:i]))
            parts, start = [], i + 1
        elif code[i] == "{":
            depth, j = 0, i
            while j < len(code):
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                if depth == 0:
                    break
                j += 1
            if code[:i].rstrip().endswith(")"):  # a function's body
                parts, start = [], j + 1
            else:  # a struct's members, an initializer: kept out
                parts.append(code[start:i] + "{}")
                start = j + 1
            i = j
        i += 1
    return found


def file_scope_arrays(code):
    """[(offset, name, declaration)] of the writable byte buffers (arrays
    of char, not of pointers) declared at file scope: not const, not
    thread-local, not extern (defined here)."""
    found = []
    for offset, decl in file_scope(code):
        if re.match(r"\s*(typedef|extern)\b", decl) or re.search(
                r"\b(const|_Thread_local|__thread|thread_local)\b", decl):
            continue
        depth = 0
        for m in re.finditer(r"[()]|\b([A-Za-z_]\w*)\s*\[", decl):
            if m[0] in "()":
                depth += 1 if m[0] == "(" else -1
            elif depth == 0 and "*" not in re.split(
                    r"[,=]", decl[:m.start()])[-1] and re.search(
                    r"\b(char|u?int8_t|u_char)\b", decl[:m.start()]):
                found.append((offset + m.start(), m[1], decl))
    return found


# What hands out a buffer from the heap (or a mapping): a static pointer set
# from one of these, once, is one buffer that every thread writes.
ALLOCATORS = r"(?:malloc|calloc|realloc|reallocarray|strdup|strndup|" \
    r"aligned_alloc|memalign|valloc|mmap)"
BYTE_TYPES = r"\b(char|u?int8_t|u_char|void)\b"


def static_pointers(code):
    """[(offset, name, scope)] of the static pointers to writable bytes
    (char *, uint8_t *, void *; not a pointer to const, not thread-local)
    in code: declared in a function with `static` (scope: its name), or at
    file scope (scope None)."""
    found = []

    def pointers(decl, at, scope):
        if re.search(r"\b(const|_Thread_local|__thread|thread_local|"
                     r"typedef|extern)\b", decl.split("*")[0] + " " +
                     decl.split("=")[0].split("(")[0]):
            return
        for m in re.finditer(r"\*\s*([A-Za-z_]\w*)\s*(?=[=,;\[]|$)", decl):
            head = decl[:m.start()]
            if "(" in head or not re.search(BYTE_TYPES, head):
                continue
            found.append((at + m.start(), m[1], scope))

    for offset, decl in file_scope(code):
        pointers(decl, offset, None)
    for name, (first, body) in function_names(code).items():
        start = code.find(body)
        for m in re.finditer(r"\bstatic\b[^;{}()]*", body):
            pointers(m[0], start + m.start() if start >= 0 else 0, name)
    return found


def static_objects(code):
    """{name: (its struct or union tag or typedef name, scope)} of the
    objects in static storage (at file scope, or static in a function) of
    a struct or union type: not const, not thread-local, not extern, not a
    pointer to one (scope: the function's name, or None)."""
    found, bodies = {}, aggregate_bodies(code)
    decl = re.compile(r"\s*(?:static\s+)?(?:volatile\s+)?(?:(struct|union)"
                      r"\s+)?([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*(?=[;=\[,])")

    def objects(text, scope):
        head = text.split("=")[0]
        if "(" in head or re.search(r"\b(const|_Thread_local|__thread|"
                                    r"thread_local|typedef|extern)\b", head):
            return
        m = decl.match(head + ";")
        if m and (m[1] or m[2] in bodies):
            found[m[3]] = (m[2], scope)

    for _, text in file_scope(code):
        objects(text, None)
    for name, (_, body) in function_names(code).items():
        for m in re.finditer(r"\bstatic\b[^;{}()]*", body):
            objects(m[0], name)
    return found


def aggregate_bodies(code):
    """{struct/union tag or typedef name: its members' text} in code."""
    bodies = {}
    for m in re.finditer(r"\b(?:struct|union)\s+([A-Za-z_]\w*)?\s*\{", code):
        end = closing(code, m.end() - 1)
        body = code[m.end():end]
        if m[1]:
            bodies[m[1]] = body
        named = re.match(r"\s*([A-Za-z_]\w*)\s*;", code[end + 1:])
        if named and re.search(r"\btypedef\s*$", code[:m.start()]):
            bodies[named[1]] = body
    return bodies


def static_members(code):
    """[(offset, object, member, allocator)] of each byte pointer member
    (char *, uint8_t *, void *; not a pointer to const) of an object in
    static storage (static_objects) that code sets from an allocator
    (server.location = malloc(...)): one heap buffer behind a member of a
    static struct is one buffer that every thread writes, all the same."""
    objects, bodies, found = static_objects(code), aggregate_bodies(code), []
    for m in re.finditer(rf"\b([A-Za-z_]\w*)\s*\.\s*([A-Za-z_]\w*)\s*=\s*"
                         rf"(?:\([^()]*\)\s*)?({ALLOCATORS})\s*\(", code):
        if m[1] not in objects:
            continue
        body = bodies.get(objects[m[1]][0], "")
        member = re.search(rf"(?:^|(?<=[;{{]))([^;{{}}]*?)\*\s*{m[2]}\s*"
                           r"(?=[;,\[])", body)
        if member and re.search(BYTE_TYPES, member[1]) and not re.search(
                r"\bconst\b", member[1]):
            found.append((m.start(), m[1], m[2], m[3]))
    return found


def static_handed(code):
    """[(offset, object, member, function, scope)] of each object in static
    storage (static_objects) of a struct type with a byte pointer member
    (char *, uint8_t *, void *; not a pointer to const) that code hands,
    whole, by address to a function (sb_reserve(&location, ...)): that
    function may point the member at a heap buffer (realloc() inside a
    helper), one buffer that every thread writes, all the same."""
    objects, bodies, found = static_objects(code), aggregate_bodies(code), []
    for name, (kind, scope) in objects.items():
        members = [m for m in re.finditer(
            r"(?:^|(?<=[;{]))([^;{}]*?)\*\s*([A-Za-z_]\w*)\s*(?=[;,\[])",
            bodies.get(kind, "")) if re.search(BYTE_TYPES, m[1]) and
            not re.search(r"\bconst\b", m[1])]
        if not members:
            continue
        where = function_body(code, scope)[1] if scope else code
        start = code.find(where) if scope else 0
        for m in re.finditer(rf"&\s*{name}\s*[,)]", where):
            function = called_with(where, m.start())
            if function:
                found.append((max(start, 0) + m.start(), name,
                              members[0][2], function, scope))
                break
    return found


def called_with(code, at):
    """The function whose call's arguments hold code[at] (the innermost
    parenthesis open there, with a name before it that is not a keyword),
    or None."""
    depth = 0
    for i in range(at - 1, -1, -1):
        if code[i] in ";{}":
            return None
        depth += {")": 1, "(": -1}.get(code[i], 0)
        if depth < 0:
            name = re.search(r"([A-Za-z_]\w*)\s*$", code[:i])
            if name and name[1] not in ("if", "while", "for", "switch",
                                        "sizeof", "return"):
                return name[1]
            depth = 0
    return None


BYTE_MEMBER = re.compile(r"(?:^|(?<=[;{]))\s*((?:(?!\bconst\b)[^;{}*])*?\b(?:char|"
                         r"u?int8_t|u_char)\b[^;{}*()]*?\b([A-Za-z_]\w*)"
                         r"\s*\[)")


def closing(code, i):
    """Where the brace opened at code[i] closes (or the end of code)."""
    depth = 0
    for j in range(i, len(code)):
        depth += {"{": 1, "}": -1}.get(code[j], 0)
        if depth == 0:
            return j
    return len(code)


def byte_aggregates(code):
    """{struct/union tag or typedef name: a byte array member in it} for
    every struct and union in code (C without comments and literals) that
    holds a writable byte array, directly or in a member of such a type."""
    bodies = aggregate_bodies(code)
    found = {}
    for name, body in bodies.items():
        member = BYTE_MEMBER.search(body)
        if member:
            found[name] = member[2]
    while True:  # a member whose type holds one holds one too
        more = {}
        for name, body in bodies.items():
            if name in found:
                continue
            for m in re.finditer(r"(?:^|(?<=[;{]))\s*(?:(?:struct|union)\s+)?"
                                 r"([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*[;\[]",
                                 body):
                if m[1] in found and "const" not in m[0]:
                    more[name] = found[m[1]]
                    break
        if not more:
            return found
        found.update(more)


def static_aggregates(code):
    """[(offset, name, member, scope)] of the objects in static storage
    (static in a function, or at file scope) of a struct or union type
    that holds a writable byte array (member: that array): not const, not
    thread-local, not extern. A char array wrapped in a struct is one
    buffer that every thread writes all the same."""
    types, found = byte_aggregates(code), []
    depth, level = 0, []
    for ch in code:  # the brace depth before each character
        level.append(depth)
        depth += {"{": 1, "}": -1}.get(ch, 0)
    names = "|".join(map(re.escape, types)) or "(?!)"
    pattern = re.compile(rf"\b(?:(?:struct|union)\s*([A-Za-z_]\w*)?\s*(\{{)"
                         rf"|(?:struct|union)\s+({names})\b|({names})\b)")
    functions = [(code.find(body), code.find(body) + len(body), name)
                 for name, (_, body) in function_names(code).items()]
    i = 0
    while True:
        m = pattern.search(code, i)
        if not m:
            return found
        i = m.end()
        member = None
        if m[2]:  # an inline body
            end = closing(code, m.end() - 1)
            inline = BYTE_MEMBER.search(code[m.end():end])
            member = inline and inline[2] or (m[1] and types.get(m[1]))
            i = end + 1
        else:
            member = types.get(m[3] or m[4])
        head = re.split(r"[;{}]", code[:m.start()])[-1]
        tail = re.match(r"[^;{}]*", code[i:])[0]
        if not member or "(" in head or re.search(
                r"\b(const|_Thread_local|__thread|thread_local|typedef|"
                r"extern)\b", head + " " + tail.split("=")[0]):
            continue
        if level[m.start()] and not re.search(r"\bstatic\b", head):
            continue  # automatic: on the stack, the thread's own
        declared = re.match(r"\s*(\**)\s*([A-Za-z_]\w*)\s*[\[=;,]",
                            code[i:])
        if not declared or declared[1] or "(" in tail.split("=")[0]:
            continue  # a pointer, a function, a bare type
        scope = next((name for lo, hi, name in functions
                      if lo <= m.start() < hi), None)
        found.append((m.start(), declared[2], member, scope))


# Why a buffer in static storage is wrong, in every review message.
SHARED_BUFFER = ("that every thread writes at once, so a request can be "
                 "answered with another's bytes (another redirect's "
                 "Location); a buffer stays on the stack (it is what the "
                 "stack is for) or is allocated per request (and freed)")


@grader.check(5, "no writable buffer in static storage, in a function or "
              "at file scope (a source review): every thread would share it")
def shared_buffers(lab):
    text = source_text(lab)
    code, lines = code_only(text), text.splitlines()
    for at, name, _ in file_scope_arrays(code):
        if name in STARTER_GLOBALS:
            continue
        line = code.count("\n", 0, at) + 1
        lab.expect(False, f"{name}[] is declared at file scope, in static "
                   "storage: one buffer that every thread writes at once, "
                   "so a request can be answered with another's bytes (a "
                   f"torn header, another's Location): line {line}: "
                   f"{lines[line - 1].strip()[:80]!r}; a buffer stays on "
                   "the stack (it is what the stack is for) or on the heap, "
                   "per thread")
    for name, (first, body) in function_names(code).items():
        for m in re.finditer(r"\bstatic\b([^;{}()]*?)\b([A-Za-z_]\w*)\s*\[",
                             body):
            if (re.search(r"\b(const|_Thread_local|__thread|thread_local)\b",
                          m[1]) or (name, m[2]) in STARTER_STATICS):
                continue
            line = first + body.count("\n", 0, m.start())
            lab.expect(False, f"{name}() keeps {m[2]}[] in static storage: "
                       "one buffer that every thread writes at once, so a "
                       "request can be answered with another's bytes (a "
                       f"torn header, another file): line {line}: "
                       f"{lines[line - 1].strip()[:80]!r}; a buffer stays "
                       "on the stack (it is what the stack is for) or on "
                       "the heap, per thread")
    for at, name, member, scope in static_aggregates(code):
        if (scope, name) in STARTER_AGGREGATES:
            continue
        line = code.count("\n", 0, at) + 1
        lab.expect(False, f"{scope + '()' if scope else 'file scope'} keeps "
                   f"{name} in static storage, a struct holding {member}[]: "
                   "one buffer that every thread writes at once, so a "
                   "request can be answered with another's bytes (another "
                   f"redirect's Location): line {line}: "
                   f"{lines[line - 1].strip()[:80]!r}; a buffer stays on "
                   "the stack (it is what the stack is for) or on the heap, "
                   "per thread")
    for at, name, scope in static_pointers(code):
        where = function_body(code, scope)[1] if scope else code
        set_from = re.search(rf"\b{name}\s*=\s*(?:\([^()]*\)\s*)?"
                             rf"{ALLOCATORS}\s*\(", where)
        if not set_from:
            continue
        line = code.count("\n", 0, at) + 1
        lab.expect(False, f"{name} is a static pointer "
                   f"({scope + '()' if scope else 'file scope'}, line "
                   f"{line}: {lines[line - 1].strip()[:70]!r}) set from "
                   f"{set_from[0].split('=')[-1].strip()[:-1].strip()}(): "
                   f"one heap buffer {SHARED_BUFFER}")
    for at, name, member, allocator in static_members(code):
        line = code.count("\n", 0, at) + 1
        lab.expect(False, f"{name}.{member}, a pointer in {name} (static "
                   f"storage), is set from {allocator}() (line {line}: "
                   f"{lines[line - 1].strip()[:70]!r}): one heap buffer "
                   f"{SHARED_BUFFER}")
    for at, name, member, function, scope in static_handed(code):
        if (scope, name) in STARTER_HANDED:
            continue
        line = code.count("\n", 0, at) + 1
        lab.expect(False, f"{scope + '()' if scope else 'file scope'} keeps "
                   f"{name} in static storage, a struct whose {member} "
                   f"points at bytes, and hands it to {function}() (line "
                   f"{line}: {lines[line - 1].strip()[:70]!r}), which may "
                   f"point it at a heap buffer: one buffer {SHARED_BUFFER}")
    return "no static buffer"


@grader.check(5, "pages and the guestbook still served; a clean stop")
def still_serves(lab):
    server = start(lab)
    for path in ("/", "/guestbook", "/style.css"):
        try:
            status, _ = get(server.port, path)
        except OSError:
            alive(lab, server, f"GET {path}")
            raise
        lab.expect(status == 200, f"GET {path} answered {status}")
    server.stop()


if __name__ == "__main__":
    grader.main()
