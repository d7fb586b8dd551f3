"""Every input bound at its edge (docs/DESIGN.md §3 and §5, the config
block of each main.c): exactly at the bound is served, one byte (or one
character) past it gets the documented status. A test that sends far more
than a limit cannot tell `n > MAX` from `n >= MAX`; these can.

Each test is parametrised at/one-past; where one bound can be reached in
several shapes (the head: one long header line, many short ones, a long
target) every shape is sent on its own connection within the test.
The servers have no bound of their own on a header line, on the number of
headers or on pipelining depth: the 8 KiB of the head bounds them all, and
the head test reaches it through each. The body's bound (18,932 bytes, 413)
is tested at and one past in test_guestbook.py
(test_body_cap_is_the_worst_form). The timeouts (5 s idle, 10 s per
request) are left to test_connections.py: at the edge they would cost
seconds per server.
"""

import pytest

from processes import token
from rawhttp import FORM_HEAD, assert_html_error, exchange
from test_guestbook import (MAX_NAME, MAX_REMARK, entry_with, form,
                            get_page, post_form, refused_fields)

MAX_HEAD = 8192  # request line + headers, blank line included
MAX_URI = 4096  # the request target
MAX_METHOD = 16  # longest method token read before 400
MAX_LENGTH_DIGITS = 9  # Content-Length digits read before 400

EDGES = pytest.mark.parametrize("over", [0, 1], ids=["at-the-bound",
                                                     "one-past"])


def head_of(size, shape):
    """A GET / head of exactly `size` bytes, blank line included."""
    end = b"\r\n"
    if shape == "one-header-line":
        start = b"GET / HTTP/1.1\r\nHost: x\r\n"
        pad = size - len(start) - len(b"X-Pad: \r\n") - len(end)
        head = start + b"X-Pad: " + b"p" * pad + b"\r\n" + end
    elif shape == "many-headers":  # 9-byte lines, some 900 of them
        start = b"GET / HTTP/1.1\r\nHost: x\r\n"
        lines, room = [], size - len(start) - len(end)
        while room >= 20:
            lines.append(b"X-%03x: \r\n" % (len(lines) % 4096))
            room -= len(lines[-1])
        lines.append(b"Y: " + b"v" * (room - 5) + b"\r\n")
        head = start + b"".join(lines) + end
    else:  # "long-target": a target at its own bound, headers fill the rest
        target = b"/?" + b"q" * (MAX_URI - 2)
        start = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n"
        pad = size - len(start) - len(b"X-Pad: \r\n") - len(end)
        head = start + b"X-Pad: " + b"p" * pad + b"\r\n" + end
    assert len(head) == size
    return head


@EDGES
def test_head_bound_is_8192_bytes(server, over):
    for shape in ("one-header-line", "many-headers", "long-target"):
        resp = exchange(server.port, head_of(MAX_HEAD + over, shape))
        if over:
            assert_html_error(resp, 431)
        else:
            assert resp.status == 200, (shape, resp)


@EDGES
def test_target_bound_is_4096_bytes(server, over):
    # Origin form and absolute form: both are the same target bound.
    for prefix in (b"/?", b"http://x/?"):
        target = prefix + b"q" * (MAX_URI + over - len(prefix))
        resp = exchange(server.port,
                        b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        if over:
            assert_html_error(resp, 414)
        else:
            assert resp.status == 200, (prefix, resp)



def test_head_bound_crossed_in_the_target_is_414(server):
    # Blank lines before a request line are tolerated (RFC 9112 §2.2), and
    # they count toward the head's 8 KiB. When that bound is crossed while
    # the target is still arriving, the target is what did not fit: 414
    # (shorten the URL), not 431 (send fewer headers), though the target
    # alone is under its own 4 KiB.
    lead = b"\r\n" * 3000
    target = b"/?" + b"q" * (MAX_URI - 100)
    resp = exchange(server.port, lead + b"GET " + target +
                    b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(lead) + len(b"GET ") + len(target) > MAX_HEAD
    assert_html_error(resp, 414)

@EDGES
def test_method_bound_is_16_characters(server, over):
    # A method no server knows: 501 while it is short enough to read,
    # 400 (a malformed request line) once it is longer than any method.
    method = b"M" * (MAX_METHOD + over)
    resp = exchange(server.port, method + b" / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 400 if over else 501)


@EDGES
def test_content_length_bound_is_9_digits(server, site, over):
    # Leading zeros are digits (RFC 9110: 1*DIGIT): nine are read, ten are
    # refused as malformed, whatever their value.
    tag = token()
    body = form("Digits", tag)
    digits = b"%0*d" % (MAX_LENGTH_DIGITS + over, len(body))
    resp = exchange(server.port, FORM_HEAD + b"Content-Length: " + digits
                    + b"\r\n\r\n" + body)
    if over:
        assert_html_error(resp, 400)
    else:
        assert resp.status == 303, resp
        entry_with(get_page(server.port, site)[1], tag)


def counted(text):
    """Characters as the form rule counts them: code points, CR LF as one."""
    return len(text.replace("\r\n", "\n"))


@EDGES
def test_remark_bound_is_2000_characters(server, site, over):
    # Line breaks (CR LF: one each), a 4-byte and a 2-byte character among
    # ASCII: the bound counts characters, not bytes or UTF-16 units.
    tag = token()
    mix = tag + "\r\n" * 50 + "😀" * 20 + "é" * 30
    remark = mix + "r" * (MAX_REMARK + over - counted(mix))
    assert counted(remark) == MAX_REMARK + over
    resp = post_form(server.port, form("Edge", remark))
    if over:
        assert refused_fields(resp, site, 400,
                              "remark is longer than 2,000 characters") == (
            b"Edge", remark.encode())
        assert not any(tag in e for e in get_page(server.port, site)[1])
    else:
        assert resp.status == 303, resp
        assert remark in entry_with(get_page(server.port, site)[1], tag)


@EDGES
def test_name_bound_is_100_characters(server, site, over):
    tag = token()
    mix = "😀" * 10 + "ñ" * 10
    name = mix + "n" * (MAX_NAME + over - counted(mix))
    assert counted(name) == MAX_NAME + over
    resp = post_form(server.port, form(name, tag))
    if over:
        assert refused_fields(resp, site, 400,
                              "name is longer than 100 characters") == (
            name.encode(), tag.encode())
        assert not any(tag in e for e in get_page(server.port, site)[1])
    else:
        assert resp.status == 303, resp
        assert name in entry_with(get_page(server.port, site)[1], tag)
