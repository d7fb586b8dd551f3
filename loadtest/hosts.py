"""The sweep's other hosts (--host COMPONENT=[USER@]HOST): ssh's options,
each host connected and checked before the sweep, and where every
component runs (placed), with each host's logs fetched and its scratch
folder removed at the end. The ssh work itself is harness.SSHHost's.
"""

import contextlib
import tempfile
from pathlib import Path

import harness  # SSHHost, Place, fail (loadtest/ is on sys.path: sweep's)


def ssh_options(args):
    """ssh's arguments for every host. The user's come first: for each
    setting ssh keeps the first value it is given."""
    options = []
    for option in args.ssh_option:
        options += ["-o", option]
    if args.ssh_config:
        options += ["-F", args.ssh_config]
    if args.ssh_port:
        options += ["-p", str(args.ssh_port)]
    return options + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def prepare_host(args, host, places, logs):
    """Connect to the host and check that it can run what is placed there:
    exit 1 if it cannot be reached or lacks a tool or a built server, exit 2
    if a CPU given to it is not online there."""
    mine = [name for name, place in places.items() if place.host is host]
    tools = ["setsid", "tar"]
    tools += ["taskset"] if any(places[name].cpus for name in mine) else []
    programs = {"redis": "redis-server", "nginx": "nginx"}
    tools += [programs[name] for name in mine if name in programs]
    files = (["public"] + args.servers) if "server" in mine else []
    try:
        host.connect(logs / f"ssh-{host.target}.log")
        facts = host.probe(tools, files)
    except (harness.StartError, harness.RemoteError) as e:
        harness.fail(str(e))
    problems = [f"{tool} not installed" for tool in facts.get("missing", [])]
    problems += [f"{host.suite_dir}/{name} not found" for name in
                 facts.get("absent", [])]
    if problems:
        harness.fail(f"{host.target}: {'; '.join(problems)} (build the "
                     "suite there with `make deps all`, or give --remote-dir)")
    online = set(host.online_cpus())
    for name in mine:
        offline = set(places[name].cpus or []) - online
        if offline:
            harness.fail(f"--cpus {name}: CPU {harness.cpu_text(offline)} is "
                         f"not online on {host.target} (online: "
                         f"{harness.cpu_text(online)})", status=2)


@contextlib.contextmanager
def placed(args, logs, components):
    """{component: harness.Place} for each of components: on which host
    and CPUs it runs (args.hosts, args.cpus), the hosts connected and
    checked (prepare_host). On leaving, each host's files are fetched into
    logs/HOST/, its scratch folder removed and its connection closed."""
    hosts, places = {}, {}
    with tempfile.TemporaryDirectory(prefix="sweep-ssh-") as sockets:
        for component in components:
            target = args.hosts.get(component)
            if target and target not in hosts:
                hosts[target] = harness.SSHHost(
                    target, ssh_options(args), args.remote_dir,
                    Path(sockets) / str(len(hosts)))  # short: a socket path
            places[component] = harness.Place(args.cpus.get(component),
                                              hosts.get(target))
        try:
            for host in hosts.values():
                prepare_host(args, host, places, logs)
            yield places
        finally:
            for host in hosts.values():
                host.close(logs / host.target)
