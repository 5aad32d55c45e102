"""
llm_math.py —— 第 1 讲：一个 token 到底要花多少？（不运行模型，只用公式）

【问题】给定一个 decoder-only Transformer 的结构（L 层、宽 d、H 个 query 头、G 个 KV 头、每头 dh、MLP 宽 f、词表 V），
    参数量是多少、和官方数字对得上吗？每个 token 要多少 FLOPs、多少字节的 KV cache？训练要多少算力、显存、时间？
    推理时 prefill（一次处理整段提示）和 decode（一次一个 token）的算术强度差多少、在某块芯片上要多久？
    后面的讲次都以这里为"账本"：第 2 讲真的运行模型、逐次记账再来对账；第 5、6 讲用它估每一步的时间。

【里面有什么】
    ModelConfig        结构 + 全部公式：按组的参数量、FLOPs/token、KV 字节/token、训练显存、一次前向的代价
    step_time / decode_time_per_token / decode_tokens_per_s / max_batch / train_time
                       把账本和芯片（hw_specs.Chip）结合起来：roofline 时间；放不下时报 CapacityError
    fit / chips_needed / FIT_RULES / MAX_CHIPS
                       全课程唯一的"放不放得下、要几张卡"规则（按可分配显存 alloc_bytes × MEM_UTIL）
    LLAMA32_1B … GPT3_175B、PRESETS、PUBLISHED_PARAMS、param_tolerance
                       真实模型的预设、官方公布的参数量和比较容差（出处键见 SOURCES.md）

【约定】
    - 一次乘加 = 2 FLOPs：x[M, K]·W[K, N] 是 2·M·K·N FLOPs。字节用十进制（1 GB = 10⁹），bytes_per_elem 默认 2（BF16）。
    - 结构按 Llama：RMSNorm（只有缩放）、RoPE（没有参数）、GQA、SwiGLU（3 个矩阵，3·d·f 个参数）。
      GPT-2/3 的两矩阵 GELU MLP（8d² 个参数）写成参数量、FLOPs 都相同的"等效 SwiGLU"：f = 8d/3；
      它们的偏置、LayerNorm 偏置、可学习位置编码记在 qkv_bias / n_pos / extra_per_layer / extra_final 里。
    - matmul_params = 每个 token 真正乘一遍的权重：注意力 4 个投影 + MLP + lm_head（和词嵌入共享也照样乘）。
    - 逐元素运算（归一化、RoPE、softmax、激活）的 FLOPs 不计：比矩阵乘小两三个数量级（第 2 讲会数出来）。

【运行】python3 lecture01/llm_math.py    # 自检：预设的参数量 = 官方数字（1% 内）、各个恒等式、坏输入报错
【依赖】只用 Python 标准库（同一文件夹的 course_utils.py）。
"""

import math
from dataclasses import dataclass, fields

# 格式化小工具的实现在同一文件夹的 course_utils.py；这里照旧导出，llm_math.format_table / fmt_si 等继续可用
from course_utils import display_width, fmt_bytes, fmt_count, fmt_si, fmt_time, format_table  # noqa: F401
# 参数检查（check_int / check_real）也在 course_utils：个数参数用 whole_float=True（15.6e12 这样的 token 数也算整数）
from course_utils import check_bool, check_choice, check_int, check_real

# =============================================================================
# 第 1 部分：模型结构与公式
# =============================================================================
_POSITIVE_INT_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "vocab")
_NONNEG_INT_FIELDS = ("n_pos", "extra_per_layer", "extra_final")


