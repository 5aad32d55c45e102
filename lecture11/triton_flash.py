"""
Triton 版 FlashAttention-2：flash_lab 里用 numpy 写清楚的算法，怎样写成 GPU 内核，又怎样证明它算对了？

两个版本（后一版 = 前一版 + 新东西，每版有自己的检查命令）；flash-decoding 在 flash_decode.py（本模块重新导出
flash_decode 等公开名字），主机端的快速启动在 fast_launch.py：
  v1  最小内核 mini_attention(q, k, v, causal)：约 150 行，Triton 教程 06-fused-attention 的范围。
      前向 = 一层在线 softmax 循环；反向 = D = Σ dO∘O（torch 算）+ dK/dV 内核 + dQ 内核。
      限制：q、k、v 形状相同（Nq = Nk，Hq = Hk），d ∈ {16, 32, 64, 128}，每个块都做掩码。
          python3 lecture11/triton_flash.py --kernel minimal
  v2  完整内核 flash_attn_func / flash_attn_varlen_func（flash-attn 的接口），在 v1 上加了：
      a. 速度：三段循环（只有边上的块做掩码）、整块被掩码的块不进循环、exp2 + 一次 FMA、倒序发 Q 块、autotune
      b. 形状：Nq ≠ Nk（右下角对齐）、GQA / MQA、变长序列打包（varlen）、任意 d ≤ 256、任意步长
      c. 特性：滑动窗口、ALiBi、bias、softcap（Gemma-2）、dropout（Philox 随机数，反向重新生成同一张掩码）
      d. 反向：默认 split = dK/dV 内核 + dQ 内核（每对块 7 次矩阵乘，逐位可复现）；Launch(bwd="atomic") 是 FA2 的
         原子 dQ（5 次）。按实测选：H200 上原子路径反而慢。试过但默认关的 Hopper 开关：TMA 描述符、warp_specialize
          python3 lecture11/triton_flash.py --kernel full
  和 float64 参考 reference_attention 逐项比较 out、LSE、dQ、dK、dV：CPU 上用 Triton 解释器（fp32，误差 < CPU_TOL），
  GPU 上用 flash-attn 的判据（误差 ≤ 2 × PyTorch 自己 bf16/fp16 注意力的误差）。

形状（flash-attn 的布局）：q [B, Nq, Hq, d]，k、v [B, Nk, Hk, d] → out [B, Nq, Hq, d]，LSE [B, Hq, Nq]（自然对数）。
速度、主机开销（H200）：lecture11/bench/README.md。

运行：
  python3 lecture11/triton_flash.py [--kernel minimal|full|decode|configs|determinism|all] [--seed N]
      有 GPU：bf16/fp16 真实尺寸；没有 GPU：以 TRITON_INTERPRET=1 重新运行自己（CPU 解释器，小尺寸 fp32）。
      每次运行打印种子；失败时用 --seed 复现同一组输入。decode = flash_decode.py 的检查。
依赖 torch、triton（解释器模式要在 import 本模块之前设置环境变量 TRITON_INTERPRET=1）。
"""
import argparse
import dataclasses
import itertools
import math
import numbers
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:            # fast_launch、flash_decode 在同一文件夹（别的讲次按路径加载本文件时也找得到）
    sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
from course_utils import (check_bool, check_choice, check_device, check_int, check_memory, check_real,  # noqa: E402
                          check_seed)

try:
    import torch
except ImportError:
    if __name__ == "__main__":      # 当脚本运行：按仓库约定打印一行 SKIP、退出码 77（check-all 显示为 skip）
        print("SKIP: 没有安装 torch：在仓库根目录运行 `make setup`，再用 `.venv/bin/python lecture11/triton_flash.py`")
        sys.exit(77)
    raise
try:
    import triton
    import triton.language as tl
except ImportError:
    if __name__ == "__main__":
        print("SKIP: 没有安装 triton（requirements.txt 只在 Linux 上装它；本模块需要 triton 和 Linux）")
        sys.exit(77)
    raise

from fast_launch import (_MAX_PLANS, _PLANS, _SEEN, _Plan, _current_stream, _launch_hooks_active,  # noqa: E402,F401
                         _should_record, _sm_count)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"   # 必须在定义内核之前确定
