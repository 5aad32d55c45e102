"""
第 11 讲 · 演示 2：FlashAttention 前向——同样的 FLOPs，少得多的显存读写

你会看到：
    1. flash_fwd 的两种循环顺序（fa1 = 论文算法 1，fa2 = FlashAttention-2）在不整除的形状、N ≠ Nk、causal 下
       都和标准注意力一致（差 < 1e-12），而且 FLOPs 和标准写法完全一样多。
    2. 两种顺序各自反复读写什么：fa1 把 Q、O、l、m 读写 Tc 遍，fa2 把 K、V 读 Tr 遍——按数据分账的表。
    3. 读写量随 N 的变化：标准 Θ(Nd + N²) 里 N×N 的两项占满；flash 逐块计数 = 闭式公式。
    4. 读写量随片上存储 M 的变化：flash 的读写 ∝ N²d²/M（IO·M/(N²d²) 基本是常数），标准写法和 M 无关（图）。
    5. causal 跳过整块看不见的 (i, j)：块越小、跳过的比例越接近一半。

运行：python3 lecture11/02_flash_forward.py [--quick] [--seed 0]
图：lecture11/figures/02_flash_forward_io.png
"""
import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402
from course_utils import fmt_count, format_table, save_figure  # noqa: E402

D = 64                   # 头维度
M_SRAM = 65536           # 片上能放的元素个数（FP16 时 128 KiB，和 A100 / H100 每个 SM 的共享内存同一量级）


def qkv(rng, N, Nk, d, dv):
    return rng.standard_normal((N, d)), rng.standard_normal((Nk, d)), rng.standard_normal((Nk, dv))


def correctness(rng):
    rows = []
    for N, Nk, d, dv, Br, Bc in ((100, 100, 16, 16, 16, 24), (37, 91, 8, 5, 10, 7), (64, 40, 12, 12, 9, 13)):
        Q, K, V = qkv(rng, N, Nk, d, dv)
        for causal in (False, True):
            O_ref, _, io_std = fl.standard_attention(Q, K, V, causal)
            L_ref = fl.reference_lse(Q, K, causal)
            fin = np.isfinite(L_ref)
            for order in fl.ORDERS:
                O, L, io = fl.flash_fwd(Q, K, V, Br, Bc, causal, order=order)
                err_o = np.abs(O - O_ref).max()
                err_l = np.abs(L[fin] - L_ref[fin]).max()
                assert err_o < 1e-12 and err_l < 1e-12 and np.array_equal(np.isfinite(L), fin)
                if not causal:
                    assert io.flops == io_std.flops
                rows.append([f"{N}×{Nk}, d={d}, dv={dv}", f"{Br}×{Bc}", causal, order, f"{err_o:.1e}",
                             f"{err_l:.1e}", f"{io.flops / io_std.flops:.2f}"])
    print(format_table(["Q×K 形状", "块 Br×Bc", "causal", "顺序", "O 的最大差", "L 的最大差",
                           "FLOPs / 标准"], rows))
    print("N = 64 > Nk = 40 且 causal 时，前 24 行没有可见 key：约定输出 0、L = −∞，标准写法和两种顺序一致。")


def loop_orders(rng, N):
    Q, K, V = qkv(rng, N, N, D, D)
    Br, Bc = fl.block_sizes(M_SRAM, D)
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)
    print(f"N = Nk = {N}，d = {D}，M = {M_SRAM} → block_sizes 给出 Br = {Br}、Bc = {Bc}；Tr = {Tr}，Tc = {Tc}")
    res = {order: fl.flash_fwd(Q, K, V, Br, Bc, order=order)[2] for order in fl.ORDERS}
    rows = []
    for what in ("Q", "K,V", "O", "l,m", "L"):
        cells = [what]
        for order in fl.ORDERS:
            book = res[order].notes.get(what, {"read": 0, "write": 0})
            cells += [f"{book['read']:,}", f"{book['write']:,}"]
        rows.append(cells)
    rows.append(["合计"] + [f"{x:,}" for o in fl.ORDERS for x in (res[o].read, res[o].write)])
    print(format_table(["数据", "fa1 读", "fa1 写", "fa2 读", "fa2 写"], rows))
    nd = N * D
    q1, o1 = res["fa1"].notes["Q"]["read"] / nd, res["fa1"].notes["O"]["write"] / nd
    kv2 = res["fa2"].notes["K,V"]["read"] / (2 * nd)
    print(f"fa1：Q 被读了 {q1:.0f} 遍（= Tc），O 被写了 {o1:.0f} 遍（Tc + 初始化 1 次）；"
          f"fa2：K、V 各被读了 {kv2:.0f} 遍（= Tr），Q 读 1 遍、O 写 1 遍。")
    assert q1 == Tc and o1 == Tc + 1 and kv2 == Tr
    print("fa2 的好处不只是读写：不同的 Q 块互不依赖，能分给不同的 SM；fa1 的顺序里所有 SM 都在改同一份 O。")


