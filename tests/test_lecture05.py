"""第 5 讲 serving_sim 的单元测试与性质测试（自检和演示由 test_harness.py 在子进程里跑，这里不重复）。"""
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from labload import load_lab

ss = load_lab("lecture05", "serving_sim")
lm = load_lab("lecture01", "llm_math")
hw = load_lab("lecture01", "hw_specs")
cs = load_lab("prereq5", "comm_sim")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------
# 随机模型与芯片
# ---------------------------------------------------------------------------
@st.composite
def models(draw):
    G = draw(st.sampled_from([1, 2, 4, 8]))
    H = G * draw(st.integers(1, 8))
    return lm.ModelConfig("rand", n_layers=draw(st.integers(1, 48)), d_model=draw(st.integers(64, 8192)),
                          n_heads=H, n_kv_heads=G, d_head=draw(st.sampled_from([32, 64, 128])),
                          d_ff=draw(st.integers(64, 16384)), vocab=draw(st.integers(100, 150000)),
                          tied=draw(st.booleans()))


@st.composite
def model_chip(draw):
    """随机模型 + 一块放得下它的随机芯片（容量 = 权重的 1.5–20 倍 + 2^23 个 token 的 KV，再除以可用比例 0.9：
    下面的性质测试要问很长的上下文，decode_cost 对放不下的上下文报 CapacityError）。"""
    m = draw(models())
    cap = (m.weight_bytes() * draw(st.floats(1.5, 20.0)) + m.kv_bytes_per_token(2) * 2 ** 23) / 0.9
    chip = hw.Chip("rand-chip", "GPU", peak={"bf16": draw(st.floats(50e12, 5e15))},
                   mem_bw=draw(st.floats(0.3e12, 10e12)), mem_cap=cap, mem_kind="HBM",
                   link_bw=draw(st.floats(20e9, 1e12)))
    return m, chip


def _rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


