"""第 18 讲的错误答案语料（只给老师）：学生常写出的、"看起来对"的合并与分块注意力。"""
import torch

from grading import Wrong, module

fl = module("lecture18", "flash_lab")
F18 = ("lecture18", "flash_lab")
NEG_INF = float("-inf")


# ---- 18.1 合并 ----
def merge_unguarded(a, b):
    """没有 −∞ 保护：两边都是空状态时 exp(−∞ − (−∞)) = NaN。"""
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    alpha, beta = torch.exp(ma - m), torch.exp(mb - m)
    return m, alpha * la + beta * lb, alpha.unsqueeze(-1) * oa + beta.unsqueeze(-1) * ob


def merge_no_rescale(a, b):
    """不换算到新基准：直接把两边的 l、o 相加。"""
    (ma, la, oa), (mb, lb, ob) = a, b
    return torch.maximum(ma, mb), la + lb, oa + ob


def merge_rescale_one_side(a, b):
    """只把旧的累加器 a 换算到新基准，新来的块 b 原样加上。"""
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    alpha = torch.exp(ma - torch.where(torch.isneginf(m), torch.zeros_like(m), m))
    return m, alpha * la + lb, alpha.unsqueeze(-1) * oa + ob


def merge_flipped_exponent(a, b):
    """换算因子的指数写反：exp(m_新 − m_旧) ≥ 1（−∞ 有保护，所以不出 NaN，只是数不对）。"""
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    alpha = torch.where(torch.isneginf(ma), torch.zeros_like(ma), torch.exp(base - torch.nan_to_num(ma, neginf=0.0)))
    beta = torch.where(torch.isneginf(mb), torch.zeros_like(mb), torch.exp(base - torch.nan_to_num(mb, neginf=0.0)))
    return m, alpha * la + beta * lb, alpha.unsqueeze(-1) * oa + beta.unsqueeze(-1) * ob


def merge_in_float32(a, b):
    """算法对，但中间转成 float32 再转回来：只剩 ~1e-7 的精度。"""
    (ma, la, oa), (mb, lb, ob) = (tuple(t.float() for t in s) for s in (a, b))
    m = torch.maximum(ma, mb)
    base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    alpha, beta = torch.exp(ma - base), torch.exp(mb - base)
    out = (m, alpha * la + beta * lb, alpha.unsqueeze(-1) * oa + beta.unsqueeze(-1) * ob)
    return tuple(t.to(a[0].dtype) for t in out)


# ---- 18.2 分块注意力 ----
def _fwd_variant(off_shift=0, first_row_skip=False):
    def fwd(q, k, v, block_q, block_k, causal, scale):
        N, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
        off = Nk - N + off_shift
        O = q.new_empty((*q.shape[:-1], dv))
        lse = q.new_empty(q.shape[:-1])
        for i0, i1 in fl._tiles(N, block_q):
            qi = q[..., i0:i1, :]
            state = fl._empty_state(qi.shape[:-1], dv, q)
            for j0, j1 in fl._tiles(Nk, block_k):
                last = i0 + 1 if first_row_skip else i1
                if causal and off + last - 1 < j0:
                    break
                S = (qi @ k[..., j0:j1, :].transpose(-2, -1)) * scale
                if causal:
                    S = S.masked_fill(~fl._block_mask(i0, i1, j0, j1, off, S.device), NEG_INF)
                state = fl._merge(state, fl._block_state(S, v[..., j0:j1, :]))
            O[..., i0:i1, :], lse[..., i0:i1] = fl._finalize(state)
        return O, lse
    return fwd


