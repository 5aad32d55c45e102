"""
第 11 讲 · 演示 1：在线 softmax——少读一遍数据，靠的是一个换算因子

你会看到：
    1. 三遍 softmax 和在线 softmax 结果一样（差 < 1e-15），但在线版本只读 2 遍数据；
       输入整体加 1000 时，不减最大值的"教科书写法"溢出成 NaN，两种安全写法都没事。
    2. 在线 softmax 逐块更新 (m, l) 的过程：每当出现更大的值，旧的 l 乘上换算因子 exp(m_旧 − m_新)，
       而不是回头重算——这张表就是 FlashAttention 内层循环在做的事。
    3. 局部状态 (m, l, o) 的合并 merge_states 满足交换律（逐位相等）和结合律（舍入误差内）：
       随机切点、随机合并树、还夹着整段被掩码（−∞）的段，结果都和整行一次算相同。

运行：python3 lecture11/01_online_softmax.py [--quick] [--seed 0]
图：lecture11/figures/01_online_softmax_rescale.png
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402


def passes_and_overflow(rng, n):
    """第 1 部分：两种写法的遍数、误差，以及溢出的例子。"""
    x = rng.standard_normal((8, n)) * 3
    y3, p3 = fl.softmax_3pass(x)
    yo, po = fl.softmax_online(x, block=64)
    big = x + 1000.0                                          # 每个 exp(x) 都是 inf
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(big) / np.exp(big).sum(axis=1, keepdims=True)
    nan_3, nan_on = np.isnan(fl.softmax_3pass(big)[0]).mean(), np.isnan(fl.softmax_online(big, 64)[0]).mean()
    rows = [["教科书 exp(x)/Σexp(x)", 2, "—", f"{np.isnan(naive).mean():.0%}"],
            ["三遍（减最大值）", p3, "参考", f"{nan_3:.0%}"],
            ["在线（块 = 64）", po, f"{np.abs(yo - y3).max():.1e}", f"{nan_on:.0%}"]]
    print(format_table(["写法", "读数据的遍数", "和三遍的最大差", "x + 1000 时 NaN 的比例"], rows))
    assert np.abs(yo - y3).max() < 1e-15 and (p3, po) == (3, 2)
    assert np.isnan(naive).all() and np.abs(fl.softmax_online(big, 64)[0] - y3).max() < 1e-12


def rescale_trace(x, block):
    """第 2 部分：一行数据逐块读入时 (m, l) 的变化。用 partial_state + merge_states 走一遍——和 softmax_online
    的第 1 遍是同一个更新。返回每块一行的记录。"""
    state = fl.partial_state(x[:0])                           # 空状态 (−∞, 0)：什么也没看到
    trace = []
    for s in range(0, len(x), block):
        blk = fl.partial_state(x[s:s + block])
        m_old = state[0]
        state = fl.merge_states(state, blk)
        factor = float(np.exp(m_old - state[0])) if np.isfinite(m_old) else 0.0
        trace.append((s // block, float(blk[0]), float(m_old), float(state[0]), factor, float(state[1])))
    return trace, state


def print_trace(trace, x):
    def note(k, f):
        return "—（第一块，没有旧状态）" if k == 0 else f"{f:.4f}" + ("  ← 最大值变大" if f < 1 else "")

    rows = [[k, f"{mb:+.2f}", f"{mo:+.2f}", f"{mn:+.2f}", note(k, f), f"{l:.4f}"] for k, mb, mo, mn, f, l in trace]
    print(format_table(["块", "块内最大", "m_旧", "m_新", "换算因子 exp(m_旧−m_新)", "l_新"], rows))
    m, l = trace[-1][3], trace[-1][5]
    l_direct = np.exp(x - x.max()).sum()
    print(f"最后的 m = {m:+.4f}（= max x = {x.max():+.4f}），l = {l:.12f}（直接算 Σ exp(x − max) = {l_direct:.12f}）")
    assert m == x.max() and abs(l - l_direct) < 1e-12 * l_direct


def random_tree_merge(states, rng):
    """随机挑两个状态合并（任意两个，不必相邻），直到只剩一个；返回 (结果, 合并树的写法)。"""
    items = [(s, str(k)) for k, s in enumerate(states)]
    while len(items) > 1:
        a, b = sorted(rng.choice(len(items), size=2, replace=False))
        (sa, na), (sb, nb) = items[a], items[b]
        if rng.random() < 0.5:                                # 左右也随机：考交换律
            sa, na, sb, nb = sb, nb, sa, na
        items = [it for k, it in enumerate(items) if k not in (a, b)] + [(fl.merge_states(sa, sb), f"({na}·{nb})")]
    return items[0]


def merge_trials(rng, n, trials):
    """第 3 部分：随机切点 × 随机合并树，和整行一次算比较。每次试验有一段整段被掩码。"""
    x = rng.standard_normal((4, n)) * 3
    v = rng.standard_normal((n, 5))
    rows, worst = [], 0.0
    for t in range(trials):
        cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(2, 7), replace=False))
        xm = x.copy()
        lo, hi = cuts[0], cuts[1]
        xm[:, lo:hi] = -np.inf                                # 第 2 段整段被掩码（比如 causal 的右上角）
        whole = fl.partial_state(xm, v)
        segs = [fl.partial_state(xs, vs) for xs, vs in zip(np.split(xm, cuts, axis=1), np.split(v, cuts))]
        (m, l, o), tree = random_tree_merge(segs, rng)
        err_o = np.abs(o / l[:, None] - whole[2] / whole[1][:, None]).max()
        err_l = np.abs(l / whole[1] - 1).max()
        worst = max(worst, err_o, err_l)
        assert np.array_equal(m, whole[0])                    # max 没有舍入：逐位相等
        rows.append([t, len(segs), tree, f"{err_l:.1e}", f"{err_o:.1e}"])
    print(format_table(["试验", "段数", "合并树（段从 0 编号；1 号段全是 −∞）", "l 的相对差", "输出的最大差"], rows))
    a, b = segs[0], segs[1]
    ab, ba = fl.merge_states(a, b), fl.merge_states(b, a)
    assert all(np.array_equal(p, q) for p, q in zip(ab, ba))
    empty = fl.merge_states(a, fl.partial_state(xm[:, :0], v[:0]))
    assert all(np.array_equal(p, q) for p, q in zip(empty, a))
    print("交换律：merge(a, b) 与 merge(b, a) 逐位相等；(−∞, 0, 0) 是单位元：merge(a, 空) 逐位等于 a。")
    return worst


def plot(trace, x, block, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    ax1.plot(np.arange(len(x)), x, ".", ms=6, color="0.5", label="scores x")
    ends = [min((k + 1) * block, len(x)) - 1 for k, *_ in trace]
    ax1.step(ends, [t[3] for t in trace], where="post", color="C0", lw=2, label="running max m")
    for k, *_rest in trace:
        ax1.axvline(k * block, color="0.85", lw=0.5)
    ax1.set_xlabel("position in the row")
    ax1.set_ylabel("score x (one row of QKᵀ)")
    ax1.set_title("Online softmax reads the row block by block")
    ax1.legend(loc="lower right")
    ax2.bar([t[0] for t in trace[1:]], [t[4] for t in trace[1:]], color="C1")
    ax2.set_xlim(-0.5, len(trace) - 0.5)
    ax2.set_xlabel("block (block 0 has no previous state)")
    ax2.set_ylabel("rescale factor exp(m_old − m_new)")
    ax2.set_title("Rescaling factor (< 1 when the max grows)")
    return save_figure(fig, __file__, "rescale", quick=quick)


def main():
    ap = argparse.ArgumentParser(description="在线 softmax 与局部状态的合并")
    ap.add_argument("--quick", action="store_true", help="小规模：更少的合并试验")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"随机种子 seed = {args.seed}")

    print("\n== 1. 读几遍数据：三遍 vs 在线（8 行 × 1000 列）==")
    passes_and_overflow(rng, 1000)

    block = 8
    x = rng.standard_normal(64) + np.linspace(-3, 3, 64)      # 整体往后变大：最大值会被刷新好几次
    print(f"\n== 2. 一行 64 个数、每块 {block} 个：(m, l) 怎么更新 ==")
    trace, _ = rescale_trace(x, block)
    print_trace(trace, x)
    assert any(t[4] < 1 for t in trace[1:])                   # 至少一次最大值变大、旧 l 被换算

    trials = 4 if args.quick else 10
    print(f"\n== 3. merge_states：随机切点 × 随机合并树（{trials} 次试验，4 行 × 300 列，dv = 5）==")
    worst = merge_trials(rng, 300, trials)
    assert worst < 1e-12

    print(f"\n结论：在线 softmax 少读一遍数据、结果不变；换算因子 exp(m_旧 − m_新) 让旧结果不必重算；"
          f"任意切分、任意合并顺序的最大差 {worst:.1e}——这就是 FlashAttention 分块、flash-decoding 切段的数学基础。")
    if not args.no_fig:
        path = plot(trace, x, block, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
