"""第 4 讲练习的评分检查：RMSNorm（4.1）、SwiGLU（4.2）、两种配对的 RoPE（4.3）、GQA 注意力与 KV cache（4.4）。

参考都在这里用 float64 独立写出（numpy 或 torch 的基本运算，不用实验模块的积木）；梯度用
torch.autograd.gradcheck（float64、小的不规则尺寸）检查，并和参考的梯度比较。
"""
import math

import numpy as np
import torch

from grading import close, exercise, expect, expect_no_calls, module

ml = module("lecture04", "modern_lm")
F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _grads(fn, inputs, weight):
    """Σ fn(inputs)·weight 对每个输入的梯度（weight 是固定的随机张量：比 sum() 更能看出错位的梯度）。"""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    (fn(*leaves) * weight).sum().backward()
    return [t.grad for t in leaves]


def _gradcheck(fn, inputs, what):
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    try:
        ok = torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-5, raise_exception=False)
    except NotImplementedError:                    # 学生版里还没写：让它以练习自己的消息失败
        raise
    except RuntimeError as e:                      # 前向断开了计算图（detach、numpy、原地改写叶子……）
        ok, why = False, str(e).splitlines()[0]
    else:
        why = "自动求导的梯度与有限差分不一致"
    expect(ok, f"{what}：torch.autograd.gradcheck 没通过（{why}）：前向里不要 detach、不要转 numpy、不要 no_grad")


# =============================================================================
# 练习 4.1：RMSNorm
# =============================================================================
def _rmsnorm_ref(x, w, eps):
    """参考：y = x · (Σx²/d + eps)^(−1/2) · w，float64。"""
    return x * (x.square().sum(-1, keepdim=True) / x.shape[-1] + eps) ** -0.5 * w


NORM_CASES = ((3, 7, 0.3), (2, 5, 33, 1e-5), (1, 1, 0.7), (4, 2, 9, 2.0))   # (…形状, d, eps)


def _norm(d, eps, seed):
    norm = ml.RMSNorm(d, eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, dtype=F64, generator=_gen(seed)) + 0.5)   # 不全是 1：漏乘 weight 看得出
    return norm


@exercise("4.1")
def test_rmsnorm_matches_reference():
    for i, (*lead, d, eps) in enumerate(NORM_CASES):
        norm = _norm(d, eps, 4100 + i)
        x = 0.4 * torch.randn(*lead, d, dtype=F64, generator=_gen(4110 + i))   # 尺度小：eps 放错位置看得出
        close(norm(x).detach(), _rmsnorm_ref(x, norm.weight.detach(), eps), atol=1e-12, rtol=1e-12,
              message=f"RMSNorm 与 x / √(mean(x²) + eps) · weight 不一致（d={d}, eps={eps}）")
    expect_no_calls(ml.RMSNorm.forward, ["rms_norm", "layer_norm", "LayerNorm", "make_norm"])


@exercise("4.1")
def test_rmsnorm_does_not_subtract_the_mean():
    d = 6
    norm = _norm(d, 1e-12, 4120)
    w = norm.weight.detach()
    for c in (3.0, -0.25):
        x = torch.full((2, d), c, dtype=F64)
        close(norm(x).detach(), math.copysign(1.0, c) * w.expand(2, d), atol=1e-9, rtol=0,
              message=f"常数行 x = {c}·1 应归一成 sign(c)·weight：RMSNorm 不减均值（减了均值就是 LayerNorm，会得到 0）")
    x = torch.randn(3, d, dtype=F64, generator=_gen(4121))
    close(norm(7.5 * x).detach(), norm(x).detach(), atol=1e-10, rtol=0,
          message="RMSNorm(c·x) 应等于 RMSNorm(x)（c > 0，eps → 0）：除的是 √mean(x²)")


