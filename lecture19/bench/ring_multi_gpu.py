"""
第 19 讲 · 工作台 ring_multi_gpu.py：在几块真的 GPU 上跑环形注意力（NCCL）——结果和单卡一样吗？通信能藏在计算后面多少？

你会看到……
  1. 已提交的实测（lecture19/bench/results/ring_multi_gpu.json：2×H200、NCCL，一个进程一块 GPU；文件里记着日期、
     GPU、驱动、torch / NCCL 版本、NCCL 的环境变量和 `nvidia-smi topo -m`）。
  2. 正确性：ring_dist.ring_attention_dist 在 P 块 GPU 上（contiguous / striped，causal / 非 causal，bf16）
     拼出的输出，和整条序列的 float64 注意力比；判据是 flash-attn 的规则：误差 ≤ 2 × PyTorch 自己 bf16 SDPA 的误差。
  3. 每轮的时间线（每块 GPU 4k … 64k token，16 头，d = 128，bf16，causal，striped）：ring_dist.RingEvents 在真正重叠的
     环里，计算流上用 CUDA 事件夹住每轮的"算"（块注意力 + 合并），旁路流上夹住"传"（NCCL 的 P2P 收发）。
     同样的环不重叠地跑一遍（先传完再算），得到"单独算""单独传"的每轮时间。两个读数（目标：每块 ≥ 16k 时 ≥ 80%）：
       藏住     = 1 − 传没被盖住 / Σ传·单独：重叠的环里"在传、却没在算"的时间，占单独传要花的时间的比例；
       有效藏住 = (不重叠的环 − 重叠的环) / Σ传·单独，交替成对地测：重叠实际省下的时间（计算被拖慢也扣掉了）。
     |传 ∩ 算| / |传|（重叠率）只作诊断：NCCL 排在注意力内核后面等 SM 时，传的区间被拉长、落在算里面，
     这个比例按构造接近 100%，不说明省下了什么。
  4. 变体（每个一次 torchrun；NCCL 的环境变量在建通信器时读）：默认；NCCL_MAX_NCHANNELS=2（NCCL 少占 SM）；
     TORCH_NCCL_HIGH_PRIORITY=1（NCCL 的流是高优先级）；每块换成第 11 讲的 Triton FlashAttention
     （triton_flash.flash_attn_func，return_lse=True）。
  5. 模型：一轮计算 = 这一轮的 FLOPs / 实测的单块吞吐；一轮通信 = α + 字节 × β
     （prereq5/bench/nccl_measure.py 的 NCCL 拟合）；重叠后 = max(计算, 通信)。P = 4 / 8 没有在真机上测过。
  6. 图（存进 lecture19/bench/figures/；--replot 才重画已提交的 results/ring_multi_gpu.png）。上左：藏住 / 有效藏住和
     80% 目标；上右：每轮的实测 vs 模型；下：32k 时第一个变体 default 和藏住最低的变体（这次是 triton）各一个环的
     甘特图——每轮的算和传在什么时候

在 2 块 GPU 上重新测时间线（四个变体 + 合并进 ring_multi_gpu.json；提交的那次 118 s）：
    bash lecture19/bench/run_ring_gpu.sh
  没有 GPU 时：bash lecture19/bench/run_ring_gpu.sh --cpu（gloo + 小尺寸，结果写到临时目录）
正确性 + 旧的总时间计时（重写 ring_multi_gpu.json 的 checks / times，保留时间线，约 2 分钟）：
    torchrun --nproc_per_node=2 lecture19/bench/ring_multi_gpu.py --measure
只读结果、画图（没有 GPU 也行）：python3 lecture19/bench/ring_multi_gpu.py [--quick | --replot]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))          # lecture19/bench
LESSON = os.path.dirname(HERE)                              # lecture19：工作台导入课，课从不导入工作台
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
sys.path.insert(0, os.path.join(LESSON, "..", "prereq5"))
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01", "bench"))          # gpu_timing

SKIP = 77
RESULTS = os.path.join(HERE, "results", "ring_multi_gpu.json")
RESULT_PNG = "ring_multi_gpu.png"      # 已提交的图 results/<它>：只有 --replot 才重画（committed_figure）
NCCL_RESULTS = os.path.join(LESSON, "..", "prereq5", "bench", "results", "nccl_measure.json")
HEADS, D = 16, 128
LOCAL_LENS = (4096, 8192, 16384, 32768, 65536)      # 每块 GPU 上的 token 数
CHECK_LENS = (1024, 4096)                            # 正确性检查用的每块长度（float64 参考放得下）


# =============================================================================
# 一块注意力：FlashAttention-2 内核 + 它返回的 logsumexp → (m, ℓ, o) 状态
# =============================================================================
def flash_block(q, k, v, qpos, kpos, causal, scale):
    """
    ring_attention_dist 的 block 钩子（GPU，PyTorch 的 FlashAttention-2 内核）：q [B, H, n, d]，k、v [B, H, m, d]
    （bf16），qpos / kpos 是 CPU 上的全局位置。返回 ((m, ℓ, o) 或 None, 算了多少对)。

    一个已归一化的块输出 O 和它的 lse 就是一个合法的状态：m = lse、ℓ = 1、o = O（合并时 exp(m − m') 的换算一样成立）。
    因果掩码只会出现三种块：整块可见（键都在查询之前）、整块在未来（跳过）、和自己那段（对角块，is_causal）；
    striped 布局里"上一块设备"的那段是错开一位的对角块：第 i 个查询看得见第 j < i 个键——去掉第 0 个查询和
    最后一个键，就又是普通的对角块，第 0 行什么也看不见（状态 (−∞, 0, 0)）。
    """
    return _block_with(_flash_state, q, k, v, qpos, kpos, causal, scale)


def triton_block(q, k, v, qpos, kpos, causal, scale):
    """同 flash_block，每块换成第 11 讲的 triton_flash.flash_attn_func（GPU；CPU 上要 TRITON_INTERPRET=1）。"""
    return _block_with(_triton_state, q, k, v, qpos, kpos, causal, scale)


def explicit_block(q, k, v, qpos, kpos, causal, scale):
    """同 flash_block，每块用显式的分数矩阵（float64）：CPU 上（gloo）走一遍测量代码时用。"""
    return _block_with(_explicit_state, q, k, v, qpos, kpos, causal, scale)


def _block_with(state, q, k, v, qpos, kpos, causal, scale):
    """三种块的分派（见 flash_block）；state(q, k, v, is_causal, scale) → ((lse, 1, O), None) 算一块。"""
    import torch
    n, m = q.shape[-2], k.shape[-2]
    mode = _block_mode(qpos, kpos, causal)
    if mode == "skip":
        return None, 0
    if mode == "shifted":
        (m1, l1, o1), _ = state(q[..., 1:, :], k[..., :-1, :], v[..., :-1, :], True, scale)
        pad_m = torch.full_like(m1[..., :1], float("-inf"))
        st = (torch.cat([pad_m, m1], -1), torch.cat([torch.zeros_like(l1[..., :1]), l1], -1),
              torch.cat([torch.zeros_like(o1[..., :1, :]), o1], -2))
        return st, (n - 1) * n // 2
    st, _ = state(q, k, v, mode == "diag", scale)
    return st, (n * (n + 1) // 2 if mode == "diag" else n * m)


def _flash_state(q, k, v, is_causal, scale):
    import torch
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[:2]
    return (lse, torch.ones_like(lse), out.float()), None       # lse: [B, H, n] float32


def _triton_state(q, k, v, is_causal, scale):
    """
    triton_flash 用 flash-attn 的布局 [B, N, H, d]：transpose(1, 2) 只换步长；内核每种布局只收一组步长，
    flash_attn_func 把不连续的输入拷成连续的（每块一次 O(n·H·d) 的拷贝）。causal 按右下角对齐，
    对角块 n = m，和左上角对齐一样。
    """
    import torch
    out, lse = _triton_flash().flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               softmax_scale=scale, causal=is_causal, return_lse=True)
    return (lse, torch.ones_like(lse), out.transpose(1, 2).float()), None     # out [B, n, H, d] → [B, H, n, d]


def _triton_flash():
    """按需导入 lecture11/triton_flash（只有选了 triton 块才导入；它在导入时读 TRITON_INTERPRET）。"""
    sys.path.insert(0, os.path.join(LESSON, "..", "lecture11"))
    import triton_flash
    return triton_flash


def _explicit_state(q, k, v, is_causal, scale):
    """和 FlashAttention 内核同样的输出 (lse, 1, O)，显式算 float64 的分数矩阵（参考；CPU）。"""
    import torch
    S = (q.double() @ k.double().transpose(-2, -1)) * scale          # [B, H, n, m]
    if is_causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device).triu(1), float("-inf"))
    lse = torch.logsumexp(S, -1)                                      # [B, H, n]
    return (lse, torch.ones_like(lse), torch.softmax(S, -1) @ v.double()), None


BLOCKS = {"aten": flash_block, "triton": triton_block, "explicit": explicit_block}


def _block_mode(qpos, kpos, causal):
    """块的种类（只看 CPU 上的位置，不碰 GPU）：full / skip / diag / shifted；别的形状这个钩子不处理。"""
    if not causal or int(kpos.max()) <= int(qpos.min()):
        return "full"
    if int(kpos.min()) > int(qpos.max()):
        return "skip"
    delta = kpos - qpos                                   # 同一段：0；striped 的别的段：一个常数，|delta| < 步长
    stride = int(qpos[1] - qpos[0]) if qpos.numel() > 1 else 1
    even = bool((qpos.diff() == stride).all()) and bool((kpos.diff() == stride).all())
    if even and bool(((delta <= 0) & (delta > -stride)).all()):
        return "diag"                                     # 键 j 可见 ⟺ j ≤ i
    if even and bool(((delta > 0) & (delta < stride)).all()):
        return "shifted"                                  # 键 j 可见 ⟺ j < i
    raise ValueError("flash_block 只处理 contiguous / striped 布局产生的块")


# =============================================================================
# 测量（torchrun，一个进程一块 GPU）
# =============================================================================
def _cuda_time(fn, reps):
    """gpu_timing.cuda_time：预热一次，7 组、每组连着 reps 次取平均，取最快的一组（秒）。"""
    from gpu_timing import cuda_time
    return cuda_time(fn, reps, trials=7)


def _paired_gap(fa, fb, pairs):
    """
    交替各跑一次 fa、fb（奇数对先 fb），共 pairs 对；返回每对 t(fb) − t(fa) 的中位数（秒）。
    为什么成对：GPU 的频率、温度、别的进程造成的慢漂移对一对里的两次几乎一样，差值里抵消——
    要量的"被藏住的通信"只占整个环的几个百分点（report 打印实测的比例），分开测两个平均值再相减，漂移就比它还大。
    """
    import torch
    gaps = []
    for i in range(pairs):
        t = {}
        for name, f in ((("a", fa), ("b", fb)) if i % 2 == 0 else (("b", fb), ("a", fa))):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            e1.synchronize()
            t[name] = e0.elapsed_time(e1) / 1e3
        gaps.append(t["b"] - t["a"])
    return float(np.median(gaps))


def _max_over_ranks(x, device):
    import torch
    import torch.distributed as dist
    t = torch.tensor([x], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def _check_correctness(ll, rank, world, device, seed, block=flash_block, lens=CHECK_LENS, heads=HEADS, d=D):
    """每个 rank 按同一种子造出整条序列，拿自己那段跑环；rank 0 收齐后和 float64 参考比。"""
    import ring_dist as rd
    import torch
    import torch.distributed as dist
    rows = []
    for n in lens:
        N = n * world
        g = torch.Generator(device=device).manual_seed(seed + n)
        Q, K, V = (torch.randn(1, heads, N, d, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
        for layout in ll.LAYOUTS:
            for causal in (False, True):
                idx = ll.shard_index(N, world, layout)
                mine = idx[rank].to(device)
                o = rd.ring_attention_dist(Q[..., mine, :], K[..., mine, :], V[..., mine, :], causal, layout,
                                           block=block)
                o = o.to(torch.bfloat16).contiguous()
                parts = [torch.empty_like(o) for _ in range(world)]
                dist.all_gather(parts, o)
                if rank == 0:
                    O = torch.empty_like(Q)
                    for r in range(world):
                        O[..., idx[r].to(device), :] = parts[r]
                    ref = _attention_fp64(Q, K, V, causal)
                    sdpa = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal)
                    err = float((O.double() - ref).abs().max())
                    base = float((sdpa.double() - ref).abs().max())
                    rows.append({"n_local": n, "N": N, "layout": layout, "causal": causal, "ring_err": err,
                                 "sdpa_err": base, "ok": err <= 2 * base + 1e-5})
    return rows


def _attention_fp64(Q, K, V, causal):
    """float64 参考，按头分块（整张 N×N 的 float64 分数 16 个头一起放不下）。"""
    import torch
    out = torch.empty(Q.shape, dtype=torch.float64, device=Q.device)
    for h in range(Q.shape[1]):
        q, k, v = (t[:, h].double() for t in (Q, K, V))
        out[:, h] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out


def _timing(ll, rank, world, device, n, seed):
    """每块 n 个 token：重叠的环、只算、只传的时间（各进程里最慢的）。"""
    import ring_dist as rd
    import torch
    import torch.distributed as dist
    g = torch.Generator(device=device).manual_seed(seed + rank)
    q, k, v = (torch.randn(1, HEADS, n, D, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    idx = ll.shard_index(n * world, world, "striped")
    reps = 5 if n >= 32768 else 10
    ring = _cuda_time(lambda: rd.ring_attention_dist(q, k, v, True, "striped", block=flash_block), reps)
    serial = _cuda_time(lambda: rd.ring_attention_dist(q, k, v, True, "striped", block=flash_block,
                                                         overlap=False), reps)
    overlapped = lambda: rd.ring_attention_dist(q, k, v, True, "striped", block=flash_block)  # noqa: E731
    serial_fn = lambda: rd.ring_attention_dist(q, k, v, True, "striped", block=flash_block, overlap=False)  # noqa: E731
    gap = _paired_gap(overlapped, serial_fn, 21 if n >= 32768 else 41)
    scale = D ** -0.5

    def compute_only():                                   # 同样的 P 块计算，K/V 不动（只换"它来自谁"的位置）
        acc = None
        for rnd in range(world):
            st, _ = flash_block(q, k, v, idx[rank], idx[(rank - rnd) % world], True, scale)
            if st is not None:
                acc = st if acc is None else ll.merge_states(acc, st)
        return ll.finalize(acc)

    kv = torch.stack([k, v]).contiguous()
    buf = torch.empty_like(kv)

    def comm_only():                                      # P − 1 次 K/V 交换，没有计算
        for _ in range(world - 1):
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world), dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    comp = _cuda_time(compute_only, reps)
    comm = _cuda_time(comm_only, reps)
    flops_full = 4.0 * n * n * D * HEADS                 # 一块不掩码的 n×n：QKᵀ 和 PV 各 2·n·n·d，每个头
    full_block = _cuda_time(lambda: _flash_state(q, k, v, False, scale), reps)
    return {"n_local": n, "world": world, "ring_s": _max_over_ranks(ring, device),
            "serial_s": _max_over_ranks(serial, device),
            "serial_minus_ring_paired_s": -_max_over_ranks(-gap, device),     # 各进程里最小的（最保守）
            "compute_s": _max_over_ranks(comp, device), "comm_s": _max_over_ranks(comm, device),
            "kv_bytes_per_round": kv.numel() * kv.element_size(),
            "full_block_tflops": flops_full / _max_over_ranks(full_block, device) / 1e12}


def measure(out_path, seed):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    if not torch.cuda.is_available():
        print("SKIP: --measure 需要 CUDA GPU（每个进程一块），用 torchrun --nproc_per_node=P 启动")
        sys.exit(SKIP)
    from gpu_timing import nccl_environment
    import long_lab as ll
    import ring_dist as rd
    rank, world, device = rd.init_distributed()
    import torch.distributed as dist
    checks = _check_correctness(ll, rank, world, device, seed)
    times = []
    for n in LOCAL_LENS:
        times.append(_timing(ll, rank, world, device, n, seed))
        if rank == 0:
            print(f"n = {n}: {times[-1]}", flush=True)
    if rank == 0:
        res = {"meta": {**nccl_environment(torch), "heads": HEADS, "d": D, "dtype": "bfloat16", "world": world,
                        "seed": seed, "layout_timed": "striped", "causal_timed": True,
                        "timing": "CUDA events, warm-up then fastest of 7 groups of reps; max over ranks"},
               "checks": checks, "times": times}
        from course_utils import update_json

        def replace_keep_timeline(d):                     # 时间线（--timeline + --merge 写的）原样保留
            timeline_part = d.get("timeline")
            d.clear()
            d.update(res)
            if timeline_part is not None:
                d["timeline"] = timeline_part

        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        update_json(out_path, replace_keep_timeline, strict=True)     # 已提交的结果坏了：报错，不覆盖
        print(f"结果写入 {out_path}；正确性 {sum(c['ok'] for c in checks)}/{len(checks)}")
    dist.destroy_process_group()


# =============================================================================
# 时间线：每轮的"算"和"传"各在什么时候（torchrun，一个进程一块 GPU；没有 GPU 时 gloo + CPU）
# =============================================================================
MODES = ("overlapped", "serial", "plain")  # 重叠的环（记录）、先传完再算的环（记录）、重叠的环（不记录：记录器的开销）
PREROLL_S = 3e-3          # 每个环之前计算流空转这么久：主机趁机把整个环排进队列，事件只反映设备上的先后
WARMUPS = 2               # 每个长度先把三种环各跑这么多遍（NCCL 建连接、分配器、内核），不计时
LEN_BUDGET_S = 4.0        # 每个长度计时的预算（三种环各 reps 次）；reps 夹在 [MIN_REPS, MAX_REPS] 里
MIN_REPS, MAX_REPS = 12, 60
TIMELINE_DIR = os.path.join(HERE, "results", "ring_timeline")     # 每个变体一个 JSON（run_ring_gpu.sh 写）
SIZES = {   # 长度、头数、d、dtype、正确性检查的长度、每种环的次数（None：按预算）
    "gpu": dict(lens=LOCAL_LENS, heads=HEADS, d=D, dtype="bfloat16", check_lens=(1024,), reps=None),
    "gpu-quick": dict(lens=(1024, 2048), heads=HEADS, d=D, dtype="bfloat16", check_lens=(1024,), reps=5),
    "cpu": dict(lens=(24, 40), heads=2, d=8, dtype="float64", check_lens=(16,), reps=3),
}


def _aligned_start(dist, torch, device, flag, sleep_cycles):
    """
    两块 GPU 同时开始下一个环，而且主机跑在设备前面：主机同步 → 一次 all-reduce、再同步（两个进程一起出发）→
    计算流空转 PREROLL_S（主机这时把整个环排进队列）→ 再一次 all-reduce（两块 GPU 同时走出这个内核，环在两边
    同时开始，不把"对方晚到"算成通信时间）。CPU（gloo）上只做一次 barrier。
    """
    if device.type != "cuda":
        dist.barrier()
        return
    torch.cuda.synchronize(device)
    dist.all_reduce(flag)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(sleep_cycles)
    dist.all_reduce(flag)


def _sleep_cycles(torch, device, seconds):
    """torch.cuda._sleep 的参数是时钟周期：先量 100 万个周期有多长，再换算成 seconds 秒。"""
    if device.type != "cuda":
        return 0
    torch.cuda._sleep(1000)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(1_000_000)
    e1.record()
    e1.synchronize()
    return int(seconds / (e0.elapsed_time(e1) / 1e3 / 1e6))


class _Stopwatch:
    """不带记录器的环用：CUDA 事件（GPU）或 perf_counter（CPU）。"""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            import time
            self.t0 = time.perf_counter()

    def stop(self):
        if not self.cuda:
            import time
            return time.perf_counter() - self.t0
        e1 = self.torch.cuda.Event(enable_timing=True)
        e1.record()
        e1.synchronize()
        return self.e0.elapsed_time(e1) / 1e3


def _time_fn(torch, fn, device, reps):
    """一次 fn() 的时间（秒）：GPU 上 gpu_timing.cuda_time（3 组取最快），CPU 上 3 次取最快。"""
    if device.type == "cuda":
        from gpu_timing import cuda_time
        return cuda_time(fn, reps, trials=3)
    import time
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _median(xs):
    return float(np.median(xs))


def _median_rounds(rows, key):
    """每轮分开取中位数（这一轮没有传时是 None）。"""
    P = len(rows[0][key])
    return [None if rows[0][key][r] is None else _median([x[key][r] for x in rows]) for r in range(P)]


def rank_summary(samples):
    """
    一个进程、一个长度的所有样本 → 中位数（秒 / 比例）。samples[mode] = [timeline_summary 或 {"ring_s"}, ...]，
    三种环交替地各跑 reps 次，第 i 个 overlapped 和第 i 个 serial 是挨着跑的一对。
      overlap            |传 ∩ 算| / |传|（重叠的环，每个环一个数，取中位数；p10 / p90 另记）——只作诊断：
                         NCCL 等 SM 时传的区间被拉长、落在算里面，它按构造接近 1（读数见 hidden_share）
      compute_ring_s / compute_alone_s   每轮"算"的时长：重叠的环里 / 不重叠的环里（没有并发的传）
      comm_ring_s / comm_alone_s         每轮"传"的时长：同上
      compute_slowdown_s Σ算(重叠) − Σ算(不重叠)，逐对相减取中位数：并发的 NCCL 内核让计算慢了多少
      comm_exposed_s     Σ(|传| − |传 ∩ 算|)：传的时候设备上没在算的时间
      exposed_s          重叠的环 − Σ算（露在外面的通信 + 环自己的拼 K/V、分配、归一化）
      hidden_effective   (不重叠的环 − 重叠的环) / Σ传(不重叠)，逐对：重叠实际省下的时间占通信的比例
                         （≈ hidden_share 扣掉"计算被拖慢"的那部分）
      recorder_overhead  重叠的环（记录）/ 重叠的环（不记录）− 1
    """
    ov, se, pl = samples["overlapped"], samples["serial"], samples["plain"]
    pairs = list(zip(ov, se))
    comm_sent = any(x is not None for x in ov[0]["per_round_comm_s"])
    out = {"reps": len(ov), "ring_s": _median([x["ring_s"] for x in ov]),
           "ring_plain_s": _median([x["ring_s"] for x in pl]), "ring_serial_s": _median([x["ring_s"] for x in se]),
           "compute_ring_s": _median_rounds(ov, "per_round_compute_s"),
           "compute_alone_s": _median_rounds(se, "per_round_compute_s"),
           "comm_ring_s": _median_rounds(ov, "per_round_comm_s"),
           "comm_alone_s": _median_rounds(se, "per_round_comm_s"),
           "compute_slowdown_s": _median([o["compute_s"] - s["compute_s"] for o, s in pairs]),
           "comm_exposed_s": _median([x["comm_exposed_s"] for x in ov]),
           "exposed_s": _median([x["exposed_s"] for x in ov]),
           "serial_exposed_s": _median([x["exposed_s"] for x in se])}
    out["recorder_overhead"] = out["ring_s"] / out["ring_plain_s"] - 1
    if comm_sent:
        shares = [x["overlap"] for x in ov]
        out["overlap"] = _median(shares)
        out["overlap_p10_p90"] = [float(np.percentile(shares, 10)), float(np.percentile(shares, 90))]
        out["hidden_effective"] = _median([(s["ring_s"] - o["ring_s"]) / max(s["comm_s"], 1e-12) for o, s in pairs])
    return out


def _timeline_length(ll, torch, dist, block, state, rank, world, device, n, cfg, seed, sleep_cycles):
    """每块 n 个 token：预热 → 三种环交替各 reps 次 → 这个进程的中位数（和原始样本）。"""
    import ring_dist as rd
    dtype = getattr(torch, cfg["dtype"])
    g = torch.Generator(device=device).manual_seed(seed + rank)
    q, k, v = (torch.randn(1, cfg["heads"], n, cfg["d"], generator=g, device=device, dtype=dtype) for _ in range(3))
    idx = ll.shard_index(n * world, world, "striped")
    scale = cfg["d"] ** -0.5
    for rnd in range(world):               # 先在本卡上把每一轮的块算一遍（Triton 在这里编译、调优，不在环里）
        block(q, k, v, idx[rank], idx[(rank - rnd) % world], True, scale)
    ev = rd.RingEvents(device)
    flag = torch.zeros(1, device=device)

    def run(mode):
        _aligned_start(dist, torch, device, flag, sleep_cycles)
        if mode == "plain":
            watch = _Stopwatch(torch, device)
            out = rd.ring_attention_dist(q, k, v, True, "striped", block=block)
            return {"ring_s": watch.stop()}, out
        out = rd.ring_attention_dist(q, k, v, True, "striped", block=block, overlap=mode == "overlapped", events=ev)
        return rd.timeline_summary(ev.timeline()), out

    warm = {}
    for _ in range(WARMUPS):              # 预热（NCCL 建连接、分配器、内核），顺便比较三种环的输出
        for mode in MODES:
            warm[mode] = run(mode)
    diff = max(float((warm[m][1].double() - warm["plain"][1].double()).abs().max()) for m in MODES)
    t_ring = _max_over_ranks(warm["plain"][0]["ring_s"], device)     # 各进程用同一个 reps（否则会互相等死）
    reps = cfg["reps"] or int(min(MAX_REPS, max(MIN_REPS, LEN_BUDGET_S / (3 * (t_ring + PREROLL_S + 1e-3)))))
    samples = {m: [] for m in MODES}
    for i in range(reps):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):         # 交替先后：慢漂移对三种环一样
            samples[mode].append(run(mode)[0])
    stats = {}
    rd.ring_attention_dist(q, k, v, True, "striped", block=block, stats=stats)          # 只为拿每轮的对数
    full_s = _time_fn(torch, lambda: state(q, k, v, False, scale), device, 2 if n >= 32768 else 5)
    example = {}
    for mode in ("overlapped", "serial"):                           # 一个环的原始区间（画甘特图用）
        _aligned_start(dist, torch, device, flag, sleep_cycles)
        rd.ring_attention_dist(q, k, v, True, "striped", block=block, overlap=mode == "overlapped", events=ev)
        example[mode] = ev.timeline()
    return {"rank": rank, **rank_summary(samples), "pairs_per_round": [r["pairs"] for r in stats["rounds"]],
            "full_block_tflops": 4.0 * n * n * cfg["d"] * cfg["heads"] / full_s / 1e12,
            "recorder_output_max_diff": diff, "example": example, "samples": samples}


def _round_floats(x, digits=4):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _round_floats(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round_floats(v, digits) for v in x]
    return x


def _comm_ratio(r):
    ring, alone = r["comm_ring_s"][0], r["comm_alone_s"][0]
    return "-" if ring is None or not alone else f"{ring / alone:.2f}"


def _per_rank(ranks, key, mult=1.0):
    """进度行：各进程的一个数，"a/b"。"""
    return "/".join(f"{r[key] * mult:.3f}" if r.get(key) is not None else "-" for r in ranks)


def _variant_meta(torch, args, cfg, world, sleep_cycles, device):
    """这个变体"在哪、怎么测的"：gpu_timing.gpu_meta（GPU 上经 gpu_timing.nccl_environment，加 NCCL 版本；
    都带 triton 版本）+ NCCL 环境变量、尺寸、种子。"""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL"))}
    if device.type == "cuda":
        from gpu_timing import nccl_environment
        meta = nccl_environment(torch)
        meta.pop("topology", None)                 # 拓扑已经在文件的 meta 里
    else:
        from gpu_timing import gpu_meta
        meta = dict(gpu_meta(torch), gpu="cpu (gloo)")
    meta.update(variant=args.variant, block=args.block, env=env, world=world, heads=cfg["heads"], d=cfg["d"],
                dtype=cfg["dtype"], layout="striped", causal=True, seed=args.seed, preroll_s=PREROLL_S,
                preroll_cycles=sleep_cycles, sizes=args.sizes)
    return meta


def timeline(args):
    """--timeline：一个变体（一次 torchrun）。rank 0 把所有进程的结果写进 args.out。"""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import long_lab as ll
    import ring_dist as rd
    cpu = args.cpu or not torch.cuda.is_available()
    args.sizes = "cpu" if cpu else ("gpu-quick" if args.quick else "gpu")
    if cpu and args.block == "aten":
        args.block = "explicit"             # aten 的 flash 内核只有 GPU 版
    cfg = SIZES[args.sizes]
    rank, world, device = rd.init_distributed("gloo" if cpu else None)
    import torch.distributed as dist
    block = BLOCKS[args.block]
    state = {"aten": _flash_state, "triton": _triton_state, "explicit": _explicit_state}[args.block]
    sleep_cycles = _sleep_cycles(torch, device, PREROLL_S)
    meta = _variant_meta(torch, args, cfg, world, sleep_cycles, device)
    if rank == 0:
        print(f"[{args.variant}] block = {args.block}，{meta.get('gpu')} × {world}，NCCL 环境：{meta['env']}",
              flush=True)
    checks = _check_correctness(ll, rank, world, device, args.seed, block=block, lens=cfg["check_lens"],
                                heads=cfg["heads"], d=cfg["d"])
    if rank == 0:
        print(f"[{args.variant}] 正确性 {sum(c['ok'] for c in checks)}/{len(checks)}", flush=True)
    lengths = []
    for n in cfg["lens"]:
        mine = _timeline_length(ll, torch, dist, block, state, rank, world, device, n, cfg, args.seed, sleep_cycles)
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
        lengths.append({"n_local": n, "kv_bytes_per_round": 2 * cfg["heads"] * n * cfg["d"] *
                        torch.tensor([], dtype=getattr(torch, cfg["dtype"])).element_size(), "ranks": ranks})
        if rank == 0:
            print(f"[{args.variant}] n = {n}: reps {ranks[0]['reps']}, ring {_per_rank(ranks, 'ring_s', 1e3)} ms, "
                  f"hidden {'/'.join(_pct(hidden_share(r)) for r in ranks)}, "
                  f"hidden_effective {_per_rank(ranks, 'hidden_effective')}, "
                  f"comm in ring / alone {'/'.join(_comm_ratio(r) for r in ranks)}, "
                  f"recorder diff {max(r['recorder_output_max_diff'] for r in ranks):.1e}", flush=True)
    if rank == 0:
        for length in lengths:                  # 原始样本只留 4 位有效数字、不缩进：文件小一些
            for r in length["ranks"]:
                r["samples"] = _round_floats(r["samples"])
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "checks": checks, "lengths": lengths}, f, separators=(",", ":"))
        print(f"[{args.variant}] 写入 {args.out}", flush=True)
    dist.destroy_process_group()


TIMELINE_METHOD = (
    "Per ring round, CUDA events on the compute stream bracket compute (block attention + merge); the K/V exchange "
    "is issued from a side stream whose two events bracket the NCCL P2P kernel. "
    f"Each ring starts after a {PREROLL_S * 1e3:g} ms GPU spin (host queues the whole ring) and an all-reduce "
    "(ranks start together). Modes alternate per repetition: overlapped (recorded), serial (recorded; gives "
    "compute/comm alone), plain (not recorded; recorder overhead). Values are per-rank medians over repetitions "
    f"after {WARMUPS} warm-ups of each mode.")


def merge(paths, results):
    """
    --merge：各变体的 JSON → results 的 "timeline" 一节（去掉原始样本；其余各节不动）。
    course_utils.update_json(strict=True) 读-改-写（加锁、先写临时文件再改名；results 坏了就报错、不覆盖）。
    它把键按字母排序，所以测量的先后（paths 的顺序，run_ring_gpu.sh 里的顺序）另记在 "order" 里，报告按它排。
    """
    from course_utils import load_json, update_json
    variants = {}
    for p in paths:
        v = load_json(p)
        if v is None:
            raise SystemExit(f"--merge：没有 {p}")
        for length in v["lengths"]:
            for r in length["ranks"]:
                r.pop("samples", None)
        variants[v["meta"]["variant"]] = v
    if not variants:
        raise SystemExit("--merge：没有可合并的变体 JSON")
    first = next(iter(variants.values()))["meta"]
    keys = ("date", "gpu", "driver", "torch", "nccl", "NCCL_NVLS_ENABLE", "world", "heads", "d", "dtype", "layout",
            "causal", "preroll_s", "sizes")
    section = {"meta": {k: first.get(k) for k in keys}, "method": TIMELINE_METHOD, "order": list(variants),
               "variants": variants}
    update_json(results, lambda d: d.update(timeline=section), strict=True)
    print(f"合并 {len(variants)} 个变体（{', '.join(variants)}）→ {results}")


# =============================================================================
# 分析（不需要 GPU）
# =============================================================================
def p2p_model():
    """一次 K/V 交换的 α-β 模型：P = 2 时 all-gather 的 ring 一步正是"发 X 字节、收 X 字节"，借它的拟合。"""
    import comm_sim as cs
    from course_utils import load_json
    res = load_json(NCCL_RESULTS)
    if res is None:
        return None
    rows = [r for r in res["rows"] if r["collective"] == "allgather"]
    n = np.array([r["bytes"] for r in rows], dtype=np.float64)
    t = np.array([r["seconds"] for r in rows])
    fit = cs.fit_alpha_beta(n, t, p=2, collective="allgather", algo="ring")
    return fit.alpha, fit.beta


def report(res):
    from course_utils import fmt_time, format_table
    meta = res["meta"]
    print(f"实测：{meta['gpu']} × {meta['world']}，驱动 {meta.get('driver')}，torch {meta['torch']}，"
          f"NCCL {meta['nccl']}，{meta['date']}；{meta['heads']} 头，d = {meta['d']}，{meta['dtype']}")
    print("拓扑（nvidia-smi topo -m）：\n  " + meta.get("topology", "?").replace("\n", "\n  "))
    rows = [[c["n_local"], c["N"], c["layout"], "是" if c["causal"] else "否", f"{c['ring_err']:.2e}",
             f"{c['sdpa_err']:.2e}", "✓" if c["ok"] else "✗"] for c in res["checks"]]
    print("\n== 正确性：环形注意力 vs 整条序列的 float64 注意力（判据：≤ 2 × bf16 SDPA 自己的误差）")
    print(format_table(["每块 n", "全长 N", "布局", "因果", "环的最大误差", "SDPA 的最大误差", "通过"], rows))
    assert all(c["ok"] for c in res["checks"]), "环形注意力必须和单卡注意力一样（在 bf16 的误差内）"

    model = p2p_model()
    rows, out = [], []
    for t in res.get("times", []):
        P, n = t["world"], t["n_local"]
        exposed = max(0.0, t["ring_s"] - t["compute_s"])          # 重叠的环比"只算"多出来的时间
        # 被藏住的通信 = 不重叠的环 − 重叠的环：两者走同一段代码（拼 K/V、分配缓冲、合并状态），固定开销相互抵消
        gap = t.get("serial_minus_ring_paired_s", t["serial_s"] - t["ring_s"])   # 成对测的差（见 _paired_gap）
        hidden = min(1.0, max(0.0, gap / t["comm_s"]))
        m_comp = _causal_striped_flops(n, P) / P / P / (t["full_block_tflops"] * 1e12)   # 每块 GPU、每一轮
        m_comm = model[0] + t["kv_bytes_per_round"] * model[1] if model else float("nan")
        m_ring = P * m_comp + (P - 1) * max(0.0, m_comm - m_comp)
        out.append((n, hidden, t["ring_s"], m_ring, exposed / t["ring_s"], exposed / t["comm_s"], gap / t["ring_s"]))
        rows.append([f"{n // 1024}k", fmt_time(t["compute_s"] / P), fmt_time(m_comp), fmt_time(t["comm_s"] / (P - 1)),
                     fmt_time(m_comm), fmt_time(t["serial_s"]), fmt_time(t["ring_s"]), fmt_time(m_ring),
                     f"{hidden:.0%}", f"{exposed / t['ring_s']:.1%}", f"{exposed / t['comm_s']:.0%}",
                     f"{P * n / t['ring_s'] / 1e6:.2f}"])
    if not rows:
        return out
    print(f"\n== 旧读法（总时间相减）：每块 GPU n 个 token，P = {res['meta']['world']}，causal + striped")
    print(format_table(["每块 n", "一轮计算", "模型", "一轮通信", "模型(α-β)", "不重叠的环", "重叠的环", "模型",
                        "通信被藏住", "露在外面/总时间", "露在外面/只传", "M tokens/s"], rows))
    print("  通信被藏住 = (不重叠的环 − 重叠的环，两者交替成对地测、取差的中位数) / 只传；\n"
          "  露在外面 = 重叠的环 − 只算（同样几块、不传、也不拼 K/V），\n"
          "  所以它还含着环自己的固定开销（拼 K/V、分配接收缓冲），是通信代价的上界。\n"
          "  模型：一轮计算 = 这一轮的 FLOPs / 单块实测吞吐，"
          "一轮通信 = α + K/V 字节 × β（prereq5/bench/nccl_measure.py 的 NCCL 拟合），重叠后每轮取两者的大者。\n"
          "  两种读法看起来不一致（见 lecture19/bench/README.md）。一部分是分母不同：\"露在外面/总时间\"的 "
          f"{_span(o[4] for o in out)} 是\n  占整个环的比例，换成占通信的比例（\"露在外面/只传\"）就是 "
          f"{_span(o[5] for o in out)}。\n"
          "  另一部分来自方法，不是噪声：这里成对相减的差（占环的 "
          f"{_span(o[6] for o in out)}）是每次单独调用、\n"
          "  调用前设备是空的（没有空转，主机发射内核的时间混进了事件之间），两个进程也没有对齐起跑（对方晚到的等待\n"
          "  算成了传）。下面的时间线（如果已经测了）两件事都做了：每个环前空转、两个进程同时出发，再按轮读算和传。")
    return out


def _span(xs):
    """一串比例 → "最小–最大"（百分数；小于 10% 的留一位小数）。"""
    xs = list(xs)
    lo, hi = min(xs), max(xs)
    fmt = (lambda x: f"{100 * x:.1f}") if hi < 0.1 else (lambda x: f"{100 * x:.0f}")
    return f"{fmt(lo)}–{fmt(hi)}%"


TARGET, TARGET_FROM_N = 0.8, 16384      # 目标：每块 ≥ 16k token 时 ≥ 80% 的通信被藏住
GANTT_N = 32768                         # 甘特图画哪个长度（没有就画最长的）


def hidden_share(r):
    """
    藏住 = 1 − 传没被盖住 / Σ传·单独（一个进程、一个长度的中位数；没有传时 None）。
    传没被盖住（comm_exposed_s）= 重叠的环里"在传、设备却没在算"的时间；分母是不重叠的环里单独传的时间。
    和 |传 ∩ 算| / |传| 不同，分母不会被拉长：传拖到这一轮算完之后，露出来的那段直接扣掉；露出来的比单独传
    还长时它是负的。
    """
    alone = sum(x for x in r["comm_alone_s"] if x is not None)
    return None if alone <= 0 else 1.0 - r["comm_exposed_s"] / alone


def report_timeline(tl):
    """时间线一节：每个变体一张表（每个长度、每个进程一行），对照 80% 的目标，最后一张总表；返回画图用的数。"""
    from course_utils import fmt_time, format_table
    meta = tl["meta"]
    print(f"\n== 时间线（{meta.get('date')}，{meta.get('gpu')} × {meta.get('world')}，torch {meta.get('torch')}，"
          f"NCCL {meta.get('nccl')}；{meta.get('heads')} 头，d = {meta.get('d')}，{meta.get('dtype')}，"
          "causal + striped）")
    print("  方法（测量时记下的文字）：" + tl["method"])
    print("  读数的定义见各表后的注释：藏住、有效藏住对照目标；|comm ∩ compute| / |comm|（重叠率）只作诊断。")
    model = p2p_model()
    data, verdicts = {}, {}
    agree = []                                   # |(藏住 − 慢/传) − 有效藏住|，每一行：(差, 变体, n, rank)
    for name in tl.get("order") or list(tl["variants"]):   # 测量的先后（merge 记下的；更早合并的 JSON 没有：按键）
        v = tl["variants"][name]
        vm = v["meta"]
        print(f"\n-- 变体 {name}：block = {vm['block']}，NCCL 环境 {vm['env']}"
              + (f"，triton {vm.get('triton')}" if vm["block"] == "triton" else ""))
        checks = v.get("checks", [])
        lens = sorted({c["n_local"] for c in checks})
        print(f"   正确性 {sum(c['ok'] for c in checks)}/{len(checks)}（每块 {lens}）")
        assert all(c["ok"] for c in checks), f"变体 {name} 的环和单卡注意力不一致"
        rows, per_len, rec, slow_comm, slow_comp = [], [], [], [], []
        for length in v["lengths"]:
            n = length["n_local"]
            for r in length["ranks"]:
                _check_rank(r, name, n)
                comp_alone = sum(r["compute_alone_s"])
                comm_alone = sum(x for x in r["comm_alone_s"] if x is not None)
                comm_ring = sum(x for x in r["comm_ring_s"] if x is not None)
                hid = hidden_share(r)
                slow = r["compute_slowdown_s"]
                hid_net = None if hid is None or not comm_alone else hid - slow / comm_alone   # 藏住 − 慢/传
                p10, p90 = r.get("overlap_p10_p90") or (None, None)
                rec.append(r["recorder_overhead"])
                slow_comp.append(slow / comp_alone)
                if comm_alone:
                    slow_comm.append(slow / comm_alone)
                    if hid_net is not None and r.get("hidden_effective") is not None:
                        agree.append((abs(hid_net - r["hidden_effective"]), name, n, r["rank"]))
                rows.append([f"{n // 1024}k" if n >= 1024 else n, r["rank"], fmt_time(r["ring_serial_s"]),
                             fmt_time(r["ring_s"]), fmt_time(comp_alone), f"{slow / comp_alone:+.1%}",
                             fmt_time(comm_alone), fmt_time(comm_ring), fmt_time(r["comm_exposed_s"]), _pct(hid),
                             _pct(r.get("hidden_effective")),
                             "-" if hid_net is None else _pct(hid_net),
                             "-" if p10 is None else f"{_pct(r.get('overlap'))} ({100 * p10:.0f}–{100 * p90:.0f})"])
            per_len.append(_length_point(length, vm, model))
        print(format_table(["每块 n", "rank", "不重叠的环", "重叠的环", "Σ算·单独", "算变慢", "传·单独", "传·环里",
                            "传没被盖住", "藏住", "有效藏住", "藏住−慢/传", "重叠率 (p10–p90)"], rows))
        print(f"   记录器开销（记录的环 / 不记录的环 − 1）：{min(rec):+.1%} … {max(rec):+.1%}；"
              "三种环的输出逐位相同")
        if slow_comm:
            print(f"   算变慢 ÷ 传·单独：{min(slow_comm):+.0%} … {max(slow_comm):+.0%}（各长度、两个进程），"
                  f"而算变慢只占 Σ算·单独 的 {min(slow_comp):+.1%} … {max(slow_comp):+.1%}")
        verdicts[name] = _verdict(name, per_len)
        data[name] = per_len
    print("  藏住 = 1 − 传没被盖住 / 传·单独：传没被盖住 = Σ(|传| − |传 ∩ 算|)，重叠的环里在传、设备却没在算的时间；\n"
          "  有效藏住 = (不重叠的环 − 重叠的环) / 传·单独，交替成对地测、取中位数：重叠实际省下的时间；\n"
          "  算变慢 = Σ算(重叠) − Σ算(不重叠)，逐对相减的中位数，占 Σ算·单独：并发的 NCCL 内核抢 SM、显存带宽的代价；\n"
          "  藏住−慢/传 = 藏住 − 算变慢的时间 / 传·单独：两个环的差 = 传·单独 − 传没被盖住 − 算变慢（固定开销相消），\n"
          "  所以它应当 ≈ 有效藏住：藏住和有效藏住差的就是\"算变慢 ÷ 传·单独\"（各表后给出它的范围），\n"
          "  对照算变慢占计算的比例——计算比传长得多时，计算慢一点点就是传的一大截。\n"
          "  重叠率 = |传 ∩ 算| / |传|，中位数（p10–p90），只作诊断：传的区间从\"可以开始传\"算到 NCCL 结束，\n"
          "  NCCL 的线程块要等注意力内核让出 SM 时，这段等待也算在传里——传被拉长、落在算里面，重叠率就接近 100%，\n"
          "  哪怕传其实排在算后面（传·环里 远大于 传·单独 就是这个信号）。\n"
          f"  目标：每块 ≥ {TARGET_FROM_N // 1024}k 时藏住和有效藏住都 ≥ {TARGET:.0%}（各长度、两个进程里取最低）。")
    if agree:
        worst = max(agree)
        close = sum(a[0] <= 0.02 for a in agree)
        print(f"  藏住−慢/传 对 有效藏住：{len(agree)} 行里 {close} 行差 ≤ 2 个百分点，"
              f"最大差 {100 * worst[0]:.0f} 个百分点（{worst[1]} 每块 {worst[2] // 1024}k rank {worst[3]}）")
    _summary(data, verdicts)
    return data


def _summary(data, verdicts):
    """总表：每个变体在每块 ≥ 16k 的几个长度上的读数（两个进程里最低；传的时间取 rank 0）。"""
    from course_utils import fmt_time, format_table
    rows = []
    for name, pts in data.items():
        big = [p for p in pts if p["n"] >= TARGET_FROM_N and p["hidden"] is not None]
        if not big:
            continue
        slow = [s for p in big for s in p["slowdown_share"]]
        rows.append([name, " / ".join(_pct(p["hidden"]) for p in big),
                     " / ".join(_pct(p["hidden_effective"]) for p in big),
                     " / ".join(_pct(p["overlap"]) for p in big), f"{min(slow):+.1%} … {max(slow):+.1%}",
                     fmt_time(big[0]["comm_alone_s"]),
                     " / ".join(f"{p['comm_ring_s'] / p['comm_alone_s']:.1f}" for p in big),
                     {True: "达到", False: "没有达到", None: "-"}[verdicts.get(name)]])
    if not rows:
        return
    lens = " / ".join(f"{p['n'] // 1024}k" for p in next(iter(data.values())) if p["n"] >= TARGET_FROM_N)
    print(f"\n== 总表：每块 {lens}（两个进程里最低；传·单独、传·环里取 rank 0）")
    print(format_table(["变体", "藏住", "有效藏住", "重叠率（诊断）", "算变慢", f"传·单独 {lens.split(' / ')[0]}",
                        "传·环里 ÷ 传·单独", f"目标 ≥ {TARGET:.0%}"], rows))


def _pct(x):
    return "-" if x is None else f"{x:.0%}"


def _check_rank(r, name, n):
    """记录器不能改变环的输出：三种环是同样的内核、同样的顺序，输出必须逐位相同（差正好是 0）。"""
    where = f"变体 {name}，n = {n}，rank {r['rank']}"
    assert r["recorder_output_max_diff"] == 0, f"{where}：记录器改变了环的输出（差 {r['recorder_output_max_diff']}）"


def _length_point(length, vm, model):
    """一个长度的画图 / 总表数据：比例取各进程里最差的；每轮时间和甘特图取 rank 0；模型按 rank 0 的每轮对数。"""
    ranks = length["ranks"]
    r0 = ranks[0]
    flops_pair = 4.0 * vm["d"] * vm["heads"]                 # 每个 (查询, 键) 对、每个头：QKᵀ 和 PV 各 2d

    def worst(values):
        values = [x for x in values if x is not None]
        return min(values) if values else None

    return {"n": length["n_local"], "hidden": worst(hidden_share(r) for r in ranks),
            "hidden_effective": worst(r.get("hidden_effective") for r in ranks),
            "overlap": worst(r.get("overlap") for r in ranks),
            "slowdown_share": [r["compute_slowdown_s"] / sum(r["compute_alone_s"]) for r in ranks],
            "compute_alone_s": r0["compute_alone_s"], "compute_ring_s": r0["compute_ring_s"],
            "comm_alone_s": r0["comm_alone_s"][0], "comm_ring_s": r0["comm_ring_s"][0],
            "example": r0.get("example") or None,
            "model_compute_s": [p * flops_pair / (r0["full_block_tflops"] * 1e12) for p in r0["pairs_per_round"]],
            "model_comm_s": model[0] + length["kv_bytes_per_round"] * model[1] if model else None}


def _verdict(name, points, target=TARGET, from_n=TARGET_FROM_N):
    """
    目标：每块 ≥ 16k 时 ≥ 80% 的通信被藏住——藏住和有效藏住（各长度、两个进程里最低）都要 ≥ 80%。
    只陈述，不 assert（这是测量结果）；返回 True / False，没有这么长的长度时 None。
    """
    big = [p for p in points if p["n"] >= from_n and p["hidden"] is not None]
    if not big:
        print(f"   [{name}] 没有每块 ≥ {from_n // 1024}k 的长度：不对照 {target:.0%} 的目标")
        return None
    hid = min(p["hidden"] for p in big)
    he = min(p["hidden_effective"] for p in big)
    met = hid >= target and he >= target
    print(f"   [{name}] 每块 ≥ {from_n // 1024}k：藏住最低 {hid:.0%}（{'≥' if hid >= target else '<'} {target:.0%}），"
          f"有效藏住最低 {he:.0%}（{'≥' if he >= target else '<'} {target:.0%}）→ 目标{'达到' if met else '没有达到'}")
    return met


def _causal_striped_flops(n, P):
    """causal 整条序列（N = nP）的注意力 FLOPs：N(N+1)/2 个可见的 (查询, 键) 对，每对每头 4d（QKᵀ 和 PV 各 2d）。"""
    N = n * P
    return 4.0 * D * HEADS * N * (N + 1) / 2


def plot(out, quick, world, replot=False):
    sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
    from course_utils import committed_figure, pyplot, save_figure
    plt = pyplot()
    n = [o[0] for o in out]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.4))
    a1.semilogx(n, [100 * o[1] for o in out], "o-", lw=2, base=2, label="comm hidden (paired serial - overlapped)")
    a1.semilogx(n, [100 * o[4] for o in out], "s--", lw=2, base=2, label="ring minus compute-only, share of ring time")
    a1.axhline(100 * TARGET, color="gray", ls=":", label=f"target: {TARGET:.0%} hidden")   # 标签进图例：不压数据
    a1.set_xlabel("tokens per GPU")
    a1.set_ylabel("percent")
    a1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16))   # 图下方：不压数据
    a1.set_ylim(0, 105)
    a1.set_title(f"Ring attention on {world} GPUs (causal, striped)")
    a2.loglog(n, [o[2] * 1e3 for o in out], "o", ms=8, label="measured")
    a2.loglog(n, [o[3] * 1e3 for o in out], "-", lw=2, label="model: max(compute, alpha-beta comm) per round")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("tokens per GPU")
    a2.set_ylabel("time of the whole ring (ms)")
    a2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16))
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
    path = save_figure(fig, __file__, "overlap", quick=quick, path=committed_figure(__file__, RESULT_PNG, replot))
    print(f"\n图已保存：{path}")


# 时间线图的颜色：算 / 传在右上和甘特图里意思相同；变体（左上）用另外的颜色，不和算 / 传 / 露出的红色撞色
COMPUTE_COLOR, COMM_COLOR = "tab:blue", "tab:orange"
VARIANT_COLORS = {"default": "tab:green", "highprio": "tab:purple", "nchannels2": "tab:brown", "triton": "black"}


SAME_PP = 2.0         # 图：一个变体的藏住和有效藏住处处相差不到这么多个百分点时，两条线画出来是重合的


def plot_timeline(data, quick, world, replot=False):
    """
    上左：每个变体的藏住（实线）和有效藏住（虚线）、80% 目标（图例里）；上右：第一个变体每轮的实测 vs 模型；
    下：甘特图（_gantt_rows：GANTT_N 时基准变体和藏住最低的变体各一个环，rank 0，JSON 里的 example）。
    没有 example 时不画下面一行。
    """
    from course_utils import committed_figure, merge_identical, pyplot, save_figure
    from matplotlib.lines import Line2D
    plt = pyplot()
    gantt = _gantt_rows(data)
    fig = plt.figure(figsize=(18, 14 if gantt else 7.5), layout="constrained")
    # 两张上图的图例都在图下方、比各自的图宽，constrained 排版不把伸出去的部分算进列间距（默认 wspace 0.02 时
    # 两个框挨在一起）：列间距放大到 0.1，两个图例框之间约 0.4 英寸（tests/test_lecture19.py 查 ≥ 0.25 英寸）
    fig.get_layout_engine().set(wspace=0.1)
    grid = fig.add_gridspec(2 if gantt else 1, 2, height_ratios=[1.25, 1] if gantt else [1])
    a1, a2 = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    # 颜色的意思全图固定：蓝 = 算、橙 = 传（右上和甘特图），变体用另一组颜色（左上），达标最好的 default 用醒目的绿色
    colors = [COMPUTE_COLOR, COMM_COLOR]
    spare = iter(c for c in ("tab:gray", "tab:pink", "tab:olive", "tab:cyan") if c not in VARIANT_COLORS.values())
    color_of = {name: VARIANT_COLORS.get(name) or next(spare, "k") for name in data}
    lows = [0.0]
    # 两个变体的线可以完全重合（default 和 highprio 的藏住都是 100%）：merge_identical 合成一条；
    # 重合的那条画粗一点的空心圆，另一种颜色的实心小点叠在上面，两种颜色都看得见
    for key, fmt, kw in (("hidden", "o-", dict(lw=2.5, ms=11, mfc="none")),
                         ("hidden_effective", "s--", dict(lw=2, ms=7))):
        series = []
        for name, pts in data.items():
            pts = [p for p in pts if p["hidden"] is not None]
            series.append((name, [p["n"] for p in pts], [100 * p[key] for p in pts]))
        for label, n, ys in merge_identical(series, atol=0.5):
            names = label.split(" = ")
            a1.semilogx(n, ys, fmt, color=color_of[names[0]], mew=2, base=2, zorder=3 if names[0] == "default" else 2,
                        **kw)
            for other in names[1:]:
                a1.semilogx(n, ys, "o", color=color_of[other], ms=5, base=2, zorder=4)
            lows += ys
    a1.axhline(100 * TARGET, color="gray", ls=":", lw=2)
    # 图例 = 每个变体一种颜色 + 线型的意思（不再每条线一项）。一个变体的实线和虚线处处相差 ≤ SAME_PP 个百分点时
    # 虚线藏在实线下面（nchannels2：传几乎完全露在外面，两种读法都是约 21%）：图例里写明，学生不用去找那条虚线
    same = {name for name, pts in data.items()
            if (both := [p for p in pts if p["hidden"] is not None])
            and max(abs(p["hidden"] - p["hidden_effective"]) for p in both) * 100 <= SAME_PP}
    handles = [Line2D([], [], color=color_of[name], lw=3, label=f"{name} (solid = dashed)" if name in same else name)
               for name in data]
    handles += [Line2D([], [], color="k", marker="o", mfc="none", lw=2, mew=2,
                       label="solid: hidden = 1 - exposed / comm alone"),
                Line2D([], [], color="k", marker="s", ls="--", lw=2,
                       label="dashed: saved = time saved / comm alone"),
                Line2D([], [], color="gray", ls=":", lw=2, label=f"target: {TARGET:.0%} hidden")]
    a1.set_ylim(max(min(lows) - 8, -100), 112)       # 可以是负的（传露出来的比单独传还长）；太负的画到框外
    a1.set_xlabel("tokens per GPU")
    a1.set_ylabel("share of communication hidden (%)")
    met = [name for name, pts in data.items()
           if (big := [p for p in pts if p["n"] >= TARGET_FROM_N and p["hidden"] is not None])
           and min(min(p["hidden"], p["hidden_effective"]) for p in big) >= TARGET]
    a1.set_title(f"{world} GPUs: {' and '.join(repr(m) for m in met) or 'no variant'} "
                 f"{'hides' if len(met) == 1 else 'hide'} ≥ {TARGET:.0%} of comm\n"
                 f"at every length ≥ {TARGET_FROM_N // 1024}k tokens per GPU (both measures)")
    a1.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    name = next(iter(data))                          # 基准变体：测量顺序里的第一个（default）
    pts = data[name]
    n = [p["n"] for p in pts]
    ms = 1e3
    for r, mk in ((0, "o"), (1, "s")):
        if all(len(p["compute_alone_s"]) > r for p in pts):
            a2.loglog(n, [p["compute_alone_s"][r] * ms for p in pts], mk, color=COMPUTE_COLOR, ms=9, mfc="none",
                      mew=2)
            a2.loglog(n, [p["compute_ring_s"][r] * ms for p in pts], mk, color=COMPUTE_COLOR, ms=5)
            a2.loglog(n, [p["model_compute_s"][r] * ms for p in pts], "-" if r == 0 else ":", color=COMPUTE_COLOR,
                      lw=2)
    a2.loglog(n, [p["comm_alone_s"] * ms for p in pts], "^", color=COMM_COLOR, ms=9, mfc="none", mew=2)
    a2.loglog(n, [p["comm_ring_s"] * ms for p in pts], "v", color=COMM_COLOR, ms=6)
    if all(p["model_comm_s"] is not None for p in pts):
        a2.loglog(n, [p["model_comm_s"] * ms for p in pts], "--", color=COMM_COLOR, lw=2)
    a2.set_xscale("log", base=2)
    a2.set_xlabel("tokens per GPU")
    a2.set_ylabel("time per ring round (ms)")
    longer = all(p["compute_alone_s"][0] > p["comm_alone_s"] for p in pts)
    a2.set_title(f"'{name}', rank 0: " + ("each round's compute outlasts its K/V exchange,\nso the exchange can hide"
                                          if longer else "per-round compute vs K/V exchange"))
    a2.legend(handles=[
        Line2D([], [], color=COMPUTE_COLOR, marker="o", lw=2, label="compute (line: FLOPs / throughput)"),
        Line2D([], [], color=COMM_COLOR, marker="^", ls="--", lw=2, label="comm (line: α + bytes·β, NCCL fit)"),
        Line2D([], [], color="k", marker="o", mfc="none", mew=2, ls="", ms=9, label="hollow: alone"),
        Line2D([], [], color="k", marker="o", ls="", ms=5, label="filled: inside the ring"),
        Line2D([], [], color="k", marker="s", mfc="none", mew=2, ls=":", lw=2, label="square / dotted: round 1")],
        loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    for a, xs in ((a1, sorted({p["n"] for pts in data.values() for p in pts})), (a2, n)):
        a.grid(True, alpha=0.3)
        a.set_xticks(xs, [f"{x // 1024}k" if x >= 1024 else str(x) for x in xs])
        a.minorticks_off()
    if gantt:
        _plot_gantt(fig.add_subplot(grid[1, :]), gantt, colors)
    path = save_figure(fig, __file__, "overlap", quick=quick, path=committed_figure(__file__, RESULT_PNG, replot))
    print(f"\n图已保存：{path}")


def _gantt_rows(data):
    """
    甘特图的行 [(变体, 模式, 每块 n, timeline)]：rank 0 的 example，每块 GANTT_N（第一个变体没有这个长度就用它最长的）。
    画两个变体：第一个（测量顺序里的第一个，基准）和其余变体里这个长度上藏住最低的那个——藏得住的和藏不住的对照着看。
    """
    have = {name: {p["n"]: p for p in pts if p.get("example")} for name, pts in data.items()}
    have = {name: pts for name, pts in have.items() if pts}
    if not have:
        return []
    base = next(iter(have))
    n = GANTT_N if GANTT_N in have[base] else max(have[base])
    others = [v for v in have if v != base and n in have[v] and have[v][n]["hidden"] is not None]
    names = [base] + ([min(others, key=lambda v: have[v][n]["hidden"])] if others else [])
    return [(v, mode, n, have[v][n]["example"][mode]) for v in names for mode in ("overlapped", "serial")
            if mode in have[v][n]["example"]]


def _plot_gantt(ax, rows, colors):
    """每行一个环：粗条 = 每轮的算（计算流），细条 = 这一轮的传（旁路流夹住的 NCCL），红色 = 传没被算盖住的部分。"""
    from matplotlib.patches import Patch

    import ring_dist as rd
    ms = 1e3
    labels = []
    longest = max(tl["ring_s"] for *_, tl in rows)
    for y, (name, mode, _, tl) in enumerate(rows):
        computes = [r["compute"] for r in tl["rounds"]]
        for i, (s, e) in enumerate(computes):
            ax.broken_barh([(s * ms, (e - s) * ms)], (y - 0.38, 0.42), color=colors[0],
                           alpha=1.0 if i % 2 == 0 else 0.6, edgecolor="k", lw=0.8)
            if e - s > 0.15 * longest:                   # 窄条里放不下字
                ax.text((s + e) / 2 * ms, y - 0.17, f"round {i}", ha="center", va="center", color="white")
        for r in tl["rounds"]:
            if r["comm"] is None:
                continue
            a, b = r["comm"]
            ax.broken_barh([(a * ms, (b - a) * ms)], (y + 0.08, 0.3), color=colors[1], edgecolor="k", lw=0.8)
            free = rd.uncovered(r["comm"], computes)                      # 红色：这段传没被算盖住
            ax.broken_barh([(s * ms, (e - s) * ms) for s, e in free], (y + 0.08, 0.3), color="red")
        exposed = rd.timeline_summary(tl)["comm_exposed_s"]              # = 红段的总长
        labels.append(f"{name}, {mode}\nring {tl['ring_s'] * ms:.1f} ms, exposed comm {exposed * ms:.2f} ms")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time since ring start (ms), CUDA events on one GPU")
    n = rows[0][2]
    ax.set_title(f"One ring at {n // 1024 if n >= 1024 else n}{'k' if n >= 1024 else ''} tokens per GPU, rank 0: "
                 "compute (thick) vs K/V exchange (thin); red = exchange left exposed")
    ax.legend(handles=[Patch(color=colors[0], label="compute (block attention + merge)"),
                       Patch(color=colors[1], label="comm: K/V exchange, ready to send → NCCL done"),
                       Patch(color="red", label="comm not covered by compute (exposed)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    ax.grid(True, axis="x", alpha=0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--measure", action="store_true", help="正确性 + 旧的总时间计时（GPU，torchrun 启动）")
    ap.add_argument("--timeline", action="store_true", help="每轮的时间线，一个变体（torchrun 启动；没有 GPU 时 gloo）")
    ap.add_argument("--variant", default="default", help="--timeline：变体的名字（写进 JSON）")
    ap.add_argument("--block", default="aten", choices=sorted(BLOCKS), help="--timeline：每块用哪个内核")
    ap.add_argument("--out", default=None, help="--timeline：这个变体的 JSON（默认 results/ring_timeline/<变体>.json）")
    ap.add_argument("--cpu", action="store_true", help="--timeline：强制 gloo + CPU + 小尺寸（检查代码用）")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="把各变体的 JSON 合并进 --results 的 timeline 一节")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="读结果时同完整版；--timeline 时用小尺寸（GPU 上 1k、2k，几秒）")
    ap.add_argument("--replot", action="store_true", help="读结果时图写进 results/ring_multi_gpu.png（重测之后用）")
    args = ap.parse_args()
    if args.measure or args.timeline:                 # 只有测量用随机输入
        print(f"随机种子 seed = {args.seed}")
    if args.measure:
        return measure(args.results, args.seed)
    if args.timeline:
        args.out = args.out or os.path.join(TIMELINE_DIR, f"{args.variant}.json")
        return timeline(args)
    if args.merge:
        return merge(args.merge, args.results)
    from course_utils import load_json
    res = load_json(args.results)
    if res is None:
        print(f"SKIP: 没有实测结果 {args.results}；在多块 GPU 的机器上用 bash lecture19/bench/run_ring_gpu.sh 生成")
        sys.exit(SKIP)
    out = report(res)
    if "timeline" in res:
        plot_timeline(report_timeline(res["timeline"]), args.quick, res["meta"]["world"], args.replot)
    else:
        print("\n（还没有时间线：bash lecture19/bench/run_ring_gpu.sh 在 2 块 GPU 上测，合并进这个文件）")
        plot(out, args.quick, res["meta"]["world"], args.replot)


if __name__ == "__main__":
    main()
