"""
第 11 讲 · 演示 3：FlashAttention 反向——宁可多算一次 QKᵀ，也不存 N×N 的 P

你会看到：
    1. flash_bwd（只用前向存下的每行 log-sum-exp L，片上重算 P）和标准反向（读存下的 P）一致到 1e-12，
       也和有限差分一致；包括 N ≠ Nk、causal、没有可见 key 的行（梯度为 0）。
    2. FLOPs：标准反向 4 次矩阵乘法 = 前向的 2 倍；flash 反向 5 次 = 前向的 2.5 倍（"2.5× 规则"）。
       前向 + 反向：标准 3×、flash 3.5×——flash 多算了约 17%。
    3. 读写和前后向之间要存的东西：标准写法存 N×Nk 的 P、反向再读写 5 + 2 遍 N×Nk；flash 只存 N 个数。
    4. 按 roofline 估一个头的下界时间：标准写法受带宽限制，flash 多出的 FLOPs 换来的是更短的时间。

运行：python3 lecture11/03_flash_backward.py [--quick] [--seed 0]
图：lecture11/figures/03_flash_backward_cost.png
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402
from course_utils import fmt_count, format_table, save_figure  # noqa: E402

D = 64          # 头维度（d = dv）
BLOCK = 128     # flash 的块大小 Br = Bc（FlashAttention-2 的常见取值）
ELEM = 2        # BF16 每个元素的字节数


def finite_difference(Q, K, V, dO, causal, which, idx, eps=1e-6):
    """loss = Σ O ∘ dO 对 (Q, K, V)[which][idx] 的中心差分。"""
    vals = []
    for sign in (1, -1):
        args = [Q.copy(), K.copy(), V.copy()]
        args[which][idx] += sign * eps
        vals.append(np.sum(fl.standard_attention(*args, causal=causal)[0] * dO))
    return (vals[0] - vals[1]) / (2 * eps)


def correctness(rng, n_fd):
    rows = []
    for N, Nk, d, dv, Br, Bc in ((48, 48, 8, 8, 16, 16), (21, 50, 6, 4, 8, 11), (30, 19, 5, 7, 7, 6)):
        Q, K, V = rng.standard_normal((N, d)), rng.standard_normal((Nk, d)), rng.standard_normal((Nk, dv))
        dO = rng.standard_normal((N, dv))
        for causal in (False, True):
            _, P, _ = fl.standard_attention(Q, K, V, causal)
            ref = fl.standard_attention_bwd(Q, K, V, P, dO)[:3]
            O, L, _ = fl.flash_fwd(Q, K, V, Br, Bc, causal)
            got = fl.flash_bwd(Q, K, V, O, dO, L, Br, Bc, causal)[:3]
            errs = [np.abs(g - r).max() for g, r in zip(got, ref)]
            fd = 0.0
            for _ in range(n_fd):
                which = int(rng.integers(3))
                X = (Q, K, V)[which]
                idx = tuple(int(rng.integers(s)) for s in X.shape)
                fd = max(fd, abs(finite_difference(Q, K, V, dO, causal, which, idx) - got[which][idx]))
            assert max(errs) < 1e-12 and fd < 1e-7, (N, Nk, causal, errs, fd)
            empty = max(0, N - Nk) if causal else 0
            assert np.all(got[0][:empty] == 0)
            rows.append([f"{N}×{Nk}, d={d}, dv={dv}", f"{Br}×{Bc}", causal, empty] + [f"{e:.1e}" for e in errs]
                        + [f"{fd:.1e}"])
    print(format_table(["Q×K 形状", "块", "causal", "空行数", "|dQ 差|", "|dK 差|", "|dV 差|",
                           f"有限差分（{n_fd} 个元素）"], rows))


def costs(rng, Ns):
    """每个 N 实际跑一遍标准 / flash 的前向和反向，收集 FLOPs 和读写计数。"""
    out = []
    for N in Ns:
        Q, K, V, dO = (rng.standard_normal((N, D)) for _ in range(4))
        _, P, f_std = fl.standard_attention(Q, K, V)
        b_std = fl.standard_attention_bwd(Q, K, V, P, dO)[3]
        O, L, f_fl = fl.flash_fwd(Q, K, V, BLOCK, BLOCK)
        b_fl = fl.flash_bwd(Q, K, V, O, dO, L, BLOCK, BLOCK)[3]
        out.append((N, f_std, b_std, f_fl, b_fl, P.size, L.size))
    return out


def print_costs(res):
    rows = []
    for N, f_std, b_std, f_fl, b_fl, saved_std, saved_fl in res:
        assert f_fl.flops == f_std.flops
        assert 2 * b_std.flops == 4 * f_std.flops and 2 * b_fl.flops == 5 * f_fl.flops   # 2× 与 2.5×
        assert b_fl.total < b_std.total and saved_fl * N == saved_std                     # 存 N 个数 vs N² 个
        rows.append([N, f"{f_std.flops / 1e9:.2f}", f"{b_std.flops / f_std.flops:.1f}×",
                     f"{b_fl.flops / f_fl.flops:.1f}×", fmt_count(b_std.total), fmt_count(b_fl.total),
                     f"{b_std.total / b_fl.total:.1f}×", f"{saved_std:,}", f"{saved_fl:,}"])
    print(format_table(["N", "前向 GFLOPs", "标准反向/前向", "flash 反向/前向", "标准反向读写（元素）",
                           "flash 反向读写（元素）", "读写之比", "标准存 P（元素）", "flash 存 L（元素）"], rows))
    N, f_std, b_std, f_fl, b_fl, *_ = res[-1]
    total_fl, total_std = (f_fl.flops + b_fl.flops) / f_fl.flops, (f_std.flops + b_std.flops) / f_std.flops
    print(f"flash 反向 5 次矩阵乘法（比标准多一次 QKᵀ 重算）：前向 + 反向 = {total_fl:.1f}× 前向，"
          f"标准是 {total_std:.1f}×。")
    print(f"标准反向按内核分账（N = {N}，读 + 写）："
          + "，".join(f"{k} {v['read'] + v['write']:,}" for k, v in b_std.notes.items()))


def roofline(res, gpus):
    """一个头、前向 + 反向的下界时间：max(FLOPs / 峰值, 字节 / 带宽)。"""
    N, f_std, b_std, f_fl, b_fl, *_ = res[-1]
    rows = []
    for g in gpus:
        bound = {}
        for name, flops, elems in (("标准", f_std.flops + b_std.flops, f_std.total + b_std.total),
                                   ("flash", f_fl.flops + b_fl.flops, f_fl.total + b_fl.total)):
            t_c, t_m = flops / g.tc_flops, elems * ELEM / g.hbm
            bound[name] = (max(t_c, t_m), t_c > t_m)
            rows.append([g.name, name, f"{flops / 1e9:.2f}", f"{elems * ELEM / 1e6:.2f}", f"{t_c * 1e6:.2f}",
                         f"{t_m * 1e6:.2f}", f"{max(t_c, t_m) * 1e6:.2f}", "算力" if t_c > t_m else "带宽"])
        assert bound["flash"][0] < bound["标准"][0] and not bound["标准"][1], g.name   # flash 更快；标准受带宽限制
    heads = ["GPU", "写法", "GFLOPs", "读写 MB", "算力下界 µs", "带宽下界 µs", "下界 µs", "受限于"]
    print(format_table(heads, rows))
    print(f"（N = {N}、d = {D}、BF16、一个头；峰值取稠密 Tensor Core 与显存带宽，见 flash_lab.DecodeGPU。"
          "真实内核达不到峰值，但结论一样：标准写法被 N×N 的读写拖住。）")


def plot(res, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    from matplotlib.ticker import NullFormatter
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 6))
    labels = ["std fwd", "std bwd", "flash fwd", "flash bwd"]
    N, f_std, b_std, f_fl, b_fl, *_ = res[-1]
    vals = [1.0, b_std.flops / f_std.flops, 1.0, b_fl.flops / f_fl.flops]
    ax1.bar(labels, vals, color=["C0", "C0", "C1", "C1"])
    for k, v in enumerate(vals):
        ax1.text(k, v + 0.03, f"{v:.1f}×", ha="center")
    ax1.set_ylim(0, 1.15 * max(vals))
    ax1.set_ylabel("matmul FLOPs / forward FLOPs")
    ax1.set_title("Backward: 4 matmuls (std) vs 5 (flash recomputes S)")
    Ns = [r[0] for r in res]
    ax2.loglog(Ns, [r[2].total for r in res], "o-", color="C0", label="standard backward")
    ax2.loglog(Ns, [r[4].total for r in res], "o-", color="C1", label=f"flash backward (blocks {BLOCK})")
    ax2.loglog(Ns, [r[5] for r in res], "s--", color="C0", alpha=0.5, label="saved for bwd: P (N²)")
    ax2.loglog(Ns, [r[6] for r in res], "s--", color="C1", alpha=0.5, label="saved for bwd: L (N)")
    ax2.set_xticks(Ns, [str(n) for n in Ns])              # 只标测过的 N，普通整数（避免 "3×10²4×10²" 挤在一起）
    ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel("sequence length N")
    ax2.set_ylabel("HBM reads + writes (elements)")
    ax2.set_title(f"Backward HBM reads + writes (d={D})")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax2.grid(True, which="both", alpha=0.3)
    return save_figure(fig, __file__, "cost", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="FlashAttention 反向：重算、2.5× 规则、读写")
    ap.add_argument("--quick", action="store_true", help="小规模：N 最大 1024、少做几次有限差分")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"随机种子 seed = {args.seed}")

    print("\n== 1. 正确性：flash_bwd vs 标准反向 vs 有限差分 ==")
    correctness(rng, 4 if args.quick else 12)
    Ns = (256, 512, 1024) if args.quick else (256, 512, 1024, 2048)
    print(f"\n== 2. FLOPs 与读写（d = dv = {D}，flash 块 {BLOCK}×{BLOCK}，不带 causal）==")
    res = costs(rng, Ns)
    print_costs(res)
    print("\n== 3. roofline 下界：一个头的前向 + 反向 ==")
    roofline(res, (fl.A100_DEC, fl.H100_DEC, fl.H200_DEC))

    print("\n结论：反向用 L 重算 P，多 25% 的反向 FLOPs（2.5× 而不是 2×），换来前后向之间只存 N 个数、"
          "反向读写少几倍；在带宽受限的区间，这笔交换让时间更短。")
    if not args.no_fig:
        path = plot(res, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
