"""
第 18 讲 · 演示 1：(m, ℓ, o) 状态代数——任意顺序、任意合并树、整行掩码、每行一个 LSE

你会看到：
    1. 把 [批, 头, 行, 列] 的分数切成很多块，每块一个局部状态 (m, ℓ, o)；按从左到右、从右到左、随机合并树
       合并，结果都等于整块一次算（float64 差 ~1e-15，float32 ~1e-6 以内）；交换律逐位成立，结合律在舍入误差内。
    2. 整行被掩码（全是 −∞）的块：不加保护的写法 exp(S − max S) 得到 NaN，并且一合并就污染整行；
       block_state 给出 (−∞, 0, 0)——合并的单位元，合进来等于没有它。ring attention 的条带布局里这种块很常见。
    3. LSE = m + log ℓ：每行一个数。反向传播只要它就能重算出整行概率 P = exp(S − lse)，
       不必存 N×Nk 的 P——这是演示 3 的重算反向的全部秘密。

运行：python3 lecture18/01_state_algebra.py [--quick] [--seed 0]
"""
import argparse
import math
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402


def random_cuts(n, k, rng):
    """把 [0, n) 随机切成 k 段（段长不一）。"""
    cuts = sorted(rng.sample(range(1, n), k - 1))
    return list(zip([0, *cuts], [*cuts, n]))


def orders_and_trees(gen, rng, trials, n_cols):
    """第 1 部分：随机切块 × 各种合并顺序，和整块一次算比较。"""
    rows = []
    worst = {torch.float64: 0.0, torch.float32: 0.0}
    for t in range(trials):
        k = rng.randint(3, 12)
        cuts = random_cuts(n_cols, k, rng)
        for dtype in (torch.float64, torch.float32):
            S = torch.randn(2, 3, 5, n_cols, generator=gen, dtype=torch.float64).to(dtype) * 4
            V = torch.randn(2, 3, n_cols, 8, generator=gen, dtype=torch.float64).to(dtype)
            ref = torch.softmax(S.double(), -1) @ V.double()          # float64 的参考
            parts = [fl.block_state(S[..., a:b], V[..., a:b, :]) for a, b in cuts]
            trees = {"left to right": fl.chain_tree(k), "right to left": fl.reverse_chain_tree(k),
                     "random tree": fl.random_tree(k, rng)}
            for name, tree in trees.items():
                err = (fl.finalize(fl.merge_tree(parts, tree))[0].double() - ref).abs().max().item()
                worst[dtype] = max(worst[dtype], err)
                if dtype == torch.float64 or name == "random tree":
                    rows.append([t, k, str(dtype).replace("torch.", ""), name,
                                 fl.tree_depth(tree), f"{err:.1e}"])
    print(fl.format_table(["试验", "块数", "dtype", "合并顺序", "树深", "和整块一次算的最大差"], rows))
    a, b = parts[0], parts[1]
    same = all(torch.equal(x, y) for x, y in zip(fl.merge_states(a, b), fl.merge_states(b, a)))
    print(f"交换律 merge(a, b) == merge(b, a) 逐位相等：{same}；最大差 float64 {worst[torch.float64]:.1e}、"
          f"float32 {worst[torch.float32]:.1e}（结合律只在舍入误差内：浮点加法不结合）")
    assert same and worst[torch.float64] < 1e-13 and worst[torch.float32] < 1e-5
    return worst


def naive_state(S, V):
    """不加保护的局部状态：直接减去行最大值。整行 −∞ 时 max = −∞，S − max = −∞ − (−∞) = NaN。"""
    m = S.amax(-1)
    p = torch.exp(S - m[..., None])
    return m, p.sum(-1), p @ V


def naive_merge(a, b):
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    alpha, beta = torch.exp(ma - m), torch.exp(mb - m)
    return m, alpha * la + beta * lb, alpha[..., None] * oa + beta[..., None] * ob


