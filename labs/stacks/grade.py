#!/usr/bin/env python3
"""Grader for the stacks lab (labs/stacks/README.md)."""

import time

from grading import (Grader, idle_clients, seconds,  # labs/grading.py
                     status_field, wait_for)

IDLE = 300  # idle keep-alive clients: a thread (and a stack) each
LIMIT_KB = 1024  # virtual memory per thread: a 64 KiB stack is far below
# One malloc arena for all threads: glibc otherwise reserves 64 MiB of
# address space per arena (up to 8 per core), which would swamp the stacks.
ENV = {"MALLOC_ARENA_MAX": "1"}
grader = Grader("stacks")


def per_thread_kb(lab):
    """VmSize added per thread while IDLE clients are connected."""
    server = lab.start(env=ENV)
    before = status_field(server.pid, "VmSize")
    clients = idle_clients(server.port, IDLE)
    threads = wait_for(lambda: status_field(server.pid, "Threads"),
                       lambda n: n > IDLE, limit=5)
    time.sleep(seconds(0.2))
    after = status_field(server.pid, "VmSize")
    for c in clients:
        c.close()
    lab.expect(threads > IDLE, f"{threads} threads for {IDLE} clients")
    return (after - before) / (threads - 1), server


@grader.check(60, f"at most {LIMIT_KB} KiB of address space per thread with "
              f"{IDLE} idle clients")
def small_stacks(lab):
    kb, _ = per_thread_kb(lab)
    lab.expect(kb <= LIMIT_KB, f"{kb:.0f} KiB per thread")
    return f"{kb:.0f} KiB per thread"


grader.still_serves(40, env=ENV)


if __name__ == "__main__":
    grader.main()
