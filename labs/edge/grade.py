#!/usr/bin/env python3
"""Grader for the edge lab (labs/edge/README.md)."""

import os
import socket
import time
from pathlib import Path

from grading import (Grader, big_file, get, kept_clients,  # labs/grading.py
                     seconds)

PIPELINED = 3000  # HEAD requests in one send: more than one recv() holds
EPOLLET = 1 << 31
REMARK = "x" * 1500  # 100 of these: an LRANGE reply of about 150 KB
grader = Grader("edge")


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


def responses(sock, count, limit):
    """How many responses of `count` arrive within `limit` seconds."""
    sock.settimeout(seconds(limit))
    data = b""
    try:
        while data.count(b"HTTP/1.1 ") < count:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    return data.count(b"HTTP/1.1 ")


@grader.check(30, "client sockets are watched edge-triggered (EPOLLET)")
def edge_triggered(lab):
    server = lab.start()
    clients = kept_clients(server.port, 5)
    time.sleep(seconds(0.2))
    interest = epoll_interest(server.pid)
    edge = [fd for fd, ev in interest.items() if ev & EPOLLET]
    for c in clients:
        c.close()
    lab.expect(len(edge) >= 5, f"{len(edge)} of {len(interest)} watched "
               "descriptors are edge-triggered")


@grader.check(30, f"{PIPELINED} pipelined requests in one send: all answered")
def pipelined(lab):
    server = lab.start()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n" * PIPELINED)
        got = responses(s, PIPELINED, limit=5)
    lab.expect(got == PIPELINED, f"{got} of {PIPELINED} answered in 5 s")


@grader.check(15, "an 8 MiB file reaches a client in full")
def big_download(lab):
    path = big_file(lab)
    server = lab.start()
    status, body = get(server.port, path, timeout=10)
    lab.expect(status == 200 and len(body) == 8 << 20,
               f"status {status}, {len(body)} bytes")


@grader.check(15, "a guestbook page whose Redis reply is 150 KB")
def big_redis_reply(lab):
    server = lab.start()
    for i in range(100):
        lab.redis.command("RPUSH", "guestbook:remarks", f"0:{REMARK}{i}")
    status, page = get(server.port, "/guestbook", timeout=5)
    lab.expect(status == 200 and page.count(REMARK.encode()) == 100,
               f"status {status}")


@grader.check(10, "a request sent one byte at a time")
def bytewise(lab):
    server = lab.start()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n\r\n":
            s.send(bytes([byte]))
            time.sleep(0.002)
        lab.expect(responses(s, 1, limit=3) == 1, "no answer")
    server.stop()


if __name__ == "__main__":
    grader.main()
