#!/usr/bin/env python3
"""Grader for the slowloris lab (labs/slowloris/README.md).

Both directions of a deadline: attackers (idle, or a byte a second) must be
cut so a new client gets a thread (an upper bound), and slow but legitimate
clients, inside the 5 s idle and 10 s request limits, must still be served
(a lower bound). The pool is checked to be the size asked for, so more
threads cannot stand in for the deadlines."""

import fcntl
import os
import re
import selectors
import socket
import struct
import termios
import threading
import time
from pathlib import Path

from grading import (Grader, _strace, build, cpu_seconds, death,
                     build_shim, code_only,
                     descriptors, get, idle_clients, raise_open_file_limit,
                     seconds, status_field, wait_for)  # labs/grading.py
from rawhttp import Connection  # tests/rawhttp.py

THREADS = 8  # the pool under attack
ATTACKERS = THREADS + 5  # more connections than threads
BURST = 10  # new clients arriving at once while the pool is under attack
WIDE = 18  # threads when each attacker is timed (one for each)
CUT = 11.5  # seconds: the 10 s request limit, and a margin
TIGHT = 10.6  # seconds: the 10 s request limit when the first byte comes
#               0.1 s into a second of CLOCK_MONOTONIC (no rounding up)
BIG_HEAD = (b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"y" * 8300
            + b"\r\n\r\n")  # 8.3 KB: over MAX_HEAD (8 KiB), within the buffer
LATE = 9.85  # seconds after a request's first byte: one more byte (what is
#              left, 0.15 s, rounded up to a whole second would cut at 10.85)
MAX_BODY = 18932  # the form rule's bound on a POST body (docs/DESIGN.md)
_MAX_FRONT = (b"POST /guestbook HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/x-www-form-urlencoded\r\nContent-Length: "
              + str(MAX_BODY).encode() + b"\r\nConnection: close\r\nX-Pad: ")
# The largest request: a head of MAX_HEAD (8,192) bytes and a body of
# MAX_BODY, CONN_BUF_SIZE (27,124) bytes in all: it fits the buffer exactly.
MAX_REQUEST = (_MAX_FRONT + b"p" * (8192 - len(_MAX_FRONT) - 4) + b"\r\n\r\n"
               + b"guest-name=a&guest-remarks=" + b"x" * (MAX_BODY - 27))
IDLE_CUT = 7.5  # seconds: the 5 s idle limit, and a margin
UPTIME_DAYS = 926  # CLOCK_MONOTONIC about this far ahead (80,000,000 s,
#                   in [2^26, 2^27) s): its ms are long past 2^31 and 2^32,
#                   and a float of its seconds steps FLOAT_STEP s at a time
UPTIME_S = 80_000_000
FLOAT_STEP = 8  # seconds between two floats (24-bit mantissa) at UPTIME_S
WALL_STEP = 3600  # seconds the wall clock (CLOCK_REALTIME) steps ahead
JUMP_MS = 2**31 - 1000  # CLOCK_MONOTONIC jumps this far after the server
#                         has started: with the seconds it has run, its
#                         uptime in ms is past INT_MAX
LONG_REQUESTS = 25  # requests on one keep-alive connection, the clock
LONG_GAP_S = 3  # jumping this far before each: 72 s of the server's time
#                 on one connection, in a fraction of a second
RUNNABLE = 2.0  # pool threads runnable at once, on average, while idle
WAKEUPS = 200  # context switches of the whole server in that idle second
ATTACK_WAKEUPS = 100  # a second, on average over the slow body attack (the
#                       reference: about 10, a wake for each piece)
BEGUN = b"GET / HT"  # a request begun, then nothing: its wait is watched too
# Refused at once by answer_expect() (405: /nope takes no POST), the
# request's first byte already in: a way out of read_request() too.
REFUSED_EXPECT = (b"POST /nope HTTP/1.1\r\nHost: x\r\nExpect: 100-continue"
                  b"\r\nContent-Length: 5\r\n\r\n")
# What a deadline might make a descriptor with: while the idle attackers
# arrive, each pool thread's first such call fails with EMFILE (strace's
# fault injection), as at the process's descriptor limit.
MAKES_FD = ("timerfd_create", "eventfd2", "epoll_create1", "signalfd4",
            "pipe2", "dup", "dup3")
