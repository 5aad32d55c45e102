"""lecture04/modern_lm.py 的单元测试与性质测试。

_selftest() 和演示的 --quick 由 test_harness.py 在子进程里跑，这里不重复。这里测：
  · 随机小配置（位置方案、窗口、GQA 组数、归一化、MLP、pre/post-norm、tied）上：KV cache 分段计算 = 整段计算；
    GQA 展开成 MHA 后 logits 相同；
  · 随机的第 2 讲配置：第 2 讲 numpy 前向 = from_lecture02 装进 ModernLM 的前向（float64）；
  · RoPE：半对半与交错只差 half_to_interleaved 排列（含小数位置）；分数只依赖相对位置；
  · 注意力（GQA + 窗口 + ALiBi）对照逐头显式 softmax；正弦表、ALiBi 斜率对照定义；参数量 = llm_math 公式；
  · 合成语言：每个 token 的真实对数概率可以只从 token 本身独立重算；复制块与来源相同；
  · 训练：学习率日程；中断后续训与一口气训完的权重逐位相同；检查点损坏 / 配置不符 → 重训；入库的检查点都能核对通过；
  · 坏输入：报错里写出参数名与允许的取值。
"""
import json
import math
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

ml = load_lab("lecture04", "modern_lm")
tl = load_lab("lecture02", "transformer_lab")
F64 = torch.float64


# ---------------------------------------------------------------------------
# 随机小配置
# ---------------------------------------------------------------------------
@st.composite
def lm_configs(draw):
    H = draw(st.integers(1, 4))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    pos = draw(st.sampled_from(ml.POSITIONS))
    d_model = 2 * draw(st.integers(2, 9))
    return ml.LMConfig(vocab=draw(st.integers(3, 23)), d_model=d_model, n_layers=draw(st.integers(1, 2)),
                       n_heads=H, n_kv_heads=G, d_head=2 * draw(st.integers(1, 4)), d_ff=draw(st.integers(1, 13)),
                       max_seq=24, norm=draw(st.sampled_from(ml.NORMS)),
                       norm_place=draw(st.sampled_from(ml.NORM_PLACES)),
                       mlp=draw(st.sampled_from(ml.MLPS)), pos=pos, window=draw(st.integers(0, 5)),
                       tied=draw(st.booleans()), rope_base=draw(st.sampled_from([10000.0, 37.0])))


def _model(cfg, seed):
    torch.manual_seed(seed)
    return ml.ModernLM(cfg).double().eval()


@settings(deadline=None, max_examples=40)
@given(cfg=lm_configs(), seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3),
       cuts=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_cache_in_pieces_equals_whole(cfg, seed, B, cuts):
    """整段前向 = 分几段、每段接在 KV cache 后面的前向（任何位置方案、窗口、GQA 组数）。"""
    model = _model(cfg, seed)
    T = sum(cuts)
    ids = torch.randint(0, cfg.vocab, (B, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        whole = model(ids)
        cache, parts, t = ml.KVCache(cfg), [], 0
        for c in cuts:
            parts.append(model(ids[:, t:t + c], cache))
            t += c
    assert cache.length == T
    assert torch.allclose(torch.cat(parts, dim=1), whole, atol=1e-11, rtol=0)


@settings(deadline=None, max_examples=25)
@given(cfg=lm_configs(), seed=st.integers(0, 2**31 - 1))
def test_gqa_expanded_to_mha_is_identical(cfg, seed):
    model = _model(cfg, seed)
    ids = torch.randint(0, cfg.vocab, (2, 9), generator=torch.Generator().manual_seed(seed))
    big = ml.expand_kv_heads(model)
    assert big.cfg.n_kv_heads == cfg.n_heads
    with torch.no_grad():
        assert torch.allclose(model(ids), big(ids), atol=1e-12, rtol=0)


@st.composite
def lecture02_configs(draw):
    H = draw(st.integers(1, 5))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    return tl.Config(vocab=draw(st.integers(3, 31)), d_model=draw(st.integers(2, 17)), n_layers=draw(st.integers(1, 3)),
                     n_heads=H, n_kv_heads=G, d_head=2 * draw(st.integers(1, 5)), d_ff=draw(st.integers(1, 15)),
                     max_seq=32, rope_theta=draw(st.sampled_from([10000.0, 500000.0, 7.5])), tied=draw(st.booleans()))


@settings(deadline=None, max_examples=25)
@given(cfg=lecture02_configs(), seed=st.integers(0, 2**31 - 1), T=st.integers(1, 11))
def test_matches_lecture02_numpy(cfg, seed, T):
    """第 2 讲的 numpy Llama（交错 RoPE）= 我们的 torch 模型（半对半 RoPE、Wq/Wk 行已重排），float64。"""
    params = tl.init_params(cfg, seed=seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab, size=(2, T))
    ours = ml.from_lecture02(params, cfg)
    with torch.no_grad():
        got = ours(torch.from_numpy(ids)).numpy()
    assert np.max(np.abs(got - tl.forward(params, cfg, ids))) < 1e-10


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=60)
@given(half_dim=st.integers(1, 12), T=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
       base=st.sampled_from([10000.0, 500000.0, 3.0]), scale=st.sampled_from([1.0, 0.25, 1 / 3]))
def test_half_and_interleaved_differ_by_permutation(half_dim, T, seed, base, scale):
    dim = 2 * half_dim
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, T, dim, dtype=F64, generator=gen)
    cos, sin = ml.rope_angles(torch.arange(T, dtype=F64) * scale, dim, base)   # 小数位置（位置插值）
    perm = ml.half_to_interleaved(dim)
    assert sorted(perm.tolist()) == list(range(dim))
    got = ml.apply_rope_half(x[..., perm], cos, sin)
    assert torch.allclose(got, ml.apply_rope_interleaved(x, cos, sin)[..., perm], atol=1e-13, rtol=0)
    # 独立参考：把 (x_i, x_{i+dim/2}) 看成复数 x_i + j·x_{i+dim/2}，乘以 e^{j·pos·θ_i}
    z = torch.complex(x[..., :half_dim], x[..., half_dim:])
    theta = base ** (-torch.arange(half_dim, dtype=F64) * 2 / dim)
    rot = z * torch.polar(torch.ones(T, half_dim, dtype=F64), torch.outer(torch.arange(T, dtype=F64) * scale, theta))
    want = torch.cat((rot.real, rot.imag), dim=-1)
    assert torch.allclose(ml.apply_rope_half(x, cos, sin), want, atol=1e-12, rtol=0)


