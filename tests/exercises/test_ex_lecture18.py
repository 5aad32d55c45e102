"""第 18 讲练习的评分检查：18.1 −∞ 安全的状态合并，18.2 分块注意力与重算反向。

参考答案都在这里按定义用 float64 重新写（显式的 softmax、右下角对齐的因果掩码），不调用实验模块自己的参考实现。
"""
import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grading import close, exercise, expect, expect_no_calls, module

fl = module("lecture18", "flash_lab")
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------
# 测试自己的参考：一块分数 S [..., nq, nk]（被掩码处 −∞）的状态，和整段的 softmax
# ---------------------------------------------------------------------------
def ref_state(S, V):
    """按定义：m = 行最大值，l = Σ exp(S − m)，o = Σ exp(S − m)·V；整行 −∞ 的行是 (−∞, 0, 0)。"""
    S, V = np.asarray(S, np.float64), np.asarray(V, np.float64)
    m = S.max(axis=-1)
    empty = np.isneginf(m)
    base = np.where(empty, 0.0, m)
    p = np.exp(S - base[..., None])
    p[empty] = 0.0
    return m, p.sum(-1), p @ V


def to_state(s):
    return tuple(torch.from_numpy(np.ascontiguousarray(t)) for t in s)


def random_scores(rng, lead, nq, nk, p_row_masked=0.3, p_masked=0.3):
    """随机分数：一部分位置被掩码，一部分行整行被掩码（ring attention 的条带布局里常见）。"""
    S = rng.standard_normal((*lead, nq, nk)) * 3.0
    S[rng.random(S.shape) < p_masked] = NEG_INF
    S[rng.random((*lead, nq)) < p_row_masked] = NEG_INF
    return S


def merged(a, b):
    return tuple(t.numpy() for t in fl.merge_states(to_state(a), to_state(b)))


FP32_HINT = "只差舍入量级（约 1e-7）：中间经过了 float32 吗？合并要在输入的 dtype（这里是 float64）里算"


