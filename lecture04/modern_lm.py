"""
CS349E 第 4 讲 · modern_lm.py：现代 decoder 是怎样一件件换出来的（PyTorch，可配置、可训练、可消融）

【这一讲回答的问题】
    2017 年的 Transformer / 2019 年的 GPT-2 和 2024 年的 Llama 3 骨架相同，区别在几块积木：
    LayerNorm → RMSNorm，GELU MLP → SwiGLU，学出来的绝对位置 → RoPE，多头注意力 → GQA，
    再加上滑动窗口、权重共享、KV cache。每一块换掉之后到底买到了什么？
    这里把每块积木做成一个开关（LMConfig 的一个字段），在一个离线生成、最优损失已知的合成语言上训练
    小模型做消融：baseline（LayerNorm、GELU、学出来的位置、MHA）对现代栈，再一次只换一块。

【主要内容】
    RMSNorm / SwiGLU / GeluMLP / make_norm       积木（RMSNorm、SwiGLU 也给第 19 讲用）
    rope_angles / apply_rope_half / apply_rope_interleaved / half_to_interleaved   两种 RoPE 配对与它们之间的排列
    sinusoidal_table / alibi_slopes / attn_bias  其余位置方案与注意力掩码（因果、滑动窗口、ALiBi）
    LMConfig / ModernLM / KVCache / generate     可配置的模型、KV cache、贪心生成
    from_lecture02 / expand_kv_heads             第 2 讲的 numpy 权重装进来（float64 下 logits 一致）；GQA → 等价 MHA
    ChunkCopyLanguage                            合成语言：马尔可夫"文字" + 按标记整块复制；每个 token 的真实概率已知
    train_model / evaluate                       AdamW、预热 + 余弦、梯度裁剪、tqdm（tokens/s、ETA）、定期评估、续训
    loss_breakdown / loss_by_position            按 token 类别（块标记、新块字母、复制）/ 按位置拆开的损失，与最优并排
    CHECKPOINTS / load_or_train / verify_checkpoint   入库的 12 个检查点（格式、核对、续训：checkpoint_store.py）

【约定】
    形状：token [B, T]；激活 [B, T, d]；注意力里 q [B, H, T, dh]、k/v [B, G, S, dh]（G = n_kv_heads，
    S = 键的个数，含 cache 里的旧键）。位置从 0 数；查询 i 的绝对位置是 pos0 + i（pos0 = cache 里已有的长度）。
    nn.Linear 的权重是 [输出维, 输入维]（第 2 讲 numpy 是 W[输入维, 输出维]，装载时转置）。
    损失单位：nats / token（自然对数）。RoPE 默认"前半与后半配对"（Hugging Face Llama 的写法）。

【运行】python3 lecture04/modern_lm.py          # 自检（几秒）
        python3 lecture04/train_checkpoints.py   # 重新训练入库的检查点（12 个模型，每个约 2–5 分钟，见该文件）
【依赖】torch、numpy、tqdm；../lecture01（course_utils、llm_math）；../lecture02/transformer_lab.py（只在自检里）。
"""

import csv
import dataclasses
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import (check_bool, check_choice, check_int, check_memory, check_real, check_torch_seed,  # noqa: E402,F401
                          format_table, read_json_dict)
from llm_math import ModelConfig  # noqa: E402

sys.path.insert(0, HERE)
from checkpoint_store import CheckpointStore, interrupted, stop_on_ctrl_c  # noqa: E402

NORMS = ("rms", "layer")
NORM_PLACES = ("pre", "post")
MLPS = ("swiglu", "gelu")
POSITIONS = ("rope", "learned", "sinusoidal", "alibi", "none")
CKPT_DIR = os.path.join(HERE, "checkpoints")


# =============================================================================
# 1. 积木：归一化与 MLP
# =============================================================================
class RMSNorm(nn.Module):
    """y = x / √(mean(x²) + eps) · weight（沿最后一维）。不减均值、没有偏置：比 LayerNorm 少一次规约。"""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.d = _check_width("d", d, 1, "RMSNorm")
        self.eps = check_real("eps", eps, lo=0.0, lo_open=True, where="RMSNorm")
        self.weight = nn.Parameter(torch.ones(self.d))

    def forward(self, x):
        _check_features(x, self.d, "RMSNorm")
        # >>> 练习 4.1
        xf = x.to(torch.promote_types(x.dtype, torch.float32))   # fp16 里 300² 就溢出成 inf：规约在 float32 里做
        inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)   # [..., 1]
        return (xf * inv_rms).to(x.dtype) * self.weight
        # <<< 练习 4.1


def make_norm(kind, d, eps=1e-5):
    """kind = "rms" → RMSNorm；"layer" → LayerNorm（减均值、除标准差、增益 + 偏置）。"""
    check_choice("norm", kind, NORMS, where="make_norm")
    d = _check_width("d", d, 1, "make_norm")
    eps = check_real("eps", eps, lo=0.0, lo_open=True, where="make_norm")
    return RMSNorm(d, eps) if kind == "rms" else nn.LayerNorm(d, eps=eps)


class SwiGLU(nn.Module):
    """SwiGLU MLP（无偏置）：w_down(SiLU(w_gate x) ⊙ w_up x)。三个矩阵，参数 3·d_model·d_ff。"""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.d_model, d_ff = _check_mlp_sizes(d_model, d_ff, 3, "SwiGLU")
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        _check_features(x, self.d_model, "SwiGLU")
        # >>> 练习 4.2
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        # <<< 练习 4.2


class GeluMLP(nn.Module):
    """GPT-2 式 MLP（这里也无偏置）：w_down(GELU(w_up x))。两个矩阵，参数 2·d_model·d_ff。
    和 SwiGLU 比要"等参数"：GELU 的 d_ff 取 SwiGLU 的 1.5 倍（见 mlp_width）。"""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.d_model, d_ff = _check_mlp_sizes(d_model, d_ff, 2, "GeluMLP")
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        _check_features(x, self.d_model, "GeluMLP")
        return self.w_down(F.gelu(self.w_up(x)))


def mlp_width(d_ff_swiglu, kind):
    """同样的参数量下 MLP 的中间宽度：SwiGLU 三个矩阵、GELU 两个，所以 GELU 宽 1.5 倍。"""
    d_ff_swiglu = check_int("d_ff_swiglu", d_ff_swiglu, lo=1, where="mlp_width")
    check_choice("mlp", kind, MLPS, where="mlp_width")
    return d_ff_swiglu if kind == "swiglu" else (3 * d_ff_swiglu) // 2


# =============================================================================
# 2. 位置：RoPE（两种配对）、正弦表、ALiBi
# =============================================================================
def rope_angles(positions, dim, base=10000.0):
    """
    RoPE 的角度表：位置 p、第 i 个频率（i = 0 … dim/2 − 1）转 p · base^(−2i/dim) 弧度。
    positions：一维张量（可以是小数位置——位置插值 PI 把位置除以倍数）。返回 (cos, sin)，形状 [T, dim/2]，
    dtype 与 positions 相同（整数位置给默认浮点类型）；角度在 float64 里算，长位置也不丢精度。
    """
    dim = _check_rope_dim(dim, "rope_angles")
    base = check_real("base", base, lo=1.0, lo_open=True, where="rope_angles")
    pos = _check_positions(positions)
    check_memory(f"positions 的 {pos.numel()} 个位置 × dim/2 = {dim // 2} 个角度（float64，cos、sin）",
                 4 * 8 * pos.numel() * (dim // 2) + 8 * dim, "rope_angles")
    out_dtype = pos.dtype if pos.is_floating_point() else torch.get_default_dtype()
    inv_freq = base ** (-torch.arange(dim // 2, dtype=torch.float64) * 2.0 / dim)   # [dim/2]
    angles = torch.outer(pos.to(torch.float64), inv_freq)                           # [T, dim/2]
    return angles.cos().to(out_dtype), angles.sin().to(out_dtype)


def apply_rope_half(x, cos, sin):
    """
    "前半与后半配对"的 RoPE（Hugging Face Llama 的写法）：分量 i 与 i + dim/2 组成一个平面向量，转第 i 个角度。
        (a, b) → (a·cos − b·sin, a·sin + b·cos)，a = x[..., :dim/2]，b = x[..., dim/2:]
    x：[..., T, dim]（如 [B, H, T, dh]）；cos、sin：[T, dim/2]（rope_angles 的输出）。
    第 2 讲的 apply_rope 是"相邻两个数一对"：两者差一个固定的维度排列（见 half_to_interleaved）。
    """
    _check_rope_shapes(x, cos, sin, "apply_rope_half")
    # >>> 练习 4.3
    half = x.shape[-1] // 2
    c, s = cos.to(x.dtype), sin.to(x.dtype)           # [T, dim/2]，与 [..., T, dim/2] 广播
    a, b = x[..., :half], x[..., half:]               # [..., T, dim/2]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    # <<< 练习 4.3


def apply_rope_interleaved(x, cos, sin):
    """"相邻两个数一对"的 RoPE（RoFormer 论文、第 2 讲、Meta 的原始 Llama 代码）：分量 (2i, 2i+1) 转第 i 个角度。"""
    _check_rope_shapes(x, cos, sin, "apply_rope_interleaved")
    # >>> 练习 4.3
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]                 # [..., T, dim/2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)   # [..., T, dim/2, 2] → [..., T, dim]
    # <<< 练习 4.3


def half_to_interleaved(dim):
    """
    排列 perm（长度 dim）：x_half = x_inter[..., perm] 时
        apply_rope_half(x_half) = apply_rope_interleaved(x_inter)[..., perm]。
    perm = [0, 2, 4, …, 1, 3, 5, …]：交错配对的第 i 对 (2i, 2i+1) 搬到半对半配对的 (i, i + dim/2)。
    q·k 对两边做同一个排列不变，所以把 Wq、Wk 的输出列（每个头内部）按 perm 重排，模型就从一种写法换成另一种。
    """
    dim = _check_rope_dim(dim, "half_to_interleaved")
    check_memory(f"dim={dim} 的排列（int64，两份）", 16 * dim, "half_to_interleaved")
    return torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))


def sinusoidal_table(n_pos, d):
    """原始 Transformer 的正弦位置表 [n_pos, d]：第 i 对分量是 (sin, cos)(p · 10000^(−2i/d))，不需要训练。"""
    d = _check_rope_dim(d, "sinusoidal_table", "d")
    n_pos = check_int("n_pos", n_pos, lo=0, where="sinusoidal_table")
    check_memory(f"n_pos × d = {n_pos} × {d} 的表（float64 角度 + 几份中间结果）", 6 * 8 * n_pos * d,
                 "sinusoidal_table")
    cos, sin = rope_angles(torch.arange(n_pos), d)                    # [n_pos, d/2]
    return torch.stack((sin, cos), dim=-1).flatten(-2)                # [n_pos, d]


def alibi_slopes(n_heads):
    """ALiBi 每个头的斜率：2^(−8/H), 2^(−16/H), …（头数为 2 的幂时与论文相同；否则按论文的插补规则）。"""
    n_heads = check_int("n_heads", n_heads, lo=1, where="alibi_slopes")
    check_memory(f"n_heads={n_heads} 个斜率（先是 Python 列表，每个约 32 字节）", 40 * n_heads, "alibi_slopes")
    p = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * (i + 1) / p) for i in range(p)]
    extra = [2 ** (-4 * (2 * i + 1) / p) for i in range(n_heads - p)]   # 非 2 的幂：从 2p 个头的序列里隔一个取
    return torch.tensor(slopes + extra)


