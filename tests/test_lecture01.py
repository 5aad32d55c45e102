"""第 1 讲（llm_math、hw_specs）的单元测试和性质测试。

自检（_selftest）和演示（--quick）由 test_harness.py 在子进程里跑，这里不重复。
这里用 hypothesis 随机生成模型结构和芯片参数，检查公式的恒等式，以及和一个独立的"逐个张量数参数"的参考实现一致。
"""
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

LM = load_lab("lecture01", "llm_math")
CU = load_lab("lecture01", "course_utils")
GT = load_lab("lecture01/bench", "gpu_timing")
HW = load_lab("lecture01", "hw_specs")

SETTINGS = settings(deadline=None, max_examples=60)


@st.composite
def configs(draw, tied=None):
    """随机的合法 ModelConfig：n_heads = n_kv_heads × 组大小，保证能整除。"""
    G = draw(st.integers(1, 8))
    R = draw(st.integers(1, 8))
    return LM.ModelConfig(
        "rand",
        n_layers=draw(st.integers(1, 12)),
        d_model=draw(st.integers(8, 512)),
        n_heads=G * R,
        n_kv_heads=G,
        d_head=draw(st.integers(1, 64)),
        d_ff=draw(st.integers(1, 1024)),
        vocab=draw(st.integers(2, 5000)),
        tied=draw(st.booleans()) if tied is None else tied,
        qkv_bias=draw(st.booleans()),
        n_pos=draw(st.integers(0, 64)),
        extra_per_layer=draw(st.integers(0, 100)),
        extra_final=draw(st.integers(0, 100)),
    )


def count_by_tensors(cfg):
    """参考实现：像 lecture02 的 count_params 那样，把每个张量的元素个数加起来（不用 ModelConfig 的公式）。"""
    d, H, G, dh, f, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff, cfg.vocab
    layer = {
        "attn_norm": d, "wq": d * H * dh, "wk": d * G * dh, "wv": d * G * dh, "wo": H * dh * d,
        "mlp_norm": d, "w_gate": d * f, "w_up": d * f, "w_down": f * d, "extra": cfg.extra_per_layer,
    }
    if cfg.qkv_bias:
        layer.update(bq=H * dh, bk=G * dh, bv=G * dh)
    n = V * d + cfg.n_pos * d + d + cfg.extra_final + cfg.n_layers * sum(layer.values())
    return n if cfg.tied else n + d * V


# ---------------------------------------------------------------------------
# ModelConfig：参数量与 FLOPs 的恒等式
# ---------------------------------------------------------------------------
@SETTINGS
@given(configs())
def test_n_params_matches_tensor_count(cfg):
    assert cfg.n_params() == count_by_tensors(cfg)
    assert cfg.n_params() == sum(cfg.param_groups().values())


@SETTINGS
@given(configs(tied=False))
def test_tying_removes_exactly_one_vocab_matrix(cfg):
    tied = LM.scaled(cfg, tied=True)
    assert cfg.n_params() - tied.n_params() == cfg.vocab * cfg.d_model
    # 共享之后 lm_head 的乘法照样要做：每 token 的 FLOPs 不变
    assert tied.matmul_params() == cfg.matmul_params()
    assert tied.linear_flops_per_token() == cfg.linear_flops_per_token()


def matmul_flops_by_shapes(cfg, ctx):
    """参考实现：一个新 token 在上下文 ctx 处的前向 FLOPs，按每个矩阵乘法的形状 [M,K]·[K,N] → 2·M·K·N 逐个相加。"""
    d, H, G, dh, f, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff, cfg.vocab
    shapes = [(1, d, V)]                                                         # lm_head（共享也要乘）
    for _ in range(cfg.n_layers):
        shapes += [(1, d, H * dh), (1, d, G * dh), (1, d, G * dh), (1, H * dh, d),   # Wq Wk Wv Wo
                   (1, d, f), (1, d, f), (1, f, d)]                                  # gate up down
        shapes += [(1, dh, ctx), (1, ctx, dh)] * H                                   # 每个 query 头：q·Kᵀ、p·V
    return sum(2 * m * k * n for m, k, n in shapes)


@SETTINGS
@given(configs(), st.integers(0, 5_000))
def test_flops_match_matmul_shapes(cfg, ctx):
    assert cfg.flops_per_token(ctx) == matmul_flops_by_shapes(cfg, ctx)
    assert cfg.linear_flops_per_token() == matmul_flops_by_shapes(cfg, 0)
    assert cfg.attn_flops_per_token(ctx) == matmul_flops_by_shapes(cfg, ctx) - matmul_flops_by_shapes(cfg, 0)


@SETTINGS
@given(configs(), st.integers(1, 64), st.integers(0, 500))
def test_prefill_equals_sum_of_decodes(cfg, T, ctx0):
    # 一次送进 T 个 token 的 FLOPs = 一个一个送进去的 FLOPs 之和（因果注意力的账相同）
    one_shot = cfg.step_flops(1, T, ctx0)
    stepwise = sum(cfg.flops_per_token(ctx0 + j) for j in range(1, T + 1))
    assert math.isclose(one_shot, stepwise, rel_tol=1e-12)
    assert math.isclose(cfg.step_flops(3, T, ctx0), 3 * one_shot, rel_tol=1e-12)


@SETTINGS
@given(configs(), st.integers(1, 20), st.integers(1, 200))
def test_train_flops_is_three_forwards(cfg, n_seq, S):
    # n_seq 条长 S 的序列：前向 = 每个位置 j（看 j 个 key）的 FLOPs 逐个相加；训练 = 3 × 前向
    fwd = n_seq * sum(matmul_flops_by_shapes(cfg, j) for j in range(1, S + 1))
    assert math.isclose(cfg.train_flops(n_seq * S, S), 3 * fwd, rel_tol=1e-12)
    assert cfg.train_flops(n_seq * S, S) >= 6 * cfg.matmul_params() * n_seq * S


