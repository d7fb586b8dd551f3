"""What 09_reuseport adds: N event loops, one per thread, each with its own
SO_REUSEPORT listener, connections, timers and Redis link.

The server is started with ZEROHTTPD_LOOPS=2 (this machine has two cores;
the tests need two loops, not two cores). At the stop it prints the usual
summary line and then `reuseport: per loop: A B`: the requests each loop
served. Those counts, and Redis's own list of its clients, are how the tests
see the loops from outside.
"""

import os
import re
import signal
import threading
import time

import pytest

from processes import (RedisServer, ServerProcess, free_port, run_to_exit,
                       settled)
from rawhttp import (Connection, assert_prompt, assert_recovers, get,
                     slow_reader)

pytestmark = pytest.mark.models("reuseport")

LOOPS = 2
NEW_CONNECTIONS = 200  # each lands on a loop by its 4-tuple's hash
PROMPT = 0.5  # seconds: "answered promptly" while slow clients are held
SLOW_CLIENTS = 20  # of each kind, spread over both loops
RECOVERY_PAGES = 40  # /guestbook pages: both loops get some (2^-39 they don't)
STOP_LIMIT = 2.0  # seconds from SIGTERM to exit, under load
LOAD_THREADS = 4
PER_LOOP_RE = re.compile(r"^reuseport: per loop:((?: \d+)+)$", re.M)


def two_loops(binary, site, redis_port):
    return ServerProcess(binary, site, redis_port,
                         env={"ZEROHTTPD_LOOPS": str(LOOPS)})


def per_loop(server):
    """The per-loop request counts printed after the summary line."""
    m = PER_LOOP_RE.search(server.stdout.decode("utf-8", "replace"))
    assert m, f"no per-loop line: {server.stdout!r}"
    return [int(n) for n in m.group(1).split()]


def redis_links(redis):
    """Connections Redis holds, besides the one asking (one per loop that
    has talked to it)."""
    clients = redis.command("CLIENT", "LIST").strip().splitlines()
    return len(clients) - 1


# ---- the loops and the kernel's spread ----

def test_new_connections_reach_every_loop(binary, site, redis):
    server = two_loops(binary, site, redis.port)
    try:
        for _ in range(NEW_CONNECTIONS):
            assert get(server.port, "/").status == 200
        server.stop()
        counts = per_loop(server)
        assert len(counts) == LOOPS, counts
        assert sum(counts) == NEW_CONNECTIONS == server.summary()[1], counts
        # The hash of 200 different source ports: both get a share (the
        # chance that one gets none is 2^-199).
        assert all(n > 0 for n in counts), counts
    finally:
        server.cleanup()


def test_default_is_one_loop_per_usable_cpu(server):
    assert get(server.port, "/").status == 200
    server.stop()
    assert len(per_loop(server)) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "257", "many", "-1"])
def test_invalid_loop_count_exits_2_naming_it(binary, site, value):
    code, out, err = run_to_exit(binary, [str(free_port())], site,
                                 env={"ZEROHTTPD_LOOPS": value})
    assert code == 2, (code, out, err)
    assert "ZEROHTTPD_LOOPS must be a number from 1 to 256" in err, err
    assert "listening" not in out


# ---- slow clients hold no loop ----

def test_slow_clients_on_every_loop_delay_no_one(binary, site, redis):
    # Clients that stop reading an 8 MiB file, and clients that send half a
    # request, land on both loops. Fresh clients, on both loops too, are
    # answered promptly meanwhile; then the slow ones are served as well.
    server = two_loops(binary, site, redis.port)
    stalled, halves = [], []
    try:
        for _ in range(SLOW_CLIENTS):
            stalled.append(slow_reader(server.port))
            half = Connection(server.port)
            half.send(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: text/")
            halves.append(half)
        time.sleep(0.5)  # let the loops fill the readers' sockets
        assert_prompt(server.port, PROMPT, times=40)
        assert_prompt(server.port, PROMPT, times=10, path="/guestbook")
        for half in halves:
            half.send(b"html\r\n\r\n")
            assert half.read_response().status == 200
        assert stalled[0].read_response().status == 200
    finally:
        for conn in stalled + halves:
            conn.close()
    server.stop()
    counts = per_loop(server)
    # 50 fresh clients and 20 finished halves: both loops served some.
    assert all(n > 0 for n in counts), counts


# ---- each loop's own Redis link ----

def test_redis_restart_recovers_every_loop(binary, site, tmp_path):
    # Each loop has its own link: after Redis returns, each must notice its
    # link is dead and reconnect by itself, not only the one that tried.
    redis = RedisServer(tmp_path / "redis").start()
    server = two_loops(binary, site, redis.port)
    try:
        for _ in range(RECOVERY_PAGES):
            assert get(server.port, "/guestbook").status == 200
        assert settled(lambda: redis_links(redis), "Redis links") == LOOPS
        redis.proc.kill()  # SIGKILL: no goodbye on either link
        redis.proc.wait(timeout=5)
        assert get(server.port, "/guestbook").status == 503
        redis.start()  # the same port
        # A page on a new connection lands on either loop: RECOVERY_PAGES
        # in a row at 200 means both loops answer again...
        assert_recovers(server.port, timeout=5.0, checks=RECOVERY_PAGES)
        # ...and Redis sees a link from each.
        assert settled(lambda: redis_links(redis), "Redis links") == LOOPS
        server.stop()
        assert all(n > 0 for n in per_loop(server))
    finally:
        server.cleanup()
        redis.stop()


# ---- the stop ----

def keep_asking(port, stopping, errors):
    """Keep-alive requests for / and /guestbook until `stopping`, on a new
    connection whenever the server closes one (it will, at the stop)."""
    while not stopping.is_set():
        try:
            with Connection(port, timeout=2) as conn:
                while not stopping.is_set():
                    for path in ("/", "/guestbook"):
                        conn.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"
                                  .encode())
                        conn.read_response()
        except (OSError, AssertionError) as e:
            errors.append(e)  # expected once the server stops
            time.sleep(0.01)


def test_sigterm_under_load_exits_0_within_2_seconds(binary, site, redis):
    server = two_loops(binary, site, redis.port)
    stopping, errors = threading.Event(), []
    threads = [threading.Thread(target=keep_asking,
                                args=(server.port, stopping, errors))
               for _ in range(LOAD_THREADS)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert not errors, errors[:3]  # the load ran cleanly until now
        started = time.monotonic()
        assert server.terminate(timeout=STOP_LIMIT) == 0
        took = time.monotonic() - started
        assert took < STOP_LIMIT, f"exit took {took:.2f} s"
    finally:
        stopping.set()
        for t in threads:
            t.join(timeout=10)
    server.check_exit()  # exit 0, the summary, no sanitizer report
    counts = per_loop(server)
    assert sum(counts) == server.summary()[1] > 0, counts


def test_sigint_stops_like_sigterm(binary, site, redis):
    server = two_loops(binary, site, redis.port)
    try:
        assert get(server.port, "/").status == 200
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=5) == 0
        server.result = 0
        server._read_stdout(PER_LOOP_RE, time.monotonic() + 2)
        assert sum(per_loop(server)) == 1
    finally:
        server.cleanup()
