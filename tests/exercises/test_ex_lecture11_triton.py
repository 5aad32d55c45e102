"""第 11 讲 Triton 练习（11.7 v1 前向内核、11.8 v1 反向内核）的 CPU 检查：全部在 Triton 解释器里跑。

正确性：不规则尺寸、fp32 和 fp16、causal 与否，和测试里写的 float64 参考逐元素比（max-abs + 相对误差；
fp16 用 flash-attn 的判据：误差 ≤ 2 × PyTorch 自己 fp16 计算的误差）。速度（不用 GPU）：tools/triton_io.py
数出内核读写的字节，和 flash_lab.fa_io_formula 对账（≤ 1.1 倍）。GPU 上的计时评分在 tools/grade_gpu.py。
11.8 的检查用 float64 参考算出的 out、lse 调 mini_attention_backward，不依赖 11.7 的前向。
"""
import contextlib
import math
import os
import sys

import numpy as np
import torch

from grading import called_names, close, exercise, expect, module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from triton_interp import interpreter_env, load_triton_flash  # noqa: E402

IO_SLACK = 1.1                 # 解释器计数 ≤ 1.1 × fa_io_formula 算满分


# 解释器里内核出错时 Triton 只给一行 "InterpreterError: AssertionError('…')"：常见的几种换成能照着改的话
KERNEL_ERROR_HINTS = (
    ("Both operands must be same dtype", "tl.dot 的两个操作数 dtype 要一样：P 是 float32，乘 V 之前先 p.to(v.dtype)"
                                         "（m、l、acc 仍用 float32）"),
    ("must be a power of 2", "tl.arange / 块的长度要是 2 的幂"),
)


@contextlib.contextmanager
def _interp():
    """在 Triton 解释器里跑；内核本身出错（InterpreterError / CompilationError）时换成一句中文的 AssertionError。"""
    try:
        with interpreter_env():
            yield
    except Exception as exc:
        if type(exc).__name__ not in ("InterpreterError", "CompilationError"):
            raise
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, NotImplementedError):          # 学生树里的留空处：原样报"练习未完成"
            raise cause from None
        text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        hint = next((h for key, h in KERNEL_ERROR_HINTS if key in str(exc)), "看 Triton 的报错改内核")
        raise AssertionError(f"内核在 Triton 解释器里出错：{hint}（Triton 说：{text[:200]}）") from exc


def _tf():
    return load_triton_flash()                 # 以解释器模式加载（同一进程里只加载一次）


def _qkv(seed, B, N, H, d, dtype, v_offset=0.0):
    """随机 q、k、v；v_offset ≠ 0 时 v = offset + 0.1·噪声（输出 ≈ offset：累加器的舍入误差最显眼）。"""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, N, H, d, generator=g) for _ in range(3))
    if v_offset:
        v = v_offset + 0.1 * v
    return [t.to(dtype) for t in (q, k, v)]


def _ref_attention(q, k, v, causal):
    """float64 的逐行 softmax 注意力（[B, N, H, d] → out [B, N, H, d]、lse [B, H, N]），和课程代码无关。"""
    Q, K, V = (t.double().permute(0, 2, 1, 3) for t in (q, k, v))        # [B, H, N, d]
    s = Q @ K.transpose(-1, -2) / math.sqrt(q.shape[-1])                 # [B, H, N, N]
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)                                         # [B, H, N]
    out = torch.exp(s - lse[..., None]) @ V
    return out.permute(0, 2, 1, 3), lse


def _ref_grads(q, k, v, do, causal):
    qkv = [t.double().requires_grad_(True) for t in (q, k, v)]
    out, _ = _ref_attention(*qkv, causal)
    return torch.autograd.grad(out, qkv, do.double())


def _torch_fp16_attention(q, k, v, causal):
    """PyTorch 在 fp16 里逐步算（每一步都舍入到 fp16）：flash-attn 判据里的"PyTorch 自己的误差"。"""
    Q, K, V = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    s = (Q @ K.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s.float(), -1).half() @ V).permute(0, 2, 1, 3)


def _err(a, b):
    return float((a.double() - b.double()).abs().max())


def _jit_helpers(tf):
    """v2 的 @triton.jit 函数（练习的内核不能调用它们：那等于抄了完整内核）。"""
    out = []
    for name, obj in vars(tf).items():
        if type(obj).__name__ in ("JITFunction", "InterpretedFunction") and not name.startswith("_mini"):
            out.append(name)
    return out


def _fwd_bytes(fl, B, H, N, d, esize, causal):
    """fa_io_formula 数的是元素（Q 读一遍、K/V 每个 Q 块读一遍、O 和 LSE 写一遍）；LSE 是 float32，其余 esize 字节。"""
    br, bc = _tf().MINI_BLOCKS
    elems = fl.fa_io_formula(N, d, None, Br=br, Bc=bc, causal=causal)
    return B * H * ((elems - N) * esize + N * 4)