MAX_HEAD_DIM = 256
_LOG2E = tl.constexpr(math.log2(math.e))     # 内核里用的 log2 e（= 1.4426950408889634）
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ============================================================================
# v1 · 最小内核（前向 + 反向，causal 或不 causal）
#   q、k、v [B, N, H, d] 连续且形状相同，步长 (stride_b, stride_n, stride_h, 1) 四个张量共用；
#   program (i, b·H + h) 负责第 b 个序列、第 h 个头的 Q 块 [i·BLOCK_M, (i+1)·BLOCK_M)。
#   练习 11.7 写前向内核、11.8 写反向的两个内核（lecture11/EXERCISES.md）；启动它们的主机代码是给定的。
# ============================================================================
@triton.jit
def _mini_visible(rows, cols, N, CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] 的 bool：key 列在序列内，causal 时还要 j ≤ i。越界的 Q 行不管（它们不会被写回）。"""
    ok = (cols < N)[None, :] & (rows >= 0)[:, None]
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None])
    return ok


@triton.jit
def _mini_fwd_kernel(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """一个 Q 块留在片上，走过它看得见的 K/V 块（在线 softmax）：写 O 块 [BLOCK_M, D] 和 LSE = m + log l。"""
    # >>> 练习 11.7
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h        # 第 b 个序列、第 h 个头
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")      # 每行目前见过的最大 logit
    l_i = tl.zeros_like(m_i)                                        # Σ exp(s − m_i)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)                  # Σ exp(s − m_i)·v（还没除以 l_i）
    hi = N
    if CAUSAL:                                                       # 对角线右边的块整块看不见：不进循环
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_off = base + cols[:, None] * stride_n + offs_d[None, :]
        k = tl.load(K + kv_off, mask=(cols < N)[:, None], other=0.0)                 # K_j [BLOCK_N, D]
        v = tl.load(V + kv_off, mask=(cols < N)[:, None], other=0.0)                 # V_j [BLOCK_N, D]
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale                  # [BLOCK_M, BLOCK_N]
        s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(tl.max(s, 1), m_i)      # 有限：每行在第一个块里至少看得见 key 0
        alpha = tl.exp(m_i - m_new)                # 旧的累加量按新的最大值缩小
        p = tl.exp(s - m_new[:, None])
        l_i = alpha * l_i + tl.sum(p, 1)
        acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=(rows < N)[:, None])
    tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)      # LSE [B, H, N]
    # <<< 练习 11.7


@triton.jit
def _mini_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """K_j、V_j 留在片上，走过看得见它们的 Q 块：dV_j = Σ_i P_ijᵀ dO_i，dK_j = scale·Σ_i dS_ijᵀ Q_i。"""
    # >>> 练习 11.8
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_off = base + cols[:, None] * stride_n + offs_d[None, :]
    k = tl.load(K + kv_off, mask=(cols < N)[:, None], other=0.0)
    v = tl.load(V + kv_off, mask=(cols < N)[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    lo = 0
    if CAUSAL:                                                       # 更早的 Q 行看不见这个 key 块
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, N, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q_off = base + rows[:, None] * stride_n + offs_d[None, :]
        q = tl.load(Q + q_off, mask=(rows < N)[:, None], other=0.0)                  # 越界行读 0：贡献为 0
        do = tl.load(DO + q_off, mask=(rows < N)[:, None], other=0.0)
        lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
        delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
        p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)  # 由 LSE 重算 P
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        dov = tl.dot(do, tl.trans(v), input_precision=PREC)                          # dP = dO Vᵀ
        ds = p * (dov - delta[:, None])                                              # dS = P∘(dP − D)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=(cols < N)[:, None])
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=(cols < N)[:, None])
    # <<< 练习 11.8


@triton.jit
def _mini_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """Q_i 留在片上，走过它看得见的 key 块：dQ_i = scale·Σ_j dS_ij K_j（和前向同样的循环）。"""
    # >>> 练习 11.8
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_off = base + rows[:, None] * stride_n + offs_d[None, :]
    q = tl.load(Q + q_off, mask=(rows < N)[:, None], other=0.0)
    do = tl.load(DO + q_off, mask=(rows < N)[:, None], other=0.0)
    lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
    delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_off = base + cols[:, None] * stride_n + offs_d[None, :]
        k = tl.load(K + kv_off, mask=(cols < N)[:, None], other=0.0)
        v = tl.load(V + kv_off, mask=(cols < N)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
        p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)
        dov = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dov - delta[:, None])
        dq += tl.dot(ds.to(q.dtype), k, input_precision=PREC)
    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rows < N)[:, None])
    # <<< 练习 11.8


MINI_BLOCKS = (16, 32) if INTERPRET else (64, 64)    # (BLOCK_M, BLOCK_N)；解释器用小块，几十行也跨好几块


def _hole_error(kernel, err):
    """
    练习没写完的内核（函数体是 raise NotImplementedError(...)）启动时的错误 → 那个 NotImplementedError。
    解释器把内核里的异常包成 InterpreterError（原异常在 __cause__ 里）；GPU 上 JIT 根本编译不了 raise，
    只好从内核源码里把那句提示读出来。都不是时返回 None（别的错误原样抛出）。
    """
    seen = err
    while seen is not None:
        if isinstance(seen, NotImplementedError):
            return seen
        seen = seen.__cause__ or seen.__context__
    import ast
    import inspect
    import textwrap
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(kernel, "fn", kernel))))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        exc = node.exc if isinstance(node, ast.Raise) else None
        if (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "NotImplementedError"
                and exc.args and isinstance(exc.args[0], ast.Constant)):
            return NotImplementedError(exc.args[0].value)
    return None


def _mini_launch(kernel, grid, *args, **meta):
    """启动一个 v1 内核；练习没写完时报那个练习自己的 NotImplementedError，而不是编译器的回溯。"""
    try:
        kernel[grid](*args, **meta)
    except Exception as err:
        hole = _hole_error(kernel, err)
        if hole is None:
            raise
        raise hole from None


def _mini_meta(q, causal):
    return dict(D=q.shape[-1], BLOCK_M=MINI_BLOCKS[0], BLOCK_N=MINI_BLOCKS[1], CAUSAL=causal, PREC=_prec(q.dtype))


def _mini_fwd(q, k, v, causal, scale):
    """q、k、v [B, N, H, d] 连续、形状相同 → o [B, N, H, d]，lse [B, H, N]（float32）。"""
    batch, n, heads, _ = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, n), device=q.device, dtype=torch.float32)
    _mini_launch(_mini_fwd_kernel, (triton.cdiv(n, MINI_BLOCKS[0]), batch * heads),
                 q, k, v, o, lse, scale, n, heads, *q.stride()[:3], **_mini_meta(q, causal))
    return o, lse


def _mini_bwd(q, k, v, o, lse, do, causal, scale):
    """前向存下的 q、k、v、o、lse 和 dO（都连续）→ dq、dk、dv；D = Σ dO∘O 由 torch 算。"""
    batch, n, heads, _ = q.shape
    delta = (do.float() * o.float()).sum(-1).transpose(1, 2).contiguous()     # D_i = Σ dO_i∘O_i [B, H, N]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sizes, meta = (scale, n, heads, *q.stride()[:3]), _mini_meta(q, causal)
    _mini_launch(_mini_dkdv_kernel, (triton.cdiv(n, MINI_BLOCKS[1]), batch * heads),
                 q, k, v, do, dk, dv, lse, delta, *sizes, **meta)
    _mini_launch(_mini_dq_kernel, (triton.cdiv(n, MINI_BLOCKS[0]), batch * heads),
                 q, k, v, do, dq, lse, delta, *sizes, **meta)
    return dq, dk, dv


class _MiniAttention(torch.autograd.Function):
    """v1 的 autograd 包装：前向存 q、k、v、o、LSE（都是 O(N)），反向由 LSE 重算 P。"""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = _mini_fwd(q, k, v, causal, scale)
        ctx.causal, ctx.scale = causal, scale
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _mini_bwd(q, k, v, o, lse, do.contiguous(), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def mini_attention(q, k, v, causal=False, softmax_scale=None):
    """v1 的入口：q、k、v [B, N, H, d]（形状相同，d ∈ {16, 32, 64, 128}）→ (out [B, N, H, d], lse [B, H, N])。"""
    causal, scale = _check_mini(q, k, v, causal, softmax_scale)
    return _MiniAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)


def mini_attention_backward(q, k, v, out, lse, dout, causal=False, softmax_scale=None):
    """
    v1 的反向（不经 autograd）：前向的 q、k、v、out [B, N, H, d]、lse [B, H, N]（float32）和 dout → (dq, dk, dv)。
    out、lse 可以来自任何正确的前向（练习 11.8 的检查用 float64 参考算出的 out、lse，不依赖练习 11.7）。
    """
    causal, scale = _check_mini(q, k, v, causal, softmax_scale)
    _check_mini_saved(q, out, lse, dout)
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    return _mini_bwd(q, k, v, out, lse.contiguous(), dout, causal, scale)


def _check_mini_saved(q, out, lse, dout):
    where = "mini_attention_backward"
    for name, t in (("out", out), ("dout", dout)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{where}：{name} 必须是和 q 同形状 {tuple(q.shape)}、同 dtype {q.dtype}、同设备的张量")
    want = (q.shape[0], q.shape[2], q.shape[1])
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want or lse.dtype != torch.float32 \
            or lse.device != q.device:
        raise ValueError(f"{where}：lse 必须是 float32、形状 [B, H, N] = {want}、和 q 同设备的张量")


# ============================================================================
# v2 · 完整内核
#
# 和 flash_lab._fwd_fa2 的逐行对应（记号：Q 块 [i0, i1)，K/V 块 [j0, j1)）
#   for i0, i1 in _tiles(N, Br)        program_id(0) = Q 块号（外层循环变成并行，倒序发：重的块先算），
#                                      program_id(1) = batch × query 头；BLOCK_M 就是 Br
#   for j0, j1 in _tiles(Nk, Bc)       _fwd_tiles 里的 key 块循环；_tile_range 先算出这个 Q 块要看的 [lo, hi)
#   if not _live(...): break           整块被掩码的 key 块根本不在 [lo, hi) 里
#   S = _masked_scores(...)            _logits：dot(q, kᵀ)，掩码只在带掩码的两段做
#   m, l, acc 的在线更新               同上，但在 log2 单位里：p = exp2(s·c − m)，c = scale·log2 e（一次 FMA）
#   O, L = _normalize(acc, m, l)       循环后除一次 l；l = 0 的行 O = 0、LSE = −inf；LSE 乘 ln 2 换回自然对数
#   flash_bwd：D = Σ dO∘O              _delta_kernel（顺便把 LSE 换成 log2 单位，空行换成 +inf）
#   flash_bwd 外层 j（dK_j、dV_j）     _dkdv_kernel：K/V 块不动，走 Q 块；GQA 组内的 query 头也在这个 program
#                                      里依次累加，所以 dK、dV 不用原子加
#   dQ_i += dS K_j                     两种做法（Launch(bwd=...) 选）：
#                                      "split"（默认）：_dq_kernel，Q 块不动，走 K/V 块，dQ 写一次。代价：QKᵀ、dO Vᵀ
#                                        各多算一遍（每对块 7 次矩阵乘），换来没有原子操作、结果逐位可复现
#                                      "atomic"（FA2）：同一个 _dkdv_kernel 里 ATOMIC_DQ = True，每对块顺手算 dS K_j，
#                                        原子加进 fp32 累加器：5 次矩阵乘（QKᵀ、dO Vᵀ、Pᵀ dO、dSᵀ Q、dS K），加的
#                                        先后由 GPU 调度决定，dQ 的末位每次可能不同
#                                      默认是 split，因为 H200 上实测它更快：少掉的 2 次矩阵乘没有换来时间
#                                        （bench/triton_bench.py 的 ours/atomic 一栏）
#
# 三段循环：对一个 Q 块，要看的 key 块是 [lo, hi)，其中对块里每一行都合法的是 [fs, fe)。循环分三段
#   （STAGE 0/1/2）：[lo, fs) 带掩码、[fs, fe) 不带掩码、[fe, hi) 带掩码；causal 时第 0 段为空、第 2 段是对角块。
#   一次调用 + tl.static_range(3)：STAGE 是编译期常量，编译出三份循环体，中段没有掩码指令。
#
# 约定
#   - 非 varlen 的输入看成"每段等长"的 varlen：[B, N, H, d] → [B·N, H, d]（连续张量只是换个视图），一套内核两种接口。
#   - causal、滑动窗口在 Nq ≠ Nk 时按"右下角"对齐：第 i 个 query 位于 key 轴上的位置 Nk − Nq + i，只看
#     j ∈ [pos − left, pos + right]（causal 即 right = 0）；和 flash_lab、flash-attn ≥ 2.1 一致。PyTorch SDPA 的
#     is_causal 是"左上角"对齐（query i 看 j ≤ i），Nq ≠ Nk 时两者不同。
#   - 一行一个合法 key 都没有（例如 Nq > Nk 的 causal 的前几行）：输出 0，LSE = −inf，梯度 0。
#   - ALiBi：logit 加上 −slope·|pos_i − j|（slope [Hq] 或 [B, Hq]，float32）。bias [B 或 1, Hq 或 1, Nq, Nk]
#     加在 softmax 之前，不求梯度、不支持 varlen。
#   - softcap c > 0（flash-attn 的定义）：x = q kᵀ·scale 先换成 c·tanh(x/c)，再加 ALiBi / bias、做掩码；反向的 dS
#     乘 1 − tanh²(x/c)（_logits 顺手返回 tanh，反向每个块只算一次）。它和 ALiBi 一样走"已乘 scale"的路径、不调优。
#   - dropout：P 归一化后按概率 p 置零、其余乘 1/(1 − p)（l 用未 dropout 的 P）；(b, h, i, j) 的随机数由
#     Philox(seed, 计数器) 生成，反向用同一个 seed 重新生成同一张掩码，掩码不用存。
#   - head dim 不是 2 的幂时补到 2 的幂，多出的列读 0。fp32 的矩阵乘用 IEEE 精度（不用 tf32）。
#     解释器（CPU）上 bf16 能跑但结果完全错误（误差 ~1e9），所以在解释器里直接报 TypeError；fp16、fp32 是对的。
# ============================================================================
@triton.jit
def _seq_bounds(CU_Q, CU_K, b):
    """第 b 段序列在打包张量里的起点和长度（非 varlen 也走这里：cu = [0, N, 2N, ...]）。"""
    q0 = tl.load(CU_Q + b)
    len_q = tl.load(CU_Q + b + 1) - q0
    k0 = tl.load(CU_K + b)
    len_k = tl.load(CU_K + b + 1) - k0
    return q0, len_q, k0, len_k


@triton.jit
def _floor_to(x, BLOCK: tl.constexpr):
    return (x // BLOCK) * BLOCK          # 调用处保证 x ≥ 0（负数的整除在 C 和 Python 里不一样）


@triton.jit
def _ceil_to(x, BLOCK: tl.constexpr):
    return ((x + BLOCK - 1) // BLOCK) * BLOCK


@triton.jit
def _tile_range(first, last, len_q, len_k, BLOCK: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr):
    """
    Q 行 [first, last]（都在序列内）要看的 key 块，分三段：[lo, fs) 带掩码、[fs, fe) 不带、[fe, hi) 带掩码。
    key j 对行 i 合法 ⇔ pos − WIN_L ≤ j ≤ pos + WIN_R，pos = i + len_k − len_q（WIN_* < 0 表示那一侧不限）。
    这个关系对 i、j 是对称的：反向的 dK/dV 要"key 列 [first, last] 被哪些 Q 行块看见"，就交换 (len_q, len_k)
    和 (WIN_L, WIN_R) 调用同一个函数（j ≤ i + shift + R ⇔ i ≥ j − shift − R）。
    """
    shift = len_k - len_q
    lo = first * 0
    hi = lo + len_k
    full_lo = lo
    full_hi = lo + len_k
    if WIN_L >= 0:
        lo = tl.maximum(first + shift - WIN_L, 0)
        full_lo = tl.maximum(last + shift - WIN_L, 0)
    if WIN_R >= 0:
        hi = tl.minimum(tl.maximum(last + shift + WIN_R + 1, 0), len_k)
        full_hi = tl.minimum(tl.maximum(first + shift + WIN_R + 1, 0), len_k)
    lo = _floor_to(lo, BLOCK)
    hi = _ceil_to(hi, BLOCK)
    fs = tl.minimum(tl.maximum(_ceil_to(full_lo, BLOCK), lo), hi)
    fe = tl.minimum(tl.maximum(_floor_to(full_hi, BLOCK), fs), hi)
    return lo, fs, fe, hi


@triton.jit
def _stage_bounds(lo, fs, fe, hi, STAGE: tl.constexpr):
    """三段循环的第 STAGE 段：0 → [lo, fs)，1 → [fs, fe)（不带掩码），2 → [fe, hi)。"""
    if STAGE == 0:
        start, stop = lo, fs
    elif STAGE == 1:
        start, stop = fs, fe
    else:
        start, stop = fe, hi
    return start, stop


@triton.jit
def _head_setup(SLOPES, BIAS, b, h, n_heads_q, max_q, max_k, stride_sb, stride_sh, stride_bb, stride_bh,
                HAS_ALIBI: tl.constexpr):
    """(batch b, query 头 h) 的 ALiBi 斜率（log2 单位）、bias 的起点、dropout 计数器的起点（三个内核共用）。"""
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32) * _LOG2E
    bias_base = BIAS + b.to(tl.int64) * stride_bb + h.to(tl.int64) * stride_bh
    rng_base = (b * n_heads_q + h).to(tl.int64) * max_q * max_k
    return slope2, bias_base, rng_base


@triton.jit
def _load_rows(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """读一个 [行, BLOCK_D] 的块；越界的行、补出来的列读 0。不需要检查时不生成掩码。"""
    if CHECK_ROWS:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    return x


@triton.jit
def _tanh(y):
    """
    fp32 的 tanh，全范围相对误差 ≤ 4e-7（Triton 没有各版本通用的 tl.tanh；libdevice 的 tanh 在解释器里不能用）。
    |y| ≥ 0.5：1 − 2/(e^{2y} + 1)（y 截在 ±32：不溢出，fp32 里 tanh(32) 就是 1）；|y| < 0.5 时这个式子相减抵消
    （相对误差 ~1e-7/|y|，softcap 很大时 c·tanh(x/c) 会错得很多），改用泰勒级数到 y¹⁵（截断误差 < 1e-8）。
    """
    a = tl.abs(y)
    big = 1.0 - 2.0 / (tl.exp2(tl.minimum(tl.maximum(y, -32.0), 32.0) * (2.0 * _LOG2E)) + 1.0)
    z = tl.minimum(a, 0.5)                       # 多项式只在 |y| < 0.5 时用：截住参数，|y| 大时也不溢出
    z = z * z
    p = -929569.0 / 638512875.0
    p = p * z + 21844.0 / 6081075.0
    p = p * z - 1382.0 / 155925.0
    p = p * z + 62.0 / 2835.0
    p = p * z - 17.0 / 315.0
    p = p * z + 2.0 / 15.0
    p = p * z - 1.0 / 3.0
    return tl.where(a < 0.5, y + y * (p * z), big)


@triton.jit
def _logits(q, k, rows, cols, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
            MASKED: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
            HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PREC: tl.constexpr):
    """
    返回 (s, t)。s = (cap(q kᵀ·scale) + alibi + bias)·log2 e，形状 [BLOCK_M, BLOCK_N]；MASKED 时不合法的位置是 −inf。
    cap(x) = c·tanh(x/c)（HAS_SOFTCAP，c = softcap），否则 cap(x) = x。t = tanh(x/c)：反向要 dcap/dx = 1 − t²
    （没有 softcap 时 t 没人用，编译时删掉）。没有 alibi/bias/softcap 时 s 是未乘 qk_scale 的 q kᵀ：
    调用处把乘法并进 exp2 的参数（一次 FMA：s·c − m）。
    """
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    t = s
    if HAS_SOFTCAP:           # 在自然单位里截：x = q kᵀ·scale = s·qk_scale / log2 e
        t = _tanh(s * (qk_scale / (softcap * _LOG2E)))
        s = t * (softcap * _LOG2E)                                # c·tanh(x/c)，换成 log2 单位
    elif HAS_ALIBI or HAS_BIAS:
        s = s * qk_scale
    pos = rows[:, None] + (len_k - len_q)                         # query 在 key 轴上的位置（右下角对齐）
    if HAS_ALIBI:
        s -= slope2 * tl.abs(pos - cols[None, :]).to(tl.float32)  # slope2 = slope·log2 e
    if HAS_BIAS:
        inside = (rows[:, None] < len_q) & (cols[None, :] < len_k)
        bias = tl.load(bias_base + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=inside, other=0.0)
        s += bias.to(tl.float32) * _LOG2E
    if MASKED:
        ok = (rows[:, None] < len_q) & (cols[None, :] < len_k)
        if WIN_L >= 0:
            ok = ok & (cols[None, :] >= pos - WIN_L)
        if WIN_R >= 0:
            ok = ok & (cols[None, :] <= pos + WIN_R)
        s = tl.where(ok, s, float("-inf"))
    return s, t


@triton.jit
def _probs(s, lse2, qk_scale, SCALED: tl.constexpr):
    """反向重算 P = exp2(s − LSE2)（s 没乘 qk_scale 时并进 FMA）。"""
    if SCALED:
        p = tl.exp2(s - lse2[:, None])
    else:
        p = tl.exp2(s * qk_scale - lse2[:, None])
    return p


@triton.jit
def _keep_mask(seed, rng_base, rows, cols, max_k, dropout_p):
    """dropout 保留掩码：计数器 = ((b·Hq + h)·max_q + i)·max_k + j，前向、反向、dropout_mask() 完全相同。"""
    offs = rng_base + rows.to(tl.int64)[:, None] * max_k + cols[None, :]
    return tl.rand(seed, offs) >= dropout_p


# ---------------------------------------------------------------------------- 前向
@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, lo, fs, fe, hi,
               rows, offs_n, offs_d, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
               seed, rng_base, max_k, dropout_p, k_desc, v_desc, kv_row0, kv_col0,
               STAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
               HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr):
    """flash_fwd(order="fa2") 的内层循环：对第 STAGE 段的 key 块做在线 softmax（TMA、WS 只用在不带掩码的中段）。"""
    MASKED: tl.constexpr = STAGE != 1
    USE_DESC: tl.constexpr = TMA and STAGE == 1          # K、V 用张量描述符整块搬运（Hopper 的拷贝引擎）
    LOOP_WS: tl.constexpr = WS and STAGE == 1            # warp specialization：Triton 3.6 上没变快
    SCALED: tl.constexpr = HAS_ALIBI or HAS_BIAS or HAS_SOFTCAP     # _logits 已经乘过 qk_scale
    start, stop = _stage_bounds(lo, fs, fe, hi, STAGE)
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=LOOP_WS):
        cols = start_n + offs_n
        if USE_DESC:
            k = k_desc.load([kv_row0 + start_n, kv_col0])
        else:
            k = _load_rows(k_base + cols[:, None] * stride_kn + offs_d[None, :], cols, len_k, offs_d,
                           HEAD_DIM, BLOCK_D, MASKED)                                # K_j [BLOCK_N, D]
        s, _ = _logits(q, k, rows, cols, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
                       MASKED, WIN_L, WIN_R, HAS_ALIBI, HAS_BIAS, HAS_SOFTCAP, PREC)    # [BLOCK_M, BLOCK_N]
        if SCALED:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)                        # s 还没乘 qk_scale
        # 整行到目前都是 −inf 时 m_new = −inf：用 0 代替，避免 (−inf) − (−inf) = NaN。不带掩码的块也要：可见的分数
        # 可能溢出成 −inf（之后的块里还有有限的分数，这一行的答案仍是有限的）。每行一次比较，[BLOCK_M] 个元素。
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        if SCALED:
            p = tl.exp2(s - m_use[:, None])
        else:
            p = tl.exp2(s * qk_scale - m_use[:, None])                              # 一次 FMA + exp2
        alpha = tl.exp2(m_i - m_use)                                                 # 旧累加器的缩放
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            keep = _keep_mask(seed, rng_base, rows, cols, max_k, dropout_p)
            p = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
        if USE_DESC:
            v = v_desc.load([kv_row0 + start_n, kv_col0])
        else:
            v = _load_rows(v_base + cols[:, None] * stride_kn + offs_d[None, :], cols, len_k, offs_d,
                           HEAD_DIM, BLOCK_D, MASKED)                                # V_j [BLOCK_N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, BIAS, SLOPES, CU_Q, CU_K,
                sm_scale, seed, dropout_p, softcap,
                stride_qn, stride_qh,                  # Q、O：[total_q, Hq, d]（_fwd 保证两者步长相同）
                stride_kn, stride_kh,                  # K、V：[total_k, Hk, d]（同上）
                stride_lh,                             # LSE：[Hq, total_q]
                stride_bb, stride_bh, stride_bm, stride_bn, stride_sb, stride_sh,   # bias [B, H, Nq, Nk]、ALiBi [B, H]
                n_heads_q, group, max_q, max_k, tune_n, total_k,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr = False,
                HAS_SOFTCAP: tl.constexpr = False):
    # 有掩码时越靠后的 Q 块越重：倒着发（先发重的），负载更均衡
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads_q
    h = pid_bh % n_heads_q
    hk = h // group                                        # GQA：这个 query 头读第 hk 个 K/V 头
    q0, len_q, k0, len_k = _seq_bounds(CU_Q, CU_K, b)
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:                                   # varlen：这段序列没这么长
        return
    rows = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + q0.to(tl.int64) * stride_qn + h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :]
    q = _load_rows(q_ptrs, rows, len_q, offs_d, HEAD_DIM, BLOCK_D, True)        # Q_i [BLOCK_M, D]，读一次
    k_base = K + k0.to(tl.int64) * stride_kn + hk * stride_kh
    v_base = V + k0.to(tl.int64) * stride_kn + hk * stride_kh
    if TMA:   # K、V 看成二维 [total_k, Hk·d]：第 hk 个头是列 [hk·d, (hk+1)·d)（要求 d = BLOCK_D、头在行内连续）
        k_desc = tl.make_tensor_descriptor(K, shape=[total_k, (n_heads_q // group) * HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(V, shape=[total_k, (n_heads_q // group) * HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
    else:
        k_desc = K
        v_desc = V
    qk_scale = sm_scale * _LOG2E
    slope2, bias_base, rng_base = _head_setup(SLOPES, BIAS, b, h, n_heads_q, max_q, max_k,
                                              stride_sb, stride_sh, stride_bb, stride_bh, HAS_ALIBI)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    last_row = tl.minimum(m_start + BLOCK_M, len_q) - 1
    lo, fs, fe, hi = _tile_range(m_start, last_row, len_q, len_k, BLOCK_N, WIN_L, WIN_R)
    for stage in tl.static_range(3):                       # 带掩码 / 不带掩码 / 带掩码（stage 是编译期常量）
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, lo, fs, fe, hi,
                                   rows, offs_n, offs_d, len_q, len_k, qk_scale, softcap, slope2, bias_base,
                                   stride_bm, stride_bn, seed, rng_base, max_k, dropout_p, k_desc, v_desc, k0,
                                   hk * HEAD_DIM, stage, HEAD_DIM, BLOCK_D, BLOCK_N, WIN_L, WIN_R, HAS_ALIBI,
                                   HAS_BIAS, HAS_DROPOUT, PREC, TMA, WS, HAS_SOFTCAP)
    # 最后除一次 l（FA2）；没有合法 key 的行 l = 0 → 输出 0，LSE = −inf
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    if not HAS_BIAS:   # 有 bias 时 −inf 是用户给的掩码（合法）：照旧 O = 0、LSE = −inf；没有 bias 时见下
        # 这一行有没有合法 key 只由 len_q、len_k、窗口决定（不读任何东西）：
        # key j 合法 ⇔ j ∈ [pos − WIN_L, pos + WIN_R] ∩ [0, len_k)
        pos = rows + (len_k - len_q)
        first = pos * 0
        last = first + len_k - 1
        if WIN_L >= 0:
            first = tl.maximum(pos - WIN_L, 0)
        if WIN_R >= 0:
            last = tl.minimum(pos + WIN_R, len_k - 1)
        # 有合法 key 却 l = 0：可见的分数全都溢出成了 −inf。写 NaN（不冒充"没有 key"）；反向经 LSE 把 NaN 传给 dQ
        overflow = empty & (first <= last) & (rows < len_q)
        out = tl.where(overflow[:, None], float("nan"), out)
        lse = tl.where(overflow, float("nan"), lse)
    o_ptrs = O + q0.to(tl.int64) * stride_qn + h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(rows < len_q)[:, None] & (offs_d < HEAD_DIM)[None, :])
    tl.store(LSE + h * stride_lh + q0 + rows, lse, mask=rows < len_q)


# ---------------------------------------------------------------------------- 反向
@triton.jit
def _delta_kernel(O, DO, LSE, DELTA, LSE2, stride_qn, stride_qh, stride_lh, total_q,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """D_i = Σ dO_i∘O_i（O、dO 是 Q 的布局：一组步长）。LSE 换成 log2 单位，空行（−inf）换成 +inf，
    这样反向 exp2(s − LSE2) 在空行上是 0 而不是 NaN。"""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < total_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    offs = h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :]
    o = tl.load(O + offs, mask=mask, other=0.0)
    do = tl.load(DO + offs, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    lse = tl.load(LSE + h * stride_lh + rows, mask=rows < total_q, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E)
    tl.store(DELTA + h * stride_lh + rows, delta, mask=rows < total_q)
    tl.store(LSE2 + h * stride_lh + rows, lse2, mask=rows < total_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, stride_qn, lse_base, delta_base,
                lo, fs, fe, hi, cols, offs_m, offs_d, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm,
                stride_bn, seed, rng_base, max_k, dropout_p,
                STAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """
    flash_bwd 的内层循环（对固定的 K_j、V_j 走第 STAGE 段的 Q 块 i）：dV_j += Pᵀ dO_i，dK_j += dSᵀ Q_i。
    ATOMIC_DQ：顺便把 dS_ij K_j 原子加进 fp32 的 dQ 累加器（FA2 的做法，每对块 5 次矩阵乘）；
    别的 program（别的 key 块）也在加同一行，加的先后每次不同，所以 dQ 不逐位可复现。
    """
    MASKED: tl.constexpr = STAGE != 1
    start, stop = _stage_bounds(lo, fs, fe, hi, STAGE)
    for start_m in range(start, stop, BLOCK_M):
        rows = start_m + offs_m
        q = _load_rows(q_base + rows[:, None] * stride_qn + offs_d[None, :], rows, len_q, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED)                                     # Q_i [BLOCK_M, D]
        do = _load_rows(do_base + rows[:, None] * stride_qn + offs_d[None, :], rows, len_q, offs_d,
                        HEAD_DIM, BLOCK_D, MASKED)                                    # dO_i [BLOCK_M, D]
        if MASKED:
            lse2 = tl.load(lse_base + rows, mask=rows < len_q, other=float("inf"))
            delta = tl.load(delta_base + rows, mask=rows < len_q, other=0.0)
        else:
            lse2 = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        s, t = _logits(q, k, rows, cols, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
                       MASKED, WIN_L, WIN_R, HAS_ALIBI, HAS_BIAS, HAS_SOFTCAP, PREC)  # [BLOCK_M, BLOCK_N]
        p = _probs(s, lse2, qk_scale, HAS_ALIBI or HAS_BIAS or HAS_SOFTCAP)          # 重算 P = exp(S − L)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)                            # dP = dO Vᵀ
        if HAS_DROPOUT:
            keep = _keep_mask(seed, rng_base, rows, cols, max_k, dropout_p)
            p_drop = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        else:
            p_drop = p
        dv += tl.dot(tl.trans(p_drop.to(do.dtype)), do, input_precision=PREC)
        ds = p * (dp - delta[:, None])                                                # dS = P∘(dP − D)
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)                       # 对截之前的 x 求导：d(c·tanh(x/c))/dx = 1 − t²
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
        if ATOMIC_DQ:                      # dQ_i += dS K_j（scale 在最后换 dtype 时乘）
            dq = tl.dot(ds.to(k.dtype), k, input_precision=PREC)                      # [BLOCK_M, D]，fp32
            dq_ptrs = dq_base + rows[:, None] * stride_qn + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=(rows < len_q)[:, None] & (offs_d < HEAD_DIM)[None, :], sem="relaxed")
            elif BLOCK_D != HEAD_DIM:
                tl.atomic_add(dq_ptrs, dq, mask=(offs_d < HEAD_DIM)[None, :], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, DK, DV, DQ, LSE2, DELTA, BIAS, SLOPES, CU_Q, CU_K,
                 sm_scale, seed, dropout_p, softcap,
                 stride_qn, stride_qh,                 # Q、dO、DQ：[total_q, Hq, d]（_bwd 保证步长相同）
                 stride_kn, stride_kh,                 # K、V、dK、dV：[total_k, Hk, d]（同上）
                 stride_lh,                            # LSE2、DELTA：[Hq, total_q]
                 stride_bb, stride_bh, stride_bm, stride_bn, stride_sb, stride_sh,
                 n_heads_k, group, max_q, max_k, tune_n,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr = False):
    """
    K/V 不动（stationary）：program_id(0) = key 块 j，program_id(1) = batch × K/V 头。
    ATOMIC_DQ：DQ 是 fp32 的累加器（调用前清零），dQ 也在这里算（原子加）；否则 DQ 不用，dQ 由 _dq_kernel 算。
    """
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads_k
    hk = pid_bh % n_heads_k
    q0, len_q, k0, len_k = _seq_bounds(CU_Q, CU_K, b)
    n_start = pid_n * BLOCK_N
    if n_start >= len_k:
        return
    cols = n_start + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_offs = k0.to(tl.int64) * stride_kn + hk * stride_kh + cols[:, None] * stride_kn + offs_d[None, :]
    k = _load_rows(K + kv_offs, cols, len_k, offs_d, HEAD_DIM, BLOCK_D, True)        # K_j [BLOCK_N, D]
    v = _load_rows(V + kv_offs, cols, len_k, offs_d, HEAD_DIM, BLOCK_D, True)        # V_j [BLOCK_N, D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * _LOG2E
    last_col = tl.minimum(n_start + BLOCK_N, len_k) - 1
    # 哪些 Q 行块看得见 key 列 [n_start, last_col]：同一个 _tile_range，交换 q/k 长度和左右窗口
    lo, fs, fe, hi = _tile_range(n_start, last_col, len_k, len_q, BLOCK_M, WIN_R, WIN_L)
    if n_start + BLOCK_N > len_k:    # 最后一个不完整的 key 块：全部走带掩码的循环
        fs = hi
        fe = hi
    for g in range(0, group):        # GQA：同组的 query 头依次累加进同一个 dK、dV（不需要原子加）
        h = hk * group + g
        slope2, bias_base, rng_base = _head_setup(SLOPES, BIAS, b, h, n_heads_k * group, max_q, max_k,
                                                  stride_sb, stride_sh, stride_bb, stride_bh, HAS_ALIBI)
        q_offs = q0.to(tl.int64) * stride_qn + h * stride_qh
        q_base, do_base, dq_base = Q + q_offs, DO + q_offs, DQ + q_offs
        lse_base = LSE2 + h * stride_lh + q0
        delta_base = DELTA + h * stride_lh + q0
        for stage in tl.static_range(3):
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, stride_qn, lse_base, delta_base,
                                 lo, fs, fe, hi, cols, offs_m, offs_d, len_q, len_k, qk_scale,
                                 softcap, slope2, bias_base, stride_bm, stride_bn, seed, rng_base, max_k, dropout_p,
                                 stage, HEAD_DIM, BLOCK_D, BLOCK_M, WIN_L, WIN_R, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT,
                                 PREC, ATOMIC_DQ, HAS_SOFTCAP)
    dk = dk * sm_scale                # S = scale·QKᵀ ⇒ dK = scale·dSᵀQ
    mask = (cols < len_k)[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(DK + kv_offs, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + kv_offs, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, lo, fs, fe, hi,
              rows, offs_n, offs_d, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
              seed, rng_base, max_k, dropout_p,
              STAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
              WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """对固定的 Q_i 走第 STAGE 段的 key 块 j：dQ_i += dS_ij K_j。"""
    MASKED: tl.constexpr = STAGE != 1
    start, stop = _stage_bounds(lo, fs, fe, hi, STAGE)
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_base + cols[:, None] * stride_kn + offs_d[None, :], cols, len_k, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED)
        v = _load_rows(v_base + cols[:, None] * stride_kn + offs_d[None, :], cols, len_k, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED)
        s, t = _logits(q, k, rows, cols, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm, stride_bn,
                       MASKED, WIN_L, WIN_R, HAS_ALIBI, HAS_BIAS, HAS_SOFTCAP, PREC)
        p = _probs(s, lse2, qk_scale, HAS_ALIBI or HAS_BIAS or HAS_SOFTCAP)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        if HAS_DROPOUT:
            keep = _keep_mask(seed, rng_base, rows, cols, max_k, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, DO, DQ, LSE2, DELTA, BIAS, SLOPES, CU_Q, CU_K,
               sm_scale, seed, dropout_p, softcap,
               stride_qn, stride_qh,                   # Q、dO、dQ：[total_q, Hq, d]（_bwd 保证步长相同）
               stride_kn, stride_kh,                   # K、V：[total_k, Hk, d]（同上）
               stride_lh,                              # LSE2、DELTA：[Hq, total_q]
               stride_bb, stride_bh, stride_bm, stride_bn, stride_sb, stride_sh,
               n_heads_q, group, max_q, max_k, tune_n,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               WIN_L: tl.constexpr, WIN_R: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
               HAS_DROPOUT: tl.constexpr, PREC: tl.constexpr, HAS_SOFTCAP: tl.constexpr = False):
    """Q 不动：program_id(0) = Q 块 i（倒序），program_id(1) = batch × query 头；结构和前向一样。"""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads_q
    h = pid_bh % n_heads_q
    hk = h // group
    q0, len_q, k0, len_k = _seq_bounds(CU_Q, CU_K, b)
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:
        return
    rows = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_offs = q0.to(tl.int64) * stride_qn + h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :]
    q = _load_rows(Q + q_offs, rows, len_q, offs_d, HEAD_DIM, BLOCK_D, True)         # Q_i [BLOCK_M, D]
    do = _load_rows(DO + q_offs, rows, len_q, offs_d, HEAD_DIM, BLOCK_D, True)       # dO_i [BLOCK_M, D]
    lse2 = tl.load(LSE2 + h * stride_lh + q0 + rows, mask=rows < len_q, other=float("inf"))
    delta = tl.load(DELTA + h * stride_lh + q0 + rows, mask=rows < len_q, other=0.0)
    k_base = K + k0.to(tl.int64) * stride_kn + hk * stride_kh
    v_base = V + k0.to(tl.int64) * stride_kn + hk * stride_kh
    qk_scale = sm_scale * _LOG2E
    slope2, bias_base, rng_base = _head_setup(SLOPES, BIAS, b, h, n_heads_q, max_q, max_k,
                                              stride_sb, stride_sh, stride_bb, stride_bh, HAS_ALIBI)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    last_row = tl.minimum(m_start + BLOCK_M, len_q) - 1
    lo, fs, fe, hi = _tile_range(m_start, last_row, len_q, len_k, BLOCK_N, WIN_L, WIN_R)
    for stage in tl.static_range(3):
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, lo, fs, fe, hi,
                       rows, offs_n, offs_d, len_q, len_k, qk_scale, softcap, slope2, bias_base, stride_bm,
                       stride_bn, seed, rng_base, max_k, dropout_p, stage, HEAD_DIM, BLOCK_D, BLOCK_N,
                       WIN_L, WIN_R, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, PREC, HAS_SOFTCAP)
    dq = dq * sm_scale
    tl.store(DQ + q_offs, dq.to(DQ.dtype.element_ty), mask=(rows < len_q)[:, None] & (offs_d < HEAD_DIM)[None, :])


@triton.jit
def _dropout_mask_kernel(OUT, seed, dropout_p, n_heads_q, max_q, max_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """只给测试用：把第 (b, h) 的 [max_q, max_k] 保留掩码写出来（和内核里用的计数器完全一样）。"""
    pid_bh = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _keep_mask(seed, pid_bh.to(tl.int64) * max_q * max_k, rows, cols, max_k, dropout_p)
    ptrs = OUT + pid_bh.to(tl.int64) * max_q * max_k + rows[:, None] * max_k + cols[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(rows < max_q)[:, None] & (cols < max_k)[None, :])


# ============================================================================
# 分块大小：GPU 上自动调优（只对常用的无附加特性路径），其余用固定配置
# ============================================================================
def _cfg(bm, bn, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


# 每个配置在租用的 GPU 上都要编译一次：列表保持很短
# 前向的四个配置来自 bench/results/triton_explore.json（H200 上 7 个配置 × 有无 TMA 的实测）
FWD_CONFIGS = [_cfg(128, 64, 4, 3), _cfg(128, 64, 8, 3), _cfg(128, 128, 8, 3), _cfg(64, 64, 4, 3)]
# dK/dV：BLOCK_M = 32 行的 Q 块只能配 num_stages = 1（_dkdv_config_safe）。(32, 64, 4, 3)、(32, 128, 4, 2) 在 H200 上
# 给出错的、每次不同的 dK（causal、Nq ≠ Nk 时最大误差是 PyTorch 的 10–260 倍；同样的块配 1 级流水线就对）。
# check_configs() 在 GPU 上逐个检查这里的每一项
DKDV_CONFIGS = [_cfg(64, 128, 8, 2), _cfg(64, 64, 4, 2), _cfg(64, 64, 4, 3), _cfg(32, 64, 4, 1)]
DQ_CONFIGS = [_cfg(128, 64, 8, 2), _cfg(128, 32, 4, 2), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 3)]
# 带原子 dQ 的 dK/dV 内核（Launch(bwd="atomic")）：每个 Q 块多一个 [BLOCK_M, d] 的 fp32 dQ 块，寄存器更紧，所以没有
# (32, 128) 这种长 key 块配 4 warp 的组合；没有在 GPU 上挑选过（实测比 split 慢）
DKDV_ATOMIC_CONFIGS = [_cfg(64, 128, 8, 2), _cfg(64, 64, 4, 2), _cfg(128, 64, 8, 2), _cfg(32, 64, 4, 1)]
TUNE_CONFIGS = {"fwd": FWD_CONFIGS, "dkdv": DKDV_CONFIGS, "dkdv_atomic": DKDV_ATOMIC_CONFIGS, "dq": DQ_CONFIGS}


_TUNE_KEY = ["tune_n", "HEAD_DIM", "WIN_L", "WIN_R"]


def _dkdv_config_safe(block_m, block_n, warps, stages):
    """
    dK/dV 内核的这个配置在 Hopper 上算得对吗：BLOCK_M < 64 时 S = Q Kᵀ 这类 M = BLOCK_M 的矩阵乘只能用 mma.sync，
    dK += dSᵀ Q 却是 wgmma（A 在寄存器里）；num_stages > 1 时 Triton 3.6–3.9 的流水线让这些 wgmma 跨过循环的回边还在读
    共享内存里的 Q，而下一轮的 cp.async 已经往同一格写下一个 Q 块（缓冲区只有 num_stages − 1 格）。
    """
    return block_m >= 64 or stages == 1


def _prune_dkdv(configs, named_args, **kwargs):
    """调优列表的守门：不安全的配置（_dkdv_config_safe）永远不试（列表本身也不许有，测试查）。"""
    return [c for c in configs if _dkdv_config_safe(*config_tuple(c))]


def _prune_fwd(configs, named_args, **kwargs):
    """d = 128 时 4 个 warp 的配置在 H200 上慢很多（explore：279 对 490 TFLOP/s），不必每次都量。"""
    d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    keep = [c for c in configs if c.num_warps == 8] if d >= 128 else configs
    return keep or configs


def _tuned(kernel, configs, extra_key=(), prune=None, reset_to_zero=None):
    extra = {"prune_configs_by": {"early_config_prune": prune}} if prune else {}
    # reset_to_zero：原子累加的输出在每次试跑之前清零（否则几个配置的试跑会叠加进同一个 dQ）
    return triton.autotune(configs=configs, key=_TUNE_KEY + list(extra_key), reset_to_zero=reset_to_zero,
                           **extra)(kernel)


def _fixed_config(kind, block_d, dtype):
    """不调优时用的配置 (BLOCK_M, BLOCK_N, warps, stages)（解释器用很小的块，好让几十行的序列也跨好几个块）。"""
    kind = kind.removesuffix("_atomic")         # 带原子 dQ 的 dK/dV 内核用 dK/dV 的固定配置
    if INTERPRET:
        return {"fwd": (16, 32, 4, 1), "dkdv": (32, 16, 4, 1), "dq": (16, 32, 4, 1)}[kind]
    big = block_d > 128 or dtype == torch.float32
    if kind == "fwd":
        return (64, 64, 4, 2) if big else (128, 64, 8, 3)      # 不调优路径（alibi、bias、dropout、窗口）
    if kind == "dkdv":
        return (32, 64, 4, 1) if big else (64, 64, 4, 2)        # BLOCK_M = 32 只配 1 级流水线（见 DKDV_CONFIGS）
    return (64, 32, 4, 2) if big else (64, 64, 4, 2)


# "dkdv" 和 "dkdv_atomic" 是同一个内核（ATOMIC_DQ = False / True），各有自己的配置表和 autotune 缓存
_KERNELS = {"fwd": _fwd_kernel, "dkdv": _dkdv_kernel, "dkdv_atomic": _dkdv_kernel, "dq": _dq_kernel}


def _tuned_kernels():
    """GPU 上调优用的 Autotuner（解释器里不用；测试里单独建一份，换掉计时函数来检查清零）。"""
    return {"fwd": _tuned(_fwd_kernel, TUNE_CONFIGS["fwd"], ["TMA"], _prune_fwd),
            "dkdv": _tuned(_dkdv_kernel, TUNE_CONFIGS["dkdv"], prune=_prune_dkdv),
            "dkdv_atomic": _tuned(_dkdv_kernel, TUNE_CONFIGS["dkdv_atomic"], prune=_prune_dkdv, reset_to_zero=["DQ"]),
            "dq": _tuned(_dq_kernel, TUNE_CONFIGS["dq"])}


def config_tuple(cfg):
    """triton.Config → Launch.blocks 用的 (BLOCK_M, BLOCK_N, warps, stages)。"""
    if not isinstance(cfg, triton.Config):
        raise TypeError(f"config_tuple：cfg 必须是 triton.Config（如 FWD_CONFIGS 的一项），收到 {type(cfg).__name__}")
    return (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)


def reachable_configs(kind):
    """kind 的内核可能用上的全部配置：autotune 列表里的每一项 + 两种固定配置（d > 128 或 fp32 / 其余），不重复。"""
    check_choice("kind", kind, tuple(TUNE_CONFIGS), where="reachable_configs")
    seen = [config_tuple(c) for c in TUNE_CONFIGS[kind]]
    for block_d, dtype in ((256, torch.float16), (64, torch.float16)):
        fixed = _fixed_config(kind, block_d, dtype)
        if fixed not in seen:
            seen.append(fixed)
    return seen


_TUNED = {} if INTERPRET else _tuned_kernels()


_BLOCK_KINDS = ("fwd", "dkdv", "dkdv_atomic", "dq")


def _pow2(x):
    return x > 0 and x & (x - 1) == 0


def _check_block_config(name, cfg, where):
    """一个 (BLOCK_M, BLOCK_N, warps, stages)：块是 16…256 的 2 的幂（tl.arange、tl.dot 要），warps 是 1…32 的
    2 的幂，stages ≥ 1。"""
    ok = isinstance(cfg, (tuple, list)) and len(cfg) == 4 and all(type(x) is int for x in cfg)
    ok = ok and all(_pow2(b) and 16 <= b <= 256 for b in cfg[:2]) and _pow2(cfg[2]) and cfg[2] <= 32
    if not (ok and 1 <= cfg[3] <= 8):
        raise ValueError(f"{where}：{name} 必须是 (BLOCK_M, BLOCK_N, warps, stages)：块是 16…256 的 2 的幂、warps 是 "
                         f"1…32 的 2 的幂、stages 在 1…8 之间的整数，收到 {cfg!r}")
    return tuple(cfg)


def _check_blocks(name, blocks, where):
    """Launch.blocks：None 或 {内核: (BLOCK_M, BLOCK_N, warps, stages)}，内核只能是 _BLOCK_KINDS 之一。"""
    if blocks is None:
        return
    if not isinstance(blocks, dict):
        raise TypeError(f"{where}：{name} 必须是 None 或 {{内核: (BLOCK_M, BLOCK_N, warps, stages)}} 的 dict，"
                        f"收到 {type(blocks).__name__}")
    for kind, cfg in blocks.items():
        check_choice(f"{name} 的键", kind, _BLOCK_KINDS, where)
        _check_block_config(f"{name}[{kind!r}]", cfg, where)


BWD_PATHS = ("split", "atomic")             # Launch.bwd 的取值：第一个是默认


@dataclasses.dataclass(frozen=True)
class Launch:
    """
    怎样启动内核（检查和基准用；默认值就是正常用法）。作为 flash_attn_func(..., launch=Launch(...)) 传入，
    不改模块里的全局开关，所以同一进程里别的调用不受影响。
      autotune  GPU 上对常用路径（d ≤ 128 的 fp16/bf16、没有附加特性）自动调优；解释器里总是固定配置
      poison    输出和梯度先填 NaN：内核漏写的元素会变成 NaN 被检查抓到
      tma       Hopper：前向的 K、V 用 TMA 张量描述符读（H200 实测更慢，默认关；留着复现对比）
      blocks    {"fwd" / "dkdv" / "dkdv_atomic" / "dq": (BLOCK_M, BLOCK_N, warps, stages)}：覆盖固定配置（测试、
                调优实验用）；"dkdv_atomic" 是 bwd="atomic" 时带原子 dQ 的那个 dK/dV 内核
      bwd       反向的 dQ 怎么算："split"（默认：单独的 dQ 内核，逐位可复现，H200 上实测更快）或 "atomic"
                （FA2：dK/dV 内核里原子加进 fp32 累加器，少 2 次矩阵乘；留着对比和教学）
      gluon     Hopper 上 flash_attn_func 把 gluon_flash 支持、实测更快的调用交给它（gluon_route）；
                False = 总是用本文件的 Triton 内核（检查、基准测"我们的内核"时用）
    """
    autotune: bool = True
    poison: bool = False
    tma: bool = False
    blocks: dict = None
    bwd: str = "split"
    gluon: bool = True

    def __post_init__(self):
        check_choice("bwd", self.bwd, BWD_PATHS, where="Launch")
        for name in ("autotune", "poison", "tma", "gluon"):
            check_bool(name, getattr(self, name), where="Launch")
        _check_blocks("blocks", self.blocks, "Launch")
        for kind in ("dkdv", "dkdv_atomic"):
            cfg = (self.blocks or {}).get(kind)
            if cfg is not None and not _dkdv_config_safe(*cfg):
                raise ValueError(f"Launch：blocks[{kind!r}] = {tuple(cfg)} 会算错 dK：BLOCK_M < 64 的 dK/dV 配置只能用 "
                                 "num_stages = 1（Triton 的流水线给 wgmma 的共享内存操作数少分了一格，"
                                 "见 _dkdv_config_safe）")


DEFAULT_LAUNCH = Launch()


def _launch(kind, n_blocks_of, args, meta, use_tune, dtype, launch, record=None):
    """
    n_blocks_of(block) → 第 0 维的网格大小；use_tune 时由 autotune 选 BLOCK_M/BLOCK_N。
    record = (键, 张量)：启动之后把这次启动记成 _Plan（同样形状的下一次调用走快速路径）。
    """
    grid1 = meta.pop("grid1")
    blk = "BLOCK_N" if kind.startswith("dkdv") else "BLOCK_M"
    # 只对 d ≤ 128 的 fp16/bf16 调优：大 head dim 和 fp32 用固定的小块（大块放不下，也省编译时间）
    if (use_tune and launch.autotune and kind in _TUNED and meta["BLOCK_D"] <= 128 and dtype != torch.float32
            and not (launch.blocks and kind in launch.blocks)):
        _TUNED[kind][lambda m: (n_blocks_of(m[blk]), grid1)](*args, **meta)
        cfg = getattr(_TUNED[kind], "best_config", None) if record is not None else None   # 这一次选中的配置
        kwargs = None if cfg is None else dict(meta, **cfg.all_kwargs())
    else:
        if launch.blocks and kind in launch.blocks:
            bm, bn, warps, stages = launch.blocks[kind]
        else:
            bm, bn, warps, stages = _fixed_config(kind, meta["BLOCK_D"], dtype)
        kwargs = dict(meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        _KERNELS[kind][(n_blocks_of(kwargs[blk]), grid1)](*args, **kwargs)
    if record is not None:
        grid = (n_blocks_of(kwargs[blk]), grid1) if kwargs is not None else None
        _PLANS[record[0]] = kwargs is not None and _Plan.build(_KERNELS[kind], args, kwargs, grid, record[1])


_CU_DENSE = {}


def _cu_dense(batch, n, device):
    """等长 batch 的 cu_seqlens [0, N, 2N, …]：按 (B, N, 设备) 缓存，每次调用不再新建张量、不再启动 arange。"""
    key = (batch, n, device)
    cu = _CU_DENSE.get(key)
    if cu is None:
        cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * n
        if not (cu.is_cuda and torch.cuda.is_current_stream_capturing()):   # 图捕获期间分配的内存不能缓存
            _CU_DENSE[key] = cu
    return cu


# ============================================================================
# 主机端：打包、启动、autograd（输入检查在文件后面）
# ============================================================================
def _new(shape, like, poison, dtype=None):
    dtype = like.dtype if dtype is None else dtype
    if poison:
        return torch.full(shape, float("nan"), device=like.device, dtype=dtype)
    return torch.empty(shape, device=like.device, dtype=dtype)


def _rows_layout(t):
    """[total, H, d] 的连续张量（已经连续时原样返回，不拷贝）。内核对 Q、O、dO、dQ 只收一组步长，对 K、V、dK、dV
    也只收一组（Triton 教程 06-fused-attention 的做法）：输出和梯度是新分配的连续张量，所以输入也得是连续的，
    步长才真的相同。代价：不连续的输入（如 qkvpacked 切出来的 q）多拷一次，O(N·H·d)，相对 O(N²·H·d) 的内核很小。"""
    return t if t.is_contiguous() else t.contiguous()


_ALLOCATOR_SET = False


def _can_use_tma(q, k, v, d, block_d, launch):
    """TMA 的条件：GPU 且算力 ≥ 9.0、fp16/bf16、d 是 2 的幂（不补列）、每个头的 d 个数在行内连续、16 字节对齐。"""
    global _ALLOCATOR_SET
    if INTERPRET or not launch.tma or not q.is_cuda or q.dtype == torch.float32 or d != block_d:
        return False
    if torch.cuda.get_device_capability(q.device)[0] < 9 or not hasattr(tl, "make_tensor_descriptor"):
        return False
    for t in (k, v):
        if t.stride(1) != d or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    if not _ALLOCATOR_SET:   # 设备端创建描述符需要一小块全局内存
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True
    return True


def _prec(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


def _tune_bucket(n):
    return max(64, triton.next_power_of_2(max(int(n), 1)))


def _strides_bias(bias):
    return (0, 0, 0, 0) if bias is None else tuple(bias.stride())


def _fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, win, slopes, bias, dropout_p, seed, launch, softcap, plan_key=None,
         out=None, lse=None):
    """
    q [total_q, Hq, d]，k、v [total_k, Hk, d] → o（同 q），lse [Hq, total_q]（自然对数）。
    q 和 o 的步长必须相同，k 和 v 的也是（内核各只收一组，见 _rows_layout）：调用者保证。
    plan_key 不是 None 时：同一个键的第二次起直接用记下的 _Plan 启动（见 _Plan）。
    out、lse 给了就写进它们（同样的形状、最后一维连续；flash_decode 转过来时写进调用者的 out）。
    """
    total_q, hq, d = q.shape
    o = _new(q.shape, q, launch.poison) if out is None else out
    lse = _new((hq, total_q), q, launch.poison, torch.float32) if lse is None else lse
    if total_q == 0:
        return o, lse
    tensors = (q, k, v, o, lse, cu_q, cu_k)
    plan = _PLANS.get(plan_key) if plan_key is not None else None
    if plan and plan(tensors, q.device.index):
        return o, lse
    hk = k.shape[1]
    batch = cu_q.numel() - 1
    block_d = max(16, triton.next_power_of_2(d))
    sb = _strides_bias(bias)
    ss = (0, 0) if slopes is None else tuple(slopes.stride())
    args = (q, k, v, o, lse, q if bias is None else bias, q if slopes is None else slopes, cu_q, cu_k,
            scale, seed, dropout_p, softcap, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            lse.stride(0), *sb, *ss, hq, hq // hk, max_q, max_k, _tune_bucket(max(max_q, max_k)), k.shape[0])
    meta = dict(HEAD_DIM=d, BLOCK_D=block_d, WIN_L=win[0], WIN_R=win[1], HAS_ALIBI=slopes is not None,
                HAS_BIAS=bias is not None, HAS_DROPOUT=dropout_p > 0, PREC=_prec(q.dtype), grid1=batch * hq,
                HAS_SOFTCAP=softcap > 0)
    meta["TMA"] = _can_use_tma(q, k, v, d, block_d, launch)
    plain = slopes is None and bias is None and dropout_p == 0 and win[0] < 0 and softcap == 0
    record = (plan_key, tensors) if _should_record(plan_key) else None
    _launch("fwd", lambda bm: triton.cdiv(max_q, bm), args, meta, plain, q.dtype, launch, record)
    return o, lse


def _bwd(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, win, slopes, bias, dropout_p, seed, launch, softcap):
    """
    launch.bwd == "split"（默认）：Delta 预处理 + dK/dV 内核 + 单独的 dQ 内核（7 次矩阵乘，没有原子操作，逐位可复现）；
    launch.bwd == "atomic"：Delta + 一个 dK/dV 内核，dQ 原子加进 fp32 累加器（每对块 5 次矩阵乘）。
    """
    total_q, hq, d = q.shape
    hk = k.shape[1]
    batch = cu_q.numel() - 1
    do = _rows_layout(do)        # q、k、v 在入口已是连续的（_rows_layout）：dO、dQ 和 q 同步长，dK、dV 和 k、v 同步长
    dq, dk, dv = (_new(t.shape, t, launch.poison) for t in (q, k, v))
    if total_q == 0 or k.shape[0] == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_d = max(16, triton.next_power_of_2(d))
    delta, lse2 = _new(lse.shape, lse, launch.poison), _new(lse.shape, lse, launch.poison)
    _delta_kernel[(triton.cdiv(total_q, 64), hq)](o, do, lse, delta, lse2, q.stride(0), q.stride(1), lse.stride(0),
                                                  total_q, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=64)
    sb = _strides_bias(bias)
    ss = (0, 0) if slopes is None else tuple(slopes.stride())
    bias_arg = q if bias is None else bias
    slope_arg = q if slopes is None else slopes
    tune_n = _tune_bucket(max(max_q, max_k))
    meta = dict(HEAD_DIM=d, BLOCK_D=block_d, WIN_L=win[0], WIN_R=win[1], HAS_ALIBI=slopes is not None,
                HAS_BIAS=bias is not None, HAS_DROPOUT=dropout_p > 0, PREC=_prec(q.dtype), HAS_SOFTCAP=softcap > 0)
    plain = slopes is None and bias is None and dropout_p == 0 and win[0] < 0 and softcap == 0
    atomic = launch.bwd == "atomic"
    # 原子路径的 dQ 先在 fp32 里累加（每个元素由多个 key 块的 program 加上去），最后乘 scale、换成输入的 dtype
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if atomic else None
    dq_arg = dq_acc if atomic else q                               # split 路径不用 DQ：随便给一个指针
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), lse.stride(0), *sb, *ss)
    args = (q, k, v, do, dk, dv, dq_arg, lse2, delta, bias_arg, slope_arg, cu_q, cu_k, scale, seed, dropout_p, softcap,
            *strides, hk, hq // hk, max_q, max_k, tune_n)
    kind = "dkdv_atomic" if atomic else "dkdv"
    _launch(kind, lambda bn: triton.cdiv(max_k, bn), args, dict(meta, grid1=batch * hk, ATOMIC_DQ=atomic),
            plain, q.dtype, launch)
    if atomic:
        torch.mul(dq_acc, scale, out=dq)                         # S = scale·QKᵀ ⇒ dQ = scale·dS K（一次读写）
        return dq, dk, dv
    args = (q, k, v, do, dq, lse2, delta, bias_arg, slope_arg, cu_q, cu_k, scale, seed, dropout_p, softcap,
            *strides, hq, hq // hk, max_q, max_k, tune_n)
    _launch("dq", lambda bm: triton.cdiv(max_q, bm), args, dict(meta, grid1=batch * hq), plain, q.dtype, launch)
    return dq, dk, dv


class _FlashAttn(torch.autograd.Function):
    """autograd 包装：前向存 q、k、v、o、lse（都是 O(N) 的），反向重算 P。"""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, scale, win, slopes, bias, dropout_p, seed, launch, softcap):
        o, lse = _fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, win, slopes, bias, dropout_p, seed, launch, softcap)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.extra = (max_q, max_k, scale, win, slopes, bias, dropout_p, seed, launch, softcap)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _bwd(do, q, k, v, o, lse, cu_q, cu_k, *ctx.extra)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


def _window(causal, window_size):
    left, right = window_size
    if causal:
        right = 0                 # causal = 右侧窗口为 0（和 flash-attn 一样；左侧窗口照常生效）
    return (left, right)


def _draw_seed(seed, dropout_p):
    if dropout_p == 0:
        return 0
    if seed is None:                  # 从 torch 的默认随机数发生器抽一个：torch.manual_seed 可复现
        return int(torch.randint(0, 2**31 - 1, (1,)).item())
    return seed


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, bias=None, alibi_slopes=None,
                    window_size=(-1, -1), return_lse=False, seed=None, return_encoded_softmax=False,
                    enable_profiling=False, launch=None, deterministic=False, softcap=0.0):
    """
    q [B, Nq, Hq, d]，k、v [B, Nk, Hk, d] → out [B, Nq, Hq, d]（return_lse 时再返回 lse [B, Hq, Nq]，自然对数）。
    causal / window_size=(left, right) 按右下角对齐（见 v2 的约定）；dropout 的掩码由 seed 决定，反向重新生成。
    deterministic（flash-attn 的名字）：True = 梯度必须逐位可复现；False 只是"允许"不可复现。默认的反向（split：
    dK/dV 和 dQ 分两个内核，没有原子操作）本来就逐位可复现，所以两者结果相同；Launch(bwd="atomic")（dQ 原子加）
    和 deterministic=True 一起传报 ValueError。
    softcap = c > 0（Gemma-2 [S92] 的 logit soft-capping，flash-attn 的定义）：logit x = q kᵀ·scale 换成 c·tanh(x/c)，
    然后才加 ALiBi / bias、做掩码。为什么：tanh 把 q kᵀ 这一项关在 (−c, c) 里，q、k 再大 logit 也有界，训练更稳
    （Gemma-2 的注意力层用 c = 50）；反向乘上 1 − tanh²(x/c)。softcap = 0（默认）= 不截，走原来的内核。
    return_encoded_softmax、enable_profiling 只为兼容原版的调用方式；launch 见 Launch（检查和基准用）。
    分数溢出（q、k 有限，可见的 q kᵀ·scale 在 fp32 里成了 +∞ 或 NaN，或者一行里可见的分数全都成了 −∞）时内核不同步
    主机就没法报错：受影响的 query 行的 out、lse 及其梯度写成 NaN，别的行照常（主机上的参考实现报 ValueError）；
    溢出成 −∞ 的分数旁边还有有限分数时，它的权重是 0，这正是精确答案。传了 bias 时 −∞ 是合法的掩码：一行全被
    bias 掩掉（或全溢出成 −∞）照旧给 out = 0、lse = −∞。
    """
    raw_key = _dense_key(q, k, v, dropout_p, softmax_scale, causal, bias, alibi_slopes, window_size, return_lse, seed,
                         return_encoded_softmax, enable_profiling, launch, deterministic, softcap)
    fast = _PLANS.get(raw_key) if raw_key is not None else None
    if fast and not _launch_hooks_active():      # 这组参数检查过、这组形状启动过：直接启动（_DenseFast）
        return fast(q, k, v)
    opts = _check_dense(q, k, v, dropout_p, softmax_scale, causal, bias, alibi_slopes, window_size, return_lse,
                        seed, return_encoded_softmax, enable_profiling, launch, deterministic, softcap)
    batch, nq, hq, d = q.shape
    nk = k.shape[1]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    gluon = gluon_route(q, k, v, opts, grad)
    if gluon is not None:             # Hopper 上更快的 FA3 式内核（gluon_flash.py），结果的形状、约定相同
        return gluon.attention(q, k, v, causal=opts.window == (-1, 0), softmax_scale=opts.scale,
                               return_lse=opts.return_lse)
    # 等长的 batch 看成 varlen：[B, N, H, d] → [B·N, H, d]（连续张量只是换个视图；不连续的拷一次，见 _rows_layout）
    qp = _rows_layout(q).view(batch * nq, hq, d)
    kp = _rows_layout(k).view(batch * nk, k.shape[2], d)
    vp = _rows_layout(v).view(batch * nk, k.shape[2], d)
    cu_q, cu_k = _cu_dense(batch, nq, q.device), _cu_dense(batch, nk, q.device)
    args = (qp, kp, vp, cu_q, cu_k, nq, nk, opts.scale, opts.window, opts.slopes, opts.bias, opts.dropout_p,
            opts.seed, opts.launch, opts.softcap)
    if grad:
        o, lse = _FlashAttn.apply(*args)
    else:                             # 不求梯度（推理、解码）：不经过 autograd；常用路径按形状记下启动参数
        plan_key = _plan_key(qp, kp, vp, opts, batch, nq, nk)
        o, lse = _fwd(*args, plan_key=plan_key)
        plan = _PLANS.get(plan_key) if plan_key is not None else None
        if plan and raw_key is not None and len(_PLANS) < 2 * _MAX_PLANS \
                and all(a.data_ptr() == b.data_ptr() for a, b in ((q, qp), (k, kp), (v, vp))) \
                and not torch.cuda.is_current_stream_capturing():     # 图捕获期间的 cu_seqlens 属于图：不记
            _PLANS[raw_key] = _DenseFast(plan, cu_q, cu_k, (batch, nq, hq, d), opts.return_lse)
    out = o.view(batch, nq, hq, d)
    if opts.return_lse:
        return out, lse.view(hq, batch, nq).transpose(0, 1)     # [B, Hq, Nq]
    return out


# gluon_route 的门槛：每个 (序列, 头) 至少 GLUON_MIN_N 行，总的打分元素 B·Hq·N² 至少 GLUON_MIN_WORK。
# bench/triton_bench.py 量过的 24 个形状（N = 1k…16k，d = 64 / 128，bf16，triton_bench.json）上 gluon 的前向、反向
# 最多慢 1%（最差是 causal、d = 64、N = 1k 的反向；tests/test_lecture11_configs.py 由 JSON 现算），别处都更快；
# N < 1k 没有量过。总量的门槛：2²⁷ 个打分 × 4d FLOP 在 ~400 TFLOP/s 上是几十 µs（d = 64、causal）到几百 µs，
# 让 gluon 每次调用多出的主机开销（建 TMA 描述符、Triton 的正常启动；还没有在 GPU 上单独量过）摊得开
GLUON_MIN_N = 1024
GLUON_MIN_WORK = 1 << 27
_GLUON = []                   # [gluon_flash 模块或 None]：第一次问的时候 import 一次


def _gluon_module():
    if not _GLUON:
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        try:
            import gluon_flash
            _GLUON.append(gluon_flash if gluon_flash.GLUON_ERROR is None else None)
        except Exception:             # noqa: BLE001 —— 没有 Gluon 的 Triton：总是走本文件的内核
            _GLUON.append(None)
    return _GLUON[0]


def gluon_route(q, k, v, opts, grad):
    """
    这次 flash_attn_func 调用交给 gluon_flash.attention 吗？返回那个模块或 None。条件：Hopper（sm_90）上、launch.gluon、
    gluon_flash 支持这个调用（bf16 / fp16、d ∈ {64, 128}、Nq = Nk、只有 causal 或不加掩码、没有 dropout / ALiBi / bias /
    softcap、q、k、v 连续）、形状够大（GLUON_MIN_N、GLUON_MIN_WORK）；求梯度且 deterministic=True 时不交（gluon 的 dQ
    用 TMA 归约相加，不逐位可复现；dK、dV 是）。
    """
    grad = _flag("grad", grad, "gluon_route")
    if INTERPRET or not opts.launch.gluon or not q.is_cuda or q.dtype == torch.float32:
        return None
    batch, nq, hq, d = q.shape
    nk = k.shape[1]
    if (d not in (64, 128) or nq != nk or nq < GLUON_MIN_N or batch * hq * nq * nk < GLUON_MIN_WORK
            or opts.window not in ((-1, -1), (-1, 0)) or opts.dropout_p > 0 or opts.slopes is not None
            or opts.bias is not None or opts.softcap != 0.0 or (grad and opts.deterministic)
            or not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
            or not (q.dtype == k.dtype == v.dtype) or torch.cuda.get_device_capability(q.device)[0] != 9):
        return None
    return _gluon_module()


def _dense_key(q, k, v, dropout_p, softmax_scale, causal, bias, alibi_slopes, window_size, return_lse, seed,
               return_encoded_softmax, enable_profiling, launch, deterministic, softcap=0.0):
    """
    flash_attn_func 最快的路径的键：直接由调用者给的原始参数组成（不检查、不 reshape），只给 GPU 上、不求梯度、
    没有 bias / ALiBi / dropout、默认 Launch 的调用。每个标量参数连同它的类型进键（True 和 1 不算同一个）；
    不可哈希（如 list 的 window_size）、不是张量等情况返回 None，走正常路径（由 _check_dense 检查、报错）。
    """
    try:
        if (INTERPRET or bias is not None or alibi_slopes is not None or dropout_p != 0
                or return_encoded_softmax is not False or not (launch is None or launch is DEFAULT_LAUNCH)
                or not q.is_cuda or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                  or v.requires_grad))):
            return None
        if type(window_size) is not tuple:
            return None
        scalars = (dropout_p, softmax_scale, causal, return_lse, seed, enable_profiling, deterministic, softcap,
                   *window_size)
        types = tuple(map(type, scalars))
        if types not in _PLAIN_TYPES:                 # 第一次见到这组类型：逐个看（之后只查集合）
            if not all(t in _PLAIN for t in types):
                return None                           # numpy 标量、0 维张量、list……：交给正常路径
            _PLAIN_TYPES.add(types)
        key = ("dense", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.get_device(), k.get_device(), v.get_device(), q.data_ptr() % 16, k.data_ptr() % 16,
               v.data_ptr() % 16, scalars, types)
        hash(key)
        return key
    except (AttributeError, TypeError, ValueError, RuntimeError):   # RuntimeError：多元素张量的 dropout_p != 0
        return None


_PLAIN = (bool, int, float, type(None))
_PLAIN_TYPES = set()           # 检查过、全是 _PLAIN 的类型元组（最多 4¹⁰ 种，实际只有几种）


class _DenseFast:
    """flash_attn_func 的最快路径：一个 _Plan 加上这组形状的 cu_seqlens 和输出形状。q、k、v 直接传给内核
    （记录时已确认 reshape 成 [B·N, H, d] 只是换视图：数据指针相同，步长在键里）。o 直接按 [B, N, H, d] 分配
    （连续：和内核看到的 [B·N, H, d] 是同一块内存）。不要 lse 时内核照样写 lse，写进每块 GPU 共用的一块草稿区
    （_lse_scratch）：每次调用少分配一次；没人读它，几个 stream 同时写也无妨。"""
    __slots__ = ("plan", "cu_q", "cu_k", "shape", "return_lse", "lse_scratch", "cu_ptrs")

    def __init__(self, plan, cu_q, cu_k, shape, return_lse):
        self.plan, self.cu_q, self.cu_k, self.shape, self.return_lse = plan, cu_q, cu_k, shape, return_lse
        batch, nq, hq, _ = shape
        self.lse_scratch = None if return_lse else _lse_scratch(cu_q.device, hq * batch * nq)
        self.cu_ptrs = (cu_q.data_ptr(), cu_k.data_ptr())        # 缓存的张量（self 留着它们）：地址不变

    def __call__(self, q, k, v):
        o = q.new_empty(self.shape)
        stream = _current_stream(q.get_device())
        head = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        if self.lse_scratch is not None:
            self.plan.launch_ptrs((*head, self.lse_scratch.data_ptr(), *self.cu_ptrs), stream)
            return o
        batch, nq, hq, _ = self.shape
        lse = q.new_empty((hq, batch * nq), dtype=torch.float32)
        self.plan.launch_ptrs((*head, lse.data_ptr(), *self.cu_ptrs), stream)
        if self.return_lse:
            return o, lse.view(hq, batch, nq).transpose(0, 1)
        return o


_LSE_SCRATCH = {}
_LSE_RETIRED = []             # 被更大的一块换下来的草稿区：永远留着（别的 stream 上的内核可能还在写它）
LSE_SCRATCH_MAX = 1 << 20     # 草稿区最多 1M 个 fp32（4 MB）；更大的 lse 每次照常分配（那时内核本身远比分配慢）


def _lse_scratch(device, numel):
    """device 上共用的 fp32 草稿区，至少 numel 个；numel > LSE_SCRATCH_MAX 时返回 None。不够时按两倍长大，换下来
    的那块不释放（_PLANS 清空时它可能已经没有 _DenseFast 引用，而另一个 stream 上的内核还在写——释放了就会被
    分配器交给别人），所以每块 GPU 总共最多约 2 × LSE_SCRATCH_MAX。"""
    if numel > LSE_SCRATCH_MAX:
        return None
    buf = _LSE_SCRATCH.get(device)
    if buf is None or buf.numel() < numel:
        if buf is not None:
            _LSE_RETIRED.append(buf)
        size = max(numel, 2 * (0 if buf is None else buf.numel()), 4096)
        buf = torch.empty(min(size, LSE_SCRATCH_MAX), device=device, dtype=torch.float32)
        _LSE_SCRATCH[device] = buf
    return buf


def _plan_key(qp, kp, vp, opts, batch, max_q, max_k):
    """
    快速路径的键（只给 GPU 上、没有 ALiBi / bias / dropout、默认 Launch 的调用）；不适用时返回 None。
    打包后的形状 [B·N, H, d] 分不出 B = 1、N = 2048 和 B = 2、N = 1024：网格和内核的 max_q、max_k 参数却不同，
    所以 batch、max_q、max_k 也进键。
    """
    if INTERPRET or not qp.is_cuda or opts.launch is not DEFAULT_LAUNCH or opts.slopes is not None \
            or opts.bias is not None or opts.dropout_p != 0:
        return None
    return (qp.shape, qp.stride(), kp.shape, kp.stride(), vp.stride(), qp.dtype, qp.device, opts.window, opts.scale,
            opts.softcap, batch, max_q, max_k, qp.data_ptr() % 16, kp.data_ptr() % 16, vp.data_ptr() % 16)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, alibi_slopes=None, window_size=(-1, -1),
                           return_lse=False, seed=None, return_encoded_softmax=False, enable_profiling=False,
                           launch=None, deterministic=False, softcap=0.0):
    """
    变长序列打包在一起：q [total_q, Hq, d]，k、v [total_k, Hk, d]；第 b 段是 cu_seqlens[b] : cu_seqlens[b + 1]。
    返回 out [total_q, Hq, d]（return_lse 时再返回 lse [Hq, total_q]）。bias 不支持（它是每段 N×N 的输入）。
    deterministic、softcap 同 flash_attn_func。
    """
    _check_max_seqlens(q, k, max_seqlen_q, max_seqlen_k)
    opts = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                         causal, alibi_slopes, window_size, return_lse, seed, return_encoded_softmax,
                         enable_profiling, launch, deterministic, softcap)
    q, k, v = (_rows_layout(t) for t in (q, k, v))
    o, lse = _FlashAttn.apply(q, k, v, opts.cu_q, opts.cu_k, opts.max_q, opts.max_k, opts.scale, opts.window,
                              opts.slopes, None, opts.dropout_p, opts.seed, opts.launch, opts.softcap)
    return (o, lse) if opts.return_lse else o


def dropout_mask(seed, dropout_p, batch, n_heads_q, max_q, max_k, device):
    """
    只给测试 / 教学用（会分配 N×N）：返回内核对 (b, h, i, j) 用的保留掩码 [B, Hq, max_q, max_k]（bool）。
    varlen 时 i、j 是段内下标，max_q、max_k 是传给 flash_attn_varlen_func 的 max_seqlen。
    """
    seed, dropout_p, device = _check_dropout_mask(seed, dropout_p, batch, n_heads_q, max_q, max_k, device)
    if batch * n_heads_q * max_q * max_k == 0:
        return torch.zeros((batch, n_heads_q, max_q, max_k), device=device, dtype=torch.bool)
    out = torch.empty((batch, n_heads_q, max_q, max_k), device=device, dtype=torch.int8)
    grid = (triton.cdiv(max_q, 32), triton.cdiv(max_k, 32), batch * n_heads_q)
    _dropout_mask_kernel[grid](out, seed, float(dropout_p), n_heads_q, max_q, max_k, BLOCK_M=32, BLOCK_N=32)
    return out.bool()


# ============================================================================
# 参考实现（纯 torch，会分配 N×N：只用来检查）
# ============================================================================
def allowed_mask(nq, nk, causal=False, window_size=(-1, -1), device="cpu"):
    """[Nq, Nk] 的 bool：query i（位置 Nk − Nq + i）能不能看 key j。右下角对齐。"""
    causal, window_size, device = _check_allowed(nq, nk, causal, window_size, device)
    left, right = _window(causal, window_size)
    pos = torch.arange(nq, device=device)[:, None] + (nk - nq)
    j = torch.arange(nk, device=device)[None, :]
    ok = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= pos - left
    if right >= 0:
        ok &= j <= pos + right
    return ok


def reference_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), alibi_slopes=None,
                        bias=None, dropout_p=0.0, keep=None, dtype=torch.float64, softcap=0.0):
    """
    q [B, Nq, Hq, d]，k、v [B, Nk, Hk, d]，在 dtype 里算（float64 = 参考；q.dtype = "PyTorch 自己的低精度注意力"）。
    keep：[B, Hq, Nq, Nk] 的 dropout 保留掩码（dropout_mask() 给出）。softcap > 0：logit 先换成 c·tanh(logit/c)，
    再加 ALiBi / bias、做掩码（flash-attn 的顺序）。返回 (out [B, Nq, Hq, d], lse [B, Hq, Nq])。
    """
    causal, scale, window_size, dropout_p, softcap = _check_reference(
        q, k, v, causal, softmax_scale, window_size, alibi_slopes, bias, dropout_p, keep, dtype, softcap)
    batch, nq, hq, d = q.shape
    nk, hk = k.shape[1], k.shape[2]
    qh = q.to(dtype).transpose(1, 2)                                        # [B, Hq, Nq, d]
    kh = k.to(dtype).transpose(1, 2).repeat_interleave(hq // hk, dim=1)      # [B, Hq, Nk, d]
    vh = v.to(dtype).transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    s = (qh @ kh.transpose(-1, -2)) * scale                                 # [B, Hq, Nq, Nk]
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        pos = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        dist = (pos - torch.arange(nk, device=q.device)[None, :]).abs().to(dtype)
        slopes = alibi_slopes.to(dtype).reshape(-1, hq)[:, :, None, None]   # [B 或 1, Hq, 1, 1]
        s = s - slopes * dist
    if bias is not None:
        s = s + bias.to(dtype)
    ok = allowed_mask(nq, nk, causal, window_size, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                            # 全被掩码的行：0
    if keep is not None:
        p = p * keep.to(dtype) / (1.0 - dropout_p)
    out = (p @ vh).transpose(1, 2)                                          # [B, Nq, Hq, d]
    return out, lse


def _reference_varlen(q, k, v, cu_q, cu_k, **kw):
    """逐段调用 reference_attention（kw 里的 keep 是 [B, Hq, max_q, max_k]，按段切）。"""
    keep = kw.pop("keep", None)
    outs, lses = [], []
    for b in range(cu_q.numel() - 1):
        a, e = int(cu_q[b]), int(cu_q[b + 1])
        c, f = int(cu_k[b]), int(cu_k[b + 1])
        kb = None if keep is None else keep[b:b + 1, :, :e - a, :f - c]
        o, lse = reference_attention(q[None, a:e], k[None, c:f], v[None, c:f], keep=kb, **kw)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _alibi_slopes_for(n_heads):
    """ALiBi 论文的斜率：2^(−8/H), 2^(−16/H), …（H 是 2 的幂时；这里只用来造测试输入）。"""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / n_heads) for i in range(n_heads)], dtype=torch.float32)


# ============================================================================
# 检查用例：CPU 解释器（小尺寸、fp32）与 GPU（真实尺寸、bf16/fp16）共用一套描述
# ============================================================================
def make_case(name, batch, nq, nk, hq, hk, d, dtype, device, gen, causal=False, window=(-1, -1), alibi=False,
              bias=False, dropout_p=0.0, varlen_q=None, varlen_k=None, softcap=0.0, q_gain=1.0):
    """造一组新的随机输入（由 gen 决定）；varlen_q/varlen_k 给出每段长度时走 varlen 接口。
    q_gain：q 乘上这个数（logit 跟着变大，softcap 才真的截得到；取 2 的幂，低精度里也是精确的）。"""
    _check_make_case(name, batch, nq, nk, hq, hk, d, dtype, device, gen, causal, window, alibi, bias, dropout_p,
                     varlen_q, varlen_k, softcap, q_gain)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    case = dict(name=name, causal=causal, window=window, dropout_p=dropout_p, varlen=varlen_q is not None,
                softcap=softcap)
    if varlen_q is not None:
        tq, tk = sum(varlen_q), sum(varlen_k)
        case.update(q=rnd(tq, hq, d) * q_gain, k=rnd(tk, hk, d), v=rnd(tk, hk, d), do=rnd(tq, hq, d),
                    cu_q=torch.tensor([0, *itertools.accumulate(varlen_q)], dtype=torch.int32, device=device),
                    cu_k=torch.tensor([0, *itertools.accumulate(varlen_k)], dtype=torch.int32, device=device),
                    max_q=max(varlen_q), max_k=max(varlen_k), batch=len(varlen_q))
    else:
        case.update(q=rnd(batch, nq, hq, d) * q_gain, k=rnd(batch, nk, hk, d), v=rnd(batch, nk, hk, d),
                    do=rnd(batch, nq, hq, d), batch=batch, max_q=nq, max_k=nk)
    case["slopes"] = _alibi_slopes_for(hq).to(device) if alibi else None
    case["bias"] = rnd(1, hq, nq, nk) if bias else None
    case["seed"] = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    return case


KERNELS = ("minimal", "full")
SELFTEST_KERNELS = ("all", *KERNELS, "configs", "determinism", "decode")


def run_ours(case, kernel="full", launch=None):
    """
    跑我们的内核（v1 "minimal" 或 v2 "full"，前向 + 反向），返回 (out, lse, dq, dk, dv)，都是 float64。
    v2 的反向路径由 launch.bwd 选（默认 split，Launch(bwd="atomic") 是原子 dQ）；v1 的反向总是两个内核。
    """
    _check_case_dict(case, "run_ours")
    q, k, v = (case[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v"))
    if check_choice("kernel", kernel, KERNELS, where="run_ours") == "minimal":
        if case["softcap"]:
            raise ValueError(f"run_ours：v1（minimal）没有 softcap，用例 {case['name']!r} 的 softcap = "
                             f"{case['softcap']}")
        out, lse = mini_attention(q, k, v, causal=case["causal"])
    else:
        kw = dict(causal=case["causal"], window_size=case["window"], dropout_p=case["dropout_p"],
                  alibi_slopes=case["slopes"], return_lse=True, seed=case["seed"], launch=launch,
                  softcap=case["softcap"])
        if case["varlen"]:
            out, lse = flash_attn_varlen_func(q, k, v, case["cu_q"], case["cu_k"], case["max_q"], case["max_k"], **kw)
        else:
            out, lse = flash_attn_func(q, k, v, bias=case["bias"], **kw)
    out.backward(case["do"])
    return tuple(t.double() for t in (out.detach(), lse, q.grad, k.grad, v.grad))


def run_reference(case, dtype=torch.float64):
    """同样的输入，用 reference_attention 在 dtype 里算（dropout 用内核同一张掩码）。"""
    _check_case_dict(case, "run_reference")
    _check_float_dtype("dtype", dtype, "run_reference")
    keep = None
    hq = case["q"].shape[-2]
    if case["dropout_p"] > 0:
        keep = dropout_mask(case["seed"], case["dropout_p"], case["batch"], hq, case["max_q"], case["max_k"],
                            case["q"].device)
    q, k, v = (case[n].detach().to(dtype).requires_grad_(True) for n in ("q", "k", "v"))
    kw = dict(causal=case["causal"], window_size=case["window"], alibi_slopes=case["slopes"],
              dropout_p=case["dropout_p"], keep=keep, dtype=dtype, softcap=case["softcap"])
    if case["varlen"]:
        out, lse = _reference_varlen(q, k, v, case["cu_q"], case["cu_k"], **kw)
    else:
        out, lse = reference_attention(q, k, v, bias=case["bias"], **kw)
    out.backward(case["do"].to(dtype))
    return tuple(t.detach().double() for t in (out, lse, q.grad, k.grad, v.grad))


def _rel_err(x, ref):
    """‖x − ref‖ / ‖ref‖（NaN 直接算作无穷大，不会被悄悄放过）。"""
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def _max_abs(x, ref):
    """max|x − ref|（NaN、±inf 算作无穷大）；两边都是 −inf 的位置（LSE 的"没有可见 key"）不算。"""
    both_inf = torch.isneginf(x) & torch.isneginf(ref)
    if bool((torch.isneginf(x) != torch.isneginf(ref)).any()) or not bool(torch.isfinite(x[~both_inf]).all()):
        return float("inf")
    return float((x[~both_inf] - ref[~both_inf]).abs().max()) if bool((~both_inf).any()) else 0.0


_lse_err = _max_abs      # LSE 一直按最大绝对误差比（bench/triton_bench.py、gluon_flash 用这个名字）


FIELDS = ("out", "lse", "dq", "dk", "dv")


def field_errors(ours, ref):
    """run_ours / run_reference 的两组结果 → {字段: 误差}：LSE 用最大绝对误差，其余用相对误差（NaN 算作无穷大）。"""
    _check_fields(ours, ref)
    return {f: (_lse_err(a, b) if f == "lse" else _rel_err(a, b)) for f, a, b in zip(FIELDS, ours, ref)}


def torch_bound(torch_err):
    """flash-attn 的 GPU 判据的上限：2 × PyTorch 自己在同一低精度里算的误差（+1e-6：两边都是 0 时也算过）。"""
    torch_err = check_real("torch_err", torch_err, lo=0.0, allow_inf=True, where="torch_bound")
    return 2 * torch_err + 1e-6


def within_torch_bound(field, err, torch_errs):
    """
    我们这一项和 float64 参考的误差 ≤ torch_bound(PyTorch 低精度的误差)。field 可以带后缀（"dq:atomic" 和 dq 比
    同一个 torch 误差）。返回 (是否过, torch 的误差)。
    """
    t = _check_within(field, err, torch_errs)
    return err <= torch_bound(t), t


def both_backward_errors(case, kernel, ref, launch=None):
    """
    v2 的两条反向路径都查：默认路径（split）的 out、LSE、dQ、dK、dV，再加 Launch(bwd="atomic") 路径的
    "dq:atomic"、"dk:atomic"、"dv:atomic"（前向两条路径相同，不重复列）。v1 只有前五项。
    """
    launch = launch or DEFAULT_LAUNCH
    if kernel == "full":                           # 不带后缀的那几项一定是 split（调用者的 launch 可能是 atomic）
        launch = dataclasses.replace(launch, bwd="split")
    errs = field_errors(run_ours(case, kernel, launch), ref)
    if kernel == "full":
        atomic = field_errors(run_ours(case, kernel, dataclasses.replace(launch, bwd="atomic")), ref)
        errs.update({f"{f}:atomic": atomic[f] for f in ("dq", "dk", "dv")})
    return errs


def cpu_cases(gen, kernel="full"):
    """解释器用例：fp32、奇数长度。v2：Nq<Nk 与 Nq>Nk、GQA 1/2/4、d = 16/40/64/80 及各特性；v1：它支持的形状。"""
    check_choice("kernel", kernel, KERNELS, where="cpu_cases")
    _check_gen(gen, "cpu_cases")
    f32, cpu = torch.float32, "cpu"
    if kernel == "minimal":
        return [
            make_case("v1 plain d=64", batch=2, nq=37, nk=37, hq=2, hk=2, d=64, dtype=f32, device=cpu, gen=gen),
            make_case("v1 causal d=16", batch=1, nq=45, nk=45, hq=3, hk=3, d=16, dtype=f32, device=cpu, gen=gen,
                      causal=True),
            make_case("v1 causal d=32 N=5", batch=2, nq=5, nk=5, hq=1, hk=1, d=32, dtype=f32, device=cpu, gen=gen,
                      causal=True),
        ]
    return [
        make_case("plain d=64", 2, 37, 37, 2, 2, 64, f32, cpu, gen),
        make_case("causal Nq<Nk GQA4 d=16", 1, 23, 71, 4, 1, 16, f32, cpu, gen, causal=True),
        make_case("causal Nq>Nk GQA2 d=40", 1, 61, 29, 4, 2, 40, f32, cpu, gen, causal=True),
        make_case("window(9,5) d=80", 1, 45, 53, 2, 1, 80, f32, cpu, gen, window=(9, 5)),
        make_case("causal+window(7) GQA2 d=40", 1, 50, 50, 2, 1, 40, f32, cpu, gen, causal=True, window=(7, -1)),
        make_case("alibi causal d=64", 2, 33, 47, 2, 2, 64, f32, cpu, gen, causal=True, alibi=True),
        make_case("softcap 5 causal Nq<Nk GQA2 d=40", 1, 23, 41, 4, 2, 40, f32, cpu, gen, causal=True, softcap=5.0,
                  q_gain=4.0),
        make_case("softcap 3 alibi window(9,5) d=24", 2, 30, 26, 2, 1, 24, f32, cpu, gen, window=(9, 5), alibi=True,
                  softcap=3.0, q_gain=4.0),
        make_case("bias d=16", 2, 19, 26, 2, 1, 16, f32, cpu, gen, bias=True),
        make_case("dropout 0.3 causal GQA2", 1, 40, 40, 2, 1, 16, f32, cpu, gen, causal=True, dropout_p=0.3),
        make_case("varlen causal (0,1,37,9) GQA2", 0, 0, 0, 2, 1, 40, f32, cpu, gen, causal=True,
                  varlen_q=[0, 1, 37, 9], varlen_k=[5, 1, 40, 0]),
    ]


def _gpu_cases(gen, dtype, kernel="full"):
    """GPU 用例：真实尺寸、奇数长度，bf16/fp16。"""
    dev = "cuda"
    if kernel == "minimal":
        return [
            make_case("v1 plain d=128", 2, 1531, 1531, 16, 16, 128, dtype, dev, gen),
            make_case("v1 causal d=64", 2, 2049, 2049, 16, 16, 64, dtype, dev, gen, causal=True),
            make_case("v1 causal d=16", 1, 777, 777, 4, 4, 16, dtype, dev, gen, causal=True),
            make_case("v1 plain d=32", 3, 1000, 1000, 8, 8, 32, dtype, dev, gen),
        ]
    return [
        make_case("plain d=128", 2, 1531, 1531, 16, 16, 128, dtype, dev, gen),
        make_case("causal Nq<Nk GQA4 d=64", 2, 1000, 1777, 16, 4, 64, dtype, dev, gen, causal=True),
        make_case("causal Nq>Nk MQA d=80", 2, 1777, 1000, 8, 1, 80, dtype, dev, gen, causal=True),
        make_case("window(256,64) GQA4 d=40", 2, 2049, 2049, 8, 2, 40, dtype, dev, gen, window=(256, 64)),
        make_case("alibi causal d=96", 2, 1203, 1203, 8, 8, 96, dtype, dev, gen, causal=True, alibi=True),
        make_case("softcap 30 causal GQA2 d=128", 2, 1411, 1411, 16, 8, 128, dtype, dev, gen, causal=True,
                  softcap=30.0, q_gain=16.0),
        make_case("softcap 20 alibi causal d=64", 2, 1000, 1333, 8, 8, 64, dtype, dev, gen, causal=True, alibi=True,
                  softcap=20.0, q_gain=8.0),
        make_case("plain d=192", 1, 1111, 1333, 8, 8, 192, dtype, dev, gen),
        make_case("causal d=256 GQA2", 1, 1500, 1500, 8, 4, 256, dtype, dev, gen, causal=True),
        make_case("bias d=16", 2, 700, 900, 4, 4, 16, dtype, dev, gen, bias=True),
        make_case("dropout 0.2 causal d=64", 2, 1024, 1024, 8, 2, 64, dtype, dev, gen, causal=True, dropout_p=0.2),
        make_case("varlen causal GQA2 d=128", 0, 0, 0, 16, 8, 128, dtype, dev, gen, causal=True,
                  varlen_q=[0, 1, 777, 2048, 1500], varlen_k=[3, 1, 900, 2048, 1500]),
    ]


CPU_TOL = 1e-5     # 解释器上 fp32 对 float64 参考的误差上限（实测 ≤ 1e-6；tests/test_lecture11_triton.py 用同一个）


def _pick_seed(seed, where=""):
    """检查函数的种子（course_utils.check_seed 的约定：≥ 0 的整数或 np.random.Generator；None → 由时间取一个）
    → 一个整数（打印出来，失败时用 --seed 复现；Generator 给的是从它抽出的那个数）。"""
    if seed is None:
        return int(time.time() * 1000) % 2**31
    rng = check_seed("seed", seed, where)
    if isinstance(seed, numbers.Integral):
        return int(check_int("seed", seed, lo=0, hi=2**63 - 1, where=where))    # torch.manual_seed 的上限
    return int(rng.integers(0, 2**31 - 1))


def check_cpu(kernel="full", seed=None, verbose=True):
    """解释器检查：和 float64 参考逐项比较（fp32 输入，误差 < CPU_TOL）。先打印全部误差再断言。"""
    kernel = check_choice("kernel", kernel, KERNELS, where="check_cpu")
    verbose = check_bool("verbose", verbose, "check_cpu")
    seed = _pick_seed(seed, "check_cpu")
    print(f"  [{kernel}] 种子 {seed}（复现：python3 lecture11/triton_flash.py --kernel {kernel} --seed {seed}）")
    gen = torch.Generator().manual_seed(seed)
    worst, failed = 0.0, []
    for case in cpu_cases(gen, kernel):
        errs = both_backward_errors(case, kernel, run_reference(case))
        bad = {f: e for f, e in errs.items() if not e < CPU_TOL}
        if verbose or bad:
            print(f"  {case['name']:<32s} " + "  ".join(f"{f} {e:.1e}" for f, e in errs.items())
                  + ("  ✗" if bad else ""))
        failed += [(case["name"], bad)] if bad else []
        worst = max(worst, *errs.values())
    assert not failed, f"误差超过 {CPU_TOL:.0e}（种子 {seed}）：{failed}"
    return worst


def check_gpu(kernel="full", dtypes=(torch.bfloat16, torch.float16), seed=None, poison=True, autotune=False,
              verbose=True, only=None):
    """
    GPU 检查（flash-attn 的判据）：对每个输出，‖ours − ref64‖/‖ref64‖ ≤ 2 × ‖torch低精度 − ref64‖/‖ref64‖，
    "torch 低精度" = 同样的输入用纯 torch 在 bf16/fp16 里算。v2 的两条反向路径（split、原子 dQ）都查。
    poison：v2 的输出先填 NaN；autotune=False：固定配置，每个用例少编译几个版本（调优路径由
    bench/triton_bench.py 对照 SDPA 检查）。only：只跑名字里含这个子串的用例。先打印再断言。
    """
    kernel = check_choice("kernel", kernel, KERNELS, where="check_gpu")
    launch = Launch(autotune=check_bool("autotune", autotune), poison=check_bool("poison", poison), gluon=False)
    dtypes, verbose = _check_dtypes(dtypes, "check_gpu"), check_bool("verbose", verbose, "check_gpu")
    if only is not None and not isinstance(only, str):
        raise TypeError(f"check_gpu：only 必须是 None 或用例名字里的一段文字（str），收到 {type(only).__name__}")
    seed = _pick_seed(seed, "check_gpu")
    _require_cuda("check_gpu")
    print(f"  [{kernel}] 种子 {seed}（复现：python3 lecture11/triton_flash.py --kernel {kernel} --seed {seed}）")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for case in _gpu_cases(gen, dtype, kernel):
            if only is not None and only not in case["name"]:
                continue
            ref = run_reference(case)
            errs = both_backward_errors(case, kernel, ref, launch)          # v2：split 和原子 dQ 两条反向
            torch_errs = field_errors(run_reference(case, dtype=dtype), ref)
            for f, e in errs.items():
                ok, t = within_torch_bound(f, e, torch_errs)
                rows.append((str(dtype).replace("torch.", ""), case["name"], f, e, t, ok))
            del ref
            torch.cuda.empty_cache()
    failed = [r for r in rows if not r[-1]]
    if verbose or failed:
        print(f"  {'dtype':<9s}{'case':<30s}{'field':<10s}{'ours':>10s}{'torch':>10s}  ok")
        for dt, name, f, e, t, ok in (rows if verbose else failed):
            print(f"  {dt:<9s}{name:<30s}{f:<10s}{e:>10.2e}{t:>10.2e}  {'✓' if ok else '✗'}")
    assert not failed, f"GPU 检查失败（种子 {seed}）：{failed}"
    return rows


# ---------------------------------------------------------------------------- 每个可能选中的配置
# autotune 可能选中列表里的任何一项：只查默认选中的那个等于没查（dK 的错配置就是这样漏过去的）。check_configs 把
# 每个内核的每个配置（reachable_configs：调优列表 + 固定配置）用 Launch(blocks=...) 强制启动一遍，在 flash-attn 那些
# 别扭的长度上（Nq ≠ Nk 两个方向、1、3、97、113、127、203、799、1023、1025）对照 float64 参考：
#   最大绝对误差 ≤ 2 × PyTorch 低精度的最大绝对误差（梯度 3 ×，flash-attn 测试的判据）+ atol，
#   相对误差 ≤ 2 × PyTorch 的相对误差 + atol（一个范数看不出几行错，一个最大值看不出整体偏），
#   输出和梯度先填 NaN（漏写的元素是 NaN），同一个输入跑两遍逐位相同（原子 dQ 除外）。
CONFIG_FACTORS = {"out": 2, "lse": 2, "dq": 3, "dk": 3, "dv": 3}


def _config_cases(gen, device="cuda"):
    """check_configs 的用例（make_case）：d ≤ 128 的 fp16/bf16 用调优配置，d = 256 和 fp32 用固定配置。"""
    f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32
    return [
        make_case("causal 127x512 d=128", 2, 127, 512, 4, 4, 128, f16, device, gen, causal=True),
        make_case("causal 799x113 GQA2 d=64", 2, 799, 113, 6, 3, 64, b16, device, gen, causal=True),
        make_case("plain 1025x97 d=64", 2, 1025, 97, 4, 4, 64, f16, device, gen),
        make_case("varlen causal GQA2 d=128", 0, 0, 0, 4, 2, 128, b16, device, gen, causal=True,
                  varlen_q=[113, 1, 1023, 3], varlen_k=[203, 3, 1025, 97]),
        make_case("causal 97x203 d=256", 1, 97, 203, 2, 2, 256, f16, device, gen, causal=True),
        make_case("causal 203x97 fp32 d=64", 1, 203, 97, 2, 2, 64, f32, device, gen, causal=True),
    ]


def _config_applies(kind, cfg, case):
    """这个配置在这个用例上会不会真的被用到：调优配置只管 d ≤ 128 的 fp16/bf16，固定配置按 _fixed_config 的规则。"""
    d, dtype = case["q"].shape[-1], case["q"].dtype
    block_d = max(16, triton.next_power_of_2(d))
    tuned = block_d <= 128 and dtype != torch.float32
    if cfg in [config_tuple(c) for c in TUNE_CONFIGS[kind]] and tuned:
        return True
    return cfg == _fixed_config(kind, block_d, dtype)


def check_configs(seed=None, kinds=None, configs=None, cases=None, run=None, atol=1e-6, verbose=True):
    """
    每个内核（fwd、dkdv、dkdv_atomic、dq）的每个可能被选中的配置都对（见上）。configs = {kind: [配置, …]}
    换掉 reachable_configs，cases 换掉 _config_cases，run(case, launch) 换掉 run_ours
    （测试用它造一个坏配置，证明检查会失败）。
    返回全部 (kind, 配置, 用例, 字段, 最大绝对误差, 上限, 相对误差, 上限, 可复现) 行；有不过的行时 AssertionError，
    消息里列出配置。
    """
    kinds, configs, cases, run, atol, verbose = _check_configs_args(kinds, configs, cases, run, atol, verbose)
    seed = _pick_seed(seed, "check_configs")
    if cases is None:
        _require_cuda("check_configs")
    print(f"  [configs] 种子 {seed}（复现：python3 lecture11/triton_flash.py --kernel configs --seed {seed}）")
    gen = torch.Generator().manual_seed(seed)
    if kinds is None:
        kinds = tuple(TUNE_CONFIGS) if configs is None else tuple(configs)
    cases = _config_cases(gen) if cases is None else cases
    run = run or (lambda case, launch: run_ours(case, "full", launch))
    rows = []
    for case in cases:
        ref = run_reference(case)
        low = run_reference(case, dtype=case["q"].dtype)
        t_abs = {f: _max_abs(a, b) for f, a, b in zip(FIELDS, low, ref)}
        t_rel = field_errors(low, ref)
        for kind in kinds:
            for cfg in (configs or {}).get(kind, reachable_configs(kind)):
                if configs is None and not _config_applies(kind, cfg, case):
                    continue
                launch = Launch(autotune=False, poison=True, blocks={kind: tuple(cfg)}, gluon=False,
                                bwd="atomic" if kind == "dkdv_atomic" else "split")
                first, again = run(case, launch), run(case, launch)
                rel = field_errors(first, ref)
                for f, a, b, r in zip(FIELDS, first, again, ref):
                    if kind in ("dkdv", "dkdv_atomic", "dq") and f in ("out", "lse"):
                        continue                          # 前向是固定配置：只在 kind = fwd 时记
                    if kind == "fwd" and f in ("dq", "dk", "dv"):
                        continue
                    err = _max_abs(a, r)
                    bound = CONFIG_FACTORS[f] * t_abs[f] + atol
                    rbound = torch_bound(t_rel[f]) + atol
                    same = bool(torch.equal(a, b)) or (kind == "dkdv_atomic" and f == "dq")
                    ok = err <= bound and rel[f] <= rbound and same
                    rows.append((kind, tuple(cfg), case["name"], f, err, bound, rel[f], rbound, same, ok))
        del ref, low
    failed = [r for r in rows if not r[-1]]
    if verbose or failed:
        print(f"  {'kernel':<12s}{'config':<18s}{'case':<28s}{'field':<6s}{'max|err|':>10s}{'bound':>10s}"
              f"{'rel':>10s}{'bound':>10s}  repro ok")
        for kind, cfg, name, f, e, b, r, rb, same, ok in (rows if verbose else failed):
            print(f"  {kind:<12s}{str(cfg):<18s}{name:<28s}{f:<6s}{e:>10.2e}{b:>10.2e}{r:>10.2e}{rb:>10.2e}"
                  f"  {'✓' if same else '✗':<5s}{'✓' if ok else '✗'}")
    bad = sorted({(r[0], r[1]) for r in failed})
    assert not failed, f"这些配置算错了或不可复现（种子 {seed}）：{bad}"
    return rows


# ---------------------------------------------------------------------------- 逐位可复现（flash-attn 的定义）
def _determinism_cases(gen, device="cuda"):
    """(名字, 用例, deterministic)：第一次调用就是调优的那一次；B = 60 的大 batch；gluon 接手的形状。"""
    f16, b16 = torch.float16, torch.bfloat16
    return [
        ("B=60 causal 1024 d=128 deterministic", make_case("d1", 60, 1024, 1024, 4, 4, 128, f16, device, gen,
                                                            causal=True), True),
        ("B=60 causal 1024 d=128 (gluon)", make_case("d2", 60, 1024, 1024, 4, 4, 128, f16, device, gen,
                                                     causal=True), False),
        ("causal 127x513 d=64 deterministic", make_case("d3", 4, 127, 513, 9, 9, 64, b16, device, gen,
                                                        causal=True), True),
        ("causal 3x799 d=128", make_case("d4", 3, 3, 799, 4, 4, 128, f16, device, gen, causal=True), False),
        ("plain 1024x128 d=32 B=60", make_case("d5", 60, 1024, 128, 4, 4, 32, f16, device, gen), False),
        ("varlen causal d=64 deterministic", make_case("d6", 0, 0, 0, 6, 3, 64, b16, device, gen, causal=True,
                                                       varlen_q=[113, 1, 799, 3], varlen_k=[203, 3, 799, 97]), True),
    ]


def _run_public(case, deterministic):
    """公开入口（默认 launch：autotune、gluon 分派照常）前向 + 反向一次 → (out, lse, dq, dk, dv)。"""
    q, k, v = (case[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v"))
    kw = dict(causal=case["causal"], return_lse=True, deterministic=deterministic)
    if case["varlen"]:
        out, lse = flash_attn_varlen_func(q, k, v, case["cu_q"], case["cu_k"], case["max_q"], case["max_k"], **kw)
    else:
        out, lse = flash_attn_func(q, k, v, **kw)
    out.backward(case["do"])
    return out.detach(), lse, q.grad, k.grad, v.grad


def check_determinism(seed=None, calls=4, verbose=True):
    """
    同一个输入调用 calls 次（第一次会 autotune），out、LSE、dQ、dK、dV 必须和第一次逐位相同。例外只有 flash-attn
    也允许的那一个：deterministic=False 时交给 gluon 的调用，dQ 由 TMA 归约相加、先后不定，只要求
    |dQ − dQ₀| ≤ 2 × PyTorch 低精度 dQ 的最大误差（flash-attn 的 race-condition 测试也这样放宽 dQ）。
    """
    calls = check_int("calls", calls, lo=2, hi=100, where="check_determinism")
    verbose = check_bool("verbose", verbose, "check_determinism")
    seed = _pick_seed(seed, "check_determinism")
    _require_cuda("check_determinism")
    print(f"  [determinism] 种子 {seed}（复现：python3 lecture11/triton_flash.py --kernel determinism --seed {seed}）")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for name, case, det in _determinism_cases(gen):
        grad = True
        routed = (not case["varlen"] and gluon_route(case["q"], case["k"], case["v"],
                  _check_dense(case["q"], case["k"], case["v"], 0.0, None, case["causal"], None, None, (-1, -1),
                               True, None, False, False, None, det), grad) is not None)
        first = _run_public(case, det)
        dq_tol = None
        if routed:
            ref = run_reference(case, dtype=torch.float32)
            low = run_reference(case, dtype=case["q"].dtype)
            dq_tol = 2 * _max_abs(low[2].double(), ref[2])
        diffs = {f: 0.0 for f in FIELDS}
        for _ in range(calls - 1):
            for f, a, b in zip(FIELDS, first, _run_public(case, det)):
                diffs[f] = max(diffs[f], 0.0 if torch.equal(a, b) else _max_abs(b.double(), a.double()))
        for f in FIELDS:
            ok = diffs[f] == 0.0 or (f == "dq" and dq_tol is not None and diffs[f] <= dq_tol)
            rows.append((name, "gluon" if routed else "triton", f, diffs[f], ok))
        torch.cuda.empty_cache()
    failed = [r for r in rows if not r[-1]]
    if verbose or failed:
        print(f"  {'case':<40s}{'path':<8s}{'field':<6s}{'max diff':>10s}  ok")
        for name, path, f, dmax, ok in (rows if verbose else failed):
            print(f"  {name:<40s}{path:<8s}{f:<6s}{dmax:>10.2e}  {'✓' if ok else '✗'}")
    assert not failed, f"重复调用的结果不一样（种子 {seed}）：{failed}"
    return rows


def _selftest(kernel="all", seed=None, only=None):
    check_choice("kernel", kernel, SELFTEST_KERNELS)
    kernels = KERNELS if kernel == "all" else tuple(k for k in KERNELS if k == kernel)
    run_decode = kernel in ("all", "decode")
    if torch.cuda.is_available() and not INTERPRET:
        print(f"triton_flash 自检：GPU（{torch.cuda.get_device_name()}，torch {torch.__version__}，"
              f"triton {triton.__version__}），bf16/fp16，真实尺寸")
        if kernel in ("all", "determinism"):          # 先做：这时还没有调优过，第一次调用就是调优的那一次
            t0 = time.time()
            rows = check_determinism(seed=seed, verbose=False)
            print(f"triton_flash 自检通过（GPU，determinism）：{len(rows)} 项重复调用逐位相同"
                  f"（gluon 的 dQ 在 flash-attn 的容差内），{time.time() - t0:.0f} s")
        for name in kernels:
            t0 = time.time()
            rows = check_gpu(name, seed=seed, only=only)
            print(f"triton_flash 自检通过（GPU，{name}）：{len(rows)} 项误差都 ≤ 2 × PyTorch 低精度注意力的误差，"
                  f"{time.time() - t0:.0f} s")
        if kernel in ("all", "configs"):
            t0 = time.time()
            rows = check_configs(seed=seed, verbose=False)
            n_cfg = len({(r[0], r[1]) for r in rows})
            print(f"triton_flash 自检通过（GPU，configs）：{n_cfg} 个（内核, 配置）× 用例共 {len(rows)} 项，"
                  f"最大绝对误差和相对误差都在 flash-attn 的判据内、两次运行逐位相同，{time.time() - t0:.0f} s")
        for dtype in (torch.bfloat16, torch.float16) if run_decode else ():
            worst = _decode_module.check_decode("cuda", dtype, seed=seed)
            print(f"triton_flash 自检通过（GPU，decode，{dtype}）：最大相对误差 {worst:.1e} ≤ 2 × SDPA 的误差")
        return
    if not INTERPRET:
        # 没有 GPU：以解释器模式重新运行自己（TRITON_INTERPRET 必须在定义内核之前设置）
        print("没有 CUDA：以 TRITON_INTERPRET=1 重新运行自检（解释器，小尺寸，fp32）")
        argv = ["--kernel", kernel] + ([] if seed is None else ["--seed", str(seed)])
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), *argv],
                             env=dict(os.environ, TRITON_INTERPRET="1"))
        if rc != 0:
            sys.exit(rc)
        return
    print(f"triton_flash 自检：Triton 解释器（CPU，triton {triton.__version__}），小尺寸 fp32")
    if kernel in ("configs", "determinism"):
        print(f"SKIP: --kernel {kernel} 查的是 GPU 上 autotune 可能选中的配置 / 重复调用，解释器里只有固定配置")
        return
    for name in kernels:
        t0 = time.time()
        worst = check_cpu(name, seed=seed)
        paths = "（反向两条路径：split、原子 dQ）" if name == "full" else ""
        print(f"triton_flash 自检通过（解释器，{name}）：out、LSE、dQ/dK/dV{paths}和 float64 参考的最大误差 "
              f"{worst:.1e} < {CPU_TOL:.0e}（LSE 是最大绝对误差，其余是相对误差），{time.time() - t0:.0f} s")
    if run_decode:
        t0 = time.time()
        worst = _decode_module.check_decode("cpu", torch.float32, seed=seed)
        print(f"triton_flash 自检通过（解释器，decode）：flash_decode 和 float64 参考的最大相对误差 {worst:.1e} "
              f"< {CPU_TOL:.0e}，{time.time() - t0:.0f} s")


# ============================================================================
# 基准共用：bench/triton_bench.py、bench/gluon_sweep.py（--bench / --explore）、ncu_profile.py 的 SDPA 后端
# （形状和 FLOP 算法在 flash_lab.py：attention_flops、BENCH_TOKENS / BENCH_HIDDEN，没有 GPU 也能用）
# ============================================================================
SDPA_BACKENDS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")


def sdpa_fn(backend):
    """PyTorch SDPA 的一个后端（SDPA_BACKENDS 之一）→ run(q, k, v, causal)。q、k、v 和输出都是 flash-attn 的布局
    [B, N, H, d]；SDPA 要 [B, H, N, d]，进出各转置一次（只是视图）。"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = check_choice("backend", backend, SDPA_BACKENDS, where="sdpa_fn")
    chosen = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
              "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    F = torch.nn.functional

    def run(q, k, v, causal):
        with sdpa_kernel([chosen]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal)
        return out.transpose(1, 2)
    return run


