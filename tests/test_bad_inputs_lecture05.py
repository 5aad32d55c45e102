"""第 5 讲 serving_sim、step_bench 的坏输入：每个公开入口的每一种坏值都得到 TypeError / ValueError（CapacityError
是 ValueError 的子类），消息里写出调用者传的那个参数名；合法的边界值照常运行、答案对得上参考；调度器守恒请求和 token。
CASES_SS / CASES_SB 是 (编号, 调用, 异常类型, 消息里必须有的文字)。"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, check_case, params
from labload import load_lab

ss = load_lab("lecture05", "serving_sim")
sb = load_lab("lecture05", "step_bench")
lm = load_lab("lecture01", "llm_math")

M13, A100 = ss.GPT3_13B, ss.A100_40G
STEP = ss.StepModel(M13, A100)
CAP = STEP.kv_capacity_tokens()
A1 = float(M13.attn_flops_per_token(1))
RNG = np.random.default_rng
REQS = ss.make_requests(6, 10.0, ("uniform", 4, 40), ("uniform", 1, 8), seed=1)
DONE, _ = ss.simulate_static(REQS, STEP, 4)
CapErr = ss.CapacityError


def _sm(**kw):
    return lambda: ss.StepModel(M13, A100, **kw)


def _sched(**kw):
    args = dict(arrival=[0.0, 1.0], prompt=[10, 20], output=[3, 4], step=STEP, max_batch=4)
    args.update(kw)
    return lambda: ss.iteration_schedule(**args)


def _unfinished():
    return [ss.Request(0, 0.0, 5, 2)]


CASES_SS = [
    # StepModel 的构造
    ("sm-model", lambda: ss.StepModel("13B", A100), TypeError, "model"),
    ("sm-chip", lambda: ss.StepModel(M13, "A100"), TypeError, "chip"),
    ("sm-tp0", _sm(tp=0), ValueError, "tp"),
    ("sm-tp-float", _sm(tp=2.0), TypeError, "tp"),
    ("sm-tp-bool", _sm(tp=True), TypeError, "tp"),
    ("sm-tp3", _sm(tp=3), ValueError, "tp"),
    ("sm-mfu0", _sm(mfu=0), ValueError, "mfu"),
    ("sm-mfu-nan", _sm(mfu=math.nan), ValueError, "mfu"),
    ("sm-mfu-str", _sm(mfu="0.5"), TypeError, "mfu"),
    ("sm-mbu-big", _sm(mbu=1.5), ValueError, "mbu"),
    ("sm-overhead-neg", _sm(overhead=-1), ValueError, "overhead"),
    ("sm-overhead-inf", _sm(overhead=math.inf), ValueError, "overhead"),
    ("sm-wbytes0", _sm(w_bytes=0), ValueError, "w_bytes"),
    ("sm-kvbytes-neg", _sm(kv_bytes=-2), ValueError, "kv_bytes"),
    ("sm-memutil0", _sm(mem_util=0), ValueError, "mem_util"),
    ("sm-memutil-big", _sm(mem_util=1.1), ValueError, "mem_util"),
    ("sm-actbytes-nan", _sm(act_bytes=math.nan), ValueError, "act_bytes"),
    ("sm-prec-typo", _sm(prec="bf17"), ValueError, "prec"),
    ("sm-commalgo-typo", _sm(comm_algo="rign"), ValueError, "comm_algo"),
    ("sm-commalpha-neg", _sm(comm_alpha=-1), ValueError, "comm_alpha"),
    # prefill：和 decode 同一条容量规则
    ("pf-empty", lambda: STEP.prefill_time([]), ValueError, "prompt_lens"),
    ("pf-zero", lambda: STEP.prefill_time([0]), ValueError, "prompt_lens"),
    ("pf-float", lambda: STEP.prefill_time([1.5]), TypeError, "prompt_lens"),
    ("pf-bool", lambda: STEP.prefill_time([True]), TypeError, "prompt_lens"),
    ("pf-str", lambda: STEP.prefill_time(["a"]), TypeError, "prompt_lens"),
    ("pf-nan", lambda: STEP.prefill_time([math.nan]), TypeError, "prompt_lens"),
    ("pf-neg", lambda: STEP.prefill_time([-3]), ValueError, "prompt_lens"),
    ("pf-huge", lambda: STEP.prefill_time([10 ** 9]), CapErr, "prompt_lens"),
    ("pf-sum-over-cap", lambda: STEP.prefill_time([CAP // 2 + 1] * 2), CapErr, "prompt_lens"),
    ("pf-cost-huge", lambda: STEP.prefill_cost([CAP + 1]), CapErr, "prompt_lens"),
    # decode
    ("dc-batch0", lambda: STEP.decode_time(0, 10), ValueError, "batch"),
    ("dc-batch-float", lambda: STEP.decode_time(2.0, 10), TypeError, "batch"),
    ("dc-ctx-small", lambda: STEP.decode_time(4, 3), ValueError, "ctx_tokens"),
    ("dc-ctx-huge", lambda: STEP.decode_time(1, 10 ** 9), CapErr, "ctx_tokens"),
    ("dc-ctx-float", lambda: STEP.decode_time(1, [1.5]), TypeError, "ctx_tokens"),
    ("dc-ctx-neg", lambda: STEP.decode_time(1, -1), ValueError, "ctx_tokens"),
    # mixed：和 decode 同一条容量规则
    ("mx-ctx-huge", lambda: STEP.mixed_time(1, 10 ** 9, 0, 0), CapErr, "ctx_tokens"),
    ("mx-prefill-huge", lambda: STEP.mixed_time(0, 0, 10 ** 9, A1 * 10 ** 9), CapErr, "prefill_tokens"),
    ("mx-sum-over-cap", lambda: STEP.mixed_time(1, CAP, 1, A1), CapErr, "prefill_tokens"),
    ("mx-nothing", lambda: STEP.mixed_time(0, 0, 0, 0), ValueError, "n_decode"),
    ("mx-ndecode-neg", lambda: STEP.mixed_time(-1, 0, 1, A1), ValueError, "n_decode"),
    ("mx-ctx-lt-n", lambda: STEP.mixed_time(2, 1, 0, 0), ValueError, "ctx_tokens"),
    ("mx-attn-neg", lambda: STEP.mixed_time(0, 0, 10, -1.0), ValueError, "prefill_attn_flops"),
    ("mx-attn-nan", lambda: STEP.mixed_time(0, 0, 10, math.nan), ValueError, "prefill_attn_flops"),
    ("mx-attn-no-prefill", lambda: STEP.mixed_time(1, 1, 0, 5.0), ValueError, "prefill_attn_flops"),
    ("mx-attn-pairs", lambda: STEP.mixed_time(0, 0, 10, 55.0), ValueError, "prefill_attn_flops"),
    ("mx-pctx-neg", lambda: STEP.mixed_time(1, 1, 0, 0, prefill_ctx_tokens=-1), ValueError, "prefill_ctx_tokens"),
    ("mx-ctx-float", lambda: STEP.mixed_time(1, 1.5, 0, 0), TypeError, "ctx_tokens"),
    ("mx-pt-str", lambda: STEP.mixed_time(1, 1, "3", 0), TypeError, "prefill_tokens"),
    # comm_time、h200_measured_step、ft_batch_cap
    ("comm-neg", lambda: STEP.comm_time(-1), ValueError, "n_tokens"),
    ("comm-float", lambda: STEP.comm_time(2.5), TypeError, "n_tokens"),
    ("h200-mode-typo", lambda: ss.h200_measured_step(ss.LLAMA31_8B, mode="Graph"), ValueError, "mode"),
    ("h200-mode-none", lambda: ss.h200_measured_step(ss.LLAMA31_8B, mode=None), ValueError, "mode"),
    ("h200-model", lambda: ss.h200_measured_step("8B"), TypeError, "model"),
    ("ft-maxseq0", lambda: ss.ft_batch_cap(M13, A100, max_seq=0), ValueError, "max_seq"),
    ("ft-maxseq-float", lambda: ss.ft_batch_cap(M13, A100, max_seq=2048.0), TypeError, "max_seq"),
    ("ft-runtime-neg", lambda: ss.ft_batch_cap(M13, A100, runtime_bytes=-1), ValueError, "runtime_bytes"),
    ("ft-act0", lambda: ss.ft_batch_cap(M13, A100, act_bytes=0), ValueError, "act_bytes"),
    ("ft-wbytes-neg", lambda: ss.ft_batch_cap(M13, A100, w_bytes=-2), ValueError, "w_bytes"),
    ("ft-kvbytes-str", lambda: ss.ft_batch_cap(M13, A100, kv_bytes="2"), TypeError, "kv_bytes"),
    ("ft-model", lambda: ss.ft_batch_cap("13B", A100), TypeError, "model"),
    # Request
    ("req-arrival-nan", lambda: ss.Request(0, math.nan, 10, 3), ValueError, "arrival"),
    ("req-arrival-neg", lambda: ss.Request(0, -1.0, 10, 3), ValueError, "arrival"),
    ("req-arrival-str", lambda: ss.Request(0, "0", 10, 3), TypeError, "arrival"),
    ("req-prompt0", lambda: ss.Request(0, 0.0, 0, 3), ValueError, "prompt"),
    ("req-output-float", lambda: ss.Request(0, 0.0, 10, 2.5), TypeError, "output"),
    ("req-rid-str", lambda: ss.Request("a", 0.0, 10, 3), TypeError, "rid"),
    # sample_lengths、make_requests
    ("sl-n-neg", lambda: ss.sample_lengths(("fixed", 5), -1, RNG(0)), ValueError, "n"),
    ("sl-n-float", lambda: ss.sample_lengths(("fixed", 5), 2.0, RNG(0)), TypeError, "n"),
    ("sl-n-huge", lambda: ss.sample_lengths(("fixed", 5), 10 ** 12, RNG(0)), ValueError, "n"),
    ("sl-rng-int", lambda: ss.sample_lengths(("fixed", 5), 3, 0), TypeError, "rng"),
    ("sl-spec-str", lambda: ss.sample_lengths("uniform", 3, RNG(0)), TypeError, "spec"),
    ("sl-spec-typo", lambda: ss.sample_lengths(("unif", 1, 2), 3, RNG(0)), ValueError, "spec"),
    ("sl-spec-hi-lo", lambda: ss.sample_lengths(("uniform", 5, 3), 3, RNG(0)), ValueError, "spec"),
    ("sl-spec-args", lambda: ss.sample_lengths(("fixed",), 3, RNG(0)), ValueError, "spec"),
    ("sl-sigma-neg", lambda: ss.sample_lengths(("lognormal", 100, -1, 1000), 3, RNG(0)), ValueError, "sigma"),
    ("mr-n0", lambda: ss.make_requests(0, 1.0), ValueError, "n"),
    ("mr-n-huge", lambda: ss.make_requests(10 ** 11, 1.0), ValueError, "n"),
    ("mr-rate0", lambda: ss.make_requests(3, 0.0), ValueError, "rate"),
    ("mr-rate-nan", lambda: ss.make_requests(3, math.nan), ValueError, "rate"),
    ("mr-rate-neg", lambda: ss.make_requests(3, -1.0), ValueError, "rate"),
    ("mr-seed-str", lambda: ss.make_requests(3, 1.0, seed="x"), TypeError, "seed"),
    ("mr-seed-neg", lambda: ss.make_requests(3, 1.0, seed=-1), ValueError, "seed"),
    ("mr-seed-float", lambda: ss.make_requests(3, 1.0, seed=1.5), TypeError, "seed"),
    ("mr-prompt-float", lambda: ss.make_requests(3, 1.0, prompt=("fixed", 2.5)), TypeError, "prompt"),
    ("mr-output-zero", lambda: ss.make_requests(3, 1.0, output=("uniform", 0, 3)), ValueError, "output"),
    ("mr-prompt-typo", lambda: ss.make_requests(3, 1.0, prompt=("fixd", 3)), ValueError, "prompt"),
    ("mr-output-str", lambda: ss.make_requests(3, 1.0, output="fixed"), TypeError, "output"),
    # 指标
    ("sum-empty", lambda: ss.summarize([]), ValueError, "reqs"),
    ("sum-ints", lambda: ss.summarize([1, 2]), TypeError, "reqs"),
    ("sum-warmup1", lambda: ss.summarize(DONE, warmup=1.0), ValueError, "warmup"),
    ("sum-warmup-nan", lambda: ss.summarize(DONE, warmup=math.nan), ValueError, "warmup"),
    ("sum-slo-neg", lambda: ss.summarize(DONE, slo_ttft=-1), ValueError, "slo_ttft"),
    ("sum-slo-str", lambda: ss.summarize(DONE, slo_tpot="x"), TypeError, "slo_tpot"),
    ("sum-unfinished", lambda: ss.summarize(_unfinished()), ValueError, "t_finish"),
    ("occ-object", lambda: ss.occupancy([object()]), TypeError, "reqs"),
    ("occ-unfinished", lambda: ss.occupancy(_unfinished()), ValueError, "t_finish"),
    ("ta-t1-le-t0", lambda: ss.time_average([0, 1], [1, 0], 1.0, 1.0), ValueError, "t1"),
    ("ta-t0-nan", lambda: ss.time_average([0, 1], [1, 0], math.nan, 1.0), ValueError, "t0"),
    ("ta-t0-str", lambda: ss.time_average([0, 1], [1, 0], "a", 1.0), TypeError, "t0"),
    ("ta-times-decreasing", lambda: ss.time_average([2, 1, 3], [1, 2, 0], 0.0, 3.0), ValueError, "times"),
    ("ta-len-mismatch", lambda: ss.time_average([0, 1, 2], [1, 0], 0.0, 2.0), ValueError, "counts"),
    ("ta-times-nan", lambda: ss.time_average([0, math.nan], [1, 0], 0.0, 2.0), ValueError, "times"),
    ("ll-empty", lambda: ss.littles_law([]), ValueError, "reqs"),
    ("ll-t0-str", lambda: ss.littles_law(DONE, t0="a"), TypeError, "t0"),
    ("ll-t1-nan", lambda: ss.littles_law(DONE, t1=math.nan), ValueError, "t1"),
    # 模拟器
    ("st-step", lambda: ss.simulate_static(REQS, "step", 4), TypeError, "step"),
    ("st-maxbatch0", lambda: ss.simulate_static(REQS, STEP, 0), ValueError, "max_batch"),
    ("st-maxbatch-float", lambda: ss.simulate_static(REQS, STEP, 2.5), TypeError, "max_batch"),
    ("st-reserve0", lambda: ss.simulate_static(REQS, STEP, 4, kv_reserve=0), ValueError, "kv_reserve"),
    ("st-reserve-bool", lambda: ss.simulate_static(REQS, STEP, 4, kv_reserve=True), TypeError, "kv_reserve"),
    ("st-wait-neg", lambda: ss.simulate_static(REQS, STEP, 4, max_wait=-1), ValueError, "max_wait"),
    ("st-unsorted", lambda: ss.simulate_static(REQS[::-1], STEP, 4), ValueError, "reqs"),
    ("st-empty", lambda: ss.simulate_static([], STEP, 4), ValueError, "reqs"),
    ("st-int", lambda: ss.simulate_static(5, STEP, 4), TypeError, "reqs"),
    ("st-dicts", lambda: ss.simulate_static([{"rid": 0}], STEP, 4), TypeError, "reqs"),
    ("ct-chunk0", lambda: ss.simulate_continuous(REQS, STEP, 4, chunk=0), ValueError, "chunk"),
    ("ct-chunk-float", lambda: ss.simulate_continuous(REQS, STEP, 4, chunk=1.5), TypeError, "chunk"),
    ("ct-step-none", lambda: ss.simulate_continuous(REQS, None, 4), TypeError, "step"),
    ("ct-maxbatch-str", lambda: ss.simulate_continuous(REQS, STEP, "4"), TypeError, "max_batch"),
    # iteration_schedule：公开的引擎，自己查（它的包装也查，但不能只靠包装）
    ("is-arrival-nan", _sched(arrival=[0.0, math.nan]), ValueError, "arrival"),
    ("is-arrival-inf", _sched(arrival=[0.0, math.inf]), ValueError, "arrival"),
    ("is-arrival-unsorted", _sched(arrival=[1.0, 0.0]), ValueError, "arrival"),
    ("is-arrival-neg", _sched(arrival=[-1.0, 0.0]), ValueError, "arrival"),
    ("is-arrival-str", _sched(arrival="ab"), TypeError, "arrival"),
    ("is-prompt0", _sched(prompt=[0, 3]), ValueError, "prompt"),
    ("is-prompt-float", _sched(prompt=[1.5, 3]), TypeError, "prompt"),
    ("is-output-len", _sched(output=[3]), ValueError, "output"),
    ("is-maxbatch0", _sched(max_batch=0), ValueError, "max_batch"),
    ("is-reserve-short", _sched(reserve=[5, 30]), ValueError, "reserve"),
    ("is-reserve-over-cap", _sched(reserve=[CAP + 1, 30]), ValueError, "reserve"),
    ("is-chunk-no-reserve", _sched(chunk=8), ValueError, "chunk"),
    ("is-chunk0", _sched(reserve=[13, 24], chunk=0), ValueError, "chunk"),
    ("is-tlimit-nan", _sched(t_limit=math.nan), ValueError, "t_limit"),
    ("is-history-str", _sched(history="x"), TypeError, "history"),
    ("is-ids-len", _sched(ids=[7]), ValueError, "ids"),
    ("is-prompt-over-cap", _sched(prompt=[CAP + 5, 3]), ValueError, "prompt"),
    ("is-step", _sched(step="x"), TypeError, "step"),
    # 演示工具
    ("cb-bmax0", lambda: ss.crossover_batch(STEP, b_max=0), ValueError, "b_max"),
    ("cb-bmax-huge", lambda: ss.crossover_batch(STEP, b_max=10 ** 12), ValueError, "b_max"),
    ("cb-ctx-neg", lambda: ss.crossover_batch(STEP, ctx_per_seq=-1), ValueError, "ctx_per_seq"),
    ("cb-step", lambda: ss.crossover_batch(3), TypeError, "step"),
    ("mt-candidates-int", lambda: ss.min_tp(M13, A100, candidates=5), TypeError, "candidates"),
    ("mt-candidates-zero", lambda: ss.min_tp(M13, A100, candidates=[0]), ValueError, "candidates"),
    ("mt-candidates-float", lambda: ss.min_tp(M13, A100, candidates=[1.5]), TypeError, "candidates"),
    ("mt-kw-mfu", lambda: ss.min_tp(M13, A100, mfu=2), ValueError, "mfu"),
    ("os-batches-int", lambda: ss.offline_sweep(STEP, 4, 3), TypeError, "batch_sizes"),
    ("os-batches-float", lambda: ss.offline_sweep(STEP, [2.7], 3), TypeError, "batch_sizes"),
    ("os-nreq0", lambda: ss.offline_sweep(STEP, [2], 0), ValueError, "n_req"),
    ("os-nreq-huge", lambda: ss.offline_sweep(STEP, [2], 10 ** 11), ValueError, "n_req"),
    ("os-seed-str", lambda: ss.offline_sweep(STEP, [2], 3, seed="x"), TypeError, "seed"),
]

# ---------------------------------------------------------------------------
# step_bench
# ---------------------------------------------------------------------------
TINY = sb.TINY
torch.manual_seed(0)
MODEL = sb.build_model(TINY, max_pos=16)
CACHE = sb.alloc_cache(TINY, 1, 16, torch.float32, "cpu")
IDS = torch.zeros(1, 3, dtype=torch.long)
GRID = {"prefill_n": (1, 2), "prefill_len": (16, 40), "decode_batch": (1, 3), "decode_ctx": (24, 64)}  # 小网格
PTS = sb.synthetic_points(sb.MODELS, GRID,
                          {"mfu": 0.7, "mbu": 0.8, "overhead_eager_per_layer": 1e-4, "overhead_graph_per_layer": 1e-6})
CFGS = {m.name: m for m in sb.MODELS}
FIT = {"mfu": 0.7, "mbu": 0.8, "overhead_eager_per_layer": 1e-4, "overhead_graph_per_layer": 1e-6}
ROWS = sb.compare_points(PTS, CFGS, FIT)
PT = {"model": TINY.name, "kind": "decode", "batch": 2, "context": 8, "mode": "eager"}


def _pt(**kw):
    return [dict(PTS[0], **kw)]


def _odd_head():
    return lm.ModelConfig("odd", n_layers=1, d_model=12, n_heads=2, n_kv_heads=1, d_head=5, d_ff=16, vocab=11)


def _fwd(ids=IDS, cache=CACHE, pos0=0, **kw):
    return lambda: MODEL(ids, cache, pos0, **kw)


CASES_SB = [
    ("bm-cfg", lambda: sb.build_model("8B"), TypeError, "cfg"),
    ("bm-dtype-int", lambda: sb.build_model(TINY, dtype=torch.int32), TypeError, "dtype"),
    ("bm-dtype-str", lambda: sb.build_model(TINY, dtype="float32"), TypeError, "dtype"),
    ("bm-maxpos0", lambda: sb.build_model(TINY, max_pos=0), ValueError, "max_pos"),
    ("bm-maxpos-float", lambda: sb.build_model(TINY, max_pos=2.5), TypeError, "max_pos"),
    ("bm-maxpos-huge", lambda: sb.build_model(TINY, max_pos=10 ** 12), ValueError, "max_pos"),
    ("bm-seed-str", lambda: sb.build_model(TINY, seed="x"), TypeError, "seed"),
    ("bm-seed-neg", lambda: sb.build_model(TINY, seed=-1), ValueError, "seed"),
    ("bm-seed-float", lambda: sb.build_model(TINY, seed=1.5), TypeError, "seed"),
    ("bm-device-typo", lambda: sb.build_model(TINY, device="gpu"), ValueError, "device"),
    ("bm-device-int", lambda: sb.build_model(TINY, device=[0]), ValueError, "device"),
    ("bm-device-missing", lambda: sb.build_model(TINY, device="cuda:99"), ValueError, "device"),
    ("bm-huge-cfg", lambda: sb.build_model(lm.LLAMA31_405B), ValueError, "cfg"),
    ("bm-not-llama", lambda: sb.build_model(lm.GPT3_13B), ValueError, "cfg"),
    ("bm-odd-head", lambda: sb.build_model(_odd_head()), ValueError, "d_head"),
    ("ac-batch0", lambda: sb.alloc_cache(TINY, 0, 8, torch.float32, "cpu"), ValueError, "batch"),
    ("ac-maxseq0", lambda: sb.alloc_cache(TINY, 1, 0, torch.float32, "cpu"), ValueError, "max_seq"),
    ("ac-batch-float", lambda: sb.alloc_cache(TINY, 2.0, 8, torch.float32, "cpu"), TypeError, "batch"),
    ("ac-dtype-int", lambda: sb.alloc_cache(TINY, 1, 8, torch.int64, "cpu"), TypeError, "dtype"),
    ("ac-cfg", lambda: sb.alloc_cache("tiny", 1, 8, torch.float32, "cpu"), TypeError, "cfg"),
    ("ac-huge", lambda: sb.alloc_cache(lm.LLAMA31_8B, 10 ** 5, 10 ** 6, torch.float32, "cpu"), ValueError, "batch"),
    ("ac-device-typo", lambda: sb.alloc_cache(TINY, 1, 8, torch.float32, "tpu"), ValueError, "device"),
    # forward（LlamaShaped）
    ("fw-ids-float", _fwd(ids=torch.zeros(1, 3)), TypeError, "ids"),
    ("fw-ids-1d", _fwd(ids=torch.zeros(3, dtype=torch.long)), TypeError, "ids"),
    ("fw-ids-bool", _fwd(ids=torch.zeros(1, 3, dtype=torch.bool)), TypeError, "ids"),
    ("fw-ids-list", _fwd(ids=[[1, 2]]), TypeError, "ids"),
    ("fw-ids-oov", _fwd(ids=torch.full((1, 3), TINY.vocab)), ValueError, "ids"),
    ("fw-ids-neg", _fwd(ids=torch.full((1, 3), -1)), ValueError, "ids"),
    ("fw-ids-empty", _fwd(ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "ids"),
    ("fw-ids-device", _fwd(ids=torch.zeros(1, 3, dtype=torch.long, device="meta")), ValueError, "ids"),
    ("fw-cache-device", _fwd(cache=torch.zeros(2, 2, 1, 2, 16, 8, device="meta")), ValueError, "cache"),
    ("fw-cache-shape", _fwd(cache=torch.zeros(2, 2, 1, 2, 16, 7)), ValueError, "cache"),
    ("fw-cache-dtype", _fwd(cache=CACHE.double()), ValueError, "cache"),
    ("fw-cache-none", _fwd(cache=None), ValueError, "cache"),
    ("fw-cache-batch", _fwd(ids=torch.zeros(2, 1, dtype=torch.long)), ValueError, "cache"),
    ("fw-pos0-neg", _fwd(pos0=-1), ValueError, "pos0"),
    ("fw-pos0-float", _fwd(pos0=1.0), TypeError, "pos0"),
    ("fw-pos0-bool", _fwd(pos0=True), TypeError, "pos0"),
    ("fw-prefill-at-pos", _fwd(pos0=2), ValueError, "pos0"),
    ("fw-past-cache", _fwd(ids=torch.zeros(1, 1, dtype=torch.long), pos0=16), ValueError, "pos0"),
    ("fw-lastonly-str", _fwd(last_only="no"), TypeError, "last_only"),
    ("fw-lastonly-int", _fwd(last_only=0), TypeError, "last_only"),
    ("rl-ids-oov", lambda: sb.reference_logits(MODEL, torch.full((1, 2), 500)), ValueError, "ids"),
    ("rl-model", lambda: sb.reference_logits("m", IDS), TypeError, "model"),
    ("rl-too-long", lambda: sb.reference_logits(MODEL, torch.zeros(1, 17, dtype=torch.long)), ValueError, "ids"),
    ("rl-ids-float", lambda: sb.reference_logits(MODEL, torch.zeros(1, 2)), TypeError, "ids"),
    # 网格与点
    ("pp-models-str", lambda: sb.plan_points("x", GRID), TypeError, "models"),
    ("pp-models-item", lambda: sb.plan_points([TINY, "x"], GRID), TypeError, "models"),
    ("pp-models-empty", lambda: sb.plan_points([], GRID), ValueError, "models"),
    ("pp-grid-key", lambda: sb.plan_points([TINY], {"prefill_n": (1,)}), ValueError, "grid"),
    ("pp-grid-str", lambda: sb.plan_points([TINY], "GRID"), ValueError, "grid"),
    ("pp-grid-int", lambda: sb.plan_points([TINY], dict(GRID, prefill_n=4)), TypeError, "grid"),
    ("pp-grid-zero", lambda: sb.plan_points([TINY], dict(GRID, decode_batch=(0,))), ValueError, "grid"),
    ("pp-grid-float", lambda: sb.plan_points([TINY], dict(GRID, prefill_len=(2.5,))), TypeError, "grid"),
    ("pp-modes-typo", lambda: sb.plan_points([TINY], GRID, modes=("eagr",)), ValueError, "modes"),
    ("pp-modes-str", lambda: sb.plan_points([TINY], GRID, modes="eager"), TypeError, "modes"),
    ("pp-extra-short", lambda: sb.plan_points([TINY], GRID, extra=[("tiny", 1)]), ValueError, "extra"),
    ("pp-extra-zero", lambda: sb.plan_points([TINY], GRID, extra=[("tiny", 0, 5)]), ValueError, "extra"),
    ("ps-str", lambda: sb.point_shape("x"), TypeError, "p"),
    ("ps-kind-typo", lambda: sb.point_shape(dict(PT, kind="prefil")), ValueError, "kind"),
    ("ps-missing", lambda: sb.point_shape({"kind": "prefill", "prompt_len": 4}), TypeError, "n_prompts"),
    ("ps-batch0", lambda: sb.point_shape(dict(PT, batch=0)), ValueError, "batch"),
    ("ps-context-neg", lambda: sb.point_shape(dict(PT, context=-1)), ValueError, "context"),
    ("ps-batch-float", lambda: sb.point_shape(dict(PT, batch=1.5)), TypeError, "batch"),
    ("pb-cfg", lambda: sb.point_bytes("x", PT), TypeError, "cfg"),
    ("pb-elem0", lambda: sb.point_bytes(TINY, PT, elem=0), ValueError, "elem"),
    ("pb-elem-str", lambda: sb.point_bytes(TINY, PT, elem="2"), TypeError, "elem"),
    ("fc-cfg", lambda: sb.fits_chip("x", PT), TypeError, "cfg"),
    ("fc-chip", lambda: sb.fits_chip(TINY, PT, chip="h200"), TypeError, "chip"),
    # 拟合
    ("it-points-str", lambda: sb.ideal_times("x", CFGS), TypeError, "points"),
    ("it-points-int", lambda: sb.ideal_times([5], CFGS), TypeError, "points"),
    ("it-model", lambda: sb.ideal_times(_pt(model="70B"), CFGS), ValueError, "model"),
    ("it-kind", lambda: sb.ideal_times(_pt(kind="pre"), CFGS), ValueError, "kind"),
    ("it-mode", lambda: sb.ideal_times(_pt(mode="fast"), CFGS), ValueError, "mode"),
    ("it-configs", lambda: sb.ideal_times(PTS, list(CFGS)), TypeError, "configs"),
    ("it-shape0", lambda: sb.ideal_times(_pt(kind="prefill", n_prompts=0, prompt_len=4), CFGS), ValueError,
     "n_prompts"),
    ("so-mode", lambda: sb.step_overhead(FIT, "fast", TINY), ValueError, "mode"),
    ("so-params-int", lambda: sb.step_overhead(5, "eager", TINY), TypeError, "params"),
    ("so-params-none-key", lambda: sb.step_overhead({"mfu": 0.5}, "eager", TINY), ValueError, "params"),
    ("so-params-both", lambda: sb.step_overhead(dict(FIT, overhead_per_step=1e-3), "eager", TINY), ValueError,
     "params"),
    ("so-overhead-str", lambda: sb.step_overhead({"overhead_per_step": "x"}, "eager", TINY), TypeError,
     "overhead_per_step"),
    ("so-overhead-neg", lambda: sb.step_overhead(dict(FIT, overhead_eager_per_layer=-1), "eager", TINY), ValueError,
     "overhead_eager_per_layer"),
    ("so-cfg", lambda: sb.step_overhead(FIT, "eager", "tiny"), TypeError, "cfg"),
    ("pr-mfu0", lambda: sb.predict(np.array([1.0]), np.array([1.0]), 0.0, 0.5, 0.0), ValueError, "mfu"),
    ("pr-mfu-neg", lambda: sb.predict(np.array([1.0]), np.array([1.0]), -0.5, 0.5, 0.0), ValueError, "mfu"),
    ("pr-mbu-big", lambda: sb.predict(np.array([1.0]), np.array([1.0]), 0.5, 2.0, 0.0), ValueError, "mbu"),
    ("pr-tc-nan", lambda: sb.predict(np.array([math.nan]), np.array([1.0]), 0.5, 0.5, 0.0), ValueError, "tc"),
    ("pr-tc-neg", lambda: sb.predict(np.array([-1.0]), np.array([1.0]), 0.5, 0.5, 0.0), ValueError, "tc"),
    ("pr-tm-inf", lambda: sb.predict(np.array([1.0]), np.array([math.inf]), 0.5, 0.5, 0.0), ValueError, "tm"),
    ("pr-overhead-neg", lambda: sb.predict(np.array([1.0]), np.array([1.0]), 0.5, 0.5, -1.0), ValueError, "overhead"),
    ("pr-tc-str", lambda: sb.predict(np.array(["a"]), np.array([1.0]), 0.5, 0.5, 0.0), TypeError, "tc"),
    ("ll-pred0", lambda: sb.log_loss(np.array([0.0]), np.array([1.0])), ValueError, "pred"),
    ("ll-meas-neg", lambda: sb.log_loss(np.array([1.0]), np.array([-1.0])), ValueError, "meas"),
    ("ll-pred-nan", lambda: sb.log_loss(np.array([math.nan]), np.array([1.0])), ValueError, "pred"),
    ("ll-meas-str", lambda: sb.log_loss(np.array([1.0]), "x"), TypeError, "meas"),
    ("fl-mfu-big", lambda: sb.fit_loss(PTS, CFGS, dict(FIT, mfu=2.0)), ValueError, "mfu"),
    ("fl-params-empty", lambda: sb.fit_loss(PTS, CFGS, {}), ValueError, "mfu"),
    ("fl-points-empty", lambda: sb.fit_loss([], CFGS, FIT), ValueError, "points"),
    ("fl-seconds0", lambda: sb.fit_loss(_pt(seconds=0.0), CFGS, FIT), ValueError, "seconds"),
    ("fl-seconds-nan", lambda: sb.fit_loss(_pt(seconds=math.nan), CFGS, FIT), ValueError, "seconds"),
    ("fs-all-graph", lambda: sb.fit_step_params([p for p in PTS if p["mode"] == "graph"], CFGS), ValueError, "eager"),
    ("fs-empty", lambda: sb.fit_step_params([], CFGS), ValueError, "points"),
    ("fs-str", lambda: sb.fit_step_params("points", CFGS), TypeError, "points"),
    ("fs-model", lambda: sb.fit_step_params(_pt(model="x"), CFGS), ValueError, "model"),
    ("nl-rel0", lambda: sb.nudged_losses(PTS, CFGS, FIT, rel=0.0), ValueError, "rel"),
    ("nl-rel-nan", lambda: sb.nudged_losses(PTS, CFGS, FIT, rel=math.nan), ValueError, "rel"),
    ("nl-dirs0", lambda: sb.nudged_losses(PTS, CFGS, FIT, n_dirs=0), ValueError, "n_dirs"),
    ("nl-dirs-huge", lambda: sb.nudged_losses(PTS, CFGS, FIT, n_dirs=10 ** 9), ValueError, "n_dirs"),
    ("nl-seed-str", lambda: sb.nudged_losses(PTS, CFGS, FIT, seed="x"), TypeError, "seed"),
    ("nl-seed-neg", lambda: sb.nudged_losses(PTS, CFGS, FIT, seed=-1), ValueError, "seed"),
    ("cp-mfu-str", lambda: sb.compare_points(PTS, CFGS, dict(FIT, mfu="x")), TypeError, "mfu"),
    ("cp-params-none", lambda: sb.compare_points(PTS, CFGS, None), TypeError, "params"),
    # 行、说明、常数
    ("gr-missing", lambda: sb.group_rows([{"model": 1}]), ValueError, "rows"),
    ("gr-int", lambda: sb.group_rows(5), TypeError, "rows"),
    ("es-empty", lambda: sb.error_summary([]), ValueError, "rows"),
    ("es-ratio-neg", lambda: sb.error_summary([dict(ROWS[0], ratio=-1.0)]), ValueError, "ratio"),
    ("es-ratio-nan", lambda: sb.error_summary([dict(ROWS[0], ratio=math.nan)]), ValueError, "ratio"),
    ("wr-n-neg", lambda: sb.worst_rows(ROWS, -1), ValueError, "n"),
    ("wr-n-float", lambda: sb.worst_rows(ROWS, 1.5), TypeError, "n"),
    ("wr-ratio0", lambda: sb.worst_rows([dict(ROWS[0], ratio=0.0)], 1), ValueError, "ratio"),
    ("wr-str", lambda: sb.worst_rows("rows", 1), TypeError, "rows"),
    ("ep-row-empty", lambda: sb.explain_point({}, sb.MODELS[0]), ValueError, "row"),
    ("ep-cfg", lambda: sb.explain_point(ROWS[0], "1B"), TypeError, "cfg"),
    ("ep-kernels0", lambda: sb.explain_point(ROWS[0], CFGS[ROWS[0]["model"]], kernels_per_step=0), ValueError,
     "kernels_per_step"),
    ("ep-kernels-str", lambda: sb.explain_point(ROWS[0], CFGS[ROWS[0]["model"]], kernels_per_step="many"), TypeError,
     "kernels_per_step"),
    ("ep-peers-bad", lambda: sb.explain_point(ROWS[0], CFGS[ROWS[0]["model"]], peers=[{"x": 1}]), ValueError, "peers"),
    ("ct-fit-int", lambda: sb.constant_text(5, {}), TypeError, "fit"),
    ("ct-fit-missing", lambda: sb.constant_text({"mbu": 0.5}, {}), ValueError, "fit"),
    ("ct-meta-none", lambda: sb.constant_text(FIT, None), TypeError, "meta"),
    # 合成结果、cache 等价
    ("sp-noise-neg", lambda: sb.synthetic_points(sb.MODELS, GRID, FIT, noise=-1), ValueError, "noise"),
    ("sp-noise-nan", lambda: sb.synthetic_points(sb.MODELS, GRID, FIT, noise=math.nan), ValueError, "noise"),
    ("sp-seed-str", lambda: sb.synthetic_points(sb.MODELS, GRID, FIT, seed="x"), TypeError, "seed"),
    ("sp-seed-neg", lambda: sb.synthetic_points(sb.MODELS, GRID, FIT, seed=-1), ValueError, "seed"),
    ("sp-mfu0", lambda: sb.synthetic_points(sb.MODELS, GRID, dict(FIT, mfu=0.0)), ValueError, "mfu"),
    ("sp-models-str", lambda: sb.synthetic_points("x", GRID, FIT), TypeError, "models"),
    ("sr-models-single", lambda: sb.synthetic_results(FIT, models=TINY), TypeError, "models"),
    ("ce-ndecode0", lambda: sb.check_cache_equivalence(TINY, 1, 3, 0), ValueError, "n_decode"),
    ("ce-prompt0", lambda: sb.check_cache_equivalence(TINY, 1, 0, 2), ValueError, "prompt"),
    ("ce-batch0", lambda: sb.check_cache_equivalence(TINY, 0, 3, 2), ValueError, "batch"),
    ("ce-seed-neg", lambda: sb.check_cache_equivalence(TINY, 1, 3, 2, seed=-1), ValueError, "seed"),
]


def test_case_counts():
    """每个实验模块至少 100 种坏输入（编号不重复由 params 在收集时查）。"""
    for cases in (CASES_SS, CASES_SB):
        assert len(cases) >= 100


@params([Case(*c) for c in CASES_SS + CASES_SB])
def test_bad_input_is_a_clear_error(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


# ---------------------------------------------------------------------------
# 合法的边界值：照常运行，答案对得上参考
# ---------------------------------------------------------------------------
def _roofline(flops, nbytes, step=STEP):
    """独立的 roofline：max(FLOPs ÷ (峰值·mfu), 字节 ÷ (带宽·mbu)) + 开销（tp = 1）。"""
    peak = A100.peak_flops("bf16")
    return max(flops / (peak * step.mfu), nbytes / (A100.mem_bw * step.mbu)) + step.overhead


def test_capacity_edges_are_priced():
    """正好等于 KV 容量的 prefill / decode / mixed 照常给时间，并和手算的 roofline 一致；多 1 个就是 CapacityError。"""
    w = M13.matmul_params() * 2.0
    kv = STEP.kv_bytes_per_token
    want = _roofline(CAP * 2 * M13.matmul_params() + A1 * CAP * (CAP + 1) / 2, w + CAP * kv)
    assert STEP.prefill_time([CAP]) == pytest.approx(want, rel=1e-12)
    assert STEP.mixed_time(0, 0, CAP, A1 * CAP * (CAP + 1) / 2) == pytest.approx(want, rel=1e-12)
    assert STEP.decode_time(1, CAP) == pytest.approx(_roofline(2 * M13.matmul_params() + A1 * CAP, w + (CAP + 1) * kv),
                                                     rel=1e-12)
    with pytest.raises(CapErr):
        STEP.decode_time(1, CAP + 1)


def test_legal_edges_run():
    assert ss.sample_lengths(("fixed", 3), 0, RNG(0)).shape == (0,)
    rs = ss.make_requests(1, math.inf, seed=np.int64(3))
    assert rs[0].arrival == 0.0 and isinstance(rs[0].prompt, int)
    empty = ss.iteration_schedule([], [], [], STEP, 1)
    assert empty["done"] == 0 and empty["iters"] == 0
    # 阶梯函数 1 (0..1)、3 (1..2)：[0, 2] 上的平均 = 2
    assert ss.time_average(np.array([0.0, 1.0, 2.0]), np.array([1, 3, 0]), 0.0, 2.0) == pytest.approx(2.0)
    assert ss.crossover_batch(STEP, b_max=1) in (None, 1)


def test_forward_legal_edges_match_reference():
    """token 0 和 vocab − 1、int32 的 ids、长度正好等于 max_pos：和朴素参考一致。"""
    ids = torch.tensor([[0, TINY.vocab - 1] * 8], dtype=torch.int32)                 # [1, 16] = max_pos
    cache = sb.alloc_cache(TINY, 1, 16, torch.float32, "cpu")
    with torch.no_grad():
        got = MODEL(ids, cache, 0, last_only=False)
    ref = sb.reference_logits(MODEL, ids.long())
    assert float((got - ref).abs().max()) < 1e-4


# ---------------------------------------------------------------------------
# 调度器的守恒律（Hypothesis）
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=15)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(1, 300), st.integers(1, 20)), min_size=1, max_size=12),
       st.integers(1, 6), st.sampled_from([None, 16, 64]))
def test_schedule_conserves_requests_and_tokens(reqs, max_batch, chunk):
    """每个请求恰好完成一次、恰好产出 output 个 token；decode 的次数 = Σ (output − 1)；KV 从不超过容量。"""
    reqs.sort()
    arr, P, O = [r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs]
    hist = []
    run = ss.iteration_schedule(arr, P, O, STEP, max_batch, reserve=[p + o for p, o in zip(P, O)], chunk=chunk,
                                history=hist)
    assert run["done"] == len(reqs) and not run["deadlock"]
    assert [len(t) for t in run["token_times"]] == O
    assert sum(len(h["decode"]) for h in hist) == sum(o - 1 for o in O)
    assert run["peak_used"] <= run["peak_reserved"] <= CAP
    assert sorted(run["admit_order"]) == list(range(len(reqs)))
