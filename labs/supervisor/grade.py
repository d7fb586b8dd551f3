#!/usr/bin/env python3
"""Grader for the supervisor lab (labs/supervisor/README.md).

Each check probes one way a supervisor goes wrong: deaths that pile up
under one SIGCHLD (it replaces one), a replacement that is not recorded in
its slot (it is not replaced in turn, nor stopped), a replacement forked
unlike the first workers (a different signal mask, or one that does not
serve), and a supervisor that blocks (it never takes SIGTERM). Counts, never
speeds; every wait is generous."""

import os
import signal
import socket
import subprocess
import time

from grading import (Grader, HeldClients, Unmet, failing,  # labs/
                     get, live_children, seconds, stopped, wait_for,
                     zombie_children)

WORKERS = 4
CROWD = 32  # a bigger pool, most of it dying at once
ROUNDS = 8  # generations of replacements, each killed in turn
# The server inherits a blocked signal, as from a shell or a supervisor of
# its own: the first workers get that mask back, and so must replacements
# (an empty mask would only match the first workers' under a clean start).
INHERITED = (signal.SIGUSR2,)
DEATHS = {"SIGTERM (it exits normally, status 0)": signal.SIGTERM,
          "SIGSEGV (a crash)": signal.SIGSEGV,
          "SIGKILL": signal.SIGKILL}
WATCH = ("watch: ZEROHTTPD_WORKERS=4 ./preforked 8000 & kill -9 "
         "$(pgrep -P $! | head -3); ps -o pid,stat --ppid $!")
grader = Grader("supervisor")


def pool(lab, workers=WORKERS):
    """A server with `workers` workers, all started."""
    server = lab.start(env={"ZEROHTTPD_WORKERS": str(workers)},
                       blocked=INHERITED)
    started = wait_for(lambda: live_children(server.pid),
                       lambda w: len(w) == workers, limit=3)
    lab.expect(len(started) == workers, f"{len(started)} workers at start "
               f"(ZEROHTTPD_WORKERS={workers}); watch: ps -o pid,stat --ppid "
               "PID")
    return server, started


def refilled(lab, server, victims, what, workers=WORKERS):
    """The pool is `workers` live workers again, none of them a victim,
    and no zombie: its workers' PIDs."""
    alive = wait_for(lambda: live_children(server.pid),
                     lambda w: len(w) == workers and not set(w) & set(victims),
                     limit=2)
    lab.expect(len(alive) == workers and not set(alive) & set(victims),
               f"{len(alive)} live workers of {workers} 2 s after {what}; "
               f"{WATCH}")
    zombies = zombie_children(server.pid)
    lab.expect(not zombies, f"{len(zombies)} zombie workers after {what}; "
               f"{WATCH}")
    return alive


def kill(pids, sig=signal.SIGKILL):
    for pid in pids:
        os.kill(pid, sig)


def stops(lab, server):
    """SIGTERM: the supervisor must take it and stop cleanly."""
    try:
        server.terminate(timeout=seconds(5))
        server.check_exit()
    except AssertionError as error:
        server.cleanup()  # SIGKILL it and its workers now, not in 10 s
        raise Unmet(f"no clean stop ({str(error)[:120]}): a supervisor stuck "
                    "in a blocking waitpid() never takes SIGTERM, one that "
                    "lost a worker's PID never stops it; watch: strace -p "
                    "PID, then kill -TERM PID") from None


def serves_beside_held(lab, server):
    """WORKERS clients at once, WORKERS - 1 of them busy keep-alive ones
    that hold their workers: every one must be served, each by its own
    worker."""
    with HeldClients(server.port, WORKERS - 1, timeout=3) as held:
        served = held.answered  # each held client's first answer
        try:
            status, _ = get(server.port, "/", timeout=3)
            served += status == 200
        except (socket.timeout, ConnectionError):
            pass
    lab.expect(served == WORKERS, f"{served} of {WORKERS} clients at once "
               f"served (each waited {seconds(3):.0f} s) by a refilled pool "
               f"of {WORKERS} ({WORKERS - 1} of them busy keep-alive): a "
               "replacement that does not accept (forked, but not as a "
               "worker?); watch: curl -m 5 http://127.0.0.1:8000/ with "
               "ZEROHTTPD_WORKERS=1 after kill -9 of the worker")