# ============================================================================
# 输入检查（放在最后：上面的教学代码每个入口只调用一次 _check_*）
# ============================================================================
def _check_runnable(t, name="q"):
    if t.is_cuda or (INTERPRET and t.device.type == "cpu"):
        return
    if t.device.type != "cpu":
        raise ValueError(f"{name} 在 {t.device} 设备上：Triton 内核只能在 CUDA GPU 上跑（或 CPU 上的解释器）")
    raise RuntimeError(
        "triton_flash：张量在 CPU 上，但 Triton 解释器没有打开。要么把张量放到 GPU 上（.cuda()），"
        "要么在 import 本模块之前设置环境变量 TRITON_INTERPRET=1（例如 `TRITON_INTERPRET=1 python3 ...`）。")


def _check_tensors(where, named):
    """
    注意力输入共同的检查（_check_qkv 和 _check_decode 共用）。named = ((名字, 张量, 允许的维数, 布局说明), …)，
    前两个是 query 和 key：都是张量、维数对、dtype 是 _DTYPES 之一且相同、解释器上不是 bf16、在同一个设备上、
    head dim 相同、Hq 是 Hk 的整数倍。where 不是 None 时错误消息以 "where：" 开头。返回 (Hq, Hk, d)。
    """
    pre = "" if where is None else f"{where}："
    for name, t, dims, layout in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{pre}{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.dim() not in dims:
            raise ValueError(f"{pre}{name} 必须是 {layout}，收到形状 {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{pre}{name}.dtype 必须是 float16、bfloat16 或 float32 之一，收到 {t.dtype}")
    names, tensors = "、".join(n[0] for n in named), [n[1] for n in named]
    q, k = tensors[0], tensors[1]
    if any(t.dtype != q.dtype for t in tensors):
        raise TypeError(f"{pre}{names} 的 dtype 必须相同，收到 {'、'.join(str(t.dtype) for t in tensors)}")
    if INTERPRET and not q.is_cuda and q.dtype == torch.bfloat16:
        # 解释器跑 bf16 不报错，但结果错得离谱（误差 ~1e9）；GPU 上 bf16 是对的
        raise TypeError(f"{pre}Triton 解释器（CPU）上不支持 bfloat16（能跑但结果是错的）：请用 float32 或 float16，"
                        "bf16 请在 GPU 上跑")
    if any(t.device != q.device for t in tensors):
        raise ValueError(f"{pre}{names} 必须在同一个设备上，收到 {'、'.join(str(t.device) for t in tensors)}")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"{pre}{named[0][0]} 和 {named[1][0]} 的 head dim 必须相同，收到 {d} 和 {k.shape[-1]}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"{pre}{named[0][0]} 的头数 Hq（shape[-2]）必须是 {named[1][0]} 的头数 Hk 的整数倍"
                         "（GQA/MQA），"
                         f"收到 Hq={hq}、Hk={hk}")
    return hq, hk, d


