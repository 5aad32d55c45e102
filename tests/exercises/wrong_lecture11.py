"""第 11 讲（numpy 部分）的错误答案语料（只给老师）：学生常写的错法，每一个都必须让对应练习至少一个检查失败。

每个变体是被替换函数的完整实现，参数与原函数相同；输入检查省掉了（检查只传合法的输入）。
"""
import numpy as np
from grading import Wrong, module

fl = module("lecture11", "flash_lab")
_safe = fl._safe


# ---------------------------------------------------------------------------------------------- 11.1
def _online_no_rescale(x, block=128):
    x = np.asarray(x, dtype=np.float64)
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s:s + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        l = l + np.exp(xb - _safe(m_new)[..., None]).sum(axis=-1)       # 旧的 l 没乘 exp(m − m')
        m = m_new
    e = np.exp(x - _safe(m)[..., None])
    return np.divide(e, l[..., None], out=np.zeros_like(e), where=l[..., None] > 0), 2


def _three_pass(x, block=128):
    m = _safe(np.max(x, axis=-1, keepdims=True))                   # 整行求 max、整行 exp、求和：结果对，但不是在线的
    e = np.exp(x - m)
    l = e.sum(axis=-1, keepdims=True)
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0), 2


def _online_stale_max(x, block=128):
    x = np.asarray(x, dtype=np.float64)
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s:s + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        l = l * np.exp(m - _safe(m_new)) + np.exp(xb - _safe(m)[..., None]).sum(axis=-1)   # exp 用了旧的 m
        m = m_new
    e = np.exp(x - _safe(m)[..., None])
    return np.divide(e, l[..., None], out=np.zeros_like(e), where=l[..., None] > 0), 2


def _online_no_max(x, block=128):
    x = np.asarray(x, dtype=np.float64)
    l = np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        l = l + np.exp(x[..., s:s + block]).sum(axis=-1)                  # 不减最大值：大分数溢出
    e = np.exp(x)
    return np.divide(e, l[..., None], out=np.zeros_like(e), where=l[..., None] > 0), 2


# ---------------------------------------------------------------------------------------------- 11.2
def _states(a, b):
    (ma, la, oa), (mb, lb, ob) = a, b
    def f(t):
        return None if t is None else np.asarray(t, dtype=np.float64)
    return f(ma), f(la), f(oa), f(mb), f(lb), f(ob)


def _merge_no_rescale(a, b):
    ma, la, oa, mb, lb, ob = _states(a, b)
    return np.maximum(ma, mb), la + lb, None if oa is None else oa + ob


def _merge_unweighted_o(a, b):
    ma, la, oa, mb, lb, ob = _states(a, b)
    m = np.maximum(ma, mb)
    alpha, beta = np.exp(ma - _safe(m)), np.exp(mb - _safe(m))
    return m, alpha * la + beta * lb, None if oa is None else oa + ob   # o 没有乘权重


def _merge_to_b_max(a, b):
    ma, la, oa, mb, lb, ob = _states(a, b)
    alpha = np.exp(ma - _safe(mb))                                       # 以为 b 的最大值总是更大
    return mb, alpha * la + lb, None if oa is None else alpha[..., None] * oa + ob


