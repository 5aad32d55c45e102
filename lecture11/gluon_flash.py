"""
Gluon 版 FlashAttention-3（Hopper / H200）：Triton 编译器替我们做掉的那几件事——TMA、mbarrier、异步 wgmma、
warp 专门化、两组 warpgroup 轮流——自己一件件写出来，每一件买到了多少速度？

FlashAttention-3 [S91] 的前向 = FA2 的在线 softmax + 三件 Hopper 专属的事：(1) 生产者/消费者异步（TMA 搬 K/V，
专门的生产者 warp 只发 TMA）；(2) 乒乓（§3.1）：两个计算 warpgroup 轮流，一个做 softmax 时另一个做矩阵乘；
(3) 组内重叠（§3.2）：先发第 j+1 块的 QKᵀ，再在它跑着的时候做第 j 块的 softmax。
一个内核 _attn_fwd（在 gluon_kernels.py），constexpr 开关一步步加上去（variant= 选一步，FLAGS）：
  "pipelined" A：一个 warpgroup，TMA + mbarrier + 异步 wgmma，K/V 3 级缓冲
  "ws"        B：+ 1 个生产者 warp 填 K/V 环（ready / empty 两组 mbarrier），1 个计算组
  "ws2"       C：两个计算组各算 64 行 Q，共用每一份 K/V（一组做 softmax 时另一组的 wgmma 在跑）
  "overlap"   D1：C + 组内重叠；"pingpong" D2：D1 + 两组用 mbarrier 轮流发矩阵乘
  "persist"   E：C 做成持久内核（每个 SM 一个程序，下一个 Q 块提前读进来）= "best"
反向（attention_backward；输入要梯度时 attention() 自动走它）：一个程序拿住 128 行 K/V（两个计算组各 64 行），
Q、dO 块流过，每对块 5 次矩阵乘（Sᵀ、dPᵀ、dV、dK、dQ）；dQ 两组交换 dSᵀ 后各算一半列，用 TMA 归约写回。
H200 上每一步买到多少（对 cuDNN 的 TFLOP/s）、反向和 cuDNN 的比：lecture11/bench/README.md。

形状（flash-attn 布局）：q、k、v [B, N, H, d]（Hk | H：GQA），bf16 / fp16，d ∈ {64, 128}，任意 N，causal = 左上角对齐
（Nq = Nk）。out [B, N, H, d]，LSE [B, H, N]（自然对数，fp32）。TMA 描述符把连续的 q 看成二维 [B·N, H·d]：一个 Q 块 =
行 [b·N + m0, +BLOCK_M)、列 [h·d, +d)；块跨过序列末尾读到的行被掩掉（key 列 ≥ N → −∞，多出的 Q 行不写回）。
运行（只在 Hopper 上；没有 GPU 时一行 SKIP、退出码 77）：
  python3 lecture11/gluon_flash.py [--seed N] [--only V ...]   每个 variant 和反向对照 float64 参考（flash-attn 判据）
  python3 lecture11/bench/gluon_sweep.py --bench | --explore | --explore-bwd    基准和块大小的 sweep
依赖 torch、triton ≥ 3.6（triton.experimental.gluon；Gluon 的接口还在变，本文件按 3.6 写）。
"""
import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
sys.path.insert(0, HERE)
from course_utils import check_bool, check_choice, check_device, check_int, check_memory, check_real  # noqa: E402

try:
    import torch
except ImportError:                 # 只编译内核（不运行）时可以没有 torch
    torch = None
try:
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from gluon_kernels import _attn_bwd, _attn_fwd, _bwd_preprocess, _dq_convert  # noqa: F401  （内核本身）
    from fast_launch import _sm_count     # 每个设备问一次 SM 数（持久内核的网格）
    GLUON_ERROR = None
except Exception as exc:            # 没有 triton，或者 triton 太旧、没有 Gluon：模块照样能 import，attention() 报错
    triton = gl = None
    GLUON_ERROR = f"{type(exc).__name__}: {exc}"

VARIANTS = ("pipelined", "ws", "ws2", "overlap", "pingpong", "persist")
BEST = "persist"      # 实测：N = 1k 上明显最快，4k、16k 上不慢于 C（bench/results/gluon_explore_*.json，best_variant）
HEAD_DIMS = (64, 128)
LOG2E = math.log2(math.e)


# ============================================================================
# 每个 variant 打开哪些开关（步骤 A → D2，每一步只多一件事）
#   WS         生产者 warp + 计算 warpgroup（否则一个 warpgroup 自己发 TMA、自己算）
#   CONSUMERS  计算 warpgroup 的个数（每个算一个 BLOCK_M 行的 Q 块）
#   OVERLAP    组内重叠：QK^T_j 和 P_{j-1}V_{j-1} 一起发出后，只等 QK^T_j 就开始 softmax
#   PINGPONG   两个 warpgroup 轮流发矩阵乘
#   PERSIST    持久内核（步骤 E，在 C 上加）：每个 SM 一个程序，自己走过一串 Q 块（见 _tile_order）
# ============================================================================
_OFF = dict(OVERLAP=False, PINGPONG=False, PERSIST=False)
FLAGS = {
    "pipelined": dict(_OFF, WS=False, CONSUMERS=1),
    "ws": dict(_OFF, WS=True, CONSUMERS=1),
    "ws2": dict(_OFF, WS=True, CONSUMERS=2),
    "overlap": dict(_OFF, WS=True, CONSUMERS=2, OVERLAP=True),
    "pingpong": dict(_OFF, WS=True, CONSUMERS=2, OVERLAP=True, PINGPONG=True),
    "persist": dict(_OFF, WS=True, CONSUMERS=2, PERSIST=True),
}


