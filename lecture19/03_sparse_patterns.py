"""
第 19 讲 · 演示 3：稀疏注意力——省下多少 (q, k) 对，又看不见什么

你会看到：
    1. 四种因果模式（full / window / strided / dilated）在 T = 128…2048 上要算的 (q, k) 对数：full 随 T² 涨，
       window 随 T·w 线性涨，strided 约 T·(stride + T/(2·stride))
       （局部 stride 个 + 每隔 stride 一个、平均 T/(2·stride) 个；精确式见 strided_pairs，
       演示里和掩码直接数出来的对数核对），dilated（LongNet [S96] 的简化版）按段长和间隔累加。
    2. 看不见什么：最后一个位置在 1 层、2 层之内能"看到"（直接或经过一个中间位置）哪些位置。
       window 两层也只到 2·(w − 1) 远；strided 一层只看稀疏的一列，两层就能到达所有位置——这正是
       Sparse Transformer [S95] 用两种头交替的理由；我们简化的 dilated 最大段长 128，更远的位置两层也到不了。
    3. 实际效果：从基座模型出发，每种模式各微调一小段（checkpoints/sparse_*.pt），在 T = 128 和 512 上
       测大海捞针；准确率对计算的 (q, k) 对数画成取舍图。

运行：python3 lecture19/03_sparse_patterns.py [--quick]
      --quick 也读入库的检查点，只缩小评测（读不到时只在内存里训 20 步，不写文件）。
图：lecture19/figures/03_sparse_patterns_masks.png、03_sparse_patterns_tradeoff.png
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


import long_lab as L  # noqa: E402
from course_utils import pyplot, save_figure  # noqa: E402

MODELS = {"full": "base", "window": "sparse_window", "strided": "sparse_strided", "dilated": "sparse_dilated"}


def mask_kw(kind):
    """各模式的参数：和 CHECKPOINTS 里微调时用的一致。"""
    return dict(L.CHECKPOINTS[MODELS[kind]]["cfg"].get("mask_kw", {}))


def strided_pairs(T, stride):
    """
    strided 模式的 (q, k) 对数，直接推出来：查询 i 看最近 min(i + 1, s) 个键（同 window），外加距离为 s、2s、… 的
    ⌊i/s⌋ 个键。Σ min(i + 1, s) = s(s + 1)/2 + (T − s)·s（T ≥ s）；T = q·s + r 时 Σ ⌊i/s⌋ = s·q(q − 1)/2 + r·q。
    合计 ≈ T·s + T²/(2s)：远处那部分每个查询平均只有 T/(2s) 个（前面的查询往回看得少），不是 T/s。
    """
    if T < stride:
        return T * (T + 1) // 2
    q, r = divmod(T, stride)
    return stride * (stride + 1) // 2 + (T - stride) * stride + stride * q * (q - 1) // 2 + r * q


def pairs_table(lengths):
    rows = []
    for kind in L.MASK_KINDS:
        counts = [L.pattern_pairs(kind, T, **mask_kw(kind)) for T in lengths]
        rows.append([kind, str(mask_kw(kind) or "")] + [f"{c:,}（{c / (T * (T + 1) // 2):.0%}）"
                                                         for c, T in zip(counts, lengths)])
    print(L.format_table(["模式", "参数"] + [f"T = {T}" for T in lengths], rows))
    w = mask_kw("window")["window"]
    T = lengths[-1]
    assert L.pattern_pairs("window", T, window=w) == w * (w + 1) // 2 + (T - w) * w
    assert L.pattern_pairs("full", T) == T * (T + 1) // 2
    st = mask_kw("strided")["stride"]
    for t in lengths:                                            # 推出来的式子 = 掩码里直接数的 True 个数
        assert strided_pairs(t, st) == L.pattern_pairs("strided", t, stride=st), t
    print(f"strided（s = {st}）：公式 s(s+1)/2 + (T−s)·s + s·q(q−1)/2 + r·q（T = q·s + r）= 掩码直接数的对数，"
          f"T = {T} 时 {strided_pairs(T, st):,} ≈ T·(s + T/(2s)) = {T * (st + T / (2 * st)):,.0f}")


def reach(kind, T):
    """最后一个位置 1 层、2 层之内能到达的位置（布尔 [T]）。两层：经过某个中间位置 m，m 能看 j、最后一个位置能看 m。"""
    m = L.attention_mask(kind, T, **mask_kw(kind)).float()      # [T, T]
    one = m[-1] > 0
    two = (m[-1] @ m) > 0                                        # [T]：Σ_m M[last, m]·M[m, j]
    return one, two


def reach_table(T):
    rows = []
    for kind in L.MASK_KINDS:
        one, two = reach(kind, T)
        far = int((~two).nonzero().max()) if (~two).any() else -1
        rows.append([kind, f"{int(one.sum())}", f"{int(two.sum())}（{two.float().mean():.0%}）",
                     "—" if far < 0 else f"位置 0…{far} 中有 {int((~two).sum())} 个"])
    print(f"\n最后一个位置（T = {T}）能看到的位置数：")
    print(L.format_table(["模式", "1 层", "2 层", "2 层也看不到的"], rows))
    one, two = reach("window", T)
    w = mask_kw("window")["window"]
    assert int(two.sum()) == min(T, 2 * w - 1)                    # 两层窗口最远到 2(w − 1)
    assert bool(reach("strided", T)[1].all())                    # 跨步两层覆盖全部


def accuracy(task, quick, lengths, depths, n):
    res = {}
    for kind, name in MODELS.items():
        model, _ = L.get_checkpoint(task, name, quick=quick)
        res[kind] = L.cached_grid(task, name, model, lengths, depths, n=n, quick=quick, log=print)
    rows = []
    for kind in L.MASK_KINDS:
        for T in lengths:
            g = res[kind]
            frac = L.pattern_pairs(kind, T, **mask_kw(kind)) / (T * (T + 1) // 2)
            rows.append([kind, T, f"{frac:.0%}"] + [f"{g[(T, d)]:.2f}" for d in depths]
                        + [f"{sum(g[(T, d)] for d in depths) / len(depths):.2f}"])
    print(f"\n大海捞针准确率（每格 {n} 个序列）：")
    print(L.format_table(["模式", "T", "(q,k) 对 / full"] + [f"深度 {d:.2f}" for d in depths] + ["平均"], rows))
    return res


# 每种掩码一种颜色，两张图共用；full 是黑色参照，精度/算力折中最好的 strided 用醒目的蓝色
COLORS = {"full": "black", "window": "tab:orange", "strided": "tab:blue", "dilated": "tab:purple"}


def plot(res, lengths, depths, quick):
    plt = pyplot()
    from matplotlib.colors import ListedColormap
    T = 64
    fig, axes = plt.subplots(1, 4, figsize=(14, 4.3))
    full_pairs = L.pattern_pairs("full", T, **mask_kw("full"))
    for ax, kind in zip(axes, L.MASK_KINDS):
        pairs = L.pattern_pairs(kind, T, **mask_kw(kind))
        ax.imshow(L.attention_mask(kind, T, **mask_kw(kind)).numpy(), cmap=ListedColormap(["white", COLORS[kind]]),
                  interpolation="nearest", vmin=0, vmax=1)
        ax.set_title(f"{kind}: {pairs} pairs ({pairs / full_pairs:.0%})", color=COLORS[kind])
        ax.set_xlabel("key position j")
    axes[0].set_ylabel("query position i")
    fig.suptitle(f"Sparse masks at T = {T} compute a fraction of causal attention's pairs (coloured = computed)")
    paths = [save_figure(fig, __file__, "masks", quick=quick)]
    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    far = [d for d in depths if d < 1.0] or list(depths)            # 深度 1 的针紧挨问题，谁都看得见
    markers = {T: m for T, m in zip(lengths, ("o", "s", "^"))}
    for kind in L.MASK_KINDS:
        xs = [L.pattern_pairs(kind, T, **mask_kw(kind)) for T in lengths]
        ys = [sum(res[kind][(T, d)] for d in far) / len(far) for T in lengths]
        ax.plot(xs, ys, color=COLORS[kind], lw=2 if kind != "strided" else 3, zorder=2)    # 同一掩码：T 变长
        for x, y, T in zip(xs, ys, lengths):
            ax.scatter(x, y, s=150, marker=markers[T], color=COLORS[kind], edgecolor="black", zorder=3)
        # 直接在最后一个点旁写名字，不用查图例的颜色
        ax.annotate(kind, (xs[-1], ys[-1]), xytext=(10, 8 if kind != "window" else -16), textcoords="offset points",
                    color=COLORS[kind], fontsize=13, fontweight="bold")
    for T in lengths:
        ax.scatter([], [], s=150, marker=markers[T], color="white", edgecolor="black", label=f"T = {T} tokens")
    ax.axhline(1 / 16, color="gray", ls=":", lw=1.5, label="chance (1/16)")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.08)
    ax.margins(x=0.2)
    ax.set_xlabel("(query, key) pairs computed per sequence (log scale)")
    ax.set_ylabel(f"NIAH accuracy (fraction), depths {far[0]:g}-{far[-1]:g}")
    # 标题由数据算出：最长的 T 上每种掩码的准确率（远处深度的平均）和它算的对数占 full 的比例
    T_max = lengths[-1]
    acc = {k: sum(res[k][(T_max, d)] for d in far) / len(far) for k in res}
    frac = {k: L.pattern_pairs(k, T_max, **mask_kw(k)) / L.pattern_pairs("full", T_max, **mask_kw("full"))
            for k in res} if "full" in res else {}
    parts = [f"{k} {acc[k]:.2f}" + (f" ({frac[k]:.0%} pairs)" if k in frac else "") for k in res]
    ax.set_title(f"NIAH accuracy vs pairs computed; at T = {T_max}:\n" + ", ".join(parts[:2]) + ",\n"
                 + ", ".join(parts[2:]))
    ax.legend(loc="center right")
    paths.append(save_figure(fig, __file__, "tradeoff", quick=quick))
    return paths


def main():
    args, task = L.demo_start("稀疏注意力：对数、可达性、准确率",
                              "读入库的检查点、小表（读不到时每个模型只训练 20 步，不写文件）")
    pairs_table([128, 512, 2048])
    reach_table(128)
    reach_table(512)
    lengths = (128,) if args.quick else (128, 512)
    depths = (0.0, 1.0) if args.quick else L.NIAH_DEPTHS
    res = accuracy(task, args.quick, lengths, depths, n=4 if args.quick else 64)
    if not args.quick:
        full, win = res["full"], res["window"]
        assert min(full[(128, d)] for d in depths) >= 0.9
        assert win[(512, 0.0)] < 0.5                  # 窗口看不到开头那根针
    for p in plot(res, lengths, depths, args.quick):
        print(f"图：{os.path.relpath(p)}")


if __name__ == "__main__":
    main()
