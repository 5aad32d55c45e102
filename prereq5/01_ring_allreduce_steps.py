"""
预备课 5 · 演示 01：一步一步看环形 all-reduce（reduce-scatter + all-gather）

你会看到……
  1. P 个设备各自的向量被切成 P 块；每一步每个设备把一块发给环上的下一个设备。
     文字视图里每一格写"这一块已经加进了哪些设备的数据"（a = 设备 0，b = 设备 1，……），* 表示这一步刚变过。
     P − 1 步 reduce-scatter 之后，每个设备恰好有一块是全体之和；再 P − 1 步 all-gather，人人都有完整结果。
  2. 账本：每一步谁发给谁、发了哪一块、多少字节。
  3. 用随机浮点数再跑一遍：结果 = numpy 直接求和、所有设备逐位相同；每个设备发的字节 = 2(P−1)/P · n。
  4. P 从 2 到 64：每个设备发的字节 / n → 2，不随 P 增长——环形算法"带宽最优"的原因。
  5. 一张图：每一步、每个设备、每一块里有几个设备的贡献（prereq5/figures/01_ring_allreduce_steps_grid.png）。

运行：python3 prereq5/01_ring_allreduce_steps.py [--quick] [--p 4] [--n 10] [--seed 0]
"""
import argparse
import os
import sys
from textwrap import indent

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
import comm_sim as cs  # noqa: E402
from course_utils import fmt_bytes, format_table, save_figure  # noqa: E402


def letters(mask, p):
    """位掩码 → 贡献设备的字母，例如 0b0101 → "a.c."（P = 4）。"""
    return "".join(chr(ord("a") + r) if mask >> r & 1 else "." for r in range(p))


def contribution_trace(p, n):
    """设备 r 的每个元素都是 1 << r：求和 = 按位或，所以每个元素的二进制位就是"加进了哪些设备"。"""
    xs = [np.full(n, 1 << r, dtype=np.int64) for r in range(p)]
    trace = []
    outs, ledger = cs.ring_all_reduce(xs, trace=trace)
    assert all(np.all(o == (1 << p) - 1) for o in outs), "all-reduce 之后每个元素都应包含全部 P 个设备"
    return trace, ledger


def chunk_masks(chunks):
    """每一块的贡献掩码（一块里所有元素相同；空块记 -1）。"""
    return [int(c[0]) if c.size else -1 for c in chunks]


def print_trace(trace, ledger, p):
    prev = None
    for phase, step, bufs in trace:
        masks = [chunk_masks(b) for b in bufs]
        title = "初始状态" if step < 0 else f"第 {step} 步之后（{phase}）"
        print(f"\n{title}")
        rows = []
        for r in range(p):
            row = [f"d{r}"]
            for c in range(p):
                m = masks[r][c]
                star = "*" if prev is not None and prev[r][c] != m else " "
                row.append(("-" * p if m < 0 else letters(m, p)) + star)
            rows.append(row)
        print(indent(format_table(["设备"] + [f"块{c}" for c in range(p)], rows, ["<"] * (p + 1)), "  "))
        if step >= 0:
            sends = ", ".join(f"d{m.src}→d{m.dst} {fmt_bytes(m.nbytes)}" for m in ledger.step_messages(step))
            print(f"  本步消息：{sends}")
        prev = masks


def numeric_check(p, n, rng):
    xs = [rng.standard_normal(n) for _ in range(p)]
    outs, ledger = cs.ring_all_reduce(xs)
    ref = np.sum(np.stack(xs), axis=0)                     # [P, n] → [n]
    err = max(float(np.max(np.abs(o - ref))) for o in outs)
    same = all(np.array_equal(outs[0], o) for o in outs)
    print(f"\n随机 float64 数据（P = {p}，n = {n}）：与 numpy 求和的最大误差 {err:.2e}，各设备逐位相同：{same}")
    assert err < 1e-12 and same
    sent = ledger.bytes_sent()
    formula = 2 * (p - 1) / p * n * 8
    rows = [[f"d{r}", int(sent[r]), f"{formula:.1f}"] for r in range(p)]
    print(indent(format_table(["设备", "发出字节", "2(P−1)/P·n·8"], rows), "  "))
    # 总字节精确相等；单个设备因为 n 不能被 P 整除，和公式最多差 2(P−1) 个元素的"块长之差"
    assert sent.sum() == 2 * (p - 1) * n * 8
    assert np.all(np.abs(sent - formula) <= 2 * (p - 1) * 8)
    print(f"  合计 {sent.sum()} 字节 = P × 2(P−1)/P · n · 8 = {2 * (p - 1) * n * 8}（精确相等）")