def tile_config(variant, d):
    """
    (BLOCK_M, BLOCK_N, STAGES, num_warps, maxnreg, worker_regs)。BLOCK_M 是每个计算 warpgroup 的 Q 行数。
    寄存器账（每线程，128 线程的 warpgroup）：O 累加器 BLOCK_M·d/128 个 fp32，S 是 BLOCK_M·BLOCK_N/128，
    P（16 位，两个一包）再一半，外加 softmax 的临时量。下面每一组都用 triton 3.6 为 sm_90 编译、ptxas -v 看过：
    没有溢出（spill 0 字节）。溢出过的组合：一个 warpgroup 128 × 128（d = 64：376 字节）、128 × 64（d = 128：92 字节）；
    两个计算组时 128 × 64（d = 128：148 字节）——FA3 的 CUTLASS 内核能用 128 行，Triton 生成的 softmax 多占寄存器。
    共享内存（H200 每块 ≤ 227 KiB）：Q CONSUMERS·BLOCK_M·d·2 字节 + STAGES·2·BLOCK_N·d·2 字节。
    寄存器重分配（FA3 的 setmaxnreg）：gl.warp_specialize 的 worker_num_regs 给每个 worker 分区定寄存器数，
    默认分区拿剩下的（按内核的 maxnreg 算）：3 个 warpgroup × 168 = 生产者 24 + 两个计算组各 240（生产者那 1 个 warp
    也占一整个 warpgroup 的寄存器，分配以 warpgroup 为单位）。
    步骤 A（没有生产者分区）至少 3 级：第 j 轮发的 TMA 放进第 j − 2 块的格子。
    """
    f = FLAGS[check_choice("variant", variant, VARIANTS, where="tile_config")]
    check_choice("d", d, HEAD_DIMS, where="tile_config")
    if not f["WS"]:
        return (128, 64, 3, 4, None, ()) if d == 64 else (64, 128, 3, 4, None, ())
    if f["CONSUMERS"] == 1:                       # 默认分区 4 warp + 生产者 1 warp（按 warpgroup 算：8 warp）
        return (128, 64, 4, 4, 232, (24,)) if d == 64 else (64, 64, 4, 4, 232, (24,))
    # worker 顺序：计算组 1（4 warp）、生产者（1 warp）
    # 块大小按 --explore 的实测（bench/results/gluon_explore.json）：d = 128 时 BLOCK_N 128 × 3 级比 64 × 4 级快 10–25%
    # worker_regs 只是记账：内核 _attn_fwd 的 gl.warp_specialize 调用里写死了 [24] / [240, 24]（Gluon 要字面的列表），
    # 改这里就要改那里——tests/test_lecture11_gluon.py 对照两处
    # 持久内核 d = 64 用 3 级：和 4 级在 1k、4k 上差 ≤ 1.6%，16k 上快 3%（gluon_explore_1k_4k.json、_16k.json）
    stages = 3 if d == 128 or f["PERSIST"] else 4
    return (64, 128, stages, 4, 168, (240, 24))


# ============================================================================
# 主机端：检查参数 → 描述符 → 启动。参数先查（CPU 上也能测），设备后查。
# ============================================================================
_GL_DTYPES = {}          # torch dtype → gluon dtype（第一次用时填）
_LAYOUTS = {}            # (block_shape, dtype) → NVMMASharedLayout：每组形状只算一次


def _check_args(q, k, v, causal, softmax_scale, variant, return_lse, where="attention"):
    """坏输入 → ValueError / TypeError，消息里有参数名和允许的取值。返回 (variant, scale)。"""
    check_bool("causal", causal, where=where)
    check_bool("return_lse", return_lse, where=where)
    variant = check_choice("variant", variant, ("best",) + VARIANTS, where=where)
    if torch is None:
        raise RuntimeError(f"{where} 需要 torch（{GLUON_ERROR or '没有安装 torch'}）")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{where}：{name} 必须是 4 维 [B, N, H, d]，收到形状 {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{where}：{name} 的 dtype 只能是 torch.bfloat16 / torch.float16，收到 {t.dtype}")
    batch, n, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"{where}：k、v 的形状必须相同，收到 {tuple(k.shape)} 和 {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[1] != n or k.shape[3] != d:
        raise ValueError(f"{where}：k、v 必须是 [B, N, Hk, d]，B、N、d 和 q 相同"
                         f"（q {tuple(q.shape)}，k {tuple(k.shape)}）")
    if d not in HEAD_DIMS:
        raise ValueError(f"{where}：q 的头维 d（最后一维）只能是 {' / '.join(map(str, HEAD_DIMS))}，收到 {d}")
    if k.shape[2] < 1 or hq < 1 or hq % k.shape[2] != 0:
        raise ValueError(f"{where}：q 的头数 {hq} 必须是 k、v 头数 {k.shape[2]} 的整数倍，且都 ≥ 1（GQA）")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{where}：q、k、v 的 dtype 必须相同，收到 {q.dtype}、{k.dtype}、{v.dtype}")
    if n < 1 or batch < 1:
        raise ValueError(f"{where}：q 的 B、N 必须 ≥ 1，收到 B={batch}、N={n}（形状 {tuple(q.shape)}）")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = check_real("softmax_scale", softmax_scale, lo=0, lo_open=True, where=where, type_error=ValueError)
    return (best_variant(d, n) if variant == "best" else variant), scale


def best_variant(d, n):
    """variant="best" 选哪一步：按 H200 上的实测，量过的形状都用 BEST（persist，步骤 E）。
    同一次运行里比（gluon_explore_1k_4k.json：E 对 A、C；gluon_explore_16k.json：E 对 C）：N = 1k 上 E 明显
    最快（+11–26%；d = 64 原来最快的 pipelined 375 / 268 → E 419 / 291 TFLOP/s）；N = 4k、16k 上 E 比 C 快 0–9%，
    但这在运行之间的起伏之内（同一个 ws2 配置 d = 128、16k 在三次运行里是 616 / 652 / 685），只能说"不慢于 C"。
    测试 test_best_variant_rule_follows_the_committed_sweeps 对照这两份扫描。d、n 留着：以后按形状选。"""
    check_choice("d", d, HEAD_DIMS, where="best_variant")
    check_int("n", n, lo=1, where="best_variant")
    return BEST


def _check_on_hopper(where, **tensors):
    """参数查过以后查设备：Gluon 可用、张量都在同一块 Hopper GPU 上（CPU 张量 → RuntimeError，写出是哪个张量）。"""
    q = tensors["q"]
    why = "" if torch.cuda.is_available() else "；这台机器没有 CUDA"
    for name, t in tensors.items():
        check_device(f"{name} 的设备", t.device, where, kinds=("cuda",), error=RuntimeError,
                     hint=f"（本内核要 Hopper GPU（sm_90，如 H100 / H200）上的 CUDA 张量{why}）")
        if t.device != q.device:
            raise RuntimeError(f"{where}：{name} 必须在和 q 同一块 CUDA GPU 上（{q.device}），收到 {t.device}")
    if GLUON_ERROR is not None:
        raise RuntimeError(f"{where} 需要 triton ≥ 3.6 的 Gluon（triton.experimental.gluon）：{GLUON_ERROR}")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        raise RuntimeError(f"{where}：本内核只为 Hopper GPU（sm_90）写（wgmma、setmaxnreg），"
                           f"q 所在的 GPU 是 sm_{major}{minor}")


def _layout(block, dtype):
    key = (tuple(block), dtype)
    if key not in _LAYOUTS:
        if not _GL_DTYPES:
            _GL_DTYPES.update({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32})
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])
    return _LAYOUTS[key]


