"""lecture02/transformer_lab.py 的单元测试与性质测试。

_selftest() 和演示的 --quick 由 test_harness.py 在子进程里跑，这里不重复。这里测：
  · 随机小配置（GQA 组大小 1…H、奇数长度、tied 与否）上：KV cache 分段计算 = 整段计算；Counter = analytic_ops；
    参数量 = llm_math；矩阵乘 FLOPs = T × linear_flops_per_token；
  · attention_core 对照逐头循环、显式掩码的 float64 softmax(QKᵀ/√d)V，以及 torch 的 SDPA；
  · 整个前向对照一份独立写的 torch float64 Llama（复数形式的 RoPE、repeat_interleave 的 GQA）；
  · RoPE 的相对位置性质、einsum_flops 与 np.einsum 的一致性、KVCache 回滚；
  · 坏输入：越界 token、cache 溢出、超过 max_seq、形状与配置不符……都给出点名参数的 ValueError/TypeError。
"""
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

tl = load_lab("lecture02", "transformer_lab")


# ---------------------------------------------------------------------------
# 随机小配置
# ---------------------------------------------------------------------------
@st.composite
def configs(draw, max_seq=40):
    H = draw(st.integers(1, 6))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))   # 组大小 H/G 取遍 1…H 的因子
    return tl.Config(vocab=draw(st.integers(3, 37)), d_model=draw(st.integers(2, 21)),
                     n_layers=draw(st.integers(1, 3)), n_heads=H, n_kv_heads=G,
                     d_head=2 * draw(st.integers(1, 5)), d_ff=draw(st.integers(1, 19)), max_seq=max_seq,
                     rope_theta=draw(st.sampled_from([10000.0, 500000.0, 7.5])), tied=draw(st.booleans()))


def _tokens(rng, cfg, B, T):
    return rng.integers(0, cfg.vocab, size=(B, T))


@settings(deadline=None, max_examples=40)
@given(cfg=configs(), seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3),
       cuts=st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_cache_chunks_equal_full_forward(cfg, seed, B, cuts):
    """任意切段（含奇数长度）逐段喂进 KV cache，每段的 logits = 整段一次算出的对应位置。"""
    rng = np.random.default_rng(seed)
    params = tl.init_params(cfg, seed=seed)
    toks = _tokens(rng, cfg, B, sum(cuts))
    full = tl.forward(params, cfg, toks)
    cache, start = tl.KVCache(cfg, B), 0
    for n in cuts:
        part = tl.forward(params, cfg, toks[:, start:start + n], cache=cache)
        np.testing.assert_allclose(part, full[:, start:start + n], rtol=0, atol=1e-9)
        start += n
    assert cache.length == sum(cuts)


@settings(deadline=None, max_examples=25)
@given(cfg=configs(), seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3), P=st.integers(1, 9),
       n_new=st.integers(1, 6))
def test_generate_with_and_without_cache(cfg, seed, B, P, n_new):
    params = tl.init_params(cfg, seed=seed)
    prompt = _tokens(np.random.default_rng(seed), cfg, B, P)
    t1, l1 = tl.generate(params, cfg, prompt, n_new, use_cache=True)
    t2, l2 = tl.generate(params, cfg, prompt, n_new, use_cache=False)
    assert t1.shape == (B, P + n_new) and np.array_equal(t1[:, :P], prompt)
    np.testing.assert_allclose(np.array(l1), np.array(l2), rtol=0, atol=1e-9)
    assert np.array_equal(t1, t2)     # 随机 float64 logits 几乎不可能恰好并列，argmax 应该相同


@settings(deadline=None, max_examples=40)
@given(cfg=configs(), seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3), T=st.integers(1, 9),
       pos0=st.integers(0, 11), last_only=st.booleans(), causal=st.booleans(), use_rope=st.booleans(),
       bpe=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
