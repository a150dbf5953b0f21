"""A planned launch sequence replayed as one CUDA graph, keyed by its tensors' pointers.

A planned backward still pays Python for every launch, stream switch and event of it: a
stride-2 3x3 conv's backward makes 8 launches, 6 event records and 8 stream waits, about 200 us
of host time a step on the calling thread and about twice that on autograd's device thread
(docs/kernels/host_path.md, "Graphed backward"). Once every launch of such a sequence is
planned, what it does depends on nothing but its tensors' pointers. So the sequence is captured
into a CUDA graph the SIGHTINGS-th time the same pointers come back, and later calls replay it:
one cudaGraphLaunch. A training loop's caching allocator hands a layer the same blocks each step,
so in a loop the pointers do come back.

What a graph bakes in, and why it stays valid:
- the key's tensors (inputs, and outputs the caller allocated before the call): the key is their
  pointers, so a replay reads and writes exactly the call's tensors;
- intermediates the sequence allocates (workspaces, a dgrad's tap matrix): these come from a
  private memory pool of the sequence's graphs on one replay stream, which those graphs hold
  (torch frees a pool once no graph holds it, and its id cannot be used again, so a pool lives
  and dies with one Graphed). A replay writes each intermediate before reading it, and replays on
  one stream do not overlap; graphs for two replay streams share no pool, and each replay stream
  has its own capture stream (and so its own split-K counters);
- buffers that outlive a call (split-K arrival counters, cached per stream and replaced when a
  larger grid needs more; the plans a sequence runs): a graph keeps references to the capture
  stream's counters and to what the caller names (`keep()`, called once, at capture), so that
  replacing them in a cache cannot free memory a graph still writes.

Nothing is captured off CUDA, while torch.compile traces, during another capture, while Triton's
launch hooks are set (a profiler that wants each launch), or with KBENCH_GRAPHS=0 in the
environment. A capture that fails marks its sequence ungraphable, and from then on the sequence
runs launch by launch.

    Graphed()(key, launches, keep)   replay key's graph and return True, or return False and
                                     leave the call to the caller (capturing first, then
                                     replaying, on the SIGHTINGS-th sighting)
    Graphed().run(t, tensors, launches, keep)
                                     run launches: as a graph keyed by the current stream of
                                     t's device and the tensors' pointers where usable(t),
                                     else (or where the graph declines) launch by launch
    usable(t)                        whether a call on t's device may use a graph now
    stream_key(t)                    the raw current stream of t's device (a key's first field)
    CAPTURE.active                   one of these captures is under way on this thread
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from kernels._common import stream_tile_counters
from kernels._launch import hooks_unset

GRAPHS = os.environ.get("KBENCH_GRAPHS", "1") != "0"
SIGHTINGS = 2  # capture a pointer set the second time it comes: a one-off call never captures
PER_SEQUENCE = 16  # graphs a sequence keeps: ResNet-50 repeats one conv geometry up to 6 times
_SEEN_MAX = 256  # pointer sets counted toward SIGHTINGS, before the count starts over


class _Capture(threading.local):
    active = False


CAPTURE = _Capture()
# (device index, replay stream) -> its capture stream
_STREAMS: dict = {}


def usable(t: torch.Tensor) -> bool:
    return (GRAPHS and t.is_cuda and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing() and hooks_unset())  # fmt: skip


def stream_key(t: torch.Tensor) -> tuple[int, int]:
    index = t.get_device()
    return index, torch._C._cuda_getCurrentRawStream(index)


class Graphed:
    """One launch sequence's graphs, by key: (stream_key, then the tensors' data pointers)."""

    __slots__ = ("graphs", "seen", "broken", "captures", "pools")

    def __init__(self):
        self.graphs: dict = {}  # key -> (CUDAGraph, what it keeps alive)
        self.pools: dict = {}  # replay stream_key -> the memory pool of its graphs
        self.seen: dict = {}  # key -> sightings so far, below SIGHTINGS
        self.broken = False  # a capture failed: never capture this sequence again
        self.captures = 0

    def __call__(self, key: tuple, launches, keep=tuple) -> bool:
        entry = self.graphs.get(key)
        if entry is not None:
            entry[0].replay()
            return True
        if self.broken or len(self.graphs) >= PER_SEQUENCE:
            return False
        count = self.seen.get(key, 0) + 1
        if count < SIGHTINGS:
            if len(self.seen) >= _SEEN_MAX:
                self.seen.clear()
            self.seen[key] = count
            return False
        self.seen.pop(key, None)
        graph = self._capture(key, launches, keep)
        if graph is None:
            return False
        graph.replay()
        return True

    def run(self, t: torch.Tensor, tensors, launches, keep=tuple) -> None:
        """launches(), replayed from this sequence's graph of the key (stream_key(t), then each
        of `tensors`' data pointers, 0 for None) where usable(t) and the graph takes it."""
        if usable(t):
            key = (stream_key(t), *(0 if u is None else u.data_ptr() for u in tensors))
            if self(key, launches, keep):
                return
        launches()

    def _capture(self, key, launches, keep):
        try:
            capture_stream = _STREAMS.get(key[0])
            if capture_stream is None:
                capture_stream = _STREAMS[key[0]] = torch.cuda.Stream(key[0][0])
            pool = self.pools.get(key[0])
            if pool is None:
                pool = self.pools[key[0]] = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(capture_stream):
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                CAPTURE.active = True
                try:
                    launches()
                finally:
                    CAPTURE.active = False
                    graph.capture_end()
        except Exception as exc:  # a launch that cannot be captured: run launch by launch
            self.broken = True
            warnings.warn(f"kernels: a launch sequence could not be captured as a CUDA graph "
                          f"and runs launch by launch ({type(exc).__name__}: {exc})",
                          RuntimeWarning, stacklevel=3)  # fmt: skip
            return None
        counters = stream_tile_counters(capture_stream.cuda_stream)
        self.graphs[key] = (graph, (tuple(keep()), counters))
        self.captures += 1
        return graph
