#!/usr/bin/env python3
"""Grader for the slowloris lab (labs/slowloris/README.md)."""

import threading
import time

from grading import Grader, get, idle_clients, seconds  # labs/grading.py

THREADS = 8  # the pool under attack
ATTACKERS = THREADS + 5  # more connections than threads
grader = Grader("slowloris")


def served_within(port, limit):
    """Seconds a new client waits for GET /, or None past `limit`."""
    start = time.monotonic()
    try:
        status, _ = get(port, "/", timeout=limit)
    except OSError:
        return None
    took = time.monotonic() - start
    return took if status == 200 and took <= seconds(limit) else None


def trickle(socks, stop):
    """Slowloris: one more byte of a request head on each socket, every
    second, never the blank line that would end it."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 1000
    for i in range(len(head)):
        for s in socks:
            try:
                s.send(head[i:i + 1])
            except OSError:
                pass
        if stop.wait(1.0):
            return


@grader.check(40, f"{ATTACKERS} idle connections against {THREADS} threads: "
              "a new client is served within 8 s")
def idle_attack(lab):
    server = lab.start(env={"ZEROHTTPD_THREADS": str(THREADS)})
    attackers = idle_clients(server.port, ATTACKERS)
    took = served_within(server.port, 8)
    for s in attackers:
        s.close()
    lab.expect(took is not None, "the new client was not served in 8 s")
    return f"served after {took:.1f} s"


@grader.check(40, f"{ATTACKERS} connections sending a byte a second: a new "
              "client is served within 14 s")
def slow_attack(lab):
    server = lab.start(env={"ZEROHTTPD_THREADS": str(THREADS)})
    attackers = idle_clients(server.port, ATTACKERS)
    stop = threading.Event()
    sender = threading.Thread(target=trickle, args=(attackers, stop))
    sender.start()
    try:
        took = served_within(server.port, 14)
    finally:
        stop.set()
        sender.join()
        for s in attackers:
            s.close()
    lab.expect(took is not None, "the new client was not served in 14 s")
    return f"served after {took:.1f} s"


grader.still_serves(20, env={"ZEROHTTPD_THREADS": str(THREADS)})


if __name__ == "__main__":
    grader.main()
