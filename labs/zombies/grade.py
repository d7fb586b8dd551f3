#!/usr/bin/env python3
"""Grader for the zombies lab (labs/zombies/README.md).

Each check probes one way a reaper goes wrong: exits that pile up under
one SIGCHLD (a reaper that does not loop), exits under concurrent load, a
reaper that waits for a child still serving (it blocks every other client),
and children collected some other way than by waitpid() (the exit statuses
are lost). Counts, never speeds; every wait is generous."""

import os
import signal
import socket
import subprocess
import threading
import time

from grading import (Grader, HeldClients, Unmet,  # labs/grading.py
                     cpu_seconds, get, idle_clients, live_children,
                     review_handlers, seconds, slowed, stopped,
                     strace_returns, wait_for, zombie_children)

BURST = 200  # children that exit while the server cannot run: one SIGCHLD
LOAD = ["-n", "3000", "-c", "50"]  # ab: 50 connections at a time
PILED = 300  # zombies at once during that load, at most
SERIAL = 40  # requests one after another
ROUNDS = 3  # a child exits while the reaper's waitpid() is under way
SLOWED = 0.5  # seconds added to the return of each waitpid() (strace)
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


@grader.check(25, f"{BURST} children exit at once (one SIGCHLD): all reaped")
def bursts(lab):
    server = lab.start()
    clients = idle_clients(server.port, BURST)  # a child each, waiting
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n >= BURST, limit=5)
    lab.expect(alive >= BURST, f"{alive} children for {BURST} clients "
               "connected at once: does the accept loop wait for a child? "
               "watch: ps -o pid,stat,wchan --ppid PID while they connect")
    children = live_children(server.pid)
    with stopped(server.pid):  # the exits pile up; signals do not queue
        for client in clients:
            client.close()
        for pid in children[::10]:  # a few die of a signal instead
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(zombie_children(server.pid)),
                 lambda n: n >= BURST, limit=5)
    zombies_gone(lab, server, f"{BURST} children exited at once, every "
                 "tenth killed by SIGKILL (one SIGCHLD stood for all of "
                 "them: a fixed batch or table, or a loop that stops at a "
                 "child killed by a signal?)")


@grader.check(15, f"ab {' '.join(LOAD)}: every request served, no zombie "
              "and no child left")
def under_load(lab):
    server = lab.start(blocked=(signal.SIGCHLD,))
    most, done_loading = [0], threading.Event()

    def count_zombies():  # while the load runs, not only after it
        while not done_loading.wait(0.05):
            most[0] = max(most[0], len(zombie_children(server.pid)))

    counter = threading.Thread(target=count_zombies, daemon=True)
    counter.start()
    try:
        done = subprocess.run(
            ["ab", "-q", *LOAD, "-s", str(int(seconds(30))),
             f"http://127.0.0.1:{server.port}/"],
            capture_output=True, text=True, timeout=seconds(120))
    finally:
        done_loading.set()
        counter.join()
    lab.expect(done.returncode == 0 and "Failed requests:        0"
               in done.stdout, "ab failed: " + done.stdout[-300:] +
               done.stderr[-300:])
    zombies_gone(lab, server, f"ab {' '.join(LOAD)} ended (the server "
                 "was started with SIGCHLD blocked, as a parent may start "
                 "it: the loop reaps each turn, signal or not)")
    lab.expect(most[0] <= PILED, f"{most[0]} zombies at once during ab "
               f"{' '.join(LOAD)}: reap on every turn of the loop, not only "
               "when accept() was interrupted")
    alive = wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n == 0, limit=3)
    lab.expect(alive == 0, f"{alive} children still running 3 s after the "
               "last client (ps -o pid,stat,wchan --ppid PID)")


@grader.check(15, "a client is served while another client's child is busy")
def never_blocks(lab):
    server = lab.start()
    with HeldClients(server.port, 1) as held:  # its child lives on
        lab.expect(held.answered, "; ".join(held.errors[:1]))
        for k in range(3):  # each new client's child exits in turn
            served(lab, server, limit=3, beside=f" (new client {k + 1} of "
                   "3, one after another) while one keep-alive client was "
                   "being served by its child")
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


@grader.check(10, f"a child that exits while waitpid() is under way is "
              f"reaped ({ROUNDS} times, each waitpid() slowed by {SLOWED} s)")
def no_lost_wakeup(lab):
    server = lab.start()
    stranded = []

    def exit_while_reaping():
        """Two children each round: the first exits, and the second
        while the reaper's last waitpid() (the one that finds nothing
        more) is under way: its SIGCHLD comes while the reaper runs."""
        for _ in range(ROUNDS):
            first, second = idle_clients(server.port, 2)
            wait_for(lambda: len(live_children(server.pid)),
                     lambda n: n >= 2, limit=5)
            first.close()
            time.sleep(SLOWED * 1.5)  # inside the waitpid() that finds 0
            second.close()
            left = wait_for(lambda: len(zombie_children(server.pid)),
                            lambda n: n == 0, limit=2 + 4 * SLOWED)
            if left:
                stranded.append(left)
                return

    slowed(server.pid, "wait4", SLOWED, exit_while_reaping)
    lab.expect(not stranded, f"a zombie {seconds(2 + 4 * SLOWED):.0f} s "
               "after a child exited while the reaper ran (each waitpid() "
               f"returned {SLOWED} s late: strace -e inject=wait4:"
               f"delay_exit={int(SLOWED * 1e6)} -p PID widens the window): "
               "its SIGCHLD was lost (a flag cleared after the loop it "
               "guards?)")


@grader.check(10, "SIGTERM stops it at once while a keep-alive client is "
              "being served")
def stops_while_serving(lab):
    server = lab.start()
    with HeldClients(server.port, 1):  # its child never exits by itself
        started = time.monotonic()
        try:
            server.terminate(timeout=seconds(3))
        except AssertionError:
            raise Unmet(f"still running {seconds(3):.0f} s after SIGTERM "
                        "while one keep-alive client was being served: "
                        "does the stop wait for a child still serving "
                        "(waitpid without WNOHANG)? watch: strace -p PID, "
                        "then kill -TERM PID") from None
    server.check_exit()
    return f"stopped in {time.monotonic() - started:.1f} s"


@grader.check(5, "the signal handler is async-signal-safe (source review)")
def safe_handler(lab):
    return review_handlers(lab)


@grader.check(10, "still serving pages and the guestbook; a clean stop")
def clean_stop(lab):
    server = lab.start()
    for path in ("/", "/guestbook", "/style.css"):
        served(lab, server, path)
    server.stop()  # exit 0, summary printed, no process left behind


if __name__ == "__main__":
    grader.main()
