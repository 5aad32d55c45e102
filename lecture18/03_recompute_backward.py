"""
第 18 讲 · 演示 3：重算反向——gradcheck，以及"多算一次矩阵乘法、少存一个 N×N"的账

你会看到：
    1. torch.autograd.gradcheck（float64 有限差分）对 BlockwiseAttention 的解析梯度：causal、N > Nk（有没有可见
       key 的行）、不整除的块都通过；大一点的尺寸上和标准写法的 autograd 梯度差 ~1e-15。
    2. 反向从 O 和 lse 重算 P：autograd 为反向存下的只有 q、k、v、O、lse——随 N 线性增长；
       标准写法存 P，随 N² 增长（MemoryMeter 量出来）。
    3. 代价：用 torch.utils.flop_counter 数矩阵乘法的 FLOPs。标准反向 4 次矩阵乘法（= 2 × 前向），
       分块反向 5 次（多一次重算 S = q kᵀ，= 2.5 × 前向）：注意力这一步的总 FLOPs 多 1/6，
       换来为反向多存的东西从每个头 N×Nk 个数（P）变成 N 个数（lse）。
       causal 时分块版跳过整块看不见的 (i, j)，总 FLOPs 反而比标准写法少。

运行：python3 lecture18/03_recompute_backward.py [--quick] [--seed 0]
图：lecture18/figures/03_recompute_backward_trade.png
"""
import argparse
import os
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402
from course_utils import merge_identical  # noqa: E402  （flash_lab 已把 lecture01 放上 sys.path）

HEADS, D, BLOCK = 4, 64, 64


