"""What only the event-loop servers (poll, epoll, io_uring, reuseport; and
fibers, an event loop from outside) promise.

One thread serves everyone (reuseport: each loop's thread serves its own),
so nothing one client (or Redis) does may hold up the others: 10,000 idle
keep-alive connections, a reader that stops reading,
a request that stops halfway, a Redis that stops answering or restarts. Each
test shows that with real sockets and real processes, and then checks that
the server gave back every descriptor (counted in /proc/PID/fd).
"""

import select
import signal
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from processes import (DEFER_ACCEPT, RedisServer, ServerProcess, fd_count,
                       need_descriptors, redis_settle, settled, wait_for_fds)
from rawhttp import (HOST, Connection, assert_html_error,
                     assert_prompt, assert_recovers, get, open_asking,
                     slow_reader)

pytestmark = [pytest.mark.models("poll", "epoll", "io_uring", "reuseport",
                                 "fibers"),
              pytest.mark.usefixtures("many_descriptors")]

IDLE_CLIENTS = 10_000
FD_MARGIN = 512  # descriptors beyond the idle clients: ours, the server's
PROMPT = 0.5  # seconds: "served promptly" while the loop is under strain
REDIS_TIMEOUT = 1.0  # seconds the servers wait for a Redis reply
STALLED_READERS = 50
SEND_TIMEOUT = 10.0  # seconds without write progress: the reader is dropped
WARM_UP = 0.5  # seconds of guestbook load before the descriptors are counted


WANTED_FDS = IDLE_CLIENTS + FD_MARGIN  # per process: ours, and the server's



# ---- looking at the server from outside ----


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def readable(conns):
    """How many of conns have something to read: bytes nobody asked for, or
    the server's FIN. One poll() over all (select() stops at fd 1024)."""
    poller = select.poll()
    for conn in conns:
        poller.register(conn.sock, select.POLLIN)
    return len(poller.poll(0))


# ---- many idle connections ----

# Serial: all 10,000 must open within the 5 s idle timeout, which beside
# make test's parallel tests and lab gradings took 4.3-5.3 s (2026-11-27).
@pytest.mark.serial
def test_10000_idle_keep_alive_connections(server):
    need_descriptors(WANTED_FDS)
    baseline = settled(lambda: fd_count(server.pid), "descriptor count")
    started = time.monotonic()
    conns = []
    try:
        # Each one asks for a small file and keeps the connection: the
        # requests go out as the connections open, the answers are read
        # after, so all 10,000 are open at once and then idle, well within
        # the 5 s idle timeout.
        open_asking(server.port, IDLE_CLIENTS, conns)
        for conn in conns:
            assert conn.read_response().status == 200
        opened = time.monotonic() - started
        assert_prompt(server.port, PROMPT)
        # Every one answered and none closed: all held at once (the first
        # has idled `opened` seconds; the idle timeout is 5 s).
        assert opened < 4, f"opening took {opened:.1f} s: too slow to test"
        assert readable(conns) == 0, "the server closed idle connections"
    finally:
        for conn in conns:
            conn.close()
    assert wait_for_fds(server.pid, baseline) <= baseline


# ---- a new client ----