# ---------------------------------------------------------------------------
# KV cache：按 G 变，不按 H 变
# ---------------------------------------------------------------------------
@SETTINGS
@given(configs(), st.integers(1, 4), st.sampled_from([0.5, 1.0, 2.0, 4.0]))
def test_kv_bytes_scale_with_kv_heads_not_query_heads(cfg, k, bpe):
    more_q = LM.scaled(cfg, n_heads=cfg.n_heads * k)                       # 只加 query 头
    more_kv = LM.scaled(cfg, n_heads=cfg.n_heads * k, n_kv_heads=cfg.n_kv_heads * k)
    assert more_q.kv_bytes_per_token(bpe) == cfg.kv_bytes_per_token(bpe)
    assert more_kv.kv_bytes_per_token(bpe) == k * cfg.kv_bytes_per_token(bpe)
    # 注意力 FLOPs 反过来：按 H 变，和 G 无关
    assert more_q.attn_flops_per_token(100) == more_kv.attn_flops_per_token(100) == k * cfg.attn_flops_per_token(100)
    # 按缓存张量数：每层一个 K、一个 V，形状 [G, dh]
    cache = [(cfg.n_kv_heads, cfg.d_head)] * (2 * cfg.n_layers)
    assert cfg.kv_bytes_per_token(bpe) == sum(math.prod(sh) for sh in cache) * bpe


@SETTINGS
@given(configs(), st.integers(0, 64), st.integers(0, 10_000))
def test_kv_cache_linear_in_batch_and_ctx(cfg, batch, ctx):
    per = cfg.kv_bytes_per_token()
    assert cfg.kv_cache_bytes(batch, ctx) == batch * ctx * per
    assert cfg.weight_bytes(1.0) == cfg.n_params()


# ---------------------------------------------------------------------------
# 算术强度：decode 随批大小增长，prefill 随提示长度增长
# ---------------------------------------------------------------------------
@SETTINGS
@given(configs(), st.integers(1, 256), st.integers(0, 4096))
def test_intensity_grows_with_batch_and_prompt(cfg, b, ctx):
    assert cfg.arithmetic_intensity(b + 1, 1, ctx) > cfg.arithmetic_intensity(b, 1, ctx)
    assert cfg.arithmetic_intensity(1, b + 1, 0) > cfg.arithmetic_intensity(1, b, 0)
    r = cfg.arithmetic_intensity(b, 1, ctx)
    assert math.isclose(r, cfg.step_flops(b, 1, ctx) / cfg.step_bytes(b, 1, ctx), rel_tol=1e-12)


@pytest.mark.parametrize("batch", [1, 2, 8, 32, 128])
def test_decode_intensity_is_about_batch_for_real_models(batch):
    for m in (LM.LLAMA31_8B, LM.LLAMA31_70B, LM.MISTRAL_7B):
        ai = m.arithmetic_intensity(batch, 1, 0)
        assert abs(ai - batch) / batch < 0.01


# ---------------------------------------------------------------------------
# 预设
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LM.PRESETS))
def test_presets_match_published_totals(name):
    cfg = LM.PRESETS[name]
    pub, src = LM.PUBLISHED_PARAMS[name]
    err = abs(count_by_tensors(cfg) - pub) / pub
    tol, why = LM.param_tolerance(name)
    if name in LM.PARAM_TOL_EXCEPTIONS:
        assert why and 0.01 < err < tol <= 0.015          # 例外：写明原因，而且真的需要放宽
    else:
        assert tol == 0.01 and err < 0.01
    assert src
    assert cfg.n_params() == count_by_tensors(cfg)


def gpt2_style_params(L, d, vocab, n_pos):
    """GPT-2/3 结构的参数量，独立地逐项数：每层 Wqkv 3d² + Wo d² + MLP 8d² 权重，qkv 偏置 3d + o 偏置 d +
    MLP 偏置 5d + 两个 LayerNorm 4d；最后一个 LayerNorm 2d；词嵌入（共享）和位置编码 (V + n_pos)·d。"""
    return L * (12 * d * d + 13 * d) + 2 * d + (vocab + n_pos) * d


def test_gpt3_13b_published_number_and_documented_gap():
    pub, src = LM.PUBLISHED_PARAMS["GPT-3-13B"]
    assert "[S46]" in src and "13.0B" in src
    assert round(pub / 1e9, 1) == 13.0                    # 论文表 2.1 印的就是 13.0B，不能为了凑代码改掉
    # 论文同一行印的 d_model = 5140：在 1% 内复现 13.0B
    printed = gpt2_style_params(L=40, d=5140, vocab=50257, n_pos=2048)
    assert abs(printed - pub) / pub < 0.01
    assert abs(LM.GPT3_13B_AS_PRINTED.n_params() - printed) <= 3 * 40 * 5140     # 只差等效 d_ff 的取整
    # 我们的预设用 40 × 128 = 5120：超出 1%，但在单独写明的 1.5% 以内
    ours = gpt2_style_params(L=40, d=5120, vocab=50257, n_pos=2048)
    assert abs(LM.GPT3_13B.n_params() - ours) <= 3 * 40 * 5120
    gap = (pub - LM.GPT3_13B.n_params()) / pub
    tol, why = LM.param_tolerance("GPT-3-13B")
    assert 0.01 < gap < tol == 0.015 and "5140" in why and "5120" in why


def test_exact_public_counts():
    assert LM.LLAMA31_8B.n_params() == 8_030_261_248
    assert LM.LLAMA31_70B.n_params() == 70_553_706_496
    assert LM.LLAMA31_405B.n_params() == 405_853_388_800
    assert LM.LLAMA32_1B.n_params() == 1_235_814_400
    assert LM.GPT2_SMALL.n_params() == 124_439_808


