"""Every Redis reply the guestbook does not expect, for each of its four
commands (LRANGE, INCR, GET for a page; RPUSH for a post): an error, a nil,
a reply of the wrong type, an integer at its limit, a reply cut off by
Redis closing the link. Each is answered 503 (the page with the form and
the reason: docs/DESIGN.md §3), never a page with stale or partial data,
and the server serves the next page from what Redis holds then. A reply
that arrives split across reads is no fault at all: it is served.

Errors that a real Redis gives are made with a real redis-server, a
private one per test module and worker (the keys are changed under the
servers, which the session's shared Redis must not see): INCR on a value
that is not an integer, at the integer limit, on a list; LRANGE and RPUSH
on a string. Replies no real Redis gives (a nil where a number is due, a
string for a list, a split or a cut) come from FakeRedis below: a real
socket server on 127.0.0.1 that speaks RESP2, keeps a small store of its
own, and answers one scripted reply when told to.
"""

import re
import socket
import threading
import time

import pytest

from processes import RedisServer, ServerProcess, token
from rawhttp import exchange
from test_guestbook import entry_with, form, page_regex, post_form, \
    refused_fields

RECOVERY = 5.0  # seconds for a server to serve a page again (event
# servers back off 100 ms after a lost link, doubling: a few tries at most)
PAGE_DOWN = "cannot reach its storage"  # a page Redis could not fill
POST_DOWN = "your remark was not saved"  # a remark Redis did not take


def bulk(text):
    data = text.encode() if isinstance(text, str) else text
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)


def stored(name, remark):
    """A list element as the servers store it: "<name length>:" name remark."""
    return f"{len(name.encode())}:{name}{remark}"


class FakeRedis:
    """A RESP2 server on 127.0.0.1 (a thread per connection) with a store
    of one list and one counter. It answers LRANGE, INCR, GET and RPUSH as
    Redis does, except the next command named in `script`: that one gets
    the scripted pieces, sent with a pause between them, and then, if the
    script says so, the connection is closed."""

    PAUSE = 0.03  # seconds between the pieces of a split reply

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.remarks = []  # list elements, as the servers store them
        self.visitors = 0
        self.script = {}  # command -> (pieces, close afterwards)
        self.conns = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def answer_next(self, command, *pieces, close=False):
        """The next `command` gets these pieces as its reply."""
        with self.lock:
            self.script[command] = (pieces, close)

    def pending(self):
        with self.lock:
            return dict(self.script)

    def close(self):
        self.closed = True
        self.listener.close()
        for conn in list(self.conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,),
                             daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                command, buf = self._command(buf)
                if command is None:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                    continue
                with self.lock:
                    name = command[0].decode().upper()
                    scripted = self.script.pop(name, None)
                    reply = None if scripted else self._reply(name, command)
                if scripted is None:
                    conn.sendall(reply)
                    continue
                pieces, close = scripted
                for i, piece in enumerate(pieces):
                    if i:
                        time.sleep(self.PAUSE)
                    conn.sendall(piece)
                if close:
                    time.sleep(self.PAUSE)  # the piece leaves before the FIN
                    return
        except OSError:
            return
        finally:
            conn.close()

    @staticmethod
    def _command(buf):
        """One whole command (a RESP array of bulk strings) from buf:
        (its arguments, the rest), or (None, buf) until it is all here."""
        if not buf.startswith(b"*") or b"\r\n" not in buf:
            return None, buf
        line, rest = buf.split(b"\r\n", 1)
        args = []
        for _ in range(int(line[1:])):
            if b"\r\n" not in rest:
                return None, buf
            line, rest = rest.split(b"\r\n", 1)
            n = int(line[1:])
            if len(rest) < n + 2:
                return None, buf
            args.append(rest[:n])
            rest = rest[n + 2:]
        return args, rest

    def _reply(self, name, args):
        if name == "LRANGE":
            return array(*(bulk(r) for r in self.remarks[-100:]))
        if name == "INCR":
            self.visitors += 1
            return b":%d\r\n" % self.visitors
        if name == "GET":
            return bulk(str(self.visitors))
        if name == "RPUSH":
            self.remarks.append(args[2].decode())
            return b":%d\r\n" % len(self.remarks)
        return b"-ERR unknown command\r\n"


@pytest.fixture
def fake_redis():
    fake = FakeRedis()
    yield fake
    fake.close()


@pytest.fixture
def faked(binary, site, fake_redis):
    """A server whose Redis is the fake, with two remarks stored."""
    fake_redis.remarks = [stored("Ann", "first remark"),
                          stored("Bob", "second <remark>")]
    fake_redis.visitors = 41
    with ServerProcess(binary, site, fake_redis.port) as server:
        yield server


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    """A real redis-server for this module alone (per xdist worker)."""
    server = RedisServer(tmp_path_factory.mktemp("own-redis")).start()
    yield server
    server.stop()


