#!/usr/bin/env python3
"""Grader for the batching lab (labs/batching/README.md).

What is counted is the loop's own promise: one io_uring_enter() per loop
turn, the one that submits and waits. Every enter that only submits (its
min_complete is 0) is a turn paying twice, whatever the load; that is
measured per turn, not only per request, so submitting every 8th entry or
once more per turn shows. The ring must be the reference's (no SQPOLL
kernel thread submitting for the server, both queues its sizes, its setup
flags), and a full ring's submission that the kernel refuses must not be
retried forever."""

import errno
import os
import re
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

from grading import (Grader, Unmet, _strace, ab_ok, ab_said,  # labs/grading.py
                     build_shim,
                     asking_clients, code_only, cpu_seconds,
                     death, descriptors, function_body, get, keepalive_load,
                     kept_clients,
                     raise_open_file_limit, seconds, source_text, stop_now,
                     stopped,
                     strace_calls, strace_count, wait_for)

REQUESTS = 4000  # keep-alive requests for /, 50 at a time
PER_REQUEST = 0.5  # io_uring_enter calls per request; batched is near 0.1
SHARE = 0.1  # enters that only submit, of all enters; batched: none
# (path, requests, concurrency): pages, Redis-bound pages, many clients
# at once, so that a turn queues hundreds of entries, and connections the
# server closes
# (a negative concurrency: no keep-alive, so the server closes each
# connection with its receive still armed: a cancel each), and one client
# alone (a turn of its few entries: its Redis round trips)
LOADS = [("/", REQUESTS, 50), ("/guestbook", 2000, 50), ("/", 5000, 1000),
         ("/", 2000, -50), ("/guestbook", 100, 1)]
