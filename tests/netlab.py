"""Network faults for tests: network namespaces on a bridge, packet loss, partitions, and a TCP
proxy that delays or stalls a link (this kernel has no netem; see shared/network-faults.md).

Everything stays inside namespaces the test creates (private 10.x addresses on a bridge in its
own hub namespace) or on loopback; a :class:`Lab` removes what it made, also on failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence


def namespaces_available() -> str | None:
    """None when this machine lets the test make namespaces and iptables rules; else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        return "the ip and iptables commands are needed (apt-get install iproute2 iptables)"
    probe = f"flprobe{os.getpid() % 10000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Lab:
    """``n`` namespaces, each with one veth on a bridge in a hub namespace; node i has address
    ``ip(i)``. Use as a context manager."""

    def __init__(self, n: int):
        tag = os.getpid() % 9000 + 1000
        self.tag, self.n = tag, n
        self.hub = f"fl{tag}hub"
        self.names = [f"fl{tag}n{i}" for i in range(n)]
        self.subnet = f"10.{77 + tag % 100}.{tag % 250}"

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def _veth(self, i: int) -> tuple[str, str]:
        return f"v{self.tag}a{i}", f"v{self.tag}b{i}"

    def __enter__(self) -> Lab:
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                inner, outer = self._veth(i)
                _ip("netns", "add", ns)
                _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "netns", self.hub)
                _ip("-n", self.hub, "link", "set", outer, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in [*self.names, self.hub]:  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def popen(self, i: int, argv: Sequence[str], **kw: object) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], **kw)  # type: ignore[call-overload]

    def lossy(self, i: int, probability: float) -> None:
        """Drop that share of the packets node i receives (iptables statistic, in its namespace)."""
        done = subprocess.run(["ip", "netns", "exec", self.names[i], "iptables", "-A", "INPUT", "-m",
                               "statistic", "--mode", "random", "--probability", str(probability), "-j",
                               "DROP"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"iptables in {self.names[i]}: {done.stderr.strip()}")

    def cut(self, i: int) -> None:
        """Partition node i: its link to the bridge goes down."""
        _ip("-n", self.hub, "link", "set", self._veth(i)[1], "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.hub, "link", "set", self._veth(i)[1], "up")


class SlowProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (HOST:PORT): every chunk either way
    waits ``delay_s``; ``stall(seconds)`` holds all traffic for a while. Runs in a thread;
    ``address`` is where to connect; ``close()`` when done."""

    def __init__(self, target: str, delay_s: float = 0.0):
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.delay_s = delay_s
        self.stalled_until = 0.0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.address = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    def stall(self, seconds: float) -> None:
        self.stalled_until = self.loop.time() + seconds

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                wait = max(self.delay_s, self.stalled_until - self.loop.time())
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def close(self) -> None:
        async def shutdown() -> None:  # end every piped connection before the loop goes
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