def gradchecks(gen):
    """第 1 部分：gradcheck + 和标准写法的梯度比较。"""
    rows = []
    for N, Nk, d, dv, bq, bk, causal in ((6, 9, 3, 2, 4, 3, True), (7, 4, 3, 3, 2, 3, True),
                                         (5, 5, 4, 2, 5, 5, False), (9, 13, 2, 3, 4, 5, True)):
        inputs = [torch.randn(2, n, c, generator=gen, dtype=torch.float64, requires_grad=True)
                  for n, c in ((N, d), (Nk, d), (Nk, dv))]
        t0 = time.perf_counter()
        ok = torch.autograd.gradcheck(lambda q, k, v, c=causal, a=bq, b=bk: fl.blockwise_attention(q, k, v, a, b, c),
                                      inputs)
        rows.append([f"{N}×{Nk}, d={d}, dv={dv}", f"{bq}×{bk}", causal, "pass" if ok else "FAIL",
                     f"{time.perf_counter() - t0:.2f} s"])
        assert ok
    print(fl.format_table(["N×Nk", "块", "causal", "gradcheck", "用时"], rows))
    q, k, v = (torch.randn(2, HEADS, n, D, generator=gen, dtype=torch.float64, requires_grad=True)
               for n in (200, 300, 300))
    dO = torch.randn(2, HEADS, 200, D, generator=gen, dtype=torch.float64)
    g_ref = torch.autograd.grad(fl.vanilla_attention(q, k, v, True), (q, k, v), dO)
    g_blk = torch.autograd.grad(fl.blockwise_attention(q, k, v, 48, 40, True), (q, k, v), dO)
    errs = [(a - b).abs().max().item() for a, b in zip(g_blk, g_ref)]
    print(f"2×{HEADS}×200×300、d = {D}、块 48×40、causal：dq、dk、dv 和标准写法 autograd 的最大差 "
          + "、".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 1e-12


def one_step(N, causal, gen):
    """N = Nk 的一次前向 + 反向：两种写法各自的 FLOPs（前向 / 反向）和为反向存下的字节。"""
    out = {}
    q0, k0, v0 = (torch.randn(1, HEADS, N, D, generator=gen) for _ in range(3))
    runs = {"vanilla": lambda q, k, v: fl.vanilla_attention(q, k, v, causal),
            "blockwise": lambda q, k, v: fl.blockwise_attention(q, k, v, BLOCK, BLOCK, causal)}
    for name, run in runs.items():
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        with fl.MemoryMeter() as mm:
            with FlopCounterMode(display=False) as fwd:
                O = run(q, k, v)
            kept = mm.live - O.numel() * O.element_size()        # 不算输出本身
            with FlopCounterMode(display=False) as bwd:
                O.sum().backward()
        out[name] = dict(fwd=fwd.get_total_flops(), bwd=bwd.get_total_flops(), kept=kept)
    return out


def trade(Ns, gen):
    """第 2、3 部分：存下的字节和 FLOPs 随 N 变化。"""
    rows, res = [], {}
    for causal in (False, True):
        for N in Ns:
            r = one_step(N, causal, gen)
            res[(N, causal)] = r
            v, b = r["vanilla"], r["blockwise"]
            rows.append([N, causal, fl.fmt_bytes(v["kept"]), fl.fmt_bytes(b["kept"]), f"{v['kept'] / b['kept']:.1f}×",
                         f"{v['bwd'] / v['fwd']:.2f}", f"{b['bwd'] / b['fwd']:.2f}",
                         f"{(b['fwd'] + b['bwd']) / (v['fwd'] + v['bwd']):.3f}"])
            if not causal:                                       # 精确的矩阵乘法计数
                assert v["bwd"] == 2 * v["fwd"] and 2 * b["bwd"] == 5 * b["fwd"] and b["fwd"] == v["fwd"]
    print(fl.format_table(["N", "causal", "存下的（标准）", "存下的（分块）", "省了", "标准 反向/前向",
                           "分块 反向/前向", "分块 / 标准 总 FLOPs"], rows))
    print(f"（{HEADS} 个头、d = {D}、块 {BLOCK}×{BLOCK}、FP32；FLOPs 只数矩阵乘法。\"存下的\" = 前向新产出、"
          "结束时还活着的张量减去输出 O：q、k、v 本来就在，不算——标准写法多存的是 P（causal 时还有掩码），"
          "分块写法多存的只有 lse，所以\"省了\"≈ N 倍）")
    big = Ns[-1]
    v, b = res[(big, False)]["vanilla"], res[(big, False)]["blockwise"]
    print(f"N = {big}：多出的反向 FLOPs = {fl.fmt_count(b['bwd'] - v['bwd'])}（= 2·N²·d·头数，正好一次 q kᵀ），"
          f"换来少存 {fl.fmt_bytes(v['kept'] - b['kept'])}（P 是 {HEADS}×{big}×{big} 个 FP32）。")
    return res


# 每种算法一种颜色和标记，两块面板共用（与演示 4 一致：标准 = 红，分块 / 省内存 = 蓝）
COLORS = {"vanilla": "tab:red", "blockwise": "tab:blue"}
MARK = {"vanilla": dict(marker="s", ms=8, lw=2), "blockwise": dict(marker="o", ms=8, lw=2.5)}


def plot(res, Ns, quick):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.ticker
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 13})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for name in ("vanilla", "blockwise"):
        label = "standard (stores P)" if name == "vanilla" else "blockwise (recomputes P)"
        short = "standard" if name == "vanilla" else "blockwise"
        ax1.plot(Ns, [res[(N, False)][name]["kept"] / 2**20 for N in Ns], color=COLORS[name], label=label,
                 **MARK[name])
        series = [(f"{short}, {'causal' if c else 'full'}", Ns,
                   [(res[(N, c)][name]["fwd"] + res[(N, c)][name]["bwd"]) / 1e9 for N in Ns]) for c in (False, True)]
        # 标准写法的 causal 和 full 一样（掩码不省乘法）：merge_identical 合成一条，图例里不列看不见的线
        for (lab, xs, ys), ls in zip(merge_identical(series), ("-", "--")):
            ax2.plot(xs, ys, color=COLORS[name], label=lab, **{**MARK[name], "ls": ls})
    ax1.set_title("Blockwise keeps O(N) for backward,\nstandard keeps the O(N²) matrix P")
    ax1.set_ylabel("kept for backward, besides q, k, v, O (MiB)")
    ax2.set_title("The price: one extra QKᵀ matmul in backward")
    ax2.set_ylabel("matmul work, fwd + bwd (GFLOP)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel(f"sequence length N (tokens; {HEADS} heads, d={D})")
        ax.grid(True, which="major", alpha=0.3)
    ax1.legend(fontsize=12, loc="center right")     # 两条线之间、右侧是空的
    ax2.legend(fontsize=12, loc="lower right")     # 右下角没有数据：曲线都往右上走
    return fl.save_figure(fig, __file__, "trade", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="重算反向：gradcheck，FLOPs 与内存的交换")
    ap.add_argument("--quick", action="store_true", help="小规模：N ≤ 256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    torch.set_num_threads(1)          # 分块算法是许多小矩阵乘法：单线程反而快
    print(f"随机种子 seed = {args.seed}")
    gen = torch.Generator().manual_seed(args.seed)
    Ns = [64, 128, 256] if args.quick else [128, 256, 512, 1024, 2048]

    print("\n== 1. gradcheck（float64 有限差分）与梯度对照 ==")
    gradchecks(gen)
    print("\n== 2–3. 存下多少、多算多少 ==")
    res = trade(Ns, gen)

    print("\n结论：反向只靠 O 和每行一个 lse 就能重算出 P，梯度和标准写法一样；"
          "代价是多一次 q kᵀ（反向 2 → 2.5 倍前向），收获是存下的激活从 ∝ N² 变成 ∝ N。")
    if not args.no_fig:
        path = plot(res, Ns, args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
