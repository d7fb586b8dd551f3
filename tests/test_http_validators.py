"""HTTP as a real static server speaks it (issue 12): absolute-form targets,
Expect: 100-continue, HTTP/1.x versions, validators and 304, byte ranges,
cache headers, the favicon and styled error pages; and httplint, the linter
behind REDbot, finds nothing to warn about in what a real socket received.
"""

import email.utils
import os
import re
import socket
import subprocess
import time

import pytest

from processes import REPO, python_with, token
from rawhttp import (FORM_HEAD, HOST, Connection, assert_html_error,
                     exchange, get)

CURL_TIMEOUT = 10  # seconds; a curl run that takes longer is a failure
EXPECT_WAIT_S = 8  # curl's wait for a 100 Continue before it sends anyway


def request(port, path, *headers, method="GET", version="1.1"):
    """One request with extra header lines, answered on a fresh connection."""
    lines = [f"{method} {path} HTTP/{version}", "Host: x", "Connection: close",
             *headers]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return exchange(port, raw, head=method == "HEAD")


def curl(*args):
    """Runs curl; returns (exit code, stdout bytes, stderr text)."""
    proc = subprocess.run(["curl", "--silent", "--show-error", *args],
                          capture_output=True, timeout=CURL_TIMEOUT)
    return proc.returncode, proc.stdout, proc.stderr.decode(errors="replace")


def public_file(site, name, data):
    """A file of the test's own in the session's public/, so that changing
    it disturbs no other test."""
    path = site / "public" / name
    path.write_bytes(data)
    return path


# ---- request targets, Expect and versions ----

@pytest.mark.parametrize("target", [
    "http://localhost/index.html",
    "HTTP://LOCALHOST:8000/index.html",
    "http://localhost/index.html?query=1",
])
def test_absolute_form_target_is_served(server, site, target):
    resp = exchange(server.port, f"GET {target} HTTP/1.1\r\nHost: localhost\r\n"
                    f"Connection: close\r\n\r\n".encode())
    assert resp.status == 200, resp
    assert resp.body == (site / "public" / "index.html").read_bytes()


@pytest.mark.parametrize("target", ["http://localhost", "http://localhost?x=/a"])
def test_absolute_form_without_path_means_root(server, site, target):
    resp = exchange(server.port, f"GET {target} HTTP/1.1\r\nHost: localhost\r\n"
                    f"Connection: close\r\n\r\n".encode())
    assert resp.status == 200, resp
    assert resp.body == (site / "public" / "index.html").read_bytes()


def test_curl_through_a_proxy_sends_absolute_form(server, site):
    code, body, err = curl("-x", f"http://{HOST}:{server.port}",
                           "http://example.invalid/notes.txt")
    assert code == 0, err
    assert body == (site / "public" / "notes.txt").read_bytes()