@exercise("4.1")
def test_rmsnorm_gradients():
    for i, (*lead, d, eps) in enumerate(NORM_CASES[:3]):
        norm = _norm(d, eps, 4130 + i)
        x = torch.randn(*lead, d, dtype=F64, generator=_gen(4140 + i))
        w = norm.weight.detach()

        def student(x_, w_, norm=norm):
            return torch.func.functional_call(norm, {"weight": w_}, (x_,))
        _gradcheck(student, (x, w), f"RMSNorm（d={d}）")
        g = torch.randn(*lead, d, dtype=F64, generator=_gen(4150 + i))
        got = _grads(student, (x, w), g)
        want = _grads(lambda a, b, eps=eps: _rmsnorm_ref(a, b, eps), (x, w), g)
        for name, a, b in zip(("x", "weight"), got, want):
            expect(a is not None, f"RMSNorm 的输出对 {name} 没有梯度")
            close(a, b, atol=1e-10, rtol=1e-10, message=f"RMSNorm 对 {name} 的梯度与参考不一致（d={d}）")


@exercise("4.1")
def test_rmsnorm_fp16_does_not_overflow():
    norm = ml.RMSNorm(16).half()
    x = torch.full((2, 16), 300.0, dtype=torch.float16)         # 300² = 90000 > fp16 的最大值 65504
    y = norm(x)
    expect(y.dtype == torch.float16, f"fp16 输入应得到 fp16 输出，得到 {y.dtype}")
    expect(bool(torch.isfinite(y).all()) and torch.allclose(y.float(), torch.ones(2, 16), atol=1e-2),
           "fp16 输入 300：x² 在 fp16 里溢出成 inf，结果成了 0 / NaN；平方和的规约要在 float32 里做")


# =============================================================================
# 练习 4.2：SwiGLU
# =============================================================================
def _swiglu_ref(x, wg, wu, wd):
    """参考：(silu(x·Wgᵀ) ⊙ x·Wuᵀ)·Wdᵀ，silu(z) = z / (1 + e^(−z))；nn.Linear 的权重是 [输出, 输入]。"""
    g = x @ wg.T
    return (g / (1 + torch.exp(-g)) * (x @ wu.T)) @ wd.T


MLP_CASES = ((2, 3, 5, 11), (1, 7, 9, 4), (3, 1, 2, 13))       # (B, T, d_model, d_ff)


def _mlp(d, f, seed):
    torch.manual_seed(seed)
    mlp = ml.SwiGLU(d, f).double()
    with torch.no_grad():
        for lin in (mlp.w_gate, mlp.w_up, mlp.w_down):
            lin.weight.mul_(3.0)                                # 让 gate 落到 SiLU 的弯曲处，分支对错看得出
    return mlp


def _weights(mlp):
    return [lin.weight.detach() for lin in (mlp.w_gate, mlp.w_up, mlp.w_down)]


@exercise("4.2")
def test_swiglu_matches_reference():
    for i, (B, T, d, f) in enumerate(MLP_CASES):
        mlp = _mlp(d, f, 4200 + i)
        x = torch.randn(B, T, d, dtype=F64, generator=_gen(4210 + i))
        close(mlp(x).detach(), _swiglu_ref(x, *_weights(mlp)), atol=1e-12, rtol=1e-12,
              message=f"SwiGLU 与 w_down(SiLU(w_gate·x) ⊙ w_up·x) 不一致（d_model={d}, d_ff={f}）")
    expect_no_calls(ml.SwiGLU.forward, ["gelu", "GeluMLP", "glu"], why="SwiGLU 用 SiLU 门控")


@exercise("4.2")
def test_swiglu_is_linear_in_the_up_branch():
    mlp = _mlp(6, 10, 4220)
    x = torch.randn(4, 6, dtype=F64, generator=_gen(4221))
    base = mlp(x).detach()
    with torch.no_grad():
        mlp.w_up.weight.mul_(-2.0)
    close(mlp(x).detach(), -2.0 * base, atol=1e-12, rtol=1e-12,
          message="w_up 乘 −2，输出应恰好乘 −2：SiLU 只作用在 gate 分支，up 分支是线性的")
    with torch.no_grad():
        mlp.w_up.weight.div_(-2.0)
        mlp.w_gate.weight.zero_()
    close(mlp(x).detach(), torch.zeros_like(base), atol=1e-15, rtol=0,
          message="w_gate = 0 时 SiLU(0) = 0，输出应为 0：门控是 SiLU(w_gate·x)")