@settings(deadline=None, max_examples=60)
@given(half_dim=st.integers(1, 16), m=st.floats(0, 5000), n=st.floats(0, 5000), shift=st.floats(-3000, 3000),
       seed=st.integers(0, 2**31 - 1))
def test_rope_score_depends_only_on_offset(half_dim, m, n, shift, seed):
    """⟨R(m)q, R(n)k⟩ = ⟨R(m+s)q, R(n+s)k⟩：只依赖 m − n（位置可以是小数、平移可以是负数）。"""
    dim = 2 * half_dim
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, dim, dtype=F64, generator=gen), torch.randn(1, dim, dtype=F64, generator=gen)

    def score(a, b):
        cos, sin = ml.rope_angles(torch.tensor([a, b], dtype=F64), dim)
        return float(ml.apply_rope_half(q, cos[:1], sin[:1]) @ ml.apply_rope_half(k, cos[1:], sin[1:]).T)

    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-8 * (1 + float(q.norm() * k.norm()))


def test_rope_angles_dtype_and_fractional_positions():
    cos, sin = ml.rope_angles(torch.arange(5), 6)
    assert cos.dtype == torch.get_default_dtype() and cos.shape == (5, 3)
    cos64, _ = ml.rope_angles(torch.arange(5, dtype=F64) / 4, 6)
    assert cos64.dtype == F64 and torch.allclose(cos64[:, 0], torch.cos(torch.arange(5, dtype=F64) / 4))