def test_lecture02_style_construction():
    # lecture02 的 Config.to_model_config 就是这样调用的（全部关键字参数）
    m = LM.ModelConfig("tiny", n_layers=4, d_model=128, n_heads=8, n_kv_heads=2, d_head=16, d_ff=344, vocab=512,
                       tied=False)
    per_layer = 2 * 128 + 128 * 8 * 16 + 2 * 128 * 2 * 16 + 8 * 16 * 128 + 3 * 128 * 344
    assert m.n_params() == 512 * 128 * 2 + 128 + 4 * per_layer


# ---------------------------------------------------------------------------
# 坏输入
# ---------------------------------------------------------------------------
def _args(**kw):
    a = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128, vocab=100)
    a.update(kw)
    return a


def test_heads_not_divisible_names_both_numbers():
    with pytest.raises(ValueError) as e:
        LM.ModelConfig("bad", **_args(n_heads=12, n_kv_heads=5))
    assert "12" in str(e.value) and "5" in str(e.value)


@pytest.mark.parametrize("field", ["n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "vocab"])
@pytest.mark.parametrize("value, exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_non_positive_sizes_rejected(field, value, exc):
    # 课程约定（course_utils.check_int）：不是整数 → TypeError（和 allreduce_time(p=2.5) 一样），越界 → ValueError
    with pytest.raises(exc, match=field):
        LM.ModelConfig("bad", **_args(**{field: value}))


def test_bad_call_arguments():
    m = LM.LLAMA31_8B
    for fn in (lambda: m.attn_flops_per_token(-1), lambda: m.kv_bytes_per_token(0),
               lambda: m.kv_cache_bytes(-1, 10), lambda: m.step_flops(1, 0),
               lambda: LM.step_time(m, HW.H100_SXM, 1, 1, mfu=0), lambda: LM.max_batch(m, HW.H100_SXM, 10, mem_util=2),
               lambda: LM.train_time(m, 1e9, HW.H100_SXM, 0)):
        with pytest.raises(ValueError):
            fn()


NAN, INF = float("nan"), float("inf")
# 每种参数的坏值：(值, 期望的异常)
BAD_BY_KIND = {
    "count0": [(NAN, ValueError), (INF, ValueError), (-1, ValueError), (2.5, TypeError), ("a", TypeError),
               (True, TypeError), (None, TypeError)],
    "real0": [(NAN, ValueError), (INF, ValueError), (-1, ValueError), ("a", TypeError), (None, TypeError)],
    "pos": [(NAN, ValueError), (INF, ValueError), (0, ValueError), (-2, ValueError), ("a", TypeError),
            (True, TypeError)],
    "frac": [(NAN, ValueError), (0, ValueError), (1.5, ValueError), (-0.1, ValueError), ("a", TypeError)],
    "flag": [("False", TypeError), (1, TypeError), (None, TypeError)],
}
BAD_BY_KIND["count1"] = BAD_BY_KIND["count0"] + [(0, ValueError)]


class _FakeChip:
    mem_bw, mem_cap = 1e12, 80e9

    @staticmethod
    def peak_flops(prec="bf16"):
        return 1e15


_M8 = LM.LLAMA31_8B
# (名字, 调用 f(**kw), 合法的关键字参数, {参数: 种类})
PUBLIC_CALLS = [
    ("weight_bytes", _M8.weight_bytes, dict(bytes_per_elem=2.0), {"bytes_per_elem": "pos"}),
    ("attn_flops_per_token", _M8.attn_flops_per_token, dict(ctx=10), {"ctx": "real0"}),
    ("flops_per_token", _M8.flops_per_token, dict(ctx=10), {"ctx": "real0"}),
    ("kv_bytes_per_token", _M8.kv_bytes_per_token, dict(bytes_per_elem=2.0), {"bytes_per_elem": "pos"}),
    ("kv_cache_bytes", _M8.kv_cache_bytes, dict(batch=2, ctx=3, bytes_per_elem=2.0),
     {"batch": "count0", "ctx": "count0", "bytes_per_elem": "pos"}),
    ("step_flops", _M8.step_flops, dict(batch=1, n_new=1, ctx=0),
     {"batch": "count1", "n_new": "count1", "ctx": "count0"}),
    ("step_bytes", _M8.step_bytes, dict(batch=1, n_new=1, ctx=0, w_bytes=2.0, kv_bytes=2.0),
     {"batch": "count1", "n_new": "count1", "ctx": "count0", "w_bytes": "pos", "kv_bytes": "pos"}),
    ("arithmetic_intensity", _M8.arithmetic_intensity, dict(batch=1, n_new=1, ctx=0, w_bytes=2.0, kv_bytes=2.0),
     {"batch": "count1", "n_new": "count1", "ctx": "count0", "w_bytes": "pos", "kv_bytes": "pos"}),
    ("train_flops", _M8.train_flops, dict(n_tokens=10, seq_len=10, causal=True),
     {"n_tokens": "count0", "seq_len": "count1", "causal": "flag"}),
    ("activation_bytes", _M8.activation_bytes, dict(batch=1, seq_len=10, bytes_per_elem=2.0, recompute=False),
     {"batch": "count1", "seq_len": "count1", "bytes_per_elem": "pos", "recompute": "flag"}),
    ("train_memory", _M8.train_memory, dict(batch=1, seq_len=10),
     {"batch": "count1", "seq_len": "count1", "recompute": "flag", "w_bytes": "pos", "grad_bytes": "pos",
      "master_bytes": "pos", "adam_bytes": "pos", "act_bytes": "pos", "logits_bytes": "pos"}),
    ("step_time", lambda **kw: LM.step_time(_M8, _FakeChip, **kw), dict(batch=1, n_new=1, ctx=0),
     {"batch": "count1", "n_new": "count1", "ctx": "count0", "w_bytes": "pos", "kv_bytes": "pos", "mfu": "frac",
      "mbu": "frac"}),
    ("decode_time_per_token", lambda **kw: LM.decode_time_per_token(_M8, _FakeChip, **kw), dict(batch=1, ctx=0),
     {"batch": "count1", "ctx": "count0", "mfu": "frac"}),
    ("decode_tokens_per_s", lambda **kw: LM.decode_tokens_per_s(_M8, _FakeChip, **kw), dict(batch=1, ctx=0),
     {"batch": "count1", "ctx": "count0", "mbu": "frac"}),
    ("max_batch", lambda **kw: LM.max_batch(_M8, _FakeChip, **kw), dict(ctx=8192),
     {"ctx": "count1", "w_bytes": "pos", "kv_bytes": "pos", "mem_util": "frac"}),
    ("train_time", lambda **kw: LM.train_time(_M8, chip=_FakeChip, **kw), dict(n_tokens=1e9, n_chips=8),
     {"n_tokens": "count0", "n_chips": "count1", "mfu": "frac", "seq_len": "count1"}),
]
BAD_CASES = [pytest.param(fn, {**good, arg: val}, exc, arg, id=f"{name}-{arg}={val!r}")
             for name, fn, good, spec in PUBLIC_CALLS for arg, kind in spec.items()
             for val, exc in BAD_BY_KIND[kind]]


@pytest.mark.parametrize("name,fn,good,spec", PUBLIC_CALLS, ids=[c[0] for c in PUBLIC_CALLS])
def test_public_functions_accept_good_arguments(name, fn, good, spec):
    out = fn(**good)
    vals = out.values() if isinstance(out, dict) else [out]
    assert all(isinstance(v, (str, bool, LM.Fit)) or math.isfinite(v) for v in vals), name


@pytest.mark.parametrize("fn,kw,exc,arg", BAD_CASES)
def test_public_functions_reject_bad_arguments(fn, kw, exc, arg):
    """NaN、无穷、负数、小数个数、非数字：每个公开函数的每个参数都报错，消息里写出参数名。"""
    with pytest.raises(exc, match=arg):
        fn(**kw)


def test_integral_float_counts_still_accepted():
    # 训练 token 数常写成 15.6e12；整数值的浮点数和 numpy 整数都算"整数"
    np = pytest.importorskip("numpy")
    assert _M8.train_flops(15.6e12, 8192) == _M8.train_flops(15_600_000_000_000, 8192)
    assert _M8.kv_cache_bytes(np.int64(4), np.int32(100)) == _M8.kv_cache_bytes(4, 100)
    assert _M8.step_flops(2.0, 3.0, 5.0) == _M8.step_flops(2, 3, 5)


# ---------------------------------------------------------------------------
# hw_specs.Chip
# ---------------------------------------------------------------------------
chip_numbers = st.floats(1e6, 1e16, allow_nan=False, allow_infinity=False)


@SETTINGS
@given(chip_numbers, chip_numbers, st.floats(0, 1e18), st.floats(0, 1e15), st.floats(1, 100))
def test_roofline_time_is_max_and_monotone(peak, bw, flops, nbytes, k):
    c = HW.Chip("c", "GPU", peak={"bf16": peak}, mem_bw=bw, mem_cap=1e9, mem_kind="HBM", link_bw=1e9)
    t = c.roofline_time(flops, nbytes)
    assert t == max(flops / peak, nbytes / bw)
    assert c.roofline_time(flops * k, nbytes) >= t and c.roofline_time(flops, nbytes * k) >= t
    assert math.isclose(c.ridge_point(), peak / bw)
    # 强度高于屋脊点 ⇔ 受算力限制
    if nbytes > 0 and flops > 0 and not math.isclose(flops / nbytes, c.ridge_point(), rel_tol=1e-9):
        assert (c.bound(flops, nbytes) == "compute") == (flops / nbytes > c.ridge_point())
    assert c.attainable_flops(c.ridge_point()) == pytest.approx(peak)


@pytest.mark.parametrize("call,arg", [
    (lambda c, v: c.roofline_time(v, 1.0), "flops"), (lambda c, v: c.roofline_time(1.0, v), "nbytes"),
    (lambda c, v: c.bound(v, 1.0), "flops"), (lambda c, v: c.bound(1.0, v), "nbytes"),
    (lambda c, v: c.attainable_flops(v), "intensity"), (lambda c, v: c.link_time(v), "nbytes"),
])
@pytest.mark.parametrize("value,exc", [(NAN, ValueError), (INF, ValueError), (-1.0, ValueError),
                                       ("a", TypeError), (None, TypeError)])
def test_chip_methods_reject_nan_and_negative(call, arg, value, exc):
    """NaN 不能悄悄变成答案：min(峰值, nan) 返回峰值、max(nan, x) 返回 nan。"""
    with pytest.raises(exc, match=arg):
        call(HW.H100_SXM, value)


def test_chip_table_contents():
    need = {"H100_SXM", "H100_PCIE", "H200", "B200", "MI300X", "TPU_V5E", "TPU_V5P", "TPU_V6E", "RTX_4090"}
    for const in need:
        chip = getattr(HW, const)
        assert HW.CHIPS[chip.name] is chip
        assert all(k == k.lower() for k in chip.peak)
        assert chip.notes and "[S" in chip.notes
    assert not any("A100" in n for n in HW.CHIPS)
    assert HW.H100_SXM.link_bw == 450e9 and HW.H200.link_bw == 450e9 and HW.B200.link_bw == 900e9
    assert HW.H100_SXM.peak_flops("bf16") == 989e12 and HW.H100_SXM.mem_bw == 3.35e12


def test_unknown_precision_lists_available():
    with pytest.raises(ValueError) as e:
        HW.TPU_V6E.peak_flops("fp4")
    msg = str(e.value)
    assert "bf16" in msg and "int8" in msg


@pytest.mark.parametrize("bad", [dict(peak={}), dict(peak={"BF16": 1e12}), dict(peak={"bf16": 0}),
                                 dict(mem_bw=0), dict(mem_cap=-1), dict(link_bw=-1), dict(power_w=-5),
                                 dict(name=""), dict(mem_bw=float("nan")), dict(peak={"bf16": float("inf")})])
def test_chip_validation(bad):
    good = dict(name="x", kind="GPU", peak={"bf16": 1e12}, mem_bw=1e9, mem_cap=1e9, mem_kind="HBM", link_bw=1e9)
    with pytest.raises(ValueError):
        HW.Chip(**{**good, **bad})


def test_lecture06_style_chip():
    # 原课程第 6 讲模块的 A100_40G 就是这样构造的
    a100 = HW.Chip("A100-SXM4-40GB", "GPU", peak={"bf16": 312e12, "fp16": 312e12, "int8": 624e12},
                   mem_bw=1.555e12, mem_cap=40e9, mem_kind="HBM2", link_bw=300e9, power_w=400, year=2020,
                   notes="A100 datasheet")
    assert a100.peak_flops("bf16") == 312e12 and a100.mem_cap == 40e9 and a100.link_bw == 300e9
    t = LM.step_time(LM.LLAMA32_1B, a100, 1, 1)
    assert t["bound"] == "memory"


def test_decode_speed_bound_is_bandwidth_over_weights():
    for chip in HW.CHIPS.values():
        m = LM.LLAMA31_8B
        if not LM.fit(m, chip, batch=8, ctx=1).fits:                  # 8B 放不进 16 GB 的 TPU v5e：报错，不给数
            with pytest.raises(LM.CapacityError):
                LM.decode_tokens_per_s(m, chip)
            continue
        tps = LM.decode_tokens_per_s(m, chip)
        assert tps == pytest.approx(chip.mem_bw / (2 * m.matmul_params()), rel=1e-3)
        assert LM.decode_tokens_per_s(m, chip, batch=8) > 7 * tps


def test_format_table_aligns_cjk():
    out = LM.format_table(["模型", "x"], [["中文", 1], ["ab", 22]]).splitlines()
    widths = {CU.display_width(line) for line in out}
    assert len(widths) == 1


def test_lab_modules_share_course_utils_helpers():
    """各实验模块导出的表格 / 数字 / 存图小工具就是 course_utils 里的那一份（老名字继续可用）。

    labload 把 course_utils 另以 "lecture01.course_utils" 登记，和模块里裸名导入的不是同一个对象，
    所以比较函数定义所在的文件，而不是 `is`。"""
    def from_course_utils(fn):
        return os.path.samefile(fn.__code__.co_filename, CU.__file__)

    for a in ("format_table", "fmt_si", "fmt_count", "fmt_bytes", "fmt_time"):
        assert from_course_utils(getattr(LM, a)), a
    for folder, name, attrs in (("prereq5", "comm_sim", ("format_table",)),
                                ("lecture05", "serving_sim", ("format_table", "figure_path", "save_figure")),
                                ("lecture11", "flash_lab", ("format_table", "figure_path", "save_figure")),
                                ("lecture02", "transformer_lab", ("format_table", "fmt_si", "save_figure"))):
        mod = load_lab(folder, name)
        for a in attrs:
            assert from_course_utils(getattr(mod, a)), (name, a)


@settings(deadline=None, max_examples=60)
@given(rows=st.lists(st.lists(st.text(alphabet="ab中文字１2.", min_size=1, max_size=6), min_size=3, max_size=3),
                     max_size=6))
def test_format_table_every_line_same_width(rows):
    """任意中英文混排的非空单元格（含全角字符）：表头、分隔线、每一行的显示宽度都相同。"""
    lines = CU.format_table(["名字", "n", "备注"], rows).split("\n")
    assert len(lines) == 2 + len(rows)
    assert len({CU.display_width(ln) for ln in lines}) == 1, lines


def test_format_table_bad_input():
    with pytest.raises(ValueError, match="rows"):
        CU.format_table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="align"):
        CU.format_table(["a", "b"], [[1, 2]], align=["<", "^"])


def test_figure_path_and_save_figure(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    script = str(tmp_path / "09_demo.py")
    assert CU.figure_path(script, "x") == str(tmp_path / "figures" / "09_demo_x.png")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = CU.save_figure(fig, script, "line", dpi=50)
    assert path == str(tmp_path / "figures" / "09_demo_line.png")
    assert (tmp_path / "figures" / "09_demo_line.png").stat().st_size > 0
    assert not plt.fignum_exists(fig.number)


# ---------------------------------------------------------------------------
# course_utils.check_int / check_real：各实验模块共用的参数检查
# ---------------------------------------------------------------------------
def _real_ok(v, lo, hi, lo_open, hi_open, allow_inf):
    """独立写的参考判定：v 该不该被 check_real 接受（v 已知是非 bool 的实数）。"""
    if v != v or (not allow_inf and v in (math.inf, -math.inf)):
        return False
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    return hi is None or (v < hi if hi_open else v <= hi)


def _agrees_real(fn, v, lo, hi, lo_open, hi_open, allow_inf):
    """fn 的行为和参考判定一致：该收的返回 float(v)；该拒的报 ValueError，消息写出 where、参数名和收到的值。"""
    try:
        out = fn("lr", v, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, where="opt", allow_inf=allow_inf)
    except ValueError as e:
        assert not _real_ok(v, lo, hi, lo_open, hi_open, allow_inf), (v, lo, hi, lo_open, hi_open, e)
        assert "opt：lr" in str(e) and repr(v) in str(e), e
    else:
        assert _real_ok(v, lo, hi, lo_open, hi_open, allow_inf), (v, lo, hi, lo_open, hi_open, out)
        assert type(out) is float and (out == v or (out != out and v != v)), (v, out)


real_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10),
                        st.sampled_from([0.0, 1.0, -1.0, 0.5]))
bounds = st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 0.5, 1.0]))
REAL_ARGS = dict(v=real_values, lo=bounds, hi=bounds, lo_open=st.booleans(), hi_open=st.booleans(),
                 allow_inf=st.booleans())