def _bwd_variant(local_softmax=False, ignore_dlse=False):
    def bwd(q, k, v, O, lse, dO, block_q, block_k, causal, scale, dlse=None):
        N, Nk = q.shape[-2], k.shape[-2]
        off = Nk - N
        D = (dO * O).sum(dim=-1)
        if dlse is not None and not ignore_dlse:
            D = D - dlse
        lse_sub = lse.masked_fill(torch.isneginf(lse), float("inf"))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for j0, j1 in fl._tiles(Nk, block_k):
            kj, vj = k[..., j0:j1, :], v[..., j0:j1, :]
            for i0, i1 in fl._tiles(N, block_q):
                qi, dOi = q[..., i0:i1, :], dO[..., i0:i1, :]
                S = (qi @ kj.transpose(-2, -1)) * scale
                if causal:
                    S = S.masked_fill(~fl._block_mask(i0, i1, j0, j1, off, S.device), NEG_INF)
                if local_softmax:     # 在块内重新做 softmax：每块各自归一化，而不是用整行的 lse
                    P = torch.nan_to_num(torch.softmax(S, dim=-1))
                else:
                    P = torch.exp(S - lse_sub[..., i0:i1, None])
                dv[..., j0:j1, :] += P.transpose(-2, -1) @ dOi
                dS = P * (dOi @ vj.transpose(-2, -1) - D[..., i0:i1, None])
                dq[..., i0:i1, :] += (dS @ kj) * scale
                dk[..., j0:j1, :] += (dS.transpose(-2, -1) @ qi) * scale
        return dq, dk, dv
    return bwd


class SavesProbabilities(torch.autograd.Function):
    """梯度全对，但前向把 N×Nk 的概率矩阵 P 存下给反向用：激活显存回到 ∝ N²。"""

    @staticmethod
    def forward(ctx, q, k, v, block_q, block_k, causal, scale):
        O, lse = fl._fwd(q, k, v, block_q, block_k, causal, scale)
        S = (q @ k.transpose(-2, -1)) * scale
        if causal:
            N, Nk = q.shape[-2], k.shape[-2]
            S = S.masked_fill(~fl._block_mask(0, N, 0, Nk, Nk - N, S.device), NEG_INF)
        P = torch.exp(S - lse.masked_fill(torch.isneginf(lse), float("inf"))[..., None])
        ctx.save_for_backward(q, k, v, O, P)
        ctx.cfg = (block_q, block_k, causal, scale)
        return O, lse

    @staticmethod
    def backward(ctx, dO, dlse):
        q, k, v, O, P = ctx.saved_tensors
        scale = ctx.cfg[3]
        D = (dO * O).sum(-1) - dlse
        dS = P * (dO @ v.transpose(-2, -1) - D[..., None])
        return (dS @ k) * scale, (dS.transpose(-2, -1) @ q) * scale, P.transpose(-2, -1) @ dO, None, None, None, None


VARIANTS = [
    Wrong("18.1", *F18, "_merge", "没有 −∞ 保护：两个空状态合并得 NaN", merge_unguarded),
    Wrong("18.1", *F18, "_merge", "不按新的最大值换算：l、o 直接相加", merge_no_rescale, says="直接相加"),
    Wrong("18.1", *F18, "_merge", "只换算了累加器，新块没换算", merge_rescale_one_side, says="只换算了一边"),
    Wrong("18.1", *F18, "_merge", "换算因子的指数写反", merge_flipped_exponent, says="指数写反了"),
    Wrong("18.1", *F18, "_merge", "中间转成 float32 再转回来", merge_in_float32, says="float32"),
    Wrong("18.2", *F18, "BlockwiseAttention", "为反向存下了 N×Nk 的概率矩阵 P", SavesProbabilities),
    Wrong("18.2", *F18, "_bwd", "重算时在块内重新 softmax（没用整行的 lse）", _bwd_variant(local_softmax=True)),
    Wrong("18.2", *F18, "_bwd", "反向忽略了 lse 的上游梯度 dlse", _bwd_variant(ignore_dlse=True)),
    Wrong("18.2", *F18, "_fwd", "因果掩码错一位：query i 多看了一个 key", _fwd_variant(off_shift=1)),
    Wrong("18.2", *F18, "_fwd", "跳过整块时用了块里第一个 query：漏算了可见的块", _fwd_variant(first_row_skip=True)),
]
