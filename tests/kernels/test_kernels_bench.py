"""When ``kernels.bench.do_bench`` times a call as a CUDA-graph replay (CPU: the rule; GPU: both paths)."""

import pytest
import torch

from kernels.bench import LAUNCH_BOUND, do_bench, wants_graph


def test_short_or_launch_bound_calls_are_graphed():
    assert wants_graph(estimate_us=8.0, enqueue_us=1.0)  # short: launch gaps would dominate an eager timing
    assert not wants_graph(estimate_us=400.0, enqueue_us=20.0)  # long and GPU-bound: eager is exact
    # the fused MoE at one token: ~15 launches take the CPU longer than the GPU takes to run them
    assert wants_graph(estimate_us=300.0, enqueue_us=280.0)
    assert wants_graph(estimate_us=100.0, enqueue_us=LAUNCH_BOUND * 100.0)
    assert not wants_graph(estimate_us=100.0, enqueue_us=LAUNCH_BOUND * 100.0 - 1.0)
    assert not wants_graph(estimate_us=30.0, enqueue_us=1.0, graph_below_us=20.0)
    assert wants_graph(estimate_us=30.0, enqueue_us=1.0, graph_below_us=50.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA kernels")
def test_launch_bound_call_is_graphed_and_a_synchronising_one_is_timed_eagerly():
    x = torch.randn(64, device="cuda")

    def many_small(_=None):  # 40 tiny launches: the CPU, not the GPU, sets the pace eagerly
        y = x
        for _ in range(40):
            y = y + 1.0
        return y

    t = do_bench(many_small, flush_l2=False, graph_below_us=0.0)
    assert t.graph and t.median_us > 0

    def syncs(_=None):  # .item() synchronises: it cannot be captured, and trying would break this process's RNG
        return (x + 1.0).sum().item()

    t = do_bench(syncs, flush_l2=False, graph_below_us=1e9)
    assert not t.graph and t.median_us > 0
    assert torch.randn(4, device="cuda").isfinite().all()  # the process is still fine