def test_expect_100_continue_gets_100_before_the_body(server):
    body = f"guest-remarks=expect-{token()}".encode()
    with Connection(server.port) as conn:
        conn.send(FORM_HEAD + b"Expect: 100-continue\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode())
        interim = conn.read_response()
        assert (interim.status, interim.body) == (100, b""), interim
        conn.send(body)
        resp = conn.read_response()
    assert resp.status == 303, resp


def test_expect_with_the_body_already_sent_gets_no_100(server):
    body = f"guest-remarks=expect-{token()}".encode()
    resp = exchange(server.port, FORM_HEAD + b"Expect: 100-continue\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert resp.status == 303, resp


@pytest.mark.parametrize("head, status", [
    (b"POST /index.html HTTP/1.1\r\nHost: x\r\n", 405),
    (b"POST /guestbook HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n",
     415),
])
def test_expect_for_a_refused_request_gets_the_final_status_at_once(
        server, head, status):
    with Connection(server.port) as conn:
        conn.send(head + b"Expect: 100-continue\r\nContent-Length: 10\r\n\r\n")
        resp = conn.read_response()  # no body sent: it must not be awaited
    assert_html_error(resp, status)


def test_expect_for_a_body_too_large_gets_413_at_once(server):
    with Connection(server.port) as conn:
        conn.send(FORM_HEAD + b"Expect: 100-continue\r\n"
                  b"Content-Length: 99999999\r\n\r\n")
        resp = conn.read_response()
    assert_html_error(resp, 413)


def test_unknown_expectation_gets_417(server):
    resp = request(server.port, "/index.html", "Expect: something-else")
    assert_html_error(resp, 417)


def test_http10_expect_is_ignored(server):
    body = f"guest-remarks=expect-{token()}".encode()
    with Connection(server.port) as conn:
        conn.send(b"POST /guestbook HTTP/1.0\r\nExpect: 100-continue\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode())
        conn.sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            conn.sock.recv(1)  # no 100 for HTTP/1.0: the body is awaited
        conn.sock.settimeout(5)
        conn.send(body)
        resp = conn.read_response()
    assert resp.status == 303, resp


def test_curl_expect_100_continue_does_not_wait_a_second(server):
    # curl sends the body after a 100 Continue or after its own timeout
    # (1 s by default; EXPECT_WAIT_S here): a server that never says 100
    # costs all of it, while a loaded machine delays a right one far less (a
    # bound of 0.5 s against curl's 1 s failed so in make test)
    remark = f"guest-remarks=curl-expect-{token()}"
    started = time.monotonic()
    code, _, err = curl("-o", "/dev/null", "-w", "%{http_code}",
                        "--expect100-timeout", str(EXPECT_WAIT_S),
                        "-H", "Expect: 100-continue", "-d", remark,
                        f"http://{HOST}:{server.port}/guestbook")
    took = time.monotonic() - started
    assert code == 0, err
    assert took < EXPECT_WAIT_S / 2, (
        f"POST with Expect took {took:.2f} s: curl waited for a 100 Continue "
        f"that never came (its --expect100-timeout is {EXPECT_WAIT_S} s)")


def test_higher_http1_minor_version_is_served_as_1_1(server, site):
    with Connection(server.port) as conn:
        conn.send(b"GET /index.html HTTP/1.2\r\nHost: x\r\n\r\n")
        resp = conn.read_response()
        assert resp.status == 200 and resp.version == "HTTP/1.1", resp
        assert resp.body == (site / "public" / "index.html").read_bytes()
        if resp.headers.get("Connection") != "close":  # 01 always closes
            conn.send(b"GET /notes.txt HTTP/1.9\r\nHost: x\r\n\r\n")
            assert conn.read_response().status == 200


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.1"])
def test_other_major_versions_get_505(server, version):
    resp = exchange(server.port, b"GET / " + version + b"\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 505)


# ---- validators, 304 and cache headers ----

def test_static_file_carries_validators_and_cache_headers(server, site):
    path = site / "public" / "index.html"
    resp = get(server.port, "/index.html")
    assert resp.status == 200
    assert re.fullmatch(r'(W/)?"[^"]+"', resp.headers["ETag"]), resp.headers
    modified = email.utils.parsedate_to_datetime(resp.headers["Last-Modified"])
    assert int(modified.timestamp()) == int(path.stat().st_mtime)
    assert resp.headers["Last-Modified"].endswith(" GMT")
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["Cache-Control"] == "no-cache"


def test_index_and_file_share_one_etag_and_head_agrees(server):
    etag = get(server.port, "/index.html").headers["ETag"]
    assert get(server.port, "/").headers["ETag"] == etag
    assert request(server.port, "/", method="HEAD").headers["ETag"] == etag


def assert_not_modified(resp, etag):
    assert resp.status == 304, resp
    assert resp.body == b""
    assert "Content-Length" not in resp.headers, resp.headers
    assert resp.headers["ETag"] == etag
    assert "Last-Modified" in resp.headers
    assert resp.headers["Cache-Control"] == "no-cache"


@pytest.mark.parametrize("form", [
    "{etag}", "W/{etag}", '"other", {etag}', '"a" ,W/{etag} , "b"', "*",
])
def test_if_none_match_that_matches_gets_304(server, form):
    etag = get(server.port, "/notes.txt").headers["ETag"]
    resp = request(server.port, "/notes.txt",
                   "If-None-Match: " + form.format(etag=etag))
    assert_not_modified(resp, etag)


@pytest.mark.models("forking", "preforked", "threaded", "prethreaded", "poll",
                    "epoll", "io_uring")  # 01 closes after every response
def test_304_then_the_connection_serves_the_next_request(server, site):
    etag = get(server.port, "/notes.txt").headers["ETag"]
    with Connection(server.port) as conn:
        conn.send(f"GET /notes.txt HTTP/1.1\r\nHost: x\r\nIf-None-Match: "
                  f"{etag}\r\n\r\nGET /notes.txt HTTP/1.1\r\nHost: x\r\n"
                  f"Connection: close\r\n\r\n".encode())
        assert_not_modified(conn.read_response(), etag)
        resp = conn.read_response()
    assert resp.body == (site / "public" / "notes.txt").read_bytes()


def test_if_none_match_that_differs_gets_the_file(server, site):
    resp = request(server.port, "/notes.txt", 'If-None-Match: "nope", W/"no"')
    assert resp.status == 200
    assert resp.body == (site / "public" / "notes.txt").read_bytes()


def http_dates(when):
    """The same moment in the three forms RFC 9110 §5.6.7 makes us accept."""
    t = time.gmtime(when)
    return [time.strftime("%a, %d %b %Y %H:%M:%S GMT", t),
            time.strftime("%A, %d-%b-%y %H:%M:%S GMT", t),
            time.strftime("%a %b ", t) + f"{t.tm_mday:2d}"
            + time.strftime(" %H:%M:%S %Y", t)]


@pytest.mark.parametrize("form", [0, 1, 2], ids=["imf", "rfc850", "asctime"])
def test_if_modified_since_not_older_gets_304(server, site, form):
    mtime = (site / "public" / "notes.txt").stat().st_mtime
    etag = get(server.port, "/notes.txt").headers["ETag"]
    for when in (mtime, mtime + 3600):
        resp = request(server.port, "/notes.txt",
                       "If-Modified-Since: " + http_dates(when)[form])
        assert_not_modified(resp, etag)


@pytest.mark.parametrize("value", [
    "garbage", "Sun, 32 Foo 1994 08:49:37 GMT", "",
])
def test_if_modified_since_older_or_invalid_gets_the_file(server, site, value):
    mtime = (site / "public" / "notes.txt").stat().st_mtime
    old = http_dates(mtime - 3600)[0]
    for header in (f"If-Modified-Since: {old}", f"If-Modified-Since: {value}"):
        assert request(server.port, "/notes.txt", header).status == 200


def test_if_none_match_overrides_if_modified_since(server, site):
    mtime = (site / "public" / "notes.txt").stat().st_mtime
    resp = request(server.port, "/notes.txt", 'If-None-Match: "stale"',
                   "If-Modified-Since: " + http_dates(mtime + 3600)[0])
    assert resp.status == 200


def test_browser_reload_gets_304s(server):
    """What a reload sends: the validators of the first load, for the page
    and what it links to."""
    for path in ("/", "/style.css", "/img/models.png", "/favicon.ico"):
        first = get(server.port, path)
        assert first.status == 200, path
        resp = request(server.port, path,
                       f"If-None-Match: {first.headers['ETag']}",
                       f"If-Modified-Since: {first.headers['Last-Modified']}")
        assert_not_modified(resp, first.headers["ETag"])


def assert_serves(port, path, data):
    resp = get(port, path)
    assert resp.status == 200 and resp.body == data, resp
    return resp.headers["ETag"]


def test_replaced_file_gets_new_validators_at_once(server, site):
    """Includes 08_io_uring's open-file cache: the next response after a
    rename over the file has the new bytes and a new ETag."""
    name = f"changing-{token()}.txt"
    path = public_file(site, name, b"first version\n")
    old = assert_serves(server.port, "/" + name, b"first version\n")
    assert_serves(server.port, "/" + name, b"first version\n")  # now cached
    for n in range(3):
        new_bytes = f"version {n + 2}, longer than before\n".encode()
        spare = path.with_suffix(".new")
        spare.write_bytes(new_bytes)
        os.replace(spare, path)
        etag = assert_serves(server.port, "/" + name, new_bytes)
        assert etag != old
        old = etag


def test_file_rewritten_in_place_gets_new_validators_at_once(server, site):
    name = f"rewritten-{token()}.txt"
    path = public_file(site, name, b"AAAA\n")
    old = assert_serves(server.port, "/" + name, b"AAAA\n")
    assert_serves(server.port, "/" + name, b"AAAA\n")
    with open(path, "r+b") as f:  # same inode, same size: only mtime moves
        f.write(b"BBBB\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    resp = request(server.port, "/" + name, f"If-None-Match: {old}")
    assert resp.status == 200 and resp.body == b"BBBB\n", resp
    assert resp.headers["ETag"] != old


# ---- byte ranges ----

RANGE_CASES = [  # (Range, first byte, last byte) of a 100-byte file
    ("bytes=0-9", 0, 9),
    ("bytes=10-19", 10, 19),
    ("bytes=90-", 90, 99),
    ("bytes=-5", 95, 99),
    ("bytes=95-500", 95, 99),
    ("bytes=50-100", 50, 99),  # one past the end, exactly: clamped too
    ("bytes=-500", 0, 99),
    ("BYTES=99-99", 99, 99),
]


@pytest.fixture
def hundred(site):
    data = bytes(range(100))
    public_file(site, "hundred.bin", data)
    return data


@pytest.mark.parametrize("spec, first, last", RANGE_CASES,
                         ids=[c[0] for c in RANGE_CASES])
def test_single_range_gets_206_and_only_those_bytes(server, hundred, spec,
                                                    first, last):
    resp = request(server.port, "/hundred.bin", f"Range: {spec}")
    assert resp.status == 206, resp
    assert resp.headers["Content-Range"] == f"bytes {first}-{last}/100"
    assert resp.body == hundred[first:last + 1]
    assert int(resp.headers["Content-Length"]) == last - first + 1
    assert "ETag" in resp.headers and resp.headers["Accept-Ranges"] == "bytes"


@pytest.mark.parametrize("spec", ["bytes=100-", "bytes=500-600", "bytes=-0"])
def test_unsatisfiable_range_gets_416(server, hundred, spec):
    resp = request(server.port, "/hundred.bin", f"Range: {spec}")
    assert_html_error(resp, 416)
    assert resp.headers["Content-Range"] == "bytes */100"


@pytest.mark.parametrize("spec", [
    "bytes=0-1,5-6", "items=0-1", "bytes=5-1", "bytes=a-b", "bytes=-", "0-1",
])
def test_other_ranges_get_the_whole_file(server, hundred, spec):
    resp = request(server.port, "/hundred.bin", f"Range: {spec}")
    assert resp.status == 200 and resp.body == hundred, resp
    assert "Content-Range" not in resp.headers


def test_range_on_head_is_ignored(server, hundred):
    resp = request(server.port, "/hundred.bin", "Range: bytes=0-9",
                   method="HEAD")
    assert resp.status == 200 and resp.headers["Content-Length"] == "100"


def test_range_deep_into_a_big_file(server, site):
    data = (site / "public" / "big.bin").read_bytes()
    start = len(data) - 1_000_000 - 7
    resp = request(server.port, "/big.bin", f"Range: bytes={start}-")
    assert resp.status == 206
    assert resp.body == data[start:]


def test_if_range_that_matches_gets_the_range(server, hundred):
    first = get(server.port, "/hundred.bin")
    for validator in (first.headers["ETag"], first.headers["Last-Modified"]):
        resp = request(server.port, "/hundred.bin", "Range: bytes=0-9",
                       f"If-Range: {validator}")
        assert resp.status == 206 and resp.body == hundred[:10], validator


def test_if_range_that_differs_gets_the_whole_file(server, site, hundred):
    first = get(server.port, "/hundred.bin")
    mtime = (site / "public" / "hundred.bin").stat().st_mtime
    for validator in ('"other"', "W/" + first.headers["ETag"],
                      http_dates(mtime - 60)[0], "nonsense"):
        resp = request(server.port, "/hundred.bin", "Range: bytes=0-9",
                       f"If-Range: {validator}")
        assert resp.status == 200 and resp.body == hundred, validator


def test_curl_resumes_a_download(server, site, tmp_path):
    data = (site / "public" / "big.bin").read_bytes()
    out = tmp_path / "big.bin"
    out.write_bytes(data[:3_000_000])  # an interrupted earlier download
    code, _, err = curl("-C", "-", "-o", str(out),
                        f"http://{HOST}:{server.port}/big.bin")
    assert code == 0, err
    assert out.read_bytes() == data


# ---- the guestbook, the favicon, error pages ----

def test_guestbook_is_never_stored_by_caches(server):
    assert get(server.port, "/guestbook").headers["Cache-Control"] == "no-store"
    body = f"guest-remarks=no-store-{token()}".encode()
    resp = exchange(server.port, FORM_HEAD + b"Connection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert resp.status == 303
    assert resp.headers["Cache-Control"] == "no-store"


def test_favicon_is_a_real_icon(server):
    resp = get(server.port, "/favicon.ico")
    assert resp.status == 200
    assert resp.headers["Content-Type"] in ("image/x-icon",
                                            "image/vnd.microsoft.icon")
    body = resp.body
    assert body[:4] == b"\x00\x00\x01\x00", "not an ICO header"
    count = int.from_bytes(body[4:6], "little")
    sizes = {body[6 + 16 * i] or 256 for i in range(count)}
    assert {16, 32} <= sizes, sizes


def test_error_page_uses_the_stylesheet(server):
    resp = get(server.port, "/no-such-page")
    assert_html_error(resp, 404)
    assert b'<link rel="stylesheet" href="/style.css">' in resp.body
    assert b'name="viewport"' in resp.body


def test_pages_are_made_for_small_screens():
    """The check a headless browser would make, in the sources: every page
    sets the viewport, the logo may shrink and the header may wrap."""
    css = (REPO / "public" / "style.css").read_text()
    for page in (REPO / "public" / "index.html",
                 REPO / "templates" / "guestbook" / "index.html"):
        assert 'name="viewport"' in page.read_text(), page
    assert "flex-wrap: wrap" in css
    assert re.search(r"\.logo\s*{[^}]*width:\s*min\(", css)


# ---- httplint on what a real socket received ----

CLOCK_BEHIND = re.compile(r"The server's clock is (\d+) seconds? behind")
LINT_PROGRAM = ("import sys; from httplint.cli import main; "
                "sys.argv = ['httplint', '-n']; main()")


def raw_response(port, path):
    """The exact bytes a GET received, to the server's close."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                     f"Connection: close\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("path", ["/", "/style.css", "/img/models.png",
                                  "/favicon.ico", "/guestbook"])
def test_httplint_finds_nothing_to_warn_about(server, path):
    raw = raw_response(server.port, path)
    received = time.monotonic()
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
    proc = subprocess.run([python_with("httplint"), "-c", LINT_PROGRAM], input=raw,
                          capture_output=True, timeout=30)
    report = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert "[GOOD]" in report, report  # it did lint something
    # httplint compares Date with its own clock when it runs: a linter slow
    # to start (a busy machine) reads as a server clock behind by as long.
    late = time.monotonic() - received + 1
    bad = [line for line in report.splitlines()
           if ("[WARN]" in line or "[BAD]" in line) and not (
               (behind := CLOCK_BEHIND.search(line)) and
               int(behind[1]) <= late)]
    assert not bad, report


def test_ranges_and_head_of_a_file_served_from_memory(server, hundred):
    """08_io_uring keeps a hot small file's bytes after its first whole
    READ: ranges, HEAD and 304 must come out the same from there."""
    for _ in range(3):  # the first fills 08's cache, the others use it
        resp = get(server.port, "/hundred.bin")
        assert resp.status == 200 and resp.body == hundred
    for spec, first, last in RANGE_CASES:
        resp = request(server.port, "/hundred.bin", f"Range: {spec}")
        assert resp.status == 206 and resp.body == hundred[first:last + 1]
    head = request(server.port, "/hundred.bin", method="HEAD")
    assert head.status == 200 and head.headers["Content-Length"] == "100"
    resp = request(server.port, "/hundred.bin",
                   f"If-None-Match: {head.headers['ETag']}")
    assert_not_modified(resp, head.headers["ETag"])