CHECK_SETTINGS = settings(deadline=None, max_examples=300, database=None, derandomize=True)


@CHECK_SETTINGS
@given(**REAL_ARGS)
def test_check_real_matches_reference(v, lo, hi, lo_open, hi_open, allow_inf):
    _agrees_real(CU.check_real, v, lo, hi, lo_open, hi_open, allow_inf)


def test_check_real_property_catches_a_mutation():
    """变异检验：把开区间当闭区间（忘了 lo_open）的实现，上面的性质测试必须抓到。"""
    def mutant(name, v, lo=None, hi=None, lo_open=False, **kw):
        return CU.check_real(name, v, lo=lo, hi=hi, lo_open=False, **kw)

    @CHECK_SETTINGS
    @given(**REAL_ARGS)
    def prop(v, lo, hi, lo_open, hi_open, allow_inf):
        _agrees_real(mutant, v, lo, hi, lo_open, hi_open, allow_inf)

    with pytest.raises(AssertionError):
        prop()


def _int_ok(v, lo, hi, whole_float):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "type"
    if isinstance(v, float) and not (whole_float and math.isfinite(v) and v == int(v)):
        # 课程约定：不是整数（float 类型，或 whole_float 时的 2.5）→ TypeError；NaN / ∞ → ValueError
        return "value" if whole_float and not math.isfinite(v) else "type"
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        return "value"
    return "ok"


