"""
transformer_lab.py —— 第 2 讲：会给自己记账的 numpy Transformer

【问题】第 1 讲的 llm_math 只用公式估算每个 token 多少 FLOPs、多少字节、KV cache 多大；公式会写错，也会悄悄漏项。
    这里真的搭一个 Llama 风格的 decoder-only 模型（纯 numpy），让它在每次矩阵乘、每次读写 KV cache 时记账，
    再逐项和公式对照：实际做了多少 FLOPs、其中多少有用；读了多少字节的权重、KV cache、激活。
    第 5/6 讲（服务与解码）导入本模块；量化和张量并行在本课程之外（TP 的通信见 prereq5/04、第 5 讲演示 04）。

【一层的数据流】（pre-norm + 残差；L 层之后：最终 RMSNorm ─► lm_head ─► logits[vocab]）
    x ─► RMSNorm ─► q,k,v = h·Wq, h·Wk, h·Wv ─► RoPE(q,k) ─► 因果 GQA 注意力 ─► ·Wo ─► 加回 x
      ─► RMSNorm ─► (SiLU(h·Wg) ⊙ h·Wu)·Wd ─► 加回 x

【里面有什么】
    Config / TINY / config_like / init_params / count_params   结构（字段同 llm_math.ModelConfig）与随机参数（不训练）
    linear / rms_norm / rope_angles / apply_rope / softmax / silu / attention_core   积木
    KVCache / forward / generate                    带 KV cache 的前向与贪心生成
    Counter / sum_rows / ops_table / analytic_ops / phase_costs / einsum_flops   账本；闭式公式；einsum 的 FLOPs 规则

【约定】形状：tokens [B, T]；激活 [B, T, d]；q [B, T, H, dh]；k, v [B, S, G, dh]（G = KV 头数，S = 键的个数）；
    权重 W[输入维, 输出维]，y = x·W。记账：矩阵乘 x[M, K]·W[K, N] 记 2MKN FLOPs、权重 KN、激活 MK + MN 个元素；
    注意力核心按一个融合内核记（分数不落显存，第 11 讲）：4·B·T·S·H·dh FLOPs，useful 只算因果掩码允许的对；
    逐元素运算按"每元素几次"粗估。字节 = 元素数 × bytes_per_elem（默认 2 = BF16），与 numpy 的 float64 无关；
    算术用 float64，是为了"带 / 不带 KV cache"的结果能比到 1e-9 以内。坏输入一律 ValueError / TypeError；
    种子是 ≥ 0 的整数或 np.random.Generator；放不进本机内存的大小在分配之前就报错（写出要多少字节）。

【运行】python3 lecture02/transformer_lab.py
        # 自检：参数量 = 公式；带 / 不带 cache 的生成一致；Counter = analytic_ops；attention / RoPE = 独立参考
【依赖】numpy；../lecture01/ 的 llm_math（ModelConfig）与 course_utils。
"""

import math
import os
import sys
from dataclasses import dataclass, replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import fmt_si, format_table, save_figure  # noqa: E402,F401  save_figure：演示共用
from course_utils import check_array, check_bool, check_int, check_real  # noqa: E402  参数检查（第 1 讲起各讲共用）
from course_utils import check_choice, check_dtype, check_memory, check_seed  # noqa: E402
from llm_math import ModelConfig  # noqa: E402

# 逐元素运算每个元素记几次运算（粗估；只影响逐元素那几行，矩阵乘法的账与它们无关）
NORM_FLOPS = 4      # RMSNorm：平方、求和、乘 1/rms、乘增益
ROPE_FLOPS = 3      # RoPE：每一对 4 乘 2 加 = 每个数 3 次
SOFTMAX_FLOPS = 5   # 减最大值、exp（按 1 次记，其实贵得多）、求和、除
SWIGLU_FLOPS = 5    # sigmoid ≈ 3 次，再乘 g、乘 u
RESID_FLOPS = 1     # 残差加法


# =============================================================================
# 配置
# =============================================================================
_INT_FIELDS = ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_ff", "max_seq")


@dataclass(frozen=True)
class Config:
    """
    Llama 风格模型的结构参数。结构字段与第 1 讲 llm_math.ModelConfig 同名同义，另有运行时需要的几项。

    结构：vocab 词表大小；d_model 残差流宽度；n_layers 层数；n_heads query 头数；
          n_kv_heads K/V 头数（GQA 的组数 G）；d_head 每头维度；d_ff MLP 中间宽度。
    运行：max_seq KV cache 预分配长度（也是 generate 的上限）；rope_theta RoPE 基数（Llama 3 是 500000，
          RoFormer / Llama 2 是 10000）；tied lm_head 是否复用词嵌入；norm_eps RMSNorm 的小常数；name 打印用。
    约束（在 __post_init__ 里检查，违反就 ValueError/TypeError）：整数字段 ≥ 1；
          n_heads 是 n_kv_heads 的整数倍（每组 K/V 服务 n_heads/n_kv_heads 个 query 头）；
          d_head 为偶数（RoPE 把相邻两个数当一个二维向量转）；rope_theta > 1；norm_eps > 0。
    """
    vocab: int = 512
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    d_head: int = 16
    d_ff: int = 344
    max_seq: int = 256
    rope_theta: float = 1e4
    tied: bool = False
    norm_eps: float = 1e-5
    name: str = "tiny"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Config：name 必须是非空字符串，收到 {type(self.name).__name__} 类型的 {self.name!r}")
        for f in _INT_FIELDS:
            # check_int 返回 int：np.int64 → int（llm_math.ModelConfig 按 Python int 算）
            object.__setattr__(self, f, check_int(f, getattr(self, f), lo=1, where="Config"))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Config.n_heads={self.n_heads} 必须是 n_kv_heads={self.n_kv_heads} 的整数倍"
                             f"（可选的 n_kv_heads：{_divisors(self.n_heads)}）")
        if self.d_head % 2:
            raise ValueError(f"Config.d_head={self.d_head} 必须是偶数：RoPE 按相邻两个数成对旋转")
        check_real("rope_theta", self.rope_theta, lo=1.0, lo_open=True, where="Config")
        check_real("norm_eps", self.norm_eps, lo=0.0, lo_open=True, where="Config")
        object.__setattr__(self, "tied", check_bool("tied", self.tied, where="Config"))

    @property
    def group(self):
        """一组 K/V 被多少个 query 头共用：MHA 为 1，MQA 为 n_heads。"""
        H, G = self.n_heads, self.n_kv_heads
        return H // G

    def to_model_config(self):
        """换成第 1 讲的 ModelConfig，直接用那边的公式（参数量、FLOPs/token、KV 字节/token）。"""
        structure = {f: getattr(self, f) for f in _INT_FIELDS if f != "max_seq"}
        return ModelConfig(self.name, tied=self.tied, **structure)


def _divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


TINY = Config()   # 4 层、d=128、8 个 query 头、2 组 K/V（GQA，每组 4 头）、词表 512：笔记本上毫秒级


def config_like(cfg, **changes):
    """
    拷贝 cfg 并改几个字段，例：config_like(TINY, n_kv_heads=8) 是 TINY 的 MHA 版本。
    frozen dataclass 不能原地改，dataclasses.replace 会新建对象并重新跑 __post_init__ 的检查。
    """
    _check_cfg(cfg, "config_like")
    known = [f for f in _INT_FIELDS + ("rope_theta", "tied", "norm_eps", "name")]
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise TypeError(f"config_like：Config 没有字段 {', '.join(unknown)}；可改的字段：{', '.join(known)}")
    new_cfg = replace(cfg, **changes)
    return new_cfg


# =============================================================================
# 参数
# =============================================================================
def init_params(cfg, seed=0, dtype=np.float64, logit_std=2.0):
    """
    按 (cfg, seed) 确定性地生成一组随机参数（未训练）。

    尺度的选择（让前向的数值量级正常，而不是让模型"会说话"）：
      · 词嵌入 ~ N(0, 1)；RMSNorm 增益全 1。
      · 线性层 W[n_in, n_out] ~ N(0, 1/n_in)：输出方差 ≈ 输入方差。
      · 写回残差流的 Wo、W_down 再乘 1/√(2L)：2L 个分支叠加后残差流的方差不随层数增长。
      · lm_head ~ N(0, logit_std²/d)：logits 的标准差约 logit_std，输出分布不是近似均匀的
        （要比较量化前后的分布时，均匀分布看不出差别；量化本身在本课程之外）。
    返回 {"embed": [V, d], "layers": [每层 dict], "final_norm": [d], "lm_head": [d, V] 或 None（tied）}；
    每层 dict 的键：attn_norm, wq [d, H·dh], wk [d, G·dh], wv [d, G·dh], wo [H·dh, d], mlp_norm,
    w_gate [d, d_ff], w_up [d, d_ff], w_down [d_ff, d]。
    """
    gen, dtype, logit_std = _check_init(cfg, seed, dtype, logit_std)
    d, hd, kvd, f = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff
    branch_out = 1.0 / math.sqrt(2 * cfg.n_layers)

    def dense(n_in, n_out, gain=1.0):
        w = gen.standard_normal((n_in, n_out)) * (gain / math.sqrt(n_in))
        return w.astype(dtype)

    def one_layer():
        return dict(
            attn_norm=np.ones(d, dtype=dtype),
            wq=dense(d, hd), wk=dense(d, kvd), wv=dense(d, kvd), wo=dense(hd, d, branch_out),
            mlp_norm=np.ones(d, dtype=dtype),
            w_gate=dense(d, f), w_up=dense(d, f), w_down=dense(f, d, branch_out),
        )

    layers = [one_layer() for _ in range(cfg.n_layers)]
    embed = gen.standard_normal((cfg.vocab, d)).astype(dtype)
    head = None if cfg.tied else dense(d, cfg.vocab, logit_std)
    return {"embed": embed, "layers": layers, "final_norm": np.ones(d, dtype=dtype), "lm_head": head}