# ---------------------------------------------------------------------------
# 时间模型
# ---------------------------------------------------------------------------
def test_kv_capacity_matches_seed_and_vllm_headroom():
    import dataclasses
    seed_a100 = dataclasses.replace(ss.A100_40G, mem_alloc=None)        # 原课程第 6 讲模块的 A100：只有手册的 40e9
    assert ss.StepModel(ss.GPT3_13B, seed_a100).kv_capacity_tokens() // 2048 == 6      # 种子的断言
    sm = ss.StepModel(ss.GPT3_13B, ss.A100_40G)                          # 我们的：可分配 42.6 GB（推出）
    kv = 2 * 40 * 40 * 128 * 2
    assert sm.kv_capacity_tokens() == int((0.9 * ss.A100_40G.alloc_bytes - ss.GPT3_13B.n_params() * 2) // kv)
    assert sm.kv_capacity_tokens() // 2048 == ss.ft_batch_cap(ss.GPT3_13B, ss.A100_40G)["cap"] == 7


def test_ft_batch_cap_from_stated_assumptions():
    """FT 批上限由写明的假设算出（不是调出来的利用率）：逐项手算；工作区越大批越小；论文 "8 就 OOM"。"""
    m, chip = ss.GPT3_13B, ss.A100_40G
    r = ss.ft_batch_cap(m, chip)
    S, d, H = 2048, 5120, 40
    kv_seq = 2 * 40 * 40 * 128 * 2 * S
    work = (H * S * S + 10 * d * S) * 2
    free = chip.alloc_bytes - 1e9 - m.n_params() * 2
    assert r["kv_per_seq"] == kv_seq and r["work_per_seq"] == work
    assert r["cap"] == int(free // (kv_seq + work)) == 7 and r["cap_kv_only"] == int(free // kv_seq) == 9
    assert ss.ft_batch_cap(m, chip, runtime_bytes=5e9)["cap"] < r["cap"]
    assert ss.ft_batch_cap(m, chip, max_seq=1024)["cap"] > r["cap"]


@settings(max_examples=60, **SETTINGS)
@given(mc=model_chip(), b=st.integers(1, 512), ctx_per=st.integers(1, 8192), data=st.data())
def test_decode_monotone_and_roofline(mc, b, ctx_per, data):
    m, chip = mc
    sm = ss.StepModel(m, chip, mfu=data.draw(st.floats(0.05, 1.0)), mbu=data.draw(st.floats(0.05, 1.0)))
    ctx = b * ctx_per
    t = sm.decode_time(b, ctx)
    assert sm.decode_time(b + 1, ctx + 1) >= t                         # 多一个序列
    assert sm.decode_time(b, ctx + data.draw(st.integers(0, 10**6))) >= t   # 更长的上下文
    c = sm.decode_cost(b, ctx)
    # 账单 = 从 llm_math 的计数独立算出的 roofline
    flops = b * m.linear_flops_per_token() + m.attn_flops_per_token(ctx)
    nbytes = m.matmul_params() * 2 + (ctx + b) * m.kv_bytes_per_token(2)
    assert _rel(c.t_compute, flops / (chip.peak_flops("bf16") * sm.mfu)) < 1e-9
    assert _rel(c.t_memory, nbytes / (chip.mem_bw * sm.mbu)) < 1e-9
    assert t == max(c.t_compute, c.t_memory) + sm.overhead            # tp = 1：没有通信
    assert t >= c.t_compute + sm.overhead and t >= c.t_memory + sm.overhead


@settings(max_examples=60, **SETTINGS)
@given(mc=model_chip(), lens=st.lists(st.integers(1, 4096), min_size=1, max_size=8), extra=st.integers(1, 999))
def test_prefill_monotone_and_mixed_consistency(mc, lens, extra):
    m, chip = mc
    sm = ss.StepModel(m, chip)
    t = sm.prefill_time(lens)
    assert sm.prefill_time(lens + [extra]) >= t
    assert sm.prefill_time([lens[0] + extra] + lens[1:]) >= t
    # 因果注意力：T(T+1)/2 对；mixed(0, 0, ΣT, 注意力) = prefill
    pattn = m.attn_flops_per_token(1) * sum(L * (L + 1) / 2 for L in lens)
    assert _rel(sm.mixed_time(0, 0, sum(lens), pattn), t) < 1e-12
    assert sm.mixed_time(3, 3 * extra, 0, 0) == sm.decode_time(3, 3 * extra)
    # 在 decode 步里塞进 prefill 不会更快
    assert sm.mixed_time(3, 3 * extra, sum(lens), pattn) >= sm.decode_time(3, 3 * extra)


@settings(max_examples=40, **SETTINGS)
@given(mc=model_chip(), tp=st.sampled_from([2, 4, 8]), b=st.integers(1, 256), ctx_per=st.integers(1, 4096))
def test_tensor_parallel_consistency(mc, tp, b, ctx_per):
    m, chip = mc
    assume(m.n_heads % tp == 0 and (m.n_kv_heads % tp == 0 or tp % m.n_kv_heads == 0))
    s1, sp = ss.StepModel(m, chip), ss.StepModel(m, chip, tp=tp)
    assert s1.comm_time(b) == 0.0
    want = 2 * m.n_layers * cs.tp_allreduce_time(b * m.d_model * 2, tp, chip.link_bw)
    assert _rel(sp.comm_time(b), want) < 1e-12
    c1, cp = s1.decode_cost(b, b * ctx_per), sp.decode_cost(b, b * ctx_per)
    assert _rel(cp.flops * tp, c1.flops) < 1e-12                       # 运算平分
    assert _rel(sp.weight_read_bytes * tp, s1.weight_read_bytes) < 1e-12
    assert cp.bytes <= c1.bytes                                       # 每卡读的不会更多
    assert sp.kv_capacity_tokens() >= s1.kv_capacity_tokens()         # 每卡权重少了，KV 位置只多不少
    # 每卡每 token 的 KV：全量 KV 分成 min(tp, G) 份不同的头——G ≥ tp 时 tp 份；G < tp 时只有 G 个头可分，
    # 多出来的卡复制已有的头（不会出现半个头）
    per_chip = m.kv_bytes_per_token(2) / min(tp, m.n_kv_heads)
    assert sp.kv_bytes_per_token == per_chip
    assert sp.kv_capacity_tokens() == int((0.9 * chip.alloc_bytes - m.weight_bytes() / tp) // per_chip)
    assert _rel(sp.decode_time(b, b * ctx_per), max(cp.t_compute, cp.t_memory) + cp.t_comm + sp.overhead) < 1e-12


def test_crossover_batch_is_the_first_compute_bound_batch():
    for m, chip in ((ss.LLAMA31_8B, hw.H100_SXM), (ss.LLAMA31_8B, hw.B200), (ss.GPT3_13B, ss.A100_40G)):
        sm = ss.StepModel(m, chip)
        for ctx in (1, 256):
            bx = ss.crossover_batch(sm, ctx, b_max=4096)
            if bx is None:                                            # MHA + 长上下文：KV 字节随批一起涨，永远到不了
                # 批 4096 仍受带宽限制：换一块显存够大的同款芯片（roofline 只看峰值和带宽，容量只决定放不放得下）
                need = (m.weight_bytes() + 4096 * ctx * m.kv_bytes_per_token(2)) / sm.mem_util
                big = ss.StepModel(m, dataclasses.replace(chip, mem_cap=2 * need, mem_alloc=None))
                assert big.decode_cost(4096, 4096 * ctx).bound == "memory"
                continue
            assert sm.decode_cost(bx, bx * ctx).bound == "compute"
            assert bx == 1 or sm.decode_cost(bx - 1, (bx - 1) * ctx).bound == "memory"
        # 上下文很短时拐点 ≈ 有效 ridge（权重读取占主导）
        assert _rel(ss.crossover_batch(sm, 1), sm.effective_ridge()) < 0.1


def test_bad_inputs_raise_with_names():
    sm = ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM)
    with pytest.raises(ValueError, match="GB"):
        ss.StepModel(ss.LLAMA31_70B, hw.H100_SXM)                     # 141 GB 权重 > 72 GB
    with pytest.raises(ValueError, match="tp"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, tp=3)
    with pytest.raises(TypeError, match="tp"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, tp=2.0)
    with pytest.raises(ValueError, match="mfu"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, mfu=0.0)
    with pytest.raises(ValueError, match="prec"):
        ss.StepModel(ss.LLAMA31_8B, hw.TPU_V5E, w_bytes=1.0)          # v5e 没有 fp8 峰值
    with pytest.raises(ValueError, match="comm_algo"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, comm_algo="magic")
    with pytest.raises(TypeError, match="model"):
        ss.StepModel("llama", hw.H100_SXM)
    with pytest.raises(ValueError, match="ctx_tokens"):
        sm.decode_time(8, 4)
    with pytest.raises(ValueError, match="prompt_lens"):
        sm.prefill_time([])
    with pytest.raises(ValueError, match="prompt_lens"):
        sm.prefill_time([5, 0])
    with pytest.raises(TypeError, match="prompt_lens"):
        sm.prefill_time([1.5])
    with pytest.raises(ValueError, match="n_decode"):
        sm.mixed_time(0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="prefill_attn_flops"):
        sm.mixed_time(1, 10, 0, 5.0)
    with pytest.raises(ValueError, match="GB"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, mem_util=0.18)       # 可用 15.3 GB < 权重 16.1 GB
    with pytest.raises(ss.CapacityError, match="KV 容量"):           # 放不下的上下文不给"48.9 s"这样的时间
        sm.decode_time(4, 10 ** 9)
    assert ss.CapacityError is lm.CapacityError                       # 全课程同一个异常
    tight = (sm.weight_bytes_per_chip + 0.5 * sm.kv_bytes_per_token) / hw.H100_SXM.alloc_bytes
    with pytest.raises(ValueError, match="KV"):
        ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM, mem_util=tight)      # 放下权重后不到 1 个 token 的 KV
    # 70B 在 4 卡上放得下，而且 KV 头（8 个）超过 tp 时仍然平分
    s4 = ss.StepModel(ss.LLAMA31_70B, hw.H100_SXM, tp=4)
    assert s4.kv_heads_per_chip == 2 and ss.min_tp(ss.LLAMA31_70B, hw.H100_SXM) == 2


def test_kv_heads_replicated_when_tp_exceeds_kv_heads():
    """405B（8 个 KV 头）切 16 块 H100：每块卡复制 1 个 KV 头，不是 0.5 个。参考值全部从公开的结构参数手算。"""
    L, d, H, G, dh, f, V = 126, 16384, 128, 8, 128, 53248, 128256    # Llama-3.1-405B[S41]
    # 每层 q、o + k、v + MLP 三个矩阵 + 2 个 norm；再加词嵌入 + lm_head（不共享）+ 末层 norm
    n_params = L * (2 * d * H * dh + 2 * d * G * dh + 3 * d * f + 2 * d) + 2 * V * d + d
    usable = 0.9 * hw.H100_SXM.alloc_bytes                            # H100 可分配字节的 90%
    weights_per_chip = 2 * n_params / 16                              # BF16，平分到 16 块卡
    kv_per_token_per_chip = 2 * L * 1 * dh * 2                        # K 和 V × 层 × 1 个头 × dh × 2 字节 = 64,512 B
    s16 = ss.StepModel(lm.LLAMA31_405B, hw.H100_SXM, tp=16)
    assert s16.kv_heads_per_chip == 1
    assert s16.kv_bytes_per_token == kv_per_token_per_chip == 64512
    assert s16.weight_bytes_per_chip == weights_per_chip
    assert s16.kv_capacity_tokens() == math.floor((usable - weights_per_chip) / kv_per_token_per_chip)
    # tp 翻倍到超过 G 之后，每卡每 token 的 KV 不再减半（H200 上 TP8 每卡也是 1 个头）
    s8 = ss.StepModel(lm.LLAMA31_405B, hw.H200, tp=8)
    assert s8.kv_bytes_per_token == s16.kv_bytes_per_token
    # 40 个 KV 头的 GPT-3 13B 切 8 块：每卡 5 个头（平分，不复制）
    s13 = ss.StepModel(ss.GPT3_13B, hw.H100_SXM, tp=8)
    assert s13.kv_bytes_per_token == 2 * 40 * 5 * 128 * 2


def test_tp_and_kv_heads_must_divide_one_another():
    """tp 整除 n_heads，但和 n_kv_heads 互不整除：KV 头没法平分也没法整份复制，报错而不是静默算错。"""
    m = lm.ModelConfig("h12g4", n_layers=2, d_model=256, n_heads=12, n_kv_heads=4, d_head=32, d_ff=512, vocab=1000)
    with pytest.raises(ValueError, match="n_kv_heads=4"):
        ss.StepModel(m, hw.H100_SXM, tp=3)                            # 12 % 3 == 0，但 4 和 3 互不整除
    m6 = lm.ModelConfig("h12g6", n_layers=2, d_model=256, n_heads=12, n_kv_heads=6, d_head=32, d_ff=512, vocab=1000)
    with pytest.raises(ValueError, match="n_kv_heads=6"):
        ss.StepModel(m6, hw.H100_SXM, tp=4)
    assert ss.StepModel(m6, hw.H100_SXM, tp=2).kv_heads_per_chip == 3
    assert ss.StepModel(m6, hw.H100_SXM, tp=12).kv_heads_per_chip == 1   # 12 = 2 × 6：每 2 块卡共用一个头
    assert ss.min_tp(m, hw.H100_SXM, candidates=(3, 4)) == 4             # 切不了的 tp 跳过


def test_helpers_reject_bad_inputs_instead_of_answering_wrong():
    sm = ss.StepModel(ss.LLAMA31_8B, hw.H100_SXM)
    # 坏参数不能被 min_tp 当成"放不下"而返回 None
    with pytest.raises(ValueError, match="mfu"):
        ss.min_tp(ss.LLAMA31_70B, hw.H100_SXM, mfu=2.0)
    with pytest.raises(TypeError, match="candidates"):
        ss.min_tp(ss.LLAMA31_70B, hw.H100_SXM, candidates=(2.5,))
    assert ss.min_tp(ss.LLAMA31_70B, hw.H100_SXM, candidates=(8, 2, 4)) == 2   # 最小的那个，与顺序无关
    assert ss.min_tp(lm.LLAMA31_405B, hw.H100_SXM, candidates=(1, 2, 4, 8)) is None   # 812 GB / 8 > 72 GB
    # 批大小 2.7 不能被静默截成 2
    with pytest.raises(TypeError, match="batch_sizes"):
        ss.offline_sweep(sm, [2.7], 4)
    # 无穷大的 σ 会让对数正态抽出 nan → 垃圾整数
    with pytest.raises(ValueError, match="sigma"):
        ss.make_requests(5, 1.0, prompt=("lognormal", 100, math.inf, 50))
    with pytest.raises(ValueError, match="reqs"):
        ss.littles_law([])
    # 注意力要传 FLOPs：传 (q, k) 对数（小了 attn_flops_per_token(1) 倍）或 inf 都报错
    pairs = 100 * 101 / 2
    with pytest.raises(ValueError, match="prefill_attn_flops"):
        sm.mixed_time(0, 0, 100, pairs)
    with pytest.raises(ValueError, match="prefill_attn_flops"):
        sm.mixed_time(0, 0, 100, math.inf)
    a1 = ss.LLAMA31_8B.attn_flops_per_token(1)
    assert sm.mixed_time(0, 0, 100, a1 * pairs) == sm.prefill_time([100])


# ---------------------------------------------------------------------------
# 负载生成
# ---------------------------------------------------------------------------
def test_make_requests_seeded_and_poisson():
    a = ss.make_requests(50, 3.0, seed=5)
    b = ss.make_requests(50, 3.0, seed=5)
    c = ss.make_requests(50, 6.0, seed=5)
    assert [(r.arrival, r.prompt, r.output) for r in a] == [(r.arrival, r.prompt, r.output) for r in b]
    assert [(r.prompt, r.output) for r in a] == [(r.prompt, r.output) for r in c]   # 换速率只伸缩时间
    assert np.allclose([r.arrival / 2 for r in a], [r.arrival for r in c])
    big = ss.make_requests(20000, 4.0, ("uniform", 10, 20), ("lognormal", 50, 1.0, 300), seed=1)
    gaps = np.diff([0.0] + [r.arrival for r in big])
    assert abs(gaps.mean() * 4.0 - 1) < 0.03                          # 指数分布，均值 1/λ
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05                   # 变异系数 = 1
    P = np.array([r.prompt for r in big])
    O = np.array([r.output for r in big])
    assert P.min() == 10 and P.max() == 20 and 1 <= O.min() and O.max() <= 300
    assert abs(np.median(O) - 50) <= 3
    assert all(r.arrival == 0.0 for r in ss.make_requests(5, math.inf))
    for bad in [("normal", 3), ("uniform", 5), ("uniform", 9, 3), "fixed"]:
        with pytest.raises((ValueError, TypeError)):
            ss.make_requests(3, 1.0, prompt=bad)
    with pytest.raises(ValueError, match="rate"):
        ss.make_requests(3, 0.0)


def test_summarize_hand_trace():
    r1 = ss.Request(0, 0.0, 10, 3, t_start=0.5, t_first=1.0, t_last=2.0, t_finish=2.5,
                    token_times=np.array([1.0, 1.5, 2.0]))
    r2 = ss.Request(1, 1.0, 10, 1, t_start=1.0, t_first=4.0, t_last=4.0, t_finish=4.0,
                    token_times=np.array([4.0]))
    s = ss.summarize([r1, r2], slo_ttft=2.0, slo_tpot=0.6)
    assert s["span"] == 4.0 and s["req_per_s"] == 0.5 and s["tok_per_s"] == 1.0
    assert s["ttft_mean"] == 2.0 and s["tpot_mean"] == 0.5 and s["e2e_mean"] == 2.75
    assert s["slo_frac"] == 0.5 and s["goodput"] == 0.25             # r2 的 TTFT = 3 s 超了：4 s 里按时完成 1 个
    assert s["itl_p99"] == 0.5 and s["queue_mean"] == 0.25
    with pytest.raises(ValueError, match="t_finish"):
        ss.summarize([ss.Request(0, 0.0, 1, 1)])


# ---------------------------------------------------------------------------
# 调度模拟：不变式
# ---------------------------------------------------------------------------
STEP = ss.StepModel(ss.GPT3_13B, ss.A100_40G)


@st.composite
def traces(draw):
    n = draw(st.integers(1, 40))
    rate = draw(st.sampled_from([0.5, 2.0, 8.0, 50.0, math.inf]))
    hi_p = draw(st.integers(1, 1500))
    hi_o = draw(st.integers(1, 300))
    return ss.make_requests(n, rate, ("uniform", 1, hi_p), ("uniform", 1, hi_o), seed=draw(st.integers(0, 10**6)))


def _in_service_max(rs):
    """同时在服务中（t_start ≤ t < t_finish）的请求数的最大值。"""
    ev = sorted([(r.t_start, 1) for r in rs] + [(r.t_finish, -1) for r in rs], key=lambda e: (e[0], e[1]))
    return max(np.cumsum([d for _, d in ev]))


def _check_trace(reqs, rs, max_batch):
    assert [r.rid for r in rs] == [r.rid for r in reqs]               # 每个请求恰好一次
    assert all(math.isnan(r.t_finish) for r in reqs)                  # 输入没有被改
    for r in rs:
        assert 0 <= r.arrival <= r.t_start <= r.t_first <= r.t_last <= r.t_finish
        assert len(r.token_times) == r.output and np.all(np.diff(r.token_times) > 0)
        assert r.token_times[0] == r.t_first and r.token_times[-1] == r.t_last
    assert np.all(np.diff([r.t_start for r in rs]) >= 0)              # FCFS
    assert _in_service_max(rs) <= max_batch
    assert ss.littles_law(rs)["rel_err"] < 1e-9                       # 整个窗口：精确


@settings(max_examples=40, **SETTINGS)
@given(reqs=traces(), B=st.integers(1, 12), reserve=st.sampled_from([None, 2048]),
       wait=st.sampled_from([0.0, 0.3, 5.0]))
def test_static_invariants(reqs, B, reserve, wait):
    rs, info = ss.simulate_static(reqs, STEP, B, kv_reserve=reserve, max_wait=wait)
    _check_trace(reqs, rs, B)
    cap = STEP.kv_capacity_tokens()
    assert sum(b for _, _, b in info["batches"]) == len(reqs)
    e_prev = 0.0
    for (s0, e0, b0), nxt in zip(info["batches"], info["batches"][1:] + [None]):
        members = [r for r in rs if r.t_start == s0]
        assert len(members) == b0 and all(r.t_finish == e0 for r in members)
        need = b0 * (max(r.prompt for r in members) + max(r.output for r in members) - 1)
        assert need <= cap if reserve is None else b0 * reserve <= cap
        if nxt is not None:
            assert nxt[0] >= e0                                       # 一批跑完才下一批
        # 发车不会无故拖延：要么凑满了（或被显存截断），要么等够了 max_wait，要么上一批刚结束
        first = min(r.arrival for r in members)
        assert s0 <= max(first + wait, max(r.arrival for r in members), e_prev) + 1e-12
        e_prev = e0


@settings(max_examples=40, **SETTINGS)
@given(reqs=traces(), B=st.integers(1, 24), chunk=st.sampled_from([None, 1, 64, 512]))
def test_continuous_invariants(reqs, B, chunk):
    rs, info = ss.simulate_continuous(reqs, STEP, B, chunk=chunk)
    _check_trace(reqs, rs, B)
    assert all(r.t_last == r.t_finish for r in rs)                    # 一完成就离开


@settings(max_examples=25, **SETTINGS)
@given(reqs=traces())
def test_static_and_continuous_agree_at_batch_one(reqs):
    a, _ = ss.simulate_static(reqs, STEP, 1)
    b, _ = ss.simulate_continuous(reqs, STEP, 1)
    for x, y in zip(a, b):
        assert abs(x.t_finish - y.t_finish) <= 1e-9 * max(1.0, x.t_finish)
        assert np.allclose(x.token_times, y.token_times, rtol=1e-12, atol=1e-12)


def test_littles_law_in_steady_state_window():
    """稳态（负载约一半）下中间窗口的 L 与 λW 在统计误差内相等；两个模拟器都检查。"""
    reqs = ss.make_requests(3000, 1.5, ("uniform", 32, 512), ("uniform", 1, 128), seed=11)
    for rs in (ss.simulate_static(reqs, STEP, 8)[0], ss.simulate_continuous(reqs, STEP, 16)[0]):
        lw = ss.littles_law(rs, rs[300].arrival, rs[2700].arrival)
        assert lw["rel_err"] < 0.05, lw


def test_simulator_errors_and_kv_wall():
    reqs = ss.make_requests(30, math.inf, ("fixed", 512), ("fixed", 256), seed=0)
    _, info = ss.simulate_static(reqs, STEP, 64)
    wall = STEP.kv_capacity_tokens() // (512 + 256 - 1)
    assert max(b for _, _, b in info["batches"]) == wall             # 批大小被 KV 截断
    _, info = ss.simulate_static(reqs, STEP, 64, kv_reserve=2048)
    assert info["kv_limit"] == STEP.kv_capacity_tokens() // 2048 == 7
    with pytest.raises(ValueError, match="排序"):
        ss.simulate_static(list(reversed(ss.make_requests(5, 1.0))), STEP, 4)
    with pytest.raises(ValueError, match="容量"):
        ss.simulate_static([ss.Request(0, 0.0, 20000, 5)], STEP, 4)
    with pytest.raises(ValueError, match="容量"):
        ss.simulate_continuous([ss.Request(0, 0.0, 20000, 5)], STEP, 4)
    with pytest.raises(ValueError, match="kv_reserve"):
        ss.simulate_static([ss.Request(0, 0.0, 3000, 5)], STEP, 4, kv_reserve=2048)
    with pytest.raises(TypeError, match="max_batch"):
        ss.simulate_static(reqs, STEP, 2.5)
    with pytest.raises(ValueError, match="max_batch"):
        ss.simulate_continuous(reqs, STEP, 0)
    with pytest.raises(ValueError, match="chunk"):                  # 不预留时没有定义分块 prefill
        ss.iteration_schedule([0.0], [5], [1], STEP, max_batch=4, reserve=None, chunk=3)


def test_offline_sweep_matches_direct_simulation():
    """offline_sweep 的每一行 = 自己造同样的离线请求、跑 simulate_static、逐批手算补齐后的 token 位置。"""
    spec = (("uniform", 32, 512), ("uniform", 1, 128))
    rows = ss.offline_sweep(STEP, [1, 4, 64], 40, *spec, seed=3)
    reqs = ss.make_requests(40, math.inf, *spec, seed=3)
    useful = sum(q.prompt + q.output - 1 for q in reqs)
    for row in rows:
        rs, info = ss.simulate_static(reqs, STEP, row["max_batch"])
        sizes = [b for _, _, b in info["batches"]]
        assert row["largest_batch"] == max(sizes) <= row["max_batch"] and row["eff_batch"] == np.mean(sizes)
        slot = 0
        for s0, _, b in info["batches"]:                                  # 每批补齐到 L_max、陪跑到 O_max
            members = [x for x in rs if x.t_start == s0]
            slot += b * (max(x.prompt for x in members) + max(x.output for x in members) - 1)
        assert math.isclose(row["useful_frac"], useful / slot, rel_tol=1e-12)
        assert row["tok_per_s"] == ss.summarize(rs)["tok_per_s"]
    assert rows[0]["useful_frac"] == 1.0 and rows[-1]["useful_frac"] < rows[1]["useful_frac"]   # 批 1 没有浪费


@settings(max_examples=30, **SETTINGS)
@given(P=st.integers(1, 3000), O=st.integers(1, 6), C=st.integers(1, 1024))
def test_chunked_prefill_single_request_by_hand(P, O, C):
    """一个请求、没有别人：分块 prefill 的 TTFT = 各块一步一步加起来（注意力按每个 token 的位置逐个数）。"""
    (r,), _ = ss.simulate_continuous([ss.Request(0, 0.0, P, O)], STEP, 4, chunk=C)
    a1 = ss.GPT3_13B.attn_flops_per_token(1)
    t, done = 0.0, 0
    while done < P:
        c = min(C, P - done)
        attn = a1 * float(np.arange(done + 1, done + c + 1).sum())    # 第 j 个 token 看见 j 个 key
        t += STEP.mixed_time(0, 0, c, attn, done)
        done += c
    assert abs(r.t_first - t) <= 1e-9 * t
    for g in range(1, O):                                             # 之后每步 decode 1 个
        t += STEP.decode_time(1, P + g)
    assert abs(r.t_finish - t) <= 1e-9 * t
    # 分块不改变总注意力 FLOPs：各块之和 = 整段的 P(P+1)/2 对
    whole = STEP.prefill_cost([P]).flops
    pieces = sum(STEP.mixed_cost(0, 0, min(C, P - o), a1 * float(np.arange(o + 1, min(o + C, P) + 1).sum()), o).flops
                 for o in range(0, P, C))
    assert abs(pieces - whole) <= 1e-9 * whole
