"""
comm_sim.py —— 预备课 5：集合通信一步一步怎么搬数据、要多久（α-β 模型）

【问题】张量并行、数据并行、专家并行都要在芯片之间合并或交换数据：all-reduce、all-gather、reduce-scatter、
    broadcast、all-to-all。每块芯片发多少字节、走几步？一次 all-reduce 什么时候由延迟 α 决定、什么时候由带宽 β 决定？
    (1) 模拟：P 个"设备"各拿一个 numpy 数组，按算法一步步把块发给别的设备；结果和 numpy 直接算（求和 / 拼接 / 转置）
        逐元素比较；账本 Ledger 记下每一步、每条链路发了多少字节。
    (2) 代价模型：每种算法的 α-β 公式"步数 × α + 关键路径字节 × β"（Thakur、Rabenseifner、Gropp 2005 [S73]）。
        账本数出来的步数和字节数**恰好等于**公式的两个系数——这是本模块的核心检验。
    结论先看：ring all-reduce = reduce-scatter + all-gather，每个设备发 2(P−1)/P·n 字节（P 再大也不超过 2n）；
    树 / 递归倍增只要 ⌈lg P⌉ 步，但每步发整条消息；Rabenseifner 两者兼得；两级 all-reduce 节点间只走 1/G 的数据。

【里面有什么】
    Message / Ledger                                   账本（cost()、time(alpha, beta)、bytes_sent()）
    ring_* / rec_* / rabenseifner_all_reduce / tree_* / scatter_allgather_broadcast / pairwise_all_to_all /
    hierarchical_all_reduce / SIMULATORS               模拟，都返回 (每个设备的结果, Ledger)；P ≤ MAX_SIM_DEVICES
    Cost / cost_terms / allreduce_time … / crossover_bytes   代价模型；n* = α 项等于 β 项的消息大小
    bus_factor / algbw / busbw / nccl_ring_latency     nccl-tests 的口径 [S68]，NCCL 自己的延迟常数 [S71]
    tp_allreduce_time / fit_alpha_beta                 第 5 讲用的 TP all-reduce 时间；从实测数据拟合 α、β

【约定】单位：字节、秒、字节/秒；P = 设备数。n = nccl-tests 的消息大小：all-reduce / reduce-scatter / broadcast
    是每个设备的完整输入；all-gather 是拼起来的总大小；all-to-all 是每个设备发出的全部字节。α = 每步固定延迟，
    β = 1 / 链路单向带宽。一步 = 每个设备最多发一条、收一条（单端口、全双工），时间 = α + β × 这一步最大的消息。
    n 不能被 P 整除时块长差 1：总字节仍等于公式，关键路径只多不到一个块。忽略归约计算（γ）、拥塞、协议开销。
    缓冲区是整数或浮点的一维数组（bool、字符串、复数报 TypeError）；求和放不进 dtype 时报错，不回绕、不换 dtype。

【运行】python3 prereq5/comm_sim.py    # 自检（2 核 CPU 上不到 1 秒）
【依赖】numpy；../lecture01/course_utils.py。演示 05 另外用 torch.distributed 的 gloo 后端。
"""

import math
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import format_table  # noqa: E402,F401  演示共用的对齐表格（实现在 lecture01/course_utils.py）
from course_utils import check_choice, check_int, check_memory, check_real  # noqa: E402  参数检查（第 1 讲起各讲共用）

# =====================================================================
# 0. 常量：默认延迟 α，以及 NCCL 自己的延迟表
# =====================================================================
# NCCL 的调优代码（src/graph/tuning.cc，2023–24 版，[S71]）把一次 ring 集合通信的延迟建模成
#     baseLat + nsteps × hopLat，all-reduce 的 nsteps = 2(P−1)，all-gather / reduce-scatter 为 P−1。
# 下面是 NVLink 上 ring 算法的常数（微秒），三种协议：LL（小消息）、LL128（中等）、Simple（大消息）。
NCCL_RING_BASE_US = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}      # [S71] baseLat, Ring
NCCL_NVLINK_HOP_US = {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}      # [S71] hwLat, NVLink, Ring

# DEFAULT_ALPHA：我们的 α-β 模型没有 baseLat，只有"每步 α"。张量并行在 decode 时发的是小消息（NCCL 选 LL），
# 8 卡 ring all-reduce 的 NCCL 延迟 = 6.6 + 14 × 0.6 = 15.0 µs，摊到 14 步 ≈ 1.07 µs/步；取整为 1 µs。
# 这样 TP 8 的小消息 all-reduce ≈ 14 µs，和 NCCL 模型一致；TP 2 只有 2 µs（NCCL 模型 7.8 µs，我们偏乐观）。
DEFAULT_ALPHA = 1.0e-6

# 已知的集合通信和算法（每个元组的第一个是默认算法）
ALGORITHMS = {
    "allreduce": ("ring", "tree", "rec_doubling", "rabenseifner"),
    "allgather": ("ring", "rec_doubling"),
    "reduce_scatter": ("ring", "rec_halving"),
    "broadcast": ("tree", "scatter_allgather"),
    "alltoall": ("pairwise",),
}

REDUCE_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
LINK_KINDS = ("link", "intra", "inter")     # 账本里的链路种类：单层拓扑 "link"，两级拓扑 "intra" / "inter"
MAX_SIM_DEVICES = 512   # 模拟最多几个设备：环形算法记 2(P−1)·P 条消息，P = 512 已是 50 万条（几秒）


# =====================================================================
# 1. 账本：每一步、每条链路发了多少字节
# =====================================================================
@dataclass(frozen=True)
class Message:
    step: int
    src: int
    dst: int
    nbytes: int
    kind: str = "link"        # 链路种类：单层拓扑用 "link"；两级拓扑用 "intra"（NVLink）/ "inter"（节点间网络）


class Cost(NamedTuple):
    """α-β 模型的两个系数：时间 = steps × α + bytes × β（bytes = 关键路径上的字节数）。"""
    steps: float
    bytes: float

    def time(self, alpha, beta):
        """steps × alpha + bytes × beta（秒）。alpha、beta 是 ≥ 0 的有限数（bytes 是数组时逐点算）。"""
        return self.steps * _check_nonneg(alpha, "alpha") + self.bytes * _check_nonneg(beta, "beta")


