#!/usr/bin/env python3
"""Grader for the zombies lab (labs/zombies/README.md).

Each check probes one way a reaper goes wrong: exits that pile up under
one SIGCHLD (a reaper that does not loop), exits under concurrent load, a
reaper that waits for a child still serving (it blocks every other client),
and children collected some other way than by waitpid() (the exit statuses
are lost). Counts, never speeds; every wait is generous."""

import socket
import subprocess

from grading import (Grader, HeldClients, Unmet,  # labs/grading.py
                     cpu_seconds, get, idle_clients, live_children, seconds,
                     stopped, strace_returns, wait_for, zombie_children)

BURST = 50  # children that exit while the server cannot run: one SIGCHLD
LOAD = ["-n", "600", "-c", "50"]  # ab: 50 connections at a time
SERIAL = 40  # requests one after another
WATCH = ("watch them: ./forking 8000 & ab -n 1000 -c 50 "
         "http://127.0.0.1:8000/; ps -o pid,stat --ppid $!")
grader = Grader("zombies")


def served(lab, server, path="/", limit=5, beside=""):
    """GET path, which must answer 200 within limit s. A server that does
    not answer is told apart from one that spins (a reaper that loops
    forever) by the CPU it burns meanwhile. beside: what else went on,
    for the message."""
    before = cpu_seconds(server.pid)
    try:
        status, _ = get(server.port, path, timeout=limit)
    except (socket.timeout, ConnectionError) as error:
        spent = cpu_seconds(server.pid) - before
        raise Unmet(f"GET {path}: no answer within {seconds(limit):.0f} s "
                    f"({type(error).__name__}){beside}; the server used "
                    f"{spent:.1f} s of CPU meanwhile: it waits for "
                    "something (near 0 s: a child that has not exited? "
                    "waitpid without WNOHANG) or spins (a loop that never "
                    "ends); watch: strace -p PID while curl -m 5 "
                    f"http://127.0.0.1:8000{path}") from None
    lab.expect(status == 200, f"GET {path} answered {status}; watch: curl "
               f"-i http://127.0.0.1:8000{path}")


def zombies_gone(lab, server, what, limit=2):
    """Every child reaped within limit s of `what`; else say how many."""
    left = wait_for(lambda: len(zombie_children(server.pid)),
                    lambda n: n == 0, limit=limit)
    lab.expect(left == 0, f"{left} zombies {seconds(limit):.0f} s after "
               f"{what}; {WATCH}")


@grader.check(30, f"{BURST} children exit at once (one SIGCHLD): all reaped")
def bursts(lab):
    server = lab.start()
    clients = idle_clients(server.port, BURST)  # a child each, waiting
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n >= BURST, limit=5)
    lab.expect(alive >= BURST, f"{alive} children for {BURST} clients "
               "connected at once: does the accept loop wait for a child? "
               "watch: ps -o pid,stat,wchan --ppid PID while they connect")
    with stopped(server.pid):  # the exits pile up; signals do not queue
        for client in clients:
            client.close()
        wait_for(lambda: len(zombie_children(server.pid)),
                 lambda n: n >= BURST, limit=5)
    zombies_gone(lab, server, f"{BURST} children exited at once (one "
                 "SIGCHLD stood for all of them)")


@grader.check(20, f"ab {' '.join(LOAD)}: every request served, no zombie "
              "and no child left")
def under_load(lab):
    server = lab.start()
    done = subprocess.run(
        ["ab", "-q", *LOAD, "-s", str(int(seconds(30))),
         f"http://127.0.0.1:{server.port}/"],
        capture_output=True, text=True, timeout=seconds(120))
    lab.expect(done.returncode == 0 and "Failed requests:        0"
               in done.stdout, "ab failed: " + done.stdout[-300:] +
               done.stderr[-300:])
    zombies_gone(lab, server, f"ab {' '.join(LOAD)} ended")
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n == 0, limit=3)
    lab.expect(alive == 0, f"{alive} children still running 3 s after the "
               "last client (ps -o pid,stat,wchan --ppid PID)")


@grader.check(20, "a client is served while another client's child is busy")
def never_blocks(lab):
    server = lab.start()
    with HeldClients(server.port, 1) as held:  # its child lives on
        lab.expect(held.answered, "; ".join(held.errors[:1]))
        served(lab, server, limit=3, beside=" while one keep-alive client "
               "was being served by its child")
    lab.expect(not held.errors, "; ".join(held.errors[:1]))


@grader.check(10, f"waitpid() collects each of {SERIAL} children's exit "
              "status")
def collects_statuses(lab):
    server = lab.start()

    def serve_serially():
        for _ in range(SERIAL):
            served(lab, server)
        wait_for(lambda: len(live_children(server.pid)),
                 lambda n: n == 0, limit=3)
        served(lab, server)  # one more turn of the loop after the last exit

    reaped = [pid for pid in strace_returns(server.pid, "wait4",
                                            serve_serially) if pid > 0]
    lab.expect(len(reaped) >= SERIAL, f"waitpid() returned {len(reaped)} "
               f"children's PIDs for {SERIAL + 1} children: the rest were "
               "never collected by waitpid() (SIGCHLD ignored, or "
               "SA_NOCLDWAIT: their exit statuses are lost); watch: strace "
               "-e trace=wait4,rt_sigaction -p PID")


@grader.check(20, "still serving pages and the guestbook; a clean stop")
def clean_stop(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        served(lab, server, path)
    server.stop()  # exit 0, summary printed, no process left behind


if __name__ == "__main__":
    grader.main()
