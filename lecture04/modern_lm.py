"""
CS349E 第 4 讲 · modern_lm.py：现代 decoder 的积木（建设中：先提供第 19 讲要用的四个名字）
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import check_int, check_real  # noqa: E402


class RMSNorm(nn.Module):
    """y = x / √(mean(x²) + eps) · weight（沿最后一维）。不减均值、没有偏置：比 LayerNorm 少一次规约。"""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.d = check_int("d", d, lo=1, where="RMSNorm")
        self.eps = check_real("eps", eps, lo=0.0, lo_open=True, where="RMSNorm")
        self.weight = nn.Parameter(torch.ones(self.d))

    def forward(self, x):
        _check_last_dim(x, self.d, "RMSNorm")
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)   # [..., 1]
        return x * inv_rms * self.weight


class SwiGLU(nn.Module):
    """SwiGLU MLP（无偏置）：w_down(SiLU(w_gate x) ⊙ w_up x)。参数 3·d_model·d_ff。"""

    def __init__(self, d_model, d_ff):
        super().__init__()
        d_model = check_int("d_model", d_model, lo=1, where="SwiGLU")
        d_ff = check_int("d_ff", d_ff, lo=1, where="SwiGLU")
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def rope_angles(positions, dim, base=10000.0):
    """
    RoPE 的角度表：位置 p、第 i 个频率（i = 0 … dim/2 − 1）转 p · base^(−2i/dim) 弧度。
    positions：一维张量（可以是小数位置——位置插值 PI 把位置除以倍数）。返回 (cos, sin)，形状 [T, dim/2]，
    dtype 与 positions 相同（整数位置给默认浮点类型）；角度在 float64 里算，长位置也不丢精度。
    """
    dim = _check_rope_dim(dim, "rope_angles")
    base = check_real("base", base, lo=1.0, lo_open=True, where="rope_angles")
    pos = torch.as_tensor(positions)
    out_dtype = pos.dtype if pos.is_floating_point() else torch.get_default_dtype()
    if pos.ndim != 1:
        raise ValueError(f"rope_angles：positions 必须是一维的位置序列，收到形状 {tuple(pos.shape)}")
    pos = pos.to(torch.float64)
    if not torch.isfinite(pos).all():
        raise ValueError("rope_angles：positions 必须全是有限数（不能含 NaN / ±∞）")
    inv_freq = base ** (-torch.arange(dim // 2, dtype=torch.float64) * 2.0 / dim)   # [dim/2]
    angles = torch.outer(pos, inv_freq)                                              # [T, dim/2]
    return angles.cos().to(out_dtype), angles.sin().to(out_dtype)


def apply_rope_half(x, cos, sin):
    """
    "前半与后半配对"的 RoPE（Hugging Face Llama 的写法）：分量 i 与 i + dim/2 组成一个平面向量，转第 i 个角度。
        (a, b) → (a·cos − b·sin, a·sin + b·cos)，a = x[..., :dim/2]，b = x[..., dim/2:]
    x：[..., T, dim]（如 [B, H, T, dh]）；cos、sin：[T, dim/2]（rope_angles 的输出）。
    第 2 讲的 apply_rope 是"相邻两个数一对"：两者差一个固定的维度排列（见 half_to_interleaved）。
    """
    _check_rope_shapes(x, cos, sin)
    half = x.shape[-1] // 2
    c, s = cos.to(x.dtype), sin.to(x.dtype)           # [T, dim/2]，与 [..., T, dim/2] 广播
    a, b = x[..., :half], x[..., half:]               # [..., T, dim/2]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


# =============================================================================
# 输入检查（放在教学代码下面）
# =============================================================================
def _check_last_dim(x, d, where):
    if not torch.is_tensor(x) or x.ndim < 1 or x.shape[-1] != d:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"{where}：输入的最后一维必须是 {d}，收到 {shape}")


def _check_rope_dim(dim, where):
    dim = check_int("dim", dim, lo=2, where=where)
    if dim % 2:
        raise ValueError(f"{where}：dim（每个头的维度）必须是偶数——RoPE 把分量两两配成平面向量旋转，收到 {dim}")
    return dim


def _check_rope_shapes(x, cos, sin):
    if not torch.is_tensor(x) or x.ndim < 2 or x.shape[-1] % 2:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"apply_rope_half：x 应为 [..., T, dim] 且 dim 为偶数（每个头的维度），收到 {shape}")
    want = (x.shape[-2], x.shape[-1] // 2)
    if tuple(cos.shape) != want or tuple(sin.shape) != want:
        raise ValueError(f"apply_rope_half：cos / sin 应为 [T, dim/2] = {list(want)}（x 形状 {tuple(x.shape)}），"
                         f"收到 {tuple(cos.shape)} / {tuple(sin.shape)}")


def _selftest():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 10, dtype=torch.float64)
    cos, sin = rope_angles(torch.arange(7, dtype=torch.float64), 10)
    y = apply_rope_half(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))            # 旋转保长度
    n = RMSNorm(10).double()(x)
    assert torch.allclose(n.pow(2).mean(-1), torch.ones(2, 3, 7, dtype=torch.float64), atol=1e-4)
    assert SwiGLU(10, 12).double()(x).shape == x.shape
    print("modern_lm 自检通过（积木）")


if __name__ == "__main__":
    _selftest()