@grader.check(10, "a worker killed with SIGKILL is replaced within 2 s")
def replaced(lab):
    server, workers = pool(lab)
    kill(workers[:1])
    refilled(lab, server, workers[:1], "SIGKILL to one worker")


@grader.check(15, f"{WORKERS - 1} workers die at once (one SIGCHLD): all "
              "replaced")
def bursts(lab):
    server, workers = pool(lab)
    victims = workers[:WORKERS - 1]
    with stopped(server.pid):  # the deaths pile up; signals do not queue
        kill(victims)
        wait_for(lambda: len(zombie_children(server.pid)),
                 lambda n: n >= len(victims), limit=5)
    refilled(lab, server, victims, f"{len(victims)} workers died while the "
             "supervisor could not run (one SIGCHLD stood for all)")


@grader.check(10, f"a replacement that dies is replaced in turn, {ROUNDS} "
              "times")
def generations(lab):
    server, workers = pool(lab)
    victim = workers[-1]
    for n in range(ROUNDS):
        kill([victim])
        before = set(workers)
        workers = refilled(lab, server, [victim],
                           f"SIGKILL to worker {victim} (round {n + 1} of "
                           f"{ROUNDS}, each a replacement after the first): "
                           "is each replacement's PID kept in its slot?")
        victim = (set(workers) - before).pop()


@grader.check(10, "replacements are forked like the first workers (signal "
              "mask) and serve")
def like_first(lab):
    server, workers = pool(lab)
    mask = status_field_text(workers[-1], "SigBlk")
    kill(workers[:-1])
    fresh = refilled(lab, server, workers[:-1], f"SIGKILL to {WORKERS - 1} "
                     "workers")
    for pid in set(fresh) - set(workers):
        got = status_field_text(pid, "SigBlk")
        lab.expect(got == mask, f"a replacement blocks signals {got}, the "
                   f"first workers {mask} (the server was started with "
                   "SIGUSR2 blocked, as a shell may start it): fork it as "
                   "the first ones, spawn_worker() with the mask it is "
                   "given; watch: grep SigBlk /proc/PID/status")
    serves_beside_held(lab, server)


@grader.check(10, f"whatever the death ({', '.join(DEATHS)}): each worker "
              "is replaced")
def any_death(lab):
    server, workers = pool(lab)
    for (what, sig), victim in zip(DEATHS.items(), workers):
        kill([victim], sig)
        workers = refilled(lab, server, [victim], f"{what} to worker "
                           f"{victim}: replace every worker that is gone, "
                           "however it went")


@grader.check(10, "replacements die with the supervisor, as the first "
              "workers do")
def no_orphans(lab):
    server, workers = pool(lab)
    kill(workers[:2])
    fresh = refilled(lab, server, workers[:2], "SIGKILL to 2 workers")
    os.kill(server.pid, signal.SIGKILL)  # no stop: the kernel must end them
    left = wait_for(lambda: [p for p in fresh if alive(p)], lambda w: not w,
                    limit=2)
    lab.expect(not left, f"{len(left)} workers still running 2 s after the "
               f"supervisor was killed with SIGKILL (of {len(fresh)}, "
               f"{len(set(fresh) - set(workers))} of them replacements): an "
               "orphan holds the port for ever (fork replacements as the "
               "first: spawn_worker(), with PR_SET_PDEATHSIG); watch: kill "
               "-9 a worker, then the supervisor, then pgrep -x preforked")


def alive(pid):
    """pid runs (not gone, not a zombie waiting for its new parent)."""
    return status_field_text(pid, "State")[:1] not in ("Z", "(")


