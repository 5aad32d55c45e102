"""
第 19 讲 · 演示 2：把上下文从 128 扩展到 1024、2048——外推、位置插值、调大 base、继续训练

你会看到：
    1. 基座模型（T = 128 上训练）直接外推：从 128 到 2048 每个长度、每个深度的准确率——几倍长度以内还行，
       再长就从远处开始失效。
    2. 零样本（不训练，只改 RoPE [S93]）：位置插值 PI（位置 m → m / s，s = 2、4、8），调大 base（40k；NTK-aware
       的 b·s^(D/(D−2))，s = 8）。它们把远处的角度压回训练时见过的范围，但也把近处的角度压扁了。
    3. 在更长的序列上继续训练一小段（CHECKPOINTS 里的 ext_* 模型，150 步）：只在 256 上继续训练，1024 仍然不行；
       位置插值 ×4 再在 512 上训练 150 步（ext_512：训练时的角度范围和基座一样），模型学会了"被压缩的位置"；
       测试 1024 时按 PI 的规则把倍数设成 s = L'/L = 1024/128 = 8：1024（8× 基座的训练长度）上每个深度 ≥ 0.9，
       2048 上也 ≥ 0.9。只用训练时的 ×4 去测 1024，最远的深度就掉到 0.9 附近。
    4. NoPE（不加位置编码，同样在 128 上训练）作对照。
    表：每种方法在每个长度上"最差深度"的准确率；图：最差深度准确率随长度的曲线 + 最好方法的热力图。

运行：python3 lecture19/02_extend_context.py [--quick]
      --quick 也读入库的检查点，只缩小评测（读不到时只在内存里训 20 步，不写文件）。
      模型从 checkpoints/ 读取；NIAH 表缓存在 checkpoints/grids.json（换了检查点自动重算）。
图：lecture19/figures/02_extend_context_curves.png、02_extend_context_best.png
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


import long_lab as L  # noqa: E402
from course_utils import pyplot, save_figure  # noqa: E402

D_HEAD = 64
NTK8 = 10000.0 * 8 ** (D_HEAD / (D_HEAD - 2))        # NTK-aware：b' = b·s^(D/(D−2))，s = 8

# (显示名, 检查点, 变体名, 额外的 set_rope 参数)：变体名进缓存键
METHODS = [
    ("base: extrapolate", "base", "", {}),
    ("zero-shot PI x2", "base", "pi2", {"scale": 2.0}),
    ("zero-shot PI x4", "base", "pi4", {"scale": 4.0}),
    ("zero-shot base 40k", "base", "b40k", {"base": 40000.0}),
    ("zero-shot NTK base (s=8)", "base", "ntk8", {"base": NTK8}),
    ("continued @256", "ext_256", "", {}),
    ("continued @512, PI x4", "ext_512", "", {}),
    ("continued @512, PI x4, test PI x8", "ext_512", "pi8", {"scale": 8.0}),
    ("NoPE", "nope", "", {}),
]
TARGET = "continued @512, PI x4, test PI x8"     # 要在 1024（8× 训练长度）的每个深度都 ≥ 0.9 的方法


def evaluate(task, quick, lengths, depths, n):
    grids = {}
    models = {}
    for label, ckpt, variant, rope in METHODS:
        if ckpt not in models:
            models[ckpt] = L.get_checkpoint(task, ckpt, quick=quick)[0]
        model = models[ckpt]
        cfg = L.CHECKPOINTS[ckpt]["cfg"]                 # 先回到检查点自己的 RoPE 设置，再加这个方法的改动
        model.set_rope(**dict({"scale": cfg.get("scale", 1.0), "base": cfg.get("base", 10000.0)}, **rope))
        grids[label] = L.cached_grid(task, ckpt, model, lengths, depths, n=n, variant=variant, quick=quick, log=print)
    return grids


def table(grids, lengths, depths, n):
    rows = []
    for label, g in grids.items():
        rows.append([label] + [f"{min(g[(T, d)] for d in depths):.2f}" for T in lengths])
    print(f"\n每种方法在每个长度上\"最差深度\"的准确率（{len(depths)} 个深度，每格 {n} 个序列，随机猜 1/16）：")
    print(L.format_table(["方法"] + [f"T = {T}" for T in lengths], rows))


def detail(g, label, lengths, depths):
    rows = [[T] + [f"{g[(T, d)]:.2f}" for d in depths] for T in lengths]
    print(f"\n{label}：每个深度")
    print(L.format_table(["T \\ 深度"] + [f"{d:.2f}" for d in depths], rows))


# 每个方法一种颜色（两块小图共用）；达标的 TARGET 用最醒目的红色粗线，基座外推是黑色参照线，两块里都画
COLORS = {"base: extrapolate": "black", "zero-shot PI x2": "tab:orange", "zero-shot PI x4": "tab:green",
          "zero-shot base 40k": "tab:purple", "zero-shot NTK base (s=8)": "tab:brown",
          "continued @256": "tab:cyan", "continued @512, PI x4": "tab:blue", TARGET: "tab:red", "NoPE": "tab:olive"}
MARKERS = ("o", "s", "^", "D", "v")


def plot(grids, lengths, depths, quick):
    plt = pyplot()
    # 9 条曲线放一张图图例太长：按"只在测试时改 RoPE"和"继续训练 / 换位置编码"分成两块小图
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.8), sharey=True)
    zero_shot = {label for label, _, variant, _ in METHODS if variant and not label.startswith("continued")}
    panels = (("Test-time RoPE changes alone fall below 0.9 by 1024",
               ["base: extrapolate"] + [m for m in grids if m in zero_shot]),
              ("Continued training @512 + test PI x8 holds ≥ 0.9 to 2048",
               ["base: extrapolate"] + [m for m in grids if m not in zero_shot and m != "base: extrapolate"]))
    for ax, (title, labels) in zip(axes, panels):
        for k, label in enumerate(m for m in labels if m in grids):
            g = grids[label]
            ax.plot(lengths, [min(g[(T, d)] for d in depths) for T in lengths], color=COLORS[label],
                    ls="--" if label in zero_shot else "-", marker=MARKERS[k % len(MARKERS)], ms=8, label=label,
                    lw=3.5 if label == TARGET else 2, zorder=3 if label == TARGET else 2)
        ax.axvline(128, color="gray", lw=1.5)
        ax.axhline(0.9, color="gray", ls=":", lw=1.5)
        ax.text(lengths[0] * 1.05, 0.88, "0.9 target", ha="left", va="top", fontsize=12, color="dimgray")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("context length T (tokens; base trained at 128)")
        ax.set_title(title)
        ax.legend(loc="lower left", fontsize=12)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("NIAH accuracy at the worst depth (fraction)")
    paths = [save_figure(fig, __file__, "curves", quick=quick)]
    g = grids[TARGET]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    im = L.niah_heatmap(ax, g, lengths, depths)
    ax.set_xlabel("context length T (tokens)")
    ax.set_ylabel("needle depth (0 = start)")
    ax.set_title(f"{TARGET}:\n≥ {min(g.values()):.2f} at every length and depth")
    fig.colorbar(im, ax=ax, label="retrieval accuracy (fraction correct)")
    paths.append(save_figure(fig, __file__, "best", quick=quick))
    return paths


def main():
    args, task = L.demo_start("扩展上下文：外推、PI、调大 base、继续训练、NoPE",
                              "读入库的检查点、小表（读不到时每个模型只训练 20 步，不写文件）")
    lengths = (128, 256) if args.quick else L.NIAH_LENGTHS
    depths = (0.0, 1.0) if args.quick else L.NIAH_DEPTHS
    n = 4 if args.quick else 64
    grids = evaluate(task, args.quick, lengths, depths, n)
    table(grids, lengths, depths, n)
    detail(grids["base: extrapolate"], "基座直接外推", lengths, depths)
    detail(grids["continued @512, PI x4"], "continued @512, PI x4", lengths, depths)
    detail(grids[TARGET], TARGET, lengths, depths)
    if not args.quick:
        worst = min(grids[TARGET][(1024, d)] for d in depths)
        assert worst >= 0.9, f"{TARGET} 在 1024 上最差深度 {worst} < 0.9"
        plain = grids["continued @512, PI x4"]
        print(f"\n{TARGET}：1024（8× 训练长度）上最差的深度 {worst:.2f}，2048 上最差 "
              f"{min(grids[TARGET][(2048, d)] for d in depths):.2f}；同一个模型只用训练时的 ×4："
              f"1024 上最差 {min(plain[(1024, d)] for d in depths):.2f}，2048 上最差 "
              f"{min(plain[(2048, d)] for d in depths):.2f}。")
    for p in plot(grids, lengths, depths, args.quick):
        print(f"图：{os.path.relpath(p)}")


if __name__ == "__main__":
    main()
