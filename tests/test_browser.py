"""The browser and the server agree (issue 23, docs/DESIGN.md §3 the form rule):
a remark the guestbook's form accepts is stored, and a refused one comes
back in the form with a message.

Headless Chromium (Debian's chromium and chromium-driver) fills in the form
through tests/browser.py, run with a Python that has Selenium; the servers
are real, on 127.0.0.1, against the session's Redis.
"""

import json
import subprocess

import pytest

from processes import REPO, python_with, token
from rawhttp import Response, parse_head
from test_guestbook import MAX_REMARK, refused_fields

# Plain builds: the same requests reach the ASan builds in test_guestbook;
# a browser start per test is what costs here.
pytestmark = pytest.mark.models("iterative", "prethreaded", "epoll",
                                "io_uring", "fibers", asan=False)

BROWSER_TIMEOUT = 120  # seconds for Chromium to start, type, send, report


def units(text):
    """Length as the browser's maxlength counts it: UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def sign_in_browser(port, name, remark, force=False):
    """Chromium types name and remark into the page's form and signs: what
    it shows next (see tests/browser.py)."""
    proc = subprocess.run(
        [python_with("selenium"), str(REPO / "tests" / "browser.py"),
         f"http://127.0.0.1:{port}/guestbook"],
        input=json.dumps({"name": name, "remark": remark, "force": force}),
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_typed_remark_of_2000_units_with_emoji_and_accents_is_stored(server):
    # Emoji are 2 units each, "é" and "中" one, a line break one (sent as
    # CR LF). What the browser lets a visitor type, up to maxlength, is
    # what the server stores; the browser drops what is typed past it.
    tag = token()
    remark = tag + "é😀\n中" * 397 + "ab."
    assert units(remark) == MAX_REMARK
    shown = sign_in_browser(server.port, "Zoë 😀", remark + " past the limit")
    assert shown["typed"] == MAX_REMARK
    assert shown["message"] is None and shown["remark"] == "", shown
    mine = [e for e in shown["entries"] if e.startswith(tag)]
    assert mine == [remark + " — Zoë 😀"]


def test_over_long_remark_comes_back_in_the_form(server, site):
    # With curl: 2,001 characters are refused with the page, the text kept.
    tag = token()
    remark = "\n" + tag + " é" * ((MAX_REMARK - len(tag)) // 2)
    assert len(remark) == MAX_REMARK + 1
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-D", "-",
         "--data-urlencode", "guest-name=Ann",
         "--data-urlencode", "guest-remarks=" + remark.replace("\n", "\r\n"),
         f"http://127.0.0.1:{server.port}/guestbook"],
        capture_output=True, timeout=20, check=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    resp = Response(*parse_head(head + b"\r\n\r\n"), body)
    assert refused_fields(resp, site, 400, "longer than 2,000 characters") \
        == (b"Ann", remark.replace("\n", "\r\n").encode())
    # The browser (the length set by script: maxlength stops typing) gets
    # the same page back and shows the text in the form, line breaks and
    # all: the textarea's first line break survives the HTML parser.
    shown = sign_in_browser(server.port, "Ann", remark, force=True)
    assert shown["typed"] == MAX_REMARK + 1
    assert "longer than 2,000 characters" in shown["message"]
    assert (shown["name"], shown["remark"]) == ("Ann", remark)
    assert not any(tag in e for e in shown["entries"])