def _check_qkv(q, k, v, packed):
    want, layout = (3, "3 维 [total, H, d]") if packed else (4, "4 维 [B, N, H, d]")
    _, _, d = _check_tensors(None, [(name, t, (want,), layout) for name, t in (("q", q), ("k", k), ("v", v))])
    if k.shape != v.shape:
        raise ValueError(f"k 和 v 的形状必须相同，收到 {tuple(k.shape)} 和 {tuple(v.shape)}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q、k、v 的 head dim（最后一维）必须在 1…{MAX_HEAD_DIM} 之间，收到 {d}")
    if not packed and k.shape[0] != q.shape[0]:
        raise ValueError(f"q 和 k 的 batch 维必须相同，收到 {q.shape[0]} 和 {k.shape[0]}")
    _check_runnable(q)


def _scalar(x):
    """0 维实数张量 → Python 数（numpy 标量 course_utils 本来就认）；其他原样交给 check_* 去报错。"""
    if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_complex():
        return x.item()
    return x


def _flag(name, value, where):
    """开关：True / False 直接放行（热路径上省掉一次函数调用），其余交给 check_bool 报错。"""
    return value if value is True or value is False else check_bool(name, value, where)


def _check_scale(softmax_scale, d, where):
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    scale = _scalar(softmax_scale)
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool) and scale == 0:
        raise ValueError(f"{where}：softmax_scale 必须是正的有限数或 None，收到 0（0 不表示默认值：要 1/√d 请传 None）")
    return check_real("softmax_scale", scale, lo=0.0, lo_open=True, where=where, type_error=ValueError)


