"""The Redis-backed guestbook: rendering, counting, posting, limits.

The session's Redis is shared by every test and every server, so tests tag
their remarks with a unique token and compare counts instead of expecting
exact ones (except where a test sets the counter itself just before).
"""

import re
import subprocess
import time

import pytest

from processes import token
from rawhttp import (FORM_HEAD, Connection, assert_html_error, exchange,
                     media_type)

COUNT_RE = r"\d{1,3}(?:,\d{3})*"  # 1,234,567: groups of three after the first



def page_regex(site):
    """The guestbook template as a regex: the page must be the template with
    only the two placeholders replaced."""
    template = (site / "templates" / "guestbook" / "index.html").read_text()
    holes = {"$GUEST_REMARKS$": ("remarks", ".*?"),
             "$VISITOR_COUNT$": ("count", COUNT_RE)}
    seen, regex = set(), ""
    for part in re.split(r"(\$GUEST_REMARKS\$|\$VISITOR_COUNT\$)", template):
        if part in holes:
            name, body = holes[part]
            regex += f"(?P={name})" if name in seen else f"(?P<{name}>{body})"
            seen.add(name)
        else:
            regex += re.escape(part)
    assert seen == {"remarks", "count"}, "template lacks a placeholder"
    return re.compile(regex + r"\Z", re.S)


