#!/usr/bin/env python3
"""Grader for the fibers lab (labs/fibers/README.md)."""

import time

from grading import (Grader, asking_clients, get, seconds,  # labs/
                     wait_for)
from processes import guarded_stacks  # tests/processes.py: also the suite's

CLIENTS = 200  # kept connections served at once: a fiber each
grader = Grader("fibers")


def open_clients(port, count):
    """count keep-alive clients, each answered once and left open."""
    clients = asking_clients(port, count,
                             b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answered = 0
    for s in clients:
        if s.recv(65536).startswith(b"HTTP/1.1 200"):
            answered += 1
    return clients, answered


@grader.check(40, f"fibers switch: {CLIENTS} kept clients at once, pages and "
              "the guestbook")
def switching(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        status, _ = get(server.port, path)
        lab.expect(status == 200, f"GET {path} answered {status}")
    clients, answered = open_clients(server.port, CLIENTS)
    for s in clients:
        s.close()
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")


@grader.check(40, f"each of {CLIENTS} fibers' stacks has a guard page below "
              "it, unmapped when its client leaves")
def guard_pages(lab):
    server = lab.start()
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    time.sleep(seconds(0.2))
    before = guarded_stacks(server.pid)
    clients, answered = open_clients(server.port, CLIENTS)
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")
    guarded = guarded_stacks(server.pid) - before
    for s in clients:
        s.close()
    lab.expect(guarded == CLIENTS, f"{guarded} guarded stacks for {CLIENTS} "
               "clients")
    left = wait_for(lambda: guarded_stacks(server.pid) - before,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} stacks still mapped after the clients left")


grader.still_serves(20)


if __name__ == "__main__":
    grader.main()