@dataclass(frozen=True)
class ModelConfig:
    """
    一个 decoder-only Transformer 的结构，以及"一个 token 花多少"的全部公式。

    【字段】
        name       ：名字（打印用）
        n_layers   ：层数 L
        d_model    ：残差流宽度 d
        n_heads    ：query 头数 H
        n_kv_heads ：K/V 头数 G（G = H 是多头注意力 MHA；1 < G < H 是分组查询注意力 GQA；G = 1 是多查询注意力 MQA）
        d_head     ：每个头的维度 dh（通常 d / H，但不必如此，例如 Llama-3.2-3B：d = 3072、H = 24、dh = 128）
        d_ff       ：SwiGLU MLP 的中间维 f
        vocab      ：词表大小 V
        tied       ：lm_head 是否和词嵌入共享同一个矩阵（共享时参数只算一次）
      可选（默认值不改变上面的语义）：
        qkv_bias        ：q/k/v 投影是否带偏置（Qwen2 / GPT-2 有）：每层多 (H + 2G)·dh 个参数
        n_pos           ：可学习的绝对位置编码有几行（GPT-2 是 1024、GPT-3 是 2048；RoPE 模型为 0）
        extra_per_layer ：每层还有多少"其它"参数
                          （例如 GPT-2 的输出投影偏置 d、MLP 偏置 4d + d、两个 LayerNorm 偏置 2d，共 8d）
        extra_final     ：层外还有多少"其它"参数（例如 GPT-2 最后一个 LayerNorm 的偏置 d）
    【边界】整数字段必须为正（不是整数 → TypeError，≤ 0 → ValueError）；tied、qkv_bias 必须是 True / False
        （TypeError）；n_heads 必须能被 n_kv_heads 整除（每组 K/V 服务 H/G 个 query 头），否则 ValueError。
    【Python 小知识】frozen=True 让对象不可修改（可以放进 set、当 dict 的键）；
        __post_init__ 在自动生成的 __init__ 之后运行。
    """
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    n_pos: int = 0
    extra_per_layer: int = 0
    extra_final: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"ModelConfig：name 必须是非空字符串（打印用），收到 {type(self.name).__name__} 类型的 "
                            f"{self.name!r}")
        # 课程约定（course_utils.check_int）：不是整数（2.5、"8"、True）→ TypeError；越界 → ValueError
        for f in _POSITIVE_INT_FIELDS + _NONNEG_INT_FIELDS:
            lo = 1 if f in _POSITIVE_INT_FIELDS else 0
            object.__setattr__(self, f, check_int(f, getattr(self, f), lo=lo, where=self.name))
        for f in ("tied", "qkv_bias"):            # "False" 是真值：不检查的话 tied='False' 会被当成共享
            object.__setattr__(self, f, check_bool(f, getattr(self, f), where=self.name))
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"{self.name}: n_heads={self.n_heads} 不能被 n_kv_heads={self.n_kv_heads} 整除"
                             f"（每组 K/V 头要服务整数个 query 头）")

    # ---- 几个派生量 ----------------------------------------------------------
    @property
    def group(self):
        """每组 K/V 头被几个 query 头共享：H / G（MHA = 1，MQA = H）。"""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self):
        """所有 query 头拼起来的宽度 H·dh（= Wq 的输出维 = Wo 的输入维）。"""
        return self.n_heads * self.d_head

    @property
    def kv_dim(self):
        """所有 K（或 V）头拼起来的宽度 G·dh（= Wk、Wv 的输出维）。"""
        return self.n_kv_heads * self.d_head

    # ---- 参数量 -----------------------------------------------------------------
    def layer_params(self):
        """
        一层的参数，按组拆开：{"attention", "mlp", "norms", "other"}。

        【公式】注意力：Wq d×H·dh + Wk、Wv 各 d×G·dh + Wo H·dh×d（有 qkv 偏置再加 (H+2G)·dh）；
            MLP：W_gate、W_up d×f，W_down f×d，共 3·d·f；归一化：两个 RMSNorm 的缩放向量 2·d；
            other：extra_per_layer。值都是 Python 整数。
        """
        # >>> 练习 1.1
        d = self.d_model
        attn = d * (self.q_dim + 2 * self.kv_dim) + self.q_dim * d
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return {"attention": attn, "mlp": 3 * d * self.d_ff, "norms": 2 * d, "other": self.extra_per_layer}
        # <<< 练习 1.1

    def param_groups(self):
        """
        整个模型的参数，按组拆开：{"embeddings", "attention", "mlp", "norms", "lm_head", "other"}。

        【边界】tied 时 lm_head 这一组是 0（矩阵算在 embeddings 里，不重复计数）；
            embeddings 包括可学习位置编码（n_pos·d）；norms 包括最后一个归一化层（d）；other 包括 extra_final。
        """
        # >>> 练习 1.1
        L, d, V = self.n_layers, self.d_model, self.vocab
        lp = self.layer_params()
        return {
            "embeddings": V * d + self.n_pos * d,
            "attention": L * lp["attention"],
            "mlp": L * lp["mlp"],
            "norms": L * lp["norms"] + d,
            "lm_head": 0 if self.tied else V * d,
            "other": L * lp["other"] + self.extra_final,
        }
        # <<< 练习 1.1

    def n_params(self):
        """参数总数（所有组之和）。和第 2 讲 transformer_lab.count_params(init_params(...)) 逐个元素数出来的相等。"""
        return sum(self.param_groups().values())

    def matmul_params(self):
        """
        每个 token 要"乘一遍"的权重个数：L·(注意力 4 个投影 + MLP 3 个矩阵) + lm_head 的 d·V。

        【和 n_params 的区别】不含词嵌入查表、位置编码、归一化和偏置（它们不是矩阵乘法）；
            含 lm_head —— 即使它和词嵌入共享，乘法照样要做。
        """
        d = self.d_model
        per_layer = d * (self.q_dim + 2 * self.kv_dim) + self.q_dim * d + 3 * d * self.d_ff
        return self.n_layers * per_layer + d * self.vocab

    def weight_bytes(self, bytes_per_elem=2.0):
        """权重占多少字节（显存占用）= n_params · bytes_per_elem。BF16 用 2，FP8 / INT8 用 1，INT4 用 0.5。"""
        check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True)
        return self.n_params() * bytes_per_elem

    # ---- 每个 token 的 FLOPs -----------------------------------------------------
    def linear_flops_per_token(self):
        """矩阵乘法部分：每个权重一次乘加 = 2 FLOPs，所以是 2 · matmul_params（和上下文长度无关）。"""
        return 2 * self.matmul_params()

    def attn_flops_per_token(self, ctx):
        """
        一个 query 对 ctx 个 key 做注意力：QKᵀ（每头 2·dh·ctx）+ PV（每头 2·dh·ctx），所有层、所有 query 头：
        4 · L · H · dh · ctx。

        【边界】ctx 是有限实数、≥ 0（ctx = 0 时为 0）；允许小数，因为训练时代入的是平均上下文 (seq_len + 1)/2。
            注意是 H 而不是 G：GQA 省的是 K/V 的存储和读取，不省注意力的运算。
        """
        check_real("ctx", ctx, lo=0.0)
        return 4 * self.n_layers * self.n_heads * self.d_head * ctx

    def flops_per_token(self, ctx):
        """在上下文长度 ctx 处生成一个 token 的前向 FLOPs = 矩阵乘法部分 + 注意力部分。"""
        return self.linear_flops_per_token() + self.attn_flops_per_token(ctx)

    def attn_crossover_ctx(self):
        """
        上下文多长时，注意力的 FLOPs 追上矩阵乘法的 FLOPs：4·L·H·dh·ctx = 2·matmul_params。

        【数字】Llama-3.1-8B 约 2.9 万个 token，70B 约 5.3 万，405B 约 9.8 万：模型越宽，注意力越"晚"成为大头。
        """
        return self.linear_flops_per_token() / (4 * self.n_layers * self.n_heads * self.d_head)

    # ---- KV cache -------------------------------------------------------------
    def kv_bytes_per_token(self, bytes_per_elem=2.0):
        """每个 token 在 KV cache 里占的字节：每层缓存这个 token 的 K 和 V（各 G 个头 × dh 维），
        每个数 bytes_per_elem 字节。
        GQA 的 H 个 query 头共享这 G 个 KV 头：缓存只存 G 个。"""
        check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True)
        # >>> 练习 1.2
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * bytes_per_elem
        # <<< 练习 1.2

    def kv_cache_bytes(self, batch, ctx, bytes_per_elem=2.0):
        """batch 个序列、每个 ctx 个 token 的 KV cache 总字节（随 batch、ctx 线性增长）。batch、ctx 是 ≥ 0 的整数。"""
        check_int("batch", batch, lo=0, whole_float=True)
        check_int("ctx", ctx, lo=0, whole_float=True)
        # >>> 练习 1.2
        return batch * ctx * self.kv_bytes_per_token(bytes_per_elem)
        # <<< 练习 1.2

    # ---- 一次前向（prefill / decode 通用）---------------------------------------
    def step_flops(self, batch, n_new, ctx=0):
        """
        一次前向的 FLOPs：batch 个序列，每个已有 ctx 个 token 在 KV cache 里，这次送进 n_new 个新 token。

        【公式】batch · n_new · 矩阵乘法/token + batch · Σ_{j=1..n_new} 注意力(ctx + j)
            （因果掩码：第 j 个新 token 看 ctx + j 个 key，只算"有用的"那一半。）
            prefill：batch = 1、n_new = 提示长度、ctx = 0；decode：n_new = 1。
        """
        check_int("batch", batch, lo=1, whole_float=True)
        check_int("n_new", n_new, lo=1, whole_float=True)
        check_int("ctx", ctx, lo=0, whole_float=True)
        keys = n_new * ctx + n_new * (n_new + 1) / 2          # Σ_{j=1..n_new} (ctx + j)
        return batch * n_new * self.linear_flops_per_token() + batch * self.attn_flops_per_token(1) * keys

    def step_bytes(self, batch, n_new, ctx=0, w_bytes=2.0, kv_bytes=2.0):
        """
        一次前向至少要搬多少字节（从显存到芯片）：权重读一遍 + 每个序列的 KV（读已有的 ctx 个、写新的 n_new 个）。

        【假设】权重只读一遍（批里所有 token 共享这一次读取）；注意力是融合内核（分数矩阵不落显存）；
            激活的读写不计（它们和 d_model 成正比，比权重和长上下文的 KV 小得多）。
            词嵌入查表只读用到的几行，这里不计；lm_head 计在 matmul_params 里。
        【边界】batch、n_new ≥ 1，ctx ≥ 0（整数）；w_bytes、kv_bytes 是正的有限实数。
        """
        check_int("batch", batch, lo=1, whole_float=True)
        check_int("n_new", n_new, lo=1, whole_float=True)
        check_int("ctx", ctx, lo=0, whole_float=True)
        check_real("w_bytes", w_bytes, lo=0.0, lo_open=True)
        check_real("kv_bytes", kv_bytes, lo=0.0, lo_open=True)
        return self.matmul_params() * w_bytes + self.kv_cache_bytes(batch, ctx + n_new, kv_bytes)

    def arithmetic_intensity(self, batch, n_new, ctx=0, w_bytes=2.0, kv_bytes=2.0):
        """
        算术强度 = FLOPs / 字节（FLOP/byte）：每从显存搬一个字节，能做多少次运算。

        【要点】decode（n_new = 1、ctx 小）：FLOPs ≈ 2·N·batch，字节 ≈ 2·N（BF16 权重），强度 ≈ batch；
            prefill（batch = 1、n_new = T）：强度 ≈ T —— 提示越长越"吃算力"，芯片的 ridge point 大约几百，
            所以 decode 几乎总是受带宽限制，长 prefill 受算力限制。
        """
        return self.step_flops(batch, n_new, ctx) / self.step_bytes(batch, n_new, ctx, w_bytes, kv_bytes)

    # ---- 训练 -----------------------------------------------------------------
    def train_flops(self, n_tokens, seq_len, causal=True):
        """
        训练 n_tokens 个 token（序列长度 seq_len）的总 FLOPs：前向 1 份 + 反向 2 份（对激活、对权重各一次）= 3 × 前向。

        【公式】3 · D · (2·matmul_params + 注意力(平均上下文))，因果时平均上下文 = (seq_len + 1)/2。
            第一项就是常说的 6·N·D（N 取 matmul_params；用 n_params 差别是词嵌入那一块）。
        """
        check_int("n_tokens", n_tokens, lo=0, whole_float=True)
        check_int("seq_len", seq_len, lo=1, whole_float=True)
        check_bool("causal", causal, where="train_flops")
        avg_ctx = (seq_len + 1) / 2 if causal else seq_len
        return 3 * n_tokens * (self.linear_flops_per_token() + self.attn_flops_per_token(avg_ctx))

    def activation_elems_per_token_layer(self):
        """
        每层、每个 token 为反向传播保存的激活个数（粗略估算，不做重计算、FlashAttention、无 dropout）：
            两个归一化的输入和输出 4d + q、k、v（RoPE 之后）(H + 2G)·dh + 注意力输出 H·dh
            + MLP 的 gate、up、两者乘积 3f。
        【对照】GPT-3 式模型（MHA、f = 4d）时约 34·d 字节（BF16，Korthikanti et al. 2022 表 2 的 sbh·34，不含 s² 项），
            这个估算给 2·(4d + 4d + 12d) = 40d 字节，同一量级。
        """
        return 4 * self.d_model + 2 * self.q_dim + 2 * self.kv_dim + 3 * self.d_ff

    def activation_bytes(self, batch, seq_len, bytes_per_elem=2.0, recompute=False):
        """
        一个 micro-batch（batch × seq_len 个 token）训练时保存的激活字节（不含 logits，见 train_memory）。

        【recompute=True】全部重计算（activation checkpointing）：每层只存输入 d 个数，反向时再算一遍；
            同一时刻只需要一层的完整激活。
        【边界】batch、seq_len 是 ≥ 1 的整数；bytes_per_elem 是正的有限实数；recompute 是 bool。
        """
        check_int("batch", batch, lo=1, whole_float=True)
        check_int("seq_len", seq_len, lo=1, whole_float=True)
        check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True)
        check_bool("recompute", recompute, where="activation_bytes")
        tokens = batch * seq_len
        per_layer = self.activation_elems_per_token_layer()
        elems = (self.n_layers * self.d_model + per_layer) if recompute else self.n_layers * per_layer
        return tokens * elems * bytes_per_elem

    def train_memory(self, batch, seq_len, recompute=False, w_bytes=2.0, grad_bytes=2.0, master_bytes=4.0,
                     adam_bytes=8.0, act_bytes=2.0, logits_bytes=4.0):
        """
        混合精度 Adam 训练一份完整模型（不切分）要多少显存，按项拆开。

        【默认】BF16 权重 2 + BF16 梯度 2 + FP32 主权重 4 + Adam 的 m、v 各 FP32 共 8 = 每个参数 16 字节
            （ZeRO 论文的 16Ψ）；激活见 activation_bytes；logits 用 FP32 存（batch·seq·V·4，词表 12.8 万时很可观）。
        【返回】{"weights", "grads", "master", "adam", "activations", "logits", "total"}（字节）
        【边界】batch、seq_len 是 ≥ 1 的整数；各项字节宽度是正的有限实数。
        """
        for nm, v in (("w_bytes", w_bytes), ("grad_bytes", grad_bytes), ("master_bytes", master_bytes),
                      ("adam_bytes", adam_bytes), ("act_bytes", act_bytes),
                      ("logits_bytes", logits_bytes)):
            check_real(nm, v, lo=0.0, lo_open=True)
        n = self.n_params()
        out = {
            "weights": n * w_bytes,
            "grads": n * grad_bytes,
            "master": n * master_bytes,
            "adam": n * adam_bytes,
            "activations": self.activation_bytes(batch, seq_len, act_bytes, recompute),
            "logits": batch * seq_len * self.vocab * logits_bytes,
        }
        out["total"] = sum(out.values())
        return out