def attn_bias(q_pos, k_pos, window=0, slopes=None, dtype=torch.float32):
    """
    注意力分数上要加的偏置：被掩掉的 (查询, 键) 对为 −∞，其余为 0（ALiBi 时为 −slope·距离）。
    q_pos [T]、k_pos [S]：绝对位置。因果：键位置 ≤ 查询位置；window = W > 0 时只看最近 W 个键（含自己）。
    返回 [T, S]，给了 slopes（[H]）时 [H, T, S]。
    """
    window = _check_bias_args(q_pos, k_pos, window, slopes, dtype)
    dist = q_pos[:, None] - k_pos[None, :]                            # [T, S]：查询比键晚多少个位置
    allowed = dist >= 0
    if window:
        allowed &= dist < window
    bias = torch.zeros(dist.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))
    if slopes is not None:
        bias = bias - slopes.to(dtype)[:, None, None] * dist.clamp(min=0).to(dtype)   # [H, T, S]
    return bias


# =============================================================================
# 3. 配置与模型
# =============================================================================
@dataclass(frozen=True)
class LMConfig:
    """
    vocab、d_model、n_layers、n_heads、n_kv_heads（GQA 的组数 G：= n_heads 是 MHA，= 1 是 MQA）、d_head、
    d_ff（MLP 中间宽度）；
    max_seq：学出来的位置表的行数（只有 pos="learned" 用：更长的序列报错）；
    norm ∈ NORMS、norm_place ∈ NORM_PLACES、mlp ∈ MLPS、pos ∈ POSITIONS；
    window：0 = 完整因果注意力，W > 0 = 每个查询只看最近 W 个键；tied：lm_head 与词嵌入共享；
    rope_base：RoPE 的 base（θ）；norm_eps；name 只用来打印。
    """
    vocab: int = 40
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_head: int = 16
    d_ff: int = 172
    max_seq: int = 256
    norm: str = "rms"
    norm_place: str = "pre"
    mlp: str = "swiglu"
    pos: str = "rope"
    window: int = 0
    tied: bool = False
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    name: str = "modern"

    def __post_init__(self):
        _check_config(self)

    def to_model_config(self):
        """换成第 1 讲的 ModelConfig，直接用那边的公式（KV 字节 / token 等）；学出来的位置表记在 n_pos。"""
        return ModelConfig(self.name, n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, d_head=self.d_head, d_ff=self.d_ff, vocab=self.vocab,
                           tied=self.tied, n_pos=self.max_seq if self.pos == "learned" else 0)

    def to_dict(self):
        return dataclasses.asdict(self)


def config_like(cfg, **changes):
    """拷贝 cfg 改几个字段（会重新检查）：config_like(MODERN, pos="alibi")。"""
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"config_like：cfg 必须是 LMConfig，收到 {type(cfg).__name__}")
    _check_keys("config_like", changes, LMConfig)
    return dataclasses.replace(cfg, **changes)


class Attention(nn.Module):
    """因果自注意力：MHA / GQA / MQA，可选 RoPE、ALiBi、滑动窗口；能读写 KV cache。"""

    def __init__(self, cfg):
        super().__init__()
        _check_cfg_type("Attention", cfg)
        self.cfg = cfg
        H, G, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
        self.wq = nn.Linear(d, H * dh, bias=False)
        self.wk = nn.Linear(d, G * dh, bias=False)
        self.wv = nn.Linear(d, G * dh, bias=False)
        self.wo = nn.Linear(H * dh, d, bias=False)
        self.register_buffer("slopes", alibi_slopes(H) if cfg.pos == "alibi" else None, persistent=False)

    def forward(self, x, pos0=0, cache=None, layer=0):
        """x [B, T, d_model]（浮点）；pos0：x 第一个位置的绝对位置；cache：KVCache 或 None；layer：cache 里的第几层。"""
        pos0 = _check_block_args("Attention", x, pos0, cache, layer, self.cfg)
        return self._attend(x, pos0, cache, layer)

    def _project(self, x, pos0):
        """q、k、v 投影（pos="rope" 时已转过 RoPE）：q [B, H, T, dh]，k、v [B, G, T, dh]；另返回位置 q_pos [T]。"""
        cfg = self.cfg
        B, T, _ = x.shape
        H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        q = self.wq(x).view(B, T, H, dh).transpose(1, 2)              # [B, H, T, dh]
        k = self.wk(x).view(B, T, G, dh).transpose(1, 2)              # [B, G, T, dh]
        v = self.wv(x).view(B, T, G, dh).transpose(1, 2)
        q_pos = torch.arange(pos0, pos0 + T)
        if cfg.pos == "rope":
            # 位置、角度至少用 float32（bf16 里 256 和 257 是同一个数）；cos / sin 在 apply_rope_half 里才转成 x.dtype
            cos, sin = rope_angles(q_pos.to(torch.promote_types(x.dtype, torch.float32)), dh, cfg.rope_base)
            q, k = apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
        return q, k, v, q_pos

    def _attend(self, x, pos0, cache, layer):
        """注意力本身：接上 KV cache，GQA 把每组 K/V 分给组里的 H/G 个查询头，掩码（因果、窗口、ALiBi），再过 wo。"""
        q, k, v, q_pos = self._project(x, pos0)
        # >>> 练习 4.4
        cfg = self.cfg
        B, n_heads, T, dh = q.shape
        R = n_heads // cfg.n_kv_heads                                 # 一组 K/V 服务 R 个相邻的查询头
        k, v, k_pos = (k, v, q_pos) if cache is None else cache._append(layer, k, v, q_pos)   # [B, G, S, dh]：旧键在前
        k, v = k.repeat_interleave(R, dim=1), v.repeat_interleave(R, dim=1)   # [B, H, S, dh]：头 h 用第 h // R 组
        if cfg.window or cfg.pos == "alibi" or cache is not None:
            bias = attn_bias(q_pos, k_pos, cfg.window, self.slopes, x.dtype)   # [T, S] 或 [H, T, S]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:                                                          # 普通因果：SDPA 的快路径
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, n_heads * dh))   # [B, T, H·dh] → [B, T, d]
        # <<< 练习 4.4


class Block(nn.Module):
    """一层：pre-norm x + f(norm(x))（GPT-2 以后的做法），或 post-norm norm(x + f(x))（2017 年原版）。"""

    def __init__(self, cfg):
        super().__init__()
        _check_cfg_type("Block", cfg)
        self.cfg = cfg
        self.pre = cfg.norm_place == "pre"
        self.norm1 = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff) if cfg.mlp == "swiglu" else GeluMLP(cfg.d_model, cfg.d_ff)

    def forward(self, x, pos0=0, cache=None, layer=0):
        """参数同 Attention.forward。"""
        pos0 = _check_block_args("Block", x, pos0, cache, layer, self.cfg)
        return self._run(x, pos0, cache, layer)

    def _run(self, x, pos0, cache, layer):
        if self.pre:
            x = x + self.attn._attend(self.norm1(x), pos0, cache, layer)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn._attend(x, pos0, cache, layer))
        return self.norm2(x + self.mlp(x))


class ModernLM(nn.Module):
    """
    decoder-only 语言模型。forward(ids [B, T], cache=None) → logits [B, T, vocab]。
    cache 给了（KVCache）时，新 token 接在 cache 里已有的 cache.length 个位置之后。
    pos="learned" 时序列（含 cache 里的）不能超过 max_seq——学出来的表只有这么多行。
    """

    def __init__(self, cfg):
        super().__init__()
        _check_cfg_type("ModernLM", cfg)
        _check_model_fits("ModernLM", cfg)
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq, cfg.d_model) if cfg.pos == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_place == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self._init_weights()
        if cfg.tied:
            self.head.weight = self.tok.weight

    def _init_weights(self):
        """N(0, 0.02)；写回残差流的 wo、w_down 再乘 1/√(2L)（GPT-2：2L 个分支叠加后方差不随层数涨）。"""
        for name, p in self.named_parameters():
            if p.ndim == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w_down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, cache=None):
        _check_ids(ids, self.cfg)
        _check_cache(cache, self.cfg, ids)
        T = ids.shape[1]
        pos0 = 0 if cache is None else cache.length
        _check_length(self.cfg, pos0 + T)
        _check_forward_fits("ModernLM.forward", "ids 的 [B, T]", self.cfg, ids.shape[0], T, pos0 + T,
                            cache is not None, self.tok.weight.element_size())
        return self._forward(ids, cache)

    def _forward(self, ids, cache):
        """不查参数的前向：generate、lm_loss 在入口查过一次之后用它（每步不再对 ids 做 min / max）。"""
        T = ids.shape[1]
        pos0 = 0 if cache is None else cache.length
        x = self.tok(ids)                                             # [B, T, d]
        if self.cfg.pos == "learned":
            x = x + self.pos_emb(torch.arange(pos0, pos0 + T))
        elif self.cfg.pos == "sinusoidal":
            x = x + sinusoidal_table(pos0 + T, self.cfg.d_model)[pos0:].to(x.dtype)
        for li, blk in enumerate(self.blocks):
            x = blk._run(x, pos0, cache, li)
        if cache is not None:
            cache.length = pos0 + T
        return self.head(self.norm(x))                                # [B, T, vocab]

    def n_params(self):
        return sum(p.numel() for p in self.parameters())


