#!/usr/bin/env python3
"""Grader for the fibers lab (labs/fibers/README.md).

The switch is graded by serving: a stack laid out wrong (a register too
many, the return address misplaced, misaligned for fiber_main) kills the
server as its first fiber runs. The guard is graded in /proc/PID/maps: a
PROT_NONE page right below each fiber's stack, and gone with it."""

import resource
from pathlib import Path

from grading import (Grader, asking_clients, build,  # labs/grading.py
                     build_reference, death_telling, failing, get,
                     raise_open_file_limit, status_field, wait_for)
from processes import (fd_count, guarded_stacks,  # tests/processes.py
                       settled)

CLIENTS = 200  # kept connections served at once: a fiber each
REFUSED = 2000  # clients that come while every mprotect() fails
REFUSED_KIB = 64  # address space they may leave behind, all of them
IDLE = 1000  # kept clients whose stacks' resident memory is counted
IDLE_KIB = 40  # resident memory per kept client (the reference: about 17)
RUN = ("gdb -ex run --args ./fibers 8000, then curl http://127.0.0.1:8000/ "
       "from another shell; bt and info registers rsp show where it was")
MAPS = "watch /proc/$(pgrep -x fibers)/maps under 100 kept clients"
grader = Grader("fibers")
check = death_telling(grader, RUN)


