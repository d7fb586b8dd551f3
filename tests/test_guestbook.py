"""The Redis-backed guestbook: rendering, counting, posting, limits, and
the form rule (docs/DESIGN.md §3): what the form accepts is stored, counted in
characters as its maxlength counts them, and a refused form comes back as
the page with a message and the visitor's text (tests/test_browser.py shows
the same in a real browser).

The session's Redis is shared by every test and every server, so tests tag
their remarks with a unique token and compare counts instead of expecting
exact ones (except where a test sets the counter itself just before).
"""

import html
import re
import socket
import subprocess
import time
import urllib.parse

import pytest

from processes import (REPO, RedisServer, ServerProcess, fd_count, free_port,
                       token, wait_for_fds)
from rawhttp import (FORM_HEAD, SMALL_RCVBUF, Connection, assert_html_error,
                     exchange, get, media_type)

COUNT_RE = r"\d{1,3}(?:,\d{3})*"  # 1,234,567: groups of three after the first
# The form rule (docs/DESIGN.md §3): the limits in characters (code points; a
# CR LF line break is one), as the template's maxlength has them, and the
# largest body: 9 bytes a character at worst (%E4%B8%80) and the names.
MAX_REMARK, MAX_NAME = 2000, 100
MAX_BODY = 9 * (MAX_REMARK + MAX_NAME) + 32

# What fills each placeholder of the template: on a page (the remarks and
# the count; the form empty), and on a refused form's page (no remarks, no
# count: Redis is not asked; the message and the fields as sent, escaped).
PAGE = {"$GUEST_REMARKS$": "(?P<remarks>.*?)",
        "$VISITOR_COUNT$": f"(?P<count>{COUNT_RE})",
        "$FORM_MESSAGE$": "", "$FORM_NAME$": "", "$FORM_REMARK$": ""}
REFUSED = {"$GUEST_REMARKS$": "",
           "$VISITOR_COUNT$": "not counted on this page",
           "$FORM_MESSAGE$": '<p class="form-message" role="alert">'
                             '(?P<message>[^<]+)</p>\n',
           "$FORM_NAME$": '(?P<name>[^<"]*)',
           "$FORM_REMARK$": "(?P<remark>[^<]*)"}


def page_regex(site, holes=PAGE):
    """The guestbook template as a regex: the page must be the template with
    only its placeholders replaced, each by its hole's regex."""
    template = (site / "templates" / "guestbook" / "index.html").read_text()
    parts = re.split("(" + "|".join(map(re.escape, holes)) + ")", template)
    assert {p for p in parts if p in holes} == set(holes), \
        "template lacks a placeholder"
    return re.compile("".join(holes.get(p, re.escape(p)) for p in parts)
                      + r"\Z", re.S)


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


def refused_fields(resp, site, status, says):
    """A refused form's answer: the guestbook page again with status and a
    message that says `says`. Returns the fields it kept, unescaped, as
    bytes (the text may be the invalid UTF-8 the visitor sent)."""
    assert resp.status == status, resp
    assert media_type(resp) == "text/html"
    assert int(resp.headers["Content-Length"]) == len(resp.body), resp
    m = page_regex(site, REFUSED).match(
        resp.body.decode("utf-8", "surrogateescape"))
    assert m, f"not the page with the form:\n{resp.body[:3000]}"
    assert says in m.group("message"), m.group("message")
    return tuple(html.unescape(m.group(g)).encode("utf-8", "surrogateescape")
                 for g in ("name", "remark"))


def assert_refused(server, site, body, tag, status, says, kept=None):
    """The POST is refused with status and stores nothing; the page keeps
    the fields as sent (kept: (name, remark) as bytes, decoded)."""
    fields = refused_fields(post_form(server.port, body), site, status, says)
    if kept is not None:
        assert fields == kept
    _, entries = get_page(server.port, site)
    assert not any(tag in e for e in entries)


def form(name, remark):
    """A form body as a browser encodes it: UTF-8, percent-escaped."""
    return (f"guest-name={urllib.parse.quote_plus(name)}&guest-remarks="
            f"{urllib.parse.quote_plus(remark)}").encode()


