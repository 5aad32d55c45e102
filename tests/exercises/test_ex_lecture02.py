"""第 2 讲练习的评分检查：RoPE（2.1）、带 KV cache 的 GQA 注意力（2.2）、矩阵乘的记账（2.3）。

每个检查用固定种子、不规则的尺寸，和这里独立写出的 float64 参考比较（不用实验模块自己的参考函数），
或者检验一条必须成立的性质（旋转保长度、分数只依赖相对位置、未来的键不影响输出……）。
"""
import math

import numpy as np

from grading import close, exercise, expect, expect_no_calls, module

tl = module("lecture02", "transformer_lab")


# =============================================================================
# 练习 2.1：RoPE
# =============================================================================
def _rope_by_complex(x, positions, theta):
    """参考：相邻两个数 (x[2i], x[2i+1]) 当作复数 x[2i] + i·x[2i+1]，乘以 e^{i·p·ω_i}，ω_i = θ^(−2i/d)。"""
    d = x.shape[-1]
    omega = np.exp(-math.log(theta) * np.arange(0, d, 2) / d)                    # [d/2]
    phase = np.exp(1j * np.outer(np.asarray(positions, dtype=np.float64), omega))  # [T, d/2]
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * phase[None, :, None, :]            # [B, T, 头数, d/2]
    return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)


ROPE_CASES = ((2, 5, 3, 6, 10000.0), (1, 9, 2, 14, 500000.0), (3, 4, 1, 22, 37.0), (1, 1, 4, 2, 10000.0))