def scaling_table(ps, rng):
    rows, ratios = [], []
    for p in ps:
        n = 12 * p                                          # 能被 P 整除：每个设备的字节数恰好等于公式
        _, ledger = cs.ring_all_reduce([rng.standard_normal(n) for _ in range(p)])
        per_dev = ledger.bytes_sent()
        assert np.all(per_dev == per_dev[0])
        ratio = per_dev[0] / (n * 8)
        ratios.append(ratio)
        assert np.isclose(ratio, 2 * (p - 1) / p) and ledger.n_steps == 2 * (p - 1)
        rows.append([p, n, int(per_dev[0]), f"{ratio:.4f}", f"{2 * (p - 1) / p:.4f}", ledger.n_steps])
    print(format_table(["P", "n（元素）", "每设备发出/字节", "÷ (n·8)", "2(P−1)/P", "步数"], rows, [">"] * 6))
    assert all(a < b for a, b in zip(ratios, ratios[1:])) and ratios[-1] < 2
    print("每个设备发的字节随 P 增加而增加，但永远 < 2n：环形 all-reduce 的带宽项与 P 几乎无关（步数却是 2(P−1)）。")


def plot_grid(trace, p, quick=False):
    from course_utils import pyplot
    plt = pyplot()
    k = len(trace)
    cols = min(k, 4)
    rows = (k + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (phase, step, bufs) in zip(axes.flat, trace):
        counts = np.array([[bin(m).count("1") if m >= 0 else 0 for m in chunk_masks(b)] for b in bufs])  # [P, P]
        ax.imshow(counts, vmin=0, vmax=p, cmap="viridis")
        for r in range(p):
            for c in range(p):
                ax.text(c, r, str(counts[r, c]), ha="center", va="center",
                        color="white" if counts[r, c] < p / 2 else "black")
        ax.set_title("start" if step < 0 else f"step {step} ({phase})")
        ax.set_xticks(range(p), [f"c{c}" for c in range(p)])
        ax.set_yticks(range(p), [f"dev{r}" for r in range(p)])
        ax.axis("on")
    fig.suptitle(f"Ring all-reduce, P={p}: how many devices are summed into each chunk "
                 "(rows: devices, columns: chunks)")
    spare = list(axes.flat)[k:]                    # 用空着的格子写结论
    if spare:
        spare[0].text(0.0, 0.5, f"after 2(P−1) = {2 * (p - 1)} steps\nevery device holds the full sum;\n"
                      f"each step every device sends\nn/P bytes to its neighbour", va="center",
                      transform=spare[0].transAxes)
    print(f"\n图已保存：{save_figure(fig, __file__, 'grid', dpi=110, quick=quick)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--quick", action="store_true", help="小规模（check-all 用）")
    ap.add_argument("--p", type=int, default=4, help="设备数（文字视图用，默认 4）")
    ap.add_argument("--n", type=int, default=10, help="每个设备的向量长度（默认 10，故意不被 P 整除）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 2 <= args.p <= 26:
        raise SystemExit(f"--p 必须在 2 … 26 之间（字母 a…z 表示设备），收到 {args.p}")
    if args.n < 1:
        raise SystemExit(f"--n 必须 ≥ 1，收到 {args.n}")
    print(f"随机种子 seed = {args.seed}")
    rng = np.random.default_rng(args.seed)

    print(f"== 1. 文字视图：P = {args.p} 个设备，每个向量 {args.n} 个元素，切成 {args.p} 块 ==")
    print("每格 = 这一块里已经加进了哪些设备的数据（a = d0，b = d1 …，'.' = 还没有）；* = 这一步刚变过")
    trace, ledger = contribution_trace(args.p, args.n)
    print_trace(trace, ledger, args.p)
    assert ledger.n_steps == 2 * (args.p - 1)

    print("\n== 2. 数值检查 ==")
    numeric_check(args.p, args.n, rng)

    print("\n== 3. P 变大时每个设备发多少 ==")
    scaling_table((2, 4, 8, 16) if args.quick else (2, 4, 8, 16, 32, 64), rng)

    plot_grid(trace, args.p, quick=args.quick)


if __name__ == "__main__":
    main()
