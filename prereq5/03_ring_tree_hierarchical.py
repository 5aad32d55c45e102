"""
预备课 5 · 演示 03：ring、tree、递归倍增、Rabenseifner、两级（hierarchical）all-reduce 的比较

你会看到……
  1. 先在模拟器上把每种 all-reduce 真跑一遍（P = 8 和非 2 的幂的 P = 6）：结果 = numpy；
     账本数出来的步数、关键路径字节数 = α-β 公式里的两个系数。
  2. 一台 8×H100（NVLink）上，消息从 1 kB 到 1 GB（十进制单位，与 fmt_bytes 一致），每种算法的时间和胜者：
     小消息时步数少的算法赢（递归倍增 lg P 步），大消息时字节少的算法赢（ring、Rabenseifner 约 2n），
     不分段的树每步都发整条消息，大消息时慢 lg P / ((P−1)/P) 倍。
  3. 多台机器（N 个节点 × 8 块 GPU，节点间每块 GPU 一张 400 Gb/s 网卡）：
     扁平单环（每一步都被网卡拖慢）、扁平 8 个并行环（每个环分 n/8，像 NCCL 的多通道；假设 NVLink 上的
     转发和网卡同时进行、不成为瓶颈）、两级算法。
     两级算法走网卡的步数只有 2(N−1)（扁平环 2(NG−1)），小消息快得多；
     但它的节点内阶段和节点间阶段是串行的，大消息时 8 个并行环反而更快——真实系统（NCCL）两种都用。
  4. 图：prereq5/figures/03_ring_tree_hierarchical_node.png、03_ring_tree_hierarchical_cluster.png

运行：python3 prereq5/03_ring_tree_hierarchical.py [--quick] [--nodes 4] [--seed 0]
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

AR_ALGOS = cs.ALGORITHMS["allreduce"]
# 节点间网络：每块 GPU 一张 NDR 400 Gb/s 网卡 = 50 GB/s 单向线速（实测 busbw 46–48 GB/s，[S69]）。
NIC_BW = 400e9 / 8
# 节点间每步延迟：NCCL 调优表里网络 ring 的每跳延迟，LL128 协议 4.0 µs（LL 2.7、Simple 14.0，[S71]）。
ALPHA_NET = 4.0e-6


def simulate_all(ps, rng):
    rows = []
    for p in ps:
        q = 1 << (p.bit_length() - 1)
        n = 3 * p * q                                    # 能被 P 和 q（不超过 P 的 2 的幂）整除：账本与公式逐项相等
        xs = [rng.standard_normal(n) for _ in range(p)]
        ref = np.sum(np.stack(xs), axis=0)               # [P, n] → [n]
        for algo in AR_ALGOS:
            outs, ledger = cs.SIMULATORS[("allreduce", algo)](xs)
            err = max(float(np.max(np.abs(o - ref))) for o in outs)
            model = cs.allreduce_terms(n * 8, p, algo)
            got = ledger.cost()
            ok = got.steps == model.steps and np.isclose(got.bytes, model.bytes)
            assert err < 1e-12 and ok, (p, algo, err, got, model)
            rows.append([p, algo, f"{err:.1e}", got.steps, model.steps, got.bytes, f"{model.bytes:.0f}",
                         f"{ledger.total_bytes() / (n * 8):.2f}"])
    print(format_table(["P", "算法", "误差", "账本步数", "公式步数", "账本字节", "公式字节", "全网字节/n"], rows,
                          [">", "<"] + [">"] * 6))
    print("'账本字节' = Σ 每步最大的消息（关键路径）；'全网字节/n' = 所有链路加起来搬了几份 n。")


def node_comparison(sizes, p, alpha, bw):
    times = {a: cs.allreduce_time(sizes, p, alpha, 1 / bw, a) for a in AR_ALGOS}
    rows = []
    winners = []
    for i, n in enumerate(sizes):
        best = min(AR_ALGOS, key=lambda a: times[a][i])
        winners.append(best)
        rows.append([fmt_bytes(n)] + [fmt_time(times[a][i]) for a in AR_ALGOS] + [best])
    print(format_table(["消息"] + list(AR_ALGOS) + ["最快"], rows))
    # 小消息：步数最少的递归倍增赢；大消息：ring 与 Rabenseifner 字节相同（2(P−1)/P·n），Rabenseifner 步数少一点
    assert winners[0] == "rec_doubling"
    assert winners[-1] == "rabenseifner" and times["ring"][-1] / times["rabenseifner"][-1] < 1.01
    lgp = int(np.log2(p))
    ratio = times["tree"][-1] / times["ring"][-1]
    expect = lgp / ((p - 1) / p)
    print(f"\n{fmt_bytes(sizes[-1])} 时 tree / ring = {ratio:.2f}，公式 lg P / ((P−1)/P) = {expect:.2f}："
          "不分段的树每一步都发整条消息。")
    assert abs(ratio / expect - 1) < 0.01
    print("在纯 α-β 模型里 Rabenseifner 总不比 ring 慢。NCCL 仍以 ring 为主（加上分段流水的双二叉树、NVLS）：\n"
          "ring 每步只和固定的邻居通信，能切成很多小段流水、贴合任何拓扑；递归减半的伙伴距离 P/2、P/4 …，\n"
          "在非全连接的网络上会争抢同一段链路——这是模型里没有的代价（拥塞）。")
    return times


def cluster_times(sizes, n_nodes, g, alpha_i, bw_i, alpha_e, bw_e):
    """n_nodes 个节点 × g GPU 上 all-reduce 的三种做法的时间（秒）：(扁平单环, 扁平 g 环, 两级)。"""
    p = n_nodes * g
    flat1 = cs.allreduce_time(sizes, p, alpha_e, 1 / bw_e)               # 单环：每一步都要等最慢的链路（网卡）
    flatg = cs.allreduce_time(sizes / g, p, alpha_e, 1 / bw_e)           # g 个环并行，各分 n/g，各用一张网卡
    hier = cs.hierarchical_allreduce_time(sizes, n_nodes, g, alpha_i, 1 / bw_i, alpha_e, 1 / bw_e)
    return flat1, flatg, hier


def cluster_comparison(sizes, n_nodes, g, alpha_i, bw_i, alpha_e, bw_e):
    p = n_nodes * g
    flat1, flatg, hier = cluster_times(sizes, n_nodes, g, alpha_i, bw_i, alpha_e, bw_e)
    rows = [[fmt_bytes(n), fmt_time(a), fmt_time(b), fmt_time(c), "两级" if c < b else f"{g} 环"]
            for n, a, b, c in zip(sizes, flat1, flatg, hier)]
    print(format_table(["消息", "扁平单环", f"扁平 {g} 环", "两级", "更快"], rows))
    assert np.all(hier < flat1), "两级算法的 α 项和 β 项都比扁平单环小"
    assert hier[0] < flatg[0], "小消息：两级算法走网卡的步数少得多"
    # 交叉点：两条直线 t = a + b·n 的交点（各自的 α 项和 β 项系数）
    t = cs.hierarchical_allreduce_terms(1.0, n_nodes, g)
    a_h = t["intra"].steps * alpha_i + t["inter"].steps * alpha_e
    b_h = t["intra"].bytes / bw_i + t["inter"].bytes / bw_e
    c = cs.allreduce_terms(1.0 / g, p)
    a_f, b_f = c.steps * alpha_e, c.bytes / bw_e
    if b_f < b_h:
        n_cross = (a_f - a_h) / (b_h - b_f)
        print(f"\n消息大于 {fmt_bytes(n_cross)} 时扁平 {g} 环更快：两级算法的节点内 RS/AG 和节点间阶段串行，"
              f"而 {g} 个环同时用着 NVLink 和网卡。")
        assert np.all((hier < flatg) == (sizes < n_cross))
    # 经网卡的字节，同类相比：扁平单环只有每个节点的"边界" GPU 的网卡在发（N 张），其余闲着；
    # g 个并行环每个节点用 g 张网卡、各发 n/g 的环流量；两级算法每块 GPU 的网卡都在发。
    net_flat = cs.allreduce_terms(1.0, p).bytes                 # 扁平单环：一张边界网卡发的字节 / n
    net_flatg = net_flat / g                                     # g 个环：每张网卡
    net_hier = t["inter"].bytes                                  # 两级：每张网卡
    rows = [["扁平单环", n_nodes, f"{net_flat:.3f}", f"{n_nodes * net_flat:.2f}", 2 * (p - 1)],
            [f"扁平 {g} 环", n_nodes * g, f"{net_flatg:.3f}", f"{n_nodes * g * net_flatg:.2f}", 2 * (p - 1)],
            ["两级", p, f"{net_hier:.3f}", f"{p * net_hier:.2f}", t["inter"].steps]]
    print("\n经网卡发出的字节（÷ n），同类相比：")
    print(format_table(["做法", "在用的网卡", "最忙的一张网卡", "所有网卡合计", "走网卡的步数"], rows))
    print(f"→ 最忙的网卡：两级比扁平单环少 {net_flat / net_hier:.1f} 倍——主要因为流量摊到了每个节点的 {g} 张网卡上"
          f"（扁平单环每个节点只有 1 张在用）；所有网卡合计只少 {net_flat / (g * net_hier):.2f} 倍"
          f"（{n_nodes * net_flat:.2f}n vs {p * net_hier:.2f}n）。和扁平 {g} 环比，两级每张网卡少发 "
          f"{net_flatg / net_hier:.2f} 倍，走网卡的步数少得多（{t['inter'].steps} vs {2 * (p - 1)}）。")
    assert net_hier < net_flat / g and abs(n_nodes * net_flat - n_nodes * g * net_flatg) < 1e-12
    return flat1, flatg, hier


def simulate_hierarchical(n_nodes, g, rng):
    p = n_nodes * g
    n = 5 * p
    xs = [rng.standard_normal(n) for _ in range(p)]
    outs, ledger = cs.hierarchical_all_reduce(xs, g)
    err = max(float(np.max(np.abs(o - np.sum(np.stack(xs), axis=0)))) for o in outs)
    terms = cs.hierarchical_allreduce_terms(n * 8, n_nodes, g)
    rows = []
    for kind in ("intra", "inter"):
        got = ledger.cost(kind)
        assert got.steps == terms[kind].steps and np.isclose(got.bytes, terms[kind].bytes)
        rows.append([kind, got.steps, terms[kind].steps, got.bytes, f"{terms[kind].bytes:.0f}"])
    assert err < 1e-12
    print(f"模拟两级 all-reduce（{n_nodes} 节点 × {g} GPU，n = {n}）：误差 {err:.1e}")
    print(format_table(["链路", "账本步数", "公式步数", "账本字节", "公式字节"], rows))


def plot(sizes, times, cluster, n_nodes, g, alpha, bw, quick=False):
    from course_utils import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for a in AR_ALGOS:
        ax.loglog(sizes, times[a], label=a)
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("time (s)")
    ax.set_title(f"All-reduce on 8 GPUs (NVLink {bw / 1e9:g} GB/s, α {alpha * 1e6:g} µs)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    print(f"图已保存：{save_figure(fig, __file__, 'node', dpi=110, quick=quick)}")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, t in zip(("flat ring (1 ring)", f"flat ring ({g} rings, n/{g} each)", "hierarchical"), cluster):
        ax.loglog(sizes, t, label=label)
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("time (s)")
    ax.set_title(f"All-reduce on {n_nodes} nodes x {g} GPUs (NIC {NIC_BW / 1e9:g} GB/s per GPU)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    print(f"图已保存：{save_figure(fig, __file__, 'cluster', dpi=110, quick=quick)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--quick", action="store_true", help="少几个消息大小（check-all 用）")
    ap.add_argument("--nodes", type=int, default=4, help="节点数（默认 4，每个节点 8 块 GPU）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.nodes < 2:
        raise SystemExit(f"--nodes 必须 ≥ 2，收到 {args.nodes}")
    print(f"随机种子 seed = {args.seed}")
    rng = np.random.default_rng(args.seed)
    alpha, bw, g = cs.DEFAULT_ALPHA, H100_SXM.link_bw, 8

    print("== 1. 模拟器上的 all-reduce：结果 = numpy，账本 = 公式 ==")
    simulate_all((6, 8), rng)

    print(f"\n== 2. 一台 8×H100：α = {alpha * 1e6:g} µs，B = {bw / 1e9:g} GB/s ==")
    sizes = np.logspace(3, 9, 7 if args.quick else 13)
    node_comparison(sizes, 8, alpha, bw)

    print(f"\n== 3. {args.nodes} 个节点 × {g} GPU：节点内 NVLink（α {alpha * 1e6:g} µs，{bw / 1e9:g} GB/s），"
          f"节点间网卡（α {ALPHA_NET * 1e6:g} µs，{NIC_BW / 1e9:g} GB/s / GPU）==")
    simulate_hierarchical(min(args.nodes, 3), 4, rng)       # 小规模模拟（对账），大规模只用公式
    print()
    cluster_comparison(sizes, args.nodes, g, alpha, bw, ALPHA_NET, NIC_BW)

    fine = np.logspace(3, 10, 40 if args.quick else 120)
    node_t = {a: cs.allreduce_time(fine, 8, alpha, 1 / bw, a) for a in AR_ALGOS}
    cl = cluster_times(fine, args.nodes, g, alpha, bw, ALPHA_NET, NIC_BW)
    plot(fine, node_t, cl, args.nodes, g, alpha, bw, quick=args.quick)


if __name__ == "__main__":
    main()
