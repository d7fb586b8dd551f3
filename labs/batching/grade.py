#!/usr/bin/env python3
"""Grader for the batching lab (labs/batching/README.md).

What is counted is the loop's own promise: one io_uring_enter() per loop
turn, the one that submits and waits. Every enter that only submits (its
min_complete is 0) is a turn paying twice, whatever the load; that is
measured per turn, not only per request, so submitting every 8th entry or
once more per turn shows. The ring must be the reference's (no SQPOLL
kernel thread submitting for the server)."""

import re
import socket
import time
from pathlib import Path

from grading import (Grader, code_only, connections,  # labs/grading.py
                     death, descriptors, function_body, get, keepalive_load,
                     kept_clients, raise_open_file_limit, seconds, stopped,
                     strace_calls, strace_count, wait_for)

REQUESTS = 4000  # keep-alive requests for /, 50 at a time
PER_REQUEST = 0.5  # io_uring_enter calls per request; batched is near 0.1
SHARE = 0.1  # enters that only submit, of all enters; batched: none
# (path, requests, concurrency): pages, Redis-bound pages, many clients
# at once, so that a turn queues hundreds of entries, and connections the
# server closes
# (a negative concurrency: no keep-alive, so the server closes each
# connection with its receive still armed: a cancel each)
LOADS = [("/", REQUESTS, 50), ("/guestbook", 2000, 50), ("/", 10000, 1000),
         ("/", 2000, -50)]
RING = 4096  # the reference's submission queue: RING_ENTRIES
CROWD = 5000  # idle clients timed out in one loop turn: more entries than RING
IDLE = 5  # seconds: the servers' idle timeout
ASK = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
WATCH = ("watch it: strace -f -e trace=io_uring_enter -p $(pgrep -x "
         "io_uring) under ab -k -n 4000 -c 50 (the 3rd argument, "
         "min_complete, is 0 on an enter that only submits)")
grader = Grader("batching")


def ring_server(lab):
    """The server, refused if io_uring is not available or if its ring has
    an SQPOLL thread (a kernel thread that submits instead of the loop)."""
    server = lab.start()
    reason = lab.binary.unavailable()
    lab.expect(reason is None, f"io_uring is not available here: {reason}")
    rings = [fd for fd, what in descriptors(server.pid).items()
             if what == "anon_inode:[io_uring]"]
    lab.expect(rings, "no io_uring descriptor in /proc/PID/fd")
    for fd in rings:
        info = Path(f"/proc/{server.pid}/fdinfo/{fd}").read_text()
        lab.expect(f"SqMask:\t{RING - 1:#x}" in info,
                   f"the ring's submission queue is not the reference's "
                   f"{RING} entries (SqMask in /proc/{server.pid}/fdinfo/"
                   f"{fd}): a bigger ring only moves the full-ring case to "
                   "a bigger burst; keep RING_ENTRIES, change the code")
        lab.expect("SqThread:\t-1" in info,
                   f"the ring has an SQPOLL thread (SqThread in /proc/"
                   f"{server.pid}/fdinfo/{fd}): a kernel thread submitting "
                   "on a core of its own does not batch; keep the "
                   "reference's ring flags")
    return server


@grader.check(30, f"at most {PER_REQUEST} io_uring_enter calls per request "
              "under keep-alive load (ab -k -c 50)")
def batched(lab):
    server = ring_server(lab)
    calls = strace_count(server.pid, ["io_uring_enter"],
                         lambda: keepalive_load(lab, server.port, REQUESTS))
    per = calls.get("io_uring_enter", 0) / REQUESTS
    lab.expect(per <= PER_REQUEST, f"{per:.2f} io_uring_enter calls per "
               f"request; {WATCH}")
    return f"{per:.2f} per request"


@grader.check(30, "one io_uring_enter per loop turn, the one that submits "
              f"and waits: at most {SHARE:.0%} of enters only submit, for "
              "pages, the guestbook, and 1,000 clients at once")
def one_enter_per_turn(lab):
    raise_open_file_limit()  # ab's 1,000 connections, and the server's
    server = ring_server(lab)
    seen = []
    for path, requests, concurrency in LOADS:
        keep = concurrency > 0  # else no keep-alive: the server closes
        calls = strace_calls(server.pid, "io_uring_enter", lambda: (
            keepalive_load(lab, server.port, requests, concurrency,
                           path=path) if keep else
            connections(lab, server.port, requests, -concurrency, (path,))))
        args = [call.split(", ") for call in calls if call.count(", ") > 2]
        extra = sum(1 for a in args if a[2] == "0")  # min_complete 0
        handed = sum(int(a[1]) for a in args if a[1].isdigit())
        lab.expect(extra <= SHARE * len(args),
                   f"ab {'-k ' if keep else ''}-n {requests} -c "
                   f"{abs(concurrency)} {path}: {extra} of "
                   f"{len(args)} io_uring_enter calls only submitted "
                   f"(min_complete 0), {handed / max(len(args), 1):.1f} "
                   f"entries each on average: an enter more per turn; "
                   + WATCH.replace("-k -n 4000 -c 50", f"{'-k ' * keep}-n "
                                   f"{requests} -c {abs(concurrency)} "
                                   f"...{path}"))
        seen.append(f"{extra} of {len(args)}")
    return f"enters that only submitted: {', '.join(seen)}"


