#!/usr/bin/env python3
"""Grader for the lookup lab (labs/lookup/README.md)."""

from grading import (Grader, build_reference, keepalive_load,  # labs/
                     kept_clients, raise_open_file_limit, user_ticks)

IDLE = 5000  # idle keep-alive clients beside the busy ones
REQUESTS = 20000  # keep-alive requests for /, 50 at a time
RATIO = 2.0  # user CPU per request against the reference, at most
grader = Grader("lookup")


def user_cpu_under_load(lab, binary=None):
    """The server's user CPU (ticks) for REQUESTS with IDLE clients open."""
    server = lab.start(binary=binary)
    idle = kept_clients(server.port, IDLE)
    before = user_ticks(server.pid)
    keepalive_load(lab, server.port, REQUESTS)
    ticks = user_ticks(server.pid) - before
    for s in idle:
        s.close()
    server.stop()
    return ticks


@grader.check(70, f"user CPU per request with {IDLE} idle clients at most "
              f"{RATIO:g}x the reference's, measured in the same run")
def lookup_is_cheap(lab):
    raise_open_file_limit()
    reference = build_reference("06_poll", lab.workdir)
    yours = user_cpu_under_load(lab)
    ref = user_cpu_under_load(lab, reference)
    lab.expect(yours <= RATIO * ref + 5,  # 5 ticks: 50 ms of slack
               f"{yours} ticks of user CPU against the reference's {ref}")
    return f"{yours} ticks against the reference's {ref}"


grader.still_serves(30)


if __name__ == "__main__":
    grader.main()
