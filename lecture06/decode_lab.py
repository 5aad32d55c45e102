"""
decode_lab.py —— 第 6 讲：让 decode 的每一步做更多有用功（迭代级调度、选择性批处理、投机解码）

【问题】decode 每步只给每个序列产出 1 个 token，却要把全部权重从 HBM 搬一遍：算术强度 ≈ 这一步里有几个 token，
    远低于 GPU 的拐点（第 1 讲）。让一步做更多有用功只有两个方向：
      A. 一步里放更多**请求**——请求随时到达、长短不一、阶段不同 → Orca（Yu et al., OSDI '22）：
         迭代级调度 + 选择性批处理。
      B. 一步里为同一个请求验证更多 **token**——第 t+1 个依赖第 t 个 → 投机解码（Leviathan et al., ICML '23；
         Chen et al. 2023）：草稿模型先猜 γ 个，目标模型一次验证；修正过的拒绝采样让输出分布和目标模型**完全相同**。

【里面有什么】
    §1 调度：Req、orca_workload、run_request_level（FasterTransformer 式）、run_iteration_level（Orca 算法 1：
       三种 KV 预留、死锁检测；引擎是第 5 讲的 serving_sim.iteration_schedule）、latency_throughput
    §2 选择性批处理：ragged_forward —— 长短不一的请求拼成 [ΣT_i, d] 过线性层，只有注意力按请求拆开
    §3 投机解码：adjust / residual / spec_output_dist / sample_rows、TransformerLM / NGramLM、speculative_generate、
       spec_sample_batch、exact_continuation_dist / chi_square_gof、expected_tokens / walltime_speedup / best_gamma
    §4 硬件视角：verify_time、spec_round / best_round、fits_in_memory、tree_round（树形验证）；tiny_pair（小模型对）

【约定】时间：秒；长度：token 数；1 GB = 10⁹ 字节。概率分布 = 最后一维和为 1 的 float64 数组 [..., V]。
    随机性一律由调用者传入 np.random.Generator（结果可复现）。调度函数会改写传入的 Req（开始时先清零，可重复模拟）。
【假设】（改它们会改数字，不改结论的方向）
    H1 每步时间 = roofline + 固定开销（第 5 讲 StepModel 的默认值）；H2 只模拟一块 GPU；H3 调度不花时间；
    H4 KV 按 token 精确分配、没有碎片（分页在本课程之外：vLLM [S60]）；H5 Leviathan：各草稿 token 以概率 α 独立被接受、
    验证 γ+1 个和 decode 1 个一样快（§4 换成 roofline）；H6 spec_round：批里同一个 γ，草稿和目标串行。
    投机解码的正确性检验用没训练过的小模型：接受率只说明机制，不代表真实模型。

【运行】python3 lecture06/decode_lab.py      # 自检，不到 1 秒
【依赖】numpy；lecture01（llm_math、hw_specs）、lecture02（transformer_lab）、lecture05（serving_sim）、prereq5（comm_sim）。
"""

import itertools
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for _dep in ("lecture01", "lecture02", "lecture05", "prereq5"):
    sys.path.insert(0, os.path.join(HERE, "..", _dep))

import llm_math  # noqa: E402
import serving_sim  # noqa: E402
from serving_sim import StepModel  # noqa: E402
from transformer_lab import (KVCache, attention_core, apply_rope, forward, linear, lm_head_matrix,  # noqa: E402
                             rms_norm, rope_angles, silu, softmax)
import transformer_lab as _tl  # noqa: E402  （逐元素运算的记账常数，和 forward 记得一样）
from course_utils import check_choice, check_count, check_int, check_real, check_rng  # noqa: E402  参数检查（第 1 讲起各讲共用）


# =============================================================================
# §1 调度模拟：请求级（FasterTransformer）vs 迭代级（Orca）
# =============================================================================
# Orca 的实验平台与模型：和第 1、5 讲用**同一个对象**（一处定义，数字只在一个地方改）。
#   A100_40G ：Azure ND96asr A100 v4 上的 A100-SXM4-40GB[S56]；312 TFLOPS BF16 稠密、1,555 GB/s、
#              40 GB HBM2[S1, S3]。第 1 讲的芯片表里没有 A100，它定义在第 5 讲的 serving_sim 里。
#   GPT3_13B ：Orca 表 1 的 13B（40 层、隐藏维 5120、单卡；MHA、头维 128；[S46]）。第 1 讲的预设把 GPT-3 的
#              d→4d→d MLP 换成参数量相同的 SwiGLU（d_ff = 13653），并计入 qkv 偏置和 2048 个学到的位置向量。
#   LLAMA32_1B：Llama 3.2 1B[S41, S42]：和 Llama 3.1 8B / 70B 共用分词器（词表 128256），常作草稿模型。
A100_40G = serving_sim.A100_40G
ft_batch_cap = serving_sim.ft_batch_cap        # FT 式批上限：由写明的假设推出（见 serving_sim）
GPT3_13B = llm_math.GPT3_13B
LLAMA32_1B = llm_math.LLAMA32_1B
LLAMA31_8B = llm_math.LLAMA31_8B
LLAMA31_70B = llm_math.LLAMA31_70B
FT_MAX_SEQ = 2048          # FasterTransformer 按模型最大长度给每个请求预留 KV（Orca 的最大长度 2048 [S56]）


@dataclass
class Req:
    """
    调度模拟里的一个请求。

    【输入字段】rid 编号；arrival 到达时刻（秒）；prompt 输入 token 数；
        output   ：实际要生成的 token 数（≥ 1；第 1 个由处理输入的那次迭代产出）；
        max_gen  ：请求声明的生成上限（≥ output）。Orca 按 prompt + max_gen 预留 KV；Orca 的实验强制生成到上限，
                   即 output = max_gen [S56]。
    【模拟写入的字段】gen 已生成数；admitted 是否已接纳（已占 KV）；admit_t 第一次被放进一步的时刻；
        first_tok 第一个 token 算出来的时刻；finish 最后一个 token 算出来的时刻（没完成时是 nan）。
    【为什么 output 和 max_gen 分开】真实请求常常提前遇到 EOS：声明 128、实际 20。按声明预留的 KV 有一大半白占着
        ——这就是 01 演示里"预留 vs 实际使用"那张表。
    """
    rid: int
    arrival: float
    prompt: int
    output: int
    max_gen: int
    gen: int = 0
    finish: float = math.nan
    admitted: bool = False
    admit_t: float = math.nan
    first_tok: float = math.nan

    def __post_init__(self):
        check_int("Req.rid", self.rid)
        check_int("Req.prompt", self.prompt, lo=1)
        check_int("Req.output", self.output, lo=1)
        check_int("Req.max_gen", self.max_gen, lo=1)
        if self.max_gen < self.output:
            raise ValueError(f"Req {self.rid}: max_gen={self.max_gen} 必须 ≥ output={self.output}（否则预留不够）")
        check_real("Req.arrival", self.arrival, lo=0.0)

    @property
    def latency(self):
        """端到端延迟：到达 → 最后一个 token。"""
        return self.finish - self.arrival   # 秒

    @property
    def norm_latency(self):
        """Orca 图 10 的纵轴：延迟 / 生成的 token 数（平均每个 token 等了多久）。"""
        return self.latency / self.output   # 秒 / token

    def _reset(self):
        self.gen, self.finish, self.admitted = 0, math.nan, False
        self.admit_t = self.first_tok = math.nan


def orca_workload(n, rate, seed=0, prompt_range=(32, 512), gen_range=(1, 128), max_gen=None):
    """
    Orca 论文 §6 的合成负载[S56, S58]：输入长度 ~ U{32..512}，生成长度 ~ U{1..128}，泊松到达。

    【参数】n 请求数；rate 平均每秒到达几个（泊松过程的强度）；seed 随机种子；
        prompt_range / gen_range：闭区间 [lo, hi] 上的离散均匀分布；
        max_gen：None 时 max_gen = output（和论文一样强制生成到上限）；给整数 m 时每个请求声明 max(m, output)，
            实际只生成 output 个（模拟"提前遇到 EOS"）。
    【返回】按到达时间排好的 Req 列表。
    【设计】先抽单位强度的到达间隔再除以 rate：同一个 seed 下换 rate 只是把时间轴整体伸缩，长度完全不变，
        不同负载之间的比较只差"来得多快"这一个因素。
    """
    n = check_int("n", n, lo=1)
    rate = check_real("rate", rate, lo=0.0, lo_open=True)
    (plo, phi), (glo, ghi) = (_closed_range(nm, r) for nm, r in (("prompt_range", prompt_range),
                                                                  ("gen_range", gen_range)))
    if max_gen is not None:
        max_gen = check_int("max_gen", max_gen, lo=1)
    # 同一个生成器：第 5 讲的 make_requests（泊松到达 + 闭区间均匀长度），这里只把 Request 换成带 max_gen 的 Req
    base = serving_sim.make_requests(n, rate, ("uniform", plo, phi), ("uniform", glo, ghi), seed=seed)
    return [Req(r.rid, r.arrival, r.prompt, r.output, r.output if max_gen is None else max(r.output, max_gen))
            for r in base]


def _closed_range(name, r):
    try:
        lo, hi = r
    except (TypeError, ValueError):
        raise TypeError(f"{name} 必须是两个整数 (lo, hi)，收到 {r!r}") from None
    lo, hi = check_int(f"{name}[0]", lo, lo=1), check_int(f"{name}[1]", hi, lo=1)
    if lo > hi:
        raise ValueError(f"{name} 要求 lo ≤ hi，收到 ({lo}, {hi})")
    return lo, hi


def _start(reqs, max_bs):
    """每次模拟开始时：检查请求按到达排序、清空模拟字段。"""
    reqs = _seq("reqs", reqs)
    for r in reqs:
        if not isinstance(r, Req):
            raise TypeError(f"reqs 的元素必须是 Req，收到 {type(r).__name__}")
    arr = [r.arrival for r in reqs]
    if any(b < a for a, b in zip(arr, arr[1:])):
        raise ValueError("reqs 必须按 arrival 从早到晚排序（先到先服务的前提）")
    for r in reqs:
        r._reset()
    return reqs, check_int("max_bs", max_bs, lo=1)