class Ledger:
    """
    记账：模拟的每一步（step）里谁给谁发了多少字节。

    单端口、全双工：一步之内每个设备最多发 1 条、收 1 条消息（违反就是模拟代码的错，抛 RuntimeError）。
    公开的 send 检查参数（设备号、字节数是整数，链路种类在 LINK_KINDS 里）；模拟内部用 _send，不在内层循环里查。
    一步的时间 = max over 消息 (α_kind + β_kind × 字节数)——同一步里的消息并行传输，最慢的那条决定这一步。
    """

    def __init__(self, p):
        self.p = check_int("p", p, lo=1)
        self.messages = []
        self.n_steps = 0
        self._senders, self._receivers = set(), set()

    def new_step(self):
        self.n_steps += 1
        self._senders, self._receivers = set(), set()
        return self.n_steps - 1

    def send(self, src, dst, nbytes, kind="link"):
        """记一条消息：设备 src → dst（0 … P−1 的整数），nbytes 个字节（≥ 0 的整数），链路种类 kind（LINK_KINDS）。"""
        src = check_int("src", src, lo=0, hi=self.p - 1, where="Ledger.send")
        dst = check_int("dst", dst, lo=0, hi=self.p - 1, where="Ledger.send")
        nbytes = check_int("nbytes", nbytes, lo=0, where="Ledger.send")
        check_choice("kind", kind, LINK_KINDS, where="Ledger.send")
        self._send(src, dst, nbytes, kind)

    def _send(self, src, dst, nbytes, kind="link"):
        """模拟内部的 send：参数来自模拟代码本身（已是合法的整数），只查单端口规则。"""
        if self.n_steps == 0:
            raise RuntimeError("先调用 new_step() 再 send()")
        if src == dst or not (0 <= src < self.p and 0 <= dst < self.p):
            raise RuntimeError(f"非法消息 {src} → {dst}（P = {self.p}）")
        if src in self._senders or dst in self._receivers:
            raise RuntimeError(f"第 {self.n_steps - 1} 步里设备 {src} 发了两次或设备 {dst} 收了两次（单端口模型）")
        self._senders.add(src)
        self._receivers.add(dst)
        self.messages.append(Message(self.n_steps - 1, int(src), int(dst), int(nbytes), kind))

    # ---- 统计 ----
    def bytes_sent(self):
        """每个设备一共发出的字节数，形状 (P,)。"""
        out = np.zeros(self.p, dtype=np.int64)
        for m in self.messages:
            out[m.src] += m.nbytes
        return out

    def bytes_received(self):
        out = np.zeros(self.p, dtype=np.int64)
        for m in self.messages:
            out[m.dst] += m.nbytes
        return out

    def total_bytes(self, kind=None):
        """所有消息的字节数之和；kind 给定时只算这种链路（LINK_KINDS 之一）。"""
        if kind is not None:
            check_choice("kind", kind, LINK_KINDS, where="Ledger.total_bytes")
        return sum(m.nbytes for m in self.messages if kind is None or m.kind == kind)

    def link_bytes(self):
        """{(src, dst): 这条（有向）链路上的总字节数}。"""
        out = {}
        for m in self.messages:
            out[(m.src, m.dst)] = out.get((m.src, m.dst), 0) + m.nbytes
        return out

    def step_messages(self, step):
        """第 step 步（0 … n_steps−1）的消息。"""
        step = check_int("step", step, lo=0, hi=max(self.n_steps - 1, 0), where="Ledger.step_messages")
        return [m for m in self.messages if m.step == step]

    def _steps_by_kind(self):
        """每一步：{kind: 这种链路上最大的消息字节数}。本模块的算法每一步只走一种链路；混合时 time() 取最慢的那种。"""
        per = [dict() for _ in range(self.n_steps)]
        for m in self.messages:
            per[m.step][m.kind] = max(per[m.step].get(m.kind, 0), m.nbytes)
        return per

    def cost(self, kind=None):
        """Cost(步数, 关键路径字节数 = Σ_每步 最大消息)。kind 给定时只统计这种链路的步。"""
        if kind is not None:
            check_choice("kind", kind, LINK_KINDS, where="Ledger.cost")
        steps, nbytes = 0, 0
        for d in self._steps_by_kind():
            items = [(k, b) for k, b in d.items() if kind is None or k == kind]
            if items:
                steps += 1
                nbytes += max(b for _, b in items)
        return Cost(steps, nbytes)

    def time(self, alpha, beta):
        """α-β 时间。alpha、beta 是 ≥ 0 的有限数，或 {kind: 这样的数}（两级拓扑）。"""
        for name, v in (("alpha", alpha), ("beta", beta)):
            for k, x in (v.items() if isinstance(v, dict) else [(None, v)]):
                _check_nonneg(x, name if k is None else f"{name}[{k!r}]")
        total = 0.0
        for d in self._steps_by_kind():
            if not d:
                continue
            total += max(_per_kind(alpha, k, "alpha") + _per_kind(beta, k, "beta") * b for k, b in d.items())
        return total


def _per_kind(v, kind, name):
    if isinstance(v, dict):
        if kind not in v:
            raise ValueError(f"{name} 缺少链路种类 {kind!r} 的值，已有 {sorted(v)}")
        return v[kind]
    return v


def _trace(trace, phase, step, bufs):
    """trace 是列表时，记下这一步之后每个设备的块（副本）。trace 的类型在入口查过（_check_trace）。"""
    if trace is not None:
        trace.append((phase, step, [[None if c is None else c.copy() for c in chunks] for chunks in bufs]))


# =====================================================================
# 2. 环形算法（ring）：reduce-scatter、all-gather、all-reduce
# =====================================================================
# 写成"多个组同时跑"的形式（groups：每组一串设备号，组里位置 i 的下一个是位置 i + 1，最后一个接回第一个）：
# 两级算法里每个节点一个组，各组在同一步里并行。bufs[r] 是设备 r 的 g 块（g = 组的大小），原地更新。
def _ring_rs_steps(bufs, groups, ledger, op, kind="link", trace=None):
    """环形 reduce-scatter 的 g − 1 步：结束时组里位置 c 的设备的块 c = 组内所有设备块 c 的 op-归约。
    每一步先 ledger.new_step()，每个设备给下一个设备发一块（ledger._send），trace 给定时每步末尾 _trace 一次。"""
    # >>> 练习 P5.1
    # 第 s 步，位置 i 的设备把块 (i − s − 1) mod g 发给位置 i + 1，对方把它归约进自己的同一块。
    # 块 c 从位置 c + 1 出发，绕环走 g − 1 步后停在位置 c：那里拿到块 c 的全部和。
    g = len(groups[0])
    for s in range(g - 1):
        step = ledger.new_step()
        posted = []                                     # 先"发出"所有消息，再统一"到达"：同步的一步
        for grp in groups:
            for i, r in enumerate(grp):
                c = (i - s - 1) % g
                posted.append((r, grp[(i + 1) % g], c, bufs[r][c].copy()))
        for src, dst, c, data in posted:
            ledger._send(src, dst, data.nbytes, kind)
            bufs[dst][c] = op(bufs[dst][c], data)
        _trace(trace, "reduce-scatter", step, bufs)
    # <<< 练习 P5.1


def _ring_ag_steps(bufs, groups, ledger, kind="link", trace=None):
    """环形 all-gather 的 g − 1 步：开始时组里位置 i 的设备拥有块 i（别的块可以是 None），结束时每个设备拥有全部 g 块。
    账本、trace 的用法同 _ring_rs_steps（trace 的阶段名 "all-gather"）。"""
    # >>> 练习 P5.1
    # 第 s 步，位置 i 的设备把块 (i − s) mod g 转发给位置 i + 1（对方直接覆盖）：第 0 步发自己的块，
    # 之后发上一步刚收到的那块。
    g = len(groups[0])
    for s in range(g - 1):
        step = ledger.new_step()
        posted = []
        for grp in groups:
            for i, r in enumerate(grp):
                c = (i - s) % g
                posted.append((r, grp[(i + 1) % g], c, bufs[r][c].copy()))
        for src, dst, c, data in posted:
            ledger._send(src, dst, data.nbytes, kind)
            bufs[dst][c] = data
        _trace(trace, "all-gather", step, bufs)
    # <<< 练习 P5.1


def ring_reduce_scatter(xs, op="sum", trace=None):
    """
    环形 reduce-scatter。xs：P 个长度相同的一维数组。
    返回 (outs, ledger)：outs[r] = np.array_split(op-归约(xs), P)[r]。P − 1 步。
    """
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op, trace=trace)
    p = len(xs)
    bufs = [np.array_split(x, p) for x in xs]          # bufs[r][c]：设备 r 的第 c 块
    ledger = Ledger(p)
    _trace(trace, "start", -1, bufs)
    _ring_rs_steps(bufs, [list(range(p))], ledger, fn, trace=trace)
    return [bufs[r][r] for r in range(p)], ledger


