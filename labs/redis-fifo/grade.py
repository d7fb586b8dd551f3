#!/usr/bin/env python3
"""Grader for the redis-fifo lab (labs/redis-fifo/README.md).

Each check probes one way a Redis client inside an event loop goes wrong:
it blocks (static pages wait behind a stalled Redis), its reply clock never
runs or is pushed back by every newcomer (pages wait for ever), its clock is
too short (a Redis that pauses briefly costs pages it should have served),
it hammers a dead Redis (a connect per page instead of a backoff), or it
opens a link per command. Timings have wide margins; counts are exact."""

import ctypes
import fcntl
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import termios
import threading
import time
import urllib.parse

from grading import (HEAP_BLOCKS, Grader, _strace, ab_said, death_telling,  # labs/grading.py
                     build_shim,
                     asking_clients, get, heap_blocks,
                     keepalive_load, wait_for,
                     proc_stat, raise_open_file_limit, seconds,
                     status_field, stopped,
                     strace_count)

STATIC_LIMIT = 0.3  # seconds for a static page while Redis is stalled
CONNECT_LIMIT = 0.07  # seconds for a static page read in the same loop
# turn as a page that starts a connect that hangs (the reference: ms)
RECONNECT_TRIES = 10  # pages, 0.2 s apart, until one connects again (strace)
WAITERS = 3  # guestbook requests parked on the stalled Redis
REPLY_LIMIT = 2.0  # seconds a page may wait on a stalled Redis (it has 1 s)
HANG_LIMIT = 3.0  # seconds for a page that comes while a connect hangs (the
# connect's 1 s clock; one restarted per newcomer: 1 s past the last page)
STREAM = 15  # pages arriving on a stalled Redis, one every STREAM_EVERY s
STREAM_EVERY = 0.2
PAUSE = 0.25  # a Redis pause the server must sit out (its timeout is 1 s)
GONE_PAGES = 60  # pages asked of a dead Redis, one every GONE_EVERY s
GONE_EVERY = 0.05
GONE_CONNECTS = 10  # connects allowed for them: the backoff makes about 5
SILENT_PAGES = 20  # then pages, one every STREAM_EVERY s, on a port that
SILENT_GAP = 2.5  # accepts and never answers: s between two connects (the
# reference: its 1 s reply clock, then its 2 s backoff; a reset: 1.1 s)
AT_ONCE = 0.25  # seconds: a 503 "at once" (no Redis to wait for)
BACKOFF_MAX = 2.0  # the longest backoff (REDIS_BACKOFF_MAX_MS)
BACK = BACKOFF_MAX + 1.0  # seconds after Redis is back: pages are 200 again
LONE_EVERY = 1.2  # s between pages once Redis is back: past the 1 s clock
LONE_PAGES = 4  # of them: one is 200 (at the latest the third)
BIG_TOGETHER = 30  # big posts in one loop turn (180 KB of commands)
BLOCK_SLACK = 10  # heap blocks (malloc less free) a burst may leave
SENDS = 1.5  # send() calls per guestbook page: its answer, and a share of
# the one send a loop turn makes to Redis for every command queued in it
TOGETHER = 20  # pages arriving in one loop turn: one send to Redis for all
CROSSINGS = 3  # times a page's reply, then a new page, come in one turn
FIFO_SLOTS = 64  # FIFO_INITIAL: a FIFO that cannot grow holds this many
AT_ONCE_PAGES = 200  # guestbook pages at once: more waiters than that
CROWD = 10240  # pages waiting out a pause at once: more than MAX_EVENTS
# (1,024) and its multiples up to ten, than 8,192 (the FIFO's 64 doubled
# seven times) and 10,000, and than somaxconn (4,096: clients that each
# sent half a request are the running server's, no backlog bounds them; the
# rest comes while Redis is stalled): past any cap a FIFO might take (the
# grader's descriptors allow 20,000)
HALF = b"GET /guestbook HTTP/1.0\r\n"  # and the rest: b"\r\n"
LEAVE_AFTER = 0.3  # s a keep-alive client waits on a stalled Redis, then
# resets its connection; a new page comes LATE_PAGE s after its page, and
LATE_PAGE = 0.7  # must get its 503 by LEFT_LIMIT s after the first page
LEFT_LIMIT = 1.35  # (the first one's 1 s clock: 1 s; restarted for the
# newcomer because only departed clients wait: 1.7 s)
# A page waits on a stalled Redis, its 1 s clock running, and every
# epoll_wait() of the server is held (strace) EXPIRED_ENTER s on its way in
# and EXPIRED_EXIT s on its way out: a kept client's page, asked for once
# the first page's command is in Redis's queue, is handled in a turn that
# starts past that clock (EXPIRED_ENTER + EXPIRED_EXIT > 1 s), before the
# timers. The first page must get its 503 in that turn: within
# EXPIRED_DELAY + EXPIRED_LIMIT s of the ask (the reference: at most
# EXPIRED_DELAY). A clock that an expired one is taken for no clock
# (rd->deadline <= loop.now) restarts there: 1 s more, and another
# EXPIRED_DELAY for the turn that finds it run out. The ask may come up to
# EXPIRED_ENTER + 1 s after the first page's turn (a busy grader).
EXPIRED_ENTER = 2.0
EXPIRED_EXIT = 0.3
EXPIRED_DELAY = EXPIRED_ENTER + EXPIRED_EXIT
EXPIRED_LIMIT = 0.8
MID_PAUSE = 5000  # ms of CLIENT PAUSE WRITE: reads answered, INCR not
GONE_POSTS = 2000  # big posts while Redis is gone, each answered 503
RECONNECTS = 20  # links Redis drops (CLIENT KILL), each with a big reply read
SHOWN = 100  # GUESTBOOK_SHOWN: remarks on the page (LRANGE's reply)
POSTS = 1000  # big posts arriving in one loop turn: more than the 4 MiB
RAW_CHAR = "\U0001F600"  # 4 bytes of UTF-8, sent raw in guestbook_works
REMARK = "\u20ac" * 2000  # output buffer holds (6 KB of command each)
QUOTED = urllib.parse.quote(REMARK)  # as a browser sends it: once
STRBUF_MAX = 4 << 20  # the link's output buffer: as many commands as fit
# in it (about 690 of them, each RPUSH's size read back from Redis), less
# FIT_SLACK, must be answered 303 (a cap of its own below the buffer's,
# say at 2 MiB, 3.5 MiB or 15/16 of it, refuses more)
FIT_SLACK = 2
LEAK_PAGES = 20000  # keep-alive guestbook pages: nothing kept per page
GHOSTS = [f"ghost{k}" for k in range(8)]  # posts answered 503 in a backoff
FAILED_CONNECTS = 12  # links dropped, the next socket() failing each time
FAILING_PAGES = 40  # pages, one every GONE_EVERY s, while socket() fails
SOCKET_TRIES = 4  # socket() calls for them within TRIES_WITHIN s of the
TRIES_WITHIN = 1.25  # first: backoffs of 100, 200, 400 ms (0.7 s, and the
# pages' 50 ms spacing) that double; a retry_at set again after the failure
# (200, 400, 800 ms) makes the fourth 1.4 s at the earliest, a failure
# counted twice (400, 1600, 2000 ms) 4 s
SOON = 0.6  # s for each of them but the first 3 (AT_ONCE) to get its 503,
# on a busy machine, with strace attached: a page parked with no link waits
# for the next connect or the 1 s clock (by the fourth, 0.8 s at least)
# A malloc() that fails for the FIFO's first growth (64 -> 128 pointers,
# 1,024 bytes) and nothing else the server asks for (fault injection), in
# the library that counts the heap blocks in use (grading.heap_blocks).
COUNTED_MALLOC = "void *malloc(size_t n) { return counted(__libc_malloc(n)); }"
NO_GROWTH = HEAP_BLOCKS.replace(COUNTED_MALLOC, """void *malloc(size_t n)
{
    if (n == 1024) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(__libc_malloc(n));
}""")
assert NO_GROWTH != HEAP_BLOCKS
PAGE = b"GET /guestbook HTTP/1.0\r\n\r\n"
STALL_HOW = ("watch it: redis-cli CLIENT PAUSE 3000, then curl -w "
             "'%{time_total}\\n' http://127.0.0.1:8000/guestbook")