def io_vs_n(rng, Ns):
    Br, Bc = fl.block_sizes(M_SRAM, D)
    sq = math.ceil(M_SRAM / (4 * D))                          # fa2 的自然选择：Br = Bc = M/(4d)
    rows, curves = [], {"standard": [], "fa1": [], "fa2 (paper blocks)": [], f"fa2 (Br=Bc={sq})": []}
    for N in Ns:
        Q, K, V = qkv(rng, N, N, D, D)
        std = fl.standard_attention(Q, K, V)[2].total
        assert std == 2 * N * D + 4 * N * N + 2 * N * D       # (N + Nk)d + 4N·Nk + Nk·dv + N·dv，第 4 部分用它
        counts = [fl.flash_fwd(Q, K, V, Br, Bc, order="fa1")[2].total,
                  fl.flash_fwd(Q, K, V, Br, Bc, order="fa2")[2].total,
                  fl.flash_fwd(Q, K, V, sq, sq, order="fa2")[2].total]
        assert counts[0] == fl.fa_io_formula(N, D, M_SRAM, "fa1")
        assert counts[1] == fl.fa_io_formula(N, D, M_SRAM, "fa2")
        assert counts[2] == fl.fa_io_formula(N, D, M_SRAM, "fa2", Br=sq, Bc=sq)
        for key, val in zip(curves, [std] + counts):
            curves[key].append(val)
        rows.append([N, fmt_count(std), f"{4 * N * N / std:.0%}"] + [fmt_count(c) for c in counts]
                    + [f"{std / counts[0]:.1f}×", f"{std / counts[2]:.1f}×"])
    print(format_table(["N", "标准（元素）", "其中 N×N 项", "fa1（元素）", "fa2 论文块（元素）",
                           f"fa2 {sq}×{sq}（元素）", "标准/fa1", f"标准/fa2 {sq}"], rows))
    print("（元素个数；每个 flash 计数都已断言 = fa_io_formula。fa2 用论文的块时 Br = d = 64，K、V 要读 N/64 遍；"
          f"换成 Br = {sq} 就少 4 倍——FlashAttention-2 的实现正是用更大的 Br。）")
    big = Ns[-1]
    assert curves["standard"][-1] > 3 * curves["fa1"][-1] and curves["standard"][-1] > 5 * curves[
        f"fa2 (Br=Bc={sq})"][-1], big
    return curves


def io_vs_m(N, Ms):
    std = (2 * N) * D + 4 * N * N + 2 * N * D                 # 标准：(N + Nk)d + 4N·Nk + Nk·dv + N·dv
    rows, fa1 = [], []
    for M in Ms:
        Br, Bc = fl.block_sizes(M, D)
        io1 = fl.fa_io_formula(N, D, M, "fa1")
        fa1.append(io1)
        c = io1 * M / (N * N * D * D)
        rows.append([f"{M:,}", f"{Br}×{Bc}", math.ceil(N / Bc), fmt_count(std), fmt_count(io1), f"{c:.1f}",
                     f"{std / io1:.1f}×"])
    print(format_table(["M（元素）", "Br×Bc", "Tc", "标准（元素）", "fa1（元素）", "IO·M/(N²d²)", "标准/fa1"], rows))
    consts = [io * M / (N * N * D * D) for io, M in zip(fa1, Ms) if math.ceil(N / fl.block_sizes(M, D)[1]) >= 8]
    assert max(consts) / min(consts) < 1.5 and all(a > b for a, b in zip(fa1, fa1[1:]))
    print(f"Tc ≥ 8 时 IO·M/(N²d²) 在 {min(consts):.1f} 到 {max(consts):.1f} 之间：flash 的读写 = Θ(N²d²/M)，"
          "M 翻倍读写减半；标准写法和 M 无关。\n"
          "M 太小（块只有几行）时 flash 反而读写更多：每个 (i, j) 都要把 O_i 读写一遍。")
    return std, fa1