def ring_all_gather(chunks, trace=None):
    """
    环形 all-gather。chunks[r]：设备 r 的那一块（长度可以不同，即 allgatherv）。
    返回 (outs, ledger)：每个设备都得到 np.concatenate(chunks)。P − 1 步。
    """
    chunks = _check_buffers(chunks, "chunks", same_len=False, trace=trace)
    p = len(chunks)
    bufs = [[chunks[r] if c == r else None for c in range(p)] for r in range(p)]   # None = 还没收到
    ledger = Ledger(p)
    _trace(trace, "start", -1, bufs)
    _ring_ag_steps(bufs, [list(range(p))], ledger, trace=trace)
    return [np.concatenate(b) for b in bufs], ledger


def ring_all_reduce(xs, op="sum", trace=None):
    """
    环形 all-reduce = 环形 reduce-scatter（P − 1 步）+ 环形 all-gather（P − 1 步）。
    每个设备一共发 2(P − 1) 块 ≈ 2(P − 1)/P · n 字节。返回 (outs, ledger)，每个设备的结果逐位相同。
    trace：传入一个列表时，追加 (阶段, 步号, 每个设备的块列表) ——演示 01 用它画每一步的状态。
    """
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op, trace=trace)
    p = len(xs)
    bufs = [np.array_split(x, p) for x in xs]
    ledger = Ledger(p)
    _trace(trace, "start", -1, bufs)
    groups = [list(range(p))]
    _ring_rs_steps(bufs, groups, ledger, fn, trace=trace)
    _ring_ag_steps(bufs, groups, ledger, trace=trace)
    return [np.concatenate(b) for b in bufs], ledger


# =====================================================================
# 3. 递归减半 / 递归倍增（P 为 2 的幂；all-reduce 对任意 P 先折叠）
# =====================================================================
def _rec_halving_steps(bufs, ranks, ledger, op):
    """bufs[r]：设备 r 的 q 块列表（q = len(ranks) 是 2 的幂）。结束时位置 i 的设备拥有块 i 的归约结果。"""
    q = len(ranks)
    m = q // 2
    while m >= 1:
        ledger.new_step()
        posted = []
        for i, r in enumerate(ranks):
            lo = i - i % (2 * m)                        # 当前持有的块区间 [lo, lo + 2m)
            give = range(lo, lo + m) if i & m else range(lo + m, lo + 2 * m)   # 交出不含自己位置的那一半
            posted.append((r, ranks[i ^ m], [(c, bufs[r][c].copy()) for c in give]))
        for src, dst, items in posted:
            ledger._send(src, dst, sum(d.nbytes for _, d in items))
            for c, d in items:
                bufs[dst][c] = op(bufs[dst][c], d)
        m //= 2


def _rec_doubling_ag_steps(bufs, ranks, ledger):
    """位置 i 的设备拥有块 i；每步和距离 m 的伙伴交换手上的整段，段长翻倍。"""
    q = len(ranks)
    m = 1
    while m < q:
        ledger.new_step()
        posted = []
        for i, r in enumerate(ranks):
            lo = i - i % m                               # 当前持有的块区间 [lo, lo + m)
            posted.append((r, ranks[i ^ m], [(c, bufs[r][c].copy()) for c in range(lo, lo + m)]))
        for src, dst, items in posted:
            ledger._send(src, dst, sum(d.nbytes for _, d in items))
            for c, d in items:
                bufs[dst][c] = d
        m *= 2


def rec_halving_reduce_scatter(xs, op="sum"):
    """递归减半 reduce-scatter（P 须是 2 的幂）：lg P 步，发 n/2 + n/4 + … + n/P 字节。返回 (outs, ledger)。"""
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op)
    p = len(xs)
    _require_pow2(p, "rec_halving reduce-scatter")
    bufs = [np.array_split(x, p) for x in xs]
    ledger = Ledger(p)
    _rec_halving_steps(bufs, list(range(p)), ledger, fn)
    return [bufs[r][r] for r in range(p)], ledger


def rec_doubling_all_gather(chunks):
    """递归倍增 all-gather（P 须是 2 的幂）：lg P 步。返回 (outs, ledger)。"""
    chunks = _check_buffers(chunks, "chunks", same_len=False)
    p = len(chunks)
    _require_pow2(p, "rec_doubling all-gather")
    bufs = [[chunks[r] if c == r else None for c in range(p)] for r in range(p)]
    ledger = Ledger(p)
    _rec_doubling_ag_steps(bufs, list(range(p)), ledger)
    return [np.concatenate(b) for b in bufs], ledger


# 非 2 的幂（MPICH 的做法，Thakur et al. 2005 §4）：q = 不超过 P 的最大 2 的幂，多出 e = P − q 个设备。
# 前 2e 个设备两两配对：偶数号把整条向量发给右边的奇数号（多 1 步、n 字节），奇数号先归约；
# 剩下 q 个设备跑 2 的幂算法；最后奇数号把结果发回给偶数号（再多 1 步、n 字节）。
def _fold(xs, ledger, op):
    p = len(xs)
    q = _floor_pow2(p)
    e = p - q
    if e:
        ledger.new_step()
        for i in range(0, 2 * e, 2):
            ledger._send(i, i + 1, xs[i].nbytes)
            xs[i + 1] = op(xs[i + 1], xs[i].copy())
    return [i for i in range(1, 2 * e, 2)] + list(range(2 * e, p))     # 留下来的 q 个设备


def _unfold(outs, ledger):
    e = len(outs) - _floor_pow2(len(outs))
    if e:
        ledger.new_step()
        for i in range(0, 2 * e, 2):
            ledger._send(i + 1, i, outs[i + 1].nbytes)
            outs[i] = outs[i + 1].copy()


def rec_doubling_all_reduce(xs, op="sum"):
    """
    递归倍增 all-reduce：每步和距离 1, 2, 4, … 的伙伴交换**整条**向量并归约。
    lg q 步、每步 n 字节（q 是 2 的幂时）——步数最少，适合小消息。任意 P（非 2 的幂先折叠，+2 步）。
    """
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op)
    p = len(xs)
    ledger = Ledger(p)
    ranks = _fold(xs, ledger, fn)
    q = len(ranks)
    m = 1
    while m < q:
        ledger.new_step()
        posted = [(r, ranks[i ^ m], xs[r].copy()) for i, r in enumerate(ranks)]
        for src, dst, d in posted:
            ledger._send(src, dst, d.nbytes)
            xs[dst] = fn(xs[dst], d)                   # a+b 与 b+a 在浮点里逐位相同：两个伙伴结果一致
        m *= 2
    _unfold(xs, ledger)
    return xs, ledger


def rabenseifner_all_reduce(xs, op="sum"):
    """
    Rabenseifner all-reduce = 递归减半 reduce-scatter + 递归倍增 all-gather：
    2 lg q 步、2(q − 1)/q · n 字节——步数像树、字节数像环。任意 P（非 2 的幂先折叠，+2 步、+2n 字节）。
    """
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op)
    p = len(xs)
    ledger = Ledger(p)
    ranks = _fold(xs, ledger, fn)
    q = len(ranks)
    bufs = {r: np.array_split(xs[r], q) for r in ranks}     # 只有留下的 q 个设备切块
    _rec_halving_steps(bufs, ranks, ledger, fn)
    _rec_doubling_ag_steps(bufs, ranks, ledger)
    outs = [None] * p
    for r in ranks:
        outs[r] = np.concatenate(bufs[r])
    _unfold(outs, ledger)
    return outs, ledger


