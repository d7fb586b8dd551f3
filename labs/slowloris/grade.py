#!/usr/bin/env python3
"""Grader for the slowloris lab (labs/slowloris/README.md).

Both directions of a deadline: attackers (idle, or a byte a second) must be
cut so a new client gets a thread (an upper bound), and slow but legitimate
clients, inside the 5 s idle and 10 s request limits, must still be served
(a lower bound). The pool is checked to be the size asked for, so more
threads cannot stand in for the deadlines."""

import selectors
import socket
import threading
import time

from grading import (Grader, get, idle_clients, seconds,  # labs/grading.py
                     status_field, wait_for)
from rawhttp import Connection  # tests/rawhttp.py

THREADS = 8  # the pool under attack
ATTACKERS = THREADS + 5  # more connections than threads
BURST = 10  # new clients arriving at once while the pool is under attack
WIDE = 16  # threads when each attacker is timed (one for each)
CUT = 11.5  # seconds: the 10 s request limit, and a margin
WATCH = (f"watch it: ZEROHTTPD_THREADS={THREADS} ./prethreaded 8000, the "
         f"handout's {ATTACKERS} idle sockets, then time curl "
         "http://127.0.0.1:8000/")
grader = Grader("slowloris")


def pool_server(lab):
    """The server with THREADS threads; more (a bigger pool instead of the
    deadlines) fails the check."""
    server = lab.start(env={"ZEROHTTPD_THREADS": str(THREADS)})
    get(server.port, "/")  # the pool is up once a request is answered
    threads = wait_for(lambda: status_field(server.pid, "Threads"),
                       lambda n: n > THREADS + 2, 0.5)  # any late starter
    lab.expect(threads <= THREADS + 2,
               f"{threads} threads for ZEROHTTPD_THREADS={THREADS}: the pool "
               f"must stay {THREADS} (ls /proc/PID/task counts them)")
    return server


def burst_served_within(port, limit):
    """BURST new clients at once, each GET /: the slowest one's seconds, or
    None if one was not answered 200 within `limit`."""
    took = [None] * BURST

    def one(k):
        start = time.monotonic()
        try:
            status, _ = get(port, "/", timeout=limit)
        except OSError:
            return
        if status == 200:
            took[k] = time.monotonic() - start

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


def under_attack(lab, attackers, limit, every=None, pieces=None):
    """The slowest of a burst of new clients while `attackers` hold the
    pool (trickling a piece every `every` seconds if set), or None."""
    stop = threading.Event()
    sender = threading.Thread(target=trickle,
                              args=(attackers, stop, every, pieces))
    if every:
        sender.start()
    try:
        time.sleep(0.5)  # every attacker has its thread
        return burst_served_within(lab.servers[-1].port, limit)
    finally:
        stop.set()
        if every:
            sender.join()
        for s in attackers:
            s.close()


@grader.check(15, f"{ATTACKERS} idle connections against {THREADS} threads: "
              f"{BURST} new clients are served within 8 s")
def idle_attack(lab):
    server = pool_server(lab)
    took = under_attack(lab, idle_clients(server.port, ATTACKERS), 8)
    lab.expect(took is not None,
               f"a new client was not served in 8 s while {ATTACKERS} idle "
               "connections held the pool (no idle deadline, or one longer "
               f"than 5 s); {WATCH}")
    return f"served after {took:.1f} s"


@grader.check(15, f"{ATTACKERS} connections sending a byte a second: "
              f"{BURST} new clients are served within 14 s")
def slow_attack(lab):
    server = pool_server(lab)
    took = under_attack(lab, idle_clients(server.port, ATTACKERS), 14,
                        every=1.0)
    lab.expect(took is not None,
               f"a new client was not served in 14 s while {ATTACKERS} "
               "connections sent a byte a second (no request deadline, or "
               "one pushed back by each byte: it counts from the first); "
               "watch it: "
               "the handout's attackers plus s.send(b'x') every second, "
               "then time curl")
    return f"served after {took:.1f} s"


@grader.check(10, f"{ATTACKERS} connections sending a head over 7 s, then a "
              f"body a byte a second: {BURST} new clients are served within "
              "14 s")
def slow_body_attack(lab):
    server = pool_server(lab)
    took = under_attack(lab, idle_clients(server.port, ATTACKERS), 14,
                        every=1.0, pieces=SLOW_BODY)
    lab.expect(took is not None,
               f"a new client was not served in 14 s while {ATTACKERS} "
               "connections sent a POST head over 7 s, then its body a byte "
               "a second (a clock started again for the body? the 10 s "
               "count from the request's first byte, body included)")
    return f"served after {took:.1f} s"


