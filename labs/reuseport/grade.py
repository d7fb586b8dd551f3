#!/usr/bin/env python3
"""Grader for the reuseport lab (labs/reuseport/README.md).

What it looks at is the kernel's side: the sockets listening on the port
(their inodes, as ss -ltne lists them, and each one's options, read
through a copy of the server's own descriptor), and where the kernel sends
a burst of new connections (the per-loop counts of the summary)."""

import ctypes
import errno
import os
import re
import selectors
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from grading import (Grader, connections, death_telling,  # labs/
                     build_shim,
                     get, seconds, wait_for)
from processes import free_port  # tests/processes.py

LOOPS = 4  # more than two: a socket shared by every loop after the first
BURST = 800  # new connections, one request each, 50 at a time
LISTEN_BACKLOG = 16384  # open_listener()'s listen(), as main.c defines it
ENV = {"ZEROHTTPD_LOOPS": str(LOOPS)}
RUN = f"ZEROHTTPD_LOOPS={LOOPS} ./reuseport 8000 &"  # how to watch it by hand
SOMAXCONN = 65535  # the kernel's cap on a queue, raised where the grader
# may (its own network namespace, as root) so that queue lengths differ
# as the code asks, not as the cap makes them all 4096
grader = Grader("reuseport")
# A shim (LD_PRELOAD) that makes one kind of call fail as the kernel would,
# from the process's Nth on, whichever thread makes it: FAIL_CALL=socket
# (a TCP socket()), bind, listen, or SO_REUSEPORT, SO_REUSEADDR or
# TCP_NODELAY (a setsockopt() of that option), FAIL_FROM=N, with the errno
# FAIL_ERRNO gives (any: the grader tries them all). From the
# Nth on, not the Nth alone: a
# listener's bind() that fails here fails again if tried again (the port's
# other socket is the server's own first one), so a retry ends in die() too.
NTH_FAILS = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
static int fail_errno = -1; /* this run's, when FAIL_ERRNOS gave a list */
static int failed(void)
{
    errno = fail_errno >= 0 ? fail_errno : atoi(getenv("FAIL_ERRNO"));
    return -1;
}
static int failing(const char *name)
{
    static int calls;
    const char *which = getenv("FAIL_CALL"), *from = getenv("FAIL_FROM");
    if (!which || !from || (fail_errno < 0 && !getenv("FAIL_ERRNO")) ||
        strcmp(which, name) != 0)
        return 0;
    return __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST) >= atoi(from);
}
int socket(int domain, int type, int protocol)
{
    static int (*real)(int, int, int);
    if (!real)
        real = dlsym(RTLD_NEXT, "socket");
    if ((domain == AF_INET || domain == AF_INET6) &&
        (type & 0xf) == SOCK_STREAM && failing("socket"))
        return failed();
    return real(domain, type, protocol);
}
int bind(int fd, const struct sockaddr *a, socklen_t n)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real)
        real = dlsym(RTLD_NEXT, "bind");
    if (failing("bind"))
        return failed();
    return real(fd, a, n);
}
int listen(int fd, int backlog)
{
    static int (*real)(int, int);
    if (!real)
        real = dlsym(RTLD_NEXT, "listen");
    if (failing("listen"))
        return failed();
    return real(fd, backlog);
}
int setsockopt(int fd, int level, int name, const void *v, socklen_t n)
{
    static int (*real)(int, int, int, const void *, socklen_t);
    if (!real)
        real = dlsym(RTLD_NEXT, "setsockopt");
    if ((level == SOL_SOCKET && name == SO_REUSEPORT &&
         failing("SO_REUSEPORT")) ||
        (level == SOL_SOCKET && name == SO_REUSEADDR &&
         failing("SO_REUSEADDR")) ||
        (level == IPPROTO_TCP && name == TCP_NODELAY &&
         failing("TCP_NODELAY")))
        return failed();
    return real(fd, level, name, v, n);
}
/* FAIL_ERRNOS=E1,E2,... (with FAIL_REPORT, a descriptor, and FAIL_WAIT_MS):
 * one run per errno, each a fork() of this process made before main(), as
 * an exec would start it but without the exec and the dynamic linking
 * (most of a run's cost): the child runs main() with its errno; the parent
 * waits for it, at most FAIL_WAIT_MS, and writes a line to FAIL_REPORT,
 * "E exit N", "E signal N", or "E running PID" (then it waits, and the
 * grader kills that PID). It stops after a run that exits 0 or runs on. */