HALF_CLOSED = 5  # of the BURST in idle_attack: the request, then the FIN
REFUSED = 20  # malformed requests (400) in idle_attack: none may leave a
#               descriptor behind (at most THREADS in all) or close one twice
# Preloaded in idle_attack: each pool thread's first call that makes a
# descriptor fails with EMFILE from the thread's start (a descriptor made
# once per thread as it starts, and never checked, is -1 for good); the
# main thread's calls are left alone. The calls refused are logged to
# $NOFD_LOG.
NOFD = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
static __thread int made;
static int refuse(const char *what)
{
    if (syscall(SYS_gettid) == getpid() || made++)
        return 0;
    const char *log = getenv("NOFD_LOG");
    int fd = log ? open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)
                 : -1;
    if (fd >= 0) {
        if (write(fd, what, strlen(what)) < 0 || write(fd, "\n", 1) < 0) {}
        close(fd);
    }
    errno = EMFILE;
    return 1;
}
#define PASS(name, ret, params, args)                                      \
    ret name params                                                        \
    {                                                                      \
        static ret (*real) params;                                         \
        if (refuse(#name))                                                 \
            return -1;                                                     \
        if (!real)                                                         \
            real = (ret (*) params)dlsym(RTLD_NEXT, #name);                \
        return real args;                                                  \
    }
#include <dlfcn.h>
PASS(timerfd_create, int, (int c, int f), (c, f))
PASS(eventfd, int, (unsigned int v, int f), (v, f))
PASS(epoll_create1, int, (int f), (f))
PASS(epoll_create, int, (int n), (n))
PASS(signalfd, int, (int fd, const sigset_t *m, int f), (fd, m, f))
PASS(pipe2, int, (int p[2], int f), (p, f))
PASS(pipe, int, (int p[2]), (p))
PASS(dup, int, (int fd), (fd))
PASS(dup3, int, (int a, int b, int f), (a, b, f))
"""
HIGH_FD = 1100  # high_descriptors: the server starts with 3..HIGH_FD taken,
#                 so its clients' descriptors are past FD_SETSIZE (1,024)
FORTIFY = "-O1 -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2"  # as distributions build
# (fortify needs optimization: tools/lab builds at -O0)
# What can write an fd_set: a source without any of these is not rebuilt.
FD_SET_WORDS = re.compile(r"\b(?:fd_set|FD_SET|FD_ISSET|FD_CLR|FD_ZERO|"
                          r"p?select|select\.h|__fd_mask|fds_bits)\b")
WATCH = (f"watch it: ZEROHTTPD_THREADS={THREADS} ./prethreaded 8000, the "
         f"handout's {ATTACKERS} idle sockets, then time curl "
         "http://127.0.0.1:8000/")
grader = Grader("slowloris")


def pool_server(lab, env=None):
    """The server with THREADS threads; more (a bigger pool instead of the
    deadlines) fails the check."""
    server = lab.start(env={"ZEROHTTPD_THREADS": str(THREADS), **(env or {})})
    get(server.port, "/")  # the pool is up once a request is answered
    threads = wait_for(lambda: status_field(server.pid, "Threads"),
                       lambda n: n > THREADS + 2, 0.5)  # any late starter
    lab.expect(threads <= THREADS + 2,
               f"{threads} threads for ZEROHTTPD_THREADS={THREADS}: the pool "
               f"must stay {THREADS} (ls /proc/PID/task counts them)")
    return server


def half_closed_get(port, limit):
    """GET / sent whole, then the client's FIN (shutdown(SHUT_WR), as nc -N
    and many scripts do): the status of the answer, 0 for none."""
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(limit)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)[0]


def burst_served_within(port, limit, halfclosed=0, dropped=None):
    """BURST new clients at once, each GET /: the slowest one's seconds, or
    None if one was not answered 200 within `limit`. The first `halfclosed`
    send their request and their FIN together (they wait in the backlog
    while the pool is held: both are in when a thread turns to them);
    dropped: a list that receives the statuses those were answered that
    were not 200 (0: none)."""
    took = [None] * BURST

    def one(k):
        start = time.monotonic()
        try:
            if k < halfclosed:
                status = half_closed_get(port, limit)
            else:
                status, _ = get(port, "/", timeout=limit)
        except OSError:
            status = 0
        if status == 200:
            took[k] = time.monotonic() - start
        elif k < halfclosed and dropped is not None:
            dropped.append(status)
            took[k] = 0.0  # graded apart, once the others are served

    clients = [threading.Thread(target=one, args=(k,)) for k in range(BURST)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    if None in took or max(took) > seconds(limit):
        return None
    return max(took)


ENDLESS_HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 1000
# A head sent in 8 pieces a second apart (7 s), then a body of 100 bytes,
# a byte a second: the 10 s of the request limit count from its first
# byte, and the body is part of the request.
POST_HEAD = (b"POST /guestbook HTTP/1.1\r\nHost: x\r\nContent-Type: "
             b"application/x-www-form-urlencoded\r\nContent-Length: 100"
             b"\r\n\r\n")
SLOW_BODY = ([POST_HEAD[len(POST_HEAD) * k // 8:len(POST_HEAD) * (k + 1) // 8]
              for k in range(8)] + [b"x"] * 100)


def trickle(socks, stop, every=1.0, pieces=None):
    """Slowloris: one more piece of a request on each socket every `every`
    seconds (default: a byte of a head that never ends)."""
    for piece in pieces or [ENDLESS_HEAD[i:i + 1]
                            for i in range(len(ENDLESS_HEAD))]:
        for s in socks:
            try:
                s.send(piece)
            except OSError:
                pass
        if stop.wait(every):
            return


def under_attack(lab, attackers, limit, every=None, pieces=None, heard=None,
                 halfclosed=0, dropped=None):
    """The slowest of a burst of new clients while `attackers` hold the
    pool (trickling a piece every `every` seconds if set), or None.
    heard: a list that receives what each attacker was sent (b"" for
    nothing) before it is closed."""
    stop = threading.Event()
    sender = threading.Thread(target=trickle,
                              args=(attackers, stop, every, pieces))
    if every:
        sender.start()
    try:
        time.sleep(0.5)  # every attacker has its thread
        return burst_served_within(lab.servers[-1].port, limit, halfclosed,
                                   dropped)
    finally:
        stop.set()
        if every:
            sender.join()
        for s in attackers:
            if heard is not None:
                s.setblocking(False)  # one still held: no 5 s timeout
                try:
                    heard.append(s.recv(65536, socket.MSG_DONTWAIT
                                        | socket.MSG_PEEK))
                except OSError:  # nothing (EAGAIN), or reset
                    heard.append(b"")
            s.close()


def closed_twice(traced):
    """The descriptors (>= 0) of the close() calls that failed with EBADF
    in strace -f's record: each was closed already, and in between another
    thread may have been given that number for a new client."""
    called, twice = {}, []
    for line in traced.splitlines():
        pid = line.split(None, 1)[0] if line else ""
        start = re.search(r"close\((-?\d+)", line)
        if start:  # the call, or its first half (<unfinished ...>)
            called[pid] = int(start[1])
        if "EBADF" in line and called.get(pid, -1) >= 0:
            twice.append(called[pid])
    return twice


@grader.check(15, f"{ATTACKERS} idle connections against {THREADS} threads: "
              f"{BURST} new clients are served within 8 s; each cut "
              "connection closed once, silently; held threads asleep, idle "
              "or with a request begun")
def idle_attack(lab):
    # Each pool thread's first call that makes a descriptor fails with
    # EMFILE from the thread's start (NOFD, preloaded), and again from when
    # the attackers come (strace's fault injection).
    nofd_log = lab.workdir / "nofd.log"
    server = pool_server(lab, env={
        "LD_PRELOAD": str(build_shim(lab, "nofd", NOFD, "-ldl")),
        "NOFD_LOG": str(nofd_log)})
    held = len(descriptors(server.pid))  # before any client of the checks
    base = sockets(server.pid)  # its listener
    # First THREADS silent connections hold the pool for a second, its
    # threads watched; they leave (the threads see EOF) before the attack.
    quiet = idle_clients(server.port, THREADS)
    running, woke, cpu = pool_asleep(server, quiet, base)
    lab.expect(running < RUNNABLE and woke <= WAKEUPS * seconds(1),
               f"while {THREADS} connections that send nothing held the "
               f"pool for {seconds(1):.0f} s, {running:.1f} of its threads "
               f"were runnable at once on average (at most {RUNNABLE:.0f}) "
               f"and they were switched out {woke} times (at most "
               f"{WAKEUPS}: voluntary and nonvoluntary_ctxt_switches in "
               f"/proc/PID/task/*/status), using {cpu:.2f} s of CPU: a "
               "thread that waits for a client by spinning (recv() with "
               "MSG_DONTWAIT, and the clock again) burns a CPU until its "
               "deadline, and the attack takes every core too; one that "
               "naps between tries (nanosleep() of a millisecond or so) "
               "still wakes a thousand times a second for nothing; wait "
               "asleep in poll() (wait_readable) for what is left of the "
               "deadline; watch it: top -H -p PID, or grep ctxt "
               "/proc/PID/task/*/status twice a second apart, during the "
               "handout's first block")
    # Then THREADS that have begun a request ('GET / HT') and stopped: the
    # wait for the rest of a request is a wait too, under its 10 s.
    back_in_accept(server.pid, base)
    begun = idle_clients(server.port, THREADS)
    for s in begun:
        s.send(BEGUN)
    b_running, b_woke, b_cpu = pool_asleep(server, begun, base)
    lab.expect(b_running < RUNNABLE and b_woke <= WAKEUPS * seconds(1),
               f"while {THREADS} connections that had sent {BEGUN!r} (a "
               f"request begun) held the pool for {seconds(1):.0f} s, "
               f"{b_running:.1f} of its threads were runnable at once on "
               f"average (at most {RUNNABLE:.0f}) and they were switched "
               f"out {b_woke} times (at most {WAKEUPS}), using {b_cpu:.2f} "
               "s of CPU (while they were idle: "
               f"{running:.1f} runnable, {woke} switches): the wait for the "
               "rest of a request begun spins (recv() with MSG_DONTWAIT, "
               "and the clock again) or naps? It is a wait like the idle "
               "one: asleep in poll() (wait_readable) until the request's "
               "deadline; watch it: top -H -p PID while 8 clients each "
               "send 'GET / HT' and stop")
    back_in_accept(server.pid, base)
    # The 2 * THREADS clients have left (their threads saw EOF): what each
    # request took is given back; one descriptor per thread, made once and
    # kept, is no leak.
    now = wait_for(lambda: len(descriptors(server.pid)),
                   lambda n: n <= held + THREADS, 2)
    lab.expect(now <= held + THREADS,
               f"the server held {held} descriptors before {2 * THREADS} "
               f"clients came, {now} after they had all left (by closing "
               "their end: recv() returned 0): a descriptor made for each "
               "request (a timerfd?) is not closed on every way out of "
               "read_request(), the client's close included; once the "
               "table is full no deadline can be made (docs/DESIGN.md: no "
               "server leaks descriptors); watch it: ls /proc/PID/fd | wc "
               "-l before and after 100 curl http://127.0.0.1:8000/")
    # The attackers connect once strace is attached, and the first call of
    # each pool thread that makes a descriptor (MAKES_FD) fails with EMFILE.
    # Then, still watched, REFUSED malformed requests one after another,
    # each answered 400 and closed: a way out of read_request() too.
    took, heard, dropped, refusals = [], [], [], []

    def attack():
        took.append(under_attack(lab, idle_clients(server.port, ATTACKERS),
                                 8, heard=heard, halfclosed=HALF_CLOSED,
                                 dropped=dropped))
        refusals.extend(malformed(server.port, REFUSED))

    traced = _strace(server.pid, ["close", *MAKES_FD], attack, "-f", "-e",
                     f"inject={','.join(MAKES_FD)}:error=EMFILE:when=1")
    took = took[0]
    failed = sorted({m[1] for m in re.finditer(
        r"(\w+)(?:\(| resumed>).*EMFILE.*INJECTED", traced)} | set(
        nofd_log.read_text().split() if nofd_log.exists() else []))
    lab.expect(took is not None,
               f"a new client was not served in 8 s while {ATTACKERS} idle "
               "connections held the pool (no idle deadline, or one longer "
               "than 5 s)" + (
                   f"; meanwhile each pool thread's first {failed[0]}() "
                   "failed with EMFILE, as when the process is at its "
                   "descriptor limit (from the thread's start, an "
                   "LD_PRELOAD shim; and again from when the attackers "
                   "came, strace's fault injection): is its "
                   "result checked? poll() skips a descriptor of -1 and "
                   "waits with no deadline at all; when it fails, fall back "
                   "on wait_readable()'s timeout, or close that connection "
                   f"(docs/DESIGN.md: every call's result is checked); watch "
                   f"it: strace -f -e inject={failed[0]}:error=EMFILE "
                   "./prethreaded 8000 (from its start), then the handout's "
                   "first block" if failed else
                   f"; {WATCH}"))
    lab.expect(not dropped,
               f"{len(dropped)} of {HALF_CLOSED} new clients that sent a "
               "whole request and then their FIN (shutdown(SHUT_WR), as nc "
               "-N and many scripts do), queued while the idle attackers "
               "held the pool, were not answered (answered: "
               + ", ".join(str(d) for d in dropped) + "): the request and "
               "the FIN were both in when a thread turned to them; a "
               "client that has finished sending is not gone: read what it "
               "sent (recv() returns the request, then 0) and answer it; "
               "POLLRDHUP or POLLHUP before reading drops it; watch it: "
               "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -N 127.0.0.1 8000 "
               "while the handout's 13 idle sockets hold the pool")
    twice = closed_twice(traced)
    lab.expect(not twice,
               f"{len(twice)} close() calls failed with EBADF while the idle "
               f"attackers were cut and {REFUSED} malformed requests were "
               f"refused (close({twice[0]})"
               + (" and more" if len(twice) > 1 else "") + "): a "
               "descriptor closed twice, by the code that cut it and again "
               "by serve_connection()? Or on the parser's refusal and again "
               "on a shared way out? In between another pool thread may "
               "accept a new client on that number, whose connection the "
               "second close() then ends; watch it: strace -f -e "
               "trace=close -p PID during the handout's first block, or "
               "while printf 'GET / HTTP/1.1\\r\\nHost x\\r\\n\\r\\n' | nc "
               "127.0.0.1 8000 (a 400)"
               if twice else "")
    after = wait_for(lambda: len(descriptors(server.pid)),
                     lambda n: n <= held + THREADS, 2)
    lab.expect(after <= held + THREADS,
               f"the server held {held} descriptors before any client came, "
               f"{after} once the attack was over and {REFUSED} malformed "
               f"requests had been refused ({len(refusals)} answered "
               f"{sorted(set(refusals))[:3]}) and closed (at most "
               f"{held + THREADS}: one kept by each thread): a descriptor "
               "made for each request (a timerfd?) not closed when the "
               "parser refuses the request (PARSE_ERROR: a 400, 414, 431)? "
               "Every way out of read_request() closes it; once the table "
               "is full no client is accepted (docs/DESIGN.md: no server "
               "leaks descriptors); watch it: ls /proc/PID/fd | wc -l "
               "before and after 100 printf 'GET / HTTP/1.1\\r\\nHost "
               "x\\r\\n\\r\\n' | nc 127.0.0.1 8000")
    told = [h for h in heard if h]
    lab.expect(not told, f"{len(told)} of {ATTACKERS} connections that never "
               "sent a byte were sent something before the close ("
               + (repr(told[0].split(b"\r\n")[0][:40]) if told else "")
               + "): a connection that has not begun a request has nothing "
               "to answer: close it silently (PARSE_CLOSED), as "
               "docs/DESIGN.md's limits say (idle: the connection is "
               "closed); a 408 would reach a keep-alive client that sends "
               "its next request just then as the answer to it; watch it: "
               "nc 127.0.0.1 8000 and wait 5 s")
    return (f"served after {took:.1f} s ({HALF_CLOSED} half-closed too); "
            f"{woke} context switches while "
            f"{THREADS} idle clients were held, {b_woke} while {THREADS} "
            f"begun requests were; {now - held:+} descriptors after "
            f"{2 * THREADS} clients left")


def malformed(port, count):
    """`count` malformed requests (a header line without a colon), one
    after another, each on a new connection: the statuses answered (0:
    none)."""
    said = []
    for _ in range(count):
        try:
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=seconds(5)) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost x\r\n\r\n")
                said.append(read_answer(sock)[0])
        except OSError:
            said.append(0)
    return said


def task_files(pid, name):
    """The text of /proc/PID/task/*/NAME, a thread's each (one that has
    just ended left out): plain os calls, a sample's cost being most of
    what watching a pool costs."""
    texts, where = [], f"/proc/{pid}/task/"
    for task in os.listdir(where):
        try:
            fd = os.open(where + task + "/" + name, os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            texts.append(os.read(fd, 4096))
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return texts


def context_switches(pid):
    """Voluntary and nonvoluntary context switches of all pid's threads so
    far: a thread asleep in poll() until its deadline adds none; one that
    naps between tries adds one a nap."""
    return sum(int(m) for text in task_files(pid, "status")
               for m in re.findall(rb"ctxt_switches:\s*(\d+)", text))


def runnable_threads(pid, span, limit=RUNNABLE, failed=None):
    """The number of pid's threads in state R (running or waiting for a
    CPU), on average over `span` seconds, sampled every 50 ms: a thread
    blocked in poll() or accept() is S. Sampling stops early once the
    average over the whole span cannot fall below `limit`, or failed()
    (asked every 4th sample) says the span has failed already (a spinning
    or napping pool: the rest of its second would only burn CPU)."""
    counts, end = [], time.monotonic() + span
    most = int(span / 0.05) + 1  # samples the span can hold at most
    while time.monotonic() < end and sum(counts) < limit * most:
        counts.append(sum(text[text.rindex(b")") + 2:][:1] == b"R"
                          for text in task_files(pid, "stat")))
        if failed and len(counts) % 4 == 0 and failed():
            break
        time.sleep(0.05)
    return sum(counts) / len(counts)


def sockets(pid):
    """How many of pid's descriptors are sockets."""
    return sum(what.startswith("socket:")
               for what in descriptors(pid).values())


def back_in_accept(pid, base):
    """Waits (at most a second) until the server has closed every client's
    socket, `base` sockets left: each thread is back at accept()."""
    wait_for(lambda: sockets(pid), lambda n: n <= base, 1)


def pool_asleep(server, clients, base):
    """While `clients` (one for each pool thread) hold the pool, for a
    second: (the threads runnable at once on average, the context switches
    of the whole server, its CPU seconds); then the clients close. base:
    the server's sockets before they came."""
    wait_for(lambda: sockets(server.pid),  # each has its thread
             lambda n: n >= base + len(clients), 1)
    time.sleep(0.05)
    cpu, woke = cpu_seconds(server.pid), context_switches(server.pid)
    running = runnable_threads(  # its switches only grow: once past the
        server.pid, seconds(1), failed=lambda: (  # limit, it has failed
            context_switches(server.pid) - woke > WAKEUPS * seconds(1)))
    cpu = cpu_seconds(server.pid) - cpu
    woke = context_switches(server.pid) - woke
    for s in clients:
        s.close()
    return running, woke, cpu


@grader.check(15, f"{ATTACKERS} connections sending a byte a second: "
              f"{BURST} new clients are served within 14 s; each cut "
              "connection closed once")
def slow_attack(lab):
    server = pool_server(lab)
    took = []  # the attackers connect once strace is attached: their
    traced = _strace(server.pid, ["close"], lambda: took.append(  # 1st byte
        under_attack(lab, idle_clients(server.port, ATTACKERS), 14,  # at 0
                     every=1.0)), "-f")
    took = took[0]
    lab.expect(took is not None,
               f"a new client was not served in 14 s while {ATTACKERS} "
               "connections sent a byte a second (no request deadline, or "
               "one pushed back by each byte: it counts from the first); "
               "watch it: "
               "the handout's attackers plus s.send(b'x') every second, "
               "then time curl")
    twice = closed_twice(traced)
    lab.expect(not twice,
               f"{len(twice)} close() calls failed with EBADF while "
               "requests begun and never finished were cut (close("
               + (f"{twice[0]})" + (" and more" if len(twice) > 1 else "")
                  if twice else ")")
               + "): a descriptor closed twice, by the code that timed the "
               "request out (after its 408?) and again by "
               "serve_connection()? In between another pool thread may "
               "accept a new client on that number, whose connection the "
               "second close() then ends: return PARSE_ERROR with a 408 "
               "status (serve_connection answers and closes) or "
               "PARSE_CLOSED, and close nothing yourself; watch it: strace "
               "-f -e trace=close -p PID while a client sends a byte a "
               "second" if twice else "")
    return f"served after {took:.1f} s"


@grader.check(10, f"{ATTACKERS} connections sending a head over 7 s, then a "
              f"body a byte a second: {BURST} new clients are served within "
              "14 s")
def slow_body_attack(lab):
    server = pool_server(lab)
    woke, start = context_switches(server.pid), time.monotonic()
    took = under_attack(lab, idle_clients(server.port, ATTACKERS), 14,
                        every=1.0, pieces=SLOW_BODY)
    span = time.monotonic() - start
    woke = context_switches(server.pid) - woke
    lab.expect(took is not None,
               f"a new client was not served in 14 s while {ATTACKERS} "
               "connections sent a POST head over 7 s, then its body a byte "
               "a second (a clock started again for the body? the 10 s "
               "count from the request's first byte, body included)")
    lab.expect(woke <= ATTACK_WAKEUPS * span,
               f"the server's threads were switched out {woke} times in the "
               f"{span:.1f} s of the attack (at most {ATTACK_WAKEUPS} a "
               f"second, {ATTACK_WAKEUPS * span:.0f}: voluntary and "
               "nonvoluntary_ctxt_switches in /proc/PID/task/*/status), "
               "where a wake for each piece that came is about 10 a "
               "second: a wait that naps "
               "as its deadline nears? In the last second before it, a "
               "timeout computed in the wrong unit (microseconds put in "
               "tv_nsec) or rounded down to nothing wakes the thread "
               "every millisecond or so; wait asleep in poll() "
               "(wait_readable) for all that is left of the deadline; "
               "watch it: grep ctxt /proc/PID/task/*/status every second "
               "while a client sends 'G', then 'E' 0.5 s later, then "
               "nothing")
    return (f"served after {took:.1f} s; {woke} context switches in "
            f"{span:.1f} s")