@exercise("4.2")
def test_swiglu_gradients():
    for i, (B, T, d, f) in enumerate(MLP_CASES[:2]):
        mlp = _mlp(d, f, 4230 + i)
        x = torch.randn(B, T, d, dtype=F64, generator=_gen(4240 + i))

        def student(x_, wg, wu, wd, mlp=mlp):
            params = {"w_gate.weight": wg, "w_up.weight": wu, "w_down.weight": wd}
            return torch.func.functional_call(mlp, params, (x_,))
        inputs = (x, *_weights(mlp))
        _gradcheck(student, inputs, f"SwiGLU（d_model={d}, d_ff={f}）")
        g = torch.randn(B, T, d, dtype=F64, generator=_gen(4250 + i))
        for name, a, b in zip(("x", "w_gate", "w_up", "w_down"), _grads(student, inputs, g),
                              _grads(_swiglu_ref, inputs, g)):
            expect(a is not None, f"SwiGLU 的输出对 {name} 没有梯度")
            close(a, b, atol=1e-10, rtol=1e-10, message=f"SwiGLU 对 {name} 的梯度与参考不一致")


# =============================================================================
# 练习 4.3：RoPE 的两种配对
# =============================================================================
def _omega(dim, base):
    return base ** (-torch.arange(0, dim, 2, dtype=F64) / dim)          # [dim/2]：θ^(−2i/dim)


