"""
第 18 讲 · 演示 5：从一块设备到很多块——同样的合并，分给 P 块"设备"（通往第 19 讲的环形注意力）

你会看到：
    1. K、V 切给 P 块设备，每块设备对全部 query 算一个局部状态 (m, ℓ, o)，再按链式（P − 1 步）、
       树形（⌈log₂P⌉ 层，像 all-reduce）或随机顺序合并：结果都等于一块设备上的整段注意力。causal 时
       有的设备对某些行"一个 key 也看不见"，它们的状态是 (−∞, 0, 0)，合并时自然消失。
    2. 环形注意力的排程：每块设备留着自己那段 Q，K、V 沿环传 P 轮，每轮用手上的 K、V 块更新自己的状态。
       连续切分（contiguous）时，causal 让前面的设备大多在等（整块在未来，直接跳过）；
       条带切分（striped [S97]，token t 给设备 t mod P）每轮的工作量几乎一样——代价是出现整行被掩码的块，
       这正是 block_state 必须给出 (−∞, 0, 0) 而不是 NaN 的原因。完整的模拟（带传输账本）在第 19 讲的 long_lab。
    3. 每块设备的激活：按 Ring Attention 论文表 1，只存 6 个 [c, h] 的块（c = s / P），和总长 s 无关。

运行：python3 lecture18/05_many_devices.py [--quick] [--seed 0]
图：lecture18/figures/05_many_devices_work.png
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

LAYOUTS = ("contiguous", "striped")


def kv_split(gen, rng, Ps, N):
    """第 1 部分：K、V 切给 P 块设备，各种合并树。"""
    q, k, v = (torch.randn(2, 4, N, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    rows = []
    for causal in (False, True):
        ref = fl.vanilla_attention(q, k, v, causal)
        for P in Ps:
            states, _ = fl.kv_split_states(q, k, v, P, causal)
            empty = sum(int(torch.isneginf(m).sum()) for m, _, _ in states)
            for name, tree in (("chain", fl.chain_tree(P)), ("pairwise tree", fl.pair_tree(P)),
                               ("random tree", fl.random_tree(P, rng))):
                err = (fl.finalize(fl.merge_tree(states, tree))[0] - ref).abs().max().item()
                assert err < 1e-12
                rows.append([causal, P, name, fl.tree_depth(tree), empty, f"{err:.1e}"])
    print(fl.format_table(["causal", "P", "合并树", "层数", "状态为 (−∞, 0, 0) 的行", "和整段注意力的最大差"],
                          rows))
    print(f"（2 × 4 个头、N = Nk = {N}、d = 32、float64；每块设备对全部 {N} 个 query 各有一个状态；"
          "\"状态为 (−∞, 0, 0) 的行\"数的是所有设备、所有头上一个 key 也看不见的行）")


def ring(q, k, v, P, layout, causal=True):
    """
    环形注意力的最小模拟：设备 r 留着自己的 Q_r，第 t 轮手上是 K、V 的第 (r − t) mod P 段。
    返回 (O, work, empty_rows)：work[t][r] = 第 t 轮设备 r 真正算的 (q, k) 对数（整块在未来就跳过，记 0）；
    empty_rows = 算了的块里整行被掩码的行数（这些行的状态是 (−∞, 0, 0)）。
    """
    N, d = q.shape[-2], q.shape[-1]
    idx = [torch.arange(r * N // P, (r + 1) * N // P) if layout == "contiguous" else torch.arange(r, N, P)
           for r in range(P)]
    acc = [None] * P
    work, empty_rows = [], 0
    for t in range(P):
        row = []
        for r in range(P):
            qi, kj = idx[r], idx[(r - t) % P]
            visible = kj[None, :] <= qi[:, None] if causal else torch.ones(len(qi), len(kj), dtype=torch.bool)
            row.append(int(visible.sum()))
            if not visible.any():
                continue                                      # 整块在未来：不算，也不用合并
            empty_rows += int((~visible.any(dim=1)).sum())
            S = (q[..., qi, :] @ k[..., kj, :].transpose(-2, -1) / math.sqrt(d)).masked_fill(~visible, -math.inf)
            st = fl.block_state(S, v[..., kj, :])             # 条带布局里，有的行整行是 −∞ → (−∞, 0, 0)
            acc[r] = st if acc[r] is None else fl.merge_states(acc[r], st)
        work.append(row)
    O = torch.empty_like(q)
    for r in range(P):
        O[..., idx[r], :] = fl.finalize(acc[r])[0]
    return O, work, empty_rows


def ring_schedule(gen, P, N):
    """第 2 部分：两种切分的排程和工作量。"""
    q, k, v = (torch.randn(2, N, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    ref = fl.vanilla_attention(q, k, v, True)
    works, rows = {}, []
    for layout in LAYOUTS:
        O, work, empty = ring(q, k, v, P, layout)
        err = (O - ref).abs().max().item()
        assert err < 1e-12
        works[layout] = work
        total = sum(map(sum, work))
        critical = sum(max(r) for r in work)                  # 每轮等最慢的设备
        rows.append([layout, f"{err:.1e}", total, critical, f"{total / (P * critical):.0%}", empty])
        if layout == "striped":
            assert empty == P * (P - 1) // 2                  # K 段号 > Q 段号的块，各有一行整行被掩码
    print(fl.format_table(["切分", "和整段注意力的最大差", "总 (q, k) 对数", "Σ 每轮最慢设备的对数",
                           "设备利用率", "整行被掩码的行"], rows))
    for layout in LAYOUTS:
        grid = [[f"K{(r - t) % P}:{works[layout][t][r]}" if works[layout][t][r] else "skip" for t in range(P)]
                for r in range(P)]
        print(f"\n{layout}：设备 r 第 t 轮手上的 K/V 段和算的对数（skip = 整块在未来）")
        print(fl.format_table(["设备"] + [f"第 {t} 轮" for t in range(P)], [[f"GPU {r}"] + grid[r] for r in range(P)]))
    print(f"\n条带切分里，K 段号大于 Q 段号的 {P * (P - 1) // 2} 个块，第一行（设备 r 的 token r）一个 key 也看不见："
          "block_state 给 (−∞, 0, 0)，合并后没有 NaN。")
    assert sum(max(r) for r in works["striped"]) < sum(max(r) for r in works["contiguous"])
    return works


def memory_per_device(s, h, n, Ps):
    """第 3 部分：表 1，每块设备的激活。"""
    rows = [["1 块设备，BPT", fl.fmt_bytes(fl.activation_bytes("bpt", s, h, n))]]
    for P in Ps:
        ring = fl.activation_bytes("ring", s, h, n, c=s // P)
        rows.append([f"{P} 块设备，ring（c = s/P = {s // P:,}）", fl.fmt_bytes(ring)])
    print(fl.format_table(["方案", "每块设备一层的最大激活（BF16）"], rows))
    print(f"（s = {s:,}、h = {h}、{n} 头；ring 的 6bch 只和块长 c 有关："
          "总长 s 翻倍、设备数也翻倍，每块设备的激活不变）")


def plot(works, P, quick):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 13})
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 5), gridspec_kw={"width_ratios": [1, 1, 0.05]})
    vmax = max(max(map(max, w)) for w in works.values())
    for ax, layout in zip(axes[:2], LAYOUTS):
        w = torch.tensor(works[layout], dtype=torch.float64).T        # [设备, 轮]
        im = ax.imshow(w.numpy(), cmap="viridis", vmin=0, vmax=vmax)
        for r in range(P):
            for t in range(P):
                n = int(w[r, t])
                ax.text(t, r, f"K{(r - t) % P}\n{n if n else 'skip'}", ha="center", va="center", fontsize=12,
                        color="white" if w[r, t] < vmax / 2 else "black")
        ax.set_xticks(range(P))
        ax.set_yticks(range(P))
        ax.set_xlabel("ring round t")
        ax.set_ylabel("device r (holds Q_r)")
        # 每一轮等最慢的那块设备：各轮最大值之和 = 关键路径上算的对数
        crit = sum(max(r) for r in works[layout])
        verdict = "idle vs overloaded devices" if layout == "contiguous" else "every device busy, balanced"
        ax.set_title(f"{layout}: {verdict}\n(critical path {crit:,} (q, k) pairs)")
    fig.suptitle("Striped layout balances causal ring attention: same total work, shorter critical path")
    fig.colorbar(im, cax=axes[2], label="(q, k) pairs per device per round")
    return fl.save_figure(fig, __file__, "work", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="同样的合并分给 P 块设备：K/V 切分、环形排程、每块设备的激活")
    ap.add_argument("--quick", action="store_true", help="小规模：P ≤ 4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"随机种子 seed = {args.seed}")
    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)
    Ps = [2, 4] if args.quick else [2, 3, 4, 8]
    P_ring = 4

    print("\n== 1. K、V 切给 P 块设备，按不同的树合并 ==")
    kv_split(gen, rng, Ps, 64 if args.quick else 256)
    print(f"\n== 2. 环形注意力的排程（P = {P_ring}，causal，N = 32 × P）==")
    works = ring_schedule(gen, P_ring, 32 * P_ring)
    print("\n== 3. 每块设备的激活（表 1，一层 7B 规模：h = 4096、32 头、s = 1M）==")
    memory_per_device(2**20, 4096, 32, [8, 64, 512])

    print("\n结论：合并可交换、可结合、有单位元，所以 K、V 放在哪块设备、按什么顺序到达都不影响结果——"
          "环形注意力就是让 K、V 沿环流过每块设备，每到一块就合并一次；第 19 讲在此之上数通信、比较切分方式。")
    if not args.no_fig:
        path = plot(works, P_ring, args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
