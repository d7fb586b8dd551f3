"""Fixtures: one real redis-server and one site directory per session, and a
fresh server process per test, parametrized over every built binary.

Binaries: $ZEROHTTPD_BINARIES (space-separated paths), else every ./NAME and
asan/NAME that `make all` / `make asan` built. Test ids name the server:
test_x[iterative], test_x[asan-iterative], ...

A test marked @pytest.mark.models("preforked") runs only against those models.

Run: `make all asan && python3 -m pytest tests -q`, or for some servers only:
`ZEROHTTPD_BINARIES="./epoll asan/epoll" python3 -m pytest tests -q`.
"""

import os
import resource
import shutil

import pytest

from processes import REPO, RedisServer, ServerProcess, discover_binaries

BINARIES = discover_binaries()
BIG_FILE_SIZE = 8 * 1024 * 1024  # large enough to outlast socket buffers

PNG_BYTES = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00"
             b"\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc"
             b"\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND"
             b"\xaeB`\x82")

# One file per extension the MIME tests check (the content is irrelevant).
SAMPLE_FILES = {
    "page.html": b"<!doctype html><p>html</p>\n",
    "style.css": b"p { color: red; }\n",
    "app.js": b"console.log('js');\n",
    "data.json": b'{"json": true}\n',
    "notes.txt": b"plain text\n",
    "pixel.png": PNG_BYTES,
    "shape.svg": b'<svg xmlns="http://www.w3.org/2000/svg"/>\n',
    "old.htm": b"<p>htm</p>\n",
    "photo.jpg": b"\xff\xd8\xff\xe0jpg",
    "photo.jpeg": b"\xff\xd8\xff\xe0jpeg",
    "anim.gif": b"GIF89a",
    "favicon.ico": b"\x00\x00\x01\x00",
    "image.webp": b"RIFF\x00\x00\x00\x00WEBP",
    "font.woff2": b"wOF2",
    "paper.pdf": b"%PDF-1.4\n",
    "blob.xyz": b"\x00\x01\x02unknown extension\n",
    "noextension": b"no extension at all\n",
}


# Modules whose module-scoped fixture does the work of all their tests (one
# trace run, one run of every handout, one pack, one sweep host): under
# pytest-xdist (`make test` runs `-n 4 --dist loadgroup`) all their tests go
# to one worker, or each worker would redo that work.
ONE_WORKER = ("test_trace", "test_handouts", "test_lab_pack",
              "test_sweep_placement", "test_sweep_costs")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "models(*names, asan=True): run only against these server "
        "models (asan=False: their plain builds only)")
    config.addinivalue_line(
        "markers", "serial: measures how long or how much work something "
        "took against another process's, so it runs alone: make test runs "
        "`-m 'not serial'` in parallel, then `-m serial` on its own")


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if module in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(module))


def pytest_generate_tests(metafunc):
    if "binary" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("models")
    wanted = [b for b in BINARIES if marker is None or (
        b.model in marker.args and not (b.asan and marker.kwargs.get(
            "asan") is False))]
    metafunc.parametrize("binary", wanted, ids=[b.id for b in wanted])


@pytest.fixture(autouse=True)
def skip_unavailable_server(request):
    """A server the kernel cannot run here (io_uring where io_uring_setup is
    refused) is reported as skipped, with its own reason, never passed."""
    if "binary" in request.fixturenames:
        reason = request.getfixturevalue("binary").unavailable()
        if reason:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def redis(tmp_path_factory):
    """The shared redis-server. Tests share it, so they compare counts
    rather than expect exact values, and tag their remarks uniquely."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A working directory for the servers: copies of the repo's public/ and
    templates/, plus files that exercise MIME types, sizes and escapes."""
    root = tmp_path_factory.mktemp("site")
    for name in ("public", "templates"):
        assert (REPO / name).is_dir(), f"the repo has no {name}/ directory"
        shutil.copytree(REPO / name, root / name, symlinks=True)
    public = root / "public"
    (public / "big.bin").write_bytes(os.urandom(BIG_FILE_SIZE))
    # Symlinks out of public/: a file and a directory. Neither may be served.
    (public / "escape.txt").symlink_to("/etc/passwd")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("outside-secret\n")
    (public / "outside").symlink_to(outside, target_is_directory=True)
    (public / "with space.txt").write_text("a file name with a space\n")
    (public / "LOGO.PNG").write_bytes(PNG_BYTES)
    types = public / "types"
    types.mkdir()
    for name, data in SAMPLE_FILES.items():
        (types / name).write_bytes(data)
    return root


@pytest.fixture
def server(binary, site, redis):
    """A fresh server on a free port, stopped with SIGTERM after the test;
    the stop checks the exit code, the summary and the sanitizers."""
    with ServerProcess(binary, site, redis.port) as proc:
        yield proc


@pytest.fixture(scope="module")
def many_descriptors(request):
    """Raise this process's open-file soft limit towards the test module's
    WANTED_FDS (the hard limit here is 20,000); servers started meanwhile
    inherit it. Restored after the module. Use it with
    `pytestmark = [..., pytest.mark.usefixtures("many_descriptors")]`."""
    wanted = request.module.WANTED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
