"""
坏输入：lecture18/flash_lab.py（torch）的每个公开入口，补 test_torch_bad_inputs.py 没有的用例。

重点是状态代数：merge_states / block_state / finalize / merge_tree 不悄悄广播（batch 1 对 batch 2），不收 NaN、+∞ 的
最大值、负的分母、整数状态、m = −∞ 却 l > 0 的"空状态"；(−∞, 0, 0) 是合法的空状态、合并的单位元（Hypothesis 检查
交换律、结合律、单位元）。另有：开关只收 True / False，个数、大小有上限（放不下时报出要多少），很深的合并树不爆栈。
整个文件在 2 核 CPU 上 < 30 s。
"""
import math
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, randn, check_case, params
from labload import load_lab

fl = load_lab("lecture18", "flash_lab")

SEED = 20261203
F64 = torch.float64
NAN, INF = math.nan, math.inf


def _r(*shape, dtype=F64, seed=SEED):
    return randn(*shape, dtype=dtype, seed=seed)


def _at(t, value, where=0):
    t = t.clone()
    t.view(-1)[where] = value
    return t


def _with(state, i, value):
    s = list(state)
    s[i] = value
    return tuple(s)


Q, K, V = _r(2, 5, 4, seed=1), _r(2, 7, 4, seed=2), _r(2, 7, 3, seed=3)
S2, V2 = _r(2, 3, 6, seed=4), _r(2, 6, 3, seed=5)
ST = fl.block_state(S2, V2)                                    # m [2, 3]、l [2, 3]、o [2, 3, 3]
ST1 = tuple(x[:1] for x in ST)                                 # batch 1
EMPTY = (torch.full((2, 3), -INF, dtype=F64), torch.zeros(2, 3, dtype=F64), torch.zeros(2, 3, 3, dtype=F64))
LAYER = fl.TransformerLayer(8, 2, dtype=F64)
XL = _r(1, 6, 8, seed=6)
O_, LSE_ = fl.blockwise_attention_fwd(Q, K, V)
dO = _r(2, 5, 3, seed=7)

ATTN = {
    "vanilla_attention": lambda **kw: fl.vanilla_attention(Q, K, V, **kw),
    "sdpa_attention": lambda **kw: fl.sdpa_attention(Q, K, V, **kw),
    "blockwise_attention": lambda **kw: fl.blockwise_attention(Q, K, V, 2, 3, **kw),
    "blockwise_attention_fwd": lambda **kw: fl.blockwise_attention_fwd(Q, K, V, 2, 3, **kw),
    "blockwise_attention_bwd": lambda **kw: fl.blockwise_attention_bwd(Q, K, V, O_, LSE_, dO, 2, 3, **kw),
    "flash_attention": lambda **kw: fl.flash_attention(Q, K, V, **kw),
    "kv_split_states": lambda **kw: fl.kv_split_states(Q, K, V, 2, **kw),
}

BAD = []
for fname, f in ATTN.items():
    for flag in ("False", None, 1.0, torch.tensor(True)):
        BAD.append((f"{fname} causal={flag!r}", lambda f=f, flag=flag: f(causal=flag), TypeError, "causal"))
    for sc, exc in ((True, TypeError), (-INF, ValueError), (torch.tensor(0.5), TypeError)):
        BAD.append((f"{fname} scale={sc!r}", lambda f=f, sc=sc: f(scale=sc), exc, "scale"))
