#!/usr/bin/env python3
"""Grader for the reuseport lab (labs/reuseport/README.md)."""

import re
import time
from pathlib import Path

from grading import Grader, get, seconds  # labs/grading.py

LOOPS = 2
CONNECTIONS = 200  # new connections, one request each
ENV = {"ZEROHTTPD_LOOPS": str(LOOPS)}
grader = Grader("reuseport")


def listening_sockets(port):
    """Distinct sockets listening on the port (by inode): one per accept
    queue, however many descriptors point at each."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "0A":  # TCP_LISTEN
                inodes.add(fields[9])
    return len(inodes)


@grader.check(40, f"{LOOPS} loops: {LOOPS} listening sockets, each with its "
              "own accept queue")
def own_listeners(lab):
    server = lab.start(env=ENV)
    time.sleep(seconds(0.2))
    count = listening_sockets(server.port)
    lab.expect(count == LOOPS, f"{count} listening sockets on the port")


@grader.check(30, f"{CONNECTIONS} new connections: every loop serves some, "
              "and the summary says how many")
def spread(lab):
    server = lab.start(env=ENV)
    for _ in range(CONNECTIONS):
        status, _ = get(server.port, "/")
        lab.expect(status == 200, f"GET / answered {status}")
    server.stop()
    per_loop = re.search(r"per loop:((?: \d+)+)",
                         server.stdout.decode()).group(1).split()
    counts = [int(n) for n in per_loop]
    lab.expect(len(counts) == LOOPS and min(counts) > 0 and
               sum(counts) == CONNECTIONS, f"per loop: {counts}")
    return f"per loop: {counts}"


grader.still_serves(30, env=ENV)


if __name__ == "__main__":
    grader.main()