def attack_plan(start):
    """Attackers of every shape, each (what it is, the seconds within
    which it must be cut, a list of (seconds from `start`, bytes to send)),
    timed from its first byte. The slow head a byte a second (staggered
    starts: every request has a clock of its own); a request answered with
    the start of the next, which then waits 9 s and trickles (its clock
    started with those first bytes); a POST with Expect: 100-continue, its
    head over 7 s, then its body a byte a second (the 100 Continue restarts
    nothing); a byte every 9 s (no single wait is long, the request is);
    a byte, then one more LATE s later (a wait's timeout rounded up to
    whole seconds holds it to 10.85 s); a POST with Expect: 100-continue
    whose head ends at 8.5 s, then nothing (the 100 starts no new 5 s);
    a blank line every 2 s (bytes all the same: the request clock runs);
    a keep-alive request answered, then silence (the idle limit holds
    between requests too, not only before the first)."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    expect = POST_HEAD.replace(b"\r\n\r\n",
                               b"\r\nExpect: 100-continue\r\n\r\n")
    plans = []
    for k in range(3):
        t0 = start + k
        plans.append(("a byte a second (staggered)", TIGHT,
                      [(t0 + i, ENDLESS_HEAD[i:i + 1]) for i in range(30)]))
        plans.append(("pipelined, then 9 s, then a byte a second", TIGHT,
                      [(start, ask + ask[:16])] +
                      [(start + 9 + i, b"X") for i in range(20)]))
        plans.append(("Expect: 100-continue, head over 7 s, body a byte a "
                      "second", TIGHT,
                      [(start + i, expect[len(expect) * i // 8:
                                          len(expect) * (i + 1) // 8])
                       for i in range(8)] +
                      [(start + 8 + i, b"x") for i in range(20)]))
        plans.append(("a byte every 9 s", TIGHT,
                      [(start + 9 * i, ENDLESS_HEAD[i:i + 1])
                       for i in range(4)]))
    plans.append((f"a byte, then one more {LATE} s later (0.15 s left: a "
                  "wait's timeout rounded up to whole seconds waits 1 s)",
                  TIGHT, [(start, ENDLESS_HEAD[:1]),
                          (start + LATE, ENDLESS_HEAD[1:2])]))
    plans.append(("Expect: 100-continue, head over 8.5 s, then nothing (no "
                  "new 5 s for the body after the 100)", TIGHT,
                  [(start, expect[:20]), (start + 8.5, expect[20:])]))
    plans.append(("a blank line (CR LF) every 2 s", TIGHT,
                  [(start + 2 * i, b"\r\n") for i in range(10)]))
    plans.append(("a POST with Expect: 100-continue to a path that takes "
                  "none, refused at once", TIGHT, [(start, REFUSED_EXPECT)]))
    plans.append(("a head of 8.3 KB, over MAX_HEAD, sent at once", CUT,
                  [(start, BIG_HEAD)]))
    plans.append(("a keep-alive request answered, then silence", IDLE_CUT,
                  [(start, ask)]))
    return plans


def held_for(port, plans, limit, heard=None):
    """Runs the plans (lists of (time, bytes)), one connection each, and
    returns how long after its first byte the server closed each (None: not
    within `limit` s). heard: a list that receives the bytes each was
    sent."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5)
             for _ in plans]
    sel = selectors.DefaultSelector()
    for k, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, k)
    pending = sorted((t, k, data) for k, plan in enumerate(plans)
                     for t, data in plan)
    first = {k: plan[0][0] for k, plan in enumerate(plans)}
    closed, got = {}, [b""] * len(socks)
    end = max(first.values()) + limit
    try:
        while len(closed) < len(socks) and time.monotonic() < end:
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                _, k, data = pending.pop(0)
                if k not in closed:
                    try:
                        socks[k].send(data)
                    except OSError:
                        pass
            wait = min([pending[0][0] - now] if pending else [0.1])
            for key, _ in sel.select(max(0.0, min(wait, 0.1))):
                k = key.data
                try:
                    chunk = socks[k].recv(65536)
                    got[k] += chunk
                    gone = not chunk
                except BlockingIOError:
                    continue
                except OSError:
                    gone = True
                if gone:
                    closed[k] = time.monotonic() - first[k]
                    sel.unregister(socks[k])
    finally:
        for s in socks:
            s.close()
    if heard is not None:
        heard.extend(got)
    return [closed.get(k) for k in range(len(plans))]


