"""Counted FLOPs that do not depend on compile: attention is counted as its math whatever kernel runs, so an eager step
and a compiled model counted on its meta copy agree; activation-checkpoint recompute stays counted.
"""

from __future__ import annotations

import pytest
from test_agent_depth import facts, gpt

from trainmeter_agent._flops import _counter, meta_copy

heavy = pytest.mark.xdist_group("heavy")

# Attention shapes for the formula tests: batch 2, 3 heads, 16 positions, head width 8.
B, H, T, D = 2, 3, 16, 8


@heavy
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_eager_and_compiled_counted_flops_per_token_are_equal_and_equal_the_hand_count(run, torch, compiled):
    gpt(run, "--steps", "3", *(["--compile"] if compiled else []))
    counted = facts(run.records())["counted_flop_per_token"]
    # tests/agent_scripts/gpt_loop.py: 2 layers, d 32, 2 heads of 16, T 16, vocabulary 64, tied head.
    # Matmul weights per token: 2 layers x (qkv 32x96 + proj 32x32 + mlp 32x128 + 128x32) + head 32x64
    #   = 2 x (3072 + 1024 + 4096 + 4096) + 2048 = 26624; forward 2 and backward 4 FLOPs per weight: 6 x 26624 = 159744.
    # Attention as its math, per token and layer, over the whole T x T (causal or not): forward QK^T and PV,
    #   2 matmuls x 2 x T 16 x d 32 = 2048; backward dS, dV, dQ, dK, 4 x 2 x 16 x 32 = 4096; 6144 per layer.
    # 159744 + 2 x 6144 = 172032, eager (the CPU flash kernel runs) and compiled (a meta copy, math kernels) alike.
    assert counted["value"] == 172032.0
    assert ("meta copy" in counted["note"]) is compiled


def _meta(torch, *shape):
    return torch.empty(*shape, device="meta")


def test_every_fused_attention_backward_is_counted_as_four_matmuls(torch):
    aten = torch.ops.aten
    counter = _counter()
    q = _meta(torch, B, H, T, D)
    lse = _meta(torch, B, H, T)
    # The math backward: dS = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q, each 2 x B x H x T x T x D FLOPs:
    # 4 x 2 x 2 x 3 x 16 x 16 x 8 = 98304. torch's own formula adds the recompute of QK^T: 5 x 24576 = 122880.
    expected = 98304
    for name in (
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ):
        # grad_out, query, key, value first; torch reads their shapes only.
        assert counter.flop_registry[getattr(aten, name)](q, q, q, q, q, lse, out_val=None) == expected, name
    from torch.utils.flop_counter import flop_registry

    torch_own = flop_registry[aten._scaled_dot_product_flash_attention_backward](
        q, q, q, q, q, lse, out_val=None
    )
    assert torch_own == 122880  # the figure an eager GPU step was counted with before
    # The kernels that take (B, T, H, D), counted by torch as if (B, H, T, D): the ratio 4/5 holds all the same.
    k = _meta(torch, B, T, H, D)
    flash = counter.flop_registry[aten._flash_attention_backward](
        k, k, k, k, k, lse, None, None, T, T, out_val=None
    )
    efficient = counter.flop_registry[aten._efficient_attention_backward](
        k, k, k, k, None, k, None, None, T, T, out_val=None
    )
    torch_flash = flop_registry[aten._flash_attention_backward](
        k, k, k, k, k, lse, None, None, T, T, out_val=None
    )
    assert flash == efficient == torch_flash * 4 // 5


def test_a_value_width_unlike_the_query_width_keeps_the_math_count(torch):
    aten = torch.ops.aten
    q = _meta(torch, B, H, T, D)
    v = _meta(torch, B, H, T, 4)
    # dS = dO V^T and dV = P^T dO are 2 x B x H x T x T x 4 each, dQ and dK 2 x B x H x T x T x 8 each:
    # 2 x 2 x 3 x 16 x 16 x (4 + 4 + 8 + 8) = 73728.
    counted = _counter().flop_registry[aten._scaled_dot_product_flash_attention_backward](
        v, q, q, v, v, _meta(torch, B, H, T), out_val=None
    )
    assert counted == 73728


def _attention_block(torch):
    """A projection to queries, keys and values of 2 heads of width 8, then causal scaled dot-product attention."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    torch.manual_seed(0)
    return Block()


def test_a_cpu_attention_step_counts_the_same_eagerly_and_on_a_meta_copy(torch):
    block = _attention_block(torch)
    x = torch.randn(2, 8, 16)
    eager = _counter()
    with eager:
        block(x).backward()
    copy = meta_copy(block, torch)
    on_meta = _counter()
    with torch.device("meta"), on_meta:
        copy(torch.empty(2, 8, 16, device="meta")).backward()
    # qkv 16 -> 48 on 2 x 8 = 16 positions: forward 2 x 16 x 16 x 48 = 24576, backward the weight's gradient only
    # (x needs none) 24576. Attention of 2 x 2 heads over 8 x 8 positions, width 8, as its math: forward
    # 2 matmuls x 2 x 4 x 8 x 8 x 8 = 8192, backward 4 matmuls, 16384. 24576 + 24576 + 8192 + 16384 = 73728.
    assert eager.get_total_flops() == on_meta.get_total_flops() == 73728


@pytest.mark.parametrize(("reentrant", "expected"), [(False, 3584), (True, 4096)])
def test_activation_checkpoint_recompute_stays_counted(torch, reentrant, expected):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    plain, recomputed = _counter(), _counter()
    with plain:
        block(x).sum().backward()
    with recomputed:
        checkpoint(block, x, use_reentrant=reentrant).sum().backward()
    # Each linear: forward 2 x 4 x 8 x 8 = 512, backward (input and weight) 1024; two of them: 3072 without a
    # checkpoint. The reentrant checkpoint reruns the whole forward in backward: 3072 + 1024 = 4096. The
    # non-reentrant one stops recomputing once it has every tensor backward needs (the second linear's input is the
    # GELU's output): the first linear reruns, 3072 + 512 = 3584.
    assert plain.get_total_flops() == 3072
    assert recomputed.get_total_flops() == expected