def lm_head_matrix(params):
    """输出投影 [d, vocab]：有独立的 lm_head 就用它，tied 时用词嵌入表的转置（一个视图，不复制）。"""
    _check_param_dict(params, "lm_head_matrix")
    head = params["lm_head"]
    return params["embed"].T if head is None else head


def count_params(params):
    """
    把所有数组的元素个数加起来。tied（lm_head 为 None）时输出投影不另算——和
    llm_math.ModelConfig.n_params 的约定相同。
    """
    _check_param_dict(params, "count_params")
    total = params["embed"].size + params["final_norm"].size
    total += 0 if params["lm_head"] is None else params["lm_head"].size
    total += sum(arr.size for layer in params["layers"] for arr in layer.values())
    return int(total)


def param_groups(params):
    """
    参数按用途分组计数：{"词嵌入", "注意力 Wq/Wk/Wv/Wo", "MLP", "RMSNorm 增益", "lm_head"}，总和 = count_params。
    01 演示用它说明"参数都花在哪儿"。
    """
    _check_param_dict(params, "param_groups")
    attn = sum(lp[k].size for lp in params["layers"] for k in ("wq", "wk", "wv", "wo"))
    mlp = sum(lp[k].size for lp in params["layers"] for k in ("w_gate", "w_up", "w_down"))
    norms = params["final_norm"].size + sum(lp[k].size for lp in params["layers"] for k in ("attn_norm", "mlp_norm"))
    head = 0 if params["lm_head"] is None else params["lm_head"].size
    return {"词嵌入": int(params["embed"].size), "注意力 Wq/Wk/Wv/Wo": int(attn), "MLP": int(mlp),
            "RMSNorm 增益": int(norms), "lm_head": int(head)}


# =============================================================================
# 账本
# =============================================================================
class Counter:
    """
    按运算名（"q_proj"、"attn_core"……）累计一次或多次前向的开销。每个运算名一行，列为：
        flops  实际执行的浮点运算数
        useful 其中真正需要的部分（只有注意力核心与其 softmax 会小于 flops：被因果掩码挡掉的不算）
        w      读权重的字节
        kv     读 / 写 KV cache 的字节
        act    读写激活的字节（按"每个运算一个内核、输入输出都经过显存"估计）
        calls  记了几笔
    用法：c = Counter(bytes_per_elem=2); forward(..., counter=c); c.total("flops", ops=MATMUL_OPS)
    bytes_per_elem 只把"元素个数"换算成字节，不影响 FLOPs。
    """

    FIELDS = tuple("flops useful w kv act calls".split())

    def __init__(self, bytes_per_elem=2.0):
        # 每个元素几个字节
        self.bpe = check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True, where="Counter")
        self.rows = {}

    def add(self, op, flops=0, useful=None, w_elems=0, kv_elems=0, act_elems=0):
        """记一笔：运算数、有用运算数（None = 与 flops 相同），以及权重 / KV / 激活的**元素个数**。
        都是 ≥ 0 的整数（numpy 整数也行），useful ≤ flops；op 是非空字符串。常见情形（Python int）只花一次类型比较。"""
        if type(op) is not str or not all(type(v) is int and v >= 0 for v in (flops, w_elems, kv_elems, act_elems)) \
                or (useful is not None and not (type(useful) is int and 0 <= useful <= flops)):
            op, flops, useful, w_elems, kv_elems, act_elems = _check_add(op, flops, useful, w_elems, kv_elems,
                                                                         act_elems)
        row = self.rows.get(op)
        if row is None:
            row = self.rows[op] = dict.fromkeys(self.FIELDS, 0)
        row["flops"] += int(flops)
        row["useful"] += int(flops if useful is None else useful)
        row["w"] += w_elems * self.bpe
        row["kv"] += kv_elems * self.bpe
        row["act"] += act_elems * self.bpe
        row["calls"] += 1

    def total(self, key, ops=None):
        """一列的和；给了 ops（运算名的集合）时只加这些行。"""
        check_choice("key", key, self.FIELDS, where="Counter.total")
        return sum_rows(self.rows, key, ops)

    def merged(self, groups):
        """按 {组名: [运算名, …]} 合并成 {组名: {列: 和}}；没列进任何组的运算不出现。"""
        return _merge_rows(self.rows, groups, self.FIELDS)


def _merge_rows(rows, groups, fields=("flops", "useful", "w", "kv", "act")):
    """Counter.rows 或 analytic_ops 的结果按组合并：{组名: {列: 这组各运算之和}}。"""
    _check_rows(rows, "_merge_rows")
    groups = _check_groups(groups, rows, "_merge_rows")
    for k in fields:
        check_choice("fields 的元素", k, Counter.FIELDS, where="_merge_rows")
    return {g: {k: sum(rows[n][k] for n in names if n in rows) for k in fields} for g, names in groups.items()}


# 运算名分组。MATMUL_OPS 恰好对应 llm_math.matmul_params 里的那些矩阵（lm_head 即使 tied 也要乘一次）。
ATTN_PROJ_OPS = tuple(f"{w}_proj" for w in "qkvo")                    # q_proj k_proj v_proj o_proj
MLP_OPS = tuple(f"mlp_{w}" for w in ("gate", "up", "down"))
MATMUL_OPS = ATTN_PROJ_OPS + MLP_OPS + ("lm_head",)
ATTN_CORE_OPS: tuple = ("attn_core",)
ELEMENTWISE_OPS = tuple("norm rope softmax swiglu residual".split())
OP_GROUPS = {                                   # 组名 → 运算名（打印表格用；顺序 = 数据流的顺序）
    "嵌入查表": ["embed"],
    "q/k/v/o 投影": list(ATTN_PROJ_OPS),
    "注意力核心": list(ATTN_CORE_OPS),
    "KV cache 写入": ["kv_write"],
    "MLP 三个矩阵": list(MLP_OPS),
    "lm_head": ["lm_head"],
    "逐元素运算": list(ELEMENTWISE_OPS),
}


def ops_table(rows, groups=None, title=None):
    """
    把 Counter.rows 或 analytic_ops 的结果排成一张对齐的表（返回字符串）：每组一行，列为 FLOPs、useful、
    权重 / KV / 激活字节，以及这一组占总 FLOPs、总字节的百分比；最后一行是合计。
    groups 默认 OP_GROUPS；传 "ops" 则每个运算名单独一行（按第一次出现的顺序，即数据流的顺序）。
    """
    _check_rows(rows, "ops_table")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"ops_table：title 必须是字符串或 None，收到 {type(title).__name__}")
    if isinstance(groups, str):
        check_choice("groups", groups, ("ops",), where="ops_table")
    first_col = "运算" if groups == "ops" else "运算组"
    if groups == "ops":
        groups = {op: [op] for op in rows}
    elif groups is None:
        groups = OP_GROUPS
    merged = _merge_rows(rows, groups)
    tot = {k: sum(r[k] for r in merged.values()) for k in ("flops", "useful", "w", "kv", "act")}
    all_bytes = tot["w"] + tot["kv"] + tot["act"]
    body = []
    for name, r in list(merged.items()) + [("合计", tot)]:
        nbytes = r["w"] + r["kv"] + r["act"]
        body.append([name, fmt_si(r["flops"]), fmt_si(r["useful"]), fmt_si(r["w"], "B"), fmt_si(r["kv"], "B"),
                     fmt_si(r["act"], "B"), f"{100 * r['flops'] / max(tot['flops'], 1):.1f}",
                     f"{100 * nbytes / max(all_bytes, 1):.1f}"])
    table = format_table([first_col, "FLOPs", "useful", "权重", "KV", "激活", "FLOPs %", "字节 %"], body)
    return table if title is None else f"{title}\n{table}"


