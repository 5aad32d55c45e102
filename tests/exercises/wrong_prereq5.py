"""预备课 5 的错误答案语料（只给老师）：学生写环形步骤和 α-β 系数时常犯的错，每个都必须被检查拒绝。"""
import math

from grading import Wrong, module

cs = module("prereq5", "comm_sim")
_allreduce_terms = cs.allreduce_terms          # 别的算法（rec_doubling / rabenseifner）照原样算


def _ring(bufs, groups, ledger, op, kind, trace, phase, chunk_of, reduce=True, pos_is_rank=False):
    """环形步骤的通用骨架：chunk_of(i, s, g) 给出位置 i 在第 s 步发的块号。"""
    g = len(groups[0])
    for s in range(g - 1):
        step = ledger.new_step()
        posted = []
        for grp in groups:
            for i, r in enumerate(grp):
                c = chunk_of(r if pos_is_rank else i, s, g)
                posted.append((r, grp[(i + 1) % g], c, bufs[r][c].copy()))
        for src, dst, c, data in posted:
            ledger._send(src, dst, data.nbytes, kind)
            bufs[dst][c] = op(bufs[dst][c], data) if reduce else data
        cs._trace(trace, phase, step, bufs)


def rs_chunk_off_by_one(bufs, groups, ledger, op, kind="link", trace=None):
    _ring(bufs, groups, ledger, op, kind, trace, "reduce-scatter", lambda i, s, g: (i - s) % g)


def rs_rank_not_position(bufs, groups, ledger, op, kind="link", trace=None):
    _ring(bufs, groups, ledger, op, kind, trace, "reduce-scatter", lambda i, s, g: (i - s - 1) % g,
          pos_is_rank=True)


def rs_one_step_short(bufs, groups, ledger, op, kind="link", trace=None):
    """reduce-scatter 只走 g − 2 步（range 的上界少了一）：每块少加了一个设备。"""
    g = len(groups[0])
    for s in range(g - 2):
        step = ledger.new_step()
        posted = []
        for grp in groups:
            for i, r in enumerate(grp):
                c = (i - s - 1) % g
                posted.append((r, grp[(i + 1) % g], c, bufs[r][c].copy()))
        for src, dst, c, data in posted:
            ledger._send(src, dst, data.nbytes, kind)
            bufs[dst][c] = op(bufs[dst][c], data)
        cs._trace(trace, "reduce-scatter", step, bufs)


def rs_whole_buffer(bufs, groups, ledger, op, kind="link", trace=None):
    """每步把整条向量（原始数据）沿环转发，接收方全部加上：结果对，但每步发 n 字节而不是 n/P。"""
    g = len(groups[0])
    carry = {r: [c.copy() for c in bufs[r]] for grp in groups for r in grp}
    for _ in range(g - 1):
        step = ledger.new_step()
        posted = [(r, grp[(i + 1) % g], carry[r]) for grp in groups for i, r in enumerate(grp)]
        for src, dst, data in posted:
            ledger._send(src, dst, sum(d.nbytes for d in data), kind)
            for c in range(g):
                bufs[dst][c] = op(bufs[dst][c], data[c])
        carry = {dst: data for _, dst, data in posted}
        cs._trace(trace, "reduce-scatter", step, bufs)


def ag_skipped(bufs, groups, ledger, kind="link", trace=None):
    """all-reduce 只做了 reduce-scatter：每个设备只有自己那一块是和。"""
    return None


def ag_chunk_off_by_one(bufs, groups, ledger, kind="link", trace=None):
    _ring(bufs, groups, ledger, None, kind, trace, "all-gather", lambda i, s, g: (i - s - 1) % g, reduce=False)


def ag_rank_not_position(bufs, groups, ledger, kind="link", trace=None):
    _ring(bufs, groups, ledger, None, kind, trace, "all-gather", lambda i, s, g: (i - s) % g, reduce=False,
          pos_is_rank=True)