def run_request_level(reqs, step, max_bs, max_seq=FT_MAX_SEQ, history=None):
    """
    请求级调度（Orca 图 2、图 3；NVIDIA Triton + FasterTransformer 的做法）：引擎空闲时从队列头取最多 B 个
    请求组成一批，**整批做完**才返回结果、才接下一批。

    【三个代价】
        1. 显存：FasterTransformer 给每个请求预留 max_seq 个 token 的 KV，不管它实际多长，所以
           B ≤ ⌊KV 容量 / max_seq⌋。GPT-3 13B 在 A100 40GB 上是 7（0.9 × 可分配 42.6 GB；ft_batch_cap 按权重、
           KV、FT 工作区的假设推出的也是 7）—— 论文说 FT 在 13B 上批到 8 就 OOM [S56]。
        2. 补齐：第一次迭代把这一批的输入都补到最长的那个 L_max，按 [B, L_max] 一起算。
        3. 白算与陪跑：之后每次迭代全批 B 行一起 decode，直到最长的输出 O_max 生成完；
           早结束的请求那几行在空转，它的结果也要等整批结束才一起返回。
    【参数】reqs：Req 列表（按到达排序；会被改写）；step：serving_sim.StepModel（或接口相同的对象）；
        max_bs：最大批大小（会被显存上限截断）；max_seq：每个请求预留的 KV 长度；
        history：给一个列表时，每批追加一条 {"t0", "t1", "rids"}（测试"先到先服务、时间不倒流"用）。
    【返回】字典：slot_tokens（算过的 token 位置数，含补齐和空转）、useful_tokens（真正需要的）、
        batches（批数）、max_bs_used（实际批大小上限）。
    【报错】显存放不下一个 max_seq 的请求、或者某个请求 prompt + max_gen > max_seq 时抛 ValueError（与其
        模拟一个不可能的系统，不如直接说清楚）。
    """
    reqs, max_bs = _start(reqs, max_bs)
    _check_step_history(step, history, "run_request_level")
    max_seq = check_int("max_seq", max_seq, lo=1)
    for r in reqs:
        if r.prompt + r.max_gen > max_seq:
            raise ValueError(f"请求 {r.rid} 的 prompt + max_gen = {r.prompt + r.max_gen} 超过 max_seq={max_seq}")
    cap = int(step.kv_capacity_tokens()) // max_seq      # 每个请求占满 max_seq 时能放几个
    if cap < 1:
        raise ValueError(f"KV 容量只有 {step.kv_capacity_tokens()} 个 token，放不下一个 max_seq={max_seq} 的请求")
    bs = min(max_bs, cap)
    t, head, n = 0.0, 0, len(reqs)
    slot = useful = n_batches = 0
    while head < n:
        t = max(t, reqs[head].arrival)                  # 队列空时引擎空等，直到下一个请求到达
        tail = head
        while tail < n and tail - head < bs and reqs[tail].arrival <= t:
            tail += 1
        batch, head = reqs[head:tail], tail
        B = len(batch)
        L_pad = max(r.prompt for r in batch)            # 补齐到最长输入
        O_max = max(r.output for r in batch)            # 全批陪跑到最长输出
        t0 = t
        t += step.prefill_time([L_pad] * B)
        t_first = t
        for j in range(1, O_max):                       # 第 j 次 decode：每行的上下文是 L_pad + j
            t += step.decode_time(B, B * (L_pad + j))
        for r in batch:
            r.admitted, r.gen = True, r.output
            r.admit_t, r.first_tok, r.finish = t0, t_first, t
        slot += B * (L_pad + O_max - 1)
        useful += sum(r.prompt + r.output for r in batch) - B
        n_batches += 1
        if isinstance(history, list):                   # _check_step_history：列表或 None
            history.append({"t0": t0, "t1": t, "rids": [r.rid for r in batch]})
    return {"slot_tokens": slot, "useful_tokens": useful, "batches": n_batches, "max_bs_used": bs}


RESERVE_MODES = ("max_gen", "max_seq", "none")


def _kv_need(r, reserve, max_seq):
    """请求被接纳时要占的 KV token 数：按声明预留 / 按模型最大长度预留 / 只占输入。"""
    if reserve == "max_gen":
        return r.prompt + r.max_gen
    if reserve == "max_seq":
        return max_seq
    return r.prompt


def _check_fits(reqs, reserve, max_seq, slots):
    """每个请求单独占满一块 GPU 时能不能跑完？不能就报错——否则它会永远排在队头，模拟要么卡死要么误报死锁。"""
    for r in reqs:
        if reserve == "max_seq" and r.prompt + r.max_gen > max_seq:
            raise ValueError(f"请求 {r.rid} 的 prompt + max_gen = {r.prompt + r.max_gen} 超过 max_seq={max_seq}")
        # 一个请求最终写下的 KV：prompt + output − 1（最后一个 token 不需要写 KV）
        need = max(_kv_need(r, reserve, max_seq), r.prompt + r.output - 1)
        if need > slots:
            raise ValueError(f"请求 {r.rid} 需要 {need} 个 token 的 KV，但整块 GPU 只有 {slots} 个"
                             f"（reserve={reserve!r}）：它永远不可能被服务，请缩短请求或换更大的显存")


def run_iteration_level(reqs, step, max_bs, reserve="max_gen", max_seq=FT_MAX_SEQ, t_limit=None, history=None):
    """
    迭代级调度（Orca §3 S1、§4.2 算法 1）：**每一次迭代**都重新决定这一步算哪些请求（先到先服务，最多 max_bs 个）；
    新请求的整段输入和老请求的 1 个 decode token 放进同一步（靠 §2 的选择性批处理），做完一个就立刻返回、腾位置。

    【KV 预留模式 reserve】
        "max_gen"：Orca 的做法。请求第一次被选中时预留 prompt + max_gen 个 token；剩余不够就停止接纳新请求
                   （算法 1 第 23–25 行）。已接纳的请求一定能跑完，不会死锁；代价是声明远大于实际时白占显存。
        "max_seq"：每个请求预留 max_seq（像 FasterTransformer 那样）——调度变聪明了，显存管理还是粗放的。
        "none"   ：不预留，写多少占多少；接纳时只要放得下输入。显存写满之后，每个正在生成的请求下一步还要再写
                   1 个 token 的 KV，可能谁都动不了 → **死锁**（没有抢占 / 换出时）。PagedAttention +
                   抢占（vLLM [S60]，本课程之外）就是来解决这个的。
    【一次迭代】
        1. 已接纳的请求全部参加（"none" 模式下只有还能写 1 个 KV 的那些能动）；
        2. 按到达顺序接纳新请求，直到批满或 KV 不够——遇到第一个放不下的就停，后面的也不插队（FCFS）；
        3. 时间 = StepModel.mixed_time（decode 请求各 1 个 token、读各自的 KV；新请求的全部输入按因果掩码算注意力）；
        4. 每个参加的请求 gen += 1；生成够了的立刻完成、释放它的 KV。
    【参数】reqs：Req 列表（按到达排序；会被改写）；step：StepModel；max_bs：最大批大小；reserve：见上；
        max_seq："max_seq" 模式的预留长度，也是请求长度上限；t_limit：模拟时钟超过它就停（可选）；
        history：给一个列表时，每次迭代追加 {"t0", "t1", "prefill", "decode", "reserved", "used"}。
    【返回】字典：deadlock、deadlock_t、done（完成数）、iters（迭代数）、
        mean_reserved / mean_used（按迭代平均：这一步执行时已预留 / 已写入的 KV token 数）、
        peak_reserved / peak_used、admit_order（接纳的先后，rid 列表）。
    【报错】永远放不下的请求（单独占满整块 GPU 也不够）→ ValueError，而不是让它永远堵在队头。
    """
    reqs, max_bs = _start(reqs, max_bs)
    _check_step_history(step, history, "run_iteration_level")
    check_choice("reserve", reserve, RESERVE_MODES)
    max_seq = check_int("max_seq", max_seq, lo=1)
    if t_limit is not None:
        t_limit = check_real("t_limit", t_limit)
    _check_fits(reqs, reserve, max_seq, int(step.kv_capacity_tokens()))
    # 调度本身只有一份：第 5 讲 serving_sim.iteration_schedule（这里的 "none" 就是它的 reserve=None）
    need = None if reserve == "none" else [_kv_need(r, reserve, max_seq) for r in reqs]
    run = serving_sim.iteration_schedule([r.arrival for r in reqs], [r.prompt for r in reqs],
                                         [r.output for r in reqs], step, max_bs, reserve=need, t_limit=t_limit,
                                         history=history, ids=[r.rid for r in reqs])
    for r, t0, times in zip(reqs, run["admit_t"], run["token_times"]):
        r.admitted, r.admit_t, r.gen = not math.isnan(t0), t0, len(times)
        r.first_tok = times[0] if times else math.nan
        r.finish = times[-1] if r.gen == r.output else math.nan
    keys = ("deadlock", "deadlock_t", "done", "iters", "mean_reserved", "mean_used", "peak_reserved", "peak_used",
            "admit_order")
    return {k: run[k] for k in keys}


def latency_throughput(reqs, warmup=0.2):
    """
    一次模拟的两个指标：吞吐（每秒完成的请求数）和每 token 归一化延迟（Orca 图 10 的纵轴）。

    【参数】warmup：去掉最早到达的这一比例（系统刚启动时是空的，延迟偏乐观），取值 [0, 1)。
    【返回】(吞吐 req/s, 归一化延迟中位数 s/token, 归一化延迟第 90 百分位 s/token)
    【定义】吞吐 = 统计的请求数 / (最后一个完成时刻 − 第一个统计请求的到达时刻)。
        过载时队列越排越长：吞吐趋于系统上限，延迟随请求数一直涨——所以它描述的是"这 n 个请求"。
    【报错】有请求没完成（死锁、t_limit 截断）时抛 ValueError，而不是返回 nan。
    """
    warmup = check_real("warmup", warmup, lo=0.0)
    if warmup >= 1.0:
        raise ValueError(f"warmup 必须在 [0, 1) 里，收到 {warmup}")
    rs = sorted(_req_list(reqs, "latency_throughput"), key=lambda r: r.arrival)
    pending = [r.rid for r in rs if not math.isfinite(r.finish)]
    if pending:
        raise ValueError(f"reqs 里 {len(pending)} 个请求没有完成（例如 rid {pending[:5]}）：先检查死锁或 t_limit")
    rs = rs[int(len(rs) * warmup):]
    if not rs:
        raise ValueError("去掉 warmup 之后没有请求可统计")
    window = max(r.finish for r in rs) - rs[0].arrival
    per_tok = np.array([r.norm_latency for r in rs])
    return len(rs) / window, float(np.median(per_tok)), float(np.percentile(per_tok, 90))


# =============================================================================
# §2 选择性批处理（Orca §3 S2）
# =============================================================================
def _note(counter, op, **kw):
    if counter is not None:
        counter.add(op, **kw)


def ragged_forward(params, cfg, chunks, caches, counter=None):
    """
    选择性批处理的一次迭代：几个请求各带 T_i 个新 token（prefill 时是整段输入，decode 时是 1 个），一起前向。

    【参数】params, cfg：第 2 讲的参数和 Config；chunks[i]：请求 i 这一步的新 token（一维，长度 ≥ 1）；
        caches[i]：请求 i 自己的 KVCache（批大小 1），里面已经有它之前的 token；counter：Counter 或 None。
    【返回】列表，第 i 个是请求 i 每个新位置的 logits [T_i, vocab]；每个 cache 前进 T_i。
    【思路（Orca 图 5）】
        线性层、RMSNorm、残差、SwiGLU 都是**逐 token** 的：一个 token 属于哪个请求、在第几个位置，它们都不关心。
        于是把 N = ΣT_i 个 token 拼成 [1, N, d] 一起算——权重只读一遍，没有补齐。
        只有两处需要"请求"的概念：RoPE 要每个 token 自己的绝对位置；注意力要和**自己**的 KV 做。
        注意力没有权重，按请求拆开做不会多读权重——这就是 Orca 说"只对注意力不批处理"的理由。
    【记账】和 forward 的约定完全相同（逐元素运算也记），所以"拼起来算"和"分开算"的账可以逐项比较（02 演示）。
    """
    chunks = [_tokens(f"chunks[{i}]", c, cfg.vocab) for i, c in enumerate(_seq("chunks", chunks))]
    caches = _seq("caches", caches)
    for i, cache in enumerate(caches):
        if not all(hasattr(cache, a) for a in ("k", "v", "length", "max_len", "write", "read")):
            raise TypeError(f"ragged_forward：caches[{i}] 必须是 transformer_lab.KVCache，收到 {type(cache).__name__}")
    if not chunks or len(chunks) != len(caches):
        raise ValueError(f"chunks 和 caches 必须一一对应且非空，收到 {len(chunks)} 和 {len(caches)} 个")
    for i, (c, cache) in enumerate(zip(chunks, caches)):
        if cache.k.shape[1] != 1:
            raise ValueError(f"caches[{i}] 的批大小必须是 1（每个请求一个 cache），收到 {cache.k.shape[1]}")
        if cache.length + len(c) > cache.max_len:
            raise ValueError(f"caches[{i}] 剩余容量 {cache.max_len - cache.length} 放不下 {len(c)} 个新 token")
    lens = [c.size for c in chunks]
    bounds = np.concatenate([[0], np.cumsum(lens)])     # 请求 i 占拼接张量的 [bounds[i], bounds[i+1])
    N = int(bounds[-1])
    pos = np.concatenate([cache.length + np.arange(T) for cache, T in zip(caches, lens)])   # 每个 token 的绝对位置
    x = params["embed"][np.concatenate(chunks)][None]                                     # [1, N, d]
    _note(counter, "embed", w_elems=N * cfg.d_model, act_elems=N * cfg.d_model)
    cos, sin = rope_angles(pos, cfg.d_head, cfg.rope_theta)
    for li, lp in enumerate(params["layers"]):
        x = _ragged_attention_block(x, lp, li, cfg, caches, bounds, cos, sin, counter)
        x = _mlp_block(x, lp, cfg, counter)
    for i, cache in enumerate(caches):
        cache.length += lens[i]
    h = rms_norm(x, params["final_norm"], cfg.norm_eps, counter)
    logits = linear(h, lm_head_matrix(params), "lm_head", counter)[0]                      # [N, vocab]
    return [logits[bounds[i]:bounds[i + 1]] for i in range(len(chunks))]