@grader.check(10, f"{CROWD} workers, {CROWD * 3 // 4} of them die at once "
              "(one SIGCHLD): all replaced within 2 s")
def many_die(lab):
    server, workers = pool(lab, CROWD)
    victims = workers[:CROWD * 3 // 4]
    with stopped(server.pid):  # the deaths pile up; signals do not queue
        for k, victim in enumerate(victims):
            kill([victim], list(DEATHS.values())[k % len(DEATHS)])
        wait_for(lambda: len(zombie_children(server.pid)),
                 lambda n: n >= len(victims), limit=5)
    refilled(lab, server, victims, f"{len(victims)} of {CROWD} workers died "
             "while the supervisor could not run (a fixed batch, a cap on "
             "restarts, or a pause per replacement?)", CROWD)


@grader.check(5, "a worker stopped and continued (SIGSTOP, SIGCONT) is not "
              "dead: not replaced, and the stop still works")
def stopped_worker(lab):
    server, workers = pool(lab)
    os.kill(workers[0], signal.SIGSTOP)
    time.sleep(seconds(0.5))
    os.kill(workers[0], signal.SIGCONT)
    time.sleep(seconds(0.5))
    now = live_children(server.pid)
    lab.expect(sorted(now) == sorted(workers), f"{len(now)} workers after "
               f"one was stopped and continued, {len(set(now) - set(workers))}"
               " of them new: a stopped worker was taken for dead (waitpid "
               "with WUNTRACED reports stops too)")
    stops(lab, server)


@grader.check(5, "a fork that fails does not bring the supervisor down")
def fork_fails(lab):
    server, workers = pool(lab)

    def deaths_while_fork_fails():
        kill(workers[:2])
        time.sleep(seconds(1))

    failing(server.pid, "clone", "EAGAIN", deaths_while_fork_fails)
    time.sleep(seconds(1.5))  # a supervisor that retries may refill now
    lab.expect(server.proc.poll() is None, "the supervisor exited "
               f"({server.proc.poll()}) when fork() failed for a "
               "replacement: a failed fork leaves a slot empty (or tried "
               "again later), never ends the server; watch: strace -e "
               "inject=clone:error=EAGAIN -p PID, then kill -9 a worker")
    status = get(server.port, "/", timeout=3)[0]
    lab.expect(status == 200, f"GET / answered {status} after a failed fork")
    stops(lab, server)


@grader.check(5, "SIGINT (Ctrl-C) stops it as SIGTERM does")
def sigint_stops(lab):
    server, workers = pool(lab)
    kill(workers[:1])
    refilled(lab, server, workers[:1], "SIGKILL to one worker")
    server.proc.send_signal(signal.SIGINT)
    try:
        code = server.proc.wait(timeout=seconds(5))
    except subprocess.TimeoutExpired:
        code = None
    seen = "still running after 5 s" if code is None else f"exit {code}"
    lab.expect(code == 0, f"SIGINT: {seen}: the supervisor must stop on "
               "SIGINT as on SIGTERM (both are in the set it waits for)")


@grader.check(10, "every worker killed: the pool comes back, answers and "
              "stops cleanly")
def serves_after(lab):
    server, workers = pool(lab)
    kill(workers)  # a client caught in a dying worker's accept() is lost
    refilled(lab, server, workers, f"SIGKILL to all {WORKERS} workers")
    for _ in range(10):
        status, _ = get(server.port, "/", timeout=3)
        lab.expect(status == 200, f"GET / answered {status or 'nothing'} "
                   "after the pool came back; watch: curl -i after kill -9 "
                   "of every worker")
    stops(lab, server)


def status_field_text(pid, name):
    """A field of /proc/PID/status as text (a signal mask is hex)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except (FileNotFoundError, ProcessLookupError):
        pass
    return "(gone)"


if __name__ == "__main__":
    grader.main()
