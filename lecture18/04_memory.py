"""
第 18 讲 · 演示 4：激活显存——标准注意力、省内存的注意力、BPT，量出来和论文表 1 对账

你会看到：
    1. 同一层 Transformer 的三种算法（vanilla / flash / bpt，见 flash_lab.TransformerLayer）输出相同，
       而一次前向 + 反向里：前向最大的单个张量**恰好**等于 Ring Attention 论文表 1 [S83] 的公式（换成 FP32 的字节）：
       vanilla 是 [b, n, s, s] 的 P，flash 是 [b, s, 4h] 的前馈中间层，bpt 是 [b, s, h]。
    2. 同时活着的总量（峰值）和为反向存下的量（kept）随 s 的增长：vanilla ∝ s²，另外两种 ∝ s；
       BPT [S98] 比 flash 少的正是前馈的 4h 中间层（图）。
    3. 给定显存预算能训练多长的序列：用量出来的曲线拟合，以及用表 1 的公式算一层 7B 规模（h = 4096、32 头、BF16）。

怎么量：CPU 上的 torch 没有分配器统计，tracemalloc 看不到 torch 的内存；flash_lab.MemoryMeter 在算子层面
登记每个新产出张量的存储、在存储释放时减掉（数的是"张量的字节"）。有 CUDA 时另外打印
torch.cuda.max_memory_allocated 的增量作对照（它还含分配器的取整和缓存）。

运行：python3 lecture18/04_memory.py [--quick] [--budget-gib 16]
图：lecture18/figures/04_memory_peak.png
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402

LABELS = {"vanilla": "vanilla attention", "flash": "memory-efficient attn", "bpt": "BPT (attn + FFN blockwise)"}


def measure(s_list, h, n, c, vanilla_max, seed):
    """每个 (s, 算法) 量一次；vanilla 只量到 vanilla_max（再往上 P 就太大了）。"""
    layer = fl.TransformerLayer(h, n, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    res, rows = {}, []
    for s in s_list:
        x = torch.randn(1, s, h, generator=gen)
        outs = {}
        for mode in fl.MODES:
            if mode == "vanilla" and s > vanilla_max:
                continue
            r = fl.measure_layer(layer, x, mode, block=c)
            outs[mode] = r["out"]
            formula = fl.activation_bytes(mode, s, h, n, c, elem_bytes=4)
            assert r["fwd_largest"] == formula, (s, mode, r["fwd_largest"], formula)
            res[(s, mode)] = r
            rows.append([s, mode, fl.fmt_bytes(r["fwd_largest"]), fl.fmt_bytes(formula), fl.fmt_bytes(r["kept"]),
                         fl.fmt_bytes(r["peak"]), f"{r['peak'] / r['fwd_largest']:.1f}×", cuda_peak(layer, x, mode, c)])
        for mode in outs:
            assert (outs[mode] - outs["flash"]).abs().max() < 1e-4
    print(fl.format_table(["s", "算法", "前向最大张量（量）", "表 1 公式（FP32）", "为反向存下", "峰值",
                           "峰值 / 最大张量", "CUDA 峰值增量"], rows))
    if vanilla_max < s_list[-1]:
        print(f"vanilla 只量到 s = {vanilla_max}：再往上光 P 就要 {fl.fmt_bytes(4 * n * s_list[-1] ** 2)}。")
    print(f"（h = {h}、{n} 个头、块 c = {c}、b = 1、FP32；峰值里含参数梯度 12h² × 4 B = "
          f"{fl.fmt_bytes(12 * h * h * 4)}；三种算法的输出差 < 1e-4）")
    print("表 1 只数最大的那一块激活，而且和量出来的逐字节相等；真正同时活着的峰值是它的几倍"
          "（q、k、v、O、残差、反向时的梯度……），但增长的阶数相同。")
    return res


def cuda_peak(layer, x, mode, c):
    """有 CUDA 时：同一层放到 GPU 上，用分配器的 max_memory_allocated 量峰值增量（对照）；否则 "—"。"""
    if not torch.cuda.is_available():
        return "—"
    lay, xg = fl.TransformerLayer(layer.h, layer.n_heads).cuda(), x.cuda()
    lay.load_state_dict(layer.state_dict())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    lay(xg, mode, c).sum().backward()
    torch.cuda.synchronize()
    return fl.fmt_bytes(torch.cuda.max_memory_allocated() - base)


def growth(res, s_list):
    """s 翻倍时 kept 和峰值各乘多少：vanilla → 4，另外两种 → 2。"""
    rows = []
    for mode in fl.MODES:
        ss = [s for s in s_list if (s, mode) in res]
        a, b = ss[-2], ss[-1]
        kept = res[(b, mode)]["kept"] / res[(a, mode)]["kept"]
        peak = res[(b, mode)]["peak"] / res[(a, mode)]["peak"]
        rows.append([mode, f"{a} → {b}", f"×{kept:.2f}", f"×{peak:.2f}"])
    print(fl.format_table(["算法", "s", "为反向存下", "峰值"], rows))
    return rows


def fit_and_budget(res, s_list, budget):
    """峰值 ≈ a + b·s + c·s²（最小二乘；flash、bpt 只拟合到 s 的一次项），解出预算下最长的 s。"""
    rows = []
    for mode in fl.MODES:
        ss = np.array([s for s in s_list if (s, mode) in res], dtype=float)
        peak = np.array([res[(int(s), mode)]["peak"] for s in ss], dtype=float)
        deg = 2 if mode == "vanilla" else 1
        coef = np.polyfit(ss, peak, deg)                      # 高次项在前
        roots = (np.poly1d(coef) - budget).roots
        s_max = max(r.real for r in roots if abs(r.imag) < 1e-9 and r.real > 0)
        rows.append([mode, poly_text(coef), f"{s_max:,.0f}"])
    print(fl.format_table(["算法", "拟合的峰值（字节）", f"{gib_text(budget)} 能放下的 s"], rows))


def poly_text(coef):
    """[c2, c1, c0] → "26.7 s² + 3 s + 9.2e+04"（高次项在前）。"""
    names = {2: " s²", 1: " s", 0: ""}
    deg = len(coef) - 1
    terms = [f"{v:.3g}{names[deg - i]}" for i, v in enumerate(coef) if abs(v) > 1e-6 * max(abs(coef))]
    return " + ".join(terms).replace("+ -", "− ")


def gib_text(nbytes):
    """预算按二进制单位写：2**28 → "256 MiB"。"""
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def paper_scale(budget, devices):
    """表 1 的公式放到一层 7B 规模上：h = 4096、32 头、BF16、b = 1。"""
    h, n = 4096, 32
    rows = []
    for kind in fl.KINDS:
        P = devices if kind == "ring" else 1
        s = fl.max_seq_len(kind, budget, h, n, devices=P)
        rows.append([kind + (f"（{P} 块设备）" if P > 1 else ""), f"{s:,}", f"{s / 1024:,.0f}K"])
    print(fl.format_table(["算法", f"一层激活 ≤ {gib_text(budget)} 时最长的 s", "≈"], rows))
    return rows


# 每种算法一种颜色，两块面板共用（与演示 3 一致：vanilla = 红，省内存的注意力 = 蓝；BPT 最省 = 绿）
COLORS = {"vanilla": "tab:red", "flash": "tab:blue", "bpt": "tab:green"}


def plot(res, s_list, h, n, c, quick):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.ticker
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    plt.rcParams.update({"font.size": 13})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    for mode in fl.MODES:
        ss = [s for s in s_list if (s, mode) in res]
        col, lw = COLORS[mode], (3 if mode == "bpt" else 2)          # BPT（最省）用最粗的线
        ax1.plot(ss, [res[(s, mode)]["peak"] / 2**20 for s in ss], "o-", color=col, lw=lw, ms=8)
        ax1.plot(ss, [res[(s, mode)]["kept"] / 2**20 for s in ss], "s--", color=col, lw=lw, ms=7, alpha=0.7)
        ax2.plot(ss, [res[(s, mode)]["fwd_largest"] / 2**20 for s in ss], "o", color=col, ms=10)
        ax2.plot(s_list, [fl.activation_bytes(mode, s, h, n, c, elem_bytes=4) / 2**20 for s in s_list], "-",
                 color=col, lw=lw, alpha=0.6)
    modes = [Line2D([], [], color=COLORS[m], lw=3, label=LABELS[m]) for m in fl.MODES]
    # 图例放在两块面板下面：左上角正是 vanilla 曲线的位置
    ax1.legend(handles=modes + [Line2D([], [], color="k", marker="o", lw=2, label="peak (fwd + bwd)"),
                                Line2D([], [], color="k", ls="--", marker="s", lw=2, label="kept for backward")],
               fontsize=12, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax2.legend(handles=modes + [Line2D([], [], color="k", marker="o", ls="", ms=10, label="measured"),
                                Line2D([], [], color="k", alpha=0.6, lw=2, label="table 1 formula (x2 for FP32)")],
               fontsize=12, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax1.set_title(f"Peak memory: vanilla grows ∝ s², BPT lowest\n(one layer, fwd + bwd, h={h}, {n} heads, FP32)")
    ax2.set_title("Largest forward activation matches\nRing Attention table 1")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(s_list, [str(s) for s in s_list])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("sequence length s (tokens)")
        ax.set_ylabel("memory (MiB)")
        ax.grid(True, which="major", alpha=0.3)
    return fl.save_figure(fig, __file__, "peak", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="激活显存：vanilla / 省内存的注意力 / BPT，对照 Ring Attention 表 1")
    ap.add_argument("--quick", action="store_true", help="小规模：h = 32、s ≤ 256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-gib", type=float, default=16.0, help="第 3 部分一层激活的显存预算（GiB）")
    ap.add_argument("--devices", type=int, default=8, help="ring 用几块设备")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    fl.check_real("--budget-gib", args.budget_gib, lo=0, lo_open=True)
    fl.check_int("--devices", args.devices, lo=1)
    torch.set_num_threads(1)          # 分块算法是许多小矩阵乘法：单线程反而快
    print(f"随机种子 seed = {args.seed}")
    if args.quick:
        h, n, c, s_list, vmax = 32, 2, 16, [64, 128, 256], 256
    else:
        h, n, c, s_list, vmax = 64, 4, 64, [256, 512, 1024, 2048, 4096], 2048

    print("\n== 1. 一层的一次前向 + 反向：量出来的激活 vs 论文表 1 ==")
    res = measure(s_list, h, n, c, vmax, args.seed)
    print("\n== 2. s 翻倍，显存乘多少 ==")
    growth(res, s_list)
    print(f"\n== 3a. 本演示这一层（h = {h}）：峰值的拟合，和 256 MiB 预算下最长的 s（外推）==")
    fit_and_budget(res, s_list, 256 * 2**20)
    print("\n== 3b. 表 1 的公式，一层 7B 规模（h = 4096、32 头、BF16、b = 1）==")
    paper_scale(args.budget_gib * 2**30, args.devices)
    print("论文表 3 [S84]（8×A100、7B，整模型含参数和优化器）：vanilla / 省内存 / BPT / Ring = 2K / 16K / 32K / 256K——"
          "顺序和倍数的方向一致，绝对值不同：那里的预算还要装下参数、优化器状态和所有层。")

    print("\n结论：省内存的注意力把 s² 的 P 去掉，激活变成 ∝ s，剩下最大的是前馈的 4h 中间层；BPT 把前馈也按块算、"
          "反向按块重算，最大的只剩 [s, h] 的输出；环形注意力再把 s 分给多块设备，每块只存和 s 无关的 6 个 [c, h] 块。")
    if not args.no_fig:
        path = plot(res, s_list, h, n, c, args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
