"""Weight buckets handed to vLLM's worker processes through files in shared memory.

vLLM's RPC carries its arguments through two serialisations (msgpack to the engine core, pickle to each worker),
so a bucket passed as bytes is copied four times on its way, and a tensor does not survive the msgpack leg at all.
Instead the engine's process writes each part of a sync into one file under ``/dev/shm`` (a temporary directory
when that is too small: a container's default is 64 MiB) and the RPC carries only the path and the layout; every
worker maps the file copy-on-write and loads from views of it. A tensor listed under two names (a tied head) is
written once and laid out under both (the layout is ``weight_buckets``' plan of the part). The file is deleted once the workers have loaded it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

from rlinf_search.scheduler.weight_buckets import ALIGN, pack_bucket, plan_buckets

SHM_DIR = Path("/dev/shm")
Layout = list[list]
"""One ``[name, dtype, shape, offset, nbytes]`` per tensor: plain lists, which every RPC serialiser carries."""


def file_parts(buckets: Iterable[Mapping[str, torch.Tensor]], max_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """Each incoming bucket in parts of at most about ``max_bytes`` (a larger tensor is a part of its own), taken
    one at a time as the buckets arrive."""
    for bucket in buckets:
        part: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in bucket.items():
            tensor = torch.as_tensor(tensor)
            if part and size + tensor.nbytes > max_bytes:
                yield part
                part, size = {}, 0
            part[name] = tensor
            size += tensor.nbytes
        if part:
            yield part


@contextlib.contextmanager
def bucket_file(part: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, Layout]]:
    """Write ``part`` into a new shared-memory file; yield its path and layout; delete it afterwards."""
    plan = plan_buckets(part, bucket_bytes=sys.maxsize, version=0)  # one bucket: the weight sync's own layout
    slots = plan.buckets[0] if plan.buckets else ()
    size = max(plan.sizes[0] if plan.sizes else 0, ALIGN)
    layout: Layout = [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in slots]
    offsets = {s.name: (s.offset, s.nbytes) for s in slots}
    layout += [[alias, str(part[alias].dtype).removeprefix("torch."), list(part[alias].shape), *offsets[source]]
               for alias, source in plan.aliases.items()]
    directory = SHM_DIR if SHM_DIR.is_dir() and shutil.disk_usage(SHM_DIR).free > 2 * size else tempfile.gettempdir()
    path = Path(directory) / f"rlinf-weights-{os.getpid()}-{uuid.uuid4().hex}.bin"
    try:
        pack_bucket(part, slots, size, out=torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8))
        yield str(path), layout
    finally:
        path.unlink(missing_ok=True)


def read_bucket_file(path: str, layout: Layout) -> dict[str, torch.Tensor]:
    """The tensors of a bucket file, as views of a copy-on-write mapping of it (no copy)."""
    size = max([ALIGN] + [offset + nbytes for _, _, _, offset, nbytes in layout])
    flat = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    return {name: flat[offset:offset + nbytes].view(getattr(torch, dtype)).view(shape)
            for name, dtype, shape, offset, nbytes in layout}