def _agrees_int(fn, v, lo, hi, whole_float):
    want = _int_ok(v, lo, hi, whole_float)
    try:
        out = fn("batch", v, lo=lo, hi=hi, whole_float=whole_float, where="step")
    except TypeError as e:
        assert want == "type", (v, lo, hi, whole_float, e)
        assert "step：batch" in str(e), e
    except ValueError as e:
        assert want == "value", (v, lo, hi, whole_float, e)
        assert "step：batch" in str(e) and repr(v) in str(e), e
    else:
        assert want == "ok", (v, lo, hi, whole_float, out)
        assert out == v and (type(out) is int or (whole_float and type(out) is float)), (v, out)


INT_ARGS = dict(v=st.one_of(st.integers(-5, 5), st.booleans(), st.floats(-5, 5),
                            st.sampled_from([2.0, math.nan, math.inf, "3", None])),
                lo=st.one_of(st.none(), st.integers(-2, 2)), hi=st.one_of(st.none(), st.integers(-2, 3)),
                whole_float=st.booleans())


@CHECK_SETTINGS
@given(**INT_ARGS)
def test_check_int_matches_reference(v, lo, hi, whole_float):
    _agrees_int(CU.check_int, v, lo, hi, whole_float)


def test_check_int_property_catches_a_mutation():
    """变异检验：把 bool 当整数收下（True == 1）的实现，上面的性质测试必须抓到。"""
    def mutant(name, v, **kw):
        return int(v) if isinstance(v, bool) else CU.check_int(name, v, **kw)

    @CHECK_SETTINGS
    @given(**INT_ARGS)
    def prop(v, lo, hi, whole_float):
        _agrees_int(mutant, v, lo, hi, whole_float)

    with pytest.raises(AssertionError):
        prop()


