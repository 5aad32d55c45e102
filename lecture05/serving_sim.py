"""
serving_sim.py —— 第 5 讲：推理服务：一步要多久、一批放几个、排队排多久

【问题】一串请求（什么时候到、输入多长、要生成多少）在给定的模型和芯片上：引擎的一步要多久，受算力还是带宽限制？
    攒批让吞吐（tokens/s）和延迟（TTFT、TPOT）怎样此消彼长、批最大多大（KV cache 的墙）？请求随机到达时排队让延迟
    变成多少、满足 SLO 的有效吞吐（goodput）是多少？张量并行（TP）省了多少显存、快了多少、在 all-reduce 上花了多少？

【里面有什么】
    时间模型    StepCost、StepModel（prefill / decode / 混合一步的时间、KV 容量、TP 的 all-reduce）、A100_40G；
               H200_MEASURED、h200_measured_step（H200 上实测拟合的 mfu / mbu / 每层开销：lecture05/bench/）
    请求与指标  Request、make_requests / sample_lengths（泊松到达、长度分布）、summarize（TTFT / TPOT / goodput）、
               littles_law / occupancy / time_average
    调度模拟    simulate_static（静态批处理，FasterTransformer 式）、simulate_continuous（迭代级，可选分块 prefill）；
               两者之下的 iteration_schedule 是迭代级调度的引擎，第 6 讲的 Orca 模拟也用它
    演示工具    crossover_batch、min_tp、offline_sweep、ft_batch_cap（FasterTransformer 式批上限，由写明的假设推出）

【时间模型的假设】（都是参数，改了就能看结论怎么变；不是测量值）
    A1 一步 = max(FLOPs ÷ (峰值 × mfu), 字节 ÷ (带宽 × mbu)) + 通信 + overhead；默认 mfu 0.6、mbu 0.8、1 ms。
    A2 权重与 KV 默认 BF16；每步把全部矩阵乘权重读一遍（llm_math.matmul_params，lm_head 也算）。
    A3 FLOPs 只算矩阵乘（2·参数/token）和注意力；prefill 按因果掩码，长度 T 共 T(T+1)/2 个 (query, key) 对。
    A4 字节只算权重、读 KV、写 KV；激活的读写忽略（融合内核让它们留在片上）。
    A5 可用显存 = mem_util × 可分配显存 chip.alloc_bytes（H200 实测，其余推出；默认 0.9，vLLM gpu_memory_utilization
       的老默认 [S59, S61]）；KV 容量 = (可用显存 − 权重) ÷ 每 token 的 KV 字节。
    A6 TP：权重、FLOPs、KV 平均分到每卡（KV 头少于 tp 时每卡复制 1 个）；每层两次 all-reduce，
       用 prereq5/comm_sim.tp_allreduce_time 计时，和计算不重叠（保守）。
    A7 StepModel 构造时用 llm_math.fit（全课程一条规则）检查权重放得下；prefill / decode / mixed 的一步碰到的 KV
       超过 KV 容量就 CapacityError（不给一个看似正常的时间）；模拟器在接纳请求时检查。

【单位】秒；字节；FLOP/s；字节/秒；长度 = token 个数。  【运行】python3 lecture05/serving_sim.py（自检，约 1 秒）
【依赖】numpy；../lecture01（llm_math、hw_specs、course_utils）、../prereq5（comm_sim）。
"""

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "prereq5"):
    sys.path.insert(0, os.path.join(HERE, "..", _sub))

import hw_specs  # noqa: E402
import llm_math  # noqa: E402
import comm_sim  # noqa: E402
from comm_sim import tp_allreduce_time  # noqa: E402
from course_utils import figure_path, format_table, merge_identical, save_figure  # noqa: E402,F401  演示共用
from course_utils import check_array, check_choice, check_count, check_int, check_memory, check_real, check_rng  # noqa: E402,F401  参数检查

# ---- 时间模型的默认假设（见模块开头 A1–A6）----
MFU = 0.6              # 能用到的峰值算力比例（假设）
MBU = 0.8              # 能用到的峰值带宽比例（假设）
STEP_OVERHEAD_S = 1e-3  # 每步固定开销，秒（假设）
GPU_MEM_UTIL = 0.9     # 可用显存比例：vLLM gpu_memory_utilization 的老默认值 [S61]
ACT_BYTES = 2.0        # all-reduce 传的激活是 BF16

# ---- H200 上实测拟合的参数（不是假设）----
# 工作台 lecture05/bench/step_calibration.py 在 H200 上测 Llama-3.2-1B / 3.1-8B 形状的 prefill 与 decode，
# 拟合 StepModel：mfu、mbu 共用；开销按层给（秒/层，h200_measured_step 乘模型的 n_layers：主机开销来自
# 内核启动，一步的内核数和层数成正比）。overhead_eager_per_layer = 逐个启动内核（PyTorch eager），
# overhead_graph_per_layer = 整步录成 CUDA graph。拟合后的中位误差约 11%，所以只写 3 位有效数字；
# "source" 是出处。tests/test_lecture05_step_bench.py 断言它等于对已提交 JSON 的拟合：数据变了，这里必须跟着改
# （工作台打印要粘贴的三行）。
H200_MEASURED = {"mfu": 0.755, "mbu": 0.851, "overhead_eager_per_layer": 0.000478, "overhead_graph_per_layer": 0.000116,
                 "source": "NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130, CUDA 13.0, 2026-11-30; "
                           "fit of lecture05/bench/results/step_measure.json"}

# Orca / DistServe 实验用的 A100 40GB
# （312 TFLOPS BF16 稠密、1555 GB/s、NVLink3 每方向 300 GB/s [S1, S3]）。
# 第 1 讲的芯片表里没有 A100，这里单独建一个，不改第 1 讲。
# 可分配字节没有实测：hw_specs.with_alloc 按第 1 讲的同一条规则推出（mem_cap × ALLOC_PER_DATASHEET_BYTE）。
A100_40G = hw_specs.with_alloc(hw_specs.Chip(
    "A100-SXM4-40GB", "GPU", peak={"bf16": 312e12, "fp16": 312e12, "int8": 624e12},
    mem_bw=1.555e12, mem_cap=40e9, mem_kind="HBM2", link_bw=300e9, power_w=400, year=2020,
    notes="[S1, S3]：稠密 BF16 312 TFLOPS；NVLink3 600 GB/s 双向 = 每方向 300 GB/s",
))

# FasterTransformer 式批上限的假设（ft_batch_cap；全部写在这里，不是调出来的利用率）
FT_RUNTIME_BYTES = 1.0e9   # CUDA 上下文 + cuBLAS / NCCL 工作区等运行时开销：假设 1 GB（没有实测）
FT_ACT_WIDTHS = 10         # 每个 token 的激活缓冲：q、k、v（3d）+ 注意力输出 d + FFN 中间 4d + 两个残差 / 归一化 2d