POSTS = (4, 50)  # rounds of 50 POSTs at once with Expect: 100-continue
# Turns that come rarely under a steady load, each of which must still cost
# one enter: Redis drops the server's link (CLIENT KILL) and the next
# guestbook request reconnects, RECONNECTS times; and a server limited to
# NOFILE descriptors meets SHED clients at once, so that its multishot
# accept ends (EMFILE) and is armed again, client after client. There no
# enter may only submit, unless it hands over a full ring.
RECONNECTS = 5
# And a file under public/ changes (replaced by a rename) while it is
# cached: the inotify poll completes, the cache is emptied and the poll
# armed again in that turn, CHANGES times.
CHANGES = 5
NOFILE = 64  # the server's descriptor limit for the shedding
SHED = 150  # clients at once: more than NOFILE
RING = 4096  # the reference's submission queue: RING_ENTRIES
CQ_RING = 16384  # the reference's completion queue: CQ_ENTRIES
SETUP_FLAGS = 0x3008  # the reference's: CQSIZE | SINGLE_ISSUER | DEFER_TASKRUN
PLAIN_FLAGS = 0x8  # CQSIZE alone: the reference's ring where 0x3008 is refused
CROWD = 5000  # idle clients timed out in one loop turn: more than RING
REFUSED_CROWD = 5000  # clients at a stop whose full ring's submit fails
# What the shim below refuses with, in turn: a server started for each.
# Both are the kernel's "reap completions first"; an answer that retries on
# the one it thinks transient spins on it (rounds 11 and 12 each wrote one).
REFUSED_ERRNOS = (errno.EAGAIN, errno.EBUSY)
REFUSED_LIMIT = 5  # seconds after SIGTERM for that server to end (the
# reference: at once, its die(); a drain of the cancelled: 1 s)
REFUSED_SPIN = 0.5  # CPU-s the server may spend after SIGTERM still running
# (the reference: about 0.01 s to its die()); more is a retry loop, told
# at once rather than after REFUSED_LIMIT s of spinning
# A shim (LD_PRELOAD): from the start, every io_uring_enter() that only
# submits (min_complete 0) fails with REFUSE (-DREFUSE=EBUSY; EAGAIN if
# not given): EAGAIN as a kernel answers that ran out of resources for the
# request ("wait for some completions and try again", io_uring_enter(2)),
# EBUSY as one whose completion queue overflowed into a backlog it cannot
# flush: either way completions must be reaped first, which only the loop
# does, and a retry spins. The loop's own enter (min_complete 1) is
# untouched, so the server serves as before until a full ring must be
# handed over in the middle of a turn. A seccomp filter: liburing's calls
# are caught too.
SUBMIT_FAILS = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifndef REFUSE
#define REFUSE EAGAIN
#endif
__attribute__((constructor)) static void submit_fails(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_enter, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                 offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | REFUSE),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog))
        _exit(99);
}
"""
STOP_CROWD = 9000  # clients connected at the stop: over twice RING
WAITERS = 5000  # clients answered 503 in one turn when Redis does not answer
IDLE = 5  # seconds: the servers' idle timeout
BUSY_AFTER = 2.5  # s after the crowd's last answer: the busy client comes
REDIS_TIMEOUT = 1  # seconds: a Redis reply overdue, the waiters get 503
LONE = 20  # requests of a lone client, one after another, per page
LONE_LIMIT = 5  # seconds for all of them (the reference: about 0.05 s)
BESIDE = 3  # idle keep-alive clients beside the one busy client
BESIDE_LIMIT = 2.5  # seconds for its requests: they close after 5 s idle
ASK = b"GET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"
ASK_GUESTBOOK = b"GET /guestbook HTTP/1.1\r\nHost: x\r\n\r\n"
POST_BODY = b"guest-name=batch&guest-remarks=one+enter+per+turn"
POST_HEAD = (b"POST /guestbook HTTP/1.1\r\nHost: x\r\n"
             b"Content-Type: application/x-www-form-urlencoded\r\n"
             b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n"
             % len(POST_BODY))
WATCH = ("watch it: strace -f -e trace=io_uring_enter -p $(pgrep -x "
         "io_uring) under ab -k -n 4000 -c 50 (the 3rd argument, "
         "min_complete, is 0 on an enter that only submits)")
grader = Grader("batching")


def ring_server(lab, nofile=None, env=None, refused=False):
    """The server, refused if io_uring is not available, if its ring has
    an SQPOLL thread (a kernel thread that submits instead of the loop), if
    either of its queues is not the reference's size, or if it was set up
    with flags other than the reference's (strace follows the grader's fork
    of the server to see io_uring_setup). refused: the server's first
    io_uring_setup() fails with EINVAL (strace's fault injection), as a
    kernel before 6.1 refuses 0x3008: its fallback ring must be CQSIZE
    alone (0x8)."""
    started = []
    inject = ("-e", "inject=io_uring_setup:error=EINVAL:when=1") * refused
    setup = _strace(os.getpid(), ["io_uring_setup"],
                    lambda: started.append(lab.start(nofile=nofile, env=env)),
                    "-f", "-X", "raw", *inject)
    server = started[0]
    reason = lab.binary.unavailable()
    lab.expect(reason is None, f"io_uring is not available here: {reason}")
    rings = [fd for fd, what in descriptors(server.pid).items()
             if what == "anon_inode:[io_uring]"]
    lab.expect(rings, "no io_uring descriptor in /proc/PID/fd")
    for fd in rings:
        info = Path(f"/proc/{server.pid}/fdinfo/{fd}").read_text()
        lab.expect(f"SqMask:\t{RING - 1:#x}" in info,
                   f"the ring's submission queue is not the reference's "
                   f"{RING} entries (SqMask in /proc/{server.pid}/fdinfo/"
                   f"{fd}): a bigger ring only moves the full-ring case to "
                   "a bigger burst; keep RING_ENTRIES, change the code")
        cq = re.search(r"CqMask:\s*(\S+)", info)
        lab.expect(cq and cq[1] == f"{CQ_RING - 1:#x}",
                   f"the ring's completion queue is not the reference's "
                   f"{CQ_RING} entries (CqMask in /proc/{server.pid}/fdinfo/"
                   f"{fd}: {cq[1] if cq else 'none'}, the reference's "
                   f"{CQ_RING - 1:#x}): the ring stays as it is, both its "
                   "queues; keep CQ_ENTRIES, change the code")
        lab.expect("SqThread:\t-1" in info,
                   f"the ring has an SQPOLL thread (SqThread in /proc/"
                   f"{server.pid}/fdinfo/{fd}): a kernel thread submitting "
                   "on a core of its own does not batch; keep the "
                   "reference's ring flags")
    # Each io_uring_setup() the server made: its flags and its result.
    calls = [(int(f, 0), int(r)) for f, r in re.findall(
        r"io_uring_setup\(\d+, \{flags=(0x[0-9a-f]+|\d+).*\)\s+=\s+(-?\d+)",
        setup)]
    lab.expect(calls, "strace saw no io_uring_setup() as the server started")
    watch = ("the setup flags stay as they are; change the code, not the "
             "ring; watch it: strace -X raw -e trace=io_uring_setup "
             + "-e inject=io_uring_setup:error=EINVAL:when=1 " * refused
             + "./io_uring 8000")
    if refused:
        watch = (f"its first io_uring_setup() refused (EINVAL, as a kernel "
                 f"before 6.1 refuses {SETUP_FLAGS:#x}), the fallback ring "
                 f"is CQSIZE alone ({PLAIN_FLAGS:#x}), no other flag; "
                 + watch)
    extra = [f"{f:#x}" for f, _ in calls if f & ~SETUP_FLAGS]
    lab.expect(not extra, f"the ring was set up with flags {', '.join(extra)}"
               f" (the reference: {SETUP_FLAGS:#x}, IORING_SETUP_CQSIZE | "
               "SINGLE_ISSUER | DEFER_TASKRUN, or CQSIZE alone where those "
               f"are refused): {watch}")
    # CQSIZE alone only after the kernel refused the reference's flags.
    refused = False
    for f, result in calls:
        lab.expect(f == SETUP_FLAGS or (f == PLAIN_FLAGS and refused),
                   f"the ring was set up with flags {f:#x}" + (
                       " (CQSIZE alone) without asking for the reference's "
                       f"{SETUP_FLAGS:#x} first (IORING_SETUP_CQSIZE | "
                       "SINGLE_ISSUER | DEFER_TASKRUN): CQSIZE alone is what "
                       "only a kernel that refuses those (EINVAL) gets, and "
                       "this kernel was not asked"
                       if f == PLAIN_FLAGS else
                       f", not the reference's {SETUP_FLAGS:#x} "
                       "(IORING_SETUP_CQSIZE | SINGLE_ISSUER | "
                       "DEFER_TASKRUN), nor CQSIZE alone after the kernel "
                       "refused those") + f"; {watch}")
        refused = refused or (f == SETUP_FLAGS and result < 0)
    return server


def fallback_ring(lab):
    """The server started on a kernel that refuses the reference's flags
    (its first io_uring_setup() fails with EINVAL, strace's injection):
    ring_server() checks that the next asks for CQSIZE alone (0x8), no
    more; then it must serve a page. A note for the check's line."""
    server = ring_server(lab, refused=True)
    status, _ = get(server.port, "/")
    lab.expect(status == 200, f"GET / answered {status} by a server whose "
               f"first io_uring_setup() was refused (EINVAL, {SETUP_FLAGS:#x}"
               f"), on its fallback ring (CQSIZE alone, {PLAIN_FLAGS:#x})")
    return f"fallback ring {PLAIN_FLAGS:#x} after EINVAL serves"


def responses(socks, limit):
    """One response read on each socket, all at once, within limit s in
    all (stretched by TIMEOUT): for each, the response (head and body), or
    None if the server closed the connection (or reset it) before a byte
    came, or what came (b"" for nothing) if the time ran out. A 1xx interim
    answer counts as a response."""
    got = {s.fileno(): b"" for s in socks}
    done = {}
    deadline = time.monotonic() + seconds(limit)
    # epoll, not poll: a wait costs what is ready, not every socket (5,000
    # to 9,000 of them here, each poll() walking them all)
    with select.epoll(max(len(socks), 1)) as poller:
        for s in socks:
            poller.register(s.fileno(), select.EPOLLIN)
        while len(done) < len(socks):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left, 4096):
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # reset
                    chunk = b""
                if not chunk or complete(got[fd] + chunk):
                    done[fd] = got[fd] + chunk if chunk or got[fd] else None
                    poller.unregister(fd)
                else:
                    got[fd] += chunk
    return [done.get(s.fileno(), got[s.fileno()]) for s in socks]


def complete(data):
    """Whether data holds a whole response (its head and Content-Length
    bytes of body)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    return bool(sep) and len(body) >= content_length(data)


def enters_full(calls):
    """What is wrong with the enters that hand over a full ring: the
    complaint, or None. An enter that only submits (min_complete 0) must
    hand over a full ring, and one that hands over a full ring must only
    submit: a wait in the middle of a turn has no timeout, and a ring of
    receives may never complete."""
    args = [call.split(", ") for call in calls if call.count(", ") > 2]
    early = [a[1] for a in args if a[2] == "0" and a[1] != str(RING)]
    if early:
        return (f"{len(early)} io_uring_enter calls during that turn only "
                f"submitted, with {', '.join(early[:3])} entries: an enter "
                f"that only submits must hand over a full ring ({RING}), "
                "else it is one more enter than the turn needs")
    waited = [a[2] for a in args if a[1] == str(RING) and a[2] != "0"]
    if waited:
        return (f"{len(waited)} io_uring_enter calls handed over a full ring "
                f"({RING} entries) and waited (min_complete {waited[0]}): "
                "a full ring in the middle of a turn must be submitted "
                "without waiting (min_complete 0), since nothing bounds that "
                "wait (no timeout, no timer fires) and a ring of receives "
                "may never complete")
    return None


@grader.check(20, f"at most {PER_REQUEST} io_uring_enter calls per request "
              "under keep-alive load (ab -k -c 50); where the kernel refuses "
              f"{SETUP_FLAGS:#x}, the fallback ring is {PLAIN_FLAGS:#x}")
def batched(lab):
    server = ring_server(lab)
    calls = strace_count(server.pid, ["io_uring_enter"],
                         lambda: keepalive_load(lab, server.port, REQUESTS))
    per = calls.get("io_uring_enter", 0) / REQUESTS
    lab.expect(per <= PER_REQUEST, f"{per:.2f} io_uring_enter calls per "
               f"request; {WATCH}")
    return f"{per:.2f} per request; {fallback_ring(lab)}"


@grader.check(25, "one io_uring_enter per loop turn, the one that submits "
              f"and waits: at most {SHARE:.0%} of enters only submit, for "
              "pages, the guestbook, 1,000 clients at once, one client "
              "alone, and POSTs that expect 100 Continue; none (but a full "
              "ring's) as Redis reconnects, or accept is armed again after "
              "a shed client")
def one_enter_per_turn(lab):
    raise_open_file_limit()  # ab's 1,000 connections, and the server's
    server = ring_server(lab)
    seen = []
    for path, requests, concurrency in LOADS + [("POST", 0, 0)]:
        keep = concurrency > 0  # else no keep-alive: the server closes
        if path == "POST":
            what = (f"{POSTS[0]} rounds of {POSTS[1]} POST /guestbook at "
                    "once, each sending its head with Expect: 100-continue, "
                    "then its body once 100 Continue came")
            load = lambda: posts(lab, server.port)
            watch = (WATCH.split(" under ")[0] + " while curl -H 'Expect: "
                     "100-continue' -d guest-name=a -d guest-remarks=b "
                     "http://127.0.0.1:8000/guestbook runs (the 3rd "
                     "argument, min_complete, is 0 on an enter that only "
                     "submits)")
        else:
            what = (f"ab {'-k ' if keep else ''}-n {requests} -c "
                    f"{abs(concurrency)} {path}")
            load = lambda: ab_load(lab, server.port, path, requests,
                                   concurrency)
            watch = WATCH.replace("-k -n 4000 -c 50", f"{'-k ' * keep}-n "
                                  f"{requests} -c {abs(concurrency)} "
                                  f"...{path}")
        try:
            calls = strace_calls(server.pid, "io_uring_enter", load)
        except Exception:
            dead = death(lab)
            if dead:
                raise Unmet(f"{what}: {dead}")
            raise
        args = [call.split(", ") for call in calls if call.count(", ") > 2]
        extra = sum(1 for a in args if a[2] == "0")  # min_complete 0
        handed = sum(int(a[1]) for a in args if a[1].isdigit())
        lab.expect(extra <= SHARE * len(args),
                   f"{what}: {extra} of "
                   f"{len(args)} io_uring_enter calls only submitted "
                   f"(min_complete 0), {handed / max(len(args), 1):.1f} "
                   f"entries each on average: an enter more per turn; "
                   + watch)
        seen.append(f"{extra} of {len(args)}")
    # The rare turns: no enter there may only submit (but a full ring's).
    calls = strace_calls(server.pid, "io_uring_enter",
                         lambda: reconnects(lab, server.port))
    seen.append(f"{rare_extra(lab, calls, 'reconnects')} of {len(calls)}")
    calls = strace_calls(server.pid, "io_uring_enter",
                         lambda: file_changes(lab, server.port))
    seen.append(f"{rare_extra(lab, calls, 'changes')} of {len(calls)}")
    shedder = ring_server(lab, nofile=NOFILE)
    calls = strace_calls(shedder.pid, "io_uring_enter",
                         lambda: shed(lab, shedder.port))
    seen.append(f"{rare_extra(lab, calls, 'shedding')} of {len(calls)}")
    return f"enters that only submitted: {', '.join(seen)}"


def rare_extra(lab, calls, what):
    """0, the enters that only submitted (min_complete 0) without handing
    over a full ring; else Unmet, saying what, how many and with what."""
    args = [call.split(", ") for call in calls if call.count(", ") > 2]
    extra = [a[1] for a in args if a[2] == "0" and a[1] != str(RING)]
    said = {"reconnects": (
        f"Redis dropped the server's link {RECONNECTS} times (CLIENT KILL "
        "TYPE normal), each time a GET /guestbook reconnected",
        "queue the CONNECT (and the cancel of a failed link) like any "
        "entry: the turn's one enter hands it over; watch it: redis-cli "
        "CLIENT KILL TYPE normal, then curl .../guestbook"),
        "changes": (
        f"public/notes.txt replaced {CHANGES} times while cached (the "
        "inotify poll completes, the cache is emptied, the poll is armed "
        "again)",
        "queue the poll armed again like any entry: the turn's one enter "
        "hands it over (the kernel queues the poll's completion as the "
        "file changes, before any request sent after it, so no change is "
        "missed); watch it: curl .../notes.txt, touch public/notes.txt"),
        "shedding": (
        f"{SHED} clients at once at a server limited to {NOFILE} "
        "descriptors (ulimit -n), so that its multishot accept ends "
        "(EMFILE) and is armed again after each client shed",
        "arm the accept like any entry: the turn's one enter hands it "
        f"over; watch it: ulimit -n {NOFILE}; ./io_uring 8000, then ab "
        "-r -k -c 120 -n 3000 http://127.0.0.1:8000/")}[what]
    lab.expect(not extra, f"{said[0]}: {len(extra)} of {len(args)} "
               "io_uring_enter calls only submitted (min_complete 0), with "
               f"{', '.join(extra[:3])} entries: an enter more in that turn "
               "(a turn that comes rarely still makes one enter, the one "
               f"that submits and waits); {said[1]}")
    return 0


def reconnects(lab, port):
    """RECONNECTS times: Redis drops every client's link (the server's
    too), then GET /guestbook until it is answered 200 (the server saw the
    link go, waited out its backoff, connected again)."""
    for n in range(RECONNECTS):
        killed = lab.redis.command("CLIENT", "KILL", "TYPE", "normal")
        lab.expect(killed, "CLIENT KILL TYPE normal found no client of "
                   "Redis: the server was not connected to it")
        status = wait_for(lambda: status_of(port, "/guestbook"),
                          lambda s: s == 200, limit=10)
        lab.expect(status == 200, f"GET /guestbook answered {status}, not "
                   f"200, 10 s after Redis dropped the server's link (drop "
                   f"{n + 1} of {RECONNECTS}): the server must connect again")


def file_changes(lab, port):
    """CHANGES times: GET /notes.txt (cached now, its directory watched),
    then the file is replaced (written beside the site, renamed over it),
    and GET /notes.txt until it says the new words (the server saw the
    change: its inotify poll completed and was armed again)."""
    public = lab.site / "public"
    for n in range(CHANGES):
        status, _ = get(port, "/notes.txt")
        lab.expect(status == 200, f"GET /notes.txt answered {status}")
        words = f"changed {n + 1} of {CHANGES}\n".encode()
        fresh = lab.workdir / "notes.txt.new"
        fresh.write_bytes(words)
        os.replace(fresh, public / "notes.txt")
        body = wait_for(lambda: body_of(port, "/notes.txt"),
                        lambda b: b == words, limit=10)
        lab.expect(body == words, f"GET /notes.txt answered {body[:40]!r}, "
                   f"10 s after public/notes.txt was replaced by "
                   f"{words!r} (change {n + 1} of {CHANGES}): the file "
                   "cache's inotify poll must be armed again after each "
                   "change")


def body_of(port, path):
    """The body of one GET of path (b"" if not answered 200), after a
    pause of 0.02 s (wait_for polls it)."""
    time.sleep(0.02)
    try:
        status, body = get(port, path)
    except OSError:
        return b""
    return body if status == 200 else b""


def status_of(port, path):
    """The status of one GET of path (0: no answer, a reset), after a
    pause of 0.05 s (wait_for polls it)."""
    time.sleep(0.05)
    try:
        return get(port, path)[0]
    except OSError:
        return 0


def shed(lab, port):
    """SHED clients at once, each asking: the server (NOFILE descriptors)
    answers some and sheds the rest; each must be answered or closed
    within 10 s, and the server serves again once they leave."""
    socks = asking_clients(port, SHED, ASK)
    try:
        got = responses(socks, 10)
    finally:
        for s in socks:
            s.close()
    hanging = sum(1 for r in got if r is not None and not complete(r))
    lab.expect(not hanging, f"{hanging} of {SHED} clients at a server "
               f"limited to {NOFILE} descriptors neither answered nor "
               "closed within 10 s")
    status = wait_for(lambda: status_of(port, "/"), lambda s: s == 200,
                      limit=10)
    lab.expect(status == 200, f"GET / answered {status} once the {SHED} "
               f"clients at a server limited to {NOFILE} descriptors left")


def ab_load(lab, port, path, requests, concurrency):
    """ab for path: keep-alive if concurrency > 0, else new connections
    (the server closes each); every request must succeed, within 60 s in
    all (a few seconds for the reference)."""
    keep = concurrency > 0
    argv = ["ab", "-q", *(["-k"] if keep else []), "-n", str(requests),
            "-c", str(abs(concurrency)), "-s", str(int(seconds(30))),
            f"http://127.0.0.1:{port}{path}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=seconds(60))
    except subprocess.TimeoutExpired:
        raise Unmet(f"{' '.join(argv[1:-1])} {path} did not finish within "
                    f"{seconds(60):.0f} s (the reference takes a few): a "
                    "turn waits for more than one completion, or for its "
                    "timeout") from None
    lab.expect(ab_ok(done), f"{' '.join(argv[1:-1])} {path} failed: "
               + ab_said(done))


def posts(lab, port):
    """POSTS rounds of POSTs to the guestbook, each round's clients at
    once: each sends its head with Expect: 100-continue, waits for the
    100 Continue (at most 5 s), sends its body, and must be answered."""
    for _ in range(POSTS[0]):
        socks = [socket.create_connection(("127.0.0.1", port),
                                          timeout=seconds(5))
                 for _ in range(POSTS[1])]
        try:
            for s in socks:
                s.sendall(POST_HEAD)
            interim = responses(socks, 5)
            for s in socks:
                s.sendall(POST_BODY)
            final = responses(socks, 10)
        finally:
            for s in socks:
                s.close()
        odd = [i for i in interim if not (i and i.startswith(b"HTTP/1.1 100"))]
        lab.expect(not odd, f"a POST with Expect: 100-continue got "
                   f"{(odd[:1] or [b''])[0] or b'nothing'!r:.40} before its "
                   "body, not 100 Continue")
        odd = [f for f in final if not (f and f[9:10] in b"23")]
        lab.expect(not odd, "a POST to /guestbook was answered "
                   f"{(odd[:1] or [b''])[0] or b'nothing'!r:.40}")


@grader.check(15, f"{CROWD} idle clients timed out in one loop turn (more "
              f"entries than the ring's {RING}): each closed, the server "
              "lives")
def full_ring(lab):
    raise_open_file_limit()
    server = ring_server(lab)
    before = len(descriptors(server.pid))
    clients = kept_clients(server.port, CROWD)
    first = sum(bool(r) and r.startswith(b"HTTP/1.1 200")
                for r in responses(clients, 30))
    answered = time.monotonic()  # every idle timer of the crowd runs
    lab.expect(first == CROWD, f"{first} of {CROWD} keep-alive clients "
               "answered their first request within 30 s"
               + (f"; {death(lab)}" if death(lab) else ""))
    # Their idle timers started as each was answered, spread over the time
    # the crowd took to connect (seconds on a busy machine, so that the
    # first could fall due before the stop, a few per turn). Asked again
    # while the server is stopped, they all restart within its next turns.
    with stopped(server.pid):
        for c in clients:
            c.sendall(ASK)
    asked = time.monotonic()  # no idle timer of the crowd due before +IDLE
    again = sum(bool(r) and r.startswith(b"HTTP/1.1 200")
                for r in responses(clients, 30))
    answered = time.monotonic()
    lab.expect(again == CROWD, f"{again} of {CROWD} keep-alive clients "
               "answered their second request within 30 s"
               + (f"; {death(lab)}" if death(lab) else ""))
    # The one more client: its idle timer falls due 2.5 s after the
    # crowd's, room for the turn that closes them all on a busy machine.
    time.sleep(BUSY_AFTER)
    busy = kept_clients(server.port, 1)[0]  # asks again during the stop
    got = answer(busy)
    lab.expect(got and got.startswith(b"HTTP/1.1 200"),
               f"a new client got {(got or b'nothing')[:20]!r}")
    closed, margin, got = [], [], []

    def burst():
        margin.append(asked + IDLE - time.monotonic())
        with stopped(server.pid):  # every idle timer of the crowd falls due
            time.sleep(max(0, answered + IDLE + 0.5 - time.monotonic()))
            busy.sendall(ASK)  # its operations: the turn's first entries
        # Its answer, and one more on the same connection, at once: read
        # after the crowd's closes were counted, the second came past its
        # own idle timeout on a busy machine (a close, not a lost owner).
        got.append(told(busy))
        if got[0].startswith(b"HTTP/1.1 200"):  # the connection still works
            busy.sendall(ASK)
            got.append(told(busy))
        closed.append(sum(r is None for r in responses(clients, IDLE * 2)))

    calls = strace_calls(server.pid, "io_uring_enter", burst)
    closed = closed[0]
    wrong = enters_full(calls)
    lab.expect(not wrong, wrong)
    dead = death(lab)
    for c in clients:
        c.close()
    busy.close()
    lab.expect(not dead, f"{dead}: in the turn that closed {CROWD} idle "
               f"clients, more than the ring's {RING} entries "
               "(io_uring_get_sqe() returns NULL each time it is full: "
               "submit what is queued, then take a slot again, and tag the "
               f"slot it returns); watch it: {CROWD} kept clients, SIGSTOP "
               f"the server for {IDLE + 1} s, SIGCONT")
    lab.expect(all(g.startswith(b"HTTP/1.1 200") for g in got),
               "a client that asked during that turn got "
               f"{b' then '.join(g[:20] for g in got)!r}: a completion "
               "went to the wrong owner (a slot taken again after a submit "
               "keeps the user_data of the entry it held before: tag it)")
    lab.expect(closed == CROWD, f"{closed} of {CROWD} idle "
               f"clients closed by the server after their {IDLE} s, all due "
               "in one loop turn: that "
               f"turn queued more than the ring's {RING} entries "
               "(io_uring_get_sqe() returns NULL each time it is full: "
               "submit what is queued, then take a slot again, and tag the "
               f"slot it returns); watch it: {CROWD} kept clients, SIGSTOP "
               f"the server for {IDLE + 1} s, SIGCONT")
    status, _ = get(server.port, "/")
    lab.expect(status == 200, f"GET / answered {status} after the burst")
    left = wait_for(lambda: len(descriptors(server.pid)) - before,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} descriptors more than before the {CROWD} "
               "clients came, 5 s after each was closed: an operation of "
               "that turn was lost or went to the wrong owner (a slot taken "
               "before a submit, or retaken without its user_data)")
    return f"stopped {margin[0]:.1f} s before the crowd's first idle timer"


@grader.check(10, f"{WAITERS} clients waiting on a Redis that does not "
              "answer, all answered 503 in one loop turn (more sends than "
              f"the ring's {RING} entries): each answered, nothing lost")
def full_ring_answers(lab):
    raise_open_file_limit()
    server = ring_server(lab)
    status, _ = get(server.port, "/guestbook")  # the Redis link is up
    lab.expect(status == 200, f"GET /guestbook answered {status}")
    before = len(descriptors(server.pid))
    clients = kept_clients(server.port, WAITERS)
    first = sum(bool(r) and r.startswith(b"HTTP/1.1 200")
                for r in responses(clients, 30))
    lab.expect(first == WAITERS, f"{first} of {WAITERS} keep-alive clients "
               "answered their first request within 30 s"
               + (f"; {death(lab)}" if death(lab) else ""))
    lab.stall_redis()  # SIGSTOP: connected, never answers
    got = []

    def burst():
        with stopped(server.pid):  # so that all ask within one Redis wait
            for c in clients:
                c.sendall(ASK_GUESTBOOK)
        got.extend(responses(clients, REDIS_TIMEOUT + 10))

    calls = strace_calls(server.pid, "io_uring_enter", burst)
    dead = death(lab)
    for c in clients:
        c.close()
    told = sum(bool(r) and r.startswith(b"HTTP/1.1 503") for r in got)
    other = next((r for r in got if not (r and r.startswith(
        b"HTTP/1.1 503"))), b"")
    lab.expect(not dead and told == WAITERS, f"{told} of {WAITERS} clients "
               f"waiting on a stopped Redis answered 503 within "
               f"{REDIS_TIMEOUT + 10} s (one got "
               f"{(other or b'nothing')[:20]!r})"
               + (f"; {dead}" if dead else "") + ": when the Redis reply is "
               f"overdue ({REDIS_TIMEOUT} s) every waiter is answered in one "
               f"turn, more sends than the ring's {RING} entries (a full "
               "ring can come from any code that queues: let new_sqe() "
               "submit what is queued and take a slot again); watch it: "
               f"{WAITERS} kept clients, SIGSTOP redis-server, each asks for "
               "/guestbook")
    wrong = enters_full(calls)
    lab.expect(not wrong, wrong)
    left = wait_for(lambda: len(descriptors(server.pid)) - before,
                    lambda n: n <= 0, limit=2 * IDLE + 2)  # timers included
    lab.expect(left <= 0, f"{left} descriptors more than before the "
               f"{WAITERS} clients came, {2 * IDLE + 2} s after each, "
               "answered, left (every idle timer has fired since): the "
               "completion of a send of that turn went to the wrong owner, "
               "so its connection never read again (a slot taken again "
               "after a submit must be tagged like any other: owner | op)")
    os.kill(lab.redis.proc.pid, signal.SIGCONT)
    lab.stalled = False
    status, _ = get(server.port, "/")
    lab.expect(status == 200, f"GET / answered {status} after the burst")


@grader.check(5, f"a lone client answered at once: {LONE} requests one "
              f"after another for / and for /guestbook, within {LONE_LIMIT} "
              f"s in all alone, {BESIDE_LIMIT} s beside {BESIDE} idle "
              "keep-alive clients")
def lone_client(lab):
    server = ring_server(lab)
    took = []
    for beside, ask in ((0, ASK.replace(b"/notes.txt", b"/")),
                        (0, ASK_GUESTBOOK),
                        (BESIDE, ASK.replace(b"/notes.txt", b"/")),
                        (BESIDE, ASK_GUESTBOOK)):
        idle = kept_clients(server.port, beside)  # answered, then silent:
        answered = responses(idle, 5)  # each with a receive in flight
        lab.expect(all(r and r.startswith(b"HTTP/1.1 200") for r in answered),
                   f"{beside} keep-alive clients were not all answered")
        sock = socket.create_connection(("127.0.0.1", server.port),
                                        timeout=seconds(5))
        limit = BESIDE_LIMIT if beside else LONE_LIMIT
        start = time.monotonic()
        for n in range(LONE):
            sock.sendall(ask)
            got = responses([sock], limit)[0]
            spent = time.monotonic() - start
            lab.expect(got and got.startswith(b"HTTP/1.1 200") and
                       spent <= seconds(limit),
                       f"{ask.split()[1].decode()}: request {n + 1} of "
                       f"{LONE} from one keep-alive client, one at a time"
                       + (f", beside {beside} idle keep-alive clients (the "
                          "only busy one)" if beside else " (alone)") +
                       f": {(got or b'nothing')[:20]!r} after {spent:.1f} s "
                       f"in all (at most {limit} s; the reference takes "
                       "about 0.05 s): the loop's enter must wait for one "
                       "completion (min_complete 1), not for more, which a "
                       "lone busy client never makes, however many others "
                       "are connected; watch it: time curl -s "
                       "http://127.0.0.1:8000/ >/dev/null"
                       + (f" with {beside} idle curl --keepalive clients "
                          "connected" if beside else ""))
        took.append(f"{spent:.2f} s")
        sock.close()
        for s in idle:
            s.close()
    return f"{', '.join(took)}"


def answer(sock, limit=10):
    """One small response on a kept connection: None if the server closed
    it, b"" if nothing came within limit s."""
    sock.settimeout(seconds(limit))
    data = b""
    try:
        if not sock.recv(65536, socket.MSG_PEEK):
            return None
        while b"\r\n\r\n" not in data or len(data.partition(
                b"\r\n\r\n")[2]) < content_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    except OSError:  # reset
        return None if not data else data
    return data


def told(sock):
    """answer(sock), a close or nothing said so."""
    got = answer(sock)
    return b"a close" if got is None else got or b"nothing"


def content_length(data):
    head = data.partition(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


TAG = r"io_uring_sqe_set_data|user_data\s*="  # a slot's tag set


def guard(text, at):
    """The condition the statement at offset `at` of a function body runs
    under: its own if (without braces), or the if of a block around it
    ("else" for an else branch), innermost first; None if it always runs
    (as far as ifs go)."""
    own = if_before(text, at, r"\)", r"\belse\b")
    if own:
        return own
    depth = 0
    for i in range(at - 1, -1, -1):
        if text[i] == "}":
            depth += 1
        elif text[i] == "{" and depth:
            depth -= 1
        elif text[i] == "{":  # a block around it: under an if?
            around = if_before(text, i, r"\)\s*$", r"\belse\s*$")
            if around:
                return around
    return None


def if_before(text, at, close, otherwise):
    """The condition of the `if (...)` (its closing parenthesis matched by
    `close`) in the statement head that ends at `at`, "else" if the head
    matches `otherwise`, else None."""
    start = max(text.rfind(c, 0, at) for c in ";{}")
    head = text[start + 1:at]
    cond = re.search(r"\bif\s*\((.*)" + close, head, re.S)
    if cond:
        return cond[1]
    return "else" if re.search(otherwise, head) else None


def on_slot_alone(cond, slots):
    """Whether a condition names nothing but the slot (e.g. `if (!sqe)`)."""
    return not re.search(r"\b(?!(?:%s|NULL)\b)[A-Za-z_]\w*" % "|".join(
        map(re.escape, slots)), cond)


def tags(code, text, lo=0, hi=None, slots=("sqe",), depth=3,
         where=("new_sqe()", 0)):
    """Whether text[lo:hi] sets a slot's tag whatever the entry: itself,
    or through a function of code's that it calls (a helper such as
    tag_sqe(sqe, owner, op), up to depth calls deep), not under a condition
    on anything but the slot. (True, None), or (False, a tag found only
    under such a condition: (function, line, condition))
    or (False, None)."""
    hi = len(text) if hi is None else hi
    name, first = where
    found = None
    def under(at):  # a condition on more than the slot, or None
        cond = guard(text, at)
        return None if cond is None or on_slot_alone(cond, slots) else cond
    for m in re.finditer(TAG, text[lo:hi]):
        cond = under(lo + m.start())
        if cond is None:
            return True, None
        line = first + text.count("\n", 0, lo + m.start())
        found = found or (name, line, cond)
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", text[lo:hi]):
        called = function_body(code, m[1]) if depth else None
        if m[1] in ("if", "while", "for", "switch", "return", "sizeof") \
                or not called:
            continue
        head = re.search(rf"\b{m[1]}\s*\(([^;{{}})]*)\)\s*{{", code)
        own = tuple(re.findall(r"struct\s+io_uring_sqe\s*\*\s*(\w+)",
                               head[1])) if head else ()
        ok, inner = tags(code, called[1], slots=own or ("sqe",),
                         depth=depth - 1, where=(f"{m[1]}()", called[0]))
        if not ok:
            found = found or inner
            continue
        cond = under(lo + m.start())
        if cond is None:
            return True, None
        line = first + text.count("\n", 0, lo + m.start())
        found = found or (name, line, cond)
    return False, found


REAP = (r"\b(io_uring_peek_cqe|io_uring_wait_cqes?|io_uring_for_each_cqe|"
        r"io_uring_peek_batch_cqe|io_uring_cqe_seen|io_uring_cq_advance|"
        r"dispatch)\s*\(")  # completions taken in, handed to their owners


def reaps(code, text, depth=3, seen=()):
    """The reaping call text makes (itself, or through a function of
    code's that it calls, up to depth calls deep), or None."""
    found = re.search(REAP, text)
    if found:
        return found[0].rstrip("( ")
    called = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
    for name in called - set(seen) - {"if", "while", "for", "switch",
                                       "return", "sizeof"}:
        body = function_body(code, name) if depth else None
        said = body and reaps(code, body[1], depth - 1, (*seen, name))
        if said:
            return f"{name}() -> {said}"
    return None


@grader.check(5, "every slot new_sqe() hands out is tagged with its owner, "
              "whatever its owner, and new_sqe() reaps no completion "
              "(source review)")
def tagged_slots(lab):
    text = source_text(lab)
    found = function_body(code_only(text), "new_sqe")
    lab.expect(found, "no new_sqe() found in the source")
    first, body = found
    code = code_only(text)
    said = reaps(code, body, seen=("new_sqe",))
    lab.expect(not said, f"new_sqe() takes in completions ({said}) and "
               "hands them to their owners: a completion handler then runs "
               "inside whatever code asked for a slot (conn_close(), the "
               "timers' loop, another handler halfway through), which "
               "re-enters state it is in the middle of; new_sqe() submits "
               "on a full ring, and only the loop reaps")
    lines = text.splitlines()
    def only_when(said):  # the complaint about a conditional tag
        where, line, cond = said
        return (f"{where} line {line} tags the slot only when "
                f"{' '.join(cond.split())} ({lines[line - 1].strip()[:70]!r})"
                ": a slot left untagged keeps the user_data of the entry it "
                "held before, whatever its owner (a close or a cancel with "
                "none too), so its completion goes to that entry's owner; "
                "tag every slot")
    for tag in re.finditer(TAG, body):  # a tag set only for some slots
        cond = guard(body, tag.start())
        line = first + body.count("\n", 0, tag.start())
        lab.expect(cond is None or on_slot_alone(cond, ("sqe",)),
                   only_when(("new_sqe()", line, cond or "")))
    for ret in re.finditer(r"\breturn\b[^;]*;", body):
        taken = [m.end() for m in re.finditer(r"io_uring_get_sqe\s*\(",
                                             body[:ret.end()])]
        if not taken:
            continue
        tagged, said = tags(code, body, taken[-1], ret.end(),
                            where=("new_sqe()", first))
        line = first + body.count("\n", 0, ret.start())
        lab.expect(tagged or not said, f"new_sqe() line {line} returns a "
                   "slot taken with io_uring_get_sqe() that is tagged only "
                   "under a condition since: " + (only_when(said) if said
                                                  else ""))
        lab.expect(tagged, f"new_sqe() line {line} returns a "
                   "slot taken with io_uring_get_sqe() and not tagged since "
                   f"({lines[line - 1].strip()[:70]!r}): a slot "
                   "keeps the user_data of the entry it held before, so its "
                   "completion goes to that entry's owner; set it on every "
                   "slot you return")
    return "every slot returned is tagged"


@grader.check(5, "a full ring's submission that the kernel refuses (EAGAIN, "
              f"then EBUSY) at a stop with {REFUSED_CROWD} clients "
              f"connected: the server ends within {REFUSED_LIMIT} s by die() "
              "(status 1, its message), not a retry forever, a crash or a "
              "dropped entry")
def refused_submit(lab):
    return "; ".join(f"{errno.errorcode[err]}: {refused_once(lab, err)}"
                     for err in REFUSED_ERRNOS)


def shim_howto(err):
    """How to build the refusing shim by hand, as a "watch it" says."""
    define = "" if err == errno.EAGAIN else f"-DREFUSE={errno.errorcode[err]} "
    return (f"gcc -shared -fPIC {define}-o submit_fails.so submit_fails.c "
            "(from labs/batching/grade.py), LD_PRELOAD=./submit_fails.so "
            f"./io_uring 8000, {REFUSED_CROWD} kept clients, kill -TERM")


def refused_once(lab, err):
    """refused_submit with every submit-only enter refused with err."""
    raise_open_file_limit()
    name = errno.errorcode[err]
    shim = build_shim(lab, f"submit_fails_{name}", SUBMIT_FAILS,
                      f"-DREFUSE={name}")
    server = ring_server(lab, env={"LD_PRELOAD": str(shim)})
    before = len(descriptors(server.pid))
    clients = kept_clients(server.port, REFUSED_CROWD)
    try:
        got = responses(clients, 30)
        dead = death(lab)
        if dead:  # it gave up on a refused submission: not a hang
            by_die(lab, server, server.proc.returncode, "before the stop",
                   err)
            return f"ended before the stop: {dead}"
        first = sum(bool(r) and r.startswith(b"HTTP/1.1 200") for r in got)
        lab.expect(first == REFUSED_CROWD, f"{first} of {REFUSED_CROWD} "
                   "keep-alive clients answered their first request within "
                   "30 s, every io_uring_enter() that only submits failing "
                   f"with {name} (the loop's own enter working)")
        # Stopped (SIGSTOP) while counted and told to stop, so that no
        # idle timer fires in between on a busy machine: the turn it
        # resumes in reads the stop and closes whoever is still connected.
        stop_now(server.pid)
        held = len(descriptors(server.pid)) - before
        if held <= RING:  # idle timers fired: the stop would not fill it
            os.kill(server.pid, signal.SIGCONT)
            raise RuntimeError(f"only {held} of the {REFUSED_CROWD} clients "
                               "still connected at the stop (the machine is "
                               "too slow for this check)")
        spent = cpu_seconds(server.pid)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        os.kill(server.pid, signal.SIGCONT)
        try:
            code = ended(server, spent, started)
            server.result = code  # stopped by the check
        except subprocess.TimeoutExpired:
            spin = cpu_seconds(server.pid) - spent
            later = time.monotonic() - started
            server.proc.kill()  # deaf to SIGTERM: no second wait for it
            server.result = server.proc.wait()
            raise Unmet(
                f"SIGTERM with {REFUSED_CROWD} clients connected, each of "
                "whose receives the stop cancels (more than the ring's "
                f"{RING} entries: a full ring handed over in the middle of "
                "the turn), every io_uring_enter() that only submits failing "
                f"with {name} (the kernel's \"reap some completions first\", "
                "and only the loop reaps): the server still "
                f"runs {later:.1f} s later, "
                f"{spin:.1f} s of CPU since the stop (the reference: about "
                f"0.01 s to its exit; at most {REFUSED_SPIN} s, or "
                f"{REFUSED_LIMIT} s in all): new_sqe() retries a "
                "submission the kernel refuses, forever, and never returns "
                "to the loop that reads the stop; check what "
                "io_uring_submit() returns (a full ring that cannot be "
                "handed over, whatever the errno, EAGAIN's \"try again\" "
                "and EBUSY's \"busy\" too, is the broken ring the starter's "
                f"die() is for); watch it: {shim_howto(err)}") from None
        said = by_die(lab, server, code, f"{time.monotonic() - started:.1f}"
                      " s after SIGTERM", err)
        return (f"{REFUSED_CROWD} clients; ended "
                f"{time.monotonic() - started:.1f} s "
                f"after SIGTERM, status {code}"
                + (f": {said[-1][:80]}" if said else ""))
    finally:
        for c in clients:
            c.close()


def ended(server, spent, started):
    """The exit status of the server told to stop (SIGTERM) at `started`
    (monotonic) with `spent` CPU-s used by then, once it exits; Timeout-
    Expired if it still runs REFUSED_LIMIT s later, or sooner once it has
    used REFUSED_SPIN CPU-s since (a loop retrying what the kernel refuses:
    no need to watch it spin for seconds more)."""
    limit = started + seconds(REFUSED_LIMIT)
    while True:
        try:
            return server.proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            try:
                spin = cpu_seconds(server.pid) - spent
            except (OSError, ValueError, IndexError):  # exiting
                continue
            if spin > REFUSED_SPIN or time.monotonic() > limit:
                raise


def by_die(lab, server, code, when, err):
    """Unmet unless the server under the shim refusing with err ended as
    die() ends it: exit status 1 (not a signal, not 0) and a line on stderr
    that names an error (the kernel's err, or the starter's EBUSY, not
    "Success"). Its stderr's lines."""
    name, say = errno.errorcode[err], os.strerror(err)
    said = server.stderr().strip().splitlines()
    how = (f"died of {signal.Signals(-code).name}" if code < 0 else
           f"exited with status {code}")
    lab.expect(code == 1 and said, f"the server {how} {when}"
               + (f" ({said[-1][:80]!r})" if said else ", saying nothing")
               + f", with {REFUSED_CROWD} clients connected and every "
               f"io_uring_enter() that only submits failing with {name}: a "
               "full ring the kernel refuses is a broken ring, and the "
               "starter's die() is the answer there (exit status 1 and its "
               "message): "
               + ("a slot io_uring_get_sqe() did not give (NULL) was used; "
                  "check what io_uring_submit() returns and take the slot "
                  "again only after it handed the ring over" if code < 0
                  else "the operation of a refused slot went nowhere, and "
                  "its owner waits forever on a completion that never comes"
                  if code == 0 else "end by die()")
               + f"; watch it: {shim_howto(err)}, echo $?")
    last = said[-1].rstrip()
    lab.expect(last.endswith((say, os.strerror(errno.EBUSY))),
               f"the server ended by die() "
               f"{when} (status 1), but its message {last[:80]!r} does not "
               f"name the error: the kernel refused the submission with "
               f"{name} ({say!r}), and die() prints "
               "strerror(errno); io_uring_submit() returns -errno and sets "
               "no errno, so errno is whatever it was before (0: "
               "\"Success\", a refusal reported as success); set errno from "
               "what io_uring_submit() returned (or EBUSY, as the starter "
               f"did) before die(); watch it: {shim_howto(err)}")
    return said


@grader.check(15, "pages and the guestbook still served; a clean stop, "
              f"with {STOP_CROWD} clients connected (over twice the ring's "
              f"{RING} entries)")
def still_serves(lab):
    raise_open_file_limit()
    server = ring_server(lab)
    for path in ("/", "/guestbook", "/style.css"):
        status, _ = get(server.port, path)
        lab.expect(status == 200, f"GET {path} answered {status}")
    clients = kept_clients(server.port, STOP_CROWD)
    try:
        first = sum(bool(r) and r.startswith(b"HTTP/1.1 200")
                    for r in responses(clients, 30))
        lab.expect(first == STOP_CROWD, f"{first} of {STOP_CROWD} keep-alive "
                   "clients answered their first request within 30 s"
                   + (f"; {death(lab)}" if death(lab) else ""))
        try:
            server.stop()  # SIGTERM: exit 0 and the summary within 10 s
        except AssertionError as error:
            said = " ".join(str(error).split())[:300]
            raise Unmet(f"{said}: at the stop, with {STOP_CROWD} "
                        "clients connected, the loop cancels each, more than "
                        f"twice the ring's {RING} entries in one go "
                        "(io_uring_get_sqe() returns NULL each time it is "
                        "full: submit what is queued, then take a slot "
                        f"again); watch it: {STOP_CROWD} kept clients, then "
                        "kill -TERM the server") from None
    finally:
        for c in clients:
            c.close()


if __name__ == "__main__":
    grader.main()
