"""第 2 讲练习的错误答案语料（只给老师）：每一个都是学生真会写出来的实现，必须被 test_ex_lecture02 的检查拒绝。"""
import math

import numpy as np

from grading import Wrong, module

tl = module("lecture02", "transformer_lab")
L02 = ("lecture02", "transformer_lab")


# ---- 2.1 RoPE ---------------------------------------------------------------
def rope_angles_exponent_i_over_d(positions, d_head, theta=10000.0):
    """频率写成 θ^(−i/d)：少了指数里的 2，后面的对转得太快。"""
    pos = np.asarray(positions, dtype=np.float64)
    freqs = theta ** (-np.arange(d_head // 2) / d_head)
    return np.cos(np.outer(pos, freqs)), np.sin(np.outer(pos, freqs))


def rope_angles_exponent_over_half(positions, d_head, theta=10000.0):
    """频率写成 θ^(−2i/(d/2))：把 d/2 当成了分母。"""
    pos = np.asarray(positions, dtype=np.float64)
    freqs = theta ** (-2.0 * np.arange(d_head // 2) / (d_head // 2))
    return np.cos(np.outer(pos, freqs)), np.sin(np.outer(pos, freqs))


def apply_rope_half_pairs(x, cos, sin, counter=None):
    """按 Hugging Face 的"前半与后半配对"转：与本讲约定的"相邻两个数一对"不符。"""
    x = np.asarray(x, dtype=np.float64)
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def apply_rope_sin_sign(x, cos, sin, counter=None):
    """sin 的符号反了：往反方向转（长度不变、相对位置性质也还在，只有和参考比较才看得出）。"""
    x = np.asarray(x, dtype=np.float64)
    c, s = cos[:, None, :], sin[:, None, :]
    even, odd = x[..., ::2], x[..., 1::2]
    out = np.empty(x.shape)
    out[..., ::2] = even * c + odd * s
    out[..., 1::2] = -even * s + odd * c
    return out


def rope_angles_sin_cos_swapped(positions, d_head, theta=10000.0):
    """返回 (sin, cos)：顺序反了，apply_rope 把 sin 当 cos 用。"""
    pos = np.asarray(positions, dtype=np.float64)
    angles = np.outer(pos, theta ** (-2.0 * np.arange(d_head // 2) / d_head))
    return np.sin(angles), np.cos(angles)


# ---- 2.2 注意力 -------------------------------------------------------------
def _attend(q, k, v, visible, group_of_head):
    """错误变体共用的小骨架：给定 [T, S] 可见矩阵和"头 → 组"的映射，算 softmax(q·kᵀ/√dh)·v。"""
    B, T, H, dh = q.shape
    out = np.empty((B, T, H, dh))
    for h in range(H):
        g = group_of_head(h)
        s = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(dh)
        s = np.where(visible[None], s, -np.inf)
        with np.errstate(invalid="ignore"):                 # 整行被掩掉：−∞ − (−∞)
            w = np.nan_to_num(np.exp(s - s.max(-1, keepdims=True)))
        out[:, :, h] = np.einsum("bts,bsd->btd", w / np.maximum(w.sum(-1, keepdims=True), 1e-300), v[:, :, g])
    return out.reshape(B, T, H * dh)


def _rows_cols(q, k, q_pos0):
    return (q_pos0 + np.arange(q.shape[1]))[:, None], np.arange(k.shape[1])[None, :]


def attention_head_mod_groups(q, k, v, q_pos0, counter=None, causal=True):
    """头 h 用第 h % G 组（q 变形成 [B, T, R, G, dh]）：相邻的头分到了不同的组。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    rows, cols = _rows_cols(q, k, q_pos0)
    vis = cols <= rows if causal else np.ones((q.shape[1], k.shape[1]), bool)
    return _attend(q, k, v, vis, lambda h: h % k.shape[2])


def attention_mask_one_future_key(q, k, v, q_pos0, counter=None, causal=True):
    """掩码差一格：查询 i 还看到了位置 q_pos0 + i + 1 的键。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    rows, cols = _rows_cols(q, k, q_pos0)
    vis = cols <= rows + 1 if causal else np.ones((q.shape[1], k.shape[1]), bool)
    R = q.shape[2] // k.shape[2]
    return _attend(q, k, v, vis, lambda h: h // R)


def attention_mask_hides_self(q, k, v, q_pos0, counter=None, causal=True):
    """掩码差一格的另一边：用了 < 而不是 ≤，查询看不到自己位置的键。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    rows, cols = _rows_cols(q, k, q_pos0)
    vis = cols < rows if causal else np.ones((q.shape[1], k.shape[1]), bool)
    R = q.shape[2] // k.shape[2]
    return _attend(q, k, v, vis, lambda h: h // R)


def attention_mask_ignores_q_pos0(q, k, v, q_pos0, counter=None, causal=True):
    """掩码左上对齐（查询 i 看键 0 … i，同 PyTorch SDPA 的 is_causal）：忘了查询前面还有 q_pos0 个缓存的位置。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    rows, cols = _rows_cols(q, k, 0)
    vis = cols <= rows if causal else np.ones((q.shape[1], k.shape[1]), bool)
    R = q.shape[2] // k.shape[2]
    return _attend(q, k, v, vis, lambda h: h // R)


def attention_no_mask_with_history(q, k, v, q_pos0, counter=None, causal=True):
    """"有缓存就是解码，解码不用掩码"：q_pos0 > 0 时整块查询都看全部键（分块 prefill 时看到了未来）。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    rows, cols = _rows_cols(q, k, q_pos0)
    vis = cols <= rows if causal and q_pos0 == 0 else np.ones((q.shape[1], k.shape[1]), bool)
    R = q.shape[2] // k.shape[2]
    return _attend(q, k, v, vis, lambda h: h // R)


def attention_reads_cache_too_short(q, k, v, q_pos0, counter=None, causal=True):
    """只用前 q_pos0 + 1 个键（缓存读到 length + 1 而不是 length + T）：一块里后面的查询看不到同一块的键。"""
    q, k, v, causal = tl._check_attention_shapes(q, k, v, q_pos0, causal, counter)
    k, v = k[:, :q_pos0 + 1], v[:, :q_pos0 + 1]
    rows, cols = _rows_cols(q, k, q_pos0)
    vis = cols <= rows if causal else np.ones((q.shape[1], k.shape[1]), bool)
    R = q.shape[2] // k.shape[2]
    return _attend(q, k, v, vis, lambda h: h // R)


# ---- 2.3 矩阵乘记账 -----------------------------------------------------------
def count_matmul_mkn(counter, op, x, W):
    """FLOPs 记成 M·K·N：把一次乘加算成一次运算。"""
    K, N = W.shape
    M = x.size // K
    counter.add(op, flops=M * K * N, w_elems=K * N, act_elems=M * (K + N))


def count_matmul_weights_per_token(counter, op, x, W):
    """每个 token 都记一遍读权重：w = M·K·N（实际一次矩阵乘只把 W 读一遍）。"""
    K, N = W.shape
    M = x.size // K
    counter.add(op, flops=2 * M * K * N, w_elems=M * K * N, act_elems=M * (K + N))


def count_matmul_rows_from_first_dim(counter, op, x, W):
    """行数取 x.shape[0]：x 是 [B, T, K] 时只数了 B 行，漏了 T。"""
    K, N = W.shape
    M = x.shape[0] if x.ndim > 1 else 1
    counter.add(op, flops=2 * M * K * N, w_elems=K * N, act_elems=M * (K + N))


def count_matmul_input_only(counter, op, x, W):
    """激活只记读入的 x（M·K），漏了写出的 y（M·N）。"""
    K, N = W.shape
    M = x.size // K
    counter.add(op, flops=2 * M * K * N, w_elems=K * N, act_elems=M * K)


VARIANTS = [
    Wrong("2.1", *L02, "rope_angles", "频率指数写成 i/d（少了 2）", rope_angles_exponent_i_over_d),
    Wrong("2.1", *L02, "rope_angles", "频率指数的分母写成 d/2", rope_angles_exponent_over_half),
    Wrong("2.1", *L02, "apply_rope", "前半与后半配对（与本讲的相邻配对不符）", apply_rope_half_pairs),
    Wrong("2.1", *L02, "apply_rope", "sin 的符号反了（反方向转）", apply_rope_sin_sign),
    Wrong("2.1", *L02, "rope_angles", "返回 (sin, cos)，顺序反了", rope_angles_sin_cos_swapped),
    Wrong("2.2", *L02, "attention_core", "头 h 用第 h % G 组 K/V", attention_head_mod_groups),
    Wrong("2.2", *L02, "attention_core", "因果掩码多看一个未来的键", attention_mask_one_future_key),
    Wrong("2.2", *L02, "attention_core", "因果掩码用 <，看不到自己", attention_mask_hides_self),
    Wrong("2.2", *L02, "attention_core", "掩码左上对齐，忽略 q_pos0", attention_mask_ignores_q_pos0),
    Wrong("2.2", *L02, "attention_core", "q_pos0 > 0 时不加掩码", attention_no_mask_with_history),
    Wrong("2.2", *L02, "attention_core", "缓存只读到 q_pos0 + 1 个键", attention_reads_cache_too_short),
    Wrong("2.3", *L02, "_count_matmul", "FLOPs 记成 M·K·N", count_matmul_mkn),
    Wrong("2.3", *L02, "_count_matmul", "每个 token 都记一遍读权重", count_matmul_weights_per_token),
    Wrong("2.3", *L02, "_count_matmul", "行数只取 x.shape[0]", count_matmul_rows_from_first_dim),
    Wrong("2.3", *L02, "_count_matmul", "激活漏了写出的 y", count_matmul_input_only),
]
