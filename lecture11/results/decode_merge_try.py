# ruff: noqa: E501, B007, B023, F821   （试验脚本原样存档：在 GPU 上跑的就是这一份）
"""
flash_decode 的"截距"在哪（B = 1、S = 32k：35 µs 里约 6 µs 不是在读 K/V）。一次 GPU 调用：
  1. 时间戳：第一步、第二步内核的每个程序在入口、gdc_wait 之后、循环结束、出口读 %globaltimer（和 SM 号），
     录进一张 8 次调用的 CUDA 图重放 → 每次调用里各阶段的时间线。
  2. 变体计时（CUDA 图，轮流 3 轮取最快）：
       base   = triton_flash.flash_decode（现在的两个内核）
       copy   = 本脚本里的同一份内核（确认复制件和 base 一样快）
       early  = 合并内核在 gdc_wait 之后 gdc_launch_dependents（下一次调用的第一步提前上 SM）
       last   = 一个内核、最后到的程序合并（原子计数器，自己清零）
       k1     = 只有第一步（不合并：看合并值多少）
       sdpa
用法：python3 lecture11/results/decode_merge_try.py $OUT（在 GPU 上跑的是同一份，当时放在 .gpu/intercept_try.py；
之后加了 ORDER 开关给 decode_order_try.py 用，ORDER = 0 就是原来的顺序）
"""
import importlib.util
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # lecture11/results/ 之上两层
SHAPES = ((1, 32768), (1, 131072), (1, 8192), (8, 32768), (64, 8192))
ROUNDS = 3
STAMP_CALLS = 8
MERGES = ("m:128:4", "m:128:1", "m:64:2", "m:64:1", "m:32:1", "m:32:4")
STAMP_MODES = ("early", "m:128:1", "m:32:1", "last3")
TIME_MODES = ("copy", "early") + MERGES + ("last3", "k1")


