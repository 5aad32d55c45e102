"""
CS349E 第 18 讲实验模块 flash_lab（PyTorch 版）：(m, ℓ, o) 状态代数、分块注意力与重算反向、分块并行 Transformer

【这一讲回答的问题】
    第 11 讲用 numpy 把 FlashAttention 的前向、反向算了一遍。要拿它去**训练**、去**很多块设备**，还差三步：
      1. 把"一块分数 → 局部状态 (m, ℓ, o) → 合并 → 归一化"写成三个能在任意形状的 torch 张量上用的函数，
         而且对整行被掩码的块（ring attention 的条带布局里常见）给出 (−∞, 0, 0)，永远不出 NaN；
      2. 用它们拼出分块注意力，包进 torch.autograd.Function：反向只用 O 和每行一个 LSE 重算 P，
         不存任何 N×Nk 的东西；
      3. 前馈层也按块算（Blockwise Parallel Transformer，BPT），量一量激活显存到底省了多少。

【本文件提供】（草稿：其余部分随后补上）
    §1 状态代数：block_state(S, V)、merge_states(a, b)、finalize(state)

【约定】
    - 分数 S [..., nq, nk]，被掩码的位置是 −∞；V [..., nk, dv]；前面的维度（批、头）可以有任意多个。
    - 局部状态 (m, l, o)：m [..., nq] 行最大值，l [..., nq] = Σ exp(S − m)，o [..., nq, dv] = exp(S − m) @ V。
    - 整行被掩码：m = −∞、l = 0、o = 0；finalize 给 O = 0、lse = −∞。

【运行】python3 lecture18/flash_lab.py      # 自检
【依赖】torch；../lecture01/course_utils.py（参数检查）。
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import check_int  # noqa: E402,F401

NEG_INF = float("-inf")


# =============================================================================
# 1. 状态代数：一块分数 → (m, l, o)；两块合并；归一化
# =============================================================================
def _safe(m):
    """把 −∞ 换成 0 再当减数：exp(−∞ − 0) = 0，而 exp(−∞ − (−∞)) 是 NaN。"""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def block_state(S, V):
    """
    一块分数的局部状态：m = 行最大值，l = Σ_j exp(S_j − m)，o = Σ_j exp(S_j − m)·V_j。

    状态只记"以 m 为基准"的未归一化和：以后见到更大的分数时，乘一个换算因子 exp(m − m') 就能对齐，
    不必回头重算（merge_states）。
    【参数】S [..., nq, nk]（被掩码处为 −∞）；V [..., nk, dv]（前面的维度与 S 可广播）
    【返回】(m [..., nq], l [..., nq], o [..., nq, dv])；整行 −∞ 的行给 (−∞, 0, 0)。
    """
    _check_block(S, V)
    if S.shape[-1] == 0:                                      # 空块："什么也没看到"
        m = S.new_full(S.shape[:-1], NEG_INF)
    else:
        m = S.amax(dim=-1)                                    # [..., nq]
    p = torch.exp(S - _safe(m).unsqueeze(-1))                 # [..., nq, nk]；整行 −∞ → 全 0
    return m, p.sum(dim=-1), p @ V


def merge_states(a, b):
    """
    合并两个局部状态，结果等于"两块拼在一起"的局部状态：

        m = max(m_a, m_b)，α = exp(m_a − m)，β = exp(m_b − m)，l = α·l_a + β·l_b，o = α·o_a + β·o_b

    交换律逐位精确成立（max 和两项相加都可交换）；结合律在舍入误差内成立——所以可以按任意顺序、
    任意树形合并。(−∞, 0, 0) 是单位元：被完全掩码的块合并进来等于没有它。
    【参数】a、b：(m, l, o) 三元组，形状一致（或可广播）
    【返回】(m, l, o)
    """
    _check_states(a, b)
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    alpha = torch.exp(ma - _safe(m))                          # m_a = −∞ 时为 0
    beta = torch.exp(mb - _safe(m))
    return m, alpha * la + beta * lb, alpha.unsqueeze(-1) * oa + beta.unsqueeze(-1) * ob


def finalize(state):
    """
    把局部状态归一化成注意力输出：O = o / l，lse = m + log l（每行一个数，反向传播只需要它）。
    【返回】(O [..., nq, dv], lse [..., nq])；l = 0 的行（什么也没看到）给 O = 0、lse = −∞。
    """
    _check_states(state)
    m, l, o = state
    seen = l > 0
    O = o / torch.where(seen, l, torch.ones_like(l)).unsqueeze(-1)    # 分母换成 1 只是为了不除 0：这些行 o 本来就是 0
    lse = torch.where(seen, _safe(m) + torch.log(torch.where(seen, l, torch.ones_like(l))),
                      torch.full_like(m, NEG_INF))
    return O, lse


# =============================================================================
# 输入检查（坏输入报出参数名和允许的取值）
# =============================================================================
def _check_tensor(name, x, where):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{where}：{name} 必须是浮点张量，收到 dtype={x.dtype}")


def _check_block(S, V):
    _check_tensor("S", S, "block_state")
    _check_tensor("V", V, "block_state")
    if S.dim() < 2 or V.dim() < 2:
        raise ValueError(f"block_state：S 必须是 [..., nq, nk]、V 必须是 [..., nk, dv]，"
                         f"收到 {tuple(S.shape)} 和 {tuple(V.shape)}")
    if S.shape[-1] != V.shape[-2]:
        raise ValueError(f"block_state：S [..., nq, nk] 的 nk 必须等于 V [..., nk, dv] 的 nk，"
                         f"收到 S {tuple(S.shape)}、V {tuple(V.shape)}")
    if torch.isnan(S).any() or torch.isposinf(S).any():
        raise ValueError("block_state：S 只能含有限值或 −∞（被掩码的位置），发现了 NaN 或 +∞")


def _check_states(*states):
    for s in states:
        if not isinstance(s, (tuple, list)) or len(s) != 3 or not all(isinstance(t, torch.Tensor) for t in s):
            raise TypeError("状态必须是 (m, l, o) 三个 torch.Tensor 组成的三元组（block_state 的返回值）")
        m, l, o = s
        if m.shape != l.shape or o.shape[:-1] != m.shape:
            raise ValueError(f"状态 (m, l, o) 的形状必须是 ([...], [...], [..., dv])，收到 "
                             f"{tuple(m.shape)}、{tuple(l.shape)}、{tuple(o.shape)}")


# =============================================================================
# 自检
# =============================================================================
def _check_state_algebra(gen):
    """切成几块、按不同顺序合并，等于一次算完；整行掩码不出 NaN。"""
    S = torch.randn(2, 3, 7, 19, generator=gen, dtype=torch.float64)
    V = torch.randn(2, 3, 19, 5, generator=gen, dtype=torch.float64)
    S[..., 2, :] = NEG_INF                                    # 一整行被掩码
    ref = torch.softmax(S, dim=-1).nan_to_num(0.0) @ V
    cuts = [0, 4, 11, 12, 19]
    parts = [block_state(S[..., a:b], V[..., a:b, :]) for a, b in zip(cuts, cuts[1:])]
    left = parts[0]
    for p in parts[1:]:
        left = merge_states(left, p)
    right = parts[-1]
    for p in reversed(parts[:-1]):
        right = merge_states(p, right)
    for st in (left, right):
        O, lse = finalize(st)
        assert not torch.isnan(O).any() and not torch.isnan(lse).any()
        assert torch.allclose(O, ref, atol=1e-12)
        assert torch.isneginf(lse[..., 2]).all() and (O[..., 2, :] == 0).all()
        assert torch.allclose(lse[..., [0, 1, 3, 4, 5, 6]],
                              torch.logsumexp(S[..., [0, 1, 3, 4, 5, 6], :], dim=-1), atol=1e-12)
    a, b = parts[0], parts[1]
    assert all(torch.equal(x, y) for x, y in zip(merge_states(a, b), merge_states(b, a)))


def _selftest():
    gen = torch.Generator().manual_seed(0)
    _check_state_algebra(gen)
    print("lecture18 flash_lab 自检通过：状态代数")


if __name__ == "__main__":
    _selftest()