def test_counter_equals_analytic(cfg, seed, B, T, pos0, last_only, causal, use_rope, bpe):
    """每个运算、每一列：运行时记的账 = 解析公式（包括双向、无 RoPE、last_only、不同字节宽度）。"""
    rng = np.random.default_rng(seed)
    params = tl.init_params(cfg, seed=seed)
    cache = tl.KVCache(cfg, B)
    if pos0:
        tl.forward(params, cfg, _tokens(rng, cfg, B, pos0), cache=cache, causal=causal, use_rope=use_rope)
    c = tl.Counter(bpe)
    tl.forward(params, cfg, _tokens(rng, cfg, B, T), cache=cache, counter=c, last_only=last_only,
               causal=causal, use_rope=use_rope)
    want = tl.analytic_ops(cfg, B, T, pos0, bpe, last_only=last_only, causal=causal, use_rope=use_rope)
    assert set(want) == set(c.rows)
    for op, row in want.items():
        for key, val in row.items():
            assert c.rows[op][key] == pytest.approx(val, rel=1e-12, abs=1e-9), (op, key)
    mc = cfg.to_model_config()
    assert tl.count_params(params) == mc.n_params()
    assert c.rows["attn_core"]["useful"] <= c.rows["attn_core"]["flops"]
    if not last_only:
        assert c.total("flops", tl.MATMUL_OPS) == B * T * mc.linear_flops_per_token()
    if causal:   # 有用的 FLOPs 正是 llm_math.step_flops 的定义
        assert c.total("useful", tl.MATMUL_OPS + tl.ATTN_CORE_OPS) == pytest.approx(
            mc.step_flops(B, T, pos0) - (B * (T - 1) * 2 * cfg.d_model * cfg.vocab if last_only else 0))


def test_analytic_ops_scales_to_real_models():
    """llm_math.ModelConfig 也能直接用；prefill 的有用 FLOPs = llm_math.step_flops。"""
    from llm_math import LLAMA31_70B
    rows = tl.analytic_ops(LLAMA31_70B, 1, 4096)
    assert tl.sum_rows(rows, "useful", tl.MATMUL_OPS + tl.ATTN_CORE_OPS) == LLAMA31_70B.step_flops(1, 4096)
    ph = tl.phase_costs(LLAMA31_70B, 1, 1, 4096)
    assert ph["bytes"] == ph["w"] + ph["kv"] + ph["act"] and ph["intensity"] < 2


# ---------------------------------------------------------------------------
# 注意力：独立参考
# ---------------------------------------------------------------------------
def _plain_attention(q, k, v, q_pos0, causal):
    """float64 逐头：softmax(QKᵀ/√d + M)V，M 是显式写出的 0/−∞ 掩码矩阵；GQA 用"第 h 头 → 第 h // R 组"。"""
    B, T, H, dh = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    M = np.zeros((T, S))
    if causal:
        for i in range(T):
            for j in range(S):
                if j > q_pos0 + i:
                    M[i, j] = -np.inf
    out = np.empty((B, T, H, dh))
    for b in range(B):
        for h in range(H):
            s = q[b, :, h, :] @ k[b, :, h // R, :].T / math.sqrt(dh) + M
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            out[b, :, h, :] = (e / e.sum(axis=-1, keepdims=True)) @ v[b, :, h // R, :]
    return out.reshape(B, T, H * dh)


@st.composite
def attn_shapes(draw):
    H = draw(st.integers(1, 8))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    T = draw(st.integers(1, 9))
    S = T + draw(st.integers(0, 8))
    return draw(st.integers(1, 3)), T, S, H, G, draw(st.integers(1, 9)), draw(st.booleans())


@settings(deadline=None, max_examples=60)
@given(shape=attn_shapes(), seed=st.integers(0, 2**31 - 1))
def test_attention_core_matches_plain_softmax(shape, seed):
    B, T, S, H, G, dh, causal = shape
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((B, T, H, dh)), rng.standard_normal((B, S, G, dh)), rng.standard_normal((B, S, G, dh))
    q_pos0 = S - T                                          # 右下对齐：最后一个查询看到全部键
    got = tl.attention_core(q, k, v, q_pos0, causal=causal)
    np.testing.assert_allclose(got, _plain_attention(q, k, v, q_pos0, causal), rtol=0, atol=1e-12)
    # torch 的 SDPA（布尔掩码 True = 可见；GQA 用 repeat_interleave 展开）
    qt, kt, vt = (torch.from_numpy(a).permute(0, 2, 1, 3) for a in (q, k, v))   # [B, 头, 长度, dh]
    kt, vt = kt.repeat_interleave(H // G, dim=1), vt.repeat_interleave(H // G, dim=1)
    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T) if causal else None
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    np.testing.assert_allclose(got, ref.permute(0, 2, 1, 3).reshape(B, T, H * dh).numpy(), rtol=0, atol=1e-12)


def test_attention_core_shorter_prefix_q_pos0():
    """q_pos0 < S − T（查询只看到前缀）也按定义算，useful 只数可见的 (q, k) 对。"""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 3, 2, 4))
    k, v = rng.standard_normal((2, 1, 8, 1, 4))
    c = tl.Counter()
    got = tl.attention_core(q, k, v, 2, counter=c)
    np.testing.assert_allclose(got, _plain_attention(q, k, v, 2, True), atol=1e-12)
    assert c.rows["attn_core"]["useful"] == 4 * (3 + 4 + 5) * 2 * 4


