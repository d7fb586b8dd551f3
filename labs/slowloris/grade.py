#!/usr/bin/env python3
"""Grader for the slowloris lab (labs/slowloris/README.md).

Both directions of a deadline: attackers (idle, or a byte a second) must be
cut so a new client gets a thread (an upper bound), and slow but legitimate
clients, inside the 5 s idle and 10 s request limits, must still be served
(a lower bound). The pool is checked to be the size asked for, so more
threads cannot stand in for the deadlines."""

import threading
import time

from grading import (Grader, get, idle_clients, seconds,  # labs/grading.py
                     status_field, wait_for)
from rawhttp import Connection  # tests/rawhttp.py

THREADS = 8  # the pool under attack
ATTACKERS = THREADS + 5  # more connections than threads
BURST = 10  # new clients arriving at once while the pool is under attack
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


@grader.check(20, f"{ATTACKERS} idle connections against {THREADS} threads: "
              f"{BURST} new clients are served within 8 s")
def idle_attack(lab):
    server = pool_server(lab)
    took = under_attack(lab, idle_clients(server.port, ATTACKERS), 8)
    lab.expect(took is not None,
               f"a new client was not served in 8 s while {ATTACKERS} idle "
               "connections held the pool (no idle deadline, or one longer "
               f"than 5 s); {WATCH}")
    return f"served after {took:.1f} s"


@grader.check(20, f"{ATTACKERS} connections sending a byte a second: "
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


@grader.check(15, f"{ATTACKERS} connections sending a head over 7 s, then a "
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
              "a head over 7 s; a pipelined request finished 7 s later")
def combined_slow_clients(lab):
    wrong = slow_clients(lab, ["idle-trickle", "pipelined"])
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