def _desc(t2d, block):
    """
    连续的 t2d → 块 block 的 TMA 描述符（基址 16 字节对齐、行步长是 16 字节的倍数）：q、k、v 看成二维 [B·N, H·d]
    （16 位），反向的 dQ 累加器看成 [B·H·n_pad, d]（fp32），反向的 LSE / D 是一维的 [2·B·H·n_pad]（fp32）。
    """
    return TensorDescriptor.from_tensor(t2d, list(block), _layout(block, t2d.dtype))


def attention(q, k, v, causal=False, softmax_scale=None, variant="best", return_lse=False):
    """
    q [B, N, H, d]，k、v [B, N, Hk, d]（Hk | H）→ out [B, N, H, d]
    （return_lse 时再返回 lse [B, H, N]，自然对数，fp32）。
    variant：'pipelined' / 'ws' / 'ws2' / 'overlap' / 'pingpong' / 'persist'（'best' = best_variant(d, N)），见开头。
    主机端不同步：只做形状检查、建描述符、启动一次内核。
    """
    variant, scale = _check_args(q, k, v, causal, softmax_scale, variant, return_lse)
    _check_on_hopper("attention", q=q, k=k, v=v)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        out, lse = _AttentionFn.apply(q, k, v, causal, scale, variant)      # 可求导：反向 = attention_backward
        return (out, lse) if return_lse else out
    return _launch(q, k, v, causal, scale, variant, return_lse)


def persistent_grid(n_m, bh, n_sm):
    """
    持久内核（variant "persist"）的 grid 和每段的头数：n_m·bh 个 Q 块，程序数 G = min(Q 块数, SM 数)，
    每个 SM 一个程序（ws2 的 3 个 warpgroup × 168 个寄存器占满一个 SM 的寄存器堆）。
    段的头数 = ⌈2G / n_m⌉：一段大约两轮（每轮每个程序一个 Q 块）——蛇形发块时第 0 轮拿到长块的程序，第 1 轮拿到短块，
    两轮合起来每个程序的块数差不多；同时在算的 Q 块只落在一段的头上（N = 1k、d = 128 时 33 个头的 K/V，17 MB，
    小于 H200 的 50 MB L2）。
    """
    _check_grid_args(n_m, bh, n_sm, "persistent_grid")
    return _grid(n_m, bh, n_sm)


def _check_grid_args(n_m, bh, n_sm, where, names=("n_m", "bh", "n_sm")):
    for name, x in zip(names, (n_m, bh, n_sm)):
        check_int(name, x, lo=1, where=where)


SCHEDULE_BYTES_PER_TILE = 128      # persistent_schedule 的表里一项：一个 (pid_m, bh) 元组 + 列表里的指针，往多里算


def _check_schedule_size(tiles, where, name):
    """发块表有 Q 块数那么多项：先算要多少内存（太大 → ValueError，写出引出它的参数）。"""
    check_memory(name, tiles * SCHEDULE_BYTES_PER_TILE, where=where)