def _only_rounded(x, want):
    """x 和 want 不逐位相等，但只差 float32 的舍入（有限的位置、−∞ 的位置都一样）。"""
    x, want = np.asarray(x, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    return (x.shape == want.shape and np.array_equal(np.isfinite(x), fin)
            and np.allclose(x[fin], want[fin], rtol=1e-5, atol=1e-30))


def _rounding_note(x, want):
    return f"（{FP32_HINT}）" if _only_rounded(x, want) else ""


def _l_mistake(a, b, l, wl):
    """合并后的 l 不对时猜是哪一种常见错误：拿两边的状态 a、b 按每种错法重算一遍，和学生的 l 比。l 对时返回 ""。"""
    default = "较小一边要乘 exp(m_旧 − m_新) 换到新基准"
    l = np.asarray(l, np.float64)
    if l.shape != wl.shape:
        return default
    if np.allclose(l, wl, rtol=1e-12, atol=1e-12):
        return ""
    (ma, la, _), (mb, lb, _) = a, b
    with np.errstate(invalid="ignore", over="ignore"):
        base = np.maximum(ma, mb)
        base = np.where(np.isneginf(base), 0.0, base)
        fa, fb = np.exp(ma - base), np.exp(mb - base)                    # 正确的换算因子，≤ 1
        inv_a = np.where(np.isneginf(ma), 0.0, np.exp(base - np.where(np.isneginf(ma), 0.0, ma)))
        inv_b = np.where(np.isneginf(mb), 0.0, np.exp(base - np.where(np.isneginf(mb), 0.0, mb)))
        guesses = {
            "两边的 l 直接相加了：两边都要先乘各自的 exp(m_旧 − m_新) 换到新基准": la + lb,
            "换算因子的指数写反了：应是 exp(m_旧 − m_新) ≤ 1，不是 exp(m_新 − m_旧)": la * inv_a + lb * inv_b,
            "只换算了一边：两边都要乘各自的 exp(m_旧 − m_新)": (la * fa + lb, la + lb * fb),
        }
    for hint, guess in guesses.items():
        for g in guess if isinstance(guess, tuple) else (guess,):
            if np.allclose(l, g, rtol=1e-9, atol=1e-300, equal_nan=True):
                return hint
    return FP32_HINT if _only_rounded(l, wl) else default


# ---------------------------------------------------------------------------
# 18.1
# ---------------------------------------------------------------------------
@exercise("18.1")
def test_merge_equals_concatenated_block():
    """两块的状态合并 = 两块拼在一起的状态（m、l、o 逐元素，到 1e-12）；切点不规则。"""
    rng = np.random.default_rng(1801)
    for lead, nq, nk1, nk2, dv in (((2, 3), 7, 5, 11, 4), ((), 13, 1, 9, 3), ((4,), 5, 17, 2, 6)):
        S = random_scores(rng, lead, nq, nk1 + nk2)
        V = rng.standard_normal((*lead, nk1 + nk2, dv))
        a = ref_state(S[..., :nk1], V[..., :nk1, :])
        b = ref_state(S[..., nk1:], V[..., nk1:, :])
        m, l, o = merged(a, b)
        wm, wl, wo = ref_state(S, V)
        expect(not (np.isnan(m).any() or np.isnan(l).any() or np.isnan(o).any()),
               "合并结果里出现了 NaN：两边都是 −∞ 的行算了 exp(−∞ − (−∞))")
        expect(np.array_equal(m, wm), "合并后的 m 应是两边 m 的最大值" + _rounding_note(m, wm))
        close(l, wl, atol=1e-12, rtol=1e-12, message=f"合并后的 l 与拼在一起那块的 Σexp(S − m) 不一致"
              f"（{_l_mistake(a, b, l, wl)}）")
        close(o, wo, atol=1e-12, rtol=1e-12, message="合并后的 o 与拼在一起那块的 Σexp(S − m)·V 不一致")


@exercise("18.1")
def test_fully_masked_states_are_identity():
    """(−∞, 0, 0) 是单位元：在左边、右边、两边都是时都不出 NaN，结果逐位等于另一边。"""
    rng = np.random.default_rng(1802)
    nq, dv = 6, 3
    live = ref_state(rng.standard_normal((nq, 8)), rng.standard_normal((8, dv)))
    empty = (np.full(nq, NEG_INF), np.zeros(nq), np.zeros((nq, dv)))
    for name, (a, b) in (("右边是空状态", (live, empty)), ("左边是空状态", (empty, live))):
        got = merged(a, b)
        expect(all(not np.isnan(t).any() for t in got), f"{name}时合并结果里出现了 NaN")
        off = [(g, w) for g, w in zip(got, live) if not np.array_equal(g, w)]
        expect(not off, f"{name}时合并结果应逐位等于另一边" + (_rounding_note(*off[0]) if off else ""))
    got = merged(empty, empty)
    expect(all(not np.isnan(t).any() for t in got),
           "两边都是空状态 (−∞, 0, 0) 时出现了 NaN：exp(−∞ − (−∞)) 要先把基准 −∞ 换成有限值")
    expect(np.isneginf(got[0]).all() and (got[1] == 0).all() and (got[2] == 0).all(),
           "两个空状态合并应仍是空状态 (−∞, 0, 0)")


@exercise("18.1")
@settings(deadline=None, max_examples=25, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), nq=st.integers(1, 6), cuts=st.tuples(*[st.integers(1, 5)] * 3),
       p_row=st.sampled_from([0.0, 0.4, 1.0]))
def test_merge_associative_and_commutative(seed, nq, cuts, p_row):
    """结合律（舍入误差内）与交换律（逐位）；整行被掩码的行随机出现在任意一块里。"""
    rng = np.random.default_rng(seed)
    dv = 2
    parts = [ref_state(random_scores(rng, (), nq, n, p_row_masked=p_row), rng.standard_normal((n, dv)))
             for n in cuts]
    a, b, c = parts
    left = merged(merged(a, b), c)
    right = merged(a, merged(b, c))
    for x, y, what in zip(left, right, "mlo"):
        expect(not np.isnan(x).any() and not np.isnan(y).any(), f"按不同顺序合并时 {what} 出现了 NaN")
        if what == "m":
            expect(np.array_equal(x, y), "(a·b)·c 与 a·(b·c) 的 m 应逐位相等（都是三者的最大值）")
            continue
        close(x, y, atol=1e-12, rtol=1e-12, message=f"(a·b)·c 与 a·(b·c) 的 {what} 不一致：合并不满足结合律")
    ab, ba = merged(a, b), merged(b, a)
    expect(all(np.array_equal(x, y, equal_nan=True) for x, y in zip(ab, ba)), "merge(a, b) 与 merge(b, a) 应逐位相等")


@exercise("18.1")
def test_merge_writes_its_own_algebra():
    expect_no_calls(fl._merge, ["_safe", "merge_states", "merge_tree", "_merge_tree", "block_state", "_block_state",
                                "finalize", "_finalize", "vanilla_attention", "_vanilla", "kv_split_states"],
                    why="合并两个状态（含 −∞ 的保护）要自己写")