# =====================================================================
# 4. 树：二项树 reduce + broadcast、broadcast 的两种算法
# =====================================================================
def _binomial_reduce(xs, ranks, ledger, op):
    """向 ranks[0] 归约：距离 m = 1, 2, 4, … 的设备把部分和发给左边的伙伴。⌈lg q⌉ 步。"""
    q = len(ranks)
    m = 1
    while m < q:
        ledger.new_step()
        posted = [(ranks[v], ranks[v - m], xs[ranks[v]].copy()) for v in range(m, q, 2 * m)]
        for src, dst, d in posted:
            ledger._send(src, dst, d.nbytes)
            xs[dst] = op(xs[dst], d)
        m *= 2


def _binomial_bcast(xs, ranks, ledger):
    """从 ranks[0] 广播整条向量：距离 m = 2^(⌈lg q⌉−1), …, 2, 1。⌈lg q⌉ 步，每步 n 字节。"""
    q = len(ranks)
    m = _floor_pow2(q - 1) if q > 1 else 0
    while m >= 1:
        ledger.new_step()
        for v in range(0, q, 2 * m):
            if v + m < q:
                ledger._send(ranks[v], ranks[v + m], xs[ranks[v]].nbytes)
                xs[ranks[v + m]] = xs[ranks[v]].copy()
        m //= 2


def tree_all_reduce(xs, op="sum"):
    """二项树 reduce 到设备 0，再二项树 broadcast：2⌈lg P⌉ 步，每步整条 n 字节（不分段流水）。任意 P。"""
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op)
    p = len(xs)
    ledger = Ledger(p)
    ranks = list(range(p))
    _binomial_reduce(xs, ranks, ledger, fn)
    _binomial_bcast(xs, ranks, ledger)
    return xs, ledger


def tree_broadcast(x, p, root=0):
    """二项树 broadcast：⌈lg P⌉ 步，每步 n 字节。返回 (P 个副本, ledger)。"""
    x, p, root = _check_bcast(x, p, root)
    ranks = [(root + v) % p for v in range(p)]          # 相对编号 v = (r − root) mod P
    bufs = [None] * p
    bufs[root] = x
    ledger = Ledger(p)
    _binomial_bcast(bufs, ranks, ledger)
    return bufs, ledger


def scatter_allgather_broadcast(x, p, root=0):
    """
    大消息 broadcast（van de Geijn）：先二项树 scatter（每个设备拿 1/P），再环形 all-gather。
    ⌈lg P⌉ + P − 1 步，字节 2(P − 1)/P · n——大消息时比二项树的 ⌈lg P⌉ · n 少得多。
    """
    x, p, root = _check_bcast(x, p, root)
    ranks = [(root + v) % p for v in range(p)]
    parts = np.array_split(x, p)                         # 相对编号 v 最终拿块 v
    held = {0: {c: parts[c] for c in range(p)}}          # 相对编号 → {块编号: 数据}；开始时都在根上
    ledger = Ledger(p)
    m = _floor_pow2(p - 1) if p > 1 else 0
    while m >= 1:                                        # scatter：持有 [v, v + 2m) 的设备把 [v + m, …) 交给 v + m
        ledger.new_step()
        for v in list(held):
            give = {c: d.copy() for c, d in held[v].items() if c >= v + m}
            if give:
                ledger._send(ranks[v], ranks[v + m], sum(d.nbytes for d in give.values()))
                held[v] = {c: d for c, d in held[v].items() if c < v + m}
                held[v + m] = give
        m //= 2
    bufs = [None] * p
    for v in range(p):                                   # scatter 之后相对编号 v 恰好只剩块 v
        bufs[ranks[v]] = [held[v][c] if c == v else None for c in range(p)]
    _ring_ag_steps(bufs, [ranks], ledger)                # 按相对编号排成环
    return [np.concatenate(b) for b in bufs], ledger


# =====================================================================
# 5. all-to-all：成对交换
# =====================================================================
def pairwise_all_to_all(xs):
    """
    成对交换 all-to-all：xs[r] 切成 P 块，第 d 块要送给设备 d。第 s 步（s = 1 … P−1）设备 r 把块 (r + s) mod P
    发给设备 (r + s) mod P。返回 (outs, ledger)：outs[d] = 拼接_r np.array_split(xs[r], P)[d]（按 r 的顺序）。
    """
    xs = _check_buffers(xs, same_len=False)
    p = len(xs)
    blocks = [np.array_split(x, p) for x in xs]         # blocks[r][d]：r 要给 d 的数据
    recv = [[None] * p for _ in range(p)]                # recv[d][r]：d 从 r 收到的数据
    for r in range(p):
        recv[r][r] = blocks[r][r].copy()                 # 给自己的那块不过链路
    ledger = Ledger(p)
    for s in range(1, p):
        ledger.new_step()
        for r in range(p):
            d = (r + s) % p
            ledger._send(r, d, blocks[r][d].nbytes)
            recv[d][r] = blocks[r][d].copy()
    return [np.concatenate(row) for row in recv], ledger


# =====================================================================
# 6. 两级（hierarchical）all-reduce：节点内 NVLink + 节点间网络
# =====================================================================
def hierarchical_all_reduce(xs, gpus_per_node, op="sum"):
    """
    P = N × G 个设备，设备 r 在节点 r // G、本地编号 r % G。三个阶段：
      1. 每个节点内环形 reduce-scatter（G 块）：本地编号 l 拿到节点内块 l 的和；          链路 "intra"
      2. 本地编号相同的 N 个设备（每个节点一个）对块 l 做环形 all-reduce；G 个环并行；   链路 "inter"
      3. 每个节点内环形 all-gather。                                                  链路 "intra"
    节点间每个设备只发 2(N − 1)/N · n/G 字节、走 2(N − 1) 步（扁平环是 2(P − 1) 步全走最慢的链路）。
    返回 (outs, ledger)；ledger.cost("intra") / cost("inter") 分别对应 hierarchical_allreduce_terms。
    """
    fn = _check_op(op)
    xs = _check_buffers(xs, op=op)
    p = len(xs)
    g = check_int("gpus_per_node", gpus_per_node, lo=1)
    if p % g:
        raise ValueError(f"设备数 P = len(xs) = {p} 必须是 gpus_per_node = {g} 的整数倍")
    n_nodes = p // g
    ledger = Ledger(p)
    nodes = [list(range(k * g, (k + 1) * g)) for k in range(n_nodes)]
    bufs = [np.array_split(x, g) for x in xs]
    _ring_rs_steps(bufs, nodes, ledger, fn, kind="intra")
    # 阶段 2：设备 r 手上归约好的块 l = r % G，再切成 N 份，在"同一本地编号"的环上 all-reduce
    shards = [np.array_split(bufs[r][r % g], n_nodes) for r in range(p)]
    rails = [[k * g + l for k in range(n_nodes)] for l in range(g)]
    _ring_rs_steps(shards, rails, ledger, fn, kind="inter")
    _ring_ag_steps(shards, rails, ledger, kind="inter")
    for r in range(p):
        bufs[r] = [bufs[r][c] if c != r % g else np.concatenate(shards[r]) for c in range(g)]
    _ring_ag_steps(bufs, nodes, ledger, kind="intra")
    return [np.concatenate(b) for b in bufs], ledger