# =============================================================================
# 积木
# =============================================================================
def linear(x, W, op, counter=None):
    """
    y = x·W 并记账。x [..., K]（前面的维度都算作 M 行），W [K, N]，返回 [..., N]。
    积木（linear、rms_norm、apply_rope、silu）只查 dtype 和形状（O(1)），不扫描数值：它们在每一步解码的热路径上，
    NaN 进来就 NaN 出去；forward / generate 在入口查 tokens 和参数的形状、dtype。
    记：FLOPs 2MKN；权重 KN；激活 MK（读）+ MN（写）。
    """
    x, W = _real_array("x", x, "linear"), _real_array("W", W, "linear")
    _check_op_counter(op, counter, "linear")
    if W.ndim != 2 or x.ndim < 1 or x.shape[-1] != W.shape[0]:
        raise ValueError(f"linear('{op}')：x 的最后一维 {x.shape[-1:]} 必须等于 W[K, N] 的 K，W 形状 {W.shape}")
    y = x @ W
    if counter is not None:
        _count_matmul(counter, op, x, W)
    return y


def _count_matmul(counter, op, x, W):
    """给 y = x·W（x [..., K]、W [K, N]）记一笔账：counter.add(op, flops=…, w_elems=…, act_elems=…)。"""
    # >>> 练习 2.3
    K, N = W.shape
    n_rows = x.size // K                        # M：x 前面所有维度合起来的行数
    counter.add(op, flops=2 * n_rows * K * N, w_elems=K * N, act_elems=n_rows * (K + N))
    # <<< 练习 2.3


def rms_norm(x, w, eps, counter=None):
    """
    RMSNorm：沿最后一维 x / √(mean(x²) + eps) · w。
    比 LayerNorm 少了减均值（少一次规约），Llama 全系列使用。w 的形状必须是 [x.shape[-1]]。
    eps 必须是 > 0 的有限数：eps ≤ 0 时全零（或很小）的行会除以 0 或给负数开方，得到 inf / NaN。
    """
    eps = check_real("eps", eps, lo=0.0, lo_open=True, where="rms_norm")
    x, w = _real_array("x", x, "rms_norm"), _real_array("w", w, "rms_norm")
    _check_op_counter("norm", counter, "rms_norm")
    if x.ndim < 1 or w.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm：增益 w 的形状 {w.shape} 必须等于 x 的最后一维 {x.shape[-1:]}")
    if counter is not None:
        counter.add("norm", act_elems=2 * x.size, flops=NORM_FLOPS * x.size)
    mean_sq = np.square(x).sum(axis=-1, keepdims=True) / x.shape[-1]    # = np.mean，少一层 Python 包装
    return x / np.sqrt(mean_sq + eps) * w