def _ragged_attention_block(x, lp, li, cfg, caches, bounds, cos, sin, counter):
    """一层的注意力子块：投影一起做（[1, N, ·]）；Split → 每个请求和自己的 cache 做注意力 → Merge。"""
    N, H, G, dh = x.shape[1], cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    xn = rms_norm(x, lp["attn_norm"], cfg.norm_eps, counter)

    def heads(W, op, n_heads):                         # [1, N, d] → [1, N, 头数, dh]
        return linear(xn, lp[W], op, counter).reshape(1, N, n_heads, dh)

    q = apply_rope(heads("wq", "q_proj", H), cos, sin, counter)
    k = apply_rope(heads("wk", "k_proj", G), cos, sin, counter)
    v = heads("wv", "v_proj", G)
    parts = []
    for i, cache in enumerate(caches):
        s, e = bounds[i], bounds[i + 1]
        cache.write(li, k[:, s:e], v[:, s:e])          # 写到 cache.length 起的位置（length 在整次前向后才推进）
        _note(counter, "kv_write", kv_elems=2 * (e - s) * G * dh)
        K, V = cache.read(li, cache.length + (e - s))  # [1, S_i, G, dh]：旧的 + 这一步新写的
        parts.append(attention_core(q[:, s:e], K, V, cache.length, counter))   # [1, T_i, H·dh]
    a = np.concatenate(parts, axis=1)                  # Merge：[1, N, H·dh]
    x = linear(a, lp["wo"], "o_proj", counter) + x
    _note(counter, "residual", flops=_tl.RESID_FLOPS * x.size, act_elems=3 * x.size)
    return x


def _mlp_block(x, lp, cfg, counter):
    """SwiGLU MLP 子块：完全逐 token，拼起来算和分开算没有任何区别。"""
    xn = rms_norm(x, lp["mlp_norm"], cfg.norm_eps, counter)
    gate = silu(linear(xn, lp["w_gate"], "mlp_gate", counter))
    m = gate * linear(xn, lp["w_up"], "mlp_up", counter)
    _note(counter, "swiglu", flops=_tl.SWIGLU_FLOPS * m.size, act_elems=3 * m.size)
    x = linear(m, lp["w_down"], "mlp_down", counter) + x
    _note(counter, "residual", flops=_tl.RESID_FLOPS * x.size, act_elems=3 * x.size)
    return x