# 模拟函数索引：(集合通信, 算法) → 函数。all-reduce / reduce-scatter 的参数是 xs；all-gather 是 chunks；
# broadcast 是 (x, p)；all-to-all 是 xs。
SIMULATORS = {
    ("allreduce", "ring"): ring_all_reduce,
    ("allreduce", "tree"): tree_all_reduce,
    ("allreduce", "rec_doubling"): rec_doubling_all_reduce,
    ("allreduce", "rabenseifner"): rabenseifner_all_reduce,
    ("reduce_scatter", "ring"): ring_reduce_scatter,
    ("reduce_scatter", "rec_halving"): rec_halving_reduce_scatter,
    ("allgather", "ring"): ring_all_gather,
    ("allgather", "rec_doubling"): rec_doubling_all_gather,
    ("broadcast", "tree"): tree_broadcast,
    ("broadcast", "scatter_allgather"): scatter_allgather_broadcast,
    ("alltoall", "pairwise"): pairwise_all_to_all,
}


# =====================================================================
# 7. α-β 代价模型：Cost(步数, 关键路径字节数)
# =====================================================================
# 公式见（Thakur, Rabenseifner, Gropp 2005 [S73]），γ（归约计算）忽略。
# 非 2 的幂的 rec_doubling / rabenseifner 按上面的"折叠"写：多 2 步、多 2n 字节。
def _fold_extra(p, n):
    return (2, 2 * n) if p != _floor_pow2(p) else (0, 0 * n)


def allreduce_terms(n_bytes, p, algo="ring"):
    """
    all-reduce 的 Cost(steps, bytes)：n_bytes = 每个设备完整输入的字节数（可以是数组），p 个设备，
    algo 是 ALGORITHMS["allreduce"] 之一。steps = 走几步（一步里每个设备最多发一条、收一条消息），
    bytes = 关键路径上的字节数（每一步最大的那条消息之和）——和模拟器账本 Ledger.cost() 的口径相同。
    ring：ring_all_reduce 的做法（reduce-scatter + all-gather，块长 n/P）；
    tree：tree_all_reduce 的做法（二项树 reduce 到设备 0，再二项树 broadcast，每步发整条 n 字节，不分段）。
    P = 1 时没有通信：0 步、0 字节。
    """
    n = _check_nonneg(n_bytes, "n_bytes")
    p = check_int("p", p, lo=1)
    algo = _check_algo("allreduce", algo)
    if algo in ("rec_doubling", "rabenseifner"):
        q = _floor_pow2(p)
        lg = q.bit_length() - 1
        es, eb = _fold_extra(p, n)
        if algo == "rec_doubling":
            return Cost(lg + es, lg * n + eb)
        return Cost(2 * lg + es, 2 * (q - 1) / q * n + eb)        # rabenseifner
    # >>> 练习 P5.2
    if algo == "ring":
        return Cost(2 * (p - 1), 2 * (p - 1) / p * n)
    return Cost(2 * _ceil_lg(p), 2 * _ceil_lg(p) * n)             # tree：二项树 reduce + broadcast
    # <<< 练习 P5.2


def allgather_terms(n_bytes, p, algo="ring"):
    """n_bytes = 拼起来之后的总字节数。"""
    n = _check_nonneg(n_bytes, "n_bytes")
    p = check_int("p", p, lo=1)
    algo = _check_algo("allgather", algo)
    if algo == "rec_doubling":
        _require_pow2(p, "rec_doubling all-gather")
        return Cost(_ceil_lg(p), (p - 1) / p * n)
    return Cost(p - 1, (p - 1) / p * n)


def reduce_scatter_terms(n_bytes, p, algo="ring"):
    """n_bytes = 每个设备完整输入向量的字节数。"""
    n = _check_nonneg(n_bytes, "n_bytes")
    p = check_int("p", p, lo=1)
    algo = _check_algo("reduce_scatter", algo)
    if algo == "rec_halving":
        _require_pow2(p, "rec_halving reduce-scatter")
        return Cost(_ceil_lg(p), (p - 1) / p * n)
    return Cost(p - 1, (p - 1) / p * n)


def broadcast_terms(n_bytes, p, algo="tree"):
    n = _check_nonneg(n_bytes, "n_bytes")
    p = check_int("p", p, lo=1)
    algo = _check_algo("broadcast", algo)
    if algo == "tree":
        return Cost(_ceil_lg(p), _ceil_lg(p) * n)
    return Cost(_ceil_lg(p) + p - 1, 2 * (p - 1) / p * n)         # scatter + ring all-gather


def alltoall_terms(n_bytes, p, algo="pairwise"):
    """n_bytes = 每个设备要发出的全部字节（含留给自己的 1/P）。"""
    n = _check_nonneg(n_bytes, "n_bytes")
    p = check_int("p", p, lo=1)
    _check_algo("alltoall", algo)
    return Cost(p - 1, (p - 1) / p * n)


_TERMS = {"allreduce": allreduce_terms, "allgather": allgather_terms, "reduce_scatter": reduce_scatter_terms,
          "broadcast": broadcast_terms, "alltoall": alltoall_terms}


def cost_terms(collective, n_bytes, p, algo=None):
    """任一集合通信的 Cost(steps, bytes)。algo=None 用该集合通信的默认算法（ALGORITHMS 里的第一个）。"""
    algo = _check_algo(collective, algo)
    return _TERMS[collective](n_bytes, p, algo)


def _time(collective, n_bytes, p, alpha, beta, algo):
    alpha = _check_nonneg(alpha, "alpha")
    beta = _check_nonneg(beta, "beta")
    return cost_terms(collective, n_bytes, p, algo).time(alpha, beta)


def allreduce_time(n_bytes, p, alpha, beta, algo="ring"):
    """all-reduce 的 α-β 时间（秒）。beta = 1/单向链路带宽（秒/字节）。n_bytes 可以是数组（画曲线用）。"""
    return _time("allreduce", n_bytes, p, alpha, beta, algo)


def allgather_time(n_bytes, p, alpha, beta, algo="ring"):
    return _time("allgather", n_bytes, p, alpha, beta, algo)


def reduce_scatter_time(n_bytes, p, alpha, beta, algo="ring"):
    return _time("reduce_scatter", n_bytes, p, alpha, beta, algo)


def broadcast_time(n_bytes, p, alpha, beta, algo="tree"):
    return _time("broadcast", n_bytes, p, alpha, beta, algo)


def alltoall_time(n_bytes, p, alpha, beta, algo="pairwise"):
    return _time("alltoall", n_bytes, p, alpha, beta, algo)


def hierarchical_allreduce_terms(n_bytes, n_nodes, gpus_per_node, inter_algo="ring"):
    """
    两级 all-reduce 的系数：{"intra": Cost, "inter": Cost}。
    intra = 节点内 ring reduce-scatter + ring all-gather（各 G − 1 步、(G − 1)/G · n 字节）；
    inter = N 个节点之间对 n/G 字节做 all-reduce（算法 inter_algo，默认 ring）。
    """
    n = _check_nonneg(n_bytes, "n_bytes")
    nn = check_int("n_nodes", n_nodes, lo=1)
    g = check_int("gpus_per_node", gpus_per_node, lo=1)
    intra = Cost(2 * (g - 1), 2 * (g - 1) / g * n)
    return {"intra": intra, "inter": allreduce_terms(n / g, nn, inter_algo)}