def rope_angles(positions, d_head, theta=10000.0):
    """
    RoPE 的角度表。位置 p、第 i 对分量（i = 0 … d_head/2 − 1）转 p · θ^(−2i/d_head) 弧度。
    返回 (cos, sin)，形状都是 [len(positions), d_head/2]。
    直觉：每一对分量是一根转速不同的指针——靠前的对转得快（分辨近邻），靠后的转得慢（分辨远处）；
    频率序列与原始 Transformer 的正弦位置编码一样。
    theta 必须是 > 1 的有限数：θ = 1 时每一对转速相同（不再有快慢指针），θ ≤ 0 时 θ^(−x) 是 inf / NaN。
    """
    d_head = check_int("d_head", d_head, lo=2, where="rope_angles", type_error=ValueError)
    if d_head % 2:
        raise ValueError(f"rope_angles：d_head 必须是 ≥ 2 的偶数，收到 {d_head!r}")
    theta = check_real("theta", theta, lo=1.0, lo_open=True, where="rope_angles")
    pos = np.asarray(positions)
    if pos.ndim != 1:
        raise ValueError(f"rope_angles：positions 必须是一维的位置序列，收到形状 {pos.shape}")
    if pos.dtype.kind == "b":
        raise TypeError("rope_angles：positions 必须是整数或实数位置，收到 dtype=bool")
    if pos.dtype.kind not in "iu":                                 # 整数位置（forward 里总是）天然有限
        pos = check_array("positions", pos, where="rope_angles")    # 其余：实数、有限（NaN / ±∞ 报错）
    check_memory("positions × d_head", 3 * 8 * pos.size * (d_head // 2), where="rope_angles")   # 角度、cos、sin
    # >>> 练习 2.1
    freqs = theta ** (np.arange(d_head // 2) * (-2.0 / d_head))      # [dh/2]
    angles = pos[:, None] * freqs                                      # [T, dh/2]
    return np.cos(angles), np.sin(angles)
    # <<< 练习 2.1


def apply_rope(x, cos, sin, counter=None):
    """
    对 x [B, T, 头数, dh] 做旋转位置编码：分量 (2i, 2i+1) 看成平面向量 (a, b)，转过对应角度 φ：
        (a, b) → (a·cosφ − b·sinφ, a·sinφ + b·cosφ)
    query 在位置 m 转 mφ、key 在位置 n 转 nφ，二者的点积只剩 (m − n)φ：分数只依赖相对位置（02 演示验证）。
    cos / sin 的形状必须是 [T, dh/2]（rope_angles 的输出）。
    整数的 x 按 float64 算（结果不截断回整数）；非实数 dtype → TypeError。
    注意成对方式：这里是"相邻两个数一对"（RoFormer 论文）；Hugging Face 的 Llama 用"前半与后半配对"，
    两者只差一个固定的维度排列，数学上等价，但权重不能不经换位直接混用。
    """
    x = _real_array("x", x, "apply_rope")
    cos, sin = _real_array("cos", cos, "apply_rope"), _real_array("sin", sin, "apply_rope")
    _check_op_counter("rope", counter, "apply_rope")
    if x.ndim != 4 or cos.shape != sin.shape or cos.shape != (x.shape[1], x.shape[-1] // 2) or x.shape[-1] % 2:
        raise ValueError(f"apply_rope：x 应为 [B, T, 头数, dh]（dh 偶数）且 cos/sin 为 [T, dh/2]；"
                         f"收到 x {x.shape}、cos {cos.shape}、sin {sin.shape}")
    if counter is not None:
        counter.add("rope", act_elems=2 * x.size, flops=ROPE_FLOPS * x.size)
    # >>> 练习 2.1
    c, s = cos[:, None, :], sin[:, None, :]           # [T, 1, dh/2]，与 [B, T, 头数, dh/2] 广播
    even, odd = x[..., ::2], x[..., 1::2]             # [B, T, 头数, dh/2]
    out = np.empty_like(x) if x.dtype.kind == "f" else np.empty(x.shape)   # 整数 x：结果是 float64，不截断
    out[..., ::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out
    # <<< 练习 2.1


def softmax(x, axis=-1):
    """
    数值稳定的 softmax：先减去该轴最大值再取 exp，结果与原式相同但不会溢出。
    某一行全是 −∞（全被掩掉）或含 NaN/+∞ 时结果无意义，这里直接 ValueError，而不是悄悄返回 NaN。
    x 是整数或浮点数组（bool、字符串 → TypeError；空数组、标量 → ValueError）；axis 是 −ndim … ndim−1 的整数。
    """
    x = _real_array("x", x, "softmax", allow_bool=False)
    if x.ndim == 0 or x.size == 0:
        raise ValueError(f"softmax：x 不能是标量或空数组，收到形状 {x.shape}")
    axis = check_int("axis", axis, lo=-x.ndim, hi=x.ndim - 1, where="softmax")
    top = x.max(axis=axis, keepdims=True)
    if not np.isfinite(top).all():
        raise ValueError("softmax：x 有一行全是 −∞（所有位置都被掩掉）或含 NaN/+∞，归一化无定义")
    e = np.exp(x - top)
    return e / e.sum(axis=axis, keepdims=True)


def silu(x):
    """
    SiLU(x) = x · sigmoid(x) = x / (1 + e^{−x})。
    x 很负（< −709）时 e^{−x} 溢出成 inf，商是 −0：真值的绝对值小于 1e-305，这就是正确的舍入结果；
    所以只需关掉那条溢出警告（errstate），不必按符号分两支（那样多 3 次逐元素运算，生成时慢约 10%）。
    """
    x = _real_array("x", x, "silu", allow_bool=False)
    with np.errstate(over="ignore"):
        den = np.exp(-x)
    den += 1.0
    return x / den


def _causal_pairs(T, S, q_pos0):
    """因果掩码下允许的 (query, key) 对数：query i（位置 q_pos0+i）能看 min(q_pos0+i+1, S) 个键。"""
    return int(np.minimum(q_pos0 + np.arange(T) + 1, S).sum())


def attention_core(q, k, v, q_pos0, counter=None, causal=True):
    """
    softmax(Q·Kᵀ/√dh + 掩码)·V，支持 GQA。

    参数
        q      [B, T, H, dh]：T 个查询，绝对位置 q_pos0 … q_pos0+T−1
        k, v   [B, S, G, dh]：S 个键 / 值，位置 0 … S−1（KV cache 里的旧 token 在前，这次的新 token 在后）
        q_pos0 第一个查询的位置；causal=True 时查询 i 只看位置 ≤ q_pos0+i 的键。
               前向里总有 q_pos0 = S − T，即掩码"右下对齐"（同 flash-attn ≥ 2.1，不同于 PyTorch SDPA 的 is_causal）。
    返回 [B, T, H·dh]。
    GQA：H 个头分成 G 组，每组 R = H/G 个头共用一份 K/V。把 q 变形成 [B, G, R, T, dh]、K 加一个长度 1 的轴
        [B, G, 1, dh, S]，一次批量矩阵乘就让每组的 R 个头对着同一组 K/V 算：G = H 是 MHA，G = 1 是 MQA。
    记账：见模块开头；softmax 另记一行，只有运算没有字节（融合内核里分数留在片上）。
    """
    q, k, v, causal = _check_attention_shapes(q, k, v, q_pos0, causal, counter)
    B, T, H, dh = q.shape
    _, S, G, _ = k.shape
    if counter is not None:
        pairs = _causal_pairs(T, S, q_pos0) if causal else T * S
        counter.add("attn_core", flops=4 * B * T * S * H * dh, useful=4 * B * pairs * H * dh,
                    act_elems=2 * B * T * H * dh, kv_elems=2 * B * S * G * dh)
        counter.add("softmax", flops=SOFTMAX_FLOPS * B * H * T * S, useful=SOFTMAX_FLOPS * B * H * pairs)
    # >>> 练习 2.2
    # 两次乘法就是 einsum("btgrd,bsgd->bgrts", ·) 和 einsum("bgrts,bsgd->btgrd", ·)；写成批量矩阵乘（@）是因为
    # numpy 的 @ 走 BLAS，比 einsum 的通用循环快 2–15 倍（prefill、上千个样本的批里差得最多）。
    qg = q.reshape(B, T, G, H // G, dh).transpose(0, 2, 3, 1, 4)              # [B, G, R, T, dh]
    kt = k.transpose(0, 2, 3, 1)[:, :, None]                                   # [B, G, 1, dh, S]
    scores = (qg @ kt) * (1.0 / math.sqrt(dh))                                 # [B, G, R, T, S]
    if causal and q_pos0 < S - 1:                     # decode（一个查询在最后）看得见全部键，不用掩码
        visible = np.arange(S)[None, :] <= (q_pos0 + np.arange(T))[:, None]   # [T, S]
        scores = np.where(visible, scores, -np.inf)
    probs = softmax(scores, axis=-1)
    out = (probs @ v.transpose(0, 2, 1, 3)[:, :, None]).transpose(0, 3, 1, 2, 4)   # [B, T, G, R, dh]
    return out.reshape(B, T, -1)                                               # [B, T, H·dh]
    # <<< 练习 2.2


# =============================================================================
# KV cache
# =============================================================================
class KVCache:
    """
    预分配的 KV cache：k、v 各是 [L, B, max_len, G, dh]。

    为什么能缓存：因果掩码下位置 j 的 K、V 只由 token 0…j 决定，后来的 token 改变不了它们，
        所以解码第 t 步时前面 t−1 个位置的 K、V 直接拿来用（04 演示验证）。
    用法（forward 内部）：每层先 write(layer, k_new, v_new) 写到位置 length…length+T−1，
        再 read(layer, length+T) 取出全部；整次前向结束后 length += T。
    length 可以直接改小（投机解码回滚草稿，第 6 讲），之后的写入会覆盖旧数据；但不能越过 [0, max_len]。
    dtype 必须是浮点（整数缓存会把 K、V 截断）；放不进本机内存的 batch × max_len 在分配之前报 ValueError。
    越界写（溢出）、读还没写过的位置、形状与 cache 不符都抛 ValueError——真实引擎遇到容量不足会
        换出、重算或拒绝请求（分页与抢占在本课程之外，见 vLLM 论文 [S60]），绝不会默默算错。
    """

    def __init__(self, cfg, batch, max_len=None, dtype=np.float64):
        _check_cfg(cfg, "KVCache")
        max_len = cfg.max_seq if max_len is None else max_len
        for name, val in (("batch", batch), ("max_len", max_len)):
            check_int(name, val, lo=1, where="KVCache", type_error=ValueError)
        dtype = check_dtype("dtype", dtype, "f", where="KVCache")             # 整数缓存会把 K、V 截断
        shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.d_head)   # [L, B, max_len, G, dh]
        check_memory("batch × max_len", 2 * math.prod(shape) * dtype.itemsize, where="KVCache")
        self.k, self.v = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.max_len = int(max_len)
        self.cfg = cfg
        self._pending = {}           # layer → (写入起点, 写入个数)：本次前向已写、length 尚未推进的部分
        self._length = 0

    @property
    def length(self):
        """已经提交的位置数（批内所有序列一样长）。"""
        return self._length

    @length.setter
    def length(self, value):
        self._length = check_int("KVCache.length", value, lo=0, hi=self.max_len, type_error=ValueError)
        self._pending = {}           # 提交（或回滚）之后，没有"写了但未提交"的位置

    def write(self, layer, k_new, v_new):
        """把第 layer 层 T 个新位置的 K、V（[B, T, G, dh]）写到 length … length+T−1。"""
        if type(layer) is not int:
            layer = check_int("layer", layer, lo=0, where="KVCache.write", type_error=ValueError)
        if not (isinstance(k_new, np.ndarray) and isinstance(v_new, np.ndarray)) or k_new.dtype.kind not in "iuf" \
                or v_new.dtype.kind not in "iuf":
            raise TypeError(f"KVCache.write：k_new、v_new 必须是实数 numpy 数组，收到 {type(k_new).__name__} / "
                            f"{type(v_new).__name__}（dtype {getattr(k_new, 'dtype', '?')} / "
                            f"{getattr(v_new, 'dtype', '?')}）")
        want = (self.k.shape[1], k_new.shape[1] if k_new.ndim == 4 else -1) + self.k.shape[3:]
        if k_new.shape != v_new.shape or k_new.shape != want:
            raise ValueError(f"KVCache.write：k_new / v_new 应为 [B, T, G, dh] = [{self.k.shape[1]}, T, "
                             f"{self.k.shape[3]}, {self.k.shape[4]}]，收到 {k_new.shape} / {v_new.shape}")
        if not 0 <= layer < self.k.shape[0]:
            raise ValueError(f"KVCache.write：layer 必须在 0…{self.k.shape[0] - 1}，收到 {layer}")
        start, T = self._length, k_new.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"KV cache 溢出：已有 {start} 个位置，再写 {T} 个超过 max_len={self.max_len}")
        self.k[layer, :, start:start + T] = k_new
        self.v[layer, :, start:start + T] = v_new
        self._pending[layer] = (start, T)

    def read(self, layer, upto):
        """第 layer 层位置 0 … upto−1 的 K、V（切片是视图，不复制）；upto 不能超过已写入的位置。"""
        if type(layer) is not int or type(upto) is not int:
            layer = check_int("layer", layer, lo=0, where="KVCache.read", type_error=ValueError)
            upto = check_int("upto", upto, lo=1, where="KVCache.read", type_error=ValueError)
        if not 0 <= layer < self.k.shape[0]:
            raise ValueError(f"KVCache.read：layer 必须在 0…{self.k.shape[0] - 1}，收到 {layer}")
        start, T = self._pending.get(layer, (-1, 0))
        filled = start + T if start == self._length else self._length
        if not 0 < upto <= filled:
            raise ValueError(f"KVCache.read：upto 必须在 1…{filled}（第 {layer} 层已写入的位置数），收到 {upto}")
        span = slice(0, upto)
        return self.k[layer, :, span], self.v[layer, :, span]

    def nbytes(self, bytes_per_elem=2.0):
        """已提交部分按 bytes_per_elem 计的大小 = 2 · L · B · length · G · dh · 字节数。"""
        bytes_per_elem = check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True, where="KVCache.nbytes")
        n_layers, batch, _, groups, dh = self.k.shape
        return 2 * n_layers * batch * self._length * groups * dh * bytes_per_elem


# =============================================================================
# 前向与生成
# =============================================================================
def _matmul(x, W, op, layer, counter, linear_fn):
    """前向里所有"x·W"都走这里：默认用 linear；给了 linear_fn 就用它算（例如量化乘法），账照普通矩阵乘记。"""
    if linear_fn is None:
        return linear(x, W, op, counter=counter)
    out = linear_fn(x, W, op, layer)
    if out.shape != x.shape[:-1] + (W.shape[1],):
        raise ValueError(f"linear_fn('{op}') 返回形状 {out.shape}，应为 {x.shape[:-1] + (W.shape[1],)}")
    if counter is not None:
        _count_matmul(counter, op, x, W)
    return out


def _residual(x, delta, counter):
    out = x + delta
    if counter is not None:
        counter.add("residual", flops=RESID_FLOPS * out.size, act_elems=3 * out.size)   # 读两份、写一份
    return out


def _attention_block(x, lp, li, cfg, rope, cache, pos0, counter, linear_fn, causal):
    """一层的注意力分支：norm → q/k/v 投影 → RoPE → （写 / 读 cache）→ 注意力 → Wo。返回 [B, T, d]。"""
    B, T, _ = x.shape
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    h = rms_norm(x, lp["attn_norm"], eps=cfg.norm_eps, counter=counter)
    q = _matmul(h, lp["wq"], "q_proj", li, counter, linear_fn).reshape(B, T, H, dh)   # [B, T, H, dh]
    k = _matmul(h, lp["wk"], "k_proj", li, counter, linear_fn).reshape(B, T, G, dh)   # [B, T, G, dh]
    v = _matmul(h, lp["wv"], "v_proj", li, counter, linear_fn).reshape(B, T, G, dh)
    if rope is not None:
        q, k = apply_rope(q, *rope, counter), apply_rope(k, *rope, counter)
    if cache is not None:
        cache.write(li, k, v)
        if counter is not None:
            counter.add("kv_write", kv_elems=2 * k.size)                           # K 与 V 同样大
        k, v = cache.read(li, pos0 + T)                                               # [B, pos0+T, G, dh]
    a = attention_core(q, k, v, pos0, counter, causal=causal)                          # [B, T, H·dh]
    return _matmul(a, lp["wo"], "o_proj", li, counter, linear_fn)


def _mlp_block(x, lp, li, cfg, counter, linear_fn):
    """一层的 SwiGLU 分支：norm → SiLU(h·Wg) ⊙ (h·Wu) → ·Wd。返回 [B, T, d]。"""
    h = rms_norm(x, lp["mlp_norm"], eps=cfg.norm_eps, counter=counter)
    gate = _matmul(h, lp["w_gate"], "mlp_gate", li, counter, linear_fn)               # [B, T, d_ff]
    up = _matmul(h, lp["w_up"], "mlp_up", li, counter, linear_fn)
    m = silu(gate) * up
    if counter is not None:
        counter.add("swiglu", flops=SWIGLU_FLOPS * m.size, act_elems=3 * m.size)     # 读 gate、up，写 m
    return _matmul(m, lp["w_down"], "mlp_down", li, counter, linear_fn)


def forward(params, cfg, tokens, cache=None, counter=None, last_only=False, linear_fn=None,
            use_rope=True, causal=True, return_hidden=False, rope_pos0=None):
    """
    一批 token 的一次前向。cache=None 时整段计算（prefill / 训练式前向）；
    有 cache 时，新 token 接在 cache 已有的 cache.length 个位置之后（解码时 T = 1），结束时 length += T。

    参数
        tokens      [B, T] 整数，取值 [0, vocab)
        cache       KVCache 或 None；批大小、层数、G、dh 要与 cfg / tokens 一致，剩余容量要放得下 T
        counter     Counter 或 None
        last_only   只对最后一个位置算 lm_head（生成时只要最后一个 logits，省掉 (T−1)/T 的 lm_head）
        linear_fn   可选的 linear_fn(x, W, op, layer) → y，替换所有"x·W"（例如插入量化乘法；量化在本课程之外）；
                    layer 是层号，lm_head 为 None；记账仍按普通矩阵乘
        use_rope    False：不加位置编码（02 演示：没有位置信息会怎样）
        causal      False：双向注意力（02 演示：未来信息泄漏）
        return_hidden  另外返回最后一层输出的隐藏状态 [B, T, d]（final norm 之前、last_only 截取之前）
        rope_pos0   RoPE 的起始位置；None = cache.length（正确做法）。真实引擎显式传 position ids，
                    04 演示用它复现"位置编号写错"的 bug。注意它只影响 RoPE，不影响掩码。
    返回 logits [B, T, vocab]（last_only 时 [B, 1, vocab]）；return_hidden 时 (logits, hidden)。
    """
    tokens, rope_pos0 = _check_forward(params, cfg, tokens, cache, rope_pos0, counter, linear_fn,
                                       last_only=last_only, use_rope=use_rope, causal=causal,
                                       return_hidden=return_hidden)
    return _forward(params, cfg, tokens, cache=cache, counter=counter, last_only=last_only, linear_fn=linear_fn,
                    use_rope=use_rope, causal=causal, return_hidden=return_hidden, rope_pos0=rope_pos0)


def _forward(params, cfg, tokens, cache=None, counter=None, last_only=False, linear_fn=None, use_rope=True,
             causal=True, return_hidden=False, rope_pos0=None):
    """forward 的计算部分（输入已检查）。generate 检查一次之后直接调它：每步新 token 来自 argmax，不必再查。"""
    B, T = tokens.shape
    pos0 = 0 if cache is None else cache.length
    if rope_pos0 is None:
        rope_pos0 = pos0
    rope = rope_angles(np.arange(rope_pos0, rope_pos0 + T), cfg.d_head, cfg.rope_theta) if use_rope else None

    x = params["embed"][tokens]                                                        # [B, T, d]
    if counter is not None:
        counter.add("embed", w_elems=x.size, act_elems=x.size)                         # 读 B·T 行嵌入，写出
    for li, weights in enumerate(params["layers"]):
        x = _residual(x, _attention_block(x, weights, li, cfg, rope, cache, pos0, counter, linear_fn, causal),
                      counter)
        x = _residual(x, _mlp_block(x, weights, li, cfg, counter, linear_fn), counter)
    if cache is not None:
        cache.length = pos0 + T
    hidden = x
    if last_only:
        x = x[:, -1:]                                                                  # [B, 1, d]
    x = rms_norm(x, params["final_norm"], eps=cfg.norm_eps, counter=counter)
    logits = _matmul(x, lm_head_matrix(params), "lm_head", None, counter, linear_fn)   # [B, T or 1, vocab]
    if return_hidden:
        return logits, hidden
    return logits


def generate(params, cfg, prompt, n_new, use_cache=True, counter_prefill=None, counter_decode=None):
    """
    贪心生成 n_new 个 token（每步取 argmax）。

    use_cache=True：prefill 一次处理整段提示并写 cache，之后每步只喂 1 个新 token（共 n_new−1 次解码前向）。
    use_cache=False：每一步把到目前为止的整段序列从头再算一遍，只取最后一个位置。
    两者数学上相同（04 演示与自检验证到 1e-9），差别只在运算量。
    counter_prefill 记第一次前向，counter_decode 记之后的每一次（都可为 None）。
    返回 (tokens [B, T0 + n_new], 每一步的 logits 列表，每个 [B, vocab])。
    prompt 长度 + n_new 不能超过 cfg.max_seq。
    """
    _check_params(params, cfg)
    prompt = _check_tokens(prompt, cfg)
    n_new = check_int("n_new", n_new, lo=0, where="generate")
    check_bool("use_cache", use_cache, where="generate")
    _check_op_counter("generate", counter_prefill, "generate", "counter_prefill")
    _check_op_counter("generate", counter_decode, "generate", "counter_decode")
    B, T0 = prompt.shape
    final_len = T0 + n_new
    if final_len > cfg.max_seq:
        raise ValueError(f"generate：提示长度 {T0} + 生成 n_new={n_new} = {final_len} 超过 cfg.max_seq={cfg.max_seq}")
    seq = prompt.copy()
    per_step = []
    cache = KVCache(cfg, B, dtype=params["embed"].dtype) if use_cache else None
    feed = seq                                       # 这一步要喂给模型的 token
    for step in range(n_new):
        counter = counter_prefill if step == 0 else counter_decode
        # 输入在开头查过一次；之后每步的 token 来自 argmax，所以直接调计算部分 _forward
        logits = _forward(params, cfg, feed, cache=cache, counter=counter, last_only=True)[:, -1]   # [B, vocab]
        per_step.append(logits)
        nxt = np.argmax(logits, axis=-1)[:, None]    # [B, 1]
        seq = np.concatenate([seq, nxt], axis=1)
        feed = nxt if use_cache else seq
    return seq, per_step


# =============================================================================
# 同一本账的解析公式
# =============================================================================
def analytic_ops(cfg, batch, n_new, pos0=0, bytes_per_elem=2.0, last_only=False, with_cache=True,
                 causal=True, use_rope=True):
    """
    不运行模型，用公式写出一次前向的逐运算账本，约定与 Counter 完全相同（所以两者应逐项相等）。

    场景：batch 个序列，每个已有 pos0 个缓存位置，这次新来 n_new 个 token（prefill：pos0=0；解码一步：n_new=1）。
    cfg 可以是 Config，也可以是 llm_math.ModelConfig（只用结构字段）——于是可以直接算 Llama-3.1-70B。
    with_cache：是否记"写 KV cache"那一行；last_only：lm_head 是否只算最后一个位置；
    causal / use_rope：与 forward 的同名开关对应。
    返回 {运算名: {"flops", "useful", "w", "kv", "act"}}（没有 calls 列）。
    """
    _check_structure(cfg, "analytic_ops")
    for name, val in (("batch", batch), ("n_new", n_new), ("pos0", pos0)):
        check_int(name, val, lo=0 if name == "pos0" else 1, where="analytic_ops")
    for name, flag in (("last_only", last_only), ("with_cache", with_cache), ("causal", causal),
                       ("use_rope", use_rope)):
        check_bool(name, flag, where="analytic_ops")
    bytes_per_elem = check_real("bytes_per_elem", bytes_per_elem, lo=0.0, lo_open=True, where="analytic_ops")
    L, d, f, V = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    B, T = batch, n_new
    S = pos0 + T                                # 每个查询最多能看到的键数
    M = B * T                                   # 这次前向经过的 token 数（每个矩阵乘的行数）
    pairs = T * pos0 + T * (T + 1) // 2 if causal else T * S   # 新 token i 看 pos0+i+1 个键
    rows = {}

    def put(op, times, flops=0, useful=None, w=0, kv=0, act=0):
        r = rows.setdefault(op, dict(flops=0, useful=0, w=0.0, kv=0.0, act=0.0))
        r["flops"] += times * flops
        r["useful"] += times * (flops if useful is None else useful)
        r["w"] += times * w * bytes_per_elem
        r["kv"] += times * kv * bytes_per_elem
        r["act"] += times * act * bytes_per_elem

    def matmul(op, times, m, k, n):
        put(op, times, flops=2 * m * k * n, w=k * n, act=m * (k + n))

    put("embed", 1, w=M * d, act=M * d)
    put("norm", 2 * L, flops=NORM_FLOPS * M * d, act=2 * M * d)             # 每层两个 norm
    matmul("q_proj", L, M, d, H * dh)
    matmul("k_proj", L, M, d, G * dh)
    matmul("v_proj", L, M, d, G * dh)
    if use_rope:                                                            # q 与 k 各转一次
        put("rope", L, flops=ROPE_FLOPS * M * (H + G) * dh, act=2 * M * (H + G) * dh)
    if with_cache:
        put("kv_write", L, kv=2 * M * G * dh)
    put("attn_core", L, flops=4 * B * T * S * H * dh, useful=4 * B * pairs * H * dh,
        kv=2 * B * S * G * dh, act=2 * M * H * dh)
    put("softmax", L, flops=SOFTMAX_FLOPS * B * H * T * S, useful=SOFTMAX_FLOPS * B * H * pairs)
    matmul("o_proj", L, M, H * dh, d)
    put("residual", 2 * L, flops=RESID_FLOPS * M * d, act=3 * M * d)
    matmul("mlp_gate", L, M, d, f)
    matmul("mlp_up", L, M, d, f)
    put("swiglu", L, flops=SWIGLU_FLOPS * M * f, act=3 * M * f)
    matmul("mlp_down", L, M, f, d)
    head_rows = B if last_only else M
    put("norm", 1, flops=NORM_FLOPS * head_rows * d, act=2 * head_rows * d)   # 最终 norm
    matmul("lm_head", 1, head_rows, d, V)
    return rows


def sum_rows(rows, key, ops=None):
    """账本（Counter.rows 或 analytic_ops 的结果）某一列的和；ops 给出时只加这些运算名。"""
    _check_rows(rows, "sum_rows")
    check_choice("key", key, Counter.FIELDS, where="sum_rows")
    if ops is not None:
        ops = set(_check_op_names(ops, rows, "sum_rows"))
    return sum(row[key] for op, row in rows.items() if ops is None or op in ops)


def phase_costs(cfg, batch, n_new, pos0=0, bytes_per_elem=2.0, last_only=False):
    """
    把 analytic_ops 汇总成一个阶段（prefill 或一步解码）的几个数：
        flops、useful（总 FLOPs / 有用 FLOPs）、w、kv、act（字节）、bytes（三者之和）、
        tokens（这次处理的 token 数 = batch·n_new）、
        intensity = flops / bytes（FLOPs/字节，与芯片的 ridge point 比较）。
    03 与 05 演示用它比较 prefill 和 decode。
    """
    rows = analytic_ops(cfg, batch, n_new, pos0, bytes_per_elem, last_only=last_only)
    out = {k: sum_rows(rows, k) for k in ("flops", "useful", "w", "kv", "act")}
    out["bytes"] = out["w"] + out["kv"] + out["act"]
    out["tokens"] = batch * n_new
    out["intensity"] = out["flops"] / out["bytes"]
    return out


# =============================================================================
# einsum 记号与 FLOPs 规则
# =============================================================================
def einsum_flops(spec, *shapes):
    """
    How to Scale Your Model 第 4 章的规则：一个 einsum 收缩（至少两个操作数、且有字母被求和）的 FLOPs
    = 2 × 所有出现过的维度长度之积（每个字母只乘一次）：每一组下标组合做一次乘、一次加。
    没有被求和的字母时（纯逐元素乘），或只有一个操作数（纯求和 / 转置），每个下标组合记 1 次。

    参数 spec 形如 "btd,df->btf"（必须写出 "->" 与输出）；shapes 为每个操作数的形状（也可直接传数组）。
    例：einsum_flops("btd,df->btf", (2, 8, 64), (64, 256)) = 2·2·8·64·256（就是 2MKN）。
    坏输入（操作数个数、维数不符，同一字母长度不一致，输出里出现输入没有的字母）→ ValueError。
    """
    if not isinstance(spec, str) or spec.count("->") != 1:
        raise ValueError(f"einsum_flops：spec 必须是带一个 '->' 的字符串，如 'btd,df->btf'，收到 {spec!r}")
    lhs, out = spec.replace(" ", "").split("->")
    operands = lhs.split(",")
    if len(operands) != len(shapes):
        raise ValueError(f"einsum_flops：spec 有 {len(operands)} 个操作数，但给了 {len(shapes)} 个形状")
    sizes = {}
    for letters, shape in zip(operands, shapes):
        shape = getattr(shape, "shape", shape)
        if not isinstance(shape, (tuple, list)):
            raise TypeError(f"einsum_flops：操作数 '{letters}' 的 shapes 必须是形状元组（或数组），收到 {shape!r}")
        shape = tuple(shape)
        for n in shape:
            check_int(f"操作数 '{letters}' 的维度长度", n, lo=1, where="einsum_flops")
        if not letters.isalpha() or len(letters) != len(shape):
            raise ValueError(f"einsum_flops：操作数 '{letters}' 与形状 {shape} 的维数不一致（或含非字母）")
        for letter, n in zip(letters, shape):
            if sizes.setdefault(letter, n) != n:
                raise ValueError(f"einsum_flops：字母 '{letter}' 的长度不一致：{sizes[letter]} 与 {n}")
    if not set(out) <= set(sizes) or len(set(out)) != len(out):
        raise ValueError(f"einsum_flops：输出 '{out}' 只能用输入里出现过的字母、且每个至多一次")
    n_index = math.prod(sizes.values())
    contracted = set(sizes) - set(out)
    return 2 * n_index if contracted and len(operands) >= 2 else n_index


# =============================================================================
# 输入检查（放在教学代码之后：每个公开函数开头一行 _check_*，然后是数学）
# =============================================================================
def _check_params(params, cfg):
    """前向之前核对参数形状与 cfg 一致：形状不符时 numpy 常常照样能广播出一个错误的结果。
    每个数组还要是浮点 numpy 数组（整数权重会让 RMSNorm、softmax 的结果截断或溢出）。只看形状和 dtype（O(数组个数)），
    不扫描数值：逐个找 NaN 要把全部权重读一遍，每一步解码都付不起。"""
    _check_cfg(cfg, "forward")
    _check_param_dict(params, "forward")
    d, hd, kvd, f = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff
    want = {"attn_norm": (d,), "wq": (d, hd), "wk": (d, kvd), "wv": (d, kvd), "wo": (hd, d),
            "mlp_norm": (d,), "w_gate": (d, f), "w_up": (d, f), "w_down": (f, d)}
    arrays = [("params['embed']", params["embed"]), ("params['final_norm']", params["final_norm"])]
    arrays += [] if params["lm_head"] is None else [("params['lm_head']", params["lm_head"])]
    arrays += [(f"params['layers'][{i}]['{k}']", a) for i, lp in enumerate(params["layers"]) for k, a in lp.items()]
    for nm, a in arrays:
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            raise TypeError(f"{nm} 必须是浮点 numpy 数组，收到 {type(a).__name__}"
                            f"{'（dtype ' + str(a.dtype) + '）' if isinstance(a, np.ndarray) else ''}")
    if params["embed"].shape != (cfg.vocab, d):
        raise ValueError(f"params['embed'] 形状 {params['embed'].shape} 与 cfg 不符，应为 (vocab, d_model) = "
                         f"{(cfg.vocab, d)}")
    if len(params["layers"]) != cfg.n_layers:
        raise ValueError(f"params 有 {len(params['layers'])} 层，cfg.n_layers = {cfg.n_layers}")
    for i, layer in enumerate(params["layers"]):
        for key, shape in want.items():
            if key not in layer or layer[key].shape != shape:
                got = layer[key].shape if key in layer else "缺失"
                raise ValueError(f"params['layers'][{i}]['{key}'] 形状 {got}，按 cfg 应为 {shape}")
    if params["final_norm"].shape != (d,):
        raise ValueError(f"params['final_norm'] 形状 {params['final_norm'].shape}，应为 {(d,)}")
    head = params["lm_head"]
    if (head is None) != bool(cfg.tied):
        raise ValueError(f"cfg.tied={cfg.tied}，但 params['lm_head'] {'是' if head is None else '不是'} None")
    if head is not None and head.shape != (d, cfg.vocab):
        raise ValueError(f"params['lm_head'] 形状 {head.shape}，应为 (d_model, vocab) = {(d, cfg.vocab)}")


def _check_attention_shapes(q, k, v, q_pos0, causal, counter=None):
    """attention_core 的输入检查；返回检查过的 causal（bool）。"""
    causal = check_bool("causal", causal, where="attention_core")
    q, k, v = (_real_array(nm, a, "attention_core") for nm, a in (("q", q), ("k", k), ("v", v)))
    _check_op_counter("attn_core", counter, "attention_core")
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"attention_core：q 应为 [B, T, H, dh]，k、v 应为同形状的 [B, S, G, dh]；"
                         f"收到 q {q.shape}、k {k.shape}、v {v.shape}")
    B, T, H, dh = q.shape
    if k.shape[0] != B or k.shape[3] != dh or H % k.shape[2]:
        raise ValueError(f"attention_core：q {q.shape} 与 k {k.shape} 不配：批大小与 dh 要相同，"
                         f"H={H} 要是 G={k.shape[2]} 的整数倍")
    check_int("q_pos0", q_pos0, lo=0, where="attention_core", type_error=ValueError)
    if causal and q_pos0 + T > k.shape[1]:
        raise ValueError(f"attention_core：因果注意力里最后一个查询在位置 q_pos0+T−1 = {q_pos0 + T - 1}，"
                         f"但只有 S={k.shape[1]} 个键（它自己的键缺失）；前向里应有 q_pos0 = S − T")
    # 分数矩阵 [B, H, T, S]：float64 的分数、掩码后的分数、exp、概率 ≈ 4 份
    check_memory("q 的 T × k 的 S", 4 * 8 * B * H * T * k.shape[1], where="attention_core")
    return q, k, v, causal


def _check_tokens(tokens, cfg):
    """tokens 必须是 [B, T] 的整数数组、取值在 [0, vocab)：numpy 会把 −1 悄悄当成最后一个词。"""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens 必须是形状 [B, T]（B, T ≥ 1）的二维数组，收到形状 {tokens.shape}")
    if tokens.dtype == np.bool_ or not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"tokens 必须是整数数组，收到 dtype={tokens.dtype}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= cfg.vocab:
        raise ValueError(f"tokens 的 token id 必须在 [0, vocab={cfg.vocab}) 内，收到最小 {lo}、最大 {hi}")
    return tokens


def _check_forward(params, cfg, tokens, cache, rope_pos0, counter=None, linear_fn=None, **flags):
    """forward 的全部输入检查（flags：last_only / use_rope / causal / return_hidden）；返回 (tokens, rope_pos0)。"""
    _check_params(params, cfg)
    tokens = _check_tokens(tokens, cfg)
    for name, flag in flags.items():
        check_bool(name, flag, where="forward")
    _check_op_counter("forward", counter, "forward")
    if linear_fn is not None and not callable(linear_fn):
        raise TypeError(f"forward：linear_fn 必须是 None 或可调用的 linear_fn(x, W, op, layer)，"
                        f"收到 {type(linear_fn).__name__}")
    T = tokens.shape[1]
    pos0 = 0
    if cache is not None:
        if not all(hasattr(cache, a) for a in ("k", "v", "length", "max_len", "write", "read")):
            raise TypeError(f"forward：cache 必须是 None 或 transformer_lab.KVCache，收到 {type(cache).__name__}")
        _check_cache(cache, cfg, *tokens.shape)
        pos0 = cache.length
    if pos0 + T > cfg.max_seq:           # 和 generate 同一条上限：模型只为 max_seq 个位置设计（RoPE、缓存、掩码）
        raise ValueError(f"tokens：位置 {pos0} + {T} 个 token = {pos0 + T} 超过 cfg.max_seq={cfg.max_seq}"
                         f"（generate 也拒绝；要更长就用更大的 max_seq 建 Config）")
    if rope_pos0 is not None:
        rope_pos0 = check_int("rope_pos0", rope_pos0, lo=0, where="forward")
    return tokens, rope_pos0


def _check_init(cfg, seed, dtype, logit_std):
    """init_params 的输入：cfg 的字段、种子（course_utils.check_seed）、浮点 dtype、放得下的大小。"""
    _check_cfg(cfg, "init_params")
    logit_std = check_real("logit_std", logit_std, lo=0.0, lo_open=True, where="init_params")
    dtype = check_dtype("dtype", dtype, "f", where="init_params")     # 整数类型会把 N(0, 1/n) 的权重截断成 0
    d, hd, kvd, f, V = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff, cfg.vocab
    n = V * d + d + cfg.n_layers * (2 * d + d * hd + 2 * d * kvd + hd * d + 3 * d * f) + (0 if cfg.tied else d * V)
    biggest = max(V * d, d * f, d * hd)                                # 每个矩阵先按 float64 生成再转 dtype
    check_memory("cfg 的大小（vocab、d_model、n_layers、d_ff……）", n * dtype.itemsize + 8 * biggest,
                 where="init_params")
    return check_seed("seed", seed, where="init_params"), dtype, logit_std


def _check_structure(cfg, where):
    """cfg 要有结构字段（Config 或 llm_math.ModelConfig 都行）。"""
    missing = [f for f in _INT_FIELDS if f != "max_seq" and not hasattr(cfg, f)]
    if missing:
        raise TypeError(f"{where}：cfg 必须是 transformer_lab.Config 或 llm_math.ModelConfig，"
                        f"{type(cfg).__name__} 缺少字段 {missing}")


def _check_cfg(cfg, where):
    """按字段而不是 isinstance 检查：pytest 里本模块可能以两个名字各加载一次（见 tests/labload.py）。"""
    missing = [f for f in _INT_FIELDS + ("tied", "rope_theta", "norm_eps") if not hasattr(cfg, f)]
    if missing:
        raise TypeError(f"{where}：cfg 必须是 transformer_lab.Config，{type(cfg).__name__} 缺少字段 {missing}")


def _check_param_dict(params, where):
    keys = ("embed", "layers", "final_norm", "lm_head")
    if not isinstance(params, dict) or any(k not in params for k in keys):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise TypeError(f"{where}：params 必须是 init_params 返回的字典（键 {keys}），收到 {got}")
    if not isinstance(params["layers"], (list, tuple)) or not all(isinstance(lp, dict) for lp in params["layers"]):
        raise TypeError(f"{where}：params['layers'] 必须是每层一个字典的列表")


def _real_array(name, x, where, allow_bool=True):
    """积木的数组参数：实数 numpy 数组（列表先 np.asarray）。只看 dtype（O(1)），不扫描数值。"""
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.dtype.kind not in ("biuf" if allow_bool else "iuf"):
        raise TypeError(f"{where}：{name} 必须是实数数组，收到 dtype={x.dtype}")
    return x


def _check_op_counter(op, counter, where, counter_name="counter"):
    if type(op) is not str:
        raise TypeError(f"{where}：op 必须是运算名字符串（如 'q_proj'），收到 {type(op).__name__} 类型的 {op!r}")
    if counter is not None and not callable(getattr(counter, "add", None)):
        raise TypeError(f"{where}：{counter_name} 必须是 None 或 transformer_lab.Counter，"
                        f"收到 {type(counter).__name__}")


def _check_add(op, flops, useful, w_elems, kv_elems, act_elems):
    """Counter.add 的慢路径：不是 Python int 的值在这里检查、转换。"""
    if not isinstance(op, str) or not op:
        raise TypeError(f"Counter.add：op 必须是非空字符串，收到 {type(op).__name__} 类型的 {op!r}")
    vals = [check_int(nm, v, lo=0, where="Counter.add") for nm, v in
            (("flops", flops), ("w_elems", w_elems), ("kv_elems", kv_elems), ("act_elems", act_elems))]
    if useful is not None:
        useful = check_int("useful", useful, lo=0, hi=vals[0], where="Counter.add")
    return op, vals[0], useful, vals[1], vals[2], vals[3]


_KNOWN_OPS = frozenset(MATMUL_OPS + ATTN_CORE_OPS + ELEMENTWISE_OPS + ("embed", "kv_write"))


def _check_rows(rows, where):
    from collections.abc import Mapping
    if not isinstance(rows, Mapping) or not all(isinstance(r, Mapping) for r in rows.values()):
        raise TypeError(f"{where}：rows 必须是账本 {{运算名: {{列: 数}}}}（Counter.rows 或 analytic_ops 的结果），"
                        f"收到 {type(rows).__name__}")


def _check_op_names(ops, rows, where, name="ops"):
    """运算名的集合：不能是一个字符串（'q_proj' 会被当成字母的集合）；每个名字要么在账本里、要么是已知的运算名。"""
    if isinstance(ops, str) or not hasattr(ops, "__iter__"):
        raise TypeError(f"{where}：{name} 必须是运算名的列表 / 元组 / 集合，收到 {type(ops).__name__} 类型的 {ops!r}")
    ops = list(ops)
    unknown = [o for o in ops if o not in rows and o not in _KNOWN_OPS]
    if unknown:
        raise ValueError(f"{where}：{name} 里有不认识的运算名 {unknown}；认识的：{sorted(_KNOWN_OPS | set(rows))}")
    return ops


def _check_groups(groups, rows, where):
    from collections.abc import Mapping
    if not isinstance(groups, Mapping):
        raise TypeError(f"{where}：groups 必须是 {{组名: [运算名, …]}}，收到 {type(groups).__name__} 类型的 {groups!r}")
    for g, names in groups.items():
        _check_op_names(names, rows, where, name=f"groups[{g!r}]")
    return groups


def _check_cache(cache, cfg, B, T):
    L, cb, _, G, dh = cache.k.shape
    if (L, G, dh) != (cfg.n_layers, cfg.n_kv_heads, cfg.d_head):
        raise ValueError(f"cache 的 (层数, G, dh) = {(L, G, dh)} 与 cfg 的 "
                         f"{(cfg.n_layers, cfg.n_kv_heads, cfg.d_head)} 不符")
    if cb != B:
        raise ValueError(f"tokens 的批大小 {B} 与 cache 的批大小 {cb} 不同")
    if cache.length + T > cache.max_len:
        raise ValueError(f"KV cache 溢出：已有 {cache.length} 个位置，再来 {T} 个超过 max_len={cache.max_len}")


# =============================================================================
# 自检
# =============================================================================
# 自检用的参考实现只给老师（学生树里没有它们：它们就是练习 2.1、2.2 的答案；学生的解答由 make grade 核对）
# >>> 练习 2.2 instructor
def _attention_reference(q, k, v, q_pos0, causal):
    """逐头循环、显式掩码矩阵的 float64 参考：softmax(q_h k_gᵀ/√dh + mask) v_g。"""
    nb, nt, nh, hd = q.shape                   # 参考只按定义写：批、query 数、头数、头维
    ns, ng = k.shape[1], k.shape[2]
    out = np.zeros((nb, nt, nh, hd))
    mask = np.zeros((nt, ns))
    if causal:
        for i in range(nt):
            mask[i, q_pos0 + i + 1:] = -np.inf
    for b in range(nb):
        for h in range(nh):
            g = h // (nh // ng)                    # 第 h 个 query 头属于第 g 组
            s = q[b, :, h] @ k[b, :, g].T / math.sqrt(hd) + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, :, g]
    return out.reshape(nb, nt, nh * hd)
# <<< 练习 2.2


# >>> 练习 2.1 instructor
def _rope_reference(x, positions, theta):
    """RoPE 的复数写法：相邻两个数拼成一个复数 a + ib，乘以 e^{i·p·ω_j}。"""
    dh = x.shape[-1]
    z = x[..., 0::2] + 1j * x[..., 1::2]
    omega = theta ** (-np.arange(dh // 2) * 2.0 / dh)
    z = z * np.exp(1j * np.asarray(positions)[:, None] * omega)[None, :, None, :]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out
# <<< 练习 2.1


def _selftest():
    rng = np.random.default_rng(2024)

    # 1. 参数量 = llm_math 的公式（tied / 非 tied、一个不规则的 GQA 配置）
    odd = Config(vocab=97, d_model=40, n_layers=3, n_heads=6, n_kv_heads=3, d_head=10, d_ff=71, max_seq=64)
    for cfg in (TINY, config_like(TINY, tied=True), odd):
        p = init_params(cfg, seed=3)
        assert count_params(p) == cfg.to_model_config().n_params(), cfg
        assert sum(param_groups(p).values()) == count_params(p)

    # 2. 积木对照独立参考：attention_core（GQA、decode 式的 q_pos0、双向）与 apply_rope（复数乘法）
    # >>> 练习 2.2 instructor
    for B, T, S, H, G, causal in ((2, 5, 5, 6, 3, True), (1, 3, 11, 4, 1, True), (2, 4, 7, 4, 4, False)):
        q = rng.standard_normal((B, T, H, 6))
        k, v = rng.standard_normal((2, B, S, G, 6))
        fast = attention_core(q, k, v, S - T, causal=causal)
        err = np.max(np.abs(fast - _attention_reference(q, k, v, S - T, causal)))
        assert err < 1e-12, ("attention_core", err)
    # <<< 练习 2.2
    x, pos = rng.standard_normal((2, 7, 3, 10)), rng.integers(0, 5000, size=7)
    # >>> 练习 2.1 instructor
    err = np.max(np.abs(apply_rope(x, *rope_angles(pos, 10, 500000.0)) - _rope_reference(x, pos, 500000.0)))
    assert err < 1e-12, ("apply_rope", err)
    # <<< 练习 2.1

    # 3. 贪心生成：带 / 不带 KV cache 逐 token 相同，logits 差 < 1e-9
    p = init_params(TINY, seed=0)
    prompt = rng.integers(0, TINY.vocab, size=(2, 12))
    toks_c, logits_c = generate(p, TINY, prompt, 8, use_cache=True)
    toks_r, logits_r = generate(p, TINY, prompt, 8, use_cache=False)
    assert np.array_equal(toks_c, toks_r)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(logits_c, logits_r))
    assert diff < 1e-9, diff

    # 4. 实际记的账 = 解析公式：prefill 与"已有 17 个位置时的解码一步"，每个运算、每一列
    for cfg, B, T, pos0 in ((TINY, 2, 12, 0), (TINY, 3, 1, 17), (odd, 2, 5, 9)):
        pp = p if cfg is TINY else init_params(cfg, seed=1)
        cache = KVCache(cfg, B)
        if pos0:
            forward(pp, cfg, rng.integers(0, cfg.vocab, size=(B, pos0)), cache=cache)
        c = Counter()
        forward(pp, cfg, rng.integers(0, cfg.vocab, size=(B, T)), cache=cache, counter=c)
        want_rows = analytic_ops(cfg, B, T, pos0)
        assert set(want_rows) == set(c.rows), set(want_rows) ^ set(c.rows)
        for op, want_row in want_rows.items():
            for key, want in want_row.items():
                assert abs(c.rows[op][key] - want) <= 1e-9 * max(1.0, abs(want)), (op, key, c.rows[op][key], want)

    # 5. 矩阵乘 FLOPs = T × llm_math.linear_flops_per_token()（lm_head 即使 tied 也要乘）
    for cfg in (TINY, config_like(TINY, tied=True)):
        c = Counter()
        forward(init_params(cfg, seed=5), cfg, rng.integers(0, cfg.vocab, size=(1, 5)), counter=c)
        assert c.total("flops", MATMUL_OPS) == 5 * cfg.to_model_config().linear_flops_per_token()

    # 6. einsum 规则：矩阵乘 = 2MKN；注意力两次 einsum 之和 = Counter 记的 4·B·T·S·H·dh；逐元素乘不乘 2
    assert einsum_flops("btd,df->btf", (2, 8, 64), (64, 256)) == 2 * (2 * 8) * 64 * 256
    B, T, S, G, R, dh = 2, 3, 7, 2, 3, 4
    qk = einsum_flops("btgrd,bsgd->bgrts", (B, T, G, R, dh), (B, S, G, dh))
    pv = einsum_flops("bgrts,bsgd->btgrd", (B, G, R, T, S), (B, S, G, dh))
    c = Counter()
    attention_core(rng.standard_normal((B, T, G * R, dh)), rng.standard_normal((B, S, G, dh)),
                   rng.standard_normal((B, S, G, dh)), S - T, counter=c)
    assert qk + pv == c.rows["attn_core"]["flops"]
    assert einsum_flops("bti,bti->bti", (2, 3, 5), (2, 3, 5)) == 30

    refs = "attention/RoPE = 独立参考；" if "_rope_reference" in globals() else ""   # 学生树里没有这两个参考
    print(f"transformer_lab 自检通过：参数量 = llm_math 公式（{count_params(p):,}）；{refs}"
          f"带 / 不带 KV cache 的 logits 最大差 {diff:.1e}；Counter = analytic_ops（逐项）；einsum 规则成立")


if __name__ == "__main__":
    _selftest()
