"""Connections: keep-alive, pipelining, slow senders, headers, timeouts.

01_iterative is the one server that always answers `Connection: close` and
closes (a kept connection would starve everyone else); tests where that
matters branch on it explicitly.
"""

import email.utils
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from processes import DEFER_ACCEPT, REQUEST_TIMEOUT
from rawhttp import Connection, exchange

IDLE_TIMEOUT = 5  # seconds a kept connection may idle between requests


def test_http_1_1_keeps_the_connection(server, site):
    index = (site / "public" / "index.html").read_bytes()
    with Connection(server.port) as conn:
        if server.model == "iterative":
            # Iterative: one request per connection, said and done.
            conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            resp = conn.read_response()
            assert resp.body == index
            assert resp.headers["Connection"].lower() == "close"
            assert conn.wait_closed(3)
            return
        for _ in range(3):
            conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            resp = conn.read_response()
            assert resp.status == 200 and resp.body == index
            assert resp.headers.get("Connection", "").lower() != "close"


def test_http_1_0_keep_alive_is_kept_and_said(server):
    with Connection(server.port) as conn:
        conn.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        resp = conn.read_response()
        assert resp.status == 200
        if server.model == "iterative":
            # Iterative closes even when asked to keep the connection.
            assert resp.headers["Connection"].lower() == "close"
            assert conn.wait_closed(3)
            return
        # ab -k only reuses a connection that says so.
        assert resp.headers["Connection"].lower() == "keep-alive"
        conn.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert conn.read_response().status == 200


def test_http_1_0_closes_by_default(server):
    with Connection(server.port) as conn:
        conn.send(b"GET / HTTP/1.0\r\n\r\n")
        resp = conn.read_response()
        assert resp.status == 200
        assert resp.headers.get("Connection", "close").lower() == "close"
        assert conn.wait_closed(3)


def test_connection_close_is_honoured(server):
    with Connection(server.port) as conn:
        conn.send(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        resp = conn.read_response()
        assert resp.status == 200
        assert resp.headers["Connection"].lower() == "close"
        assert conn.wait_closed(3)


def test_pipelined_requests_answered_in_order(server, site):
    types = site / "public" / "types"
    with Connection(server.port) as conn:
        conn.send(b"GET /types/notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /types/style.css HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /types/data.json HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        first = conn.read_response()
        assert first.body == (types / "notes.txt").read_bytes()
        if server.model == "iterative":
            # Iterative answers the first request only, then closes; the
            # two behind it are dropped with the connection.
            assert conn.wait_closed(3)
            return
        assert conn.read_response().body == (types / "style.css").read_bytes()
        assert conn.read_response().body == (types / "data.json").read_bytes()
        assert conn.wait_closed(3)


def test_request_sent_one_byte_at_a_time(server, site):
    request = b"GET /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with Connection(server.port) as conn:
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(request)):
            conn.send(request[i:i + 1])
            time.sleep(0.002)  # each byte its own segment
        resp = conn.read_response()
    assert resp.status == 200
    assert resp.body == (site / "public" / "index.html").read_bytes()


def test_response_headers_present(server):
    for target in (b"/", b"/no-such-file", b"/docs", b"/guestbook"):
        resp = exchange(server.port,
                        b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        for name in ("Date", "Server", "Content-Length", "Content-Type"):
            assert len(resp.headers.get_all(name)) == 1, (target, resp)
        assert resp.headers["Server"] == f"zerohttpd/{server.model}"
        assert int(resp.headers["Content-Length"]) == len(resp.body)


def test_date_header_is_http_date_of_now(server):
    resp = exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    date = resp.headers["Date"]
    # IMF-fixdate, as RFC 9110 requires: Sun, 06 Nov 1994 08:49:37 GMT
    assert re.fullmatch(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d "
                        r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
                        r"\d{4} \d\d:\d\d:\d\d GMT", date), date
    sent = email.utils.parsedate_to_datetime(date).timestamp()
    assert abs(sent - time.time()) < 60


def test_curl_reuses_the_connection(server, site):
    url = f"http://127.0.0.1:{server.port}"
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-w", "%{http_code} %{num_connects}\n",
         "-o", "/dev/null", f"{url}/index.html", "-o", "/dev/null", f"{url}/docs/"],
        capture_output=True, timeout=20, check=True)
    lines = out.stdout.decode().split()
    if server.model == "iterative":
        # Iterative closes after each response: curl connects twice.
        assert lines == ["200", "1", "200", "1"]
    else:
        assert lines == ["200", "1", "200", "0"]


def test_idle_silent_and_stalled_connections_are_closed(server):
    # The clocks run at once to keep the suite short: a kept connection
    # idling after its response (closed at ~5 s), a client that connects and
    # never says a word (~5 s; the event servers defer accepting it until
    # its first bytes, and the kernel hands it over after DEFER_ACCEPT
    # without them), and a request stalled after its first bytes (~10 s).
    def closed_after(conn, since, allow_data):
        assert conn.wait_closed(REQUEST_TIMEOUT + 5, allow_data=allow_data)
        return time.monotonic() - since

    with Connection(server.port) as stalled, ThreadPoolExecutor(2) as pool:
        stalled_since = time.monotonic()
        stalled.send(b"GET / HTTP/1.1\r\nHo")
        stalled_closed = pool.submit(closed_after, stalled, stalled_since, True)
        # Iterative keeps no connection to idle: it closes after each response,
        # and meets the silent one only once the stalled one is gone.
        if server.model != "iterative":
            with Connection(server.port) as silent, \
                    Connection(server.port) as idle:
                silent_closed = pool.submit(closed_after, silent,
                                            time.monotonic(), False)
                idle.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert idle.read_response().status == 200
                idle_closed = closed_after(idle, time.monotonic(), False)
                assert IDLE_TIMEOUT - 2 <= idle_closed <= IDLE_TIMEOUT + 2
                assert (IDLE_TIMEOUT - 2 <= silent_closed.result()
                        <= IDLE_TIMEOUT + DEFER_ACCEPT + 2)
        assert (REQUEST_TIMEOUT - 2 <= stalled_closed.result()
                <= REQUEST_TIMEOUT + 3)
