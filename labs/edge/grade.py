#!/usr/bin/env python3
"""Grader for the edge lab (labs/edge/README.md).

Under edge triggering a handler that stops before EAGAIN is not called
again for the bytes it left, unless something new arrives. Each check
leaves bytes where one handler would stop early and nothing new will come:
a pipeline longer than the request buffer (one client, then a burst of
them), a Redis reply many reads long, a refused body to drain before
closing, an 8 MiB file. The setting itself is checked in /proc (every
watched descriptor EPOLLET), and so is what edge triggering is for: few
epoll_ctl() calls, so re-arming on every call cannot stand in for the
work."""

import contextlib
import fcntl
import os
import re
import selectors
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from grading import (Grader, _strace, asking_clients,  # labs/grading.py
                     build_shim, get, kept_clients, keepalive_load,
                     raise_open_file_limit, seconds,
                     status_field, stop_now, wait_for)

PIPELINED = 20000  # HEAD requests in one go: 560 KB, more than a request
# buffer holds, even one enlarged so that "any pipeline fits"
SILENCE = 3  # seconds without an answer that count as a stall
LONGEST = 60  # seconds one connection's answers are read for, at most
GAP = 0.9  # seconds between two answers of one pipeline, at most: a loop
# that waits out epoll_wait's 1 s timeout between them missed an edge
BURST = 8  # clients at once, each pipelining BURST_EACH requests (28 KB,
BURST_EACH = 1000  # more than the 27,124-byte request buffer)
HEAD = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
GUESTBOOK_HEAD = b"HEAD /guestbook HTTP/1.1\r\nHost: x\r\n\r\n"
EPOLLET = 1 << 31
EPOLLONESHOT = 1 << 30
REMARK = "x" * 1500  # 100 of these: an LRANGE reply of about 150 KB
LONG_REMARK = "y" * 7000  # 100 of these: about 700 KB, past any read budget
LINK_BACK = 0.5  # s after Redis closes the link: the reconnect's backoff
# (100 ms) is over, the next page must be served
REFUSED_BODY = 60000  # over MAX_BODY (18,932: 413), under LINGER_MAX_BYTES
LINGERERS = 3
LINGER_MS = 500  # lingering lasts at most this long after the refusal
LINGER_HELD = 2.5  # s a trickling refused client may be held, at most (the
# reference: 0.5, LINGER_MS, whatever the client sends meanwhile)
TRICKLE = 0.1  # s between a trickling refused client's 100-byte sends
MAX_HEAD = 8192  # the starter's MAX_HEAD: bytes of a request's head
MAX_BODY = 18932  # the starter's MAX_BODY: bytes of a POST's body
REQUEST_BUFFER = MAX_HEAD + MAX_BODY  # CONN_BUF_SIZE, 27,124: one whole
# request fits, to its last byte
LINGER_MAX = 64 << 10  # LINGER_MAX_BYTES: read after the refusal went out
DRAIN_CHUNK = 4096  # the starter's DRAIN_CHUNK: bytes dropped per recv()
DRAIN_READ = 128 << 10  # bytes read from a refused client in all: its
# request buffer (read before the refusal), then lingering
QUEUED = REQUEST_BUFFER + LINGER_MAX + 2 * DRAIN_CHUNK  # bytes waiting in
# the server's socket before it runs again: every read that counts returns
# all it asks for (this machine queues 128,512), so the count is exact
HALF_HEADS = 100  # clients that each hold half a request, buffered
KEPT = 300  # kept-alive clients, answered and idle: no request buffer held
KEPT_KIB = 8  # address space allowed for each (the reference: under 1)
BUFFER_KIB = 64  # address space allowed for each (the reference: 27)
HALF_CLOSED = (1, 10, 1000)  # requests from each client before its FIN (as
# the check's title says)
CTL_REQUESTS = 250  # ab -k requests while epoll_ctl() is counted
CTL_CLIENTS = 5  # ab -c: each connection costs its own epoll_ctl()s
CUT = 11.5  # seconds: the 10 s request timeout, and a margin
HEAD_REST = 6.5  # s after a download its next head's rest comes: past the
# 5 s idle timeout, within the 10 s request one (begun during the download)
SLOW_RATE = 320 << 10  # bytes a second a slow reader takes of the 8 MiB
# file: writable again every few seconds (a third of a 4 MiB send buffer),
# and the answer not all written 10 s in (3.2 MB read, 4.2 MB in buffers)
SLOW_SPAN = 12  # s it reads for: past the 10 s send timeout and a margin
FIN_CLOSE = 2  # s within which a FIN after an incomplete request closes
ENDLESS = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 10
NOFILE = 40  # the server's descriptor limit in out_of_descriptors
CROWD = 3300  # clients that connect at once, each with a request: one
# edge for all (under the 4,096 backlog somaxconn allows). A cap of accepts
# per wake-up under CROWD is seen by ACCEPT_WATCH even when one more edge
# comes and saves the rest (the kernel sometimes wakes the listener again
# while the loop accepts: a cap of 3,072 passed 3 runs in 4 on answers)
CROWD_WAIT = 5  # s for all of them to be answered (the reference: 0.2)
EMFILE_WAIT = 3  # s for a client that came while accept4() said EMFILE
SHORTAGE_WAIT = 1.0  # s for a kept-alive client's answer while every
# accept4() fails with ENOBUFS (the reference: at once)
SHORTAGE_SPAN = 0.5  # s the lasting shortage is watched for, at least
ACCEPT_TRIES = 250  # accept4() calls a second allowed meanwhile (the
# reference: 100, one per 10 ms pause; a retry on every loop turn makes
# thousands, under strace)
# Preloaded into the crowd's server: counts the times the server went to
# a blocking epoll_wait() while clients waited in its listener's queue,
# its accept loop having stopped after a successful accept (no EAGAIN, no
# error, no epoll_ctl() on the listener since): no edge is due for those
# clients. [0]: such waits; [1]: the accepts in a row before the first.
ACCEPT_WATCH = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static long none[2], *seen = none;
static int listener = -1;
static long streak; /* successful accepts since the last failed one */
__attribute__((constructor)) static void share(void)
{
    const char *path = getenv("LAB_ACCEPT_WATCH");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0)
        return;
    long *shared = mmap(NULL, 2 * sizeof *shared, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    close(fd);
    if (shared != MAP_FAILED)
        seen = shared;
}
static int taken(int fd, int got)
{
    int saved = errno;
    listener = fd;
    streak = got >= 0 ? streak + 1 : 0;
    errno = saved;
    return got;
}
int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(
            RTLD_NEXT, "accept4");
    return taken(fd, real(fd, a, l, flags));
}
int accept(int fd, struct sockaddr *a, socklen_t *l)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(
            RTLD_NEXT, "accept");
    return taken(fd, real(fd, a, l));
}
int epoll_ctl(int ep, int op, int fd, struct epoll_event *ev)
{
    static int (*real)(int, int, int, struct epoll_event *);
    if (!real)
        real = (int (*)(int, int, int, struct epoll_event *))dlsym(
            RTLD_NEXT, "epoll_ctl");
    if (fd == listener)
        streak = 0; /* unwatched, or watched again: it will be reported */
    return real(ep, op, fd, ev);
}
static void waiting(int blocking)
{
    int saved = errno;
    if (streak && blocking && listener >= 0) {
        struct pollfd p = {.fd = listener, .events = POLLIN};
        if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
            if (!seen[0])
                seen[1] = streak;
            seen[0]++;
        }
        streak = 0;
    }
    errno = saved;
}
int epoll_wait(int ep, struct epoll_event *ev, int n, int ms)
{
    static int (*real)(int, struct epoll_event *, int, int);
    if (!real)
        real = (int (*)(int, struct epoll_event *, int, int))dlsym(
            RTLD_NEXT, "epoll_wait");
    waiting(ms != 0);
    return real(ep, ev, n, ms);
}
int epoll_pwait(int ep, struct epoll_event *ev, int n, int ms,
                const sigset_t *mask)
{
    static int (*real)(int, struct epoll_event *, int, int,
                       const sigset_t *);
    if (!real)
        real = (int (*)(int, struct epoll_event *, int, int,
                        const sigset_t *))dlsym(RTLD_NEXT, "epoll_pwait");
    waiting(ms != 0);
    return real(ep, ev, n, ms, mask);
}
int epoll_pwait2(int ep, struct epoll_event *ev, int n,
                 const struct timespec *t, const sigset_t *mask)
{
    static int (*real)(int, struct epoll_event *, int,
                       const struct timespec *, const sigset_t *);
    if (!real)
        real = (int (*)(int, struct epoll_event *, int,
                        const struct timespec *, const sigset_t *))dlsym(
            RTLD_NEXT, "epoll_pwait2");
    waiting(!t || t->tv_sec || t->tv_nsec);
    return real(ep, ev, n, t, mask);
}
"""
# Preloaded into few_epoll_ctl's server: counts its epoll_ctl() calls (every
# thread; [0] of the shared file), as strace -c did at a ptrace stop per
# system call of the server.
CTL_COUNT = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>
static long none[1], *calls = none;
__attribute__((constructor)) static void share(void)
{
    const char *path = getenv("LAB_CTL_COUNT");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0)
        return;
    long *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    close(fd);
    if (shared != MAP_FAILED)
        calls = shared;
}
int epoll_ctl(int ep, int op, int fd, struct epoll_event *ev)
{
    static int (*real)(int, int, int, struct epoll_event *);
    if (!real)
        real = (int (*)(int, int, int, struct epoll_event *))dlsym(
            RTLD_NEXT, "epoll_ctl");
    __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
    return real(ep, op, fd, ev);
}
"""
PIPELINED_CTL = 500  # pipelined requests while epoll_ctl() is counted
BUSY_CLIENTS = 10  # kept-alive clients that each ask for a page while Redis
# is stalled, then for HEAD / while it waits: 2 requests each
CTL_PER_REQUEST = 0.25  # allowed per request (level or edge: about 0.08 at
# CTL_REQUESTS over CTL_CLIENTS connections)
PIPE_HOW = ("watch it: the handout's pipelining one-liner against ./epoll "
            "8000 (more HEADs if your request buffer is bigger)")
