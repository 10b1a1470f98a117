"""A two-node Ray cluster on this machine, the second node unable to see the first's /dev/shm.

Not a benchmark: what tests/test_remote.py and ``bench_apex.py --remote`` start. The head is a
plain ``ray start --head``; the second node runs ``ray start`` inside its own mount namespace
(``unshare -m``) over a private tmpfs on /dev/shm, so that, like a second host, it cannot see
any segment made on the head (and the head none of its own). It carries the custom resource
``"remote"`` that pins work to it. Every port is a free one and the temp dir is private, so
this cluster never meets another on the machine: a plain ``ray.init()`` elsewhere does not
find it, and :meth:`TwoNodes.stop` ends exactly the processes it started (their process
groups), never another cluster's (``ray stop`` would end every Ray of this user).

What it binds: both nodes are given ``--node-ip-address``, the address this machine's own
outward interface has (:func:`own_address`: the one a local Ray picks by default, checked to
be this machine's by binding a socket to it), so nothing listens on an address that is not
this machine's; :meth:`TwoNodes.start` says which on stderr. It cannot be loopback: Ray then
refuses a second node. The single-node runtimes that the tests, the benchmarks and the
examples start on their own stay on 127.0.0.1 instead (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
which this harness removes from its nodes' environment). A user's own cluster, given by
``address=``, is left as it is.

Needs root (or CAP_SYS_ADMIN) for the mount namespace, and Ray's ``ray`` script beside the
running interpreter's Ray (``python -m ray.scripts.scripts``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

REMOTE_RESOURCE = "remote"


def free_port() -> int:
    """A TCP port nobody listens on now.

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def own_address() -> str:
    """This machine's outward IPv4 address (what a route to the outside leaves from; no packet
    is sent), checked to be one of its own by binding a socket to it; 127.0.0.1 where it has
    none.

    >>> address = own_address()
    >>> with socket.socket() as probe:
    ...     probe.bind((address, 0))     # an address of this machine
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))     # TEST-NET-1: connect() only picks a route
            address = str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"
    with socket.socket() as check:
        check.bind((address, 0))                # OSError if it is not this machine's
    return address


def can_unshare() -> Optional[str]:
    """None when this process can make the second node's mount namespace, else why not.

    >>> why_not = can_unshare()
    >>> why_not is None or why_not.startswith(("no unshare", "unshare -m failed"))
    True
    """
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    result = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if result.returncode != 0:
        return f"unshare -m failed (needs root): {result.stderr.strip()}"
    return None


class TwoNodes:
    """Start and stop the two nodes. ``address`` is what ``ray.init(address=...)`` takes.

    Parameters
    ----------
    python_path : list of str
        Put on PYTHONPATH of both nodes (their workers import cpprb_ray from there).
    cpus : int
        CPUs each node offers.

    Examples
    --------
    >>> from benchmarks._two_nodes import TwoNodes
    >>> TwoNodes(["/repo"]).env()["RAY_USAGE_STATS_ENABLED"]
    '0'
    """

    def __init__(self, python_path: List[str], cpus: int = 1) -> None:
        self.python_path = python_path
        self.cpus = cpus
        self.directory = ""
        self.address = ""
        self.node_ip = ""
        self.processes: List[subprocess.Popen] = []

    def env(self) -> Dict[str, str]:
        """The environment both nodes (and so their workers) run with."""
        env = dict(os.environ)
        env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                    "PYTHONPATH": os.pathsep.join(self.python_path)})
        env.pop("RAY_ADDRESS", None)
        # Set, it keeps a node on loopback and makes Ray refuse the second one.
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        return env

    def _ray(self) -> List[str]:
        # Ray's CLI through this interpreter: the same Ray as the driver's, script or not.
        return [sys.executable, "-m", "ray.scripts.scripts"]

    def _launch(self, argv: List[str], log: str) -> subprocess.Popen:
        with open(os.path.join(self.directory, log), "wb") as output:
            # Its own session: stop() signals this process group, and only it.
            process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=self.env(),
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def start(self, timeout: float = 90.0) -> str:
        """Start the head, then the second node; returns the cluster's address."""
        # Short: Ray's socket paths under it must stay within 107 bytes.
        self.directory = tempfile.mkdtemp(prefix="cr2n_", dir="/tmp")
        ray = self._ray()
        self.node_ip = own_address()
        print(f"two-node Ray cluster: both nodes bind {self.node_ip}, an address of this "
              f"machine (its outward interface; loopback cannot hold two nodes)",
              file=sys.stderr, flush=True)
        common = ["--block", "--num-cpus", str(self.cpus), "--disable-usage-stats",
                  "--node-ip-address", self.node_ip]
        head = self._launch(ray + [
            "start", "--head", "--port", str(free_port()), "--include-dashboard=false",
            "--dashboard-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--temp-dir", os.path.join(self.directory, "head")] + common, "head.log")
        address_file = os.path.join(self.directory, "head", "ray_current_cluster")
        deadline = time.monotonic() + timeout
        while not os.path.exists(address_file):
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the head node did not start:\n{self.log('head.log')}")
            time.sleep(0.1)
        time.sleep(0.1)   # written in one go, but give its writer the moment
        with open(address_file) as handle:
            self.address = handle.read().strip()
        # The second node: its own mount namespace with a private tmpfs over /dev/shm (Ray's
        # object store there too), mounted before Ray starts.
        self._launch(["unshare", "-m", "bash", "-c",
                      'mount -t tmpfs -o size=2g tmpfs /dev/shm && exec "$0" "$@"'] + ray + [
            "start", "--address", self.address,
            "--resources", json.dumps({REMOTE_RESOURCE: 1}),
            "--dashboard-agent-listen-port", str(free_port()),
            "--temp-dir", os.path.join(self.directory, "node2")] + common, "node2.log")
        return self.address

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.directory, name), errors="replace") as handle:
                return handle.read()[-4000:]
        except OSError as error:
            return str(error)

    def stop(self) -> None:
        """End both nodes (each `ray start --block` with everything it started) and remove the
        temp dir."""
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            alive = []
            for process in self.processes:
                try:
                    os.killpg(process.pid, sig)
                    alive.append(process)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + grace
            for process in alive:
                try:
                    process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            # The group is gone when no member is left (workers outlive `ray start` briefly).
            if not any(_group_alive(process.pid) for process in self.processes):
                break
            time.sleep(0.2)
        self.processes = []
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TwoNodes:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def kill_mount_namespace_of(pid: int) -> int:
    """SIGKILL every process in the mount namespace of `pid` (the second node's, as a host that
    dies: its raylet, object store and workers, whatever process group they are in); returns
    how many. Refuses this process's own namespace.

    Examples
    --------
    >>> import os
    >>> kill_mount_namespace_of(os.getpid())
    Traceback (most recent call last):
    ...
    ValueError: pid ... shares this process's mount namespace; not killing a host's worth of it
    """
    namespace = os.readlink(f"/proc/{pid}/ns/mnt")
    if namespace == os.readlink("/proc/self/ns/mnt"):
        raise ValueError(f"pid {pid} shares this process's mount namespace; not killing a "
                         f"host's worth of it")
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except (FileNotFoundError, ProcessLookupError):
            continue   # ended meanwhile
        except PermissionError:
            continue   # not ours to look at (pid 1 of a sandbox): not the node's either
    return killed


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_nodes(ray: object, count: int = 2, timeout: float = 60.0) -> None:
    """Return once the connected cluster has `count` live nodes (RuntimeError after timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[attr-defined]
        if len(alive) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(alive)} of {count} Ray nodes came up in {timeout} s")
        time.sleep(0.2)
