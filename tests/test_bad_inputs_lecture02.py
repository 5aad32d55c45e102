"""第 2 讲 transformer_lab 的坏输入：每个公开入口、每种坏值（dtype、形状、NaN/inf、0 与负数、放不下的大小、
bool / 字符串当数字、拼错的选项和字段名）。

每个用例断言异常类型和消息里的参数名；合法的边界输入（整数数组、numpy 整数、float32、Generator 种子……）
对照独立算出的值。放不下的大小在分配之前就被拒绝（用例里是远超任何机器内存的形状）。
"""
import random

import numpy as np
import pytest
from bad_input_cases import Case, cases_for, check_case, params
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

TL = load_lab("lecture02", "transformer_lab")
LM = load_lab("lecture01", "llm_math")

NAN, INF = float("nan"), float("inf")
CFG = TL.Config(vocab=50, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_head=4, d_ff=24, max_seq=16)
P = TL.init_params(CFG, seed=1)
TOK = np.array([[1, 2, 3]])
ROWS = TL.analytic_ops(CFG, 1, 3)
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 16))
W = RNG.standard_normal((16, 8))
Q = RNG.standard_normal((1, 3, 4, 4))
KV = RNG.standard_normal((1, 3, 2, 4))
COS, SIN = TL.rope_angles(np.arange(3), 4)


def _big(shape):
    """一个不占内存的大数组（步长为 0 的视图）：用来测"放不下"的分支，而不真的分配。"""
    return np.broadcast_to(np.zeros(1), shape)


def _cfg(**kw):
    return TL.config_like(CFG, **kw)


def _int_bad():
    return [(True, TypeError), ("3", TypeError), (None, TypeError), (2.5, TypeError), (2.0, TypeError),
            (NAN, TypeError), (-1, ValueError), (0, ValueError)]


def _bad_params(**changes):
    p = {**P, "layers": [dict(lp) for lp in P["layers"]]}
    for k, v in changes.items():
        if k.startswith("layer0_"):
            p["layers"][0][k[len("layer0_"):]] = v
        else:
            p[k] = v
    return p


FLAG_BAD = [("False", TypeError), (1, TypeError), (None, TypeError)]
CASES = []
# ---- Config / config_like -------------------------------------------------------------------------------
for _f in TL._INT_FIELDS:
    CASES += cases_for(f"Config-{_f}", lambda v, f=_f: TL.Config(**{f: v}), _f, _int_bad())
CASES += cases_for("Config", lambda v: TL.Config(rope_theta=v), "rope_theta",
                    [(1.0, ValueError), (0, ValueError), (NAN, ValueError), ("1e4", TypeError), (True, TypeError)])
CASES += cases_for("Config", lambda v: TL.Config(norm_eps=v), "norm_eps",
                    [(0.0, ValueError), (-1e-5, ValueError), (NAN, ValueError), ("1e-5", TypeError)])
CASES += cases_for("Config", lambda v: TL.Config(tied=v), "tied", FLAG_BAD)
CASES += cases_for("Config", lambda v: TL.Config(name=v), "name", [(None, TypeError), (5, TypeError)])
CASES += [
    Case("Config-heads-not-divisible", lambda: TL.Config(n_heads=8, n_kv_heads=3), ValueError, "n_kv_heads"),
    Case("Config-d_head-odd", lambda: TL.Config(d_head=15), ValueError, "d_head"),
    Case("config_like-cfg=None", lambda: TL.config_like(None, n_layers=2), TypeError, "cfg"),
    Case("config_like-typo", lambda: TL.config_like(CFG, n_layer=2), TypeError, "n_layer"),
    Case("config_like-bad-value", lambda: TL.config_like(CFG, d_model=0), ValueError, "d_model"),
]
# ---- init_params 与参数字典 ----------------------------------------------------------------------------
CASES += cases_for("init_params", lambda v: TL.init_params(CFG, seed=v), "seed",
                    [("x", TypeError), (-1, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError),
                     (random.Random(0), TypeError), (np.random.RandomState(0), TypeError)])
CASES += cases_for("init_params", lambda v: TL.init_params(CFG, dtype=v), "dtype",
                    [("float17", TypeError), (np.int32, TypeError), (None, TypeError), (complex, TypeError),
                     ("U4", TypeError), (bool, TypeError)])