def hierarchical_allreduce_time(n_bytes, n_nodes, gpus_per_node, alpha_intra, beta_intra,
                                alpha_inter, beta_inter, inter_algo="ring"):
    """
    两级 all-reduce 的时间（秒）：N = n_nodes 个节点、每个节点 G = gpus_per_node 块 GPU。
    beta_intra = 1/NVLink 单向带宽；beta_inter = 1/（每块 GPU 分到的）节点间网络单向带宽——
    例如 DGX H100 每块 GPU 一张 400 Gb/s 网卡：beta_inter = 1/50e9。阶段 2 的 G 个环各用自己的网卡，并行。
    inter_algo 可以是 ALGORITHMS["allreduce"] 里的任何一个（公式组合）；模拟器 hierarchical_all_reduce 只实现了 ring。
    """
    t = hierarchical_allreduce_terms(n_bytes, n_nodes, gpus_per_node, inter_algo)
    a_i, b_i = _check_nonneg(alpha_intra, "alpha_intra"), _check_nonneg(beta_intra, "beta_intra")
    a_e, b_e = _check_nonneg(alpha_inter, "alpha_inter"), _check_nonneg(beta_inter, "beta_inter")
    return t["intra"].time(a_i, b_i) + t["inter"].time(a_e, b_e)


def tp_allreduce_time(n_bytes, tp, link_bw, alpha=DEFAULT_ALPHA, algo="ring"):
    """
    张量并行组里一次 all-reduce 的时间（秒）——第 5 讲 serving_sim 调用的接口。
    n_bytes：每块芯片上完整张量的字节数（例如 B·T·d·2，bf16）；tp：组里的芯片数（tp == 1 → 0.0）；
    link_bw：芯片的 scale-up 带宽，**单向**，字节/秒（hw_specs.Chip.link_bw 的口径：A100 300e9，H100/H200 450e9）；
    alpha：每步延迟（秒），默认 DEFAULT_ALPHA；algo：ALGORITHMS["allreduce"] 之一。
    这是线速下的理想值：NCCL 实测 ring 的 busbw 约为线速的 80%（H100：~370 / 450 GB/s，[S40]），
    想打折就传 link_bw × 效率。
    """
    tp = check_int("tp", tp, lo=1)
    link_bw = _check_positive(link_bw, "link_bw")
    if tp == 1:
        _check_nonneg(n_bytes, "n_bytes")
        _check_algo("allreduce", algo)
        return 0.0
    return allreduce_time(n_bytes, tp, alpha, 1.0 / link_bw, algo)


def crossover_bytes(collective, p, alpha, beta, algo=None):
    """
    交叉点 n*：α 项 = β 项的消息大小（字节）。n < n* 时延迟为主，n > n* 时带宽为主。
    字节项对 n 是线性的：bytes(n) = c·n，所以 n* = steps·α / (c·β)。P = 1 时没有通信，抛 ValueError。
    """
    alpha = _check_nonneg(alpha, "alpha")
    beta = _check_positive(beta, "beta")
    c = cost_terms(collective, 1.0, p, algo)
    if c.bytes == 0:
        raise ValueError(f"p = {p}：没有通信，交叉点无定义（需要 p ≥ 2）")
    return c.steps * alpha / (c.bytes * beta)


# =====================================================================
# 8. nccl-tests 的 algbw / busbw，NCCL 延迟，α-β 拟合
# =====================================================================
_BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
               "allgather": lambda p: (p - 1) / p, "alltoall": lambda p: (p - 1) / p,
               "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}


def bus_factor(collective, p):
    """nccl-tests PERFORMANCE.md [S68]：busbw = algbw × 这个系数。"""
    return _BUS_FACTOR[check_choice("collective", collective, sorted(_BUS_FACTOR))](check_int("p", p, lo=1))


def algbw(n_bytes, seconds):
    """算法带宽 = 消息大小 / 时间（字节/秒）。"""
    return _check_nonneg(n_bytes, "n_bytes") / _check_positive(seconds, "seconds")


def busbw(collective, n_bytes, seconds, p):
    """总线带宽 = algbw × bus_factor：和"每条链路实际用了多少带宽"可比，与 P、算法无关地衡量硬件利用率。"""
    return algbw(n_bytes, seconds) * bus_factor(collective, p)


def nccl_ring_latency(p, protocol="LL", collective="allreduce"):
    """NCCL 调优模型（[S71]）里 NVLink 上 ring 算法的固定延迟（秒）：baseLat + nsteps × hopLat。"""
    p = check_int("p", p, lo=1)
    check_choice("protocol", protocol, NCCL_RING_BASE_US)
    check_choice("collective", collective, ("allreduce", "allgather", "reduce_scatter"))
    nsteps = 2 * (p - 1) if collective == "allreduce" else p - 1
    return (NCCL_RING_BASE_US[protocol] + nsteps * NCCL_NVLINK_HOP_US[protocol]) * 1e-6


class Fit(NamedTuple):
    alpha: float      # 每步延迟（秒）
    beta: float       # 每字节时间（秒/字节）
    intercept: float  # 拟合直线 t = intercept + slope · n 的截距（秒）
    slope: float      # 斜率（秒/字节）
    max_rel_err: float  # 拟合直线相对测量值的最大相对误差


def fit_alpha_beta(n_bytes, seconds, p, collective="allreduce", algo=None):
    """
    从测量的 (消息大小, 时间) 拟合 t = intercept + slope·n，再按算法的系数换成 α、β：
    intercept = steps·α，slope = (bytes/n)·β。
    用相对误差加权（每个点除以它的时间）：消息大小跨好几个数量级，不加权的最小二乘只看得见最大的那几个点，
    截距（α）会被大消息的噪声淹没。
    【报错】拟合出的斜率 ≤ 0（时间随消息变大反而不增）或截距 < 0 → ValueError：负的 β / α 不是答案。
    """
    n = np.asarray(_check_nonneg(np.asarray(n_bytes), "n_bytes"), dtype=np.float64)
    t = np.asarray(_check_positive(np.asarray(seconds), "seconds"), dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape or n.size < 2 or np.unique(n).size < 2:
        raise ValueError(f"n_bytes 和 seconds 必须是等长的一维数组，且至少有 2 个不同的消息大小，"
                         f"收到形状 {n.shape}、{t.shape}")
    A = np.stack([np.ones_like(n), n], axis=1) / t[:, None]     # (k, 2)，每行除以 t：相对误差
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    c = cost_terms(collective, 1.0, p, algo)
    if c.bytes == 0:
        raise ValueError(f"p = {p}：没有通信，无法拟合（需要 p ≥ 2）")
    if not b > 0:            # 时间不随消息变大而增长：β ≤ 0 没有物理意义，不返回一个"负带宽"
        raise ValueError(f"拟合出的斜率 {b:.3g} s/字节 ≤ 0：时间没有随消息大小增长（测量噪声太大、消息太小，"
                         f"或进程数超过核数被调度打乱）；β 无意义，请加大消息、多测几次取中位数")
    if a < 0:
        raise ValueError(f"拟合出的截距 {a:.3g} s < 0：α 无意义（小消息的时间太吵）；请多测小消息、取中位数")
    rel = np.max(np.abs(a + b * n - t) / t)
    return Fit(alpha=a / c.steps, beta=b / c.bytes, intercept=float(a), slope=float(b), max_rel_err=float(rel))


# =====================================================================
# 9. 输入检查（放在教学代码之后；单个参数用 course_utils 的 check_*）
# =====================================================================
# 设备数之类的整数：check_int(name, p, lo=1)；标量实数：check_real（都在 lecture01/course_utils.py）
def _check_nonneg(x, name):
    """标量（交给 check_real）或 numpy 数组，有限且 ≥ 0；返回 float 或 float64 数组。"""
    if not isinstance(x, np.ndarray):
        return check_real(name, x, lo=0.0)
    if x.dtype.kind not in "iuf":                 # 先查 dtype 再转换：'1e6' 的字符串数组、bool 数组不是字节数
        raise TypeError(f"{name} 必须是实数数组，收到 dtype={x.dtype}")
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} 必须是有限的非负数（≥ 0），收到 {x}")
    return float(arr) if arr.ndim == 0 else arr


