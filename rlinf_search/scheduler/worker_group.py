"""``WorkerGroup``: the ranks of one component as Ray actors on their placed devices.

``MyWorker.create_group(*args).launch(cluster, placement, name="rollout")`` starts one actor per rank;
``group.call("method", ...)`` runs a method on every rank and ``group.call_on(ranks, ...)`` on some,
each returning a ``GroupCall`` to ``wait()`` on or ``await``. A rank that raises or dies surfaces as a
``WorkerError`` naming the group, the rank and the remote traceback.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayError, RayTaskError

from rlinf_search.scheduler.cluster import Cluster
from rlinf_search.scheduler.payload import REF_THRESHOLD_BYTES, payload_nbytes
from rlinf_search.scheduler.placement import ComponentPlacement

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerError(RuntimeError):
    """A rank raised in a method (``cause_type`` and ``remote_traceback`` say what), or died."""

    # Defaults only so that pickling (BaseException rebuilds from the message, then restores the
    # attributes) works when a worker calling another group passes the error on to the driver.
    def __init__(self, message: str, *, group: str = "", rank: int = -1, method: str = "", cause_type: str = "",
                 remote_traceback: str = ""):
        super().__init__(message)
        self.group = group
        """Name of the worker group."""
        self.rank = rank
        """Rank that failed."""
        self.method = method
        """Method that was running (``__init__`` for a failed start)."""
        self.cause_type = cause_type
        """Exception type raised on the rank (``ValueError``), or Ray's death error (``ActorDiedError``)."""
        self.remote_traceback = remote_traceback
        """Traceback from the rank's process, when it raised."""

    @property
    def process_lost(self) -> bool:
        """The rank's process died or could not be reached (no exception of its own to show): a machine or
        process failure, not a bug in the method."""
        return not self.remote_traceback


class GroupCall:
    """Results of one method call on some ranks: ``wait(timeout)`` blocks, ``await`` does not."""

    def __init__(self, group: str, method: str, ranks: Sequence[int], refs: Sequence[ray.ObjectRef],
                 *, single: bool):
        self.group = group
        self.method = method
        self.ranks = tuple(ranks)
        self._refs = list(refs)
        self._single = single  # call_on(3, ...) returns rank 3's value, not a one-element list

    def wait(self, timeout: float | None = None) -> Any:
        """Results in rank order (one value for a single-rank call). Raises the first ``WorkerError``
        as soon as any rank fails, and ``TimeoutError`` naming unfinished ranks after ``timeout`` s."""
        return wait_all([self], timeout)[0]

    def rank_call(self, rank: int) -> GroupCall:
        """The part of this call that runs on ``rank`` (one of ``ranks``), as a call of its own."""
        i = self.ranks.index(rank)
        return GroupCall(self.group, self.method, [rank], [self._refs[i]], single=True)

    def raise_if_failed(self) -> None:
        """Raise the ``WorkerError`` of a rank that has already failed or died; return at once otherwise (a
        driver waiting on something else, such as a channel these ranks feed, polls this)."""
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        for ref in ready:
            self._get(ref, self.ranks[self._refs.index(ref)])

    def __await__(self):
        return self._gather().__await__()

    async def _gather(self) -> Any:
        async def one(ref: ray.ObjectRef, rank: int) -> Any:
            try:
                return await ref
            except RayError as exc:
                raise self._error(exc, rank) from None

        results = await asyncio.gather(*(one(ref, rank) for ref, rank in zip(self._refs, self.ranks)))
        return self._shape(list(results))

    def _shape(self, results: list[Any]) -> Any:
        return results[0] if self._single else results

    def _get(self, ref: ray.ObjectRef, rank: int) -> Any:
        try:
            return ray.get(ref)
        except RayError as exc:
            raise self._error(exc, rank) from None

    def _error(self, exc: RayError, rank: int) -> WorkerError:
        where = f"rank {rank} of group '{self.group}'"
        if isinstance(exc, RayTaskError):
            cause_type = type(exc.cause).__name__
            # Ray's message is the remote traceback under a header naming the process, colored, with
            # caret lines left behind by the Ray frames it hides.
            remote = "\n".join(line for line in _ANSI.sub("", str(exc)).splitlines()
                                if line.strip(" ^~"))
            return WorkerError(f"{self.method}() failed on {where}: {cause_type}: {exc.cause}\n"
                               f"remote traceback:\n{remote}",
                               group=self.group, rank=rank, method=self.method, cause_type=cause_type,
                               remote_traceback=remote)
        kind = "died" if isinstance(exc, RayActorError) else "failed"
        return WorkerError(f"{where} {kind} during {self.method}(): {type(exc).__name__}: {exc}",
                           group=self.group, rank=rank, method=self.method, cause_type=type(exc).__name__)