LIBC = ctypes.CDLL(None, use_errno=True)
PIDFD_GETFD = 438  # the syscall: a copy of another process's descriptor
grader = Grader("redis-fifo")


def send_page_requests(port, count):
    """Guestbook GETs sent and left waiting: their sockets."""
    return asking_clients(port, count, PAGE)


def received_until(sock, marker):
    """What sock gave until `marker` came (or it closed)."""
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def status_of(sock):
    """The status of the answer on sock (0: closed without one), then
    closes it; a socket timeout propagates."""
    data = received_until(sock, b"\r\n")
    sock.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def resume_redis(lab):
    """SIGCONT the Redis that lab.stall_redis() stopped."""
    os.kill(lab.redis.proc.pid, signal.SIGCONT)
    lab.stalled = False


def answer_times(port, count, every, limit):
    """Sends a guestbook GET on a new connection every `every` seconds,
    `count` of them, and waits up to `limit` seconds after the last for
    their answers: [(status, seconds from its request to its answer)],
    status 0 and None seconds for a page never answered."""
    sel = selectors.DefaultSelector()
    sent, got = [], {}  # got: {index: (status, seconds)}
    next_at = time.monotonic()
    end = None
    while len(got) < count:
        now = time.monotonic()
        if len(sent) < count and now >= next_at:
            s = socket.create_connection(("127.0.0.1", port),
                                         timeout=seconds(5))
            s.sendall(PAGE)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, (len(sent), b""))
            sent.append(now)
            next_at += every
            if len(sent) == count:
                end = now + seconds(limit)
        if end and now >= end:
            break
        wait = (next_at if len(sent) < count else end) - now
        for key, _ in sel.select(max(wait, 0)):
            k, data = key.data
            chunk = key.fileobj.recv(4096)
            data += chunk
            if chunk and b"\r\n" not in data:
                sel.modify(key.fileobj, selectors.EVENT_READ, (k, data))
                continue
            status = (int(data.split(b" ", 2)[1])
                      if data.startswith(b"HTTP/") else 0)
            got[k] = (status, time.monotonic() - sent[k])
            sel.unregister(key.fileobj)
            key.fileobj.close()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return [got.get(k, (0, None)) for k in range(count)]


def redis_connections(lab):
    """Connections Redis has accepted so far (this question's included)."""
    info = lab.redis.command("INFO", "stats")
    return int(info.split("total_connections_received:")[1].split()[0])


def died_how(code):
    """A Popen return code, in words."""
    return (f"killed by {signal.Signals(-code).name}" if code < 0
            else f"exit {code}")


def link_ready(lab, server):
    """One guestbook page, so the server holds its link to Redis."""
    status = get(server.port, "/guestbook")[0]
    lab.expect(status == 200, f"GET /guestbook answered {status} with Redis "
               "up and idle: is the reply clock too short, or the client not "
               "parked? watch it: curl -i http://127.0.0.1:8000/guestbook")


@grader.check(15, f"Redis stalled, {WAITERS} pages waiting: static files "
              f"answered within {STATIC_LIMIT} s")
