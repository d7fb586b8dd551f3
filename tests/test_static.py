"""Static files from public/: bytes, MIME types, HEAD, indexes, redirects."""

from urllib.parse import quote

import pytest

from rawhttp import Connection, assert_html_error, exchange, get, media_type


def test_static_bytes_equal_the_files(server, site):
    public = site / "public"
    paths = [p for p in public.rglob("*")
             if p.is_file() and not p.is_symlink()
             and not (public / "outside") in p.parents]
    assert len(paths) >= 10
    for path in paths:
        url = "/" + quote(str(path.relative_to(public)))
        resp = get(server.port, url)
        assert resp.status == 200, (url, resp)
        assert resp.body == path.read_bytes(), url
        assert int(resp.headers["Content-Length"]) == path.stat().st_size


MIME_CASES = [
    ("/types/page.html", {"text/html"}),
    ("/types/style.css", {"text/css"}),
    ("/types/app.js", {"text/javascript", "application/javascript"}),
    ("/types/data.json", {"application/json"}),
    ("/types/notes.txt", {"text/plain"}),
    ("/types/pixel.png", {"image/png"}),
    ("/types/shape.svg", {"image/svg+xml"}),
    ("/types/old.htm", {"text/html"}),
    ("/types/photo.jpg", {"image/jpeg"}),
    ("/types/photo.jpeg", {"image/jpeg"}),
    ("/types/anim.gif", {"image/gif"}),
    ("/types/favicon.ico", {"image/x-icon", "image/vnd.microsoft.icon"}),
    ("/types/image.webp", {"image/webp"}),
    ("/types/font.woff2", {"font/woff2"}),
    ("/types/paper.pdf", {"application/pdf"}),
    ("/LOGO.PNG", {"image/png"}),  # the extension is case-insensitive
    ("/types/blob.xyz", {"application/octet-stream"}),
    ("/types/noextension", {"application/octet-stream"}),
]


@pytest.mark.parametrize("path, expected", MIME_CASES,
                         ids=[path for path, _ in MIME_CASES])
def test_mime_type_by_extension(server, path, expected):
    resp = exchange(server.port,
                    f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert resp.status == 200
    assert media_type(resp) in expected, resp.headers


def test_head_has_headers_but_no_body(server, site):
    size = (site / "public" / "index.html").stat().st_size
    with Connection(server.port) as conn:
        conn.send(b"HEAD /index.html HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        resp = conn.read_response(head=True)
        assert resp.status == 200
        assert int(resp.headers["Content-Length"]) == size
        assert media_type(resp) == "text/html"
        # Nothing may follow the head: the next bytes are the close.
        assert conn.wait_closed(3)


def test_head_of_a_missing_file_has_no_body(server):
    # An error page obeys HEAD too: its head says the page's length, and
    # none of the page follows.
    with Connection(server.port) as conn:
        conn.send(b"HEAD /no-such-file.html HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        resp = conn.read_response(head=True)
        assert resp.status == 404
        assert int(resp.headers["Content-Length"]) > 0
        assert conn.wait_closed(3)


def test_missing_file_is_404_with_html_body(server):
    resp = exchange(server.port,
                    b"GET /no-such-file.html HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 404)


def test_root_serves_index_html(server, site):
    resp = exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200
    assert resp.body == (site / "public" / "index.html").read_bytes()
    assert media_type(resp) == "text/html"


def test_directory_with_slash_serves_its_index(server, site):
    resp = exchange(server.port, b"GET /docs/ HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200
    assert resp.body == (site / "public" / "docs" / "index.html").read_bytes()


def test_directory_without_slash_redirects(server):
    resp = exchange(server.port, b"GET /docs HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 301
    assert resp.headers["Location"] == "/docs/"


def test_directory_without_index_is_404(server):
    resp = exchange(server.port, b"GET /types/ HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 404)


@pytest.mark.parametrize("target", [b"/index.html?v=1", b"/?a=b&c=d"])
def test_query_string_is_ignored_for_static(server, site, target):
    resp = exchange(server.port,
                    b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200
    assert resp.body == (site / "public" / "index.html").read_bytes()


def test_percent_encoded_space_in_name(server, site):
    resp = exchange(server.port,
                    b"GET /with%20space.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200
    assert resp.body == (site / "public" / "with space.txt").read_bytes()