CASES += cases_for("init_params", lambda v: TL.init_params(CFG, logit_std=v), "logit_std",
                    [(0.0, ValueError), (NAN, ValueError), ("2", TypeError)])
CASES += cases_for("init_params", TL.init_params, "cfg",
                    [(None, TypeError), (LM.LLAMA32_1B, TypeError),
                     (TL.Config(vocab=10 ** 7, d_model=10 ** 5, n_heads=1, n_kv_heads=1, d_head=2), ValueError),
                     (TL.Config(n_layers=10 ** 6, d_model=4096, d_ff=10 ** 5), ValueError)])
for _fn in (TL.lm_head_matrix, TL.count_params, TL.param_groups):
    CASES += cases_for(_fn.__name__, _fn, "params", [(None, TypeError), ([], TypeError), ({"embed": 1}, TypeError)])
# ---- 账本 ----------------------------------------------------------------------------------------------
CASES += cases_for("Counter", TL.Counter, "bytes_per_elem", [(0, ValueError), (NAN, ValueError), ("2", TypeError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add("q_proj", flops=v), "flops",
                    [(-1, ValueError), (2.5, TypeError), (NAN, TypeError), ("3", TypeError), (True, TypeError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add("q_proj", flops=10, useful=v), "useful",
                    [(11, ValueError), (-1, ValueError), (1.5, TypeError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add("x", w_elems=v), "w_elems", [(-3, ValueError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add("x", kv_elems=v), "kv_elems", [(0.5, TypeError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add("x", act_elems=v), "act_elems", [("1", TypeError)])
CASES += cases_for("Counter.add", lambda v: TL.Counter().add(v), "op", [(None, TypeError), (3, TypeError)])
CASES += cases_for("Counter.total", lambda v: TL.Counter().total(v), "key", [("flop", ValueError), (None, ValueError)])
CASES += cases_for("Counter.total", lambda v: TL.Counter().total("flops", v), "ops",
                    [("q_proj", TypeError), (["q_prj"], ValueError), (5, TypeError)])
CASES += cases_for("Counter.merged", lambda v: TL.Counter().merged(v), "groups",
                    [("ops", TypeError), ([["q_proj"]], TypeError)])
CASES += cases_for("Counter.merged", lambda v: TL.Counter().merged({"a": v}), "groups['a']",
                    [("q_proj", TypeError), (["qproj"], ValueError)])
CASES += cases_for("ops_table", lambda v: TL.ops_table(ROWS, groups=v), "groups",
                    [("op", ValueError), (5, TypeError)])
CASES += cases_for("ops_table", lambda v: TL.ops_table(ROWS, title=v), "title", [(5, TypeError)])
CASES += cases_for("ops_table", TL.ops_table, "rows", [(None, TypeError)])
CASES += cases_for("sum_rows", lambda v: TL.sum_rows(ROWS, v), "key", [("flop", ValueError)])
CASES += cases_for("sum_rows", lambda v: TL.sum_rows(ROWS, "flops", v), "ops",
                    [("lm_head", TypeError), ({"lm_haed"}, ValueError)])
# ---- 积木 ----------------------------------------------------------------------------------------------
CASES += [
    Case("linear-x=str", lambda: TL.linear(np.array([["a"] * 16]), W, "q"), TypeError, "x"),
    Case("linear-W=object", lambda: TL.linear(X, W.astype(object), "q"), TypeError, "W"),
    Case("linear-x=complex", lambda: TL.linear(X + 1j, W, "q"), TypeError, "x"),
    Case("linear-shape", lambda: TL.linear(X, W.T, "q"), ValueError, "W"),
    Case("linear-x=scalar", lambda: TL.linear(3.0, W, "q"), ValueError, "x"),
    Case("linear-op=5", lambda: TL.linear(X, W, 5), TypeError, "op"),
    Case("linear-counter=5", lambda: TL.linear(X, W, "q", counter=5), TypeError, "counter"),
]
CASES += cases_for("rms_norm", lambda v: TL.rms_norm(X, np.ones(16), v), "eps",
                    [(0.0, ValueError), (-1.0, ValueError), (NAN, ValueError), ("1e-5", TypeError)])
CASES += [
    Case("rms_norm-x=str", lambda: TL.rms_norm(np.array(["a"]), np.ones(1), 1e-5), TypeError, "x"),
    Case("rms_norm-w-shape", lambda: TL.rms_norm(X, np.ones(15), 1e-5), ValueError, "w"),
    Case("rms_norm-counter", lambda: TL.rms_norm(X, np.ones(16), 1e-5, counter="c"), TypeError, "counter"),
]
CASES += cases_for("rope_angles", lambda v: TL.rope_angles(np.arange(3), v), "d_head",
                    [(3, ValueError), (0, ValueError), (2.5, ValueError), (True, ValueError), ("8", ValueError),
                     (2 * 10 ** 12, ValueError)])
CASES += cases_for("rope_angles", lambda v: TL.rope_angles(np.arange(3), 4, v), "theta",
                    [(1.0, ValueError), (0.0, ValueError), (NAN, ValueError), ("1e4", TypeError)])
CASES += cases_for("rope_angles", lambda v: TL.rope_angles(v, 4), "positions",
                    [(np.zeros((2, 2)), ValueError), (np.array([True, False]), TypeError),
                     ([0.0, NAN], ValueError), ([INF], ValueError), (["1"], TypeError)])
CASES += [
    Case("apply_rope-x=str", lambda: TL.apply_rope(np.full((1, 3, 1, 4), "a"), COS, SIN), TypeError, "x"),
    Case("apply_rope-x-3d", lambda: TL.apply_rope(Q[0], COS, SIN), ValueError, "x"),
    Case("apply_rope-cos-shape", lambda: TL.apply_rope(Q, COS[:2], SIN[:2]), ValueError, "cos"),
    Case("apply_rope-sin=str", lambda: TL.apply_rope(Q, COS, np.full(COS.shape, "s")), TypeError, "sin"),
    Case("apply_rope-counter", lambda: TL.apply_rope(Q, COS, SIN, counter=1), TypeError, "counter"),
]
CASES += cases_for("softmax", TL.softmax, "x",
                    [(np.array(["a", "b"]), TypeError), (np.array([True, False]), TypeError), (np.zeros(0), ValueError),
                     (np.float64(1.0), ValueError), (np.array([-INF, -INF]), ValueError),
                     (np.array([1.0, NAN]), ValueError), (np.array([1.0, INF]), ValueError)])
CASES += cases_for("softmax", lambda v: TL.softmax(np.zeros((2, 3)), v), "axis",
                    [(2, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError), ("0", TypeError)])
CASES += cases_for("silu", TL.silu, "x",
                    [(np.array(["a"]), TypeError), (np.array([True]), TypeError), (["1"], TypeError)])
CASES += [
    Case("attention_core-q-3d", lambda: TL.attention_core(Q[0], KV, KV, 0), ValueError, "q"),
    Case("attention_core-kv-mismatch", lambda: TL.attention_core(Q, KV, KV[:, :2], 0), ValueError, "v"),
    Case("attention_core-G-not-divisor", lambda: TL.attention_core(Q, KV[:, :, :1].repeat(3, 2),
                                                                   KV[:, :, :1].repeat(3, 2), 0), ValueError, "G"),
    Case("attention_core-causal=str", lambda: TL.attention_core(Q, KV, KV, 0, causal="False"), TypeError, "causal"),
    Case("attention_core-q_pos0=-1", lambda: TL.attention_core(Q, KV, KV, -1), ValueError, "q_pos0"),
    Case("attention_core-q_pos0=1.5", lambda: TL.attention_core(Q, KV, KV, 1.5), ValueError, "q_pos0"),
    Case("attention_core-q_pos0-too-far", lambda: TL.attention_core(Q, KV, KV, 2), ValueError, "q_pos0"),
    Case("attention_core-q=str", lambda: TL.attention_core(Q.astype(str), KV, KV, 0), TypeError, "q"),
    Case("attention_core-k=complex", lambda: TL.attention_core(Q, KV + 0j, KV, 0), TypeError, "k"),
    Case("attention_core-counter", lambda: TL.attention_core(Q, KV, KV, 0, counter=[]), TypeError, "counter"),
    Case("attention_core-huge-scores",
         lambda: TL.attention_core(_big((1, 10 ** 6, 8, 2)), _big((1, 10 ** 6, 8, 2)), _big((1, 10 ** 6, 8, 2)), 0),
         ValueError, "S"),
]
# ---- KV cache ------------------------------------------------------------------------------------------
CASES += cases_for("KVCache", lambda v: TL.KVCache(CFG, v), "batch",
                    [(0, ValueError), (1.5, ValueError), (True, ValueError), (10 ** 9, ValueError)])
CASES += cases_for("KVCache", lambda v: TL.KVCache(CFG, 1, v), "max_len",
                    [(0, ValueError), ("16", ValueError), (10 ** 12, ValueError)])
CASES += cases_for("KVCache", lambda v: TL.KVCache(CFG, 1, dtype=v), "dtype",
                    [(np.int32, TypeError), ("float17", TypeError), (None, TypeError)])
CASES += cases_for("KVCache", lambda v: TL.KVCache(v, 1), "cfg", [(None, TypeError), ("tiny", TypeError)])
CASES += [
    Case("KVCache.write-layer=1.5", lambda: TL.KVCache(CFG, 1).write(1.5, KV, KV), ValueError, "layer"),
    Case("KVCache.write-layer=5", lambda: TL.KVCache(CFG, 1).write(5, KV, KV), ValueError, "layer"),
    Case("KVCache.write-layer=str", lambda: TL.KVCache(CFG, 1).write("0", KV, KV), ValueError, "layer"),
    Case("KVCache.write-k=list", lambda: TL.KVCache(CFG, 1).write(0, KV.tolist(), KV), TypeError, "k_new"),
    Case("KVCache.write-v=str", lambda: TL.KVCache(CFG, 1).write(0, KV, KV.astype(str)), TypeError, "v_new"),
    Case("KVCache.write-shape", lambda: TL.KVCache(CFG, 1).write(0, KV[:, :, :1], KV[:, :, :1]), ValueError, "k_new"),
    Case("KVCache.read-upto=0", lambda: TL.KVCache(CFG, 1).read(0, 0), ValueError, "upto"),
    Case("KVCache.read-upto=1.0", lambda: TL.KVCache(CFG, 1).read(0, 1.0), ValueError, "upto"),
    Case("KVCache.read-layer=-1", lambda: TL.KVCache(CFG, 1).read(-1, 1), ValueError, "layer"),
    Case("KVCache.length=-1", lambda: setattr(TL.KVCache(CFG, 1), "length", -1), ValueError, "length"),
    Case("KVCache.nbytes", lambda: TL.KVCache(CFG, 1).nbytes(0), ValueError, "bytes_per_elem"),
]
# ---- forward / generate --------------------------------------------------------------------------------
CASES += cases_for("forward", lambda v: TL.forward(P, CFG, v), "tokens",
                    [([[1.7, 2.2]], TypeError), (np.array([[1.0, 2.0]]), TypeError), ([[-1, 2]], ValueError),
                     ([[1, 50]], ValueError), ([1, 2], ValueError), (np.array([[True]]), TypeError),
                     ([["a"]], TypeError), (np.zeros((1, 0), dtype=int), ValueError),
                     (np.zeros((1, 17), dtype=int), ValueError), ([[1, None]], TypeError)])
for _flag in ("last_only", "use_rope", "causal", "return_hidden"):
    CASES += cases_for("forward", lambda v, f=_flag: TL.forward(P, CFG, TOK, **{f: v}), _flag, FLAG_BAD[:2])
CASES += cases_for("forward", lambda v: TL.forward(P, CFG, TOK, rope_pos0=v), "rope_pos0",
                    [(-1, ValueError), (1.5, TypeError)])
CASES += cases_for("forward", lambda v: TL.forward(P, CFG, TOK, counter=v), "counter",
                    [(5, TypeError), ("c", TypeError)])
CASES += cases_for("forward", lambda v: TL.forward(P, CFG, TOK, linear_fn=v), "linear_fn", [(5, TypeError)])
CASES += cases_for("forward", lambda v: TL.forward(P, CFG, TOK, cache=v), "cache",
                    [(5, TypeError), (TL.KVCache(CFG, 2), ValueError)])
CASES += cases_for("forward", lambda v: TL.forward(v, CFG, TOK), "params",
                    [(None, TypeError), (_bad_params(embed=P["embed"].astype(np.int64)), TypeError),
                     (_bad_params(layer0_wq=P["layers"][0]["wq"].tolist()), TypeError),
                     (_bad_params(layer0_wq=P["layers"][0]["wq"][:, :3]), ValueError),
                     (_bad_params(lm_head=None), ValueError)])
CASES += cases_for("forward", lambda v: TL.forward(P, v, TOK), "cfg", [(None, TypeError), (LM.LLAMA31_8B, TypeError)])
CASES += cases_for("generate", lambda v: TL.generate(P, CFG, TOK, v), "n_new",
                    [(-1, ValueError), (1.5, TypeError), (14, ValueError), ("2", TypeError)])
CASES += cases_for("generate", lambda v: TL.generate(P, CFG, TOK, 2, use_cache=v), "use_cache", FLAG_BAD[:2])
CASES += cases_for("generate", lambda v: TL.generate(P, CFG, v, 2), "tokens", [([[0.5]], TypeError)])
CASES += cases_for("generate", lambda v: TL.generate(P, CFG, TOK, 2, counter_prefill=v), "counter_prefill",
                    [(1, TypeError)])
CASES += cases_for("generate", lambda v: TL.generate(P, CFG, TOK, 2, counter_decode=v), "counter_decode",
                    [({}, TypeError)])
# ---- 解析公式、einsum ---------------------------------------------------------------------------------
CASES += cases_for("analytic_ops", lambda v: TL.analytic_ops(v, 1, 1), "cfg", [(None, TypeError), ({}, TypeError)])
CASES += cases_for("analytic_ops", lambda v: TL.analytic_ops(CFG, v, 1), "batch", [(0, ValueError), (1.5, TypeError)])
CASES += cases_for("analytic_ops", lambda v: TL.analytic_ops(CFG, 1, v), "n_new", [(0, ValueError)])
CASES += cases_for("analytic_ops", lambda v: TL.analytic_ops(CFG, 1, 1, v), "pos0", [(-1, ValueError)])
CASES += cases_for("analytic_ops", lambda v: TL.analytic_ops(CFG, 1, 1, bytes_per_elem=v), "bytes_per_elem",
                    [(0, ValueError)])
for _flag in ("last_only", "with_cache", "causal", "use_rope"):
    CASES += cases_for("analytic_ops", lambda v, f=_flag: TL.analytic_ops(CFG, 1, 1, **{f: v}), _flag,
                        [("False", TypeError)])
CASES += cases_for("phase_costs", lambda v: TL.phase_costs(CFG, v, 1), "batch", [(0, ValueError), ("1", TypeError)])
CASES += cases_for("phase_costs", lambda v: TL.phase_costs(CFG, 1, 1, last_only=v), "last_only", [(1, TypeError)])
CASES += cases_for("einsum_flops", lambda v: TL.einsum_flops(v, (2, 3), (3, 4)), "spec",
                    [("ij,jk", ValueError), (None, ValueError), ("ij,jk->ik->i", ValueError)])
CASES += [
    Case("einsum_flops-shape=int", lambda: TL.einsum_flops("i,i->", 5, 5), TypeError, "shapes"),
    Case("einsum_flops-dim=0", lambda: TL.einsum_flops("ij,jk->ik", (2, 0), (0, 4)), ValueError, "维度长度"),
    Case("einsum_flops-dim=2.0", lambda: TL.einsum_flops("ij,jk->ik", (2, 3.0), (3, 4)), TypeError, "维度长度"),
    Case("einsum_flops-mismatch", lambda: TL.einsum_flops("ij,jk->ik", (2, 3), (4, 4)), ValueError, "j"),
    Case("einsum_flops-count", lambda: TL.einsum_flops("ij,jk->ik", (2, 3)), ValueError, "spec"),
]


@params(CASES)
def test_transformer_lab_bad_input(case):
    check_case(case)


def test_case_count():
    assert len(CASES) >= 100, len(CASES)


# =============================================================================
# 合法的边界输入：对照独立算出的值
# =============================================================================
def test_float_ids_are_refused_but_int_like_ids_agree():
    """logits([1.7, 2.2]) 不能等于 logits([1, 2])：浮点 id 报错；各种整数形式的 id 给出同一个结果。"""
    ref = TL.forward(P, CFG, np.array([[1, 2]], dtype=np.int64))
    for toks in ([[1, 2]], np.array([[1, 2]], dtype=np.int32), np.array([[1, 2]], dtype=np.uint8)):
        assert np.array_equal(TL.forward(P, CFG, toks), ref)
    with pytest.raises(TypeError, match="tokens"):
        TL.forward(P, CFG, [[1.7, 2.2]])


def test_seed_conventions_agree():
    a = TL.init_params(CFG, seed=7)
    b = TL.init_params(CFG, seed=np.random.default_rng(7))
    c = TL.init_params(CFG, seed=np.int64(7))
    for x, y in ((a, b), (a, c)):
        assert np.array_equal(x["embed"], y["embed"]) and np.array_equal(x["lm_head"], y["lm_head"])


def test_float32_model_and_cache_run():
    p32 = TL.init_params(CFG, seed=1, dtype="float32")
    assert p32["embed"].dtype == np.float32
    cache = TL.KVCache(CFG, 1, dtype=np.float32)
    out = TL.forward(p32, CFG, TOK, cache=cache)
    ref = TL.forward(P, CFG, TOK)
    assert cache.length == 3 and np.max(np.abs(out - ref)) < 1e-4 * max(1.0, np.max(np.abs(ref)))


def test_integer_inputs_to_blocks_match_float_reference():
    xi = RNG.integers(-5, 5, size=(1, 3, 2, 4))
    xf = xi.astype(np.float64)
    assert np.array_equal(TL.apply_rope(xi, COS, SIN), TL.apply_rope(xf, COS, SIN))    # 不再截断成整数
    assert TL.apply_rope(xi, COS, SIN).dtype == np.float64
    assert np.array_equal(TL.softmax(xi), TL.softmax(xf))
    assert np.array_equal(TL.silu(xi), TL.silu(xf)) and np.array_equal(TL.linear(xi[0, 0], W[:4], "q"),
                                                                         xf[0, 0] @ W[:4])
    assert np.array_equal(TL.rms_norm(xi, np.ones(4), 1e-5), TL.rms_norm(xf, np.ones(4), 1e-5))
    cos, sin = TL.rope_angles([0, 1.5, 2], 4)                     # 小数位置（插值）也可以
    assert np.allclose(cos[1], np.cos(1.5 * 10000.0 ** (-np.arange(2) * 2 / 4)))


def test_counter_numpy_ints_and_known_empty_ops():
    c = TL.Counter()
    c.add("q_proj", flops=np.int64(10), useful=np.int32(4), w_elems=np.uint8(3))
    assert c.rows["q_proj"]["flops"] == 10 and c.rows["q_proj"]["useful"] == 4 and c.rows["q_proj"]["w"] == 6.0
    assert c.total("flops", ["kv_write"]) == 0                     # 已知但这次没记的运算：0，不报错
    assert c.total("flops", ("q_proj",)) == 10 == TL.sum_rows(c.rows, "flops", {"q_proj"})
    assert TL.einsum_flops("ij,jk->ik", (np.int64(2), 3), np.zeros((3, 4))) == 2 * 2 * 3 * 4


def test_memory_refusal_names_the_size():
    with pytest.raises(ValueError) as e:
        TL.KVCache(CFG, 1, 10 ** 12)
    assert "max_len" in str(e.value) and "TB" in str(e.value)       # 消息写出要多少字节


@settings(deadline=None, max_examples=25)
@given(rows=st.integers(1, 4), cols=st.integers(1, 7), seed=st.integers(0, 10 ** 6),
       shift=st.floats(-1e3, 1e3, allow_nan=False))
def test_softmax_laws(rows, cols, seed, shift):
    """softmax 的律：每行和为 1、每个值在 [0, 1]、加同一个常数不变。"""
    x = np.random.default_rng(seed).standard_normal((rows, cols)) * 10
    p = TL.softmax(x)
    assert np.allclose(p.sum(-1), 1.0) and np.all((p >= 0) & (p <= 1))
    assert np.allclose(TL.softmax(x + shift), p, atol=1e-12)
    assert np.allclose(TL.softmax(x, axis=0).sum(0), 1.0)


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(1, 6))
def test_forward_integer_dtypes_property(seed, n):
    """任何整数 dtype 的同一组 token id 给出逐位相同的 logits。"""
    toks = np.random.default_rng(seed).integers(0, CFG.vocab, size=(1, n))
    ref = TL.forward(P, CFG, toks)
    for dt in (np.int16, np.uint16, np.int32):
        assert np.array_equal(TL.forward(P, CFG, toks.astype(dt)), ref)