def scaled(cfg, name=None, **changes):
    """
    复制一个配置并改几个字段，例如 scaled(LLAMA31_8B, n_kv_heads=32) 得到 MHA 版本。

    【Python 小知识】frozen dataclass 不能原地改；dataclasses.replace 生成改了字段的新对象（会重新做参数检查）。
    """
    from dataclasses import replace
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"scaled：cfg 必须是 llm_math.ModelConfig（例如 LLAMA31_8B），收到 {type(cfg).__name__}")
    unknown = sorted(set(changes) - {f.name for f in fields(ModelConfig)})
    if unknown:
        raise TypeError(f"scaled：ModelConfig 没有字段 {', '.join(unknown)}；"
                        f"可改的字段：{', '.join(f.name for f in fields(ModelConfig) if f.name != 'name')}")
    return replace(cfg, name=name or cfg.name, **changes)


# =============================================================================
# 第 2 部分：和芯片结合（芯片见 hw_specs.Chip；只用 chip.peak_flops(prec)、chip.mem_bw 和显存字段）
# =============================================================================
MEM_UTIL = 0.9     # 只用可分配显存的这个比例：vLLM gpu_memory_utilization 的老默认值 [S61]（新版 0.92 [S59]）


class CapacityError(ValueError):
    """显存放不下（权重放不下，或放下权重后 KV 放不下）。全课程同一个异常；是 ValueError 的子类。"""


def check_model_chip(model, chip):
    """model 要像 ModelConfig、chip 要像 hw_specs.Chip；不像（例如 chip='H100' 这样的名字）→ TypeError。"""
    if not all(hasattr(model, a) for a in ("weight_bytes", "kv_bytes_per_token", "step_flops", "n_kv_heads")):
        raise TypeError(f"model 必须是 llm_math.ModelConfig（例如 llm_math.LLAMA31_8B），收到 {type(model).__name__}")
    _check_chip(chip)


def _check_chip(chip):
    """chip 要像 hw_specs.Chip：有 peak_flops、mem_bw、mem_cap，带宽和容量是正的有限实数。"""
    missing = [a for a in ("peak_flops", "mem_bw", "mem_cap") if not hasattr(chip, a)]
    if missing:
        raise TypeError(f"chip 必须是 hw_specs.Chip（例如 hw_specs.H100_SXM；缺少 {', '.join(missing)}），"
                        f"收到 {type(chip).__name__} {chip!r}")
    for a in ("mem_bw", "mem_cap"):
        check_real(f"chip.{a}", getattr(chip, a), lo=0.0, lo_open=True)