_FP32_TINY, _FP32_MAX = 2.0 ** -126, 3.4e38      # fp32 最小的正规数、（略小于）最大的有限数


def _check_softcap(softcap, scale, where):
    """softcap：0（不截）或正的有限数。内核用 fp32 算 scale / c 和 c·log2 e：这两个数要是 fp32 的正规数，
    否则 0·inf 会变成 NaN、或者 tanh 的参数全变成 0（只在 c 小于 ~1e-38·scale 或大于 ~1e38 这种没有意义的值时发生）。"""
    if type(softcap) is float and softcap == 0.0:            # 最常见的"不截"：不多调一次 check_real
        return 0.0
    cap = check_real("softcap", _scalar(softcap), lo=0.0, where=where, type_error=ValueError)
    if cap > 0 and not (_FP32_TINY <= cap and _FP32_TINY <= scale / cap <= _FP32_MAX
                        and cap * math.log2(math.e) <= _FP32_MAX):
        raise ValueError(f"{where}：softcap = {cap!r} 超出 fp32 能算的范围：softcap、softmax_scale / softcap 和 "
                         f"softcap·log2 e 都要在 {_FP32_TINY:.1e}…{_FP32_MAX:.1e} 之间（softmax_scale = {scale!r}）")
    return cap


@dataclasses.dataclass
class _Options:
    """_check_dense / _check_varlen 检查、换算好的参数。"""
    scale: float
    window: tuple
    dropout_p: float
    seed: int
    slopes: object
    bias: object
    return_lse: bool
    launch: Launch
    deterministic: bool = False
    softcap: float = 0.0
    cu_q: object = None
    cu_k: object = None
    max_q: int = 0
    max_k: int = 0