grader = Grader("edge")


def big_file(lab, size=8 << 20):
    """A file under the lab's public/ larger than any socket buffer, so
    that sending it needs the socket to drain many times: its URL path.
    Zeros (grading.big_file's random bytes cost a CPU-second in every 50
    writes, and only the length is checked; not sparse: sending holes of
    8 MiB cost 0.2 CPU-s more here)."""
    (lab.site / "public" / "big.bin").write_bytes(bytes(size))
    return "/big.bin"


def epoll_interest(pid):
    """{fd: events} of every descriptor in the server's epoll instance."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[eventpoll]":
            watched = {}
            for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                if line.startswith("tfd:"):
                    fields = line.split()
                    watched[int(fields[1])] = int(fields[3], 16)
            return watched
    return {}


def responses(sock, count, limit, gaps=None):
    """How many responses of `count` arrive before the server falls silent
    for `limit` seconds, closes or resets the connection (or LONGEST s
    pass). gaps: a list that gets the longest wait between two reads with
    answers in them."""
    sock.settimeout(seconds(limit))
    mark = b"HTTP/1.1 "
    seen, tail = 0, b""  # counted so far; the last bytes, for a split mark
    last, longest = time.monotonic(), 0.0
    ends = last + seconds(LONGEST)
    try:
        while seen < count and time.monotonic() < ends:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            now = time.monotonic()
            if seen:
                longest = max(longest, now - last)
            last = now
            data = tail + chunk
            seen += data.count(mark)
            tail = data[-(len(mark) - 1):]
    except (socket.timeout, ConnectionResetError):
        pass
    if gaps is not None:
        gaps.append(longest)
    return seen


def first_bytes(socks, limit):
    """Waits for every one of socks at once, `limit` s in all (a server
    that leaves them hanging costs `limit`, not `limit` per client): how
    many got an answer (HTTP/1.1 200), how many were closed or reset, and
    how many got nothing."""
    waiting = selectors.DefaultSelector()
    for s in socks:
        waiting.register(s, selectors.EVENT_READ)
    answered = closed = 0
    deadline = time.monotonic() + seconds(limit)
    while waiting.get_map() and time.monotonic() < deadline:
        for key, _ in waiting.select(0.1):
            waiting.unregister(key.fileobj)
            try:
                data = key.fileobj.recv(65536)
            except OSError:
                data = b""
            answered += data.startswith(b"HTTP/1.1 200")
            closed += not data.startswith(b"HTTP/1.1 200")
    hanging = len(waiting.get_map())
    waiting.close()
    return answered, closed, hanging


def server_sockets(port):
    """{client port: (bytes unread in the server's socket, its inode)} of
    every established connection to `port` (ss, filtered in the kernel:
    /proc/net/tcp lists every socket of the machine; inode 0: the server
    closed its descriptor, the kernel still sends what it holds)."""
    said = subprocess.run(["ss", "-tnHe", "state", "established",
                           f"( sport = :{port} )"], capture_output=True,
                          text=True).stdout
    found = {}
    for line in said.splitlines():
        fields = line.split()
        inode = re.search(r"\bino:(\d+)", line)
        if len(fields) >= 4:
            found[int(fields[3].rpartition(":")[2])] = (
                int(fields[0]), int(inode.group(1)) if inode else 0)
    return found


def send_quietly(sock, data):
    """sendall() for a thread: a connection the server stalled or closed
    is the check's to report, not the thread's."""
    try:
        sock.sendall(data)
    except OSError:
        pass


@grader.check(10, "every watched descriptor is edge-triggered (EPOLLET, not "
              "EPOLLONESHOT): listener, clients (one waiting to write), the "
              "Redis link")
def edge_triggered(lab):
    path = big_file(lab)
    server = lab.start()
    lab.expect(get(server.port, "/guestbook")[0] == 200, "no guestbook page")
    clients = kept_clients(server.port, 5)
    stalled = socket.create_connection(("127.0.0.1", server.port),
                                       timeout=seconds(5))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    stalled.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    clients.append(stalled)  # unread: its answer waits for room to write
    time.sleep(seconds(0.3))
    interest = epoll_interest(server.pid)
    for c in clients:
        c.close()
    level = [fd for fd, ev in interest.items() if not ev & EPOLLET]
    oneshot = [fd for fd, ev in interest.items() if ev & EPOLLONESHOT]
    lab.expect(len(interest) >= 8 and not level and not oneshot,
               f"{len(interest)} watched descriptors (5 clients, one whose "
               "8 MiB answer waits for room to write, the listener and "
               f"Redis expected), {len(level)} level-triggered, "
               f"{len(oneshot)} one-shot: every watch must be EPOLLET; see "
               f"them: grep tfd /proc/$(pgrep -x epoll)/fdinfo/* (events "
               "8000xxxx is edge)")


@grader.check(15, f"{PIPELINED} pipelined requests on one connection (never "
              f"{GAP} s between answers), then {BURST} clients at once with "
              f"{BURST_EACH} each: all answered")
def pipelined(lab):
    server = lab.start()
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(10)) as s:
        # Sent beside the reading: 560 KB of requests and 4 MB of answers
        # would fill both directions' buffers if one waited for the other.
        sender = threading.Thread(target=send_quietly,
                                  args=(s, HEAD * PIPELINED), daemon=True)
        sender.start()
        start = time.monotonic()
        gaps = []
        got = responses(s, PIPELINED, limit=SILENCE, gaps=gaps)
        took = time.monotonic() - start
        try:
            s.shutdown(socket.SHUT_RDWR)  # wakes a sender the server stalled
        except OSError:
            pass  # the server closed it already
        sender.join(timeout=seconds(5))
    lab.expect(got == PIPELINED, f"{got} of {PIPELINED} pipelined requests "
               f"answered, then {SILENCE} s of silence or a close: bytes left "
               "in the "
               "socket with no edge to come (a full buffer, a read that "
               "stopped early), or a full buffer taken for EOF; " + PIPE_HOW)
    lab.expect(gaps[0] <= seconds(GAP), f"all {PIPELINED} answered, but once "
               f"{gaps[0]:.2f} s passed between two answers (at most {GAP} "
               "s): bytes already in were left until epoll_wait's timeout "
               "woke the loop (work queued after the wait's turn was taken, "
               "no edge to come); " + PIPE_HOW)
    burst = []
    for _ in range(BURST):  # all sent before any answer is read
        s = socket.create_connection(("127.0.0.1", server.port),
                                     timeout=seconds(5))
        s.sendall(HEAD * BURST_EACH)
        burst.append(s)
    got = [responses(s, BURST_EACH, limit=SILENCE) for s in burst]
    for s in burst:
        s.close()
    lab.expect(got == [BURST_EACH] * BURST,
               f"answered per client {got} of {BURST_EACH} each, {BURST} "
               "clients at once: " + PIPE_HOW)
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(10)) as s:
        s.sendall(HEAD)  # a kept connection, then a pipeline of pages
        lab.expect(responses(s, 1, limit=SILENCE) == 1, "no answer")
        sender = threading.Thread(target=send_quietly,
                                  args=(s, GUESTBOOK_HEAD * BURST_EACH),
                                  daemon=True)
        sender.start()
        got = responses(s, BURST_EACH, limit=SILENCE)
        sender.join(timeout=seconds(5))
    lab.expect(got == BURST_EACH, f"{got} of {BURST_EACH} pipelined HEAD "
               "/guestbook answered (37 KB: more than the request buffer; "
               "each answer waits for Redis): after an answer that came "
               "from Redis, the rest of a full buffer's bytes must be read "
               "too")
    return f"{PIPELINED} answered in {took:.1f} s, {gaps[0]:.2f} s apart at most"


@grader.check(5, f"{HALF_HEADS} clients holding half a request cost at most "
              f"{BUFFER_KIB} KiB each (the 26.5 KiB request buffer stays), "
              f"{KEPT} idle kept-alive ones at most {KEPT_KIB} KiB each; "
              f"a request of exactly {REQUEST_BUFFER:,} bytes is answered")
def buffer_bounded(lab):
    server = lab.start()
    before = status_field(server.pid, "VmSize")
    socks = asking_clients(server.port, HALF_HEADS, b"GET / HTTP/1.1\r\n")
    grown = wait_for(lambda: status_field(server.pid, "VmSize") - before,
                     lambda kib: kib >= HALF_HEADS * 20, limit=2)
    for s in socks:
        s.close()
    each = grown / HALF_HEADS
    lab.expect(each <= BUFFER_KIB, f"{each:.0f} KiB of address space per "
               "client holding half a request: a bigger request buffer only "
               "moves the stall to a longer pipeline; watch it: grep VmSize "
               "/proc/$(pgrep -x epoll)/status while clients hold requests")
    time.sleep(seconds(0.3))
    before = status_field(server.pid, "VmSize")
    kept = kept_clients(server.port, KEPT)  # answered, then idle
    answered, _, _ = first_bytes(kept, 5)
    if answered < KEPT:
        for s in kept:
            s.close()
    lab.expect(answered == KEPT, f"{answered} of {KEPT} clients that "
               "connected at once, each with a request, answered within 5 "
               "s: the listener's edge came for many at once; accept until "
               "EAGAIN, or the rest wait for a new client to come")
    time.sleep(seconds(0.3))
    idle = (status_field(server.pid, "VmSize") - before) / KEPT
    for s in kept:
        s.close()
    lab.expect(idle <= KEPT_KIB, f"{idle:.1f} KiB of address space per "
               f"kept-alive client, answered and idle ({KEPT} of them; at "
               f"most {KEPT_KIB}): an idle connection holds no request "
               "buffer (it is given back once a request is done and nothing "
               "more is in)")
    answer = largest_request(server.port)
    lab.expect(answer.startswith(b"HTTP/1.1 405"), "a request of exactly "
               f"{REQUEST_BUFFER:,} bytes, the largest the request buffer "
               f"promises to hold (an {MAX_HEAD:,}-byte head, MAX_HEAD, and a "
               f"{MAX_BODY:,}-byte body, MAX_BODY; a POST to a page: 405 "
               "once its body is in), sent at once: " + (
                   f"answered {answer[:24]!r}" if answer else "no answer") +
               f" within {SILENCE} s (the reference: at once): the reads "
               "stopped short of CONN_BUF_SIZE (a byte kept for a '\\0'?), "
               "and no edge comes for the bytes left in the socket; the "
               "buffer must be filled to the last byte")
    return f"{each:.0f} KiB per client holding half a request, {idle:.1f} per idle one"


def largest_request(port):
    """What the server answers (its first bytes, b"" if none within SILENCE
    s) to a POST /index.html of exactly REQUEST_BUFFER bytes, sent in one
    go: a head of MAX_HEAD bytes (padded by a header), a body of MAX_BODY."""
    head = (b"POST /index.html HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nX-Pad: "
            % MAX_BODY)
    head += b"a" * (MAX_HEAD - len(head) - 4) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(SILENCE)) as s:
        s.sendall(head + b"x" * MAX_BODY)
        try:
            return s.recv(65536)
        except OSError:  # none within SILENCE s, or reset
            return b""


HUGE = 48 << 20  # bytes of a file sent to a client with room for most of
# it: more than any per-wake-up cap "just past what the other checks
# send" (8 MiB)
HUGE_WINDOW = 64 << 20  # its receive buffer (as root): the server's first
# sendfile() for it sends over 20 MB with no EAGAIN
EPOLL_WAITS = {"232", "281", "441", "22"}  # /proc/PID/syscall: epoll_wait,
# epoll_pwait, epoll_pwait2 (x86-64), epoll_pwait (arm64)


@grader.check(5, f"an 8 MiB file reaches a client in full, and a {HUGE >> 20}"
              " MiB one a client with room for most of it")
def big_download(lab):
    path = big_file(lab)
    with open(lab.site / "public" / "huge.bin", "wb") as f:  # sparse too
        f.truncate(HUGE)
    server = lab.start()
    status, body = get(server.port, path, timeout=10)
    lab.expect(status == 200 and len(body) == 8 << 20,
               f"status {status}, {len(body)} of {8 << 20} bytes: the send "
               "side stopped before EAGAIN; watch it: curl -o /dev/null "
               "http://127.0.0.1:8000/big.bin with a big file in public/")
    queued, got, need = roomy_download(server, "/huge.bin")
    lab.expect(got >= need, f"{got:,} of {need:,} bytes of a {HUGE >> 20} "
               f"MiB file to a client with a {HUGE_WINDOW >> 20} MiB receive "
               f"buffer ({queued:,} bytes in it when the server went back to "
               f"epoll_wait(), then read at once), {SILENCE} s of silence "
               "after: the send loop stopped with room left in the socket "
               "(no EAGAIN), so no EPOLLOUT edge was owed (a cap on bytes or "
               "calls per wake-up, however high); write on to EAGAIN, or, to "
               "be fair to other clients, come back by yourself (a list of "
               "connections to resume before the next blocking wait); watch "
               "it: curl -o /dev/null http://127.0.0.1:8000/huge.bin with a "
               f"{HUGE >> 20} MiB file in public/")


def waits_in_epoll(pid):
    """Whether the server's (main) thread is blocked in epoll_wait()."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] in \
            EPOLL_WAITS
    except (OSError, IndexError):
        return False


def roomy_download(server, path):
    """A client with a HUGE_WINDOW receive buffer asks for path and reads
    nothing until the server, having sent some, is back in epoll_wait()
    (its first burst of sending over), then reads as fast as it can until
    the answer is whole, the server closes, or SILENCE s pass with
    nothing: (bytes queued then, bytes read, bytes the answer has)."""
    with socket.socket() as s:
        try:  # as root; else what SO_RCVBUF allows (net.core.rmem_max)
            s.setsockopt(socket.SOL_SOCKET, 33, HUGE_WINDOW)  # ...BUFFORCE
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, HUGE_WINDOW)
        s.settimeout(seconds(SILENCE))
        s.connect(("127.0.0.1", server.port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        queued = wait_for(lambda: unread(s) if waits_in_epoll(server.pid)
                          else 0, lambda n: n > 0, limit=5)
        buf = bytearray(1 << 20)
        got, need, head = 0, HUGE, b""
        try:
            while got < need:
                n = s.recv_into(buf)
                if not n:
                    break
                if len(head) < 4096:
                    head += bytes(buf[:min(n, 4096)])
                    end = head.find(b"\r\n\r\n")
                    if end >= 0:
                        need = end + 4 + HUGE
                got += n
        except OSError:  # SILENCE s with nothing, or reset
            pass
    return queued, got, need


def unread(sock):
    """Bytes waiting in sock's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD,
                                          b"\0" * 4))[0]


# Pages of 700 KB asked one after another: a Redis read with a byte budget
# stalled on about 5 pages in 6 (2026-11-27), so 4 miss it 1 time in 1,300.
BIG_PAGES = 4


@grader.check(10, "guestbook pages whose Redis replies are 150 KB and 700 "
              f"KB; Redis closes the link (CLIENT KILL), or sends its last reply "
              f"and its FIN in one segment: {LINK_BACK} s later the next "
              "page is served, 200")
def big_redis_reply(lab):
    server = lab.start()
    for i in range(100):
        lab.redis.command("RPUSH", "guestbook:remarks", f"0:{REMARK}{i}")
    status, page = 0, b""
    try:
        status, page = get(server.port, "/guestbook", timeout=5)
    except socket.timeout:
        pass
    lab.expect(status == 200 and page.count(REMARK.encode()) == 100,
               f"status {status} (0: none in 5 s) for a page whose LRANGE "
               "reply is 150 KB, many recv()s long: the Redis reply was not "
               "read to EAGAIN; watch it: redis-cli RPUSH guestbook:remarks "
               "0:$(head -c 1500 /dev/zero | tr '\\0' x) 100 times, then "
               "curl http://127.0.0.1:8000/guestbook")
    for i in range(100):
        lab.redis.command("RPUSH", "guestbook:remarks",
                          f"0:{LONG_REMARK}{i}")
    for k in range(BIG_PAGES):  # a read cut short stalls only when the
        status, page = 0, b""   # rest is in already: most times, not all
        try:
            status, page = get(server.port, "/guestbook", timeout=5)
        except socket.timeout:
            pass
        lab.expect(status == 200 and
                   page.count(LONG_REMARK.encode()) == 100,
                   f"status {status} (0: none in 5 s) for page {k + 1} of "
                   f"{BIG_PAGES} whose LRANGE reply is 700 KB: a read that "
                   "stops after so many bytes leaves the rest in the "
                   "socket, and no edge comes for it")
    killed = lab.redis.command("CLIENT", "KILL", "TYPE", "normal")
    time.sleep(seconds(LINK_BACK))  # the link's EOF read, its backoff over
    start, status = time.monotonic(), 0
    try:
        status, _ = get(server.port, "/guestbook", timeout=5)
    except OSError:  # none in 5 s, or reset
        pass
    took = time.monotonic() - start
    lab.expect(killed >= 1 and status == 200, f"Redis closed the link "
               f"(CLIENT KILL, {killed} killed), and {LINK_BACK} s later "
               f"the guestbook answered {status} (0: none in 5 s) after "
               f"{took:.1f} s: the link's EOF (recv() returning 0) was "
               "taken for \"nothing more for now\", so the link was never "
               "closed and reconnected, and the command went to a dead "
               "socket; watch it: redis-cli CLIENT KILL TYPE normal, then "
               "curl http://127.0.0.1:8000/guestbook")
    redis_closes_with_reply(lab)


def fake_redis(port, close_after):
    """A Redis stand-in on port (the real one stopped), in a thread: it
    answers LRANGE (no remarks), INCR and GET (1) on each link; on the
    first link, its reply to command number close_after goes out with its
    FIN in one segment (TCP_CORK), and the link is closed. Returns
    stop(), which ends it."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    listener.settimeout(0.1)
    done = threading.Event()
    answers = {b"LRANGE": b"*0\r\n", b"INCR": b":1\r\n",
               b"GET": b"$1\r\n1\r\n", b"RPUSH": b":1\r\n"}

    def serve(link, closing):
        link.settimeout(0.1)
        buf, count = b"", 0
        with link:
            while not done.is_set():
                try:
                    chunk = link.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while True:  # whole commands: *N, then N bulk strings
                    parts = buf.split(b"\r\n")
                    if not parts[0].startswith(b"*") or len(parts) < 2:
                        break
                    argc = int(parts[0][1:])
                    if len(parts) < 1 + 2 * argc + 1:
                        break
                    name = parts[2].upper()
                    buf = b"\r\n".join(parts[1 + 2 * argc:])
                    count += 1
                    reply = answers.get(name, b"-ERR unknown\r\n")
                    if closing and count == close_after:
                        link.setsockopt(socket.IPPROTO_TCP,
                                        socket.TCP_CORK, 1)
                        link.sendall(reply)
                        link.shutdown(socket.SHUT_WR)
                        link.setsockopt(socket.IPPROTO_TCP,
                                        socket.TCP_CORK, 0)
                        time.sleep(0.05)
                        return
                    link.sendall(reply)

    links = []

    def run():
        with listener:
            while not done.is_set():
                try:
                    link, _ = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    return
                links.append(threading.Thread(target=serve, args=(
                    link, not links), daemon=True))
                links[-1].start()
    runner = threading.Thread(target=run, daemon=True)
    runner.start()

    def stop():  # every socket of its closed: the port is free again
        done.set()
        runner.join()
        for link in links:
            link.join()
    return stop


def redis_closes_with_reply(lab):
    """Redis's last reply and its FIN in one segment: the page it ends is
    served, and the next page, LINK_BACK s later, too (on a new link): a
    Redis read that stops at a short read never sees that FIN, and sends
    the next command down a closed link."""
    lab.redis.stop()
    try:
        stop = fake_redis(lab.redis.port, 3)  # LRANGE, INCR, GET: a page
        try:
            server = lab.start()
            statuses = []
            for _ in range(2):
                status = 0
                with contextlib.suppress(OSError, AssertionError):
                    status, _ = get(server.port, "/guestbook", timeout=5)
                statuses.append(status)
                time.sleep(seconds(LINK_BACK))
            server.stop()
        finally:
            stop()
    finally:
        lab.redis.start()
    lab.expect(statuses == [200, 200], f"Redis sent a page's last reply "
               f"and its FIN in one segment (a stand-in, TCP_CORK): that "
               f"page answered {statuses[0]}, and the next, {LINK_BACK} s "
               f"later, {statuses[1]} (0: none in 5 s): a Redis read that "
               "stops at a short read never sees the FIN that came with "
               "the reply (no edge comes for it), so the link is never "
               "reconnected; read on to EAGAIN, and the 0 is the FIN")


@grader.check(10, f"{LINGERERS} bodies refused (413) at once: each drained "
              "before the close, so no client is reset")
def linger_drained(lab):
    server = lab.start()
    socks = []
    for _ in range(LINGERERS):
        s = socket.create_connection(("127.0.0.1", server.port),
                                     timeout=seconds(5))
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % REFUSED_BODY + b"j" * REFUSED_BODY)
        socks.append(s)
    statuses = []
    for s in socks:  # the answer, then the server's half-close
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
            statuses.append(data[9:12].decode() or "none")
        except ConnectionResetError:
            statuses.append("reset")
    # The server closes each after LINGER_MS (500 ms) of silence, with an
    # empty socket; closing one with unread bytes sends a reset instead.
    time.sleep(seconds(1.5))
    resets = [s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for s in socks]
    for s in socks:
        s.close()
    lab.expect(statuses == ["413"] * LINGERERS,
               f"answers {statuses} to a {REFUSED_BODY}-byte body")
    reset = [e for e in resets if e]
    lab.expect(not reset, f"{len(reset)} of {LINGERERS} clients were reset "
               f"({os.strerror(reset[0]) if reset else ''}): the server "
               "closed with some of the refused body unread, because "
               "lingering stopped reading before EAGAIN; watch it: tcpdump "
               "-ni lo 'tcp[tcpflags] & tcp-rst != 0' during head -c 60000 "
               "/dev/zero | curl -H Expect: --data-binary @- "
               "http://127.0.0.1:8000/")
    read, lingered, queued, stepped = drained_after_refusal(lab, server)
    lab.expect(read <= DRAIN_READ, f"the server read {read >> 10} KiB from "
               "a client whose body it refused, with megabytes waiting: "
               "lingering reads at most 64 KiB, counted as it reads (not "
               "only once the socket is empty), then closes")
    # With fewer bytes queued than count, a read may come up short, and
    # a bound checked right may then pass 64 KiB by part of a chunk.
    allowed = LINGER_MAX if queued else LINGER_MAX + DRAIN_CHUNK
    lab.expect(lingered is not None and lingered <= allowed,
               "no answer seen on the refused client's socket (strace: "
               "sendto, sendmsg, write, writev)" if lingered is None else
               f"the server read {lingered:,} bytes from a refused client "
               f"after its answer went out, with megabytes waiting: "
               f"lingering reads at most {LINGER_MAX:,} (64 KiB), then "
               "closes: a bound checked with > instead of >= (or after the "
               "read) reads one chunk more; watch it: strace -e "
               "trace=recvfrom,sendto -p $(pgrep -x epoll) while curl -H "
               "Expect: --data-binary @big.bin http://127.0.0.1:8000/ posts "
               "a few MiB")
    lab.expect(stepped is not None and stepped <= LINGER_MAX + DRAIN_CHUNK,
               "no answer seen to a refused client (strace)" if stepped is
               None else f"the server read {stepped:,} bytes from a refused "
               f"client that sent {STEP // 1024} KiB every "
               f"{STEP_PACE * 1000:g} ms after its answer: lingering reads at "
               f"most {LINGER_MAX:,} (64 KiB) in all, counted across "
               "wake-ups (a count kept per call restarts at each edge, and "
               "a steady sender is read until the linger timer)")
    held = held_while_trickling(server.port)
    lab.expect(held is not None and held <= seconds(LINGER_HELD),
               "a refused client (400) that sends 100 bytes every "
               f"{TRICKLE:g} s after its answer was " + (
                   f"not closed within {seconds(LINGER_HELD):g} s of its "
                   "answer (or never answered)" if held is None else
                   f"closed {held:.1f} s after its answer") +
               f" (at most {LINGER_HELD:g}: lingering lasts LINGER_MS, "
               f"{LINGER_MS} ms, from the answer): a linger timer set again "
               "by each read never fires while the client trickles, and a "
               "slow sender holds the descriptor for hours")
    cut = cut_while_uploading(server.port)
    lab.expect(cut is None, "a refused client (413) still uploading its "
               f"body ({PACED_PIECE:,} bytes every {PACED_PACE * 1000:g} ms, "
               f"under {LINGER_MAX >> 10} KiB in all) was {cut}: lingering "
               "closed it early, the unread bytes that came next reset it, "
               "and a client that reads only once it has sent its body never "
               "sees its 413; a read shorter than asked for only means the "
               f"socket is empty for now: drain until the FIN, "
               f"{LINGER_MAX >> 10} KiB or LINGER_MS ({LINGER_MS} ms)")
    return (f"{read >> 10} KiB read from a refused client, {lingered:,} "
            f"bytes of them after its answer; {stepped:,} from a stepping "
            f"one; a trickling one closed "
            f"{held:.1f} s after its answer")


PACED_PIECE = 3000  # bytes of a refused body sent at a time (less than a
PACED_PACE = 0.03   # 4 KiB drain read), every PACED_PACE s, PACED_PIECES
PACED_PIECES = 8    # times after the answer: 0.24 s, inside LINGER_MS
PACED_EARLY = 0.4   # s after the answer: a reset before this is lingering's
# fault (the reference holds the connection LINGER_MS, 0.5 s, or to the FIN)


def cut_while_uploading(port):
    """A client posts a 60,000-byte body (413) in PACED_PIECE-byte pieces
    PACED_PACE s apart, the first with the head; once answered it sends
    PACED_PIECES more, then its FIN, then reads to EOF. None if it was
    not reset within PACED_EARLY s of its answer (a reset later is the
    linger timer's, under load); else what it saw."""
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(5)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n" % REFUSED_BODY + b"p" * PACED_PIECE)
        try:
            answer = s.recv(65536)
        except OSError as error:
            return f"reset before its answer ({error.__class__.__name__})"
        answered = time.monotonic()
        if not answer.startswith(b"HTTP/1.1 413"):
            return f"answered {answer[:12]!r} (413 expected)"
        sent = 0
        try:
            for _ in range(PACED_PIECES):
                time.sleep(PACED_PACE)
                s.sendall(b"p" * PACED_PIECE)
                sent += 1
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError as error:
            took = time.monotonic() - answered
            if took < seconds(PACED_EARLY):
                return (f"reset {took:.2f} s after its answer "
                        f"({error.__class__.__name__}, {sent} of "
                        f"{PACED_PIECES} pieces sent after it)")
    return None


def held_while_trickling(port):
    """A client posts a 1 GB body's head (refused: 400) and, once answered,
    sends 100 bytes every TRICKLE s: how long after the answer the server
    closed it (None: not within LINGER_HELD s, or never answered).
    Lingering half-closes first (the client reads a FIN); the close itself
    shows as a reset once the next bytes reach the closed socket."""
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(5)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n" % (1 << 30))
        s.settimeout(seconds(SILENCE))
        try:
            if not s.recv(65536):
                return None  # closed with no answer
        except OSError:
            return None
        answered = time.monotonic()
        ends = answered + seconds(LINGER_HELD)
        with selectors.DefaultSelector() as waiting:
            waiting.register(s, selectors.EVENT_READ)
            while time.monotonic() < ends:
                try:
                    s.send(b"t" * 100)
                    if not waiting.get_map():  # its FIN is in: pace by
                        time.sleep(TRICKLE)    # the clock
                    for _ in waiting.select(TRICKLE):
                        if not s.recv(65536):
                            waiting.unregister(s)
                except OSError:  # reset: it was closed
                    return time.monotonic() - answered
    return None


def unacked(sock):
    """Bytes sent on sock that the other end's kernel has not acknowledged
    (SIOCOUTQ): 0 once all it was sent is in the peer's socket, whether
    or not the process there reads it."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                          b"\0" * 4))[0]


SOCKET_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?"  # strace -f
                         r"(recvfrom|sendto|sendmsg|write|writev)"
                         r"\((\d+),.*\)\s+=\s+(\d+)", re.M)


STEP = 8192  # bytes a stepping refused client sends at a time, after its
STEP_PACE = 0.01  # answer, every STEP_PACE s, for STEP_SPAN s at most (under
STEP_SPAN = 0.45  # LINGER_MS): each its own wake-up, 360 KiB in all
STEP_MARK = b"POST /step "  # its request, to find its descriptor in strace
STEP_READ = re.compile(r'recvfrom\((\d+), "' + STEP_MARK.decode())


def stepping(s, said):
    """A kept-alive client (s) posts a 1 GB body's head (refused: 400) and,
    once answered, sends STEP bytes every STEP_PACE s until the server
    closes it (a reset) or STEP_SPAN s pass: said["sent"] is what it sent
    after its answer."""
    said["sent"] = 0
    try:
        s.sendall(STEP_MARK + b"HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  b"%d\r\n\r\n" % (1 << 30))
        if not s.recv(65536):
            return
        start = time.monotonic()
        while time.monotonic() - start < STEP_SPAN:
            s.sendall(b"s" * STEP)
            said["sent"] += STEP
            time.sleep(STEP_PACE)
    except OSError:  # reset: it was closed
        pass


def drained_after_refusal(lab, server):
    """A client posts an oversized body while the server is stopped, and
    as much of it as its 4 MiB send buffer takes: the bytes the server
    reads from it once it runs again (strace sums recvfrom's returns),
    answering 413 and lingering: (in all, after the first answer bytes
    sent on that socket or None, whether QUEUED bytes were waiting, and
    the bytes read after its answer from a stepping() client meanwhile or
    None)."""
    stepper = socket.create_connection(("127.0.0.1", server.port),
                                       timeout=seconds(5))
    stepper.sendall(HEAD)  # accepted and answered before the trace
    lab.expect(responses(stepper, 1, limit=SILENCE) == 1, "no answer")
    s = socket.create_connection(("127.0.0.1", server.port),
                                 timeout=seconds(5))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setblocking(False)
    stop_now(server.pid)
    data = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % (1 << 30) + b"j" * (4 << 20))
    sent = 0
    try:
        while sent < len(data):
            sent += s.send(data[sent:sent + 65536])
    except BlockingIOError:
        pass
    queued = wait_for(lambda: sent - unacked(s), lambda n: n >= QUEUED,
                      limit=2) >= QUEUED  # in the server's socket
    stepped = {}

    def run_again():  # traced from before it runs
        start = time.monotonic()
        os.kill(server.pid, signal.SIGCONT)
        stepping(stepper, stepped)
        time.sleep(max(0.0, start + seconds(1.5) - time.monotonic()))

    try:
        said = _strace(server.pid, ["recvfrom", "sendto", "sendmsg", "write",
                                    "writev"], run_again, "-f")
    finally:
        os.kill(server.pid, signal.SIGCONT)
        s.close()
        stepper.close()
    step_fd = STEP_READ.search(said)
    step_fd = step_fd.group(1) if step_fd else None
    read, answered, after = {}, set(), {}
    for call, fd, n in SOCKET_CALL.findall(said):
        if call == "recvfrom":
            read[fd] = read.get(fd, 0) + int(n)
            if fd in answered:
                after[fd] += int(n)
        elif int(n) > 0 and fd not in answered:
            answered.add(fd)
            after[fd] = 0
    stepped_after = after.pop(step_fd, None)
    read.pop(step_fd, None)
    return (max(read.values(), default=0), max(after.values(), default=None),
            queued, stepped_after)


@grader.check(10, "clients that send 1, 10 and 1,000 pipelined requests, "
              "a guestbook page, or an 8 MiB file, then a FIN (half-close): "
              "all answered in full; a FIN in the request's own segment seen; "
              "a head cut short and its FIN in one segment: "
              f"closed within {FIN_CLOSE} s")
def half_closed(lab):
    path = big_file(lab)
    server = lab.start()
    socks = []
    asks = [HEAD * count for count in HALF_CLOSED] + [
        b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()]
    for ask in asks:  # at once: the FIN is in before any answer
        s = socket.create_connection(("127.0.0.1", server.port),
                                     timeout=seconds(5))
        s.sendall(ask)
        s.shutdown(socket.SHUT_WR)
        socks.append(s)
    got = [responses(s, count, limit=SILENCE)
           for s, count in zip(socks, HALF_CLOSED)]
    whole = [len(read_all(s)) for s in socks[len(HALF_CLOSED):]]
    for s in socks:
        s.close()
    lab.expect(got == list(HALF_CLOSED),
               f"answered {got} of {list(HALF_CLOSED)} requests sent before "
               "a FIN: draining to EOF closed the connection before the "
               "requests already read were answered; watch it: the handout's "
               "pipelining one-liner with s.shutdown(1) after its sendall")
    lab.expect(whole[0] > 1000 and whole[1] > 8 << 20,
               f"{whole[0]} bytes for a guestbook page and {whole[1]} for an "
               "8 MiB file, each asked for just before a FIN: the answer was "
               "cut at the FIN (a client that half-closes still reads: "
               "finish what is under way, then close)")
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(5)) as s:
        s.sendall(HEAD)  # answered: kept alive, watched
        lab.expect(responses(s, 1, limit=SILENCE) == 1, "no answer")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        s.sendall(HEAD)
        s.shutdown(socket.SHUT_WR)  # the FIN waits behind the cork...
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)  # ...and goes
        start = time.monotonic()  # in the request's segment
        answer = read_all(s)
        took = time.monotonic() - start
    lab.expect(answer.startswith(b"HTTP/1.1 200") and took < seconds(2),
               f"a kept-alive client's next request and its FIN in one "
               f"segment: answered "
               f"{answer[:12]!r}, closed after {took:.1f} s (the idle timer's "
               "5 s?): a read that returned less than asked for is not "
               "EAGAIN; read on, and the 0 that follows is the FIN")
    cut_short(lab, server)


def cut_short(lab, server):
    """A FIN after an incomplete request: a kept-alive client, answered
    once, sends a head cut short then its FIN; a new client sends a POST's
    head and part of its body, then its FIN. Nothing more can come on
    either: each must be closed within FIN_CLOSE s (not held until the
    10 s request timer), both waited for at once."""
    kept = socket.create_connection(("127.0.0.1", server.port),
                                    timeout=seconds(5))
    fresh = socket.create_connection(("127.0.0.1", server.port),
                                     timeout=seconds(5))
    corked = socket.create_connection(("127.0.0.1", server.port),
                                      timeout=seconds(5))
    paged = socket.create_connection(("127.0.0.1", server.port),
                                     timeout=seconds(5))
    paged_corked = socket.create_connection(("127.0.0.1", server.port),
                                            timeout=seconds(5))
    first = {}
    try:
        for s in (kept, corked, paged, paged_corked):
            s.sendall(HEAD)
            lab.expect(responses(s, 1, limit=SILENCE) == 1, "no answer to "
                       "a HEAD request")
        kept.sendall(b"GET / HTTP/1.1\r\nHo")  # a head cut short
        kept.shutdown(socket.SHUT_WR)
        corked.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        corked.sendall(b"GET / HTTP/1.1\r\nHo")  # the same, its FIN in
        corked.shutdown(socket.SHUT_WR)  # the same segment: one edge, one
        corked.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)  # read
        fresh.sendall(b"POST /guestbook HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/x-www-form-urlencoded\r\n"
                      b"Content-Length: 100\r\n\r\nname=ab")  # 7 of 100
        fresh.shutdown(socket.SHUT_WR)
        # A page (its answer comes from Redis, not from a socket event),
        # then a head cut short, then the FIN: the check for "FIN seen,
        # nothing complete left" must run after that answer too.
        paged.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET / HTTP/1.1\r\nHo")
        paged.shutdown(socket.SHUT_WR)
        # The same with its FIN in the request's segment (TCP_CORK): read
        # in the same event as the request, whatever the timing, so that
        # only a check after the answer can close it.
        paged_corked.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        paged_corked.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n"
                             b"GET / HTTP/1.1\r\nHo")
        paged_corked.shutdown(socket.SHUT_WR)
        paged_corked.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        start = time.monotonic()
        took = closed_within([kept, fresh, corked, paged, paged_corked],
                             FIN_CLOSE + 1,
                             first)
    finally:
        for s in (kept, fresh, corked, paged, paged_corked):
            s.close()
    late = [what for what, t in zip(
        ["a kept-alive client's next head cut short (`GET / HTTP/1.1\\r\\nHo`)",
         "a new client's POST head and 7 bytes of its 100-byte body",
         "a kept-alive client's head cut short in the same segment as its "
         "FIN (TCP_CORK; a read shorter than asked for is not EAGAIN: "
         "read on to the 0)",
         "a kept-alive client's guestbook request and a head cut short "
         "(its answer came from Redis: check for the FIN after an answer "
         "finished there too, not only at the end of a socket event)",
         "a kept-alive client's guestbook request and a head cut short "
         "with its FIN in the same segment (TCP_CORK: read with the "
         "request; the FIN check must run after the answer from Redis)"],
        took)
        if t is None or t - start > seconds(FIN_CLOSE)]
    lab.expect(not late, f"{' and '.join(late)}, then the client's FIN: "
               f"not closed within {FIN_CLOSE:g} s (held until the request "
               "timer?): nothing more can come, so the request can never be "
               "complete; remember the FIN (an EOF flag) and close once "
               "nothing complete is left, body or head")
    pages = [first.get(s, b"") for s in (paged, paged_corked)]
    page = next((p for p in pages if not p.startswith(b"HTTP/1.1 200")),
                pages[0])
    lab.expect(all(p.startswith(b"HTTP/1.1 200") for p in pages), "a "
               "kept-alive client sent a guestbook request, a head cut short "
               f"and its FIN: its page answered {page[:12]!r} before the "
               "close (a FIN says the client sends no more: answer what is "
               "complete, then close)")


def closed_within(socks, limit, first=None):
    """When each of socks reads EOF or an error (monotonic), all waited for
    at once; None for one still open after `limit` s. first: a dict that
    gets each socket's first bytes read."""
    waiting, ended = selectors.DefaultSelector(), {}
    for s in socks:
        waiting.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds(limit)
    while waiting.get_map() and time.monotonic() < deadline:
        for key, _ in waiting.select(0.05):
            try:
                data = key.fileobj.recv(65536)
            except OSError:
                data = b""
            gone = data == b""
            if first is not None:
                first.setdefault(key.fileobj, data)
            if gone:
                ended[key.fileobj] = time.monotonic()
                waiting.unregister(key.fileobj)
    waiting.close()
    return [ended.get(s) for s in socks]


def read_all(sock):
    """Everything the server sends until it closes (or falls silent, or
    LONGEST s pass)."""
    sock.settimeout(seconds(SILENCE))
    data, ends = bytearray(), time.monotonic() + seconds(LONGEST)
    try:
        while time.monotonic() < ends and (chunk := sock.recv(1 << 20)):
            data += chunk  # in place: no copy of all so far per chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return bytes(data)


@grader.check(10, "a request that arrives while the one before it waits "
              "(on Redis, or on a client reading a big file) is answered "
              "after it")
def arrives_while_busy(lab):
    path = big_file(lab)
    server = lab.start()
    lab.expect(get(server.port, "/guestbook")[0] == 200, "no guestbook page")
    waiting = socket.create_connection(("127.0.0.1", server.port),
                                       timeout=seconds(5))
    waiting.sendall(HEAD)  # a keep-alive client, read-ready when it asks
    lab.expect(responses(waiting, 1, limit=SILENCE) == 1, "no answer")
    lab.stall_redis()
    waiting.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)  # parked on Redis; the next one comes as a new edge
    waiting.sendall(HEAD)
    time.sleep(0.3)
    os.kill(lab.redis.proc.pid, signal.SIGCONT)
    lab.stalled = False
    on_redis = responses(waiting, 2, limit=SILENCE)
    waiting.close()
    sending = socket.create_connection(("127.0.0.1", server.port),
                                       timeout=seconds(5))
    sending.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sending.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    time.sleep(0.3)  # the file fills the socket: the server waits on us
    sending.sendall(HEAD)
    on_file = responses(sending, 2, limit=SILENCE)
    sending.close()
    leaving = socket.create_connection(("127.0.0.1", server.port),
                                       timeout=seconds(5))
    leaving.sendall(HEAD)  # kept alive and watched, then a page and a FIN
    lab.expect(responses(leaving, 1, limit=SILENCE) == 1, "no answer")
    lab.stall_redis()
    leaving.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    leaving.shutdown(socket.SHUT_WR)  # its FIN comes while Redis holds it
    time.sleep(0.3)
    os.kill(lab.redis.proc.pid, signal.SIGCONT)
    lab.stalled = False
    after_fin = read_all(leaving)
    leaving.close()
    timing_out = socket.create_connection(("127.0.0.1", server.port),
                                          timeout=seconds(5))
    timing_out.sendall(HEAD)
    lab.expect(responses(timing_out, 1, limit=SILENCE) == 1, "no answer")
    lab.stall_redis()  # longer than its 1 s: the page gets its 503
    timing_out.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)
    timing_out.sendall(HEAD)
    on_timeout = responses(timing_out, 2, limit=SILENCE)
    timing_out.close()
    os.kill(lab.redis.proc.pid, signal.SIGCONT)
    lab.stalled = False
    missed = [f"{n} of 2 answers when the second request came while the "
              f"first {what}" for n, what in (
                  (on_redis, "waited on a stalled Redis"),
                  (on_file, "was an 8 MiB file being sent"),
                  (on_timeout, "waited on a Redis that timed out (its 503 "
                   "went out)")) if n != 2]
    if not (after_fin.startswith(b"HTTP/1.1 200") and b"</html>" in
            after_fin):
        missed.append(f"{after_fin[:12]!r} ({len(after_fin)} bytes) for a "
                      "guestbook page asked for just before a half-close "
                      "while Redis was slow: a FIN says the client sends no "
                      "more, not that it stopped reading; answer, then "
                      "close")
    lab.expect(not missed, "; ".join(missed) + (
        ": its edge came while the connection was busy, and no other will "
        "(read it when it comes, or read again after each answer, after a "
        "503 too)" if any(n != 2 for n in (on_redis, on_file, on_timeout))
        else ""))


@grader.check(10, f"at most {CTL_PER_REQUEST} epoll_ctl() per request under "
              "ab -k, pages and the guestbook, pipelined, and arriving while "
              "busy (no re-arming on every call)")
def few_epoll_ctl(lab):
    counter = lab.workdir / "ctl_count"
    counter.write_bytes(bytes(8))
    server = lab.start(env={
        "LD_PRELOAD": str(build_shim(lab, "ctl_count", CTL_COUNT)),
        "LAB_CTL_COUNT": str(counter)})
    ctl_calls = ctl_counter(counter)
    calls = ctl_calls(lambda: [keepalive_load(
        lab, server.port, CTL_REQUESTS // 2, concurrency=CTL_CLIENTS,
        path=path)
        for path in ("/", "/guestbook")])
    per = calls / CTL_REQUESTS
    lab.expect(per <= CTL_PER_REQUEST,
               f"{per:.2f} epoll_ctl() per request (the reference makes about "
               "0.08): interest re-armed on every call, which only imitates "
               "level triggering; watch it: strace -c -e trace=epoll_ctl -p "
               f"$(pgrep -x epoll) during ab -k -n {CTL_REQUESTS} -c "
               f"{CTL_CLIENTS} http://127.0.0.1:8000/")

    def pipeline():
        with socket.create_connection(("127.0.0.1", server.port),
                                      timeout=seconds(10)) as s:
            sender = threading.Thread(target=send_quietly,
                                      args=(s, HEAD * PIPELINED_CTL),
                                      daemon=True)
            sender.start()
            responses(s, PIPELINED_CTL, limit=SILENCE)
            sender.join(timeout=seconds(5))
    piped = ctl_calls(pipeline) / PIPELINED_CTL
    lab.expect(piped <= CTL_PER_REQUEST,
               f"{piped:.2f} epoll_ctl() per request over {PIPELINED_CTL} "
               "pipelined on one connection: a re-arm after each answer to "
               "get an edge for the bytes already in; read them at once "
               "instead")
    busy = busy_arrivals(lab, server, ctl_calls)
    lab.expect(busy <= CTL_PER_REQUEST,
               f"{busy:.2f} epoll_ctl() per request when {BUSY_CLIENTS} "
               "kept-alive clients each asked for the guestbook while Redis "
               "was stalled and then, while it waited, for HEAD /: reading "
               "interest dropped while a connection is busy and restored "
               "after its answer (2 calls for each request that comes "
               "meanwhile) is the level-triggered way; edge-triggered, "
               "ignore the event and read at once after the answer")
    return (f"{per:.3f} epoll_ctl() per request, {piped:.3f} pipelined, "
            f"{busy:.2f} arriving while busy")


def ctl_counter(counter):
    """calls(during): the epoll_ctl() calls the server made while during()
    ran, as the CTL_COUNT library preloaded into it counted them in
    counter (a file)."""
    def calls(during):
        before = struct.unpack("q", counter.read_bytes()[:8])[0]
        during()
        return struct.unpack("q", counter.read_bytes()[:8])[0] - before
    return calls


def busy_arrivals(lab, server, ctl_calls):
    """BUSY_CLIENTS kept-alive clients each ask for the guestbook while
    Redis is stalled and, once the server has read that request (its
    socket empty), for HEAD /, its own edge while the connection is busy;
    then Redis resumes and both answers are read: epoll_ctl() calls per
    request meanwhile (the preloaded CTL_COUNT)."""
    clients = []
    for _ in range(BUSY_CLIENTS):
        clients.append(socket.create_connection(("127.0.0.1", server.port),
                                                timeout=seconds(5)))
        clients[-1].sendall(HEAD)
        lab.expect(responses(clients[-1], 1, limit=SILENCE) == 1,
                   "no answer")
    ports = [c.getsockname()[1] for c in clients]

    def arrive():
        lab.stall_redis()
        try:
            for c in clients:
                c.sendall(GUESTBOOK_HEAD)
            wait_for(lambda: server_sockets(server.port),  # all read in
                     lambda found: all(found.get(p, (1,))[0] == 0
                                       for p in ports), limit=1)
            for c in clients:
                c.sendall(HEAD)  # an edge while the page waits on Redis
            wait_for(lambda: sum(map(unacked, clients)), lambda n: n == 0,
                     limit=1)
        finally:
            os.kill(lab.redis.proc.pid, signal.SIGCONT)
            lab.stalled = False
        for c in clients:
            responses(c, 2, limit=SILENCE)
    try:
        calls = ctl_calls(arrive)
    finally:
        for c in clients:
            c.close()
    return calls / (2 * BUSY_CLIENTS)


@grader.check(5, f"a head sent a byte a second is cut within {CUT} s of "
              "its first byte (the request timer is not restarted by reads); "
              "a slow reader is not cut")
def slow_head_cut(lab):
    path = big_file(lab)
    server = lab.start()
    during = {}
    begun = threading.Thread(target=head_begun_during_download,
                             args=(server.port, path, during))
    begun.start()  # beside the byte-a-second head: no time added
    piped = {}
    pipelined = threading.Thread(target=head_begun_pipelined,
                                 args=(server.port, piped))
    pipelined.start()  # beside it too
    slow = {}
    reader = threading.Thread(target=slow_reader,
                              args=(server.port, path, slow))
    reader.start()  # beside it too
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(0.05)
        start = time.monotonic()
        closed = None
        for byte in ENDLESS:
            try:
                s.send(bytes([byte]))
                if s.recv(65536) == b"":
                    closed = time.monotonic() - start
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = time.monotonic() - start
                break
            if time.monotonic() - start > CUT + 1:
                break
            time.sleep(0.95)
    lab.expect(closed is not None and closed <= CUT, "a head sent a byte a "
               "second was " + (f"cut after {closed:.1f} s" if closed else
                                f"still open after {CUT + 1:.0f} s") +
               ": the request's 10 s run from its first byte; a timer set "
               "again after each read never fires")
    begun.join(seconds(30))
    reader.join(seconds(30))
    pipelined.join(seconds(30))
    lab.expect(slow.get("held"), f"a client reading an 8 MiB answer at "
               f"{SLOW_RATE >> 10} KiB/s was {slow.get('said', 'not read')}:"
               " the 10 s send timer is for a reader that takes nothing; "
               "set it again at each stall, so that a slow reader that "
               "keeps taking is not cut (a timer set once per answer cuts "
               "every download that takes longer than 10 s)")
    lab.expect(during.get("answer", b"").startswith(b"HTTP/1.1 200"),
               f"a request whose first bytes came while an 8 MiB answer was "
               f"being sent, the rest of its head {HEAD_REST:g} s after the "
               f"answer was read in full: {during.get('said', 'no answer')} "
               "(cut by the 5 s idle timer?): a request begun is under the "
               "10 s request timer, also when its first bytes are read at "
               "once after the answer before it (the read that no edge "
               "calls for)")
    lab.expect(piped.get("answer", b"").startswith(b"HTTP/1.1 200"),
               "a request whose first bytes came pipelined, in the same "
               "segment as the whole request before it (already in the "
               "buffer when that answer was done), the rest of its head "
               f"{HEAD_REST:g} s after that answer: "
               f"{piped.get('said', 'no answer')} (cut by the 5 s idle "
               "timer?): a request begun is under the 10 s request timer "
               "from the moment the server turns to it, also when its "
               "bytes are in the buffer already and no read comes to "
               "start the clock")


def slow_reader(port, path, said):
    """A client (its receive buffer 64 KiB) asks for the 8 MiB file and
    reads it at SLOW_RATE for SLOW_SPAN s: said["held"] is whether the
    server still holds the connection then (ss: established, its
    descriptor open; a server that closed it has its send buffer still to
    deliver, so the client's reads do not show it); said["said"]: what
    was seen."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=seconds(10))
    except OSError as error:
        said["said"] = f"could not connect ({error})"
        return
    got = 0
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < SLOW_SPAN:
            allowed = int((elapsed + 0.1) * SLOW_RATE) - got
            if allowed > 0:
                chunk = s.recv(min(allowed, 1 << 20))
                if not chunk:
                    said["said"] = f"closed after {got:,} bytes"
                    return
                got += len(chunk)
            time.sleep(0.1)
        server = server_sockets(port).get(s.getsockname()[1])
        said["held"] = bool(server and server[1])
        said["said"] = (f"closed by the server within {SLOW_SPAN} s, "
                        f"{got:,} bytes read by then")
    except OSError as error:
        said["said"] = f"cut after {got:,} bytes ({error})"
    finally:
        s.close()


def head_begun_during_download(port, path, said):
    """A client asks for the 8 MiB file and, 0.3 s later, while it is being
    sent, begins its next request's head; it reads the file in full, then
    sends the rest of the head HEAD_REST s later (under the 10 s request
    timeout, past the 5 s idle one). said["answer"]: what the server sent
    after the file; said["said"]: what went wrong."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=seconds(10))
    except OSError as error:
        said["said"] = f"could not connect ({error})"
        return
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(0.3)
        s.sendall(b"GET /notes.txt HTTP/1.1\r\nHo")
        data, need = bytearray(), None  # appended to in place, not copied
        while need is None or len(data) < need:
            chunk = s.recv(1 << 20)
            if not chunk:
                said["said"] = f"closed after {len(data)} bytes of the file"
                return
            data += chunk
            if need is None and b"\r\n\r\n" in data:
                head, _, _ = data.partition(b"\r\n\r\n")
                length = [line for line in head.split(b"\r\n") if
                          line.lower().startswith(b"content-length:")]
                need = len(head) + 4 + int(length[0].split(b":")[1])
        time.sleep(HEAD_REST)
        try:
            s.sendall(b"st: x\r\n\r\n")
            said["answer"] = bytes(data[need:]) + s.recv(65536)
        except OSError as error:
            said["said"] = f"closed ({error.__class__.__name__})"
            return
        if not said["answer"]:
            said["said"] = "closed with no answer"
        else:
            said["said"] = f"answered {said['answer'][:12]!r}"
    except (OSError, IndexError, ValueError) as error:
        said["said"] = f"failed: {error}"
    finally:
        s.close()


def head_begun_pipelined(port, said):
    """A client sends a whole request and the start of the next in one
    segment, reads the first answer, then sends the rest of the head
    HEAD_REST s later (under the 10 s request timeout, past the 5 s idle
    one). said["answer"]: what the server sent to it; said["said"]: what
    was seen."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=seconds(10))
    except OSError as error:
        said["said"] = f"could not connect ({error})"
        return
    try:
        s.sendall(b"HEAD /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /notes.txt HTTP/1.1\r\nHo")
        if responses(s, 1, limit=SILENCE) != 1:
            said["said"] = "no answer to the first request"
            return
        time.sleep(HEAD_REST)
        try:
            s.sendall(b"st: x\r\n\r\n")
            said["answer"] = s.recv(65536)
        except OSError as error:
            said["said"] = f"closed ({error.__class__.__name__})"
            return
        said["said"] = (f"answered {said['answer'][:12]!r}" if
                        said["answer"] else "closed with no answer")
    except OSError as error:
        said["said"] = f"failed: {error}"
    finally:
        s.close()


@grader.check(5, f"{CROWD:,} clients at once, all answered; out of "
              f"descriptors ({NOFILE} at most), {NOFILE + 20} clients at once: "
              "none left hanging, a new one served after; accept4() failing "
              "with EMFILE (twice), with ENOMEM (once) or ENOBUFS (lasting: "
              "no busy retry), while a client comes: it is served")
def out_of_descriptors(lab):
    raise_open_file_limit()
    report = lab.workdir / "accept_watch"
    report.write_bytes(bytes(16))
    crowd_server = lab.start(env={
        "LD_PRELOAD": str(build_shim(lab, "accept_watch", ACCEPT_WATCH)),
        "LAB_ACCEPT_WATCH": str(report)})
    # An answer first: its edge has the accept loop take the connection
    # the harness made to see the port open (it may sit in the accept
    # queue with no edge of its own), which would add an edge later.
    lab.expect(get(crowd_server.port, "/")[0] == 200, "GET / failed")
    # The cheap cases first (a grading stops at its first failure): one
    # client while accept4() fails, on this server, its queue drained.
    shortage = paused_listener(lab, crowd_server)
    with open(report, "r+b") as counts:  # what the shim saw so far: none
        counts.write(bytes(16))            # of it is the crowd's
    stop_now(crowd_server.pid)  # they all queue meanwhile...
    try:
        crowd = asking_clients(crowd_server.port, CROWD, HEAD)
        # Every request in the server's kernel (so each client is in the
        # accept queue: TCP_DEFER_ACCEPT) before it runs again: a late
        # one would make another edge.
        wait_for(lambda: sum(map(unacked, crowd)), lambda n: n == 0, limit=5)
    finally:
        os.kill(crowd_server.pid, signal.SIGCONT)  # ...one edge for all
    answered, _, _ = first_bytes(crowd, CROWD_WAIT)
    for s in crowd:
        s.close()
    waits, after = struct.unpack("qq", report.read_bytes()[:16])
    crowd_server.terminate()  # its closes are no load on what follows
    lab.expect(answered == CROWD, f"{answered:,} of {CROWD:,} clients that "
               f"connected at once answered within {CROWD_WAIT} s: the "
               "listener's edge came once for all; accept until EAGAIN (a "
               "cap on accepts per wake-up, even MAX_EVENTS, leaves the "
               "rest with no edge to come), or the rest wait for a new "
               "client to come")
    lab.expect(not waits, f"the accept loop stopped after {after:,} "
               f"accepts in a row ({CROWD:,} clients had connected at once) "
               "and the server went back to wait in epoll_wait() with "
               "clients still in the listener's queue: no edge is due for "
               "them (this time another wake-up came by chance); accept "
               "until EAGAIN, with no cap per wake-up")
    server = lab.start(nofile=NOFILE)
    socks = asking_clients(server.port, NOFILE + 20, HEAD)
    _, _, hanging = first_bytes(socks, 3)  # an answer or a close: either
    for s in socks:
        s.close()
    lab.expect(hanging == 0, f"{hanging} of {NOFILE + 20} clients neither "
               f"answered nor closed within 3 s, the server's descriptor "
               f"limit {NOFILE}: out of descriptors, the listener must still "
               "be drained (the accept loop's shedding and pause, kept)")

    def asked():  # refused (shed) until the server has seen those closes
        with contextlib.suppress(OSError):
            return get(server.port, "/")[0]
        return 0
    lab.expect(wait_for(asked, lambda status: status == 200, limit=3) ==
               200, "GET / failed for 3 s once descriptors were free again")
    return shortage


def paused_listener(lab, server):
    """accept4() fails with EMFILE twice (strace's fault injection: the
    accept, and the one after the spare descriptor is given up) as one
    client comes, then works: the accept loop pauses, and must come back
    by itself for the client still in the backlog (a listener unwatched
    and watched again: EPOLL_CTL_ADD reports it ready), since no new edge
    comes. Then the same with one ENOMEM (accept(2): ENOBUFS, ENOMEM, not
    enough memory), an error the starter's loop returns on: the client is
    still queued, and no edge comes for it either. server: one whose accept
    queue was drained by an answer (no connection left there to make
    another edge)."""
    answered, closed = injected_accept_error(server, "EMFILE:when=1..2")
    lab.expect(answered or closed, "a client that came while accept4() "
               f"failed (EMFILE, twice: the spare given up did not help) "
               f"got nothing within {EMFILE_WAIT} s, accept4() working "
               "from its third call on: the listener's edge came once, and "
               "nothing brought the accept loop back after the pause "
               "(unwatch the listener, and watching it again reports it "
               "ready; a watch_fd() that changes nothing makes no "
               "epoll_ctl()); watch it: strace -e inject=accept4:error="
               "EMFILE:when=1..2 -p $(pgrep -x epoll) while one client "
               "comes")
    answered, closed = injected_accept_error(server, "ENOMEM:when=1")
    lab.expect(answered or closed, "a client that came while accept4() "
               f"failed once with ENOMEM got nothing within {EMFILE_WAIT} "
               "s, accept4() working from its second call on: the accept "
               "loop returned on an error other than EAGAIN with the client "
               "still queued, and edge-triggered, no new edge comes for it "
               "(the starter's `return` on any other error was safe only "
               "level-triggered); on ENOMEM or ENOBUFS pause as for EMFILE "
               "(unwatch the listener, watch it again later); watch it: "
               "strace -e inject=accept4:error=ENOMEM:when=1 -p $(pgrep -x "
               "epoll) while one client comes")
    return lasting_shortage(lab, server)


def lasting_shortage(lab, server):
    """accept4() fails with ENOBUFS on every call (strace's fault
    injection: a memory shortage that lasts) while one client comes, and
    then a kept-alive client asks again: it must be answered within
    SHORTAGE_WAIT s (an accept loop that retries at once spins and serves
    nobody); once accept4() works again, the client that came must be
    served within EMFILE_WAIT s (a loop that returned on ENOBUFS left it
    queued with no edge to come)."""
    kept = socket.create_connection(("127.0.0.1", server.port),
                                    timeout=seconds(5))
    late, got = [], {}
    try:
        kept.sendall(HEAD)
        lab.expect(responses(kept, 1, limit=SILENCE) == 1, "no answer")

        def shortage():
            start = time.monotonic()
            late.append(socket.create_connection(("127.0.0.1", server.port),
                                                 timeout=seconds(5)))
            late[0].sendall(HEAD)  # the listener's edge, then the kept one's
            kept.sendall(HEAD)
            got["kept"] = responses(kept, 1, limit=SHORTAGE_WAIT)
            rest = start + SHORTAGE_SPAN - time.monotonic()
            if rest > 0:  # a span to count the tries over
                time.sleep(rest)
            got["start"] = start
        said = _strace(server.pid, ["accept4"], shortage, "-f", "-e",
                       "inject=accept4:error=ENOBUFS:when=1+")
        span = time.monotonic() - got["start"]  # to the tracer's detach
        tries = said.count("accept4(")
        lab.expect(got["kept"] == 1, "while every accept4() failed with "
                   "ENOBUFS (a memory shortage that lasts) and a client "
                   "waited in the listener's queue, a kept-alive client's "
                   f"request got no answer within {SHORTAGE_WAIT:g} s: an "
                   "accept loop that tries again at once spins as long as "
                   "the shortage lasts and serves nobody; on ENOMEM or "
                   "ENOBUFS pause as for EMFILE (unwatch the listener, "
                   "watch it again later); watch it: strace -e inject="
                   "accept4:error=ENOBUFS:when=1+ -p $(pgrep -x epoll) "
                   "while one client comes")
        lab.expect(tries <= 2 + ACCEPT_TRIES * span, f"{tries:,} "
                   f"accept4() calls in {span:.1f} s while every one failed "
                   f"with ENOBUFS (at most {ACCEPT_TRIES} a second; a pause "
                   "of 10 ms makes 100): the accept loop tries again on "
                   "every loop turn, a busy loop that burns a core as long "
                   "as the shortage lasts; do not retry at once, pause as "
                   "for EMFILE (unwatch the listener, watch it again "
                   "EMFILE_PAUSE_MS later)")
        answered, closed, _ = first_bytes(late[:1], EMFILE_WAIT)
        lab.expect(answered or closed, "a client that came while every "
                   "accept4() failed with ENOBUFS got nothing within "
                   f"{EMFILE_WAIT} s once accept4() worked again: the accept "
                   "loop returned on ENOBUFS with the client still queued, "
                   "and no edge comes for it (accept(2): ENOBUFS, ENOMEM, "
                   "not enough memory: both mean pause as for EMFILE, "
                   "unwatch the listener and watch it again later)")
        return (f"{tries} accept4() calls in {span:.1f} s of lasting "
                "ENOBUFS")
    finally:
        kept.close()
        for s in late[:1]:
            s.close()


def injected_accept_error(server, inject):
    """One client comes (and sends a request) while strace injects
    accept4:error=`inject` into the server: (answered, closed) for it
    within EMFILE_WAIT s."""
    late = []

    def one_comes():
        late.append(socket.create_connection(("127.0.0.1", server.port),
                                             timeout=seconds(5)))
        late[0].sendall(HEAD)
        late.append(first_bytes(late[:1], EMFILE_WAIT))
    try:
        _strace(server.pid, ["accept4"], one_comes, "-f", "-e",
                "inject=accept4:error=" + inject)
    finally:
        for s in late[:1]:
            s.close()
    answered, closed, _ = late[1]
    return answered, closed


@grader.check(5, "a request sent one byte at a time")
def bytewise(lab):
    server = lab.start()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n\r\n":
            s.send(bytes([byte]))
            time.sleep(0.002)
        lab.expect(responses(s, 1, limit=3) == 1, "no answer to a request "
                   "sent one byte at a time")
    server.stop()


if __name__ == "__main__":
    grader.main()