def allocatable_bytes(chip):
    """
    一块芯片上程序能分配的字节：hw_specs.Chip 的 alloc_bytes（H200 实测、其余按规则推出）；
    没有这个字段的芯片（例如原课程第 6 讲模块自己定义的 A100）退回手册的 mem_cap。
    """
    _check_chip(chip)
    alloc = getattr(chip, "alloc_bytes", None)
    if alloc is None:
        return float(chip.mem_cap)
    return check_real("chip.alloc_bytes", alloc, lo=0.0, lo_open=True)


# "放不放得下 / 要几张卡" 的两条规则（全课程只用 fit / chips_needed 判断，表格打印用的是哪条）
FIT_RULES = {
    "tp": "张量并行：卡数 n 整除 query 头数 H，且与 KV 头数 G 一个整除另一个（G < n 时每卡复制 1 个 KV 头）；"
          "每卡 权重/n + 本卡的 KV ≤ mem_util × 可分配显存",
    "bytes": "只按字节：权重和 KV 平分到 n 张卡（不管头数能不能整除，是下限）；每卡同上",
}


def tp_layout_problem(model, n, name="n"):
    """n 张卡能不能按张量并行切这个模型：能切返回 None，不能切返回原因（一句话；name 是消息里卡数的名字）。

    【边界】n 是 ≥ 1 的整数（0、负数、2.5、True → 报错，消息用 name 称呼它），model 要有 n_heads、n_kv_heads。"""
    if not isinstance(name, str) or not name:
        raise TypeError(f"tp_layout_problem：name 必须是非空字符串（消息里卡数的名字），收到 {name!r}")
    if not all(hasattr(model, a) for a in ("n_heads", "n_kv_heads")):
        raise TypeError(f"tp_layout_problem：model 必须是 llm_math.ModelConfig，收到 {type(model).__name__}")
    n = int(check_int(name, n, lo=1, whole_float=True, where="tp_layout_problem"))
    if model.n_heads % n:
        return f"{name}={n} 必须整除注意力头数 n_heads={model.n_heads}（每块卡分到整数个头）"
    G = model.n_kv_heads
    if G % n and n % G:
        return (f"{name}={n} 与 n_kv_heads={G} 必须一个整除另一个（KV 头要么平分到各卡、要么每 {name}/G 块卡复制"
                f"同一个头；允许的 {name} 是 {G} 的约数或倍数）")
    return None


@dataclass(frozen=True)
class Fit:
    """
    fit / chips_needed 的结果（字节都是**每张卡**的）。

    fits：放得下吗；n_chips、rule：几张卡、按哪条规则（FIT_RULES）；why：放不下的原因（放得下时为空串）；
    usable = mem_util × 可分配显存；weights、kv：这张卡上的权重和 KV（batch 个序列 × ctx 个 token）；
    kv_per_token：这张卡上每个 token 的 KV；kv_tokens：放下权重后还能放多少个 token 的 KV（≥ 0）。
    """
    fits: bool
    n_chips: int
    rule: str
    usable: float
    weights: float
    kv: float
    kv_per_token: float
    kv_tokens: int
    why: str = ""

    @property
    def need(self):
        """这张卡要放的字节：权重 + KV。"""
        return self.weights + self.kv


def _fit_kw(w_bytes, kv_bytes, mem_util, rule):
    check_real("w_bytes", w_bytes, lo=0.0, lo_open=True)
    check_real("kv_bytes", kv_bytes, lo=0.0, lo_open=True)
    check_real("mem_util", mem_util, lo=0.0, lo_open=True, hi=1.0)
    check_choice("rule", rule, FIT_RULES, where="fit")


def fit(model, chip, n_chips=1, batch=1, ctx=0, w_bytes=2.0, kv_bytes=2.0, mem_util=MEM_UTIL, rule="tp"):
    """
    n_chips 张卡能不能放下 model 的权重加上 batch 个序列、每个 ctx 个 token 的 KV。全课程"放不放得下"都问它。

    【规则】rule="tp"（默认，真实部署）或 "bytes"（只按字节的下限），见 FIT_RULES。
    【返回】Fit（fits=False 时 why 写出原因；数字照样算好，表格可以把"放不下"和数字一起打印）。
    【边界】n_chips ≥ 1、batch ≥ 0、ctx ≥ 0 是整数；w_bytes、kv_bytes > 0；mem_util 在 (0, 1]。
    """
    check_model_chip(model, chip)
    n = int(check_int("n_chips", n_chips, lo=1, whole_float=True))
    batch = check_int("batch", batch, lo=0, whole_float=True)
    ctx = check_int("ctx", ctx, lo=0, whole_float=True)
    _fit_kw(w_bytes, kv_bytes, mem_util, rule)
    usable = mem_util * allocatable_bytes(chip)
    weights = model.weight_bytes(w_bytes) / n
    if rule == "tp":
        kv_heads = max(model.n_kv_heads // n, 1)              # G < n：每卡复制 1 个头，KV 不再随 n 变小
        kv_tok = model.kv_bytes_per_token(kv_bytes) * kv_heads / model.n_kv_heads
        why = tp_layout_problem(model, n) or ""
    else:
        kv_tok = model.kv_bytes_per_token(kv_bytes) / n
        why = ""
    kv = batch * ctx * kv_tok
    free = usable - weights
    kv_tokens = int(free // kv_tok) if free > 0 else 0
    where = f"{getattr(chip, 'name', 'chip')} × {n}"
    if not why and weights > usable:
        why = (f"{model.name} 在 {where} 上每卡权重 {weights / 1e9:.1f} GB > 可用 {usable / 1e9:.1f} GB"
               f"（{mem_util:g} × 可分配 {allocatable_bytes(chip) / 1e9:.1f} GB）")
    elif not why and weights + kv > usable:
        why = (f"{model.name} 在 {where} 上每卡权重 {weights / 1e9:.1f} GB + KV {kv / 1e9:.1f} GB"
               f"（{batch} 个序列 × {ctx} token）> 可用 {usable / 1e9:.1f} GB")
    return Fit(fits=not why, n_chips=n, rule=rule, usable=usable, weights=weights, kv=kv, kv_per_token=kv_tok,
               kv_tokens=kv_tokens, why=why)


MAX_CHIPS = 65536    # chips_needed 最多试到几张卡：一张张试，10¹² 张要跑几天（今天最大的集群是 10⁵ 量级）


def chips_needed(model, chip, batch=1, ctx=0, w_bytes=2.0, kv_bytes=2.0, mem_util=MEM_UTIL, rule="tp",
                 max_chips=1024):
    """
    最少几张卡放得下（fit 的规则）：返回那个 n 的 Fit；到 max_chips 都放不下时返回 n = max_chips 的 Fit（fits=False）。

    【例】Llama-3.1-405B（BF16，只放权重）：rule="bytes" 要 11 张 H100，rule="tp" 要 16 张
        （128 个头，11、12 都不整除）。第 1 讲演示 05、第 5 讲演示 04 都用这一个函数。
    """
    max_chips = check_int("max_chips", max_chips, lo=1, hi=MAX_CHIPS, where="chips_needed")
    for n in range(1, max_chips + 1):
        f = fit(model, chip, n, batch, ctx, w_bytes, kv_bytes, mem_util, rule)
        if f.fits:
            return f
    return f


def fit_rows(fits):
    """[(标签, Fit)] → format_table 的行：标签、规则、卡数、放得下、每卡权重 GB、KV GB、可用 GB、原因。"""
    fits = list(fits)
    for i, item in enumerate(fits):
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[1], Fit):
            raise TypeError(f"fit_rows：fits 的第 {i} 项必须是 (标签, Fit)，收到 {item!r}")
    return [[label, f.rule, f.n_chips, "是" if f.fits else "否", f"{f.weights / 1e9:.1f}", f"{f.kv / 1e9:.1f}",
             f"{f.usable / 1e9:.1f}", f.why or "—"] for label, f in fits]


FIT_HEADERS = ["配置", "规则", "卡数", "放得下", "每卡权重 GB", "每卡 KV GB", "每卡可用 GB", "放不下的原因"]


def step_time(model, chip, batch, n_new, ctx=0, prec="bf16", w_bytes=2.0, kv_bytes=2.0, mfu=1.0, mbu=1.0,
              n_chips=1, mem_util=MEM_UTIL, rule="tp"):
    """
    roofline 估计：一次前向的时间 = max(运算时间, 搬数据时间)。

    【参数】model：ModelConfig；chip：有 peak_flops(prec)、mem_bw、mem_cap 的对象；batch、n_new、ctx：见 step_flops；
        mfu / mbu：能达到峰值算力 / 峰值带宽的比例（1.0 = 理想上限；实际 decode 内核带宽利用率常在 50–80%）；
        n_chips：几张卡按张量并行分摊 FLOPs 和权重字节（理想切分，**不计通信**：见 prereq5/04、第 5 讲演示 04）；
        每卡读的 KV 按 fit 的 kv_per_token（rule="tp" 且 n_chips > n_kv_heads 时每卡读 1 个复制的 KV 头）。
    【返回】{"flops", "bytes", "intensity", "t_compute", "t_memory", "time", "bound", "fits", "fit"}：
        bound 为 "compute" 或 "memory"；fits / fit 是 fit(model, chip, n_chips, batch, ctx + n_new, …) ——
        放不下的配置照样给出时间，**打印它的表格必须同时打印 fits**（decode_time_per_token 等只返回一个数的函数
        遇到放不下直接抛 CapacityError）。flops、bytes 是每张卡的。
    【边界】mfu、mbu 必须在 (0, 1]；batch、n_new、ctx、w_bytes、kv_bytes 的要求见 step_flops / step_bytes。
    """
    check_real("mfu", mfu, lo=0.0, lo_open=True, hi=1.0)
    check_real("mbu", mbu, lo=0.0, lo_open=True, hi=1.0)
    check_model_chip(model, chip)
    flops = model.step_flops(batch, n_new, ctx)                      # 先查 batch、n_new、ctx（消息写它们的名字）
    # >>> 练习 1.3
    f = fit(model, chip, n_chips, batch, ctx + n_new, w_bytes, kv_bytes, mem_util, rule)
    # 每卡的字节（step_bytes 的两项，按卡分）：矩阵乘权重平分；KV 按 fit 的每卡每 token 字节（"tp" 在 n > G 时
    # 每卡留 1 个复制的 KV 头，不再随 n 变小；"bytes" 就是总量 / n）—— 和第 5 讲 StepModel.weight_read_bytes 的账一致
    flops = flops / f.n_chips
    nbytes = model.matmul_params() * w_bytes / f.n_chips + batch * (ctx + n_new) * f.kv_per_token
    t_c = flops / (chip.peak_flops(prec) * mfu)
    t_m = nbytes / (chip.mem_bw * mbu)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "t_compute": t_c, "t_memory": t_m,
            "time": max(t_c, t_m), "bound": "compute" if t_c >= t_m else "memory", "fits": f.fits, "fit": f}
    # <<< 练习 1.3