def statuses(data):
    """The status lines of the responses in data, one after another (by
    their Content-Length); what is left, if anything, as it came."""
    lines = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            lines.append(data[:40])
            break
        lines.append(head.split(b"\r\n")[0][:40])
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        data = rest[int(length[1]) if length else 0:]
    return lines


def after_answer(data):
    """What came after the first whole response in data (by its
    Content-Length)."""
    head, _, rest = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return rest[int(length[1]) if length else 0:]


@grader.check(15, f"attackers of every shape: each cut within {TIGHT} s of "
              "its request's first byte, with one 408 or nothing; an 8.3 KB "
              f"head answered 431; an idle keep-alive client within "
              f"{IDLE_CUT} s, silently; the largest request answered; then "
              f"{WIDE} two-piece requests served (no stale clock of a cut "
              "or refused request) and left idle: no descriptor left behind")
def every_attacker_cut(lab):
    server = lab.start(env={"ZEROHTTPD_THREADS": str(WIDE)})
    get(server.port, "/")
    before = len(descriptors(server.pid))
    start = time.monotonic() + 0.3  # 0.1 s into a second: a deadline in
    plans = attack_plan(start + (0.1 - start % 1) % 1)  # whole seconds
    # rounded up would cut 10.9 s after the first byte
    heard = []
    held = held_for(server.port, [plan for _, _, plan in plans], CUT + 2,
                    heard)
    late = [f"{shape}: " + (f"{h:.1f} s" if h else "never") + f" (at most "
            f"{limit} s)" for (shape, limit, _), h in zip(plans, held)
            if h is None or h > limit]
    lab.expect(not late, f"{len(late)} of {len(plans)} attackers held too "
               "long: " + "; ".join(sorted(set(late))[:3]) + ": the 10 s "
               "count from the request's first byte (bytes a pipelined "
               "request left count as arrived, blank lines too), once, for "
               "this request alone, body and 100 Continue included; before "
               "a request begins, first or keep-alive, the 5 s idle limit")
    big = statuses(heard[-2])
    lab.expect(len(big) == 1 and big[0].startswith(b"HTTP/1.1 431 "),
               "a request head of 8.3 KB sent at once (over MAX_HEAD, "
               "within CONN_BUF_SIZE) was answered "
               + (repr(big) if big else "nothing (closed)") + ", not one "
               "431: reading at most MAX_HEAD bytes into the buffer? Room "
               "is CONN_BUF_SIZE - c->len: a recv() of 0 bytes returns 0, "
               "read as the client's close, and every request over 8 KiB "
               "(a big POST, a head for a 431) goes unanswered; watch it: "
               "curl -H \"X-Pad: $(head -c 8300 /dev/zero | tr '\\0' y)\" "
               "http://127.0.0.1:8000/")
    wrong = []
    for (shape, _, plan), data in zip(plans[:-3], heard):
        said = statuses(data)
        while said and said[0].startswith(b"HTTP/1.1 1"):
            said = said[1:]  # 100 Continue: an interim answer
        if said[:1] == [b"HTTP/1.1 200 OK"] and plan[0][1].startswith(b"GET"):
            said = said[1:]  # the pipelined one: its first request answered
        if said and (len(said) > 1 or not said[0].startswith(
                b"HTTP/1.1 408 ")):
            wrong.append(f"{shape}: {said!r}"[:160])
    lab.expect(not wrong,
               f"{len(wrong)} requests begun and cut were sent something "
               "other than one 408 (or nothing): " + "; ".join(wrong[:2])
               + ": a request timed out gets at most one answer, "
               "\"HTTP/1.1 408 Request Timeout\": return PARSE_ERROR with "
               "c->req.status = 408 (serve_connection() answers it, once, "
               "and closes); not a status left 0, not a 408 of your own as "
               "well; watch it: printf 'GET / HT' | nc 127.0.0.1 8000 (10 s)")
    more = after_answer(heard[-1])  # the keep-alive client, answered once
    line = more.split(b"\r\n")[0][:40]
    lab.expect(not more,
               "a keep-alive client answered once, then silent, was sent "
               f"{line!r} before the close: a "
               "connection between requests has no request to answer "
               "(one already answered is no exception): close it silently "
               "(PARSE_CLOSED); a 408 sent then may cross the client's "
               "next request and be read as its answer; watch it: curl -v "
               "http://127.0.0.1:8000/ http://127.0.0.1:8000/ reuses one "
               "connection, or nc 127.0.0.1 8000, a request, then wait 5 s"
               if more else "")
    # Then a new client for each thread, its head in two pieces: 13 of the
    # threads have just cut a request (the timeout path), one has refused
    # an Expect: 100-continue, and nothing of those requests may stay
    # behind; then each is left idle and cut (the 5 s limit).
    answers, gone = after_cuts(server.port)
    lab.expect(all(a == 200 for a in answers),
               f"of {WIDE} new clients at once, one for each thread, each "
               "sending its head in two pieces 0.3 s apart after every "
               f"attacker was cut, {sum(a != 200 for a in answers)} were not "
               "answered (answered: " + ", ".join(str(a) for a in answers)
               + "): the first byte's time of a request cut by its deadline, "
               "or refused at its Expect: 100-continue (answer_expect() "
               "false: a 405, 404, 413), kept (per thread, static or "
               "__thread) and not reset on that way out: the thread's next "
               "client finds its deadline long past; keep the clock in "
               "read_request() (or the connection), or reset it on every "
               "return; watch it: ZEROHTTPD_THREADS=1, printf 'POST /nope "
               "HTTP/1.1\\r\\nExpect: 100-continue\\r\\nContent-Length: "
               "5\\r\\n\\r\\n' | nc 127.0.0.1 8000 (or printf 'GET / HT' | "
               "nc 127.0.0.1 8000, cut after 10 s), then 11 s later the "
               "handout's second block")
    status = max_request(server.port)
    lab.expect(status and status not in (408, 413, 431),
               f"the largest request, a head of MAX_HEAD (8,192) bytes and a "
               f"body of {MAX_BODY:,} (the form rule's bound), "
               f"{len(MAX_REQUEST):,} bytes sent at once, exactly "
               "CONN_BUF_SIZE, was " + (f"answered {status}" if status else
                                        "not answered (closed, or reset)")
               + ": every request within the bounds fits the buffer, with "
               "not a byte to spare: the room left to read into is "
               "CONN_BUF_SIZE - c->len (no terminator: the parser takes a "
               "length), and a recv() of 0 bytes returns 0, read as the "
               "client's close; watch it: a POST of a head of 8,192 bytes "
               f"and a body of {MAX_BODY:,} through nc")
    now = wait_for(lambda: len(descriptors(server.pid)),
                   lambda n: n <= before + WIDE, 2)
    lab.expect(now <= before + WIDE,
               f"the server held {before} descriptors before the attackers, "
               f"{now} once {len(plans) + WIDE - 2} connections had been cut "
               f"by a deadline ({gone} of them {WIDE} keep-alive clients "
               "answered, then idle) and every client had gone (at most "
               f"{before + WIDE}: one kept by each of the {WIDE} threads): "
               "a descriptor made for each request (a timerfd?) not closed "
               "when its deadline ends it? Every way out of read_request() "
               "closes it, the timeout's too; once the table is full no "
               "client is accepted (docs/DESIGN.md: no server leaks "
               "descriptors); watch it: ls /proc/PID/fd | wc -l before and "
               "after 20 nc 127.0.0.1 8000 left to be cut")
    cut = [h for h, (_, t, _) in zip(held, plans) if t == TIGHT and h]
    return (f"the longest held {max(h or 0 for h in held):.2f} s; requests "
            f"cut by {max(cut or [0]):.2f} s; the largest request answered "
            f"{status}; {now - before:+} descriptors after {gone} idle cuts")


