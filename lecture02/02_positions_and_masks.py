"""
第 2 讲 · 演示 2：位置从哪里来？—— RoPE 的相对位置、没有位置时的置换等变、双向注意力的"偷看"

你会看到：
    1. RoPE：把 query 和 key 同时平移 s 个位置（试几百个 s），注意力分数不变（差 ~1e-13）——分数只依赖 m − n。
       对照"把正弦位置编码加到输入上"的做法：同样的平移会让分数变化。
       整个模型也一样：把所有位置整体平移（rope_pos0 = s），logits 不变。
    2. 去掉位置编码、又用双向注意力时，模型是置换等变的：打乱输入顺序，输出只是跟着打乱——
       它看到的只是一袋词（bag of words）。加回 RoPE 或因果掩码，任何一个都能打破这种对称。
    3. 双向注意力会"偷看"未来：改动第 j 个 token，因果模型里位置 i < j 的 logits 纹丝不动，
       双向模型里全都变了——训练"预测下一个 token"时，答案就在输入里。

运行：python3 lecture02/02_positions_and_masks.py [--quick] [--seed 0]
图：lecture02/figures/02_positions_and_masks_rope.png、02_positions_and_masks_leak.png
"""
import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transformer_lab as tl  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402

D_HEAD = 64
THETA = 10000.0


def rope_scores(q, k, q_pos, k_pos, theta=THETA):
    """一对向量 q、k 放在位置 q_pos[i]、k_pos[i] 时的 RoPE 注意力分数（向量化：每个 i 一个分数）。"""
    n, dh = len(q_pos), q.shape[-1]
    qx = np.broadcast_to(q, (1, n, 1, dh))          # [1, n, 1, dh]：同一个 q 放在 n 个位置
    kx = np.broadcast_to(k, (1, n, 1, dh))
    qr = tl.apply_rope(qx, *tl.rope_angles(q_pos, dh, theta))
    kr = tl.apply_rope(kx, *tl.rope_angles(k_pos, dh, theta))
    return np.sum(qr * kr, axis=-1)[0, :, 0] / math.sqrt(dh)   # [n]


def sinusoid(pos, dh, theta=THETA):
    """原始 Transformer 的加法位置编码 PE(p)：[len(pos), dh]，偶数位 sin、奇数位 cos。"""
    cos, sin = tl.rope_angles(pos, dh, theta)        # 同一组频率
    pe = np.empty((len(pos), dh))
    pe[:, 0::2], pe[:, 1::2] = sin, cos
    return pe


def part_rope(rng, n_pairs, n_shifts):
    print("== 1. RoPE：分数只依赖相对位置 ==")
    q, k = rng.standard_normal((2, D_HEAD))
    m = rng.integers(0, 512, size=n_pairs)
    n = rng.integers(0, 512, size=n_pairs)
    shifts = np.arange(n_shifts) * 7                                   # 0, 7, 14, …
    qp = (m[:, None] + shifts[None, :]).ravel()                        # [pairs·shifts]
    kp = (n[:, None] + shifts[None, :]).ravel()
    rope = rope_scores(q, k, qp, kp).reshape(n_pairs, n_shifts)
    dev_rope = float(np.max(np.abs(rope - rope[:, :1])))
    pe_q, pe_k = sinusoid(qp, D_HEAD), sinusoid(kp, D_HEAD)
    additive = (np.sum((q + pe_q) * (k + pe_k), axis=-1) / math.sqrt(D_HEAD)).reshape(n_pairs, n_shifts)
    dev_add = float(np.max(np.abs(additive - additive[:, :1])))
    print(format_table(["位置编码", "(m, n) 对数", "平移次数", "最大平移", "分数随平移的最大变化"],
                       [["RoPE（旋转 q、k）", n_pairs, n_shifts, int(shifts[-1]), f"{dev_rope:.1e}"],
                        ["正弦（加到输入上）", n_pairs, n_shifts, int(shifts[-1]), f"{dev_add:.2f}"]]))
    assert dev_rope < 1e-9 and dev_add > 0.1
    print("→ RoPE 分数只依赖 m − n。加法编码 (q+PE(m))·(k+PE(n)) 里 PE(m)·PE(n) 只依赖 m − n，")
    print("  但交叉项 q·PE(n)、PE(m)·k 随绝对位置变化。")
    return q, k