def ag_reduces_again(bufs, groups, ledger, kind="link", trace=None):
    """all-gather 阶段把收到的块又加到自己的块上（应该覆盖）。"""
    import numpy as np
    _ring(bufs, groups, ledger, np.add, kind, trace, "all-gather", lambda i, s, g: (i - s) % g)


def terms_latency_p(n_bytes, p, algo="ring"):
    if algo == "ring":
        c = _allreduce_terms(n_bytes, p, algo)
        return cs.Cost(2 * p, c.bytes)                      # 步数写成 2P（应为 2(P−1)）
    return _allreduce_terms(n_bytes, p, algo)


def terms_bandwidth_n(n_bytes, p, algo="ring"):
    if algo == "ring":
        return cs.Cost(2 * (p - 1), 1.0 * n_bytes)          # 字节写成 n（应为 2(P−1)/P·n）
    return _allreduce_terms(n_bytes, p, algo)


def terms_ring_one_phase(n_bytes, p, algo="ring"):
    if algo == "ring":
        return cs.Cost(p - 1, (p - 1) / p * n_bytes)        # 只算了 reduce-scatter
    return _allreduce_terms(n_bytes, p, algo)


def terms_tree_floor_log(n_bytes, p, algo="ring"):
    if algo == "tree":
        lg = int(math.log2(p))                              # 向下取整：P = 6 时算成 2 而不是 3
        return cs.Cost(2 * lg, 2 * lg * n_bytes)
    return _allreduce_terms(n_bytes, p, algo)


def terms_tree_no_broadcast(n_bytes, p, algo="ring"):
    if algo == "tree":
        lg = (p - 1).bit_length()
        return cs.Cost(lg, lg * n_bytes)                    # 只算了 reduce，忘了 broadcast
    return _allreduce_terms(n_bytes, p, algo)


def terms_tree_chunked(n_bytes, p, algo="ring"):
    if algo == "tree":
        lg = (p - 1).bit_length()
        return cs.Cost(2 * lg, 2 * lg * n_bytes / p)        # 把树也当成分块发（每步 n/P）
    return _allreduce_terms(n_bytes, p, algo)


_RS, _AG, _T = "_ring_rs_steps", "_ring_ag_steps", "allreduce_terms"
VARIANTS = [
    Wrong("P5.1", "prereq5", "comm_sim", _AG, "跳过 all-gather", ag_skipped),
    Wrong("P5.1", "prereq5", "comm_sim", _RS, "reduce-scatter 块号差一（发块 i−s）", rs_chunk_off_by_one),
    Wrong("P5.1", "prereq5", "comm_sim", _RS, "每步发整条向量", rs_whole_buffer),
    Wrong("P5.1", "prereq5", "comm_sim", _RS, "reduce-scatter 用设备号代替组内位置", rs_rank_not_position),
    Wrong("P5.1", "prereq5", "comm_sim", _RS, "reduce-scatter 少走一步", rs_one_step_short),
    Wrong("P5.1", "prereq5", "comm_sim", _AG, "all-gather 块号差一（发块 i−s−1）", ag_chunk_off_by_one),
    Wrong("P5.1", "prereq5", "comm_sim", _AG, "all-gather 用设备号代替组内位置", ag_rank_not_position),
    Wrong("P5.1", "prereq5", "comm_sim", _AG, "all-gather 把收到的块再加一遍", ag_reduces_again),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "ring 延迟项写成 2P 步", terms_latency_p),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "ring 带宽项写成 n", terms_bandwidth_n),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "ring 只算 reduce-scatter 一段", terms_ring_one_phase),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "tree 的 log2 向下取整", terms_tree_floor_log),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "tree 忘了 broadcast 一半", terms_tree_no_broadcast),
    Wrong("P5.2", "prereq5", "comm_sim", _T, "tree 也按 n/P 分块算字节", terms_tree_chunked),
]