def decode_time_per_token(model, chip, batch=1, ctx=0, **kw):
    """
    decode 一步（批里每个序列各出 1 个 token，每个序列已有 ctx 个 token 在 KV cache 里）的 roofline 时间（秒）。
    kw（prec、w_bytes、kv_bytes、mfu、mbu、n_chips、mem_util、rule）原样传给 step_time。
    放不下 → CapacityError（消息里有 fit 的 why），而不是一个看起来正常的时间。
    """
    # >>> 练习 1.4
    r = step_time(model, chip, batch, 1, ctx, **kw)
    if not r["fits"]:
        raise CapacityError(r["fit"].why + "；用 chips_needed 找要几张卡，再传 n_chips")
    return r["time"]
    # <<< 练习 1.4


def decode_tokens_per_s(model, chip, batch=1, ctx=0, **kw):
    """
    decode 的总吞吐（token/s，批里所有序列加起来）= batch / 每步时间。单个序列的速度是它除以 batch。
    放不下（例如 405B 在一张 H100 上）→ CapacityError，而不是一个看起来正常的数。
    """
    # >>> 练习 1.4
    return batch / decode_time_per_token(model, chip, batch, ctx, **kw)
    # <<< 练习 1.4


def max_batch(model, chip, ctx, w_bytes=2.0, kv_bytes=2.0, mem_util=MEM_UTIL, n_chips=1, rule="tp"):
    """
    芯片装下权重之后，剩下的显存能同时放几个"上下文 ctx 长"的序列的 KV cache（就是 fit 的 kv_tokens // ctx）。

    【mem_util】只用可分配显存（allocatable_bytes）的这个比例（像 vLLM 的 gpu_memory_utilization，默认 0.9：
        留 10% 给激活、CUDA 上下文和碎片 [S61]）。
    【返回】整数；权重都放不下时返回 0。
    【边界】ctx 是 ≥ 1 的整数（长度 0 的序列不占 KV，"能放几个"没有意义）；mem_util 在 (0, 1]。
    """
    ctx = check_int("ctx", ctx, lo=1, whole_float=True)
    f = fit(model, chip, n_chips, 0, 0, w_bytes, kv_bytes, mem_util, rule)
    return f.kv_tokens // int(ctx) if f.fits else 0


def train_time(model, n_tokens, chip, n_chips, mfu=0.4, seq_len=8192, prec="bf16"):
    """
    训练要多久：总 FLOPs / (芯片数 × 峰值 × MFU)。

    【返回】{"flops", "seconds", "days", "chip_hours"}
    【边界】只算"有效运算"的时间：不含故障重启、检查点、评测等停顿（真实的 GPU·小时会更多）。
    """
    check_model_chip(model, chip)
    check_int("n_chips", n_chips, lo=1, whole_float=True)
    check_real("mfu", mfu, lo=0.0, lo_open=True, hi=1.0)
    flops = model.train_flops(n_tokens, seq_len)
    sec = flops / (n_chips * chip.peak_flops(prec) * mfu)
    return {"flops": flops, "seconds": sec, "days": sec / 86400, "chip_hours": sec * n_chips / 3600}


# =============================================================================
# 第 3 部分：真实模型的预设（出处标签 [Sxx] 见 SOURCES.md 第 2 节）
# =============================================================================
# Llama 3.x：Meta llama-models sku_list.py [S41] + Hugging Face config [S42–S45]。RMSNorm、RoPE、SwiGLU、无偏置。
LLAMA32_1B = ModelConfig("Llama-3.2-1B", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, d_head=64,
                         d_ff=8192, vocab=128256, tied=True)
LLAMA32_3B = ModelConfig("Llama-3.2-3B", n_layers=28, d_model=3072, n_heads=24, n_kv_heads=8, d_head=128,
                         d_ff=8192, vocab=128256, tied=True)