__attribute__((constructor)) static void each_errno(void)
{
    const char *list = getenv("FAIL_ERRNOS"), *fd = getenv("FAIL_REPORT"),
               *wait_ms = getenv("FAIL_WAIT_MS");
    char *end;
    int status;
    if (!list || !fd || !wait_ms)
        return;
    for (const char *p = list; *p; p = *end ? end + 1 : end) {
        int e = (int)strtol(p, &end, 10), report = atoi(fd);
        pid_t child = fork();
        if (child == 0) {
            fail_errno = e;
            close(report);
            unsetenv("FAIL_ERRNOS");
            return;
        }
        int pidfd = child < 0 ? -1 : (int)syscall(SYS_pidfd_open, child, 0);
        if (pidfd < 0) {
            dprintf(report, "%d error %d\n", e, errno);
            if (child > 0)
                kill(child, SIGKILL);
            _exit(2);
        }
        struct pollfd exited = {.fd = pidfd, .events = POLLIN};
        int ready;
        while ((ready = poll(&exited, 1, atoi(wait_ms))) < 0 && errno == EINTR)
            ;
        if (ready == 0) {
            dprintf(report, "%d running %d\n", e, (int)child);
            waitpid(child, &status, 0);
            _exit(0);
        }
        close(pidfd);
        waitpid(child, &status, 0);
        if (WIFEXITED(status))
            dprintf(report, "%d exit %d\n", e, WEXITSTATUS(status));
        else
            dprintf(report, "%d signal %d\n", e, WTERMSIG(status));
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            _exit(0);
    }
    _exit(0);
}
/* Calls a set-up may add beyond the six (FAIL_CALL=getsockname,
 * getsockopt, fcntl or ioctl): any of them failing must not leave a loop
 * sharing the first listener either. */
int getsockname(int fd, struct sockaddr *a, socklen_t *n)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real)
        real = dlsym(RTLD_NEXT, "getsockname");
    if (failing("getsockname"))
        return failed();
    return real(fd, a, n);
}
int getsockopt(int fd, int level, int name, void *v, socklen_t *n)
{
    static int (*real)(int, int, int, void *, socklen_t *);
    if (!real)
        real = dlsym(RTLD_NEXT, "getsockopt");
    if (failing("getsockopt"))
        return failed();
    return real(fd, level, name, v, n);
}
/* fcntl() fails in the main thread, where loops_start() sets up the
 * listeners, and in every thread for any command but the F_GETFL and
 * F_SETFL of loop_init() (which must pass for a loop to start at all: the
 * run would end there, whatever the set-up had done before). */
static int fcntl_as(const char *symbol, int fd, int cmd, void *arg)
{
    int (*real)(int, int, ...) = dlsym(RTLD_NEXT, symbol);
    if ((syscall(SYS_gettid) == getpid() ||
         (cmd != F_GETFL && cmd != F_SETFL)) && failing("fcntl"))
        return failed();
    return real(fd, cmd, arg);
}
int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_as("fcntl", fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_as("fcntl64", fd, cmd, arg);
}
int ioctl(int fd, unsigned long request, ...)
{
    static int (*real)(int, unsigned long, ...);
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (!real)
        real = dlsym(RTLD_NEXT, "ioctl");
    if (failing("ioctl"))
        return failed();
    return real(fd, request, arg);
}
"""


def own_network():
    """As root: this grader (and all it starts) in a network namespace of
    its own, loopback up and somaxconn raised. Returns what it did."""
    if os.geteuid() != 0:
        return "somaxconn as it is (not root: no namespace of our own)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
        return f"somaxconn as it is (unshare: {os.strerror(ctypes.get_errno())})"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/proc/sys/net/core/somaxconn").write_text(f"{SOMAXCONN}\n")
    return f"somaxconn {SOMAXCONN}"


NETWORK = own_network()
check = death_telling(grader, RUN)


def listening_inodes(port):
    """The inodes of the sockets listening on the port, IPv4 and IPv6: one
    per accept queue, however many descriptors point at each. Asked of
    sock_diag (netlink, as `ss -ltn` asks), which walks only the listening
    sockets: /proc/net/tcp holds the same, but each read of it walks every
    connection of the host (TIME_WAIT ones of other tests too, 100,000s
    on a busy machine: a tenth of a CPU-second a read)."""
    inodes = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                           4) as diag:  # NETLINK_SOCK_DIAG
            # struct inet_diag_req_v2: TCP sockets of the family in state
            # LISTEN (1 << 10) with this source port
            request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0,
                                  1 << 10) + struct.pack("!HH", port, 0) + \
                bytes(44)
            # struct nlmsghdr: SOCK_DIAG_BY_FAMILY (20), NLM_F_REQUEST |
            # NLM_F_DUMP
            diag.sendto(struct.pack("=IHHII", 16 + len(request), 20, 0x301,
                                    1, 0) + request, (0, 0))
            done = False
            while not done:
                data = diag.recv(1 << 16)
                at = 0
                while at + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, at)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind == 2:  # NLMSG_ERROR
                        code = -struct.unpack_from("=i", data, at + 16)[0]
                        raise OSError(code, "sock_diag")
                    # struct inet_diag_msg: state at 1, the source port at
                    # 4, the inode after the 48-byte id and four words
                    msg = at + 16
                    if data[msg + 1] == 10 and struct.unpack_from(
                            "!H", data, msg + 4)[0] == port:
                        inodes.add(struct.unpack_from("=I", data,
                                                      msg + 68)[0])
                    at += (length + 3) & ~3
                if not data:
                    break
    return inodes


def listeners(pid, port):
    """The server's listening sockets on the port, each once, in descriptor
    order (loop 0's first): a copy of each (pidfd_getfd, as the server's
    parent may), which the caller closes."""
    wanted, found = listening_inodes(port), {}
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for name in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            inode = re.fullmatch(r"socket:\[(\d+)\]", target)
            if not inode or int(inode[1]) not in wanted or \
                    int(inode[1]) in found:
                continue
            fd = libc.syscall(438, pidfd, int(name), 0)  # SYS_pidfd_getfd
            if fd < 0:
                raise OSError(ctypes.get_errno(), "pidfd_getfd")
            found[int(inode[1])] = socket.socket(fileno=fd)
    finally:
        os.close(pidfd)
    return list(found.values())


def setup(sock):
    """What a listener hands on or decides: TCP_NODELAY (its clients
    inherit it) and the length of its accept queue (struct tcp_info's
    tcpi_sacked holds sk_max_ack_backlog for a listener)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return {"TCP_NODELAY": sock.getsockopt(socket.IPPROTO_TCP,
                                           socket.TCP_NODELAY) != 0,
            "queue": struct.unpack_from("8x6I", info)[5]}


