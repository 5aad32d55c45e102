"""
坏输入：lecture11/flash_lab.py（numpy）和 lecture11/flash_attn_compat.py 的每个公开入口。

每个坏输入必须抛 ValueError / TypeError，消息里写出调用者传的参数名（不能悄悄给出错的答案 / NaN，也不能在
numpy / torch 深处抛一个不提参数的错）；合法的边界输入（空状态、−∞ 的最大值、整数值的 numpy 整数……）必须照常算。
状态代数的性质（交换律、结合律、空状态是单位元）用 Hypothesis 检查。compat 的用例在 Triton 解释器里跑
（都在启动内核之前就报错）。整个文件在 2 核 CPU 上 < 30 s。
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, check_case, params
from labload import load_lab

fl = load_lab("lecture11", "flash_lab")

SEED = 20261202
RNG = np.random.default_rng(SEED)
Q, K, V = RNG.standard_normal((4, 3)), RNG.standard_normal((6, 3)), RNG.standard_normal((6, 2))
dO = RNG.standard_normal((4, 2))
O_, L_ = fl.naive_attention(Q, K, V)                  # 参考实现：学生树里 flash_fwd 是练习 11.3 的洞
P_ = fl.standard_attention(Q, K, V)[1]
X = RNG.standard_normal((3, 5))
ST = fl.partial_state(X, RNG.standard_normal((5, 2)))          # (m [3], l [3], o [3, 2])
EMPTY = (np.full(3, -np.inf), np.zeros(3), np.zeros((3, 2)))
OPS = fl.llama_1b_ops()
PT = dict(B=1, Hq=8, Hkv=2, S=1024, d=64, method="fd", splits=2, t=1e-5)
NAN, INF = math.nan, math.inf


def _with(state, i, value):
    s = list(state)
    s[i] = value
    return tuple(s)


def _at(arr, value, where=0):
    a = np.array(arr, dtype=np.float64)
    a.reshape(-1)[where] = value
    return a


ATTN = {                                     # 公开的注意力入口：统一用同一组 Q、K、V 调
    "naive_attention": lambda **kw: fl.naive_attention(Q, K, V, **kw),
    "standard_attention": lambda **kw: fl.standard_attention(Q, K, V, **kw),
    "flash_fwd fa2": lambda **kw: fl.flash_fwd(Q, K, V, 2, 3, **kw),
    "flash_fwd fa1": lambda **kw: fl.flash_fwd(Q, K, V, 2, 3, order="fa1", **kw),
    "flash_bwd": lambda **kw: fl.flash_bwd(Q, K, V, O_, dO, L_, 2, 3, **kw),
}

# (id, 调用, 异常类型, 消息里必须出现的文字：参数名)
BAD = []
for fname, f in ATTN.items():
    for flag in ("False", 1, None, 0.0, np.int64(1)):
        BAD.append((f"{fname} causal={flag!r}", lambda f=f, flag=flag: f(causal=flag), TypeError, "causal"))
    for sc, exc in ((NAN, ValueError), (INF, ValueError), ("0.5", ValueError), (True, ValueError)):
        BAD.append((f"{fname} scale={sc!r}", lambda f=f, sc=sc: f(scale=sc), exc, "scale"))
BAD += [
    # ---- Q、K、V 本身 ----
    ("naive Q str", lambda: fl.naive_attention(Q.astype(str), K, V), TypeError, "Q"),
    ("naive Q complex", lambda: fl.naive_attention(Q + 1j, K, V), TypeError, "Q"),
    ("naive K nan", lambda: fl.naive_attention(Q, _at(K, NAN), V), ValueError, "K"),
    ("naive V inf", lambda: fl.naive_attention(Q, K, _at(V, INF)), ValueError, "V"),
    ("naive Q 1-D", lambda: fl.naive_attention(Q[0], K, V), ValueError, "Q"),
    ("naive d mismatch", lambda: fl.naive_attention(Q, K[:, :2], V), ValueError, "d"),
    ("naive Nk mismatch", lambda: fl.naive_attention(Q, K, V[:5]), ValueError, "K"),
    ("naive empty Q", lambda: fl.naive_attention(Q[:0], K, V), ValueError, "Q"),
    ("standard Q object", lambda: fl.standard_attention(np.array([[None]]), K, V), TypeError, "Q"),
    ("flash_fwd Br=0", lambda: fl.flash_fwd(Q, K, V, 0, 2), ValueError, "Br"),
    ("flash_fwd Bc=2.0", lambda: fl.flash_fwd(Q, K, V, 2, 2.0), TypeError, "Bc"),
    ("flash_fwd Br=True", lambda: fl.flash_fwd(Q, K, V, True, 2), TypeError, "Br"),
    ("flash_fwd Bc='2'", lambda: fl.flash_fwd(Q, K, V, 2, "2"), TypeError, "Bc"),
    ("flash_fwd order='fa3'", lambda: fl.flash_fwd(Q, K, V, 2, 2, order="fa3"), ValueError, "order"),
    ("flash_fwd order=None", lambda: fl.flash_fwd(Q, K, V, 2, 2, order=None), ValueError, "order"),
    ("flash_fwd order='FA2'", lambda: fl.flash_fwd(Q, K, V, 2, 2, order="FA2"), ValueError, "order"),
    ("flash_bwd L +inf", lambda: fl.flash_bwd(Q, K, V, O_, dO, _at(L_, INF), 2, 2), ValueError, "L"),
    ("flash_bwd L nan", lambda: fl.flash_bwd(Q, K, V, O_, dO, _at(L_, NAN), 2, 2), ValueError, "L"),
    ("flash_bwd L shape", lambda: fl.flash_bwd(Q, K, V, O_, dO, L_[:3], 2, 2), ValueError, "L"),
    ("flash_bwd O shape", lambda: fl.flash_bwd(Q, K, V, O_[:3], dO, L_, 2, 2), ValueError, "O"),
    ("flash_bwd dO nan", lambda: fl.flash_bwd(Q, K, V, O_, _at(dO, NAN), L_, 2, 2), ValueError, "dO"),
    ("flash_bwd Bc=0", lambda: fl.flash_bwd(Q, K, V, O_, dO, L_, 2, 0), ValueError, "Bc"),
    ("standard_bwd P shape", lambda: fl.standard_attention_bwd(Q, K, V, P_[:, :5], dO), ValueError, "P"),
    ("standard_bwd P nan", lambda: fl.standard_attention_bwd(Q, K, V, _at(P_, NAN), dO), ValueError, "P"),
    ("standard_bwd dO shape", lambda: fl.standard_attention_bwd(Q, K, V, P_, dO[:, :1]), ValueError, "dO"),
    ("standard_bwd scale str", lambda: fl.standard_attention_bwd(Q, K, V, P_, dO, scale="1"), ValueError, "scale"),
    ("reference_lse causal='no'", lambda: fl.reference_lse(Q, K, causal="no"), TypeError, "causal"),
    ("reference_lse K nan", lambda: fl.reference_lse(Q, _at(K, NAN)), ValueError, "K"),
    ("reference_lse Q 3-D", lambda: fl.reference_lse(Q[None], K), ValueError, "Q"),
    # ---- softmax 与局部状态 ----
    ("softmax_3pass scalar", lambda: fl.softmax_3pass(1.0), ValueError, "x"),
    ("softmax_3pass nan", lambda: fl.softmax_3pass(_at(X, NAN)), ValueError, "x"),
    ("softmax_3pass str", lambda: fl.softmax_3pass(["1", "2"]), TypeError, "x"),
    ("softmax_online scalar", lambda: fl.softmax_online(np.float64(2.0)), ValueError, "x"),
    ("softmax_online +inf", lambda: fl.softmax_online(_at(X, INF)), ValueError, "x"),
    ("softmax_online block=0", lambda: fl.softmax_online(X, block=0), ValueError, "block"),
    ("softmax_online block=1.5", lambda: fl.softmax_online(X, block=1.5), TypeError, "block"),
    ("softmax_online block=True", lambda: fl.softmax_online(X, block=True), TypeError, "block"),
    ("partial_state scalar", lambda: fl.partial_state(3.0), ValueError, "x"),
    ("partial_state nan x", lambda: fl.partial_state(_at(X, NAN)), ValueError, "x"),
    ("partial_state v rows", lambda: fl.partial_state(X, np.ones((4, 2))), ValueError, "v"),
    ("partial_state v 1-D", lambda: fl.partial_state(X, np.ones(5)), ValueError, "v"),
    ("partial_state v inf", lambda: fl.partial_state(X, _at(np.ones((5, 2)), INF)), ValueError, "v"),
    # ---- merge_states：状态代数 ----
    ("merge not a triple", lambda: fl.merge_states(ST[:2], ST), ValueError, "merge_states：a"),
    ("merge b not a triple", lambda: fl.merge_states(ST, 3.0), TypeError, "merge_states：b"),
    ("merge o None vs array", lambda: fl.merge_states(ST, _with(ST, 2, None)), ValueError, "的 o"),
    ("merge shape broadcast", lambda: fl.merge_states(ST, tuple(x[:1] for x in ST)), ValueError, "形状"),
    ("merge o dv mismatch", lambda: fl.merge_states(ST, _with(ST, 2, np.zeros((3, 3)))), ValueError, "形状"),
    ("merge m nan", lambda: fl.merge_states(_with(ST, 0, _at(ST[0], NAN)), ST), ValueError, "a 的 m"),
    ("merge m +inf", lambda: fl.merge_states(ST, _with(ST, 0, _at(ST[0], INF))), ValueError, "b 的 m"),
    ("merge l negative", lambda: fl.merge_states(_with(ST, 1, _at(ST[1], -1.0)), ST), ValueError, "a 的 l"),
    ("merge l nan", lambda: fl.merge_states(ST, _with(ST, 1, _at(ST[1], NAN))), ValueError, "b 的 l"),
    ("merge l +inf", lambda: fl.merge_states(ST, _with(ST, 1, _at(ST[1], INF))), ValueError, "b 的 l"),
    ("merge o nan", lambda: fl.merge_states(_with(ST, 2, _at(ST[2], NAN)), ST), ValueError, "a 的 o"),
    ("merge o inf", lambda: fl.merge_states(ST, _with(ST, 2, _at(ST[2], -INF))), ValueError, "b 的 o"),
    ("merge m numeric strings", lambda: fl.merge_states(_with(ST, 0, ST[0].astype(str)), ST), TypeError, "a 的 m"),
    ("merge l numeric strings", lambda: fl.merge_states(ST, _with(ST, 1, ["1", "2", "3"])), TypeError, "b 的 l"),
    ("merge o strings", lambda: fl.merge_states(ST, _with(ST, 2, ST[2].astype(str))), TypeError, "b 的 o"),
    ("merge m bool", lambda: fl.merge_states(_with(ST, 0, np.ones(3, bool)), ST), TypeError, "a 的 m"),
    ("merge m complex", lambda: fl.merge_states(_with(ST, 0, ST[0] + 0j), ST), TypeError, "a 的 m"),
    ("merge m=-inf with l>0", lambda: fl.merge_states(_with(EMPTY, 1, np.ones(3)), ST), ValueError, "l"),
    ("merge m=-inf with o!=0", lambda: fl.merge_states(ST, _with(EMPTY, 2, np.ones((3, 2)))), ValueError, "o"),
    # ---- 块、计数、公式 ----
    ("block_sizes M=0", lambda: fl.block_sizes(0, 8), ValueError, "M"),
    ("block_sizes d=2.5", lambda: fl.block_sizes(100, 2.5), TypeError, "d"),
    ("block_sizes M str", lambda: fl.block_sizes("100", 8), TypeError, "M"),
    ("live_tiles N=0", lambda: fl.live_tiles(0, 4, 2, 2), ValueError, "N"),
    ("live_tiles causal='yes'", lambda: fl.live_tiles(4, 4, 2, 2, causal="yes"), TypeError, "causal"),
    ("live_tiles too big", lambda: fl.live_tiles(10**7, 10**7, 64, 64), ValueError, "N"),
    ("fa_io_formula order", lambda: fl.fa_io_formula(8, 4, 64, "fa9"), ValueError, "order"),
    ("fa_io_formula causal=1", lambda: fl.fa_io_formula(8, 4, 64, causal=1), TypeError, "causal"),
    ("fa_io_formula Br only", lambda: fl.fa_io_formula(8, 4, 64, Br=2), ValueError, "Br"),
    ("fa_io_formula Nk=0", lambda: fl.fa_io_formula(8, 4, 64, Nk=0), ValueError, "Nk"),
    ("fa_io_formula dv=1.5", lambda: fl.fa_io_formula(8, 4, 64, dv=1.5), TypeError, "dv"),
    ("fa_io_formula M=None", lambda: fl.fa_io_formula(8, 4, None), TypeError, "M"),
    ("fa_io_formula causal too big", lambda: fl.fa_io_formula(10**7, 4, None, Nk=10**7, Br=1, Bc=1, causal=True),
     ValueError, "N"),
    ("attention_flops causal='False'", lambda: fl.attention_flops(1, 1, 8, 4, "False"), TypeError, "causal"),
    ("attention_flops causal=0", lambda: fl.attention_flops(1, 1, 8, 4, 0), TypeError, "causal"),
    ("attention_flops batch=0", lambda: fl.attention_flops(0, 1, 8, 4, False), ValueError, "batch"),
    ("attention_flops heads str", lambda: fl.attention_flops(1, "2", 8, 4, False), TypeError, "heads"),
    ("attention_flops n=-8", lambda: fl.attention_flops(1, 1, -8, 4, False), ValueError, "n"),
    ("attention_flops d=4.5", lambda: fl.attention_flops(1, 1, 8, 4.5, False), TypeError, "d"),
    ("attention_flops mode", lambda: fl.attention_flops(1, 1, 8, 4, False, mode="both"), ValueError, "mode"),
    # ---- flash-decoding ----
    ("split_kv n_splits=0", lambda: fl.split_kv_decode(Q, K, V, 0), ValueError, "n_splits"),
    ("split_kv n_splits=1.0", lambda: fl.split_kv_decode(Q, K, V, 1.0), TypeError, "n_splits"),
    ("split_kv scale nan", lambda: fl.split_kv_decode(Q, K, V, 2, scale=NAN), ValueError, "scale"),
    ("split_kv q nan", lambda: fl.split_kv_decode(_at(Q, NAN), K, V, 2), ValueError, "q"),
    ("split_kv V rows", lambda: fl.split_kv_decode(Q, K, V[:5], 2), ValueError, "V"),
    ("decode B=0", lambda: fl.decode_attention_time(0, 8, 2, 100, 64, "fd"), ValueError, "B"),
    ("decode Hq%Hkv", lambda: fl.decode_attention_time(1, 8, 3, 100, 64, "fd"), ValueError, "Hq"),
    ("decode method", lambda: fl.decode_attention_time(1, 8, 2, 100, 64, "fa3"), ValueError, "method"),
    ("decode gpu str", lambda: fl.decode_attention_time(1, 8, 2, 100, 64, "fd", "H100"), TypeError, "gpu"),
    ("decode splits=0", lambda: fl.decode_attention_time(1, 8, 2, 100, 64, "fd", splits=0), ValueError, "splits"),
    ("decode block_m=0", lambda: fl.decode_attention_time(1, 8, 2, 100, 64, "fd", block_m=0), ValueError, "block_m"),
    ("decode elem=0.5", lambda: fl.decode_attention_time(1, 8, 2, 100, 64, "fd", elem=0.5), TypeError, "elem"),
    ("decode S str", lambda: fl.decode_attention_time(1, 8, 2, "100", 64, "fd"), TypeError, "S"),
    ("best_splits candidates int", lambda: fl.best_splits(1, 8, 2, 100, 64, candidates=4), TypeError, "candidates"),
    ("best_splits candidate 0", lambda: fl.best_splits(1, 8, 2, 100, 64, candidates=(0, 2)), ValueError,
     "candidates"),
    ("best_splits gpu", lambda: fl.best_splits(1, 8, 2, 100, 64, gpu=None), TypeError, "gpu"),
    ("best_splits Hq str", lambda: fl.best_splits(1, "8", 2, 100, 64), TypeError, "Hq"),
    ("DecodeGPU n_sm=0", lambda: fl.DecodeGPU("x", 0, 1e12, 1e12), ValueError, "n_sm"),
    ("DecodeGPU hbm=-1", lambda: fl.DecodeGPU("x", 10, 1e12, -1.0), ValueError, "hbm"),
    ("DecodeGPU tc_eff=2", lambda: fl.DecodeGPU("x", 10, 1e12, 1e12, tc_eff=2.0), ValueError, "tc_eff"),
    ("DecodeGPU launch nan", lambda: fl.DecodeGPU("x", 10, 1e12, 1e12, launch=NAN), ValueError, "launch"),
    ("DecodeGPU tc_flops str", lambda: fl.DecodeGPU("x", 10, "1e12", 1e12), TypeError, "tc_flops"),
    ("fit_decode_gpu empty", lambda: fl.fit_decode_gpu([]), ValueError, "points"),
    ("fit_decode_gpu point not dict", lambda: fl.fit_decode_gpu([3]), TypeError, "points"),
    ("fit_decode_gpu missing key", lambda: fl.fit_decode_gpu([{k: v for k, v in PT.items() if k != "B"}]),
     ValueError, "B"),
    ("fit_decode_gpu t<=0", lambda: fl.fit_decode_gpu([dict(PT, t=0.0)]), ValueError, "t"),
    ("fit_decode_gpu caps<0", lambda: fl.fit_decode_gpu([PT], caps=[-1.0]), ValueError, "caps"),
    ("fit_decode_gpu launches empty", lambda: fl.fit_decode_gpu([PT], launches=[]), ValueError, "launches"),
    ("fit_decode_gpu gpu", lambda: fl.fit_decode_gpu([PT], gpu="H200"), TypeError, "gpu"),
    # ---- megakernel 时间线 ----
    ("llama_1b_ops context=0", lambda: fl.llama_1b_ops(0), ValueError, "context"),
    ("llama_1b_ops rows_per_cta=0", lambda: fl.llama_1b_ops(rows_per_cta=0), ValueError, "rows_per_cta"),
    ("llama_1b_ops kernels=7", lambda: fl.llama_1b_ops(kernels=7), ValueError, "kernels"),
    ("llama_1b_expected_bytes context str", lambda: fl.llama_1b_expected_bytes("160"), TypeError, "context"),
    ("Op ctas=-1", lambda: fl.Op("x", 10, -1), ValueError, "ctas"),
    ("Op bytes nan", lambda: fl.Op("x", NAN, 1), ValueError, "bytes"),
    ("Op bytes<0", lambda: fl.Op("x", -5.0, 1), ValueError, "bytes"),
    ("Op ctas=1.5", lambda: fl.Op("x", 5.0, 1.5), TypeError, "ctas"),
    ("TimelineParams n_sm=0", lambda: fl.TimelineParams(n_sm=0), ValueError, "n_sm"),
    ("TimelineParams eff=0", lambda: fl.TimelineParams(eff=0.0), ValueError, "eff"),
    ("TimelineParams launch<0", lambda: fl.TimelineParams(launch=-1e-6), ValueError, "launch"),
    ("TimelineParams hbm str", lambda: fl.TimelineParams(hbm="4.8e12"), TypeError, "hbm"),
    ("timeline mode", lambda: fl.timeline(OPS, "graph"), ValueError, "mode"),
    ("timeline p", lambda: fl.timeline(OPS, "kernels", p={}), TypeError, "p"),
    ("timeline ops empty", lambda: fl.timeline([], "kernels"), ValueError, "ops"),
    ("timeline ops int", lambda: fl.timeline(5, "kernels"), TypeError, "ops"),
    ("timeline ops of str", lambda: fl.timeline(["rmsnorm"], "kernels"), ValueError, "ops"),
    ("pad_ops fewer", lambda: fl.pad_ops(OPS, 3), ValueError, "n_kernels"),
    ("pad_ops n_kernels str", lambda: fl.pad_ops(OPS, "700"), TypeError, "n_kernels"),
    ("pad_ops too many", lambda: fl.pad_ops(OPS, 10**12), ValueError, "n_kernels"),
    ("pad_ops ops of str", lambda: fl.pad_ops(["a"], 3), ValueError, "ops"),
    ("fit_timeline param", lambda: fl.fit_timeline([(OPS, 1e-3)], fl.TimelineParams(), "sync"), ValueError,
     "param"),
    ("fit_timeline p", lambda: fl.fit_timeline([(OPS, 1e-3)], None, "small"), TypeError, "p"),
    ("fit_timeline empty", lambda: fl.fit_timeline([], fl.TimelineParams(), "small"), ValueError, "points"),
    ("fit_timeline t<0", lambda: fl.fit_timeline([(OPS, -1.0)], fl.TimelineParams(), "small"), ValueError, "实测"),
    ("fit_timeline point not pair", lambda: fl.fit_timeline([OPS], fl.TimelineParams(), "small"), ValueError,
     "points"),
    ("fit_timeline grid empty", lambda: fl.fit_timeline([(OPS, 1e-3)], fl.TimelineParams(), "small", grid=[]),
     ValueError, "grid"),
    ("fit_timeline grid negative", lambda: fl.fit_timeline([(OPS, 1e-3)], fl.TimelineParams(), "small",
                                                           grid=[-1.0, 1e-6]), ValueError, "grid"),
]


@params([Case(*c) for c in BAD])
def test_bad_input_is_refused_naming_the_argument(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


def test_enough_cases():
    assert len(BAD) >= 100, len(BAD)


# ---------------------------------------------------------------------------------------------- 合法的边界输入
def test_accepted_edges_run():
    """检查不能把合法输入也拒掉：numpy 整数、整数数组、空状态、(−∞, 0) 的分母状态、n_splits 远大于 key 数。"""
    O_ref = fl.naive_attention(Q, K, V)[0]
    assert np.abs(fl.flash_fwd(Q, K, V, np.int64(2), np.int32(3), np.bool_(False))[0] - O_ref).max() < 1e-12
    assert np.abs(fl.split_kv_decode(Q, K, V, 10**15)[0] - O_ref).max() < 1e-12     # 多出来的段是空的
    Qi = np.rint(Q * 3).astype(np.int64)
    assert np.abs(fl.standard_attention(Qi, K, V)[0] - fl.naive_attention(Qi.astype(float), K, V)[0]).max() < 1e-12
    m, l, o = fl.merge_states(EMPTY, ST)
    assert np.array_equal(m, ST[0]) and np.array_equal(l, ST[1]) and np.array_equal(o, ST[2])
    m, l, _ = fl.merge_states((np.full(2, -np.inf), np.zeros(2), None), (np.array([1, 2]), np.array([1, 1]), None))
    assert np.array_equal(m, [1.0, 2.0]) and np.array_equal(l, [1.0, 1.0])       # 整数的 (m, l) 照常合并
    assert fl.merge_states((-np.inf, 0.0, None), (0.5, 2.0, None))[:2] == (0.5, 2.0)
    assert fl.attention_flops(np.int64(2), 3, 8, 4, np.True_) == 4.0 * 2 * 3 * 64 * 4 / 2
    assert fl.live_tiles(4, 4, 2, 2).shape == (2, 2)
    assert len(fl.pad_ops(OPS, len(OPS) + 2)) == len(OPS) + 2


# ---------------------------------------------------------------------------------------------- 状态代数的性质
@st.composite
def states(draw, rows=3, dv=2):
    """一个合法的局部状态：某一段分数（可能整段被掩码 = 空状态）的 partial_state。"""
    n = draw(st.integers(0, 6))
    x = np.array(draw(st.lists(st.floats(-30, 30), min_size=rows * n, max_size=rows * n))).reshape(rows, n)
    if n and draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = -np.inf                  # 一整行被掩码
    v = np.array(draw(st.lists(st.floats(-5, 5), min_size=n * dv, max_size=n * dv))).reshape(n, dv)
    return fl.partial_state(x, v)


def _close(a, b):
    assert np.array_equal(a[0], b[0])
    for x, y in zip(a[1:], b[1:]):
        assert np.abs(x - y).max() <= 1e-12 * max(1.0, np.abs(y).max())


@settings(deadline=None, max_examples=60)
@given(states(), states(), states())
def test_merge_laws(a, b, c):
    """交换律逐位成立，结合律在舍入误差内成立，空状态 (−∞, 0, 0) 是单位元（逐位）。"""
    ab = fl.merge_states(a, b)
    assert all(np.array_equal(x, y) for x, y in zip(ab, fl.merge_states(b, a)))
    _close(fl.merge_states(ab, c), fl.merge_states(a, fl.merge_states(b, c)))
    for s in (a, b):
        assert all(np.array_equal(x, y) for x, y in zip(fl.merge_states(s, EMPTY), s))
        assert all(np.array_equal(x, y) for x, y in zip(fl.merge_states(EMPTY, s), s))


# ---------------------------------------------------------------------------------------------- compat
def _compat_cases():
    """flash_attn_compat 的坏输入（Triton 解释器、fp32 小张量；都在启动内核之前报错）。没有 triton 时为空。"""
    try:
        import torch
        from triton_interp import load_triton_flash
        load_triton_flash()
        fac = load_lab("lecture11", "flash_attn_compat")
    except (ImportError, pytest.skip.Exception):
        return []
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(2, 5, 2, 8, generator=g) for _ in range(3))
    kv, qkv = torch.stack([k, v], 2), torch.stack([q, k, v], 2)          # [B, N, 2, H, d]、[B, N, 3, H, d]
    qp, kp, vp = (t.reshape(10, 2, 8) for t in (q, k, v))
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    kvp, qkvp = torch.stack([kp, vp], 1), torch.stack([qp, kp, vp], 1)
    q1 = torch.randn(2, 3, 2, 8, generator=g)
    kc, vc = torch.randn(2, 9, 2, 8, generator=g), torch.randn(2, 9, 2, 8, generator=g)
    lens = torch.tensor([4, 9], dtype=torch.int32)
    f, kvc = fac.flash_attn_func, fac.flash_attn_with_kvcache
    return [
        ("compat causal='False'", lambda: f(q, k, v, causal="False"), TypeError, "causal"),
        ("compat causal=1", lambda: f(q, k, v, causal=1), TypeError, "causal"),
        ("compat return_attn_probs='no'", lambda: f(q, k, v, return_attn_probs="no"), TypeError, "return_attn_probs"),
        ("compat deterministic='no'", lambda: f(q, k, v, deterministic="no"), TypeError, "deterministic"),
        ("compat dropout_p=1.5", lambda: f(q, k, v, dropout_p=1.5), ValueError, "dropout_p"),
        ("compat dropout_p str", lambda: f(q, k, v, dropout_p="0"), ValueError, "dropout_p"),
        ("compat softmax_scale nan", lambda: f(q, k, v, softmax_scale=NAN), ValueError, "softmax_scale"),
        ("compat softcap str", lambda: f(q, k, v, softcap="1"), ValueError, "softcap"),
        ("compat softcap nan", lambda: f(q, k, v, softcap=NAN), ValueError, "softcap"),
        ("compat softcap True", lambda: f(q, k, v, softcap=True), ValueError, "softcap"),
        ("compat window 1 elem", lambda: f(q, k, v, window_size=(1,)), ValueError, "window_size"),
        ("compat window tensor 3", lambda: f(q, k, v, window_size=torch.tensor([1, 2, 3])), ValueError,
         "window_size"),
        ("compat window float tensor", lambda: f(q, k, v, window_size=torch.tensor([1.5, 0.0])), ValueError,
         "window_size"),
        ("compat window str", lambda: f(q, k, v, window_size="ab"), ValueError, "window_size"),
        ("compat q int", lambda: f(q.long(), k, v), TypeError, "q"),
        ("compat q 3-D", lambda: f(q[0], k, v), ValueError, "q"),
        ("compat k list", lambda: f(q, [1.0], v), TypeError, "k"),
        ("compat kvpacked 4-D kv", lambda: fac.flash_attn_kvpacked_func(q, k), ValueError, "kv"),
        ("compat kvpacked kv[...,3,...]", lambda: fac.flash_attn_kvpacked_func(q, qkv), ValueError, "kv"),
        ("compat kvpacked kv list", lambda: fac.flash_attn_kvpacked_func(q, [k, v]), TypeError, "kv"),
        ("compat qkvpacked 2 parts", lambda: fac.flash_attn_qkvpacked_func(kv), ValueError, "qkv"),
        ("compat qkvpacked None", lambda: fac.flash_attn_qkvpacked_func(None), TypeError, "qkv"),
        ("compat varlen causal str", lambda: fac.flash_attn_varlen_func(qp, kp, vp, cu, cu, 5, 5, causal="no"),
         TypeError, "causal"),
        ("compat varlen max_seqlen_q str", lambda: fac.flash_attn_varlen_func(qp, kp, vp, cu, cu, "5", 5),
         TypeError, "max_seqlen_q"),
        ("compat varlen cu float", lambda: fac.flash_attn_varlen_func(qp, kp, vp, cu.float(), cu, 5, 5),
         TypeError, "cu_seqlens_q"),
        ("compat varlen_kvpacked kv 3-D", lambda: fac.flash_attn_varlen_kvpacked_func(qp, kp, cu, cu, 5, 5),
         ValueError, "kv"),
        ("compat varlen_qkvpacked qkv 3-D", lambda: fac.flash_attn_varlen_qkvpacked_func(qp, cu, 5), ValueError,
         "qkv"),
        ("compat varlen_qkvpacked qkv 2 parts", lambda: fac.flash_attn_varlen_qkvpacked_func(kvp, cu, 5),
         ValueError, "qkv"),
        ("compat varlen return_attn_probs=1", lambda: fac.flash_attn_varlen_qkvpacked_func(
            qkvp, cu, 5, return_attn_probs=1), TypeError, "return_attn_probs"),
        ("compat kvcache cache_seqlens=True", lambda: kvc(q1, kc, vc, cache_seqlens=True), TypeError,
         "cache_seqlens"),
        ("compat kvcache cache_seqlens=2.5", lambda: kvc(q1, kc, vc, cache_seqlens=2.5), TypeError, "cache_seqlens"),
        ("compat kvcache cache_seqlens=-1", lambda: kvc(q1, kc, vc, cache_seqlens=-1), ValueError, "cache_seqlens"),
        ("compat kvcache cache_seqlens>S", lambda: kvc(q1, kc, vc, cache_seqlens=10), ValueError, "cache_seqlens"),
        ("compat kvcache causal='no'", lambda: kvc(q1, kc, vc, cache_seqlens=lens, causal="no"), TypeError, "causal"),
        ("compat kvcache causal=0", lambda: kvc(q1, kc, vc, cache_seqlens=lens, causal=0), TypeError, "causal"),
        ("compat kvcache num_splits=-1", lambda: kvc(q1, kc, vc, cache_seqlens=lens, num_splits=-1), ValueError,
         "num_splits"),
        ("compat kvcache num_splits str", lambda: kvc(q1, kc, vc, cache_seqlens=lens, num_splits="2"), TypeError,
         "num_splits"),
        ("compat kvcache num_splits=False", lambda: kvc(q1, kc, vc, cache_seqlens=lens, num_splits=False),
         TypeError, "num_splits"),
        ("compat kvcache return_softmax_lse='no'", lambda: kvc(q1, kc, vc, cache_seqlens=lens,
                                                                return_softmax_lse="no"),
         TypeError, "return_softmax_lse"),
        ("compat kvcache rotary_interleaved='no'", lambda: kvc(q1, kc, vc, cache_seqlens=lens,
                                                                rotary_interleaved="no"),
         TypeError, "rotary_interleaved"),
        ("compat kvcache softcap str", lambda: kvc(q1, kc, vc, cache_seqlens=lens, softcap="0"), TypeError,
         "softcap"),
        ("compat kvcache softmax_scale inf", lambda: kvc(q1, kc, vc, cache_seqlens=lens, softmax_scale=INF),
         ValueError, "softmax_scale"),
        ("compat kvcache q int", lambda: kvc(q1.long(), kc, vc, cache_seqlens=lens), TypeError, "q"),
        ("compat kvcache lens shape", lambda: kvc(q1, kc, vc, cache_seqlens=lens[:1]), ValueError,
         "cache_seqlens"),
        ("compat unsupported tag", lambda: fac.unsupported("no-such", "x"), ValueError, "标签"),
    ]


COMPAT = _compat_cases()


@pytest.mark.skipif(not COMPAT, reason="没有 triton")
@pytest.mark.usefixtures("triton_interpret")
@params([Case(*c) for c in COMPAT])
def test_compat_bad_input_is_refused_naming_the_argument(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）