LLAMA31_8B = ModelConfig("Llama-3.1-8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_head=128,
                         d_ff=14336, vocab=128256)
LLAMA31_70B = ModelConfig("Llama-3.1-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_head=128,
                          d_ff=28672, vocab=128256)
# 405B 的 MP16 检查点变体用 16 个 KV 头；这里取标准的 8。
LLAMA31_405B = ModelConfig("Llama-3.1-405B", n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, d_head=128,
                           d_ff=53248, vocab=128256)
# Mistral 7B v0.1：论文表 1 [S47] + HF config [S48]（滑动窗口 4096 不影响参数量；影响长上下文的 KV，这里不建模）。
MISTRAL_7B = ModelConfig("Mistral-7B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_head=128,
                         d_ff=14336, vocab=32000)
# Qwen2.5-7B：HF config [S49]。q/k/v 投影带偏置（Qwen2 架构的特点），o 投影和 MLP 不带。
QWEN25_7B = ModelConfig("Qwen2.5-7B", n_layers=28, d_model=3584, n_heads=28, n_kv_heads=4, d_head=128,
                        d_ff=18944, vocab=152064, qkv_bias=True)
# GPT-2 small：nanoGPT from_pretrained [S55]。LayerNorm（权重 + 偏置）、GELU MLP 768→3072→768（8d² 参数）、
# 所有线性层带偏置、1024 个可学习位置、lm_head 和词嵌入共享。
#   等效 SwiGLU：d_ff = 8·768/3 = 2048；qkv_bias 记 3d；
#   extra_per_layer = o 偏置 d + MLP 偏置 4d + d + 两个 LN 偏置 2d = 8d；
#   extra_final = 最后一个 LN 的偏置 d。这样参数总数和 Hugging Face 的 124,439,808 逐个相等。
GPT2_SMALL = ModelConfig("GPT-2-small", n_layers=12, d_model=768, n_heads=12, n_kv_heads=12, d_head=64,
                         d_ff=2048, vocab=50257, tied=True, qkv_bias=True, n_pos=1024, extra_per_layer=8 * 768,
                         extra_final=768)
# GPT-3：Brown et al. 2020 表 2.1 [S46]，架构"同 GPT-2"（偏置、LayerNorm、可学习位置 2048；词表 50257 是推断的；
# 论文没说 lm_head 是否共享，这里按 GPT-2 取共享，和第 6 讲 decode_lab 的用法一致）。等效 SwiGLU：d_ff = 8d/3。
#   13B：论文表里 d_model 印的是 5140，但 40 个头 × 128 = 5120（Orca 表 1 也写 5120），这里用 5120；
#   8·5120/3 不是整数，取 13653（MLP 参数少 5120 个/层，可忽略）。
#   代价：按 5120 算出 12.85B，比论文印的 13.0B 少 1.1%，超出 1% 的容差 —— 见 PARAM_TOL_EXCEPTIONS。
#   注意：GPT-3 交替使用稠密和局部带状稀疏注意力，注意力 FLOPs 的公式对它是上界。
GPT3_13B = ModelConfig("GPT-3-13B", n_layers=40, d_model=5120, n_heads=40, n_kv_heads=40, d_head=128,
                       d_ff=13653, vocab=50257, tied=True, qkv_bias=True, n_pos=2048, extra_per_layer=8 * 5120,
                       extra_final=5120)
GPT3_175B = ModelConfig("GPT-3-175B", n_layers=96, d_model=12288, n_heads=96, n_kv_heads=96, d_head=128,
                        d_ff=32768, vocab=50257, tied=True, qkv_bias=True, n_pos=2048, extra_per_layer=8 * 12288,
                        extra_final=12288)

PRESETS = {m.name: m for m in (LLAMA32_1B, LLAMA32_3B, LLAMA31_8B, LLAMA31_70B, LLAMA31_405B, MISTRAL_7B,
                               QWEN25_7B, GPT2_SMALL, GPT3_13B, GPT3_175B)}

# 官方公布的参数总数（自检要求我们的公式在 1% 以内）：名字 → (总数, 出处)
PUBLISHED_PARAMS = {
    "Llama-3.2-1B": (1.23e9, "Llama 3.2 模型卡（meta-llama/llama-models）：\"1B (1.23B)\"；"
                             "HF safetensors 精确计数 1,235,814,400"),
    "Llama-3.2-3B": (3.21e9, "Llama 3.2 模型卡：\"3B (3.21B)\""),
    "Llama-3.1-8B": (8.03e9, "HF meta-llama/Llama-3.1-8B：8.03B（safetensors 精确计数 8,030,261,248）"),
    "Llama-3.1-70B": (70.6e9, "HF meta-llama/Llama-3.1-70B：70.6B（safetensors 精确计数 70,553,706,496）"),
    "Llama-3.1-405B": (405.9e9, "HF meta-llama/Llama-3.1-405B：406B（safetensors 精确计数 405,853,388,800）"),
    "Mistral-7B": (7.24e9, "HF mistralai/Mistral-7B-v0.1：7.24B（精确计数 7,241,732,096）"),
    "Qwen2.5-7B": (7.61e9, "Qwen2.5-7B 模型卡：\"Number of Parameters: 7.61B\""
                           "（HF safetensors 7,615,616,512）"),
    "GPT-2-small": (124.4e6, "HF gpt2：124,439,808（常说 124M；GPT-2 论文表 2 印的 117M 是早期的误算）"),
    "GPT-3-13B": (13.0e9, "Brown et al. 2020 表 2.1 [S46]：13.0B（同一行的 d_model 印成 5140）"),
    "GPT-3-175B": (175.0e9, "Brown et al. 2020 表 2.1：175.0B"),
}

# 有逐个元素的精确计数（Hugging Face safetensors 的元数据，出处同上）的预设：比较时用它，不用四舍五入的
# "1.23B"——表里印 1.23B 而下面一行写着 1,235,814,400，学生会问到底该跟哪个比。
EXACT_PARAMS = {
    "Llama-3.2-1B": 1_235_814_400, "Llama-3.1-8B": 8_030_261_248, "Llama-3.1-70B": 70_553_706_496,
    "Llama-3.1-405B": 405_853_388_800, "Mistral-7B": 7_241_732_096, "Qwen2.5-7B": 7_615_616_512,
    "GPT-2-small": 124_439_808,
}


def published_count(name):
    """预设 name 的官方参数量：有精确计数时用精确计数，否则用公布的四舍五入数字。返回 (数, 是否精确)。"""
    param_tolerance(name)                   # 检查名字
    return (EXACT_PARAMS[name], True) if name in EXACT_PARAMS else (PUBLISHED_PARAMS[name][0], False)


# 预设参数量和官方数字的容差：一般 1%；个别预设有说得清的已知差距，用单独的、写明原因的容差
PARAM_TOL = 0.01
PARAM_TOL_EXCEPTIONS = {
    "GPT-3-13B": (0.015, "论文表 2.1 印的 d_model = 5140 算出 13.0B；我们的预设用 40 头 × 128 = 5120"
                         "（与 Orca 表 1 一致），宽度小 0.4%，参数量（≈ 12·L·d²）小约 0.8%，"
                         "再加上 13.0B 本身四舍五入到 0.1B，总差 1.1%"),
}


