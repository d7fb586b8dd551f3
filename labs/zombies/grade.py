#!/usr/bin/env python3
"""Grader for the zombies lab (labs/zombies/README.md)."""

import grading  # labs/grading.py: tools/lab puts labs/ on the path
from grading import Grader, get, live_children, wait_for, zombie_children

REQUESTS = 300  # each on its own connection: one child each
grader = Grader("zombies")


def serve_many(server):
    for _ in range(REQUESTS):
        status, _ = get(server.port, "/")
        if status != 200:
            raise grading.Unmet(f"GET / answered {status}")


@grader.check(60, f"no zombie left after {REQUESTS} requests")
def no_zombies(lab):
    server = lab.start()
    serve_many(server)
    zombies = wait_for(lambda: len(zombie_children(server.pid)),
                       lambda n: n == 0, limit=3)
    lab.expect(zombies == 0, f"{zombies} zombie children 3 s after the last "
               "client (look at them: ps -o pid,stat,cmd --ppid PID)")


@grader.check(20, "every child exits when its client is done")
def children_exit(lab):
    server = lab.start()
    serve_many(server)
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n == 0, limit=3)
    lab.expect(alive == 0, f"{alive} children still running")


@grader.check(20, "still serving, and stops cleanly with its summary")
def clean_stop(lab):
    server = lab.start()
    serve_many(server)
    status, _ = get(server.port, "/guestbook")
    lab.expect(status == 200, f"GET /guestbook answered {status}")
    server.stop()  # exit 0, summary printed, no process left behind


if __name__ == "__main__":
    grader.main()