def test_check_helpers_numpy_and_type_error_override():
    np = pytest.importorskip("numpy")
    assert type(CU.check_int("n", np.int64(3), lo=1)) is int and CU.check_real("x", np.float32(0.5)) == 0.5
    with pytest.raises(TypeError, match="n"):
        CU.check_int("n", np.bool_(True))
    with pytest.raises(ValueError, match="Chip：n"):           # 老接口：一切坏值都报 ValueError
        CU.check_int("n", 2.5, where="Chip", type_error=ValueError)
    with pytest.raises(ValueError, match="≤ 1"):
        CU.check_real("mfu", 1.5, lo=0.0, lo_open=True, hi=1.0)


def test_lab_modules_use_shared_checks():
    """各实验模块的私有检查函数已删掉，改用 course_utils 的同一份。"""
    for folder, name, gone in (("lecture01", "llm_math", ("_count", "_real", "_fraction", "_check_positive")),
                               ("lecture01", "hw_specs", ("_positive", "_nonneg")),
                               ("lecture02", "transformer_lab", ("_check_int", "_check_real")),
                               ("lecture05", "serving_sim", ("_int_arg", "_real_arg")),
                               ("lecture06", "decode_lab", ("_int", "_real")),
                               ("prereq5", "comm_sim", ("_check_p", "_check_root"))):
        mod = load_lab(folder, name)
        assert not any(hasattr(mod, g) for g in gone), (name, [g for g in gone if hasattr(mod, g)])
        assert os.path.samefile(mod.check_real.__code__.co_filename, CU.__file__), name


