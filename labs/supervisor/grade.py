#!/usr/bin/env python3
"""Grader for the supervisor lab (labs/supervisor/README.md)."""

import os
import signal

from grading import (Grader, get, live_children, wait_for,  # labs/grading.py
                     zombie_children)

WORKERS = 4
grader = Grader("supervisor")


def pool(lab):
    """A server with WORKERS workers, all started."""
    server = lab.start(env={"ZEROHTTPD_WORKERS": str(WORKERS)})
    started = wait_for(lambda: live_children(server.pid),
                       lambda w: len(w) == WORKERS, limit=3)
    lab.expect(len(started) == WORKERS, f"{len(started)} workers at start")
    return server, started


def kill_and_count(lab, server, victims):
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    alive = wait_for(lambda: live_children(server.pid),
                     lambda w: len(w) == WORKERS and not set(w) & set(victims),
                     limit=2)
    lab.expect(len(alive) == WORKERS and not set(alive) & set(victims),
               f"{len(alive)} workers 2 s after SIGKILL to {len(victims)}")
    zombies = zombie_children(server.pid)
    lab.expect(not zombies, f"{len(zombies)} zombie workers")


@grader.check(40, "a worker killed with SIGKILL is replaced within 2 s")
def replaced(lab):
    server, workers = pool(lab)
    kill_and_count(lab, server, workers[:1])


@grader.check(30, "three workers killed at once are all replaced")
def replaced_many(lab):
    server, workers = pool(lab)
    kill_and_count(lab, server, workers[:3])


@grader.check(30, "every worker killed: the pool comes back, answers and stops "
              "cleanly")
def serves_after(lab):
    server, workers = pool(lab)
    kill_and_count(lab, server, workers)  # a client caught in a dying
    for _ in range(20):                   # worker's accept() would be lost
        status, _ = get(server.port, "/", timeout=3)
        lab.expect(status == 200, f"GET / answered {status or 'nothing'}")
    server.stop()


if __name__ == "__main__":
    grader.main()