def ft_batch_cap(model, chip, max_seq=2048, runtime_bytes=FT_RUNTIME_BYTES, w_bytes=2.0, kv_bytes=2.0,
                 act_bytes=2.0):
    """
    FasterTransformer 式静态引擎的批上限：每个请求都按 max_seq 预留 KV 和上下文阶段的工作区，由写明的假设推出。

    【假设】可用 = 可分配显存（llm_math.allocatable_bytes）− 运行时开销 runtime_bytes − 权重；
        每个序列 = max_seq 个 token 的 KV + 上下文阶段的工作区：没融合的注意力把 QKᵀ 存成 [H, S, S]，
        加上 FT_ACT_WIDTHS·d·S 个激活（都按 act_bytes 字节，S = max_seq）。
    【返回】{"alloc", "runtime", "weights", "kv_per_seq", "work_per_seq", "cap", "cap_kv_only"}：
        cap = ⌊可用 ÷ (KV + 工作区)⌋；cap_kv_only = 不算工作区时的 ⌊可用 ÷ KV⌋（对照）。
    【例】GPT-3 13B、A100-40GB、2048：可分配 42.6 GB − 1 GB − 权重 25.7 GB = 15.9 GB；每序列 KV 1.68 GB + 工作区
        0.55 GB → 7（不算工作区是 9）。论文说 FT 批到 8 就 OOM [S56]，和 ≤ 7 一致。
        原课程第 6 讲模块的"0.9 × 40 GB"规则给 6。
    """
    S, runtime = _check_ft_args(model, chip, max_seq, runtime_bytes, act_bytes, w_bytes, kv_bytes)
    alloc = llm_math.allocatable_bytes(chip)
    weights = model.weight_bytes(w_bytes)
    kv_seq = model.kv_cache_bytes(1, S, kv_bytes)
    work_seq = (model.n_heads * S * S + FT_ACT_WIDTHS * model.d_model * S) * act_bytes
    free = alloc - runtime - weights
    cap = int(free // (kv_seq + work_seq)) if free > 0 else 0
    return {"alloc": alloc, "runtime": runtime, "weights": weights, "kv_per_seq": kv_seq, "work_per_seq": work_seq,
            "cap": cap, "cap_kv_only": int(free // kv_seq) if free > 0 else 0}

# GPT-3 13B（Orca 的实验模型）与 Llama 3.1：用第 1 讲的预设（出处见 llm_math 的注释与 SOURCES.md 第 2 节）。
GPT3_13B = llm_math.GPT3_13B
LLAMA31_8B = llm_math.LLAMA31_8B
LLAMA31_70B = llm_math.LLAMA31_70B


# =============================================================================
# 第 1 部分：一步前向的时间模型
# =============================================================================
# 显存放不下（权重放不下，或放下权重后连 1 个 token 的 KV 都放不下）：全课程同一个异常，定义在第 1 讲
CapacityError = llm_math.CapacityError


def _check_model_chip(model, chip):
    """model 要像 llm_math.ModelConfig，chip 要像 hw_specs.Chip；不像就 TypeError。"""
    for attr in ("matmul_params", "weight_bytes", "attn_flops_per_token", "n_layers", "n_heads", "n_kv_heads"):
        if not hasattr(model, attr):
            raise TypeError(f"model 必须是 llm_math.ModelConfig（缺少 {attr}），收到 {type(model).__name__}")
    for attr in ("peak_flops", "mem_bw", "mem_cap", "link_bw"):
        if not hasattr(chip, attr):
            raise TypeError(f"chip 必须是 hw_specs.Chip（缺少 {attr}），收到 {type(chip).__name__}")


def _tp_layout_problem(model, chip, tp):
    """tp 块卡能不能切这个模型：能切返回 None，不能切返回原因（一句话）。StepModel 和 min_tp 共用。"""
    why = llm_math.tp_layout_problem(model, tp, name="tp")       # 和第 1 讲 fit(rule="tp") 同一条规则
    if why:
        return why
    if tp > 1 and not chip.link_bw > 0:
        return f"tp={tp} > 1 需要芯片间互联，但 {chip.name} 的 link_bw = {chip.link_bw}"
    return None


@dataclass(frozen=True)
class StepCost:
    """
    一步前向（每块卡）的账单。数组输入时各字段是同形状的数组。

    flops / bytes：每块卡的运算量与显存读写量；t_compute = flops ÷ (峰值·mfu)；t_memory = bytes ÷ (带宽·mbu)；
    t_comm：TP 的 all-reduce 时间；overhead：固定开销。total = max(t_compute, t_memory) + t_comm + overhead。
    """
    flops: object
    bytes: object
    t_compute: object
    t_memory: object
    t_comm: float
    overhead: float

    @property
    def total(self):
        return np.maximum(self.t_compute, self.t_memory) + self.t_comm + self.overhead

    @property
    def bound(self):
        """'compute' 或 'memory'：roofline 的哪一边说了算（数组输入时逐元素）。"""
        return np.where(np.asarray(self.t_compute) >= np.asarray(self.t_memory), "compute", "memory")


class StepModel:
    """
    引擎一步（一次前向）的时间：roofline + 效率折扣 + 固定开销（模块开头 A1–A7）。

    【构造】StepModel(model, chip, tp=1, mfu=0.6, mbu=0.8, overhead=1e-3, w_bytes=2.0, kv_bytes=2.0,
                       mem_util=0.9, prec=None, act_bytes=2.0, comm_alpha=None, comm_algo="ring")
        model：llm_math.ModelConfig；chip：hw_specs.Chip；tp：张量并行的卡数；
        prec：查峰值算力用的精度，None 时 w_bytes ≥ 2 用 "bf16"，否则 "fp8"；
        comm_alpha：all-reduce 每跳延迟（秒），None 用 comm_sim 的默认值。
    【方法】
        kv_capacity_tokens()                      ：每块卡（也是整个 TP 组）能放多少个 token 的 KV
        prefill_time(prompt_lens)                 ：一批输入（长度列表）一起做 prefill
        decode_time(batch, ctx_tokens)            ：batch 个序列各生成 1 个 token，注意力一共覆盖 ctx_tokens 个 KV
        mixed_time(n_decode, ctx_tokens, prefill_tokens, prefill_attn_flops, prefill_ctx_tokens=0)
                                                  ：一次迭代里既有 decode 又有 prefill（迭代级调度、分块 prefill）
        *_cost(...)                               ：同上，返回 StepCost 账单（看是哪一边受限、通信占多少）
        comm_time(n_tokens)                       ：一步里所有 all-reduce 的时间
    【边界】权重放不下（每块卡的权重 > mem_util × 可分配显存）或放下后连 1 个 token 的 KV 都放不下：CapacityError
        （ValueError 的子类），消息里写需要多少、可用多少。tp 不整除 n_heads、或 tp 与 n_kv_heads 互不整除：
        ValueError。ctx_tokens 可以是数组（一次算很多步，模拟器用它向量化）。
    """

    def __init__(self, model, chip, tp=1, mfu=MFU, mbu=MBU, overhead=STEP_OVERHEAD_S, w_bytes=2.0,
                 kv_bytes=2.0, mem_util=GPU_MEM_UTIL, prec=None, act_bytes=ACT_BYTES, comm_alpha=None,
                 comm_algo="ring"):
        _check_model_chip(model, chip)
        self.model, self.chip = model, chip
        self.tp = check_int("tp", tp, lo=1)
        self.mfu = check_real("mfu", mfu, 0.0, 1.0, lo_open=True)
        self.mbu = check_real("mbu", mbu, 0.0, 1.0, lo_open=True)
        self.overhead = check_real("overhead", overhead, 0.0, 10.0)
        self.w_bytes = check_real("w_bytes", w_bytes, 0.0, 8.0, lo_open=True)
        self.kv_bytes = check_real("kv_bytes", kv_bytes, 0.0, 8.0, lo_open=True)
        self.mem_util = check_real("mem_util", mem_util, 0.0, 1.0, lo_open=True)
        self.act_bytes = check_real("act_bytes", act_bytes, 0.0, 8.0, lo_open=True)
        self.prec = prec if prec is not None else ("bf16" if self.w_bytes >= 2 else "fp8")
        try:
            self.peak = float(chip.peak_flops(self.prec))
        except (KeyError, ValueError) as e:
            raise ValueError(f"prec={self.prec!r}：芯片 {chip.name} 没有这个精度的峰值算力"
                             f"（有：{sorted(getattr(chip, 'peak', {}))}）") from e
        algos = comm_sim.ALGORITHMS["allreduce"]
        if comm_algo not in algos:
            raise ValueError(f"comm_algo 只能是 {algos} 之一，收到 {comm_algo!r}")
        self.comm_algo = comm_algo
        self.comm_alpha = None if comm_alpha is None else check_real("comm_alpha", comm_alpha, 0.0, 1.0)
        self._check_tp()
        self._comm_cache = {}
        self._setup_memory()

    # ---- 构造时的检查与显存账 ----
    def _check_tp(self):
        why = _tp_layout_problem(self.model, self.chip, self.tp)
        if why is not None:
            raise ValueError(why)

    def _setup_memory(self):
        m, tp = self.model, self.tp
        # 每块卡存的权重（A6：全部平分；忽略复制的 norm 向量，也忽略 G < tp 时复制的 K/V 投影权重——
        # 405B 在 TP16 上后者每卡约多 0.5 GB）与每步要读的矩阵乘法权重（A2）
        # 放不放得下：第 1 讲的 llm_math.fit（rule="tp"，全课程同一条规则）。可用 = mem_util × 可分配显存
        # （hw_specs.Chip.alloc_bytes；没有这个字段的芯片用 mem_cap）。
        f = llm_math.fit(m, self.chip, tp, 0, 0, self.w_bytes, self.kv_bytes, self.mem_util, rule="tp")
        self.weight_bytes_per_chip = f.weights
        self.weight_read_bytes = m.matmul_params() * self.w_bytes / tp
        # KV 头：G ≥ tp 时平分（每卡 G/tp 个）；G < tp 时每 tp/G 块卡复制同一个头、每卡 1 个
        # （所以 tp 超过 G 之后每卡每 token 的 KV 不再变小）。_check_tp 保证两者之一整除另一个。
        self.kv_heads_per_chip = max(m.n_kv_heads // tp, 1)
        self.kv_bytes_per_token = f.kv_per_token
        self.usable_bytes = f.usable
        free = self.usable_bytes - self.weight_bytes_per_chip
        where = f"{self.chip.name}" + (f" × TP{tp}" if tp > 1 else "")
        if free < 0:
            raise CapacityError(
                f"{m.name} 在 {where} 上放不下：每块卡的权重要 {self.weight_bytes_per_chip / 1e9:.1f} GB，"
                f"可用显存只有 {self.usable_bytes / 1e9:.1f} GB（mem_util={self.mem_util} × 可分配 "
                f"{llm_math.allocatable_bytes(self.chip) / 1e9:.1f} GB）；请加大 tp 或降低 w_bytes")
        self._kv_cap = f.kv_tokens
        if self._kv_cap < 1:
            raise CapacityError(f"{m.name} 在 {where} 上放下权重后只剩 {free / 1e6:.1f} MB，"
                             f"连 1 个 token 的 KV（{self.kv_bytes_per_token / 1e6:.2f} MB/卡）都放不下")

    def kv_capacity_tokens(self):
        """整个 TP 组能同时存多少个 token 的 KV（每块卡存每个 token 的一片，所以和单卡的 token 数相同）。"""
        return self._kv_cap

    def effective_ridge(self):
        """折扣后的"拐点"强度（FLOP/字节）= 峰值·mfu ÷ (带宽·mbu)。强度高于它的一步受算力限制。"""
        return self.peak * self.mfu / (self.chip.mem_bw * self.mbu)

    # ---- 通信 ----
    def comm_time(self, n_tokens):
        """一步的 all-reduce 总时间：每层 2 次，每次 n_tokens × d_model × act_bytes 字节（A6）。tp = 1 时为 0。"""
        n_tokens = check_int("n_tokens", n_tokens, lo=0)
        if self.tp == 1 or n_tokens == 0:
            return 0.0
        if n_tokens not in self._comm_cache:          # 模拟器反复问同样的 token 数：缓存一下
            kw = {"algo": self.comm_algo}
            if self.comm_alpha is not None:
                kw["alpha"] = self.comm_alpha
            one = tp_allreduce_time(n_tokens * self.model.d_model * self.act_bytes, self.tp, self.chip.link_bw, **kw)
            self._comm_cache[n_tokens] = 2 * self.model.n_layers * float(one)
        return self._comm_cache[n_tokens]

    # ---- 核心：由 FLOPs 和 KV 读写算出账单 ----
    def _roofline(self, n_tokens, attn_flops, kv_read_tokens, kv_write_tokens):
        """roofline 的两边（可以是数组）：返回 (每卡 FLOPs, 每卡字节, t_compute, t_memory)。参数都是整个模型的量。"""
        flops = (n_tokens * self.model.linear_flops_per_token() + attn_flops) / self.tp
        nbytes = self.weight_read_bytes + (kv_read_tokens + kv_write_tokens) * self.kv_bytes_per_token
        return flops, nbytes, flops / (self.peak * self.mfu), nbytes / (self.chip.mem_bw * self.mbu)

    def _cost(self, n_tokens, attn_flops, kv_read_tokens, kv_write_tokens):
        """n_tokens 个 token 过矩阵乘法 + attn_flops 的注意力；读 / 写这么多 token 的 KV；加上通信和固定开销。"""
        flops, nbytes, t_c, t_m = self._roofline(n_tokens, attn_flops, kv_read_tokens, kv_write_tokens)
        return StepCost(flops=flops, bytes=nbytes, t_compute=t_c, t_memory=t_m,
                        t_comm=self.comm_time(int(n_tokens)), overhead=self.overhead)

    def _attn1(self):
        """一个 query 对一个 key 的注意力 FLOPs（整个模型所有层、所有头）。"""
        return float(self.model.attn_flops_per_token(1))

    # ---- prefill ----
    def prefill_cost(self, prompt_lens):
        """一批输入一起 prefill：每个 prompt 的 T 个 token 过全部矩阵乘法，因果注意力 T(T+1)/2 对，写 T 个 KV。"""
        lens = _count_array("prompt_lens", prompt_lens, lo=1).reshape(-1)
        if lens.size == 0:
            raise ValueError("prompt_lens 不能为空（至少一个输入）")
        T = int(lens.sum())
        if T > self._kv_cap:                               # 和 decode_cost 同一条规则：写不下的 KV 不给时间
            raise CapacityError(f"prompt_lens 一共 {T:,} 个 token 的 KV 超过了 {self!r} 的 KV 容量 "
                                f"{self._kv_cap:,} token")
        pairs = float((lens * (lens + 1) // 2).sum())
        return self._cost(T, self._attn1() * pairs, 0, T)

    def prefill_time(self, prompt_lens):
        return float(self.prefill_cost(prompt_lens).total)

    # ---- decode ----
    def decode_cost(self, batch, ctx_tokens):
        """
        batch 个序列各 decode 1 个 token。ctx_tokens：这一步所有序列的注意力一共覆盖多少个 key（含刚生成的这个），
        也就是要从显存读多少个 token 的 KV；另外写 batch 个新 KV。ctx_tokens 可以是数组（很多步一起算）。
        """
        batch = check_int("batch", batch, lo=1)
        ctx = _count_array("ctx_tokens", ctx_tokens)
        if ctx.size and ctx.min() < batch:
            raise ValueError(f"ctx_tokens（{ctx.min()}）不能小于 batch（{batch}）：每个序列至少看见自己这个 token")
        if ctx.size and ctx.max() > self._kv_cap:          # 放不下的上下文不给一个看起来正常的时间
            raise CapacityError(f"ctx_tokens = {ctx.max():,} 个 token 的 KV 超过了 {self!r} 的 KV 容量 "
                                f"{self._kv_cap:,} token")
        ctx_f = ctx.astype(np.float64)
        return self._cost(batch, self._attn1() * ctx_f, ctx_f, batch)

    def decode_time(self, batch, ctx_tokens):
        tot = self.decode_cost(batch, ctx_tokens).total
        return float(tot) if np.ndim(tot) == 0 else tot

    # ---- 一次迭代里混合 decode 与 prefill ----
    def mixed_cost(self, n_decode, ctx_tokens, prefill_tokens, prefill_attn_flops, prefill_ctx_tokens=0):
        """
        n_decode 个序列各 decode 1 个 token（注意力共覆盖 ctx_tokens 个 key），同时处理 prefill_tokens 个输入 token
        （它们的注意力 FLOPs 由调用者算好传进来：整段 prompt 是 attn_flops_per_token(1)·T(T+1)/2；
        分块 prefill 的一块还要看前面块的 KV，prefill_ctx_tokens 是这部分要读的 KV token 数）。
        mixed(b, ctx, 0, 0) 与 decode(b, ctx) 相同；mixed(0, 0, ΣT, 注意力) 与 prefill(T 列表) 相同。
        """
        n_decode = check_int("n_decode", n_decode, lo=0)
        ctx = check_int("ctx_tokens", ctx_tokens, lo=0)
        pt = check_int("prefill_tokens", prefill_tokens, lo=0)
        pctx = check_int("prefill_ctx_tokens", prefill_ctx_tokens, lo=0)
        pattn = check_real("prefill_attn_flops", prefill_attn_flops, 0.0, 1e30)
        if n_decode + pt == 0:
            raise ValueError("n_decode 和 prefill_tokens 不能都是 0（这一步什么都不算）")
        if ctx < n_decode:
            raise ValueError(f"ctx_tokens（{ctx}）不能小于 n_decode（{n_decode}）")
        if ctx + pctx + pt > self._kv_cap:                 # 和 decode_cost 同一条规则：这一步碰到的 KV 要放得下
            raise CapacityError(f"ctx_tokens + prefill_ctx_tokens + prefill_tokens = {ctx + pctx + pt:,} 个 token 的 "
                                f"KV 超过了 {self!r} 的 KV 容量 {self._kv_cap:,} token")
        if pt == 0 and (pattn > 0 or pctx > 0):
            raise ValueError("prefill_tokens = 0 时 prefill_attn_flops 与 prefill_ctx_tokens 必须是 0")
        if pt > 0:
            # 每个 prefill token 至少看见自己（≥ pt 对），至多看见前面所有块的 KV 加上本块里它之前的 token
            # （≤ pt·pctx + pt(pt+1)/2 对）。超出这个范围多半是把 (q, k) 对数当成了 FLOPs，或者反过来。
            a1 = self._attn1()
            lo, hi = a1 * pt, a1 * (pt * pctx + pt * (pt + 1) / 2)
            if not lo * (1 - 1e-9) <= pattn <= hi * (1 + 1e-9):
                raise ValueError(f"prefill_attn_flops={pattn:.4g} 超出 prefill_tokens={pt}、prefill_ctx_tokens={pctx} "
                                 f"允许的范围 [{lo:.4g}, {hi:.4g}]（= attn_flops_per_token(1) × (q, k) 对数；"
                                 f"要传 FLOPs，不是对数）")
        return self._cost(n_decode + pt, self._attn1() * ctx + pattn, ctx + pctx, n_decode + pt)

    def mixed_time(self, n_decode, ctx_tokens, prefill_tokens, prefill_attn_flops, prefill_ctx_tokens=0):
        return float(self.mixed_cost(n_decode, ctx_tokens, prefill_tokens, prefill_attn_flops,
                                     prefill_ctx_tokens).total)

    def __repr__(self):
        return (f"StepModel({self.model.name} on {self.chip.name}, tp={self.tp}, mfu={self.mfu}, mbu={self.mbu}, "
                f"overhead={self.overhead * 1e3:g} ms, KV cap={self._kv_cap} tokens)")


def h200_measured_step(model, mode="graph", **kw):
    """
    用 H200 实测拟合的参数（H200_MEASURED）建 StepModel：StepModel(model, hw_specs.H200, mfu, mbu, overhead)，
    overhead = 每层开销 overhead_{mode}_per_layer × model.n_layers（每步的秒数，StepModel 的接口不变）。
    mode："graph"（整步一个 CUDA graph，引擎的做法）或 "eager"（逐个启动内核）。kw 传给 StepModel（tp、mem_util……）。
    【边界】还没有实测结果（H200_MEASURED is None）：ValueError，说怎么生成。
    """
    check_choice("mode", mode, ("eager", "graph"), where="h200_measured_step")
    if H200_MEASURED is None:
        raise ValueError("H200_MEASURED 还没有填：在 H200 上运行 python3 lecture05/bench/step_calibration.py "
                         "--measure，再不带 --measure 运行它，把它打印的三行粘贴进 serving_sim.py")
    _check_model_chip(model, hw_specs.H200)
    p = H200_MEASURED
    return StepModel(model, hw_specs.H200, mfu=p["mfu"], mbu=p["mbu"],
                     overhead=p[f"overhead_{mode}_per_layer"] * model.n_layers, **kw)


# =============================================================================
# 第 2 部分：请求、负载与指标
# =============================================================================
@dataclass
class Request:
    """
    一个请求及它在模拟里的经历（时间都是秒，没发生的是 nan）。

    rid、arrival、prompt（输入 token 数）、output（要生成的 token 数，≥ 1；第 1 个由 prefill 产生）；
    t_start：第一次被调度；t_first：第 1 个输出 token 出来；t_last：最后一个输出 token 出来；
    t_finish：离开系统（结果返回、显存释放；静态批处理里要等整批跑完，所以可能晚于 t_last）；
    token_times：每个输出 token 出来的时刻。
    """
    rid: int
    arrival: float
    prompt: int
    output: int
    t_start: float = math.nan
    t_first: float = math.nan
    t_last: float = math.nan
    t_finish: float = math.nan
    token_times: np.ndarray = field(default=None, repr=False)

    def __post_init__(self):
        _check_request(self)

    @property
    def ttft(self):
        """首 token 延迟（time to first token）= 第 1 个输出 token 的时刻 − 到达时刻（含排队）。"""
        return self.t_first - self.arrival

    @property
    def tpot(self):
        """每个输出 token 的时间（TPOT）= (最后一个 − 第一个) ÷ (output − 1)；output = 1 时没有定义（nan）。"""
        return (self.t_last - self.t_first) / (self.output - 1) if self.output > 1 else math.nan

    @property
    def e2e(self):
        """端到端延迟 = 离开系统的时刻 − 到达时刻。"""
        return self.t_finish - self.arrival

    @property
    def queue_delay(self):
        return self.t_start - self.arrival


def sample_lengths(spec, n, rng, name="spec"):
    """
    按 spec 抽 n 个长度（正整数）。

    spec：("fixed", L) | ("uniform", lo, hi)（闭区间上的整数均匀分布） |
          ("lognormal", median, sigma, max_len)（对数正态，截到 [1, max_len]；真实对话的长度分布是长尾的）
    rng：np.random.Generator；name：报错时 spec 叫什么（make_requests 传 "prompt" / "output"）。
    """
    n = check_count("n", n, _REQUEST_BYTES, where="sample_lengths", lo=0)
    check_rng("rng", rng, where="sample_lengths")
    if not isinstance(spec, (tuple, list)) or not spec:
        raise TypeError(f"{name}（长度分布）必须是元组，如 ('uniform', 32, 512)，收到 {spec!r}")
    kind, args = spec[0], tuple(spec[1:])
    want = {"fixed": 1, "uniform": 2, "lognormal": 3}
    if not isinstance(kind, str) or kind not in want:
        raise ValueError(f"{name}[0]（长度分布）只能是 {sorted(want)} 之一，收到 {kind!r}")
    if len(args) != want[kind]:
        raise ValueError(f"{name}：{kind!r} 需要 {want[kind]} 个参数，收到 {args}")
    if kind == "fixed":
        return np.full(n, check_int(f"{name} 的 L", args[0], lo=1), dtype=np.int64)
    if kind == "uniform":
        lo, hi = check_int(f"{name} 的 lo", args[0], lo=1), check_int(f"{name} 的 hi", args[1], lo=1)
        if hi < lo:
            raise ValueError(f"{name}：uniform 的 hi（{hi}）不能小于 lo（{lo}）")
        return rng.integers(lo, hi + 1, size=n).astype(np.int64)
    med = check_real(f"{name} 的 median", args[0], 0.0, 1e12, lo_open=True)   # 有限：inf × exp(−∞) 会得到 nan
    sigma = check_real(f"{name} 的 sigma", args[1], 0.0, 20.0)
    top = check_int(f"{name} 的 max_len", args[2], lo=1)
    x = np.rint(med * np.exp(sigma * rng.standard_normal(n)))
    return np.clip(x, 1, top).astype(np.int64)


def make_requests(n, rate, prompt=("uniform", 32, 512), output=("uniform", 1, 128), seed=0):
    """
    合成负载：n 个请求，泊松到达（相邻间隔 ~ 指数分布，均值 1/rate），长度按 prompt / output 分布抽。

    【参数】rate：每秒平均到达几个；rate = math.inf 表示"全部在 t = 0 到达"（离线批处理）。
    【返回】按到达时间排序的 Request 列表。
    【可复现】同一个 seed 下，间隔先按 rate = 1 抽好再除以 rate：换 rate 只是把时间轴整体伸缩，长度完全相同，
        不同负载之间比较更干净。
    """
    n = check_count("n", n, _REQUEST_BYTES, where="make_requests")
    rate = check_real("rate", rate, 0.0, lo_open=True, allow_inf=True, where="make_requests")
    rng = np.random.default_rng(check_int("seed", seed, lo=0, where="make_requests"))
    unit_gaps = rng.exponential(1.0, n)
    arrivals = np.zeros(n) if math.isinf(rate) else np.cumsum(unit_gaps) / rate
    P = sample_lengths(prompt, n, rng, name="prompt")
    O = sample_lengths(output, n, rng, name="output")
    return [Request(i, float(arrivals[i]), int(P[i]), int(O[i])) for i in range(n)]


def _pct(x, q):
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if x.size else math.nan


def _mean(x):
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def summarize(reqs, slo_ttft=None, slo_tpot=None, warmup=0.0):
    """
    一次模拟的指标。

    【参数】slo_ttft / slo_tpot：SLO（秒），None 表示不限；warmup：去掉最早到达的这一比例的请求（系统刚启动时是空的）。
    【返回】字典：n、span（统计窗口：第一个被统计的请求到达 → 最后一个离开）、
        req_per_s、tok_per_s（输出 token / 秒）、ttft_* / tpot_* / e2e_* 的 mean、p50、p99、itl_p99（相邻 token 间隔）、
        queue_mean、slo_frac（同时满足两个 SLO 的比例）、goodput（满足 SLO 的请求数 / 秒）。
    【定义】TTFT / TPOT / e2e / 排队时间用 Request 的同名属性；百分位是 np.percentile 的默认（线性插值），
        均值和百分位都跳过 nan（只出 1 个 token 的请求没有 TPOT）；itl 是每个请求相邻两个 token 的时间差，全部放在一起；
        满足 SLO = TTFT ≤ slo_ttft 且 TPOT ≤ slo_tpot（没有 TPOT 的只看 TTFT）；tok_per_s 数的是 output 之和。
    【要点】吞吐看的是"完成了多少"，goodput 只数"按时完成的"——过载时吞吐不降，goodput 会塌。
    """
    warmup = check_real("warmup", warmup, 0.0, 0.99)
    slo_ttft, slo_tpot = (None if v is None else check_real(name, v, 0.0, allow_inf=True)
                          for name, v in (("slo_ttft", slo_ttft), ("slo_tpot", slo_tpot)))
    rs = sorted(_request_list(reqs, "summarize"), key=lambda r: (r.arrival, r.rid))
    rs = rs[int(len(rs) * warmup):]
    if not rs:
        raise ValueError("reqs 为空（或 warmup 把请求都去掉了）")
    if any(math.isnan(r.t_finish) for r in rs):
        raise ValueError("有请求还没完成（t_finish 是 nan）：先跑模拟器")
    # >>> 练习 5.2
    span = max(r.t_finish for r in rs) - rs[0].arrival
    ttft = np.array([r.ttft for r in rs])
    tpot = np.array([r.tpot for r in rs])
    e2e = np.array([r.e2e for r in rs])
    gaps = [np.diff(r.token_times) for r in rs if r.token_times is not None and len(r.token_times) > 1]
    itl = np.concatenate(gaps) if gaps else np.array([])
    ok = np.ones(len(rs), dtype=bool)
    if slo_ttft is not None:
        ok &= ttft <= slo_ttft
    if slo_tpot is not None:
        ok &= np.isnan(tpot) | (tpot <= slo_tpot)          # 只出 1 个 token 的没有 TPOT
    out = {"n": len(rs), "span": span, "req_per_s": len(rs) / span,
           "tok_per_s": sum(r.output for r in rs) / span,
           "queue_mean": _mean([r.queue_delay for r in rs]), "itl_p99": _pct(itl, 99),
           "slo_frac": float(ok.mean()), "goodput": float(ok.sum()) / span}
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_mean"], out[f"{name}_p50"], out[f"{name}_p99"] = _mean(x), _pct(x, 50), _pct(x, 99)
    return out
    # <<< 练习 5.2


def occupancy(reqs):
    """
    系统里的请求数 N(t) 的阶梯函数（由到达、离开事件扫一遍得到）。

    【返回】(times, counts)：在 [times[k], times[k+1]) 上 N(t) = counts[k]。同一时刻的事件按"先离开后到达"处理
        （不影响积分，只让阶梯函数不出现瞬时尖峰）。
    """
    reqs = _request_list(reqs, "occupancy")
    a = np.array([r.arrival for r in reqs], dtype=np.float64)
    f = np.array([r.t_finish for r in reqs], dtype=np.float64)
    if np.isnan(f).any():
        raise ValueError("有请求还没完成（t_finish 是 nan）")
    t = np.concatenate([a, f])
    d = np.concatenate([np.ones_like(a), -np.ones_like(f)])
    order = np.lexsort((d, t))                 # 主键时间，次键 d：−1（离开）排在 +1（到达）前面
    return t[order], np.cumsum(d[order])


def time_average(times, counts, t0, t1):
    """阶梯函数在 [t0, t1] 上的时间平均：Σ counts[k] × (区间 k 与 [t0, t1] 的重叠长度) ÷ (t1 − t0)。"""
    times, counts, t0, t1 = _check_steps(times, counts, t0, t1)
    lo = np.clip(times[:-1], t0, t1)
    hi = np.clip(times[1:], t0, t1)
    return float(np.sum(counts[:-1] * (hi - lo)) / (t1 - t0))


def littles_law(reqs, t0=None, t1=None):
    """
    在模拟出来的轨迹上检查 Little 定律 L = λW。

    L：[t0, t1] 里系统中请求数的时间平均（由 occupancy 的阶梯函数积分）；
    λ：[t0, t1) 里到达的请求数 ÷ 窗口长度；W：这些请求在系统里待的平均时间（e2e）。
    默认窗口 = [第一个到达, 最后一个离开]：系统在两端都是空的，这时 L·T = Σ 各请求待的时间，定律**精确**成立
    （这正是它的证明：N(t) 曲线下的面积按请求切开）。取中间一段稳态窗口时，只**近似**成立（边界上跨窗口的请求）。
    【返回】字典 L、lam、W、lam_W、rel_err = |L − λW| / λW。
    """
    reqs = _request_list(reqs, "littles_law")
    if len(reqs) == 0:
        raise ValueError("reqs 不能为空（先跑模拟器，得到完成的请求列表）")
    arr = np.array([r.arrival for r in reqs])
    t0 = float(arr.min()) if t0 is None else check_real("t0", t0, where="littles_law")
    t1 = float(max(r.t_finish for r in reqs)) if t1 is None else check_real("t1", t1, where="littles_law")
    times, counts = occupancy(reqs)
    L = time_average(times, counts, t0, t1)
    inside = [r for r in reqs if t0 <= r.arrival < t1]
    if not inside:
        raise ValueError(f"窗口 [{t0}, {t1}) 里没有到达的请求")
    lam = len(inside) / (t1 - t0)
    W = float(np.mean([r.e2e for r in inside]))
    return {"L": L, "lam": lam, "W": W, "lam_W": lam * W, "rel_err": abs(L - lam * W) / (lam * W)}


# =============================================================================
# 第 3 部分：调度模拟
# =============================================================================
def _fresh_copies(reqs):
    """模拟器不改调用者的列表：复制一份、清空结果字段，并检查按到达时间排好序（FCFS 的前提）。"""
    reqs = _request_list(reqs, "模拟器")
    if len(reqs) == 0:
        raise ValueError("reqs 不能为空")
    out = [dataclasses.replace(r, t_start=math.nan, t_first=math.nan, t_last=math.nan, t_finish=math.nan,
                               token_times=None) for r in reqs]
    arr = np.array([r.arrival for r in out])
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise ValueError("到达时间必须是有限的非负数")
    if np.any(np.diff(arr) < 0):
        raise ValueError("reqs 必须按到达时间排序（先到先服务）")
    for r in out:
        check_int(f"请求 {r.rid} 的 prompt", r.prompt, lo=1)
        check_int(f"请求 {r.rid} 的 output", r.output, lo=1)
    return out


def _static_batch_size(P, O, i, b_max, cap, kv_reserve):
    """从下标 i 起最多 b_max 个请求里，显存允许的最大前缀长度（FCFS：只能取前缀）。"""
    if kv_reserve is not None:
        return min(b_max, cap // kv_reserve)
    # 按实际需要：整批补齐到最长输入 L_max、跑到最长输出 O_max，每行存 L_max + O_max − 1 个 token 的 KV
    Lm = np.maximum.accumulate(P[i:i + b_max])
    Om = np.maximum.accumulate(O[i:i + b_max])
    need = np.arange(1, len(Lm) + 1) * (Lm + Om - 1)      # need 随前缀长度单调不减
    return int(np.searchsorted(need, cap, side="right"))


def simulate_static(reqs, step, max_batch, kv_reserve=None, max_wait=0.0):
    """
    静态批处理（请求级调度，FasterTransformer 的做法）：引擎空闲时，从队列头取最多 max_batch 个请求组成一批，
    输入补齐到批里最长的 L_max 一起 prefill，然后整批 decode 到批里最长的输出 O_max，**整批结束**才返回结果、
    释放显存、接下一批。

    【参数】reqs：按到达排序的 Request 列表（不会被修改）；step：StepModel；max_batch：批大小上限；
        kv_reserve：None = 按这批实际需要的 KV（B × (L_max + O_max − 1)）检查显存；
                    整数 = 每个请求预留这么多 token（FT 按模型最大长度 2048 预留），批大小再受 cap // kv_reserve 限制；
        max_wait：队列不满一批时最多等多久再发车（秒；0 = 有几个跑几个）。
    【每个请求记录】t_start = 发车时刻；token_times[k] = 第 k 个输出 token 的时刻（第 0 个在 prefill 结束时）；
        t_last = token_times[-1]；t_finish = 整批结束的时刻（结果随整批返回）。
    【返回】(请求列表, 统计字典)：batches（每批 (发车, 结束, 批大小)）、mean_batch、kv_limit（显存允许的批大小，
        按 kv_reserve 时）、useful_tokens / slot_tokens（真正需要的 token 位置 / 实际算过的，含补齐和白跑）。
    【边界】单个请求的 KV 就超过容量：ValueError（永远跑不了，不能静默丢掉）。
    """
    rs = _fresh_copies(reqs)
    check_step_like(step, "simulate_static")
    b_max = check_int("max_batch", max_batch, lo=1)
    max_wait = check_real("max_wait", max_wait, 0.0, 1e9)
    cap = step.kv_capacity_tokens()
    P = np.array([r.prompt for r in rs], dtype=np.int64)
    O = np.array([r.output for r in rs], dtype=np.int64)
    A = np.array([r.arrival for r in rs])
    if kv_reserve is not None:
        kv_reserve = check_int("kv_reserve", kv_reserve, lo=1)
        if cap // kv_reserve < 1:
            raise ValueError(f"kv_reserve={kv_reserve} 超过 KV 容量 {cap} 个 token：一个请求都放不下")
        too_long = np.nonzero(P + O - 1 > kv_reserve)[0]
        if too_long.size:
            k = int(too_long[0])
            raise ValueError(f"请求 {rs[k].rid} 需要 {P[k] + O[k] - 1} 个 token 的 KV，超过 kv_reserve={kv_reserve}")
    else:
        bad = np.nonzero(P + O - 1 > cap)[0]
        if bad.size:
            k = int(bad[0])
            raise ValueError(f"请求 {rs[k].rid} 需要 {P[k] + O[k] - 1} 个 token 的 KV，超过容量 {cap}")
    n, i, t = len(rs), 0, 0.0
    batches, slot, useful = [], 0, 0
    while i < n:
        # 发车时刻：引擎空闲（t）且队头已到；不满一批时最多再等 max_wait（或等到凑满一批）
        fill = A[min(i + b_max, n) - 1]
        t = max(t, A[i], min(fill, A[i] + max_wait))
        b = int(np.searchsorted(A, t, side="right")) - i          # 已到达、还没服务的
        b = min(b, b_max)
        b = min(b, _static_batch_size(P, O, i, b, cap, kv_reserve))
        idx = slice(i, i + b)
        L_max, O_max = int(P[idx].max()), int(O[idx].max())
        t_start = t
        t += step.prefill_time(np.full(b, L_max))                 # 补齐到 L_max
        # 之后 O_max − 1 次 decode，全批 b 行一起；第 j 次时每行的注意力覆盖 L_max + j 个 key
        dts = step.decode_time(b, b * (L_max + np.arange(1, O_max))) if O_max > 1 else np.zeros(0)
        tok = t + np.concatenate([[0.0], np.cumsum(dts)])          # [O_max]：第 k 个输出 token 的时刻
        t = float(tok[-1])
        for k in range(i, i + b):
            r = rs[k]
            r.t_start, r.token_times = t_start, tok[:r.output].copy()
            r.t_first, r.t_last, r.t_finish = float(tok[0]), float(tok[r.output - 1]), t
        batches.append((t_start, t, b))
        slot += b * (L_max + O_max - 1)
        useful += int((P[idx] + O[idx] - 1).sum())
        i += b
    sizes = np.array([b for _, _, b in batches])
    info = {"batches": batches, "mean_batch": float(sizes.mean()), "slot_tokens": slot, "useful_tokens": useful,
            "kv_limit": None if kv_reserve is None else cap // kv_reserve}
    return rs, info


def simulate_continuous(reqs, step, max_batch, chunk=None):
    """
    一个简单的迭代级（continuous batching）调度：每次迭代重新组批，请求一完成就离开，新请求随时加入。
    第 6 讲会细讲 Orca；这里只用来和静态批处理对比，并演示 prefill 对 decode 的干扰（05 脚本）。

    【规则】
        1. 接纳（FCFS）：队头请求在"运行中 < max_batch"且 KV 预留（prompt + output 个 token，假设预先知道输出长度）
           放得下时加入；队头放不下就不再看后面的（保持先到先服务）。
        2. 每次迭代：所有 prefill 已完成的请求各 decode 1 个 token；还在 prefill 的请求按到达顺序分到输入 token。
           chunk = None：一次把整段输入做完（Orca 式）；chunk = C：这次迭代的 token 总数（decode + prefill）
           不超过 C，长输入被切成几块（Sarathi 的分块 prefill）。
        3. 一个请求输入处理完的那次迭代产生它的第 1 个输出 token；生成够 output 个就离开（t_finish = t_last）。
    【返回】(请求列表, 统计字典)：iters（迭代次数）、mean_batch（每次迭代的平均请求数）。
    """
    rs = _fresh_copies(reqs)
    check_step_like(step, "simulate_continuous")
    b_max = check_int("max_batch", max_batch, lo=1)
    if chunk is not None:
        chunk = check_int("chunk", chunk, lo=1)
    cap = step.kv_capacity_tokens()
    need = [r.prompt + r.output for r in rs]
    for r, nd in zip(rs, need):
        if nd > cap:
            raise ValueError(f"请求 {r.rid} 要预留 {nd} 个 token 的 KV，超过容量 {cap}")
    run = iteration_schedule([r.arrival for r in rs], [r.prompt for r in rs], [r.output for r in rs], step, b_max,
                             reserve=need, chunk=chunk)
    for r, t0, times in zip(rs, run["admit_t"], run["token_times"]):
        r.t_start, r.token_times = t0, np.array(times)
        r.t_first, r.t_last, r.t_finish = times[0], times[-1], times[-1]
    return rs, {"iters": run["iters"], "mean_batch": run["mean_batch"]}


def iteration_schedule(arrival, prompt, output, step, max_batch, reserve=None, chunk=None, t_limit=None,
                       history=None, ids=None):
    """
    迭代级调度的引擎（本讲的 simulate_continuous 和第 6 讲的 run_iteration_level 都只是它的包装）。
    每次迭代：先到先服务地接纳新请求 → 算一步（decode 各 1 个 token + prefill 的输入块）→ 做完的立刻离开。

    【参数】arrival / prompt / output：每个请求的到达时刻（已排序）、输入 token 数、输出 token 数（≥ 1）；
        step：StepModel（用 kv_capacity_tokens、mixed_time、model.attn_flops_per_token）；max_batch：每步最多几个请求；
        reserve：每个请求接纳时预留的 KV token 数（列表）——剩余不够就停止接纳，已接纳的一定能跑完；
                 None = 不预留，写多少占多少：接纳时只要放得下输入，之后每步每个请求还要再写 1 个；
                 显存写满时谁都动不了 → 死锁（没有抢占 / 换出；第 7 讲解决）。
        chunk：None = 输入一次做完；C = 每步的 token 总数（decode + prefill）不超过 C（分块 prefill）。
               只能和预留一起用（reserve 不是 None）。
        t_limit：时钟超过它就停；history：给一个列表时每步追加
                 {"t0", "t1", "prefill", "decode", "reserved", "used"}（请求用 ids 标识，默认是下标）。
    【返回】字典：admit_t / token_times（每个请求；没接纳是 nan / 空列表）、done、iters、
        mean_batch（每步的平均请求数）、deadlock、deadlock_t、admit_order、
        mean_reserved / mean_used / peak_reserved / peak_used
        （这一步执行时已预留 / 已写入的 KV token 数：写完本步的 KV、还没释放完成者）。
    【报错】到达时刻不是有限、非负、不减的；长度不是正整数；各列表长度不同；预留比请求要写的 KV 少或超过容量、
        不预留时一个请求单独占满显存也放不下：ValueError / TypeError（调度之前查一遍，循环里不再查）。
    """
    arrival, prompt, output, max_batch, reserve, chunk, t_limit, ids, cap = _check_schedule(
        arrival, prompt, output, step, max_batch, reserve, chunk, t_limit, history, ids)   # cap：KV 容量（token）
    # >>> 练习 5.1
    n = len(arrival)
    pre = reserve is not None                           # 预留模式（否则写多少占多少）
    attn_1 = step.model.attn_flops_per_token(1)         # 每个 token 每看一个 key 的注意力 FLOPs
    prog, gen = [0] * n, [0] * n                        # 已 prefill 的输入 token 数；已生成的输出 token 数
    admit_t, times = [math.nan] * n, [[] for _ in range(n)]
    t, arrived, head = 0.0, 0, 0                        # 下标 < arrived 已到达；head…arrived−1 在排队
    active, reserved, used = [], 0, 0                   # 已接纳未完成（按到达顺序）；已预留 / 已写入的 KV
    out = {"deadlock": False, "deadlock_t": None, "done": 0, "iters": 0, "admit_order": [],
           "peak_reserved": 0, "peak_used": 0}
    occ = res_sum = used_sum = 0
    while out["done"] < n and (t_limit is None or t <= t_limit):
        while arrived < n and arrival[arrived] <= t:
            arrived += 1
        if not active and head == arrived:              # 系统全空：时钟跳到下一个请求到达
            t = arrival[arrived]
            continue
        # 1. 谁参加这一步：已接纳的（不预留时只有还能再写 1 个 KV 的前几个），再按到达顺序接纳新请求
        batch = list(active) if pre else active[:max(0, cap - used)]
        held = reserved if pre else used + len(batch)
        while head < arrived and len(batch) < max_batch:
            need = reserve[head] if pre else prompt[head]
            if held + need > cap:
                break                                   # 队头放不下：停止接纳，后面的不插队（FCFS）
            held += need
            admit_t[head] = t
            out["admit_order"].append(ids[head])
            batch.append(head)
            active.append(head)
            head += 1
        if pre:
            reserved = held
        if not batch:                                   # 只可能在不预留时：谁都写不了 KV，也没人会释放
            out["deadlock"], out["deadlock_t"] = True, t
            break
        # 2. 这一步的工作：decode 的各 1 个 token，加上按到达顺序分到的输入块
        dec = [k for k in batch if prog[k] == prompt[k]]
        ctx = sum(prompt[k] + gen[k] for k in dec)      # decode 请求各自读的 KV（含这一步新写的那个）
        budget = math.inf if chunk is None else max(chunk - len(dec), 0)
        pieces, p_tok, p_attn, p_ctx = _prefill_pieces(batch, prompt, prog, budget, attn_1)
        t0 = t
        extra = (p_ctx,) if p_ctx else ()               # 分块时才有"之前的块"：只接受 4 个参数的 step 也能用
        t += step.mixed_time(len(dec), ctx, p_tok, p_attn, *extra)
        used += p_tok + len(dec)
        held = reserved if pre else used
        res_sum, used_sum, occ = res_sum + held, used_sum + used, occ + len(dec) + len(pieces)
        out["peak_reserved"], out["peak_used"] = max(out["peak_reserved"], held), max(out["peak_used"], used)
        out["iters"] += 1
        if history is not None:
            history.append({"t0": t0, "t1": t, "prefill": [ids[k] for k, _ in pieces],
                            "decode": [ids[k] for k in dec], "reserved": held, "used": used})
        # 3. 前进：decode 的各得 1 个 token；输入刚做完的请求这一步顺便产生第 1 个 token；做完的立刻释放
        for k in dec:
            gen[k] += 1
            times[k].append(t)
        for k, c in pieces:
            prog[k] += c
            if prog[k] == prompt[k]:
                gen[k] = 1
                times[k].append(t)
        for k in batch:
            if gen[k] == output[k]:
                out["done"] += 1
                used -= prompt[k] + output[k] - 1       # 它写过的 KV（最后一个 token 不用写）
                if pre:
                    reserved -= reserve[k]
        active = [k for k in active if gen[k] < output[k]]
    it = max(out["iters"], 1)
    out.update(admit_t=admit_t, token_times=times, mean_batch=occ / it,
               mean_reserved=res_sum / it, mean_used=used_sum / it)
    return out
    # <<< 练习 5.1


def _prefill_pieces(batch, prompt, prog, budget, attn_1):
    """按到达顺序给还在 prefill 的请求分输入块，直到 budget 用完。
    返回 (块列表 [(下标, token 数)], 总 token 数, 注意力 FLOPs, 这些块之前已 prefill 的 token 数之和)。"""
    pieces, p_tok, p_attn, p_ctx = [], 0, 0.0, 0
    for k in batch:
        left = prompt[k] - prog[k]
        if budget <= 0:
            break
        if left == 0:
            continue
        c, o = int(min(left, budget)), prog[k]
        pieces.append((k, c))
        p_tok, p_ctx, budget = p_tok + c, p_ctx + o, budget - c
        p_attn += attn_1 * (c * o + c * (c + 1) / 2)       # 这块的第 j 个 token 看 o + j 个 key（因果掩码）
    return pieces, p_tok, p_attn, p_ctx


# =============================================================================
# 第 4 部分：给演示用的小工具
# =============================================================================
def crossover_batch(step, ctx_per_seq=0, b_max=1 << 14):
    """
    decode 从"带宽受限"变成"算力受限"的最小批大小（每个序列上下文 ctx_per_seq 个 token）。找不到返回 None。

    【直觉】只看权重时，decode 一步的强度 ≈ batch × 2 FLOP ÷ w_bytes 字节 —— BF16 下就是 batch 本身；
        所以拐点批大小 ≈ effective_ridge()（= 芯片的 ridge point × mfu / mbu）。KV 的读取让拐点往后推
        （长上下文时 KV 字节随 batch 一起涨，强度上不去，可能永远到不了拐点）。
    """
    check_step_like(step, "crossover_batch")
    ctx = max(check_int("ctx_per_seq", ctx_per_seq, lo=0, where="crossover_batch"), 1)
    B = np.arange(1, check_count("b_max", b_max, 10 * 8, where="crossover_batch") + 1)   # 约 10 个 float64 数组
    _, _, t_c, t_m = step._roofline(B, step._attn1() * B * ctx, B * ctx, B)     # 和 decode_cost(B, B·ctx) 同一套账
    hit = np.nonzero(t_c >= t_m)[0]
    return int(B[hit[0]]) if hit.size else None


def min_tp(model, chip, candidates=(1, 2, 4, 8, 16), **kw):
    """
    权重放得下（且还有 KV 空间）的最小 tp；都不行返回 None。kw 传给 StepModel。
    切不了这个模型的 tp（不整除头数等）跳过；只有"显存放不下"（CapacityError）算作"这个 tp 不行"——
    其他错误（比如 mfu=2 这样的坏参数）照常抛出，不会被当成"放不下"。
    """
    _check_model_chip(model, chip)
    tps = sorted(check_int("candidates 的元素", tp, lo=1) for tp in _iterable("candidates", candidates, "min_tp"))
    for tp in tps:
        if _tp_layout_problem(model, chip, tp) is not None:
            continue
        try:
            StepModel(model, chip, tp=tp, **kw)
            return tp
        except CapacityError:
            continue
    return None


def offline_sweep(step, batch_sizes, n_req, prompt=("fixed", 512), output=("fixed", 256), seed=0, kv_reserve=None):
    """
    离线（全部请求 t = 0 到达）静态批处理，在不同 max_batch 下的吞吐与延迟。
    显存放不下的批大小会被自动截到 KV 允许的大小（"KV 的墙"）——返回里 eff_batch 记的是实际平均批大小。
    【返回】字典列表，每个含 max_batch、eff_batch、largest_batch（实际跑过的最大一批）、tok_per_s、tpot_p50、e2e_mean、
        ttft_mean、useful_frac（useful_tokens ÷ slot_tokens：补齐和陪跑之外真正有用的计算占比）。
    """
    check_step_like(step, "offline_sweep")
    batch_sizes = _iterable("batch_sizes", batch_sizes, "offline_sweep")
    n_req = check_count("n_req", n_req, _REQUEST_BYTES, where="offline_sweep")
    base = make_requests(n_req, math.inf, prompt, output, seed)
    rows = []
    for B in batch_sizes:
        B = check_int("batch_sizes 的元素", B, lo=1)          # 不静默截断 2.7 → 2
        rs, info = simulate_static(base, step, B, kv_reserve=kv_reserve)
        s = summarize(rs)
        rows.append({"max_batch": int(B), "eff_batch": info["mean_batch"],
                     "largest_batch": max(b for _, _, b in info["batches"]), "tok_per_s": s["tok_per_s"],
                     "tpot_p50": s["tpot_p50"], "e2e_mean": s["e2e_mean"], "ttft_mean": s["ttft_mean"],
                     "useful_frac": info["useful_tokens"] / info["slot_tokens"]})
    return rows


# =============================================================================
# 输入检查（放在教学代码之后；单个参数用 course_utils 的 check_*）
# =============================================================================
def _check_ft_args(model, chip, max_seq, runtime_bytes, act_bytes, w_bytes, kv_bytes):
    """ft_batch_cap 的输入检查；返回 (max_seq, runtime_bytes)。"""
    _check_model_chip(model, chip)
    for name, v in (("act_bytes", act_bytes), ("w_bytes", w_bytes), ("kv_bytes", kv_bytes)):
        check_real(name, v, 0.0, 8.0, lo_open=True, where="ft_batch_cap")
    return (check_int("max_seq", max_seq, lo=1, where="ft_batch_cap"),
            check_real("runtime_bytes", runtime_bytes, lo=0.0, where="ft_batch_cap"))


_REQUEST_BYTES = 600       # 每个请求按 600 B 算内存：make_requests 实测约 270 B/个，模拟器再复制一份、加上 token_times


def _iterable(name, v, where):
    """一串值（列表、元组、数组……）；字符串、单个数不算。"""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{where}：{name} 必须是一串值（列表或元组），收到 {type(v).__name__} {v!r}")
    return list(v)


def _check_request(r):
    """Request 的字段：rid 整数、arrival 有限且 ≥ 0、prompt / output 是正整数。"""
    check_int("rid", r.rid, where="Request")
    check_real("arrival", r.arrival, lo=0.0, where="Request")
    check_int("prompt", r.prompt, lo=1, where="Request")
    check_int("output", r.output, lo=1, where="Request")


def _request_list(reqs, where):
    """Request 的列表（元素逐个查类型）。"""
    reqs = _iterable("reqs", reqs, where)
    for i, r in enumerate(reqs):
        if not isinstance(r, Request):
            raise TypeError(f"{where}：reqs[{i}] 必须是 Request，收到 {type(r).__name__}")
    return reqs


def check_step_like(step, where):
    """step 要像 StepModel：有 kv_capacity_tokens、prefill_time、decode_time、mixed_time。"""
    for attr in ("kv_capacity_tokens", "prefill_time", "decode_time", "mixed_time"):
        if not callable(getattr(step, attr, None)):
            raise TypeError(f"{where}：step 必须是 StepModel（缺少 {attr}），收到 {type(step).__name__}")


def _check_steps(times, counts, t0, t1):
    """time_average 的输入：times 一维、有限、不减；counts 和它一样长；t0 < t1 都有限。"""
    times = check_array("times", times, ndim=1, where="time_average")
    counts = check_array("counts", counts, ndim=1, where="time_average")
    if len(times) != len(counts):
        raise ValueError(f"time_average：times 和 counts 必须一样长，收到 {len(times)} 和 {len(counts)}")
    if np.any(np.diff(times) < 0):
        raise ValueError("time_average：times 必须不减（阶梯函数的断点按时间排序）")
    t0, t1 = check_real("t0", t0, where="time_average"), check_real("t1", t1, where="time_average")
    if not t1 > t0:
        raise ValueError(f"time_average：需要 t1 > t0，收到 t0={t0}, t1={t1}")
    return times, counts, t0, t1


def _int_list(name, v, n, lo, where):
    """长度 n 的正整数列表（numpy 整数也收，转成 Python int；小数、bool 不收）。"""
    a = np.asarray(_iterable(name, v, where))
    if a.ndim != 1 or (n is not None and len(a) != n):
        raise ValueError(f"{where}：{name} 必须是长度 {n} 的一维列表，收到形状 {a.shape}")
    if a.size and (a.dtype == bool or not np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{where}：{name} 的元素必须是整数，收到 dtype {a.dtype}")
    if a.size and a.min() < lo:
        raise ValueError(f"{where}：{name} 的元素必须 ≥ {lo}，最小的是 {a.min()}")
    return [int(x) for x in a]


def _check_schedule(arrival, prompt, output, step, max_batch, reserve, chunk, t_limit, history, ids):
    """iteration_schedule 的全部输入检查（调度循环之前一次）。返回转换后的值和 KV 容量。"""
    w = "iteration_schedule"
    check_step_like(step, w)
    arr = check_array("arrival", _iterable("arrival", arrival, w), ndim=1, where=w)
    n = len(arr)
    if (arr < 0).any():
        raise ValueError(f"{w}：arrival 必须 ≥ 0，最小的是 {arr.min()}")
    if np.any(np.diff(arr) < 0):
        raise ValueError(f"{w}：arrival 必须按时间排好序（先到先服务）")
    prompt, output = _int_list("prompt", prompt, n, 1, w), _int_list("output", output, n, 1, w)
    max_batch = check_int("max_batch", max_batch, lo=1, where=w)
    top = int(step.kv_capacity_tokens())
    writes = [p + o - 1 for p, o in zip(prompt, output)]         # 一个请求最终写下的 KV（最后一个 token 不写）
    if reserve is not None:
        reserve = _int_list("reserve", reserve, n, 1, w)
        for k, (r, need) in enumerate(zip(reserve, writes)):
            if r < need or r > top:
                raise ValueError(f"{w}：reserve[{k}] = {r} 必须在 [{need}（prompt + output − 1）, {top}（KV 容量）] 里")
    else:
        for k, need in enumerate(writes):
            if need > top:
                raise ValueError(f"{w}：请求 {k} 要写 {need} 个 token 的 KV（prompt + output − 1），超过 KV 容量 {top}")
    if chunk is not None:
        if reserve is None:
            raise ValueError(f"{w}：分块 prefill（chunk）只能和 KV 预留（reserve）一起用")
        chunk = check_int("chunk", chunk, lo=1, where=w)
    if t_limit is not None:
        t_limit = check_real("t_limit", t_limit, where=w)
    if history is not None and not isinstance(history, list):
        raise TypeError(f"{w}：history 必须是列表或 None，收到 {type(history).__name__}")
    ids = list(range(n)) if ids is None else _iterable("ids", ids, w)
    if len(ids) != n:
        raise ValueError(f"{w}：ids 必须和 arrival 一样长（{n}），收到 {len(ids)}")
    return [float(a) for a in arr], prompt, output, max_batch, reserve, chunk, t_limit, ids, top


def _count_array(name, v, lo=0):
    """整数或整数数组（元素 ≥ lo）→ int64 数组。"""
    a = np.asarray(v)
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} 必须是整数或整数数组，收到 dtype {a.dtype}")
    if a.size and a.min() < lo:
        raise ValueError(f"{name} 的每个元素必须 ≥ {lo}，最小的是 {a.min()}")
    return a.astype(np.int64)


# =============================================================================
# 自检
# =============================================================================
def _ref_step_time(model, chip, n_tok, q_positions, kv_read, mfu, mbu, overhead, wb=2.0, kb=2.0):
    """
    独立的参考实现：逐个列出每层的权重矩阵、逐个 query 数注意力的 (q, k) 对，再套 roofline。
    q_positions：每个新 token 看见的 key 数（列表）；kv_read：读的 KV token 数。只适用于 tp = 1。
    """
    d, H, G, dh, f = model.d_model, model.n_heads, model.n_kv_heads, model.d_head, model.d_ff
    mats = [(d, H * dh), (d, G * dh), (d, G * dh), (H * dh, d), (d, f), (d, f), (f, d)]   # q k v o gate up down
    w_per_layer = sum(a * b for a, b in mats)
    w_total = model.n_layers * w_per_layer + d * model.vocab                              # + lm_head
    flops = 2.0 * w_total * n_tok
    for p in q_positions:                       # 每个 query 对 p 个 key：QKᵀ 和 PV 各 2·dh FLOPs/头/层
        flops += model.n_layers * H * (2 * dh * p + 2 * dh * p)
    kv_tok = 2 * model.n_layers * G * dh * kb
    nbytes = w_total * wb + (kv_read + n_tok) * kv_tok
    return max(flops / (chip.peak_flops("bf16") * mfu), nbytes / (chip.mem_bw * mbu)) + overhead


def _selftest():
    import time
    t_begin = time.perf_counter()
    rng = np.random.default_rng(2024)
    chip = A100_40G

    # 1. KV 容量 = (0.9 × 可分配显存 − 权重) ÷ 每 token KV。原课程第 6 讲的 A100（只有手册的 40e9）按 2048 预留是 6 个；
    #    我们的 A100 用推出来的可分配字节（42.6 GB），是 7 个 —— 和 FT 假设推出的批上限（ft_batch_cap）一致
    sm = StepModel(GPT3_13B, chip)
    kv_tok = 2 * 40 * 40 * 128 * 2                                       # 2(K,V) × 层 × KV 头 × 维 × 2 字节
    want = math.floor((0.9 * chip.alloc_bytes - GPT3_13B.n_params() * 2) / kv_tok)
    assert sm.kv_capacity_tokens() == want, (sm.kv_capacity_tokens(), want)
    seed_chip = dataclasses.replace(chip, mem_alloc=None)                 # 原课程的写法：没有 mem_alloc
    assert StepModel(GPT3_13B, seed_chip).kv_capacity_tokens() // 2048 == 6
    ft = ft_batch_cap(GPT3_13B, chip)
    assert want // 2048 == ft["cap"] == 7 and ft["cap_kv_only"] == 9, (want // 2048, ft)
    assert ft["cap"] < 8, "论文：FT 在 13B / A100-40GB 上批到 8 就 OOM"

    # 2. 时间 = 参考实现（逐矩阵、逐 query 计数）——随机的小模型、随机批
    for trial in range(20):
        G = int(rng.choice([1, 2, 4]))
        H = G * int(rng.integers(1, 5))
        m = llm_math.ModelConfig(f"rand{trial}", n_layers=int(rng.integers(1, 9)), d_model=int(rng.integers(64, 2049)),
                                 n_heads=H, n_kv_heads=G, d_head=int(rng.choice([32, 64, 128])),
                                 d_ff=int(rng.integers(64, 8193)), vocab=int(rng.integers(100, 50001)))
        mfu, mbu, ovh = rng.uniform(0.1, 1.0), rng.uniform(0.1, 1.0), rng.uniform(0, 2e-3)
        st = StepModel(m, chip, mfu=mfu, mbu=mbu, overhead=ovh)
        lens = rng.integers(1, 300, size=int(rng.integers(1, 6)))
        qpos = [p for L in lens for p in range(1, L + 1)]
        ref = _ref_step_time(m, chip, int(lens.sum()), qpos, 0, mfu, mbu, ovh)
        assert abs(st.prefill_time(lens) - ref) <= 1e-9 * ref
        ctxs = rng.integers(1, 4000, size=int(rng.integers(1, 64)))
        ref = _ref_step_time(m, chip, len(ctxs), list(ctxs), int(ctxs.sum()), mfu, mbu, ovh)
        assert abs(st.decode_time(len(ctxs), int(ctxs.sum())) - ref) <= 1e-9 * ref
        # 混合一步的两个特例 = decode / prefill
        assert st.mixed_time(len(ctxs), int(ctxs.sum()), 0, 0) == st.decode_time(len(ctxs), int(ctxs.sum()))
        pattn = m.attn_flops_per_token(1) * float((lens * (lens + 1) // 2).sum())
        assert abs(st.mixed_time(0, 0, int(lens.sum()), pattn) - st.prefill_time(lens)) <= 1e-12 * st.prefill_time(lens)

    # 3. roofline 的两边：decode 批 1 受带宽限制、2048 token 的 prefill 受算力限制；拐点批大小 ≈ 有效 ridge
    h100 = hw_specs.H100_SXM
    st = StepModel(GPT3_13B, h100)
    assert st.decode_cost(1, 512).bound == "memory" and st.prefill_cost([2048]).bound == "compute"
    bx = crossover_batch(st, ctx_per_seq=1)
    assert abs(bx - st.effective_ridge()) / st.effective_ridge() < 0.05, (bx, st.effective_ridge())
    # 单调：批越大、上下文越长，一步越久
    ctx = np.arange(64, 20000, 97)
    assert np.all(np.diff(st.decode_time(64, ctx)) >= 0)
    assert all(st.decode_time(b, 4096) <= st.decode_time(b + 1, 4096) for b in range(1, 200))

    # 4. 张量并行：tp = 1 没有通信；tp = 2 每卡权重减半、KV 容量至少翻倍；放不下时报错
    st1, st2 = StepModel(GPT3_13B, h100), StepModel(GPT3_13B, h100, tp=2)
    assert st1.comm_time(64) == 0.0 and st2.comm_time(64) > 0
    assert st2.weight_bytes_per_chip * 2 == st1.weight_bytes_per_chip
    assert st2.kv_capacity_tokens() >= 2 * st1.kv_capacity_tokens()
    assert st2.decode_cost(8, 8 * 1000).t_memory < st1.decode_cost(8, 8 * 1000).t_memory
    big = LLAMA31_70B
    try:
        StepModel(big, h100)
        raise AssertionError("70B 级模型 BF16 放不进一块 80 GB 的卡，应该报错")
    except ValueError as e:
        assert "GB" in str(e)
    assert min_tp(big, h100) == 2
    # KV 头少于 tp：405B 只有 8 个 KV 头，切 16 块卡时每块卡复制 1 个（不是半个）——逐字段手算参考
    m405 = llm_math.LLAMA31_405B
    s16 = StepModel(m405, h100, tp=16)
    kv_chip = 2 * m405.n_layers * 1 * m405.d_head * 2                     # K、V × 层 × 1 个头 × dh × 2 字节
    want = math.floor((0.9 * h100.alloc_bytes - m405.n_params() * 2 / 16) / kv_chip)
    assert s16.kv_bytes_per_token == kv_chip and s16.kv_capacity_tokens() == want, (s16.kv_capacity_tokens(), want)

    # 5. 静态批处理：不变式、两个模拟器在 max_batch = 1 时完全一致、Little 定律
    reqs = make_requests(300, 4.0, ("uniform", 16, 400), ("uniform", 1, 64), seed=7)
    rs, info = simulate_static(reqs, sm, 8)
    _check_trace(rs)
    assert sum(b for _, _, b in info["batches"]) == len(reqs)
    for (_, e0, _), (s1, _, _) in zip(info["batches"], info["batches"][1:]):
        assert s1 >= e0, "静态批处理：下一批必须等上一批结束"
    lw = littles_law(rs)
    assert lw["rel_err"] < 1e-9, lw                  # 整个窗口（两端系统为空）：精确
    lw_mid = littles_law(rs, rs[60].arrival, rs[240].arrival)
    assert lw_mid["rel_err"] < 0.15, lw_mid          # 中间一段稳态窗口：近似
    a, _ = simulate_static(reqs[:80], sm, 1)
    b, _ = simulate_continuous(reqs[:80], sm, 1)
    assert max(abs(x.t_finish - y.t_finish) for x, y in zip(a, b)) < 1e-9
    # 没有排队时，一个请求的延迟 = prefill + 逐步 decode（手工循环）
    solo = [Request(0, 0.0, 37, 9)]
    (r,), _ = simulate_static(solo, sm, 4)
    by_hand = sm.prefill_time([37]) + sum(sm.decode_time(1, 37 + j) for j in range(1, 9))
    assert abs(r.e2e - by_hand) < 1e-12
    rc, _ = simulate_continuous(reqs, sm, 16, chunk=256)
    _check_trace(rc)
    dt = time.perf_counter() - t_begin
    print(f"serving_sim 自检通过：KV 容量 = 参考（13B@A100 按 2048 预留：FT 假设推出 7 个，"
          f"原课程的 0.9 × 40 GB 规则 6 个）、时间 = 逐矩阵参考、roofline 拐点 "
          f"{bx} ≈ ridge {st.effective_ridge():.0f}、TP 一致、两个模拟器不变式 + Little 定律（{dt:.2f} s）")


def _check_trace(rs):
    """模拟结果的不变式：每个请求恰好完成一次、时间顺序合理、FCFS。"""
    assert len({r.rid for r in rs}) == len(rs)
    for r in rs:
        assert r.arrival <= r.t_start <= r.t_first <= r.t_last <= r.t_finish, r
        assert len(r.token_times) == r.output and np.all(np.diff(r.token_times) >= 0)
    starts = np.array([r.t_start for r in rs])
    assert np.all(np.diff(starts) >= 0), "先到先服务：开始时刻随到达顺序不减"


if __name__ == "__main__":
    _selftest()
