#!/usr/bin/env python3
"""The thundering herd, measured: K processes wait on one listening socket,
the parent makes N connections one at a time, and every process counts how
often it woke up and how often it got a connection.

  accept     each process blocks in accept()           (03_preforked's way)
  epoll      each has its own epoll on the listener    (what an event server
             and tries a non-blocking accept() on wake  with workers does)
  exclusive  the same with EPOLLEXCLUSIVE (Linux 4.5)

Two counts per mode: the times a waiter returned from its wait (epoll
checks readiness again before it returns, so a waiter that lost the race
often goes back to sleep inside the kernel), and the times the kernel woke
it at all (its voluntary context switches), per connection made.
Run: python3 labs/supervisor/herd.py [--procs 8] [--connections 200]
Only 127.0.0.1; every process it starts is ended before it returns.
"""

import argparse
import os
import select
import socket
import time


def switches():
    """This process's voluntary context switches: each sleep that ended."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def waiter(listener, mode, report, ready):
    wakes = accepted = 0
    listener.setblocking(mode == "accept")
    ep = None
    if mode != "accept":
        ep = select.epoll()
        flags = select.EPOLLIN | (select.EPOLLEXCLUSIVE
                                  if mode == "exclusive" else 0)
        ep.register(listener.fileno(), flags)
    os.write(ready, b".")
    start = switches()
    while True:
        try:
            if ep:
                events = ep.poll(1.0)
                if not events:
                    continue
            conn, _ = listener.accept()
            wakes += 1
        except BlockingIOError:
            wakes += 1  # woken, but another process took the connection
            continue
        conn.settimeout(1.0)
        if conn.recv(1) == b"q":  # the parent's "report and exit"
            slept = switches() - start
            os.write(report, f"{wakes - 1} {accepted} {slept}\n".encode())
            os._exit(0)
        accepted += 1
        conn.close()


def run(mode, procs, connections):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    report_r, report_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pids = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:
            waiter(listener, mode, report_w, ready_w)
        pids.append(pid)
    started = 0
    while started < procs:
        started += len(os.read(ready_r, procs))
    time.sleep(0.2)  # every waiter is asleep in accept() or epoll_wait()
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"x")
            c.recv(1)  # until the waiter closes: one at a time
        time.sleep(0.002)  # let every woken waiter go back to sleep
    wakes = accepted = slept = 0
    for _ in pids:  # one "q" per waiter; each answers once and exits
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"q")
            w, a, s = os.read(report_r, 64).split()
            wakes, accepted, slept = (wakes + int(w), accepted + int(a),
                                      slept + int(s))
    for pid in pids:
        os.waitpid(pid, 0)
    listener.close()
    return wakes, accepted, slept


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()
    print(f"{args.procs} processes, {args.connections} connections, "
          "one at a time")
    print(f"{'mode':10} {'accepted':>9} {'returns/conn':>13} "
          f"{'kernel wake-ups/conn':>21}")
    for mode in ("accept", "epoll", "exclusive"):
        wakes, accepted, slept = run(mode, args.procs, args.connections)
        n = max(accepted, 1)
        print(f"{mode:10} {accepted:>9} {wakes / n:>13.2f} {slept / n:>21.2f}")


if __name__ == "__main__":
    main()
