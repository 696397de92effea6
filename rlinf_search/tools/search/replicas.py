"""Several retrieval servers behind one search client: the least busy replica first, failing ones set aside.

``tools.search.server_addr`` may list several ``host:port`` replicas of one index (or one per GPU of a faiss
server). Each request goes to the admitted replica with the fewest requests in flight. A replica that fails
``replica_eject_after`` requests in a row (connection refused, timeout, 5xx) is ejected: requests skip it, and
once ``replica_probe_interval_s`` has passed, the next request starts a ``GET /health`` probe that decides whether
it is admitted again (an answer below 500 does: servers without the route say 404). A request whose replica fails
moves at once to the next untried one, each with its own time limit, so one server dying or hanging loses no
query; when every admitted replica has failed it, the ejected ones are tried too, since a request sent somewhere
beats none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One retrieval server of a replicated backend, as this client sees it."""

    addr: str
    """``host:port``."""
    in_flight: int = 0
    """Requests sent to it and not yet answered."""
    requests: int = 0
    """Requests sent to it."""
    failures: int = 0
    """Requests it failed (unreachable, timed out, 5xx)."""
    failures_in_a_row: int = 0
    """Failures since its last answer; ``eject_after`` of them eject it."""
    ejections: int = 0
    """Times it was ejected."""
    admitted: bool = True
    """Requests go to it (False: ejected until a health probe passes)."""
    probe_at: float = 0.0
    """Event-loop time after which an ejected replica is probed."""

    def snapshot(self) -> dict[str, int]:
        return {"in_flight": self.in_flight, "requests": self.requests, "failures": self.failures,
                "ejections": self.ejections, "admitted": int(self.admitted)}


class ReplicaSet:
    """Which replica a request goes to, and what its answers say of each. One belongs to one event loop."""

    def __init__(self, addrs: tuple[str, ...], *, eject_after: int, probe_interval_s: float,
                 probe: Callable[[str], Awaitable[bool]]):
        if not addrs:
            raise ValueError("a replica set needs at least one address")
        self.replicas = [Replica(addr) for addr in addrs]
        self.eject_after = eject_after
        self.probe_interval_s = probe_interval_s
        self._probe = probe
        self._probes: dict[str, asyncio.Task] = {}
        self._turn = 0  # rotates ties, so idle replicas share the load instead of the first taking it all

    def choose(self, tried: set[str]) -> Replica | None:
        """The replica for the next attempt of a request that has already failed on ``tried``: the admitted one
        with the fewest requests in flight, else an ejected one not yet tried, else None."""
        self._start_due_probes()
        untried = [r for r in self.replicas if r.addr not in tried]
        if not untried:
            return None
        admitted = [r for r in untried if r.admitted] or untried
        self._turn = (self._turn + 1) % len(self.replicas)
        order = {r.addr: (i - self._turn) % len(self.replicas) for i, r in enumerate(self.replicas)}
        return min(admitted, key=lambda r: (r.in_flight, order[r.addr]))

    def answered(self, replica: Replica) -> None:
        replica.failures_in_a_row = 0
        if not replica.admitted:
            self._admit(replica, "it answered a request")

    def failed(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        replica.failures_in_a_row += 1
        if replica.admitted and len(self.replicas) > 1 and replica.failures_in_a_row >= self.eject_after:
            replica.admitted = False
            replica.ejections += 1
            replica.probe_at = asyncio.get_running_loop().time() + self.probe_interval_s
            log.warning("retrieval replica %s ejected after %d failures in a row (last: %s); probing it again in "
                        "%g s", replica.addr, replica.failures_in_a_row, why, self.probe_interval_s)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Counters per replica address (requests, failures, ejections, in flight, admitted)."""
        return {r.addr: r.snapshot() for r in self.replicas}

    async def aclose(self) -> None:
        probes = list(self._probes.values())
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        self._probes.clear()

    def _admit(self, replica: Replica, why: str) -> None:
        replica.admitted, replica.failures_in_a_row = True, 0
        log.info("retrieval replica %s admitted again: %s", replica.addr, why)

    def _start_due_probes(self) -> None:
        loop = asyncio.get_running_loop()
        for replica in self.replicas:
            if not replica.admitted and replica.addr not in self._probes and loop.time() >= replica.probe_at:
                self._probes[replica.addr] = loop.create_task(self._run_probe(replica))

    async def _run_probe(self, replica: Replica) -> None:
        try:
            healthy = await self._probe(replica.addr)
        except Exception:  # noqa: BLE001 - a probe that cannot even be sent is a failed probe
            healthy = False
        finally:
            self._probes.pop(replica.addr, None)
        if replica.admitted:
            return
        if healthy:
            self._admit(replica, "its health probe passed")
        else:
            replica.probe_at = asyncio.get_running_loop().time() + self.probe_interval_s