# ---------------------------------------------------------------------------------------------- 11.3
def _fwd_fa2_variant(mask_strict=False, live_off_by_one=False, norm_in_loop=False, q_per_block=False,
                     stale_acc=False):
    def fwd(Q, K, V, Br, Bc, causal, scale):
        N, d = Q.shape
        Nk, dv = V.shape
        off = Nk - N
        io = fl.IO()
        O, L = np.zeros((N, dv)), np.zeros(N)
        for i0, i1 in fl._tiles(N, Br):
            br = i1 - i0
            Qi = Q[i0:i1]
            if not q_per_block:
                io.add("Q", read=br * d)
            m, l, acc = np.full(br, -np.inf), np.zeros(br), np.zeros((br, dv))
            keys = 0
            for j0, j1 in fl._tiles(Nk, Bc):
                if causal and (off + i1 - 1 <= j0 if live_off_by_one else off + i1 - 1 < j0):
                    break
                if q_per_block:
                    io.add("Q", read=br * d)                           # 每个 K 块都把 Q 块再读一遍
                if mask_strict:
                    S = (Qi @ K[j0:j1].T) * scale
                    if causal:                                         # 自己写的掩码：k < q，把对角线也遮掉了
                        S = np.where(np.arange(j0, j1)[None, :] < off + np.arange(i0, i1)[:, None], S, -np.inf)
                else:
                    S = fl._masked_scores(Qi, K[j0:j1], scale, causal, i0, j0, off)
                m_new = np.maximum(m, S.max(axis=1))
                a = np.exp(m - _safe(m_new))
                P = np.exp(S - _safe(m_new)[:, None])
                l = a * l + P.sum(axis=1)
                acc = a[:, None] * acc + P @ V[j0:j1]
                m = m_new
                keys += j1 - j0
                if stale_acc:                                          # 每步把 acc 除以 l，l 却照旧累加
                    acc = np.divide(acc, l[:, None], out=np.zeros_like(acc), where=l[:, None] > 0)
                if norm_in_loop:                                       # 每个 K 块之后都归一化、写回 O、L
                    O[i0:i1], L[i0:i1] = fl._normalize(acc, m, l)
                    io.add("O", write=br * dv)
                    io.add("L", write=br)
            if keys:
                io.add("K,V", read=keys * (d + dv))
                io.add("QKᵀ,PV", flops=2 * br * keys * (d + dv))
            if stale_acc:
                O[i0:i1], L[i0:i1] = acc, fl._lse(m, l)
            elif not norm_in_loop:
                O[i0:i1], L[i0:i1] = fl._normalize(acc, m, l)
            if not norm_in_loop:
                io.add("O", write=br * dv)
                io.add("L", write=br)
        return O, L, io
    return fwd


# ---------------------------------------------------------------------------------------------- 11.4
def _bwd_variant(d_from_dp=False, no_scale=False, stale_max=False):
    def bwd(Q, K, V, O, dO, L, Br, Bc, causal=False, scale=None):
        Q, K, V, O, dO, L = (np.asarray(t, dtype=np.float64) for t in (Q, K, V, O, dO, L))
        N, d = Q.shape
        Nk, dv = V.shape
        scale = 1.0 / np.sqrt(d) if scale is None else scale
        off = Nk - N
        io = fl.IO()
        D = (dO @ V.T).sum(axis=1) if d_from_dp else (dO * O).sum(axis=1)   # 错法：D = rowsum(dO Vᵀ)
        io.add("D=rowsum(dO∘O)", read=2 * N * dv, write=N)
        L_sub = np.where(np.isneginf(L), np.inf, L)
        if stale_max:                                          # 用第一个 K 块的 (m, l) 当整行的归一化
            first = np.full(N, np.inf)
            for i0, i1 in fl._tiles(N, Br):
                S0 = fl._masked_scores(Q[i0:i1], K[:Bc], scale, causal, i0, 0, off)
                m0 = S0.max(axis=1)
                with np.errstate(divide="ignore"):
                    first[i0:i1] = np.where(np.isneginf(m0), np.inf,
                                            _safe(m0) + np.log(np.exp(S0 - _safe(m0)[:, None]).sum(axis=1)))
            L_sub = first
        c = 1.0 if no_scale else scale
        dQ, dK, dV = np.zeros((N, d)), np.zeros((Nk, d)), np.zeros((Nk, dv))
        io.add("dQ", write=N * d)
        for j0, j1 in fl._tiles(Nk, Bc):
            bc = j1 - j0
            Kj, Vj = K[j0:j1], V[j0:j1]
            io.add("K,V", read=bc * (d + dv))
            for i0, i1 in fl._tiles(N, Br):
                if not fl._live(causal, off, i1, j0):
                    continue
                br = i1 - i0
                io.add("Q,dO,L,D", read=br * (d + dv + 2))
                S = fl._masked_scores(Q[i0:i1], Kj, scale, causal, i0, j0, off)
                P = np.exp(S - L_sub[i0:i1, None])
                dV[j0:j1] += P.T @ dO[i0:i1]
                dS = P * (dO[i0:i1] @ Vj.T - D[i0:i1, None])
                dQ[i0:i1] += (dS @ Kj) * c                             # 错法：漏了 scale
                dK[j0:j1] += (dS.T @ Q[i0:i1]) * c
                io.add("dQ", read=br * d, write=br * d)
                io.add("5 matmuls", flops=2 * br * bc * (3 * d + 2 * dv))
            io.add("dK,dV", write=bc * (d + dv))
        return dQ, dK, dV, io
    return bwd


# ---------------------------------------------------------------------------------------------- 11.5
def _segment(q, K, V, a, b, scale):
    s = (q @ K[a:b].T) * scale
    m = s.max(axis=1)
    p = np.exp(s - m[:, None])
    l = p.sum(axis=1)
    return p, m, l, (p @ V[a:b]) / l[:, None]


