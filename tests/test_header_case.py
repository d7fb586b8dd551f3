"""Header names in any case (RFC 9110 §5.1: field names are
case-insensitive), for every header the servers read: Host, Content-Length,
Transfer-Encoding, Connection, Expect, If-None-Match, If-Modified-Since,
Range, If-Range and Content-Type; and the values the RFC makes
case-insensitive: Connection's tokens (`Keep-Alive`, `CLOSE`), Expect's
`100-Continue`, the media type of Content-Type, the range unit (`BYTES=`).
Transfer-Encoding is refused whatever it names, `Chunked` included.

Each test sends its header spelled lower-case, upper-case and in mixed
case, each on a connection of its own, and expects the same effect as the
canonical spelling: a server that matched the name byte for byte would
ignore the header, and answer differently (411, 415, 200 for 304, ...).
"""

import socket

import pytest

from processes import token
from rawhttp import Connection, assert_html_error, exchange


def spellings(name):
    """lower, UPPER and aLtErNaTiNg case: never the canonical spelling."""
    mixed = "".join(c.upper() if i % 2 else c.lower()
                    for i, c in enumerate(name))
    found = [name.lower(), name.upper(), mixed]
    assert name not in found
    return found


def head(*lines, method="GET", path="/index.html", version="1.1"):
    return ("\r\n".join([f"{method} {path} HTTP/{version}", *lines])
            + "\r\n\r\n").encode()


def form_post(*lines, body):
    """A form POST to /guestbook with these header lines (no Host added)."""
    return head(*lines, method="POST", path="/guestbook") + body


def validators(port):
    resp = exchange(port, head("Host: x"))
    assert resp.status == 200, resp
    return resp.headers["ETag"], resp.headers["Last-Modified"], resp.body


def test_host_in_any_case(server):
    # HTTP/1.1 without a Host is 400: a Host not recognised would be one.
    for host in spellings("Host"):
        assert exchange(server.port, head(f"{host}: x")).status == 200, host
        # ...and a second Host, however spelled, is one too many.
        resp = exchange(server.port, head("Host: x", f"{host}: y"))
        assert_html_error(resp, 400)


def test_content_length_in_any_case(server):
    for length in spellings("Content-Length"):
        body = f"guest-name=cl&guest-remarks={token()}".encode()
        resp = exchange(server.port, form_post(
            "Host: x", "Content-Type: application/x-www-form-urlencoded",
            f"{length}: {len(body)}", body=body))
        assert resp.status == 303, (length, resp)  # not 411


def test_transfer_encoding_in_any_case(server):
    for name in spellings("Transfer-Encoding"):
        for value in ("chunked", "Chunked", "CHUNKED"):
            resp = exchange(server.port, form_post(
                "Host: x", "Content-Type: application/x-www-form-urlencoded",
                f"{name}: {value}", body=b"5\r\na=b&c\r\n0\r\n\r\n"))
            assert_html_error(resp, 501)


@pytest.mark.models("forking", "preforked", "threaded", "prethreaded",
                    "poll", "epoll", "io_uring", "reuseport", "fibers")
def test_connection_close_in_any_case(server):
    # 01_iterative closes every connection anyway: the others keep an
    # HTTP/1.1 connection unless told to close.
    for name in spellings("Connection"):
        for value in ("close", "CLOSE", "Close"):
            with Connection(server.port) as conn:
                conn.send(head("Host: x", f"{name}: {value}"))
                resp = conn.read_response()
                assert resp.status == 200, resp
                assert resp.headers["Connection"].lower() == "close", \
                    (name, value, resp)
                assert conn.wait_closed(3), (name, value)


@pytest.mark.models("forking", "preforked", "threaded", "prethreaded",
                    "poll", "epoll", "io_uring", "reuseport", "fibers")
def test_http_1_0_keep_alive_in_any_case(server):
    for name in spellings("Connection"):
        for value in ("keep-alive", "Keep-Alive", "KEEP-ALIVE"):
            with Connection(server.port) as conn:
                for _ in range(2):  # the second on the same connection
                    conn.send(head(f"{name}: {value}", version="1.0"))
                    resp = conn.read_response()
                    assert resp.status == 200, resp
                    assert resp.headers["Connection"].lower() == \
                        "keep-alive", (name, value, resp)


def test_expect_in_any_case(server):
    for name in spellings("Expect"):
        for value in ("100-continue", "100-Continue", "100-CONTINUE"):
            body = f"guest-name=ex&guest-remarks={token()}".encode()
            with Connection(server.port, timeout=3) as conn:
                conn.send(head(
                    "Host: x", "Content-Type: application/x-www-form-urlencoded",
                    f"{name}: {value}", f"Content-Length: {len(body)}",
                    method="POST", path="/guestbook"))
                try:
                    interim = conn.read_response()
                except socket.timeout:
                    raise AssertionError(f"no 100 Continue for {name}: {value}")
                assert interim.status == 100, (name, value, interim)
                conn.send(body)
                assert conn.read_response().status == 303
        resp = exchange(server.port, head("Host: x", f"{name}: something"))
        assert_html_error(resp, 417)


def test_if_none_match_in_any_case(server):
    etag, _, _ = validators(server.port)
    for name in spellings("If-None-Match"):
        resp = exchange(server.port, head("Host: x", f"{name}: {etag}"))
        assert resp.status == 304, (name, resp)


def test_if_modified_since_in_any_case(server):
    _, modified, _ = validators(server.port)
    for name in spellings("If-Modified-Since"):
        resp = exchange(server.port, head("Host: x", f"{name}: {modified}"))
        assert resp.status == 304, (name, resp)


def test_range_in_any_case(server):
    _, _, whole = validators(server.port)
    for name in spellings("Range"):
        for unit in ("bytes", "BYTES", "Bytes"):
            resp = exchange(server.port,
                            head("Host: x", f"{name}: {unit}=0-9"))
            assert resp.status == 206 and resp.body == whole[:10], \
                (name, unit, resp)


def test_if_range_in_any_case(server):
    # A validator that differs: the whole file, not the range. An If-Range
    # the server did not recognise would leave the Range alone: 206.
    etag, modified, whole = validators(server.port)
    for name in spellings("If-Range"):
        resp = exchange(server.port, head("Host: x", "Range: bytes=0-9",
                                          f'{name}: "other"'))
        assert resp.status == 200 and resp.body == whole, (name, resp)
        resp = exchange(server.port, head("Host: x", "Range: bytes=0-9",
                                          f"{name}: {etag}"))
        assert resp.status == 206 and resp.body == whole[:10], (name, resp)


def test_content_type_in_any_case(server):
    for name in spellings("Content-Type"):
        for value in ("application/x-www-form-urlencoded",
                      "Application/X-WWW-Form-URLEncoded; charset=UTF-8"):
            body = f"guest-name=ct&guest-remarks={token()}".encode()
            resp = exchange(server.port, form_post(
                "Host: x", f"{name}: {value}",
                f"Content-Length: {len(body)}", body=body))
            assert resp.status == 303, (name, value, resp)  # not 415