def param_tolerance(name):
    """预设 name 的参数量和 PUBLISHED_PARAMS 允许差多少（相对误差），以及原因（一般情况原因为空串）。"""
    check_choice("name", name, PUBLISHED_PARAMS, where="param_tolerance")
    return PARAM_TOL_EXCEPTIONS.get(name, (PARAM_TOL, ""))


# GPT-3 13B"照论文表 2.1 印的"结构：d_model = 5140。不进 PRESETS（5140 不能被 40 个头整除），
# 只用来说明官方的 13.0B 是从哪里来的。参数量只和 H·dh、G·dh 有关，和怎么分头无关，
# 这里用 20 个头 × 257 维凑出 5140；d_ff 取 8·5140/3 的近似 13707（同 GPT3_13B 的等效 SwiGLU 取法）。
GPT3_13B_AS_PRINTED = ModelConfig("GPT-3-13B (d=5140 as printed)", n_layers=40, d_model=5140, n_heads=20,
                                  n_kv_heads=20, d_head=257, d_ff=13707, vocab=50257, tied=True, qkv_bias=True,
                                  n_pos=2048, extra_per_layer=8 * 5140, extra_final=5140)

# 训练规模的公开数字（04 演示用来对照）
LLAMA31_405B_TRAIN = {
    "tokens": 15.6e12,       # Llama 3 论文（Dubey et al. 2024, arXiv 2407.21783）：405B 预训练 15.6T token
    "gpus": 16384,           # 同上：最多 16K 张 H100
    "mfu": 0.40,             # 同上表 4：BF16 MFU 38–43%，取 40%
    "seq_len": 8192,         # 同上：预训练主体阶段序列长度 8K（之后的长上下文阶段不计）
    "gpu_hours": 30.84e6,    # meta-llama/llama-models models/llama3_1/MODEL_CARD.md："Llama 3.1 405B 30.84M" GPU hours
}


# =============================================================================
# 自检
# =============================================================================
def _brute_force_params(cfg):
    """独立的参考实现：把每个张量的形状列出来、逐个相乘求和（不经过 param_groups 的公式）。"""
    d, V, f = cfg.d_model, cfg.vocab, cfg.d_ff
    shapes = [(V, d), (cfg.n_pos, d), (d,)]                                   # 词嵌入、位置编码、最后的归一化
    if not cfg.tied:
        shapes.append((d, V))
    for _ in range(cfg.n_layers):
        shapes += [(d,), (d, cfg.q_dim), (d, cfg.kv_dim), (d, cfg.kv_dim), (cfg.q_dim, d),   # 归一化、Wq Wk Wv Wo
                   (d,), (d, f), (d, f), (f, d), (cfg.extra_per_layer,)]                     # 归一化、MLP、其它
        if cfg.qkv_bias:
            shapes += [(cfg.q_dim,), (cfg.kv_dim,), (cfg.kv_dim,)]
    shapes.append((cfg.extra_final,))
    return sum(math.prod(s) for s in shapes)