def test_a_client_is_accepted_with_its_first_bytes(server):
    # The listener defers accepting (TCP_DEFER_ACCEPT): a connection whose
    # handshake is done but that has said nothing costs the server no
    # descriptor and no wake-up yet; its first bytes bring it in, and it is
    # answered at once (a 404: no file is opened, so none stays cached).
    baseline = settled(lambda: fd_count(server.pid), "descriptor count")
    with Connection(server.port) as quiet:
        time.sleep(DEFER_ACCEPT / 2)
        assert fd_count(server.pid) == baseline, "accepted before a word"
        quiet.send(b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n")
        assert quiet.read_response().status == 404
    assert wait_for_fds(server.pid, baseline) <= baseline



def test_clients_still_served_after_older_ones_leave(server):
    # Five keep-alive clients, each answered once; then the three oldest
    # hang up, one at a time, each close seen by the server before the
    # next. The two newest, whose entries sit last in the server's own
    # tables (poll's array: each hole is filled by the last entry), must
    # still be answered: a removal that drops the last entry instead of
    # moving it into the hole loses a live client, who waits for ever.
    baseline = settled(lambda: fd_count(server.pid), "descriptor count")
    ask = b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n"
    clients = [Connection(server.port, timeout=5) for _ in range(5)]
    try:
        for conn in clients:
            conn.send(ask)
            assert conn.read_response().status == 404
        for k, conn in enumerate(clients[:3]):
            conn.close()
            assert wait_for_fds(server.pid, baseline + 4 - k) \
                <= baseline + 4 - k, "the server kept a closed client"
        for _ in range(2):
            for conn in clients[3:]:
                conn.send(ask)
                assert conn.read_response().status == 404
    finally:
        for conn in clients:
            conn.close()


# ---- clients that stop halfway ----

def test_readers_that_stop_reading_cost_no_memory_or_time(server, site):
    # 50 clients ask for an 8 MiB file and read nothing. The server must
    # leave the file in the page cache (sendfile, or bounded buffers), not
    # copy it per client, and keep serving others while their sockets are
    # full. Then one of them reads its file to the end.
    big = (site / "public" / "big.bin").read_bytes()
    rss_before = rss_kib(server.pid)
    stalled = []
    try:
        for _ in range(STALLED_READERS):
            stalled.append(slow_reader(server.port))
        time.sleep(0.5)  # let the server fill their sockets
        assert_prompt(server.port, PROMPT)
        growth = rss_kib(server.pid) - rss_before
        assert growth < 16 * 1024, f"RSS grew {growth} KiB for 50 stalled reads"
        resp = stalled[0].read_response()
        assert resp.status == 200 and resp.body == big
    finally:
        for conn in stalled:
            conn.close()


def test_reader_that_stops_reading_is_dropped(server, site):
    # A client asks for the 8 MiB file and never reads. Once its socket is
    # full, the server waits SEND_TIMEOUT for progress, then drops it: a
    # reader gone silent does not hold a connection for ever. The bytes in
    # flight still arrive, then the end: the file is cut short.
    size = (site / "public" / "big.bin").stat().st_size
    got = 0
    with slow_reader(server.port) as conn:
        time.sleep(SEND_TIMEOUT + 2)
        conn.sock.settimeout(3)
        try:
            while chunk := conn.sock.recv(1 << 20):
                got += len(chunk)
        except (ConnectionResetError, socket.timeout):
            pass  # a timeout: still open, the whole file read
    assert got < size, f"never dropped: {got} bytes read after its nap"


def test_half_sent_request_does_not_delay_others(server):
    with Connection(server.port) as half:
        half.send(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: text/")
        assert_prompt(server.port, PROMPT)
        half.send(b"html\r\n\r\n")  # and it is still served, later
        assert half.read_response().status == 200


# ---- Redis that stalls or restarts ----

@pytest.fixture
def silent_redis():
    """A TCP listener that never answers: the kernel completes the
    handshake, so the server connects and sends, and no reply ever comes."""
    with socket.create_server((HOST, 0), backlog=64) as listener:
        yield listener.getsockname()[1]


def guestbook_503_while_others_flow(port):
    """GET /guestbook on a new connection while Redis is silent: static
    requests meanwhile are answered promptly, the guestbook with a 503.
    Returns the seconds the 503 took."""
    def run():
        started = time.monotonic()
        with Connection(port) as conn:
            conn.send(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
            return conn.read_response(), time.monotonic() - started
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(run)
        assert_prompt(port, PROMPT, times=5)
        resp, took = waiting.result(timeout=10)
    assert_html_error(resp, 503)
    return took


def test_stalled_redis_gets_503_and_delays_no_one(binary, site, silent_redis):
    server = ServerProcess(binary, site, silent_redis)
    try:
        took = guestbook_503_while_others_flow(server.port)
        # Not sooner: Redis accepted the command and could still answer.
        assert REDIS_TIMEOUT * 0.8 <= took < REDIS_TIMEOUT + 0.5, took
        server.stop()
    finally:
        server.cleanup()


def test_stopped_redis_then_continued(binary, site, tmp_path):
    # A real Redis frozen with SIGSTOP: connected, silent. Guestbook
    # requests get 503 in time, static files flow, and after SIGCONT the
    # guestbook recovers by itself.
    redis = RedisServer(tmp_path / "redis").start()
    server = ServerProcess(binary, site, redis.port)
    try:
        assert get(server.port, "/guestbook").status == 200
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            took = guestbook_503_while_others_flow(server.port)
            assert took < REDIS_TIMEOUT + 0.5, took
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert_recovers(server.port, timeout=5.0, checks=5,
                        settle=redis_settle(server.model))
        server.stop()
    finally:
        server.cleanup()
        redis.stop()


def test_client_gone_while_waiting_for_redis(binary, site, tmp_path):
    # A kept connection (the loop watches it) asks for the page while Redis
    # is silent (frozen with SIGSTOP for less than the reply timeout), then
    # leaves with a reset: an error event while its reply is due. The
    # reply, when it comes, is owed to no one: dropped, not handed to
    # memory the gone client left. The server serves on and stops cleanly.
    redis = RedisServer(tmp_path / "redis").start()
    server = ServerProcess(binary, site, redis.port)
    try:
        assert get(server.port, "/guestbook").status == 200
        with Connection(server.port) as gone:
            gone.send(b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            assert gone.read_response().status == 200
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                gone.send(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
                time.sleep(0.2)
                gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
                gone.close()
                time.sleep(0.2)  # the server sees it leave
            finally:
                redis.proc.send_signal(signal.SIGCONT)
        for _ in range(5):
            assert get(server.port, "/guestbook").status == 200
        server.stop()
    finally:
        server.cleanup()
        redis.stop()


class GuestbookLoad:
    """Threads requesting /guestbook in a loop, for at most `limit` seconds,
    recording (time, status) of each answer; an exception is recorded as
    status 0 (it must not happen: no resets, no hangs)."""

    def __init__(self, port, threads=4, limit=30.0):
        self.port = port
        self.results = []
        self.stopping = threading.Event()
        self.deadline = time.monotonic() + limit
        self.threads = [threading.Thread(target=self._run)
                        for _ in range(threads)]

    def _run(self):
        while not self.stopping.is_set() and time.monotonic() < self.deadline:
            try:
                status = get(self.port, "/guestbook").status
            except (OSError, AssertionError):
                status = 0
            self.results.append((time.monotonic(), status))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)

    def statuses_since(self, when):
        return [s for t, s in list(self.results) if t >= when]


def test_redis_restarted_under_load(binary, site, tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    server = ServerProcess(binary, site, redis.port)
    try:
        # The count includes the Redis link: every loop's, where there are
        # several (09), so pages on new connections until each has its own.
        with GuestbookLoad(server.port) as warm_up:
            time.sleep(WARM_UP)
        assert {s for _, s in warm_up.results} == {200}
        baseline = settled(lambda: fd_count(server.pid), "descriptor count")
        with GuestbookLoad(server.port) as load:
            time.sleep(0.5)
            redis.proc.kill()  # SIGKILL: no goodbye on the link
            redis.proc.wait(timeout=5)
            killed = time.monotonic()
            time.sleep(1.0)
            redis.start()  # the same port
            restarted = time.monotonic()
            deadline = restarted + 5
            while 200 not in load.statuses_since(restarted):
                assert time.monotonic() < deadline, "no 200 after restart"
                time.sleep(0.05)
            time.sleep(max(0.5, redis_settle(server.model)))
        statuses = [s for _, s in load.results]
        assert set(statuses) <= {200, 503}, sorted(set(statuses))
        assert 503 in load.statuses_since(killed), "Redis down, yet no 503"
        assert statuses[-5:] == [200] * 5
        assert_recovers(server.port, timeout=5.0, checks=5,
                        settle=redis_settle(server.model))
        assert wait_for_fds(server.pid, baseline) <= baseline
        server.stop()
    finally:
        server.cleanup()
        redis.stop()


def open_files(pid, name):
    """The descriptors of `pid` open on a file whose path ends with `name`."""
    fds = Path(f"/proc/{pid}/fd")
    found = set()
    for fd in fds.iterdir():
        try:
            if fd.readlink().as_posix().endswith(name):
                found.add(int(fd.name))
        except FileNotFoundError:  # closed while we looked
            pass
    return found


@pytest.mark.models("io_uring")
def test_io_uring_keeps_a_hot_file_open_between_requests(server):
    # 08 keeps a small file it has just served open for FILE_CACHE_MS (1 s),
    # so asking again costs no openat2/fstat/close: the same descriptor
    # serves every request for "/" (its index.html) within that second.
    for _ in range(3):  # a round may straddle an expiry: then try again
        seen = []
        for _ in range(5):
            assert get(server.port, "/").status == 200
            seen.append(open_files(server.pid, "/public/index.html"))
        one_fd_throughout = len(seen[0]) == 1 and all(
            fds == seen[0] for fds in seen)
        if one_fd_throughout:
            break
    assert one_fd_throughout, seen