def get_page(port, site):
    """GET /guestbook -> (visitor count, [guest-entry inner HTML])."""
    resp = exchange(port, b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200, resp
    assert media_type(resp) == "text/html"
    text = resp.body.decode("utf-8")
    m = page_regex(site).match(text)
    assert m, f"page does not follow the template:\n{text[:3000]}"
    entries = re.findall(r'<p class="guest-entry">(.*?)</p>',
                         m.group("remarks"), re.S)
    return int(m.group("count").replace(",", "")), entries


def post_form(port, body):
    """POST /guestbook with a form body, as a browser sends it."""
    return exchange(port, FORM_HEAD + b"Content-Length: %d\r\n\r\n%s"
                    % (len(body), body))


def entry_with(entries, tag):
    found = [e for e in entries if tag in e]
    assert len(found) == 1, f"{tag} in {len(found)} entries: {entries[-5:]}"
    return found[0]


def assert_stored(server, site, body, tag):
    """The POST is answered 303 and stores the remark: its entry."""
    resp = post_form(server.port, body)
    assert resp.status == 303, resp
    _, entries = get_page(server.port, site)
    return entry_with(entries, tag)


def assert_rejected(server, site, body, tag, status):
    """The POST fails with status and stores nothing."""
    assert_html_error(post_form(server.port, body), status)
    _, entries = get_page(server.port, site)
    assert not any(tag in e for e in entries)


def test_guestbook_renders_the_template(server, site):
    count, entries = get_page(server.port, site)
    assert count >= 1


def test_guestbook_renders_with_no_remarks(server, site, redis):
    # Set the shared remarks aside for this one page, then put them back.
    shared = redis.command("EXISTS", "guestbook:remarks")
    if shared:
        redis.command("RENAME", "guestbook:remarks", "guestbook:remarks:aside")
    try:
        _, entries = get_page(server.port, site)
    finally:
        if shared:
            redis.command("RENAME", "guestbook:remarks:aside",
                          "guestbook:remarks")
    assert entries == []


def test_visitor_count_increments(server, site):
    first, _ = get_page(server.port, site)
    second, _ = get_page(server.port, site)
    assert second >= first + 1


def test_head_guestbook_counts_without_body(server, site):
    before, _ = get_page(server.port, site)
    resp = exchange(server.port,
                    b"HEAD /guestbook HTTP/1.1\r\nHost: x\r\n"
                    b"Connection: close\r\n\r\n", head=True)
    assert resp.status == 200
    assert int(resp.headers["Content-Length"]) > 0
    after, _ = get_page(server.port, site)
    assert after >= before + 2  # the HEAD counted too


@pytest.mark.parametrize("stored, shown", [
    (41, 42), (998, 999), (999, 1000), (1233999, 1234000),
    (1234566, 1234567), (999999999, 1000000000)])
def test_visitor_count_has_thousands_separators(server, site, redis,
                                                stored, shown):
    # The counter is shared: put it back, so a failure here (or a huge
    # count) does not leak into the tests that follow.
    saved = redis.command("GET", "guestbook:visitors") or "0"
    redis.command("SET", "guestbook:visitors", stored)
    try:
        resp = exchange(server.port,
                        b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        redis.command("SET", "guestbook:visitors", saved)
    assert resp.status == 200, resp
    m = page_regex(site).match(resp.body.decode("utf-8"))
    assert m, resp.body[:3000]
    assert m.group("count") == f"{shown:,}"


def test_post_redirects_to_guestbook(server):
    resp = post_form(server.port,
                     b"guest-name=Tester&guest-remarks=" + token().encode())
    assert resp.status == 303
    assert resp.headers["Location"] == "/guestbook"


MAX_HEAD = 8192  # request line + headers: the largest head a server takes


@pytest.mark.parametrize("head_size", [None, MAX_HEAD],
                         ids=["short-head", "head-of-8192"])
def test_post_body_arriving_after_the_head_is_accepted(server, site,
                                                       head_size):
    # As Python's http.client sends it: the head in one write, the body in
    # later ones. The parser must not read body bytes as more headers, nor
    # count them against the head's limit when the head fills it exactly.
    tag = token().encode()
    body = b"guest-name=split&guest-remarks=" + tag
    head = FORM_HEAD + b"Content-Length: %d\r\n" % len(body)
    if head_size:
        pad = head_size - len(head) - len(b"X-Pad: \r\n\r\n")
        head += b"X-Pad: " + b"p" * pad + b"\r\n"
    with Connection(server.port) as conn:
        conn.send(head + b"\r\n")
        time.sleep(0.05)
        conn.send(body[:7])
        time.sleep(0.05)
        conn.send(body[7:])
        assert conn.read_response().status == 303
    _, entries = get_page(server.port, site)
    assert tag.decode() in entry_with(entries, tag.decode())


def test_post_decodes_plus_and_percent(server, site):
    tag = token()
    entry = assert_stored(server, site,
                          b"guest-name=Ada+L%C3%B6ve&guest-remarks="
                          + tag.encode() + b"+hello+world%21%3F+100%25", tag)
    assert f"{tag} hello world!? 100%" in entry
    assert "Ada Löve" in entry


def test_post_escapes_html(server, site):
    tag = token()
    entry = assert_stored(server, site,
                          b"guest-name=x&guest-remarks=" + tag.encode()
                          + b"+%3Cscript%3Ealert(1)%3C%2Fscript%3E+%26+co",
                          tag)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in entry
    assert "<script>" not in entry


def test_post_escapes_html_in_name(server, site):
    tag = token()
    entry = assert_stored(server, site,
                          b"guest-name=%3Cb%3EEve%3C%2Fb%3E&guest-remarks="
                          + tag.encode(), tag)
    assert "&lt;b&gt;Eve&lt;/b&gt;" in entry
    assert "<b>" not in entry


def test_empty_name_shows_anonymous(server, site):
    tag = token()
    assert "anonymous" in assert_stored(
        server, site, b"guest-name=&guest-remarks=" + tag.encode(), tag)


@pytest.mark.parametrize("body", [b"guest-name=Nobody&guest-remarks=",
                                  b"guest-name=Nobody"],
                         ids=["empty", "missing"])
def test_empty_remark_is_400(server, body):
    assert_html_error(post_form(server.port, body), 400)


def test_remark_of_2000_bytes_is_accepted(server, site):
    tag = token()
    remark = tag + "r" * (2000 - len(tag))
    assert remark in assert_stored(
        server, site, b"guest-name=Long&guest-remarks=" + remark.encode(), tag)


def test_remark_of_2001_bytes_is_400(server, site):
    tag = token()
    remark = tag + "r" * (2001 - len(tag))
    assert_rejected(server, site,
                    b"guest-name=Long&guest-remarks=" + remark.encode(),
                    tag, 400)


def test_remark_limit_counts_decoded_bytes(server, site):
    # 994 times "é" (%C3%A9, two bytes decoded) plus a 12-byte tag: 2000
    # bytes decoded, 5976 bytes on the wire. Accepted.
    tag = token()
    body = (b"guest-name=Utf&guest-remarks=" + tag.encode()
            + b"%C3%A9" * 994)
    assert tag + "é" * 994 in assert_stored(server, site, body, tag)


def test_name_of_100_bytes_is_accepted(server, site):
    tag = token()
    assert "n" * 100 in assert_stored(server, site, b"guest-name=" + b"n" * 100
                                      + b"&guest-remarks=" + tag.encode(), tag)


def test_name_of_101_bytes_is_400(server, site):
    tag = token()
    assert_rejected(server, site, b"guest-name=" + b"n" * 101
                    + b"&guest-remarks=" + tag.encode(), tag, 400)


def test_nul_in_form_field_is_400(server, site):
    tag = token()
    assert_rejected(server, site, b"guest-name=x&guest-remarks="
                    + tag.encode() + b"%00after", tag, 400)


def test_body_over_16384_bytes_is_413(server, site):
    tag = token()
    body = b"guest-name=x&guest-remarks=" + tag.encode()
    body += b"&padding=" + b"p" * (16385 - len(body) - 9)
    assert len(body) == 16385
    assert_rejected(server, site, body, tag, 413)


def test_post_without_content_length_is_411(server):
    resp = exchange(server.port, FORM_HEAD + b"\r\n")
    assert_html_error(resp, 411)


def test_post_with_wrong_content_type_is_415(server):
    resp = exchange(server.port,
                    b"POST /guestbook HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: text/plain\r\nContent-Length: 24\r\n\r\n"
                    b"guest-remarks=plain+text")
    assert_html_error(resp, 415)


def test_curl_post_follows_redirect_to_the_page(server):
    # What a browser does: POST the form, follow the 303 with a GET.
    tag = token()
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-L",
         "--data-urlencode", "guest-name=Curl User",
         "--data-urlencode", f"guest-remarks={tag} <i>hi</i> & bye",
         "-w", "\n%{http_code} %{num_redirects}",
         f"http://127.0.0.1:{server.port}/guestbook"],
        capture_output=True, timeout=20, check=True)
    page, _, status = out.stdout.decode("utf-8").rpartition("\n")
    assert status == "200 1"
    assert f"{tag} &lt;i&gt;hi&lt;/i&gt; &amp; bye" in page
    assert "Curl User" in page
