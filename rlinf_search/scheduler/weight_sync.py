"""Weight sync: the actor's new weights to the rollout (and inference) groups, with a version.

``WeightSync`` drives a transport (``weight_transports``) from the driver: it opens one on rank 0 of the sender
group and on every receiver rank, and ``sync(version)`` calls the sender's ``get_weights`` and each receiver's
``set_weight_buckets``, which loads the buckets as they arrive. The method:

- ``object_store`` (collocated): buckets through Ray's shared-memory object store;
- ``cuda_ipc`` (every receiver on the sender's one GPU): buckets as CUDA IPC handles, device to device;
- ``broadcast`` (disaggregated): a gloo or nccl broadcast per bucket;
- ``auto``: ``object_store`` when every receiver sits on a device of the sender group, ``broadcast`` otherwise.
  It does not pick ``cuda_ipc`` while that path has not run on a GPU (``GPU_CHECK_STEPS=sync`` runs it); name it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

from rlinf_search.scheduler.channel import Channel
from rlinf_search.scheduler.weight_transports import BroadcastSpec, CudaIpcSpec, ObjectStoreSpec, TransportSpec
from rlinf_search.scheduler.worker_group import WorkerError, WorkerGroup, wait_all

METHODS = ("auto", "object_store", "cuda_ipc", "broadcast")
DEFAULT_BUCKET_BYTES = 256 * 2**20


class WeightSync:
    """Driver side: rank 0 of ``sender`` to every rank of ``receivers``; usable as a context manager.

    ``method``: one of ``METHODS`` (the module's docstring says which ``auto`` picks). ``bucket_bytes``: the size
    of the buckets the weights travel in; a receiver holds at most two at a time.
    """

    def __init__(self, sender: WorkerGroup, receivers: Sequence[WorkerGroup], *, method: str = "auto",
                 timeout_s: float = 600.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if method not in METHODS:
            raise ValueError(f"weight sync method must be one of {', '.join(METHODS)}, got {method!r}")
        self._sender = sender
        self._receivers = list(receivers)
        self._timeout_s = timeout_s
        self._bucket_bytes = bucket_bytes
        self._id = self._new_id()
        self.method = self._choose(method)
        """The transport in use: ``object_store``, ``cuda_ipc`` or ``broadcast``."""
        self.version: int | None = None
        """The last version every receiver loaded."""
        self.sent: int | None = None
        """The last version sent (``start``): every receiver holds it once that sync is done."""
        self._channel: Channel | None = None
        try:
            self._open(bucket_bytes)
        except BaseException:
            if self._channel is not None:
                self._channel.close()
            raise

    def sync(self, version: int) -> None:
        """Send the sender's ``get_weights()`` to every receiver's ``set_weight_buckets(buckets, version)``."""
        self.start(version).wait()

    def start(self, version: int, *, again: bool = False) -> PendingSync:
        """``sync`` without waiting: the calls are sent and the sender's later calls queue behind its send, so a
        caller can go on using the sender while receivers load (an engine that first lets its requests in flight
        finish, for one). ``wait()`` on the result before the next ``start``. ``again``: the last version once more
        (``reopen``)."""
        if self.version is not None and version <= self.version and not (again and version == self.version):
            raise ValueError(f"weight sync {self._id}: version {version} does not advance past {self.version}")
        # Every sender rank joins: with sharded weights, gathering them is a collective (rank 0 sends).
        calls = [self._sender.call("_weight_sync_send", self._id, version)]
        calls += [group.call("_weight_sync_receive", self._id) for group in self._receivers]
        self.sent = version
        if self._channel is not None:
            threading.Thread(target=_let_sender_go_if_a_receiver_is_lost, args=(calls[1:], self._channel),
                             name="weight-sync-watch", daemon=True).start()
        return PendingSync(self, version, calls)

    def reopen(self) -> None:
        """After a receiver rank was started again (a new process, no transport): tear every transport down, open them
        anew (a broadcast group cannot take a new member) and send the last version sent again, so the new rank holds
        the weights the others hold (or are loading: a sync the lost rank never finished is sent once more; its
        sender, held by the lost receiver's full slot, is let go when the transports close). Before any sync the new
        rank already holds them (the model)."""
        self.close()
        self._id = self._new_id()
        self._open(self._bucket_bytes)
        if self.sent is not None:
            self.start(self.sent, again=self.sent == self.version).wait()

    def _new_id(self) -> str:
        return f"{self._sender.name}->{','.join(g.name for g in self._receivers)}:{uuid.uuid4().hex[:8]}"

    def _loaded(self, version: int, results: list) -> None:
        loaded = {v for versions in results[1:] for v in versions}
        if loaded != {version}:
            raise RuntimeError(f"weight sync {self._id}: receivers loaded versions {sorted(loaded)}, not {version}")
        self.version = version

    def close(self) -> None:
        """Tear down the transports (and the broadcast group's sockets) on every participant. The channel goes
        first: a sender still blocked on a receiver that died fails its send at once, instead of holding the close
        queued behind it."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        calls = [self._sender.call_on(0, "_weight_sync_close", self._id)]
        calls += [group.call("_weight_sync_close", self._id) for group in self._receivers]
        wait_all(calls, self._timeout_s)

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _choose(self, method: str) -> str:
        sender_devices = set(self._sender.placement.devices)
        receiver_devices = {device for group in self._receivers for device in group.placement.devices}
        if method == "cuda_ipc" and not (self._sender.cluster.device_kind == "cuda"
                                         and receiver_devices <= {self._sender.placement.devices[0]}):
            raise ValueError(f"weight sync method cuda_ipc needs every receiver rank on the GPU of the sender's rank "
                             f"0 (device {self._sender.placement.devices[0]}); the receivers are on devices "
                             f"{sorted(receiver_devices)} of a {self._sender.cluster.device_kind} cluster: use "
                             "object_store or broadcast")
        if method != "auto":
            return method
        return "object_store" if receiver_devices <= sender_devices else "broadcast"

    def _open(self, bucket_bytes: int) -> None:
        receiver_ranks = [(group, rank) for group in self._receivers for rank in range(group.world_size)]
        if self.method in ("object_store", "cuda_ipc"):
            # One item per receiver at a time: the sender packs the next bucket once the one before is taken.
            self._channel = Channel.create(f"weights {self._id}", maxsize=1)
            count = len(receiver_ranks)
            if self.method == "object_store":
                specs: list[TransportSpec] = [ObjectStoreSpec(self._channel, count, i, bucket_bytes)
                                              for i in (None, *range(count))]
            else:
                specs = [CudaIpcSpec(self._channel, count, i, bucket_bytes, self._timeout_s)
                         for i in (None, *range(count))]
        else:
            cluster = self._sender.cluster
            node = self._sender.placement.ranks[0].node_rank
            backend = "gloo" if cluster.device_kind == "cpu" else "nccl"
            common = dict(master_addr=cluster.node_address(node), master_port=cluster.free_port(node),
                          world_size=1 + len(receiver_ranks), backend=backend, timeout_s=self._timeout_s,
                          bucket_bytes=bucket_bytes)
            specs = [BroadcastSpec(rank=i, **common) for i in range(1 + len(receiver_ranks))]
        # All at once: the broadcast group's rendezvous waits for every participant.
        calls = [self._sender.call_on(0, "_weight_sync_open", self._id, specs[0])]
        calls += [group.call_on(rank, "_weight_sync_open", self._id, spec)
                  for (group, rank), spec in zip(receiver_ranks, specs[1:])]
        wait_all(calls, self._timeout_s)


def _let_sender_go_if_a_receiver_is_lost(receiver_calls: list, channel: Channel) -> None:
    """Close the sync's channel as soon as a receiver's process is lost: the sender's next put to that receiver's
    full slot would otherwise wait forever, and every call queued behind the send on the sender's ranks with it (a
    collective the other ranks have entered, a training step the driver waits for), so the driver would never get
    to see the loss. The send then fails; a restart opens a new channel (``reopen``)."""
    try:
        wait_all(receiver_calls)
    except WorkerError as error:
        if error.process_lost:
            channel.close()
    except Exception:  # noqa: BLE001 - the sync's own wait reports every other failure
        pass


class PendingSync:
    """A weight sync on its way (``WeightSync.start``)."""

    def __init__(self, sync: WeightSync, version: int, calls: list):
        self._sync, self.version, self._calls = sync, version, calls

    def wait(self) -> None:
        """Return once every receiver has loaded the version (raises as ``WeightSync.sync`` would). When a receiver's
        process was lost, that loss is what is raised: the other participants' failures follow from it (its channel
        was closed under them)."""
        try:
            results = wait_all(self._calls, self._sync._timeout_s)
        except WorkerError as first:
            raise _lost_process(self._calls) or first from None
        self._sync._loaded(self.version, results)


def _lost_process(calls: list) -> WorkerError | None:
    """The error of a call among ``calls`` whose rank's process was lost, if one has failed so."""
    for call in calls:
        for rank in call.ranks:
            try:
                call.rank_call(rank).raise_if_failed()
            except WorkerError as error:
                if error.process_lost:
                    return error
    return None