# ---------------------------------------------------------------------------
# 注意力、位置表、参数量
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=15)
@given(H=st.sampled_from([1, 2, 3, 4, 6]), T=st.integers(1, 8), window=st.integers(0, 4), alibi=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_attention_matches_explicit_softmax(H, T, window, alibi, seed):
    G = max(g for g in range(1, H + 1) if H % g == 0 and g < H) if H > 1 else 1
    cfg = ml.LMConfig(vocab=5, d_model=12, n_heads=H, n_kv_heads=G, d_head=4, pos="alibi" if alibi else "none",
                      window=window)
    torch.manual_seed(seed)
    attn = ml.Attention(cfg).double()
    x = torch.randn(2, T, 12, dtype=F64)
    R = H // G
    q = attn.wq(x).view(2, T, H, 4).transpose(1, 2)
    k = attn.wk(x).view(2, T, G, 4).transpose(1, 2).repeat_interleave(R, dim=1)
    v = attn.wv(x).view(2, T, G, 4).transpose(1, 2).repeat_interleave(R, dim=1)
    pos = torch.arange(T)
    ref = ml._attention_reference(q, k, v, pos, pos, window, ml.alibi_slopes(H) if alibi else None)
    want = attn.wo(ref.transpose(1, 2).reshape(2, T, H * 4))
    assert torch.allclose(attn(x), want, atol=1e-12, rtol=0)


def test_sinusoidal_table_and_alibi_slopes_follow_their_definitions():
    tab = ml.sinusoidal_table(50, 10)
    p, i = 37, 3
    assert math.isclose(float(tab[p, 2 * i]), math.sin(p / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    assert math.isclose(float(tab[p, 2 * i + 1]), math.cos(p / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    s8 = ml.alibi_slopes(8)
    assert math.isclose(float(s8[0]), 0.5) and math.isclose(float(s8[-1]), 2 ** -8)
    assert torch.allclose(s8[1:] / s8[:-1], torch.full((7,), 0.5))            # 几何级数
    s6 = ml.alibi_slopes(6)
    assert len(s6) == 6 and (s6 > 0).all() and len(set(s6.tolist())) == 6


@pytest.mark.parametrize("name", ["modern", "modern_mha", "modern_mqa"])
def test_param_count_matches_lecture01_formula(name):
    cfg = ml.CHECKPOINTS[name]
    assert ml.ModernLM(cfg).n_params() == cfg.to_model_config().n_params()


# ---------------------------------------------------------------------------
# 合成语言
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 70), chunk=st.integers(2, 9),
       p_copy=st.sampled_from([0.0, 0.3, 1.0]))
def test_language_oracle_logp_recomputed_from_tokens(seed, length, chunk, p_copy):
    """真实对数概率只从 token 本身独立重算一遍：标记 = 复制与否 × 均匀选 k；新块字母 = 转移矩阵；复制字母 = 0。"""
    lang = ml.ChunkCopyLanguage(n_letters=7, chunk=chunk, max_back=3, p_copy=p_copy, n_succ=3, seed=seed % 97)
    tokens, logp = lang.sample(4, length, seed)
    kinds = lang.token_kinds(tokens)
    for r in range(4):
        prev = None
        for t in range(1, length + 1):
            tok, blk, j = int(tokens[r, t]), t // chunk, t % chunk
            if j == 0:
                n_back = min(blk, 3)
                pc = p_copy if n_back else 0.0
                want = math.log(pc / n_back) if tok >= lang.C0 else math.log(1 - pc)
                assert kinds[r, t - 1] == 0
            elif int(tokens[r, t - j]) == lang.S:
                letter_prev = prev if prev is not None else None
                p = lang.start[tok] if letter_prev is None else lang.trans[letter_prev, tok]
                want = math.log(p)
                assert kinds[r, t - 1] == 1
            else:
                k = int(tokens[r, t - j]) - lang.C0 + 1
                assert tok == int(tokens[r, t - k * chunk]) and kinds[r, t - 1] == 1 + k
                want = 0.0
            assert math.isclose(float(logp[r, t - 1]), want, abs_tol=1e-9), (r, t)
            if j != 0:
                prev = tok


def test_language_is_deterministic_and_optimal_below_markov_only():
    lang = ml.language()
    a, la = lang.sample(8, 64, seed=3)
    b, lb = lang.sample(8, 64, seed=3)
    assert torch.equal(a, b) and torch.equal(la, lb)
    br_opt = -lang.sample(256, 64, seed=4)[1].mean()
    assert 0.6 < br_opt < 0.9 < lang.markov_entropy()


# ---------------------------------------------------------------------------
# 训练与检查点
# ---------------------------------------------------------------------------
def test_lr_schedule():
    tc = ml.TrainConfig(steps=100, warmup=10, lr=1e-3, min_lr_frac=0.1)
    lrs = [ml.lr_at(s, tc) for s in range(100)]
    assert math.isclose(lrs[9], 1e-3) and lrs[0] < lrs[5] < lrs[9]
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert math.isclose(lrs[-1], 1e-4, rel_tol=0.01)


class _Stop(Exception):
    pass


def test_resume_gives_identical_weights(tmp_path, monkeypatch):
    tc = ml.TrainConfig(steps=12, batch=4, seq=16, warmup=2, eval_every=5, eval_batches=1)
    lang = ml.language()
    straight, _ = ml.train_model(ml.MODERN, tc, lang, progress=False)
    path = str(tmp_path / "r.resume.pt")
    real = lang.sample

    def flaky(n, length, seed):
        if seed == tc.seed * 1_000_000 + 8:                              # 第 8 步"断电"（续训文件是第 5 步的）
            raise _Stop
        return real(n, length, seed)

    monkeypatch.setattr(lang, "sample", flaky)
    with pytest.raises(_Stop):
        ml.train_model(ml.MODERN, tc, lang, progress=False, resume_path=path)
    monkeypatch.setattr(lang, "sample", real)
    logs = []
    resumed, curve = ml.train_model(ml.MODERN, tc, lang, progress=False, resume_path=path, log=logs.append)
    assert any("第 5 步" in s for s in logs) and [c[0] for c in curve] == list(range(1, 13))
    for (k, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_bad_checkpoints_are_retrained(tmp_path):
    tc, d = ml.TrainConfig(steps=3, batch=2, seq=16, warmup=1, eval_every=3, eval_batches=1), str(tmp_path)
    ml.train_and_save("modern_mqa", d, tc, progress=False, log=lambda *_: None)
    assert ml.verify_checkpoint("modern_mqa", d, tc)[1] == "ok"
    assert "配置" in ml.verify_checkpoint("modern_mqa", d, ml.TrainConfig(steps=4))[1]   # 训练设置不同
    man_path = os.path.join(d, "manifest.json")
    man = json.load(open(man_path, encoding="utf-8"))
    man["models"]["modern_mqa"]["config"]["model"]["d_ff"] += 1                          # 配置不同
    json.dump(man, open(man_path, "w", encoding="utf-8"))
    why = ml.verify_checkpoint("modern_mqa", d, tc)[1]
    assert "model.d_ff: 173 → 172" in why, why                                          # 写出哪一项、旧 → 新
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, info = ml.load_or_train("modern_mqa", ckpt_dir=d, tc=tc, log=lambda *_: None)
    assert info["source"] == "retrained" and caught
    open(os.path.join(d, "modern_mqa.pt"), "wb").write(b"not a checkpoint")              # 截断 / 损坏
    assert "SHA-256" in ml.verify_checkpoint("modern_mqa", d, tc)[1]
    os.remove(os.path.join(d, "modern_mqa.pt"))
    assert "缺文件" in ml.verify_checkpoint("modern_mqa", d, tc)[1]
    # --quick：不能用时只在内存里训，不写任何文件
    before = sorted(os.listdir(d))
    _, info = ml.load_or_train("modern_mqa", quick=True, ckpt_dir=d, tc=tc, log=lambda *_: None)
    assert info["source"] == "quick" and sorted(os.listdir(d)) == before


def test_committed_checkpoints_verify():
    """入库的检查点：每个都在 manifest 里、SHA-256 对得上、weights_only 装得进当前的模型。"""
    if not os.path.exists(os.path.join(ml.CKPT_DIR, "manifest.json")):
        pytest.skip("lecture04/checkpoints/ 里还没有检查点（python3 lecture04/train_checkpoints.py）")
    for name in ml.CHECKPOINTS:
        model, why, entry = ml.checkpoint_record(name)
        assert why == "ok" and entry is not None, (name, why)
        assert ml.verify_checkpoint(name)[1] == "ok"
        assert entry["final_eval_loss"] > entry["optimal_loss"] - 0.03
        plain = torch.load(os.path.join(ml.CKPT_DIR, f"{name}.pt"), weights_only=True)     # 纯 state_dict
        assert plain.keys() == model.state_dict().keys()


# ---------------------------------------------------------------------------
# 坏输入
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kw, exc, words", [
    (dict(n_heads=4, n_kv_heads=3), ValueError, ["n_kv_heads", "[1, 2, 4]"]),
    (dict(pos="rotary"), ValueError, ["pos", "'rope'", "'alibi'", "'none'"]),
    (dict(norm="batch"), ValueError, ["norm", "'rms'", "'layer'"]),
    (dict(mlp="relu"), ValueError, ["mlp", "'swiglu'", "'gelu'"]),
    (dict(d_head=7), ValueError, ["d_head", "偶数"]),
    (dict(window=-1), ValueError, ["window"]),
    (dict(tied="no"), TypeError, ["tied"]),
    (dict(d_model=2.5), TypeError, ["d_model"]),
])
def test_bad_config(kw, exc, words):
    with pytest.raises(exc) as e:
        ml.LMConfig(**kw)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_bad_inputs():
    model = ml.ModernLM(ml.LMConfig(vocab=10, pos="learned", max_seq=8))
    with pytest.raises(ValueError, match="max_seq=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = ml.KVCache(model.cfg)
    model(torch.zeros(1, 6, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="含 cache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="vocab=10"):
        model(torch.full((1, 3), 10))
    with pytest.raises(TypeError, match="整数张量"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="偶数"):
        ml.rope_angles(torch.arange(4), 5)
    with pytest.raises(ValueError, match="有限"):
        ml.rope_angles(torch.tensor([0.0, float("nan")]), 4)
    with pytest.raises(ValueError, match=r"\[T, dim/2\]"):
        ml.apply_rope_half(torch.zeros(3, 8), *ml.rope_angles(torch.arange(4), 8))
    with pytest.raises(ValueError, match="name"):
        ml.verify_checkpoint("gpt5")
    with pytest.raises(ValueError, match="RMSNorm"):
        ml.RMSNorm(4)(torch.zeros(2, 5))