def _split_variant(no_rescale=False, drop_tail=False, naive_exp=False):
    def split(q, K, V, n_splits, scale=None):
        q, K, V = (np.asarray(t, dtype=np.float64) for t in (q, K, V))
        S = K.shape[0]
        scale = 1.0 / np.sqrt(q.shape[1]) if scale is None else scale
        n = min(n_splits, S)
        if drop_tail:                                          # 每段 S // n 个 key：余下的 S % n 个被丢掉
            step = S // n
            bounds = [(k * step, (k + 1) * step) for k in range(n)]
        else:
            e = fl._even_bounds(S, n)
            bounds = [(int(a), int(b)) for a, b in zip(e[:-1], e[1:]) if b > a]
        parts, ls = [], []
        for a, b in bounds:
            _, m, l, o_s = _segment(q, K, V, a, b, scale)
            parts.append((o_s, m + np.log(l)))
            ls.append(l)
        lse_s = np.stack([x for _, x in parts])
        o_s = np.stack([x for x, _ in parts])
        if no_rescale:                                         # 按各段自己的 l 加权：各段的基准 m 不同
            w = np.stack(ls) / np.stack(ls).sum(axis=0)
            lse = np.log(np.exp(lse_s).sum(axis=0))
        elif naive_exp:                                        # 直接 exp(lse_s)：分数大时溢出
            w = np.exp(lse_s) / np.exp(lse_s).sum(axis=0)
            lse = np.log(np.exp(lse_s).sum(axis=0))
        else:
            top = lse_s.max(axis=0)
            lse = top + np.log(np.exp(lse_s - top).sum(axis=0))
            w = np.exp(lse_s - lse)
        return np.einsum("sr,srv->rv", w, o_s), lse, parts
    return split


L11 = ("lecture11", "flash_lab")
VARIANTS = [
    Wrong("11.1", *L11, "softmax_online", "旧的 l 没有乘换算因子 exp(m − m')", _online_no_rescale),
    Wrong("11.1", *L11, "softmax_online", "exp 用的是更新前的最大值", _online_stale_max),
    Wrong("11.1", *L11, "softmax_online", "三遍 softmax（不分块，结果一样）", _three_pass),
    Wrong("11.1", *L11, "softmax_online", "不减最大值直接 exp（大分数溢出）", _online_no_max),
    Wrong("11.2", *L11, "merge_states", "l、o 直接相加，没有换算到新的最大值", _merge_no_rescale),
    Wrong("11.2", *L11, "merge_states", "l 换算了，o 却不加权直接相加", _merge_unweighted_o),
    Wrong("11.2", *L11, "merge_states", "总以 b 的最大值为基准", _merge_to_b_max),
    Wrong("11.3", *L11, "_fwd_fa2", "对角块的掩码写成 k < q，遮掉了对角线", _fwd_fa2_variant(mask_strict=True)),
    Wrong("11.3", *L11, "_fwd_fa2", "跳块条件差一：最后一行刚好看得见的块被跳过",
          _fwd_fa2_variant(live_off_by_one=True)),
    Wrong("11.3", *L11, "_fwd_fa2", "最终归一化放进了内层循环（O、L 每块写一遍）", _fwd_fa2_variant(norm_in_loop=True)),
    Wrong("11.3", *L11, "_fwd_fa2", "每个 K、V 块都重读一遍 Q 块", _fwd_fa2_variant(q_per_block=True)),
    Wrong("11.3", *L11, "_fwd_fa2", "循环里把 acc 除以 l、l 却照旧累加", _fwd_fa2_variant(stale_acc=True)),
    Wrong("11.4", *L11, "flash_bwd", "D 取 rowsum(dO·Vᵀ)，漏了乘 P", _bwd_variant(d_from_dp=True)),
    Wrong("11.4", *L11, "flash_bwd", "dQ、dK 忘了乘 scale", _bwd_variant(no_scale=True)),
    Wrong("11.4", *L11, "flash_bwd", "用第一个 K 块的最大值和分母（过期的 m、l）重算 P", _bwd_variant(stale_max=True)),
    Wrong("11.5", *L11, "split_kv_decode", "按各段自己的 l 加权合并，没有换算到同一个最大值",
          _split_variant(no_rescale=True)),
    Wrong("11.5", *L11, "split_kv_decode", "每段 S // n 个 key，不整除时丢了最后的 key", _split_variant(drop_tail=True)),
    Wrong("11.5", *L11, "split_kv_decode", "合并时直接 exp(lse_s)（大分数溢出）", _split_variant(naive_exp=True)),
]
