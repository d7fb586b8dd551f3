#!/usr/bin/env python3
"""Grader for the lookup lab (labs/lookup/README.md).

Both lookups are timed against the reference in the same run: finding the
owner of a ready fd (keep-alive load) and finding the entry that moves into
a hole (every request on its own connection, so every request closes one).
Churn then checks that the hash and the slots stay right while connections
come and go: a stale entry or a wrong slot loses a client. The scan must be
fair: a ready client passed over scan after scan waits the whole run. The
server must still be poll()'s: an epoll descriptor cannot stand in for the
lookup."""

import random
import re
import selectors
import socket
import subprocess
import time

from grading import (Grader, asking_clients, big_file,  # labs/grading.py
                     build, build_reference, descriptors, failing, get,
                     keepalive_load, kept_clients, raise_open_file_limit,
                     seconds, stopped, user_ticks, wait_for)
from rawhttp import Connection, open_asking  # tests/rawhttp.py

IDLE = 5000  # idle keep-alive clients beside the busy ones
REQUESTS = 20000  # keep-alive requests for /, 50 at a time
CLOSES = 6000  # clients with a request begun that hang up, shuffled
RATIO = 2.0  # user CPU against the reference, at most
CHURN = 100  # clients open at once while half of them come and go
ROUNDS = 4
WAIT_MS = 500  # the slowest keep-alive request; the reference's: ~10 ms
ASK = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
BIG = 8 << 20  # a file no socket takes in one send: its sender needs POLLOUT
RESTARTS = 3  # Redis restarts, each followed by a churn round
NOFILE = 150  # the server's descriptor limit in the out-of-descriptors part
CROWD = 12000  # clients at once: descriptors past 8,192 and 10,000
READY = 1500  # clients asking at once: more than MAX_EVENTS (1,024) ready
SANITIZE = "-fsanitize=address -fno-omit-frame-pointer"
NO_GROWTH = """#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
/* The pollfd array's growth past 1,024 entries fails, once. */
void *realloc(void *p, size_t n)
{
    static void *(*next)(void *, size_t);
    static int failed;
    if (!next)
        next = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    if (p && n == 2048 * sizeof(struct pollfd) && !failed) {
        failed = 1;
        errno = ENOMEM;
        return NULL;
    }
    return next(p, n);
}
"""
HALF = ASK[:-2]  # a request begun: the server holds it 10 s, not 5
grader = Grader("lookup")


def user_cpu_under_load(lab, load, clients, binary=None):
    """The server's user CPU (ticks) for load(lab, server, idle) with the
    idle clients(port) open (their sockets; load may close them)."""
    server = lab.start(binary=binary)
    idle = clients(server.port)
    before = user_ticks(server.pid)
    load(lab, server, idle)
    ticks = user_ticks(server.pid) - before
    for s in idle:
        s.close()
    server.stop()
    return ticks


def against_reference(lab, load, clients, what):
    """The student's user CPU for load against the reference's, measured in
    the same run; fails past RATIO."""
    reference = build_reference("06_poll", lab.workdir)
    yours = user_cpu_under_load(lab, load, clients)
    ref = user_cpu_under_load(lab, load, clients, reference)
    lab.expect(yours <= RATIO * ref + 5,  # 5 ticks: 50 ms of slack
               f"{yours} ticks of user CPU against the reference's {ref} "
               f"for {what}; watch it: the handout's idle clients, then "
               "perf top -p $(pgrep -x poll)")
    return f"{yours} ticks against the reference's {ref}"


