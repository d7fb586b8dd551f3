#!/usr/bin/env python3
"""Grader for the batching lab (labs/batching/README.md)."""

from grading import Grader, keepalive_load, strace_count  # labs/grading.py

REQUESTS = 4000  # keep-alive requests for /, 50 at a time
LIMIT = 0.5  # io_uring_enter calls per request; batched is near 0.1
grader = Grader("batching")


def enters_per_request(lab):
    server = lab.start()
    reason = lab.binary.unavailable()
    lab.expect(reason is None, f"io_uring is not available here: {reason}")
    calls = strace_count(server.pid, ["io_uring_enter"],
                         lambda: keepalive_load(lab, server.port, REQUESTS))
    return calls.get("io_uring_enter", 0) / REQUESTS


@grader.check(70, f"at most {LIMIT} io_uring_enter calls per request under "
              "keep-alive load")
def batched(lab):
    per = enters_per_request(lab)
    lab.expect(per <= LIMIT, f"{per:.2f} io_uring_enter calls per request")
    return f"{per:.2f} per request"


grader.still_serves(30)


if __name__ == "__main__":
    grader.main()