# ---------------------------------------------------------------- 11.7 前向
@exercise("11.7")
def test_forward_matches_float64_fp32():
    tf = _tf()
    for seed, (B, N, H, d), causal in ((1, (2, 45, 3, 16), False), (2, (1, 70, 2, 32), True),
                                       (3, (1, 37, 1, 64), True)):
        q, k, v = _qkv(seed, B, N, H, d, torch.float32)
        with _interp():
            out, lse = tf.mini_attention(q, k, v, causal=causal)
        want, want_lse = _ref_attention(q, k, v, causal)
        tag = f"（fp32，B={B} N={N} H={H} d={d} causal={causal}）"
        close(out, want, atol=2e-5, rtol=1e-4, message="输出 O 和 float64 的逐行 softmax 不一致" + tag)
        close(lse, want_lse, atol=2e-5, rtol=1e-5, message="LSE（= m + log l，自然对数，形状 [B, H, N]）不对" + tag)


@exercise("11.7")
def test_forward_fp16_within_twice_torch_error():
    tf = _tf()
    for seed, (B, N, H, d), causal, off in ((4, (1, 77, 2, 32), True, 0.0), (5, (1, 150, 1, 32), False, 1.0)):
        q, k, v = _qkv(seed, B, N, H, d, torch.float16, v_offset=off)
        with _interp():
            out, lse = tf.mini_attention(q, k, v, causal=causal)
        want, want_lse = _ref_attention(q, k, v, causal)
        tag = f"（fp16，N={N} d={d} causal={causal}）"
        expect(out.dtype == torch.float16, f"输出的 dtype 应和输入一样是 float16，得到 {out.dtype}")
        expect(lse.dtype == torch.float32, f"LSE 应是 float32，得到 {lse.dtype}")
        ours, torch_err = _err(out, want), _err(_torch_fp16_attention(q, k, v, causal), want)
        expect(ours <= 2 * torch_err + 1e-5,
               f"fp16 输出误差 {ours:.2e} 超过 PyTorch 自己 fp16 误差 {torch_err:.2e} 的 2 倍{tag}："
               "m、l、acc 要用 float32 累加，只在做 P·V 的矩阵乘前把 P 转成 V 的 dtype")
        close(lse, want_lse, atol=1e-3, rtol=1e-4, message="fp16 输入的 LSE 不对" + tag)


@exercise("11.7")
def test_forward_moves_formula_bytes():
    tf, fl = _tf(), module("lecture11", "flash_lab")
    from triton_io import count_io
    for seed, (B, N, H, d), causal in ((6, (1, 80, 2, 16), False), (7, (1, 80, 2, 16), True)):
        q, k, v = _qkv(seed, B, N, H, d, torch.float16)
        with _interp(), count_io() as io:
            tf.mini_attention(q, k, v, causal=causal)
        got, want = io.bytes(), _fwd_bytes(fl, B, H, N, d, 2, causal)
        ratio = got / want
        detail = f"（N={N} d={d} causal={causal}：数到 {got:,} B，公式 {want:,} B，{ratio:.2f} 倍）"
        expect(io.bytes("write", tensor="O") == B * N * H * d * 2,
               "O 应只写一遍（循环结束后除以 l、写回一次；不要每个 K/V 块都写 O）" + detail)
        expect(ratio <= IO_SLACK,
               f"搬的字节超过 IO 公式的 {IO_SLACK} 倍{detail}：Q 块只读一次、S/P 留在片上不写回内存"
               + ("、causal 时对角线右边整块看不见的 K/V 块不要进循环" if causal else ""))


@exercise("11.7")
def test_forward_kernel_is_self_written():
    tf = _tf()
    with _interp():                        # 先启动一次：没写完时这里报练习自己的 NotImplementedError
        tf.mini_attention(*_qkv(8, 1, 5, 1, 16, torch.float32), causal=True)
    used = called_names(tf._mini_fwd_kernel.fn) & set(_jit_helpers(tf))
    expect(not used, f"_mini_fwd_kernel 调用了 v2 的内核函数 {sorted(used)}：v1 内核要自己写出在线 softmax 循环")


# ---------------------------------------------------------------- 11.8 反向
def _run_bwd(tf, seed, B, N, H, d, dtype, causal, do_offset=0.0):
    """do_offset ≠ 0 时 dO = offset + 0.1·噪声：dV_j ≈ offset·Σ_i P_ij，跨 Q 块累加的舍入误差最显眼。"""
    q, k, v = _qkv(seed, B, N, H, d, dtype)
    do = torch.randn(B, N, H, d, generator=torch.Generator().manual_seed(seed + 100))
    do = (do_offset + 0.1 * do if do_offset else do).to(dtype)
    out, lse = _ref_attention(q, k, v, causal)
    with _interp():
        got = tf.mini_attention_backward(q, k, v, out.to(dtype), lse.float(), do, causal=causal)
    return (q, k, v, do), got, _ref_grads(q, k, v, do, causal)


@exercise("11.8")
def test_backward_matches_float64_fp32():
    tf = _tf()
    for seed, shape, causal in ((11, (2, 45, 2, 16), False), (12, (1, 70, 2, 32), True), (13, (1, 33, 1, 64), True)):
        _, got, want = _run_bwd(tf, seed, *shape, torch.float32, causal)
        tag = f"（fp32，B, N, H, d = {shape}，causal={causal}）"
        for name, g, w in zip(("dQ", "dK", "dV"), got, want):
            close(g, w, atol=1e-4, rtol=1e-3, message=f"{name} 和 float64 的梯度不一致{tag}")


