"""第 1 讲的练习检查：1.1 参数量、1.2 GQA 的 KV cache 字节、1.3 一步的 roofline 时间、1.4 decode 吞吐的上界
（1.5 是预测，见 lecture01/predictions.yaml）。

参考答案都写在这里：参数量按每个张量的形状逐个相乘（不用 llm_math._brute_force_params），FLOPs、字节、时间按公式从
配置的字段直接算（不调 matmul_params / step_flops / roofline_time）。配置除了真实模型，还有随机生成的不规则配置：
GQA（G < H、G = 1）、dh ≠ d / H、词嵌入共享与否、qkv 偏置、可学习位置编码、额外参数。
"""
import math

import numpy as np
from grading import close, exercise, expect, expect_no_calls, module

lm = module("lecture01", "llm_math")
hw = module("lecture01", "hw_specs")


def _random_configs(seed, k):
    rng = np.random.default_rng(seed)
    out = []
    for j in range(k):
        g = int(rng.choice([1, 2, 3, 5]))
        h = g * int(rng.choice([1, 2, 3, 4]))
        out.append(lm.ModelConfig(
            f"rand{j}", n_layers=int(rng.integers(1, 7)), d_model=int(rng.integers(5, 300)), n_heads=h, n_kv_heads=g,
            d_head=int(rng.integers(3, 41)), d_ff=int(rng.integers(7, 700)), vocab=int(rng.integers(11, 5000)),
            tied=bool(rng.integers(2)), qkv_bias=bool(rng.integers(2)),
            n_pos=int(rng.choice([0, int(rng.integers(1, 300))])),
            extra_per_layer=int(rng.choice([0, int(rng.integers(1, 50))])),
            extra_final=int(rng.choice([0, int(rng.integers(1, 50))]))))
    return out


def _desc(c):
    return (f"{c.name}（L = {c.n_layers}、d = {c.d_model}、H = {c.n_heads}、G = {c.n_kv_heads}、dh = {c.d_head}、"
            f"f = {c.d_ff}、V = {c.vocab}、tied = {c.tied}、qkv_bias = {c.qkv_bias}、n_pos = {c.n_pos}、"
            f"extra_per_layer = {c.extra_per_layer}、extra_final = {c.extra_final}）")


def _layer_tensors(c):
    """一层的每个张量（名字 → 形状）：Llama 式的层，偏置和"其它"按配置加上。"""
    d, qd, kvd = c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    t = {"attn_norm": (d,), "wq": (d, qd), "wk": (d, kvd), "wv": (d, kvd), "wo": (qd, d),
         "mlp_norm": (d,), "w_gate": (d, c.d_ff), "w_up": (d, c.d_ff), "w_down": (c.d_ff, d),
         "other": (c.extra_per_layer,)}
    if c.qkv_bias:
        t.update(bq=(qd,), bk=(kvd,), bv=(kvd,))
    return t


def _count(shapes):
    return sum(math.prod(s) for s in shapes)


def _model_tensors(c):
    shapes = [(c.vocab, c.d_model), (c.n_pos, c.d_model), (c.d_model,), (c.extra_final,)]
    if not c.tied:
        shapes.append((c.vocab, c.d_model))
    return shapes + [s for _ in range(c.n_layers) for s in _layer_tensors(c).values()]