BAD += [
    ("vanilla return_lse=None", lambda: fl.vanilla_attention(Q, K, V, return_lse=None), TypeError, "return_lse"),
    ("blockwise return_lse=0", lambda: fl.blockwise_attention(Q, K, V, return_lse=0), TypeError, "return_lse"),
    ("blockwise block_q=True", lambda: fl.blockwise_attention(Q, K, V, block_q=True), TypeError, "block_q"),
    ("blockwise block_k='8'", lambda: fl.blockwise_attention(Q, K, V, block_k="8"), TypeError, "block_k"),
    ("blockwise_bwd block_q=0", lambda: fl.blockwise_attention_bwd(Q, K, V, O_, LSE_, dO, 0), ValueError, "block_q"),
    ("flash block_k=0", lambda: fl.flash_attention(Q, K, V, block_k=0), ValueError, "block_k"),
    ("flash block_q=2.0", lambda: fl.flash_attention(Q, K, V, block_q=2.0), TypeError, "block_q"),
    ("sdpa q int", lambda: fl.sdpa_attention(Q.long(), K, V), TypeError, "q"),
    ("sdpa k bool", lambda: fl.sdpa_attention(Q, K > 0, V), TypeError, "k"),
    ("sdpa v 1-D", lambda: fl.sdpa_attention(Q, K, V[0, 0]), ValueError, "v"),
    ("vanilla q numpy", lambda: fl.vanilla_attention(Q.numpy(), K, V), TypeError, "q"),
    ("vanilla v -inf", lambda: fl.vanilla_attention(Q, K, _at(V, -INF)), ValueError, "v"),
    ("blockwise_bwd lse nan", lambda: fl.blockwise_attention_bwd(Q, K, V, O_, _at(LSE_, NAN), dO), ValueError, "lse"),
    ("blockwise_bwd O shape", lambda: fl.blockwise_attention_bwd(Q, K, V, O_[:, :4], LSE_, dO), ValueError, "O"),
    ("blockwise_bwd dO int", lambda: fl.blockwise_attention_bwd(Q, K, V, O_, LSE_, dO.long()), TypeError, "dO"),
    ("blockwise_bwd dlse list", lambda: fl.blockwise_attention_bwd(Q, K, V, O_, LSE_, dO, dlse=[0.0]), TypeError,
     "dlse"),
    ("kv_split P=True", lambda: fl.kv_split_states(Q, K, V, True), TypeError, "P"),
    ("kv_split P='2'", lambda: fl.kv_split_states(Q, K, V, "2"), TypeError, "P"),
    # ---- 状态代数 ----
    ("merge broadcast batch 1 vs 2", lambda: fl.merge_states(ST1, ST), ValueError, "形状"),
    ("merge broadcast batch 2 vs 1", lambda: fl.merge_states(ST, ST1), ValueError, "形状"),
    ("merge dv mismatch", lambda: fl.merge_states(ST, _with(ST, 2, ST[2][..., :2])), ValueError, "形状"),
    ("merge m nan", lambda: fl.merge_states(_with(ST, 0, _at(ST[0], NAN)), ST), ValueError, "的 m"),
    ("merge m +inf", lambda: fl.merge_states(ST, _with(ST, 0, _at(ST[0], INF))), ValueError, "的 m"),
    ("merge l negative", lambda: fl.merge_states(_with(ST, 1, _at(ST[1], -0.5)), ST), ValueError, "的 l"),
    ("merge l nan", lambda: fl.merge_states(ST, _with(ST, 1, _at(ST[1], NAN))), ValueError, "的 l"),
    ("merge l +inf", lambda: fl.merge_states(ST, _with(ST, 1, _at(ST[1], INF))), ValueError, "的 l"),
    ("merge o nan", lambda: fl.merge_states(_with(ST, 2, _at(ST[2], NAN)), ST), ValueError, "的 o"),
    ("merge o -inf", lambda: fl.merge_states(ST, _with(ST, 2, _at(ST[2], -INF))), ValueError, "的 o"),
    ("merge int m", lambda: fl.merge_states(_with(ST, 0, ST[0].long()), ST), TypeError, "的 m"),
    ("merge int l", lambda: fl.merge_states(ST, _with(ST, 1, ST[1].long())), TypeError, "的 l"),
    ("merge bool o", lambda: fl.merge_states(ST, _with(ST, 2, ST[2] > 0)), TypeError, "的 o"),
    ("merge m=-inf with l>0", lambda: fl.merge_states(_with(EMPTY, 1, torch.ones(2, 3, dtype=F64)), ST),
     ValueError, "的 l"),
    ("merge m=-inf with o!=0", lambda: fl.merge_states(ST, _with(EMPTY, 2, torch.ones(2, 3, 3, dtype=F64))),
     ValueError, "的 o"),
    ("merge list state", lambda: fl.merge_states(ST, [[1.0], [1.0], [[1.0]]]), TypeError, "状态"),
    ("merge o 0-D", lambda: fl.merge_states(*[(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(2.0))] * 2),
     ValueError, "状态"),
    ("finalize m nan", lambda: fl.finalize(_with(ST, 0, _at(ST[0], NAN))), ValueError, "的 m"),
    ("finalize l negative", lambda: fl.finalize(_with(ST, 1, -ST[1])), ValueError, "的 l"),
    ("finalize int state", lambda: fl.finalize(tuple(x.long() for x in ST)), TypeError, "的 m"),
    ("finalize m=-inf l>0", lambda: fl.finalize(_with(EMPTY, 1, torch.ones(2, 3, dtype=F64))), ValueError, "的 l"),
    ("merge_tree broadcast", lambda: fl.merge_tree([ST, ST1]), ValueError, "形状"),
    ("merge_tree m +inf", lambda: fl.merge_tree([ST, _with(ST, 0, _at(ST[0], INF))]), ValueError, "的 m"),
    ("merge_tree states not iterable", lambda: fl.merge_tree(5), TypeError, "states"),
    ("merge_tree tree list", lambda: fl.merge_tree([ST, ST], [0, 1]), TypeError, "tree"),
    ("merge_tree leaf bool", lambda: fl.merge_tree([ST, ST], (False, 1)), TypeError, "叶子"),
    ("block_state S int", lambda: fl.block_state(S2.long(), V2), TypeError, "S"),
    ("block_state dtype mix", lambda: fl.block_state(S2.float(), V2), TypeError, "dtype"),
    ("block_state S list", lambda: fl.block_state([[0.0]], V2), TypeError, "S"),
    ("block_state V 1-D", lambda: fl.block_state(S2, V2[0, 0]), ValueError, "V"),
    ("block_state V -inf", lambda: fl.block_state(S2, _at(V2, -INF)), ValueError, "V"),
    ("block_state lead mismatch", lambda: fl.block_state(S2, _r(3, 6, 3)), ValueError, "V"),
    # ---- 合并树、个数、大小 ----
    ("chain_tree too big", lambda: fl.chain_tree(10**12), ValueError, "n"),
    ("reverse_chain_tree too big", lambda: fl.reverse_chain_tree(10**12), ValueError, "n"),
    ("pair_tree too big", lambda: fl.pair_tree(10**12), ValueError, "n"),
    ("random_tree too big", lambda: fl.random_tree(10**12, random.Random(0)), ValueError, "n"),
    ("random_tree rng", lambda: fl.random_tree(4, 0), TypeError, "rng"),
    ("chain_tree True", lambda: fl.chain_tree(True), TypeError, "n"),
    ("tree_depth str", lambda: fl.tree_depth("((0, 1), 2)"), TypeError, "tree"),
    ("tree_depth 3-tuple", lambda: fl.tree_depth((0, 1, 2)), ValueError, "tree"),
    ("causal_mask too big", lambda: fl.causal_mask(10**6, 10**6), ValueError, "nq"),
    ("causal_mask nq=1.0", lambda: fl.causal_mask(1.0, 3), TypeError, "nq"),
    ("TransformerLayer too big", lambda: fl.TransformerLayer(10**6, 1), ValueError, "h"),
    ("TransformerLayer ffn too big", lambda: fl.TransformerLayer(1024, 1, ffn_mult=10**6), ValueError, "ffn_mult"),
    ("TransformerLayer dtype int", lambda: fl.TransformerLayer(8, 2, dtype=torch.int64), TypeError, "dtype"),
    ("TransformerLayer dtype str", lambda: fl.TransformerLayer(8, 2, dtype="float32"), TypeError, "dtype"),
    ("TransformerLayer seed too big", lambda: fl.TransformerLayer(8, 2, seed=2**70), ValueError, "seed"),
    ("TransformerLayer h str", lambda: fl.TransformerLayer("8", 2), TypeError, "h"),
    ("TransformerLayer n_heads=0", lambda: fl.TransformerLayer(8, 0), ValueError, "n_heads"),
    ("layer block=True", lambda: LAYER(XL, "flash", block=True), TypeError, "block"),
    ("layer causal=None", lambda: LAYER(XL, "bpt", causal=None), TypeError, "causal"),
    ("layer mode None", lambda: LAYER(XL, None), ValueError, "mode"),
    ("layer x list", lambda: LAYER([[1.0]], "flash"), TypeError, "x"),
    ("layer x s=0", lambda: LAYER(XL[:, :0], "vanilla"), ValueError, "x"),
    ("measure_layer mode", lambda: fl.measure_layer(LAYER, XL, "ring"), ValueError, "mode"),
    ("measure_layer block=0", lambda: fl.measure_layer(LAYER, XL, "bpt", block=0), ValueError, "block"),
    ("measure_layer causal str", lambda: fl.measure_layer(LAYER, XL, "flash", causal="no"), TypeError, "causal"),
    ("measure_layer x nan", lambda: fl.measure_layer(LAYER, _at(XL, NAN), "flash"), ValueError, "x"),
    ("activation_bytes b=0", lambda: fl.activation_bytes("flash", 8, 8, 1, b=0), ValueError, "b"),
    ("activation_bytes c str", lambda: fl.activation_bytes("ring", 8, 8, 1, c="4"), TypeError, "c"),
    ("activation_bytes s float", lambda: fl.activation_bytes("bpt", 8.0, 8, 1), TypeError, "s"),
    ("activation_bytes kind None", lambda: fl.activation_bytes(None, 8, 8, 1), ValueError, "kind"),
    ("max_seq_len h=0", lambda: fl.max_seq_len("flash", 1e9, 0, 1), ValueError, "h"),
    ("max_seq_len n_heads str", lambda: fl.max_seq_len("vanilla", 1e9, 8, "1"), TypeError, "n_heads"),
    ("max_seq_len budget str", lambda: fl.max_seq_len("bpt", "1e9", 8, 1), TypeError, "budget_bytes"),
    ("max_seq_len elem_bytes=0", lambda: fl.max_seq_len("bpt", 1e9, 8, 1, elem_bytes=0), ValueError, "elem_bytes"),
    ("max_seq_len devices=1.5", lambda: fl.max_seq_len("ring", 1e9, 8, 1, devices=1.5), TypeError, "devices"),
    ("triton_available q list", lambda: fl.triton_available([1.0]), TypeError, "q"),
]


