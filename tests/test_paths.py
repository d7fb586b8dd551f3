"""Request paths: nothing outside public/ is ever served."""

import pytest

from rawhttp import assert_html_error, exchange

PASSWD_MARK = b"root:"  # the first line of /etc/passwd


@pytest.mark.parametrize("target", [
    b"/../etc/passwd",
    b"/%2e%2e/%2e%2e/etc/passwd",
    b"/..%2f..%2fetc%2fpasswd",
    b"/a/../index.html",
    b"/..",
    b"/index.html%00.txt",
    b"/..\\..\\etc\\passwd",
    b"/%5c..%5cetc%5cpasswd",
])
def test_unsafe_path_is_400(server, target):
    resp = exchange(server.port,
                    b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 400)
    assert PASSWD_MARK not in resp.body


def test_symlink_to_outside_file_is_404(server):
    # public/escape.txt -> /etc/passwd
    resp = exchange(server.port,
                    b"GET /escape.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 404)
    assert PASSWD_MARK not in resp.body


def test_symlinked_directory_outside_is_404(server):
    # public/outside -> a directory outside public/ holding secret.txt
    resp = exchange(server.port,
                    b"GET /outside/secret.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 404)
    assert b"outside-secret" not in resp.body


@pytest.mark.parametrize("target", [b"/%zz", b"/index%2", b"/%g0.html"])
def test_bad_percent_escape_is_400(server, target):
    resp = exchange(server.port,
                    b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_html_error(resp, 400)