def load_bench():
    path = os.path.join(ROOT, "lecture11", "07_decode_bench.py")
    spec = importlib.util.spec_from_file_location("decode_bench_07", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = load_bench()
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton_flash as tf  # noqa: E402


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _merge_row(O_PART, LSE_PART, OUT, first, r, b, h, offs_d, N_SPLITS, stride_ob, stride_on, stride_oh,
               N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < N_SPLITS
    part = (first + splits) * (R * N_NEW) + r
    lse = tl.load(LSE_PART + part, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
    o = tl.load(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0,
                cache_modifier=".cg")
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tf._decode_store(OUT, merged, b, h, r, offs_d < HEAD_DIM, offs_d, stride_ob, stride_on, stride_oh, N_NEW, R)


@triton.jit
def _blk(q, k_base, v_base, start, hi, m_i, l_i, acc, offs_d, stride_kn, stride_vn, qk_scale,
         BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)
    col_ok = cols < hi
    k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = tl.where(col_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _dk(Q, K, V, SEQLENS, OUT, O_PART, LSE_PART, COUNTERS, STAMPS, qk_scale, S_MAX, N_KV_HEADS, N_SPLITS,
        stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
        stride_ob, stride_on, stride_oh,
        N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
        STAMP: tl.constexpr, LAST: tl.constexpr, BLOCK_S: tl.constexpr, LAST3: tl.constexpr = False,
        ORDER: tl.constexpr = 0):
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // N_KV_HEADS
    h = bh % N_KV_HEADS
    pid = bh * N_SPLITS + split
    if STAMP:
        tl.store(STAMPS + pid * 6 + 0, _now())
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if STAMP:
        tl.store(STAMPS + pid * 6 + 1, _now())
    seq_len = tl.minimum(tl.load(SEQLENS + b), S_MAX)
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    lo = (split * n_blocks // N_SPLITS) * BLOCK_N
    hi = tl.minimum(((split + 1) * n_blocks // N_SPLITS) * BLOCK_N, seq_len)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < R * N_NEW
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = (Q + b * stride_qb + (rows % N_NEW)[:, None] * stride_qn + (h * R + rows // N_NEW)[:, None] * stride_qh
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    if ORDER == 0:                                # 连续的一段（现在的做法）
        for start in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _blk(q, k_base, v_base, start, hi, m_i, l_i, acc, offs_d, stride_kn, stride_vn, qk_scale,
                                 BLOCK_N, PREC)
    elif ORDER == 1:                              # 连续的一段，但各段从不同的相位开始、绕一圈
        first = split * n_blocks // N_SPLITS
        nb = (split + 1) * n_blocks // N_SPLITS - first
        shift = split * nb // N_SPLITS
        for i in range(0, nb):
            start = (first + (i + shift) % nb) * BLOCK_N
            m_i, l_i, acc = _blk(q, k_base, v_base, start, seq_len, m_i, l_i, acc, offs_d, stride_kn, stride_vn,
                                 qk_scale, BLOCK_N, PREC)
    else:                                         # 交错：第 s 段取第 s、s + N_SPLITS、… 块
        for blk in range(split, n_blocks, N_SPLITS):
            m_i, l_i, acc = _blk(q, k_base, v_base, blk * BLOCK_N, seq_len, m_i, l_i, acc, offs_d, stride_kn,
                                 stride_vn, qk_scale, BLOCK_N, PREC)
    if STAMP:
        tl.store(STAMPS + pid * 6 + 2, tl.sum(l_i, 0).to(tl.int64) * 0 + _now())   # 依赖 l_i：循环真的结束了
    seen = l_i > 0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    part = (bh * N_SPLITS + split) * (R * N_NEW) + rows
    tl.store(LSE_PART + part, lse, mask=row_ok)
    tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
    if LAST:
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNTERS + bh, 1, sem="acq_rel", scope="gpu")
        if arrived == N_SPLITS - 1:
            for r in tl.static_range(R * N_NEW):
                _merge_row(O_PART, LSE_PART, OUT, bh * N_SPLITS, r, b, h, offs_d, N_SPLITS,
                           stride_ob, stride_on, stride_oh, N_NEW, R, HEAD_DIM, BLOCK_S)
            tl.atomic_xchg(COUNTERS + bh, 0, sem="relaxed", scope="gpu")
    if LAST3:
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNTERS + bh, 1, sem="acq_rel", scope="gpu")
        if arrived == N_SPLITS - 1:
            _merge_all(O_PART, LSE_PART, OUT, bh, b, h, N_SPLITS, stride_ob, stride_on, stride_oh,
                       N_NEW, R, HEAD_DIM, BLOCK_S, 4)
            tl.atomic_xchg(COUNTERS + bh, 0, sem="relaxed", scope="gpu")
    if STAMP:
        tl.debug_barrier()
        tl.store(STAMPS + pid * 6 + 3, _now())
        tl.store(STAMPS + pid * 6 + 4, _smid().to(tl.int64))
        tl.store(STAMPS + pid * 6 + 5, seq_len.to(tl.int64))


@triton.jit
def _mk(O_PART, LSE_PART, OUT, STAMPS, N_KV_HEADS, N_SPLITS, stride_ob, stride_on, stride_oh,
        N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
        PDL: tl.constexpr, EARLY: tl.constexpr, STAMP: tl.constexpr):
    r = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    pid = bh * (R * N_NEW) + r
    if STAMP:
        tl.store(STAMPS + pid * 4 + 0, _now())
    if PDL:
        tl.extra.cuda.gdc_wait()
        if EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    if STAMP:
        tl.store(STAMPS + pid * 4 + 1, _now())
    _merge_row(O_PART, LSE_PART, OUT, bh * N_SPLITS, r, bh // N_KV_HEADS, bh % N_KV_HEADS, tl.arange(0, HEAD_DIM),
               N_SPLITS, stride_ob, stride_on, stride_oh, N_NEW, R, HEAD_DIM, BLOCK_S)
    if STAMP:
        tl.debug_barrier()
        tl.store(STAMPS + pid * 4 + 2, _now())
        tl.store(STAMPS + pid * 4 + 3, _smid().to(tl.int64))


@triton.jit
def _mk2(O_PART, LSE_PART, OUT, STAMPS, N_KV_HEADS, N_SPLITS, stride_ob, stride_on, stride_oh,
         N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
         D_CHUNK: tl.constexpr, EARLY: tl.constexpr, STAMP: tl.constexpr):
    r = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2)
    pid = (bh * (R * N_NEW) + r) * (HEAD_DIM // D_CHUNK) + c
    if STAMP:
        tl.store(STAMPS + pid * 4 + 0, _now())
    tl.extra.cuda.gdc_wait()
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    if STAMP:
        tl.store(STAMPS + pid * 4 + 1, _now())
    offs_d = c * D_CHUNK + tl.arange(0, D_CHUNK)
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < N_SPLITS
    part = (bh * N_SPLITS + splits) * (R * N_NEW) + r
    lse = tl.load(LSE_PART + part, mask=s_ok, other=float("-inf"))
    o = tl.load(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tf._decode_store(OUT, merged, bh // N_KV_HEADS, bh % N_KV_HEADS, r, offs_d < HEAD_DIM, offs_d,
                     stride_ob, stride_on, stride_oh, N_NEW, R)
    if STAMP:
        tl.debug_barrier()
        tl.store(STAMPS + pid * 4 + 2, _now())
        tl.store(STAMPS + pid * 4 + 3, _smid().to(tl.int64))


@triton.jit
def _merge_all(O_PART, LSE_PART, OUT, bh, b, h, N_SPLITS, stride_ob, stride_on, stride_oh,
               N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
               RP: tl.constexpr):
    """一个 (b, h) 的 [N_SPLITS, R·n, d] 草稿一次读进来（连续的一块）：[BLOCK_S·RP, d] → [BLOCK_S, RP, d]。"""
    idx = tl.arange(0, BLOCK_S * RP)
    sp = idx // RP
    rr = idx % RP
    ok = (sp < N_SPLITS) & (rr < R * N_NEW)
    part = (bh * N_SPLITS + sp) * (R * N_NEW) + rr
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(LSE_PART + part, mask=ok, other=float("-inf"), cache_modifier=".cg")
    o = tl.load(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0,
                cache_modifier=".cg")
    lse3 = tl.reshape(lse, [BLOCK_S, RP])
    o3 = tl.reshape(o, [BLOCK_S, RP, HEAD_DIM])
    m = tl.max(lse3, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse3 - m_safe[None, :])
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, :, None] * o3, 0) / tl.where(total > 0, total, 1.0)[:, None]      # [RP, d]
    rows = tl.arange(0, RP)
    tf._decode_store(OUT, merged, b, h, rows[:, None], (rows < R * N_NEW)[:, None], offs_d[None, :],
                     stride_ob, stride_on, stride_oh, N_NEW, R)


class Variant:
    """mode: copy / early / last / k1；stamps：None 或 (k1 [P, 6], merge [M, 4]) int64。"""

    def __init__(self, q, k, v, lens, mode, stamps=None, order=0):
        B, hq, d = q.shape
        s_max, hk = k.shape[1], k.shape[2]
        self.R = hq // hk
        (self.block_n, self.warps, self.stages), self.splits = tf.decode_plan(B, hk, s_max, tf._sm_count(q.device))
        self.q, self.k, self.v, self.lens, self.mode = q, k, v, lens, mode
        n_rows = B * hk * self.splits * self.R
        self.o_part = torch.empty(n_rows * d, device=q.device, dtype=torch.float32)
        self.lse_part = torch.empty(n_rows, device=q.device, dtype=torch.float32)
        self.counters = torch.zeros(B * hk, device=q.device, dtype=torch.int32)
        self.out = torch.empty_like(q)
        self.B, self.hk, self.d, self.s_max = B, hk, d, s_max
        self.stamps = stamps
        self.order = order
        self.dummy = torch.zeros(8, device=q.device, dtype=torch.int64)

    def __call__(self, stamp_slot=None):
        q, k, v, out = self.q, self.k, self.v, self.out
        st1 = self.dummy if stamp_slot is None else stamp_slot[0]
        st2 = self.dummy if stamp_slot is None else stamp_slot[1]
        stamp = stamp_slot is not None
        scale = 1 / math.sqrt(self.d) * math.log2(math.e)
        bs = max(2, triton.next_power_of_2(self.splits))
        _dk[(self.splits, self.B * self.hk)](
            q, k, v, self.lens, out, self.o_part, self.lse_part, self.counters, st1, scale, self.s_max, self.hk,
            self.splits, q.stride(0), 0, q.stride(1), *k.stride()[:3], *v.stride()[:3], out.stride(0), 0, out.stride(1),
            N_NEW=1, R=self.R, HEAD_DIM=self.d, BLOCK_M=16, BLOCK_N=self.block_n, PREC=tf._prec(q.dtype), SPLIT=True, PDL=True,
            STAMP=stamp, LAST=self.mode == "last", BLOCK_S=bs, LAST3=self.mode == "last3", ORDER=self.order, num_warps=self.warps,
            num_stages=self.stages, launch_pdl=True)
        if self.mode in ("copy", "early"):
            _mk[(self.R, self.B * self.hk)](
                self.o_part, self.lse_part, out, st2, self.hk, self.splits, out.stride(0), 0, out.stride(1),
                N_NEW=1, R=self.R, HEAD_DIM=self.d, BLOCK_S=bs, PDL=True, EARLY=self.mode == "early", STAMP=stamp,
                num_warps=4, launch_pdl=True)
        if self.mode.startswith("m:"):
            _, dc, nw = self.mode.split(":")
            _mk2[(self.R, self.B * self.hk, self.d // int(dc))](
                self.o_part, self.lse_part, out, st2, self.hk, self.splits, out.stride(0), 0, out.stride(1),
                N_NEW=1, R=self.R, HEAD_DIM=self.d, BLOCK_S=bs, D_CHUNK=int(dc), EARLY=True, STAMP=stamp,
                num_warps=int(nw), launch_pdl=True)
        return out

    def merge_programs(self):
        if self.mode.startswith("m:"):
            return self.R * self.B * self.hk * (self.d // int(self.mode.split(":")[1]))
        return self.R * self.B * self.hk


def stamp_run(B, S, mode):
    """STAMP_CALLS 次调用录进一张图、重放两次，返回第二次的时间戳（ns，相对最早的入口）。"""
    q, k, v, lens = bench.make_inputs(torch, B, S)
    var = Variant(q, k, v, lens, mode)
    P = var.splits * B * var.hk
    M = var.merge_programs()
    st1 = torch.zeros(STAMP_CALLS, P, 6, device="cuda", dtype=torch.int64)
    st2 = torch.zeros(STAMP_CALLS, M, 4, device="cuda", dtype=torch.int64)
    for i in range(3):
        var((st1[0], st2[0]))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        var((st1[0], st2[0]))
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(STAMP_CALLS):
            var((st1[i], st2[i]))
    g.replay()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    a, m = st1.cpu(), st2.cpu()
    t0 = int(a[:, :, 0].min())
    calls = []
    for i in range(STAMP_CALLS):
        k1 = a[i].clone()
        k1[:, :4] -= t0
        mm = m[i].clone()
        mm[:, :3] -= t0
        c = dict(k1_entry=[int(x) for x in k1[:, 0]], k1_wait=[int(x) for x in k1[:, 1]],
                 k1_loop=[int(x) for x in k1[:, 2]], k1_exit=[int(x) for x in k1[:, 3]],
                 k1_sm=[int(x) for x in k1[:, 4]])
        if not mode.startswith("last"):
            c.update(m_entry=[int(x) for x in mm[:, 0]], m_wait=[int(x) for x in mm[:, 1]],
                     m_exit=[int(x) for x in mm[:, 2]], m_sm=[int(x) for x in mm[:, 3]])
        calls.append(c)
    ok = tf._rel_err(var().double(), tf.reference_decode(q, k, v, lens).to(q.device).double())
    return dict(B=B, S=S, mode=mode, splits=var.splits, config=[var.block_n, var.warps, var.stages], calls=calls,
                err_vs_fp64=ok)


def summarize(st):
    """每次调用：入口最早/最晚，wait 之后，循环结束的分位数，出口最晚，合并的入口/wait/出口（µs，相对第 1 次调用的最早入口）。"""
    import statistics

    def q(xs, f):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(f * len(xs)))] / 1e3
    lines = []
    for i, c in enumerate(st["calls"]):
        loop = [b - a for a, b in zip(c["k1_wait"], c["k1_loop"])]
        s = (f"  call {i}: k1 entry {q(c['k1_entry'], 0):7.2f}..{q(c['k1_entry'], 1):7.2f}  wait→ {q(c['k1_wait'], 0):7.2f}"
             f"..{q(c['k1_wait'], 1):7.2f}  loop_end p0/50/100 {q(c['k1_loop'], 0):7.2f}/{q(c['k1_loop'], .5):7.2f}/"
             f"{q(c['k1_loop'], 1):7.2f}  exit max {q(c['k1_exit'], 1):7.2f}  loop dur med {statistics.median(loop) / 1e3:6.2f}"
             f" min {min(loop) / 1e3:6.2f} max {max(loop) / 1e3:6.2f}  SMs {len(set(c['k1_sm']))}")
        if "m_entry" in c:
            s += (f" | merge entry {q(c['m_entry'], 0):7.2f}..{q(c['m_entry'], 1):7.2f} wait→ {q(c['m_wait'], 0):7.2f}.."
                  f"{q(c['m_wait'], 1):7.2f} exit {q(c['m_exit'], 1):7.2f}  merge dur med "
                  f"{statistics.median(b - a for a, b in zip(c['m_wait'], c['m_exit'])) / 1e3:5.2f} max "
                  f"{max(b - a for a, b in zip(c['m_wait'], c['m_exit'])) / 1e3:5.2f}")
        lines.append(s)
    return lines


def main(out_dir):
    t0 = time.time()
    meta = bench.gpu_meta(torch, n_sm=torch.cuda.get_device_properties(0).multi_processor_count)
    copy = bench.copy_bandwidth(torch)
    print(f"{meta['gpu']} copy {copy['best'] / 1e12:.2f} TB/s", flush=True)
    res = dict(meta=meta, copy=copy, stamps=[], rows=[])
    for B, S, mode in [(1, 32768, m) for m in STAMP_MODES]:
        st = stamp_run(B, S, mode)
        res["stamps"].append(st)
        print(f"时间戳 B={B} S={S} {mode}  err vs fp64 {st['err_vs_fp64']:.1e}  ({time.time() - t0:.0f} s)")
        print("\n".join(summarize(st)), flush=True)
        torch.cuda.empty_cache()
    for B, S in SHAPES:
        q, k, v, lens = bench.make_inputs(torch, B, S)
        kv = 2 * B * S * bench.HK * bench.D * 2
        fns = {"base": lambda: tf.flash_decode(q, k, v, lens)}
        for mode in TIME_MODES:
            fns[mode] = Variant(q, k, v, lens, mode)
        fns["sdpa"] = bench.impl_fns(torch, tf, q, k, v, lens)["sdpa"]
        ref = fns["base"]().double()
        errs = {n: (tf._rel_err(f().double(), ref) if n != "k1" else None) for n, f in fns.items()}
        times = {n: [] for n in fns}
        for _ in range(ROUNDS):
            for n, f in fns.items():
                times[n].append(bench.graph_time(torch, f, target_s=2e-3, trials=3))
        for n in fns:
            t = min(times[n])
            row = dict(B=B, S=S, variant=n, gpu_s=t, rounds=times[n], copy_frac=kv / t / copy["best"], err=errs[n])
            res["rows"].append(row)
            print(f"B={B:<3d} S={S:<7d} {n:6s} {t * 1e6:8.2f} µs  ({'/'.join(f'{x * 1e6:.2f}' for x in times[n])})"
                  f"  {row['copy_frac'] * 100:5.1f}% copy  err {errs[n] if errs[n] is None else f'{errs[n]:.1e}'}",
                  flush=True)
        del q, k, v, lens, fns
        torch.cuda.empty_cache()
    need = 2 * 32768 * bench.HK * bench.D * 2 / (0.9 * copy["best"])
    print(f"90% copy at B=1 S=32k needs <= {need * 1e6:.2f} µs  ({time.time() - t0:.0f} s)")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "decode_merge_try.json"), "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ["OUT"])
