"""kernels._graphs: when a launch sequence is captured, replayed or left to its caller.

The capture itself needs a GPU (tests/test_conv_backward.py's gpu tests replay real graphs);
here a stand-in capture records what would have been captured."""

import pytest
import torch

from kernels import _graphs
from kernels._graphs import Graphed


class FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def captured(monkeypatch):
    """Graphed._capture replaced by one that runs nothing and stores a FakeGraph; the list of
    (key, what keep() gave) it was called with."""
    calls = []

    def capture(self, key, launches, keep):
        graph = FakeGraph()
        self.graphs[key] = (graph, (tuple(keep()), ()))
        self.captures += 1
        calls.append((key, tuple(keep())))
        return graph

    monkeypatch.setattr(Graphed, "_capture", capture)
    return calls


def test_a_pointer_set_is_captured_on_its_second_sighting_then_replayed(captured):
    graphed, launches = Graphed(), []
    key = ((0, 7), 1024, 2048)
    assert graphed(key, lambda: launches.append(1), lambda: ("plan",)) is False  # first: caller
    assert captured == []
    assert graphed(key, lambda: launches.append(2), lambda: ("plan",)) is True  # captured, replayed
    assert captured == [(key, ("plan",))]
    graph = graphed.graphs[key][0]
    assert graph.replays == 1
    for _ in range(3):
        assert graphed(key, lambda: launches.append(3)) is True
    assert graph.replays == 4 and graphed.captures == 1
    assert launches == []  # the sequence object never ran its launches itself
    # other pointers (or another stream) are another key: counted from one again
    assert graphed(((0, 8), 1024, 2048), lambda: None) is False
    assert graphed(((0, 7), 1024, 4096), lambda: None) is False
    assert graphed.captures == 1


def test_graphs_per_sequence_are_bounded(captured, monkeypatch):
    monkeypatch.setattr(_graphs, "PER_SEQUENCE", 3)
    graphed = Graphed()
    for ptr in range(5):
        key = ((0, 0), ptr)
        graphed(key, lambda: None)
        graphed(key, lambda: None)
    assert graphed.captures == 3 and len(graphed.graphs) == 3
    assert graphed(((0, 0), 4), lambda: None) is False  # full: left to the caller, not captured
    assert graphed(((0, 0), 0), lambda: None) is True  # a kept graph still replays


def test_the_sighting_count_is_bounded(captured, monkeypatch):
    monkeypatch.setattr(_graphs, "_SEEN_MAX", 4)
    graphed = Graphed()
    for ptr in range(10):  # pointers that never come back are never captured
        assert graphed(((0, 0), ptr), lambda: None) is False
    assert len(graphed.seen) <= 4 and graphed.captures == 0


def test_a_failed_capture_leaves_the_sequence_to_its_caller_for_good(monkeypatch):
    """A capture that raises (here: no CUDA, or a launch that cannot be captured) warns once,
    returns False, and the sequence is never offered for capture again."""
    graphed = Graphed()
    key = ((0, 0), 1)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _raises)
    monkeypatch.setattr(_graphs, "_STREAMS", {key[0]: None})
    graphed.pools[key[0]] = None
    assert graphed(key, lambda: None) is False
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        assert graphed(key, lambda: None) is False
    assert graphed.broken and graphed.graphs == {}
    assert graphed(key, lambda: None) is False and graphed(key, lambda: None) is False


def _raises():
    raise RuntimeError("no graph here")


def test_nothing_is_graphed_off_cuda_or_when_switched_off(monkeypatch):
    assert _graphs.usable(torch.zeros(1)) is False
    monkeypatch.setattr(_graphs, "GRAPHS", False)
    assert _graphs.usable(torch.zeros(1)) is False


def test_stream_tile_counters_are_the_streams_own():
    """What a graph captured on a stream keeps alive: the split-K counters tile_counters holds
    for that stream, and only those (the CPU's stand in for a stream of their own here)."""
    from kernels._common import _TILE_COUNTERS, stream_tile_counters, tile_counters

    saved = dict(_TILE_COUNTERS)
    try:
        _TILE_COUNTERS.clear()
        counters = tile_counters(torch.device("cpu"), 8)
        _TILE_COUNTERS[("cuda", 0, 1234)] = torch.zeros(4, dtype=torch.int32)
        assert stream_tile_counters(None) == (counters,)
        assert len(stream_tile_counters(1234)) == 1 and stream_tile_counters(99) == ()
    finally:
        _TILE_COUNTERS.clear()
        _TILE_COUNTERS.update(saved)


def test_run_keys_by_stream_and_pointers_and_runs_what_is_declined(captured, monkeypatch):
    """Graphed.run: off the GPU the launches run as they are; where a graph may be used, the
    key is the stream then each tensor's pointer (0 for None), the first sighting runs the
    launches and the second replays the graph captured for it."""
    ran = []
    t, u = torch.zeros(2), torch.ones(3)
    graphed = Graphed()
    graphed.run(t, (t, None, u), lambda: ran.append(1))
    assert ran == [1] and not captured  # CPU: not usable
    monkeypatch.setattr(_graphs, "usable", lambda x: True)
    monkeypatch.setattr(_graphs, "stream_key", lambda x: (0, 7))
    for _ in range(3):
        graphed.run(t, (t, None, u), lambda: ran.append(1), lambda: ("kept",))
    assert ran == [1, 1]  # the second sighting captured (stand-in) and replayed
    assert captured == [(((0, 7), t.data_ptr(), 0, u.data_ptr()), ("kept",))]
    assert graphed.graphs[captured[0][0]][0].replays == 2