class KVCache:
    """
    每层一对 K、V（[B, G, S, dh]，RoPE 之后的），每次前向把新 token 的接在后面。
    滑动窗口模型只需要最近 window − 1 个旧键：多余的丢掉，cache 不随长度增长（Mistral 的"滚动缓冲区"）。
    """

    def __init__(self, cfg):
        _check_cfg_type("KVCache", cfg)
        _check_model_fits("KVCache", cfg)
        self.cfg, self.length = cfg, 0
        self.k, self.v, self.pos = [None] * cfg.n_layers, [None] * cfg.n_layers, [None] * cfg.n_layers

    def _append(self, layer, k_new, v_new, pos_new):
        """接上第 layer 层的新 K、V，返回这次注意力要用的全部 (k, v, 键位置)。只由 Attention 调用（已查过形状）。"""
        # >>> 练习 4.4
        if self.k[layer] is not None:
            k_new = torch.cat((self.k[layer], k_new), dim=2)         # [B, G, S_old + T, dh]
            v_new = torch.cat((self.v[layer], v_new), dim=2)
            pos_new = torch.cat((self.pos[layer], pos_new))
        keep = slice(-(self.cfg.window - 1), None) if self.cfg.window > 1 else slice(None)
        if self.cfg.window == 1:
            keep = slice(k_new.shape[2], None)                         # 窗口 1：只看自己，旧键一个也不用留
        self.k[layer], self.v[layer], self.pos[layer] = k_new[:, :, keep], v_new[:, :, keep], pos_new[keep]
        return k_new, v_new, pos_new
        # <<< 练习 4.4

    def nbytes(self):
        """cache 里实际存着的 K、V 字节数（按张量自己的 dtype）。"""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


@torch.no_grad()
def generate(model, prompt, n_new, use_cache=True):
    """
    贪心生成 n_new 个 token。返回 (ids [B, P + n_new], 每步的 logits 列表（每个 [B, vocab]）)。
    use_cache=False 时每步把整段重新算一遍（参考做法）；两者的 token 应完全相同。
    """
    n_new = check_int("n_new", n_new, lo=0, where="generate")
    use_cache = check_bool("use_cache", use_cache, where="generate")
    if not isinstance(model, ModernLM):
        raise TypeError(f"generate：model 必须是 ModernLM，收到 {type(model).__name__}")
    _check_ids(prompt, model.cfg, "prompt")
    _check_generate_fits(model.cfg, prompt, n_new, use_cache)
    ids = prompt
    cache = KVCache(model.cfg) if use_cache else None
    steps, feed = [], prompt
    for _ in range(n_new):
        logits = model._forward(feed, cache)[:, -1]                   # [B, vocab]：入口已查过 prompt 和长度
        nxt = logits.argmax(-1, keepdim=True)                          # [B, 1]
        steps.append(logits)
        ids = torch.cat((ids, nxt), dim=1)
        feed = nxt if use_cache else ids
    return ids, steps


# =============================================================================
# 4. 和第 2 讲的 numpy 模型对上
# =============================================================================
def from_lecture02(params, cfg02):
    """
    把第 2 讲 transformer_lab 的 numpy 参数装进 ModernLM（float64），两者的 logits 应一致到 ~1e-12。
    · numpy 的 W[输入, 输出] 转置成 nn.Linear 的 [输出, 输入]；
    · 第 2 讲的 RoPE 是交错配对，我们是半对半：每个头内部把 Wq、Wk 的输出行按 half_to_interleaved 重排
      （q·k 对 q、k 做同一排列不变，所以注意力分数不变；Wv、Wo 不用动）。
    """
    _check_lecture02(params, cfg02)
    cfg = LMConfig(vocab=cfg02.vocab, d_model=cfg02.d_model, n_layers=cfg02.n_layers, n_heads=cfg02.n_heads,
                   n_kv_heads=cfg02.n_kv_heads, d_head=cfg02.d_head, d_ff=cfg02.d_ff, max_seq=cfg02.max_seq,
                   rope_base=float(cfg02.rope_theta), norm_eps=float(cfg02.norm_eps), tied=bool(cfg02.tied),
                   name="from_lecture02")
    model = ModernLM(cfg).double()
    perm = half_to_interleaved(cfg.d_head)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).double()

    def rope_rows(W, n_heads):                                        # W[d, n·dh] → 行重排后的 [n·dh, d]
        w = t(W).T.reshape(n_heads, cfg.d_head, cfg.d_model)          # [n, dh, d]
        return w[:, perm].reshape(n_heads * cfg.d_head, cfg.d_model)

    with torch.no_grad():
        model.tok.weight.copy_(t(params["embed"]))
        for blk, lp in zip(model.blocks, params["layers"]):
            blk.norm1.weight.copy_(t(lp["attn_norm"]))
            blk.norm2.weight.copy_(t(lp["mlp_norm"]))
            blk.attn.wq.weight.copy_(rope_rows(lp["wq"], cfg.n_heads))
            blk.attn.wk.weight.copy_(rope_rows(lp["wk"], cfg.n_kv_heads))
            blk.attn.wv.weight.copy_(t(lp["wv"]).T)
            blk.attn.wo.weight.copy_(t(lp["wo"]).T)
            blk.mlp.w_gate.weight.copy_(t(lp["w_gate"]).T)
            blk.mlp.w_up.weight.copy_(t(lp["w_up"]).T)
            blk.mlp.w_down.weight.copy_(t(lp["w_down"]).T)
        model.norm.weight.copy_(t(params["final_norm"]))
        if not cfg.tied:
            model.head.weight.copy_(t(params["lm_head"]).T)
    return model


def expand_kv_heads(model):
    """GQA 模型 → 等价的 MHA 模型：每组的 Wk、Wv 复制给组里的 H/G 个头。两者 logits 相同（自检、测试验证）。"""
    if not isinstance(model, ModernLM):
        raise TypeError(f"expand_kv_heads：model 必须是 ModernLM，收到 {type(model).__name__}")
    cfg = model.cfg
    big = ModernLM(config_like(cfg, n_kv_heads=cfg.n_heads)).to(next(model.parameters()).dtype)
    state = dict(model.state_dict())
    R, dh, d = cfg.n_heads // cfg.n_kv_heads, cfg.d_head, cfg.d_model
    for key, w in model.state_dict().items():
        if key.endswith(("attn.wk.weight", "attn.wv.weight")):
            state[key] = w.view(cfg.n_kv_heads, dh, d).repeat_interleave(R, dim=0).reshape(cfg.n_heads * dh, d)
    big.load_state_dict(state)
    return big