# ---------------------------------------------------------------------------
# 可分配显存、同一条"放不放得下 / 要几张卡"规则、放不下的配置不给数
# ---------------------------------------------------------------------------
def test_allocatable_bytes_measured_and_derived():
    assert HW.H200.alloc_bytes == 150_109_880_320 and HW.H200.mem_cap == 141e9     # 实测值；显示仍用手册数字
    assert "measured" in HW.H200.mem_alloc_how
    for c in HW.CHIPS.values():
        assert c.alloc_bytes > c.mem_cap and c.mem_alloc_how
    bare = HW.Chip("x", "GPU", peak={"bf16": 1e12}, mem_bw=1e9, mem_cap=40e9, mem_kind="HBM", link_bw=1e9)
    assert LM.allocatable_bytes(bare) == 40e9                                     # 原课程的芯片：退回 mem_cap
    # max_batch 用可分配字节：比按手册数字多放
    m, h = LM.LLAMA31_8B, HW.H100_SXM
    want = int((0.9 * h.alloc_bytes - m.weight_bytes()) // m.kv_bytes_per_token()) // 8192
    by_datasheet = int((0.9 * h.mem_cap - m.weight_bytes()) // m.kv_bytes_per_token()) // 8192
    assert LM.max_batch(m, h, 8192) == want > by_datasheet


def test_one_fit_rule_for_cards_needed():
    m = LM.LLAMA31_405B
    for chip in (HW.H100_SXM, HW.H200, HW.B200):
        tp, by = LM.chips_needed(m, chip), LM.chips_needed(m, chip, rule="bytes")
        assert tp.fits and by.fits and tp.n_chips >= by.n_chips
        assert m.n_heads % tp.n_chips == 0 and LM.tp_layout_problem(m, tp.n_chips) is None
        assert by.n_chips == math.ceil(m.weight_bytes() / (0.9 * chip.alloc_bytes))
        assert not LM.fit(m, chip, by.n_chips - 1, rule="bytes").fits
        smaller = [n for n in range(1, tp.n_chips) if LM.tp_layout_problem(m, n) is None]
        assert all(not LM.fit(m, chip, n).fits for n in smaller)
    # 第 5 讲的 min_tp 和第 1 讲的 chips_needed 是同一个答案
    ss = __import__("labload").load_lab("lecture05", "serving_sim")
    for mm in (LM.LLAMA31_70B, m):
        for chip in (HW.H100_SXM, HW.H200, HW.B200):
            assert ss.min_tp(mm, chip) == LM.chips_needed(mm, chip, batch=1, ctx=1).n_chips


def test_impossible_configurations_do_not_return_numbers():
    m, h = LM.LLAMA31_405B, HW.H100_SXM
    with pytest.raises(LM.CapacityError, match="405B"):
        LM.decode_tokens_per_s(m, h)
    with pytest.raises(LM.CapacityError):
        LM.decode_time_per_token(LM.LLAMA31_8B, h, batch=256, ctx=4096)         # KV 137 GB > 一张 H100
    r = LM.step_time(LM.LLAMA31_8B, h, 256, 1, 4096)
    assert r["fits"] is False and "KV" in r["fit"].why                           # 表格要打印 fits
    assert LM.step_time(m, h, 1, 1, n_chips=16)["fits"]
    with pytest.raises(TypeError, match="hw_specs.Chip"):
        LM.step_time(LM.LLAMA31_8B, "H100", 1, 1)


def test_step_time_reads_the_kv_that_fit_keeps_per_card():
    """n > G（8B 有 8 个 KV 头）时 rule="tp" 每卡留 1 个复制的 KV 头：每卡读的 KV 不再随 n 变小
    （同第 5 讲 StepModel）。"""
    m, h, b, ctx = LM.LLAMA31_8B, HW.H100_SXM, 4, 4096
    w_per_card = {n: m.matmul_params() * 2.0 / n for n in (8, 16)}
    kv = {n: LM.step_time(m, h, b, 1, ctx, n_chips=n)["bytes"] - w_per_card[n] for n in (8, 16)}
    assert math.isclose(kv[16], kv[8], rel_tol=1e-12)                               # 复制：不是 kv[8] / 2
    f16 = LM.fit(m, h, 16, b, ctx + 1)
    assert math.isclose(kv[16], b * (ctx + 1) * f16.kv_per_token, rel_tol=1e-12)
    assert math.isclose(f16.kv_per_token, m.kv_bytes_per_token() / m.n_kv_heads, rel_tol=1e-12)
    ss = load_lab("lecture05", "serving_sim")
    assert ss.StepModel(m, h, tp=16).kv_bytes_per_token == f16.kv_per_token        # 第 1 讲和第 5 讲同一本账
    # rule="bytes"（下限）：总字节平分
    by = LM.step_time(m, h, b, 1, ctx, n_chips=16, rule="bytes")["bytes"]
    assert math.isclose(by, m.step_bytes(b, 1, ctx) / 16, rel_tol=1e-12)


def test_model_config_flags_must_be_bool():
    with pytest.raises(TypeError, match="tied"):
        LM.ModelConfig("x", **_args(tied="False"))
    with pytest.raises(TypeError, match="qkv_bias"):
        LM.ModelConfig("x", **_args(qkv_bias=0))


def test_save_figure_rejects_small_fonts_and_quick_goes_elsewhere(tmp_path):
    plt = CU.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    script = str(tmp_path / "07_demo.py")
    full = CU.save_figure(fig, script, "a")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    quick = CU.save_figure(fig, script, "a", quick=True)
    assert full != quick and os.path.dirname(quick).endswith(os.path.join("figures", "quick"))
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "tiny", fontsize=7)
    with pytest.raises(ValueError, match="12 磅"):
        CU.save_figure(fig, script, "b")


def test_committed_figure_only_with_replot(tmp_path):
    """已提交的图只有 replot 时才给路径（<脚本的文件夹>/results/<name>）；否则 None，save_figure 存进 figures/。
    name 写错（不带 .png、带文件夹、空）不管 replot 都报错；replot 不是 bool 也报错。"""
    script = str(tmp_path / "lec" / "06_demo.py")
    committed = str(tmp_path / "lec" / "results" / "demo.png")
    assert CU.committed_figure(script, "demo.png", True) == committed
    assert CU.committed_figure(script, "demo.png", False) is None
    for bad in ("demo", "results/demo.png", ".png", "", None):
        for replot in (True, False):
            with pytest.raises(ValueError, match="name"):
                CU.committed_figure(script, bad, replot)
    with pytest.raises(TypeError, match="replot"):
        CU.committed_figure(script, "demo.png", 1)
    # 和 save_figure 连用：replot 时写到 results/<name>，否则照旧进 figures/（quick 时 figures/quick/）
    plt = CU.pyplot()
    os.makedirs(os.path.dirname(committed))
    for replot, quick, want in ((True, False, committed),
                                (False, False, str(tmp_path / "lec" / "figures" / "06_demo_a.png")),
                                (True, True, str(tmp_path / "lec" / "figures" / "quick" / "06_demo_a.png"))):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4])
        assert CU.save_figure(fig, script, "a", quick=quick,
                              path=CU.committed_figure(script, "demo.png", replot)) == want
        assert os.path.getsize(want) > 0