@exercise("11.8")
def test_backward_causal_keeps_future_out():
    """causal：最后一个 key 只被最后一行看见，dV 的最后一行 = P[N-1, N-1]·dO[N-1]；第 0 行只看见 key 0，dQ[0] = 0。"""
    tf = _tf()
    (q, k, v, do), (dq, dk, dv), want = _run_bwd(tf, 14, 1, 50, 1, 16, torch.float32, True)
    _, lse = _ref_attention(q, k, v, True)
    last = math.exp(float(q[0, -1, 0].double() @ k[0, -1, 0].double()) / math.sqrt(16) - float(lse[0, 0, -1]))
    close(dv[0, -1, 0], last * do[0, -1, 0].double(), atol=1e-5, rtol=1e-4,
          message="causal 时最后一个 key 只被最后一行看见：dV 的最后一行应等于 P[N-1, N-1]·dO[N-1]")
    expect(float(dq[0, 0, 0].abs().max()) < 1e-5,
           "causal 时第 0 行只看得见 key 0（P = 1，dS = 0）：dQ 的第 0 行应为 0——对角线右边的 key 要掩掉")
    close(dk, want[1], atol=1e-4, rtol=1e-3, message="causal 的 dK 不对（别忘了乘 softmax_scale）")


@exercise("11.8")
def test_backward_fp16_within_twice_torch_error():
    tf = _tf()
    for seed, shape, causal, off in ((15, (1, 41, 2, 32), False, 0.0), (16, (1, 200, 1, 16), True, 1.0)):
        (q, k, v, do), got, want = _run_bwd(tf, seed, *shape, torch.float16, causal, do_offset=off)
        qkv = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref16 = torch.autograd.grad(_torch_fp16_attention(*qkv, causal), qkv, do)
        for name, g, w, t in zip(("dQ", "dK", "dV"), got, want, ref16):
            expect(g.dtype == torch.float16, f"{name} 的 dtype 应是 float16，得到 {g.dtype}")
            ours, torch_err = _err(g, w), _err(t, w)
            expect(ours <= 2 * torch_err + 1e-3,
                   f"fp16 的 {name} 误差 {ours:.2e} 超过 PyTorch 自己 fp16 误差 {torch_err:.2e} 的 2 倍"
                   f"（B, N, H, d = {shape}，causal={causal}）：dK、dV、dQ 要用 float32 累加")


@exercise("11.8")
def test_backward_moves_linear_bytes():
    """dK/dV 内核：K、V 读一遍、每个活块读 Q、dO、LSE、D；dQ 内核：Q、dO、LSE、D 读一遍、每个活块读 K、V。"""
    tf, fl = _tf(), module("lecture11", "flash_lab")
    from triton_io import count_io
    B, N, H, d = 1, 70, 2, 16
    br, bc = tf.MINI_BLOCKS
    for causal in (False, True):
        q, k, v = _qkv(17, B, N, H, d, torch.float16)
        do = torch.randn(B, N, H, d, generator=torch.Generator().manual_seed(18)).half()
        out, lse = _ref_attention(q, k, v, causal)
        with _interp(), count_io() as io:
            tf.mini_attention_backward(q, k, v, out.half(), lse.float(), do, causal=causal)
        live = fl.live_tiles(N, N, br, bc, causal=causal)                 # [Tr, Tc]
        rows = np.minimum(br, N - br * np.arange(live.shape[0]))          # 每个 Q 块的行数
        cols = np.minimum(bc, N - bc * np.arange(live.shape[1]))
        pair_rows, pair_cols = int((live * rows[:, None]).sum()), int((live * cols[None, :]).sum())
        per_head = (2 * N * d * 2 + pair_rows * (2 * d * 2 + 2 * 4) + 2 * N * d * 2       # dK/dV 内核
                    + 2 * N * d * 2 + 2 * N * 4 + pair_cols * 2 * d * 2 + N * d * 2)      # dQ 内核
        got, want = io.bytes(), B * H * per_head
        expect(got <= IO_SLACK * want,
               f"反向搬了 {got:,} B，是线性 IO 公式 {want:,} B 的 {got / want:.2f} 倍（causal={causal}）："
               "P、dS 在片上由 LSE 重算，不要写回内存；causal 时看不见的块不要进循环")


@exercise("11.8")
def test_backward_kernels_are_self_written():
    tf = _tf()
    _run_bwd(tf, 19, 1, 5, 1, 16, torch.float32, True)          # 先启动一次（没写完时报 NotImplementedError）
    helpers = set(_jit_helpers(tf))
    for kern in (tf._mini_dkdv_kernel, tf._mini_dq_kernel):
        used = called_names(kern.fn) & helpers
        expect(not used, f"{kern.fn.__name__} 调用了 v2 的内核函数 {sorted(used)}：v1 的反向要自己写")