def _selftest():
    # 1) 每个预设：参数量 = 逐个张量相加的参考实现；和官方数字差 1% 以内（写明原因的例外除外）
    worst = 0.0
    for name, cfg in PRESETS.items():
        n = cfg.n_params()
        assert n == _brute_force_params(cfg), name
        assert n == sum(cfg.param_groups().values())
        pub, _src = PUBLISHED_PARAMS[name]
        err = abs(n - pub) / pub
        tol, why = param_tolerance(name)
        if name in PARAM_TOL_EXCEPTIONS:
            assert why and err > PARAM_TOL, (name, err)        # 例外必须真的需要（否则删掉它）
        else:
            worst = max(worst, err)
        assert err < tol, (name, n, pub, err)
    assert set(PUBLISHED_PARAMS) == set(PRESETS)
    # 几个能精确核对的数字（Hugging Face 上逐个数出来的总数）：逐个相等；四舍五入的官方数字和它一致
    for name, exact in EXACT_PARAMS.items():
        assert PRESETS[name].n_params() == exact, name
        assert published_count(name) == (exact, True)
        assert abs(exact - PUBLISHED_PARAMS[name][0]) / exact < 0.006, name        # 1.23B vs 1,235,814,400
    # GPT-3 13B：论文印的 13.0B 来自同一行印的 d_model = 5140。用 GPT-2 结构逐项数（12·d² 权重 + 13·d 偏置和
    # LayerNorm 每层，最后的 LayerNorm 2·d，词嵌入和位置编码 (V + 2048)·d），5140 在 1% 内复现 13.0B
    pub13 = PUBLISHED_PARAMS["GPT-3-13B"][0]
    d_printed = 5140
    n_printed = 40 * (12 * d_printed ** 2 + 13 * d_printed) + 2 * d_printed + (50257 + 2048) * d_printed
    assert abs(n_printed - pub13) / pub13 < PARAM_TOL and round(n_printed / 1e9, 1) == 13.0
    assert abs(GPT3_13B_AS_PRINTED.n_params() - n_printed) <= 40 * 3 * d_printed     # 只差 d_ff 的取整
    gap13 = (pub13 - GPT3_13B.n_params()) / pub13                  # 我们的 5120 预设：已知差距 1.1%
    assert PARAM_TOL < gap13 < PARAM_TOL_EXCEPTIONS["GPT-3-13B"][0], gap13

    # 2) 恒等式
    for cfg in PRESETS.values():
        assert cfg.linear_flops_per_token() == 2 * cfg.matmul_params()
        assert cfg.flops_per_token(1000) == cfg.linear_flops_per_token() + cfg.attn_flops_per_token(1000)
        # 注意力 FLOPs 按矩阵乘法的形状逐个数：每层每个 query 头 q[1, dh]·Kᵀ[dh, 7] 和 p[1, 7]·V[7, dh]
        shapes = [(1, cfg.d_head, 7), (1, 7, cfg.d_head)] * (cfg.n_layers * cfg.n_heads)
        assert cfg.attn_flops_per_token(7) == sum(2 * m * k * n for m, k, n in shapes)
        # KV 字节按缓存张量的形状数：每层 K、V 各 [G, dh]，BF16 每个 2 字节
        kv_shapes = [(cfg.n_kv_heads, cfg.d_head)] * (2 * cfg.n_layers)
        assert cfg.kv_bytes_per_token() == 2 * sum(math.prod(sh) for sh in kv_shapes)
        assert cfg.kv_cache_bytes(3, 100, 1.0) == 300 * cfg.kv_bytes_per_token(1.0)
        assert cfg.weight_bytes(2.0) == 2 * cfg.n_params()
        # 没有共享、没有偏置/位置编码的 Llama：matmul_params = n_params − 词嵌入 − 归一化
        if not cfg.tied and cfg.n_pos == 0 and not cfg.qkv_bias:
            g = cfg.param_groups()
            assert cfg.matmul_params() == cfg.n_params() - g["embeddings"] - g["norms"]
        # 训练 = 3 × 前向；seq_len = 1 时注意力只看自己
        assert math.isclose(cfg.train_flops(10, 1), 3 * 10 * cfg.flops_per_token(1))
        # 一次 prefill 的 FLOPs = 逐个 token decode 的 FLOPs 之和（因果注意力的账一样）
        T = 37
        assert math.isclose(cfg.step_flops(1, T, 0), sum(cfg.flops_per_token(j) for j in range(1, T + 1)))

    # 3) GQA / MQA：KV 字节按 G 变、注意力 FLOPs 不变
    mha = scaled(LLAMA31_8B, "8B-MHA", n_kv_heads=32)
    mqa = scaled(LLAMA31_8B, "8B-MQA", n_kv_heads=1)
    assert mha.kv_bytes_per_token() == 4 * LLAMA31_8B.kv_bytes_per_token() == 32 * mqa.kv_bytes_per_token()
    assert mha.attn_flops_per_token(512) == mqa.attn_flops_per_token(512)
    assert LLAMA31_8B.kv_bytes_per_token() == 131072          # 经典数字：8B 每个 token 128 KiB（BF16）

    # 4) 算术强度：decode ≈ batch（BF16、短上下文），prefill 随提示变长而变大
    for B in (1, 4, 32):
        ai = LLAMA31_8B.arithmetic_intensity(B, 1, ctx=0)
        assert abs(ai - B) / B < 0.01, (B, ai)
    ais = [LLAMA31_8B.arithmetic_intensity(1, T) for T in (16, 128, 1024, 8192)]
    assert all(a < b for a, b in zip(ais, ais[1:]))

    # 5) 和芯片结合（一个最小的假芯片，避免依赖 hw_specs）
    class _Chip:
        mem_bw, mem_cap = 1e12, 80e9

        @staticmethod
        def peak_flops(prec):
            return 1e15

    r = step_time(LLAMA31_8B, _Chip, 1, 1)
    assert r["bound"] == "memory" and math.isclose(r["time"], r["bytes"] / 1e12)
    r = step_time(LLAMA31_8B, _Chip, 1, 8192)
    assert r["bound"] == "compute" and math.isclose(r["time"], r["flops"] / 1e15)
    free = 0.9 * 80e9 - LLAMA31_8B.weight_bytes()           # _Chip 没有 alloc_bytes：退回 mem_cap
    assert max_batch(LLAMA31_8B, _Chip, 8192) == int(free // (8192 * LLAMA31_8B.kv_bytes_per_token()))
    assert max_batch(LLAMA31_405B, _Chip, 8192) == 0
    # 放不下的配置：step_time 标 fits=False，只返回一个数的函数抛 CapacityError
    assert not step_time(LLAMA31_405B, _Chip, 1, 1)["fits"] and step_time(LLAMA31_8B, _Chip, 1, 1)["fits"]
    try:
        decode_tokens_per_s(LLAMA31_405B, _Chip)
        raise AssertionError("405B 放不进一张 80 GB 的卡，应当报 CapacityError")
    except CapacityError as e:
        assert "405B" in str(e)
    # 要几张卡：按字节是下限；按张量并行还要整除头数
    nb = chips_needed(LLAMA31_405B, _Chip, rule="bytes").n_chips
    nt = chips_needed(LLAMA31_405B, _Chip).n_chips
    assert nb == math.ceil(LLAMA31_405B.weight_bytes() / (0.9 * 80e9))             # 只放权重（ctx=0）
    assert nt >= nb and LLAMA31_405B.n_heads % nt == 0 and tp_layout_problem(LLAMA31_405B, nt) is None
    assert not fit(LLAMA31_405B, _Chip, 12).fits and "整除" in fit(LLAMA31_405B, _Chip, 12).why
    tt = train_time(LLAMA31_8B, 1e12, _Chip, n_chips=100, mfu=0.5, seq_len=4096)
    assert math.isclose(tt["chip_hours"], tt["flops"] / (1e15 * 0.5) / 3600)

    # 6) 训练显存：16 字节/参数
    m = LLAMA31_8B.train_memory(1, 4096)
    assert m["weights"] + m["grads"] + m["master"] + m["adam"] == 16 * LLAMA31_8B.n_params()
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    assert LLAMA31_8B.activation_bytes(2, 1024, recompute=True) < LLAMA31_8B.activation_bytes(2, 1024)

    # 7) 坏输入
    bad = [(dict(n_heads=32, n_kv_heads=5), ValueError), (dict(n_layers=0), ValueError),
           (dict(d_model=-1), ValueError), (dict(vocab=2.5), TypeError), (dict(n_pos=-1), ValueError),
           (dict(tied="False"), TypeError), (dict(qkv_bias=1), TypeError)]
    for kw, exc in bad:
        args = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128, vocab=100)
        args.update(kw)
        try:
            ModelConfig("bad", **args)
        except exc as e:
            if "n_kv_heads" in kw:
                assert "32" in str(e) and "5" in str(e)
        else:
            raise AssertionError(f"应当报错：{kw}")
    m8 = LLAMA31_8B
    bad_calls = [  # (调用, 期望的异常, 消息里必须出现的参数名)
        (lambda: m8.attn_flops_per_token(-1), ValueError, "ctx"),
        (lambda: m8.attn_flops_per_token(float("nan")), ValueError, "ctx"),
        (lambda: m8.kv_bytes_per_token(0), ValueError, "bytes_per_elem"),
        (lambda: m8.kv_cache_bytes(float("nan"), 3), ValueError, "batch"),
        (lambda: m8.kv_cache_bytes(2.5, 10), TypeError, "batch"),
        (lambda: m8.step_flops(0, 1), ValueError, "batch"),
        (lambda: m8.step_flops(1.5, 1), TypeError, "batch"),
        (lambda: step_time(m8, "H100", 1, 1), TypeError, "chip"),
        (lambda: fit(m8, _Chip, rule="heads"), ValueError, "rule"),
        (lambda: m8.step_flops(1, 1, "a"), TypeError, "ctx"),
        (lambda: m8.step_bytes(1, 1, w_bytes=-2), ValueError, "w_bytes"),
        (lambda: m8.train_flops(float("nan"), 10), ValueError, "n_tokens"),
        (lambda: m8.activation_bytes(-1, 10), ValueError, "batch"),
        (lambda: m8.train_memory(-3, 10), ValueError, "batch"),
        (lambda: max_batch(m8, _Chip, -5), ValueError, "ctx"),
        (lambda: step_time(m8, _Chip, 1, 1, mfu=1.5), ValueError, "mfu"),
    ]
    for fn, exc, arg in bad_calls:
        try:
            fn()
        except exc as e:
            assert arg in str(e), (arg, str(e))
        else:
            raise AssertionError(f"应当抛出 {exc.__name__}（{arg}）")
    assert m8.train_flops(15.6e12, 8192) > 0             # 整数值的浮点数 token 数照常可用
    assert [f.name for f in fields(ModelConfig)][:9] == ["name", "n_layers", "d_model", "n_heads", "n_kv_heads",
                                                          "d_head", "d_ff", "vocab", "tied"]
    assert fmt_count(8.03e9) == "8.03B" and fmt_bytes(16.06e9) == "16.1 GB" and fmt_time(2.5e-3) == "2.5 ms"

    n_regular = len(PRESETS) - len(PARAM_TOL_EXCEPTIONS)
    print(f"llm_math 自检通过：{n_regular} 个预设的参数量和官方数字最大相差 {worst:.2%}；"
          f"GPT-3-13B 按 d=5120 差 {gap13:.2%}（论文印的 d=5140 复现 13.0B，差 {abs(n_printed - pub13) / pub13:.2%}）；"
          f"Llama-3.1-8B 每 token {fmt_si(LLAMA31_8B.linear_flops_per_token(), 'FLOP')}、"
          f"KV {fmt_bytes(LLAMA31_8B.kv_bytes_per_token())}；decode 强度 ≈ batch，prefill 强度随提示长度增长")


if __name__ == "__main__":
    _selftest()