def page(port, site):
    """GET /guestbook: (status, count or None, entries, response)."""
    resp = exchange(port, b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    if resp.status != 200:
        return resp.status, None, None, resp
    m = page_regex(site).match(resp.body.decode("utf-8"))
    assert m, resp.body[:3000]
    entries = re.findall(r'<p class="guest-entry">(.*?)</p>',
                         m.group("remarks"), re.S)
    return 200, int(m.group("count").replace(",", "")), entries, resp


def assert_page_refused(port, site, case):
    """The page Redis could not fill: 503, the form and the reason, no
    remarks and no count (refused_fields checks the page is exactly the
    template with those holes)."""
    resp = exchange(port, b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 503, (case, resp)
    assert refused_fields(resp, site, 503, PAGE_DOWN) == (b"", b""), case


def serves_again(port, site, want_count, want_entries, case):
    """Pages come back, from what Redis holds now (not from before)."""
    deadline = time.monotonic() + RECOVERY
    while True:
        status, count, entries, resp = page(port, site)
        if status == 200:
            break
        assert status == 503, (case, resp)
        assert time.monotonic() < deadline, f"{case}: no page since"
        time.sleep(0.05)
    assert count == want_count(), case
    assert len(entries) == len(want_entries), (case, entries)
    for want, got in zip(want_entries, entries):
        assert want in got, (case, entries)


def fake_entries(fake):
    """The remarks the fake holds, as a page shows them (escaped; the
    test's names and remarks are ASCII, so a name's length is in bytes)."""
    shown = []
    for element in fake.remarks[-100:]:
        length, rest = element.split(":", 1)
        shown.append(rest[int(length):].replace("<", "&lt;")
                     .replace(">", "&gt;"))
    return shown


def run_cases(server, site, fake, command, cases):
    """Each case: Redis answers `command` so, the page (or post) is refused
    with 503, then served again from the fake's store."""
    for case, pieces, close in cases:
        fake.answer_next(command, *pieces, close=close)
        deadline = time.monotonic() + RECOVERY
        while True:
            if command == "RPUSH":
                tag = token()
                resp = post_form(server.port, form("Cy", f"{tag} <kept>"))
                assert resp.status == 503, (case, resp)
                assert refused_fields(resp, site, 503, POST_DOWN) == (
                    b"Cy", f"{tag} <kept>".encode()), case
            else:
                assert_page_refused(server.port, site, case)
            if not fake.pending():
                break
            # A link still backing off after the case before answered
            # without asking Redis (09 has a link per loop): ask again.
            assert time.monotonic() < deadline, \
                f"{case}: {command} was never sent"
            time.sleep(0.05)
        serves_again(server.port, site, lambda: fake.visitors,
                     fake_entries(fake), case)


ENTRY = bulk(stored("Eve", "partial"))

LRANGE_CASES = [
    ("error", [b"-ERR injected\r\n"], False),
    ("wrongtype-error", [b"-WRONGTYPE Operation against a key holding the "
                         b"wrong kind of value\r\n"], False),
    ("bulk-string", [bulk("not a list")], False),
    ("integer", [b":2\r\n"], False),
    ("nil-bulk", [b"$-1\r\n"], False),
    ("nil-array", [b"*-1\r\n"], False),
    ("array-with-an-integer", [b"*2\r\n" + ENTRY + b":7\r\n"], False),
    ("array-with-a-nil", [b"*2\r\n" + ENTRY + b"$-1\r\n"], False),
    ("array-with-an-error", [b"*2\r\n" + ENTRY + b"-ERR inside\r\n"], False),
    ("garbled", [b"?what\r\n"], False),
    ("cut-mid-array", [b"*3\r\n" + ENTRY + b"$9\r\npart"], True),
    ("cut-in-a-length", [b"*2\r\n$1"], True),
]

INCR_CASES = [
    ("error", [b"-ERR increment or decrement would overflow\r\n"], False),
    ("nil-bulk", [b"$-1\r\n"], False),
    ("bulk-string", [bulk("42")], False),
    ("simple-string", [b"+OK\r\n"], False),
    ("array", [array(b":42\r\n")], False),
    ("cut-mid-integer", [b":4"], True),
]

GET_CASES = [
    ("error", [b"-ERR injected\r\n"], False),
    ("nil-bulk", [b"$-1\r\n"], False),
    ("not-a-number", [bulk("forty-two")], False),
    ("integer-reply", [b":42\r\n"], False),
    ("simple-string", [b"+42\r\n"], False),
    ("array-of-one", [array(bulk("42"))], False),
    ("past-the-integer-limit", [bulk("9223372036854775808")], False),
    ("bulk-shorter-than-its-text", [b"$2\r\n421\r\n"], False),
    ("cut-mid-bulk", [b"$2\r\n4"], True),
]

RPUSH_CASES = [
    ("error", [b"-ERR injected\r\n"], False),
    ("wrongtype-error", [b"-WRONGTYPE Operation against a key holding the "
                         b"wrong kind of value\r\n"], False),
    ("nil-bulk", [b"$-1\r\n"], False),
    ("bulk-string", [bulk("3")], False),
    ("simple-string", [b"+OK\r\n"], False),
    ("cut-mid-integer", [b":3"], True),
]


@pytest.mark.parametrize("command, cases", [
    ("LRANGE", LRANGE_CASES), ("INCR", INCR_CASES), ("GET", GET_CASES),
    ("RPUSH", RPUSH_CASES)], ids=["LRANGE", "INCR", "GET", "RPUSH"])
def test_unexpected_reply_is_503_then_served(faked, site, fake_redis,
                                             command, cases):
    serves_again(faked.port, site, lambda: fake_redis.visitors,
                 fake_entries(fake_redis), "before")
    run_cases(faked, site, fake_redis, command, cases)


def test_reply_split_across_reads_is_served(faked, site, fake_redis):
    # Each command's reply whole, in pieces cut at every awkward place:
    # inside a type line, between CR and LF, inside a bulk string and its
    # length. Nothing is wrong: the page (the post) is served.
    fake = fake_redis
    lrange = array(*(bulk(r) for r in fake.remarks))
    for command, reply, cuts, count in [
            ("LRANGE", lrange, [1, 3, 4, 6, 9, len(lrange) - 3,
                                len(lrange) - 1], 42),
            ("INCR", b":1234\r\n", [1, 3, 6], 1234),
            ("GET", bulk("1234567"), [1, 2, 3, 7, 10], 1234567),
            ("RPUSH", b":3\r\n", [1, 2, 3], None)]:
        edges = [0, *cuts, len(reply)]
        fake.answer_next(command, *(reply[a:b]
                                    for a, b in zip(edges, edges[1:])))
        if command == "RPUSH":
            resp = post_form(faked.port, form("Split", token()))
            assert resp.status == 303, resp  # the reply was RPUSH's integer
            assert not fake.pending()
            continue
        # INCR's scripted reply stands for the increment; GET's for the count
        fake.visitors = {"LRANGE": 41, "INCR": 1234, "GET": 1234566}[command]
        status, shown, entries, resp = page(faked.port, site)
        assert status == 200, (command, resp)
        assert not fake.pending(), command
        assert shown == count, command
        assert len(entries) == 2, (command, entries)
        assert "first remark" in entries[0], command
        assert "second &lt;remark&gt;" in entries[1], command


RESP_MAX_ITEMS = 128  # strings one reply may hold (the config block)


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-bound", "one-past"])
def test_reply_item_bound_is_128(faked, site, fake_redis, over):
    # Real Redis sends at most 100 (LRANGE -100 -1); the framing's own
    # bound is 128 strings: at it the page shows them all, past it 503.
    items = [stored("", f"item-{i:03d}") for i in range(RESP_MAX_ITEMS + over)]
    fake_redis.answer_next("LRANGE", array(*(bulk(i) for i in items)))
    if over:
        assert_page_refused(faked.port, site, "129 items")
        serves_again(faked.port, site, lambda: fake_redis.visitors,
                     fake_entries(fake_redis), "after 129 items")
    else:
        status, _, entries, resp = page(faked.port, site)
        assert status == 200, resp
        assert [e.split(" <span")[0] for e in entries] == \
            [f"item-{i:03d}" for i in range(RESP_MAX_ITEMS)]


LLONG_MAX = 2 ** 63 - 1


def test_real_redis_error_replies_are_503_then_served(binary, site,
                                                      own_redis):
    # INCR on a word, on a list, at the integer limit; LRANGE and RPUSH on
    # a string: each an error reply from a real Redis. Just under the limit
    # the count is still shown, all 19 digits of it.
    r = own_redis

    def reset():
        r.command("DEL", "guestbook:remarks", "guestbook:visitors")
        r.command("RPUSH", "guestbook:remarks", stored("Ann", "real one"))
        r.command("SET", "guestbook:visitors", 41)

    def assert_serves(case, count=42):
        status, shown, entries, resp = page(server.port, site)
        assert status == 200, (case, resp)
        assert shown == count, case
        assert len(entries) == 1 and "real one" in entries[0], case

    with ServerProcess(binary, site, r.port) as server:
        reset()
        assert_serves("before")
        for case, key, setup in [
                ("INCR on a word", "guestbook:visitors", ("SET", "word")),
                ("INCR on a list", "guestbook:visitors", ("RPUSH", "x")),
                ("INCR past the limit", "guestbook:visitors",
                 ("SET", LLONG_MAX)),
                ("LRANGE on a string", "guestbook:remarks", ("SET", "s"))]:
            r.command("DEL", key)
            r.command(setup[0], key, setup[1])
            assert_page_refused(server.port, site, case)
            if "limit" in case:
                assert r.command("GET", key) == str(LLONG_MAX), case
            reset()
            assert_serves(f"after {case}")
        # RPUSH to a string: the post is refused, the text kept.
        r.command("SET", "guestbook:remarks", "s")
        resp = post_form(server.port, form("Dee", "to a string"))
        assert refused_fields(resp, site, 503, POST_DOWN) == (
            b"Dee", b"to a string")
        reset()
        assert_serves("after RPUSH on a string")
        # One under the limit: INCR reaches it, and the page shows it.
        r.command("SET", "guestbook:visitors", LLONG_MAX - 1)
        assert_serves("at the limit", LLONG_MAX)