def _check_positive(x, name):
    v = _check_nonneg(x, name)
    if np.any(np.asarray(v) <= 0):
        raise ValueError(f"{name} 必须 > 0，收到 {x}")
    return v


def _check_algo(collective, algo):
    """collective 的名字对不对；algo = None 取它的第一个（默认）算法。"""
    known = ALGORITHMS[check_choice("collective", collective, ALGORITHMS)]
    return known[0] if algo is None else check_choice(f"{collective} 的 algo", algo, known)


def _check_op(op):
    return REDUCE_OPS[check_choice("op", op, REDUCE_OPS)]


def _check_buffers(xs, name="xs", same_len=True, op=None, trace=None):
    """
    xs：每个设备一个一维 numpy 数组。返回副本列表（模拟不改动调用者的数组）。
    dtype：整数或浮点（bool 会按位或、字符串会拼接、复数没有 max/min → TypeError）；浮点数据必须有限。
    op="sum" 时先确认结果放得进这个 dtype：int8 的 100 + 100 会悄悄回绕成 −56、float16 的和会溢出成 inf。
    不换成更宽的 dtype：账本按调用者的 dtype 记字节（和真实的 NCCL 一样），换了就和公式对不上。
    """
    if trace is not None and not isinstance(trace, list):
        raise TypeError(f"trace 必须是 None 或一个列表（追加每一步的状态），收到 {type(trace).__name__}")
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name} 必须是列表（每个设备一个 numpy 数组），收到 {type(xs).__name__}")
    if len(xs) < 1:
        raise ValueError(f"{name} 至少要有 1 个设备（P ≥ 1），收到空列表")
    for i, x in enumerate(xs):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}[{i}] 必须是 numpy 数组，收到 {type(x).__name__}")
        if x.ndim != 1:
            raise ValueError(f"{name}[{i}] 必须是一维数组（形状 (n,)），收到形状 {x.shape}")
        if x.dtype.kind not in "iuf":
            raise TypeError(f"{name}[{i}] 必须是整数或浮点数组，收到 dtype={x.dtype}"
                            f"（bool 求和会变成按位或、字符串会拼接，都不是集合通信的归约）")
    if len({x.dtype for x in xs}) > 1:
        raise ValueError(f"{name} 里所有数组的 dtype 必须相同，收到 {sorted({str(x.dtype) for x in xs})}")
    if same_len and len({x.shape[0] for x in xs}) > 1:
        raise ValueError(f"{name} 里所有数组的长度必须相同，收到 {[x.shape[0] for x in xs]}")
    _check_sim_size(name, len(xs), sum(x.nbytes for x in xs), trace)     # 先查大小，再扫描数值
    for i, x in enumerate(xs):
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise ValueError(f"{name}[{i}] 含 NaN 或 ±inf：归约后每个设备都会是 NaN / inf")
    if op == "sum":
        _check_sum_fits(xs, name)
    return [x.copy() for x in xs]


def _check_sim_size(name, p, nbytes, trace):
    """设备数不超过 MAX_SIM_DEVICES；副本（输入、块、输出，trace 时每一步一份）放得进内存。"""
    if p > MAX_SIM_DEVICES:
        raise ValueError(f"{name}：模拟最多 MAX_SIM_DEVICES = {MAX_SIM_DEVICES} 个设备，收到 P = {p}"
                         f"（更大的 P 用代价模型 cost_terms / allreduce_time，不用逐条消息模拟）")
    copies = 4 + (2 * p if trace is not None else 0)
    check_memory(f"{name}（P = {p}，共 {nbytes} 字节）", copies * nbytes)


def _check_sum_fits(xs, name):
    """求和的结果放得进 dtype 吗。整数：回绕是模运算，只要最终的和在范围里，中途回绕也得到对的结果——先用每个设备的
    最大 / 最小值估，估不下来再用 Python 整数逐元素精确地算；浮点：任何部分和都不能溢出成 inf。"""
    xs = [x for x in xs if x.size]
    if not xs:
        return
    dt = xs[0].dtype
    if dt.kind in "iu":
        info = np.iinfo(dt)
        hi, lo = sum(int(x.max()) for x in xs), sum(int(x.min()) for x in xs)
        if info.min <= lo and hi <= info.max:
            return
        exact = np.sum(np.stack(xs).astype(object), axis=0)
        hi, lo = max(exact), min(exact)
        if info.min <= lo and hi <= info.max:
            return
        worst = hi if hi > info.max else lo
        raise ValueError(f"{name} 的和超出 {dt} 的范围 [{info.min}, {info.max}]（有一个元素的和是 {worst}）："
                         f"numpy 的整数加法会悄悄回绕（int8 的 100 + 100 = −56）；换成更宽的 dtype（如 int64）")
    big = float(np.finfo(dt).max)
    with np.errstate(over="ignore"):
        bound = sum(float(np.max(np.abs(x))) for x in xs)     # 任何部分和的绝对值都不超过它
    if not bound <= big:        # 浮点不像整数那样回绕：中途溢出成 inf 就回不来了，所以按部分和的上界查
        raise ValueError(f"{name} 的部分和可能超出 {dt} 的范围（Σ 各设备的 max|x| = {bound:.4g} > {big:.4g}）："
                         f"会溢出成 inf；换成更宽的 dtype（如 float64）")


def _check_bcast(x, p, root):
    """broadcast 的输入：一个一维实数数组、1 ≤ p ≤ MAX_SIM_DEVICES、0 ≤ root < p；P 个副本放得进内存。"""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x 必须是 numpy 数组，收到 {type(x).__name__}")
    p = check_int("p", p, lo=1, hi=MAX_SIM_DEVICES)
    root = check_int("root", root, lo=0, hi=p - 1)
    check_memory(f"x 的副本（p = {p} 份，每份 {x.nbytes} 字节）", 3 * p * x.nbytes)
    (x,) = _check_buffers([x], "x")
    return x, p, root


def _require_pow2(p, what):
    if p & (p - 1):
        raise ValueError(f"{what} 要求 P 是 2 的幂（1, 2, 4, 8, …），收到 P = {p}；"
                         f"非 2 的幂请用 algo='ring'，或用会折叠多余设备的 rec_doubling / rabenseifner all-reduce")


def _ceil_lg(p):
    return (p - 1).bit_length()          # ⌈log2 p⌉；p = 1 → 0


def _floor_pow2(p):
    return 1 << (p.bit_length() - 1)     # 不超过 p 的最大 2 的幂


