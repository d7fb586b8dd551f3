"""A tiny HTTP/1.x client over raw sockets, for tests that show the bytes.

The tests send exact bytes (`b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"`) so a
reader sees what goes on the wire; this module only frames the answer: one
status line, the headers, and a body delimited by Content-Length (or by the
close of the connection when there is none). Nothing here is clever on
purpose: a response that does not parse fails the test.
"""

import socket
import time

HOST = "127.0.0.1"
TIMEOUT = 5.0  # seconds a single read may block; ASan builds are slower
HEAD_LIMIT = 64 * 1024  # a response head larger than this is a server bug
SMALL_RCVBUF = 64 * 1024  # a slow reader's window: the server holds the rest

# A guestbook form POST, as a browser sends it (Content-Length follows).
FORM_TYPE = b"Content-Type: application/x-www-form-urlencoded\r\n"
FORM_HEAD = b"POST /guestbook HTTP/1.1\r\nHost: x\r\n" + FORM_TYPE


class Headers:
    """Response headers: case-insensitive names, repeated headers kept."""

    def __init__(self, pairs):
        self.pairs = pairs  # [(name, value)] in wire order

    def get_all(self, name):
        return [v for k, v in self.pairs if k.lower() == name.lower()]

    def get(self, name, default=None):
        values = self.get_all(name)
        return values[0] if values else default

    def __contains__(self, name):
        return bool(self.get_all(name))

    def __getitem__(self, name):
        values = self.get_all(name)
        if len(values) != 1:
            raise KeyError(f"{name}: expected one header, got {values!r}")
        return values[0]

    def __repr__(self):
        return f"Headers({self.pairs!r})"


class Response:
    def __init__(self, version, status, reason, headers, body):
        self.version = version  # "HTTP/1.1"
        self.status = status  # int
        self.reason = reason  # "OK"
        self.headers = headers  # Headers
        self.body = body  # bytes

    def __repr__(self):
        return (f"<Response {self.version} {self.status} {self.reason} "
                f"{self.headers!r} body={self.body[:200]!r}>")


class Connection:
    """One client socket plus the bytes received but not yet consumed, so
    several (pipelined) responses can be read from one stream."""

    def __init__(self, port, timeout=TIMEOUT):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.eof = False  # the server closed (FIN or RST)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def send_tolerating_reset(self, data):
        """Send, but let the server hang up early: a server may answer an
        oversized or malformed request before reading all of it and close,
        and its answer is still readable."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _fill(self):
        """Read more bytes into buf; returns False at end of stream. A reset
        after the server's last bytes counts as the end: Linux still hands
        over the data that arrived before the RST."""
        if self.eof:
            return False
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _take(self, n):
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_response(self, head=False):
        """Read one full response. head=True: the request was HEAD, so no
        body follows whatever Content-Length says."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > HEAD_LIMIT:
                raise AssertionError(f"response head too long: {self.buf[:200]!r}")
            if not self._fill():
                raise AssertionError(
                    f"connection closed before a full response head: {self.buf!r}")
        raw_head = self._take(self.buf.index(b"\r\n\r\n") + 4)
        version, status, reason, headers = parse_head(raw_head)
        body = b""
        if not head and status >= 200 and status not in (204, 304):
            length = headers.get("Content-Length")
            if length is None:
                while self._fill():
                    pass
                body = self._take(len(self.buf))
            else:
                n = int(length)
                while len(self.buf) < n and self._fill():
                    pass
                assert len(self.buf) >= n, (
                    f"body cut short: {len(self.buf)} of {n} bytes")
                body = self._take(n)
        return Response(version, status, reason, headers, body)

    def wait_closed(self, timeout, allow_data=False):
        """True if the server closes the connection within timeout seconds,
        False if it is still open then. Bytes arriving first fail the test
        unless allow_data (e.g. an optional 408 before a timeout close)."""
        deadline = time.monotonic() + timeout
        try:
            while not self.eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                try:
                    self._fill()
                except socket.timeout:
                    return False
                if self.buf and not allow_data:
                    raise AssertionError(f"unexpected bytes: {self.buf[:200]!r}")
            return True
        finally:
            self.sock.settimeout(TIMEOUT)


def parse_head(raw):
    """Split a response head into (version, status, reason, Headers)."""
    lines = raw[:-4].decode("latin-1").split("\r\n")
    version, status, reason = (lines[0].split(" ", 2) + [""])[:3]
    assert version in ("HTTP/1.0", "HTTP/1.1"), f"bad status line {lines[0]!r}"
    pairs = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        assert sep and name == name.strip(), f"bad header line {line!r}"
        pairs.append((name, value.strip(" \t")))
    return version, int(status), reason, Headers(pairs)


def open_asking(port, count, conns, raw=b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n",
                timeout=10):
    """count connections that each send `raw` as they open, appended to
    `conns` (the caller closes them, also after a failure): answers are read
    after, so all are open and waiting at once."""
    for _ in range(count):
        conn = Connection(port, timeout=timeout)
        conn.send(raw)
        conns.append(conn)
    return conns


def slow_reader(port, path="/big.bin"):
    """A client that asks for a (large) file with a small receive window and
    reads nothing yet: the server's sends soon find its socket full."""
    conn = Connection(port, timeout=10)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    conn.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    return conn


def exchange(port, raw, head=False, timeout=TIMEOUT):
    """Open a connection, send raw bytes, read one response, close."""
    with Connection(port, timeout) as conn:
        conn.send_tolerating_reset(raw)
        return conn.read_response(head=head)


def get(port, path):
    """The plainest request for a path: HTTP/1.1, closing afterwards."""
    raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    return exchange(port, raw.encode())


def assert_recovers(port, timeout, checks, settle=0.0):
    """/guestbook answers 200 again within timeout seconds (Redis is back),
    then, `settle` seconds later, `checks` times in a row: a connection
    broken by the outage must be replaced, not reported as 503. (settle:
    see processes.redis_settle; a server with one Redis link needs none.)"""
    deadline = time.monotonic() + timeout
    while get(port, "/guestbook").status != 200:
        assert time.monotonic() < deadline, f"no recovery within {timeout} s"
        time.sleep(0.1)
    time.sleep(settle)
    statuses = [get(port, "/guestbook").status for _ in range(checks)]
    assert statuses == [200] * checks, f"503 after Redis returned: {statuses}"


# ---- checks shared by the test files ----

def media_type(resp):
    """Content-Type without parameters, lower-cased: "text/html"."""
    return resp.headers["Content-Type"].split(";")[0].strip().lower()


def assert_html_error(resp, status):
    """An error response: the status, a small HTML body, its exact length."""
    assert resp.status == status, resp
    assert resp.headers["Content-Type"].lower().replace(" ", "") == \
        "text/html;charset=utf-8", resp
    assert int(resp.headers["Content-Length"]) == len(resp.body), resp
    assert resp.body.lstrip()[:1] == b"<", resp


def assert_prompt(port, limit, times=10, path="/"):
    """Fresh clients get `path` within `limit` seconds, one after another."""
    for _ in range(times):
        started = time.monotonic()
        assert get(port, path).status == 200
        took = time.monotonic() - started
        assert took < limit, f"GET {path} took {took:.2f} s"