@grader.check(20, f"{CROWD} idle clients timed out in one loop turn (more "
              f"entries than the ring's {RING}): each closed, the server "
              "lives")
def full_ring(lab):
    raise_open_file_limit()
    server = ring_server(lab)
    before = len(descriptors(server.pid))
    clients = kept_clients(server.port, CROWD)
    first = sum(answer(c).startswith(b"HTTP/1.1 200") for c in clients)
    lab.expect(first == CROWD, f"{first} of {CROWD} keep-alive clients "
               "answered their first request")
    time.sleep(IDLE / 2)  # a client whose idle timer falls due later
    busy = kept_clients(server.port, 1)[0]  # asks again during the stop
    lab.expect(answer(busy).startswith(b"HTTP/1.1 200"), "no answer")
    closed = []

    def burst():
        with stopped(server.pid):  # every idle timer of the crowd falls due
            time.sleep(IDLE / 2 + 1)
            busy.sendall(ASK)  # its operations: the turn's first entries
        closed.append(sum(answer(c, IDLE * 2) is None for c in clients))

    calls = strace_calls(server.pid, "io_uring_enter", burst)
    closed = closed[0]
    early = [a[1] for a in (call.split(", ") for call in calls)
             if len(a) > 2 and a[2] == "0" and a[1] != str(RING)]
    lab.expect(not early, f"{len(early)} io_uring_enter calls during that "
               f"turn only submitted, with {', '.join(early[:3])} entries: "
               f"an enter that only submits must hand over a full ring "
               f"({RING}), else it is one more enter than the turn needs")
    dead = death(lab)
    for c in clients:
        c.close()
    got = [answer(busy) or b"nothing"]
    if got[0].startswith(b"HTTP/1.1 200"):  # and the connection still works
        busy.sendall(ASK)
        got.append(answer(busy) or b"nothing")
    busy.close()
    lab.expect(all(g.startswith(b"HTTP/1.1 200") for g in got),
               "a client that asked during that turn got "
               f"{b' then '.join(g[:20] for g in got)!r}: a completion "
               "went to the wrong owner (a slot taken again after a submit "
               "keeps the user_data of the entry it held before: tag it)")
    lab.expect(not dead and closed == CROWD, f"{closed} of {CROWD} idle "
               f"clients closed by the server after their {IDLE} s, all due "
               "in one loop turn" + (f"; {dead}" if dead else "") + ": that "
               f"turn queued more than the ring's {RING} entries "
               "(io_uring_get_sqe() returns NULL when it is full: submit "
               "what is queued, then take a slot again, and tag the slot it "
               f"returns); watch it: {CROWD} kept clients, SIGSTOP the server "
               f"for {IDLE + 1} s, SIGCONT")
    status, _ = get(server.port, "/")
    lab.expect(status == 200, f"GET / answered {status} after the burst")
    left = wait_for(lambda: len(descriptors(server.pid)) - before,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} descriptors more than before the {CROWD} "
               "clients came, 5 s after each was closed: an operation of "
               "that turn was lost or went to the wrong owner (a slot taken "
               "before a submit, or retaken without its user_data)")


def answer(sock, limit=10):
    """One small response on a kept connection: None if the server closed
    it, b"" if nothing came within limit s."""
    sock.settimeout(seconds(limit))
    data = b""
    try:
        if not sock.recv(65536, socket.MSG_PEEK):
            return None
        while b"\r\n\r\n" not in data or len(data.partition(
                b"\r\n\r\n")[2]) < content_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    except OSError:  # reset
        return None if not data else data
    return data


def content_length(data):
    head = data.partition(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@grader.check(5, "every slot new_sqe() hands out is tagged with its owner "
              "(source review)")
def tagged_slots(lab):
    lab.expect(lab.source is not None, "the grader was not given the source "
               "to review (tools/lab grade passes --src)")
    text = lab.source.read_text(errors="replace")
    found = function_body(code_only(text), "new_sqe")
    lab.expect(found, "no new_sqe() found in the source")
    first, body = found
    for ret in re.finditer(r"\breturn\b[^;]*;", body):
        taken = [m.end() for m in re.finditer(r"io_uring_get_sqe\s*\(",
                                             body[:ret.end()])]
        tagged = taken and re.search(r"io_uring_sqe_set_data|user_data\s*=",
                                     body[taken[-1]:ret.start()])
        line = first + body.count("\n", 0, ret.start())
        lab.expect(not taken or tagged, f"new_sqe() line {line} returns a "
                   "slot taken with io_uring_get_sqe() and not tagged since "
                   f"({text.splitlines()[line - 1].strip()[:70]!r}): a slot "
                   "keeps the user_data of the entry it held before, so its "
                   "completion goes to that entry's owner; set it on every "
                   "slot you return")
    return "every slot returned is tagged"


grader.still_serves(15)


if __name__ == "__main__":
    grader.main()