# Every other option a listener holds that getsockopt() reads back and that
# a loop's set-up could change (none is set by the reference, beyond
# SO_REUSEPORT, SO_REUSEADDR and TCP_NODELAY on every listener): each
# listener must hold what the first holds. SO_INCOMING_CPU (49) on some
# listeners only, say, makes the kernel (>= 6.2) send a SYN handled on that
# CPU to that listener whatever the hash.
OPTIONS = [(socket.SOL_SOCKET, getattr(socket, name, number), name, fmt)
           for name, number, fmt in (
               ("SO_REUSEPORT", 15, "i"), ("SO_REUSEADDR", 2, "i"),
               ("SO_INCOMING_CPU", 49, "i"), ("SO_LINGER", 13, "ii"),
               ("SO_KEEPALIVE", 9, "i"), ("SO_RCVBUF", 8, "i"),
               ("SO_SNDBUF", 7, "i"), ("SO_RCVLOWAT", 18, "i"),
               ("SO_PRIORITY", 12, "i"), ("SO_MARK", 36, "i"),
               ("SO_BUSY_POLL", 46, "i"), ("SO_OOBINLINE", 10, "i"),
               ("SO_DONTROUTE", 5, "i"), ("SO_BROADCAST", 6, "i"))] + [
    (socket.IPPROTO_TCP, number, name, "i") for name, number in (
        ("TCP_DEFER_ACCEPT", 9), ("TCP_MAXSEG", 2), ("TCP_KEEPIDLE", 4),
        ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 6), ("TCP_USER_TIMEOUT", 18),
        ("TCP_FASTOPEN", 23), ("TCP_NOTSENT_LOWAT", 25),
        ("TCP_WINDOW_CLAMP", 10), ("TCP_CORK", 3), ("TCP_QUICKACK", 12))] + [
    (socket.IPPROTO_TCP, 13, "TCP_CONGESTION", "16s"),
    (socket.IPPROTO_IP, 1, "IP_TOS", "i"), (socket.IPPROTO_IP, 2, "IP_TTL", "i")]


def options(sock):
    """Each of OPTIONS the listener holds, by name (what getsockopt()
    reads; an option the kernel does not know is left out)."""
    held = {}
    for level, number, name, fmt in OPTIONS:
        try:
            raw = sock.getsockopt(level, number, struct.calcsize(fmt))
        except OSError:
            continue
        value = struct.unpack(fmt, raw.ljust(struct.calcsize(fmt), b"\0"))
        held[name] = value[0].rstrip(b"\0").decode() if fmt == "16s" else \
            (value[0] if len(value) == 1 else value)
    return held


def unlike(socks):
    """The options each listener after the first holds otherwise than the
    first: [(k, name, its value, the first's)]."""
    first = options(socks[0])
    return [(k, name, value, first.get(name))
            for k, sock in enumerate(socks[1:], 1)
            for name, value in options(sock).items()
            if value != first.get(name)]


def as_open_listener_makes_it():
    """The setup() and options() of a listener the grader makes itself as
    open_listener() makes the first (SOCK_CLOEXEC; SO_REUSEADDR and
    TCP_NODELAY; bind() to INADDR_ANY; listen(LISTEN_BACKLOG)), then
    loops_start()'s SO_REUSEPORT: what the first listener must still hold.
    TCP_DEFER_ACCEPT, set later by each loop's loop_init(), is left out."""
    with socket.socket(socket.AF_INET,
                       socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("0.0.0.0", 0))
        sock.listen(LISTEN_BACKLOG)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held = options(sock)
        held.pop("TCP_DEFER_ACCEPT", None)
        return setup(sock), held


def fd_flags(pid, port):
    """The open-file flags (/proc/PID/fdinfo) of each descriptor of pid
    that is a listening socket on the port."""
    wanted, flags = listening_inodes(port), []
    for name in os.listdir(f"/proc/{pid}/fd"):
        inode = re.fullmatch(r"socket:\[(\d+)\]",
                             os.readlink(f"/proc/{pid}/fd/{name}"))
        if inode and int(inode[1]) in wanted:
            info = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
            flags.append(int(re.search(r"flags:\s+(\d+)", info)[1], 8))
    return flags


