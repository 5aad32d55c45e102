"""第 6 讲 decode_lab 的坏输入：每个公开入口的每一种坏值都得到 TypeError / ValueError（CapacityError 是 ValueError
的子类），消息里写出调用者传的那个参数名；合法的边界值照常运行、答案对得上参考；调度守恒请求和 token。
CASES 是 (编号, 调用, 异常类型, 消息里必须有的文字)。投机采样的精确性在 test_lecture06.py 里，这里不重复。"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, check_case, params
from labload import load_lab

dl = load_lab("lecture06", "decode_lab")
tl = load_lab("lecture02", "transformer_lab")
lm = load_lab("lecture01", "llm_math")

TGT, DRF = dl.tiny_pair()
V = TGT.vocab
NG = dl.NGramLM.fit([np.arange(V), np.arange(V)[::-1]], V)
STEP = dl.StepModel(dl.GPT3_13B, dl.A100_40G)
CHIP, T8, D1 = dl.A100_40G, dl.LLAMA31_8B, dl.LLAMA32_1B
RNG = np.random.default_rng
P2 = np.array([0.25, 0.75])
Q2 = np.array([0.5, 0.5])
CapErr = lm.CapacityError


def _reqs(n=4):
    return dl.orca_workload(n, 5.0, seed=2, prompt_range=(8, 32), gen_range=(1, 6))


def _finished():
    rs = _reqs()
    dl.run_iteration_level(rs, STEP, 4)
    return rs


def _cache(batch=1, max_len=None):
    return tl.KVCache(TGT.cfg, batch, max_len=max_len)


def _spec(**kw):
    args = dict(target=TGT, draft=DRF, prompt=[1, 2], n_new=4, gamma=2, temperature=1.0, rng=RNG(0))
    args.update(kw)
    return lambda: dl.speculative_generate(**args)


def _batch(**kw):
    args = dict(target=TGT, draft=NG, prompt=[1, 2], n_out=2, gamma=2, temperature=1.0, n_samples=4, rng=RNG(0))
    args.update(kw)
    return lambda: dl.spec_sample_batch(**args)


CASES = [
    # Req 与负载
    ("req-prompt0", lambda: dl.Req(0, 0.0, 0, 1, 1), ValueError, "prompt"),
    ("req-maxgen-lt-output", lambda: dl.Req(0, 0.0, 5, 2, 1), ValueError, "max_gen"),
    ("req-arrival-nan", lambda: dl.Req(0, math.nan, 5, 1, 1), ValueError, "arrival"),
    ("req-rid-str", lambda: dl.Req("a", 0.0, 5, 1, 1), TypeError, "rid"),
    ("req-prompt-float", lambda: dl.Req(0, 0.0, 1.5, 1, 1), TypeError, "prompt"),
    ("ow-n0", lambda: dl.orca_workload(0, 1.0), ValueError, "n"),
    ("ow-n-huge", lambda: dl.orca_workload(10 ** 11, 1.0), ValueError, "n"),
    ("ow-rate0", lambda: dl.orca_workload(3, 0.0), ValueError, "rate"),
    ("ow-rate-inf", lambda: dl.orca_workload(3, math.inf), ValueError, "rate"),
    ("ow-seed-str", lambda: dl.orca_workload(3, 1.0, seed="x"), TypeError, "seed"),
    ("ow-seed-neg", lambda: dl.orca_workload(3, 1.0, seed=-1), ValueError, "seed"),
    ("ow-prange-order", lambda: dl.orca_workload(3, 1.0, prompt_range=(5, 3)), ValueError, "prompt_range"),
    ("ow-prange-int", lambda: dl.orca_workload(3, 1.0, prompt_range=5), TypeError, "prompt_range"),
    ("ow-grange-zero", lambda: dl.orca_workload(3, 1.0, gen_range=(0, 3)), ValueError, "gen_range"),
    ("ow-maxgen0", lambda: dl.orca_workload(3, 1.0, max_gen=0), ValueError, "max_gen"),
    ("ow-maxgen-float", lambda: dl.orca_workload(3, 1.0, max_gen=2.5), TypeError, "max_gen"),
    # 调度
    ("rr-maxbs0", lambda: dl.run_request_level(_reqs(), STEP, 0), ValueError, "max_bs"),
    ("rr-step", lambda: dl.run_request_level(_reqs(), "step", 4), TypeError, "step"),
    ("rr-maxseq0", lambda: dl.run_request_level(_reqs(), STEP, 4, max_seq=0), ValueError, "max_seq"),
    ("rr-unsorted", lambda: dl.run_request_level(_reqs()[::-1], STEP, 4), ValueError, "reqs"),
    ("rr-ints", lambda: dl.run_request_level([1], STEP, 4), TypeError, "reqs"),
    ("rr-too-long", lambda: dl.run_request_level(_reqs(), STEP, 4, max_seq=10), ValueError, "max_seq"),
    ("rr-history-str", lambda: dl.run_request_level(_reqs(), STEP, 4, history="x"), TypeError, "history"),
    ("rr-int", lambda: dl.run_request_level(5, STEP, 4), TypeError, "reqs"),
    ("ri-reserve-typo", lambda: dl.run_iteration_level(_reqs(), STEP, 4, reserve="max-gen"), ValueError, "reserve"),
    ("ri-tlimit-nan", lambda: dl.run_iteration_level(_reqs(), STEP, 4, t_limit=math.nan), ValueError, "t_limit"),
    ("ri-tlimit-str", lambda: dl.run_iteration_level(_reqs(), STEP, 4, t_limit="1"), TypeError, "t_limit"),
    ("ri-maxbs-float", lambda: dl.run_iteration_level(_reqs(), STEP, 1.5), TypeError, "max_bs"),
    ("ri-step-none", lambda: dl.run_iteration_level(_reqs(), None, 4), TypeError, "step"),
    ("ri-history-int", lambda: dl.run_iteration_level(_reqs(), STEP, 4, history=5), TypeError, "history"),
    ("ri-never-fits", lambda: dl.run_iteration_level([dl.Req(0, 0.0, 10 ** 7, 1, 1)], STEP, 4), ValueError,
     "reserve"),
    ("lt-warmup1", lambda: dl.latency_throughput(_finished(), warmup=1.0), ValueError, "warmup"),
    ("lt-warmup-neg", lambda: dl.latency_throughput(_finished(), warmup=-0.1), ValueError, "warmup"),
    ("lt-warmup-str", lambda: dl.latency_throughput(_finished(), warmup="x"), TypeError, "warmup"),
    ("lt-ints", lambda: dl.latency_throughput([1]), TypeError, "reqs"),
    ("lt-unfinished", lambda: dl.latency_throughput(_reqs()), ValueError, "reqs"),
    # 选择性批处理
    ("rf-empty", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [], []), ValueError, "chunks"),
    ("rf-float-tokens", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[1.5]], [_cache()]), TypeError, "chunks"),
    ("rf-oov", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[V]], [_cache()]), ValueError, "chunks"),
    ("rf-cache-object", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[1]], [object()]), TypeError, "caches"),
    ("rf-len-mismatch", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[1], [2]], [_cache()]), ValueError, "chunks"),
    ("rf-cache-batch2", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[1]], [_cache(2)]), ValueError, "caches"),
    ("rf-overflow", lambda: dl.ragged_forward(TGT.params, TGT.cfg, [[1, 2, 3]], [_cache(1, 2)]), ValueError, "caches"),
    ("rf-chunks-int", lambda: dl.ragged_forward(TGT.params, TGT.cfg, 5, [_cache()]), TypeError, "chunks"),
    # adjust、prob_tol、概率对
    ("ad-empty", lambda: dl.adjust([]), ValueError, "logits"),
    ("ad-nan", lambda: dl.adjust([1.0, math.nan]), ValueError, "logits"),
    ("ad-all-neginf", lambda: dl.adjust([-math.inf, -math.inf]), ValueError, "logits"),
    ("ad-str", lambda: dl.adjust(["1", "2"]), TypeError, "logits"),
    ("ad-bool", lambda: dl.adjust([True, False]), TypeError, "logits"),
    ("ad-complex", lambda: dl.adjust([1j, 2]), TypeError, "logits"),
    ("ad-temp-neg", lambda: dl.adjust([1.0, 2.0], temperature=-1), ValueError, "temperature"),
    ("ad-temp-nan", lambda: dl.adjust([1.0, 2.0], temperature=math.nan), ValueError, "temperature"),
    ("ad-temp-str", lambda: dl.adjust([1.0, 2.0], temperature="1"), TypeError, "temperature"),
    ("ad-topk0", lambda: dl.adjust([1.0, 2.0], top_k=0), ValueError, "top_k"),
    ("ad-topk-big", lambda: dl.adjust([1.0, 2.0], top_k=3), ValueError, "top_k"),
    ("ad-topk-float", lambda: dl.adjust([1.0, 2.0], top_k=1.5), TypeError, "top_k"),
    ("pt-dtype-str", lambda: dl.prob_tol("foo", 3), TypeError, "dtype"),
    ("pt-dtype-unicode", lambda: dl.prob_tol(str, 3), TypeError, "dtype"),
    ("pt-half", lambda: dl.prob_tol(np.float16, 3), ValueError, "概率表"),
    ("pt-n-neg", lambda: dl.prob_tol(np.float32, -1), ValueError, "n"),
    ("pt-n-float", lambda: dl.prob_tol(np.float32, 1.5), TypeError, "n"),
    ("rs-p-unnormalised", lambda: dl.residual([0.5, 0.6], Q2), ValueError, "p"),
    ("rs-q-negative", lambda: dl.residual(P2, [-0.5, 1.5]), ValueError, "q"),
    ("rs-shape", lambda: dl.residual(P2, [1.0]), ValueError, "p"),
    ("rs-p-str", lambda: dl.residual(["0.25", "0.75"], Q2), TypeError, "p"),
    ("rs-p-nan", lambda: dl.residual([math.nan, 1.0], Q2), ValueError, "p"),
    ("rs-scalar", lambda: dl.residual(1.0, 1.0), ValueError, "p"),
    ("so-q-unnormalised", lambda: dl.spec_output_dist(P2, [0.5, 0.6]), ValueError, "q"),
    ("so-q-zero", lambda: dl.spec_output_dist(P2, [0.0, 0.0]), ValueError, "q"),
    ("vo-variant-typo", lambda: dl.variant_output_dist(P2, Q2, "corect"), ValueError, "variant"),
    ("sr-rng-int", lambda: dl.sample_rows([[0.5, 0.5]], 0), TypeError, "rng"),
    ("sr-rng-legacy", lambda: dl.sample_rows([[0.5, 0.5]], np.random.RandomState(0)), TypeError, "rng"),
    ("sr-1d", lambda: dl.sample_rows([0.5, 0.5], RNG(0)), ValueError, "probs"),
    ("sr-negative", lambda: dl.sample_rows([[-0.5, 1.5]], RNG(0)), ValueError, "probs"),
    ("sr-zero-row", lambda: dl.sample_rows([[0.0, 0.0]], RNG(0)), ValueError, "probs"),
    ("sr-str", lambda: dl.sample_rows([["0.5", "0.5"]], RNG(0)), TypeError, "probs"),
    # TransformerLM
    ("tl-logits-float", lambda: TGT.logits([1.7, 2.2], TGT.new_cache()), TypeError, "tokens"),
    ("tl-logits-oov", lambda: TGT.logits([V], TGT.new_cache()), ValueError, "tokens"),
    ("tl-logits-empty", lambda: TGT.logits([], TGT.new_cache()), ValueError, "tokens"),
    ("tl-full-neg", lambda: TGT.full_logits([[-1]]), ValueError, "tokens2d"),
    ("tl-full-float", lambda: TGT.full_logits([[1.5]]), TypeError, "tokens2d"),
    ("tl-full-1d", lambda: TGT.full_logits([1, 2]), ValueError, "tokens2d"),
    ("tl-full-huge", lambda: TGT.full_logits(np.broadcast_to(np.zeros((1, 90), np.int64), (10 ** 6, 90))),
     ValueError, "tokens2d"),
    ("tl-sample-nnew0", lambda: TGT.sample([1], 1, 0, 1.0, RNG(0)), ValueError, "n_new"),
    ("tl-sample-too-long", lambda: TGT.sample([1, 2], 1, 200, 1.0, RNG(0)), ValueError, "n_new"),
    ("tl-sample-rng", lambda: TGT.sample([1], 1, 2, 1.0, 1), TypeError, "rng"),
    ("tl-sample-nseq0", lambda: TGT.sample([1], 0, 2, 1.0, RNG(0)), ValueError, "n_seq"),
    ("tl-sample-nseq-huge", lambda: TGT.sample([1], 10 ** 7, 90, 1.0, RNG(0)), ValueError, "n_seq"),
    ("tl-sample-prompt2d", lambda: TGT.sample([[1], [2]], 3, 2, 1.0, RNG(0)), ValueError, "prompt"),
    ("tl-rollback-neg", lambda: TGT.rollback(TGT.new_cache(), -1), ValueError, "length"),
    ("tl-rollback-longer", lambda: TGT.rollback(TGT.new_cache(), 5), ValueError, "5"),
    ("tl-params", lambda: dl.TransformerLM({}, TGT.cfg), TypeError, "params"),
    ("tl-name", lambda: dl.TransformerLM(TGT.params, TGT.cfg, name=5), TypeError, "name"),
    # NGramLM
    ("ng-table-shape", lambda: dl.NGramLM([[0.1], [0.2]]), ValueError, "table"),
    ("ng-table-str", lambda: dl.NGramLM([["a"]]), TypeError, "table"),
    ("ng-table-nan", lambda: dl.NGramLM([[math.nan]]), ValueError, "table"),
    ("ng-fit-vocab0", lambda: dl.NGramLM.fit([[1, 2]], 0), ValueError, "vocab"),
    ("ng-fit-vocab-huge", lambda: dl.NGramLM.fit([[1, 2]], 10 ** 6), ValueError, "vocab"),
    ("ng-fit-smoothing0", lambda: dl.NGramLM.fit([[1, 2]], 3, smoothing=0.0), ValueError, "smoothing"),
    ("ng-fit-oov", lambda: dl.NGramLM.fit([[1, 5]], 3), ValueError, "seqs"),
    ("ng-fit-seqs-int", lambda: dl.NGramLM.fit(5, 3), TypeError, "seqs"),
    ("ng-full-neg", lambda: NG.full_logits([[-1]]), ValueError, "tokens2d"),
    ("ng-full-float", lambda: NG.full_logits([[0.5]]), TypeError, "tokens2d"),
    ("ng-logits-cache", lambda: NG.logits([1], None), TypeError, "cache"),
    ("ng-logits-float", lambda: NG.logits([1.7], NG.new_cache()), TypeError, "tokens"),
    ("ng-sample-rng", lambda: NG.sample([1], 1, 2, 1.0, None), TypeError, "rng"),
    # 投机解码
    ("sg-gamma0", _spec(gamma=0), ValueError, "gamma"),
    ("sg-gamma-huge", _spec(draft=NG, target=NG, gamma=10 ** 10), ValueError, "gamma"),
    ("sg-nnew-neg", _spec(n_new=-1), ValueError, "n_new"),
    ("sg-rng", _spec(rng=0), TypeError, "rng"),
    ("sg-temp-neg", _spec(temperature=-1), ValueError, "temperature"),
    ("sg-vocab", _spec(draft=dl.NGramLM.fit([[1, 2]], 5)), ValueError, "词表"),
    ("sg-target", _spec(target="x"), TypeError, "target"),
    ("sg-prompt-empty", _spec(prompt=[]), ValueError, "prompt"),
    ("sg-too-long", _spec(n_new=200), ValueError, "n_new"),
    ("ag-nnew-float", lambda: dl.autoregressive_generate(TGT, [1], 1.5, 1.0, RNG(0)), TypeError, "n_new"),
    ("ag-model", lambda: dl.autoregressive_generate(None, [1], 2, 1.0, RNG(0)), TypeError, "model"),
    ("ag-too-long", lambda: dl.autoregressive_generate(TGT, [1], 200, 1.0, RNG(0)), ValueError, "n_new"),
    ("ag-rng", lambda: dl.autoregressive_generate(TGT, [1], 2, 1.0, "x"), TypeError, "rng"),
    ("sb-variant", _batch(variant="resample"), ValueError, "variant"),
    ("sb-nsamples0", _batch(n_samples=0), ValueError, "n_samples"),
    ("sb-nsamples-huge", _batch(n_samples=10 ** 9), ValueError, "n_samples"),
    ("sb-gamma-huge", _batch(gamma=10 ** 10), ValueError, "gamma"),
    ("sb-too-long", _batch(n_out=200), ValueError, "n_out"),
    ("sb-rng", _batch(rng=np.random.RandomState(0)), TypeError, "rng"),
    # 精确分布、卡方检验
    ("ec-nout0", lambda: dl.exact_continuation_dist(TGT, [1], 0, 1.0), ValueError, "n_out"),
    ("ec-nout-huge", lambda: dl.exact_continuation_dist(TGT, [1], 10 ** 9, 1.0), ValueError, "n_out"),
    ("ec-nout5", lambda: dl.exact_continuation_dist(TGT, [1], 5, 1.0), ValueError, "n_out"),
    ("ec-temp-nan", lambda: dl.exact_continuation_dist(TGT, [1], 1, math.nan), ValueError, "temperature"),
    ("ec-model", lambda: dl.exact_continuation_dist("m", [1], 1, 1.0), TypeError, "model"),
    ("cs-x-neg", lambda: dl.chi2_sf(-1.0, 3), ValueError, "x"),
    ("cs-dof0", lambda: dl.chi2_sf(1.0, 0), ValueError, "dof"),
    ("cs-x-nan", lambda: dl.chi2_sf(math.nan, 3), ValueError, "x"),
    ("cs-dof-float", lambda: dl.chi2_sf(1.0, 1.5), TypeError, "dof"),
    ("gof-unnormalised", lambda: dl.chi_square_gof([[0]] * 10, [5.0, 5.0]), ValueError, "probs"),
    ("gof-negative", lambda: dl.chi_square_gof([[0]] * 10, [-0.5, 1.5]), ValueError, "probs"),
    ("gof-nan", lambda: dl.chi_square_gof([[0]] * 10, [math.nan, 1.0]), ValueError, "probs"),
    ("gof-samples-float", lambda: dl.chi_square_gof([[0.7]] * 10, [0.5, 0.5]), TypeError, "samples"),
    ("gof-samples-1d", lambda: dl.chi_square_gof([0, 1], [0.5, 0.5]), ValueError, "samples"),
    ("gof-minexp0", lambda: dl.chi_square_gof([[0]] * 10, [0.5, 0.5], min_expected=0), ValueError, "min_expected"),
    ("gof-minexp-nan", lambda: dl.chi_square_gof([[0]] * 10, [0.5, 0.5], min_expected=math.nan), ValueError,
     "min_expected"),
    ("gof-probs-2d", lambda: dl.chi_square_gof([[0]] * 10, [[0.5, 0.5]]), ValueError, "probs"),
    ("gof-probs-len", lambda: dl.chi_square_gof([[0, 1]] * 10, [0.5, 0.5, 0.0]), ValueError, "probs"),
    # Leviathan 的公式
    ("et-alpha-big", lambda: dl.expected_tokens(1.5, 3), ValueError, "alpha"),
    ("et-alpha-nan", lambda: dl.expected_tokens(math.nan, 3), ValueError, "alpha"),
    ("et-alpha-str", lambda: dl.expected_tokens("0.5", 3), TypeError, "alpha"),
    ("et-gamma-neg", lambda: dl.expected_tokens(0.5, -1), ValueError, "gamma"),
    ("et-gamma-huge", lambda: dl.expected_tokens(0.5, 10 ** 10), ValueError, "gamma"),
    ("et-gamma-float", lambda: dl.expected_tokens(0.5, 2.5), TypeError, "gamma"),
    ("et-alpha-array-huge", lambda: dl.expected_tokens(np.broadcast_to(0.5, (10 ** 7,)), 4000), ValueError, "alpha"),
    ("ws-c-neg", lambda: dl.walltime_speedup(0.5, 3, -1), ValueError, "c"),
    ("ws-c-str", lambda: dl.walltime_speedup(0.5, 3, "0.1"), TypeError, "c"),
    ("ws-c-inf", lambda: dl.walltime_speedup(0.5, 3, math.inf), ValueError, "c"),
    ("of-chat-nan", lambda: dl.ops_factor(0.5, 3, math.nan), ValueError, "c_hat"),
    ("of-gamma-bool", lambda: dl.ops_factor(0.5, True, 0.1), TypeError, "gamma"),
    ("bg-gmax0", lambda: dl.best_gamma(0.5, 0.1, gamma_max=0), ValueError, "gamma_max"),
    ("bg-gmax-huge", lambda: dl.best_gamma(0.5, 0.1, gamma_max=10 ** 7), ValueError, "gamma_max"),
    ("bg-no-optimum", lambda: dl.best_gamma(1.0, 0.0), ValueError, "alpha"),
    ("bg-c-nan", lambda: dl.best_gamma(0.5, math.nan), ValueError, "c"),
    # 硬件视角
    ("vt-batch0", lambda: dl.verify_time(T8, CHIP, 0, 10, 1), ValueError, "batch"),
    ("vt-ntok0", lambda: dl.verify_time(T8, CHIP, 1, 10, 0), ValueError, "n_tokens"),
    ("vt-ctx-neg", lambda: dl.verify_time(T8, CHIP, 1, -1, 1), ValueError, "ctx"),
    ("vt-wbytes0", lambda: dl.verify_time(T8, CHIP, 1, 10, 1, w_bytes=0), ValueError, "w_bytes"),
    ("vt-overhead-neg", lambda: dl.verify_time(T8, CHIP, 1, 10, 1, overhead=-1), ValueError, "overhead"),
    ("vt-model", lambda: dl.verify_time("8B", CHIP, 1, 10, 1), TypeError, "model"),
    ("vt-kvbytes-neg", lambda: dl.verify_time(T8, CHIP, 1, 10, 1, kv_bytes=-1), ValueError, "kv_bytes"),
    ("vt-no-room", lambda: dl.verify_time(T8, CHIP, 1, 10 ** 8, 1), CapErr, "KV"),
    ("sp-gamma-neg", lambda: dl.spec_round(T8, D1, CHIP, 1, 100, 0.7, -1), ValueError, "gamma"),
    ("sp-alpha-big", lambda: dl.spec_round(T8, D1, CHIP, 1, 100, 2.0, 3), ValueError, "alpha"),
    ("sp-batch0", lambda: dl.spec_round(T8, D1, CHIP, 0, 100, 0.7, 3), ValueError, "batch"),
    ("sp-overhead-neg", lambda: dl.spec_round(T8, D1, CHIP, 1, 100, 0.7, 3, overhead_t=-1), ValueError,
     "overhead_t"),
    ("sp-gamma-huge", lambda: dl.spec_round(T8, D1, CHIP, 1, 100, 0.7, 10 ** 9), ValueError, "gamma"),
    ("br-gmax0", lambda: dl.best_round(T8, D1, CHIP, 1, 100, 0.7, gamma_max=0), ValueError, "gamma_max"),
    ("br-gmax-huge", lambda: dl.best_round(T8, D1, CHIP, 1, 100, 0.7, gamma_max=10 ** 6), ValueError, "gamma_max"),
    ("fm-empty", lambda: dl.fits_in_memory([], CHIP, 1, 10), ValueError, "models"),
    ("fm-batch0", lambda: dl.fits_in_memory([T8], CHIP, 0, 10), ValueError, "batch"),
    ("fm-tokens-neg", lambda: dl.fits_in_memory([T8], CHIP, 1, -1), ValueError, "tokens"),
    ("fm-memutil0", lambda: dl.fits_in_memory([T8], CHIP, 1, 10, mem_util=0), ValueError, "mem_util"),
    ("fm-wbytes-neg", lambda: dl.fits_in_memory([T8], CHIP, 1, 10, w_bytes=-2), ValueError, "w_bytes"),
    ("fm-kvbytes-str", lambda: dl.fits_in_memory([T8], CHIP, 1, 10, kv_bytes="2"), TypeError, "kv_bytes"),
    ("tr-accept-deep", lambda: dl.tree_round(T8, CHIP, 1, 100, 3.0, (2, 2)), ValueError, "mean_accept"),
    ("tr-branch-empty", lambda: dl.tree_round(T8, CHIP, 1, 100, 1.0, ()), ValueError, "branching"),
    ("tr-tdraft-neg", lambda: dl.tree_round(T8, CHIP, 1, 100, 1.0, (2,), t_draft=-1), ValueError, "t_draft"),
    ("tr-branch-huge", lambda: dl.tree_round(T8, CHIP, 1, 100, 1.0, (10 ** 10, 10 ** 10)), ValueError, "branching"),
    # 贪心的树形验证
    ("dr-seq-float", lambda: dl.draft_ranks(np.zeros((3, 4)), [0.5, 1.0, 2.0]), TypeError, "seq"),
    ("dr-logits-str", lambda: dl.draft_ranks([["a"] * 4] * 3, [0, 1, 2]), TypeError, "target_seq_logits_draft"),
    ("dr-shape", lambda: dl.draft_ranks(np.zeros((3, 4)), [0, 1]), ValueError, "seq"),
    ("dr-seq-oov", lambda: dl.draft_ranks(np.zeros((3, 4)), [0, 1, 4]), ValueError, "seq"),
    ("tn-zero", lambda: dl.tree_nodes([0]), ValueError, "branching"),
    ("tn-float", lambda: dl.tree_nodes([1.5]), ValueError, "branching"),
    ("tn-overflow", lambda: dl.tree_nodes((2 ** 40, 2 ** 40)), ValueError, "branching"),
    ("ta-ranks-float", lambda: dl.tree_accept_lengths([0.5, 1.0], (1,)), ValueError, "ranks"),
    ("ta-ranks-short", lambda: dl.tree_accept_lengths([0], (1, 1)), ValueError, "ranks"),
    ("ta-ranks-neg", lambda: dl.tree_accept_lengths([-1, 0], (1,)), ValueError, "ranks"),
    ("tp-seed-str", lambda: dl.tiny_pair(seed="x"), TypeError, "seed"),
    ("tp-seed-neg", lambda: dl.tiny_pair(seed=-1), ValueError, "seed"),
]


def test_case_count():
    assert len(CASES) >= 100


@params([Case(*c) for c in CASES])
def test_bad_input_is_a_clear_error(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


# ---------------------------------------------------------------------------
# 合法的边界值：照常运行，答案对得上参考
# ---------------------------------------------------------------------------
def test_legal_edges_match_reference():
    # 整数 / float32 的概率表、numpy 整数 token：和 float64、Python int 的结果一样
    p32 = np.array([0.25, 0.75], dtype=np.float32)
    assert np.allclose(dl.residual(p32, Q2), [0.0, 1.0]) and np.array_equal(dl.residual([0, 1], [1, 0]), [0.0, 1.0])
    lg = TGT.full_logits(np.array([[1, 2, 3]], dtype=np.int32))
    assert np.array_equal(lg, TGT.full_logits([[1, 2, 3]]))
    assert np.array_equal(NG.full_logits([[V - 1]])[0, 0], NG.table[V - 1])          # 最后一个 token 是它自己那一行
    # 边界上的 logits：一个有限值、其余 −∞ → one-hot
    assert np.array_equal(dl.adjust([-math.inf, 0.0, -math.inf]), [0.0, 1.0, 0.0])
    # 公式的端点：γ = 0 是 1；α = 1 是 γ + 1；γ = GAMMA_MAX 照常算
    assert dl.expected_tokens(0.3, 0) == 1.0 and dl.expected_tokens(1.0, 7) == 8.0
    assert dl.expected_tokens(0.5, dl.GAMMA_MAX) == pytest.approx(2.0)
    # 卡方：归一化的 probs、够多的样本 → 和 chi2_sf 一致（手算统计量）
    samples = np.array([[0]] * 30 + [[1]] * 70)
    stat, dof, pv = dl.chi_square_gof(samples, [0.25, 0.75])
    want = (30 - 25) ** 2 / 25 + (70 - 75) ** 2 / 75
    assert dof == 1 and stat == pytest.approx(want) and pv == pytest.approx(math.erfc(math.sqrt(want / 2)))
    # 树：(1,) 的节点数 1，Python 整数算的节点数和 cumprod 一致
    assert dl.tree_nodes((3, 2, 2)) == 3 + 6 + 12


def test_prompt_at_capacity_runs():
    """prompt + n_new 正好等于 cache 容量：照常生成。"""
    out, calls = dl.autoregressive_generate(TGT, [1] * 46, 50, 0.0, RNG(0))
    assert len(out) == 50 and calls == 50


# ---------------------------------------------------------------------------
# 调度的守恒律（Hypothesis）
# ---------------------------------------------------------------------------
@settings(deadline=None, max_examples=12)
@given(st.integers(1, 25), st.floats(0.5, 50.0), st.integers(0, 10 ** 6), st.integers(1, 8),
       st.sampled_from(dl.RESERVE_MODES))
def test_iteration_level_conserves_requests(n, rate, seed, max_bs, reserve):
    """预留模式下每个请求恰好完成一次、生成 output 个 token、FCFS 接纳；不预留时要么全完成，要么报告死锁。"""
    reqs = dl.orca_workload(n, rate, seed=seed, prompt_range=(8, 200), gen_range=(1, 30))
    res = dl.run_iteration_level(reqs, STEP, max_bs, reserve=reserve)
    if res["deadlock"]:
        assert reserve == "none" and res["done"] < n
        return
    assert res["done"] == n and res["admit_order"] == [r.rid for r in reqs]
    assert all(r.gen == r.output and r.arrival <= r.admit_t < r.first_tok <= r.finish for r in reqs)