def assert_kept_refusal(server, site, name, remark, says):
    """Refused with 400, the page keeping exactly what was typed."""
    assert_refused(server, site, form(name, remark), remark[:12], 400, says,
                   (name.encode(), remark.encode()))


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


def test_remarks_posted_one_after_another_are_all_shown(binary, site,
                                                        tmp_path):
    """Three remarks on a Redis of its own: the page lists all three, in
    the order posted (a reply of several bulk strings is framed whole, not
    just the first or the last of them)."""
    with RedisServer(tmp_path / "redis").start() as redis, \
            ServerProcess(binary, site, redis.port) as server:
        tags = [token() for _ in range(3)]
        for tag in tags:
            assert post_form(server.port, f"guest-name=x&guest-remarks="
                             f"{tag}".encode()).status == 303
        _, entries = get_page(server.port, site)
    assert len(entries) == 3, entries
    assert [t for e in entries for t in tags if t in e] in (tags, tags[::-1])


LONG_REMARKS = 40  # remarks of MAX_REMARK three-byte characters: a reply of
# ~240 KB, many reads


def test_page_of_long_remarks_is_framed_whole_twice(binary, site, tmp_path):
    """40 remarks of 2,000 CJK characters each on a Redis of its own: the
    page lists all 40, twice in a row. A reply of many long bulk strings
    arrives in many reads; a reply framed a few bytes short (each string's
    CRLF not counted) is taken as whole too soon, and what is left of it
    misframes the next (a 503, or a page short of entries)."""
    with RedisServer(tmp_path / "redis").start() as redis, \
            ServerProcess(binary, site, redis.port) as server:
        tags = [token() for _ in range(LONG_REMARKS)]
        for tag in tags:
            remark = tag + "中" * (MAX_REMARK - len(tag))
            body = "guest-name=x&guest-remarks=" + urllib.parse.quote(remark)
            assert post_form(server.port, body.encode()).status == 303
        for _ in range(2):
            _, entries = get_page(server.port, site)
            assert len(entries) == LONG_REMARKS, len(entries)
            assert sorted(t for e in entries for t in tags if t in e) \
                == sorted(tags)


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


def test_template_maxlength_is_the_servers_limit(site):
    # The form rule holds only while the browser's limit and the server's
    # are the same numbers: the template's maxlength and every main.c.
    template = (site / "templates" / "guestbook" / "index.html").read_text()
    assert re.search(r'<input[^>]*name="guest-name"[^>]*maxlength="%d"'
                     % MAX_NAME, template)
    assert re.search(r'<textarea[^>]*name="guest-remarks"[^>]*'
                     r'maxlength="%d"' % MAX_REMARK, template)
    for main in sorted(REPO.glob("[0-9][0-9]_*/main.c")):
        text = main.read_text()
        for name, value in (("MAX_REMARK", MAX_REMARK), ("MAX_NAME", MAX_NAME)):
            assert re.search(rf"^#define {name} +{value}\b", text, re.M), main


@pytest.mark.parametrize("body", [b"guest-name=Nobody&guest-remarks=",
                                  b"guest-name=Nobody"],
                         ids=["empty", "missing"])
def test_empty_remark_is_400_with_the_name_kept(server, site, body):
    fields = refused_fields(post_form(server.port, body), site, 400,
                            "remark is empty")
    assert fields == (b"Nobody", b"")


@pytest.mark.parametrize("chars", [1000, 2000])
def test_remark_limit_counts_characters_not_bytes(server, site, chars):
    # "é" is 2 bytes decoded and 6 on the wire (%C3%A9): 2,000 of them are
    # 4,000 bytes, a remark the browser's maxlength="2000" accepts.
    tag = token()
    remark = tag + "é" * (chars - len(tag))
    assert remark in assert_stored(server, site, form("Utf", remark), tag)