# =============================================================================
# §3 投机解码
# =============================================================================
def adjust(logits, temperature=1.0, top_k=None):
    """
    Leviathan §2.2 的"标准化采样"：贪心、温度、top-k 都写成"从一个调整过的分布里抽"。

    【参数】logits [..., V]；temperature ≥ 0（0 = 贪心）；top_k：None 或 1 … V 的整数。
    【返回】概率 [..., V]（float64，每行和为 1）。贪心时是 argmax 处的 one-hot（并列取下标最小的，np.argmax 的约定）。
    【为什么重要】投机采样只保证"输出 ~ 调整后的 p"，所以草稿和目标必须用**同一种**调整（同温度、同 top-k）。
    【数值】先减每行最大值再除以温度：温度再小（1e-300）也不会出现 inf − inf = nan。
    """
    z = _real_array("logits", logits, "adjust").copy()
    temperature = _temperature(temperature)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ValueError(f"logits 的最后一维是词表，不能为空，收到形状 {z.shape}")
    if np.isnan(z).any():
        raise ValueError("logits 里有 nan")
    if not np.isfinite(z.max(axis=-1)).all():
        raise ValueError("logits 的每一行至少要有一个有限值（最大值不能是 ±inf）")
    V = z.shape[-1]
    if top_k is not None:
        top_k = check_int("top_k", top_k, lo=1)
        if top_k > V:
            raise ValueError(f"top_k 必须在 1 … {V} 里，收到 {top_k}")
    # >>> 练习 6.1
    if temperature == 0.0:
        hot = np.zeros_like(z)
        np.put_along_axis(hot, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
        return hot
    if top_k is not None and top_k < V:
        kth = np.partition(z, V - top_k, axis=-1)[..., V - top_k:V - top_k + 1]   # 第 k 大的值
        z = np.where(z >= kth, z, -np.inf)                                       # 并列时会多留几个
    z = (z - z.max(axis=-1, keepdims=True)) / temperature
    return softmax(z)
    # <<< 练习 6.1


PROB_TOL = 1e-9     # float64 概率行的和离 1 多远算"没归一化"（更低的精度见 prob_tol）
PROB_TOL_CAP = 1e-3  # float32 的容差最多这么大：差 0.1% 以上的表不是舍入能解释的（×1.01 的表照样被拒）


def prob_tol(dtype, n, what="概率表"):
    """
    长度 n 的一行概率、以 dtype 存储时，"和为 1"允许差多少：max(PROB_TOL, min(n · eps(dtype), PROB_TOL_CAP))。

    为什么随 dtype 变：float32 的 softmax 先在 float32 里求分母 Σ exp，再让每个 p 除以它，整行的和离 1 差的
    就是这个和的相对舍入误差（_prob_rows 用 float64 求和，不再添误差）。n · eps 是求和误差的上界，
    和求和的顺序无关：两两求和（torch、numpy 的 sum）典型只有 √n · eps 的量级，但从左到右累加（cumsum、
    朴素的循环）的误差会系统地累积，量级更大——V = 128256、logits 标准差 5 的 float32 softmax 用 cumsum 求分母，
    和离 1 差 1.3e-4，已经超过 2√n · eps（8.5e-5）。上界在大词表时太松（V = 128256 时 n · eps = 1.5e-2，
    差 1% 的表都收），所以截在 PROB_TOL_CAP = 1e-3：是上面左到右求和实测误差（1.3e-4）的 8 倍，
    是"乘了 1.01"的表的误差的 1/10。float64（和整数）时就是 PROB_TOL。
    半精度（float16）不收：ValueError。它的 eps ≈ 1e-3，n · eps 在 V = 5000 时已经是 4.9，截断的容差也分不清
    舍入和"差 0.1%"的表；小概率（< 6.1e-5）还是非规格化数（间距 6e-8），1e-7 这样的概率本身就差几十个百分点。
    在 float32 或 float64 里算 softmax 再传进来。
    what：报错时说的是哪个参数。
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"prob_tol：dtype 必须是 numpy 的数值类型（如 np.float32），收到 {dtype!r}") from None
    if dt.kind not in "iuf":
        raise TypeError(f"prob_tol：dtype 必须是整数或浮点类型（{what} 的精度），收到 {dt}")
    n = check_int("n", n, lo=0, where="prob_tol")
    if dt.kind == "f" and dt.itemsize < 4:
        raise ValueError(f"{what} 是 {dt.name}：半精度的概率表分不清舍入误差和没归一化"
                         f"（eps = {float(np.finfo(dt).eps):.1e}）；请在 float32 或 float64 里算概率再传进来")
    eps = float(np.finfo(dt).eps) if dt.kind == "f" else 0.0
    return max(PROB_TOL, min(int(n) * eps, PROB_TOL_CAP))


def _prob_rows(name, a, allow_zero=False, dtype=np.float64):
    """a 的每一行（最后一维）必须是概率分布：非负、有限、和为 1（± prob_tol(dtype, 行长)）；
    allow_zero 时也允许整行为 0。
    dtype 是调用者传进来的原始精度（a 已经转成 float64，容差按原始精度给）。"""
    if (a < 0).any() or not np.isfinite(a).all():
        raise ValueError(f"{name} 必须是概率：每个元素有限且 ≥ 0，收到 {a!r}")
    sums = a.sum(axis=-1)
    tol = prob_tol(dtype, a.shape[-1] if a.ndim else 1, what=name)
    ok = np.abs(sums - 1.0) <= tol
    if allow_zero:
        ok |= sums == 0.0
    if not ok.all():
        bad = float(np.ravel(sums)[np.argmin(np.ravel(ok))])
        allowed = "1 或 0（整行为 0 = 没有草稿）" if allow_zero else "1"
        raise ValueError(f"{name} 的每一行必须归一化（和 = {allowed}，容差 {tol:.3g}），收到一行的和 = {bad!r}")


def _prob_pair(p, q, q_may_be_empty=False):
    """
    检查 (p, q)：形状相同、至少一维，每一行都是概率分布。不归一化的输入会给出看似合理却错误的答案
    （例如 β 被截成 1），所以这里报错，而不是悄悄归一化。q_may_be_empty：q 的一行可以全为 0（residual 的"没有草稿"）。
    """
    dp, dq = np.asarray(p).dtype, np.asarray(q).dtype                 # 容差按原始精度（float32 的表也收）
    p, q = _real_array("p", p, "概率"), _real_array("q", q, "概率")     # 先查 dtype 再转换（'0.5' 这样的字符串不收）
    if p.shape != q.shape or p.ndim == 0:
        raise ValueError(f"p 和 q 的形状必须相同且至少一维，收到 {p.shape} 和 {q.shape}")
    _prob_rows("p", p, dtype=dp)
    _prob_rows("q", q, allow_zero=q_may_be_empty, dtype=dq)
    return p, q


def residual(p, q):
    """
    被拒绝之后的重采样分布 p'(x) = max(0, p(x) − q(x)) / Σ_y max(0, p(y) − q(y))（Leviathan §2.3）。

    【直觉】q 在某些 x 上"给多了"（q > p）：接受规则以 p/q 的概率留下它，多出来的部分被拒掉；
        另一些 x 上 q "给少了"（q < p）：缺的 p − q 正好由被拒之后的重采样补上。两部分加起来恰好是 p。
    【边界】p == q 时分子全为 0（这时永远不会被拒，用不上它）：返回 p，保证结果仍是一个分布。
        q 全为 0（"没有草稿"）时返回 p —— §3 的实现用这一点处理"全部接受后再从 p 白拿一个"。
    【参数】p、q [..., V]：每一行和为 1（± prob_tol(dtype, V)，float64 是 1e-9）、非负有限；
        q 的一行也可以全为 0。否则 ValueError。
    """
    p, q = _prob_pair(p, q, q_may_be_empty=True)
    # >>> 练习 6.2
    over = np.maximum(p - q, 0.0)
    mass = over.sum(axis=-1, keepdims=True)
    return np.where(mass > 0, over / np.where(mass > 0, mass, 1.0), p)
    # <<< 练习 6.2


def spec_output_dist(p, q):
    """
    一步投机采样输出 token 的**精确**分布（按算法的两条路径直接加概率，不抽样）：
        路径 1：草稿抽到 x（概率 q(x)），被接受（概率 min(1, p(x)/q(x))）；
        路径 2：草稿被拒（总概率 1 − β），再从 residual(p, q) 抽到 x。
    其中 β = Σ_x q(x)·min(1, p(x)/q(x)) 是接受概率。

    【返回】(P_out [..., V], β [...])。代数上 q·min(1, p/q) = min(p, q)、1 − β = Σ max(0, p − q)，
        所以 P_out = min(p, q) + max(0, p − q) = p，β = Σ min(p, q) = 1 − TV(p, q)。这里按**算法**算，
        上面的恒等式是被检验的结论，不是实现方式（自检和 03 演示检验到浮点误差）。
    """
    p0, q0 = p, q                                        # residual 按原始精度再查一遍（float32 的表也收）
    p, q = _prob_pair(p, q)
    with np.errstate(invalid="ignore", divide="ignore"):
        accept = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)
    via_draft = q * accept
    beta = via_draft.sum(axis=-1)
    return via_draft + (1.0 - beta)[..., None] * residual(p0, q0), beta


def variant_output_dist(p, q, variant="correct"):
    """
    一步投机采样（第一个输出 token）在三种规则下的精确分布——看错误变体**偏了多少、偏向哪里**。

        "correct"         ：= spec_output_dist(p, q)[0] = p；
        "resample_p"      ：min(p, q) + (1 − β)·p        （被拒后从 p 重抽：q 和 p 都大的 token 被算了两次）；
        "accept_if_p_ge_q"：q·[p ≥ q] + (1 − Σ_{p≥q} q)·residual(p, q)（p < q 的 token 永远不会被接受，只能靠残差补）。
    【用途】spec_sample_batch 的第一个输出 token 的分布正好是它（第一个草稿位置的 p_1、q_1），03 演示拿它和
        蒙特卡洛的频率对照；测试拿它检验 _verify 的三个分支。
    """
    p0, q0 = p, q
    p, q = _prob_pair(p, q)
    check_choice("variant", variant, SPEC_VARIANTS)
    if variant == "correct":
        return spec_output_dist(p0, q0)[0]
    if variant == "resample_p":
        beta = np.minimum(p, q).sum(axis=-1, keepdims=True)
        return np.minimum(p, q) + (1.0 - beta) * p
    kept = np.where(p >= q, q, 0.0)                       # 确定性接受：p(x) ≥ q(x) 的草稿全收
    return kept + (1.0 - kept.sum(axis=-1, keepdims=True)) * residual(p0, q0)


def sample_rows(probs, rng):
    """
    每一行按自己的分布抽一个下标（逆 CDF，向量化）。

    【参数】probs [N, V]（非负，每行和 > 0；不要求恰好为 1）；rng：np.random.Generator
    【返回】[N] 的 int64 数组。
    【为什么这样截】u 按行总和缩放，结果再截到"最后一个概率 > 0 的位置"：累积和因舍入略小于 1 时，
        只截到 V − 1 可能抽到一个概率为 0 的 token；这样永远不会。
    """
    check_rng("rng", rng)
    P = _real_array("probs", probs, "sample_rows")
    if P.ndim != 2 or P.shape[1] == 0:
        raise ValueError(f"probs 必须是 [N, V] 的二维数组，收到形状 {P.shape}")
    if (P < 0).any() or not np.isfinite(P).all():
        raise ValueError("probs 必须是非负有限数")
    cdf = np.cumsum(P, axis=1)
    if (cdf[:, -1] <= 0).any():
        raise ValueError("probs 的每一行至少要有一个正概率")
    u = rng.random(P.shape[0]) * cdf[:, -1]
    idx = (cdf <= u[:, None]).sum(axis=1)                     # 第一个累积和 > u 的位置
    last_pos = P.shape[1] - 1 - np.argmax(P[:, ::-1] > 0, axis=1)
    return np.minimum(idx, last_pos).astype(np.int64)


class TransformerLM:
    """
    给第 2 讲的 numpy Transformer 套上"语言模型"接口（NGramLM 的接口相同，投机解码的代码不用区分两者）。

    【方法】new_cache()：批大小 1 的 KVCache；logits(tokens, cache, counter=None)：把一维 tokens 接到 cache 后面，
        返回每个新位置的 logits [T, V]，cache 前进 T；rollback(cache, length)：只保留前 length 个位置；
        full_logits(tokens2d)：不用 cache，对 [N, L] 整段前向，返回 [N, L, V]；
        sample(prompt, n_seq, n_new, temperature, rng)：一次采 n_seq 条续写 [n_seq, n_new]（批量 KV cache）；
            prompt 可以是一维（共用）或 [n_seq, Lp]（每条一个）；temperature = 0 就是批量贪心生成。
    【回滚为什么只改一个数】KVCache 总是从 length 往后写：把 length 改小，后面的旧数据就作废，
        下次写会覆盖。真实引擎的分页 KV 也是这样，只改块表里的长度（vLLM [S60]，本课程之外）。
    """

    def __init__(self, params, cfg, name="model"):
        if not isinstance(params, dict) or "embed" not in params or not hasattr(cfg, "vocab"):
            raise TypeError(f"TransformerLM：params 必须是 transformer_lab.init_params 的字典、cfg 是它的 Config，"
                            f"收到 {type(params).__name__} 和 {type(cfg).__name__}")
        self.params, self.cfg = params, cfg
        self.name = _name(name, "TransformerLM")

    @property
    def vocab(self):
        return self.cfg.vocab

    @property
    def capacity(self):
        """一个 cache 最多放几个 token。"""
        return self.cfg.max_seq

    def new_cache(self):
        return KVCache(self.cfg, batch=1, dtype=self.params["embed"].dtype)

    def logits(self, tokens, cache, counter=None):
        toks = _tokens("tokens", tokens, self.vocab)[None]                                # [1, T]
        return forward(self.params, self.cfg, toks, cache=cache, counter=counter)[0]     # [T, V]

    def full_logits(self, tokens2d):
        toks = _tokens2d("tokens2d", tokens2d, self.vocab)
        _check_forward_room(self, *toks.shape, "tokens2d")
        return forward(self.params, self.cfg, toks)                                       # [N, L, V]

    @staticmethod
    def rollback(cache, length):
        _rollback_check(cache.length, length)
        cache.length = int(length)

    def sample(self, prompt, n_seq, n_new, temperature, rng):
        check_rng("rng", rng)
        prompts = _prompt_rows(prompt, n_seq, self.vocab)                                  # [n_seq, Lp]
        n_new, temperature = check_int("n_new", n_new, lo=1), _temperature(temperature)
        n_seq = len(prompts)
        if prompts.shape[1] + n_new > self.capacity:
            raise ValueError(f"prompt 长度 + n_new = {prompts.shape[1] + n_new} 超过模型的 cache 容量 {self.capacity}")
        _check_forward_room(self, n_seq, prompts.shape[1] + n_new, "n_seq × n_new")
        cache = KVCache(self.cfg, n_seq, max_len=prompts.shape[1] + n_new, dtype=self.params["embed"].dtype)
        lg = forward(self.params, self.cfg, prompts, cache=cache, last_only=True)[:, -1]
        out = np.empty((n_seq, n_new), dtype=np.int64)
        for j in range(n_new):
            out[:, j] = sample_rows(adjust(lg, temperature), rng)
            if j + 1 < n_new:
                lg = forward(self.params, self.cfg, out[:, j:j + 1], cache=cache)[:, -1]
        return out


def _prompt_rows(prompt, n_seq, vocab):
    """sample 的 prompt：一维（n_seq 条共用）或二维 [n_seq, Lp]（每条一个，等长）。"""
    n_seq = check_int("n_seq", n_seq, lo=1)
    a = np.asarray(prompt)
    if a.ndim == 2:
        if a.shape[0] != n_seq or a.shape[1] == 0:
            raise ValueError(f"二维 prompt 的形状必须是 [n_seq={n_seq}, Lp ≥ 1]，收到 {a.shape}")
        return np.stack([_tokens(f"prompt[{i}]", row, vocab) for i, row in enumerate(a)])
    return np.tile(_tokens("prompt", a, vocab), (n_seq, 1))


def _rollback_check(cur, length):
    length = check_int("length", length, lo=0)
    if length > cur:
        raise ValueError(f"回滚只能变短：cache 里有 {cur} 个 token，要求保留 {length} 个")


class _TokCache:
    """NGramLM 的"cache"：只记住喂进去的 token（n-gram 只需要最后一个）。"""

    def __init__(self):
        self.toks = []

    @property
    def length(self):
        return len(self.toks)


class NGramLM:
    """
    二元语法（bigram）草稿模型：下一个 token 的 logits 只看上一个 token，查一行表即可（"几乎零成本"，c ≈ 0）。

    【参数】table [V, V]：table[a] 是"上一个 token 是 a 时，下一个 token"的 log 概率。
    【构造】NGramLM.fit(序列列表, V, smoothing)：数二元组 + 加 smoothing 平滑。最好用**目标模型自己生成的文本**来数
        ——草稿要模仿的是目标模型，不是真实语料（04 演示）。
    【接口】和 TransformerLM 相同：new_cache / logits / rollback / full_logits / sample；
        logits 记账为一次查表（读 T 行表 = T·V 个元素）。
    """

    def __init__(self, table, name="bigram"):
        table = _real_array("table", table, "NGramLM")
        name = _name(name, "NGramLM")
        if table.ndim != 2 or table.shape[0] != table.shape[1] or table.shape[0] == 0:
            raise ValueError(f"table 必须是 [V, V] 的方阵，收到形状 {table.shape}")
        if np.isnan(table).any() or not np.isfinite(table.max(axis=1)).all():
            raise ValueError("table 的每一行至少要有一个有限的 log 概率，且不能有 nan")
        self.table = table
        self.name = name

    @classmethod
    def fit(cls, seqs, vocab, smoothing=0.01, name="bigram"):
        vocab = check_int("vocab", vocab, lo=1, where="NGramLM.fit")
        check_count("vocab²", vocab * vocab, 3 * 8, where="NGramLM.fit")      # 表和两份临时数组
        smoothing = check_real("smoothing", smoothing, lo=0.0, lo_open=True)
        counts = np.full((vocab, vocab), smoothing)
        for i, s in enumerate(_seq("seqs", seqs)):
            s = _tokens(f"seqs[{i}]", s, vocab)
            np.add.at(counts, (s[:-1], s[1:]), 1.0)     # 每个相邻对 (a, b) 计一次
        return cls(np.log(counts / counts.sum(axis=1, keepdims=True)), name)

    @property
    def vocab(self):
        return self.table.shape[0]

    capacity = math.inf

    def new_cache(self):
        return _TokCache()

    def logits(self, tokens, cache, counter=None):
        toks = _tokens("tokens", tokens, self.vocab)
        if not isinstance(cache, _TokCache):
            raise TypeError(f"NGramLM.logits：cache 必须是 new_cache() 给的，收到 {type(cache).__name__}")
        cache.toks.extend(toks.tolist())
        _note(counter, "ngram_lookup", w_elems=len(toks) * self.vocab)
        return self.table[toks]

    def full_logits(self, tokens2d):
        toks = _tokens2d("tokens2d", tokens2d, self.vocab)
        check_count("tokens2d 的 token 数", toks.size, 8 * self.vocab, where="NGramLM.full_logits")
        return self.table[toks]

    @staticmethod
    def rollback(cache, length):
        _rollback_check(cache.length, length)
        del cache.toks[int(length):]

    def sample(self, prompt, n_seq, n_new, temperature, rng):
        check_rng("rng", rng)
        prev = _prompt_rows(prompt, n_seq, self.vocab)[:, -1]                   # bigram 只看最后一个 token
        n_new, temperature = check_int("n_new", n_new, lo=1), _temperature(temperature)
        check_count("n_seq × n_new", len(prev) * n_new, 8 * (self.vocab + 1), where="NGramLM.sample")
        out = np.empty((len(prev), n_new), dtype=np.int64)
        for j in range(n_new):
            prev = out[:, j] = sample_rows(adjust(self.table[prev], temperature), rng)
        return out


SPEC_VARIANTS = ("correct", "resample_p", "accept_if_p_ge_q")


def _verify(P, Q, D, rng, variant="correct"):
    """
    投机采样的验证步（向量化，M 个序列同时做）。

    【参数】P [M, γ+1, V]：目标模型在"待定 token + γ 个草稿"之后的调整后分布；Q [M, γ, V]：草稿分布；
        D [M, γ]：草稿 token；variant：见 spec_sample_batch。
    【返回】(n_acc [M]：从头连续接受了几个草稿, nxt [M]：这一轮最后补上的那个 token)
    【规则】u ~ U(0,1)，u·q(d) < p(d) 就接受（= 以 min(1, p/q) 的概率接受；写成乘法避免除以 0）；
        第一个被拒的位置 j 从 residual(p_j, q_j) 抽；全部接受时从 p_{γ+1} 抽——把 Q 在第 γ+1 个位置补成 0，
        residual(p, 0) = p，两种情况就是同一行代码。
    """
    M, g = D.shape
    rows = np.arange(M)
    pd = np.take_along_axis(P[:, :g], D[..., None], axis=2)[..., 0]      # [M, γ]：p_i(d_i)
    qd = np.take_along_axis(Q, D[..., None], axis=2)[..., 0]             # [M, γ]：q_i(d_i)
    if variant == "accept_if_p_ge_q":                                    # 错误：把随机接受换成确定的比较
        ok = pd >= qd
    else:
        ok = rng.random((M, g)) * qd < pd
    n_acc = np.cumprod(ok, axis=1).sum(axis=1)                           # 第一个 False 之前有几个 True
    Qpad = np.concatenate([Q, np.zeros_like(Q[:, :1])], axis=1)         # [M, γ+1, V]
    p_at, q_at = P[rows, n_acc], Qpad[rows, n_acc]                       # [M, V]
    dist = p_at if variant == "resample_p" else residual(p_at, q_at)     # resample_p 错误：被拒后直接从 p 抽
    return n_acc, sample_rows(dist, rng)


def _check_pair(target, draft):
    _check_lm(target, "target")
    _check_lm(draft, "draft")
    if target.vocab != draft.vocab:
        raise ValueError(f"目标和草稿的词表必须相同，收到 {target.vocab} 和 {draft.vocab}")
    return target.vocab


def speculative_generate(target, draft, prompt, n_new, gamma, temperature, rng, counter_t=None, counter_d=None):
    """
    投机解码（Leviathan 算法 1），批大小 1，两个模型都用 KV cache，被拒之后回滚。

    【参数】target / draft：TransformerLM 或 NGramLM（词表相同）；prompt：非空一维 token 序列；n_new ≥ 0；
        gamma ≥ 1：每轮草稿几个；temperature ≥ 0（0 = 贪心）；rng；counter_t / counter_d：可选 Counter。
    【返回】(n_new 个 token 的列表, 统计)。统计：target_calls / draft_calls（各自的前向次数；prefill 不算）、
        accepted（每轮接受了几个草稿）、rounds、beta（每个被检验过的草稿位置的接受概率 Σ min(p, q)，
        它们的平均值就是 Leviathan 的 α 的估计）、t_cache（每轮回滚后目标 cache 的长度）、
        target_cache_len / draft_cache_len（结束时两个 cache 的长度）。
    【不变式】每轮开始时，目标 cache 恰好存着"已确定序列去掉最后一个 token"；最后一个已确定的 token（"待定"的那个）
        还没喂进去，下一轮验证从它开始。草稿 cache 是已确定序列的一个前缀（最多缺 2 个）。
    【一轮】
        1. 草稿：补喂草稿 cache 缺的 token，得到 q_1，抽 d_1；再依次喂 d_1 … d_{γ−1}，得到 q_2 … q_γ。共 γ 次前向。
        2. 验证：目标模型一次前向 [待定, d_1, …, d_γ]（γ+1 个 token）得到 p_1 … p_{γ+1}。
        3. _verify：接受前 n 个草稿，再补 1 个 token（从残差或 p_{γ+1} 抽）。
        4. 回滚：目标 cache 退到"新的已确定序列长度 − 1"；草稿 cache 退到不超过这个长度。
    【贪心】temperature = 0 时 p、q 是 one-hot：接受 ⇔ 草稿正好是目标的 argmax；被拒时残差就是目标的 argmax。
        所以输出和目标模型自己贪心生成的逐 token 相同（自检和 03 演示检验）。
    """
    V = _check_pair(target, draft)
    check_rng("rng", rng)
    seq = _tokens("prompt", prompt, V).tolist()
    n_new, gamma = check_int("n_new", n_new, lo=0), check_int("gamma", gamma, lo=1, hi=GAMMA_MAX)
    temperature = _temperature(temperature)
    need = len(seq) + n_new + gamma
    room = min(target.capacity, draft.capacity)
    if need > room:
        raise ValueError(f"prompt + n_new + gamma = {need} 超过模型的 cache 容量 {room}")
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    if len(seq) > 1:                                          # prefill：除待定的最后一个之外全部喂进去
        target.logits(seq[:-1], t_cache, counter_t)
        draft.logits(seq[:-1], d_cache, counter_d)
    stats = {"target_calls": 0, "draft_calls": 0, "accepted": [], "rounds": 0, "beta": [], "t_cache": []}
    goal = len(seq) + n_new
    while len(seq) < goal:
        props, qs = [], []
        feed = seq[d_cache.length:]                           # 草稿 cache 缺的（至少是待定的那个）
        for _ in range(gamma):
            q = adjust(draft.logits(feed, d_cache, counter_d)[-1], temperature)
            d = int(sample_rows(q[None, :], rng)[0])
            props.append(d)
            qs.append(q)
            feed = [d]
        stats["draft_calls"] += gamma
        P = adjust(target.logits([seq[-1]] + props, t_cache, counter_t), temperature)     # [γ+1, V]
        stats["target_calls"] = stats["target_calls"] + 1
        Q = np.stack(qs)                                                                   # [γ, V]
        n_acc, nxt = _verify(P[None], Q[None], np.array([props]), rng)
        n_acc = int(n_acc[0])
        tested = min(n_acc + 1, gamma)                        # 被检验过的草稿位置：接受的 + 第一个被拒的
        stats["beta"] += np.minimum(P[:tested], Q[:tested]).sum(axis=1).tolist()
        seq += props[:n_acc] + [int(nxt[0])]
        stats["rounds"] += 1
        stats["accepted"] += [n_acc]
        target.rollback(t_cache, len(seq) - 1)
        draft.rollback(d_cache, min(d_cache.length, len(seq) - 1))
        stats["t_cache"].append(t_cache.length)
    stats["target_cache_len"], stats["draft_cache_len"] = t_cache.length, d_cache.length
    start = goal - n_new
    return seq[start:goal], stats


def autoregressive_generate(model, prompt, n_new, temperature, rng, counter=None):
    """
    基线：普通的自回归生成，每步前向 1 个 token（第一步是整段 prompt），按调整后的分布抽样。

    【返回】(n_new 个 token 的列表, 前向次数)。n_new = 0 时不做任何前向。
    """
    _check_lm(model, "model")
    check_rng("rng", rng)
    seq = _tokens("prompt", prompt, model.vocab).tolist()
    n_new = check_int("n_new", n_new, lo=0)
    temperature = _temperature(temperature)
    if len(seq) + n_new > model.capacity:
        raise ValueError(f"prompt + n_new = {len(seq) + n_new} 超过模型的 cache 容量 {model.capacity}")
    cache, out, calls = model.new_cache(), [], 0
    feed = seq
    for _ in range(n_new):
        lg = model.logits(feed, cache, counter)[-1]
        calls += 1
        out.append(int(sample_rows(adjust(lg, temperature)[None], rng)[0]))
        feed = out[-1:]
    return out, calls


def spec_sample_batch(target, draft, prompt, n_out, gamma, temperature, n_samples, rng, variant="correct"):
    """
    n_samples 个**独立**的投机采样同时跑，每个至少生成 n_out 个 token（蒙特卡洛检验"输出分布不变"用）。

    【为什么不用 KV cache】每个样本每轮接受的草稿数不同，几轮之后长度各不相同；第 2 讲的 KVCache 只有一个
        公共长度。这里每次都对整段 [M, L] 重新前向（序列短、模型小，不贵），再按每个样本自己的长度取 logits。
        因果掩码保证：样本长度之后的"垃圾"位置影响不到它前面的位置。
    【参数】target / draft：有 full_logits 的模型（TransformerLM、NGramLM）；prompt；n_out ≥ 1；gamma ≥ 1；
        temperature ≥ 0；n_samples ≥ 1；rng；
        variant："correct"（Leviathan 的规则）；
                 "resample_p"（错误 1：被拒之后直接从 p 重抽，而不是从残差 p − q）；
                 "accept_if_p_ge_q"（错误 2：p(d) ≥ q(d) 就接受、否则拒绝，把随机接受换成确定的比较）。
    【返回】[n_samples, n_out] 的 int64 数组：每个样本的前 n_out 个输出 token。
    """
    check_choice("variant", variant, SPEC_VARIANTS)
    V = _check_pair(target, draft)
    check_rng("rng", rng)
    prompt = _tokens("prompt", prompt, V)
    n_out, gamma = check_int("n_out", n_out, lo=1), check_int("gamma", gamma, lo=1, hi=GAMMA_MAX)
    n_samples, temperature = check_int("n_samples", n_samples, lo=1), _temperature(temperature)
    Lp = len(prompt)
    if Lp + n_out + gamma > min(target.capacity, draft.capacity):
        raise ValueError(f"prompt + n_out + gamma = {Lp + n_out + gamma} 超过模型的 cache 容量 "
                         f"{min(target.capacity, draft.capacity)}")
    for m in (target, draft):
        _check_forward_room(m, n_samples, Lp + n_out + gamma, "n_samples")
    toks = np.zeros((n_samples, Lp + n_out + gamma), dtype=np.int64)   # 最长：差 1 个时一轮再写 γ+1 个
    toks[:, :Lp] = prompt
    lens = np.full(n_samples, Lp)
    while (live := np.flatnonzero(lens - Lp < n_out)).size:            # 还没生成够的样本才参加这一轮
        seqs, L = toks[live], lens[live]
        rows = np.arange(live.size)
        D = np.empty((live.size, gamma), dtype=np.int64)
        Q = np.empty((live.size, gamma, V))
        for i in range(gamma):                                          # 草稿：第 i 个草稿接在位置 L + i
            lg = draft.full_logits(seqs[:, :int(L.max()) + i])[rows, L - 1 + i]
            Q[:, i] = adjust(lg, temperature)
            D[:, i] = seqs[rows, L + i] = sample_rows(Q[:, i], rng)
        lg = target.full_logits(seqs[:, :int(L.max()) + gamma])         # 目标：一次前向验证
        P = adjust(lg[rows[:, None], (L - 1)[:, None] + np.arange(gamma + 1)], temperature)   # [M, γ+1, V]
        n_acc, nxt = _verify(P, Q, D, rng, variant)
        seqs[rows, L + n_acc] = nxt
        toks[live], lens[live] = seqs, L + n_acc + 1
    return toks[:, Lp:Lp + n_out].copy()


# ---- 蒙特卡洛检验的工具：精确分布 + 卡方检验（scipy 没装，自己写） ----
def exact_continuation_dist(model, prompt, n_out, temperature):
    """
    模型自己采样时，接在 prompt 后面的前 n_out 个 token 的精确联合分布（枚举全部 V^n_out 种续写）。

    【返回】长度 V^n_out 的概率向量；下标按"n_out 位 V 进制数"编码（第一个 token 是最高位），和 chi_square_gof 一致。
    【边界】V^n_out 超过 200000 时报错（枚举太大）。
    """
    V = _check_lm(model, "model").vocab
    prompt = _tokens("prompt", prompt, V)
    n_out, temperature = check_int("n_out", n_out, lo=1), _temperature(temperature)
    if n_out * math.log(V) > math.log(200_000) + 1e-9:      # 先比对数：V ** (10**9) 本身就算不完
        raise ValueError(f"n_out = {n_out}：V^n_out = {V}^{n_out} 太大，无法枚举（上限 200000）")
    _check_forward_room(model, V ** n_out, len(prompt) + n_out, "n_out")
    conts = np.array(list(itertools.product(range(V), repeat=n_out)), dtype=np.int64)   # [V^n, n]
    full = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], axis=1)            # [V^n, Lp + n]
    Lp = len(prompt)
    probs = adjust(model.full_logits(full)[:, Lp - 1:Lp - 1 + n_out], temperature)      # [V^n, n, V]
    return np.prod(np.take_along_axis(probs, conts[..., None], axis=2)[..., 0], axis=1)


def chi2_sf(x, dof):
    """
    卡方分布的右尾概率 P(χ²_dof > x) = Q(dof/2, x/2)（正则化上不完全伽马函数）。

    【算法】x < a + 1 时用级数求下尾 P(a, x)，否则用 Lentz 连分式直接求 Q（Numerical Recipes §6.2 的两段法），
        相对精度 ~1e-14。测试拿偶数自由度的闭式 e^{-x/2}·Σ_{j<k/2} (x/2)^j/j! 和 1 自由度的 erfc(√(x/2)) 对照。
    【参数】x：有限实数且 ≥ 0（卡方统计量不会是负的）；dof：正整数。否则 ValueError / TypeError。
    """
    x, dof = check_real("x", x, lo=0.0), check_int("dof", dof, lo=1)
    if x == 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_pref = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:                                   # 级数：P = e^{-z} z^a / Γ(a+1) · Σ z^n / ((a+1)…(a+n))
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= z / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_pref))
    tiny = 1e-300                                     # 连分式（修正 Lentz）
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return math.exp(log_pref) * h


def chi_square_gof(samples, probs, min_expected=5.0):
    """
    卡方拟合优度检验：samples 的每一行（一段续写）是不是服从 probs？

    【参数】samples [N, n]（token）；probs：exact_continuation_dist 的结果（长度 V^n）；
        min_expected：期望频数小于它的格子合并成一个（卡方近似要求期望频数不太小）。
    【返回】(统计量, 自由度, p 值)。观测到概率为 0 的续写时统计量为 inf、p 值为 0（不可能事件发生了）。
    """
    samples, probs, min_expected = _check_gof(samples, probs, min_expected)
    N, n = samples.shape
    V = round(len(probs) ** (1.0 / n))
    if V ** n != len(probs) or samples.min() < 0 or samples.max() >= V:
        raise ValueError(f"probs 的长度 {len(probs)} 和 samples 的 token（n = {n}）对不上")
    codes = samples @ (V ** np.arange(n - 1, -1, -1))                    # 第一个 token 是最高位
    obs = np.bincount(codes, minlength=len(probs)).astype(np.float64)
    exp = N * probs
    if (obs[exp == 0] > 0).any():
        return math.inf, 0, 0.0
    big = exp >= min_expected
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    o, e = o[keep], e[keep]
    stat = float(((o - e) ** 2 / e).sum())
    dof = len(e) - 1
    if dof < 1:
        raise ValueError("合并后只剩一个格子，无法检验：增加样本数")
    return stat, dof, chi2_sf(stat, dof)


# ---- Leviathan 论文的公式（假设 H5） ----
def _alpha(alpha):
    a = _real_array("alpha", alpha, "接受率", finite=False)
    if np.isnan(a).any() or (a < 0).any() or (a > 1).any():
        raise ValueError(f"alpha（接受率）必须在 [0, 1] 里，收到 {alpha!r}")
    return a


def _scalar(x):
    return float(x) if np.ndim(x) == 0 else x


def expected_tokens(alpha, gamma):
    """
    式 (1)：一轮（γ 个草稿 + 1 次验证）平均产出的 token 数 = 1 + α + α² + … + α^γ = (1 − α^{γ+1}) / (1 − α)。

    【推导】产出 = 被接受的草稿数 + 1（补上的那个）；第 i 个草稿被接受要求前 i 个都被接受，概率 α^i。
    【实现】直接把等比数列逐项加起来：α → 1 时闭式 0/0 会丢精度，逐项相加没有这个问题，α = 1 时正好是 γ + 1。
        alpha 可以是数组（画图用）。γ = 0 表示不投机，结果是 1。
    """
    a = _alpha(alpha)
    gamma = check_int("gamma", gamma, lo=0, hi=GAMMA_MAX)
    check_count("alpha 的元素数 × (gamma + 1)", a.size * (gamma + 1), 8, where="expected_tokens")
    # >>> 练习 6.3
    return _scalar(np.sum(a[..., None] ** np.arange(gamma + 1), axis=-1))
    # <<< 练习 6.3


# 论文发表的数（不是我们的公式算出来的）：Leviathan, Kalman, Matias, ICML 2023, 表 1，(α, γ, c) → 墙钟加速比。
LEVIATHAN_TABLE1 = {(0.9, 10, 0.0): 6.86}


def walltime_speedup(alpha, gamma, c):
    """
    定理 3.8：墙钟时间加速比的期望 = (1 − α^{γ+1}) / ((1 − α)(γc + 1))。

    【参数】c ≥ 0：草稿前向一次的时间 / 目标前向一次的时间。分母 γc + 1 是一轮的时间（以目标前向为单位），
        这里假设目标验证 γ+1 个 token 和 decode 1 个一样快（H5）——§4 的 spec_round 把它换成 roofline。
    """
    c = _real_array("c", c, "walltime_speedup", finite=False)
    if not np.isfinite(c).all() or (c < 0).any():
        raise ValueError(f"c（草稿 / 目标的时间比）必须是有限的数且 ≥ 0，收到 {c!r}")
    return _scalar(expected_tokens(alpha, gamma) / (check_int("gamma", gamma, lo=0) * c + 1.0))


def ops_factor(alpha, gamma, c_hat):
    """
    定理 3.11：总运算量是普通 decode 的几倍 = (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1})。

    【参数】c_hat ≥ 0：草稿每个 token 的运算量 / 目标每个 token 的运算量。
    【直觉】每轮目标算 γ+1 个位置、草稿算 γ 个，平均只留下 expected_tokens 个 token，被拒位置的运算白做了。
        墙钟变快、总运算变多：批小时运算是闲着的，所以划算；批大时就不一定了（§4）。
    """
    c_hat = _real_array("c_hat", c_hat, "ops_factor", finite=False)
    if not np.isfinite(c_hat).all() or (c_hat < 0).any():
        raise ValueError(f"c_hat（草稿 / 目标每 token 的运算量之比）必须是有限的数且 ≥ 0，收到 {c_hat!r}")
    g = check_int("gamma", gamma, lo=0)
    return _scalar((g * c_hat + g + 1.0) / expected_tokens(alpha, g))


def best_gamma(alpha, c, gamma_max=64):
    """
    在 γ = 1 … gamma_max 里找让 walltime_speedup 最大的 γ（Leviathan 图 3）。返回 (γ*, 加速比)。

    【边界】最好的加速比 ≤ 1（草稿太贵或太不准）时返回 (0, 1.0)：不该用投机解码。并列时取较小的 γ。
        α = 1 且 c = 0（草稿永远对、又不花时间）时加速比随 γ 无限增长、没有最优 γ → ValueError
        （原来悄悄返回搜索上限 gamma_max）；最优 γ 落在 gamma_max 上时发 RuntimeWarning：搜索范围可能太小。
    """
    check_real("alpha", alpha, lo=0.0, hi=1.0)
    check_real("c", c, lo=0.0)
    gamma_max = check_int("gamma_max", gamma_max, lo=1, hi=GAMMA_MAX)
    if alpha == 1.0 and c == 0.0:
        raise ValueError("alpha=1 且 c=0 时加速比 = γ + 1 随 γ 无限增长，没有最优 γ（草稿永远对、又不花时间）")
    s = np.array([walltime_speedup(alpha, g, c) for g in range(1, gamma_max + 1)])
    g = int(np.argmax(s))                              # argmax 取第一个最大值：并列时 γ 最小
    if g + 1 == gamma_max and gamma_max > 1 and s[g] > 1.0:
        import warnings
        warnings.warn(f"best_gamma：最优 γ 落在搜索上限 gamma_max={gamma_max} 上，更大的 γ 可能更好；加大 gamma_max",
                      RuntimeWarning, stacklevel=2)
    return (g + 1, float(s[g])) if s[g] > 1.0 else (0, 1.0)


# =============================================================================
# §4 硬件视角：验证 γ+1 个 token 真的"免费"吗？
# =============================================================================
def verify_time(model, chip, batch, ctx, n_tokens, w_bytes=2.0, kv_bytes=2.0, mfu=serving_sim.MFU, mbu=serving_sim.MBU,
                overhead=0.0):
    """
    一次前向的 roofline 时间：批里 batch 个序列，每个已有 ctx 个 token 的 KV，这一步各送进 n_tokens 个 token
    （普通 decode：n = 1；投机验证：n = γ + 1；树形验证：n = 节点数 + 1）。

    【公式】FLOPs = batch·n·每 token 矩阵乘法 FLOPs + batch·每 key 注意力 FLOPs·Σ_{j=1..n}(ctx + j)
            字节  = 权重（matmul_params × w_bytes）+ batch·(ctx + n)·每 token KV 字节
                    （同一个序列的 n 个 query 共用一次 KV 读取——融合注意力内核，假设 H1/H6）
            时间  = max(FLOPs / (峰值·mfu), 字节 / (带宽·mbu)) + overhead
        精度：w_bytes ≥ 2 用 bf16 峰值，否则用 fp8 峰值（芯片没有 fp8 时由 Chip.peak_flops 报错）。
        实现：llm_math.step_time（第 1 讲的 step_flops / step_bytes 就是这两行公式）+ overhead。ctx 是整数 token 数。
    【要点】n 从 1 变到 γ+1：权重字节不变、KV 字节几乎不变，只有 FLOPs ×(γ+1)。批小时受带宽限制，多验证几个 token
        几乎不花时间；批大到受算力限制时，验证的时间按 γ+1 倍增长——投机解码的前提就没了。
    【返回】秒
    """
    batch, n_tokens = check_int("batch", batch, lo=1), check_int("n_tokens", n_tokens, lo=1)
    ctx = check_int("ctx", ctx, lo=0)
    w_bytes = check_real("w_bytes", w_bytes, lo=0.0, lo_open=True)
    overhead = check_real("overhead", overhead, lo=0.0)
    prec = "fp8" if w_bytes < 2 else "bf16"
    # 上面的 FLOPs / 字节正是第 1 讲的 step_flops(batch, n, ctx) / step_bytes(...)：直接用它的 roofline
    roof = llm_math.step_time(model, chip, batch, n_tokens, ctx, prec=prec, w_bytes=w_bytes, kv_bytes=kv_bytes,
                              mfu=mfu, mbu=mbu)
    if not roof["fits"]:                          # 放不下的配置不给时间（第 1 讲的 fit，同一条规则）
        raise llm_math.CapacityError(roof["fit"].why)
    return roof["time"] + overhead


def spec_round(target, draft, chip, batch, ctx, alpha, gamma, overhead_t=1e-3, overhead_d=0.3e-3, **kw):
    """
    批里每个序列都做投机解码时，一轮的时间与加速比（假设 H6）。

    【模型】一轮 = γ 次草稿 decode（批 batch、上下文 ctx）+ 1 次目标验证 γ+1 个 token；每个序列平均产出
        expected_tokens(α, γ) 个 token。基线 = 目标普通 decode 一步（每序列 1 个 token）。
        加速比 = expected_tokens · t_base / (γ·t_draft + t_verify)。
    【参数】overhead_t / overhead_d：目标 / 草稿每次前向的固定开销（秒，**假设值**：启动内核、调度、采样）；
        kw 传给 verify_time（w_bytes、kv_bytes、mfu、mbu）。γ = 0 时一轮就是一次普通 decode，加速比 1。
    【返回】字典：t_base、t_draft、t_verify、c（= t_draft / t_base）、verify_ratio（= t_verify / t_base）、speedup
    """
    gamma = check_int("gamma", gamma, lo=0, hi=GAMMA_MAX)
    check_real("alpha", alpha, lo=0.0, hi=1.0)
    batch = check_int("batch", batch, lo=1, where="spec_round")
    check_real("overhead_t", overhead_t, lo=0.0, where="spec_round")
    check_real("overhead_d", overhead_d, lo=0.0, where="spec_round")
    ok, need = fits_in_memory((target, draft), chip, batch, check_int("ctx", ctx, lo=0) + gamma + 1,
                              kw.get("w_bytes", 2.0), kw.get("kv_bytes", 2.0))
    if not ok:                                    # 目标 + 草稿一起放在这块卡上：放不下就没有"加速比"可言
        raise llm_math.CapacityError(
            f"{target.name} + {draft.name}（批 {batch}、上下文 {ctx} + {gamma + 1}）要 {need / 1e9:.1f} GB，"
            f"{chip.name} 可用 {serving_sim.GPU_MEM_UTIL * llm_math.allocatable_bytes(chip) / 1e9:.1f} GB")

    def fwd(model, n, over):
        return verify_time(model, chip, batch, ctx, n, overhead=over, **kw)

    base, one_draft, verify = fwd(target, 1, overhead_t), fwd(draft, 1, overhead_d), fwd(target, gamma + 1, overhead_t)
    return {"t_base": base, "t_draft": one_draft, "t_verify": verify, "c": one_draft / base,
            "verify_ratio": verify / base,
            "speedup": expected_tokens(alpha, gamma) * base / (gamma * one_draft + verify)}


def best_round(target, draft, chip, batch, ctx, alpha, gamma_max=16, **kw):
    """
    γ = 1 … gamma_max 里加速比最大的一个；都不超过 1 时返回 (0, None)（不投机）。返回 (γ*, spec_round 的字典)。

    【显存】只试放得下的 γ：每个序列要存 ctx + γ + 1 个 token 的 KV，显存随 γ 增长，所以遇到第一个放不下的 γ
        就停（更大的也放不下）。连 γ = 1 都放不下 → spec_round 的 CapacityError（没有"加速比"可言）。
    """
    gamma_max = check_int("gamma_max", gamma_max, lo=1, hi=GAMMA_MAX)
    rounds = []
    for g in range(1, gamma_max + 1):
        try:
            rounds.append(spec_round(target, draft, chip, batch, ctx, alpha, g, **kw))
        except llm_math.CapacityError:
            if g == 1:
                raise
            break
    i = int(np.argmax([r["speedup"] for r in rounds]))      # 第一个最大值：并列时取较小的 γ
    return (i + 1, rounds[i]) if rounds[i]["speedup"] > 1.0 else (0, None)


def fits_in_memory(models, chip, batch, tokens, w_bytes=2.0, kv_bytes=2.0, mem_util=serving_sim.GPU_MEM_UTIL):
    """
    几个模型（目标 + 草稿）的权重，加上每个模型 batch × tokens 个 token 的 KV，放不放得进一块芯片的 mem_util × 显存。

    【用途】verify_time 只算时间、不管显存；05 演示用它把"时间上好看、但根本放不下"的 (批大小, 上下文) 标出来。
    【返回】(是否放得下, 需要的字节)。可用 = mem_util × 可分配显存（llm_math.allocatable_bytes，同第 1 讲的 fit）。
    【边界】models 不能为空（"什么模型都不放"放不放得下没有意义，原来悄悄返回 (True, 0)）。
    """
    models = tuple(models)
    if not models:
        raise ValueError("models 不能为空：至少要有一个模型（例如 (目标, 草稿)）")
    for m in models:
        llm_math.check_model_chip(m, chip)
    batch, tokens = check_int("batch", batch, lo=1), check_int("tokens", tokens, lo=0)
    w_bytes = check_real("w_bytes", w_bytes, 0.0, 8.0, lo_open=True, where="fits_in_memory")
    kv_bytes = check_real("kv_bytes", kv_bytes, 0.0, 8.0, lo_open=True, where="fits_in_memory")
    mem_util = check_real("mem_util", mem_util, lo=0.0, hi=1.0, lo_open=True)
    need = sum(m.weight_bytes(w_bytes) + m.kv_cache_bytes(batch, tokens, kv_bytes) for m in models)
    return need <= mem_util * llm_math.allocatable_bytes(chip), need


def tree_round(target, chip, batch, ctx, mean_accept, branching, t_draft=0.0, overhead_t=1e-3, **kw):
    """
    树形验证一轮的时间与加速比：目标模型一次前向验证 nodes + 1 个 token（树的所有节点 + 待定的那个，
    nodes = tree_nodes(branching)），平均产出 1 + mean_accept 个 token。

    【参数】mean_accept：tree_accept_lengths 的平均值，必须在 [0, 树深 D = len(branching)] 里——一轮最多沿一条
        根到叶的路径接受 D 个草稿，不是"节点数"个；branching：(k_1, …, k_D)，同 tree_accept_lengths；
        t_draft：这一轮生成整棵树的草稿时间
        （默认 0：Medusa 式的草稿头在目标的最后一层上顺带算出，**假设**不额外花时间）；overhead_t、kw 同 spec_round。
    【近似】verify_time 按"第 j 个新 token 看 ctx + j 个 key"算注意力，树形掩码下节点只看 ctx + 深度 个，
        这里略微高估了注意力 FLOPs（节点数小时可忽略）。
    【返回】字典：t_base、t_verify、verify_ratio、speedup
    """
    k = _branching(branching)
    nodes = tree_nodes(k)
    mean_accept = check_real("mean_accept", mean_accept, lo=0.0, hi=float(len(k)))     # 接受长度 ≤ 树深
    base = verify_time(target, chip, batch, ctx, 1, overhead=overhead_t, **kw)
    ver = verify_time(target, chip, batch, ctx, nodes + 1, overhead=overhead_t, **kw)
    return {"t_base": base, "t_verify": ver, "verify_ratio": ver / base,
            "speedup": (1.0 + mean_accept) * base / (check_real("t_draft", t_draft, lo=0.0) + ver)}


def draft_ranks(target_seq_logits_draft, seq):
    """
    贪心解码下，草稿猜得准不准只取决于一件事：在每个位置，目标模型真正的下一个 token 在草稿分布里排第几。

    【参数】target_seq_logits_draft：草稿模型沿着**目标模型贪心生成的序列**在每个位置的 logits [L, V]；
        seq：这条序列 [L]（位置 t 的正确答案是 seq[t+1]）。
    【返回】长度 L − 1 的整数数组：ranks[t] = 草稿 logits[t] 里**严格**比正确答案大的个数（0 = 第一名）。
        并列算作对草稿有利（真实实现的 top-k 并列时顺序不定，这里取乐观的一边）。
    """
    lg = _real_array("target_seq_logits_draft", target_seq_logits_draft, "draft_ranks")
    seq = np.asarray(seq)
    if seq.size and (seq.dtype == bool or not np.issubdtype(seq.dtype, np.integer)):
        raise TypeError(f"draft_ranks：seq 的元素必须是整数 token，收到 dtype {seq.dtype}")
    if lg.ndim != 2 or seq.ndim != 1 or lg.shape[0] != seq.shape[0] or len(seq) < 2:
        raise ValueError(f"需要 logits [L, V] 和 seq [L]（L ≥ 2），收到 {lg.shape} 和 {seq.shape}")
    if seq.min() < 0 or seq.max() >= lg.shape[1]:
        raise ValueError(f"seq 的 token 必须在 [0, {lg.shape[1]}) 里")
    truth = lg[np.arange(len(seq) - 1), seq[1:]]                       # 每个位置正确答案的分数
    return (lg[:-1] > truth[:, None]).sum(axis=1)


def _branching(branching):
    """树的分支数 (k_1, …, k_D)：非空的一维整数序列，每个 ≥ 1。返回 int64 数组。"""
    k = np.asarray(branching)
    if k.ndim != 1 or k.size == 0 or not np.issubdtype(k.dtype, np.integer) or (k < 1).any():
        raise ValueError(f"branching 必须是非空的正整数序列（每层 k_d ≥ 1），收到 {branching!r}")
    nodes, width = 0, 1
    for kd in k.tolist():                         # Python 整数算节点数：int64 的 cumprod 会悄悄溢出
        width *= kd
        nodes += width
    if nodes > MAX_TREE_NODES:
        raise ValueError(f"branching = {branching!r} 的树有 {nodes:,} 个节点，超过上限 {MAX_TREE_NODES:,}"
                         f"（一次前向验证的 token 数）")
    return k.astype(np.int64)


def tree_nodes(branching):
    """
    静态树的节点数 = k_1 + k_1·k_2 + … + k_1⋯k_D（每个节点是一个要验证的草稿 token）。
    branching 同 tree_accept_lengths（非空、每层 ≥ 1 的整数序列，否则 ValueError）。
    """
    return int(np.cumprod(_branching(branching)).sum())


def tree_accept_lengths(ranks, branching):
    """
    静态树（第 d 层每个节点有 k_d 个孩子：草稿在该前缀上的前 k_d 名）在贪心解码下，从每个位置出发接受几个草稿 token。

    【思路】贪心时目标模型的续写是确定的。第 d 层的候选是草稿在"到目前为止都正确"的前缀上的前 k_d 名——
        只要正确答案排在前 k_d 名里，这一层就有一个节点被接受，继续往下。所以从位置 t 出发的接受长度是
        最大的 m ≤ D，使得 ranks[t + d − 1] < k_d 对 d = 1 … m 都成立。链式草稿（普通投机解码）是 k_d 全为 1 的特例。
    【参数】ranks：draft_ranks 的结果；branching：(k_1, …, k_D)，每个 ≥ 1。
    【返回】(每个起点的接受长度 [len(ranks) − D + 1], 节点数 = 一轮要验证的草稿 token 数)。末尾不足 D 个位置的起点丢掉。
    【系统联系】验证时用"树形注意力掩码"：每个节点只看得见自己的祖先（Medusa、EAGLE、SpecInfer）。节点越多接受越长，
        但一次要验证的 token 也越多——批小时几乎免费，批大时不是（05 演示）。
    """
    ranks = np.asarray(ranks)
    if ranks.size and (ranks.dtype == bool or not np.issubdtype(ranks.dtype, np.integer) or ranks.min() < 0):
        raise ValueError(f"tree_accept_lengths：ranks 必须是非负整数（draft_ranks 的结果），收到 dtype {ranks.dtype}")
    k = _branching(branching)
    D = len(k)
    if ranks.ndim != 1 or len(ranks) < D:
        raise ValueError(f"ranks 必须是一维且长度 ≥ 树深 {D}，收到形状 {ranks.shape}")
    starts = len(ranks) - D + 1
    window = np.lib.stride_tricks.sliding_window_view(ranks, D)[:starts]   # [starts, D]：window[t, d] = ranks[t+d]
    hit = window < k[None, :]
    return np.cumprod(hit, axis=1).sum(axis=1), tree_nodes(k)


# =============================================================================
# 输入检查（放在教学代码之后；单个参数用 course_utils 的 check_*）
# =============================================================================
GAMMA_MAX = 4096         # 一轮最多几个草稿（gamma、gamma_max 的上限）：实际用法是几个到几十个；再大只会让循环跑很久
MAX_TREE_NODES = 1 << 20  # 树形验证一次前向最多验证几个节点


def _seq(name, v):
    """一串东西（列表、元组、生成器）→ list；字符串、单个数不算。"""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{name} 必须是列表或元组，收到 {type(v).__name__} {v!r}")
    return list(v)


def _name(name, where):
    if not isinstance(name, str):
        raise TypeError(f"{where}：name 必须是字符串，收到 {type(name).__name__} {name!r}")
    return name


def _real_array(name, v, where, finite=False):
    """先查 dtype 再转换：整数 / 浮点数组 → float64（bool、字符串、复数、object 不收：'0.5' 不会被悄悄转成 0.5）。
    finite=True 时还不收 NaN、±inf。"""
    a = np.asarray(v)
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{where}：{name} 必须是实数数组，收到 dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if finite and not np.isfinite(a).all():
        raise ValueError(f"{where}：{name} 只能含有限值，发现了 NaN 或 ∞")
    return a


def _tokens2d(name, toks, vocab):
    """二维整数 token 数组 [N, L]（N、L ≥ 1），取值在 [0, vocab)。先查 dtype 再转换。"""
    a = np.asarray(toks)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"{name} 必须是非空的二维 token 数组 [N, L]，收到形状 {a.shape}")
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} 的元素必须是整数 token，收到 dtype {a.dtype}")
    if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"{name} 的 token 必须在 [0, {vocab}) 里，收到范围 [{a.min()}, {a.max()}]")
    return a.astype(np.int64, copy=False)


def _check_lm(model, name):
    """model 要有语言模型接口（TransformerLM、NGramLM）。"""
    for attr in ("vocab", "capacity", "new_cache", "logits", "full_logits", "rollback"):
        if not hasattr(model, attr):
            raise TypeError(f"{name} 必须是 TransformerLM 或 NGramLM（缺少 {attr}），收到 {type(model).__name__}")
    return model


def _check_forward_room(model, n, length, name):
    """n 条长 length 的序列一次前向（logits、激活、注意力分数、KV）要的内存：超过这台机器的内存就 ValueError。"""
    cfg = getattr(model, "cfg", None)
    per = 8 * length * model.vocab
    if cfg is not None:
        per += 8 * length * (6 * cfg.d_model + 3 * cfg.d_ff + 2 * cfg.n_heads * length
                             + 2 * cfg.n_layers * cfg.n_kv_heads * cfg.d_head)
    check_count(name, n, per, where=f"{getattr(model, 'name', type(model).__name__)} 的前向")


def _check_step_history(step, history, where):
    serving_sim.check_step_like(step, where)
    if history is not None and not isinstance(history, list):
        raise TypeError(f"{where}：history 必须是列表或 None，收到 {type(history).__name__}")


def _req_list(reqs, where):
    reqs = _seq("reqs", reqs)
    for i, r in enumerate(reqs):
        if not isinstance(r, Req):
            raise TypeError(f"{where}：reqs[{i}] 必须是 Req，收到 {type(r).__name__}")
    return reqs


def _check_gof(samples, probs, min_expected):
    """chi_square_gof 的输入：samples [N, n] 的整数 token；probs 一维概率（非负、有限、和为 1）；min_expected > 0。"""
    s = np.asarray(samples)
    if s.ndim != 2 or s.shape[0] == 0 or s.shape[1] == 0:
        raise ValueError(f"samples 必须是 [N, n] 的二维数组（N、n ≥ 1），收到形状 {s.shape}")
    if s.dtype == bool or not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"samples 的元素必须是整数 token，收到 dtype {s.dtype}")
    dp = np.asarray(probs).dtype
    p = _real_array("probs", probs, "chi_square_gof")
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"probs 必须是非空的一维概率向量（exact_continuation_dist 的结果），收到形状 {p.shape}")
    _prob_rows("probs", p, dtype=dp)                 # 没归一化的 probs 会给出假的拒绝（[5, 5] → p = 1e-72）
    return s.astype(np.int64), p, check_real("min_expected", min_expected, lo=0.0, lo_open=True)


def _temperature(t):
    return check_real("temperature", t, lo=0.0)


def _tokens(name, toks, vocab):
    """一维整数 token 数组，长度 ≥ 1，取值在 [0, vocab)。"""
    a = np.asarray(toks)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} 必须是非空的一维 token 序列，收到形状 {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} 的元素必须是整数 token，收到 dtype {a.dtype}")
    if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"{name} 的 token 必须在 [0, {vocab}) 里，收到范围 [{a.min()}, {a.max()}]")
    return a.astype(np.int64)


# =============================================================================
# 自检
# =============================================================================
def tiny_pair(seed=1):
    """
    自检、演示、测试共用的一对小模型（词表 24）：目标 2 层；草稿 = 目标的第 1 层（共享词嵌入和 lm_head，
    像"早退"式草稿——和目标很像，贪心时经常猜中）。返回 (target, draft)，都是 TransformerLM。
    """
    from transformer_lab import Config, config_like, init_params
    cfg = Config(vocab=24, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_ff=80, max_seq=96)
    params = init_params(cfg, seed=check_int("seed", seed, lo=0, where="tiny_pair"))
    small = dict(params, layers=params["layers"][:1])
    return TransformerLM(params, cfg, "target"), TransformerLM(small, config_like(cfg, n_layers=1), "draft")


def _selftest():
    rng = np.random.default_rng(20240906)
    # 1. 一步投机采样的精确分布 = p；β = 1 − TV（不同词表大小，q 里有 0）
    for V in (7, 50, 301):
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.full(V, 0.3))
        q[rng.random(V) < 0.2] = 0.0
        q /= q.sum()
        out, beta = spec_output_dist(p, q)     # 按算法的两条路径加出来的分布
        assert np.max(np.abs(out - p)) < 1e-15, "投机采样的输出分布必须等于 p"
        assert abs(beta - (1.0 - 0.5 * np.abs(p - q).sum())) < 1e-15, "β 必须等于 1 − TV(p, q)"
    # 2. 公式：逐项相加 = 闭式；对照论文发表的数（Leviathan et al., ICML 2023, 表 1：α = 0.9、γ = 10、c = 0 → 6.86×）
    for a, g in ((0.8, 5), (0.37, 3), (0.999, 40)):
        assert abs(expected_tokens(a, g) - (1 - a ** (g + 1)) / (1 - a)) < 1e-9
    s_t1 = walltime_speedup(0.9, 10, 0.0)
    assert abs(s_t1 - (1 - 0.9 ** 11) / 0.1) < 1e-12, "c = 0 时加速比 = 等比数列和 (1 − α^{γ+1})/(1 − α)"
    assert abs(s_t1 - LEVIATHAN_TABLE1[0.9, 10, 0.0]) < 0.005, "和 Leviathan 表 1 发表的 6.86× 对不上"
    for g, ch in ((4, 0.3), (9, 0.05)):              # 定理 3.11 的两端：α = 0 一轮只留 1 个 token；α = 1 留 γ+1 个
        assert abs(ops_factor(0.0, g, ch) - (g * ch + g + 1)) < 1e-12
        assert abs(ops_factor(1.0, g, ch) - (g * ch + g + 1) / (g + 1)) < 1e-12
    # 3. 选择性批处理 = 逐个请求单独算（阶段不同、长度不同；请求 1 已有上下文）
    tgt, drf = tiny_pair()
    cfg, params = tgt.cfg, tgt.params
    chunks = [rng.integers(0, cfg.vocab, T) for T in (5, 1, 3, 1)]
    history = [rng.integers(0, cfg.vocab, T) for T in (0, 7, 2, 11)]
    caches, refs = [], []
    for h in history:
        c, rc = KVCache(cfg, 1), KVCache(cfg, 1)
        if len(h):
            forward(params, cfg, h[None], cache=c)
            forward(params, cfg, h[None], cache=rc)
        caches.append(c)
        refs.append(rc)
    err = max(float(np.max(np.abs(o - forward(params, cfg, ch[None], cache=rc)[0])))
              for o, ch, rc in zip(ragged_forward(params, cfg, chunks, caches), chunks, refs))
    assert err < 1e-12, f"选择性批处理和逐个计算不一致：{err}"
    # 4. 贪心投机解码 = 贪心解码（Transformer 草稿和 bigram 草稿、几个 γ）
    prompt = np.array([3, 1, 4, 1, 5])
    greedy, calls = autoregressive_generate(tgt, prompt, 30, 0, rng)
    bigram = NGramLM.fit(tgt.sample(prompt, 64, 24, 1.0, rng), cfg.vocab)
    for d, g in ((bigram, 2), (drf, 1), (drf, 3)):        # 最后一个（γ = 3）的统计打印在小结里
        got, st = speculative_generate(tgt, d, prompt, 30, g, 0, rng)
        assert got == greedy, f"贪心投机解码必须和贪心解码逐 token 相同（草稿 {d.name}，γ = {g}）"
        assert st["target_cache_len"] == len(prompt) + sum(a + 1 for a in st["accepted"]) - 1
    # 5. 调度：FasterTransformer 在 13B / A100-40GB 上的批上限：由写明的假设推出 7（ft_batch_cap；论文：8 就 OOM），
    #    按 2048 预留的 KV 容量（0.9 × 可分配显存）也是 7；原课程的 A100（只有手册的 40 GB）给 6。
    #    迭代级模拟全部完成且 FCFS
    assert (GPT3_13B.n_layers, GPT3_13B.d_model, GPT3_13B.n_kv_heads) == (40, 5120, 40)       # Orca 表 1
    assert A100_40G.mem_cap == 40e9 and LLAMA32_1B.vocab == LLAMA31_8B.vocab                   # 同一个分词器
    sm = StepModel(GPT3_13B, A100_40G)
    ft_cap = ft_batch_cap(GPT3_13B, A100_40G, FT_MAX_SEQ)["cap"]
    assert sm.kv_capacity_tokens() // FT_MAX_SEQ == ft_cap == 7 < 8, "FT 式的 2048-token 预留：批上限应为 7"
    from dataclasses import replace
    assert StepModel(GPT3_13B, replace(A100_40G, mem_alloc=None)).kv_capacity_tokens() // FT_MAX_SEQ == 6
    reqs = orca_workload(60, 4.0, seed=3)
    res = run_iteration_level(reqs, sm, 16)
    assert res["done"] == 60 and not res["deadlock"] and res["admit_order"] == list(range(60))
    assert all(r.arrival <= r.admit_t < r.first_tok <= r.finish for r in reqs)
    print(f"decode_lab 自检通过：投机采样分布 = p（误差 < 1e-15）、β = 1 − TV、Leviathan 表 1（ICML 2023）的 6.86×、"
          f"定理 3.11 的两端、"
          f"选择性批处理 = 逐个计算（误差 {err:.0e}）、"
          f"贪心投机 = 贪心（目标前向 {st['target_calls']} 次 vs {calls} 次）、"
          f"FT 批上限 {ft_cap}（原课程的 0.9 × 40 GB 规则 6）")


if __name__ == "__main__":
    _selftest()
