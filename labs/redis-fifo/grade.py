#!/usr/bin/env python3
"""Grader for the redis-fifo lab (labs/redis-fifo/README.md)."""

import os
import socket
import time

from grading import Grader, asking_clients, get, seconds  # labs/grading.py

STATIC_LIMIT = 0.3  # seconds for a static page while Redis is stalled
WAITERS = 3  # guestbook requests parked on the stalled Redis
grader = Grader("redis-fifo")


def send_page_requests(port, count):
    """Guestbook GETs sent and left waiting: their sockets."""
    return asking_clients(port, count, b"GET /guestbook HTTP/1.0\r\n\r\n")


def status_of(sock):
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    sock.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


@grader.check(50, f"Redis stalled, {WAITERS} pages waiting: static files "
              f"answered within {STATIC_LIMIT} s")
def static_not_delayed(lab):
    server = lab.start()
    lab.expect(get(server.port, "/guestbook")[0] == 200, "no guestbook page")
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
               f"the slowest GET / took {slowest:.2f} s")
    return f"slowest GET / {slowest * 1000:.0f} ms"


@grader.check(20, "pages waiting on a stalled Redis get 503 within 2 s")
def stalled_pages_fail_fast(lab):
    server = lab.start()
    lab.expect(get(server.port, "/guestbook")[0] == 200, "no guestbook page")
    lab.stall_redis()
    start = time.monotonic()
    statuses = [status_of(s) for s in send_page_requests(server.port, WAITERS)]
    took = time.monotonic() - start
    lab.expect(statuses == [503] * WAITERS, f"answers {statuses}")
    lab.expect(took <= seconds(2), f"the last 503 after {took:.1f} s")


@grader.check(30, "the guestbook works: 50 pages at once, a post, a clean "
              "stop")
def guestbook_works(lab):
    server = lab.start()
    socks = send_page_requests(server.port, 50)
    statuses = [status_of(s) for s in socks]
    lab.expect(statuses == [200] * 50,
               f"{statuses.count(200)} of 50 pages were 200")
    body = b"guest-name=lab&guest-remarks=fifo+" + os.urandom(4).hex().encode()
    with socket.create_connection(("127.0.0.1", server.port),
                                  timeout=seconds(5)) as s:
        s.sendall(b"POST /guestbook HTTP/1.0\r\nContent-Type: application/"
                  b"x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        lab.expect(status_of(s) == 303, "the post was not answered 303")
    status, page = get(server.port, "/guestbook")
    lab.expect(status == 200 and body[-8:] in page, "the remark is not shown")
    server.stop()


if __name__ == "__main__":
    grader.main()