def _matmul_weights(c):
    """每个 token 乘一遍的权重：每层 Wq Wk Wv Wo + 三个 MLP 矩阵，加上 lm_head（共享也照样乘）。"""
    lt = _layer_tensors(c)
    per_layer = _count([lt[k] for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")])
    return c.n_layers * per_layer + c.vocab * c.d_model


def _kv_per_token(c, b):
    return b * c.n_layers * _count([(c.n_kv_heads, c.d_head), (c.n_kv_heads, c.d_head)])      # K 和 V


def _roofline(c, chip, batch, n_new, ctx, prec="bf16", w_bytes=2.0, kv_bytes=2.0, mfu=1.0, mbu=1.0, n_chips=1,
              rule="tp"):
    """一次前向（每卡）的 flops、字节、两种时间：公式直接从字段算。"""
    keys = n_new * ctx + n_new * (n_new + 1) / 2                  # 第 j 个新 token 看 ctx + j 个 key
    flops = batch * n_new * 2 * _matmul_weights(c) + batch * 4 * c.n_layers * c.n_heads * c.d_head * keys
    if rule == "tp":
        kv_tok = 2 * c.n_layers * max(c.n_kv_heads // n_chips, 1) * c.d_head * kv_bytes
    else:
        kv_tok = _kv_per_token(c, kv_bytes) / n_chips
    nbytes = _matmul_weights(c) * w_bytes / n_chips + batch * (ctx + n_new) * kv_tok
    flops = flops / n_chips
    return flops, nbytes, flops / (chip.peak_flops(prec) * mfu), nbytes / (chip.mem_bw * mbu)


class _OddChip:
    """一块数字不整齐的假芯片（只有 roofline 要用的字段）。"""
    name = "odd"
    mem_bw, mem_cap, alloc_bytes = 1.37e12, 33e9, 31.5e9

    @staticmethod
    def peak_flops(prec="bf16"):
        return {"bf16": 271e12, "fp8": 542e12}[prec]


# ----------------------------------------------------------------------------- 1.1
@exercise("1.1")
def test_param_count_matches_published_counts():
    for name, exact in lm.EXACT_PARAMS.items():
        got = lm.PRESETS[name].n_params()
        expect(got == exact, f"{name} 的参数总数应为 {exact:,}（Hugging Face 逐个张量数出来的），得到 {got:,}")
    for name, cfg in lm.PRESETS.items():
        pub = lm.PUBLISHED_PARAMS[name][0]
        tol = lm.param_tolerance(name)[0]
        got = cfg.n_params()
        expect(abs(got - pub) / pub < tol, f"{name} 的参数总数 {got:,} 和官方的 {pub:,.0f} 差了 "
                                           f"{abs(got - pub) / pub:.2%}（允许 {tol:.1%}）")


@exercise("1.1")
def test_param_count_equals_tensor_by_tensor_count():
    for c in _random_configs(101, 40):
        want = _count(_model_tensors(c))
        got = c.n_params()
        expect(got == want, f"{_desc(c)}：逐个张量数出来是 {want:,} 个参数，n_params() 得到 {got:,}")
        per_layer = sum(c.layer_params().values())
        want_layer = _count(_layer_tensors(c).values())
        expect(per_layer == want_layer, f"{_desc(c)}：一层应有 {want_layer:,} 个参数，layer_params() 加起来是 {per_layer:,}")


@exercise("1.1")
def test_param_groups_breakdown():
    expect_no_calls(lm.ModelConfig.layer_params, ["_brute_force_params", "count_params", "init_params",
                                                  "published_count", "matmul_params", "param_groups", "n_params"])
    expect_no_calls(lm.ModelConfig.param_groups, ["_brute_force_params", "count_params", "init_params",
                                                  "published_count", "matmul_params", "n_params"])
    for c in list(lm.PRESETS.values()) + _random_configs(202, 30):
        lt = _layer_tensors(c)
        lp = c.layer_params()
        expect(set(lp) == {"attention", "mlp", "norms", "other"},
               f"layer_params() 的键应为 attention / mlp / norms / other，得到 {sorted(lp)}")
        attn = [lt[k] for k in ("wq", "wk", "wv", "wo", "bq", "bk", "bv") if k in lt]
        want = {"attention": _count(attn), "mlp": _count([lt["w_gate"], lt["w_up"], lt["w_down"]]),
                "norms": _count([lt["attn_norm"], lt["mlp_norm"]]), "other": c.extra_per_layer}
        if lp["attention"] != want["attention"]:
            mha = (c.d_model * 4 * c.n_heads * c.d_head + (3 * c.n_heads * c.d_head if c.qkv_bias else 0))
            hint = "Wk、Wv 的输出维是 G·dh（n_kv_heads），不是 H·dh" if lp["attention"] == mha else \
                "Wq d×H·dh、Wk Wv 各 d×G·dh、Wo H·dh×d，有 qkv 偏置再加 (H + 2G)·dh"
            expect(False, f"{c.name}（H = {c.n_heads}、G = {c.n_kv_heads}、dh = {c.d_head}、d = {c.d_model}）："
                          f"一层注意力应有 {want['attention']:,} 个参数，得到 {lp['attention']:,}（{hint}）")
        for k in ("mlp", "norms", "other"):
            expect(lp[k] == want[k], f"{c.name}：一层的 {k} 应为 {want[k]:,}，得到 {lp[k]:,}")
        g = c.param_groups()
        expect(set(g) == {"embeddings", "attention", "mlp", "norms", "lm_head", "other"},
               f"param_groups() 的键应为 embeddings / attention / mlp / norms / lm_head / other，得到 {sorted(g)}")
        L, d = c.n_layers, c.d_model
        expect(g["lm_head"] == (0 if c.tied else c.vocab * d),
               f"{c.name}（tied={c.tied}）：lm_head 组应为 {0 if c.tied else c.vocab * d:,}"
               f"（共享时矩阵算在 embeddings 里，只算一次）")
        expect(g["embeddings"] == (c.vocab + c.n_pos) * d,
               f"{c.name}：embeddings 组应为 (V + n_pos)·d = {(c.vocab + c.n_pos) * d:,}（含可学习位置编码），"
               f"得到 {g['embeddings']:,}")
        expect(g["norms"] == L * want["norms"] + d,
               f"{c.name}：norms 组应为 L·2d + d = {L * want['norms'] + d:,}（别忘了最后一个归一化层），得到 {g['norms']:,}")
        for k in ("attention", "mlp"):
            expect(g[k] == L * want[k], f"{c.name}：{k} 组应为 L × 一层 = {L * want[k]:,}，得到 {g[k]:,}")
        expect(g["other"] == L * c.extra_per_layer + c.extra_final,
               f"{c.name}：other 组应为 L·extra_per_layer + extra_final，得到 {g['other']:,}")
        expect(all(type(v) is int for v in list(g.values()) + list(lp.values())),
               f"{c.name}：参数个数应是 Python 整数（不要用 / 产生浮点数）")


# ----------------------------------------------------------------------------- 1.2
@exercise("1.2")
def test_kv_bytes_per_token_counts_only_kv_heads():
    expect_no_calls(lm.ModelConfig.kv_bytes_per_token, ["fit", "kv_cache_bytes", "step_bytes", "step_time"])
    for c in list(lm.PRESETS.values()) + _random_configs(303, 30):
        for b in (2.0, 1.0, 0.5, 4.0, 1.5):
            got = c.kv_bytes_per_token(b)
            want = _kv_per_token(c, b)
            expect(math.isclose(got, want, rel_tol=1e-12),
                   f"{c.name}（L = {c.n_layers}、H = {c.n_heads}、G = {c.n_kv_heads}、dh = {c.d_head}）每个数 {b:g} 字节："
                   f"每 token 的 KV 应为 {want:g} 字节，得到 {got:g}（每层 K、V 各 G·dh 个数；GQA 只存 G 个 KV 头）")
        expect(c.kv_bytes_per_token() == _kv_per_token(c, 2.0), f"{c.name}：默认 bytes_per_elem 是 2（BF16）")
    expect(lm.LLAMA31_8B.kv_bytes_per_token() == 131072,
           "Llama-3.1-8B（32 层、8 个 KV 头、dh = 128、BF16）每 token 的 KV 应为 128 KiB = 131072 字节")
    base = lm.LLAMA31_8B
    for h in (8, 16, 64):        # query 头数变了、KV 头数不变：KV cache 不变
        other = lm.scaled(base, f"8B-H{h}", n_heads=h)
        expect(other.kv_bytes_per_token() == base.kv_bytes_per_token(),
               f"只把 query 头数从 32 改成 {h}（KV 头仍是 8）：KV cache 不应变化")


@exercise("1.2")
def test_kv_cache_bytes_scales_with_batch_and_ctx():
    expect_no_calls(lm.ModelConfig.kv_cache_bytes, ["fit", "step_bytes", "step_time"])
    cases = ((1, 1), (3, 1000), (7, 513), (64, 4096), (0, 100), (5, 0), (2, 131072.0))
    for c in (lm.LLAMA32_1B, lm.LLAMA31_70B) + tuple(_random_configs(404, 10)):
        for batch, ctx in cases:
            for b in (2.0, 1.0, 0.5):
                got = c.kv_cache_bytes(batch, ctx, b)
                want = batch * int(ctx) * _kv_per_token(c, b)
                expect(math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0),
                       f"{c.name}：batch = {batch}、ctx = {ctx} 个 token、每个数 {b:g} 字节时 KV cache 应为 {want:g} 字节，"
                       f"得到 {got:g}（batch × ctx × 每 token 的 KV）")


# ----------------------------------------------------------------------------- 1.3
_STEP_POINTS = ((1, 1, 0), (7, 1, 513), (64, 1, 4096), (1, 4096, 0), (3, 77, 1000), (256, 1, 2048))
_CHIPS = (hw.H100_SXM, hw.H200, hw.B200, _OddChip)


def _check_step(r, c, chip, point, kw):
    flops, nbytes, t_c, t_m = _roofline(c, chip, *point, **kw)
    where = f"{c.name} 在 {chip.name} 上，(batch, n_new, ctx) = {point}，{kw or '默认参数'}"
    close(r["flops"], flops, atol=0, rtol=1e-9, message=f"{where}：每卡 FLOPs")
    close(r["bytes"], nbytes, atol=0, rtol=1e-9,
          message=f"{where}：每卡字节（矩阵乘权重 × w_bytes / 卡数 + batch·(ctx + n_new)·每卡每 token 的 KV）")
    close(r["t_compute"], t_c, atol=0, rtol=1e-9, message=f"{where}：运算时间 = FLOPs / (峰值 × mfu)")
    close(r["t_memory"], t_m, atol=0, rtol=1e-9, message=f"{where}：搬数据时间 = 字节 / (带宽 × mbu)")
    close(r["time"], max(t_c, t_m), atol=0, rtol=1e-9,
          message=f"{where}：roofline 时间是两者中大的那个（运算和搬数据重叠），不是相加")
    close(r["intensity"], flops / nbytes, atol=0, rtol=1e-9, message=f"{where}：算术强度 = FLOPs / 字节")
    want = "compute" if t_c >= t_m else "memory"
    expect(r["bound"] == want, f"{where}：运算 {t_c:.3g} s、搬数据 {t_m:.3g} s，bound 应为 {want!r}，得到 {r['bound']!r}")


@exercise("1.3")
def test_step_time_is_max_of_compute_and_memory():
    expect_no_calls(lm.step_time, ["roofline_time", "attainable_flops", "ridge_point", "bound"],
                    "roofline 要在这里写出来")
    for c in (lm.LLAMA32_1B, lm.LLAMA31_8B) + tuple(_random_configs(505, 4)):
        for chip in _CHIPS:
            for point in _STEP_POINTS:
                _check_step(lm.step_time(c, chip, *point), c, chip, point, {})
    r = lm.step_time(lm.LLAMA31_8B, hw.H200, 1, 1)
    expect(r["bound"] == "memory", "Llama-3.1-8B 在 H200 上 batch 1 的 decode 应受带宽限制")
    r = lm.step_time(lm.LLAMA31_8B, hw.H200, 1, 8192)
    expect(r["bound"] == "compute", "Llama-3.1-8B 在 H200 上 8192 个 token 的 prefill 应受算力限制")


@exercise("1.3")
def test_step_time_mfu_mbu_and_precision():
    for c in (lm.LLAMA31_8B,) + tuple(_random_configs(606, 3)):
        for chip in (hw.H200, _OddChip):
            for point in _STEP_POINTS:
                for kw in ({"mfu": 0.37, "mbu": 0.61}, {"mfu": 0.5}, {"mbu": 0.8, "prec": "fp8", "w_bytes": 1.0,
                                                                       "kv_bytes": 1.0}):
                    _check_step(lm.step_time(c, chip, *point, **kw), c, chip, point, kw)


@exercise("1.3")
def test_step_time_tensor_parallel_and_fit():
    m = lm.LLAMA31_8B                                # H = 32、G = 8：16 张卡时每卡复制 1 个 KV 头
    for n in (2, 4, 8, 16):
        for point in ((1, 1, 512), (64, 1, 2048), (1, 2048, 0)):
            r = lm.step_time(m, hw.H200, *point, n_chips=n)
            _check_step(r, m, hw.H200, point, {"n_chips": n})
            expect(r["fit"] == lm.fit(m, hw.H200, n, point[0], point[2] + point[1]),
                   f"n_chips = {n}：返回的 fit 应是 fit(model, chip, n_chips, batch, ctx + n_new, …)")
            expect(r["fits"] is r["fit"].fits, "返回的 fits 应等于 fit.fits")
    for n in (3, 5):                                 # rule="bytes"：不管头数，KV 和权重都平分
        r = lm.step_time(m, hw.H100_SXM, 8, 1, 1000, n_chips=n, rule="bytes")
        _check_step(r, m, hw.H100_SXM, (8, 1, 1000), {"n_chips": n, "rule": "bytes"})
    r = lm.step_time(lm.LLAMA31_405B, hw.H200, 1, 1)
    expect(not r["fits"] and r["time"] > 0, "405B 放不进一张 H200：step_time 照样给出时间，但 fits 必须是 False")


# ----------------------------------------------------------------------------- 1.4
@exercise("1.4")
def test_decode_time_and_tokens_per_s():
    expect_no_calls(lm.decode_tokens_per_s, ["roofline_time", "attainable_flops"])
    cases = ((lm.LLAMA32_1B, hw.H200, {}), (lm.LLAMA31_8B, hw.H100_SXM, {"mbu": 0.7}),
             (lm.LLAMA31_8B, hw.H200, {"n_chips": 2, "mfu": 0.6}), (lm.LLAMA31_70B, hw.H200, {"n_chips": 4}),
             (_random_configs(707, 1)[0], _OddChip, {"mbu": 0.55}))
    for c, chip, kw in cases:
        for batch, ctx in ((1, 0), (1, 512), (7, 513), (64, 2048), (300, 100)):
            _, _, t_c, t_m = _roofline(c, chip, batch, 1, ctx, **kw)
            where = f"{c.name} 在 {chip.name} 上，batch = {batch}、ctx = {ctx}，{kw or '默认参数'}"
            t = lm.decode_time_per_token(c, chip, batch, ctx, **kw)
            close(t, max(t_c, t_m), atol=0, rtol=1e-9,
                  message=f"{where}：decode 一步的时间（n_new = 1 的 roofline 时间）")
            tps = lm.decode_tokens_per_s(c, chip, batch, ctx, **kw)
            close(tps, batch / max(t_c, t_m), atol=0, rtol=1e-9,
                  message=f"{where}：吞吐 = 批里每个序列各出 1 个 token，即 batch / 每步时间")


@exercise("1.4")
def test_decode_raises_capacity_error_when_it_does_not_fit():
    for fn in (lm.decode_time_per_token, lm.decode_tokens_per_s):
        for c, chip, batch, ctx, kw in ((lm.LLAMA31_405B, hw.H200, 1, 0, {}),
                                        (lm.LLAMA31_8B, hw.H100_SXM, 512, 32768, {}),
                                        (lm.LLAMA31_70B, hw.H200, 1, 0, {"n_chips": 1})):
            try:
                fn(c, chip, batch, ctx, **kw)
            except lm.CapacityError as e:
                expect(c.name in str(e), f"{fn.__name__}：CapacityError 的消息应说明哪个模型放不下（用 fit 的 why）")
            else:
                expect(False, f"{fn.__name__}({c.name}, {chip.name}, batch={batch}, ctx={ctx})：放不下，应抛 "
                              f"CapacityError，而不是返回一个看起来正常的数")
    t = lm.decode_time_per_token(lm.LLAMA31_405B, hw.H200, 1, 0, n_chips=8)      # 8 张卡放得下：照常给数
    expect(t > 0, "405B 在 8 张 H200 上放得下：decode_time_per_token 应返回正的时间")


@exercise("1.4")
def test_decode_throughput_grows_with_batch_then_saturates():
    m, chip = lm.LLAMA31_8B, hw.H200
    batches = (1, 2, 8, 32, 128, 512, 1024)
    tps = [lm.decode_tokens_per_s(m, chip, b, 0) for b in batches]
    shown = [f"{x:.3g}" for x in tps]
    expect(all(a <= b * (1 + 1e-12) for a, b in zip(tps, tps[1:])), f"上下文为 0 时总吞吐不应随 batch 变小（{shown}）")
    expect(all(a < b for a, b in zip(tps[:5], tps[1:5])),
           f"受带宽限制时（batch ≤ 128）权重读一遍给整个批用：总吞吐应随 batch 增长（{shown}）")
    per_seq = [t / b for t, b in zip(tps, batches)]
    expect(all(a >= b for a, b in zip(per_seq, per_seq[1:])), "每个序列的速度（总吞吐 / batch）不应随 batch 变快")
    flops_per_tok = 2 * _matmul_weights(m) + 4 * m.n_layers * m.n_heads * m.d_head       # ctx = 0：只看自己
    close(tps[-1], chip.peak_flops("bf16") / flops_per_tok, atol=0, rtol=1e-9,
          message="batch = 1024 时已受算力限制：吞吐应等于峰值 / 每 token 的 FLOPs")