def open_clients(port, count):
    """count keep-alive clients, each answered once and left open."""
    clients = asking_clients(port, count,
                             b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answered = 0
    for s in clients:
        if s.recv(65536).startswith(b"HTTP/1.1 200"):
            answered += 1
    return clients, answered


def one_page_guards(pid):
    """One-page PROT_NONE (---p) mappings, wherever they are: a guard each,
    and the gaps of shared libraries (the same all along)."""
    page = resource.getpagesize()
    count = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        count += fields[1] == "---p" and end - start == page
    return count


def mappings(pid):
    """How many mappings (VMAs) the process has."""
    return len(Path(f"/proc/{pid}/maps").read_text().splitlines())


@check(30, f"fibers switch: {CLIENTS} kept clients at once, pages and the "
       "guestbook")
def switching(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        status, _ = get(server.port, path)
        lab.expect(status == 200, f"GET {path} answered {status}")
    clients, answered = open_clients(server.port, CLIENTS)
    for s in clients:
        s.close()
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")


def at_rest(lab, binary=None):
    """A server (the student's, or binary) that has served one client and
    holds only its acceptor's fiber: (server, open descriptors, guarded
    stacks, one-page guards, mappings)."""
    server = lab.start(binary=binary)
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    fds = settled(lambda: fd_count(server.pid), "the open descriptors")
    return (server, fds, guarded_stacks(server.pid),
            one_page_guards(server.pid), mappings(server.pid))


@check(30, f"each of {CLIENTS} fibers' stacks has its own PROT_NONE page "
       "right below it, the acceptor's too, unmapped with the stack")
def guard_pages(lab):
    reference = at_rest(lab, build_reference("10_fibers", lab.workdir))
    reference[0].stop()
    server, fds, stacks, guards, vmas = at_rest(lab)
    lab.expect(stacks >= reference[2], f"at rest (only the acceptor's fiber "
               f"left), {stacks} guarded stacks, the reference has "
               f"{reference[2]}: the acceptor's stack has no guard below it "
               f"(every fiber's stack needs one); {MAPS}")
    clients, answered = open_clients(server.port, CLIENTS)
    lab.expect(answered == CLIENTS, f"{answered} of {CLIENTS} answered")
    guarded = guarded_stacks(server.pid) - stacks
    lab.expect(guarded == CLIENTS, f"{guarded} stacks of {CLIENTS} have a "
               f"PROT_NONE (---p) page right below them: {MAPS}")
    # Every other client leaves: the stacks left are apart, so each guard
    # seen below one is its own (a guard on top of each stack, "stacks grow
    # up", sat below its neighbour's stack until the neighbour left).
    for s in clients[::2]:
        s.close()
    kept = clients[1::2]
    wait_for(lambda: fd_count(server.pid), lambda n: n <= fds + len(kept),
             limit=5)
    wait_for(lambda: one_page_guards(server.pid),
             lambda n: n <= guards + len(kept), limit=10)
    own = guarded_stacks(server.pid) - stacks
    lab.expect(own == len(kept), f"with {len(kept)} clients left, {own} "
               "stacks have a PROT_NONE page right below them: each guard "
               f"must be below its own stack (stacks grow down); {MAPS}")
    # Each stack left is one mapping: a guard, then the stack right above
    # it, nothing of it below its guard.
    added = mappings(server.pid) - vmas
    lab.expect(added == 2 * len(kept), f"with {len(kept)} clients left, "
               f"{added} more mappings, not 2 each (a guard, its stack right "
               "above it): nothing of a stack's mapping may lie below its "
               f"guard; {MAPS}")
    for s in kept:
        s.close()
    left = wait_for(lambda: one_page_guards(server.pid) - guards,
                    lambda n: n <= 0, limit=5)
    lab.expect(left <= 0, f"{left} guard pages still mapped after every "
               "client left (each fiber_free must unmap its guard with its "
               f"stack): {MAPS}, then after they leave")


@check(10, f"mprotect() failing: the {REFUSED} clients that came meanwhile "
       "are refused (no stack without a guard), nothing is leaked")
def guard_fails(lab):
    server = at_rest(lab)[0]
    size = status_field(server.pid, "VmSize")  # KiB
    answered = []

    def clients_while_refused():
        for _ in range(REFUSED // 100):  # a hundred at a time
            socks = asking_clients(server.port, 100,
                                   b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            for s in socks:
                s.settimeout(3)
                try:
                    answered.append(
                        s.recv(65536).startswith(b"HTTP/1.1 200"))
                except OSError:
                    answered.append(False)
                s.close()

    failing(server.pid, "mprotect", "ENOMEM", clients_while_refused)
    served = sum(answered)
    lab.expect(served == 0, f"{served} of {REFUSED} clients served while "
               "every mprotect() failed: each on a stack with no guard "
               "below it (check mprotect's result: refuse the client, "
               "unmap the stack)")
    grown = wait_for(lambda: status_field(server.pid, "VmSize") - size,
                     lambda kib: kib <= REFUSED_KIB, limit=5)
    lab.expect(grown <= REFUSED_KIB, f"{grown} KiB more address space than "
               f"before {REFUSED} clients were refused: what was taken for "
               "a fiber that never ran (its mapping, all of it, its struct) "
               "was not given back")
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed once "
               "mprotect() worked again")


@check(5, "built with -DFIBER_UCONTEXT (swapcontext), every stack still "
       "has its guard")
def ucontext_guards(lab):
    binary = lab.workdir / "ucontext" / "fibers"
    ok, said = build(lab.source, binary, "fibers", "-DFIBER_UCONTEXT")
    lab.expect(ok, f"-DFIBER_UCONTEXT does not build: {said.strip()[:150]}")
    server = lab.start(binary=binary)
    lab.expect(get(server.port, "/")[0] == 200, "GET / failed")
    stacks = settled(lambda: guarded_stacks(server.pid), "the stacks")
    clients, answered = open_clients(server.port, 50)
    guarded = guarded_stacks(server.pid) - stacks
    for c in clients:
        c.close()
    lab.expect(answered == 50 and guarded == 50, f"built with "
               f"-DFIBER_UCONTEXT: {answered} of 50 clients answered, "
               f"{guarded} more guarded stacks: the guard belongs to "
               "fiber_spawn(), which every build runs, not to the x86-64 "
               "context_init()")


@check(5, f"{IDLE} kept clients cost at most {IDLE_KIB} KiB of resident "
       "memory each: a stack is backed only where it is touched")
def touched_only(lab):
    raise_open_file_limit()
    server = at_rest(lab)[0]
    before = status_field(server.pid, "VmRSS")
    clients, answered = open_clients(server.port, IDLE)
    each = (status_field(server.pid, "VmRSS") - before) / IDLE
    for c in clients:
        c.close()
    lab.expect(answered == IDLE and each <= IDLE_KIB, f"{answered} of {IDLE} "
               f"answered, {each:.0f} KiB resident each: a stack written in "
               "full when it is laid out (a memset?) is backed in full; "
               "write only the frame the switch pops")
    return f"{each:.0f} KiB each"


grader.still_serves(20)


if __name__ == "__main__":
    grader.main()
