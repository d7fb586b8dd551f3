#!/usr/bin/env python3
"""Grader for the batching lab (labs/batching/README.md).

What is counted is the loop's own promise: one io_uring_enter() per loop
turn, the one that submits and waits. Every enter that only submits (its
min_complete is 0) is a turn paying twice, whatever the load; that is
measured per turn, not only per request, so submitting every 8th entry or
once more per turn shows. The ring must be the reference's (no SQPOLL
kernel thread submitting for the server)."""

from pathlib import Path

from grading import (Grader, descriptors, keepalive_load,  # labs/grading.py
                     strace_calls, strace_count)

REQUESTS = 4000  # keep-alive requests for /, 50 at a time
PER_REQUEST = 0.5  # io_uring_enter calls per request; batched is near 0.1
SHARE = 0.1  # enters that only submit, of all enters; batched: none
WATCH = ("watch it: strace -f -e trace=io_uring_enter -p $(pgrep -x "
         "io_uring) under ab -k -n 4000 -c 50 (the 3rd argument, "
         "min_complete, is 0 on an enter that only submits)")
grader = Grader("batching")


def ring_server(lab):
    """The server, refused if io_uring is not available or if its ring has
    an SQPOLL thread (a kernel thread that submits instead of the loop)."""
    server = lab.start()
    reason = lab.binary.unavailable()
    lab.expect(reason is None, f"io_uring is not available here: {reason}")
    rings = [fd for fd, what in descriptors(server.pid).items()
             if what == "anon_inode:[io_uring]"]
    lab.expect(rings, "no io_uring descriptor in /proc/PID/fd")
    for fd in rings:
        info = Path(f"/proc/{server.pid}/fdinfo/{fd}").read_text()
        lab.expect("SqThread:\t-1" in info,
                   f"the ring has an SQPOLL thread (SqThread in /proc/"
                   f"{server.pid}/fdinfo/{fd}): a kernel thread submitting "
                   "on a core of its own does not batch; keep the "
                   "reference's ring flags")
    return server


@grader.check(40, f"at most {PER_REQUEST} io_uring_enter calls per request "
              "under keep-alive load (ab -k -c 50)")
def batched(lab):
    server = ring_server(lab)
    calls = strace_count(server.pid, ["io_uring_enter"],
                         lambda: keepalive_load(lab, server.port, REQUESTS))
    per = calls.get("io_uring_enter", 0) / REQUESTS
    lab.expect(per <= PER_REQUEST, f"{per:.2f} io_uring_enter calls per "
               f"request; {WATCH}")
    return f"{per:.2f} per request"


@grader.check(30, "one io_uring_enter per loop turn, the one that submits "
              f"and waits: at most {SHARE:.0%} of enters only submit")
def one_enter_per_turn(lab):
    server = ring_server(lab)
    calls = strace_calls(server.pid, "io_uring_enter",
                         lambda: keepalive_load(lab, server.port, REQUESTS))
    args = [call.split(", ") for call in calls if call.count(", ") > 2]
    extra = sum(1 for a in args if a[2] == "0")  # min_complete 0
    handed = sum(int(a[1]) for a in args if a[1].isdigit())
    lab.expect(extra <= SHARE * len(args),
               f"{extra} of {len(args)} io_uring_enter calls only submitted "
               f"(min_complete 0), {handed / max(len(args), 1):.1f} entries "
               f"each on average: an enter more per turn; {WATCH}")
    return f"{extra} of {len(args)} enters only submitted"


grader.still_serves(30)


if __name__ == "__main__":
    grader.main()
