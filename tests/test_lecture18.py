"""lecture18/flash_lab.py（torch）的单元测试与性质测试。

_selftest() 和演示的 --quick 由 test_harness.py 在子进程里跑，这里不重复；这里测随机形状上的性质：
分块前向 / 重算反向 = 逐行按定义的参考与 SDPA、状态合并的交换律 / 结合律（夹着整行 −∞）、gradcheck、
三种层算法输出相同而最大激活 = 论文表 1、MemoryMeter 的计数、K/V 切给多块设备，以及坏输入的报错。
模块用 labload 以唯一名字 "lecture18.flash_lab" 加载，不和 lecture11 的 numpy flash_lab 抢裸名字。
"""
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

fl = load_lab("lecture18", "flash_lab")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """分块算法是许多小矩阵乘法：单线程快得多（负载高的 2 核机器上多线程同步慢百倍）。测完恢复。"""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _t(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def per_row_reference(q, k, v, causal):
    """逐行按定义（不经过本模块的任何函数）：query i 只看前 n_i 个 key，n_i = Nk − N + i + 1（causal）。"""
    N, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    O = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    for i in range(N):
        n = Nk - N + i + 1 if causal else Nk
        if n <= 0:
            continue
        s = (k[..., :n, :] @ q[..., i, :, None])[..., 0] / math.sqrt(d)      # [..., n]
        O[..., i, :] = (torch.softmax(s, -1)[..., None, :] @ v[..., :n, :])[..., 0, :]
        lse[..., i] = torch.logsumexp(s, -1)
    return O, lse


@st.composite
def attn_shapes(draw):
    return dict(lead=tuple(draw(st.lists(st.integers(1, 3), max_size=2))), N=draw(st.integers(1, 40)),
                Nk=draw(st.integers(1, 40)), d=draw(st.integers(1, 8)), dv=draw(st.integers(1, 8)),
                bq=draw(st.integers(1, 20)), bk=draw(st.integers(1, 20)), causal=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


# ---------------------------------------------------------------------------------------------- 分块注意力
@settings(deadline=None, max_examples=40)
@given(attn_shapes())
def test_blockwise_matches_references(s):
    gen = torch.Generator().manual_seed(s["seed"])
    lead, N, Nk = s["lead"], s["N"], s["Nk"]
    q, k, v, dO = _t(gen, *lead, N, s["d"]), _t(gen, *lead, Nk, s["d"]), _t(gen, *lead, Nk, s["dv"]), \
        _t(gen, *lead, N, s["dv"])
    O_ref, lse_ref = per_row_reference(q, k, v, s["causal"])
    O, lse = fl.blockwise_attention_fwd(q, k, v, s["bq"], s["bk"], s["causal"])
    assert (O - O_ref).abs().max() < 1e-12
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert bool(((lse[fin] - lse_ref[fin]).abs() < 1e-12).all())
    assert (fl.sdpa_attention(q, k, v, s["causal"]) - O_ref).abs().max() < 1e-12      # SDPA 在 float64 下
    # 反向：重算版 = 对逐行参考做 autograd
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    g_ref = torch.autograd.grad(per_row_reference(*leaves, s["causal"])[0], leaves, dO, allow_unused=True)
    got = fl.blockwise_attention_bwd(q, k, v, O, lse, dO, s["bq"], s["bk"], s["causal"])
    for g, r in zip(got, g_ref):
        r = torch.zeros_like(g) if r is None else r
        assert (g - r).abs().max() < 1e-11


@pytest.mark.parametrize("N,Nk,causal", [(6, 9, True), (7, 4, True), (5, 5, False), (1, 8, True)])
def test_gradcheck(N, Nk, causal):
    gen = torch.Generator().manual_seed(N * 100 + Nk)
    inputs = [_t(gen, 2, n, c).requires_grad_(True) for n, c in ((N, 3), (Nk, 3), (Nk, 2))]
    assert torch.autograd.gradcheck(lambda q, k, v: fl.blockwise_attention(q, k, v, 4, 3, causal), inputs)


def test_backward_saves_nothing_quadratic():
    """autograd 为 BlockwiseAttention 存下的张量都是 O(N)：没有一个 [N, Nk] 的。"""
    N = Nk = 96
    q, k, v = (torch.randn(2, n, 8, requires_grad=True) for n in (N, Nk, Nk))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        fl.blockwise_attention(q, k, v, 16, 16, causal=True).sum().backward()
    assert saved and all(math.prod(sh) <= 2 * N * 8 for sh in saved), saved
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        fl.vanilla_attention(q, k, v, causal=True)
    assert any(tuple(sh[-2:]) == (N, Nk) for sh in saved)           # 对照：标准写法存了 P


def test_flash_attention_falls_back_on_cpu():
    gen = torch.Generator().manual_seed(5)
    q, k, v = _t(gen, 2, 3, 19, 8), _t(gen, 2, 3, 23, 8), _t(gen, 2, 3, 23, 8)
    assert not fl.triton_available(q)
    ref = per_row_reference(q, k, v, True)[0]
    assert (fl.flash_attention(q, k, v, causal=True, block_q=5, block_k=7) - ref).abs().max() < 1e-12


_INTERPRET_SCRIPT = r"""
import sys
import torch
sys.path.insert(0, sys.argv[1])
import flash_lab as fl
fl.triton_available = lambda q=None: True      # 让 CPU 张量也走 Triton 那条路（内核由解释器执行）
torch.manual_seed(0)
for lead, N, Nk, causal in (((2, 3), 19, 23, True), ((), 16, 16, False), ((1,), 9, 5, True)):
    q, k, v = (torch.randn(*lead, n, 16, requires_grad=True) for n in (N, Nk, Nk))
    out = fl.flash_attention(q, k, v, causal=causal)
    ref = fl.vanilla_attention(q.double(), k.double(), v.double(), causal)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    refs = torch.autograd.grad(ref.sum(), (q, k, v))
    assert out.shape == ref.shape and (out.double() - ref).abs().max() < 1e-5
    assert all((g.double() - r).abs().max() < 1e-5 for g, r in zip(grads, refs))
print("ok")
"""


def test_flash_attention_triton_path_under_interpreter():
    """flash_attention 的 Triton 分支（形状换算、causal 右下角、N > Nk、反向），在 TRITON_INTERPRET=1 的子进程里
    用 CPU 跑。解释器必须在 import triton 之前打开，所以放在子进程里，不影响本进程。"""
    pytest.importorskip("triton", reason="没有安装 triton")
    import os
    import subprocess
    import sys
    folder = os.path.join(os.path.dirname(__file__), "..", "lecture18")
    r = subprocess.run([sys.executable, "-c", _INTERPRET_SCRIPT, folder], capture_output=True, text=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="需要 CUDA（Triton 快路径）")
def test_flash_attention_triton_matches_sdpa():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 64, device="cuda", generator=gen) for n in (300, 300, 300))
    out = fl.flash_attention(q, k, v, causal=True)
    ref = fl.sdpa_attention(q.double(), k.double(), v.double(), causal=True)
    assert (out.double() - ref).abs().max() < 1e-4