def max_request(port):
    """The status of the answer to MAX_REQUEST sent at once (0: none)."""
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(5)) as sock:
        try:
            sock.sendall(MAX_REQUEST)
            return read_answer(sock)[0]
        except OSError:
            return 0


def after_cuts(port):
    """WIDE keep-alive clients at once, each a request in two pieces 0.3 s
    apart: (their statuses, 0 for none; how many the server then closed,
    idle, within IDLE_CUT s)."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = idle_clients(port, WIDE)
    answers, sel, gone = [], selectors.DefaultSelector(), 0
    try:
        for s in socks:
            s.settimeout(seconds(5))
            s.send(ask[:16])
        time.sleep(0.3)
        for s in socks:
            try:
                s.sendall(ask[16:])
                answers.append(read_answer(s)[0])
            except OSError:
                answers.append(0)
        if any(a != 200 for a in answers):
            return answers, gone
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        end = time.monotonic() + seconds(IDLE_CUT)
        while gone < len(socks) and time.monotonic() < end:
            for key, _ in sel.select(end - time.monotonic()):
                try:
                    closed = not key.fileobj.recv(4096)
                except OSError:
                    closed = True
                if closed:
                    sel.unregister(key.fileobj)
                    gone += 1
        return answers, gone
    finally:
        sel.close()
        for s in socks:
            s.close()


def read_answer(sock):
    """One response from sock: (status, its length in bytes), status 0 if
    the connection ended first."""
    data = bytearray()
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, len(data)
        data += chunk
    head = bytes(data[:data.index(b"\r\n\r\n")])
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    left = len(head) + 4 + (int(length[1]) if length else 0) - len(data)
    while left > 0:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return 0, len(data)
        data += chunk
        left -= len(chunk)
    return int(head.split(b" ", 2)[1]), len(data)


def slow_download(port, path):
    """A keep-alive client that reads a big answer only after 4 s (the
    server's send waits for it), then is silent 3 s and asks again: the
    idle 5 s run from the end of the answer, not from the request's last
    byte. None if it was served, else what went wrong."""
    label = ("a request sent 3 s after the end of a big answer the client "
             "read only after 4 s, 7 s after its request (the 5 s idle "
             "limit runs from when the server starts waiting, the end of "
             "the answer, not from the client's last byte)")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.settimeout(seconds(20))
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(4.0)  # the server's send blocks: its buffers are full
        status, _ = read_answer(sock)
        if status != 200:
            return f"a big file was answered {status}"
        time.sleep(3.0)
        try:
            sock.sendall(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _ = read_answer(sock)
        except OSError as error:
            return f"{label} was cut ({str(error)[:60]})"
        return None if status == 200 else (
            f"{label} was " + (f"answered {status}" if status else "cut"))
    finally:
        sock.close()


def pipelined_behind_download(port, path):
    """A client that sends a request for a big file and the first bytes of
    the next at once, reads the answer only after 4 s (the server's send
    waits for it), and finishes the next request 7 s after reading it: its
    10 s run from when the server turns to it. None if it was served."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    label = ("a request whose first bytes came with the request for a big "
             "file, finished 7 s after the client had read that answer "
             "(which it read only after 4 s), 11 s after those bytes came "
             "(its 10 s run from when the server turns to it, once the "
             "answer before it is sent: the time a slow reader takes over "
             "that answer is the server's, not the client's silence; "
             "docs/DESIGN.md, Limits and errors)")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.settimeout(seconds(20))
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
                     + ask[:16])
        time.sleep(4.0)  # the server's send blocks: its buffers are full
        status, _ = read_answer(sock)
        if status != 200:
            return f"a big file was answered {status}"
        time.sleep(7.0)
        try:
            sock.sendall(ask[16:])
            status, _ = read_answer(sock)
        except OSError as error:
            return f"{label} was cut ({str(error)[:60]})"
        return None if status == 200 else (
            f"{label} was " + (f"answered {status}" if status else "cut"))
    finally:
        sock.close()


def sparse_file(lab, size, name="big.bin"):
    """A file of `size` bytes under the lab's public/ (as grading.big_file
    makes), but sparse: what is sent is its size, not its bytes, and 8 MiB
    of os.urandom() cost each check 40 ms of CPU. Its URL path."""
    with (lab.site / "public" / name).open("wb") as big:
        big.truncate(size)
    return "/" + name