def _check_options(where, d, batch, hq, device, dropout_p, softmax_scale, causal, alibi_slopes, window_size,
                   return_lse, seed, return_encoded_softmax, enable_profiling, launch, deterministic=False,
                   softcap=0.0):
    """
    两个入口共用的标量参数检查；返回 _Options（bias、cu_seqlens 由调用者补上）。
    每次调用都要走这里：最常见的写法（Python 的 bool / float / int）先用几个 type 比较放行，
    其余的交给 course_utils 的 check_*（它们负责 numpy 标量、0 维张量的转换和错误消息）。
    """
    if return_encoded_softmax is not False and check_bool("return_encoded_softmax", return_encoded_softmax, where):
        raise NotImplementedError(
            "return_encoded_softmax=True 不支持：它要返回 N×N 的 dropout 后注意力矩阵，本实现不分配 N×N 缓冲区。"
            "测试里要 dropout 掩码请用 dropout_mask(seed, dropout_p, B, Hq, max_q, max_k, device)。")
    _flag("enable_profiling", enable_profiling, where)              # 原版的关键字：接受并忽略
    causal = _flag("causal", causal, where)
    return_lse = _flag("return_lse", return_lse, where)
    if launch is None:
        launch = DEFAULT_LAUNCH
    elif not isinstance(launch, Launch):
        raise TypeError(f"{where}：launch 必须是 triton_flash.Launch 或 None，收到 {type(launch).__name__}")
    deterministic = _flag("deterministic", deterministic, where)
    if deterministic and launch.bwd == "atomic":
        raise ValueError(f"{where}：deterministic=True 和 Launch(bwd='atomic') 不能同时用（原子加的 dQ 不能逐位复现）；"
                         "要可复现的梯度请用默认的 Launch(bwd='split')")
    if type(dropout_p) is float and 0.0 <= dropout_p < 1.0:
        p = dropout_p
    else:
        p = check_real("dropout_p", _scalar(dropout_p), lo=0.0, hi=1.0, hi_open=True, where=where,
                       type_error=ValueError)
    win = _check_window(window_size, where)
    if seed is not None:              # 先检查再看 dropout_p：dropout_p = 0 时坏的 seed 也要报错
        seed = check_int("seed", _scalar(seed), lo=0, hi=2**31 - 1, where=where, type_error=ValueError)
    scale = _check_scale(softmax_scale, d, where)
    return _Options(scale=scale, window=_window(causal, win), dropout_p=p,
                    seed=_draw_seed(seed, p), slopes=_check_slopes(alibi_slopes, batch, hq, device), bias=None,
                    return_lse=return_lse, launch=launch, deterministic=deterministic,
                    softcap=_check_softcap(softcap, scale, where))