def wait_all(calls: Sequence[GroupCall], timeout: float | None = None) -> list[Any]:
    """Wait for several calls together, each result shaped as its ``wait()`` would. The first failure
    on any rank raises at once: ranks blocked in a collective with a failed rank never finish."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = {ref: (i, rank) for i, call in enumerate(calls) for ref, rank in zip(call._refs, call.ranks)}
    results: dict[tuple[int, int], Any] = {}
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
        if not ready:
            late = "; ".join(f"{calls[i].method}() on group '{calls[i].group}' rank {rank}"
                             for i, rank in sorted(pending.values()))
            raise TimeoutError(f"not finished within {timeout} s: {late}")
        for ref in ready:
            i, rank = pending.pop(ref)
            results[i, rank] = calls[i]._get(ref, rank)
    return [call._shape([results[i, rank] for rank in call.ranks]) for i, call in enumerate(calls)]


Method = Callable[..., Any] | str
"""A worker method to call on a group's ranks: the function (``RewardWorker.score``) or its name."""


class WorkerGroup:
    """The ranks of one worker class, launched on a placement. Made by ``Worker.create_group``."""

    def __init__(self, worker_cls: type, init_args: tuple, init_kwargs: dict):
        self._cls = worker_cls
        self._init_args = init_args
        self._init_kwargs = init_kwargs
        self._actors: list[ActorHandle] = []
        self.name = worker_cls.__name__
        """Group name: the ``name`` given to ``launch`` (errors and ``Worker.group_name`` use it)."""
        self.placement: ComponentPlacement | None = None
        """Where each rank runs, once launched."""
        self.cluster: Cluster | None = None
        """The cluster it was launched on."""
        self.restarts_by_ray = 0
        """Times Ray starts each rank again by itself (``launch``'s ``restarts_by_ray``)."""
        self._options: dict[str, Any] = {}
        self._common_env: dict[str, str] = {}

    @property
    def world_size(self) -> int:
        return len(self._actors)

    @property
    def actors(self) -> tuple[ActorHandle, ...]:
        """Ray actor handles in rank order (to hand a rank to another worker, or to ``ray.kill`` it)."""
        return tuple(self._actors)

    def launch(self, cluster: Cluster, placement: ComponentPlacement | str, *, name: str | None = None,
               init_process_group: bool = False, max_concurrency: int | None = None,
               ready_timeout_s: float = 600.0, restarts_by_ray: int = 0) -> WorkerGroup:
        """Start one actor per placed device and wait until every rank is constructed.

        ``placement`` is a component of ``cluster.placement`` (``cluster.placement["rollout"]``) or a
        device list (``"0-1"``). ``init_process_group`` joins the ranks in ``torch.distributed``.
        ``max_concurrency`` is Ray's: calls one rank runs at once (threads, or tasks for async workers).
        ``ready_timeout_s`` bounds the constructors (a real engine loads its model there) and a rank
        Ray cannot schedule: past it the launch fails instead of waiting forever. ``restarts_by_ray``: Ray starts a
        rank whose process died again by itself, up to this many times per rank, behind the same handle: calls in
        flight at the death fail, later ones wait for the new process. Only for ranks that hold nothing a caller
        relies on (no weights, no process group): a stateless tool rank.
        """
        if self._actors:
            raise RuntimeError(f"group '{self.name}' is already launched")
        if isinstance(placement, str):
            placement = cluster.resolve(placement, name=name or self.name)
        self.name = name or placement.name
        self.placement = placement
        self.cluster = cluster
        try:
            self._start_actors(cluster, placement, max_concurrency, restarts_by_ray)
            self._call(range(self.world_size), "__ray_ready__", (), {}, single=False, label="__init__").wait(
                ready_timeout_s)
            if init_process_group:
                self.call("init_process_group").wait(ready_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        return self

    def call(self, method: Method, *args: Any, **kwargs: Any) -> GroupCall:
        """Run ``method(*args, **kwargs)`` on every rank; ``.wait()`` gives a list in rank order.

        ``method`` is the worker class's method itself (``group.call(RewardWorker.score, rows)``), so a
        rename or a typo fails where it is written, or its name as a string."""
        return self._call(range(self.world_size), self._method_name(method), args, kwargs, single=False)

    def call_on(self, ranks: int | Sequence[int], method: Method, *args: Any, **kwargs: Any) -> GroupCall:
        """Run ``method`` on some ranks; ``.wait()`` gives one value for an int, a list for a sequence."""
        single = isinstance(ranks, int)
        chosen = [ranks] if single else list(ranks)
        for rank in chosen:
            if not 0 <= rank < self.world_size:
                raise IndexError(f"group '{self.name}' has ranks 0-{self.world_size - 1}, not {rank}")
        return self._call(chosen, self._method_name(method), args, kwargs, single=single)

    def _method_name(self, method: Method) -> str:
        """The name to call on each rank; a function must be this group's class's (or a base's) own."""
        if isinstance(method, str):
            return method
        name = getattr(method, "__name__", None)
        if name is None or not any(vars(klass).get(name) is method for klass in self._cls.__mro__):
            owner = getattr(method, "__qualname__", repr(method))
            raise AttributeError(f"group '{self.name}' runs {self._cls.__name__}, which has no method {owner}")
        return name

    def restart(self, rank: int) -> GroupCall:
        """Start ``rank`` again in a new process on its device, with the arguments it was launched with (its old
        process is killed if it still runs); ``wait()`` on the result until it is constructed. Handles to the old
        rank held elsewhere do not follow: the caller hands the new ``actors[rank]`` on. Not for ranks joined in a
        process group (the others would hang)."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"group '{self.name}' has ranks 0-{self.world_size - 1}, not {rank}")
        ray.kill(self._actors[rank], no_restart=True)
        self._actors[rank] = self._start_actor(self.cluster, self.placement.ranks[rank])
        return self._call([rank], "__ray_ready__", (), {}, single=True, label="__init__")

    def shutdown(self) -> None:
        """Kill every rank (their processes exit; pending calls fail with ``WorkerError``)."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []

    def __repr__(self) -> str:
        devices = list(self.placement.devices) if self.placement else []
        return f"WorkerGroup({self._cls.__name__}, name={self.name!r}, devices={devices})"

    def _start_actors(self, cluster: Cluster, placement: ComponentPlacement, max_concurrency: int | None,
                      restarts_by_ray: int = 0) -> None:
        master = placement.ranks[0].node_rank
        self._common_env = {"WORLD_SIZE": str(placement.world_size), "RLINF_GROUP_NAME": self.name,
                            "MASTER_ADDR": cluster.node_address(master), "MASTER_PORT": str(cluster.free_port(master))}
        self._options = {"num_cpus": 0, "num_gpus": 0}
        if max_concurrency is not None:
            self._options["max_concurrency"] = max_concurrency
        self.restarts_by_ray = restarts_by_ray
        if restarts_by_ray:
            self._options["max_restarts"] = restarts_by_ray
        for spot in placement.ranks:
            self._actors.append(self._start_actor(cluster, spot))

    def _start_actor(self, cluster: Cluster, spot) -> ActorHandle:
        env = {**self._common_env, "RANK": str(spot.rank), "LOCAL_RANK": str(spot.local_rank),
               "LOCAL_WORLD_SIZE": str(spot.local_world_size), **cluster.device_env(spot.node_rank, spot.device)}
        # The environment is set when Ray starts the process, before any import reads it
        # (CUDA_VISIBLE_DEVICES before torch.cuda, OMP_NUM_THREADS before torch).
        actor = ray.remote(self._cls).options(scheduling_strategy=cluster.node_strategy(spot.node_rank),
                                              runtime_env={"env_vars": env}, **self._options)
        return actor.remote(*self._init_args, **self._init_kwargs)

    def _call(self, ranks: Sequence[int], method: str, args: tuple, kwargs: dict, *, single: bool,
              label: str | None = None) -> GroupCall:
        if not self._actors:
            raise RuntimeError(f"group '{self.name}' is not running: launch() it first")
        if label is None and not callable(getattr(self._cls, method, None)):
            raise AttributeError(f"group '{self.name}': {self._cls.__name__} has no method '{method}'")
        if len(ranks) > 1:
            args, kwargs = _share_large(args), {k: _share_large((v,))[0] for k, v in kwargs.items()}
        refs = [getattr(self._actors[rank], method).remote(*args, **kwargs) for rank in ranks]
        return GroupCall(self.name, label or method, ranks, refs, single=single)


def _share_large(args: tuple) -> tuple:
    """Put each large argument in the object store once: Ray would serialise it once per rank.
    Ray resolves a top-level reference argument to its value before the method runs."""
    return tuple(ray.put(a) if payload_nbytes(a) > REF_THRESHOLD_BYTES else a for a in args)
