"""第 6 讲 decode_lab 的单元测试与性质测试（自检和演示由 test_harness.py 在子进程里跑，这里不重复）。

每个结论都和一个**独立**的参考比较：闭式公式、暴力枚举、逐个请求单独计算、显式建树的贪心验证、
独立的蒙特卡洛模拟；调度模拟检查不变式（每个请求恰好完成一次、先到先服务、预留 ≥ 实际写入、时间不倒流）。
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from labload import load_lab

dl = load_lab("lecture06", "decode_lab")
tl = load_lab("lecture02", "transformer_lab")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
TARGET, DRAFT = dl.tiny_pair(seed=2)


# ---------------------------------------------------------------------------
# 投机采样的零件：精确分布、残差、三种规则
# ---------------------------------------------------------------------------
@st.composite
def prob_pairs(draw):
    """随机 (p, q)：词表 1–40，允许大量的 0（q 的支撑可以不含 p 的支撑，反之亦然）。"""
    V = draw(st.integers(1, 40))
    weights = st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 10.0)), min_size=V, max_size=V)
    p, q = np.array(draw(weights)), np.array(draw(weights))
    p[draw(st.integers(0, V - 1))] += 1.0            # 保证和 > 0
    q[draw(st.integers(0, V - 1))] += 1.0
    return p / p.sum(), q / q.sum()


@settings(max_examples=200, **SETTINGS)
@given(prob_pairs())
def test_spec_output_dist_is_p(pq):
    p, q = pq
    out, beta = dl.spec_output_dist(p, q)
    assert np.max(np.abs(out - p)) < 1e-12
    assert abs(beta - (1 - 0.5 * np.abs(p - q).sum())) < 1e-12          # β = 1 − TV
    assert np.allclose(dl.variant_output_dist(p, q, "correct"), p, atol=1e-12)


@settings(max_examples=200, **SETTINGS)
@given(prob_pairs())
def test_residual_properties(pq):
    p, q = pq
    r = dl.residual(p, q)
    assert (r >= 0).all() and abs(r.sum() - 1) < 1e-12
    if (p > q).any():
        assert (r[p <= q] == 0).all()                                     # 只在 q 给少了的地方补
        over = np.maximum(p - q, 0)
        assert np.allclose(r, over / over.sum())
    else:
        assert np.array_equal(r, p)                                       # p == q：退化为 p
    assert np.max(np.abs(dl.residual(p, np.zeros_like(p)) - p)) < 1e-15   # "没有草稿" = 直接从 p 抽


@settings(max_examples=100, **SETTINGS)
@given(prob_pairs())
def test_wrong_variants_are_distributions_and_biased(pq):
    p, q = pq
    for v in ("resample_p", "accept_if_p_ge_q"):
        d = dl.variant_output_dist(p, q, v)
        assert (d >= -1e-15).all() and abs(d.sum() - 1) < 1e-12
    # "被拒后从 p 抽"的偏差恰好是 (1 − β)·(p − residual)：只有 p 恰好等于残差（例如 p 是 one-hot）时才无偏
    beta = np.minimum(p, q).sum()
    bias = dl.variant_output_dist(p, q, "resample_p") - p
    assert np.allclose(bias, (1 - beta) * (p - dl.residual(p, q)), atol=1e-12)


def test_verify_monte_carlo_matches_variant_dist():
    """_verify（γ = 1）的第一个输出 token 的频率 = variant_output_dist（独立的闭式）。"""
    rng = np.random.default_rng(5)
    V, n = 6, 60000
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    P = np.broadcast_to(np.stack([p, rng.dirichlet(np.ones(V))]), (n, 2, V))
    Q = np.broadcast_to(q, (n, 1, V))
    D = dl.sample_rows(np.broadcast_to(q, (n, V)), rng)[:, None]
    for v in dl.SPEC_VARIANTS:
        n_acc, nxt = dl._verify(P, Q, D, rng, v)
        first = np.where(n_acc > 0, D[:, 0], nxt)
        freq = np.bincount(first, minlength=V) / n
        assert np.abs(freq - dl.variant_output_dist(p, q, v)).max() < 0.012, v


# ---------------------------------------------------------------------------
# 采样、调整
# ---------------------------------------------------------------------------
@settings(max_examples=100, **SETTINGS)
@given(prob_pairs(), st.integers(0, 2**32 - 1))
def test_sample_rows_never_picks_zero_probability(pq, seed):
    p, _ = pq
    rows = np.tile(p, (500, 1))
    idx = dl.sample_rows(rows, np.random.default_rng(seed))
    assert (p[idx] > 0).all()


def test_sample_rows_frequencies():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(7))
    s = dl.sample_rows(np.tile(p, (40000, 1)), rng)
    _, _, pval = dl.chi_square_gof(s[:, None], p)
    assert pval > 1e-4


def test_adjust():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 11))
    g = dl.adjust(z, 0)
    assert np.array_equal(g.argmax(-1), z.argmax(-1)) and np.array_equal(g.sum(-1), np.ones(5))
    assert np.allclose(dl.adjust(z, 1.0), np.exp(z) / np.exp(z).sum(-1, keepdims=True))
    k3 = dl.adjust(z, 0.5, top_k=3)
    assert ((k3 > 0).sum(-1) == 3).all()
    assert np.isfinite(dl.adjust(z, 1e-300)).all()                       # 极小温度也不出 nan
    with pytest.raises(ValueError, match="temperature"):
        dl.adjust(z, -0.1)
    with pytest.raises(ValueError, match="top_k"):
        dl.adjust(z, 1.0, top_k=12)
    with pytest.raises(ValueError, match="nan"):
        dl.adjust(np.array([0.0, np.nan]), 1.0)


# ---------------------------------------------------------------------------
# Leviathan 的公式与卡方工具
# ---------------------------------------------------------------------------
@settings(max_examples=200, **SETTINGS)
@given(st.floats(0.0, 0.999), st.integers(0, 30), st.floats(0.0, 2.0))
def test_formulas_closed_forms(a, g, c):
    e = dl.expected_tokens(a, g)
    assert math.isclose(e, (1 - a ** (g + 1)) / (1 - a), rel_tol=1e-9)
    assert dl.ops_factor(a, g, c) >= 1 - 1e-12                           # 投机解码从不减少总运算量
    assert dl.expected_tokens(1.0, g) == g + 1


@settings(max_examples=100, **SETTINGS)
@given(st.integers(0, 30), st.floats(0.0, 2.0))
def test_ops_factor_limits(g, c_hat):
    """定理 3.11 的两端，按"一轮做了多少活、留下几个 token"直接数：
    α = 0：每轮目标算 γ+1 个位置、草稿算 γ 个（每个 ĉ），只留下补上的 1 个 token；α = 1：留下 γ+1 个。"""
    work = (g + 1) + g * c_hat
    assert math.isclose(dl.ops_factor(0.0, g, c_hat), work, rel_tol=1e-12)
    assert math.isclose(dl.ops_factor(1.0, g, c_hat), work / (g + 1), rel_tol=1e-12)


def _constant_beta_pair(V=6, seed=12):
    """每个上下文的 (p, q) 都是同一对 (p0, q0) 循环移位：接受概率 β = Σ min(p0, q0) 与上下文无关，
    于是每个草稿独立地以 α = β 被接受——正是 Leviathan 公式的假设。"""
    rng = np.random.default_rng(seed)
    p0, q0 = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    tp = np.log(np.stack([np.roll(p0, a) for a in range(V)]))
    tq = np.log(np.stack([np.roll(q0, a) for a in range(V)]))
    return tp, tq, float(np.minimum(p0, q0).sum())


class _CountingLM(dl.NGramLM):
    """数自己被喂了多少个 token、被调用了多少次（独立于 speculative_generate 自己的统计）。"""

    def __init__(self, table, name):
        super().__init__(table, name)
        self.fed, self.calls = 0, 0

    def logits(self, tokens, cache, counter=None):
        self.fed += len(tokens)
        self.calls += 1
        return super().logits(tokens, cache, counter)


def test_ops_factor_matches_counted_work():
    """定理 3.11 对照实际数出来的活：目标每验证一个位置算 1，草稿每次前向算 ĉ；除以产出的 token 数。"""
    tp, tq, alpha = _constant_beta_pair()
    rng = np.random.default_rng(2)
    for gamma, c_hat in ((3, 0.5), (6, 0.1)):
        target, draft = _CountingLM(tp, "t"), _CountingLM(tq, "d")
        _, stats = dl.speculative_generate(target, draft, np.array([0]), 1500, gamma, 1.0, rng)
        produced = sum(a + 1 for a in stats["accepted"])                  # 含最后一轮被截掉的部分
        measured = (target.fed + c_hat * draft.calls) / produced
        assert abs(measured / dl.ops_factor(alpha, gamma, c_hat) - 1) < 0.06, (gamma, measured)


def test_acceptance_rate_estimate_along_path():
    """stats["beta"]：每轮被检验过的草稿位置 = 接受的 + 第一个被拒的（全收时是 γ 个），
    值 = 该位置上下文里的 Σ min(p, q)——沿输出序列用两张 bigram 表独立重算。"""
    rng = np.random.default_rng(9)
    V = 5
    tp, tq = np.log(rng.dirichlet(np.ones(V), size=V)), np.log(rng.dirichlet(np.ones(V) * 3, size=V))
    P, Q = np.exp(tp), np.exp(tq)
    for gamma in (1, 2, 4):
        prompt = np.array([3, 1])
        out, stats = dl.speculative_generate(dl.NGramLM(tp), dl.NGramLM(tq), prompt, 300, gamma, 1.0, rng)
        assert any(a == gamma for a in stats["accepted"]) and any(a < gamma for a in stats["accepted"])
        n_tested = sum(min(a + 1, gamma) for a in stats["accepted"])
        assert len(stats["beta"]) == n_tested
        full, pos, expect = list(prompt) + out, len(prompt), []
        for a in stats["accepted"]:
            tested = min(a + 1, gamma)
            if pos - 1 + tested > len(full):                              # 最后一轮的 token 被截掉了
                break
            expect += [float(np.minimum(P[c], Q[c]).sum()) for c in full[pos - 1:pos - 1 + tested]]
            pos += a + 1
        assert len(expect) > 50
        assert np.allclose(stats["beta"][:len(expect)], expect, atol=1e-12)
    # 上下文无关的 β：α̂ = 平均 β 正是公式里的 α，每轮产出的平均数对上式 (1)
    tp, tq, alpha = _constant_beta_pair()
    _, stats = dl.speculative_generate(dl.NGramLM(tp), dl.NGramLM(tq), np.array([0]), n_new=1500, gamma=4,
                                       temperature=1.0, rng=rng)
    assert math.isclose(np.mean(stats["beta"]), alpha, rel_tol=1e-12)
    assert abs(np.mean(np.array(stats["accepted"]) + 1) / dl.expected_tokens(alpha, 4) - 1) < 0.08


def test_walltime_speedup_monte_carlo():
    """定理 3.8 对照独立模拟：一轮花 γ·c（草稿）+ 1（验证）个单位时间，每个草稿以 α 独立被接受；
    普通 decode 每个单位时间产出 1 个 token。加速比 = 产出的 token 数 / 花掉的时间。"""
    rng = np.random.default_rng(6)
    for a, g, c in ((0.6, 3, 0.1), (0.85, 7, 0.05), (0.9, 10, 0.0), (0.5, 2, 0.8)):
        ok = rng.random((100000, g)) < a
        tokens = (np.cumprod(ok, axis=1).sum(axis=1) + 1).sum()
        clock = g * c + 1.0                                               # γ 次草稿前向 + 1 次目标验证
        assert abs(tokens / (len(ok) * clock) / dl.walltime_speedup(a, g, c) - 1) < 0.01, (a, g, c)


@settings(max_examples=60, **SETTINGS)
@given(st.floats(0.0, 0.99), st.floats(0.0, 1.0))
def test_best_gamma_brute_force(a, c):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, s = dl.best_gamma(a, c, gamma_max=40)
    best = max(((dl.walltime_speedup(a, k, c), -k) for k in range(1, 41)))
    # 最优 γ 落在搜索上限上时要发警告（原来悄悄返回上限），其他时候不发
    assert any(issubclass(w.category, RuntimeWarning) for w in caught) == (g == 40)
    if best[0] > 1:
        assert (g, s) == (-best[1], best[0])
    else:
        assert (g, s) == (0, 1.0)


def test_expected_tokens_monte_carlo():
    """式 (1) 对照独立模拟：每个草稿以 α 独立被接受，一轮产出 = 连续接受数 + 1。"""
    rng = np.random.default_rng(3)
    for a, g in ((0.6, 3), (0.85, 7)):
        ok = rng.random((200000, g)) < a
        produced = np.cumprod(ok, axis=1).sum(axis=1) + 1
        assert abs(produced.mean() - dl.expected_tokens(a, g)) < 0.02


def test_chi2_sf_bad_input():
    for x in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="x"):
            dl.chi2_sf(x, 3)
    with pytest.raises(ValueError, match="dof"):
        dl.chi2_sf(2.0, 0)
    with pytest.raises(TypeError, match="dof"):
        dl.chi2_sf(2.0, 2.5)
    assert dl.chi2_sf(0.0, 3) == 1.0


def test_probabilities_must_be_normalised():
    """不归一化 / 负 / 非有限的 p、q 必须报错并指名道姓，不能给出 β = 1 之类看似合理的错误答案。"""
    cases = [([0.7, 0.7], [0.5, 0.5], "p"), ([0.5, 0.5], [0.2, 0.2], "q"), ([2.0, 2.0], [1.0, 0.0], "p"),
             ([1.2, -0.2], [0.5, 0.5], "p"), ([0.5, 0.5], [np.nan, 0.5], "q"), ([np.inf, 0.0], [0.5, 0.5], "p")]
    for p, q, name in cases:
        for fn in (dl.spec_output_dist, dl.residual, lambda p, q: dl.variant_output_dist(p, q, "resample_p"),
                   lambda p, q: dl.variant_output_dist(p, q, "accept_if_p_ge_q")):
            with pytest.raises(ValueError, match=f"^{name} "):
                fn(p, q)
    ok = np.array([[0.25, 0.75], [1.0, 0.0]])
    with pytest.raises(ValueError, match="^q "):                        # 批里只有一行没归一化也要报
        dl.spec_output_dist(ok, np.array([[0.5, 0.5], [0.5, 0.4]]))
    assert np.array_equal(dl.residual(ok, np.zeros_like(ok)), ok)        # 只有 residual 允许"没有草稿"的全 0 行
    with pytest.raises(ValueError, match="^q "):
        dl.spec_output_dist(ok, np.zeros_like(ok))


@settings(max_examples=100, **SETTINGS)
@given(st.floats(0.01, 200.0), st.integers(1, 40))
def test_chi2_sf_closed_forms(x, half_dof):
    k = 2 * half_dof                                                      # 偶数自由度：闭式
    closed = math.exp(-x / 2) * sum((x / 2) ** j / math.factorial(j) for j in range(half_dof))
    assert math.isclose(dl.chi2_sf(x, k), closed, rel_tol=1e-9, abs_tol=1e-300)
    assert math.isclose(dl.chi2_sf(x, 1), math.erfc(math.sqrt(x / 2)), rel_tol=1e-9, abs_tol=1e-300)


# ---------------------------------------------------------------------------
# 选择性批处理
# ---------------------------------------------------------------------------
@settings(max_examples=25, **SETTINGS)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 7)), min_size=1, max_size=5), st.integers(0, 1000))
def test_ragged_equals_per_request(plan, seed):
    cfg, params = TARGET.cfg, TARGET.params
    rng = np.random.default_rng(seed)
    caches, refs, chunks = [], [], []
    for ctx, new in plan:
        c, rc = tl.KVCache(cfg, 1), tl.KVCache(cfg, 1)
        if ctx:
            h = rng.integers(0, cfg.vocab, (1, ctx))
            tl.forward(params, cfg, h, cache=c)
            tl.forward(params, cfg, h, cache=rc)
        caches.append(c)
        refs.append(rc)
        chunks.append(rng.integers(0, cfg.vocab, new))
    together, apart = tl.Counter(), tl.Counter()
    outs = dl.ragged_forward(params, cfg, chunks, caches, counter=together)
    for o, ch, rc, c in zip(outs, chunks, refs, caches):
        ref = tl.forward(params, cfg, ch[None], cache=rc, counter=apart)[0]
        assert o.shape == ref.shape and np.max(np.abs(o - ref)) < 1e-12
        assert c.length == rc.length
    for op in set(together.rows) | set(apart.rows):                       # 账：除了读权重，逐项相同
        for key in ("flops", "useful", "kv", "act"):
            assert np.isclose(together.rows[op][key], apart.rows[op][key]), (op, key)
    assert np.isclose(apart.total("w", tl.MATMUL_OPS), len(plan) * together.total("w", tl.MATMUL_OPS))


def test_ragged_bad_input():
    cfg, params = TARGET.cfg, TARGET.params
    with pytest.raises(ValueError, match="一一对应"):
        dl.ragged_forward(params, cfg, [np.array([1])], [])
    with pytest.raises(ValueError, match="chunks\\[0\\]"):
        dl.ragged_forward(params, cfg, [np.array([], dtype=int)], [tl.KVCache(cfg, 1)])
    with pytest.raises(ValueError, match="剩余容量"):
        dl.ragged_forward(params, cfg, [np.zeros(cfg.max_seq + 1, dtype=int)], [tl.KVCache(cfg, 1)])


# ---------------------------------------------------------------------------
# 投机解码：贪心等价、分布、回滚、坏输入
# ---------------------------------------------------------------------------
@settings(max_examples=20, **SETTINGS)
@given(st.lists(st.integers(0, 23), min_size=1, max_size=8), st.integers(1, 6), st.integers(0, 25),
       st.booleans())
def test_greedy_speculative_equals_greedy(prompt, gamma, n_new, use_bigram):
    rng = np.random.default_rng(0)
    draft = dl.NGramLM.fit([np.arange(24), np.arange(24)[::-1]], 24) if use_bigram else DRAFT
    ref, _ = dl.autoregressive_generate(TARGET, np.array(prompt), n_new, 0.0, rng)
    out, st_ = dl.speculative_generate(TARGET, draft, np.array(prompt), n_new, gamma, 0.0, rng)
    assert out == ref
    assert st_["target_calls"] == st_["rounds"] == len(st_["accepted"])
    assert st_["draft_calls"] == gamma * st_["rounds"]
    assert all(0 <= a <= gamma for a in st_["accepted"])
    # 回滚的不变式：每轮之后目标 cache = 已确定序列 − 1
    done = np.cumsum([a + 1 for a in st_["accepted"]])
    assert st_["t_cache"] == [len(prompt) + int(d) - 1 for d in done]


def test_speculative_generate_distribution():
    """speculative_generate（带 cache 和回滚的那条实现）的输出分布 = 目标模型自己的分布（bigram 模型，便宜）。"""
    rng = np.random.default_rng(11)
    V = 5
    target = dl.NGramLM(np.log(rng.dirichlet(np.ones(V), size=V)), "target")
    draft = dl.NGramLM(np.log(rng.dirichlet(np.ones(V), size=V)), "draft")
    prompt = np.array([2])
    exact = dl.exact_continuation_dist(target, prompt, 2, 1.0)
    samples = np.array([dl.speculative_generate(target, draft, prompt, n_new=2, gamma=2, temperature=1.0,
                                                rng=rng)[0] for _ in range(5000)])
    assert dl.chi_square_gof(samples, exact)[2] > 1e-4


def test_spec_sample_batch_variants():
    rng = np.random.default_rng(4)
    V = 6
    target = dl.NGramLM(np.log(rng.dirichlet(np.ones(V), size=V)), "target")
    draft = dl.NGramLM(np.log(rng.dirichlet(np.ones(V), size=V)), "draft")
    prompt = np.array([0, 3])
    exact = dl.exact_continuation_dist(target, prompt, 2, 0.8)
    pvals = {v: dl.chi_square_gof(dl.spec_sample_batch(target, draft, prompt, n_out=2, gamma=3,
                                                       temperature=0.8, n_samples=30000, rng=rng, variant=v), exact)[2]
             for v in dl.SPEC_VARIANTS}
    assert pvals["correct"] > 1e-4
    assert pvals["resample_p"] < 1e-8 and pvals["accept_if_p_ge_q"] < 1e-8


def test_rollback_and_caches():
    c = TARGET.new_cache()
    TARGET.logits([1, 2, 3, 4], c)
    TARGET.rollback(c, 2)
    assert c.length == 2
    with pytest.raises(ValueError, match="回滚只能变短"):
        TARGET.rollback(c, 3)
    b = dl.NGramLM.fit([np.arange(24)], 24)
    tc = b.new_cache()
    b.logits([5, 6, 7], tc)
    b.rollback(tc, 1)
    assert tc.toks == [5]


def test_speculative_bad_input():
    rng = np.random.default_rng(0)
    p = np.array([1, 2])
    with pytest.raises(ValueError, match="gamma"):
        dl.speculative_generate(TARGET, DRAFT, p, n_new=5, gamma=0, temperature=1.0, rng=rng)
    with pytest.raises(TypeError, match="gamma"):
        dl.speculative_generate(TARGET, DRAFT, p, n_new=5, gamma=2.5, temperature=1.0, rng=rng)
    with pytest.raises(ValueError, match="temperature"):
        dl.speculative_generate(TARGET, DRAFT, p, 5, 2, -1.0, rng)
    with pytest.raises(ValueError, match="prompt"):
        dl.speculative_generate(TARGET, DRAFT, np.array([], dtype=int), n_new=5, gamma=2, temperature=1.0, rng=rng)
    with pytest.raises(ValueError, match="prompt"):
        dl.speculative_generate(TARGET, DRAFT, np.array([99]), n_new=5, gamma=2, temperature=1.0, rng=rng)
    with pytest.raises(ValueError, match="词表"):
        dl.speculative_generate(TARGET, dl.NGramLM(np.zeros((5, 5))), p, n_new=5, gamma=2, temperature=1.0, rng=rng)
    with pytest.raises(ValueError, match="容量"):
        dl.speculative_generate(TARGET, DRAFT, p, TARGET.capacity, 2, 1.0, rng)
    with pytest.raises(ValueError, match="variant"):
        dl.spec_sample_batch(TARGET, DRAFT, p, n_out=1, gamma=1, temperature=1.0, n_samples=10, rng=rng, variant="oops")
    with pytest.raises(ValueError, match="gamma"):
        dl.spec_sample_batch(TARGET, DRAFT, p, n_out=1, gamma=0, temperature=1.0, n_samples=10, rng=rng)
    with pytest.raises(ValueError, match="alpha"):
        dl.expected_tokens(1.5, 3)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="c（"):
            dl.walltime_speedup(0.8, 3, bad)
        with pytest.raises(ValueError, match="c_hat"):
            dl.ops_factor(0.8, 3, bad)


# ---------------------------------------------------------------------------
# 树形验证：和显式建树的贪心验证对照
# ---------------------------------------------------------------------------
def _tree_reference(target, draft, seq, start, branching):
    """显式地一层层建树：第 d 层取草稿在（已接受）前缀上的前 k_d 名；目标的贪心下一个 token 在里面就接受。"""
    prefix = list(seq[:start + 1])
    for k in branching:
        dlg = draft.full_logits(np.array([prefix]))[0, -1]
        cands = [x for x in range(len(dlg)) if (dlg > dlg[x]).sum() < k]
        nxt = int(np.argmax(target.full_logits(np.array([prefix]))[0, -1]))
        if nxt not in cands:
            break
        prefix.append(nxt)
    return len(prefix) - start - 1


def test_tree_accept_lengths_brute_force():
    rng = np.random.default_rng(8)
    bigram = dl.NGramLM.fit(TARGET.sample(np.array([1, 2]), n_seq=64, n_new=16, temperature=1.0, rng=rng), 24)
    seq = np.concatenate([[7, 3], dl.autoregressive_generate(TARGET, np.array([7, 3]), 26, 0.0, rng)[0]])
    for draft in (bigram, DRAFT):
        # 从位置 1 起：seq[2:] 才是目标的贪心续写（seq[1] 是 prompt 的一部分）
        ranks = dl.draft_ranks(draft.full_logits(seq[None])[0][1:], seq[1:])
        for br in ((1,), (1, 1, 1), (2, 1), (3, 2, 2), (5, 1, 3, 1)):
            acc, nodes = dl.tree_accept_lengths(ranks, br)
            assert nodes == sum(int(np.prod(br[:d + 1])) for d in range(len(br)))
            ref = [_tree_reference(TARGET, draft, seq, t + 1, br) for t in range(len(acc))]
            assert acc.tolist() == ref, (draft.name, br)


def test_tree_nodes_and_round_validate():
    assert dl.tree_nodes([2, 3]) == 2 + 6
    for bad in ([0], [-1, 2], [], [1.5], [[1, 2]]):
        with pytest.raises(ValueError, match="branching"):
            dl.tree_nodes(bad)
        with pytest.raises(ValueError, match="branching"):
            dl.tree_accept_lengths(np.zeros(6, dtype=int), bad)
    hw = load_lab("lecture01", "hw_specs")
    T, chip = dl.LLAMA31_8B, hw.H100_SXM
    # 树深 2、110 个节点：一轮最多接受 2 个草稿（一条根到叶的路径），不是 110 个
    wide = (10, 10)
    assert dl.tree_nodes(wide) == 110
    r = dl.tree_round(T, chip, batch=1, ctx=512, mean_accept=2.0, branching=wide)
    assert r["speedup"] < 3.0                                            # ≤ (1 + D) 倍：验证不会比 decode 快
    for too_long in (2.5, 50.0):
        with pytest.raises(ValueError, match="mean_accept"):
            dl.tree_round(T, chip, 1, 512, too_long, wide)
    with pytest.raises(ValueError, match="branching"):
        dl.tree_round(T, chip, batch=1, ctx=512, mean_accept=1.0, branching=[0, 2])
    # 链 (1, …, 1) 的树形验证 = 普通投机解码的一次验证（草稿时间取 0）
    chain = dl.tree_round(T, chip, batch=4, ctx=512, mean_accept=1.5, branching=(1, 1, 1, 1))
    assert math.isclose(chain["t_verify"], dl.verify_time(T, chip, batch=4, ctx=512, n_tokens=5,
                                                          overhead=1e-3), rel_tol=1e-12)


@settings(max_examples=100, **SETTINGS)
@given(st.lists(st.integers(0, 6), min_size=6, max_size=40), st.lists(st.integers(1, 4), min_size=1, max_size=5),
       st.data())
def test_tree_monotone_in_branching(ranks, br, data):
    bigger = [k + data.draw(st.integers(0, 2)) for k in br]
    a, _ = dl.tree_accept_lengths(np.array(ranks), br)
    b, _ = dl.tree_accept_lengths(np.array(ranks), bigger)
    assert (b >= a).all() and (a <= len(br)).all()


# ---------------------------------------------------------------------------
# 调度模拟的不变式
# ---------------------------------------------------------------------------
class ToyStep:
    """接口和 StepModel 相同的玩具时间模型：容量随意设，时间 = 固定开销 + 每 token 的线性代价。"""

    def __init__(self, capacity, model=dl.GPT3_13B):
        self.cap, self.model = capacity, model

    def kv_capacity_tokens(self):
        return self.cap

    def prefill_time(self, prompt_lens):
        return 1e-3 + 1e-5 * sum(prompt_lens)

    def decode_time(self, batch, ctx_tokens):
        return 1e-3 + 1e-5 * batch + 1e-8 * ctx_tokens

    def mixed_time(self, n_decode, ctx_tokens, prefill_tokens, prefill_attn_flops):
        return 1e-3 + 1e-5 * (n_decode + prefill_tokens) + 1e-8 * ctx_tokens


def _check_iteration_run(reqs, res, hist, max_bs, cap):
    n = len(reqs)
    if not res["deadlock"]:
        assert res["done"] == n and all(r.gen == r.output and math.isfinite(r.finish) for r in reqs)
    assert res["admit_order"] == sorted(res["admit_order"])                           # FCFS：按到达接纳
    admitted = [r for r in reqs if r.admitted]
    assert [r.rid for r in admitted] == res["admit_order"]
    assert [r.rid for r in reqs[:len(admitted)]] == res["admit_order"]                # 是到达序列的一个前缀
    counts = {}
    prev_end = 0.0
    for h in hist:
        assert prev_end <= h["t0"] < h["t1"]                                           # 时间不倒流、迭代不重叠
        prev_end = h["t1"]
        assert h["used"] <= h["reserved"] <= cap                                       # 预留盖得住实际写入
        assert 0 < len(h["prefill"]) + len(h["decode"]) <= max_bs
        for rid in h["prefill"] + h["decode"]:
            counts[rid] = counts.get(rid, 0) + 1
        for rid in h["prefill"]:
            assert reqs[rid].arrival <= h["t0"]
    for r in reqs:
        if math.isfinite(r.finish):                                                    # 恰好完成一次
            assert counts[r.rid] == r.output
            assert r.arrival <= r.admit_t < r.first_tok <= r.finish


@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 40), st.floats(1.0, 500.0), st.integers(1, 12), st.sampled_from(dl.RESERVE_MODES),
       st.integers(600, 4000), st.integers(0, 99), st.one_of(st.none(), st.integers(100, 200)))
def test_iteration_level_invariants(n, rate, max_bs, reserve, cap, seed, max_gen):
    reqs = dl.orca_workload(n, rate, seed=seed, prompt_range=(5, 300), gen_range=(1, 60), max_gen=max_gen)
    hist = []
    res = dl.run_iteration_level(reqs, ToyStep(cap), max_bs, reserve=reserve, max_seq=512, history=hist)
    assert reserve == "none" or not res["deadlock"]
    _check_iteration_run(reqs, res, hist, max_bs, cap)
    # 同一组请求再模拟一次：结果完全相同（开始时清零）
    res2 = dl.run_iteration_level(reqs, ToyStep(cap), max_bs, reserve=reserve, max_seq=512)
    assert {k: res[k] for k in ("done", "iters", "deadlock")} == {k: res2[k] for k in ("done", "iters", "deadlock")}


def test_iteration_level_real_step_model():
    sm = dl.StepModel(dl.GPT3_13B, dl.A100_40G)
    for reserve in dl.RESERVE_MODES:
        reqs = dl.orca_workload(80, 8.0, seed=1)
        hist = []
        res = dl.run_iteration_level(reqs, sm, 32, reserve=reserve, history=hist)
        assert not res["deadlock"]
        _check_iteration_run(reqs, res, hist, 32, sm.kv_capacity_tokens())


def test_none_mode_deadlocks_and_reservation_does_not():
    # 容量 10：两个请求各占 5 个输入就满了，下一步谁都写不进 1 个 KV → 死锁；按 max_gen 预留则一个个跑完
    reqs = [dl.Req(rid=k, arrival=0.0, prompt=5, output=4, max_gen=4) for k in range(2)]
    res = dl.run_iteration_level(reqs, ToyStep(10), 8, reserve="none")
    assert res["deadlock"] and res["done"] == 0 and res["deadlock_t"] is not None
    with pytest.raises(ValueError, match="没有完成"):
        dl.latency_throughput(reqs)
    res = dl.run_iteration_level(reqs, ToyStep(10), 8, reserve="max_gen")
    assert not res["deadlock"] and res["done"] == 2
    assert reqs[1].admit_t >= reqs[0].finish                               # 第二个要等第一个释放预留


def test_request_that_never_fits_is_an_error():
    for reserve in dl.RESERVE_MODES:
        with pytest.raises(ValueError, match="永远不可能"):
            dl.run_iteration_level([dl.Req(rid=0, arrival=0.0, prompt=50, output=60, max_gen=60)],
                                   ToyStep(100), 4, reserve=reserve, max_seq=200)
    with pytest.raises(ValueError, match="max_seq"):
        dl.run_request_level([dl.Req(rid=0, arrival=0.0, prompt=50, output=10, max_gen=10)], ToyStep(1000), 4,
                             max_seq=40)
    with pytest.raises(ValueError, match="放不下一个"):
        dl.run_request_level([dl.Req(rid=0, arrival=0.0, prompt=5, output=10, max_gen=10)], ToyStep(100), 4,
                             max_seq=200)
    with pytest.raises(ValueError, match="reserve"):
        dl.run_iteration_level([dl.Req(rid=0, arrival=0.0, prompt=5, output=1, max_gen=1)], ToyStep(100), 4,
                               reserve="lazy")
    with pytest.raises(ValueError, match="排序"):
        late_first = [dl.Req(rid=0, arrival=1.0, prompt=5, output=1, max_gen=1),
                      dl.Req(rid=1, arrival=0.0, prompt=5, output=1, max_gen=1)]
        dl.run_iteration_level(late_first, ToyStep(100), 4)
    with pytest.raises(ValueError, match="max_gen"):
        dl.Req(rid=0, arrival=0.0, prompt=5, output=10, max_gen=3)


@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 40), st.floats(0.5, 300.0), st.integers(1, 10), st.integers(0, 99))
def test_request_level_invariants(n, rate, max_bs, seed):
    reqs = dl.orca_workload(n, rate, seed=seed)
    hist = []
    step = ToyStep(5 * 2048 + 7)                                           # 显存只够 5 个 2048 的预留
    res = dl.run_request_level(reqs, step, max_bs, history=hist)
    assert res["max_bs_used"] == min(max_bs, 5) and res["batches"] == len(hist)
    assert [rid for h in hist for rid in h["rids"]] == list(range(n))     # FCFS，每个请求恰好一次
    prev = 0.0
    for h in hist:
        assert prev <= h["t0"] < h["t1"] and len(h["rids"]) <= res["max_bs_used"]
        prev = h["t1"]
        for rid in h["rids"]:
            r = reqs[rid]
            assert r.arrival <= h["t0"] and r.finish == h["t1"] and r.admit_t == h["t0"] < r.first_tok
    assert res["slot_tokens"] >= res["useful_tokens"] == sum(r.prompt + r.output - 1 for r in reqs)


def test_orca_workload():
    a = dl.orca_workload(500, 2.0, seed=4)
    b = dl.orca_workload(500, 8.0, seed=4)
    assert [r.prompt for r in a] == [r.prompt for r in b]                 # 换速率只伸缩时间轴
    assert np.allclose([r.arrival for r in a], [4 * r.arrival for r in b])
    assert all(32 <= r.prompt <= 512 and 1 <= r.output == r.max_gen <= 128 for r in a)
    assert abs(len(a) / a[-1].arrival - 2.0) < 0.3                        # 泊松强度
    c = dl.orca_workload(200, 1.0, max_gen=100)
    assert all(r.max_gen == max(100, r.output) for r in c)
    with pytest.raises(ValueError, match="rate"):
        dl.orca_workload(5, 0.0)
    with pytest.raises(ValueError, match="prompt_range"):
        dl.orca_workload(5, 1.0, prompt_range=(10, 5))


def test_one_scheduler_behind_two_lectures():
    """第 5 讲 make_requests / simulate_continuous 与第 6 讲 orca_workload / run_iteration_level 是同一份实现：
    同一个种子给出同一批请求，Orca 的预留（max_gen = output）下每个请求的完成时刻逐位相同。"""
    ss = dl.serving_sim
    step = ss.StepModel(dl.GPT3_13B, dl.A100_40G)
    for rate in (0.5, 2.0, 8.0):
        orca = dl.orca_workload(150, rate, seed=9)
        lec5 = ss.make_requests(150, rate, prompt=("uniform", 32, 512), output=("uniform", 1, 128), seed=9)
        assert [(r.arrival, r.prompt, r.output) for r in orca] == [(r.arrival, r.prompt, r.output) for r in lec5]
        info = dl.run_iteration_level(orca, step, 16)
        done, _ = ss.simulate_continuous(lec5, step, 16)
        assert info["done"] == len(orca)
        assert [r.finish for r in orca] == [r.t_finish for r in done]
        assert [r.first_tok for r in orca] == [r.t_first for r in done]


# ---------------------------------------------------------------------------
# 硬件视角
# ---------------------------------------------------------------------------
def test_verify_time_and_rounds():
    hw = load_lab("lecture01", "hw_specs")
    T, D, chip = dl.LLAMA31_8B, dl.LLAMA32_1B, hw.H100_SXM
    # batch 1、短上下文：受带宽限制，时间 = 读的字节 / (带宽 × 0.8)（独立按字节算一遍）
    by = T.matmul_params() * 2 + 1 * (100 + 1) * T.kv_bytes_per_token(2.0)
    assert math.isclose(dl.verify_time(T, chip, batch=1, ctx=100, n_tokens=1), by / (chip.mem_bw * 0.8), rel_tol=1e-12)
    # 批大、上下文短：受算力限制，时间 = FLOPs / (峰值 × 0.6)；FLOPs 逐个新 token 数它看见的 ctx + j 个 key
    B, ctx, n = 1024, 256, 5
    flops = B * sum(2 * T.matmul_params() + 4 * T.n_layers * T.n_heads * T.d_head * (ctx + j) for j in range(1, n + 1))
    for w_bytes, prec in ((2.0, "bf16"), (1.0, "fp8")):                    # FP8 权重用 FP8 的峰值
        t = dl.verify_time(T, chip, B, ctx, n, w_bytes=w_bytes, overhead=1e-3)
        assert math.isclose(t, flops / (chip.peak_flops(prec) * 0.6) + 1e-3, rel_tol=1e-12), prec
    ts = [dl.verify_time(T, chip, 64, 512, n) for n in range(1, 10)]
    assert all(a <= b for a, b in zip(ts, ts[1:]))
    r0 = dl.spec_round(T, D, chip, batch=8, ctx=512, alpha=0.8, gamma=0)
    assert math.isclose(r0["speedup"], 1.0) and math.isclose(r0["verify_ratio"], 1.0)
    assert dl.best_round(T, D, chip, batch=8, ctx=512, alpha=0.0) == (0, None)           # 草稿从不被接受：不投机
    g, r = dl.best_round(T, D, chip, batch=1, ctx=512, alpha=0.9)
    assert g >= 1 and r["speedup"] == max(dl.spec_round(T, D, chip, batch=1, ctx=512, alpha=0.9,
                                                        gamma=k)["speedup"] for k in range(1, 17))
    # 显存边界：γ = 16 放不下、小一些的 γ 放得下 → best_round 只在放得下的 γ 里挑；连 γ = 1 都放不下才报错
    b = 64
    g_fit = {ctx: [k for k in range(1, 17) if dl.fits_in_memory((T, D), chip, b, ctx + k + 1)[0]]
             for ctx in range(5000, 6001)}
    ctx_mid = next(c for c, ks in g_fit.items() if 4 <= len(ks) < 16)          # 只有 γ ≤ len(ks) 放得下
    ctx_none = next(c for c, ks in g_fit.items() if not ks)
    assert g_fit[ctx_mid] == list(range(1, len(g_fit[ctx_mid]) + 1))           # 显存随 γ 单调增长
    with pytest.raises(dl.llm_math.CapacityError):                              # 原来：γ = 16 放不下就报错
        dl.spec_round(T, D, chip, batch=b, ctx=ctx_mid, alpha=0.8, gamma=16)
    g, r = dl.best_round(T, D, chip, batch=b, ctx=ctx_mid, alpha=0.8)
    want = max(range(1, len(g_fit[ctx_mid]) + 1),
               key=lambda k: dl.spec_round(T, D, chip, batch=b, ctx=ctx_mid, alpha=0.8, gamma=k)["speedup"])
    assert 1 <= g == want <= len(g_fit[ctx_mid]) and r["speedup"] > 1
    with pytest.raises(dl.llm_math.CapacityError):
        dl.best_round(T, D, chip, batch=b, ctx=ctx_none, alpha=0.8)
    with pytest.raises(ValueError, match="batch"):
        dl.verify_time(T, chip, batch=0, ctx=100, n_tokens=1)
    with pytest.raises(ValueError, match="gamma"):
        dl.spec_round(T, D, chip, batch=1, ctx=100, alpha=0.8, gamma=-1)


# ---------------------------------------------------------------------------
# 坏输入：原来悄悄通过的输入
# ---------------------------------------------------------------------------
def test_best_gamma_without_optimum_raises():
    with pytest.raises(ValueError, match="alpha=1 且 c=0"):
        dl.best_gamma(1.0, 0)
    with pytest.warns(RuntimeWarning, match="gamma_max"):
        dl.best_gamma(0.999, 0.001, gamma_max=8)


def test_prob_tolerance_follows_dtype():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(3, 5000)).astype(np.float32)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)        # float32 的 softmax：和离 1 差 ~1e-7
    assert np.abs(p.astype(np.float64).sum(axis=1) - 1).max() > dl.PROB_TOL
    out, beta = dl.spec_output_dist(p, p)                              # 原来：ValueError（容差固定 1e-9）
    assert np.allclose(out, p, atol=1e-6) and np.allclose(beta, 1.0)
    assert dl.prob_tol(np.float64, 5000) == dl.PROB_TOL
    eps32 = float(np.finfo(np.float32).eps)
    assert dl.prob_tol(np.float32, 5000) == 5000 * eps32 < dl.PROB_TOL_CAP           # n·eps：和求和顺序无关的上界
    assert dl.prob_tol(np.float32, 128256) == dl.PROB_TOL_CAP == 1e-3                # 大词表：截断，远小于 1%
    with pytest.raises(ValueError, match="归一化"):                  # 真没归一化的 float32 表照样拒绝
        dl.spec_output_dist(p * np.float32(1.01), p)


def test_prob_tolerance_at_llama3_vocab():
    """V = 128256（Llama 3 的词表）：不截断的 n·eps（1.5e-2）连乘了 1.01 的表都收，容差截在 PROB_TOL_CAP = 1e-3；
    真的 float32 softmax 要收。"""
    torch = pytest.importorskip("torch")
    V = 128256
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(4, V, generator=gen, dtype=torch.float32) * 5      # 温度让 torch 的 float32 求和误差最大（~1e-5）
    p = torch.softmax(z, dim=-1).numpy()
    assert p.dtype == np.float32
    err = np.abs(p.astype(np.float64).sum(axis=1) - 1).max()
    assert dl.PROB_TOL < err < dl.prob_tol(np.float32, V) / 3          # 真有误差，且容差留了余量
    out, beta = dl.spec_output_dist(p, p)                              # 收下（β = Σ min(p, p) = 行和）
    assert np.allclose(out, p, atol=1e-6) and np.allclose(beta, 1.0, rtol=0, atol=err)
    # 界线就在 PROB_TOL_CAP：差 1.5 倍它的表被拒，差一半的收下（0.1% 以内算舍入，见 prob_tol 的文档）
    for bad in (p * np.float32(1.01), p * np.float32(1 - 1.5 * dl.PROB_TOL_CAP)):
        with pytest.raises(ValueError, match="归一化"):
            dl.spec_output_dist(bad, p)
    dl.spec_output_dist(p * np.float32(1 - 0.5 * dl.PROB_TOL_CAP), p)


def _left_to_right_softmax(z):
    """float32 softmax，分母用 cumsum 从左到右累加（不是 numpy / torch sum 的两两求和）。"""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / np.cumsum(e, axis=-1, dtype=np.float32)[..., -1:]


def test_prob_tolerance_does_not_assume_pairwise_summation():
    """左到右求和的 float32 softmax（V = 128256）：误差超过 2√n·eps（老容差假设两两求和），照样要收；
    乘了 1.01 的同一张表要拒。"""
    V = 128256
    z = (np.random.default_rng(0).normal(size=(4, V)) * 5).astype(np.float32)
    p = _left_to_right_softmax(z)
    assert p.dtype == np.float32
    err = np.abs(p.astype(np.float64).sum(axis=1) - 1).max()
    assert 2 * np.sqrt(V) * np.finfo(np.float32).eps < err < dl.prob_tol(np.float32, V) / 3
    out, beta = dl.spec_output_dist(p, p)                              # 收下：和输入只差行和的舍入
    assert np.allclose(out, p, rtol=3 * err, atol=1e-12) and np.allclose(beta, 1.0, rtol=0, atol=err)
    with pytest.raises(ValueError, match="归一化"):
        dl.spec_output_dist(p * np.float32(1.01), p)
    with pytest.raises(ValueError, match="归一化"):
        dl.residual(p, p * np.float32(1.01))


def test_half_precision_probability_tables_rejected():
    """float16 的表不按容差收（2√n·eps 在 V = 5000 时连差 10% 的表都收）：清楚的 ValueError，说是哪个参数。"""
    V = 5000
    z = np.random.default_rng(1).normal(size=(2, V)).astype(np.float32)
    p32 = _left_to_right_softmax(z)
    p16 = p32.astype(np.float16)
    with pytest.raises(ValueError, match="p 是 float16.*半精度"):
        dl.spec_output_dist(p16, p32)
    with pytest.raises(ValueError, match="q 是 float16.*半精度"):
        dl.residual(p32, (p32 * np.float32(1.1)).astype(np.float16))
    with pytest.raises(ValueError, match="半精度"):
        dl.prob_tol(np.float16, V)
    out, _ = dl.spec_output_dist(p16.astype(np.float32) / p16.astype(np.float32).sum(axis=1, keepdims=True), p32)
    assert out.shape == (2, V)                                          # 转成 float32 再归一化：收


def test_fits_in_memory_and_capacity_errors():
    with pytest.raises(ValueError, match="models 不能为空"):
        dl.fits_in_memory([], dl.A100_40G, 1, 10)
    h100 = load_lab("lecture01", "hw_specs").H100_SXM
    with pytest.raises(dl.llm_math.CapacityError):                     # 405B 在一张 H100 上：没有"加速比"
        dl.spec_round(dl.llm_math.LLAMA31_405B, dl.LLAMA32_1B, h100, batch=1, ctx=1024, alpha=0.8, gamma=4)
    with pytest.raises(dl.llm_math.CapacityError):
        dl.verify_time(dl.llm_math.LLAMA31_405B, h100, batch=1, ctx=1024, n_tokens=5)


def test_sample_rows_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="np.random.Generator"):
        dl.sample_rows(np.ones((2, 3)) / 3, rng=0)


def test_variant_output_dist_accepts_float32_tables():
    """float32 的概率表按 float32 的容差核对（以前在内部按 float64 的容差重查而报错）。"""
    r = np.random.default_rng(0)
    p, q = (r.dirichlet(np.ones(5000)).astype(np.float32) for _ in range(2))
    out = dl.variant_output_dist(p, q, "correct")
    assert abs(float(out.sum()) - 1) < 1e-6 and float(np.abs(out - p).max()) < 1e-6