# =====================================================================
# 10. 自检
# =====================================================================
def _reference(collective, xs, p, op="sum"):
    """numpy 的直接答案（不经过任何"发送"）：每个设备应该拿到什么。"""
    if collective == "allreduce":
        red = getattr(np, op)(np.stack(xs), axis=0)
        return [red] * p
    if collective == "reduce_scatter":
        return np.array_split(getattr(np, op)(np.stack(xs), axis=0), p)
    if collective == "allgather":
        return [np.concatenate(xs)] * p
    if collective == "alltoall":
        return [np.concatenate([np.array_split(x, p)[d] for x in xs]) for d in range(p)]
    raise ValueError(collective)


def _run_sim(collective, algo, xs):
    p = len(xs)
    fn = SIMULATORS[(collective, algo)]
    if collective == "broadcast":
        return fn(xs[0], p)
    if collective == "allgather":
        return fn(np.array_split(xs[0], p))
    return fn(xs)


def _selftest():
    rng = np.random.default_rng(20260529)
    # 1. 每种模拟 = numpy，不规则的长度、非 2 的幂的 P；all-reduce 的结果在所有设备上逐位相同
    n_checked = 0
    for (coll, algo) in SIMULATORS:
        for p in (1, 3, 4, 6, 8):
            if algo in ("rec_halving",) or (coll == "allgather" and algo == "rec_doubling"):
                if p & (p - 1):
                    continue
            n = int(rng.integers(p, 97))
            xs = [rng.standard_normal(n) for _ in range(p)]
            outs, led = _run_sim(coll, algo, xs)
            if coll == "broadcast":
                ref = [xs[0]] * p
            elif coll == "allgather":
                ref = [xs[0]] * p                       # 各块拼回去就是 xs[0]
            else:
                ref = _reference(coll, xs, p)
            for o, r in zip(outs, ref):
                assert o.shape == r.shape and np.allclose(o, r, rtol=1e-12, atol=1e-12), (coll, algo, p)
            if coll == "allreduce":
                assert all(np.array_equal(outs[0], o) for o in outs), f"{algo}：各设备的结果应逐位相同"
            # 账本的总字节数 = 每个设备实际要传的数据量（与 n 能否整除无关）
            if (coll, algo) in (("allreduce", "ring"),):
                assert led.total_bytes() == 2 * (p - 1) * n * 8
            n_checked += 1
    # 整数数据：ring all-reduce 与 numpy 精确相等；max 也对
    xs = [rng.integers(-1000, 1000, size=53) for _ in range(5)]
    outs, _ = ring_all_reduce(xs)
    assert all(np.array_equal(o, np.sum(xs, axis=0)) for o in outs)
    outs, _ = rabenseifner_all_reduce(xs, op="max")
    assert all(np.array_equal(o, np.max(xs, axis=0)) for o in outs)

    # 2. 账本 = 公式：n 能被切块数整除时，步数和关键路径字节数逐项相等
    for (coll, algo) in SIMULATORS:
        for p in (2, 3, 4, 5, 8):
            if (algo == "rec_halving" or (coll == "allgather" and algo == "rec_doubling")) and p & (p - 1):
                continue
            n = p * _floor_pow2(p) * 3                  # 同时能被 P 和 q 整除
            xs = [rng.standard_normal(n) for _ in range(p)]
            _, led = _run_sim(coll, algo, xs)
            model = cost_terms(coll, n * 8, p, algo)
            got = led.cost()
            assert got.steps == model.steps and math.isclose(got.bytes, model.bytes), (coll, algo, p, got, model)
    # ring all-reduce：每个设备发 2(P−1)/P · n
    p, n = 6, 6 * 11
    _, led = ring_all_reduce([rng.standard_normal(n) for _ in range(p)])
    assert np.all(led.bytes_sent() == 2 * (p - 1) * (n // p) * 8)

    # 3. 两级 all-reduce：结果 = numpy；intra / inter 两种链路各自的账 = 公式；时间 = 公式
    g, nn = 4, 3
    n = g * nn * 5
    xs = [rng.standard_normal(n) for _ in range(g * nn)]
    outs, led = hierarchical_all_reduce(xs, g)
    assert all(np.allclose(o, np.sum(xs, axis=0), rtol=1e-12) for o in outs)
    terms = hierarchical_allreduce_terms(n * 8, nn, g)
    for kind in ("intra", "inter"):
        c = led.cost(kind)
        assert c.steps == terms[kind].steps and math.isclose(c.bytes, terms[kind].bytes)
    a, b = {"intra": 1e-6, "inter": 5e-6}, {"intra": 1 / 450e9, "inter": 1 / 50e9}
    t_model = hierarchical_allreduce_time(n * 8, nn, g, a["intra"], b["intra"], a["inter"], b["inter"])
    assert math.isclose(led.time(a, b), t_model, rel_tol=1e-12)

    # 4. 模型的性质：busbw 的定义、交叉点、tp 接口
    p, bw = 8, 450e9
    for coll in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
        t = cost_terms(coll, 1e9, p).time(0.0, 1 / bw)          # α = 0：纯带宽
        assert math.isclose(busbw(coll, 1e9, t, p), bw), "环形算法在 α = 0 时 busbw = 链路带宽"
    ns = crossover_bytes("allreduce", p, DEFAULT_ALPHA, 1 / bw)
    c = allreduce_terms(ns, p)
    assert math.isclose(c.steps * DEFAULT_ALPHA, c.bytes / bw), "n* 处 α 项 = β 项"
    t = allreduce_time(ns, p, DEFAULT_ALPHA, 1 / bw)
    assert math.isclose(busbw("allreduce", ns, t, p), bw / 2), "n* 处 busbw = 链路带宽的一半"
    assert tp_allreduce_time(1e6, 1, 450e9) == 0.0
    assert math.isclose(tp_allreduce_time(1e6, 8, 450e9), allreduce_time(1e6, 8, DEFAULT_ALPHA, 1 / 450e9))
    nccl = nccl_ring_latency(8, "LL") / (2 * 7)
    assert abs(DEFAULT_ALPHA / nccl - 1) < 0.2, "DEFAULT_ALPHA 应接近 NCCL LL 协议 8 卡 ring 的每步延迟"
    # 拟合能从无噪声数据里还原 α、β
    sizes = np.geomspace(1e3, 1e8, 9)
    fit = fit_alpha_beta(sizes, allreduce_time(sizes, 4, 3e-5, 1 / 2e9), p=4)
    assert math.isclose(fit.alpha, 3e-5, rel_tol=1e-9) and math.isclose(fit.beta, 1 / 2e9, rel_tol=1e-9)

    # 5. 坏输入
    for bad, exc in ((lambda: allreduce_time(-1, 4, 1e-6, 1e-9), ValueError),
                     (lambda: allreduce_time(10, 0, 1e-6, 1e-9), ValueError),
                     (lambda: allreduce_time(10, 4, 1e-6, 1e-9, algo="butterfly"), ValueError),
                     (lambda: rec_halving_reduce_scatter([np.ones(6)] * 3), ValueError),
                     (lambda: ring_all_reduce([np.ones(3), np.ones(4)]), ValueError),
                     (lambda: ring_all_reduce([]), ValueError),
                     (lambda: tp_allreduce_time(1e6, 8, 0.0), ValueError)):
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError("坏输入应该抛异常")
    print(f"comm_sim 自检通过：{n_checked} 个模拟（{len(SIMULATORS)} 种算法、P = 1…8、不规则长度）= numpy，"
          f"all-reduce 各设备逐位相同；账本的步数/字节 = α-β 公式（含两级拓扑）；"
          f"busbw、交叉点 n*、tp_allreduce_time、α-β 拟合、坏输入都对")


if __name__ == "__main__":
    _selftest()