def part_model_shift(rng, params, cfg, T):
    toks = rng.integers(0, cfg.vocab, size=(1, T))
    base = tl.forward(params, cfg, toks)
    rows, worst = [], 0.0
    for s in (1, 37, 1000, 100_000):
        d = float(np.max(np.abs(tl.forward(params, cfg, toks, rope_pos0=s) - base)))
        worst = max(worst, d)
        rows.append([s, f"{d:.1e}"])
    print("\n整个模型：所有位置整体平移 s（forward(..., rope_pos0=s)，不用 cache）")
    print(format_table(["平移 s", "logits 最大变化"], rows))
    assert worst < 1e-8, worst
    print("→ 模型只看得到相对位置；出问题的是'前后不一致'的位置编号（04 演示的 bug）。")


def part_permutation(rng, params, cfg, T):
    print("\n== 2. 没有位置编码 + 双向注意力 = 置换等变 ==")
    toks = rng.integers(0, cfg.vocab, size=(1, T))
    perm = rng.permutation(T)
    rows, diffs = [], {}
    for use_rope in (False, True):
        for causal in (False, True):
            out = tl.forward(params, cfg, toks, use_rope=use_rope, causal=causal)
            out_p = tl.forward(params, cfg, toks[:, perm], use_rope=use_rope, causal=causal)
            d = float(np.max(np.abs(out_p - out[:, perm])))
            diffs[use_rope, causal] = d
            rows.append(["RoPE" if use_rope else "无", "因果" if causal else "双向", f"{d:.1e}",
                         "是" if d < 1e-9 else "否"])
    print(f"打乱 {T} 个 token 的顺序后：f(打乱的输入) 与 打乱(f(输入)) 的最大差")
    print(format_table(["位置编码", "掩码", "最大差", "置换等变"], rows))
    assert diffs[False, False] < 1e-9
    assert min(d for key, d in diffs.items() if key != (False, False)) > 1e-3
    print("→ 只有'无位置 + 双向'时模型分不清词序（'狗咬人' = '人咬狗'）。因果掩码本身也带来位置信息：")
    print("  第 i 个位置能看到 i+1 个 token，所以没有位置编码（NoPE）的因果模型仍能学到位置（Haviv et al. 2022）。")


def dependence(params, cfg, toks, causal, rng):
    """D[i, j] = 把第 j 个 token 换成别的词之后，位置 i 的 logits 最多变了多少。"""
    T = toks.shape[1]
    base = tl.forward(params, cfg, toks, causal=causal)[0]             # [T, vocab]
    D = np.zeros((T, T))
    for j in range(T):
        changed = toks.copy()
        changed[0, j] = (toks[0, j] + 1 + rng.integers(cfg.vocab - 1)) % cfg.vocab   # 保证换成不同的词
        out = tl.forward(params, cfg, changed, causal=causal)[0]
        D[:, j] = np.max(np.abs(out - base), axis=-1)
    return D