def attack_plan(start):
    """Attackers of every shape, each a list of (seconds from `start`,
    bytes to send), and the moment its request's 10 s begin. The slow
    head a byte a second (staggered starts: every request has a clock of
    its own); a request answered with the start of the next, which then
    waits 9 s and trickles (its clock started with those first bytes); a
    POST with Expect: 100-continue, its head over 7 s, then its body a
    byte a second (the 100 Continue restarts nothing); a byte every 9 s
    (no single wait is long, the request is)."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    expect = POST_HEAD.replace(b"\r\n\r\n",
                               b"\r\nExpect: 100-continue\r\n\r\n")
    plans = []
    for k in range(3):
        t0 = start + 2 * k
        plans.append([(t0 + i, ENDLESS_HEAD[i:i + 1]) for i in range(30)])
        plans.append([(start, ask + ask[:16])] +
                     [(start + 9 + i, b"X") for i in range(20)])
        plans.append([(start + i, expect[len(expect) * i // 8:
                                         len(expect) * (i + 1) // 8])
                      for i in range(8)] +
                     [(start + 8 + i, b"x") for i in range(20)])
        plans.append([(start + 9 * i, ENDLESS_HEAD[i:i + 1])
                      for i in range(4)])
    return plans


def held_for(port, plans, limit):
    """Runs the plans, one connection each, and returns how long after its
    first byte the server closed each (None: not within `limit` s)."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5)
             for _ in plans]
    sel = selectors.DefaultSelector()
    for k, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, k)
    pending = sorted((t, k, data) for k, plan in enumerate(plans)
                     for t, data in plan)
    first = {k: plan[0][0] for k, plan in enumerate(plans)}
    closed = {}
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
                    gone = not socks[k].recv(65536)
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
    return [closed.get(k) for k in range(len(plans))]


@grader.check(15, f"attackers of every shape: each cut within {CUT} s of "
              "its request's first byte")
def every_attacker_cut(lab):
    server = lab.start(env={"ZEROHTTPD_THREADS": str(WIDE)})
    get(server.port, "/")
    plans = attack_plan(time.monotonic() + 0.5)
    held = held_for(server.port, plans, CUT + 2)
    shapes = ["a byte a second (staggered)", "pipelined, then 9 s, then "
              "a byte a second", "Expect: 100-continue, head over 7 s, "
              "body a byte a second", "a byte every 9 s"]
    late = [f"{shapes[k % 4]}: " + (f"{h:.1f} s" if h else "never")
            for k, h in enumerate(held) if h is None or h > CUT]
    lab.expect(not late, f"{len(late)} of {len(plans)} attackers held past "
               f"{CUT} s: " + "; ".join(sorted(set(late))[:3]) + ": the 10 s "
               "count from the request's first byte (bytes a pipelined "
               "request left count as arrived), once, for this request "
               "alone, body and 100 Continue included")
    return f"the longest held {max(h for h in held):.1f} s"


def slow_but_legitimate(port, kind):
    """One client inside the limits, as `kind` says: None if it was served,
    else what went wrong."""
    ask = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
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
        elif kind == "keepalive-4s":  # four requests 4 s apart
            for _ in range(3):
                conn.send(ask)
                conn.read_response()
                time.sleep(4.0)
            conn.send_tolerating_reset(ask)
            label = ("the 4th request 4 s after the 3rd on one keep-alive "
                     "connection (each wait between requests is its own)")
        elif kind == "pipelined":  # a second request begun with the first
            conn.send(ask + ask[:16])
            conn.read_response()
            time.sleep(7.0)
            conn.send_tolerating_reset(ask[16:])
            label = ("a pipelined request finished 7 s after its first "
                     "bytes came with the request before it (they count as "
                     "arrived: its 10 s run from then, no 5 s idle limit)")
        else:
            if kind == "pause":  # one answered request, then 3 s idle
                conn.send(ask)
                conn.read_response()
            time.sleep(3.0)
            conn.send_tolerating_reset(ask)
            label = ("a second request after 3 s idle" if kind == "pause"
                     else "a first request 3 s after connecting")
        try:
            status = conn.read_response().status
        except (AssertionError, OSError) as error:
            return f"{label} was cut ({str(error)[:60]})"
        return None if status == 200 else f"{label} was answered {status}"


@grader.check(20, "slow but legitimate clients are served: a head sent over "
              "7 s, a first request after 3 s silent, a keep-alive pause of "
              "3 s")
def slow_clients_served(lab):
    wrong = slow_clients(lab, ["trickle", "late", "pause"])
    lab.expect(not wrong,
               "; ".join(wrong) + ": a deadline shorter than the 5 s idle or "
               "the 10 s request limit; watch it with the handout's second "
               "block (a head sent over 7 s through /dev/tcp)")


@grader.check(15, "slow but legitimate, the limits combined: 4 s silent then "
              "a head over 7 s; a pipelined request finished 7 s later; "
              "6 s of silence inside a head; requests 4 s apart")
def combined_slow_clients(lab):
    wrong = slow_clients(lab, ["idle-trickle", "pipelined", "mid-pause",
                               "keepalive-4s"])
    lab.expect(not wrong, "; ".join(wrong))


def slow_clients(lab, kinds):
    """Honest slow clients of these kinds at once: what went wrong."""
    server = pool_server(lab)
    said = [None] * len(kinds)

    def run(k):
        said[k] = slow_but_legitimate(server.port, kinds[k])

    clients = [threading.Thread(target=run, args=(k,))
               for k in range(len(kinds))]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    return [s for s in said if s]


grader.still_serves(10, env={"ZEROHTTPD_THREADS": str(THREADS)})


if __name__ == "__main__":
    grader.main()