def _check_window(window_size, where, name="window_size"):
    """(left, right)：两个 ≥ −1 的整数（−1 = 不限）。最常见的 Python int 元组先放行。"""
    if type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int \
            and type(window_size[1]) is int and min(window_size) >= -1:
        return window_size
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"{where}：{name} 必须是两个 ≥ −1 的整数 (left, right)（−1 表示不限），收到 {window_size!r}")
    return tuple(check_int(f"{name}[{i}]", _scalar(w), lo=-1, where=where, type_error=ValueError)
                 for i, w in enumerate(window_size))


def _check_dense(q, k, v, dropout_p, softmax_scale, causal, bias, alibi_slopes, window_size, return_lse, seed,
                 return_encoded_softmax, enable_profiling, launch, deterministic=False, softcap=0.0):
    _check_qkv(q, k, v, packed=False)
    batch, nq, hq, d = q.shape
    opts = _check_options("flash_attn_func", d, batch, hq, q.device, dropout_p, softmax_scale, causal, alibi_slopes,
                          window_size, return_lse, seed, return_encoded_softmax, enable_profiling, launch,
                          deterministic, softcap)
    opts.bias = _check_bias(bias, q, batch, hq, nq, k.shape[1])
    return opts


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  causal, alibi_slopes, window_size, return_lse, seed, return_encoded_softmax, enable_profiling,
                  launch, deterministic=False, softcap=0.0):
    _check_qkv(q, k, v, packed=True)
    cu_q, max_q = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], "max_seqlen_q", max_seqlen_q, q.device)
    cu_k, max_k = _check_cu("cu_seqlens_k", cu_seqlens_k, k.shape[0], "max_seqlen_k", max_seqlen_k, q.device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"cu_seqlens_q 和 cu_seqlens_k 的长度必须相同（B + 1），收到 {cu_q.numel()} 和 {cu_k.numel()}")
    opts = _check_options("flash_attn_varlen_func", q.shape[-1], cu_q.numel() - 1, q.shape[1], q.device, dropout_p,
                          softmax_scale, causal, alibi_slopes, window_size, return_lse, seed, return_encoded_softmax,
                          enable_profiling, launch, deterministic, softcap)
    opts.cu_q, opts.cu_k, opts.max_q, opts.max_k = cu_q, cu_k, max(max_q, 1), max(max_k, 1)
    return opts


