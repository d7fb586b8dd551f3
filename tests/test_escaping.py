"""The whole escape set (html_escape in every main.c: & < > " '), in the
name and in the remark, on the rendered guestbook page and on a refused
form's page (the fields kept, decoded or as sent). The page must hold each
field escaped exactly: a character dropped from the escaper shows up raw, a
wrong entity shows up as itself, and text that already looks like an
entity (`&amp;`, `&#39;`) is escaped again, never passed through.
"""

import re

import pytest

from processes import token
from test_guestbook import (MAX_NAME, REFUSED, entry_with, form, get_page,
                            page_regex, post_form)

ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
           "'": "&#39;"}
EVERY = "&<>\"'"  # every character the escaper maps
LOOKALIKES = "&amp; &#39; &lt;"  # already entities: escaped again


def escaped(text):
    return "".join(ESCAPES.get(c, c) for c in text)


def test_escape_set_in_the_rendered_page(server, site):
    tag = token()
    name = f"N{EVERY} {LOOKALIKES} <b>'Eve'</b>"
    remark = f"{tag} {EVERY}{EVERY[::-1]} {LOOKALIKES} <script>x=\"1\"</script>"
    resp = post_form(server.port, form(name, remark))
    assert resp.status == 303, resp
    entry = entry_with(get_page(server.port, site)[1], tag)
    m = re.fullmatch(r'(.*) <span class="guest-name">&mdash; (.*)</span>',
                     entry, re.S)
    assert m, entry
    assert m.group(1) == escaped(remark)
    assert m.group(2) == escaped(name)


@pytest.mark.parametrize("why", ["name-too-long", "undecodable"])
def test_escape_set_in_the_refused_form(server, site, why):
    # Refused, the page gives the fields back inside value="..." and
    # <textarea>: decoded (a name too long), or as they came when they do
    # not decode (a bad %-escape: the raw bytes, which a client may send
    # unencoded).
    tag = token()
    if why == "name-too-long":
        name = f"N{EVERY} {LOOKALIKES}"
        name += "n" * (MAX_NAME + 1 - len(name))
        remark = f"{tag} {EVERY} {LOOKALIKES} </textarea>"
        body = form(name, remark)
    else:  # '&' splits fields: where it is text it goes %-encoded
        name = f"N{EVERY} {LOOKALIKES}"  # decodes: kept decoded
        remark = f"{tag} {EVERY} %zz {LOOKALIKES} </textarea>".replace(
            "&", "%26")  # a bad escape: kept as sent, %26 and all
        body = (b"guest-name=" + name.replace("&", "%26").encode()
                + b"&guest-remarks=" + remark.encode())
    resp = post_form(server.port, body)
    assert resp.status == 400, resp
    m = page_regex(site, {**REFUSED, "$FORM_NAME$": "(?P<name>[^\"]*)",
                          "$FORM_REMARK$": "(?P<remark>.*?)"}).match(
        resp.body.decode("utf-8"))
    assert m, resp.body[:3000]
    assert m.group("name") == escaped(name)
    assert m.group("remark") == escaped(remark)