# ---------------------------------------------------------------------------------------------- 状态代数
@st.composite
def split_rows(draw):
    nk = draw(st.integers(1, 30))
    cuts = sorted(set(draw(st.lists(st.integers(1, nk - 1), max_size=6)) if nk > 1 else []))
    return dict(nq=draw(st.integers(1, 6)), nk=nk, dv=draw(st.integers(1, 4)), cuts=[0, *cuts, nk],
                masked_rows=draw(st.lists(st.integers(0, 5), max_size=3)), mask_p=draw(st.floats(0, 0.9)),
                seed=draw(st.integers(0, 2**31)))


@settings(deadline=None, max_examples=60)
@given(split_rows())
def test_state_merge_any_tree_with_masked_rows(s):
    gen = torch.Generator().manual_seed(s["seed"])
    rng = random.Random(s["seed"])
    S, V = _t(gen, s["nq"], s["nk"]) * 3, _t(gen, s["nk"], s["dv"])
    S = S.masked_fill(torch.rand(S.shape, generator=gen, dtype=torch.float64) < s["mask_p"], -math.inf)
    for r in s["masked_rows"]:
        if r < s["nq"]:
            S[r] = -math.inf                                 # 整行被掩码
    parts = [fl.block_state(S[:, a:b], V[a:b]) for a, b in zip(s["cuts"], s["cuts"][1:])]
    whole = fl.finalize(fl.block_state(S, V))
    empty = ~torch.isfinite(S).any(-1)
    ref = torch.where(empty[:, None], 0.0, torch.softmax(S.masked_fill(empty[:, None], 0.0), -1)) @ V
    for tree in (None, fl.random_tree(len(parts), rng)):
        O, lse = fl.finalize(fl.merge_tree(parts, tree))
        assert not torch.isnan(O).any() and not torch.isnan(lse).any()
        assert (O - ref).abs().max() < 1e-12 and (O - whole[0]).abs().max() < 1e-12
        assert torch.equal(torch.isneginf(lse), empty) and (O[empty] == 0).all()
    for a in parts:                                          # 交换律逐位精确；单位元
        for b in parts:
            assert all(torch.equal(x, y) for x, y in zip(fl.merge_states(a, b), fl.merge_states(b, a)))
        ident = fl.block_state(S[:, :0], V[:0])
        assert all(torch.equal(x, y) for x, y in zip(fl.merge_states(ident, a), a))
    if len(parts) >= 3:                                      # 结合律（舍入误差内）
        a, b, c = parts[:3]
        left = fl.merge_states(fl.merge_states(a, b), c)
        right = fl.merge_states(a, fl.merge_states(b, c))
        assert torch.equal(left[0], right[0])
        assert (left[1] - right[1]).abs().max() < 1e-12 and (left[2] - right[2]).abs().max() < 1e-12