def _check_max_seqlens(q, k, max_seqlen_q, max_seqlen_k):
    """max_seqlen_q / max_seqlen_k 不能超过 q / k 打包后的总行数（只看形状，不读 cu_seqlens，不同步）：
    大得离谱的值会让网格大得离谱（解释器上等于卡死）。q、k 不是三维张量时交给 _check_varlen 去报错。"""
    for name, t, m in (("max_seqlen_q", q, max_seqlen_q), ("max_seqlen_k", k, max_seqlen_k)):
        if isinstance(t, torch.Tensor) and t.dim() == 3:
            check_int(name, _scalar(m), lo=0, hi=t.shape[0], where="flash_attn_varlen_func", type_error=ValueError)


def _check_mini(q, k, v, causal, softmax_scale):
    where = "mini_attention"
    _check_qkv(q, k, v, packed=False)
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"{where}（v1）只支持 q、k、v 形状相同（Nq = Nk，Hq = Hk），收到 {tuple(q.shape)}、"
                         f"{tuple(k.shape)}；其他形状请用 flash_attn_func")
    check_choice("head dim（q.shape[-1]）", q.shape[-1], (16, 32, 64, 128), where)
    check_int("N", q.shape[1], lo=1, where=where, type_error=ValueError)
    return check_bool("causal", causal, where), _check_scale(softmax_scale, q.shape[-1], where)


def _check_slopes(alibi_slopes, batch, hq, device):
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        raise TypeError("alibi_slopes 必须是 float32 的 torch.Tensor，形状 [Hq] 或 [B, Hq]")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes 必须和 q 在同一个设备上（{device}），收到 {alibi_slopes.device}")
    if alibi_slopes.requires_grad:    # 和 bias 一致：不回传梯度就不悄悄接受 requires_grad
        raise ValueError("alibi_slopes 不回传梯度：请传 alibi_slopes.detach()")
    if not bool(torch.isfinite(alibi_slopes).all()):
        raise ValueError("alibi_slopes 里有 NaN 或 ±inf")
    if tuple(alibi_slopes.shape) == (hq,):
        alibi_slopes = alibi_slopes.unsqueeze(0).expand(batch, hq)
    if tuple(alibi_slopes.shape) != (batch, hq):
        raise ValueError(f"alibi_slopes 的形状必须是 [Hq]=({hq},) 或 [B, Hq]=({batch}, {hq})，"
                         f"收到 {tuple(alibi_slopes.shape)}")
    return alibi_slopes


def _check_bias(bias, q, batch, hq, nq, nk):
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias 必须是 torch.Tensor，收到 {type(bias).__name__}")
    if bias.requires_grad:
        raise ValueError("bias 不回传梯度：请传 bias.detach()（需要 bias 梯度时用别的实现）")
    if bias.device != q.device:
        raise ValueError(f"bias 必须和 q 在同一个设备上（{q.device}），收到 {bias.device}")
    if bias.dtype not in _DTYPES:
        raise TypeError(f"bias.dtype 必须是 float16、bfloat16 或 float32 之一，收到 {bias.dtype}")
    ok = (bias.dim() == 4 and bias.shape[0] in (1, batch) and bias.shape[1] in (1, hq)
          and tuple(bias.shape[2:]) == (nq, nk))
    if not ok:
        raise ValueError(f"bias 的形状必须是 [B 或 1, Hq 或 1, Nq, Nk] = [{batch}|1, {hq}|1, {nq}, {nk}]，"
                         f"收到 {tuple(bias.shape)}")
    return bias.expand(batch, hq, nq, nk)        # 广播维的步长是 0，不拷贝


def _check_cu(name, cu, total, max_name, max_len, device):
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32:
        raise TypeError(f"{name} 必须是 int32 的 torch.Tensor，收到 {getattr(cu, 'dtype', type(cu).__name__)}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} 必须是一维、长度为 B + 1 ≥ 2 的张量，收到形状 {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} 必须和 q 在同一个设备上（{device}），收到 {cu.device}")
    host = cu.cpu()
    lengths = host[1:] - host[:-1]
    if int(host[0]) != 0 or bool((lengths < 0).any()):
        raise ValueError(f"{name} 必须从 0 开始、单调不减，收到 {host.tolist()[:8]}…")
    if int(host[-1]) != total:
        raise ValueError(f"{name} 的最后一个数必须等于打包后的总长度 {total}，收到 {int(host[-1])}")
    longest = int(lengths.max())
    n = check_int(max_name, _scalar(max_len), lo=longest, where=f"flash_attn_varlen_func（{name} 里最长的一段）",
                  type_error=ValueError)
    return cu.contiguous(), n


def _check_gen(gen, where):
    if not isinstance(gen, torch.Generator):
        raise TypeError(f"{where}：gen 必须是 torch.Generator（如 torch.Generator().manual_seed(0)），"
                        f"收到 {type(gen).__name__}")


def _check_float_dtype(name, dtype, where, allowed=None):
    """dtype 参数（转换之前）：torch 的浮点 dtype；allowed 给了时只能是其中之一。"""
    ok = isinstance(dtype, torch.dtype) and dtype.is_floating_point and (allowed is None or dtype in allowed)
    if not ok:
        want = "torch 的浮点 dtype" if allowed is None else " / ".join(str(a) for a in allowed)
        raise TypeError(f"{where}：{name} 必须是 {want}，收到 {dtype!r}")
    return dtype


def _check_dtypes(dtypes, where):
    if not isinstance(dtypes, (tuple, list)) or not dtypes:
        raise TypeError(f"{where}：dtypes 必须是非空的 tuple / list（如 (torch.bfloat16, torch.float16)），"
                        f"收到 {dtypes!r}")
    for dt in dtypes:
        _check_float_dtype("dtypes 的每一项", dt, where, _DTYPES)
    return tuple(dtypes)


def _require_cuda(where):
    if INTERPRET or not torch.cuda.is_available():
        raise RuntimeError(f"{where}：这个检查只在 CUDA GPU 上跑（没有 GPU，或者开着 Triton 解释器）")


def _check_dropout_mask(seed, dropout_p, batch, n_heads_q, max_q, max_k, device):
    where = "dropout_mask"
    seed = check_int("seed", _scalar(seed), lo=0, hi=2**31 - 1, where=where, type_error=ValueError)
    p = check_real("dropout_p", _scalar(dropout_p), lo=0.0, hi=1.0, hi_open=True, where=where, type_error=ValueError)
    sizes = [check_int(n, v, lo=0, where=where) for n, v in
             (("batch", batch), ("n_heads_q", n_heads_q), ("max_q", max_q), ("max_k", max_k))]
    check_memory("batch × n_heads_q × max_q × max_k", 2 * math.prod(sizes), where)     # int8 + bool
    dev = check_device("device", device, where=where)
    if dev.type == "cpu" and math.prod(sizes):
        _check_runnable(torch.empty(0, device=dev), "device")
    return seed, p, dev


def _check_allowed(nq, nk, causal, window_size, device):
    where = "allowed_mask"
    nq, nk = check_int("nq", nq, lo=0, where=where), check_int("nk", nk, lo=0, where=where)
    check_memory("nq × nk", 3 * nq * nk + 16 * (nq + nk), where)
    return (check_bool("causal", causal, where), _check_window(window_size, where),
            check_device("device", device, where=where))


def _check_reference(q, k, v, causal, softmax_scale, window_size, alibi_slopes, bias, dropout_p, keep, dtype,
                     softcap):
    """reference_attention 的输入：任意浮点 dtype（float64 也行）、形状同 flash_attn_func；会分配 N×N。"""
    where = "reference_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{where}：{name}.dtype 必须是浮点类型，收到 {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{where}：{name} 必须是 4 维 [B, N, H, d]，收到形状 {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{where}：{name} 必须和 q 在同一个设备上（{q.device}），收到 {t.device}")
    batch, nq, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"{where}：k 和 v 的形状必须相同，收到 {tuple(k.shape)} 和 {tuple(v.shape)}")
    nk, hk = k.shape[1], k.shape[2]
    if k.shape[0] != batch or k.shape[-1] != d:
        raise ValueError(f"{where}：k 的 batch 维和 head dim 必须和 q 相同，收到 q {tuple(q.shape)}、"
                         f"k {tuple(k.shape)}")
    if hk == 0 or hq % hk:
        raise ValueError(f"{where}：q 的头数 Hq 必须是 k 的头数 Hk 的整数倍，收到 Hq={hq}、Hk={hk}")
    _check_float_dtype("dtype", dtype, where)
    elem = torch.empty(0, dtype=dtype).element_size()
    check_memory("q、k 的 B × Hq × Nq × Nk", 6 * elem * batch * hq * nq * nk, where)     # 分数、概率、掩码……
    causal = check_bool("causal", causal, where)
    scale = _check_scale(softmax_scale, max(d, 1), where)
    window_size = _check_window(window_size, where)
    p = check_real("dropout_p", _scalar(dropout_p), lo=0.0, hi=1.0, hi_open=True, where=where, type_error=ValueError)
    cap = check_real("softcap", _scalar(softcap), lo=0.0, where=where, type_error=ValueError)
    full = (batch, hq, nq, nk)
    for name, t, shapes in (("alibi_slopes", alibi_slopes, ((hq,), (1, hq), (batch, hq))), ("bias", bias, None),
                            ("keep", keep, (full,))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}：{name} 必须是 torch.Tensor 或 None，收到 {type(t).__name__}")
        ok = (tuple(t.shape) in shapes) if shapes else (
            t.dim() == 4 and all(a in (1, b) for a, b in zip(t.shape, full)))
        if not ok:
            raise ValueError(f"{where}：{name} 的形状不对（q、k 给出 B, Hq, Nq, Nk = {full}），收到 {tuple(t.shape)}")
    if (keep is None) != (p == 0):
        raise ValueError(f"{where}：keep（dropout 的保留掩码，dropout_mask 给出）和 dropout_p > 0 要一起给，"
                         f"收到 dropout_p={p}、keep {'没给' if keep is None else '给了'}")
    return causal, scale, window_size, p, cap


_CASE_KEYS = ("name", "causal", "window", "dropout_p", "varlen", "softcap", "q", "k", "v", "do", "batch", "max_q",
              "max_k", "slopes", "bias", "seed")


def _check_case_dict(case, where):
    if not isinstance(case, dict):
        raise TypeError(f"{where}：case 必须是 make_case 给出的 dict，收到 {type(case).__name__}")
    missing = [key for key in _CASE_KEYS + (("cu_q", "cu_k") if case.get("varlen") else ()) if key not in case]
    if missing:
        raise ValueError(f"{where}：case 不是 make_case 给出的用例，缺少 {missing}")


def _check_make_case(name, batch, nq, nk, hq, hk, d, dtype, device, gen, causal, window, alibi, bias, dropout_p,
                     varlen_q, varlen_k, softcap, q_gain):
    where = "make_case"
    if not isinstance(name, str):
        raise TypeError(f"{where}：name 必须是 str，收到 {type(name).__name__}")
    batch, nq, nk = (check_int(n, v, lo=0, where=where) for n, v in (("batch", batch), ("nq", nq), ("nk", nk)))
    hq, hk = check_int("hq", hq, lo=1, where=where), check_int("hk", hk, lo=1, where=where)
    if hq % hk:
        raise ValueError(f"{where}：hq 必须是 hk 的整数倍（GQA/MQA），收到 hq={hq}、hk={hk}")
    d = check_int("d", d, lo=1, hi=MAX_HEAD_DIM, where=where)
    _check_float_dtype("dtype", dtype, where, _DTYPES)
    check_device("device", device, where=where)
    _check_gen(gen, where)
    for flag, value in (("causal", causal), ("alibi", alibi), ("bias", bias)):
        check_bool(flag, value, where)
    _check_window(window, where, "window")
    check_real("dropout_p", dropout_p, lo=0.0, hi=1.0, hi_open=True, where=where)
    check_real("softcap", softcap, lo=0.0, where=where)
    check_real("q_gain", q_gain, lo=0.0, lo_open=True, where=where)
    if (varlen_q is None) != (varlen_k is None):
        raise ValueError(f"{where}：varlen_q 和 varlen_k 要一起给（每段的 query、key 长度），"
                         f"收到 varlen_k={varlen_k!r}")
    if varlen_q is not None:
        for vname, lengths in (("varlen_q", varlen_q), ("varlen_k", varlen_k)):
            if not isinstance(lengths, (list, tuple)) or not lengths:
                raise ValueError(f"{where}：{vname} 必须是非空的长度列表，收到 {lengths!r}")
            for i, n in enumerate(lengths):
                check_int(f"{vname}[{i}]", n, lo=0, where=where, type_error=ValueError)
        if len(varlen_k) != len(varlen_q):
            raise ValueError(f"{where}：varlen_k 的段数必须和 varlen_q 相同，收到 {len(varlen_q)} 和 {len(varlen_k)}")
        rows_q, rows_k = sum(varlen_q), sum(varlen_k)
    else:
        rows_q, rows_k = batch * nq, batch * nk
    elems = 2 * rows_q * hq * d + 2 * rows_k * hk * d + (hq * nq * nk if bias else 0)
    check_memory("batch × nq × nk × hq × hk × d", 8 * elems, where)


def _check_fields(ours, ref):
    for name, t in (("ours", ours), ("ref", ref)):
        if not isinstance(t, (tuple, list)):
            raise TypeError(f"field_errors：{name} 必须是 (out, lse, dq, dk, dv) 五个张量，收到 {type(t).__name__}")
        if len(t) != len(FIELDS) or not all(isinstance(x, torch.Tensor) for x in t):
            raise ValueError(f"field_errors：{name} 必须是 {FIELDS} 五个张量，收到 {len(t)} 项")
    for f, a, b in zip(FIELDS, ours, ref):
        if a.shape != b.shape:
            raise ValueError(f"field_errors：ours 和 ref 的 {f} 形状不同：{tuple(a.shape)} 和 {tuple(b.shape)}")


def _check_within(field, err, torch_errs):
    where = "within_torch_bound"
    base = field.split(":")[0] if isinstance(field, str) else None
    if base not in FIELDS:
        raise ValueError(f"{where}：field 必须是 {FIELDS} 之一（可以带 ':atomic' 这样的后缀），收到 {field!r}")
    check_real("err", err, lo=0.0, allow_inf=True, where=where)
    if not isinstance(torch_errs, dict) or base not in torch_errs:
        raise ValueError(f"{where}：torch_errs 必须是含 {base!r} 的 dict（field_errors 的结果），收到 {torch_errs!r}")
    return torch_errs[base]


def _check_configs_args(kinds, configs, cases, run, atol, verbose):
    where = "check_configs"
    if kinds is not None:
        if not isinstance(kinds, (tuple, list)):
            raise TypeError(f"{where}：kinds 必须是 None 或内核名的 tuple / list，收到 {type(kinds).__name__}")
        for kind in kinds:
            check_choice("kinds 的每一项", kind, tuple(TUNE_CONFIGS), where)
    if configs is not None:
        if not isinstance(configs, dict):
            raise TypeError(f"{where}：configs 必须是 None 或 {{内核: [配置, …]}}，收到 {type(configs).__name__}")
        for kind, cfgs in configs.items():
            check_choice("configs 的键", kind, tuple(TUNE_CONFIGS), where)
            for cfg in cfgs:
                _check_block_config(f"configs[{kind!r}] 的每一项", cfg, where)
    if cases is not None:
        if not isinstance(cases, (tuple, list)):
            raise TypeError(f"{where}：cases 必须是 None 或 make_case 用例的 list，收到 {type(cases).__name__}")
        for case in cases:
            _check_case_dict(case, where)
    if run is not None and not callable(run):
        raise TypeError(f"{where}：run 必须是 None 或 run(case, launch) 这样的函数，收到 {type(run).__name__}")
    atol = check_real("atol", atol, lo=0.0, where=where)
    return kinds, configs, cases, run, atol, check_bool("verbose", verbose, where)


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description="triton_flash 自检：v1 最小内核、v2 完整内核和 float64 参考比较")
    ap.add_argument("--kernel", choices=SELFTEST_KERNELS, default="all",
                    help="检查哪一版（minimal = v1、full = v2、decode = v3；configs = v2 每个可能选中的配置、"
                         "determinism = 重复调用逐位相同，这两项只在 GPU 上；默认全查）")
    ap.add_argument("--seed", type=int, default=None, help="随机输入的种子（默认由时间决定，运行时会打印）")
    ap.add_argument("--only", default=None, help="GPU 上只跑名字里含这个子串的 v1 / v2 用例（如 softcap）")
    return ap.parse_args(argv)


# v3（flash-decoding）在 flash_decode.py：这里重新导出它的公开名字，triton_flash.flash_decode 等照常可用。
# 放在最后导入：flash_decode 从本模块取 _fwd 等（先导入 flash_decode 时，本模块在这里拿到的是它还没执行完的模块对象，
# 所以按名字在用到时再取，见 __getattr__）。
import flash_decode as _decode_module  # noqa: E402

DECODE_EXPORTS = ("flash_decode", "check_decode", "decode_cases", "decode_fit_smem", "decode_limit",
                  "decode_merge_config", "decode_plan", "decode_probe_shape", "decode_route", "decode_smem_bytes",
                  "decode_splits", "make_decode_case", "reference_decode", "sdpa_decode",
                  "DECODE_CONFIG", "DECODE_CONFIG_GPU", "DECODE_CONFIG_INTERPRET", "DECODE_CONFIG_SHORT",
                  "DECODE_CONFIG_SHORT_GPU", "DECODE_PDL", "MAX_DECODE_ROWS", "MAX_SPLITS", "MERGE_ELEMS_PER_THREAD",
                  "MERGE_MIN_CHUNK", "SHORT_SPLIT_KEYS", "SMEM_LIMIT_SM90", "SMEM_SLACK")


def __getattr__(name):
    if name in DECODE_EXPORTS:
        return getattr(_decode_module, name)
    raise AttributeError(f"module 'triton_flash' has no attribute {name!r}")


if __name__ == "__main__":
    _selftest(**vars(_parse_args()))