def cpu_time(pid):
    """CPU seconds (user and system) the process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]
        user, system = fields.split()[11:13]
    except (OSError, ValueError):
        return 0.0
    return (int(user) + int(system)) / os.sysconf("SC_CLK_TCK")


SPINS = 0.15  # CPU seconds: a server that starts idle uses a few hundredths


def started(lab):
    """The server, once every loop's listener is up (loops_start() opens
    them after the first accepts), or it has exited, or it spins (a loop
    that watches a socket that does not listen: epoll says EPOLLHUP for
    ever), or 2 s: the listeners it has then are all it will have."""
    server = lab.start(env=ENV)
    wait_for(lambda: (len(listening_inodes(server.port)),
                      cpu_time(server.pid), server.proc.poll()),
             lambda seen: seen[0] >= LOOPS or seen[1] >= SPINS or
             seen[2] is not None, limit=2)
    return server


@check(25, f"{LOOPS} loops: {LOOPS} listening sockets on the port, each with "
       "its own accept queue")
def own_listeners(lab):
    server = started(lab)
    count = len(listening_inodes(server.port))
    if count != LOOPS and server.proc.poll() is None:
        # Short of listeners, a loop may be watching a socket that does
        # not listen (epoll says EPOLLHUP for ever: it spins, and no
        # SIGTERM reaches it for the 10 s the stop waits): killed now,
        # by its PID, as stopped by the check.
        server.proc.kill()
        server.result = server.proc.wait()
    lab.expect(count == LOOPS, f"{count} listening socket(s) on the port, "
               f"not one per loop: see them with {RUN} `ss -ltnpe "
               "'sport = :8000'` (one inode each)")


@check(15, "every listener is set up as the first: TCP_NODELAY for its "
       "clients, an accept queue as long, closed on exec, every other "
       "option getsockopt() reads (SO_INCOMING_CPU, SO_LINGER, ...) alike; "
       "and the first as open_listener() made it")
def set_up_alike(lab):
    server = started(lab)
    socks = listeners(server.pid, server.port)
    try:
        lab.expect(len(socks) == LOOPS, f"{len(socks)} listening socket(s) "
                   f"on the port, not {LOOPS}")
        first = setup(socks[0])
        flags = fd_flags(server.pid, server.port)
        lab.expect(flags and all(f & os.O_CLOEXEC for f in flags),
                   f"{sum(not f & os.O_CLOEXEC for f in flags)} of "
                   f"{len(flags)} listeners open across exec (no "
                   "SOCK_CLOEXEC): a program the server ran would inherit "
                   "them (/proc/PID/fdinfo/FD, flags)")
        for k, sock in enumerate(socks[1:], 1):
            other = setup(sock)
            lab.expect(other["TCP_NODELAY"] == first["TCP_NODELAY"],
                       f"listener {k} has TCP_NODELAY "
                       f"{'on' if other['TCP_NODELAY'] else 'off'}, the "
                       "first's is on: its clients inherit Nagle's delay (see who "
                       "sets it: strace -f -e trace=setsockopt ./reuseport)")
            lab.expect(other["queue"] == first["queue"],
                       f"listener {k}'s accept queue holds {other['queue']}, "
                       f"the first's {first['queue']}: not set up as the "
                       "first (listen(fd, LISTEN_BACKLOG)): "
                       + ("a burst overflows it" if other["queue"] <
                          first["queue"] else "the clients the hash gives "
                          "it wait in a longer line than the others'")
                       + " (`ss -ltn 'sport = :8000'`: Send-Q is the queue, "
                       "`nstat -az TcpExtListenOverflows` under ab -c 100)")
        # Each loop sets TCP_DEFER_ACCEPT on its own in loop_init(), a
        # moment after its listener is up: a second to get there.
        odd = wait_for(lambda: unlike(socks), lambda odd: not odd, limit=1)
        lab.expect(not odd, "listener(s) not set up as the first: " +
                   ", ".join(f"listener {k} has {name} {value}, the first "
                             f"{was}" for k, name, value, was in odd[:3]) +
                   ": every loop's listener is made as open_listener() "
                   "makes the first, plus SO_REUSEPORT, nothing more (see "
                   f"who sets what: strace -f -e trace=setsockopt {RUN[:-2]})")
        # Alike is not enough: the first one, loop 0's, stays as
        # open_listener() made it (an option set on every listener, the
        # first too, passes the comparison above, and every client of the
        # server inherits it: SO_KEEPALIVE, TCP_USER_TIMEOUT, ...).
        model_setup, model = as_open_listener_makes_it()
        held = {**setup(socks[0]), **options(socks[0])}
        held.pop("TCP_DEFER_ACCEPT", None)
        changed = [(name, value, {**model_setup, **model}.get(name))
                   for name, value in held.items()
                   if value != {**model_setup, **model}.get(name)]
        lab.expect(not changed, "the first listener is not as "
                   "open_listener() made it: " +
                   ", ".join(f"it has {name} {value}, open_listener()'s "
                             f"{was}" for name, value, was in changed[:3]) +
                   ": every client it accepts inherits that; leave "
                   "open_listener() and the first listener as they are, "
                   "and set the others up as it (see who sets what: "
                   f"strace -f -e trace=setsockopt,listen {RUN[:-2]})")
    finally:
        for sock in socks:
            sock.close()
    return f"queues of {first['queue']}, {len(OPTIONS)} options alike, {NETWORK}"


@check(25, f"a burst of {BURST} new connections, 50 at a time: every loop "
       "serves its share, and the summary says how many")
def spread(lab):
    server = lab.start(env=ENV)
    done = subprocess.run(
        ["ab", "-q", "-n", str(BURST), "-c", "50", "-s",
         str(int(seconds(30))), f"http://127.0.0.1:{server.port}/"],
        capture_output=True, text=True, timeout=seconds(120))
    said = " ".join((done.stdout + done.stderr).split())
    lab.expect(done.returncode == 0 and "Failed requests: 0" in said,
               f"ab -c 50 failed: ...{said[-160:]}")
    server.stop()
    per_loop = re.search(r"per loop:((?: \d+)+)", server.stdout.decode())
    lab.expect(per_loop, "no `per loop:` line in the summary")
    counts = [int(n) for n in per_loop[1].split()]
    # The hash sends each connection to a loop at random: 800 over 4 loops
    # is 200 each give or take 12 (one standard deviation); under 100 is
    # no hash at all, but one listener preferred (e.g. a more exact
    # address), a queue two loops share, or a herd that one loop wins.
    share = BURST // LOOPS // 2
    lab.expect(len(counts) == LOOPS and sum(counts) == BURST and
               min(counts) >= share,
               f"per loop: {counts} for {BURST} connections (each loop "
               f"should have about {BURST // LOOPS}, at least {share}): "
               f"watch {RUN} ab -n 20000 -c 100 http://127.0.0.1:8000/ && "
               "kill %1 (the summary's per-loop line)")
    return f"per loop: {counts}"


@check(10, "the port stays the server's own: a second copy started on it "
       "fails, the first serves on")
def port_exclusive(lab):
    server = started(lab)
    try:
        other = subprocess.run(
            [str(lab.binary.path), str(server.port), "127.0.0.1",
             str(lab.redis.port)], cwd=lab.site, env={**os.environ, **ENV},
            capture_output=True, text=True, timeout=seconds(3))
        joined = None
    except subprocess.TimeoutExpired as running:  # it joined the port
        joined = running
    lab.expect(joined is None and other.returncode != 0,
               "a second copy of the server started on the same port and "
               "ran: it joined the port's group and takes a share of the "
               "clients (SO_REUSEPORT on the first socket before its bind "
               "lets any socket of the same user join); the first listener "
               "is bound alone, and the flag set after (see loops_start)")
    status = get(server.port, "/")[0]
    lab.expect(status == 200, f"GET / answered {status} after a second copy "
               "tried the port")


@check(5, "stopped after serving, it starts again on the same port at once")
def restarts_at_once(lab):
    server = started(lab)
    connections(lab, server.port, 200, 20, ("/",))  # it closes each first:
    server.stop()  # ...its side of each waits in TIME_WAIT on the port
    again = subprocess.Popen(
        [str(lab.binary.path), str(server.port), "127.0.0.1",
         str(lab.redis.port)], cwd=lab.site, env={**os.environ, **ENV},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        up = wait_for(lambda: len(listening_inodes(server.port)),
                      lambda n: n >= LOOPS or again.poll() is not None,
                      limit=3)
        said = "" if again.poll() is None else again.stderr.read().strip()
    finally:
        again.terminate()
        again.wait(timeout=seconds(10))
    lab.expect(up >= LOOPS and not said, f"started again on the port it had "
               f"just served on: {up} listener(s); it said "
               f"{said[-120:]!r}: a listener without SO_REUSEADDR cannot "
               "bind while the last run's connections wait in TIME_WAIT")


BORROWED = ("a loop without a listener of its own (or with another's: a "
            "dup() of the first is one queue)")
FAILED = {  # what fails, from the 2nd call on, and what it costs a loop
    "socket": ("socket()", "EMFILE", BORROWED),
    # Whatever the kernel answers: ENOPROTOOPT or EINVAL ("an old kernel")
    # is no reason to run on with one queue either (and on a kernel without
    # SO_REUSEPORT, loops_start()'s call on the first listener fails too).
    "SO_REUSEPORT": ("setsockopt(SO_REUSEPORT)", "ENOBUFS", BORROWED),
    "SO_REUSEPORT ENOPROTOOPT": ("setsockopt(SO_REUSEPORT)", "ENOPROTOOPT",
                                 BORROWED),
    "SO_REUSEPORT EINVAL": ("setsockopt(SO_REUSEPORT)", "EINVAL", BORROWED),
    "bind": ("bind()", "EADDRINUSE", "a loop without a listener of its own "
             "(or with another's)"),
    "listen": ("listen()", "EADDRINUSE", "a loop without a listener of its "
               "own (or with another's)"),
    "SO_REUSEADDR": ("setsockopt(SO_REUSEADDR)", "ENOBUFS", "a listener "
                     "that cannot bind again while the last run's "
                     "connections wait in TIME_WAIT"),
    "TCP_NODELAY": ("setsockopt(TCP_NODELAY)", "ENOBUFS", "a listener whose "
                    "clients get Nagle's delay"),
}
# Then each call again with every other errno the kernel has, one run each
# (a run that dies as it should takes a millisecond): a fallback kept for
# one errno (EOPNOTSUPP, "a kernel without SO_REUSEPORT"; ENOBUFS or ENOMEM
# from socket(), "short of memory") is as wrong as for any other, and no
# list of likely ones catches the next. Left out: EINTR and EAGAIN, which a
# right answer may retry (here they would fail again, for ever).
NAMES = {**errno.errorcode, errno.EOPNOTSUPP: "EOPNOTSUPP"}
EVERY_ERRNO = sorted(set(NAMES) - {errno.EINTR, errno.EAGAIN})
EXTRA_CALLS = ("getsockname", "getsockopt", "fcntl", "ioctl")
RUNS = [(key.split()[0], name, error, cost)
        for key, (name, error, cost) in FAILED.items()]
RUNS += [(call, name, NAMES[number], cost)
         for call, (name, _, cost) in FAILED.items() if " " not in call
         for number in EVERY_ERRNO
         if (call, NAMES[number]) not in {run[::2] for run in RUNS}]


LIKELY_GROUPS = len({key.split()[0] for key in FAILED})  # the first groups
# RUNS in order, each run of one call's consecutive errnos in one group:
# one exec, one fork() per errno (FAIL_ERRNOS in NTH_FAILS).
RUN_GROUPS = []
for _call, _name, _error, _cost in RUNS:
    if RUN_GROUPS and RUN_GROUPS[-1][0] == _call:
        RUN_GROUPS[-1][3].append(_error)
    else:
        RUN_GROUPS.append((_call, _name, _cost, [_error]))


def failing_runs(lab, shim, call, errors):
    """The server started once per errno in errors (in order), with call
    failing from the 2nd on, each run waited for 5 s: (errno, exit code,
    listening sockets) of the first run that exited 0 or ran on (code
    None; what it ran on with is counted, then it is killed by its PID),
    else (None, its exit code, 0)."""
    port = free_port()
    read_end, write_end = os.pipe()
    run = subprocess.Popen(
        [str(lab.binary.path), str(port), "127.0.0.1", str(lab.redis.port)],
        cwd=lab.site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(write_end,), env={
            **os.environ, **ENV, "LD_PRELOAD": str(shim),
            "FAIL_CALL": call, "FAIL_FROM": "2",
            "FAIL_ERRNOS": ",".join(str(getattr(errno, error))
                                    for error in errors),
            "FAIL_REPORT": str(write_end),
            "FAIL_WAIT_MS": str(int(seconds(5) * 1000))})
    os.close(write_end)
    names = {getattr(errno, error): error for error in errors}
    said, outcome, code, done = b"", None, 1, 0
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(read_end, selectors.EVENT_READ)
            while outcome is None and sel.select(timeout=seconds(10)):
                chunk = os.read(read_end, 4096)
                if not chunk:
                    break
                said += chunk
                *lines, said = said.split(b"\n")
                for line in lines:
                    number, what, value = line.decode().split()
                    done += 1
                    if what == "running":
                        up = len(listening_inodes(port))
                        os.kill(int(value), signal.SIGKILL)  # not reaped yet
                        outcome = (names[int(number)], None, up)
                    elif what == "error":
                        raise RuntimeError(f"the grader's fork: errno {value}")
                    else:
                        code = int(value) if what == "exit" else -int(value)
                        if code == 0:
                            outcome = (names[int(number)], 0, 0)
                    if outcome:
                        break
    finally:
        os.close(read_end)
        if run.poll() is None:
            try:
                run.wait(timeout=seconds(10))
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
    if not outcome and done < len(errors):
        raise RuntimeError(f"the grader's runs of {call} ended after {done} "
                           f"of {len(errors)} errnos")
    return outcome or (None, code, 0)


FAILED_WHERE = {"fcntl": " in the main thread, where the listeners are set "
                "up (in the loops, all but loop_init()'s F_GETFL and "
                "F_SETFL)",
                "getsockname": "", "getsockopt": "", "ioctl": ""}


def extra_runs(lab, shim):
    """Each of EXTRA_CALLS failing from the 1st on (ENOBUFS), one server
    each, all four at once: {call: (exit code or None, listening sockets
    on its port, how many of them are open across exec)}, each once it
    has exited, or once every loop has started (each loop's loop_init()
    sets TCP_DEFER_ACCEPT on its listener, after the set-up), or 5 s."""
    runs, socks, seen = {}, {}, {}

    def look(call):
        port, run = runs[call]
        if run.poll() is not None:
            return (run.returncode, 0, 0), True
        up = len(listening_inodes(port))
        if up != LOOPS:
            return (None, up, 0), False
        if call not in socks:
            socks[call] = listeners(run.pid, port)
        started = all(sock.getsockopt(socket.IPPROTO_TCP, 9)  # DEFER
                      for sock in socks[call])
        leaky = sum(not f & os.O_CLOEXEC for f in fd_flags(run.pid, port))
        return (run.poll(), up, leaky), started

    def settled():
        for call in runs:
            if call not in seen or not seen[call][1]:
                try:
                    seen[call] = look(call)
                except OSError:  # it exited while we looked: next round
                    seen[call] = ((runs[call][1].poll(), 0, 0), False)
        return all(done for _, done in seen.values())

    try:
        for call in EXTRA_CALLS:
            port = free_port()
            runs[call] = (port, subprocess.Popen(
                [str(lab.binary.path), str(port), "127.0.0.1",
                 str(lab.redis.port)], cwd=lab.site,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={
                    **os.environ, **ENV, "LD_PRELOAD": str(shim),
                    "FAIL_CALL": call, "FAIL_FROM": "1",
                    "FAIL_ERRNO": str(errno.ENOBUFS)}))
        wait_for(settled, bool, limit=5)
    finally:
        for sock in (s for group in socks.values() for s in group):
            sock.close()
        for _, run in runs.values():
            if run.poll() is None:
                run.kill()
            run.wait()
    return {call: seen[call][0] for call in EXTRA_CALLS}


@check(10, "a listener that cannot be set up stops the server: every "
       "socket(), setsockopt(SO_REUSEPORT), (SO_REUSEADDR), (TCP_NODELAY), "
       f"bind() or listen() from the 2nd on failing, with any of "
       f"{len(EVERY_ERRNO)} errnos, exits it, not a loop with a listener "
       "missing, borrowed or set up short; a getsockname(), getsockopt(), "
       "fcntl() or ioctl() failing leaves no loop without a listener of "
       "its own, closed on exec; each socket has SO_REUSEADDR before its "
       "bind(), none an option set after its listen() or a buffer size "
       "set, and no listener is closed or shut down while the loops start")
def setup_failures_fatal(lab):
    shim = build_shim(lab, "nth_fails", NTH_FAILS, "-ldl")
    # Cheapest first, so that a wrong answer stops early: the likely errnos
    # of each call (one run each), the added calls, the trace; then every
    # other errno (760 runs, half of the check's CPU).
    failing_groups(lab, shim, RUN_GROUPS[:LIKELY_GROUPS])
    added_calls(lab, shim)
    traced_start(lab)
    failing_groups(lab, shim, RUN_GROUPS[LIKELY_GROUPS:])


def failing_groups(lab, shim, groups):
    """Each group's call failing from the 2nd on, with each of its errnos:
    the server must exit non-zero."""
    for call, name, cost, errors in groups:
        error, code, up = failing_runs(lab, shim, call, errors)
        lab.expect(code not in (None, 0), f"every {name} from the 2nd on "
                   f"failed ({error}), and the server "
                   f"{'ran on for 5 s' if code is None else 'exited 0'} "
                   f"with {up} listening socket(s) on the port for "
                   f"{LOOPS} loops: {cost} is not the server asked for: "
                   f"check {name}'s result, and die() as open_listener() "
                   f"does (see it with strace -f -e inject=" +
                   (f"setsockopt:error={error}:when=4+" if "_" in call
                    else f"{call}:error={error}:when=2+") + f" {RUN[:-2]}"
                   + (": the first listener's three pass" if "_" in call
                      else "") + ")")


def added_calls(lab, shim):
    """A call the set-up may add failing: no loop without a listener of its
    own, closed on exec."""
    # A call the set-up may add (getsockname() to copy the first's address,
    # getsockopt() to copy an option, fcntl() or ioctl() for a flag) failing
    # from the 1st on, ENOBUFS: the server may exit non-zero, or run on
    # (the reference makes no such call on a listener), but only with a
    # listener of its own for every loop, never falling back to a dup().
    for call, (code, up, leaky) in extra_runs(lab, shim).items():
        lab.expect(code not in (None, 0) or (code is None and up == LOOPS),
                   f"every {call}() failed (ENOBUFS), and the server "
                   f"{'ran on for 5 s' if code is None else 'exited 0'} "
                   f"with {up} listening socket(s) on the port for {LOOPS} "
                   f"loops: {BORROWED} is not the server asked for; any "
                   "failure while a listener is set up is fatal, whatever "
                   f"the call: die() (see it with strace -f -e inject={call}"
                   f":error=ENOBUFS {RUN[:-2]})")
        lab.expect(code is not None or not leaky,
                   f"every {call}() failed (ENOBUFS){FAILED_WHERE[call]}, "
                   f"and the server ran on with {leaky} of its {LOOPS} "
                   "listeners open across exec (no O_CLOEXEC in "
                   "/proc/PID/fdinfo): a listener set up short; a call "
                   "you add is under the same rule as the six: check its "
                   "result and die(), or make the socket with SOCK_CLOEXEC "
                   "as open_listener() does (see it with strace -e inject="
                   f"{call}:error=ENOBUFS {RUN[:-2]}, no -f)")


def traced_start(lab):
    """The start-up traced: SO_REUSEADDR before bind(), no option after
    listen(), no buffer size, no listener ended."""
    # Traced from exec on: the closes of the start-up, each socket named
    # by its inode (-y), until every loop's listener is up. Not -yy (each
    # socket by its address): strace asks sock_diag for each, and the
    # kernel walks the host's every connection to answer (a third of a
    # CPU-second a run beside a test suite's TIME_WAIT sockets).
    port = free_port()
    trace = lab.workdir / "start.strace"
    run = subprocess.Popen(
        ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-o", str(trace),
         "-e",
         "trace=close,shutdown,dup2,dup3,setsockopt,bind,listen",
         str(lab.binary.path), str(port), "127.0.0.1", str(lab.redis.port)],
        cwd=lab.site, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        # Up: every listener, and every loop started (each loop's
        # loop_init() sets TCP_DEFER_ACCEPT on its listener, after all
        # loops_start() does), not a fixed time that load can outrun.
        wait_for(lambda: (len(listening_inodes(port)),
                          trace.read_text().count("TCP_DEFER_ACCEPT")
                          if trace.exists() else 0),
                 lambda up: min(up) >= LOOPS, limit=20)
        time.sleep(seconds(0.2))
        upto = trace.read_text() if trace.exists() else ""  # before the stop
    finally:  # the server is strace's child: stop it, and strace ends
        children = Path(f"/proc/{run.pid}/task/{run.pid}/children")
        for pid in (children.read_text().split() if children.exists() else []):
            os.kill(int(pid), 15)
        try:
            run.wait(timeout=seconds(10))
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    # Each socket by its inode (socket:[inode]); on the port: bound to it.
    lines = upto.splitlines()
    on_port = {sock[1] for line in lines
               if f"htons({port})" in line and
               (sock := re.search(r"bind\(\d+<socket:\[(\d+)\]>", line))}
    # SO_REUSEADDR set on it before its bind() to the port, or the bind
    # was made without it (set after, it only matters at the next bind).
    reuse, early = set(), []
    for line in lines:
        sock = re.search(r"(setsockopt|bind)\(\d+<socket:\[(\d+)\]>", line)
        if sock and sock[1] == "setsockopt" and \
                re.search(r"SO_REUSEADDR, \[[1-9]", line):
            reuse.add(sock[2])
        elif sock and sock[1] == "bind" and f"htons({port})" in line and \
                sock[2] not in reuse:
            early.append(line)
    lab.expect(not early, f"{len(early)} socket(s) bound to the port "
               "before SO_REUSEADDR was set on them (" +
               (early[0].split(" ", 1)[-1][:70] if early else "") + "): "
               "the kernel looks at it at bind(), so these were bound "
               "without it, and a restart fails while the last run's "
               "connections wait in TIME_WAIT; set it before bind() (see "
               f"strace -f -e trace=setsockopt,bind {RUN[:-2]})")
    # An option set on a listener after its listen() comes too late for
    # the clients the kernel queued on it meanwhile: each accepted socket
    # is cloned from the listener at its handshake, with what it held then
    # (TCP_NODELAY set after listen(): those clients keep Nagle's delay for
    # life). Only loops_start()'s SO_REUSEPORT on the first (it must be
    # bound alone) and each loop's TCP_DEFER_ACCEPT (loop_init) come after.
    listening, late = set(), []
    for line in lines:
        sock = re.search(r"(listen|setsockopt)\(\d+<socket:\[(\d+)\]>"
                         r"(?:, (\w+), (\w+))?", line)
        if sock and sock[1] == "listen" and sock[2] in on_port:
            listening.add(sock[2])
        elif sock and sock[2] in listening and \
                sock[4] not in ("SO_REUSEPORT", "TCP_DEFER_ACCEPT"):
            late.append(line)
    lab.expect(not late, f"{len(late)} setsockopt() on a listener after "
               "its listen() (" + (late[0].split(" ", 1)[-1].strip()[:70]
                                   if late else "") + "): a client that "
               "connects in between is accepted as the listener was then "
               "(an accepted socket is a copy of its listener, made at the "
               "handshake), so it goes without the option for good; set "
               "every option before bind() and listen(), as open_listener() "
               f"does (see strace -f -e trace=setsockopt,listen {RUN[:-2]})")
    # A buffer size set on a socket locks it (SOCK_SNDBUF_LOCK,
    # SOCK_RCVBUF_LOCK): the listener reads back as the first, but every
    # socket it accepts inherits the lock and its buffers never autotune
    # (a send buffer stuck at 16 KiB, not grown to megabytes). The first
    # listener has none set; the reference sets none anywhere.
    sized = [line for line in lines
             if re.search(r"setsockopt\(\d+<socket:[^>]*>, SOL_SOCKET, "
                          r"SO_(RCV|SND)BUF", line)]
    lab.expect(not sized, f"{len(sized)} setsockopt() of a buffer size on "
               "the listeners while the loops started (" +
               (sized[0].split(" ", 1)[-1][:70] if sized else "") + "): "
               "it reads back as the first listener's, but setting "
               "SO_SNDBUF or SO_RCVBUF locks the size, and every client "
               "that listener accepts inherits the lock: its buffers no "
               "longer grow with the connection (autotuning); the first "
               "listener sets none, set none (see strace -f -e "
               f"trace=setsockopt {RUN[:-2]})")
    # Ended: closed, shut down (shutdown() of a listener resets its queue
    # as close() does, and leaves the socket bound), or a dup2()/dup3()
    # over its descriptor.
    closed = [line for line in lines
              if (sock := re.search(r"(?:(?:close|shutdown)\(|dup[23]\(\d+"
                                    r"(?:<[^>]*>)?, )\d+<socket:\[(\d+)\]>",
                                    line)) and sock[1] in on_port]
    lab.expect(not closed, f"a socket on the port was closed or shut down "
               f"while the loops started ({closed[0][-80:] if closed else ''}"
               "): a client the kernel had queued on it is reset (close(), "
               "shutdown() or a dup2() over it alike); the first listener "
               "is loop 0's, kept as it is, the others are added beside it")


grader.still_serves(10, env=ENV)


if __name__ == "__main__":
    grader.main()