# =============================================================================
# 5. 合成语言：马尔可夫"文字" + 按标记整块复制
# =============================================================================
class ChunkCopyLanguage:
    """
    一种平稳的合成语言，每个 token 的真实条件概率都由生成过程给出，所以最优损失（熵率）可以直接算出来。

    词表：n_letters 个字母；S（新块）；C1 … C{max_back}（复制标记）。vocab = n_letters + 1 + max_back。
    序列由长 chunk 的块组成，每块第一个 token 是标记：
        S  ：后面 chunk − 1 个字母按一条固定的随机马尔可夫链往下写（每个字母只会接 n_succ 种字母）；
        Ck ：后面 chunk − 1 个字母原样复制往前数第 k 块的内容（只在前面至少有 k 块时可能出现）。
    每块以概率 p_copy 是复制块，k 在允许的值里均匀取。
    【为什么这样设计】
        · 马尔可夫部分只要看前一个字母（局部统计，MLP 和任何位置方案都学得会）；
        · 复制部分要"往回数 k·chunk 个位置、把那里的 token 抄过来"：需要精确的相对位置（归纳头 + 位置信息），
          位置编码、注意力的头数与 K/V 组数、窗口大小在这里拉开差距；
        · 过程是平稳的：序列变长，每个 token 的最优损失不变——长度外推（演示 5）测的就是"学到的是规则还是位置"。
    sample(n, length, seed) 返回 (tokens [n, length + 1], oracle_logp [n, length])：后者是每个预测目标
        （tokens[:, 1:]）在真实过程下的对数概率；−mean(oracle_logp) 就是"知道规则的模型"在这批数据上的损失。
    """

    def __init__(self, n_letters=32, chunk=8, max_back=4, p_copy=0.5, n_succ=4, seed=1234):
        seed = check_int("seed", seed, lo=0, where="ChunkCopyLanguage")
        self.n_letters = check_int("n_letters", n_letters, lo=2, where="ChunkCopyLanguage")
        check_memory(f"n_letters² = {n_letters}² 的转移矩阵（float64）", 8 * n_letters ** 2, "ChunkCopyLanguage")
        self.chunk = check_int("chunk", chunk, lo=2, where="ChunkCopyLanguage")
        self.max_back = check_int("max_back", max_back, lo=1, where="ChunkCopyLanguage")
        self.p_copy = check_real("p_copy", p_copy, lo=0.0, hi=1.0, where="ChunkCopyLanguage")
        self.n_succ = check_int("n_succ", n_succ, lo=1, hi=self.n_letters, where="ChunkCopyLanguage")
        self.seed = seed
        self.S = n_letters
        self.C0 = n_letters + 1                                        # C1 的编号；Ck = C0 + k − 1
        self.vocab = n_letters + 1 + max_back
        rng = np.random.default_rng(seed)
        self.trans = np.zeros((n_letters, n_letters))                  # trans[a, b] = P(下一个是 b | 当前 a)
        for a in range(n_letters):
            succ = rng.choice(n_letters, size=n_succ, replace=False)
            self.trans[a, succ] = rng.dirichlet(np.full(n_succ, 2.0))
        self.start = np.full(n_letters, 1.0 / n_letters)               # 第一块的第一个字母：均匀

    def names(self):
        return [chr(ord("a") + i) if i < 26 else f"#{i}" for i in range(self.n_letters)] + ["S"] + \
            [f"C{k}" for k in range(1, self.max_back + 1)]

    def sample(self, n, length, seed):
        n = check_int("n", n, lo=1, where="ChunkCopyLanguage.sample")
        length = check_int("length", length, lo=1, where="ChunkCopyLanguage.sample")
        seed = check_int("seed", seed, lo=0, where="ChunkCopyLanguage.sample")
        check_memory(f"n × (length + 1) = {n} × {length + 1} 个 token（连同概率与中间结果）", 64 * n * (length + 1),
                     "ChunkCopyLanguage.sample")
        rng = np.random.default_rng(seed)
        L, c = length + 1, self.chunk
        tok = np.zeros((n, L), dtype=np.int64)
        logp = np.zeros((n, L))
        prev = np.full(n, -1)                                          # 马尔可夫链的当前字母（−1 = 还没有）
        rows = np.arange(n)
        for t in range(L):
            j, blk = t % c, t // c
            if j == 0:                                                 # 块的标记
                n_back = min(blk, self.max_back)
                p_copy = self.p_copy if n_back else 0.0
                is_copy = rng.random(n) < p_copy
                back = rng.integers(1, n_back + 1, size=n) if n_back else np.ones(n, dtype=np.int64)
                tok[:, t] = np.where(is_copy, self.C0 + back - 1, self.S)
                logp[:, t] = np.where(is_copy, np.log(max(p_copy, 1e-300) / max(n_back, 1)),
                                      np.log(max(1.0 - p_copy, 1e-300)))
                copy_from = np.where(is_copy, back * c, 0)             # 复制块：抄 copy_from 个位置之前的 token
                continue
            probs = self.trans[prev] if t > 1 else np.broadcast_to(self.start, (n, self.n_letters))
            fresh = _sample_rows(rng, probs)
            src = tok[rows, np.maximum(t - copy_from, 0)]
            tok[:, t] = np.where(copy_from > 0, src, fresh)
            logp[:, t] = np.where(copy_from > 0, 0.0, np.log(probs[rows, fresh]))
            prev = tok[:, t]
        return torch.from_numpy(tok), torch.from_numpy(logp[:, 1:])

    def kind_names(self):
        """token_kinds 的类别名：块标记、新块的字母、从第 k 块前复制的字母。"""
        return ["marker", "fresh"] + [f"copy{k}" for k in range(1, self.max_back + 1)]

    def token_kinds(self, tokens):
        """每个预测目标（tokens[:, 1:]）属于哪一类（kind_names 的下标），[n, length]：只看 token 本身就能定。"""
        _check_tokens(tokens, self.vocab, "ChunkCopyLanguage.token_kinds", min_len=1)
        tgt_pos = torch.arange(1, tokens.shape[1])                    # 目标在序列里的位置
        j = tgt_pos % self.chunk                                       # 在块里的第几个
        marker = tokens[:, tgt_pos - j]                                # [n, length]：这个目标所在块的标记
        kind = torch.where(marker == self.S, 1, marker - self.C0 + 2)
        return torch.where(j == 0, 0, kind)

    def markov_entropy(self):
        """马尔可夫链每步的条件熵（按平稳分布平均），nats：只会"看前一个字母"的模型在新块里最好做到这么多。"""
        w, vecs = np.linalg.eig(self.trans.T)
        pi = np.real(vecs[:, np.argmin(np.abs(w - 1))])
        pi = pi / pi.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            h_rows = -np.nansum(np.where(self.trans > 0, self.trans * np.log(self.trans), 0.0), axis=1)
        return float(pi @ h_rows)


def _sample_rows(rng, probs):
    """每行按自己的分布抽一个下标（逆 CDF，向量化）。"""
    u = rng.random(probs.shape[0])[:, None]
    return np.minimum((np.cumsum(probs, axis=1) < u).sum(axis=1), probs.shape[1] - 1)


# =============================================================================
# 6. 训练与评估
# =============================================================================
@dataclass(frozen=True)
class TrainConfig:
    """steps、batch、seq（训练长度）、lr（峰值）、warmup、min_lr_frac（余弦退火的终点 = lr·min_lr_frac）、
    weight_decay、clip（梯度范数上限）、eval_every、eval_batches、seed。
    数据第 s 步用种子 seed·10⁶ + s：续训时数据流不变。"""
    steps: int = 1500
    batch: int = 32
    seq: int = 64
    lr: float = 3e-3
    warmup: int = 100
    min_lr_frac: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 4
    seed: int = 0

    def __post_init__(self):
        _check_train_config(self)

    def to_dict(self):
        return dataclasses.asdict(self)