def close_all(lab, server, idle):
    """Every idle client hangs up, in a shuffled order, and the server
    closes its side of each: one unwatch_fd per client, each filling its
    hole with the array's last entry."""
    rng = random.Random(21)
    rng.shuffle(idle)
    for s in idle:
        s.close()
    left = wait_for(lambda: len(descriptors(server.pid)),
                    lambda n: n < len(idle) // 100 + 20, 20)
    lab.expect(left < len(idle) // 100 + 20, f"{left} descriptors still "
               f"open 20 s after {len(idle)} clients hung up")


@grader.check(25, f"finding the owner of a ready fd: user CPU for {REQUESTS} "
              f"keep-alive requests with {IDLE} idle clients at most "
              f"{RATIO:g}x the reference's")
def lookup_is_cheap(lab):
    raise_open_file_limit()
    return against_reference(
        lab, lambda lab, server, idle: keepalive_load(lab, server.port,
                                                      REQUESTS),
        lambda port: kept_clients(port, IDLE),
        f"{REQUESTS} keep-alive requests beside {IDLE} idle clients")


def come_and_go(count):
    """A load: count clients come, each with a request begun (the server
    accepts and watches each: one watch_fd), then all hang up
    (close_all: one unwatch_fd each)."""
    def load(lab, server, _):
        clients = asking_clients(server.port, count, HALF)
        wait_for(lambda: len(descriptors(server.pid)),
                 lambda n: n >= count, 20)
        close_all(lab, server, clients)
    return load


@grader.check(15, "adding and removing entries: user CPU while "
              f"{CLOSES} clients come, then hang up, at most {RATIO:g}x the "
              "reference's")
def churn_is_cheap(lab):
    count = min(CLOSES, raise_open_file_limit() - 100)
    return against_reference(
        lab, come_and_go(count), lambda port: [],
        f"{count} clients coming (one watch_fd each), then hanging up (one "
        "unwatch_fd each): a walk over every watch as each comes or "
        "leaves?")


@grader.check(10, f"every ready client is served in turn: the slowest of "
              f"{REQUESTS} keep-alive requests beside {IDLE} idle clients "
              f"waits at most {WAIT_MS} ms")
def scan_is_fair(lab):
    raise_open_file_limit()
    server = lab.start()
    idle = kept_clients(server.port, IDLE)
    watch = ("; watch it: ab -k -n 20000 -c 50 beside the handout's idle "
             "clients, then the longest request in ab's percentile table; "
             "does the scan's start move while it runs?")
    try:
        report = keepalive_load(lab, server.port, REQUESTS, hint=watch)
    finally:
        for s in idle:
            s.close()
    longest = int(re.search(r"100%\s+(\d+) \(longest", report).group(1))
    lab.expect(longest <= seconds(WAIT_MS), f"the slowest request waited "
               f"{longest} ms: a ready client was passed over scan after "
               f"scan (poll() reports it every time){watch}")
    return f"the slowest waited {longest} ms"


def churn_round(port, conns, rng):
    """Three one-shot HTTP/1.0 clients come and go (answered at once, never
    watched); half of conns hang up (the server's entries move into the holes),
    as many new clients ask and are answered, then every open client asks
    once more (every tenth, and the newest, for a large file, which needs
    POLLOUT on its entry; every tenth for the guestbook, which needs the
    Redis link's): how many of those were not answered."""
    for _ in range(3):  # answered and closed before ever being watched
        get(port, "/notes.txt")
    rng.shuffle(conns)
    for c in conns[:CHURN // 2]:
        c.close()
    del conns[:CHURN // 2]
    for c in open_asking(port, CHURN // 2, conns, ASK, timeout=5)[-(
            CHURN // 2):]:
        c.read_response()
    for k, c in enumerate(conns):
        c.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" %
               (b"/big.bin" if k % 10 == 0 or k == len(conns) - 1 else
                b"/guestbook" if k % 10 == 5 else b"/notes.txt"))
    lost = 0
    for c in conns:
        try:
            lost += c.read_response().status != 200
        except (AssertionError, OSError):  # cut, or never answered
            lost += 1
    return lost


def answered_each(conns):
    """How many of conns, each having asked, are not answered 200; after
    the first that times out, the rest count as not answered unread (a
    server that stopped costs one timeout, not one per client)."""
    lost = 0
    for k, c in enumerate(conns):
        try:
            lost += c.read_response().status != 200
        except TimeoutError:
            return lost + len(conns) - k
        except (AssertionError, OSError):
            lost += 1
    return lost


def still_open(port, conns):
    """Clients the server has closed (idle for 5 s: a Redis restart on a
    busy machine can take that long) leave conns, and as many new ones
    come, each answered: conns is CHURN open clients again, and each of
    the others asks once more (its idle timer starts again). Returns how
    many of those were not answered."""
    for c in list(conns):
        c.sock.setblocking(False)
        try:
            gone = c.sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        c.sock.settimeout(seconds(5))
        if gone:
            c.close()
            conns.remove(c)
    for c in conns:
        c.send(ASK)
    lost = answered_each(conns)
    missing = CHURN - len(conns)
    if missing > 0:
        for c in open_asking(port, missing, conns, ASK, 5)[-missing:]:
            c.read_response()
    return lost


def second_to_last_leaves(lab, port):
    """On a fresh server (the listener, then A and B): A, the second to
    last entry, leaves (B moves into its slot); C comes (after B); B
    leaves: C must still be answered, so B's slot must have moved with
    it."""
    a, b = Connection(port, timeout=5), Connection(port, timeout=5)
    for conn in (a, b):
        conn.send(ASK)
        conn.read_response()
    a.close()
    time.sleep(0.2)  # the server has closed its side
    with Connection(port, timeout=5) as c:
        c.send(ASK)
        c.read_response()
        b.close()
        time.sleep(0.2)
        try:
            c.send(ASK)
            status = c.read_response().status
        except (AssertionError, OSError):
            status = 0
    lab.expect(status == 200, "clients A, B; A leaves; C comes; B leaves: "
               f"C's next request answered {status or 'nothing'}: when the "
               "second-to-last entry leaves, the last one moves into its "
               "slot, and its slot must say so")


@grader.check(20, f"{CHURN} keep-alive clients, half of them replaced "
              f"{ROUNDS} times: every client still open is answered, "
              "large files too")
def churn_keeps_owners(lab):
    server = lab.start()
    big_file(lab, BIG)
    lab.expect("anon_inode:[eventpoll]" not in
               descriptors(server.pid).values(),
               "the server holds an epoll descriptor: the lab is poll()'s "
               "lookup (ls -l /proc/PID/fd)")
    second_to_last_leaves(lab, server.port)
    rng = random.Random(21)
    conns = []
    watch = ("a watch hashed twice or never deleted, or a moved entry's slot "
             "not updated, loses its owner; watch it: gdb -p $(pgrep -x "
             "poll), break unwatch_fd, print polled.fds[w->slot].fd against "
             "w->fd as clients come and go")
    try:
        for turn in range(ROUNDS + 1):  # round 0: the first clients
            try:
                lost = (churn_round(server.port, conns, rng) if turn else
                        sum(c.read_response().status != 200 for c in
                            open_asking(server.port, CHURN, conns, ASK, 5)))
            except (AssertionError, OSError) as error:
                lost = f"the server stopped answering ({error})"[:80]
            died = server.proc.poll()
            lab.expect(died is None, f"the server died (exit {died}) in "
                       f"churn round {turn}: {watch}")
            if not isinstance(lost, str):
                lost = f"{lost} of {len(conns)} open clients lost"
            lab.expect(lost.startswith("0 of"), f"churn round {turn}: {lost}: "
                       f"{watch}")
    finally:
        for c in conns:
            c.close()


@grader.check(10, f"watches that leave and come back: Redis restarted "
              f"{RESTARTS} times, the listener paused out of descriptors "
              "(accept4 failing with EMFILE, twice); every client still "
              "answered")
def watches_come_back(lab):
    server = lab.start()
    big_file(lab, BIG)
    rng = random.Random(22)
    conns = []
    try:
        for c in open_asking(server.port, CHURN, conns, ASK, 5):
            c.read_response()
        for turn in range(RESTARTS):  # the link's watch leaves, comes back
            lab.redis.stop()
            lab.redis.start()
            status = wait_for(lambda: get(server.port, "/guestbook")[0],
                              lambda st: st == 200, limit=4)  # its backoff
            lab.expect(status == 200, f"after Redis restart {turn + 1}: the "
                       f"guestbook page answered {status} for 4 s")
            lost = still_open(server.port, conns)  # a slow restart: idled out
            lost += churn_round(server.port, conns, rng)
            lab.expect(lost == 0, f"after Redis restart {turn + 1}: {lost} "
                       f"of {len(conns)} open clients lost: the Redis "
                       "link's watch, unwatched when the link failed, left "
                       "behind in the hash or hashed twice when it came back?")
    except (AssertionError, OSError) as error:
        lab.expect(False, f"the server stopped answering after a Redis "
                   f"restart ({str(error)[:80]})")
    finally:
        for c in conns:
            c.close()
    server.stop()
    server = lab.start(nofile=NOFILE)  # out of descriptors: the listener
    conns = []  # is unwatched while it waits, and watched again after
    try:
        for _ in range(2):
            more = []
            for _ in range(NOFILE + 20):
                try:
                    more.append(Connection(server.port, timeout=5))
                except OSError:
                    break
            for c in more[:NOFILE // 2]:  # some of them get through
                c.send(ASK)
            conns += more
            rng.shuffle(conns)
            for c in conns[NOFILE // 3:]:  # most leave: accepting resumes
                c.close()
            del conns[NOFILE // 3:]
            lost = 0
            for c in conns:
                try:
                    c.send(ASK)
                    lost += c.read_response().status != 200
                except (AssertionError, OSError):
                    lost += 1
            lab.expect(lost <= len(conns) // 2, f"out of descriptors, then "
                       f"not: {lost} of {len(conns)} clients lost")
        status, _ = get(server.port, "/")
        lab.expect(status == 200, f"GET / answered {status} once descriptors "
                   "were free again: the listener's watch did not come back")
        window = []  # a sliding window of keep-alive clients: the oldest
        try:  # leaves as each new one comes, its hole never at the end
            for k in range(3 * NOFILE):
                window.append(socket.create_connection(
                    ("127.0.0.1", server.port), timeout=seconds(3)))
                window[-1].sendall(ASK)
                try:
                    answer = window[-1].recv(65536)
                except OSError:
                    answer = b""
                lab.expect(answer.startswith(b"HTTP/1.1 200"),
                           f"client {k + 1} of {3 * NOFILE}, one after "
                           "another, the oldest of 5 leaving as each comes, "
                           f"not answered with a descriptor limit of "
                           f"{NOFILE}: does the array stay as long as the "
                           "clients open (the last entry fills each hole)?")
                if len(window) > 5:
                    window.pop(0).close()
        finally:
            for c in window:
                c.close()
    finally:
        for c in conns:
            c.close()
    server.stop()
    listener_pauses(lab)


def listener_pauses(lab):
    """accept4 fails with EMFILE (strace's fault injection) while a client
    comes: the spare given up does not help, so the listener's watch
    leaves for 10 ms, and comes back as the array's last entry. Clients
    then leave (the listener moves into a hole: its slot must follow),
    and it pauses again: every open client must still be answered."""
    server = lab.start()
    rng = random.Random(23)
    conns = []
    try:
        for c in open_asking(server.port, 20, conns, ASK, seconds(10)):
            c.read_response()
        for turn in range(2):
            late = []

            def two_come():  # the second surely while strace holds on
                for _ in range(2):
                    late.append(Connection(server.port,
                                           timeout=seconds(10)))
                    late[-1].send(ASK)
                    time.sleep(0.3)  # the listener leaves and comes back
            failing(server.pid, "accept4", "EMFILE", two_come)
            for c in late:
                try:
                    status = c.read_response().status
                    conns.append(c)
                except TimeoutError:
                    status = 0
                except (AssertionError, OSError):  # refused: strace let go
                    status = 200  # between a failing and a working accept4
                    c.close()
                if status != 200:
                    break
            lab.expect(status == 200, f"pause {turn + 1}: a client that "
                       "came while accept4 failed answered "
                       f"{status or 'nothing'} after: the listener's watch "
                       "did not come back, or its entry moved into a hole "
                       "without its slot following (is it in the hash?)")
            rng.shuffle(conns)
            for c in conns[:len(conns) // 2]:  # the listener fills a hole
                c.close()
            del conns[:len(conns) // 2]
            for c in open_asking(server.port, 10, conns, ASK,
                                 seconds(10))[-10:]:
                c.read_response()
        for c in conns:
            c.send(ASK)
        lost = answered_each(conns)
    except (AssertionError, OSError) as error:
        lost = f"the server stopped answering ({str(error)[:80]})"
    finally:
        for c in conns:
            c.close()
    lab.expect(lost == 0, f"the listener paused twice (accept4 failing with "
               "EMFILE), clients leaving between: "
               + (f"{lost} of {len(conns)} open clients lost" if
                  isinstance(lost, int) else lost)
               + ": the listener moved into a hole without its slot "
               "following (is it in the hash?); watch it: strace -e "
               "inject=accept4:error=EMFILE -p $(pgrep -x poll) while a "
               "client comes")


def answered(conns, limit):
    """How many of conns have an answer (200) within `limit` s, all waited
    for at once (a server that never answers costs `limit`, not one
    timeout per client)."""
    waiting, count = selectors.DefaultSelector(), 0
    for c in conns:
        try:
            waiting.register(c, selectors.EVENT_READ)
        except (ValueError, OSError):  # closed already
            pass
    deadline = time.monotonic() + seconds(limit)
    while waiting.get_map() and time.monotonic() < deadline:
        for key, _ in waiting.select(0.2):
            waiting.unregister(key.fileobj)
            try:
                count += key.fileobj.recv(65536).startswith(b"HTTP/1.1 200")
            except OSError:
                pass
    waiting.close()
    return count


def sanitizer_said(server):
    """The first line of a sanitizer's report and the first function of
    the student's it names, from the server's stderr ("" if none)."""
    text = server.stderr()
    said = re.search(r"(AddressSanitizer|LeakSanitizer): ([^\n]*)", text)
    if not said:
        return ""
    where = re.search(r"#\d+ 0x[0-9a-f]+ in (?!__interceptor|__asan|"
                      r"__lsan|malloc|realloc|calloc)(\w+)", text[said.end():])
    what = said[2].split(" on address")[0].split(" (pc")[0]
    return f"{said[1]}: {what}" + (f" in {where[1]}()" if where else "")


@grader.check(10, f"built with AddressSanitizer: {READY} clients ask at "
              "once (more than MAX_EVENTS ready in one poll()), the array's "
              "growth past 1,024 entries failing once: every other client "
              "answered, no sanitizer report")
def many_ready(lab):
    raise_open_file_limit()
    lab.expect(lab.source is not None, "no source to build with "
               "-fsanitize=address (grade with --src)")
    binary = lab.workdir / "asan" / "poll"
    ok, said = build(lab.source, binary, "poll", SANITIZE)
    lab.expect(ok, f"-fsanitize=address does not build: {said.strip()[:150]}")
    shim, source = lab.workdir / "no_growth.so", lab.workdir / "no_growth.c"
    source.write_text(NO_GROWTH)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim),
                    str(source), "-ldl"], check=True, capture_output=True)
    server = lab.start(binary=binary, env={
        "LD_PRELOAD": str(shim), "ASAN_OPTIONS":
        "detect_leaks=1:abort_on_error=0:verify_asan_link_order=0"})
    watch = ("; watch it: build your main.c as `make asan` builds the "
             f"servers (-fsanitize=address), run it with {READY} of the "
             "handout's clients asking at once, and read its stderr")
    conns = kept_clients(server.port, READY)
    try:
        first = answered(conns, 10)
        with stopped(server.pid):  # all at once: more than MAX_EVENTS
            for c in conns:  # ready in the poll() after SIGCONT
                try:
                    c.sendall(ASK)
                except OSError:
                    pass
        again = answered(conns, 10)
    finally:
        for c in conns:
            c.close()
    died = server.proc.poll()
    if died is None:
        try:
            server.stop()  # its exit: LeakSanitizer's turn
        except AssertionError:
            died = server.result
    said = sanitizer_said(server)
    lab.expect(not said, f"{said} (with {READY} clients asking at once, the "
               "pollfd array's growth to 2,048 entries failing once, then "
               f"all closed and a stop){watch}")
    lab.expect(died is None, f"the server died (exit {died}) with {READY} "
               f"clients asking at once{watch}")
    lab.expect(first == READY and again >= READY - 1, f"of {READY} clients, "
               f"{first} answered once and {again} again (the one whose "
               "watch failed, when the array could not grow, may be lost): "
               "a watch hashed before the array grew, left hashed when "
               f"growing failed?{watch}")
    return f"{again} of {READY} answered again"


@grader.check(5, f"{CROWD} clients at once, past any fixed table of "
              "descriptors: the newest still answered")
def many_clients(lab):
    raise_open_file_limit()
    server = lab.start()
    conns = kept_clients(server.port, CROWD)
    try:
        for c in conns[-200:]:  # the newest, the highest descriptors
            c.settimeout(seconds(5))
            c.recv(65536)  # the first answer
        lost = 0
        for c in conns[-200:]:
            try:
                c.sendall(ASK)
                lost += not c.recv(65536).startswith(b"HTTP/1.1 200")
            except OSError:
                lost += 1
    finally:
        for c in conns:
            c.close()
    lab.expect(lost == 0, f"{lost} of the newest 200 of {CROWD} clients not "
               "answered a second time: a table indexed by descriptor with "
               "a fixed size? (uthash grows as it must)")


grader.still_serves(5)


if __name__ == "__main__":
    grader.main()