def test_check_bool_accepts_numpy_bools_only():
    # numpy 2 里 np.bool_ 的类型名是 "bool"：以前按 "bool_" 认，np.True_（比较的结果）被当成坏输入
    import numpy as np
    a = np.arange(3)
    assert CU.check_bool("causal", (a == a).all()) is True
    assert CU.check_bool("causal", np.bool_(False)) is False
    for bad in (np.int64(1), np.float64(1.0), "True", 1, None, np.array([True])):
        with pytest.raises(TypeError, match="causal"):
            CU.check_bool("causal", bad)


# ---------------------------------------------------------------------------
# course_utils 的结果文件和"在哪测的"
# ---------------------------------------------------------------------------
def test_update_json_strict_refuses_damaged_file(tmp_path):
    """strict=True（已提交的结果）：坏文件、不是字典 → ValueError，文件原样不动；默认（缓存）坏了就从空字典重建。"""
    path = tmp_path / "r.json"
    for damaged in ('{"a": [1, ', "[1, 2]", b"\xff\xfe{}"):
        if isinstance(damaged, bytes):
            path.write_bytes(damaged)
        else:
            path.write_text(damaged)
        before = path.read_bytes()
        with pytest.raises(ValueError, match="r.json"):
            CU.update_json(str(path), lambda d: d.update(x=1), strict=True)
        assert path.read_bytes() == before
        assert CU.update_json(str(path), lambda d: d.update(x=1)) == {"x": 1}     # 宽容的读：重建
    path.unlink()
    assert CU.update_json(str(path), lambda d: d.update(y=2), strict=True) == {"y": 2}   # 不存在：从空的开始
    assert CU.update_json(str(path), lambda d: d.update(z=3), strict=True) == {"y": 2, "z": 3} == CU.load_json(path)


def test_gpu_meta_without_cuda():
    """没有 CUDA：gpu、driver 是 None（不去问设备名、不跑 nvidia-smi），torch / CUDA / triton 版本和日期照样有。"""
    from types import SimpleNamespace

    def no_device(*a):
        raise AssertionError("没有 CUDA 时不该问设备名")

    fake = SimpleNamespace(__version__="9.9", version=SimpleNamespace(cuda=None),
                           cuda=SimpleNamespace(is_available=lambda: False, get_device_name=no_device))
    meta = GT.gpu_meta(fake, dtype="float32")
    assert meta["gpu"] is None and meta["driver"] is None and meta["torch"] == "9.9" and meta["cuda"] is None
    assert {"triton", "date"} <= set(meta) and meta["dtype"] == "float32"


def test_ratio_errors_median_and_worst():
    """中位 |比值 − 1|（偶数个取中间两个的平均）；最差按 |log 比值|：0.5 和 2.0 一样差，比 1.8 差。"""
    assert CU.ratio_errors([1.1, 0.5, 1.8, 1.0]) == (pytest.approx(0.3), 1)
    assert CU.ratio_errors([1.2, 0.9, 1.05]) == (pytest.approx(0.1), 0)
    assert CU.ratio_errors([2.0, 1.8])[1] == 0


def test_wall_per_call_many_interleaves_rounds_and_keeps_the_fastest(monkeypatch):
    """轮流量：每一轮每个 fn 各量一组（顺序 a b a b …），每个 fn 取最快的一轮；时钟是假的（每次调用 a 花 1、
    b 花 3，第 2 轮 a 被拖慢到 10），GPU 同步换成空函数。坏参数报名字。"""
    import time

    import torch
    clock, log = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def make(name, cost):
        def fn():
            log.append(name)
            slow = name == "a" and log.count("a") in (6, 7, 8)       # a 的第 6–8 次调用 = 热身 2 次、第 1 轮 3 次之后
            clock[0] += 10.0 if slow else cost
        return fn
    out = GT.wall_per_call_many({"a": make("a", 1.0), "b": make("b", 3.0)}, calls=9, warmup=2, rounds=3)
    assert out == {"a": 1.0, "b": 3.0}
    assert log[4:] == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    for kwargs, exc, word in [(dict(calls=2, rounds=3), ValueError, "calls"), (dict(calls=2.5), TypeError, "calls"),
                              (dict(calls=9, warmup=-1), ValueError, "warmup"), (dict(calls=9, rounds=0), ValueError,
                                                                                "rounds")]:
        with pytest.raises(exc, match=word):
            GT.wall_per_call_many({"a": make("a", 1.0)}, **kwargs)
    with pytest.raises(TypeError, match="fns"):
        GT.wall_per_call_many([make("a", 1.0)], calls=9)
    with pytest.raises(ValueError, match="trials"):
        GT.wall_per_call(make("a", 1.0), calls=9, trials=0)
    assert GT.wall_per_call(make("b", 3.0), calls=6, warmup=0, trials=3) == 3.0


def test_merge_identical_merges_within_atol_and_rejects_bad_atol():
    """xs 相同、ys 逐点差 ≤ atol 的曲线合成一条（标签 "A = B"）；差得多的、xs 不同的不合；atol 为负或 NaN 报错。"""
    series = [("A", [1, 2], [1.0, 2.0]), ("B", [1, 2], [1.0, 2.0004]), ("C", [1, 2], [1.0, 2.1]), ("D", [1, 3], [1, 2])]
    assert [s[0] for s in CU.merge_identical(series)] == ["A", "B", "C", "D"]
    merged = CU.merge_identical(series, atol=1e-3)
    assert [s[0] for s in merged] == ["A = B", "C", "D"] and merged[0][2] == [1.0, 2.0]
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="atol"):
            CU.merge_identical(series, atol=bad)