def test_fully_masked_block_gives_identity_state():
    S, V = torch.full((2, 3, 4, 5), -math.inf), torch.randn(2, 3, 5, 6)
    m, l, o = fl.block_state(S, V)
    assert torch.isneginf(m).all() and (l == 0).all() and (o == 0).all()
    O, lse = fl.finalize((m, l, o))
    assert (O == 0).all() and torch.isneginf(lse).all()


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 9), st.integers(1, 30), st.integers(1, 30), st.booleans(), st.integers(0, 2**31))
def test_kv_split_across_devices(P, N, Nk, causal, seed):
    P = min(P, Nk)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _t(gen, 2, N, 4), _t(gen, 2, Nk, 4), _t(gen, 2, Nk, 3)
    states, bounds = fl.kv_split_states(q, k, v, P, causal)
    assert [b - a for a, b in bounds] == sorted((b - a for a, b in bounds), reverse=True)
    sizes = [b - a for a, b in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == Nk and max(sizes) - min(sizes) <= 1
    ref = per_row_reference(q, k, v, causal)[0]
    tree = fl.random_tree(P, random.Random(seed))
    assert (fl.finalize(fl.merge_tree(states, tree))[0] - ref).abs().max() < 1e-12


# ---------------------------------------------------------------------------------------------- 一层三种算法与显存
def test_memory_meter_counts_storages():
    with fl.MemoryMeter() as mm:
        a = torch.empty(1000)                                # 4000 字节
        b = a[:10]                                           # 视图：不另算
        b.add_(1)                                            # 原地：不另算
        c = torch.ones(250, dtype=torch.float64)             # 2000 字节
        assert mm.live == 6000
        del a, b
        assert mm.live == 2000                               # a 的存储随最后一个视图释放
        d = c * 2
        del c, d
    assert (mm.peak, mm.largest, mm.live) == (6000, 4000, 0)


@pytest.mark.parametrize("s,h,n,c", [(128, 32, 2, 32), (192, 16, 4, 24), (96, 24, 2, 16)])
def test_layer_modes_agree_and_largest_activation_matches_table1(s, h, n, c):
    layer = fl.TransformerLayer(h, n, seed=1, dtype=torch.float64)
    x = torch.randn(1, s, h, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
    res, grads = {}, {}
    for mode in fl.MODES:
        res[mode] = fl.measure_layer(layer, x, mode, block=c)
        grads[mode] = [p.grad.clone() for p in layer.parameters()]
    for mode in ("flash", "bpt"):
        assert (res[mode]["out"] - res["vanilla"]["out"]).abs().max() < 1e-10
        for g, r in zip(grads[mode], grads["vanilla"]):
            assert (g - r).abs().max() < 1e-9 * max(1.0, r.abs().max().item())
    for mode, r in res.items():
        assert r["fwd_largest"] == fl.activation_bytes(mode, s, h, n, c, elem_bytes=8)
        assert r["grads"] == 12 * h * h * 8
    assert res["vanilla"]["peak"] > res["flash"]["peak"] > res["bpt"]["peak"]


def test_memory_scaling_with_sequence_length():
    """s 翻倍：vanilla 存下的（kept）近似 ×4（P 占大头），flash 和 bpt 近似 ×2（只有 O(s) 的张量）。"""
    layer = fl.TransformerLayer(16, 4, seed=0)
    kept = {m: [] for m in fl.MODES}
    for s in (256, 512):
        x = torch.randn(1, s, 16)
        for mode in fl.MODES:
            kept[mode].append(fl.measure_layer(layer, x, mode, block=32)["kept"])
    ratio = {m: b / a for m, (a, b) in kept.items()}
    assert 3.5 < ratio["vanilla"] < 4.1
    assert 1.9 < ratio["flash"] < 2.1 and 1.9 < ratio["bpt"] < 2.1


@settings(deadline=None, max_examples=50)
@given(st.sampled_from(fl.KINDS), st.integers(1, 10**12), st.integers(1, 8192), st.integers(1, 64),
       st.integers(1, 64), st.integers(1, 4), st.sampled_from([2, 4]))
def test_max_seq_len_is_the_largest_fitting_length(kind, budget, h, n, devices, b, eb):
    devices = devices if kind == "ring" else 1
    s = fl.max_seq_len(kind, budget, h, n, b=b, elem_bytes=eb, devices=devices)

    def need(t):
        c = -(-t // devices) if kind == "ring" else 4096
        return fl.activation_bytes(kind, t, h, n, c, b, elem_bytes=eb)

    assert s == 0 or need(s) <= budget
    assert need(s + 1) > budget


def test_activation_bytes_is_table1():
    b, s, h, n, c = 2, 1000, 64, 8, 128
    assert fl.activation_bytes("vanilla", s, h, n, c, b) == 2 * b * n * s * s
    assert fl.activation_bytes("flash", s, h, n, c, b) == 8 * b * s * h
    assert fl.activation_bytes("flash", s, h, n, c, b, part="attn") == 2 * b * s * h + 4 * b * c * h
    assert fl.activation_bytes("bpt", s, h, n, c, b) == 2 * b * s * h
    assert fl.activation_bytes("ring", s, h, n, c, b) == 6 * b * c * h
    assert fl.activation_bytes("ring", s, h, n, c, b, part="ffn", elem_bytes=4) == 4 * b * c * h


# ---------------------------------------------------------------------------------------------- 坏输入
@pytest.mark.parametrize("call,exc,words", [
    (lambda: fl.block_state(torch.zeros(3, 4), torch.zeros(5, 2)), ValueError, "nk"),
    (lambda: fl.block_state(torch.zeros(3, 4), [[0.0]]), TypeError, "V"),
    (lambda: fl.block_state(torch.tensor([[math.nan]]), torch.zeros(1, 1)), ValueError, "NaN"),
    (lambda: fl.block_state(torch.tensor([[math.inf]]), torch.zeros(1, 1)), ValueError, "+∞"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), 0, 4), ValueError,
     "block_q"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), 4, -1), ValueError,
     "block_k"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), 2.5), TypeError,
     "block_q"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(5, 2), torch.zeros(4, 2)), ValueError, "Nk"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 3), torch.zeros(4, 2)), ValueError, "d"),
    (lambda: fl.blockwise_attention(torch.zeros(2, 4, 2), torch.zeros(3, 4, 2), torch.zeros(3, 4, 2)), ValueError,
     "前面的维度"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), causal="False"),
     TypeError, "causal"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.zeros(4, 2).double(), torch.zeros(4, 2)), TypeError,
     "dtype"),
    (lambda: fl.blockwise_attention(torch.zeros(4, 2), torch.full((4, 2), math.nan), torch.zeros(4, 2)), ValueError,
     "k"),
    (lambda: fl.merge_states((1, 2, 3), (1, 2, 3)), TypeError, "(m, l, o)"),
    (lambda: fl.merge_tree([fl.block_state(torch.zeros(1, 2), torch.zeros(2, 1))] * 2, (0, 0)), ValueError,
     "叶子"),
    (lambda: fl.chain_tree(0), ValueError, "chain_tree：n"),
    (lambda: fl.reverse_chain_tree(-1), ValueError, "reverse_chain_tree：n"),
    (lambda: fl.pair_tree(0), ValueError, "pair_tree：n"),
    (lambda: fl.random_tree(0, random.Random(0)), ValueError, "random_tree：n"),
    (lambda: fl.chain_tree(2.0), TypeError, "chain_tree：n"),
    (lambda: fl.activation_bytes("sparse", 8, 8, 2), ValueError, "'ring'"),
    (lambda: fl.max_seq_len("bpt", 1e9, 8, 2, devices=4), ValueError, "devices"),
    (lambda: fl.TransformerLayer(30, 4), ValueError, "n_heads"),
    (lambda: fl.TransformerLayer(8, 2)(torch.zeros(1, 4, 8), mode="ring"), ValueError, "mode"),
    (lambda: fl.kv_split_states(torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(4, 2), 5), ValueError, "P"),
])
def test_bad_inputs(call, exc, words):
    with pytest.raises(exc, match=None) as info:
        call()
    assert words in str(info.value)


@settings(deadline=None, max_examples=30)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_merge_tree_builders(n, seed):
    """
    四种合并树都能交给 merge_tree（它核对叶子恰好是 0 … n−1 各一次），合出来 = 整行注意力（float64）；
    链 n − 1 层，两两合并 ⌈log₂ n⌉ 层，随机树介于两者之间。
    """
    g = torch.Generator().manual_seed(seed)
    S, V = torch.randn(3, n, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
    parts = [fl.block_state(S[:, i:i + 1], V[i:i + 1]) for i in range(n)]     # 每个 key 一块
    ref = torch.softmax(S, -1) @ V
    trees = {"chain": fl.chain_tree(n), "reverse": fl.reverse_chain_tree(n), "pair": fl.pair_tree(n),
             "random": fl.random_tree(n, random.Random(seed))}
    for name, t in trees.items():
        assert (fl.finalize(fl.merge_tree(parts, t))[0] - ref).abs().max() < 1e-12, name
    assert fl.tree_depth(trees["chain"]) == fl.tree_depth(trees["reverse"]) == n - 1
    assert fl.tree_depth(trees["pair"]) == math.ceil(math.log2(n))
    assert fl.tree_depth(trees["pair"]) <= fl.tree_depth(trees["random"]) <= n - 1
