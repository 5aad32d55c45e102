"""预备课 5 的练习检查：P5.1 环形 all-reduce 的两段步骤，P5.2 ring / tree 的 α-β 系数（P5.3 是预测，见 predictions.yaml）。

参考答案都写在这里（numpy 直接求和、按块长手算每个设备发的字节、公式），不用 comm_sim 自己的 _reference / cost_terms。
设备数取不规则的 P（含非 2 的幂），向量长度含不能被 P 整除、甚至比 P 还短的（有空块）。
"""
import math

import numpy as np
from grading import close, exercise, expect, expect_no_calls, module

cs = module("prereq5", "comm_sim")

RING_CASES = ((2, 9), (3, 3), (5, 23), (6, 6 * 7), (7, 4), (8, 61), (11, 30))     # (P, n)：n % P 各不相同


def _bufs(p, n, seed, dtype=np.int64):
    rng = np.random.default_rng(seed)
    if dtype == np.int64:
        return [rng.integers(-10**6, 10**6, size=n) for _ in range(p)]
    return [rng.standard_normal(n) for _ in range(p)]


def _chunk_lens(n, p):
    """np.array_split(n 个元素, p) 的块长：前 n % p 块多 1 个（写在这里，不调 array_split）。"""
    return [n // p + (1 if c < n % p else 0) for c in range(p)]


def _ceil_log2(p):
    k = 0
    while (1 << k) < p:
        k += 1
    return k


# ----------------------------------------------------------------------------- P5.1
@exercise("P5.1")
def test_ring_allreduce_gives_the_sum_on_every_device():
    for k, (p, n) in enumerate(RING_CASES):
        xs = _bufs(p, n, 510 + k)
        want = xs[0].copy()
        for x in xs[1:]:
            want = want + x
        outs, _ = cs.ring_all_reduce(xs)
        expect(len(outs) == p, f"P = {p}：应返回 {p} 个设备的结果，得到 {len(outs)} 个")
        for r, o in enumerate(outs):
            expect(o.shape == (n,), f"P = {p}、n = {n}：设备 {r} 的结果形状应为 ({n},)，得到 {o.shape}"
                                    f"（all-gather 之后每个设备都该拿回全部 {p} 块）")
            expect(np.array_equal(o, want), f"P = {p}、n = {n}：设备 {r} 的结果不是所有设备的和"
                                            f"（整数数据应逐个相等；检查每一步发的块号和 all-gather 阶段）")
        # 浮点数据：各设备逐位相同（每块只在一个设备上归约一次，别的设备拿到的是它的副本）
        xf = _bufs(p, n, 610 + k, np.float64)
        outs, _ = cs.ring_all_reduce(xf)
        close(outs[0], np.sum(np.stack(xf), axis=0), atol=1e-12, rtol=1e-12,
              message=f"P = {p}、n = {n}：浮点 all-reduce 的结果不等于和")
        expect(all(np.array_equal(outs[0], o) for o in outs),
               f"P = {p}、n = {n}：各设备的浮点结果不是逐位相同（all-gather 应转发归约好的块，而不是各自再加一遍）")
    # reduce-scatter 单独用：设备 r 拿到和的第 r 块；all-gather 单独用：块长可以不同（allgatherv）
    p, n = 5, 23
    xs = _bufs(p, n, 700)
    total = np.sum(np.stack(xs), axis=0)
    outs, _ = cs.ring_reduce_scatter(xs)
    start = 0
    for r, ln in enumerate(_chunk_lens(n, p)):
        expect(np.array_equal(outs[r], total[start:start + ln]),
               f"reduce-scatter（P = {p}、n = {n}）：设备 {r} 应拿到和的第 {r} 块（块 c 要停在位置 c 的设备上）")
        start += ln
    chunks = [np.arange(ln) + 100 * r for r, ln in enumerate((3, 0, 5, 1, 2))]
    outs, _ = cs.ring_all_gather(chunks)
    expect(all(np.array_equal(o, np.concatenate(chunks)) for o in outs),
           "all-gather（块长 3、0、5、1、2）：每个设备都应拿到按设备顺序拼起来的全部块")
    forbidden = ["_reference", "ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "tree_all_reduce",
                 "rec_doubling_all_reduce", "rabenseifner_all_reduce", "_rec_halving_steps",
                 "_rec_doubling_ag_steps", "_binomial_reduce", "_binomial_bcast"]
    expect_no_calls(cs._ring_rs_steps, forbidden, "每一步只能把一块发给下一个设备并归约")
    expect_no_calls(cs._ring_ag_steps, forbidden, "每一步只能把一块转发给下一个设备")


@exercise("P5.1")
def test_ring_bytes_sent_per_device():
    for k, (p, n) in enumerate(RING_CASES):
        xs = _bufs(p, n, 520 + k)
        _, led = cs.ring_all_reduce(xs)
        lens = _chunk_lens(n, p)
        # reduce-scatter 里设备 i 发出除块 i 以外的每一块，all-gather 里发出除块 i+1 以外的每一块
        want = [8 * ((n - lens[i]) + (n - lens[(i + 1) % p])) for i in range(p)]
        got = [int(b) for b in led.bytes_sent()]
        expect(led.total_bytes() == 2 * (p - 1) * n * 8,
               f"P = {p}、n = {n}（int64）：所有设备一共应发 2(P−1)·n·8 = {2 * (p - 1) * n * 8} 字节，"
               f"账本记了 {led.total_bytes()}（每一步每个设备只发一块，不是整条向量）")
        expect(got == want, f"P = {p}、n = {n}：每个设备发出的字节应为 {want}，账本记的是 {got}"
                            f"（P 整除 n 时每个设备都是 2(P−1)/P·n·8）")
        if n % p == 0:
            expect(all(g == 2 * (p - 1) * (n // p) * 8 for g in got),
                   f"P = {p}、n = {n}：每个设备应发 2(P−1)/P·n·8 = {2 * (p - 1) * (n // p) * 8} 字节")


@exercise("P5.1")
def test_ring_steps_and_per_step_messages():
    for k, (p, n) in enumerate(RING_CASES):
        xs = _bufs(p, n, 530 + k)
        trace = []
        outs, led = cs.ring_all_reduce(xs, trace=trace)
        lens = _chunk_lens(n, p)
        expect(led.n_steps == 2 * (p - 1), f"P = {p}：环形 all-reduce 应走 2(P−1) = {2 * (p - 1)} 步"
                                           f"（reduce-scatter P−1 步 + all-gather P−1 步），账本记了 {led.n_steps} 步")
        for step in range(led.n_steps):
            rs = step < p - 1
            s = step if rs else step - (p - 1)
            # 第 s 步：reduce-scatter 里设备 i 发块 (i − s − 1) mod P，all-gather 里发块 (i − s) mod P，都发给 i + 1
            want = sorted((i, (i + 1) % p, 8 * lens[(i - s - 1) % p if rs else (i - s) % p]) for i in range(p))
            got = sorted((m.src, m.dst, m.nbytes) for m in led.step_messages(step))
            phase = "reduce-scatter" if rs else "all-gather"
            expect(got == want, f"P = {p}、n = {n}：第 {step} 步（{phase} 的第 {s} 步）的消息应为 (发送者, 接收者, 字节) "
                                f"{want}，账本记的是 {got}")
        phases = [t[0] for t in trace]
        expect(phases == ["start"] + ["reduce-scatter"] * (p - 1) + ["all-gather"] * (p - 1),
               f"P = {p}：trace 应在开始时记 1 次、之后每一步末尾记 1 次（阶段名 reduce-scatter / all-gather），"
               f"得到 {phases}")


@exercise("P5.1")
def test_ring_steps_run_many_groups_in_parallel():
    # 两级 all-reduce：每个节点一个环（groups 有多组）、同一本地编号的设备再组成环；组里的位置 ≠ 设备号
    for (g, nodes, n) in ((3, 2, 29), (4, 3, 50), (2, 5, 17)):
        p = g * nodes
        xs = _bufs(p, n, 540 + p)
        outs, led = cs.hierarchical_all_reduce(xs, g)
        total = np.sum(np.stack(xs), axis=0)
        expect(all(np.array_equal(o, total) for o in outs),
               f"两级 all-reduce（{nodes} 个节点 × {g} 块卡、n = {n}）的结果不是和：groups 里的每一组要各自按"
               f"组内位置（不是设备号）转一圈")
        want = {"intra": 2 * (g - 1), "inter": 2 * (nodes - 1)}
        for kind, steps in want.items():
            got = led.cost(kind).steps
            expect(got == steps, f"两级 all-reduce（{nodes} × {g}）：{kind} 链路应走 {steps} 步，账本记了 {got} 步"
                                 f"（所有组在同一步里并行，一步只 new_step() 一次；每条消息要按调用者给的 kind 记账，"
                                 f"别丢了 kind 参数）")
    # 广播（scatter + 环形 all-gather）：根不是 0 时，环按"相对根的编号"排
    x = np.arange(37)
    for p, root in ((5, 3), (6, 1), (7, 6)):
        outs, _ = cs.scatter_allgather_broadcast(x, p, root)
        expect(all(np.array_equal(o, x) for o in outs),
               f"scatter + all-gather 广播（P = {p}、根 = {root}）不是每个设备都拿到原向量：组里位置 i 的下一个是 "
               f"grp[(i + 1) % g]，拥有的块号是位置 i")


# ----------------------------------------------------------------------------- P5.2
@exercise("P5.2")
def test_allreduce_terms_formula():
    expect_no_calls(cs.allreduce_terms, ["ring_all_reduce", "tree_all_reduce", "cost", "bus_factor", "busbw",
                                         "nccl_ring_latency", "_run_sim", "cost_terms", "allreduce_time"],
                    "系数要从算法的步骤推出来")
    ns = (0.0, 1.0, 1000.0, 3 * 2.0 ** 20, 1.7e9)
    for p in [5, 6, 3, 2, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 31, 33, 64, 100, 1]:
        lg = _ceil_log2(p)
        for n in ns:
            ring = cs.allreduce_terms(n, p, "ring")
            tree = cs.allreduce_terms(n, p, "tree")
            expect(ring.steps == 2 * (p - 1), f"ring，P = {p}：应走 2(P−1) = {2 * (p - 1)} 步，得到 {ring.steps}")
            close(ring.bytes, 2 * (p - 1) / p * n, atol=1e-9, rtol=1e-12,
                  message=f"ring，P = {p}、n = {n:g}：关键路径字节应为 2(P−1)/P·n")
            expect(tree.steps == 2 * lg, f"tree，P = {p}：应走 2⌈log2 P⌉ = {2 * lg} 步（reduce ⌈log2 P⌉ 步 + broadcast "
                                         f"⌈log2 P⌉ 步；P 不是 2 的幂时向上取整），得到 {tree.steps}")
            close(tree.bytes, 2 * lg * n, atol=1e-9, rtol=1e-12,
                  message=f"tree，P = {p}、n = {n:g}：每步发整条消息，关键路径字节应为 2⌈log2 P⌉·n")
    sizes = np.array([10.0, 4096.0, 3e8])                    # 数组的 n（画曲线用）：逐点同公式
    close(cs.allreduce_terms(sizes, 6, "ring").bytes, 2 * 5 / 6 * sizes, atol=0, rtol=1e-12,
          message="ring，n 是数组时：每个点的字节应为 2(P−1)/P·n")
    close(cs.allreduce_terms(sizes, 6, "tree").bytes, 2 * 3 * sizes, atol=0, rtol=1e-12,
          message="tree，n 是数组时：每个点的字节应为 2⌈log2 P⌉·n")


@exercise("P5.2")
def test_allreduce_terms_match_the_simulator_ledger():
    for p in (2, 3, 5, 6, 8, 11, 13):
        n = 4 * p                                              # 能被 P 整除：账本的字节 = 公式
        xs = _bufs(p, n, 800 + p)
        model = cs.allreduce_terms(n * 8, p, "tree")
        _, led = cs.tree_all_reduce(xs)
        got = led.cost()
        expect(model.steps == got.steps, f"tree，P = {p}：模拟器的账本走了 {got.steps} 步，allreduce_terms 给 {model.steps}")
        expect(math.isclose(model.bytes, got.bytes, rel_tol=1e-12),
               f"tree，P = {p}、n = {n * 8} 字节：账本的关键路径字节 {got.bytes}，allreduce_terms 给 {model.bytes}")
        model = cs.allreduce_terms(n * 8, p, "ring")
        try:                                                   # 环形模拟器是练习 P5.1；没做时只比上面的树
            _, led = cs.ring_all_reduce(xs)
        except NotImplementedError:
            continue
        got = led.cost()
        expect(model.steps == got.steps and math.isclose(model.bytes, got.bytes, rel_tol=1e-12),
               f"ring，P = {p}、n = {n * 8} 字节：账本是 {got.steps} 步、{got.bytes} 字节，"
               f"allreduce_terms 给 {model.steps} 步、{model.bytes} 字节")


@exercise("P5.2")
def test_ring_tree_crossover():
    alpha, beta = 2.0e-6, 1 / 100e9

    def t(n, p, algo):
        return cs.allreduce_terms(n, p, algo).time(alpha, beta)
    for p in (4, 6, 8, 12, 16, 24, 64):
        lg = _ceil_log2(p)
        # ring = 2(P−1)·α + 2(P−1)/P·n·β，tree = 2⌈lg P⌉·α + 2⌈lg P⌉·n·β：两条直线的交点
        n_x = (2 * (p - 1) - 2 * lg) * alpha / ((2 * lg - 2 * (p - 1) / p) * beta)
        t_ring, t_tree = t(n_x, p, "ring"), t(n_x, p, "tree")
        expect(math.isclose(t_ring, t_tree, rel_tol=1e-9),
               f"P = {p}：消息 n = {n_x:.4g} 字节时 ring 和 tree 应一样快（{t_ring:.4g} s vs {t_tree:.4g} s）")
        for f, faster in ((0.3, "tree"), (3.0, "ring")):
            tr, tt = t(f * n_x, p, "ring"), t(f * n_x, p, "tree")
            expect((tt < tr) if faster == "tree" else (tr < tt),
                   f"P = {p}：{f:g} × 交叉点（{f * n_x:.4g} 字节）时应是 {faster} 快，得到 ring {tr:.4g} s、tree {tt:.4g} s"
                   f"（小消息看步数 α，大消息看字节 β）")
    for p in (2, 3):     # 两三个设备：ring 的步数不比 tree 多，字节更少：任何大小都不慢
        for n in (1.0, 1e6, 1e9):
            expect(t(n, p, "ring") <= t(n, p, "tree"),
                   f"P = {p}、n = {n:g}：ring 不应比 tree 慢（步数 2(P−1) ≤ 2⌈lg P⌉，字节更少）")