def lr_at(step, tc):
    """线性预热 warmup 步，然后余弦从 lr 降到 lr·min_lr_frac。step 从 0 数（≥ steps 时停在 lr·min_lr_frac）。"""
    _check_tc("lr_at", tc)
    step = check_int("step", step, lo=0, where="lr_at")
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(tc.steps - tc.warmup, 1)
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def make_optimizer(model, tc):
    """AdamW；二维权重做 weight decay，增益 / 偏置 / 位置表之外的一维参数不做（惯例）。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_optimizer：model 必须是 torch.nn.Module（如 ModernLM），收到 {type(model).__name__}")
    _check_tc("make_optimizer", tc)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(0.9, 0.95))


def lm_loss(model, tokens):
    """下一个 token 的交叉熵（nats / token）：输入 tokens[:, :-1]，目标 tokens[:, 1:]。"""
    if not isinstance(model, ModernLM):
        raise TypeError(f"lm_loss：model 必须是 ModernLM，收到 {type(model).__name__}")
    _check_tokens(tokens, model.cfg.vocab, "lm_loss", min_len=2)
    _check_length(model.cfg, tokens.shape[1] - 1)
    _check_forward_fits("lm_loss", "tokens 的 [n, L − 1]", model.cfg, tokens.shape[0], tokens.shape[1] - 1,
                        tokens.shape[1] - 1, False, _elem(model))
    logits = model._forward(tokens[:, :-1], None)                     # [B, T, vocab]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, lang, seq, n_batches=4, batch=32, seed=999):
    """固定的评估集上的 (模型损失, 最优损失)，nats / token。"""
    _check_eval_args("evaluate", model, lang, seq, batch, seed, n_batches=n_batches)
    was = model.training
    model.eval()
    losses, opt = [], []
    for b in range(n_batches):
        tokens, logp = lang.sample(batch, seq, seed * 1000 + b)
        losses.append(float(lm_loss(model, tokens)))
        opt.append(float(-logp.mean()))
    model.train(was)
    return float(np.mean(losses)), float(np.mean(opt))


@torch.no_grad()
def loss_by_position(model, lang, seq, batch=64, seed=4242):
    """每个位置的平均损失 [seq] 和最优损失 [seq]（演示 5：过了训练长度，损失从哪儿开始涨）。"""
    _check_eval_args("loss_by_position", model, lang, seq, batch, seed)
    model.eval()
    tokens, logp = lang.sample(batch, seq, seed)
    logits = model(tokens[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")   # [B, seq]
    return nll.mean(0), -logp.mean(0)


@torch.no_grad()
def loss_breakdown(model, lang, seq, batch=64, seed=777):
    """
    按 token 类别拆开的损失：{类别: (模型损失, 最优损失, 占全部目标的比例)}，外加 "all"。
    复制块的最优损失是 0（抄得到就确定）；新块是马尔可夫链的条件熵；标记是"复制与否、抄哪块"的熵。
    """
    _check_eval_args("loss_breakdown", model, lang, seq, batch, seed)
    model.eval()
    tokens, logp = lang.sample(batch, seq, seed)
    logits = model(tokens[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")   # [B, seq]
    kinds = lang.token_kinds(tokens)
    out = {}
    for i, name in enumerate(lang.kind_names()):
        sel = kinds == i
        if sel.any():
            out[name] = (float(nll[sel].mean()), float(-logp[sel].mean()) + 0.0, float(sel.float().mean()))
    out["all"] = (float(nll.mean()), float(-logp.mean()), 1.0)
    return out


def train_model(cfg, tc, lang, progress=True, resume_path=None, desc=None, log=print):
    """
    训练一个模型，返回 (model, curve)；curve 是 [(step, train_loss, eval_loss 或 None, lr)] 的列表。
    resume_path：每次评估时（以及 Ctrl-C 时，在两步之间）把 (模型, 优化器, 步数, 曲线) 存到这里；
        文件存在且配置一致就从那里接着训。Ctrl-C：存好续训文件，一行话退出（SystemExit）。
    progress：tqdm 进度条（tokens/s、ETA）。
    种子：torch.manual_seed(tc.seed) 决定初始化，数据第 s 步的种子见 TrainConfig。
    """
    model, curve, _session = _train(cfg, tc, lang, progress, resume_path, desc, log)
    return model, curve


def _train(cfg, tc, lang, progress, resume_path, desc, log):
    """train_model 的实体；另返回这一段的 {start, seconds, seconds_before}（tokens/s 只按这一段算）。"""
    _check_train_args(cfg, tc, lang, progress, resume_path, desc, log)
    torch.manual_seed(tc.seed)
    model = ModernLM(cfg)
    opt = make_optimizer(model, tc)
    start, curve, before = 0, [], 0.0
    store = name = None
    if resume_path:
        store, name = CheckpointStore.for_resume(resume_path, "train_model")
    run_cfg = {"model": cfg.to_dict(), "train": tc.to_dict()}
    if name:
        start, meta = store.load_resume(name, model, opt, run_cfg, log=log)
        if meta is not None:
            curve, before = [tuple(r) for r in meta["curve"]], float(meta["seconds"])
    bar = _progress(tc.steps, start, tc.batch * tc.seq, desc or cfg.name, progress)
    t0 = time.perf_counter()

    def save(step):
        if name:
            store.save_resume(name, model, opt, step, run_cfg,
                              {"curve": curve, "seconds": before + time.perf_counter() - t0})
    model.train()
    with stop_on_ctrl_c() as stop:
        for step in range(start, tc.steps):
            if stop.requested:
                save(step)
                bar.close()
                raise interrupted(desc or cfg.name, step, tc.steps, resume_path or "（没有续训文件）")
            for g in opt.param_groups:
                g["lr"] = lr_at(step, tc)
            tokens, _ = lang.sample(tc.batch, tc.seq, tc.seed * 1_000_000 + step)
            loss = lm_loss(model, tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip)
            opt.step()
            row = (step + 1, loss.item(), None, lr_at(step, tc))          # (步数, train 损失, eval 损失, 学习率)
            if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
                row = row[:2] + (evaluate(model, lang, tc.seq, tc.eval_batches)[0],) + row[3:]
            curve.append(row)
            if row[2] is not None:
                save(step + 1)
            bar.update(1)
            bar.set_postfix(loss=f"{row[1]:.3f}", **({"eval": f"{row[2]:.3f}"} if row[2] is not None else {}))
    bar.close()
    model.eval()
    return model, curve, {"start": start, "seconds": time.perf_counter() - t0, "seconds_before": before}


def _progress(total, start, tokens_per_step, desc, enabled):
    """tqdm 进度条（按步计数，ETA 由 tqdm 估计），后缀里另写 tokens/s。"""
    from tqdm.auto import tqdm
    bar = tqdm(total=total, initial=start, desc=desc, disable=not enabled, mininterval=1.0, dynamic_ncols=True)
    return _StepBar(bar, tokens_per_step)


class _StepBar:
    """按"步"更新的 tqdm，后缀里写 tokens/s（tqdm 自己的速度是 步/s，对读者不直观）。"""

    def __init__(self, bar, tokens_per_step):
        self.bar, self.tps, self.t0, self.n0 = bar, tokens_per_step, time.perf_counter(), bar.n

    def update(self, n):
        self.bar.update(n)

    def set_postfix(self, **kw):
        dt = time.perf_counter() - self.t0
        if dt > 0 and self.bar.n > self.n0:
            kw["tok/s"] = f"{(self.bar.n - self.n0) * self.tps / dt:,.0f}"
        self.bar.set_postfix(kw, refresh=False)

    def close(self):
        self.bar.close()


# =============================================================================
# 输入检查（放在教学代码下面）
# =============================================================================
def _check_config(cfg):
    where = "LMConfig"
    for f in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_ff", "max_seq"):
        object.__setattr__(cfg, f, check_int(f, getattr(cfg, f), lo=1, where=where))
    object.__setattr__(cfg, "window", check_int("window", cfg.window, lo=0, where=where))
    check_choice("norm", cfg.norm, NORMS, where=where)
    check_choice("norm_place", cfg.norm_place, NORM_PLACES, where=where)
    check_choice("mlp", cfg.mlp, MLPS, where=where)
    check_choice("pos", cfg.pos, POSITIONS, where=where)
    check_bool("tied", cfg.tied, where=where)
    object.__setattr__(cfg, "rope_base", check_real("rope_base", cfg.rope_base, lo=1.0, lo_open=True, where=where))
    object.__setattr__(cfg, "norm_eps", check_real("norm_eps", cfg.norm_eps, lo=0.0, lo_open=True, where=where))
    if cfg.n_heads % cfg.n_kv_heads:
        ok = [g for g in range(1, cfg.n_heads + 1) if cfg.n_heads % g == 0]
        raise ValueError(f"{where}：n_heads={cfg.n_heads} 必须是 n_kv_heads={cfg.n_kv_heads} 的整数倍"
                         f"（每组 K/V 服务 n_heads/n_kv_heads 个查询头；可选的 n_kv_heads：{ok}）")
    if cfg.pos == "rope" and cfg.d_head % 2:
        raise ValueError(f"{where}：pos='rope' 要求 d_head 为偶数（RoPE 把分量两两配对旋转），收到 d_head={cfg.d_head}")
    if cfg.pos == "sinusoidal" and cfg.d_model % 2:
        raise ValueError(f"{where}：pos='sinusoidal' 要求 d_model 为偶数（sin、cos 成对），收到 d_model={cfg.d_model}")


def _check_ids(ids, cfg, name="ids"):
    if not torch.is_tensor(ids) or ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32):
        what = f"{tuple(ids.shape)} {ids.dtype}" if torch.is_tensor(ids) else type(ids).__name__
        raise TypeError(f"{name} 必须是 [B, T] 的整数张量（int64 / int32），收到 {what}")
    if ids.numel() == 0:
        raise ValueError(f"{name} 不能是空的，收到形状 {tuple(ids.shape)}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.vocab:
        raise ValueError(f"{name} 的 token id 必须在 [0, vocab={cfg.vocab}) 内，收到最小 {lo}、最大 {hi}")


def _check_cache(cache, cfg, ids):
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(f"ModernLM.forward：cache 必须是 KVCache 或 None，收到 {type(cache).__name__}")
    if cache.cfg != cfg:
        raise ValueError("ModernLM.forward：cache 是为另一个配置建的（KVCache(model.cfg)）")
    if cache.k[0] is not None and cache.k[0].shape[0] != ids.shape[0]:
        raise ValueError(f"ModernLM.forward：ids 的批大小 {ids.shape[0]} 与 cache 里的 {cache.k[0].shape[0]} 不同")


def _check_keys(where, given, dataclass_type):
    """配置里拼错的键（{'sede': 7}）要报错，不能悄悄忽略：列出不认识的和允许的。"""
    allowed = [f.name for f in dataclasses.fields(dataclass_type)]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"{where}：不认识的配置键 {unknown}；允许的键：{allowed}")


def _check_train_config(tc):
    where = "TrainConfig"
    for f, lo in (("steps", 1), ("batch", 1), ("seq", 1), ("warmup", 0), ("eval_every", 1), ("eval_batches", 1)):
        object.__setattr__(tc, f, check_int(f, getattr(tc, f), lo=lo, where=where))
    object.__setattr__(tc, "seed", check_torch_seed("seed", tc.seed, where=where))
    for f in ("lr", "clip"):       # clip = 0 会把每步的梯度都裁成 0：模型一步也不动
        object.__setattr__(tc, f, check_real(f, getattr(tc, f), lo=0.0, lo_open=True, where=where))
    object.__setattr__(tc, "min_lr_frac", check_real("min_lr_frac", tc.min_lr_frac, lo=0.0, hi=1.0, where=where))
    object.__setattr__(tc, "weight_decay", check_real("weight_decay", tc.weight_decay, lo=0.0, where=where))


def _check_train_args(cfg, tc, lang, progress, resume_path, desc, log):
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"train_model：cfg 必须是 LMConfig，收到 {type(cfg).__name__}")
    _check_tc("train_model", tc)
    if not isinstance(lang, ChunkCopyLanguage):
        raise TypeError(f"train_model：lang 必须是 ChunkCopyLanguage，收到 {type(lang).__name__}")
    if lang.vocab > cfg.vocab:
        raise ValueError(f"train_model：语言的词表 {lang.vocab} 大于模型的 cfg.vocab={cfg.vocab}")
    check_bool("progress", progress, where="train_model")
    if resume_path is not None and not isinstance(resume_path, (str, os.PathLike)):   # 整数会被 os.path 当成文件描述符
        raise TypeError(f"train_model：resume_path 必须是路径（str）或 None，收到 {type(resume_path).__name__}")
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"train_model：desc 必须是 str 或 None，收到 {type(desc).__name__}")
    if not callable(log):
        raise TypeError(f"train_model：log 必须是可调用的（如 print），收到 {type(log).__name__}")
    _check_model_fits("train_model", cfg, copies=4)
    _check_forward_fits("train_model", "[tc.batch, tc.seq]", cfg, tc.batch, tc.seq, tc.seq, False, 4, train=True)


def _check_eval_args(where, model, lang, seq, batch, seed, n_batches=1):
    if not isinstance(model, ModernLM):
        raise TypeError(f"{where}：model 必须是 ModernLM，收到 {type(model).__name__}")
    if not isinstance(lang, ChunkCopyLanguage):
        raise TypeError(f"{where}：lang 必须是 ChunkCopyLanguage，收到 {type(lang).__name__}")
    check_int("seq", seq, lo=1, where=where)
    check_int("batch", batch, lo=1, where=where)
    check_int("n_batches", n_batches, lo=1, where=where)      # 0 批：np.mean([]) 是 NaN
    check_int("seed", seed, lo=0, where=where)
    if lang.vocab > model.cfg.vocab:
        raise ValueError(f"{where}：语言的词表 {lang.vocab} 大于模型的 vocab={model.cfg.vocab}")
    _check_forward_fits(where, "[batch, seq]", model.cfg, batch, seq, seq, False, _elem(model))


def _check_width(name, value, lo, where, bytes_per=4):
    """一维的宽度（d、d_model …）：整数 ≥ lo，而且 bytes_per·value 字节放得进内存。"""
    value = check_int(name, value, lo=lo, where=where)
    check_memory(f"{name}={value}", bytes_per * value, where)
    return value


def _check_mlp_sizes(d_model, d_ff, n_mats, where):
    d_model = check_int("d_model", d_model, lo=1, where=where)
    d_ff = check_int("d_ff", d_ff, lo=1, where=where)
    check_memory(f"{n_mats} 个 d_model × d_ff = {d_model} × {d_ff} 的矩阵（float32）", 4 * n_mats * d_model * d_ff,
                 where)
    return d_model, d_ff


def _check_features(x, d, where):
    """模块前向的输入：浮点张量、最后一维 = d（整数张量进 RMSNorm 会被截断回整数，进 Linear 是 torch 深处的报错）。"""
    _check_last_dim(x, d, where)
    if not x.is_floating_point():
        raise TypeError(f"{where}：输入 x 必须是浮点张量，收到 dtype={x.dtype}")


def _check_cfg_type(where, cfg):
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"{where} 需要 LMConfig，收到 {type(cfg).__name__}")


def _n_params(cfg):
    d, dh = cfg.d_model, cfg.d_head
    per_layer = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * dh + cfg.n_heads * dh * d + \
        (3 if cfg.mlp == "swiglu" else 2) * d * cfg.d_ff + 4 * d
    return cfg.vocab * d * (1 if cfg.tied else 2) + (cfg.max_seq * d if cfg.pos == "learned" else 0) + \
        cfg.n_layers * per_layer + 2 * d


def _check_model_fits(where, cfg, copies=1):
    """copies = 4：训练时参数、梯度和 AdamW 的两份状态。"""
    n = _n_params(cfg)
    check_memory(f"cfg（vocab={cfg.vocab}、d_model={cfg.d_model}、n_layers={cfg.n_layers}、d_ff={cfg.d_ff}）"
                 f"的 {n:,} 个参数（float32{'，× 4：参数、梯度、AdamW 的两份状态' if copies == 4 else ''}）",
                 4 * n * copies, where)


def _elem(model):
    return next(model.parameters()).element_size()


def _check_forward_fits(where, what, cfg, B, T, S, cached, elem, train=False):
    """一次前向的激活（[B, T, ·] 的几份）加上显式的注意力偏置 / 分数（[H, T, S]：窗口、ALiBi、带 cache 时）。"""
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    per_token = 2 * cfg.d_model + (H + 4 * G) * dh + 3 * cfg.d_ff + 2 * cfg.vocab
    n = B * T * per_token * elem * (cfg.n_layers + 1 if train else 2)
    if cfg.window or cfg.pos == "alibi" or cached:
        n += T * S * (8 + 2 * elem * (H if cfg.pos == "alibi" else 1)) + 2 * B * H * T * S * elem
    check_memory(f"{what} = [{B}, {T}]（键 {S} 个）的激活与注意力分数", n, where)


def _check_block_args(where, x, pos0, cache, layer, cfg):
    _check_features(x, cfg.d_model, where)
    if x.ndim != 3:
        raise ValueError(f"{where}：x 必须是 [B, T, d_model] 的三维张量，收到形状 {tuple(x.shape)}")
    pos0 = check_int("pos0", pos0, lo=0, where=where)
    check_int("layer", layer, lo=0, hi=cfg.n_layers - 1, where=where)
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"{where}：cache 必须是 KVCache 或 None，收到 {type(cache).__name__}")
        if cache.cfg != cfg:
            raise ValueError(f"{where}：cache 是为另一个配置建的（KVCache(model.cfg)）")
        have = cache.pos[layer]
        want = cache.length if have is None else int(have[-1]) + 1 if have.numel() else cache.length
        if pos0 != want:
            raise ValueError(f"{where}：pos0={pos0} 必须接在 cache 第 {layer} 层已有的位置之后，即 pos0={want}")
        if cache.k[layer] is not None and cache.k[layer].shape[0] != x.shape[0]:
            raise ValueError(f"{where}：x 的批大小 {x.shape[0]} 与 cache 里的 {cache.k[layer].shape[0]} 不同")
    _check_forward_fits(where, "x 的 [B, T]", cfg, x.shape[0], x.shape[1], pos0 + x.shape[1], cache is not None,
                        x.element_size())
    return pos0


def _check_generate_fits(cfg, prompt, n_new, use_cache):
    B, P = prompt.shape
    total = P + n_new
    if cfg.pos == "learned" and n_new and total - 1 > cfg.max_seq:
        raise ValueError(f"generate：prompt 长 {P}、n_new={n_new}：最后一步要读 {total - 1} 个位置，超过位置表的 "
                         f"max_seq={cfg.max_seq} 行（n_new ≤ {cfg.max_seq - P + 1}）")
    kept = min(total, cfg.window) if cfg.window else total
    n = 4 * n_new * B * cfg.vocab + 8 * B * total + 2 * 4 * cfg.n_layers * B * cfg.n_kv_heads * cfg.d_head * kept
    check_memory(f"prompt [B, P] = [{B}, {P}]、n_new={n_new} 的逐步 logits 与 KV cache", n, "generate")
    if n_new:
        T = 1 if use_cache else total - 1
        _check_forward_fits("generate", "prompt + n_new 的 [B, T]", cfg, B, T, total - 1, use_cache, 4)


def _check_tc(where, tc):
    if not isinstance(tc, TrainConfig):
        raise TypeError(f"{where}：tc 必须是 TrainConfig，收到 {type(tc).__name__}")


def _check_tokens(tokens, vocab, where, min_len):
    """[n, L] 的整数 token（L ≥ min_len），id 在 [0, vocab) 里。"""
    if not torch.is_tensor(tokens) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        what = f"{tuple(tokens.shape)} {tokens.dtype}" if torch.is_tensor(tokens) else type(tokens).__name__
        raise TypeError(f"{where}：tokens 必须是 [n, L] 的整数张量（int64 / int32），收到 {what}")
    if tokens.shape[0] < 1 or tokens.shape[1] < min_len:
        raise ValueError(f"{where}：tokens 至少要 1 行、{min_len} 列，收到形状 {tuple(tokens.shape)}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{where}：tokens 的 id 必须在 [0, vocab={vocab}) 内，收到最小 {lo}、最大 {hi}")


_L02_FIELDS = ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_ff", "max_seq", "rope_theta",
               "norm_eps", "tied")


def _check_lecture02(params, cfg02):
    """第 2 讲的 (params, cfg)：字段齐全、每个数组的形状对得上、全是有限浮点数（否则 copy_ 在 torch 深处报错）。"""
    w = "from_lecture02"
    missing = [f for f in _L02_FIELDS if not hasattr(cfg02, f)]
    if missing:
        raise TypeError(f"{w}：cfg02 需要 transformer_lab.Config 的字段，{type(cfg02).__name__} 缺少 {missing}")
    check_bool("cfg02.tied", cfg02.tied, where=w)
    if not isinstance(params, dict):
        raise TypeError(f"{w}：params 必须是 transformer_lab.init_params 的 dict，收到 {type(params).__name__}")
    d, V, dh, H, G, ff = cfg02.d_model, cfg02.vocab, cfg02.d_head, cfg02.n_heads, cfg02.n_kv_heads, cfg02.d_ff
    want = [("embed", params.get("embed"), (V, d)), ("final_norm", params.get("final_norm"), (d,))]
    if not cfg02.tied:
        want.append(("lm_head", params.get("lm_head"), (d, V)))
    layers = params.get("layers")
    if not isinstance(layers, (list, tuple)) or len(layers) != cfg02.n_layers:
        raise ValueError(f"{w}：params['layers'] 必须是 n_layers={cfg02.n_layers} 个 dict 的列表，"
                         f"收到 {type(layers).__name__}"
                         + (f"（{len(layers)} 个）" if isinstance(layers, (list, tuple)) else ""))
    shapes = dict(attn_norm=(d,), mlp_norm=(d,), wq=(d, H * dh), wk=(d, G * dh), wv=(d, G * dh), wo=(H * dh, d),
                  w_gate=(d, ff), w_up=(d, ff), w_down=(ff, d))
    for i, lp in enumerate(layers):
        if not isinstance(lp, dict):
            raise TypeError(f"{w}：params['layers'][{i}] 必须是 dict，收到 {type(lp).__name__}")
        want += [(f"layers'][{i}]['{k}", lp.get(k), shape) for k, shape in shapes.items()]
    for key, a, shape in want:
        arr = np.asarray(a) if a is not None else None
        if arr is None or arr.dtype.kind != "f" or arr.shape != shape:
            got = "缺失" if arr is None else f"形状 {arr.shape}、dtype={arr.dtype}"
            raise ValueError(f"{w}：params['{key}'] 必须是形状 {shape} 的浮点数组，收到 {got}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{w}：params['{key}'] 含 NaN 或 ∞")


def _check_length(cfg, total):
    if cfg.pos == "learned" and total > cfg.max_seq:
        raise ValueError(f"序列长度 {total}（含 cache）超过学出来的位置表的 max_seq={cfg.max_seq} 行："
                         "pos='learned' 没有更远位置的向量；换 rope / alibi / none / sinusoidal，或加大 max_seq 重训")


def _check_last_dim(x, d, where):
    if not torch.is_tensor(x) or x.ndim < 1 or x.shape[-1] != d:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"{where}：输入 x 的最后一维必须是 {d}，收到 {shape}")


def _check_bias_args(q_pos, k_pos, window, slopes, dtype):
    where = "attn_bias"
    for name, t in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not torch.is_tensor(t) or t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            what = f"形状 {tuple(t.shape)}、dtype={t.dtype}" if torch.is_tensor(t) else type(t).__name__
            raise TypeError(f"{where}：{name} 必须是一维整数张量（绝对位置），收到 {what}")
    window = check_int("window", window, lo=0, where=where)     # 负的窗口会把每个键都掩掉（整行 −∞）
    if slopes is not None and (not torch.is_tensor(slopes) or slopes.ndim != 1 or not slopes.is_floating_point()):
        raise TypeError(f"{where}：slopes 必须是 None 或一维浮点张量 [H]")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{where}：dtype 必须是浮点 dtype，收到 {dtype!r}")
    T, S, H = q_pos.numel(), k_pos.numel(), 1 if slopes is None else slopes.numel()
    check_memory(f"q_pos × k_pos = {T} × {S} 对（int64 距离、布尔掩码、{H} 份偏置）",
                 T * S * (8 + 2 + 2 * H * torch.empty(0, dtype=dtype).element_size()), where)
    return window


def _check_rope_dim(dim, where, name="dim"):
    dim = check_int(name, dim, lo=2, where=where)
    if dim % 2:
        what = "每个头的维度 dim" if name == "dim" else "表的宽度，即 dim"
        raise ValueError(f"{where}：{name}（{what}）必须是偶数——分量两两配对（RoPE 旋转 / sin、cos 成对），收到 {dim}")
    return dim


def _check_positions(positions):
    try:
        pos = torch.as_tensor(positions)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"rope_angles：positions 必须是一维的实数位置（张量或数的列表），"
                        f"收到 {positions!r:.80}") from None
    if pos.ndim != 1:
        raise ValueError(f"rope_angles：positions 必须是一维的位置序列，收到形状 {tuple(pos.shape)}")
    if pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"rope_angles：positions 必须是实数位置，收到 dtype={pos.dtype}")
    if pos.dtype in (torch.float16, torch.bfloat16):    # bf16 里 256 和 257 是同一个数：位置已经丢了
        raise TypeError(f"rope_angles：positions 必须是整数或 float32 / float64（{pos.dtype} 表示不了大的位置："
                        "bf16 在 256 以上、fp16 在 2048 以上相邻整数会并成一个），收到 dtype={pos.dtype}")
    if pos.is_floating_point() and not torch.isfinite(pos).all():
        raise ValueError("rope_angles：positions 必须全是有限数（不能含 NaN / ±∞）")
    return pos


def _check_rope_shapes(x, cos, sin, where):
    if not torch.is_tensor(x) or x.ndim < 2 or x.shape[-1] % 2:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"{where}：x 应为 [..., T, dim] 且 dim 为偶数（每个头的维度），收到 {shape}")
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):     # 整数张量会把 cos / sin 截成 0、±1
        if not torch.is_tensor(t) or not t.is_floating_point():
            what = f"dtype={t.dtype}" if torch.is_tensor(t) else type(t).__name__
            raise TypeError(f"{where}：{name} 必须是浮点张量，收到 {what}")
    want = (x.shape[-2], x.shape[-1] // 2)
    if tuple(cos.shape) != want or tuple(sin.shape) != want:
        raise ValueError(f"{where}：cos / sin 应为 [T, dim/2] = {list(want)}（x 形状 {tuple(x.shape)}），"
                         f"收到 {tuple(cos.shape)} / {tuple(sin.shape)}")


# =============================================================================
# 7. 入库的检查点
# =============================================================================
LANG = dict(n_letters=32, chunk=8, max_back=4, p_copy=0.5, n_succ=4, seed=1234)   # 所有检查点用的语言
MODERN = LMConfig(vocab=32 + 1 + 4, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_head=16, d_ff=172,
                  max_seq=256, name="modern")
BASELINE = config_like(MODERN, norm="layer", mlp="gelu", d_ff=mlp_width(172, "gelu"), pos="learned",
                       n_kv_heads=4, name="baseline")
TRAIN = TrainConfig()


def _variants():
    """检查点名 → 配置。modern 是现代栈（RMSNorm、SwiGLU、RoPE、GQA 4 头 2 组）；其余每个只改一处。"""
    m = MODERN
    return {
        "modern": m,
        "baseline": BASELINE,
        "modern_layernorm": config_like(m, norm="layer", name="modern_layernorm"),
        "modern_gelu": config_like(m, mlp="gelu", d_ff=mlp_width(m.d_ff, "gelu"), name="modern_gelu"),
        "modern_learned": config_like(m, pos="learned", name="modern_learned"),
        "modern_alibi": config_like(m, pos="alibi", name="modern_alibi"),
        "modern_nope": config_like(m, pos="none", name="modern_nope"),
        "modern_mha": config_like(m, n_kv_heads=4, name="modern_mha"),
        "modern_mqa": config_like(m, n_kv_heads=1, name="modern_mqa"),
        "modern_window16": config_like(m, window=16, name="modern_window16"),
        "modern_seed1": config_like(m, name="modern_seed1"),     # 同一配置换种子：量"种子带来的波动"
        "modern_seed2": config_like(m, name="modern_seed2"),
    }


CHECKPOINTS = _variants()
SEED_REPEATS = {"modern_seed1": 1, "modern_seed2": 2}   # 这几个检查点用别的种子（初始化和数据流都换）


def train_config(name):
    """检查点 name 的训练设置：TRAIN，种子重复的那几个只换 seed。"""
    check_choice("name", name, tuple(CHECKPOINTS), where="train_config")
    return dataclasses.replace(TRAIN, seed=SEED_REPEATS[name]) if name in SEED_REPEATS else TRAIN
QUICK_TRAIN = TrainConfig(steps=30, batch=8, seq=64, warmup=5, eval_every=30, eval_batches=1)


def language():
    return ChunkCopyLanguage(**LANG)


def _store(ckpt_dir):
    return CheckpointStore(ckpt_dir, "python3 lecture04/train_checkpoints.py")


def _run_config(name, tc):
    """决定一个检查点的一切：模型配置、训练设置、语言。manifest 里记它，核对时逐项比。"""
    return {"model": CHECKPOINTS[name].to_dict(), "train": tc.to_dict(), "lang": LANG}


def verify_checkpoint(name, ckpt_dir=CKPT_DIR, tc=None):
    """
    检查一个入库的检查点能不能用，返回 (model 或 None, 原因)；原因以 "ok" 开头就能用。
    要求：配置、训练设置、语言与代码里的逐项相同（不同时原因里写出哪几项，旧 → 新）、每个文件的 SHA-256
    对得上、state_dict 装得进模型。manifest 缺失或坏了：只核对文件本身（原因写明，没有训练记录）。
    """
    model, why, _record = checkpoint_record(name, ckpt_dir, tc)
    return model, why


def checkpoint_record(name, ckpt_dir=CKPT_DIR, tc=None):
    """同 verify_checkpoint，另外返回训练记录：(model 或 None, 原因, 记录或 None)；记录只在 seal 对得上时给出。"""
    cfg = CHECKPOINTS[check_choice("name", name, tuple(CHECKPOINTS), where="verify_checkpoint")]
    tc = train_config(name) if tc is None else tc
    return _store(ckpt_dir).verify(name, _run_config(name, tc), lambda: ModernLM(cfg))


def read_curve(name, ckpt_dir=CKPT_DIR):
    """检查点的损失曲线：[(step, train_loss, eval_loss 或 None, lr)]。"""
    out = []
    with open(os.path.join(ckpt_dir, f"{name}_curve.csv"), encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out.append((int(row["step"]), float(row["train_loss"]),
                        float(row["eval_loss"]) if row["eval_loss"] else None, float(row["lr"])))
    return out


def train_and_save(name, ckpt_dir=CKPT_DIR, tc=None, progress=True, log=print):
    """
    训练一个检查点并写入 ckpt_dir：<name>.pt（纯 state_dict）、<name>_curve.csv、manifest.json 里的一项。
    中断过的（<name>.resume.pt）接着训；seconds 是累计训练秒数，tokens_per_s 只按这一次运行实际跑的步数算。
    """
    progress = check_bool("progress", progress, where="train_and_save")
    cfg = CHECKPOINTS[check_choice("name", name, tuple(CHECKPOINTS), where="train_and_save")]
    tc = train_config(name) if tc is None else tc
    os.makedirs(ckpt_dir, exist_ok=True)
    store, lang = _store(ckpt_dir), language()
    resume = store.path(name, ".resume.pt")
    model, curve, session = _train(cfg, tc, lang, progress, resume, name, log)
    ev, opt = evaluate(model, lang, tc.seq, n_batches=8)
    csv_path = os.path.join(ckpt_dir, f"{name}_curve.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_loss", "eval_loss", "lr"])
        for step, tl_, el, lr in curve:
            w.writerow([step, f"{tl_:.5f}", "" if el is None else f"{el:.5f}", f"{lr:.3e}"])
    tail = [r[1] for r in curve[-50:]]
    ran = tc.steps - session["start"]                     # 这一次运行实际跑的步数
    record = {"steps": tc.steps, "final_train_loss": round(float(np.mean(tail)), 5), "final_eval_loss": round(ev, 5),
              "optimal_loss": round(opt, 5), "seconds": round(session["seconds_before"] + session["seconds"], 1),
              "tokens_per_s": round(ran * tc.batch * tc.seq / max(session["seconds"], 1e-9)), "seed": tc.seed,
              "n_params": model.n_params()}
    store.save(name, model.state_dict(), _run_config(name, tc), record, extra_files=[csv_path])
    store.drop_resume(name)
    return model, record


def load_or_train(name, quick=False, ckpt_dir=CKPT_DIR, log=print, tc=None, progress=True):
    """
    演示用：入库的检查点能用就装载（并说一声）；缺失、损坏或配置不符时警告并重训（tqdm 进度条）。
    quick=True：检查点能用照样装载（只读）；不能用时只在内存里训 QUICK_TRAIN 的几十步，从不写 checkpoints/。
    返回 (model, info)；info 有 "source"（"checkpoint" / "retrained" / "quick"）、"steps" 和训练记录里的数字
    （只有 seal 对得上的；manifest 缺失或数字被改过时没有，steps 为 None）。
    """
    quick = check_bool("quick", quick, where="load_or_train")
    progress = check_bool("progress", progress, where="load_or_train")
    model, why, record = checkpoint_record(name, ckpt_dir, tc)
    if model is not None:
        if record is not None:
            log(f"  装载检查点 {name}.pt（{record['steps']} 步，eval 损失 {record['final_eval_loss']:.3f}，"
                f"配置与 SHA-256 已核对）")
            return model, dict(record, source="checkpoint")
        log(f"  装载检查点 {name}.pt（{why}）")
        return model, {"source": "checkpoint", "steps": None}
    if quick:
        log(f"  [--quick] 检查点 {name} 不可用（{why}）：只在内存里训 {QUICK_TRAIN.steps} 步，不写文件")
        quick_tc = dataclasses.replace(QUICK_TRAIN, seed=train_config(name).seed)
        model, curve = train_model(CHECKPOINTS[name], quick_tc, language(), progress=False)
        return model, {"source": "quick", "steps": QUICK_TRAIN.steps, "curve": curve}
    warnings.warn(f"检查点 {name} 不可用（{why}）：重新训练（2 核 CPU 上约 2–5 分钟）", stacklevel=2)
    model, record = train_and_save(name, ckpt_dir, tc, progress=progress, log=log)
    return model, dict(record, source="retrained")


# =============================================================================
# 自检
# =============================================================================
def _attention_reference(q, k, v, q_pos, k_pos, window, slopes):
    """独立的参考：float64、逐头显式 softmax（不经 SDPA、不经 attn_bias）。q [B, H, T, dh]，k/v [B, H, S, dh]。"""
    B, H, T, dh = q.shape
    out = torch.empty_like(q)
    for h in range(H):
        for i in range(T):
            scores = []
            for j in range(k.shape[2]):
                d = int(q_pos[i] - k_pos[j])
                ok = d >= 0 and (window == 0 or d < window)
                pen = 0.0 if slopes is None else float(slopes[h]) * d
                dot = (q[:, h, i] * k[:, h, j]).sum(-1)                # [B]
                scores.append(dot / math.sqrt(dh) - pen if ok else torch.full((B,), -math.inf, dtype=q.dtype))
            w = torch.softmax(torch.stack(scores, dim=-1), dim=-1)    # [B, S]
            out[:, h, i] = torch.einsum("bs,bsd->bd", w, v[:, h])
    return out


def _selftest():
    import tempfile
    t0 = time.perf_counter()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    f64 = torch.float64

    # 1) 两种 RoPE 配对只差一个排列；交错版 = 第 2 讲 numpy 的 apply_rope
    sys.path.insert(0, os.path.join(HERE, "..", "lecture02"))
    import transformer_lab as tl
    x = torch.randn(2, 3, 11, 14, dtype=f64, generator=gen)          # [B, H, T, dh]，不规则的尺寸
    pos = torch.arange(5, 16, dtype=f64)
    cos, sin = rope_angles(pos, 14, 500.0)
    perm = half_to_interleaved(14)
    err_perm = (apply_rope_half(x[..., perm], cos, sin) - apply_rope_interleaved(x, cos, sin)[..., perm]).abs().max()
    c_np, s_np = tl.rope_angles(pos.numpy(), 14, 500.0)
    ref = tl.apply_rope(x.transpose(1, 2).numpy(), c_np, s_np)       # numpy 版要 [B, T, H, dh]
    err_np = np.abs(apply_rope_interleaved(x, cos, sin).transpose(1, 2).numpy() - ref).max()
    assert err_perm < 1e-12 and err_np < 1e-12, (err_perm, err_np)

    # 2) 第 2 讲 TINY 的 numpy 权重装进我们的 torch 模型：float64 下 logits 一致
    params = tl.init_params(tl.TINY, seed=3)
    ids = np.random.default_rng(4).integers(0, tl.TINY.vocab, size=(2, 13))
    ours = from_lecture02(params, tl.TINY)
    err_tiny = (ours(torch.from_numpy(ids)) - torch.from_numpy(tl.forward(params, tl.TINY, ids))).abs().max().item()
    assert err_tiny < 1e-10, err_tiny

    # 3) 注意力对照逐头显式 softmax（GQA + 滑动窗口 + ALiBi，带 cache 的键位置）
    cfg = LMConfig(vocab=23, d_model=30, n_layers=2, n_heads=6, n_kv_heads=2, d_head=6, d_ff=40, pos="alibi",
                   window=5)
    attn = Attention(cfg).double()
    xa = torch.randn(2, 9, 30, dtype=f64, generator=gen)
    got = attn(xa)
    q = attn.wq(xa).view(2, 9, 6, 6).transpose(1, 2)
    k = attn.wk(xa).view(2, 9, 2, 6).transpose(1, 2).repeat_interleave(3, dim=1)
    v = attn.wv(xa).view(2, 9, 2, 6).transpose(1, 2).repeat_interleave(3, dim=1)
    ar = torch.arange(9)
    want = attn.wo(_attention_reference(q, k, v, ar, ar, 5, alibi_slopes(6)).transpose(1, 2).reshape(2, 9, 36))
    err_attn = (got - want).abs().max().item()
    assert err_attn < 1e-12, err_attn

    # 4) 带 / 不带 KV cache 的贪心生成相同（几种位置方案、窗口、MQA）；GQA 展开成 MHA 后 logits 相同
    errs = []
    for kw in (dict(pos="rope", n_kv_heads=2), dict(pos="alibi", window=4, n_kv_heads=1),
               dict(pos="learned", norm="layer", mlp="gelu", norm_place="post"), dict(pos="sinusoidal", tied=True),
               dict(pos="none", window=1)):
        m = ModernLM(LMConfig(vocab=19, d_model=24, n_layers=2, n_heads=4, d_head=6, d_ff=20, max_seq=32, **kw))
        m = m.double()
        prompt = torch.randint(0, 19, (3, 5), generator=gen)
        a, la = generate(m, prompt, 9, use_cache=True)
        b, lb = generate(m, prompt, 9, use_cache=False)
        assert torch.equal(a, b), kw
        errs.append(max((x1 - x2).abs().max().item() for x1, x2 in zip(la, lb)))
    gqa = ModernLM(config_like(MODERN, vocab=19)).double()
    ids = torch.randint(0, 19, (2, 17), generator=gen)
    err_gqa = (gqa(ids) - expand_kv_heads(gqa)(ids)).abs().max().item()
    assert max(errs) < 1e-12 and err_gqa < 1e-12, (errs, err_gqa)

    # 5) 合成语言：复制块与它抄的块相同；真实概率是合法分布；最优损失 < 只会马尔可夫的损失
    lang = language()
    tokens, logp = lang.sample(16, 64, seed=7)
    assert np.allclose(lang.trans.sum(1), 1.0) and (logp <= 0).all()
    for r, t in zip(*np.nonzero((tokens[:, :-1] >= lang.C0).numpy())):
        back = (int(tokens[r, t]) - lang.C0 + 1) * lang.chunk
        assert torch.equal(tokens[r, t + 1:t + lang.chunk], tokens[r, t + 1 - back:t + lang.chunk - back])

    # 6) 训练几十步损失下降；检查点写入 → 核对通过；改一个字节 → 核对失败、load_or_train 警告并重训
    tiny = TrainConfig(steps=10, batch=4, seq=32, lr=1e-2, warmup=2, eval_every=10, eval_batches=1)
    with tempfile.TemporaryDirectory() as tmp:
        model, entry = train_and_save("modern", tmp, tiny, progress=False, log=lambda *_: None)
        curve = read_curve("modern", tmp)
        assert curve[-1][1] < curve[0][1] - 0.3, (curve[0], curve[-1])
        loaded, why = verify_checkpoint("modern", tmp, tiny)
        assert why == "ok" and all(torch.equal(p, q) for p, q in zip(model.state_dict().values(),
                                                                      loaded.state_dict().values()))
        path = os.path.join(tmp, "modern.pt")
        with open(path, "r+b") as f:
            f.seek(100)
            f.write(bytes([f.read(1)[0] ^ 0xFF]))
        assert verify_checkpoint("modern", tmp, tiny)[0] is None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, info = load_or_train("modern", ckpt_dir=tmp, tc=tiny, log=lambda *_: None, progress=False)
        assert info["source"] == "retrained" and any("重新训练" in str(w.message) for w in caught)
        assert verify_checkpoint("modern", tmp, tiny)[1] == "ok"

    # 7) 坏输入：报错写清参数与允许的取值
    for bad, exc in ((dict(n_heads=4, n_kv_heads=3), ValueError), (dict(pos="rotary"), ValueError),
                     (dict(d_head=7), ValueError), (dict(tied="no"), TypeError)):
        try:
            LMConfig(**bad)
        except exc:
            pass
        else:
            raise AssertionError(f"LMConfig({bad}) 应报 {exc.__name__}")
    learned = ModernLM(LMConfig(pos="learned", max_seq=8))
    for call in (lambda: learned(torch.zeros(1, 9, dtype=torch.long)), lambda: rope_angles(torch.arange(3), 7)):
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("应报 ValueError")

    rows = [["RoPE 半对半 vs 交错（排列后）", f"{err_perm:.1e}"], ["RoPE 交错 vs 第 2 讲 numpy", f"{err_np:.1e}"],
            ["第 2 讲 TINY logits（float64）", f"{err_tiny:.1e}"], ["注意力 vs 逐头显式 softmax", f"{err_attn:.1e}"],
            ["带 / 不带 KV cache（5 种配置）", f"{max(errs):.1e}"], ["GQA vs 展开成 MHA", f"{err_gqa:.1e}"]]
    print(format_table(["检查", "最大误差"], rows))
    print(f"modern_lm 自检通过（{time.perf_counter() - t0:.1f} s）：两种 RoPE、第 2 讲等价、注意力参考、KV cache、"
          "GQA、合成语言、检查点核对与重训、坏输入")


if __name__ == "__main__":
    _selftest()