@params([Case(*c) for c in BAD])
def test_bad_input_is_refused_naming_the_argument(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


def test_enough_cases():
    assert len(BAD) >= 100, len(BAD)


# ---------------------------------------------------------------------------------------------- 合法的边界输入
def test_accepted_edges_run():
    """空状态、整行 −∞ 的块、很深的合并树（几千个状态）、numpy 整数的块大小都照常算。"""
    O_ref = fl.vanilla_attention(Q, K, V, True)
    import numpy as np
    assert (fl.blockwise_attention(Q, K, V, np.int64(2), np.int32(3), np.bool_(True)) - O_ref).abs().max() < 1e-12
    out = fl.merge_states(EMPTY, ST)
    assert all(torch.equal(a, b) for a, b in zip(out, ST))
    O, lse = fl.finalize(EMPTY)
    assert (O == 0).all() and torch.isneginf(lse).all()
    mixed = fl.merge_states(ST, (ST[0].float(), ST[1].float(), ST[2]))    # 内核给 float32 的 lse：按 torch 的规则提升
    assert all(torch.allclose(a, b, rtol=1e-6) for a, b in zip(mixed, fl.merge_states(ST, ST)))
    n = 1500                                                   # 比 Python 的递归上限（1000）深
    cols = [(i * 6 // n, (i + 1) * 6 // n) for i in range(n)]
    states = [fl.block_state(S2[..., a:b], V2[..., a:b, :]) for a, b in cols]
    for tree in (None, fl.chain_tree(n), fl.reverse_chain_tree(n), fl.pair_tree(n)):
        got = fl.finalize(fl.merge_tree(states, tree))[0]
        assert (got - fl.finalize(ST)[0]).abs().max() < 1e-12
    assert fl.tree_depth(fl.chain_tree(n)) == n - 1 and fl.tree_depth(fl.pair_tree(n)) == math.ceil(math.log2(n))


# ---------------------------------------------------------------------------------------------- 状态代数的性质
@st.composite
def states(draw):
    """一个合法的局部状态：一块分数（可能整行被掩码，也可能是空块）的 block_state。"""
    n = draw(st.integers(0, 5))
    S = torch.tensor(draw(st.lists(st.floats(-30, 30), min_size=2 * 3 * n, max_size=2 * 3 * n)),
                     dtype=F64).reshape(2, 3, n)
    if n and draw(st.booleans()):
        S[draw(st.integers(0, 1)), draw(st.integers(0, 2))] = -INF
    Vb = torch.tensor(draw(st.lists(st.floats(-5, 5), min_size=2 * n * 3, max_size=2 * n * 3)),
                      dtype=F64).reshape(2, n, 3)
    return fl.block_state(S, Vb)


@settings(deadline=None, max_examples=60)
@given(states(), states(), states())
def test_merge_laws(a, b, c):
    """交换律逐位成立，结合律在舍入误差内，空状态是单位元（逐位）。"""
    ab = fl.merge_states(a, b)
    assert all(torch.equal(x, y) for x, y in zip(ab, fl.merge_states(b, a)))
    left, right = fl.merge_states(ab, c), fl.merge_states(a, fl.merge_states(b, c))
    assert torch.equal(left[0], right[0])
    for x, y in zip(left[1:], right[1:]):
        assert (x - y).abs().max() <= 1e-12 * max(1.0, y.abs().max().item())
    for s in (a, b):
        assert all(torch.equal(x, y) for x, y in zip(fl.merge_states(s, EMPTY), s))
        assert all(torch.equal(x, y) for x, y in zip(fl.merge_states(EMPTY, s), s))