# ---------------------------------------------------------------------------
# 整个前向：独立写的 torch 版本
# ---------------------------------------------------------------------------
def _torch_forward(params, cfg, tokens):
    """torch float64 的 Llama：RoPE 用复数乘法，注意力用 SDPA(is_causal)，GQA 用 repeat_interleave。"""
    P = {k: v for k, v in params.items() if k != "layers"}
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))               # noqa: E731
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    B, T = tokens.shape
    x = t(P["embed"])[torch.from_numpy(tokens)]

    def norm(z, w):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * t(w)

    omega = cfg.rope_theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * omega                   # [T, dh/2]
    rot = torch.polar(torch.ones_like(angle), angle)                                # e^{i·p·ω}

    def rope(z):                                                            # z [B, T, n, dh]
        zc = torch.view_as_complex(z.reshape(B, T, z.shape[2], dh // 2, 2).contiguous())
        return torch.view_as_real(zc * rot[None, :, None, :]).reshape(z.shape)

    for lp in params["layers"]:
        h = norm(x, lp["attn_norm"])
        q = rope((h @ t(lp["wq"])).view(B, T, H, dh)).transpose(1, 2)
        k = rope((h @ t(lp["wk"])).view(B, T, G, dh)).transpose(1, 2).repeat_interleave(H // G, 1)
        v = (h @ t(lp["wv"])).view(B, T, G, dh).transpose(1, 2).repeat_interleave(H // G, 1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, H * dh) @ t(lp["wo"])
        h = norm(x, lp["mlp_norm"])
        x = x + (torch.nn.functional.silu(h @ t(lp["w_gate"])) * (h @ t(lp["w_up"]))) @ t(lp["w_down"])
    head = t(P["embed"]).T if P["lm_head"] is None else t(P["lm_head"])
    return (norm(x, P["final_norm"]) @ head).numpy()


@settings(deadline=None, max_examples=15)
@given(cfg=configs(), seed=st.integers(0, 2**31 - 1), B=st.integers(1, 2), T=st.integers(1, 11))
def test_forward_matches_independent_torch_model(cfg, seed, B, T):
    params = tl.init_params(cfg, seed=seed)
    toks = _tokens(np.random.default_rng(seed), cfg, B, T)
    np.testing.assert_allclose(tl.forward(params, cfg, toks), _torch_forward(params, cfg, toks), rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------
# RoPE、einsum、KVCache、其他性质
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=40)
@given(dh=st.integers(1, 16).map(lambda n: 2 * n), m=st.integers(0, 3000), n=st.integers(0, 3000),
       shift=st.integers(0, 10**5), seed=st.integers(0, 2**31 - 1))
def test_rope_score_depends_only_on_offset(dh, m, n, shift, seed):
    q, k = np.random.default_rng(seed).standard_normal((2, 1, 1, 1, dh))

    def score(pm, pn):
        rq = tl.apply_rope(q, *tl.rope_angles([pm], dh, 10000.0))
        rk = tl.apply_rope(k, *tl.rope_angles([pn], dh, 10000.0))
        return float(np.sum(rq * rk))

    assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-9)
    # 旋转不改变长度
    r = tl.apply_rope(q, *tl.rope_angles([m], dh))
    assert np.linalg.norm(r) == pytest.approx(np.linalg.norm(q), rel=1e-12)


def test_rope_angles_frequencies():
    cos, sin = tl.rope_angles(np.arange(5), 8, theta=100.0)
    ang = np.arctan2(sin, cos)
    np.testing.assert_allclose(ang[1], 100.0 ** (-np.arange(4) / 4), rtol=1e-12)   # 位置 1 的角度 = 频率
    np.testing.assert_allclose(cos[0], 1.0)
    np.testing.assert_allclose(sin[0], 0.0, atol=0)


_LETTERS = "abcdefg"


@st.composite
def einsum_cases(draw):
    sizes = {ch: draw(st.integers(2, 4)) for ch in _LETTERS}
    n_ops = draw(st.integers(1, 3))
    ops = [draw(st.lists(st.sampled_from(_LETTERS), min_size=1, max_size=3, unique=True)) for _ in range(n_ops)]
    used = sorted(set().union(*ops))
    out = draw(st.lists(st.sampled_from(used), max_size=len(used), unique=True))
    spec = ",".join("".join(o) for o in ops) + "->" + "".join(out)
    shapes = [tuple(sizes[ch] for ch in o) for o in ops]
    if draw(st.booleans()):                                 # 有时故意弄错一个维度的长度
        i = draw(st.integers(0, n_ops - 1))
        shapes[i] = shapes[i][:-1] + (shapes[i][-1] + 1,)
    return spec, shapes, sizes, ops, out


@settings(deadline=None, max_examples=80)
@given(case=einsum_cases())
def test_einsum_flops_rule_and_validation_agree_with_numpy(case):
    spec, shapes, _, ops, out = case
    arrays = [np.ones(s) for s in shapes]
    try:
        np.einsum(spec, *arrays)
        numpy_ok = True
    except ValueError:
        numpy_ok = False
    if not numpy_ok:
        with pytest.raises(ValueError, match="einsum_flops"):
            tl.einsum_flops(spec, *shapes)
        return
    f = tl.einsum_flops(spec, *shapes)
    dims = {}
    for o, s in zip(ops, shapes):
        dims.update(zip(o, s))
    n_index = math.prod(dims.values())                      # 下标组合的个数
    summed = set(dims) - set(out)
    assert f == (2 * n_index if summed and len(ops) >= 2 else n_index)
    assert tl.einsum_flops(spec, *arrays) == f              # 也可以直接传数组


def test_einsum_flops_examples():
    assert tl.einsum_flops("btd,df->btf", (2, 8, 64), (64, 256)) == 2 * 2 * 8 * 64 * 256
    assert tl.einsum_flops("ij->i", (3, 5)) == 15
    assert tl.einsum_flops("i,i->i", (7,), (7,)) == 7


def test_kv_cache_rollback_then_rewrite():
    """第 6 讲投机解码的用法：把 length 改小就丢弃草稿，之后的写入覆盖旧数据，结果与从未写过草稿一样。"""
    cfg = tl.Config(vocab=20, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_head=4, d_ff=6, max_seq=16)
    params = tl.init_params(cfg, seed=2)
    a, draft, b = np.array([[1, 2, 3]]), np.array([[7, 7]]), np.array([[4, 5]])
    cache = tl.KVCache(cfg, 1)
    tl.forward(params, cfg, a, cache=cache)
    tl.forward(params, cfg, draft, cache=cache)
    cache.length = 3
    got = tl.forward(params, cfg, b, cache=cache)
    ref = tl.forward(params, cfg, np.concatenate([a, b], axis=1))[:, 3:]
    np.testing.assert_allclose(got, ref, atol=1e-12)
    assert cache.nbytes(2.0) == 2 * 2 * 1 * 5 * 1 * 4 * 2.0


def test_last_only_return_hidden_and_linear_fn():
    cfg = tl.config_like(tl.TINY, n_layers=2, vocab=50, name="t2")
    params = tl.init_params(cfg, seed=4)
    toks = np.random.default_rng(0).integers(0, 50, size=(2, 6))
    full, hidden = tl.forward(params, cfg, toks, return_hidden=True)
    assert hidden.shape == (2, 6, cfg.d_model)
    np.testing.assert_allclose(tl.forward(params, cfg, toks, last_only=True), full[:, -1:], atol=1e-12)
    seen, c1, c2 = [], tl.Counter(), tl.Counter()

    def hook(x, W, op, layer):
        seen.append((op, layer))
        return x @ W

    np.testing.assert_allclose(tl.forward(params, cfg, toks, linear_fn=hook, counter=c1),
                               tl.forward(params, cfg, toks, counter=c2), atol=1e-12)
    assert c1.rows == c2.rows
    assert seen[:3] == [("q_proj", 0), ("k_proj", 0), ("v_proj", 0)] and seen[-1] == ("lm_head", None)
    with pytest.raises(ValueError, match="linear_fn"):
        tl.forward(params, cfg, toks, linear_fn=lambda x, W, op, layer: x)


def test_silu_and_softmax_are_stable():
    x = np.array([-1000.0, -30.0, 0.0, 2.0, 800.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = tl.silu(x)
        p = tl.softmax(np.array([[1000.0, 0.0, -np.inf]]))
    np.testing.assert_allclose(y, torch.nn.functional.silu(torch.from_numpy(x)).numpy(), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(p, [[1.0, 0.0, 0.0]])


def test_counter_merge_and_table():
    c = tl.Counter()
    tl.forward(tl.init_params(tl.TINY), tl.TINY, np.zeros((1, 4), dtype=np.int64), counter=c)
    merged = c.merged(tl.OP_GROUPS)
    assert sum(r["flops"] for r in merged.values()) == c.total("flops")       # 分组覆盖了所有运算
    text = tl.ops_table(c.rows, title="x")
    assert all(g in text for g in tl.OP_GROUPS) and "合计" in text
    per_op = tl.ops_table(c.rows, "ops")
    assert all(op in per_op for op in c.rows) and len(per_op.splitlines()) == len(c.rows) + 3   # 表头、横线、合计
    groups = tl.param_groups(tl.init_params(tl.TINY))
    assert sum(groups.values()) == tl.TINY.to_model_config().n_params()


# ---------------------------------------------------------------------------
# 坏输入
# ---------------------------------------------------------------------------
SMALL = tl.Config(vocab=11, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_head=4, d_ff=5, max_seq=6)
P_SMALL = tl.init_params(SMALL, seed=0)


@pytest.mark.parametrize("tokens, err, match", [
    (np.array([[1, -1, 2]]), ValueError, "vocab"),                # numpy 会把 −1 绕回最后一个词
    (np.array([[1, 11]]), ValueError, "vocab"),
    (np.array([1, 2, 3]), ValueError, "tokens"),
    (np.zeros((1, 0), dtype=np.int64), ValueError, "tokens"),
    (np.array([[1.0, 2.0]]), TypeError, "tokens"),
    (np.array([[True, False]]), TypeError, "tokens"),
])
def test_bad_tokens(tokens, err, match):
    with pytest.raises(err, match=match):
        tl.forward(P_SMALL, SMALL, tokens)


def test_cache_overflow_and_max_seq():
    cache = tl.KVCache(SMALL, 1)
    tl.forward(P_SMALL, SMALL, np.array([[1, 2, 3, 4]]), cache=cache)
    with pytest.raises(ValueError, match="溢出"):
        tl.forward(P_SMALL, SMALL, np.array([[1, 2, 3]]), cache=cache)
    assert cache.length == 4                                       # 失败的前向没有推进 length
    with pytest.raises(ValueError, match="max_seq"):
        tl.generate(P_SMALL, SMALL, np.array([[1, 2, 3, 4]]), 3)
    with pytest.raises(ValueError, match="n_new"):
        tl.generate(P_SMALL, SMALL, np.array([[1]]), -1)
    with pytest.raises(ValueError, match="溢出"):
        cache.write(0, np.zeros((1, 3, 1, 4)), np.zeros((1, 3, 1, 4)))


def test_cache_misuse():
    cache = tl.KVCache(SMALL, 2)
    with pytest.raises(ValueError, match="批大小"):
        tl.forward(P_SMALL, SMALL, np.array([[1, 2]]), cache=cache)
    other = tl.config_like(SMALL, n_layers=2)
    with pytest.raises(ValueError, match="cache"):
        tl.forward(P_SMALL, SMALL, np.array([[1], [2]]), cache=tl.KVCache(other, 2))
    with pytest.raises(ValueError, match="upto"):
        cache.read(0, 1)                                           # 还没写过任何位置
    with pytest.raises(ValueError, match="k_new"):
        cache.write(0, np.zeros((2, 1, 2, 4)), np.zeros((2, 1, 2, 4)))
    with pytest.raises(ValueError, match="length"):
        cache.length = SMALL.max_seq + 1
    with pytest.raises(ValueError, match="max_len"):
        tl.KVCache(SMALL, 1, max_len=0)


def test_params_must_match_config():
    with pytest.raises(ValueError, match="n_layers"):
        tl.forward(P_SMALL, tl.config_like(SMALL, n_layers=2), np.array([[1]]))
    with pytest.raises(ValueError, match="wq"):
        tl.forward(P_SMALL, tl.config_like(SMALL, n_heads=4, n_kv_heads=1), np.array([[1]]))
    with pytest.raises(ValueError, match="embed"):
        tl.forward(P_SMALL, tl.config_like(SMALL, vocab=12), np.array([[1]]))
    with pytest.raises(ValueError, match="tied"):
        tl.forward(P_SMALL, tl.config_like(SMALL, tied=True), np.array([[1]]))


@pytest.mark.parametrize("changes, err, match", [
    (dict(n_heads=6, n_kv_heads=4), ValueError, "n_kv_heads"),
    (dict(d_head=5), ValueError, "d_head"),
    (dict(d_model=0), ValueError, "d_model"),
    (dict(vocab=12.0), TypeError, "vocab"),
    (dict(n_layers=True), TypeError, "n_layers"),
    (dict(rope_theta=1.0), ValueError, "rope_theta"),
    (dict(norm_eps=0.0), ValueError, "norm_eps"),
])
def test_bad_config(changes, err, match):
    with pytest.raises(err, match=match):
        tl.config_like(tl.TINY, **changes)


def test_bad_building_blocks():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="linear"):
        tl.linear(np.ones((2, 3)), np.ones((4, 5)), "x")
    with pytest.raises(ValueError, match="rms_norm"):
        tl.rms_norm(np.ones((2, 3)), np.ones(4), 1e-5)
    with pytest.raises(ValueError, match="apply_rope"):
        tl.apply_rope(np.ones((1, 3, 2, 4)), *tl.rope_angles(np.arange(2), 4))
    with pytest.raises(ValueError, match="d_head"):
        tl.rope_angles(np.arange(3), 5)
    q, k = rng.standard_normal((1, 4, 2, 4)), rng.standard_normal((1, 3, 1, 4))
    with pytest.raises(ValueError, match="q_pos0"):
        tl.attention_core(q, k, k, 0)                              # 4 个查询、只有 3 个键：自己的键缺失
    with pytest.raises(ValueError, match="q_pos0"):
        tl.attention_core(q[:, :1], k, k, -1)
    with pytest.raises(ValueError, match="attention_core"):
        tl.attention_core(rng.standard_normal((1, 1, 3, 4)), rng.standard_normal((1, 3, 2, 4)),
                          rng.standard_normal((1, 3, 2, 4)), 2)   # H=3 不是 G=2 的倍数
    with pytest.raises(ValueError, match="softmax"):
        tl.softmax(np.array([[-np.inf, -np.inf]]))
    with pytest.raises(ValueError, match="rope_pos0"):
        tl.forward(P_SMALL, SMALL, np.array([[1]]), rope_pos0=-2)
    with pytest.raises(ValueError, match="key"):
        tl.Counter().total("bytes")
    with pytest.raises(ValueError, match="einsum_flops"):
        tl.einsum_flops("ij,jk", (2, 3), (3, 4))                  # 没有 "->"
    with pytest.raises(ValueError, match="einsum_flops"):
        tl.einsum_flops("ij,jk->ik", (2, 3))                       # 少一个形状
    with pytest.raises(ValueError, match="einsum_flops"):
        tl.einsum_flops("ij->iz", (2, 3))                          # 输出里有输入没有的字母
    with pytest.raises(ValueError, match="analytic_ops"):
        tl.analytic_ops(tl.TINY, 1, 0)


_NAN_WARN = "error"   # 坏参数必须在算之前被拒绝：一旦进到 numpy 就会先冒 RuntimeWarning（这里当成错误）


@pytest.mark.parametrize("call, err, match", [
    (lambda: tl.rope_angles(np.arange(3), 4, theta=0.0), ValueError, "theta"),
    (lambda: tl.rope_angles(np.arange(3), 4, theta=-10.0), ValueError, "theta"),
    (lambda: tl.rope_angles(np.arange(3), 4, theta=1.0), ValueError, "theta"),        # 每一对转速相同
    (lambda: tl.rope_angles(np.arange(3), 4, theta=float("nan")), ValueError, "theta"),
    (lambda: tl.rope_angles(np.arange(3), 4, theta=float("inf")), ValueError, "theta"),
    (lambda: tl.rope_angles(np.arange(3), 4, theta="1e4"), TypeError, "theta"),
    (lambda: tl.rope_angles([0.0, np.nan], 4), ValueError, "positions"),
    (lambda: tl.rms_norm(np.ones((2, 4)), np.ones(4), -1.0), ValueError, "eps"),
    (lambda: tl.rms_norm(np.zeros((2, 4)), np.ones(4), 0.0), ValueError, "eps"),
    (lambda: tl.rms_norm(np.ones((2, 4)), np.ones(4), float("nan")), ValueError, "eps"),
    (lambda: tl.rms_norm(np.ones((2, 4)), np.ones(4), float("inf")), ValueError, "eps"),
    (lambda: tl.rms_norm(np.ones((2, 4)), np.ones(4), None), TypeError, "eps"),
    (lambda: tl.einsum_flops("ab,bc->ac", (2, -3), (-3, 4)), ValueError, "einsum_flops"),
    (lambda: tl.einsum_flops("ab,bc->ac", (2, 3.0), (3.0, 4)), TypeError, "einsum_flops"),
    (lambda: tl.analytic_ops(tl.TINY, 1, 1, bytes_per_elem=-1.0), ValueError, "bytes_per_elem"),
    (lambda: tl.phase_costs(tl.TINY, 1, 1, bytes_per_elem=0.0), ValueError, "bytes_per_elem"),
    (lambda: tl.KVCache(tl.TINY, 1).nbytes(-2.0), ValueError, "bytes_per_elem"),
    (lambda: tl.Counter(float("nan")), ValueError, "bytes_per_elem"),
    (lambda: tl.init_params(tl.TINY, logit_std=-1.0), ValueError, "logit_std"),
    (lambda: tl.init_params(tl.TINY, logit_std=float("nan")), ValueError, "logit_std"),
    (lambda: tl.init_params(tl.TINY, dtype=np.int32), TypeError, "dtype"),
])
def test_bad_function_arguments_are_rejected_before_computing(call, err, match):
    with warnings.catch_warnings():
        warnings.simplefilter(_NAN_WARN)
        with pytest.raises(err, match=match):
            call()


@pytest.mark.parametrize("changes", [dict(norm_eps=float("inf")), dict(rope_theta=float("inf")),
                                     dict(norm_eps=float("nan"))])
def test_config_rejects_non_finite(changes):
    with pytest.raises(ValueError, match=next(iter(changes))):
        tl.config_like(tl.TINY, **changes)


@settings(deadline=None, max_examples=40)
@given(seed=st.integers(0, 10**6), scale=st.floats(1e-3, 1e3), eps=st.floats(1e-8, 1.0))
def test_rms_norm_scale_equivariance_and_unit_rms(seed, scale, eps):
    # 由定义 x/√(mean x² + eps)：把 x 放大 c 倍、eps 放大 c² 倍，结果不变；eps → 0 时每行的均方根 = 1
    x = np.random.default_rng(seed).standard_normal((3, 7)) + 0.1
    w = np.ones(7)
    np.testing.assert_allclose(tl.rms_norm(scale * x, w, eps * scale ** 2), tl.rms_norm(x, w, eps), rtol=1e-10)
    y = tl.rms_norm(x, w, 1e-300)
    np.testing.assert_allclose(np.sqrt(np.mean(y ** 2, axis=-1)), 1.0, rtol=1e-12)


# forward 和 generate 同一个长度上限；开关只收 True / False
def test_forward_rejects_more_than_max_seq_and_string_flags():
    cfg = tl.config_like(tl.TINY, max_seq=32)
    params = tl.init_params(cfg, seed=0)
    toks = np.zeros((1, 33), dtype=np.int64)
    with pytest.raises(ValueError, match="max_seq"):
        tl.forward(params, cfg, toks)
    cache = tl.KVCache(cfg, 1)
    tl.forward(params, cfg, toks[:, :30], cache=cache)
    with pytest.raises(ValueError, match="max_seq|max_len"):
        tl.forward(params, cfg, toks[:, :3], cache=cache)
    for kw in ({"causal": "yes"}, {"last_only": 1}, {"use_rope": "False"}):
        with pytest.raises(TypeError, match=next(iter(kw))):
            tl.forward(params, cfg, toks[:, :4], **kw)
    with pytest.raises(TypeError, match="n_new"):                       # 不是整数 → TypeError（课程约定）
        tl.generate(params, cfg, toks[:, :4], 2.5)