# ---------------------------------------------------------------------------
# 18.2
# ---------------------------------------------------------------------------
# (前面的维度, N, Nk, d, dv, block_q, block_k, causal)：块不整除 N、N ≠ Nk、N > Nk（前几行一个 key 也看不见）
FWD_CASES = (
    ((2, 3), 37, 53, 8, 5, 16, 7, True),
    ((1,), 29, 13, 4, 6, 9, 5, True),
    ((2,), 17, 23, 8, 8, 5, 4, False),
    ((), 5, 41, 3, 3, 64, 6, True),
    ((3,), 19, 19, 6, 2, 7, 8, True),
)


def ref_attention(q, k, v, causal, scale):
    """float64 的定义：S = q kᵀ·scale，causal 右下角对齐（query i 位于 Nk − N + i），softmax，O = P v；
    没有可见 key 的行 O = 0、lse = −∞。"""
    S = (q @ np.swapaxes(k, -1, -2)) * scale
    N, Nk = S.shape[-2:]
    if causal:
        visible = np.arange(Nk)[None, :] <= (Nk - N + np.arange(N))[:, None]
        S = np.where(visible, S, NEG_INF)
    m = S.max(-1, keepdims=True)
    base = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(S - base)
    l = p.sum(-1, keepdims=True)
    P = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
    lse = np.where(l[..., 0] > 0, base[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)), NEG_INF)
    return P @ v, lse


def _qkv(gen, lead, N, Nk, d, dv, requires_grad=False):
    out = [torch.randn(*lead, n, c, generator=gen, dtype=torch.float64) for n, c in ((N, d), (Nk, d), (Nk, dv))]
    return [t.requires_grad_(requires_grad) for t in out]


@exercise("18.2")
def test_blockwise_forward_matches_softmax():
    """前向 O、lse = float64 的定义（到 1e-12）：causal 右下角对齐、块不整除、没有可见 key 的行 O = 0、lse = −∞。"""
    gen = torch.Generator().manual_seed(1821)
    for lead, N, Nk, d, dv, bq, bk, causal in FWD_CASES:
        q, k, v = _qkv(gen, lead, N, Nk, d, dv)
        O, lse = fl.blockwise_attention(q, k, v, bq, bk, causal, return_lse=True)
        wO, wlse = ref_attention(q.numpy(), k.numpy(), v.numpy(), causal, 1 / math.sqrt(d))
        what = f"N={N}、Nk={Nk}、块 {bq}×{bk}、causal={causal}"
        close(O.detach().numpy(), wO, atol=1e-12, rtol=1e-12,
              message=f"{what}：分块前向的 O 与 softmax(q kᵀ/√d) v 不一致（causal 是右下角对齐：query i 看得见 key ≤ Nk − N + i）")
        got = lse.detach().numpy()
        expect(np.array_equal(np.isneginf(got), np.isneginf(wlse)),
               f"{what}：lse = −∞ 的行应恰好是一个 key 也看不见的行")
        fin = np.isfinite(wlse)
        close(got[fin], wlse[fin], atol=1e-12, rtol=1e-12, message=f"{what}：lse = m + log ℓ 不一致")


GRAD_CASES = (  # (N, Nk, d, dv, block_q, block_k, causal)：小而不规则，gradcheck 才快
    (6, 9, 3, 2, 4, 3, True),
    (7, 4, 2, 3, 3, 3, True),        # N > Nk：前 3 行没有可见 key，梯度应为 0
    (5, 7, 3, 3, 2, 4, False),
    (8, 8, 2, 2, 3, 5, True),
)


@exercise("18.2")
def test_recompute_backward_gradcheck():
    """torch.autograd.gradcheck（float64 有限差分）：对 O 的梯度；块不整除、causal、N > Nk。"""
    gen = torch.Generator().manual_seed(1822)
    for N, Nk, d, dv, bq, bk, causal in GRAD_CASES:
        inputs = _qkv(gen, (1,), N, Nk, d, dv, requires_grad=True)
        ok = torch.autograd.gradcheck(lambda q, k, v, bq=bq, bk=bk, causal=causal: fl.blockwise_attention(q, k, v, bq, bk, causal), inputs,
                                      raise_exception=False)
        expect(ok, f"N={N}、Nk={Nk}、块 {bq}×{bk}、causal={causal}：反向的梯度和有限差分对不上"
                   "（重算 P = exp(S − lse) 时要用前向那一行的 lse，并用和前向相同的掩码）")