def _grid(n_m, bh, n_sm):
    """persistent_grid 去掉检查（_launch 和 persistent_schedule 用：参数已经查过）。"""
    tiles = n_m * bh
    g = min(tiles, n_sm)
    return (g,), max(1, min(bh, -(-2 * g // n_m)))


def persistent_schedule(n_m, bh, n_sm):
    """
    主机上照抄内核的发块规则（_tile_order、_tile_of、_n_mine），返回每个程序依次算的 (pid_m, bh) 列表。
    内核里的那份在 CPU 上跑不了：测试用这一份检查"每个 Q 块恰好算一次"，基准用它报每个程序分到的 K/V 块数。
    表有 n_m·bh 项：放不进内存时 ValueError。
    """
    _check_grid_args(n_m, bh, n_sm, "persistent_schedule")
    _check_schedule_size(n_m * bh, "persistent_schedule", "n_m·bh")
    return _schedule(n_m, bh, n_sm)


def _schedule(n_m, bh, n_sm):
    (g,), chunk = _grid(n_m, bh, n_sm)
    tiles = n_m * bh

    def order(t):                                   # = _tile_order
        c = t // (chunk * n_m)
        heads = min(chunk, bh - c * chunk)
        r = t - c * chunk * n_m
        return n_m - 1 - r // heads, c * chunk + r % heads

    full = tiles // g
    out = []
    for p in range(g):
        mine = full + int((p if full % 2 == 0 else g - 1 - p) < tiles - full * g)      # = _n_mine
        out.append([order(k * g + (p if k % 2 == 0 else g - 1 - p)) for k in range(mine)])   # = _tile_of
    return out


def schedule_balance(n, bh, n_sm, causal, d=128):
    """
    持久内核每个程序要走的 K/V 块数 → (最多, 平均)；最多 / 平均 = 静态分配的尾巴。
    块数和内核的 _geometry 同一个算法：Q 块 pid_m（R = CONSUMERS·BLOCK_M 行）causal 时走到 min((pid_m + 1)·R, n)。
    """
    _check_grid_args(n, bh, n_sm, "schedule_balance", names=("n", "bh", "n_sm"))
    check_bool("causal", causal, where="schedule_balance")
    check_choice("d", d, HEAD_DIMS, where="schedule_balance")
    block_m, block_n = tile_config("persist", d)[:2]
    rows = FLAGS["persist"]["CONSUMERS"] * block_m
    n_m = -(-n // rows)
    _check_schedule_size(n_m * bh, "schedule_balance", "n·bh")
    work = [sum(-(-min((pid_m + 1) * rows, n) // block_n) if causal else -(-n // block_n) for pid_m, _ in prog)
            for prog in _schedule(n_m, bh, n_sm)]
    return max(work), sum(work) / len(work)


def _launch(q, k, v, causal, scale, variant, return_lse, tiles=None, programs=None):
    """
    检查过的输入 → 启动。tiles = (BLOCK_N, STAGES) 时换掉 tile_config 的这两项（--explore 扫配置用）；
    programs：持久内核最多几个程序（默认 = SM 数）。自检用 SELFTEST_PROGRAMS：小形状也让每个程序走好几个 Q 块。
    """
    batch, n, hq, d = q.shape
    hk = k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    block_m, block_n, stages, num_warps, maxnreg, _ = tile_config(variant, d)
    if tiles is not None:
        block_n, stages = tiles
    f = FLAGS[variant]
    out = torch.empty_like(q)                                                 # [B, N, H, d]
    lse = torch.empty((batch, hq, n), device=q.device, dtype=torch.float32) if return_lse else out
    q_desc = _desc(q.view(batch * n, hq * d), (block_m, d))                  # [B·N, H·d]，块 [BLOCK_M, d]
    k_desc = _desc(k.view(batch * n, hk * d), (block_n, d))                  # [B·N, Hk·d]，块 [BLOCK_N, d]
    v_desc = _desc(v.view(batch * n, hk * d), (block_n, d))
    n_m = triton.cdiv(n, f["CONSUMERS"] * block_m)                           # 每个 (序列, 头) 的 Q 块数
    if f["PERSIST"]:
        grid, chunk = _grid(n_m, batch * hq, programs or _sm_count(q.device))
    else:
        grid, chunk = (n_m, batch * hq), 1
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    _attn_fwd[grid](q_desc, k_desc, v_desc, out, lse, scale * LOG2E, n, hq, hq // hk, batch * hq, chunk,
                    HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                    RETURN_LSE=return_lse, num_warps=num_warps, **f, **extra)
    return (out, lse) if return_lse else out


# ############################################################################
# 反向（FA3 的做法）：一个主内核，每对 (K/V 块, Q 块) 5 次矩阵乘；dQ 经共享内存用 TMA 归约加回全局
# ############################################################################
# 记号：S = scale·Q Kᵀ，P = exp(S − LSE)，dV = Pᵀ dO，dP = dO Vᵀ，dS = P ∘ (dP − D)，D = rowsum(dO ∘ O)，
#       dQ = scale·dS K，dK = scale·dSᵀ Q。
# 程序 (i, b·H + h) 拿住第 i 个 K/V 块（两个计算组各 BLOCK_N 行），走过它看得到的所有 Q 块，每个计算组每一轮：
#   Sᵀ = K Qᵀ → Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e) → dV += Pᵀ dO → dPᵀ = V dOᵀ → dSᵀ = Pᵀ ∘ (dPᵀ − D)
#   → dK += dSᵀ Q → dSᵀ 写进共享内存、和另一组交换 → dQ 的一半列 = dS K（K 方向走满两组的 K/V 行）
#   → 写进共享内存，TMA 归约加进 fp32 的 dQ 累加器（不同 K/V 块的程序加到同一块 dQ 上）。
# 为什么算转置（Sᵀ 而不是 S）：wgmma 的 A 操作数可以在寄存器里，而 dV += Pᵀ dO、dK += dSᵀ Q 要的 A 正是 Pᵀ、dSᵀ，
# 并且行 = key 行，和 dK、dV 累加器同一种分布——Pᵀ、dSᵀ 不经过共享内存（FA3 的 "swapAB"）。
# dQ = dS K 要 dS 当 A：寄存器里的 dSᵀ 换不成 dS 的分布（要跨线程转置），而它本来就要写进共享内存给另一组用：
# [BLOCK_N, BLOCK_M] 的格子读的时候用 .permute((1, 0)) 视图 [BLOCK_M, BLOCK_N]
# （16 位数的 wgmma 允许 A 从共享内存转置读）。
# 每块 Q 行的 LSE·log2 e、D：预处理内核写成按头排的 [2, B·H, n_pad]，生产者每格用一维 TMA 和 Q、dO 一起读进来，
# 计算组直接按沿列广播的布局从共享内存读（每轮从全局读、再 convert_layout 的做法慢 1.1–1.3×）。
# 第一版每个计算组各算自己 64 行 K 的那份 dQ、从寄存器原子加（red.global.add.v2）：L2 流量是这里的两倍、
# 原子加的地址逼得 ptxas 溢出 ~830 字节，d = 128 时慢 1.6–1.8×（代码在 git 18929f1）。
# 和 triton_flash.py 默认的反向比：那里 dK/dV 内核 5 次 + 单独的 dQ 内核再算一遍 QKᵀ、dO Vᵀ = 7 次矩阵乘。
# worker_regs（最后一项）只是记账：_attn_bwd 的 gl.warp_specialize 调用里写死了同样的 [240, 24]（测试对照两处）
BWD_TILES = {64: (128, 64, 2, 2, 4, 168, (240, 24)),
             128: (64, 64, 2, 3, 4, 168, (240, 24))}


def bwd_tile_config(d):
    """
    反向的块：(BLOCK_M, BLOCK_N, CONSUMERS, STAGES, num_warps, maxnreg, worker_regs)。
    BLOCK_N = 每个计算组拿的 K/V 行数（程序的 K/V 块 = CONSUMERS·BLOCK_N = 128 行）；BLOCK_M = 每轮流过的 Q / dO 块的
    行数；STAGES = Q / dO 环的格数。
    寄存器账（每线程，128 线程的计算组）：dK、dV 累加器各 BLOCK_N·d/128 个 fp32（d = 128：64 + 64），Sᵀ、dPᵀ 各
    BLOCK_N·BLOCK_M/128（d = 128：32 + 32），Pᵀ、dSᵀ 的 16 位 A 操作数再各一半，dQ 的一半 BLOCK_M·d/2/128（这时 Sᵀ、
    dPᵀ 已经死了）。一个计算组拿 128 行 K/V 时 d = 128 的 dK + dV 就有 256 个：必溢出——所以两个计算组各 64 行，
    共用每一份 Q / dO（empty 计数 2，和前向的 ws2 一样）。
    d = 64 的 dK + dV 只有 64 个：BLOCK_M 加到 128（Sᵀ、dPᵀ 各 64 个），每轮的矩阵乘大一倍、同步和等待少一半；
    ptxas 溢出 196 字节，实测仍比 BLOCK_M = 64（4 格、不溢出）快 4–10%（bench/results/gluon_bwd_explore.json）。
    共享内存：K、V 2·CONSUMERS·BLOCK_N·d·2 字节 + STAGES·2·BLOCK_M·d·2（Q、dO）+ 4·BLOCK_N·BLOCK_M·2（dSᵀ：两组 ×
    奇偶两份）+ 2·BLOCK_M·(d/2)·4（两组的 fp32 dQ 半块）+ STAGES·2·BLOCK_M·4（每格的 LSE·log2 e、D）；
    按这个式子 d = 128 时 230 912 字节、d = 64 时 198 656 字节，再加 mbarrier 和对齐，ptxas 报 231 360 / 199 072
    （上限 232 448；d = 64 再加一格，式子就正好到上限，加上 mbarrier 就超了）。CONSUMERS 只能是 2（两组交换 dSᵀ、
    各算 dQ 的一半列是为两组写的；_launch_bwd 检查）。
    溢出（triton 3.6 为 sm_90a 编译，ptxas -v）：d = 128 full / causal 124 / 44 字节，d = 64 196 / 196 字节
    （bench/results/gluon_bwd_ptxas.log）。
    """
    return BWD_TILES[check_choice("d", d, tuple(BWD_TILES), where="bwd_tile_config")]


PRE_BLOCK = 64        # 预处理一个程序的行数（[B·N·H] 里的行）


def _check_bwd_args(q, k, v, out, lse, do, causal, softmax_scale):
    """attention_backward 的参数检查（先于设备检查，CPU 上也能测）。返回 scale。"""
    _, scale = _check_args(q, k, v, causal, softmax_scale, "best", False, where="attention_backward")
    batch, n, hq, _ = q.shape
    for name, t in (("out", out), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_backward：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.shape != q.shape:
            raise ValueError(f"attention_backward：{name} 的形状必须和 q 相同 {tuple(q.shape)}，收到 {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"attention_backward：{name} 的 dtype 必须和 q 相同（{q.dtype}），收到 {t.dtype}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"attention_backward：lse 必须是 torch.Tensor，收到 {type(lse).__name__}")
    if tuple(lse.shape) != (batch, hq, n) or lse.dtype != torch.float32:
        raise ValueError(f"attention_backward：lse 必须是 float32 的 [B, H, N] = {(batch, hq, n)}"
                         f"（attention(..., return_lse=True) 给的那个），收到 {lse.dtype} {tuple(lse.shape)}")
    return scale


def attention_backward(q, k, v, out, lse, do, causal=False, softmax_scale=None):
    """
    注意力的反向：q [B, N, H, d]、k、v [B, N, Hk, d]、前向的 out [B, N, H, d] 和 lse [B, H, N]（自然对数），
    上游梯度 do [B, N, H, d] → (dq, dk, dv)，形状、dtype 和 q、k、v 相同。causal、softmax_scale 必须和前向一样。
    GQA（Hk < H）：内核给每个 query 头写一份 fp32 的 dK、dV，主机上按组求和。
    dQ 不逐位可复现：不同 K/V 块的程序用 TMA 归约把各自那份加进同一个 fp32 累加器，先后由调度决定，两次运行的 dq
    相差最多 ~3e-5（相对，gluon_bwd_explore.json 的 rel_diff）；dK、dV 是逐位可复现的。要逐位可复现的梯度用
    triton_flash.flash_attn_func（默认的 split 反向，没有原子操作）。
    """
    scale = _check_bwd_args(q, k, v, out, lse, do, causal, softmax_scale)
    _check_on_hopper("attention_backward", q=q, k=k, v=v, out=out, lse=lse, do=do)
    return _launch_bwd(q, k, v, out, lse, do, causal, scale)


def _launch_bwd(q, k, v, out, lse, do, causal, scale, tile=None):
    """检查过的输入 → 预处理（D、清零 dQ 累加器）→ 主内核 → dQ 乘 scale 换 dtype（GQA：dK、dV 按组求和）。"""
    batch, n, hq, d = q.shape
    hk = k.shape[2]
    group = hq // hk
    q, k, v, out, do, lse = (t.contiguous() for t in (q, k, v, out, do, lse))
    block_m, block_n, cons, stages, num_warps, maxnreg, _ = tile or bwd_tile_config(d)   # tile：--explore-bwd 用
    if cons != 2:                 # 内核是为两个计算组写的（交换 dSᵀ、各算 dQ 的一半列），见 bwd_tile_config
        raise ValueError(f"_launch_bwd：反向的块 CONSUMERS 只能是 2，收到 {cons}（tile={tile}）")
    n_pad = triton.cdiv(n, block_m) * block_m                                 # 每个头的行补齐到 BLOCK_M 的倍数
    # [2, B·H·n_pad]：LSE·log2 e、D，每个头补齐到 BLOCK_M 的倍数，生产者按块用 TMA 读。补出来的位置要清零
    # （被掩掉的 query 不能是 NaN）；N 是 BLOCK_M 的倍数时没有补的位置，预处理写满每一格，省一次清零
    alloc = torch.empty if n_pad == n else torch.zeros
    stats = alloc((2 * batch * hq * n_pad,), device=q.device, dtype=torch.float32)
    dq_acc = torch.empty((batch, hq, n_pad, d), device=q.device, dtype=torch.float32)  # 预处理内核清零
    rows = batch * n * hq
    _bwd_preprocess[(triton.cdiv(rows, PRE_BLOCK),)](out, do, lse, stats, dq_acc, n, hq, rows, n_pad, HEAD_DIM=d,
                                                     BLOCK=PRE_BLOCK, num_warps=4)
    # GQA：每个 query 头一份 fp32 的 dK、dV [B, N, H, d]，之后按组求和；否则直接写输入的 dtype
    acc_dtype = q.dtype if group == 1 else torch.float32
    dk = torch.empty((batch, n, hq, d), device=q.device, dtype=acc_dtype)
    dv = torch.empty((batch, n, hq, d), device=q.device, dtype=acc_dtype)
    q_desc = _desc(q.view(batch * n, hq * d), (block_m, d))                  # [B·N, H·d]，块 [BLOCK_M, d]
    do_desc = _desc(do.view(batch * n, hq * d), (block_m, d))
    k_desc = _desc(k.view(batch * n, hk * d), (block_n, d))                  # [B·N, Hk·d]，块 [BLOCK_N, d]
    v_desc = _desc(v.view(batch * n, hk * d), (block_n, d))
    dq_desc = _desc(dq_acc.view(batch * hq * n_pad, d), (block_m, d // 2))  # 块 = 一个计算组归约的那一半
    st_desc = _desc(stats, (block_m,))                                         # 一维，块 = BLOCK_M 个 fp32
    grid = (triton.cdiv(n, cons * block_n), batch * hq)
    _attn_bwd[grid](q_desc, do_desc, k_desc, v_desc, st_desc, dq_desc, dk, dv, scale * LOG2E, scale, n, hq, group,
                    n_pad, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CONSUMERS=cons, STAGES=stages, CAUSAL=causal,
                    num_warps=num_warps, maxnreg=maxnreg)
    dq = torch.empty_like(q)                                                  # [B, H, n_pad, d] → [B, N, H, d]
    _dq_convert[(triton.cdiv(rows, PRE_BLOCK),)](dq_acc, dq, n, hq, rows, n_pad, scale, HEAD_DIM=d, BLOCK=PRE_BLOCK,
                                                 num_warps=4)
    if group > 1:                                                             # [B, N, Hk, GROUP, d] → 组内求和
        dk = dk.view(batch, n, hk, group, d).sum(3).to(q.dtype)
        dv = dv.view(batch, n, hk, group, d).sum(3).to(q.dtype)
    return dq, dk, dv


if torch is not None:
    class _AttentionFn(torch.autograd.Function):
        """attention 的 autograd：前向 = _launch（带 LSE），反向 = _launch_bwd。lse 不可求导。"""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, variant):
            out, lse = _launch(q, k, v, causal, scale, variant, True)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.set_materialize_grads(False)          # lse 没有梯度：不让 autograd 每次为它启动一个填零的内核
            ctx.causal, ctx.scale = causal, scale
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, do, _dlse):
            if do is None:                            # 损失没用到 out（set_materialize_grads(False) 时不补零）
                return None, None, None, None, None, None
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _launch_bwd(q, k, v, out, lse, do, ctx.causal, ctx.scale)
            return dq, dk, dv, None, None, None


def _short(exc):
    """异常 → 一行（表里放得下）。"""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:100] if text else ''}"


EXPLORE_BWD_TOL = 1e-3     # 反向块不同只改 fp32 累加的顺序：梯度的相对差在 1e-5 量级，超过它就是算错了


# ============================================================================
# GPU 自检：flash-attn 的判据（和 triton_flash.check_gpu 同一个）
#   ‖ours − ref64‖/‖ref64‖ ≤ 2 × ‖torch低精度 − ref64‖/‖ref64‖ + 1e-6；LSE 用最大绝对误差，同样 ≤ 2 × torch 的 + 1e-6
# ============================================================================
def _triton_flash():
    """lecture11/triton_flash.py：float64 参考、误差函数、基准里对照的 flash_attn_func。"""
    import triton_flash
    return triton_flash


SELFTEST_SHAPES = (   # (B, N, H, Hk)：不规则的 N（1、不满一块、跨几块、多出一行），B/H 也不规则
    (1, 1, 2, 2), (2, 77, 3, 3), (1, 1000, 4, 2), (1, 4097, 2, 1), (3, 384, 2, 2),
)


# 持久内核自检时的程序数：自检形状的 Q 块数是 2、6、32、66、18，5 个程序时除了 2 都要走好几轮，
# 6、32、66、18 还都剩一轮不满（_n_mine 的余数、蛇形的奇数轮）
SELFTEST_PROGRAMS = 5


def _check_gpu(seed, variants=VARIANTS, dtypes=None, shapes=SELFTEST_SHAPES):
    tf = _triton_flash()
    dtypes = dtypes or (torch.bfloat16, torch.float16)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for (batch, n, hq, hk), d, causal in ((s, d, c) for s in shapes for d in HEAD_DIMS for c in (False, True)):
            q = torch.randn(batch, n, hq, d, device="cuda", dtype=dtype, generator=gen)
            k = torch.randn(batch, n, hk, d, device="cuda", dtype=dtype, generator=gen)
            v = torch.randn(batch, n, hk, d, device="cuda", dtype=dtype, generator=gen)
            ref_o, ref_l = tf.reference_attention(q, k, v, causal=causal)                       # float64
            low_o, low_l = tf.reference_attention(q, k, v, causal=causal, dtype=dtype)          # torch 低精度
            t_o, t_l = tf._rel_err(low_o, ref_o), tf._lse_err(low_l, ref_l)
            runs = [(v_, None) for v_ in variants]
            if "persist" in variants:          # 持久内核再跑一遍 3 个程序：SM 多于 Q 块时每个程序只走 1 块，
                runs.append(("persist", SELFTEST_PROGRAMS))   # 跨 Q 块的环、Q 的相位、q_empty 都走不到
            for variant, programs in runs:
                name = f"B{batch} N{n} H{hq}/{hk} d{d}{' causal' if causal else ''}"
                label = variant if programs is None else f"{variant}/{programs}"
                try:
                    out, lse = (attention(q, k, v, causal=causal, variant=variant, return_lse=True) if programs is None
                                else _launch(q, k, v, causal, d ** -0.5, variant, True, programs=programs))
                    e_o, e_l = tf._rel_err(out, ref_o), tf._lse_err(lse, ref_l)
                    err = ""
                except Exception as exc:                 # 编译 / 运行失败也记一行，接着测别的
                    e_o = e_l = float("inf")
                    err = _short(exc)
                torch_errs = {"out": t_o, "lse": t_l}
                ok = all(tf.within_torch_bound(f, e, torch_errs)[0] for f, e in (("out", e_o), ("lse", e_l)))
                rows.append((str(dtype).replace("torch.", ""), label, name, e_o, t_o, e_l, t_l, ok, err))
    return rows


def _check_gpu_bwd(seed, dtypes=None, shapes=SELFTEST_SHAPES):
    """
    反向（前向用 BEST，经 attention() 的 autograd）：dq、dk、dv 和 float64 参考比，判据和前向相同
    （≤ 2 × PyTorch 低精度的误差 + 1e-6）；再算一遍（"rerun" 行）：dK、dV 要逐位相同，dQ 经 TMA 归约、先后不定，
    不要求逐位相同，只要两次的相对差 ≤ EXPLORE_BWD_TOL（见 attention_backward；这一行的 ours 列 = 这个相对差，
    torch 列是 None）。
    输入、参考、误差函数都用 triton_flash 的（make_case、run_reference、field_errors）：参考 = 同样的输入在 float64 /
    低精度里走一遍 autograd。返回行 (dtype, case, field, ours, torch, ok, err)。
    """
    tf = _triton_flash()
    dtypes = dtypes or (torch.bfloat16, torch.float16)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    for dtype in dtypes:
        for (batch, n, hq, hk), d, causal in ((s, d, c) for s in shapes for d in HEAD_DIMS for c in (False, True)):
            name = f"B{batch} N{n} H{hq}/{hk} d{d}{' causal' if causal else ''}"
            case = tf.make_case(name, batch, n, n, hq, hk, d, dtype, "cuda", gen, causal=causal)
            ref = tf.run_reference(case)                                                    # float64
            torch_errs = tf.field_errors(tf.run_reference(case, dtype=dtype), ref)          # torch 低精度
            q, k, v = (case[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v"))
            try:
                attention(q, k, v, causal=causal).backward(case["do"])
                grads = dict(zip(("dq", "dk", "dv"), (q.grad.double(), k.grad.double(), v.grad.double())))
                first = (k.grad.clone(), v.grad.clone())
                q.grad = k.grad = v.grad = None
                attention(q, k, v, causal=causal).backward(case["do"])          # 再算一遍：dK、dV 要逐位相同
                same = all(torch.equal(a, b) for a, b in zip(first, (k.grad, v.grad)))
                dq_diff = tf._rel_err(q.grad.double(), grads["dq"])            # dQ：两次的相对差
                err = "" if same else "dk、dv 两次不逐位相同"
            except Exception as exc:
                grads, same, dq_diff, err = None, False, float("inf"), _short(exc)
            dt = str(dtype).replace("torch.", "")
            rows.append((dt, name, "rerun", dq_diff, None, same and dq_diff <= EXPLORE_BWD_TOL, err))
            for f, r in zip(("dq", "dk", "dv"), ref[2:]):
                e = float("inf") if grads is None else tf._rel_err(grads[f], r)
                ok, t = tf.within_torch_bound(f, e, torch_errs)
                if grads is not None and float(r.norm()) == 0.0:
                    # 梯度恰好是 0（N = 1：只有一个 key，dS = P∘(dP − D) ≡ 0）：相对误差没有意义。我们的 D 按
                    # FlashAttention 的恒等式 rowsum(dO∘O) 算，和 dP 差一点舍入，dq、dk 是很小的非零数；
                    # 改成和同一用例的 dV 比大小（‖ours‖ / ‖dV‖ ≤ 1e-4）
                    e, t = _zero_grad_err(grads[f], ref[4]), 0.0
                    ok = e <= ZERO_GRAD_TOL
                rows.append((dt, name, f, e, t, ok, err))
    return rows


ZERO_GRAD_TOL = 1e-4


def _zero_grad_err(x, dv_ref):
    """参考梯度恒为 0 时的误差：‖x‖ / ‖dV 的参考‖（NaN / inf 算作无穷大）。"""
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    return float(x.norm() / dv_ref.norm().clamp_min(1e-30))


def _selftest(seed=None, only=VARIANTS + ("bwd",)):
    """only：查哪几项（前向的 variant 名，"bwd" = 反向）。编译占了大半时间，GPU 机器上可以分几个进程并行跑。"""
    if torch is None or not torch.cuda.is_available():
        print("SKIP: 没有 CUDA GPU（本文件的内核只在 Hopper 上跑：wgmma、TMA、setmaxnreg）")
        sys.exit(77)
    if GLUON_ERROR is not None:
        print(f"SKIP: 这个 triton 没有可用的 Gluon（需要 triton ≥ 3.6）：{GLUON_ERROR}")
        sys.exit(77)
    if torch.cuda.get_device_capability()[0] != 9:
        print(f"SKIP: 本内核只为 Hopper（sm_90）写，这块 GPU 是 {torch.cuda.get_device_name()}")
        sys.exit(77)
    seed = _triton_flash()._pick_seed(seed)
    print(f"gluon_flash 自检：{torch.cuda.get_device_name()}，torch {torch.__version__}，triton {triton.__version__}，"
          f"种子 {seed}（复现：python3 lecture11/gluon_flash.py --seed {seed}）")
    t0 = time.time()
    rows = _check_gpu(seed, variants=tuple(v for v in VARIANTS if v in only))
    if rows:
        print(f"  {'dtype':<9s}{'variant':<11s}{'case':<26s}{'out':>10s}{'torch':>10s}{'lse':>10s}{'torch':>10s}  ok")
    for dt, var, name, e_o, t_o, e_l, t_l, ok, err in rows:
        print(f"  {dt:<9s}{var:<11s}{name:<26s}{e_o:>10.2e}{t_o:>10.2e}{e_l:>10.2e}{t_l:>10.2e}  "
              f"{'✓' if ok else '✗'} {err}")
    failed = [r for r in rows if not r[7]]
    t1 = time.time()
    bwd_rows = _check_gpu_bwd(seed) if "bwd" in only else []
    if bwd_rows:
        print(f"  反向（前向 {BEST}）：")
        print(f"  {'dtype':<9s}{'case':<26s}{'field':<7s}{'ours':>10s}{'torch':>10s}  ok")
    for dt, name, f, e, t, ok, err in bwd_rows:
        print(f"  {dt:<9s}{name:<26s}{f:<7s}{e:>10.2e}{'–' if t is None else format(t, '.2e'):>10s}  "
              f"{'✓' if ok else '✗'} {err}")
    if bwd_rows:
        print(f"  rerun = 同样的输入再算一遍反向：dk、dv 要逐位相同；ours 列 = 两次 dq 的相对差（dq 经 TMA 归约，"
              f"先后不定，要求 ≤ {EXPLORE_BWD_TOL:.0e}）")
    failed_bwd = [r for r in bwd_rows if not r[5]]
    if failed or failed_bwd:
        print(f"gluon_flash 自检失败：前向 {len(failed)} / {len(rows)} 项，反向 {len(failed_bwd)} / {len(bwd_rows)} 项"
              f"（种子 {seed}）")
        sys.exit(1)
    print(f"gluon_flash 自检通过：前向 {len(rows)} 项（{t1 - t0:.0f} s）、反向 {len(bwd_rows)} 项"
          f"（{time.time() - t1:.0f} s）误差都 ≤ 2 × PyTorch 低精度注意力的误差")


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Gluon 版 FlashAttention-3（Hopper）：自检（基准在 bench/gluon_sweep.py）")
    ap.add_argument("--seed", type=int, default=None, help="自检的随机种子（默认按时间取，打印出来）")
    ap.add_argument("--only", nargs="+", choices=VARIANTS + ("bwd",), default=VARIANTS + ("bwd",),
                    help="自检只查这几项（前向的 variant、bwd = 反向）")
    return ap.parse_args(argv)


if __name__ == "__main__":
    _args = _parse_args()
    _selftest(_args.seed, tuple(_args.only))
