"""What 10_fibers promises beyond the event servers' tests: a fiber per
client, each on a stack of its own with a guard page below it, all of them
served by one loop however many wait at once.

The stacks are seen from outside, in /proc/PID/maps: each fiber's stack is
an rw-p mapping with a one-page ---p (PROT_NONE) mapping right below it.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from processes import (fd_count, guarded_stacks, need_descriptors, settled,
                       wait_for_fds)
from rawhttp import Connection, assert_prompt, get, open_asking

pytestmark = [pytest.mark.models("fibers"),
              pytest.mark.usefixtures("many_descriptors")]

CLIENTS = 1000
IDLE = 200  # idle clients whose stacks are counted
PROMPT = 0.5  # seconds: "served promptly" while others stall
WANTED_FDS = CLIENTS + 512  # ours, with room for the server's


def test_1000_concurrent_keep_alive_clients_are_all_served(server):
    need_descriptors(WANTED_FDS)
    conns = []
    try:
        # All connect and ask before any answer is read: 1,000 fibers at
        # once. Then each asks again on the same connection: every fiber
        # parked between its requests and was woken for the next.
        open_asking(server.port, CLIENTS, conns)
        for conn in conns:
            assert conn.read_response().status == 200
        for conn in conns:
            conn.send(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
        statuses = [conn.read_response().status for conn in conns]
        assert statuses == [200] * CLIENTS
    finally:
        for conn in conns:
            conn.close()


def test_stalled_clients_delay_no_one(server):
    # Clients that stop halfway through a head, a body, or while being
    # answered each hold a parked fiber; everyone else is served at once.
    stalled = []
    try:
        for _ in range(20):
            half = Connection(server.port)
            half.send(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: te")
            stalled.append(half)
            body = Connection(server.port)
            body.send(b"POST /guestbook HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/x-www-form-urlencoded\r\n"
                      b"Content-Length: 100\r\n\r\nguest-remarks=")
            stalled.append(body)
        assert_prompt(server.port, PROMPT)
        assert_prompt(server.port, PROMPT, times=5, path="/guestbook")
        # and the stalled ones are still served when they go on
        stalled[0].send(b"xt/html\r\n\r\n")
        assert stalled[0].read_response().status == 200
    finally:
        for conn in stalled:
            conn.close()


def test_each_client_fiber_has_a_guarded_stack_freed_when_it_leaves(server):
    assert get(server.port, "/").status == 200
    baseline = settled(lambda: guarded_stacks(server.pid), "stack count")
    fds = settled(lambda: fd_count(server.pid), "descriptor count")
    conns = []
    try:
        open_asking(server.port, IDLE, conns,
                    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for conn in conns:
            assert conn.read_response().status == 200
        # All IDLE fibers are parked now, each on its own guarded stack.
        assert guarded_stacks(server.pid) - baseline == IDLE
    finally:
        for conn in conns:
            conn.close()
    assert wait_for_fds(server.pid, fds) <= fds
    deadline = time.monotonic() + 5
    while guarded_stacks(server.pid) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guarded_stacks(server.pid) == baseline, "stacks left mapped"


def test_many_waiting_on_redis_at_once_are_answered_in_order(server):
    # 100 fibers park in the Redis FIFO at once (their commands share a
    # pipeline); each must get its own replies: every page renders whole.
    def page(_):
        resp = get(server.port, "/guestbook")
        return resp.status, resp.body.rstrip().endswith(b"</html>")
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(page, range(100)))
    assert results == [(200, True)] * 100