def test_remark_of_2001_characters_is_refused_with_the_text_kept(server,
                                                                  site):
    remark = token() + "é" * (MAX_REMARK + 1 - 12)
    assert_kept_refusal(server, site, "Élise", remark,
                        "remark is longer than 2,000 characters")


@pytest.mark.parametrize("emoji", [1, (MAX_REMARK - 12) // 2],
                         ids=["one", "all"])
def test_emoji_remark_the_browser_accepts_is_stored(server, site, emoji):
    # An emoji is 2 UTF-16 units for maxlength and 4 bytes decoded: 2,000
    # units with one of them (1,999 characters), or all emoji but the tag.
    tag = token()
    remark = tag + "😀" * emoji + "a" * (MAX_REMARK - 2 * emoji - len(tag))
    assert len(remark.encode("utf-16-le")) == 2 * MAX_REMARK
    assert remark in assert_stored(server, site, form("Emo", remark), tag)


def test_line_break_counts_once(server, site):
    # A textarea's line break is one unit for maxlength; the browser sends
    # it as CR LF (%0D%0A): 1,000 of them and 1,000 letters fit.
    tag = token()
    remark = tag + "\r\n" * 1000 + "b" * (1000 - len(tag))
    entry = assert_stored(server, site, form("Lines", remark), tag)
    assert entry.startswith(remark)


def worst_form(tag):
    """The largest form a browser sends: 100 + 2,000 characters of 3 bytes
    each (CJK), each %XX%XX%XX on the wire; the tag spelled in CJK."""
    cjk = "".join(chr(0x4E00 + ord(c)) for c in tag)
    return form("中" * MAX_NAME, cjk + "中" * (MAX_REMARK - len(cjk))), cjk


def test_worst_case_form_is_stored(server, site):
    tag = token()
    body, cjk = worst_form(tag)
    assert len(body) == MAX_BODY - 6  # the field names take 26 of the 32
    entry = assert_stored(server, site, body, cjk)
    assert "中" * MAX_NAME in entry


@pytest.mark.parametrize("over, status", [(0, 303), (1, 413)],
                         ids=["at-the-cap", "one-over"])
def test_body_cap_is_the_worst_form(server, site, over, status):
    tag = token()
    body, cjk = worst_form(tag)
    body += b"&p=" + b"p" * (MAX_BODY + over - len(body) - 3)
    assert len(body) == MAX_BODY + over
    if status == 303:
        assert_stored(server, site, body, cjk)
    else:  # refused before the body is read: the page, its fields empty
        assert_refused(server, site, body, cjk, 413, "over 18,932 bytes",
                       (b"", b""))


@pytest.mark.parametrize("bad", [b"%C3%28", b"%C0%AF", b"%ED%A0%80",
                                 b"%F4%90%80%80", b"%E2%82", b"%FF"],
                         ids=["bad-continuation", "overlong", "surrogate",
                              "past-10FFFF", "cut-short", "ff"])
def test_invalid_utf8_is_400_with_the_text_kept(server, site, bad):
    tag = token().encode()
    raw = urllib.parse.unquote_to_bytes(bad)
    assert_refused(server, site, b"guest-name=Ann&guest-remarks=" + tag + bad
                   + b"+end", tag.decode(), 400, "not valid UTF-8",
                   (b"Ann", tag + raw + b" end"))


def test_invalid_utf8_in_name_is_400(server, site):
    tag = token().encode()
    assert_refused(server, site, b"guest-name=%C3&guest-remarks=" + tag,
                   tag.decode(), 400, "not valid UTF-8", (b"\xc3", tag))


def test_remark_of_2000_bytes_is_accepted(server, site):
    tag = token()
    remark = tag + "r" * (2000 - len(tag))
    assert remark in assert_stored(
        server, site, b"guest-name=Long&guest-remarks=" + remark.encode(), tag)


def test_name_of_100_characters_is_accepted(server, site):
    tag = token()
    name = "ñ" * MAX_NAME  # 200 bytes decoded
    assert name in assert_stored(server, site, form(name, tag), tag)


def test_name_of_101_characters_is_400_with_the_text_kept(server, site):
    assert_kept_refusal(server, site, "n" * (MAX_NAME + 1),
                        token() + " hello",
                        "name is longer than 100 characters")


def test_refused_form_keeps_the_text_escaped(server, site):
    # The kept text goes back inside value="..." and <textarea>: escaped,
    # it cannot close either or start a script.
    resp = post_form(server.port, form('"><script>x</script>',
                                       "</textarea><script>y</script>"
                                       + "z" * MAX_REMARK))
    assert b"<script>" not in resp.body
    assert refused_fields(resp, site, 400, "longer than") == (
        b'"><script>x</script>',
        ("</textarea><script>y</script>" + "z" * MAX_REMARK).encode())


@pytest.mark.parametrize("sent, kept", [
    (b"%00after", b"%00after"), (b"50%+off", b"50%+off")],
    ids=["nul", "bad-escape"])
def test_undecodable_field_is_400_kept_as_sent(server, site, sent, kept):
    tag = token().encode()
    assert_refused(server, site, b"guest-name=x&guest-remarks=" + tag + sent,
                   tag.decode(), 400, "not valid UTF-8", (b"x", tag + kept))


def test_redis_down_post_is_503_with_the_text_kept(binary, site):
    # Nothing listens on Redis's port: the remark cannot be stored, and the
    # visitor gets it back with the reason. The page itself (GET) says so
    # too, still with a form, instead of a bare error.
    server = ServerProcess(binary, site, free_port())
    try:
        remark = "Still here é 😀\r\nline two <b>"
        resp = post_form(server.port, form("Ann", remark))
        assert refused_fields(resp, site, 503, "your remark was not saved") \
            == (b"Ann", remark.encode())
        resp = exchange(server.port,
                        b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
        assert refused_fields(resp, site, 503, "cannot reach its storage") \
            == (b"", b"")
        server.stop()
    finally:
        server.cleanup()


@pytest.mark.models("iterative", "forking", "threaded", "poll", "epoll",
                    "io_uring", "fibers")
def test_guestbook_clients_leave_no_descriptor_behind(server):
    # Models whose Redis links do not grow with their clients: one link in
    # 01 and in each event loop, a link per child (02) or per client thread
    # (04) that goes with it. Once a page has opened the link, more clients
    # each asking for the page leave the server's descriptors as they were.
    assert get(server.port, "/guestbook").status == 200
    baseline = fd_count(server.pid)
    for _ in range(20):
        assert get(server.port, "/guestbook").status == 200
    assert wait_for_fds(server.pid, baseline) <= baseline


def test_large_pages_pipelined_to_a_reader_that_waits(binary, site,
                                                      tmp_path):
    # Pages of 100 long remarks, each escaped to four times its length
    # (some 800 KB a page), asked for 8 times in one go by a client with a
    # small window that reads nothing for a second: more than the kernel's
    # socket buffers hold, so a write falls short of its page, and must
    # resume where it stopped. (01 answers one request a connection.) Its
    # own Redis: pages this size are no one else's business.
    redis = RedisServer(tmp_path / "redis").start()
    try:
        remarks = [f"{token()} " + "<&>" * 600 for _ in range(100)]
        for remark in remarks:
            redis.command("RPUSH", "guestbook:remarks", f"4:Slow{remark}")
        shown = [f"{r} <span class=\"guest-name\">\u2014 Slow</span>"
                 for r in remarks]
        with ServerProcess(binary, site, redis.port) as server, \
                Connection(server.port, timeout=10) as conn:
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF,
                                 SMALL_RCVBUF)
            conn.send(b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n" * 8)
            time.sleep(1)
            for _ in range(8):
                resp = conn.read_response()
                assert resp.status == 200, resp
                m = page_regex(site).match(resp.body.decode("utf-8"))
                assert m, resp.body[:300]
                entries = re.findall(r'<p class="guest-entry">(.*?)</p>',
                                     m.group("remarks"), re.S)
                assert [html.unescape(e) for e in entries] == shown
                if resp.headers.get("Connection") == "close":
                    break
    finally:
        redis.stop()


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
