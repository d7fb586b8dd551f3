#!/usr/bin/env python3
"""Grader for the batching lab (labs/batching/README.md)."""

import subprocess

from grading import Grader, get, seconds, strace_count  # labs/grading.py

REQUESTS = 4000  # keep-alive requests for /, 50 at a time
LIMIT = 0.5  # io_uring_enter calls per request; batched is near 0.1
grader = Grader("batching")


def enters_per_request(lab):
    server = lab.start()
    reason = lab.binary.unavailable()
    lab.expect(reason is None, f"io_uring is not available here: {reason}")
    url = f"http://127.0.0.1:{server.port}/"

    def load():
        done = subprocess.run(["ab", "-q", "-k", "-n", str(REQUESTS), "-c",
                               "50", "-s", str(int(seconds(20))), url],
                              capture_output=True, text=True,
                              timeout=seconds(120))
        lab.expect(done.returncode == 0 and "Failed requests:        0"
                   in done.stdout, "ab failed: " + done.stdout[-300:] +
                   done.stderr[-300:])

    calls = strace_count(server.pid, ["io_uring_enter"], load)
    return calls.get("io_uring_enter", 0) / REQUESTS


@grader.check(70, f"at most {LIMIT} io_uring_enter calls per request under "
              "keep-alive load")
def batched(lab):
    per = enters_per_request(lab)
    lab.expect(per <= LIMIT, f"{per:.2f} io_uring_enter calls per request")
    return f"{per:.2f} per request"


@grader.check(30, "pages and the guestbook still served; a clean stop")
def still_serves(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        status, _ = get(server.port, path)
        lab.expect(status == 200, f"GET {path} answered {status}")
    server.stop()


if __name__ == "__main__":
    grader.main()