def beyond_buffers(lab):
    """A file larger than the server's largest send buffer (tcp_wmem's
    largest: a buffer's bytes count with their overhead, so it holds less)
    and a 64 KiB receive buffer (128 KiB with its overhead) together, by
    1 MiB at least: sending it must wait for the client to read. Its URL
    path."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return sparse_file(lab, max(5 << 20, wmem + (1 << 20)))


def tcp_diag(sport, dport):
    """The TCP socket 127.0.0.1:sport -> 127.0.0.1:dport (the server's end
    of a client's connection), by an exact sock_diag lookup (what ss
    uses, without a dump of every socket): (its state, 1 for ESTABLISHED;
    the bytes of its stream the peer has acknowledged; the bytes in its
    send queue, sent or not, unacknowledged), or None if there is none."""
    lo = socket.inet_aton("127.0.0.1")
    req = (struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP,
                       1 << (2 - 1), 0, 0xffffffff)  # INET_DIAG_INFO
           + struct.pack("!HH", sport, dport) + lo + bytes(12) + lo
           + bytes(12) + struct.pack("=III", 0, 0xffffffff, 0xffffffff))
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as nl:
            nl.send(struct.pack("=IHHII", 16 + len(req), 20, 1, 1, 0) + req)
            data = nl.recv(65536)  # SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST
    except OSError:  # no sock_diag here
        return None
    if len(data) < 16 + 72 or struct.unpack_from("=H", data, 4)[0] != 20:
        return None  # NLMSG_ERROR: no such socket
    state = data[17]
    wqueue = struct.unpack_from("=I", data, 16 + 4 + 48 + 8)[0]
    at, acked = 16 + 72, None
    while at + 4 <= len(data):  # its attributes: INET_DIAG_INFO, tcp_info
        size, kind = struct.unpack_from("=HH", data, at)
        if kind == 2 and size >= 4 + 128:
            acked = struct.unpack_from("=Q", data, at + 4 + 120)[0]
        at += (size + 3) & ~3
        if size < 4:
            break
    return None if acked is None else (state, acked, wqueue)


def reset_cut(port, path):
    """A keep-alive client (64 KiB receive buffer) that reads a big answer
    until the server has written all of it, much still in the server's
    send queue, then reads nothing until the server has cut it (the 5 s
    idle limit, from the answer's end): then all the answer must still
    come. None if it did, else what went wrong."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.settimeout(seconds(20))
    try:
        sock.connect(("127.0.0.1", port))
        mine = sock.getsockname()[1]
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return f"a big file was not answered ({data[:40]!r})"
            data += chunk
        head = data[:data.index(b"\r\n\r\n")]
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if not head.startswith(b"HTTP/1.1 200") or not length:
            return f"a big file was answered {head[:40]!r}"
        total, got = len(head) + 4 + int(length[1]), len(data)
        # Read on until the server has written its last byte, then stop
        # while most of the answer is still in its send queue.
        while True:
            seen = tcp_diag(port, mine)
            if seen is None:
                return None  # no sock_diag here: not graded
            waiting = struct.unpack("i", fcntl.ioctl(
                sock, termios.FIONREAD, b"\0" * 4))[0]
            unwritten = total - seen[1] - seen[2]
            if unwritten <= 0:
                break
            step = max(16384, unwritten - (256 << 10))
            while step > 0 and got < total:  # frees that much window
                chunk = sock.recv(min(step, 1 << 20))
                if not chunk:
                    return (f"a big answer was cut after {got:,} of "
                            f"{total:,} bytes, read as fast as it came")
                got += len(chunk)
                step -= len(chunk)
            time.sleep(0.005)
        queued = total - got - waiting
        if queued <= 0:
            return None  # all of it at the client already: not graded
        # The server's end leaves ESTABLISHED once it has cut the client
        # (its FIN queued behind the data, or an RST); then LINGER_MS
        # (0.5 s) for a lingering close to end, a margin, and read.
        cut = None
        end = time.monotonic() + seconds(IDLE_CUT)
        while time.monotonic() < end:
            seen = tcp_diag(port, mine)
            if seen is None or seen[0] != 1:
                cut = time.monotonic()
                break
            time.sleep(0.1)
        if cut is not None:
            while time.monotonic() < cut + seconds(1.5):
                if tcp_diag(port, mine) is None:
                    break  # gone: reset (or closed and acknowledged)
                time.sleep(0.1)
        try:
            while got < total:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
        except OSError as error:
            return (f"a keep-alive client (a 64 KiB receive buffer) "
                    f"asked for a file of {total:,} bytes with its head; "
                    f"{queued:,} of them were still in the server's send "
                    "buffer when the server had written the last; it read "
                    "nothing more until the idle limit cut it, then got "
                    f"{got:,} in all ({error.strerror}): the cut reset the "
                    "connection (SO_LINGER of 0: an RST) and destroyed the "
                    "answer's tail, still in the send buffer; a connection "
                    "cut by a deadline is closed as any other "
                    "(close_lingering(): a FIN behind the data), never "
                    "reset; watch it: a client with SO_RCVBUF 64 KiB that "
                    "reads a big file at 512 KiB/s")
        return None if got == total else (
            f"a big answer whose tail was in the server's send buffer at "
            f"the idle cut ended after {got:,} of {total:,} bytes")
    finally:
        sock.close()


def many_pieces(port):
    """A request head of 160 bytes sent in 80 pieces 50 ms apart (TCP_NODELAY:
    a segment each), as a client that types it or a slow link: None if it
    was answered 200."""
    ask = (b"GET /notes.txt HTTP/1.1\r\nHost: x\r\nUser-Agent: by hand"
           b"\r\nX-Pad: " + b"p" * 160)[:156] + b"\r\n\r\n"
    label = (f"a request head of {len(ask)} bytes sent in 80 pieces 50 ms "
             "apart (4 s, well inside the 10 s: how many reads a request "
             "takes is no sign of an attack, only its time is; watch it: "
             "printf each few bytes of a head to nc 50 ms apart)")
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(20)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        for k in range(80):
            time.sleep(max(0.0, start + 0.05 * k - time.monotonic()))
            try:
                sock.send(ask[len(ask) * k // 80:len(ask) * (k + 1) // 80])
            except OSError as error:
                return f"{label} was cut after {k} pieces ({error.strerror})"
        try:
            status = read_answer(sock)[0]
        except OSError as error:
            return f"{label} was cut ({error.strerror})"
        return None if status == 200 else (
            f"{label} was " + (f"answered {status}" if status else "cut"))


def slow_but_legitimate(port, kind):
    """One client inside the limits, as `kind` says: None if it was served,
    else what went wrong."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    if kind.startswith("/"):
        return slow_download(port, kind)
    if kind.startswith("+"):
        return pipelined_behind_download(port, kind[1:])
    if kind.startswith("!"):
        return reset_cut(port, kind[1:])
    if kind == "pieces":
        return many_pieces(port)
    with Connection(port, timeout=seconds(20)) as conn:
        if kind in ("trickle", "idle-trickle"):  # 3 pieces 3.5 s apart
            if kind == "idle-trickle":  # 4 s silent first: 11 s in all
                time.sleep(4.0)
            for k, piece in enumerate([b"GET /notes.txt HTTP/1.1\r\n",
                                       b"Host: x\r\n", b"\r\n"]):
                if k:
                    time.sleep(3.5)
                conn.send_tolerating_reset(piece)
            label = ("a request head sent over 7 s" if kind == "trickle" else
                     "a head sent over 7 s after 4 s silent (its 10 s count "
                     "from its first byte, not from the connection)")
        elif kind == "mid-pause":  # 6 s of silence inside the head
            for wait, piece in [(0, b"GET /notes.txt HTTP/1.1\r\n"),
                                (6.0, b"Host: x\r\n"), (1.5, b"\r\n")]:
                time.sleep(wait)
                conn.send_tolerating_reset(piece)
            label = ("a head with 6 s of silence in it (7.5 s in all: the "
                     "5 s idle limit is for a request not yet begun)")
        elif kind == "keepalive-4s":  # three requests 4 s apart
            for _ in range(2):
                conn.send(ask)
                conn.read_response()
                time.sleep(4.0)
            conn.send_tolerating_reset(ask[:16])  # 8 s in: in 2 pieces,
            time.sleep(3.0)  # the second 11 s after the first request
            conn.send_tolerating_reset(ask[16:])
            label = ("the 3rd request 4 s after the 2nd on one keep-alive "
                     "connection, in two pieces 3 s apart, 11 s after the "
                     "1st (each wait between requests is its own, and each "
                     "request's clock: not the connection's)")
        elif kind == "pipelined":  # a second request begun with the first
            conn.send(ask[:16])  # the first takes 4 s
            time.sleep(4.0)
            conn.send(ask[16:] + ask[:16])
            conn.read_response()
            time.sleep(7.0)
            conn.send_tolerating_reset(ask[16:])
            label = ("a pipelined request finished 7 s after its first "
                     "bytes came with the request before it, which took "
                     "4 s (they count as arrived: its 10 s run from when "
                     "the server turns to it, the answer before it sent, "
                     "not from the first request's first byte, and no 5 s "
                     "idle limit)")
        elif kind in ("nearly-10s", "nearly-10s-mono"):  # 10 s are 10 s
            # The first byte at 0.8 of a second of the wall clock (time())
            # or of CLOCK_MONOTONIC (time.monotonic() reads it, as now_ms()
            # does): a deadline in whole seconds of it ends the head at
            # 9.2 s, before its second piece.
            clock = time.time if kind == "nearly-10s" else time.monotonic
            while not 0.8 <= clock() % 1 < 0.95:
                time.sleep((0.8 - clock() % 1) % 1)
            start = time.monotonic()
            for at, piece in [(0, b"GET /notes.txt HTTP/1.1\r\n"),
                              (9.35, b"Host: x\r\n"), (9.6, b"\r\n")]:
                time.sleep(max(0.0, start + at - time.monotonic()))
                conn.send_tolerating_reset(piece)
            which = ("wall-clock second" if kind == "nearly-10s" else
                     "second of CLOCK_MONOTONIC")
            label = ("a head sent over 9.6 s, its first byte at 0.8 of a "
                     f"{which} (the 10 s must be 10 s to the millisecond: "
                     "a deadline in whole seconds, time(NULL) or "
                     "now_ms() / 1000, ends it up to a second early)")
        else:
            if kind == "pause":  # one answered request, then 3 s idle
                conn.send(ask)
                conn.read_response()
            if kind == "blank":  # a blank line begins it: 10 s, not 5
                conn.send(b"\r\n")
            time.sleep(6.0 if kind == "blank" else 3.0)
            conn.send_tolerating_reset(ask)
            label = {"pause": "a second request after 3 s idle",
                     "blank": "a request 6 s after a blank line (CR LF) "
                     "sent on connecting (a blank line is a byte: the "
                     "request has begun, its 10 s run, not the 5 s idle)"
                     }.get(kind, "a first request 3 s after connecting")
        try:
            status = conn.read_response().status
        except (AssertionError, OSError) as error:
            return f"{label} was cut ({str(error)[:60]})"
        return None if status == 200 else f"{label} was answered {status}"


@grader.check(15, "slow but legitimate clients are served: a head sent over "
              "7 s, a first request after 3 s silent, a keep-alive pause of "
              "3 s, a request 6 s after a blank line, a request pipelined "
              "behind a big answer read late, finished 7 s after it, a head "
              "in 80 pieces; and a big answer still in the send buffer at "
              "the idle cut arrives whole")
def slow_clients_served(lab):
    # As in combined_slow_clients: an answer that ends only once the
    # client has read most of it.
    path = beyond_buffers(lab)
    wrong = slow_clients(lab, ["trickle", "late", "pause", "blank",
                               "+" + path,
                               "!" + sparse_file(lab, 1 << 20, "mib.bin"),
                               "pieces"])
    lab.expect(not wrong,
               "; ".join(wrong) + ("" if all("watch it" in w for w in wrong)
                                   else ": a deadline shorter than the 5 s "
                                   "idle or the 10 s request limit; watch it "
                                   "with the handout's second block (a head "
                                   "sent over 7 s through /dev/tcp)"))


@grader.check(15, "slow but legitimate, the limits combined: 4 s silent then "
              "a head over 7 s; a pipelined request finished 7 s later; "
              "6 s of silence inside a head; requests 4 s apart; a head "
              "over 9.6 s; a request 3 s after a big answer read late")
def combined_slow_clients(lab):
    # Larger than the server's largest send buffer (tcp_wmem) and the
    # client's 64 KiB receive buffer: the answer ends only once the client
    # has read most of it.
    path = beyond_buffers(lab)
    wrong = slow_clients(lab, ["idle-trickle", "pipelined", "mid-pause",
                               "keepalive-4s", "nearly-10s",
                               "nearly-10s-mono", path], hangups=True)
    lab.expect(not wrong, "; ".join(wrong))


# A shim (LD_PRELOAD) that puts CLOCK_MONOTONIC UPTIME_DAYS days ahead, as
# on a host up that long: a millisecond count kept in 32 bits wraps. And
# once the file $WALL_STEPPED exists, the wall clock (CLOCK_REALTIME,
# gettimeofday(), time()) is WALL_STEP seconds ahead, as when NTP or an
# operator steps it, and another WALL_STEP ahead at each read after that (a
# step may fall between any two reads, however close): CLOCK_MONOTONIC does
# not move.
UPTIME = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
/* Nanoseconds more, read at each call from the 8 bytes of the file
 * $UPTIME_JUMP (mapped shared: the grader writes them), as on a server up
 * that much longer: 0 until then. */
static long long jumped(void)
{
    static const long long *volatile map;
    static int tried;
    if (!map && !__atomic_exchange_n(&tried, 1, __ATOMIC_ACQ_REL)) {
        const char *file = getenv("UPTIME_JUMP");
        int fd = file ? open(file, O_RDONLY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            void *at = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (at != MAP_FAILED)
                map = at;
        }
    }
    const long long *m = map;
    return m ? __atomic_load_n(m, __ATOMIC_RELAXED) : 0;
}
static long long ahead(void) /* nanoseconds, from $UPTIME_AHEAD_NS */
{
    static long long ns = -1;
    long long got = __atomic_load_n(&ns, __ATOMIC_RELAXED);
    if (got < 0) {
        const char *set = getenv("UPTIME_AHEAD_NS");
        got = set ? strtoll(set, NULL, 10) : 0;
        __atomic_store_n(&ns, got, __ATOMIC_RELAXED);
    }
    return got + jumped();
}
static long stepped(void)
{
    static long steps;
    const char *flag = getenv("WALL_STEPPED");
    if (!flag || access(flag, F_OK) != 0)
        return 0;
    return STEP * __atomic_add_fetch(&steps, 1, __ATOMIC_RELAXED);
}
int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT,
                                                            "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE ||
                   id == CLOCK_MONOTONIC_RAW || id == CLOCK_BOOTTIME))
    {
        long long ns = ahead();
        ts->tv_sec += (time_t)(ns / 1000000000);
        ts->tv_nsec += (long)(ns % 1000000000);
        if (ts->tv_nsec >= 1000000000) {
            ts->tv_sec++;
            ts->tv_nsec -= 1000000000;
        }
    }
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        ts->tv_sec += stepped();
    return r;
}
int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    static int (*real)(struct timeval *restrict, void *restrict);
    if (!real)
        real = (int (*)(struct timeval *restrict, void *restrict))dlsym(
            RTLD_NEXT, "gettimeofday");
    int r = real(tv, tz);
    if (r == 0 && tv)
        tv->tv_sec += stepped();
    return r;
}
time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def status_or_cut(conn):
    """The status of conn's next answer, or "cut (why)" if none came."""
    try:
        return conn.read_response().status
    except (AssertionError, OSError) as error:
        return f"cut ({str(error)[:40]})"


@grader.check(5, f"on a host up {UPTIME_DAYS} days (CLOCK_MONOTONIC's "
              "milliseconds past 2^32, a float of its seconds in steps of "
              f"{FLOAT_STEP} s), a request in three pieces over 3.3 s "
              "is served; and one in three pieces while the wall clock "
              "steps 1 h ahead, then at each read, and the next 0.5 s "
              f"later; then, the server up 24.9 days, {LONG_REQUESTS} "
              f"keep-alive requests {LONG_GAP_S} s apart on its clock")
def long_uptime(lab):
    shim = build_shim(lab, "uptime", UPTIME, f"-DSTEP={WALL_STEP}L", "-ldl")
    step = lab.workdir / "wall-clock-stepped"
    jump = lab.workdir / "monotonic-jump"  # ns more, read at each call
    jump.write_bytes(bytes(8))
    # CLOCK_MONOTONIC about UPTIME_S ahead, chosen so that its seconds
    # are 2.0 past a multiple of FLOAT_STEP 0.3 s from now (the server is
    # up by then, or by 3.2 past: else one step later).
    soon = time.monotonic() + 0.3
    ahead = UPTIME_S + (2.0 - (soon + UPTIME_S)) % FLOAT_STEP
    server = lab.start(env={"ZEROHTTPD_THREADS": str(THREADS),
                            "LD_PRELOAD": str(shim),
                            "UPTIME_AHEAD_NS": str(int(ahead * 1e9)),
                            "WALL_STEPPED": str(step),
                            "UPTIME_JUMP": str(jump)})
    get(server.port, "/")

    def phase():  # the server's CLOCK_MONOTONIC seconds, modulo FLOAT_STEP
        return (time.monotonic() + ahead) % FLOAT_STEP

    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    while not 2.0 <= phase() < 3.2:  # a float of it rounds down, to 8k
        time.sleep(max(0.01, (2.0 - phase()) % FLOAT_STEP))
    with Connection(server.port, timeout=seconds(10)) as conn:
        conn.send(ask[:16])
        time.sleep((5.1 - phase()) % FLOAT_STEP)  # it rounds up, to 8k + 8
        conn.send_tolerating_reset(ask[16:28])
        time.sleep(0.2)
        conn.send_tolerating_reset(ask[28:])
        status = status_or_cut(conn)
    lab.expect(status == 200,
               f"with CLOCK_MONOTONIC {ahead:,} s ahead ({UPTIME_DAYS} days "
               f"up), a request sent in three pieces, the second 1.9 to "
               f"3.1 s after the first, the third 0.2 s later, was "
               f"{status}: its deadline wrapped into the past, or rounded? "
               "Milliseconds since boot pass 2^31 after 24.8 days: keep "
               "them in int64_t, never int; and a float of the seconds "
               f"(24 bits) steps {FLOAT_STEP} s at a time after 777 days "
               f"(the first piece came at {FLOAT_STEP}k + 2.0 to 3.2 s, read as "
               f"{FLOAT_STEP}k; the second at {FLOAT_STEP}k + 5.1 s, read as "
               f"{FLOAT_STEP}k + {FLOAT_STEP}: now + 10 s as a float is "
               f"{FLOAT_STEP}k + {FLOAT_STEP}, already passed): keep "
               "now_ms()'s int64_t milliseconds (a double would do); "
               f"watch it: unshare -rT --monotonic {UPTIME_S} ./prethreaded "
               "8000, then the handout's second block")
    with Connection(server.port, timeout=seconds(10)) as conn:
        conn.send(ask[:16])
        time.sleep(0.25)
        step.touch()  # the wall clock is an hour ahead from now on
        time.sleep(0.25)
        conn.send_tolerating_reset(ask[16:28])
        time.sleep(0.5)
        conn.send_tolerating_reset(ask[28:])
        status = status_or_cut(conn)
        idle = None
        if status == 200:  # then 0.5 s idle, the wall clock still stepping
            time.sleep(0.5)
            conn.send_tolerating_reset(ask)
            idle = status_or_cut(conn)
    lab.expect(status == 200,
               f"a request sent in three pieces 0.5 s apart, the wall clock "
               f"(CLOCK_REALTIME) stepped {WALL_STEP // 3600} h ahead after "
               f"the first (CLOCK_MONOTONIC unmoved), was {status}: a "
               "deadline kept on the wall clock (CLOCK_REALTIME, "
               "gettimeofday(), time()) moves when NTP or an operator steps "
               "it: an hour ahead cuts every client at once, an hour back "
               "lets a slowloris hold its thread for the hour; keep "
               "deadlines on CLOCK_MONOTONIC (now_ms()); watch it: "
               "LD_PRELOAD a clock_gettime() that adds 3600 s to "
               "CLOCK_REALTIME, or date -s while a request trickles in")
    lab.expect(idle == 200,
               "the next request on that keep-alive connection, 0.5 s after "
               f"the answer, the wall clock stepping {WALL_STEP // 3600} h "
               f"ahead at each read (a step may come at any instant), was "
               f"{idle}: the idle limit kept on the wall clock (gettimeofday("
               "), time(), CLOCK_REALTIME)? A step between two of its reads "
               "cuts every idle client at once (ahead) or holds a thread "
               "for the step's length (back); keep both limits on "
               "CLOCK_MONOTONIC (now_ms()); watch it: LD_PRELOAD a "
               "gettimeofday() that adds an hour at each call, then curl "
               "twice over one connection")
    # Then the server's own clock: CLOCK_MONOTONIC jumps JUMP_MS ahead, as
    # if the server had been up 24.9 days (a time counted in int
    # milliseconds from its start is past 2^31); then LONG_REQUESTS
    # requests on one keep-alive connection, the clock jumping
    # LONG_GAP_S before each (while the server waits, idle) and between
    # the two pieces of the last: minutes of the server's time, each wait
    # and each request well inside its limit.
    with jump.open("r+b") as moved:
        total = JUMP_MS * 1_000_000
        os.pwrite(moved.fileno(), struct.pack("=q", total), 0)
        said = []
        with Connection(server.port, timeout=seconds(10)) as conn:
            for k in range(LONG_REQUESTS):
                if k:
                    total += LONG_GAP_S * 1_000_000_000
                    os.pwrite(moved.fileno(), struct.pack("=q", total), 0)
                if k < LONG_REQUESTS - 1:
                    conn.send_tolerating_reset(ask)
                else:
                    conn.send_tolerating_reset(ask[:16])
                    time.sleep(0.1)
                    total += LONG_GAP_S * 1_000_000_000
                    os.pwrite(moved.fileno(), struct.pack("=q", total), 0)
                    conn.send_tolerating_reset(ask[16:])
                said.append(status_or_cut(conn))
                if said[-1] != 200:
                    break
    lab.expect(said[0] == 200,
               f"once the server had been up {JUMP_MS / 86_400_000:.1f} days "
               "(CLOCK_MONOTONIC jumped ahead after its start), a request was "
               f"{said[0]}: a deadline kept in int milliseconds since the "
               "server started passes INT_MAX (2^31 - 1) after 24.8 days "
               "and lies in the past (or wraps to a negative time): every "
               "client is dropped for the next 24.8 days; keep now_ms()'s "
               "int64_t milliseconds; watch it: an LD_PRELOAD "
               "clock_gettime() that adds 2,147,480 s to CLOCK_MONOTONIC "
               "once the server has run a second, then curl")
    lab.expect(said[-1] == 200,
               f"on one keep-alive connection, requests whose waits and "
               f"lengths were all inside the limits (CLOCK_MONOTONIC jumping "
               f"{LONG_GAP_S} s before each, as while the server waited, and "
               f"{LONG_GAP_S} s between the two pieces of the last): request "
               f"{len(said)} of {LONG_REQUESTS}, "
               f"{(len(said) - 1) * LONG_GAP_S} s of the server's clock after "
               f"the first, was {said[-1]}: a cap on the connection's "
               "lifetime (a clock of the connection, not of each request)? "
               "Each request has 10 s of its own from its first byte, and "
               "each wait between two the idle 5 s: a keep-alive client "
               "that keeps within them is served however long it stays, "
               "and a request begun is never cut inside its own 10 s; "
               "watch it: keep-alive requests 4 s apart for a minute, the "
               "last in two pieces 3 s apart")


# A shim (LD_PRELOAD) that takes the server's descriptors 3 to HIGH_FD
# (/dev/null, close-on-exec) before main(): the sockets it makes from then
# on, its clients', are numbered past FD_SETSIZE (1,024), as in a server
# with a pool of thousands of threads (MAX_THREADS) or other files open.
HIGH = r"""
#define _GNU_SOURCE
#include <fcntl.h>
__attribute__((constructor)) static void take_low_descriptors(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && fd < HIGH_FD)
        fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
}
"""


@grader.check(5, f"built with -D_FORTIFY_SOURCE=2, its descriptors 3 to {HIGH_FD} "
              "taken: clients numbered past FD_SETSIZE (1,024), a request "
              "in two pieces served; a clean stop")
def high_descriptors(lab):
    lab.expect(lab.source is not None, f"no source to build with {FORTIFY} "
               "(grade with --src)")
    # The fortified build is what makes an fd_set written past its end
    # fail at once (__fdelt_chk); a source with no fd_set, FD_* macro,
    # select() or <sys/select.h> cannot write one, and its own build
    # serves as it is (a build is most of this check's CPU).
    binary = None
    if FD_SET_WORDS.search(code_only(lab.source.read_text(errors="replace"))):
        binary = lab.workdir / "fortify" / "prethreaded"
        ok, said = build(lab.source, binary, "prethreaded", FORTIFY)
        lab.expect(ok, f"{FORTIFY} does not build: {said.strip()[:150]}")
    shim = build_shim(lab, "high", HIGH, f"-DHIGH_FD={HIGH_FD}")
    raise_open_file_limit()  # the server's soft limit: the hard one
    server = lab.start(binary=binary, env={
        "ZEROHTTPD_THREADS": str(THREADS), "LD_PRELOAD": str(shim)})
    # The port is probed once it listens (a connection, then a close): a
    # server that cannot wait on such a descriptor may be dead already.
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        with Connection(server.port, timeout=seconds(5)) as conn:
            conn.send(ask[:16])
            time.sleep(0.3)
            conn.send_tolerating_reset(ask[16:])
            status = status_or_cut(conn)
    except OSError as error:
        status = f"refused ({str(error)[:40]})"
    dead = (death(lab) if status != 200 or server.proc.poll() is not None
            else None)
    said = server.stderr().strip().splitlines()
    lab.expect(status == 200 and not dead,
               f"with its clients' descriptors past {HIGH_FD}, a request in "
               f"two pieces 0.3 s apart was {status}"
               + (f"; {dead}" if dead else "")
               + (f" ({said[-1][:100]})" if dead and said else "")
               + ": a wait with select() and an fd_set? FD_SET() on a "
               "descriptor of 1,024 (FD_SETSIZE) or more writes past the "
               "fd_set, on the thread's stack: a fortified build (as "
               "distributions build packages) aborts there, another "
               "corrupts its stack; a pool of 1,100 threads (MAX_THREADS "
               "allows 4,096) has clients that high; wait with poll() "
               "(wait_readable), which takes any descriptor; watch it: "
               f"build with {FORTIFY}, then ulimit -n 4096; "
               "ZEROHTTPD_THREADS=1100 ./prethreaded 8000 and 1,030 idle "
               "clients, then curl http://127.0.0.1:8000/")
    top = max(descriptors(server.pid))  # its listener, made after the shim
    lab.expect(top > HIGH_FD, f"the server's descriptors end at {top}, not "
               f"past {HIGH_FD}: RLIMIT_NOFILE's hard limit is too low to "
               "grade this (ulimit -Hn)")
    server.stop()
    return f"its listener was descriptor {top}"


def slow_clients(lab, kinds, hangups=False):
    """Honest slow clients of these kinds at once: what went wrong.
    hangups: first each pool thread is given a client that sends part of a
    request and hangs up: nothing of that request may stay behind."""
    server = pool_server(lab)
    if hangups:
        quit = idle_clients(server.port, THREADS)
        for s in quit:
            s.send(b"GET / HT")
        time.sleep(0.3)  # each has its thread, and its first byte
        for s in quit:
            s.close()
    said = [None] * len(kinds)

    def run(k):
        said[k] = slow_but_legitimate(server.port, kinds[k])

    clients = [threading.Thread(target=run, args=(k,))
               for k in range(len(kinds))]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    if hangups:  # over 10 s after them: a new client for every thread
        later = idle_clients(server.port, THREADS)
        time.sleep(0.3)  # each has its thread
        answers = []
        for s in later:
            try:
                s.sendall(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
                answers.append(read_answer(s)[0])
            except OSError:
                answers.append(0)
            s.close()
        if any(a != 200 for a in answers):
            said.append(f"of {THREADS} new clients at once, one for each pool "
                        f"thread, 11 s after each thread had a client that "
                        f"sent 'GET / HT' and hung up, "
                        f"{sum(a != 200 for a in answers)} were not "
                        "answered (answered: " + ", ".join(
                            str(a) for a in answers) + "): the first byte's "
                        "time of that hung-up request kept (per thread, "
                        "static or __thread) and not reset when the client "
                        "left: the thread's next client finds its deadline "
                        "long past; keep the clock in the connection or "
                        "in read_request(), or reset it on every return")
    return [s for s in said if s]


grader.still_serves(5, env={"ZEROHTTPD_THREADS": str(THREADS)})


if __name__ == "__main__":
    grader.main()