def part_leak(rng, params, cfg, T):
    print("\n== 3. 双向注意力偷看未来 ==")
    toks = rng.integers(0, cfg.vocab, size=(1, T))
    D_causal = dependence(params, cfg, toks, True, np.random.default_rng(1))
    D_bidir = dependence(params, cfg, toks, False, np.random.default_rng(1))
    future = np.triu(np.ones((T, T), dtype=bool), k=1)                 # i < j：位置 i 看到了"将来"的 token j
    nxt_mask = np.eye(T, k=1, dtype=bool)                              # j = i+1：正好是位置 i 要预测的那个 token

    def stats(D, mask):
        vals = D[mask]
        return float(vals.min()), float(vals.mean()), float(vals.max())

    table = {}
    rows = []
    for name, D in (("因果", D_causal), ("双向", D_bidir)):
        regions = (("i < j（未来）", future), ("j = i+1（答案）", nxt_mask), ("i ≥ j（过去与自己）", ~future))
        for region, mask in regions:
            lo, mean, hi = stats(D, mask)
            table[name, region] = (lo, mean, hi)
            rows.append([name, region, f"{lo:.1e}", f"{mean:.1e}", f"{hi:.1e}"])
    print("D[i, j] = 改动第 j 个 token 后，位置 i 的 logits 的最大绝对变化 max_v |Δlogits[i, v]|；")
    print("下表对一个区域里所有 (i, j) 的 D[i, j] 取最小 / 平均 / 最大")
    print(format_table(["注意力", "区域 (i, j)", "最小 D", "平均 D", "最大 D"], rows))
    lo_n, nxt, hi_n = table["双向", "j = i+1（答案）"]
    print(f"→ 双向模型里位置 i 的输出依赖 token i+1（D[i, i+1] 平均 {nxt:.2f}，最小 {lo_n:.1e}）："
          f"而 token i+1 正是它要预测的答案。"
          f"\n  这样训练，损失会很快降到接近 0，模型却什么也没学会——decoder 必须用因果掩码。")
    # 因果：未来区域的最大变化是舍入级别的 0；过去与自己的最小变化也明显非 0（真的在用前文）
    assert table["因果", "i < j（未来）"][2] < 1e-12
    assert table["因果", "i ≥ j（过去与自己）"][0] > 1e-6
    # 双向：未来区域里连最小的变化都明显非 0——每个位置都偷看到了每个未来 token
    assert table["双向", "i < j（未来）"][0] > 1e-6 and table["双向", "j = i+1（答案）"][0] > 1e-6
    for key, (lo, mean, hi) in table.items():        # 表里的三列自洽：最小 ≤ 平均 ≤ 最大
        assert lo <= mean <= hi, key
    return D_causal, D_bidir


def plot_rope(q, k, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    n = 64
    mm, nn = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    grid = rope_scores(q, k, mm.ravel(), nn.ravel()).reshape(n, n)
    dist = np.unique(np.round(np.logspace(0, 4.5, 300)).astype(int))
    ones = np.ones(D_HEAD)
    decay = rope_scores(ones, ones, dist, np.zeros_like(dist)) / rope_scores(ones, ones, [0], [0])[0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    im = ax1.imshow(grid, cmap="RdBu_r")
    fig.colorbar(im, ax=ax1, label="score q(m)·k(n)")
    ax1.set_xlabel("key position n")
    ax1.set_ylabel("query position m")
    ax1.set_title("RoPE score q(m)·k(n)\n(constant along diagonals)")
    ax2.semilogx(dist, decay)
    ax2.axhline(0, color="gray", lw=0.5)
    ax2.set_xlabel("relative distance m - n")
    ax2.set_ylabel("score / score at distance 0")
    ax2.set_title(f"RoPE long-range decay (q = k = ones, d_head={D_HEAD})")
    return save_figure(fig, path_script, "rope", quick=quick)


def plot_leak(D_causal, D_bidir, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, D, name in zip(axes, (D_causal, D_bidir), ("causal", "bidirectional")):
        im = ax.imshow(np.log10(D + 1e-16), vmin=-16, vmax=1, cmap="magma")
        ax.set_title(name)
        ax.set_xlabel("changed token j")
        ax.set_ylabel("output position i")
    fig.colorbar(im, ax=axes[1], label="log10 max |Δ logits|")      # 两图同一色标（vmin/vmax 相同），挂在右图上
    n = D_causal.shape[0]
    axes[0].text(0.95 * n, 0.2 * n, "exactly 0:\nthe future\nnever leaks", color="white", ha="right", va="top")
    fig.suptitle("How much output position i changes when input token j is replaced")
    return save_figure(fig, path_script, "leak", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="少一些位置对与平移、更短的序列")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    rng = np.random.default_rng(a.seed)
    n_pairs, n_shifts, T = (20, 100, 10) if a.quick else (50, 400, 24)
    cfg = tl.TINY
    params = tl.init_params(cfg, seed=a.seed)

    q, k = part_rope(rng, n_pairs, n_shifts)
    part_model_shift(rng, params, cfg, T)
    part_permutation(rng, params, cfg, T)
    D_causal, D_bidir = part_leak(rng, params, cfg, T)
    if not a.no_fig:
        print(f"\n图：{plot_rope(q, k, __file__, quick=a.quick)}")
        print(f"图：{plot_leak(D_causal, D_bidir, __file__, quick=a.quick)}")


if __name__ == "__main__":
    main()
