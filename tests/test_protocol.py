"""Request parsing: methods, versions, malformed input and size limits."""

import pytest

from rawhttp import (FORM_HEAD, FORM_TYPE, Connection, assert_html_error,
                     exchange)


def test_post_to_static_path_is_405_with_allow(server):
    resp = exchange(server.port,
                    b"POST /index.html HTTP/1.1\r\nHost: x\r\n" + FORM_TYPE +
                    b"Content-Length: 3\r\n\r\na=b")
    assert_html_error(resp, 405)
    allowed = {m.strip() for m in resp.headers["Allow"].split(",")}
    assert allowed == {"GET", "HEAD"}


@pytest.mark.parametrize("method", [b"DELETE", b"PUT", b"OPTIONS", b"BREW"])
def test_unknown_method_is_501(server, method):
    resp = exchange(server.port,
                    method + b" / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 501)


def test_http_2_is_505(server):
    resp = exchange(server.port, b"GET / HTTP/2.0\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 505)


@pytest.mark.parametrize("request_bytes", [
    b"GET /\r\n\r\n",  # HTTP/0.9 style, no version
    b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",  # two spaces
    b"GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.x\r\nHost: x\r\n\r\n",
    b"GET / FTP/1.1\r\nHost: x\r\n\r\n",
    b"GET index.html HTTP/1.1\r\nHost: x\r\n\r\n",  # not an absolute path
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\xfe\xff\r\n\r\n",  # TLS-ish
], ids=["no-version", "double-space", "extra-token", "version-garbage",
        "not-http", "relative-path", "binary-garbage"])
def test_malformed_request_line_is_400(server, request_bytes):
    assert_html_error(exchange(server.port, request_bytes), 400)


@pytest.mark.parametrize("header", [
    b"Host x\r\n",  # no colon
    b"Host: x\r\n: empty-name\r\n",
    b"Host: x\r\nBad Name: y\r\n",  # space inside the name
])
def test_malformed_header_line_is_400(server, header):
    resp = exchange(server.port, b"GET / HTTP/1.1\r\n" + header + b"\r\n")
    assert_html_error(resp, 400)


@pytest.mark.parametrize("lengths", [
    b"Content-Length: abc\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Length: 1x\r\n",
    b"Content-Length: 3\r\nContent-Length: 4\r\n",
], ids=["letters", "negative", "trailing-junk", "two-different"])
def test_bad_content_length_is_400(server, lengths):
    resp = exchange(server.port, FORM_HEAD + lengths + b"\r\nabcd")
    assert_html_error(resp, 400)


def test_transfer_encoding_is_501(server):
    resp = exchange(server.port,
                    FORM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
                    b"5\r\na=b&c\r\n0\r\n\r\n")
    assert_html_error(resp, 501)


def test_uri_over_4096_is_414(server):
    target = b"/" + b"a" * 4200
    resp = exchange(server.port,
                    b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 414)


def get_with_filler_headers(port, count):
    """A GET carrying `count` headers of 216 bytes each."""
    headers = b"".join(b"X-Filler-%02d: %s\r\n" % (i, b"v" * 200)
                       for i in range(count))
    return exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")


def test_headers_over_8k_are_431(server):
    assert_html_error(get_with_filler_headers(server.port, 45), 431)  # 9.5 KiB


def test_headers_just_under_8k_are_fine(server):
    assert get_with_filler_headers(server.port, 35).status == 200  # 7.4 KiB


def test_http_1_1_without_host_is_400(server):
    assert_html_error(exchange(server.port, b"GET / HTTP/1.1\r\n\r\n"), 400)


def test_http_1_0_without_host_is_fine(server):
    assert exchange(server.port, b"GET / HTTP/1.0\r\n\r\n").status == 200


def test_header_names_are_case_insensitive(server):
    resp = exchange(server.port,
                    b"GET / HTTP/1.1\r\nhOsT: x\r\nconnection: CLOSE\r\n\r\n")
    assert resp.status == 200
    assert resp.headers.get("Connection", "").lower() == "close"


def test_error_closes_the_connection(server):
    # After a malformed request the rest of the stream cannot be trusted.
    with Connection(server.port) as conn:
        conn.send(b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n")
        resp = conn.read_response()
        assert resp.status == 400
        assert resp.headers["Connection"].lower() == "close"
        assert conn.wait_closed(3)