def _rope_complex(x, pos, base, pairing):
    """参考：一对分量当作复数 a + ib，乘 e^{i·p·ω}。
    pairing="half"：a = x[i]、b = x[i + dim/2]；"inter"：a = x[2i]、b = x[2i+1]。"""
    dim = x.shape[-1]
    phase = torch.polar(torch.ones(len(pos), dim // 2, dtype=F64), torch.outer(pos, _omega(dim, base)))
    if pairing == "half":
        z = torch.complex(x[..., :dim // 2], x[..., dim // 2:]) * phase
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * phase
    return torch.view_as_real(z).reshape(x.shape)


def _angles(pos, dim, base):
    a = torch.outer(pos, _omega(dim, base))
    return a.cos(), a.sin()


ROPE_CASES = (((2, 3, 5), 6, 10000.0), ((1, 9), 14, 500000.0), ((3, 2, 4), 22, 37.0), ((7,), 2, 10000.0))


@exercise("4.3")
def test_rope_both_pairings_match_complex_reference():
    for i, (lead, dim, base) in enumerate(ROPE_CASES):
        T = lead[-1]
        pos = torch.rand(T, dtype=F64, generator=_gen(4300 + i)) * 3000     # 小数、无序的位置
        x = torch.randn(*lead, dim, dtype=F64, generator=_gen(4310 + i))
        cos, sin = _angles(pos, dim, base)
        close(ml.apply_rope_half(x, cos, sin), _rope_complex(x, pos, base, "half"), atol=1e-12, rtol=0,
              message=f"apply_rope_half 与复数乘法不一致（dim={dim}）：分量 i 与 i + dim/2 配成一对，转第 i 个角度")
        close(ml.apply_rope_interleaved(x, cos, sin), _rope_complex(x, pos, base, "inter"), atol=1e-12, rtol=0,
              message=f"apply_rope_interleaved 与复数乘法不一致（dim={dim}）：分量 2i 与 2i+1 配成一对，转第 i 个角度，"
                      "结果仍按 (2i, 2i+1) 交错放回")
    for fn in (ml.apply_rope_half, ml.apply_rope_interleaved):
        expect_no_calls(fn, ["apply_rope", "_rope_reference"])


@exercise("4.3")
def test_rope_pairings_differ_by_a_permutation_and_keep_pair_lengths():
    for i, (lead, dim, base) in enumerate(ROPE_CASES):
        T = lead[-1]
        cos, sin = _angles(torch.arange(3, 3 + T, dtype=F64) * 1.7, dim, base)
        x = torch.randn(*lead, dim, dtype=F64, generator=_gen(4320 + i))
        perm = torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))
        close(ml.apply_rope_half(x[..., perm], cos, sin), ml.apply_rope_interleaved(x, cos, sin)[..., perm],
              atol=1e-12, rtol=0,
              message=f"两种配对应只差一个维度排列：half(x[perm]) = interleaved(x)[perm]（dim={dim}）")
        h = dim // 2
        y = ml.apply_rope_half(x, cos, sin)
        close(torch.hypot(y[..., :h], y[..., h:]), torch.hypot(x[..., :h], x[..., h:]), atol=1e-12, rtol=1e-12,
              message=f"apply_rope_half 转完之后每一对 (x[i], x[i + dim/2]) 的长度应不变（dim={dim}）")
        y = ml.apply_rope_interleaved(x, cos, sin)
        close(torch.hypot(y[..., 0::2], y[..., 1::2]), torch.hypot(x[..., 0::2], x[..., 1::2]), atol=1e-12,
              rtol=1e-12, message=f"apply_rope_interleaved 转完之后每一对 (x[2i], x[2i+1]) 的长度应不变（dim={dim}）")


@exercise("4.3")
def test_rope_scores_depend_only_on_relative_position():
    for fn in (ml.apply_rope_half, ml.apply_rope_interleaved):
        for dim in (6, 18):
            q, k = torch.randn(2, 1, dim, dtype=F64, generator=_gen(4330 + dim))
            for m, n in ((9, 2), (3, 40), (500, 500)):
                scores = []
                for shift in (0, 17, 2048):
                    cq, sq = _angles(torch.tensor([m + shift], dtype=F64), dim, 10000.0)
                    ck, sk = _angles(torch.tensor([n + shift], dtype=F64), dim, 10000.0)
                    scores.append(float((fn(q, cq, sq) * fn(k, ck, sk)).sum()))
                expect(max(scores) - min(scores) < 1e-10,
                       f"{fn.__name__}：q 在位置 m、k 在位置 n 时 q·k 应只依赖 m − n"
                       f"（m={m}, n={n}, dim={dim}）：{scores}")


@exercise("4.3")
def test_rope_gradients():
    for fn in (ml.apply_rope_half, ml.apply_rope_interleaved):
        for i, (lead, dim) in enumerate((((2, 3), 6), ((1, 4), 10))):
            T = lead[-1]
            x = torch.randn(*lead, dim, dtype=F64, generator=_gen(4340 + i))
            cos, sin = _angles(torch.arange(T, dtype=F64) + 0.5, dim, 100.0)
            _gradcheck(fn, (x, cos, sin), f"{fn.__name__}（dim={dim}）")


# =============================================================================
# 练习 4.4：GQA 注意力与 KV cache
# =============================================================================
def _attention_ref(attn, x, pos0=0):
    """参考：float64 numpy，逐个查询头用第 h·G//H 组 K/V，显式掩码（因果、窗口、ALiBi），再乘 Wo。"""
    cfg = attn.cfg
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    W = {n: getattr(attn, n).weight.detach().numpy() for n in ("wq", "wk", "wv", "wo")}
    xn = x.detach().numpy()
    B, T, _ = xn.shape
    q = (xn @ W["wq"].T).reshape(B, T, H, dh)
    k = (xn @ W["wk"].T).reshape(B, T, G, dh)
    v = (xn @ W["wv"].T).reshape(B, T, G, dh)
    dist = np.arange(T)[:, None] - np.arange(T)[None, :]               # 查询比键晚多少个位置
    ok = (dist >= 0) & ((dist < cfg.window) if cfg.window else True)
    out = np.empty((B, T, H, dh))
    for h in range(H):
        g = h * G // H
        s = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(dh)
        if cfg.pos == "alibi":
            s = s - float(attn.slopes[h]) * np.maximum(dist, 0)
        s = np.where(ok[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, :, h] = np.einsum("bts,bsd->btd", p / p.sum(-1, keepdims=True), v[:, :, g])
    return out.reshape(B, T, H * dh) @ W["wo"].T


ATTN_CFGS = (  # 不用 RoPE：RoPE 是练习 4.3，这里只查注意力和 cache
    dict(n_heads=6, n_kv_heads=2, d_head=4, pos="none"),
    dict(n_heads=4, n_kv_heads=1, d_head=6, pos="alibi"),
    dict(n_heads=6, n_kv_heads=3, d_head=2, pos="none", window=3),
    dict(n_heads=5, n_kv_heads=5, d_head=4, pos="alibi", window=5),
)


def _attention(kw, seed):
    torch.manual_seed(seed)
    cfg = ml.LMConfig(vocab=11, d_model=10, n_layers=2, d_ff=8, max_seq=64, **kw)
    return ml.Attention(cfg).double()


@exercise("4.4")
def test_attention_matches_reference():
    for i, kw in enumerate(ATTN_CFGS):
        attn = _attention(kw, 4400 + i)
        x = torch.randn(2, 9, 10, dtype=F64, generator=_gen(4410 + i))
        close(attn(x).detach(), _attention_ref(attn, x), atol=1e-12, rtol=1e-12,
              message=f"整段（没有 cache）的注意力与逐头显式 softmax 的参考不一致（{kw}）")
    for fn in (ml.Attention._attend, ml.KVCache._append):
        expect_no_calls(fn, ["_attention_reference", "expand_kv_heads"])


@exercise("4.4")
def test_gqa_equals_mha_with_copied_kv_heads():
    for i, (H, G) in enumerate(((6, 2), (8, 4), (4, 1))):
        gqa = _attention(dict(n_heads=H, n_kv_heads=G, d_head=4, pos="none"), 4420 + i)
        mha = _attention(dict(n_heads=H, n_kv_heads=H, d_head=4, pos="none"), 0)
        R = H // G
        with torch.no_grad():                          # 每组的 K/V 投影复制给组里相邻的 R 个头
            for n in ("wq", "wo"):
                getattr(mha, n).weight.copy_(getattr(gqa, n).weight)
            for n in ("wk", "wv"):
                w = getattr(gqa, n).weight.view(G, 1, 4, 10).expand(G, R, 4, 10)
                getattr(mha, n).weight.copy_(w.reshape(H * 4, 10))
        x = torch.randn(2, 7, 10, dtype=F64, generator=_gen(4430 + i))
        close(gqa(x).detach(), mha(x).detach(), atol=1e-12, rtol=1e-12,
              message=f"H={H}、G={G}：GQA 应等于把每组 K/V 复制给组内 H/G 个相邻头的 MHA（头 h 用第 h // (H/G) 组）")


def _decode(attn, x, chunks):
    """按块喂进 Attention（带 KVCache，只用第 0 层），返回拼起来的输出和每块之后 cache 里留的键数。"""
    cache = ml.KVCache(attn.cfg)
    outs, kept, start = [], [], 0
    for T in chunks:
        outs.append(attn(x[:, start:start + T], pos0=start, cache=cache, layer=0))
        start += T
        cache.length = start
        kept.append(0 if cache.k[0] is None else cache.k[0].shape[2])
    return torch.cat(outs, dim=1).detach(), kept


@exercise("4.4")
def test_decode_with_cache_equals_full_attention():
    for i, kw in enumerate(ATTN_CFGS):
        attn = _attention(kw, 4440 + i)
        for chunks in ((4, 1, 1, 3, 1, 2), (1,) * 9):
            x = torch.randn(2, sum(chunks), 10, dtype=F64, generator=_gen(4450 + i))
            got, _ = _decode(attn, x, chunks)
            close(got, _attention_ref(attn, x), atol=1e-12, rtol=1e-12,
                  message=f"带 KV cache 按块 {chunks} 计算的输出与整段计算不一致（{kw}）：新的 K/V 要接在缓存的后面，"
                          "键的位置跟着一起接；有 cache 时掩码要按查询的绝对位置 pos0 + i 算")


@exercise("4.4")
def test_sliding_window_cache_stays_bounded():
    for i, W in enumerate((1, 2, 3, 6)):                 # window = 1：只看自己，一个旧键也不用留
        attn = _attention(dict(n_heads=4, n_kv_heads=2, d_head=4, pos="none", window=W), 4460 + i)
        chunks = (3,) + (1,) * 12
        x = torch.randn(1, sum(chunks), 10, dtype=F64, generator=_gen(4470 + i))
        got, kept = _decode(attn, x, chunks)
        close(got, _attention_ref(attn, x), atol=1e-12, rtol=1e-12,
              message=f"window={W}：滚动缓冲区丢掉了还要用的键（每个查询要看最近 {W} 个键，含自己）")
        expect(max(kept) <= W - 1, f"window={W}：cache 里留了 {max(kept)} 个键；滑动窗口模型只需最近 window − 1 个旧键"
                                   f"（window = 1 时一个不留：注意 -(W − 1) = -0 的切片是整段），cache 不应随长度增长")