@exercise("2.1")
def test_rope_matches_complex_reference():
    rng = np.random.default_rng(2101)
    for B, T, nh, dh, theta in ROPE_CASES:
        pos = rng.integers(0, 3000, size=T)                       # 不连续、不排序的位置
        cos, sin = tl.rope_angles(pos, dh, theta)
        expect(np.shape(cos) == (T, dh // 2) and np.shape(sin) == (T, dh // 2),
               f"rope_angles 应返回 [T, d_head/2] = {(T, dh // 2)} 的 cos、sin，得到 {np.shape(cos)}")
        omega = theta ** (-np.arange(dh // 2) / (dh / 2))
        close(cos, np.cos(np.outer(pos, omega)), atol=1e-12, rtol=0,
              message=f"rope_angles 的角度不对（d_head={dh}, θ={theta}）：第 i 对应转 p·θ^(−2i/d_head)")
        close(sin, np.sin(np.outer(pos, omega)), atol=1e-12, rtol=0,
              message=f"rope_angles 的 sin 不对（d_head={dh}, θ={theta}）")
        x = rng.standard_normal((B, T, nh, dh))
        close(tl.apply_rope(x, cos, sin), _rope_by_complex(x, pos, theta), atol=1e-12, rtol=0,
              message=f"apply_rope 与复数乘法 (x[2i] + i·x[2i+1])·e^(i·p·ω_i) 不一致（d_head={dh}）："
                      "相邻两个数一对，(a, b) → (a·cos − b·sin, a·sin + b·cos)")
    for fn in (tl.rope_angles, tl.apply_rope):
        expect_no_calls(fn, ["_rope_reference", "_attention_reference"])


@exercise("2.1")
def test_rope_rotation_keeps_each_pair_length():
    rng = np.random.default_rng(2102)
    for B, T, nh, dh, theta in ROPE_CASES:
        pos = rng.uniform(0, 2000, size=T)                        # 小数位置（位置插值）也要成立
        x = rng.standard_normal((B, T, nh, dh))
        y = tl.apply_rope(x, *tl.rope_angles(pos, dh, theta))
        pair_len = np.hypot(x[..., 0::2], x[..., 1::2])           # 每一对 (2i, 2i+1) 的长度
        close(np.hypot(y[..., 0::2], y[..., 1::2]), pair_len, atol=1e-12, rtol=1e-12,
              message=f"旋转之后每一对 (x[2i], x[2i+1]) 的长度应不变（d_head={dh}）：是不是配错了对，"
                      "或者 cos、sin 用错了位置")
        expect(np.allclose(tl.apply_rope(x[:, :1], *tl.rope_angles([0], dh, theta)), x[:, :1], atol=1e-14),
               "位置 0 的 RoPE 应是恒等变换（转 0 度）")


@exercise("2.1")
def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(2103)
    for dh, theta in ((6, 10000.0), (18, 777.0), (4, 500000.0)):
        q, k = rng.standard_normal((2, 1, 1, 1, dh))
        for m, n in ((7, 3), (2, 11), (40, 40), (1234, 987)):
            scores = []
            for shift in (0, 5, 313, 4099):
                rq = tl.apply_rope(q, *tl.rope_angles([m + shift], dh, theta))
                rk = tl.apply_rope(k, *tl.rope_angles([n + shift], dh, theta))
                scores.append(float(np.sum(rq * rk)))
            expect(np.allclose(scores, scores[0], atol=1e-10, rtol=0),
                   f"q 在位置 m、k 在位置 n 时 q·k 应只依赖 m − n（d_head={dh}, m={m}, n={n}）："
                   f"两者同时平移后分数变了 {scores}")


# =============================================================================
# 练习 2.2：GQA 注意力（带 KV cache 的解码）
# =============================================================================
def _attention_by_heads(q, k, v, q_pos0, causal):
    """参考：逐个查询头，找它的 K/V 组（相邻 H/G 个头共用一组），float64 显式 softmax。返回 [B, T, H·dh]。"""
    B, T, H, dh = q.shape
    S, G = k.shape[1], k.shape[2]
    out = np.empty((B, T, H, dh))
    key_pos = np.arange(S)
    for h in range(H):
        g = (h * G) // H                                   # 组号：头 0…R−1 → 0，R…2R−1 → 1 …
        s = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(dh)
        if causal:
            future = key_pos[None, :] > (q_pos0 + np.arange(T))[:, None]      # [T, S]
            s = np.where(future[None], -np.inf, s)
        w = np.exp(s - s.max(-1, keepdims=True))
        out[:, :, h] = np.einsum("bts,bsd->btd", w / w.sum(-1, keepdims=True), v[:, :, g])
    return out.reshape(B, T, H * dh)


ATTN_CASES = (  # (B, T, S, H, G, dh, causal)：GQA、MQA、MHA，prefill（T = S）与带历史的查询（T < S）
    (2, 5, 5, 6, 2, 6, True), (1, 3, 11, 4, 1, 10, True), (2, 4, 7, 5, 5, 4, True),
    (3, 1, 9, 8, 4, 2, True), (2, 4, 7, 6, 3, 6, False), (1, 7, 13, 9, 3, 8, True))


@exercise("2.2")
def test_attention_matches_reference():
    rng = np.random.default_rng(2201)
    for B, T, S, H, G, dh, causal in ATTN_CASES:
        q = rng.standard_normal((B, T, H, dh))
        k, v = rng.standard_normal((2, B, S, G, dh))
        got = tl.attention_core(q, k, v, S - T, causal=causal)
        close(got, _attention_by_heads(q, k, v, S - T, causal), atol=1e-12, rtol=1e-12,
              message=f"attention_core 与逐头 softmax(q·kᵀ/√dh + 因果掩码)·v 不一致"
                      f"（B={B}, T={T}, S={S}, H={H}, G={G}, dh={dh}, causal={causal}）")
    expect_no_calls(tl.attention_core, ["_attention_reference", "scaled_dot_product_attention"])


@exercise("2.2")
def test_query_heads_use_their_own_kv_group():
    rng = np.random.default_rng(2202)
    for H, G in ((6, 2), (8, 4), (6, 3), (4, 1), (5, 5)):
        B, T, S, dh = 2, 3, 6, 4
        q = rng.standard_normal((B, T, H, dh))
        k = rng.standard_normal((B, S, G, dh))
        v = np.broadcast_to(np.arange(G, dtype=np.float64)[None, None, :, None], (B, S, G, dh)).copy()
        out = tl.attention_core(q, k, v, S - T).reshape(B, T, H, dh)   # 概率和为 1：输出 = 组号
        want = np.broadcast_to((np.arange(H) // (H // G)).astype(np.float64)[None, None, :, None], out.shape)
        close(out, want, atol=1e-12, rtol=0,
              message=f"H={H}、G={G}：查询头 h 应使用第 h // (H/G) 组 K/V（相邻的 H/G 个头共用一组）")


@exercise("2.2")
def test_decode_with_cache_equals_full_attention():
    rng = np.random.default_rng(2203)
    for H, G, dh, chunks in ((6, 2, 6, (3, 1, 1, 4, 2)), (4, 1, 10, (1, 1, 1, 1, 1, 1)), (6, 6, 4, (5, 2, 1, 3))):
        B, S = 2, sum(chunks)
        cfg = tl.Config(vocab=11, d_model=8, n_layers=1, n_heads=H, n_kv_heads=G, d_head=dh, d_ff=8, max_seq=S + 3)
        q = rng.standard_normal((B, S, H, dh))
        k, v = rng.standard_normal((2, B, S, G, dh))
        cache = tl.KVCache(cfg, B)
        outs, start = [], 0
        for T in chunks:                                 # 分块 prefill + 逐 token 解码：查询从 start 开始
            cache.write(0, k[:, start:start + T], v[:, start:start + T])
            k_all, v_all = cache.read(0, start + T)
            outs.append(tl.attention_core(q[:, start:start + T], k_all, v_all, start))
            cache.length = start + T
            start += T
        close(np.concatenate(outs, axis=1), _attention_by_heads(q, k, v, 0, True), atol=1e-12, rtol=1e-12,
              message=f"用 KV cache 按块 {chunks} 逐段计算的输出与整段因果注意力不一致：查询 i 的位置是 "
                      "q_pos0 + i，它应看到 0 … q_pos0 + i 的全部键（掩码右下对齐）")


@exercise("2.2")
def test_causal_mask_offset():
    rng = np.random.default_rng(2204)
    B, T, S, H, G, dh, q_pos0 = 2, 3, 10, 6, 3, 4, 4     # 查询在位置 4、5、6；位置 7…9 的键是"未来"
    q = rng.standard_normal((B, T, H, dh))
    k, v = rng.standard_normal((2, B, S, G, dh))
    base = tl.attention_core(q, k, v, q_pos0).reshape(B, T, H, dh)
    for i in range(T):
        p = q_pos0 + i
        k2, v2 = k.copy(), v.copy()
        k2[:, p + 1:], v2[:, p + 1:] = 10 * rng.standard_normal((2, B, S - p - 1, G, dh))
        moved = tl.attention_core(q, k2, v2, q_pos0).reshape(B, T, H, dh)
        expect(np.allclose(moved[:, i], base[:, i], atol=1e-12),
               f"查询 {i}（位置 q_pos0+{i} = {p}）的输出随位置 > {p} 的键变了：看到了未来的键")
        k3, v3 = k.copy(), v.copy()
        v3[:, p] += 5.0
        moved = tl.attention_core(q, k3, v3, q_pos0).reshape(B, T, H, dh)
        expect(not np.allclose(moved[:, i], base[:, i], atol=1e-9),
               f"查询 {i}（位置 {p}）看不到它自己位置的键 / 值：掩码多挡了一格")
    close(base.reshape(B, T, H * dh), _attention_by_heads(q, k, v, q_pos0, True), atol=1e-12, rtol=1e-12,
          message="q_pos0 < S − T（后面还有未来的键）时，查询 i 只能看到位置 ≤ q_pos0 + i 的键")


# =============================================================================
# 练习 2.3：矩阵乘的记账
# =============================================================================
MATMUL_SHAPES = (((5,), 5, 3), ((2, 9, 13), 13, 6), ((3, 1, 4, 11), 11, 17), ((1, 1), 1, 1), ((5, 21), 21, 2))


@exercise("2.3")
def test_matmul_flops_are_2mkn():
    rng = np.random.default_rng(2301)
    for lead_k, K, N in MATMUL_SHAPES:
        x, W = rng.standard_normal(lead_k), rng.standard_normal((K, N))
        c = tl.Counter()
        y = tl.linear(x, W, "mlp_up", counter=c)
        M = x.size // K                                  # x 前面所有维度合起来的行数
        letters = "abcdefgh"[:x.ndim - 1]
        rule = tl.einsum_flops(f"{letters}k,kn->{letters}n", x.shape, W.shape)
        expect(y.shape == x.shape[:-1] + (N,), f"linear 的输出形状应为 {x.shape[:-1] + (N,)}，得到 {y.shape}")
        expect(c.rows.get("mlp_up", {}).get("flops") == rule == 2 * M * K * N,
               f"x{list(x.shape)}·W[{K}, {N}] 的 FLOPs 应为 2·M·K·N = {2 * M * K * N}（M = {M} 行，每个乘加算 2 次），"
               f"记了 {c.rows.get('mlp_up', {}).get('flops')}")
        expect(c.rows["mlp_up"]["useful"] == 2 * M * K * N, "矩阵乘的每次运算都有用：useful 应等于 flops")
    expect_no_calls(tl._count_matmul, ["analytic_ops", "einsum_flops", "phase_costs", "matmul_params"])


@exercise("2.3")
def test_matmul_bytes_weights_once_activations_in_and_out():
    rng = np.random.default_rng(2302)
    for bpe in (2.0, 0.5, 4.0):
        for lead_k, K, N in MATMUL_SHAPES:
            x, W = rng.standard_normal(lead_k), rng.standard_normal((K, N))
            c = tl.Counter(bytes_per_elem=bpe)
            tl.linear(x, W, "o_proj", counter=c)
            M = x.size // K
            row = c.rows["o_proj"]
            expect(abs(row["w"] - K * N * bpe) < 1e-9,
                   f"权重每次矩阵乘只读一遍：w 应为 K·N·字节数 = {K * N * bpe}（与行数 M = {M} 无关），记了 {row['w']}")
            expect(abs(row["act"] - M * (K + N) * bpe) < 1e-9,
                   f"激活应记读 x 的 M·K 加写 y 的 M·N 个元素 = {M * (K + N) * bpe} 字节"
                   f"（x{list(x.shape)}、W[{K}, {N}]、{bpe} 字节/元素），记了 {row['act']}")
            expect(row["kv"] == 0 and row["calls"] == 1, "一次矩阵乘记一笔，不碰 KV cache 那一列")


@exercise("2.3")
def test_layer_ledger_matches_analytic_ops():
    rng = np.random.default_rng(2303)
    cfg = tl.Config(vocab=37, d_model=20, n_layers=3, n_heads=6, n_kv_heads=2, d_head=6, d_ff=29, max_seq=64)
    p = tl.init_params(cfg, seed=3)
    for B, T in ((2, 7), (3, 1)):
        c = tl.Counter(bytes_per_elem=2.0)
        x = rng.standard_normal((B, T, cfg.d_model))
        for lp in p["layers"]:                            # 每层 7 个矩阵乘，按 forward 里的名字和形状
            for op, key in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("mlp_gate", "w_gate"),
                            ("mlp_up", "w_up")):
                tl.linear(x, lp[key], op, counter=c)
            tl.linear(rng.standard_normal((B, T, cfg.n_heads * cfg.d_head)), lp["wo"], "o_proj", counter=c)
            tl.linear(rng.standard_normal((B, T, cfg.d_ff)), lp["w_down"], "mlp_down", counter=c)
        tl.linear(x[:, -1:], p["lm_head"], "lm_head", counter=c)          # 生成时只算最后一个位置
        want = tl.analytic_ops(cfg, B, T, pos0=4, last_only=True)
        for op in tl.MATMUL_OPS:
            for col in ("flops", "useful", "w", "act"):
                expect(abs(c.rows[op][col] - want[op][col]) <= 1e-9 * max(1.0, want[op][col]),
                       f"{op} 的 {col} 与 analytic_ops 的公式不一致（B={B}, T={T}, L={cfg.n_layers}）："
                       f"记了 {c.rows[op][col]}，公式 {want[op][col]}")