@exercise("18.2")
def test_backward_through_lse():
    """lse 本身也回传梯度（∂lse_i/∂S_ij = P_ij）：对 (O, lse) 两个输出做 gradcheck，并与参考的 autograd 比较。"""
    gen = torch.Generator().manual_seed(1823)
    for N, Nk, d, dv, bq, bk, causal in ((6, 9, 3, 2, 4, 3, True), (5, 7, 3, 3, 2, 4, False)):
        inputs = _qkv(gen, (2,), N, Nk, d, dv, requires_grad=True)
        ok = torch.autograd.gradcheck(lambda q, k, v, bq=bq, bk=bk, causal=causal: fl.blockwise_attention(q, k, v, bq, bk, causal,
                                                                             return_lse=True), inputs,
                                      raise_exception=False)
        expect(ok, f"N={N}、Nk={Nk}、causal={causal}：对 lse 的梯度不对（lse 的上游梯度 dlse 要并进 D：D − dlse）")
        dO = torch.randn(2, N, dv, generator=gen, dtype=torch.float64)
        dl = torch.randn(2, N, generator=gen, dtype=torch.float64)
        O, lse = fl.blockwise_attention(*inputs, bq, bk, causal, return_lse=True)
        got = torch.autograd.grad((O, lse), inputs, (dO, dl))
        S = (inputs[0] @ inputs[1].transpose(-1, -2)) / math.sqrt(d)
        if causal:
            S = S.masked_fill(torch.arange(Nk)[None, :] > (Nk - N + torch.arange(N))[:, None], NEG_INF)
        want = torch.autograd.grad((torch.softmax(S, -1) @ inputs[2], torch.logsumexp(S, -1)), inputs, (dO, dl))
        for g, w, name in zip(got, want, ("dq", "dk", "dv")):
            close(g.numpy(), w.numpy(), atol=1e-11, rtol=1e-11, message=f"{name} 与 float64 定义的 autograd 不一致")


@exercise("18.2")
def test_activation_memory_is_table1():
    """激活显存：前向后留给反向的新张量只有 O 和 lse（q、k、v 本来就在）；整层的最大激活 = 表 1 的 flash 公式。"""
    gen = torch.Generator().manual_seed(1824)
    b, n, N, Nk, dh = 2, 2, 45, 61, 4
    q, k, v = _qkv(gen, (b, n), N, Nk, dh, dh, requires_grad=True)
    with fl.MemoryMeter() as mm:
        O, lse = fl.blockwise_attention(q, k, v, 8, 16, True, return_lse=True)
        kept = mm.live
    want = O.numel() * O.element_size() + lse.numel() * lse.element_size()
    expect(kept == want, f"前向结束时还活着的新张量有 {kept} 字节，应只有 O 和 lse 的 {want} 字节"
                         f"（存下了 N×Nk 的 P 或别的中间结果？N×Nk 的 P 就要 {b * n * N * Nk * 8} 字节）")
    (O.sum() + lse.sum()).backward()
    s, h, c = 96, 16, 32
    layer = fl.TransformerLayer(h, 2, seed=0, dtype=torch.float64)
    x = torch.randn(1, s, h, generator=gen, dtype=torch.float64)
    r = fl.measure_layer(layer, x, "flash", block=c)
    formula = 8 * 1 * s * h * 8 // 2       # 表 1 的 flash 合计 8bsh（BF16 字节），换成 float64
    expect(r["fwd_largest"] == formula,
           f"flash 模式一层前向的最大激活 {r['fwd_largest']} 字节，应等于 Ring Attention 表 1 的 8bsh = {formula} 字节"
           f"（前馈的 4h 中间层）；更大说明注意力里有 s×s 的张量（{2 * s * s * 8} 字节）")


@exercise("18.2")
def test_blockwise_writes_its_own_loops():
    banned = ["vanilla_attention", "_vanilla", "sdpa_attention", "scaled_dot_product_attention", "softmax",
              "logsumexp", "_differentiable_bwd", "grad", "backward", "kv_split_states"]
    for fn in (fl._fwd, fl._bwd, fl.BlockwiseAttention.forward, fl.BlockwiseAttention.backward):
        expect_no_calls(fn, [x for x in banned if not (fn is fl.BlockwiseAttention.backward
                                                       and x == "_differentiable_bwd")],
                        why="分块前向、重算反向要自己写出循环")