def causal_skipping(rng, N, blocks):
    Q, K, V = qkv(rng, N, N, D, D)
    rows = []
    for b in blocks:
        full = fl.flash_fwd(Q, K, V, b, b)[2]
        caus = fl.flash_fwd(Q, K, V, b, b, True)[2]
        T = math.ceil(N / b)
        live = int(fl.live_tiles(N, N, b, b).sum())           # 逐对查可见性，再按块取"任意一对"
        assert N % b == 0 and live == T * (T + 1) // 2        # 下三角加对角线
        # fa2 只有 K、V 的读取随块数变：每个活块读一块 K、V（b 行 × 2d）；Q 读一遍，O、L 写一遍
        kv_full, kv_caus = T * T * b * 2 * D, live * b * 2 * D
        assert full.notes["K,V"]["read"] == kv_full and caus.notes["K,V"]["read"] == kv_caus
        assert full.total - caus.total == kv_full - kv_caus
        assert caus.flops == live * 2 * b * b * 2 * D
        saved_io = (kv_full - kv_caus) / full.total
        rows.append([f"{b}×{b}", T * T, live, f"{1 - live / (T * T):.1%}", f"{saved_io:.1%}",
                     f"{(T - 1) / (2 * T):.1%}"])
    print(format_table(["块", "总块数", "活块（有可见对）", "省下的 FLOPs", "省下的读写", "(T−1)/2T"], rows))
    print("（活块是逐对查可见性数出来的；flash_fwd 的 K、V 读取 = 活块数 × b × 2d、FLOPs = 活块数 × 2b²·2d，都已断言。"
          "省下的读写比 FLOPs 少：Q 读一遍、O 写一遍是省不掉的。）")
    Q2 = Q[-N // 4:]                                          # N < Nk：前面有 3N/4 个缓存的 key（右下角对齐）
    f2, c2 = fl.flash_fwd(Q2, K, V, 32, 32)[2], fl.flash_fwd(Q2, K, V, 32, 32, True)[2]
    live2 = int(fl.live_tiles(len(Q2), N, 32, 32).sum())
    assert c2.flops == live2 * 2 * 32 * 32 * 2 * D and c2.notes["K,V"]["read"] == live2 * 32 * 2 * D
    print(f"N = {len(Q2)} 个 query、Nk = {N} 个 key（右下角对齐）：causal 只省 {1 - c2.flops / f2.flops:.1%} 的 FLOPs"
          "——被掩码的只有右上角的小三角。")


def plot(Ns, curves, N_m, Ms, std_m, fa1_m, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    from matplotlib.ticker import NullFormatter
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    for k, (label, ys) in enumerate(curves.items()):
        ax1.loglog(Ns, ys, "o-", color=f"C{k}", lw=2, label=label)
    # 只在测过的 N 上标刻度、写成普通整数；不显示次刻度的标签（否则 "3×10²4×10²" 挤在一起）
    ax1.set_xticks(Ns, [str(n) for n in Ns])
    ax1.xaxis.set_minor_formatter(NullFormatter())
    ax1.set_xlabel("sequence length N")
    ax1.set_ylabel("HBM reads + writes (elements)")
    ax1.set_title(f"IO vs N (d={D}, M={M_SRAM})")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    ax2.loglog(Ms, [std_m] * len(Ms), "-", color="C0", label="standard: Θ(Nd + N²)")
    ax2.loglog(Ms, fa1_m, "o-", color="C1", label="FlashAttention (fa1)")
    guide = [12 * N_m ** 2 * D ** 2 / M for M in Ms]
    ax2.loglog(Ms, guide, "--", color="0.5", label="12·N²d²/M")
    ax2.set_xlabel("on-chip memory M (elements)")
    ax2.set_ylabel("HBM reads + writes (elements)")
    ax2.annotate("FlashAttention IO ∝ N²d²/M:\nmore SRAM, less traffic", xy=(Ms[len(Ms) // 2], fa1_m[len(Ms) // 2]),
                 xytext=(Ms[len(Ms) // 2], std_m * 2), ha="center", arrowprops=dict(arrowstyle="->"))
    ax2.set_title(f"IO vs on-chip memory (N={N_m}, d={D})")
    ax2.legend()
    ax2.grid(True, which="both", alpha=0.3)
    return save_figure(fig, __file__, "io", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="FlashAttention 前向：循环顺序、IO 计数、causal 跳块")
    ap.add_argument("--quick", action="store_true", help="小规模：N 最大 1024")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"随机种子 seed = {args.seed}")
    Ns = (256, 512, 1024) if args.quick else (256, 512, 1024, 2048, 4096)

    print("\n== 1. 正确性：两种循环顺序 × causal × 不整除的形状 ==")
    correctness(rng)
    print("\n== 2. fa1 与 fa2：谁被读写了很多遍（元素个数）==")
    loop_orders(rng, 1024)
    print(f"\n== 3. 读写量随 N 增长（d = {D}，M = {M_SRAM}）==")
    curves = io_vs_n(rng, Ns)
    N_m = 4096
    Ms = [2 ** k for k in range(11, 21)]
    print(f"\n== 4. 读写量随片上存储 M 变化（公式，N = {N_m}，d = {D}）==")
    std_m, fa1_m = io_vs_m(N_m, Ms)
    print("\n== 5. causal：跳过整块看不见的 (i, j)（fa2，N = Nk = 1024）==")
    causal_skipping(rng, 1024, (32, 64, 128, 256) if args.quick else (16, 32, 64, 128, 256, 512))

    print("\n结论：FlashAttention 不减少 FLOPs，减少的是显存读写——N×N 的 S、P 不落地，读写从 Θ(Nd + N²) 降到 "
          "Θ(N²d²/M)；fa2 把 Q 块放在外层，既能并行又只写一次 O；causal 再省下约一半的块。")
    if not args.no_fig:
        path = plot(list(Ns), curves, N_m, Ms, std_m, fa1_m, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