def masked_rows(gen):
    """第 2 部分：整行被掩码的块。"""
    S = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    V = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    S[1, :6] = -math.inf                                      # 第 1 行：第一块整块被掩码（第二块看得见）
    S[3, :] = -math.inf                                       # 第 3 行：整行被掩码
    halves = [(0, 6), (6, 12)]
    ours = fl.finalize(fl.merge_tree([fl.block_state(S[:, a:b], V[a:b]) for a, b in halves]))[0]
    nv = [naive_state(S[:, a:b], V[a:b]) for a, b in halves]
    with torch.no_grad():
        naive = naive_merge(*nv)
        naive_O = naive[2] / naive[1][:, None]
    m0, l0, o0 = fl.block_state(S[:, :6], V[:6])
    rows = []
    for r in range(4):
        rows.append([r, "yes" if torch.isneginf(S[r, :6]).all() else "no",
                     "yes" if torch.isneginf(S[r]).all() else "no",
                     f"({m0[r].item():.3g}, {l0[r].item():.3g}, {o0[r].abs().max().item():.3g})",
                     "NaN" if torch.isnan(naive_O[r]).any() else "ok",
                     "NaN" if torch.isnan(ours[r]).any() else f"{ours[r, 0].item():+.4f}"])
    print(fl.format_table(["行", "第一块全掩码", "整行全掩码", "第一块的状态 (m, ℓ, max|o|)",
                           "不加保护", "block_state（O 的第 0 列）"], rows))
    empty = fl.block_state(S[:, :0], V[:0])
    ident = all(torch.equal(x, y) for x, y in zip(fl.merge_states(empty, (m0, l0, o0)), (m0, l0, o0)))
    print(f"(−∞, 0, 0) 是单位元：merge(空块, a) == a 逐位相等：{ident}。整行全掩码按约定输出 O = 0、lse = −∞。")
    assert torch.isnan(naive_O[1]).any() and not torch.isnan(ours).any() and ident
    assert (ours[3] == 0).all()


def lse_is_enough(gen, n):
    """第 3 部分：每行一个 lse 就能重算出整行 P。"""
    S = torch.randn(3, 64, n, generator=gen, dtype=torch.float64) * 3
    V = torch.randn(3, n, 16, generator=gen, dtype=torch.float64)
    cuts = random_cuts(n, 7, random.Random(0))
    O, lse = fl.finalize(fl.merge_tree([fl.block_state(S[..., a:b], V[..., a:b, :]) for a, b in cuts]))
    P = torch.exp(S - lse[..., None])                         # 用 lse 一步重算出归一化好的概率
    err_p = (P - torch.softmax(S, -1)).abs().max().item()
    err_lse = (lse - torch.logsumexp(S, -1)).abs().max().item()
    err_o = (P @ V - O).abs().max().item()
    rows = [["lse = m + log ℓ 对 torch.logsumexp", f"{err_lse:.1e}"],
            ["exp(S − lse) 对 softmax(S)", f"{err_p:.1e}"],
            ["重算的 P @ V 对 O", f"{err_o:.1e}"]]
    print(fl.format_table(["检查", "最大差"], rows))
    N = S.shape[-2]
    print(f"要存的：P 是 {N}×{n} = {N * n:,} 个数 / 每个头；lse 只有 {N} 个——少 {n} 倍（= 序列长度）。")
    assert max(err_p, err_lse, err_o) < 1e-12


def main():
    ap = argparse.ArgumentParser(description="(m, ℓ, o) 状态代数：任意合并顺序、整行掩码、LSE")
    ap.add_argument("--quick", action="store_true", help="小规模：更少的随机试验")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"随机种子 seed = {args.seed}")
    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)

    trials = 3 if args.quick else 8
    print(f"\n== 1. 切块 × 合并顺序（{trials} 次试验，分数 [2, 3, 5, 300]，dv = 8）==")
    orders_and_trees(gen, rng, trials, 300)
    print("\n== 2. 整行被掩码的块：不加保护的写法 vs block_state ==")
    masked_rows(gen)
    print("\n== 3. 每行一个 LSE 就够反向用 ==")
    lse_is_enough(gen, 256 if args.quick else 1024)

    print("\n结论：状态 (m, ℓ, o) 的合并可交换、可结合（舍入误差内），(−∞, 0, 0) 是单位元——所以分块的顺序、"
          "分给哪块设备、按什么树合并都可以随意安排；最后只需每行一个 lse，反向就能重算出 P。")


if __name__ == "__main__":
    main()
