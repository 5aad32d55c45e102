"""
预备课 5 · 演示 02：α-β 模型、algbw / busbw，以及"延迟不再主导"的消息大小 n*

你会看到……
  1. 8 块 H100 上 ring all-reduce 的时间 = α 项 2(P−1)·α + β 项 2(P−1)/P·n/B，消息从 1 kB 到 1 GB
     （十进制单位：1 kB = 10³ B，1 GB = 10⁹ B，与 fmt_bytes 一致）：
     小消息几乎全是延迟，大消息几乎全是带宽；algbw 和 busbw（nccl-tests 的定义）随大小怎样变化。
  2. 交叉点 n*（α 项 = β 项）：ring all-reduce 的 n* = P·α·B，随 P 线性增长；在 n* 处 busbw 恰好是链路带宽的一半。
  3. 各种集合通信 / 算法的 n*：步数少的算法（树、递归倍增）交叉点小得多。
  4. α 从哪里来：NCCL 调优代码里的延迟常数[S71]，和本模块 DEFAULT_ALPHA 的比较。
  5. 两张图：prereq5/figures/02_alpha_beta_crossover_time.png（时间分解）、
     prereq5/figures/02_alpha_beta_crossover_busbw.png（busbw / 链路带宽 随消息大小，P = 2、8、64）。

运行：python3 prereq5/02_alpha_beta_crossover.py [--quick]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
import comm_sim as cs  # noqa: E402
from hw_specs import H100_SXM  # noqa: E402
from course_utils import fmt_bytes, fmt_time, format_table, save_figure  # noqa: E402

MEASURED_RING_BUSBW = 370e9     # NCCL 维护者：8×H100 ring 实测 busbw ≈ 370 GB/s（线速 450 的约 80%）[S40]


def size_table(sizes, p, alpha, bw):
    terms = cs.allreduce_terms(sizes, p)                     # Cost(steps, bytes)，bytes 是数组
    t_alpha = np.full_like(sizes, terms.steps * alpha)
    t_beta = terms.bytes / bw
    total = cs.allreduce_time(sizes, p, alpha, 1 / bw)
    assert np.allclose(total, t_alpha + t_beta, rtol=1e-12)
    rows = []
    for n, ta, tb, t in zip(sizes, t_alpha, t_beta, total):
        alg, bus = cs.algbw(n, t), cs.busbw("allreduce", n, t, p)
        rows.append([fmt_bytes(n), fmt_time(ta), fmt_time(tb), fmt_time(t), f"{alg / 1e9:.1f}", f"{bus / 1e9:.1f}",
                     "延迟" if ta > tb else "带宽"])
    print(format_table(["消息 n", "α 项", "β 项", "总时间", "algbw GB/s", "busbw GB/s", "谁主导"], rows))
    return total


def crossover_checks(p, alpha, bw):
    ns = cs.crossover_bytes("allreduce", p, alpha, 1 / bw)
    print(f"\n交叉点 n* = {fmt_bytes(ns)}（= P·α·B = {p} × {alpha * 1e6:g} µs × {bw / 1e9:g} GB/s）")
    assert np.isclose(ns, p * alpha * bw), "ring all-reduce：2(P−1)α = 2(P−1)/P · n/B  ⇒  n* = P·α·B"
    t = cs.allreduce_time(ns, p, alpha, 1 / bw)
    bus = cs.busbw("allreduce", ns, t, p)
    print(f"n* 处：总时间 {fmt_time(t)}，busbw = {bus / 1e9:.1f} GB/s = 链路带宽的 {bus / bw:.3f}")
    assert np.isclose(bus, bw / 2), "n* 处 α 项 = β 项，所以 busbw 恰好是链路带宽的一半"
    big = 1000 * ns
    frac = cs.busbw("allreduce", big, cs.allreduce_time(big, p, alpha, 1 / bw), p) / bw
    print(f"1000·n* = {fmt_bytes(big)} 时 busbw / B = {frac:.4f}：busbw 趋于链路带宽（与 P 无关），这就是 busbw 的用处")
    assert frac > 0.998
    return ns


def crossover_table(ps, alpha, bw):
    combos = [("allreduce", "ring"), ("allreduce", "rabenseifner"), ("allreduce", "tree"),
              ("allreduce", "rec_doubling"), ("allgather", "ring"), ("reduce_scatter", "ring"),
              ("broadcast", "tree"), ("broadcast", "scatter_allgather"), ("alltoall", "pairwise")]
    rows = []
    for coll, algo in combos:
        vals = []
        for p in ps:
            c = cs.cost_terms(coll, 1.0, p, algo)
            vals.append(fmt_bytes(cs.crossover_bytes(coll, p, alpha, 1 / bw, algo)))
            assert c.steps > 0 and c.bytes > 0
        rows.append([f"{coll} / {algo}"] + vals)
    print(format_table(["集合通信 / 算法"] + [f"P={p}" for p in ps], rows))
    ring = [cs.crossover_bytes("allreduce", p, alpha, 1 / bw) for p in ps]
    rab = [cs.crossover_bytes("allreduce", p, alpha, 1 / bw, "rabenseifner") for p in ps]
    assert all(np.isclose(r, p * alpha * bw) for r, p in zip(ring, ps)), "ring：n* ∝ P"
    assert all(b < a for a, b, p in zip(ring, rab, ps) if p > 2), "Rabenseifner 步数更少（P > 2 时），交叉点更早"
    print("ring 的 n* 随 P 线性增长（步数 2(P−1)）；Rabenseifner 只随 lg P 增长；树的每步都发整条消息，n* 最小。")


def nccl_latency_table(ps, alpha):
    rows = []
    for p in ps:
        row = [p]
        for proto in cs.NCCL_RING_BASE_US:
            row.append(f"{cs.nccl_ring_latency(p, proto) * 1e6:.1f}")
        row.append(f"{cs.nccl_ring_latency(p, 'LL') / (2 * (p - 1)) * 1e6:.2f}")
        row.append(f"{2 * (p - 1) * alpha * 1e6:.1f}")
        rows.append(row)
    print(format_table(["P", "LL µs", "LL128 µs", "Simple µs", "LL 每步 µs", "本模块 2(P−1)α µs"], rows,
                          [">"] * 6))
    print("NCCL 的模型 = baseLat + 2(P−1)·hopLat（NVLink、ring；[S71]）。本模块没有 baseLat，"
          f"DEFAULT_ALPHA = {cs.DEFAULT_ALPHA * 1e6:g} µs/步 取自 P = 8、LL 协议的平均值：P 小时偏乐观。")
    assert abs(cs.nccl_ring_latency(8, "LL") / 14 / cs.DEFAULT_ALPHA - 1) < 0.2


def plot_time(sizes, p, alpha, bw, ns, plt, quick=False):
    terms = cs.allreduce_terms(sizes, p)
    fig, ax = plt.subplots(figsize=(10, 6))
    ax.loglog(sizes, np.full_like(sizes, terms.steps * alpha), "--", label=r"$\alpha$ term: 2(P-1)$\alpha$")
    ax.loglog(sizes, terms.bytes / bw, "--", label=r"$\beta$ term: 2(P-1)/P $\cdot$ n / B")
    ax.loglog(sizes, cs.allreduce_time(sizes, p, alpha, 1 / bw), "k-", lw=2, label="total")
    ax.axvline(ns, color="gray", lw=1)
    ax.text(ns * 1.1, terms.steps * alpha * 0.3, f"n* = {fmt_bytes(ns)}", color="gray")
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("time (s)")
    ax.set_title(f"Ring all-reduce, P={p}, α={alpha * 1e6:g} µs, B={bw / 1e9:g} GB/s")
    ax.legend()
    ax.grid(True, which="major", alpha=0.3)
    print(f"图已保存：{save_figure(fig, __file__, 'time', dpi=110, quick=quick)}")


def plot_busbw(sizes, alpha, bw, plt, quick=False):
    fig, ax = plt.subplots(figsize=(10, 6.5))
    for p in (2, 8, 64):
        t = cs.allreduce_time(sizes, p, alpha, 1 / bw)
        ax.semilogx(sizes, cs.busbw("allreduce", sizes, t, p) / bw, lw=2, label=f"ring, P={p}")
    ax.axhline(MEASURED_RING_BUSBW / bw, color="gray", ls=":", lw=1.5, label="NCCL ring measured, 8×H100 (~370/450)")
    ax.axhline(0.5, color="gray", lw=0.8)
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("busbw / link bandwidth")
    ax.set_title("busbw reaches 1/2 of link bandwidth at n* = P·α·B")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)     # 图下：不挡曲线和参考线
    ax.grid(True, alpha=0.3)
    print(f"图已保存：{save_figure(fig, __file__, 'busbw', dpi=110, quick=quick)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--quick", action="store_true", help="少几个消息大小（check-all 用）")
    ap.add_argument("--p", type=int, default=8, help="设备数（默认 8：一台 HGX H100）")
    args = ap.parse_args()
    if args.p < 2:
        raise SystemExit(f"--p 必须 ≥ 2（1 个设备没有通信），收到 {args.p}")
    p, alpha, bw = args.p, cs.DEFAULT_ALPHA, H100_SXM.link_bw
    print(f"设定：P = {p}，α = DEFAULT_ALPHA = {alpha * 1e6:g} µs，B = H100 NVLink 单向 {bw / 1e9:g} GB/s "
          f"（hw_specs.H100_SXM.link_bw）")

    print("\n== 1. ring all-reduce 的时间分解 ==")
    sizes = np.logspace(3, 9, 7 if args.quick else 13)      # 1 kB … 1 GB（十进制）
    total = size_table(sizes, p, alpha, bw)
    assert np.all(np.diff(total) > 0)

    print("\n== 2. 交叉点 n* ==")
    ns = crossover_checks(p, alpha, bw)

    print(f"\n== 3. 各集合通信 / 算法的 n*（α = DEFAULT_ALPHA，B = {bw / 1e9:g} GB/s）==")
    crossover_table((2, 8, 64) if args.quick else (2, 4, 8, 16, 64, 256), alpha, bw)

    print("\n== 4. α 从哪里来：NCCL 的延迟常数 ==")
    nccl_latency_table((2, 4, 8), alpha)
    print(f"实测（[S40]）：8×H100 ring 的大消息 busbw ≈ {MEASURED_RING_BUSBW / 1e9:.0f} GB/s，"
          f"是线速的 {MEASURED_RING_BUSBW / bw:.0%}（协议开销）；NVLS（交换机内归约）能到 ≈ 480 GB/s。"
          "本模块的模型按线速算，想贴近实测就把带宽乘 0.8。")

    from course_utils import pyplot
    plt = pyplot()
    fine = np.logspace(2, 10, 60 if args.quick else 200)
    plot_time(fine, p, alpha, bw, ns, plt, quick=args.quick)
    plot_busbw(fine, alpha, bw, plt, quick=args.quick)


if __name__ == "__main__":
    main()