def static_not_delayed(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.stall_redis()
    waiting = send_page_requests(server.port, WAITERS)
    time.sleep(seconds(0.05))  # the loop has read them
    slowest = 0.0
    for _ in range(5):
        start = time.monotonic()
        status, _ = get(server.port, "/")
        slowest = max(slowest, time.monotonic() - start)
        lab.expect(status == 200, f"GET / answered {status}")
    for s in waiting:
        s.close()
    lab.expect(slowest <= seconds(STATIC_LIMIT),
               f"the slowest GET / took {slowest:.2f} s while {WAITERS} pages "
               "waited on a stalled Redis: the loop waits for Redis; "
               + STALL_HOW + " beside a curl of /")
    return f"slowest GET / {slowest * 1000:.0f} ms"


@grader.check(10, f"Redis stalled, a page every {STREAM_EVERY} s: each one "
              f"answered 503 within {REPLY_LIMIT} s")
def stalled_pages_fail_fast(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.stall_redis()
    left = left_waiter_then_page(server.port)
    lab.expect(left is not None and left <= seconds(LEFT_LIMIT),
               "a keep-alive client's page waited on a stalled Redis and the "
               f"client left after {LEAVE_AFTER} s (a reset); a new page "
               f"{LATE_PAGE} s after the first was " +
               (f"answered 503 {left:.2f} s after the first page"
                if left is not None else "never answered 503 (within "
                f"{REPLY_LIMIT + 1:.0f} s of its request)") +
               f" (at most {LEFT_LIMIT} s after the first page: its 1 s "
               "clock; with no clock running at all, never): the reply "
               "clock (rd->deadline) must start with the first waiter and "
               "not restart for later ones, not even when every waiter has "
               "left: a departed client's slot still waits for its reply "
               "(the FIFO is empty only when head == tail), so a "
               "stream of impatient clients would keep a hung link alive "
               "for ever; " + STALL_HOW + ", and a curl -m 0.3 before it")
    answers = answer_times(server.port, STREAM, STREAM_EVERY,
                           limit=REPLY_LIMIT + 1)
    unanswered = [k for k, (_, took) in enumerate(answers) if took is None]
    late = [k for k, (_, took) in enumerate(answers)
            if took is not None and took > seconds(REPLY_LIMIT)]
    wrong = sorted({status for status, took in answers
                    if took is not None and status != 503})
    first = answers[0][1]
    lab.expect(not unanswered and not late and not wrong,
               f"of {STREAM} pages on a stalled Redis, {len(unanswered)} never "
               f"answered, {len(late)} after {REPLY_LIMIT} s (the first: "
               + (f"{first:.1f} s" if first is not None else "never") +
               f"), other statuses {wrong}: the reply clock (rd->deadline) "
               "must start with the first waiter and not restart for later "
               "ones; " + STALL_HOW + " while more curls arrive")
    slowest = max(took for _, took in answers)
    resume_redis(lab)  # the link back, then a clock that runs out
    wait_for(lambda: get(server.port, "/guestbook")[0], lambda st: st == 200,
             limit=BACK)
    lab.stall_redis()
    expired = expired_turn(lab, server)
    lab.expect(expired is not None and
               expired <= EXPIRED_DELAY + seconds(EXPIRED_LIMIT),
               "a page waited on a stalled Redis, its 1 s clock running, "
               "every epoll_wait() of the server was held "
               f"{EXPIRED_ENTER} s on its way in and {EXPIRED_EXIT} s on its "
               "way out (strace -e inject=epoll_wait:delay_enter="
               f"{int(EXPIRED_ENTER * 1e6)}:delay_exit="
               f"{int(EXPIRED_EXIT * 1e6)}), and a "
               "kept client asked for a page: that page was handled in a "
               "turn that started past the first page's clock, before the "
               "timers, and the first page was " + (
                   f"answered 503 {expired:.2f} s after that ask"
                   if expired is not None else "never answered 503") +
               f" (at most {EXPIRED_DELAY + EXPIRED_LIMIT:.1f} s: its clock "
               "had run out in that turn): the "
               "reply clock (rd->deadline) starts only when nobody waits "
               "(the FIFO empty, no connect under way), never because it "
               "has run out (rd->deadline <= loop.now): a newcomer in the "
               "turn that finds it run out restarts it, and a steady stream "
               "keeps a hung link for ever; " + STALL_HOW + ", and a curl "
               "every ms beside it")
    return (f"a client gone: 503 {left:.2f} s after its page; slowest 503 "
            f"after {slowest:.2f} s; a clock run out: 503 {expired:.2f} s after "
            f"a page in a turn held {EXPIRED_DELAY} s")


def redis_inbox(lab):
    """A function that returns the bytes waiting to be read (FIONREAD) in
    the connected sockets Redis holds now (copies, pidfd_getfd: a stopped
    Redis reads nothing), and the copies to close; None if the kernel
    gives no copy (then /proc/net/tcp is read, at more cost)."""
    try:
        pidfd = os.pidfd_open(lab.redis.proc.pid)
    except (OSError, AttributeError):
        return None
    copies = []
    try:
        for fd in os.listdir(f"/proc/{lab.redis.proc.pid}/fd"):
            try:
                if not os.readlink(f"/proc/{lab.redis.proc.pid}/fd/{fd}"
                                   ).startswith("socket:"):
                    continue
            except OSError:
                continue
            copy = LIBC.syscall(PIDFD_GETFD, pidfd, int(fd), 0)
            if copy < 0:
                for c in copies:
                    c.close()
                return None
            sock = socket.socket(fileno=copy)
            try:
                sock.getpeername()
                copies.append(sock)
            except OSError:
                sock.close()  # the listener
    finally:
        os.close(pidfd)

    def queued():
        waiting = bytearray(4)
        total = 0
        for sock in copies:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
            total += int.from_bytes(waiting, "little", signed=True)
        return total
    return queued, copies


def redis_queued(port):
    """Bytes waiting in the receive queues of Redis's sockets on port (a
    stopped Redis reads nothing): /proc/net/tcp and tcp6."""
    queued = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (int(fields[1].rsplit(":", 1)[1], 16) == port and
                    fields[3] == "01"):
                queued += int(fields[4].split(":")[1], 16)
    return queued


def expired_turn(lab, server):
    """On a stalled Redis: a kept client (its file read), then, with every
    epoll_wait() of the server held EXPIRED_ENTER s on its way in and
    EXPIRED_EXIT s on its way out (strace), a page on a new connection;
    once its command is in Redis's queue (its clock runs), the kept client
    asks for a page: the turn that handles it starts past the first page's
    clock. The seconds from that ask to the first page's 503, None if none
    came."""
    kept = socket.create_connection(("127.0.0.1", server.port),
                                    timeout=seconds(5))
    with kept:
        kept.sendall(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        read_answer(kept)  # read whole: the server watches it again
        took = []
        inbox = redis_inbox(lab)
        if inbox:
            measure, copies = inbox
        else:
            measure, copies = (lambda: redis_queued(lab.redis.port)), []

        def held():
            queued = measure()
            with socket.create_connection(
                    ("127.0.0.1", server.port),
                    timeout=seconds(EXPIRED_LIMIT + 3 * EXPIRED_DELAY)) \
                    as first:
                first.sendall(PAGE)
                wait_for(measure, lambda n: n > queued,
                         limit=3 * EXPIRED_DELAY)
                kept.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
                asked = time.monotonic()
                try:
                    status = status_of(first)
                except OSError:
                    status = 0
                took.append(time.monotonic() - asked if status == 503
                            else None)

        try:
            _strace(server.pid, ["epoll_wait", "epoll_pwait"], held, "-e",
                    "inject=epoll_wait,epoll_pwait:delay_enter="
                    f"{int(EXPIRED_ENTER * 1e6)}:delay_exit="
                    f"{int(EXPIRED_EXIT * 1e6)}")
        finally:
            for c in copies:
                c.close()
    return took[0]


def read_answer(sock):
    """One answer on a keep-alive connection, its head and its
    Content-Length body read whole (less if the server closes)."""
    end = b"\r\n\r\n"
    head, _, body = received_until(sock, end).partition(end)
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    while length and len(body) < int(length[1]):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk


def left_waiter_then_page(port):
    """On a stalled Redis: a keep-alive client asks for a file, then for a
    page, and leaves (a reset) LEAVE_AFTER s later; a new page comes
    LATE_PAGE s after the first: the seconds from the first page to that
    one's answer (a 503), None if none came."""
    with socket.create_connection(("127.0.0.1", port),
                                  timeout=seconds(5)) as gone:
        gone.sendall(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        read_answer(gone)  # read whole: the server watches it again
        gone.sendall(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
        first = time.monotonic()
        time.sleep(LEAVE_AFTER)
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                        b"\x01\x00\x00\x00\x00\x00\x00\x00")  # a reset
    time.sleep(max(0.0, first + LATE_PAGE - time.monotonic()))
    status, took = answer_times(port, 1, 0, limit=REPLY_LIMIT + 1)[0]
    if took is None or status != 503:
        return None
    return time.monotonic() - first


@grader.check(5, "Redis stalls between a page's commands (its LRANGE "
              f"answered, its INCR not): the page answered 503 within "
              f"{REPLY_LIMIT} s")
def stalled_mid_page(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.redis.command("CLIENT", "PAUSE", MID_PAUSE, "WRITE")  # reads go on
    try:
        answers = answer_times(server.port, 2, REPLY_LIMIT + 0.5,
                               limit=REPLY_LIMIT + 1)
    finally:
        lab.redis.command("CLIENT", "UNPAUSE")
    lab.expect(all(status == 503 and took <= seconds(REPLY_LIMIT)
                   for status, took in answers),
               "two lone pages, one after another, on a Redis that answers "
               "reads but holds writes (their LRANGE answered, their INCR "
               "not) were answered " + ", ".join(
                   f"{status} after {took:.1f} s" if took is not None
                   else "never" for status, took in answers) +
               f": each needs its 503 within {REPLY_LIMIT} s; the reply "
               "clock must start for a page's INCR and GET too, queued from "
               "a reply when nobody else waits; watch it: redis-cli CLIENT "
               "PAUSE 5000 WRITE, then curl -w '%{time_total}\\n' "
               "http://127.0.0.1:8000/guestbook")
    return "503 after " + ", ".join(f"{took:.2f} s" for _, took in answers)


@grader.check(5, f"Redis pauses {PAUSE} s (under its 1 s timeout) with "
              f"{CROWD} pages waiting at once: every one still served, none "
              "refused")
def pause_sat_out(lab):
    raise_open_file_limit()
    server = lab.start()
    link_ready(lab, server)
    # More waiters than any cap (MAX_EVENTS and its multiples; somaxconn):
    # clients that sent half a request are the server's already, whatever
    # the backlog; the rest of each comes while Redis is stalled and the
    # server stopped (they all arrive at once), and Redis resumes PAUSE s
    # after the server has read them all: all are in the FIFO together,
    # the first waiting PAUSE s and more on its 1 s reply clock.
    for attempt in (1, 2):  # a busy machine can make a reply miss its 1 s
        crowd = asking_clients(server.port, CROWD, HALF)
        lab.stall_redis()
        with stopped(server.pid):
            for s in crowd:
                s.sendall(b"\r\n")
        wait_for(lambda: proc_stat(server.pid), lambda st: st is None or
                 st[0] == "S", limit=3)  # it has read them all: it sleeps
        time.sleep(PAUSE)  # not stretched: the server's clock does not
        resume_redis(lab)
        statuses = [status_of_or_0(s) for s in crowd]
        if statuses == [200] * CROWD:
            return "all 200" + ("" if attempt == 1 else " on a second try")
        wait_for(lambda: get(server.port, "/guestbook")[0],
                 lambda st: st == 200, limit=BACK)  # the link back, if lost
    lab.expect(False, f"{statuses.count(200)} of {CROWD} pages 200 (others: "
               f"{sorted(set(statuses) - {200})}), on the second of two "
               f"tries, all {CROWD} waiting at once on a Redis paused for "
               f"{PAUSE} s, which has REDIS_TIMEOUT_MS (1 s) to answer (each "
               "client had sent half its request before, so no backlog "
               "bounds them): the reply clock is too short, or the FIFO did "
               f"not grow past its first {FIFO_SLOTS} waiters, or it "
               "refuses waiters past a cap of its own (it has none: any "
               "number of clients, MAX_EVENTS and many times more, can wait "
               "on a busy server; only a malloc() that fails refuses one); "
               f"watch it: redis-cli CLIENT PAUSE 250 while ab -n {CROWD} "
               f"-c {CROWD} http://127.0.0.1:8000/guestbook")


@grader.check(10, f"Redis gone: {GONE_PAGES} pages answered 503 at once, "
              f"with at most {GONE_CONNECTS} connects (a backoff); then a "
              f"Redis that accepts and never answers: no two connects "
              f"within {SILENT_GAP} s")
def dead_redis_backoff(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.redis.stop()
    holder = refusing(lab.redis.port)
    answers = []
    try:
        try:
            calls = strace_count(server.pid, ["connect"],
                                 lambda: answers.extend(answer_times(
                                     server.port, GONE_PAGES, GONE_EVERY,
                                     limit=2)))
        except ConnectionRefusedError:
            code = server.proc.wait(timeout=seconds(5))
            lab.expect(False, f"the server died ({died_how(code)}) once "
                       "Redis was gone: a client still in the FIFO after its "
                       "503? run it under make asan and stop redis-server")
        statuses = sorted({status for status, _ in answers})
        slow = [took for _, took in answers
                if took is None or took > seconds(AT_ONCE)]
        lab.expect(statuses == [503] and not slow,
                   f"statuses {statuses}, {len(slow)} pages slower than "
                   f"{AT_ONCE} s with Redis gone: a 503 comes at once while "
                   "the link backs off (no client parked without a link)")
        connects = calls.get("connect", 0)
        lab.expect(connects <= GONE_CONNECTS,
                   f"{connects} connects to a dead Redis for {GONE_PAGES} "
                   f"pages in {GONE_PAGES * GONE_EVERY:.1f} s: no backoff "
                   "(retry_at), or one reset before Redis ever answered (a "
                   "non-blocking connect() that says EINPROGRESS is no sign "
                   "Redis is up); watch them: stop redis-server, then strace "
                   "-e trace=connect -p $(pgrep -x epoll) during ab -n 60 "
                   "http://127.0.0.1:8000/guestbook")
        gaps = silent_connect_gaps(server, holder)
    finally:
        holder.close()
    short = [gap for gap in gaps if gap < SILENT_GAP]
    lab.expect(not short, f"connects to a Redis that accepts and never "
               f"answers, after it was gone (the backoff at "
               f"{BACKOFF_MAX:.0f} s by then), {short[0] if short else 0:.1f}"
               f" s apart, under {SILENT_GAP} s (its 1 s reply clock, then "
               "the backoff): the backoff was reset without a reply (a link "
               "that connects is no sign Redis answers: only a reply is); "
               "watch it: kill -STOP redis-server, then strace -r -e "
               "trace=connect -p $(pgrep -x epoll) while curl asks for "
               "/guestbook every 0.2 s")
    return (f"{connects} connects; then "
            + (", ".join(f"{gap:.1f}" for gap in gaps) or "no")
            + " s between connects to a silent Redis")


def silent_connect_gaps(server, holder):
    """Lets holder (the stopped Redis's port) accept connections, and never
    answers them, while SILENT_PAGES pages come one every STREAM_EVERY s:
    the seconds between one connect to it and the next."""
    holder.listen(16)
    holder.settimeout(0.02)
    accepted, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append((time.monotonic(), holder.accept()[0]))
            except socket.timeout:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        answer_times(server.port, SILENT_PAGES, STREAM_EVERY,
                     limit=REPLY_LIMIT)
    finally:
        done.set()
        thread.join()
        for _, conn in accepted:
            conn.close()
    return [b[0] - a[0] for a, b in zip(accepted, accepted[1:])]


def consecutive(lab, server, after):
    """Five guestbook pages one after another: each 200, with visitor
    counts one apart (replies that no longer match their clients break
    either)."""
    counts = []
    for _ in range(5):
        status, page = get(server.port, "/guestbook")
        found = re.search(rb"Visitors so far: (\d+)", page)
        counts.append((status, int(found[1]) if found else None))
    lab.expect(all(st == 200 for st, _ in counts) and all(
        b[1] is not None and a[1] is not None and b[1] == a[1] + 1
        for a, b in zip(counts, counts[1:])),
        f"{after}: 5 pages one after another gave {counts} (status, "
        "visitor count): the replies no longer match the clients; cut a "
        "command that cannot be queued back out of rd->out")


def refusing(port):
    """A socket that holds a stopped Redis's port, unlistening: every
    connect is refused at once, and no other program takes the port."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    return holder


@grader.check(5, f"Redis gone, then back while pages keep coming: 503s at "
              f"once, then 200s within {BACK:.0f} s of its return")
def backoff_recovers(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.redis.stop()
    holder = refusing(lab.redis.port)
    try:
        down = answer_times(server.port, 25, 0.1, limit=1)
    finally:
        holder.close()
    slow = [took for status, took in down
            if status != 503 or took is None or took > seconds(AT_ONCE)]
    lab.expect(not slow, f"{len(slow)} of 25 pages with Redis gone were not "
               f"answered 503 within {AT_ONCE} s")
    lab.redis.start()  # the same port
    back = time.monotonic()
    # Lone pages, each past the last one's 1 s reply clock: a 503 in the
    # backoff must leave no deadline running, which would fail the link
    # again with nobody waiting and push the next connect back.
    seen = []
    for k in range(LONE_PAGES):
        time.sleep(max(0.0, back + k * LONE_EVERY - time.monotonic()))
        status, _ = get(server.port, "/guestbook")
        seen.append(status)
        if status == 200:
            return f"200 again {time.monotonic() - back:.1f} s after"
    lab.expect(False, f"no 200 within {(LONE_PAGES - 1) * LONE_EVERY:.1f} s "
               f"of Redis coming back, for pages {LONE_EVERY} s apart "
               f"({seen}): the backoff is at most {BACKOFF_MAX:.0f} s; does "
               "each page push the next connect back (a failure counted per "
               "page, a client parked with no link, or a reply clock "
               "(rd->deadline) started for a page answered 503 at once, "
               "which fails the link again 1 s later with nobody waiting)? "
               "watch it: stop redis-server, curl in a loop, start it "
               "again, then curl every 1.2 s")


WAITING = ("poll", "ppoll", "select", "pselect6", "nanosleep",
           "clock_nanosleep", "epoll_create", "epoll_create1", "epoll_wait",
           "epoll_pwait")  # calls that can make the loop wait (with strace)
LOOP_WAITS = ("epoll_wait(", "epoll_pwait(", "restart_syscall(")


def waits_on_connect(text, port):
    """From strace's lines of the server's connect() and of the calls that
    can wait (WAITING): the first one that waits (a timeout other than 0,
    a sleep, an epoll of its own) between the connect to Redis (port) and
    the loop's next epoll_wait, None if none does (or no connect)."""
    lines = text.splitlines()
    epfds = [m[1] for m in (re.match(r"epoll_p?wait\((\d+),", line)
                            for line in lines) if m]
    loop_fd = max(set(epfds), key=epfds.count) if epfds else None
    after = False
    for line in lines:
        if line.startswith("connect(") and f"htons({port})" in line:
            after = True
            continue
        if not after:
            continue
        found = re.match(r"epoll_p?wait\((\d+),", line)
        if line.startswith(LOOP_WAITS) and (not found or found[1] == loop_fd):
            after = False  # the loop's next turn
            continue
        name = line.split("(", 1)[0]
        if name not in WAITING or "<unfinished" in line:
            continue
        if name in ("poll", "epoll_wait", "epoll_pwait"):
            timeout = re.search(r", (-?\d+)(?:, [^,]*)?\)\s+=", line)
            if timeout and timeout[1] == "0":
                continue
        elif name in ("ppoll", "select", "pselect6"):
            if re.search(r"\{tv_sec=0, tv_u?n?sec=0\}", line):
                continue
        return line.strip()[:120]
    return None


@grader.check(10, "a connect to Redis that hangs (its SYNs unanswered) "
              f"blocks nothing: a static page in the same turn answered "
              f"within {CONNECT_LIMIT} s, the page 503 in 3 s, a page "
              f"every {STREAM_EVERY} s meanwhile each 503 within "
              f"{HANG_LIMIT:.0f} s, and no wait on the connect (strace)")
def connect_never_blocks(lab):
    lab.redis.stop()
    holder = socket.socket()  # a port whose accept queue is full: the
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", lab.redis.port))  # kernel drops new SYNs
    holder.listen(0)
    fillers = []
    try:
        for _ in range(3):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", lab.redis.port))
            fillers.append(f)
        time.sleep(0.1)
        server = lab.start()
        # The page, then a static GET, come in one loop turn (accepted and
        # read in that order): the page starts the connect, and the GET is
        # answered right after it, with no wait on the connect at all.
        with stopped(server.pid):
            page = send_page_requests(server.port, 1)[0]
            static = asking_clients(server.port, 1,
                                    b"GET / HTTP/1.0\r\n\r\n")[0]
        start = time.monotonic()
        static.settimeout(3)
        try:
            status = status_of(static)
        except OSError:
            status = 0
        took = time.monotonic() - start
        lab.expect(status == 200 and took <= seconds(CONNECT_LIMIT),
                   f"GET / answered {status} after {took:.3f} s, read in the "
                   "loop turn of a page whose connect to Redis hangs (at "
                   f"most {CONNECT_LIMIT} s): the loop waited on the connect "
                   "(a blocking connect(), or a poll() to give it a grace "
                   "period); redis_connect() connects without waiting, and "
                   "the link's EPOLLOUT says when it is done")
        took_static = took
        # Pages keep coming while the connect hangs (and the connects after
        # it, each started once the backoff is over): each waits on its
        # connect's own 1 s clock, which a newcomer does not restart.
        stream = answer_times(server.port, STREAM, STREAM_EVERY,
                              limit=HANG_LIMIT + 1)
        page.settimeout(seconds(REPLY_LIMIT + 1))
        try:
            got = status_of(page)
        except OSError:
            got = 0
        late = [(k, status, took) for k, (status, took) in enumerate(stream)
                if status != 503 or took is None
                or took > seconds(HANG_LIMIT)]
        lab.expect(not late, f"of {STREAM} pages, one every {STREAM_EVERY} "
                   "s while connects to Redis hang (its SYNs unanswered), "
                   f"{len(late)} were not answered 503 within {HANG_LIMIT} "
                   "s (" + ", ".join(
                       f"page {k}: {status or 'nothing'}" + (
                           f" after {took:.1f} s" if took is not None else "")
                       for k, status, took in late[:3]) + "; the page that "
                   f"started the first connect: {got or 'nothing'}): a page "
                   "that comes while the link is connecting waits on the "
                   "connect's own clock (redis_connect() sets rd->deadline); "
                   "restarting it for each newcomer keeps a hanging connect "
                   "alive for as long as pages keep coming; set it only when "
                   "the FIFO was empty and no connect is under way")
        lab.expect(got == 503, f"the guestbook page waiting on a connect "
                   f"that hangs was answered {got or 'nothing'} within "
                   f"{REPLY_LIMIT + 1:.0f} s: the connect has the reply "
                   "deadline too")
        waited = None
        for _ in range(RECONNECT_TRIES):  # once the backoff (100 ms) is over
            trace = _strace(server.pid, ["connect", *WAITING], lambda: (
                answer_times(server.port, 1, 0, limit=REPLY_LIMIT + 1)))
            if f"htons({lab.redis.port})" in trace:
                waited = waits_on_connect(trace, lab.redis.port)
                break
            time.sleep(0.2)
    finally:
        for f in fillers:
            f.close()
        holder.close()
    lab.expect(waited is None, "the loop waited on a connect to Redis that "
               f"hangs, before its next epoll_wait: {waited} (strace): no "
               "wait at all, not even a short one (a grace period for a "
               "connect that is quick on localhost stalls every client of "
               "the server on each reconnect to a Redis that does not "
               "answer); redis_connect() connects without waiting, and the "
               "link's EPOLLOUT says when it is done; watch it: strace -e "
               "trace=connect,poll,epoll_wait -p $(pgrep -x epoll)")
    return (f"GET / in {took_static * 1000:.0f} ms, slowest of the stream "
            f"{max(took for _, took in stream):.2f} s")


def redis_sends_in_turns(text):
    """From strace's lines of the loop's epoll_wait and sendto calls (one
    thread): the loop turns that sent to Redis twice, the first send taking
    all it was given (a second one then is not the rest of a partial send
    but a send of its own), and the turns that sent to Redis at all."""
    doubled, sending, sends = 0, 0, []
    for line in text.splitlines() + ["epoll_wait("]:
        if line.startswith(("epoll_wait(", "epoll_pwait(")):
            full = [whole for whole, _ in sends]
            doubled += any(full[:-1])
            sending += bool(sends)
            sends = []
            continue
        found = re.match(r'sendto\(\d+, "\*.*, (\d+), [^,]+, NULL, 0\)'
                         r"\s+=\s+(-?\d+)", line)
        if found:  # a RESP command: a send to Redis
            sends.append((found[1] == found[2], line))
    return doubled, sending


@grader.check(5, f"commands go to Redis together: at most {SENDS} send() "
              "calls per guestbook page under ab -k -c 50, and no loop turn "
              "sends to Redis twice")
def one_send_per_turn(lab):
    server = lab.start()
    link_ready(lab, server)
    pages = 2000
    trace = _strace(server.pid, ["epoll_wait", "epoll_pwait", "sendto"],
                    lambda: keepalive_load(lab, server.port, pages, 50,
                                           path="/guestbook"))
    per = sum(line.startswith("sendto(")
              for line in trace.splitlines()) / pages
    lab.expect(per <= SENDS, f"{per:.2f} send() calls per guestbook page "
               "(its answer, and a send to Redis per command?): queue each "
               "command in the link's output buffer, which the loop sends "
               "once a turn for all (the pipelining); watch: strace -c -e "
               "trace=sendto -p PID under ab -k -n 2000 -c 50 .../guestbook")
    statuses = []

    def together():  # the link idle, then TOGETHER pages in one loop turn
        with stopped(server.pid):
            socks = send_page_requests(server.port, TOGETHER)
        for s in socks:
            s.settimeout(seconds(5))
        statuses.extend(status_of_or_0(s) for s in socks)

    doubled, sending = redis_sends_in_turns(_strace(
        server.pid, ["epoll_wait", "epoll_pwait", "sendto"], together))
    lab.expect(statuses == [200] * TOGETHER, f"{TOGETHER} pages in one loop "
               f"turn were answered {sorted(set(statuses))}")
    lab.expect(sending and not doubled, f"{TOGETHER} pages came in one loop "
               f"turn on an idle link: {doubled} of {sending} loop turns "
               "sent to Redis twice (a send of its own for the first "
               "command, when nobody waited, and the turn's send for the "
               "others?): redis_queue() only queues, and the loop's one "
               "redis_send() a turn carries every command of it; watch: "
               "strace -e trace=epoll_wait,sendto -p PID during ab -n 20 "
               "-c 20 .../guestbook")
    posted = []

    def big_together():  # BIG_TOGETHER big posts (6 KB commands), one turn
        _, post = big_post()
        with stopped(server.pid):
            socks = asking_clients(server.port, BIG_TOGETHER, post)
        for s in socks:
            s.settimeout(seconds(5))
        posted.extend(status_of_or_0(s) for s in socks)

    big_doubled, big_sending = redis_sends_in_turns(_strace(
        server.pid, ["epoll_wait", "epoll_pwait", "sendto"], big_together))
    lab.expect(posted == [303] * BIG_TOGETHER, f"{BIG_TOGETHER} big posts in "
               f"one loop turn were answered {sorted(set(posted))}")
    lab.expect(big_sending and not big_doubled, f"{BIG_TOGETHER} big posts "
               f"(6 KB of command each) came in one loop turn: "
               f"{big_doubled} of {big_sending} loop turns sent to Redis "
               "twice or more (a send once some KiB are queued, then the "
               "turn's send?): big commands are pipelined too, the loop's "
               "one redis_send() a turn carries them all (the 4 MiB buffer "
               "is what bounds them)")
    crossed = []

    def crossings():  # a reply, then a new page, read in one loop turn
        for _ in range(2 * CROSSINGS):  # a busy machine can cost a 1 s clock
            lab.redis.command("CLIENT", "PAUSE", MID_PAUSE, "WRITE")
            try:  # the first page's LRANGE answered, its INCR held
                first = send_page_requests(server.port, 1)[0]
                wait_for(lambda: redis_blocked(lab), lambda n: n > 0,
                         limit=3)
                with stopped(server.pid):
                    lab.redis.command("CLIENT", "UNPAUSE")
                    # (a loaded machine can hand packets over late: wait
                    # until each is in the server's socket, in order)
                    readable(server.pid, lambda sock: sock.getpeername()[1]
                             == lab.redis.port)  # the INCR's reply
                    second = send_page_requests(server.port, 1)[0]
                    readable(server.pid, lambda sock: sock.getsockopt(
                        socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
            finally:
                lab.redis.command("CLIENT", "UNPAUSE")
            for sock in (first, second):
                sock.settimeout(seconds(5))
            crossed.append((status_of_or_0(first), status_of_or_0(second)))
            if crossed.count((200, 200)) == CROSSINGS:
                return
            if crossed[-1] != (200, 200):  # the link back, if it was lost
                wait_for(lambda: get(server.port, "/guestbook")[0],
                         lambda st: st == 200, limit=BACK)

    cross_doubled, cross_sending = redis_sends_in_turns(_strace(
        server.pid, ["epoll_wait", "epoll_pwait", "sendto"], crossings))
    lab.expect((200, 200) in crossed and
               {st for pair in crossed for st in pair} <= {200, 503},
               f"a page's reply and a new page in one loop turn, "
               f"{len(crossed)} times: the pages were answered {crossed}")
    lab.expect(cross_sending and not cross_doubled, f"{len(crossed)} times, "
               "a page's reply (its INCR's) and a new page came in one loop "
               f"turn, the reply first: {cross_doubled} of "
               f"{cross_sending} loop turns sent to Redis twice (the first "
               "page's GET sent as soon as the INCR's reply was read, then "
               "the new page's LRANGE in the turn's send?): a command queued "
               "from a reply waits for the loop's one redis_send() at the "
               "end of the turn too, with the others; watch: strace -e "
               "trace=epoll_wait,sendto -p PID during ab -k -n 2000 -c 50 "
               ".../guestbook")
    load_doubled, load_sending = redis_sends_in_turns(trace)
    lab.expect(load_sending and not load_doubled, f"under ab -k -n {pages} "
               f"-c 50: {load_doubled} of {load_sending} loop turns sent to "
               "Redis twice (a send right after the replies are read, for "
               "the next steps of the pages they answered, then the turn's "
               "send for the pages that came in it?): whatever is queued, "
               "from a new page or from a reply, waits for the loop's one "
               "redis_send() at the end of the turn; watch: strace -e "
               "trace=epoll_wait,sendto -p PID during ab -k -n 2000 -c 50 "
               ".../guestbook")
    return f"{per:.2f} per page"


def readable(pid, which, limit=3):
    """Waits up to limit seconds for the socket of process pid that
    which(socket) picks (a copy of it, pidfd_getfd, looked at and closed)
    to have something to read (a listener: a client to accept). False if
    it does not, or the kernel gives no copy (then the check runs without
    this wait, as it would on an idle machine)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return False
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(
                        "socket:"):
                    continue
            except OSError:
                continue
            copy = LIBC.syscall(PIDFD_GETFD, pidfd, int(fd), 0)
            if copy < 0:  # no pidfd_getfd (ENOSYS, EPERM)
                return False
            with socket.socket(fileno=copy) as sock:
                try:
                    if not which(sock):
                        continue
                except OSError:
                    continue
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                return bool(poller.poll(seconds(limit) * 1000))
    finally:
        os.close(pidfd)
    return False


def redis_blocked(lab):
    """Clients whose command Redis holds (CLIENT PAUSE WRITE)."""
    info = lab.redis.command("INFO", "clients")
    return int(info.split("blocked_clients:")[1].split()[0])


@grader.check(5, f"a FIFO that cannot grow (malloc fails past {FIFO_SLOTS} "
              "waiters): those clients get 503, every later reply is right")
def fifo_full_cut_back(lab):
    env, blocks = heap_blocks(lab)  # its counter, with a malloc that
    # also fails for the FIFO's growth
    shim = build_shim(lab, "no_growth", NO_GROWTH)
    server = lab.start(env={**env, "LD_PRELOAD": str(shim)})
    link_ready(lab, server)
    first = blocks()
    lab.stall_redis()  # they all wait: the FIFO fills past its 64
    with stopped(server.pid):  # all of them in one loop turn
        socks = send_page_requests(server.port, 2 * FIFO_SLOTS)
    time.sleep(seconds(0.2))
    resume_redis(lab)
    statuses = [status_of(s) for s in socks]
    lab.expect(set(statuses) <= {200, 503} and statuses.count(200) >= 32,
               f"{statuses.count(200)} pages 200 and {statuses.count(503)} "
               f"503 of {2 * FIFO_SLOTS} that came in one loop turn, others "
               f"{sorted(set(statuses) - {200, 503})}: the {FIFO_SLOTS} the "
               "FIFO holds must be served; a client it cannot take costs "
               "that one client only (its command cut back out of rd->out, "
               "nothing queued before it, and the link kept)")
    consecutive(lab, server, "after clients the FIFO could not take (a "
                "command left in rd->out when fifo_push() failed?)")
    more = wait_for(lambda: blocks() - first, lambda n: n <= BLOCK_SLACK,
                    limit=3)
    lab.expect(more <= BLOCK_SLACK, f"{more:+} heap blocks in use (malloc "
               f"less free, at most {BLOCK_SLACK}) after "
               f"{statuses.count(503)} clients the FIFO could not take were "
               "answered 503, every client gone: the command built for a "
               "client that fifo_push() refused is not freed on the way to "
               "its 503")
    return f"{statuses.count(200)} pages 200, {more:+} blocks"


def resp_command(*args):
    """The RESP bytes of a command (resp_format's)."""
    words = [a.encode() for a in args]
    return b"*%d\r\n" % len(words) + b"".join(
        b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def overflow_once(lab, server):
    """POSTS big posts, each with a name of its own, sent while the server
    is stopped (one loop turn): None if each one answered 303 is saved,
    each one saved was answered 303, the rest are 503 and at least as many as fit
    are 303; else what was seen."""
    before = int(lab.redis.command("LLEN", "guestbook:remarks") or 0)
    names = [f"p{k:04d}" for k in range(POSTS)]  # who each post is
    socks = []
    with stopped(server.pid):  # all of them ready for the same turn
        for name in names:
            body = (f"guest-name={name}&guest-remarks=" +
                    QUOTED).encode()
            socks += asking_clients(server.port, 1, (
                b"POST /guestbook HTTP/1.1\r\nHost: x\r\nConnection: close"
                b"\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)) + body)
    statuses = [status_of(s) for s in socks]
    entries = lab.redis.command("LRANGE", "guestbook:remarks", before, -1)
    saved = sorted(e.split(":", 1)[1][:5] for e in entries or [])
    told = sorted(n for n, st in zip(names, statuses) if st == 303)
    longest = max((len(resp_command("RPUSH", "guestbook:remarks", e))
                   for e in entries or []), default=1)
    fits = STRBUF_MAX // longest - FIT_SLACK
    if (set(statuses) <= {303, 503} and 503 in statuses and
            len(told) >= fits and saved == told):
        return None
    lost = len(set(told) - set(saved))  # 303, and not saved
    hidden = len(set(saved) - set(told))  # saved, and answered otherwise
    return (f"{len(told)} posts answered 303 and {statuses.count(503)} 503 "
            f"(others: {sorted(set(statuses) - {303, 503})}), {len(saved)} "
            f"saved; {lost} answered 303 were not saved, {hidden} saved "
            f"were not answered 303 (at least {fits} must be 303: "
            f"{STRBUF_MAX} bytes of rd->out hold {fits + FIT_SLACK} of "
            f"these {longest}-byte RPUSH commands): the "
            "commands that fit must stay queued for their own "
            "clients (the 4 MiB buffer is the only bound: no cap of its "
            "own below it refuses posts that fit), and one that did not fit "
            "must be cut back out whole, nothing else with it (rd->out "
            "back to where it was before this command, not emptied, and the "
            "link kept)")


@grader.check(5, f"{POSTS} big posts in one loop turn overflow the link's "
              "output buffer: each is 303 and saved, or 503 and not")
def buffer_full_cut_back(lab):
    raise_open_file_limit()
    env, blocks = heap_blocks(lab)  # a preloaded malloc that counts
    server = lab.start(env=env)
    link_ready(lab, server)
    first = blocks()
    for attempt in (1, 2):  # a busy machine can make the 1 s run out
        said = overflow_once(lab, server)
        if said is None:
            break
        until = time.monotonic() + seconds(BACK)  # the link back, if lost
        while (time.monotonic() < until and
               get(server.port, "/guestbook")[0] != 200):
            time.sleep(0.1)
    lab.expect(said is None, "on two tries, the second: " + (said or "") +
               ("; none was 503: did the buffer ever overflow (commands sent "
                "before the turn's end?)" if said and " 0 503" in said
                else ""))
    consecutive(lab, server, "after the output buffer overflowed")
    more = wait_for(lambda: blocks() - first, lambda n: n <= BLOCK_SLACK,
                    limit=3)
    lab.expect(more <= BLOCK_SLACK, f"{more:+} heap blocks in use (malloc "
               f"less free, at most {BLOCK_SLACK}) after {POSTS} big posts, "
               "those that did not fit answered 503, every client gone: "
               "something built for a command (a scratch buffer?) is not "
               "freed on the way to its 503; watch: valgrind --leak-check="
               "full ./epoll 8000 during the burst")
    return ("first try" if attempt == 1 else "second try") + f", {more:+} blocks"


@grader.check(5, f"{LEAK_PAGES} keep-alive guestbook pages leave no memory "
              "behind")
def no_leak_per_page(lab):
    server = lab.start()
    link_ready(lab, server)
    keepalive_load(lab, server.port, LEAK_PAGES // 5, 50, path="/guestbook")
    before = status_field(server.pid, "VmSize")
    keepalive_load(lab, server.port, LEAK_PAGES, 50, path="/guestbook")
    grown = status_field(server.pid, "VmSize") - before
    lab.expect(grown <= 8192, f"{grown} KiB more address space after "
               f"{LEAK_PAGES} guestbook pages: something each command takes "
               "is never given back")
    return f"{grown:+} KiB"


def post_named(name, remark):
    """A POST /guestbook (Connection: close) by guest `name`."""
    body = f"guest-name={name}&guest-remarks={remark}".encode()
    return (b"POST /guestbook HTTP/1.1\r\nHost: x\r\nConnection: close"
            b"\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def status_of_or_0(sock):
    """status_of(sock), 0 if it timed out or failed."""
    try:
        return status_of(sock)
    except OSError:
        sock.close()
        return 0


def big_post():
    """A POST /guestbook with a 2,000-character remark (a 6 KB command)."""
    body = ("guest-name=big&guest-remarks=" +
            QUOTED).encode()
    return body, (b"POST /guestbook HTTP/1.1\r\nHost: x\r\nConnection: "
                  b"close\r\nContent-Type: application/x-www-form-urlencoded"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def posts_by_ab(lab, port, count):
    """`ab -c 10` of count big posts (answers not judged): the run."""
    body, _ = big_post()
    form = lab.workdir / "post.form"
    form.write_bytes(body)
    done = subprocess.run(
        ["ab", "-q", "-n", str(count), "-c", "10", "-s",
         str(int(seconds(30))), "-p", str(form), "-T",
         "application/x-www-form-urlencoded",
         f"http://127.0.0.1:{port}/guestbook"],
        capture_output=True, text=True, timeout=seconds(120))
    lab.expect(done.returncode == 0 and
               f"Complete requests:      {count}" in done.stdout,
               f"ab -n {count} of big posts failed: " + ab_said(done))
    return done


@grader.check(5, f"Redis gone: {GONE_POSTS} big posts, each answered 503, "
              "leave no memory behind")
def no_leak_while_gone(lab):
    server = lab.start()
    link_ready(lab, server)
    lab.redis.stop()
    holder = refusing(lab.redis.port)
    try:
        posts_by_ab(lab, server.port, GONE_POSTS // 5)
        before = status_field(server.pid, "VmSize")
        said = posts_by_ab(lab, server.port, GONE_POSTS)
        grown = status_field(server.pid, "VmSize") - before
    finally:
        holder.close()
    lab.expect(re.search(rf"Non-2xx responses: +{GONE_POSTS}\n", said.stdout),
               f"of {GONE_POSTS} big posts with Redis gone, not every one "
               "was answered with an error (503): " + ab_said(said))
    lab.expect(grown <= 8192, f"{grown} KiB more address space after "
               f"{GONE_POSTS} big posts (2,000-character remarks) answered "
               "503 while Redis was gone: a command built for a post and "
               "never given back on the way to its 503; watch it: stop "
               "redis-server, then grep VmData /proc/$(pgrep -x epoll)/status"
               " around ab -n 2000 -p form.txt -T application/x-www-form-"
               "urlencoded http://127.0.0.1:8000/guestbook")
    return f"{grown:+} KiB"


@grader.check(5, f"Redis drops the link {RECONNECTS} times (CLIENT KILL), "
              "each after a big reply: the reconnects leave no memory "
              "behind")
def no_leak_per_reconnect(lab):
    raise_open_file_limit()
    env, blocks = heap_blocks(lab)  # a preloaded malloc that counts
    server = lab.start(env=env)
    link_ready(lab, server)
    _, post = big_post()  # the page's LRANGE reply: about 600 KB
    for s in asking_clients(server.port, SHOWN, post):
        status_of(s)

    def reconnect():
        lab.redis.command("CLIENT", "KILL", "TYPE", "normal")
        start = time.monotonic()
        while time.monotonic() - start < seconds(BACK):
            time.sleep(0.12)  # the backoff after a healthy link: 100 ms
            if get(server.port, "/guestbook")[0] == 200:
                return
        lab.expect(False, f"no guestbook page 200 within {BACK:.0f} s of "
                   "Redis dropping the link (CLIENT KILL TYPE normal): the "
                   "link must come back after its backoff")

    for _ in range(3):
        reconnect()
    before = status_field(server.pid, "VmSize")
    first = blocks()
    for _ in range(RECONNECTS):
        reconnect()
    grown = status_field(server.pid, "VmSize") - before
    more = wait_for(lambda: blocks() - first, lambda n: n <= BLOCK_SLACK // 2,
                    limit=3)
    lab.expect(more <= BLOCK_SLACK // 2, f"{more:+} heap blocks in use "
               f"(malloc less free, at most {BLOCK_SLACK // 2}) after Redis "
               f"dropped the link {RECONNECTS} times: a buffer of the old "
               "link (rd->out, rd->in) dropped unfreed at each reconnect "
               "(reset to {0} instead of emptied or freed)")
    lab.expect(grown <= 8192, f"{grown} KiB more address space after Redis "
               f"dropped the link {RECONNECTS} times, each after a page whose "
               "LRANGE reply is 600 KB: the link's buffers (rd->in, rd->out) "
               "are reused by the next link or freed, never dropped unfreed; "
               "watch it: grep VmData /proc/$(pgrep -x epoll)/status around "
               "a loop of curl .../guestbook; redis-cli CLIENT KILL TYPE "
               "normal")
    return f"{grown:+} KiB, {more:+} blocks"


@death_telling(grader, "strace -f -e inject=socket:error=EMFILE -p "
               "$(pgrep -x epoll) while curl asks for /guestbook")(
    5, "Redis's socket() failing: pages and posts answered 503 at "
              "once, none of them reaches Redis once it works again, and "
              "nothing is left behind")
def connect_fails_at_once(lab):
    env, blocks = heap_blocks(lab)  # a preloaded malloc that counts
    server = lab.start(env=env)  # no link yet: the first page connects
    got, posts = [], []

    def refused():
        got.extend(answer_times(server.port, FAILING_PAGES, GONE_EVERY,
                                limit=2))
        # Posts in one loop turn: the first finds the backoff over and its
        # connect fails at once (socket()), or the backoff still runs; the
        # others come while it does, whatever the machine's pace.
        with stopped(server.pid):
            for name in GHOSTS:
                posts.extend(asking_clients(server.port, 1, post_named(
                    name, "backoff")))
        for s in posts:
            s.settimeout(seconds(REPLY_LIMIT))
        posts[:] = [status_of_or_0(s) for s in posts]

    trace = _strace(server.pid, ["socket"], refused, "-f", "-ttt", "-e",
                    "inject=socket:error=EMFILE")  # every socket() fails
    # The first pages at once (the first one's connect fails, the next
    # come in its backoff: none has a link to wait on), the rest soon (a
    # busy machine slows a traced server down).
    slow = [(k, st, took) for k, (st, took) in enumerate(got)
            if st != 503 or took is None
            or took > seconds(AT_ONCE if k < 3 else SOON)]
    lab.expect(not slow, f"{len(slow)} of {FAILING_PAGES} pages, one every "
               f"{GONE_EVERY} s, not answered 503 within {AT_ONCE} s (the "
               f"first 3) or {SOON} s (the rest) while socket() failed "
               "(EMFILE): " + ", ".join(
                   f"page {k}: {st or 'nothing'}" + (
                       f" after {took:.2f} s" if took is not None else "")
                   for k, st, took in slow[:3]) + ": when redis_connect() "
               "fails there is no link to wait on; answer at once")
    tries = [float(t) for t in re.findall(r"(\d+\.\d+) socket\(", trace)]
    early = [t - tries[0] for t in tries if t - tries[0] <= TRIES_WITHIN]
    lab.expect(len(early) >= SOCKET_TRIES, f"{len(early)} socket() calls "
               f"within {TRIES_WITHIN} s of the first (at " + ", ".join(
                   f"{t:.2f}" for t in early) + f" s; {len(tries)} in all) "
               f"while a page came every {GONE_EVERY} s and every socket() "
               f"failed (EMFILE): at least {SOCKET_TRIES}, after backoffs "
               "of 100, 200 and 400 ms; the backoff doubles once per "
               "failure, and redis_connect() has already counted this one "
               "(its redis_fail() set rd->retry_at and doubled the "
               "backoff): doubling it again in redis_queue() makes it grow "
               "4x, setting rd->retry_at again from the doubled backoff "
               "makes each wait the next one's; watch it: strace -r -e "
               "trace=socket -e inject=socket:error=EMFILE -p $(pgrep -x "
               "epoll) while curl asks for /guestbook every 0.05 s")
    lab.expect(posts == [503] * len(GHOSTS), f"{len(GHOSTS)} posts in one "
               f"loop turn while socket() failed were answered {posts} "
               f"within {REPLY_LIMIT} s: each one 503, with no link")
    back = time.monotonic()  # socket() works again: the link comes back
    while (time.monotonic() - back < seconds(BACK) and
           get(server.port, "/guestbook")[0] != 200):
        time.sleep(0.1)
    entries = lab.redis.command("LRANGE", "guestbook:remarks", 0, -1) or []
    ghosts = sorted(name for name in GHOSTS
                    if any(name in entry for entry in entries))
    lab.expect(not ghosts, f"{len(ghosts)} of {len(GHOSTS)} posts answered "
               f"503 while the link backed off were saved once it was back "
               f"({', '.join(ghosts)}): a command left in rd->out on the way "
               "to a 503 goes to Redis on the next link, for a client "
               "already answered, and every later reply goes to the wrong "
               "client; look at the link (rd->retry_at) before formatting, "
               "or cut the command back out")
    consecutive(lab, server, "after socket() failed and worked again")
    first = blocks()
    failed = []

    def drops():  # every other socket() fails: one reconnect in two
        for _ in range(FAILED_CONNECTS):
            lab.redis.command("CLIENT", "KILL", "TYPE", "normal")
            start, seen = time.monotonic(), []
            while time.monotonic() - start < seconds(BACK):
                time.sleep(0.05)  # the backoffs: 100 ms, then 200 ms
                seen.append(get(server.port, "/guestbook")[0])
                if seen[-1] == 200:
                    break
            failed.append(seen)
            if seen[-1] != 200:
                return

    _strace(server.pid, ["socket"], drops, "-f", "-e",
            "inject=socket:error=EMFILE:when=1+2")
    bad = [seen for seen in failed
           if seen[-1] != 200 or not set(seen) <= {200, 503}]
    lab.expect(not bad, "Redis dropped the link, then came a page every 50 "
               "ms while the next socket() failed (EMFILE) and the one "
               f"after worked: they were answered {bad[:1]}: 503s, then a "
               f"200 within {BACK:.0f} s")
    more = wait_for(lambda: blocks() - first, lambda n: n <= BLOCK_SLACK // 2,
                    limit=3)
    lab.expect(more <= BLOCK_SLACK // 2, f"{more:+} heap blocks in use "
               f"(malloc less free, at most {BLOCK_SLACK // 2}) after "
               f"{FAILED_CONNECTS} pages whose redis_connect() failed at once "
               "(socket() said EMFILE), each answered 503: the command "
               "built for a page is not freed when the connect fails; "
               "watch: valgrind --leak-check=full ./epoll 8000 with "
               "ulimit -n too low for the link")
    return ("socket() at " + ", ".join(f"{t:.2f}" for t in early) +
            " s, slowest 503 " + f"{max(took for _, took in got):.2f}" +
            f" s; {more:+} blocks after {FAILED_CONNECTS} failed connects")


@grader.check(5, f"the guestbook works: {AT_ONCE_PAGES} pages at once, a "
              "post, one Redis link, a clean stop")
def guestbook_works(lab):
    server = lab.start()
    before = redis_connections(lab)
    socks = send_page_requests(server.port, AT_ONCE_PAGES)
    statuses = [status_of(s) for s in socks]
    lab.expect(statuses == [200] * AT_ONCE_PAGES,
               f"{statuses.count(200)} of {AT_ONCE_PAGES} pages were 200 "
               f"(others: {sorted(set(statuses) - {200})}): more waiters than "
               f"the FIFO's first {FIFO_SLOTS} slots must make it grow; "
               f"watch them: ab -n {AT_ONCE_PAGES} -c {AT_ONCE_PAGES} "
               "http://127.0.0.1:8000/guestbook")
    body = b"guest-name=lab&guest-remarks=fifo+" + os.urandom(4).hex().encode()
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(5)) as s:
        s.sendall(b"POST /guestbook HTTP/1.0\r\nContent-Type: application/"
                  b"x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        lab.expect(status_of(s) == 303, "the post was not answered 303")
    status, page = get(server.port, "/guestbook")
    lab.expect(status == 200 and body[-8:] in page, "the remark is not shown")
    # The most the form rule lets through: code points counted, not bytes,
    # and raw (not percent-encoded) bytes pass url_decode(): 100 + 2,000
    # 4-byte characters, 8.4 KB of body (under MAX_BODY) and of entry, more
    # than a browser's worst (6.3 KB). Valid, so stored whole and 303.
    tag = os.urandom(4).hex()
    name = (tag + RAW_CHAR * (100 - len(tag))).encode()
    remark = (RAW_CHAR * 1999 + chr(0x1F600 + os.urandom(1)[0] % 64)).encode()
    raw = b"guest-name=" + name + b"&guest-remarks=" + remark
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(5)) as s:
        s.sendall(b"POST /guestbook HTTP/1.0\r\nContent-Type: application/"
                  b"x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(raw), raw))
        said = status_of(s)
    lab.expect(said == 303, f"a post of raw 4-byte UTF-8 characters, 100 in "
               f"the name and 2,000 in the remark ({len(raw)} bytes of body, "
               f"under MAX_BODY: the form rule counts characters, not bytes) "
               f"was answered {said}, not 303, Redis healthy: its command "
               f"(about {len(name) + len(remark) + 60} bytes) must be sent "
               "whole, however long (a fixed buffer sized from a browser's "
               "6 KB?); watch it: curl --data-binary @post http://127.0.0.1:"
               "8000/guestbook with such a body")
    status, page = get(server.port, "/guestbook")
    lab.expect(status == 200 and name in page and remark in page, "the post "
               "of raw 4-byte UTF-8 characters (answered 303) is not shown "
               "whole on the page")
    links = redis_connections(lab) - before - 1  # less this INFO's own
    lab.expect(links <= 1, f"{links} connections to Redis for "
               f"{AT_ONCE_PAGES + 4} requests: "
               "one link per loop, kept open, carries every command; watch "
               "them: redis-cli INFO stats | grep total_connections_received")
    server.stop()


if __name__ == "__main__":
    grader.main()
