"""第 1 讲 llm_math、hw_specs 与 course_utils（check_* 与格式化）的坏输入：每个公开入口、每种坏值。

每个用例断言异常类型和消息里的参数名；合法的边界输入（0 个 token、整数值的浮点数、numpy 整数……）对照独立算出的值。
"""
import math
import os

import numpy as np
import pytest
from bad_input_cases import Case, cases_for, check_case, params
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

CU = load_lab("lecture01", "course_utils")
LM = load_lab("lecture01", "llm_math")
HW = load_lab("lecture01", "hw_specs")

M8 = LM.LLAMA31_8B
CHIP = HW.H100_SXM
NAN, INF = float("nan"), float("inf")
SMALL = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128, vocab=100)
GOOD_CHIP = dict(name="x", kind="GPU", peak={"bf16": 1e12}, mem_bw=1e9, mem_cap=1e9, mem_kind="HBM", link_bw=1e9)
HUGE = 10 ** 15          # 远大于任何机器内存的字节数


def _int_bad(whole_float):
    """整数参数（个数、长度）的坏值 → 期望的异常。whole_float=True 时 NaN / inf 是 ValueError（浮点数可以）。"""
    out = [(True, TypeError), ("3", TypeError), (None, TypeError), (2.5, TypeError), (-1, ValueError)]
    out += [(NAN, ValueError), (INF, ValueError)] if whole_float else [(2.0, TypeError), (NAN, TypeError)]
    return out


REAL_BAD = [(True, TypeError), ("2", TypeError), (None, TypeError), (NAN, ValueError), (INF, ValueError),
            (-1.0, ValueError)]
POS_REAL_BAD = REAL_BAD + [(0.0, ValueError)]
FLAG_BAD = [("False", TypeError), (1, TypeError), (None, TypeError), (0.0, TypeError)]


# =============================================================================
# llm_math
# =============================================================================
def _model(**kw):
    return LM.ModelConfig("bad", **{**SMALL, **kw})


LM_CASES = []
for _f in LM._POSITIVE_INT_FIELDS:
    LM_CASES += [Case(f"ModelConfig-{_f}={v!r}", (lambda v=v, f=_f: _model(**{f: v})), exc, _f)
                 for v, exc in _int_bad(False) + [(0, ValueError)]]
for _f in LM._NONNEG_INT_FIELDS:
    LM_CASES += [Case(f"ModelConfig-{_f}={v!r}", (lambda v=v, f=_f: _model(**{f: v})), exc, _f)
                 for v, exc in ((-1, ValueError), (1.5, TypeError), ("0", TypeError))]
for _f in ("tied", "qkv_bias"):
    LM_CASES += [Case(f"ModelConfig-{_f}={v!r}", (lambda v=v, f=_f: _model(**{f: v})), exc, _f)
                 for v, exc in FLAG_BAD]
LM_CASES += [
    Case("ModelConfig-heads-not-divisible", lambda: _model(n_heads=6, n_kv_heads=4), ValueError, "n_kv_heads"),
    Case("ModelConfig-name=None", lambda: LM.ModelConfig(None, **SMALL), TypeError, "name"),
    Case("ModelConfig-name=7", lambda: LM.ModelConfig(7, **SMALL), TypeError, "name"),
    Case("ModelConfig-name=''", lambda: LM.ModelConfig("", **SMALL), TypeError, "name"),
]
LM_CASES += cases_for("weight_bytes", M8.weight_bytes, "bytes_per_elem", POS_REAL_BAD)
LM_CASES += cases_for("kv_bytes_per_token", M8.kv_bytes_per_token, "bytes_per_elem", POS_REAL_BAD)
LM_CASES += cases_for("attn_flops_per_token", M8.attn_flops_per_token, "ctx", REAL_BAD)
LM_CASES += cases_for("flops_per_token", M8.flops_per_token, "ctx", REAL_BAD)
LM_CASES += cases_for("kv_cache_bytes", lambda v: M8.kv_cache_bytes(v, 10), "batch", _int_bad(True))
LM_CASES += cases_for("kv_cache_bytes", lambda v: M8.kv_cache_bytes(2, v), "ctx", _int_bad(True))
LM_CASES += cases_for("step_flops", lambda v: M8.step_flops(v, 1), "batch", _int_bad(True) + [(0, ValueError)])
LM_CASES += cases_for("step_flops", lambda v: M8.step_flops(1, v), "n_new", _int_bad(True) + [(0, ValueError)])
LM_CASES += cases_for("step_flops", lambda v: M8.step_flops(1, 1, v), "ctx", _int_bad(True))
LM_CASES += cases_for("step_bytes", lambda v: M8.step_bytes(1, 1, w_bytes=v), "w_bytes", POS_REAL_BAD)
LM_CASES += cases_for("step_bytes", lambda v: M8.step_bytes(1, 1, kv_bytes=v), "kv_bytes", POS_REAL_BAD)
LM_CASES += cases_for("arithmetic_intensity", lambda v: M8.arithmetic_intensity(v, 1), "batch",
                       [(0, ValueError), ("1", TypeError)])
LM_CASES += cases_for("train_flops", lambda v: M8.train_flops(v, 10), "n_tokens", _int_bad(True))
LM_CASES += cases_for("train_flops", lambda v: M8.train_flops(10, v), "seq_len", [(0, ValueError), ("8", TypeError)])
LM_CASES += cases_for("train_flops", lambda v: M8.train_flops(10, 10, causal=v), "causal", FLAG_BAD)
LM_CASES += cases_for("activation_bytes", lambda v: M8.activation_bytes(1, 10, recompute=v), "recompute", FLAG_BAD)
LM_CASES += cases_for("activation_bytes", lambda v: M8.activation_bytes(v, 10), "batch", [(0, ValueError)])
LM_CASES += cases_for("activation_bytes", lambda v: M8.activation_bytes(1, 10, v), "bytes_per_elem",
                       [(0, ValueError)])
for _k in ("w_bytes", "grad_bytes", "master_bytes", "adam_bytes", "act_bytes", "logits_bytes"):
    LM_CASES += cases_for("train_memory", lambda v, k=_k: M8.train_memory(1, 10, **{k: v}), _k,
                           [(0, ValueError), (NAN, ValueError), ("4", TypeError)])
LM_CASES += cases_for("train_memory", lambda v: M8.train_memory(1, 10, recompute=v), "recompute", [("no", TypeError)])
LM_CASES += [
    Case("scaled-cfg=None", lambda: LM.scaled(None, n_layers=2), TypeError, "cfg"),
    Case("scaled-typo-field", lambda: LM.scaled(M8, n_kv_head=4), TypeError, "n_kv_head"),
    Case("scaled-bad-value", lambda: LM.scaled(M8, n_kv_heads=5), ValueError, "n_kv_heads"),
    Case("check_model_chip-model=None", lambda: LM.check_model_chip(None, CHIP), TypeError, "model"),
    Case("check_model_chip-chip=name", lambda: LM.check_model_chip(M8, "H100"), TypeError, "chip"),
    Case("allocatable_bytes-chip=None", lambda: LM.allocatable_bytes(None), TypeError, "chip"),
    Case("allocatable_bytes-chip=str", lambda: LM.allocatable_bytes("H100"), TypeError, "chip"),
]
LM_CASES += cases_for("tp_layout_problem", lambda v: LM.tp_layout_problem(M8, v), "n",
                       [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError), ("4", TypeError),
                        (None, TypeError), (NAN, ValueError)])
LM_CASES += [
    Case("tp_layout_problem-name-in-message", lambda: LM.tp_layout_problem(M8, 0, name="tp"), ValueError, "tp"),
    Case("tp_layout_problem-model=None", lambda: LM.tp_layout_problem(None, 2), TypeError, "model"),
]
LM_CASES += cases_for("fit", lambda v: LM.fit(M8, CHIP, v), "n_chips", _int_bad(True) + [(0, ValueError)])
LM_CASES += cases_for("fit", lambda v: LM.fit(M8, CHIP, batch=v), "batch", [(-1, ValueError), ("1", TypeError)])
LM_CASES += cases_for("fit", lambda v: LM.fit(M8, CHIP, ctx=v), "ctx", [(-1, ValueError), (1.5, TypeError)])
LM_CASES += cases_for("fit", lambda v: LM.fit(M8, CHIP, mem_util=v), "mem_util",
                       [(0.0, ValueError), (1.5, ValueError), (NAN, ValueError), ("0.9", TypeError)])
LM_CASES += cases_for("fit", lambda v: LM.fit(M8, CHIP, rule=v), "rule",
                       [("TP", ValueError), ("heads", ValueError), (None, ValueError)])
LM_CASES += cases_for("chips_needed", lambda v: LM.chips_needed(M8, CHIP, max_chips=v), "max_chips",
                       [(0, ValueError), (2.0, TypeError), (10 ** 12, ValueError), ("8", TypeError)])
LM_CASES += [
    Case("fit_rows-not-pairs", lambda: LM.fit_rows([1, 2]), TypeError, "fits"),
    Case("fit_rows-not-Fit", lambda: LM.fit_rows([("a", 3)]), TypeError, "fits"),
]
LM_CASES += cases_for("step_time", lambda v: LM.step_time(M8, CHIP, 1, 1, prec=v), "prec",
                       [("bf17", ValueError), (None, TypeError), (16, TypeError)])
LM_CASES += cases_for("step_time", lambda v: LM.step_time(M8, CHIP, 1, 1, mfu=v), "mfu",
                       [(0.0, ValueError), (1.5, ValueError), (NAN, ValueError)])
LM_CASES += cases_for("step_time", lambda v: LM.step_time(M8, CHIP, 1, 1, mbu=v), "mbu", [(2.0, ValueError)])
LM_CASES += cases_for("step_time", lambda v: LM.step_time(M8, v, 1, 1), "chip",
                       [("H100", TypeError), (None, TypeError)])
LM_CASES += cases_for("decode_time_per_token", lambda v: LM.decode_time_per_token(M8, CHIP, batch=v), "batch",
                       [(0, ValueError), (1.5, TypeError)])
LM_CASES += [
    Case("decode_time_per_token-typo-kw", lambda: LM.decode_time_per_token(M8, CHIP, mfuu=0.5), TypeError, "mfuu"),
    Case("decode_tokens_per_s-does-not-fit", lambda: LM.decode_tokens_per_s(LM.LLAMA31_405B, CHIP),
         LM.CapacityError, "405B"),
]
LM_CASES += cases_for("max_batch", lambda v: LM.max_batch(M8, CHIP, v), "ctx", [(0, ValueError), ("1", TypeError)])
LM_CASES += cases_for("train_time", lambda v: LM.train_time(M8, 1e12, CHIP, v), "n_chips",
                       [(0, ValueError), (2.5, TypeError)])
LM_CASES += cases_for("train_time", lambda v: LM.train_time(M8, 1e12, CHIP, 8, mfu=v), "mfu", [(0.0, ValueError)])
LM_CASES += cases_for("train_time", lambda v: LM.train_time(M8, v, CHIP, 8), "n_tokens", [(-1, ValueError)])
LM_CASES += cases_for("param_tolerance", LM.param_tolerance, "name",
                       [("llama", ValueError), (None, ValueError), (["Llama-3.1-8B"], ValueError)])
LM_CASES += cases_for("published_count", LM.published_count, "name", [("Llama-3.1-8b", ValueError)])


@params(LM_CASES)
def test_llm_math_bad_input(case):
    check_case(case)


def test_llm_math_case_count():
    assert len(LM_CASES) >= 100, len(LM_CASES)


# ---- 合法的边界输入：对照独立算出的值 -------------------------------------------------------------
def test_llm_math_legal_edges():
    L, H, G, dh = M8.n_layers, M8.n_heads, M8.n_kv_heads, M8.d_head
    assert M8.attn_flops_per_token(0) == 0 and M8.kv_cache_bytes(0, 0) == 0
    assert M8.attn_flops_per_token(2.5) == 4 * L * H * dh * 2.5                # 平均上下文可以是小数
    assert M8.kv_cache_bytes(np.int64(3), 7.0) == 3 * 7 * 2 * L * G * dh * 2   # numpy 整数、整数值的浮点数
    want = 3 * 15.6e12 * (2 * M8.matmul_params() + 4 * L * H * dh * (8192 + 1) / 2)   # 6ND + 注意力（平均上下文）
    assert math.isclose(M8.train_flops(15.6e12, 8192), want, rel_tol=1e-12)
    assert M8.train_flops(0, 1) == 0
    cfg = LM.ModelConfig("np", **{k: np.int64(v) for k, v in SMALL.items()}, tied=np.bool_(True))
    assert type(cfg.d_model) is int and cfg.tied is True and cfg.n_params() == _model(tied=True).n_params()
    assert LM.tp_layout_problem(M8, 1) is None and LM.tp_layout_problem(M8, 8.0) is None
    assert LM.tp_layout_problem(M8, 3) is not None and "n=3" in LM.tp_layout_problem(M8, 3)
    f2, f2f = LM.fit(M8, CHIP, 2), LM.fit(M8, CHIP, 2.0)
    assert f2 == f2f and type(f2f.n_chips) is int
    assert LM.chips_needed(M8, CHIP, max_chips=LM.MAX_CHIPS).n_chips == 1


# =============================================================================
# hw_specs
# =============================================================================
def _chip(**kw):
    return HW.Chip(**{**GOOD_CHIP, **kw})


HW_CASES = []
for _f in ("mem_bw", "mem_cap", "link_bw"):       # Chip 的老约定：一切坏值都是 ValueError
    HW_CASES += [Case(f"Chip-{_f}={v!r}", (lambda v=v, f=_f: _chip(**{f: v})), ValueError, _f)
                 for v in (0, -1.0, NAN, INF, "1e9", True, None)]
HW_CASES += [Case(f"Chip-power_w={v!r}", (lambda v=v: _chip(power_w=v)), ValueError, "power_w")
             for v in (0, -5, NAN, "700", True)]
HW_CASES += [Case(f"Chip-mem_alloc={v!r}", (lambda v=v: _chip(mem_alloc=v)), ValueError, "mem_alloc")
             for v in (-1.0, 0, NAN, "x")]
HW_CASES += [Case(f"Chip-year={v!r}", (lambda v=v: _chip(year=v)), ValueError, "year")
             for v in ("2024", 2024.0, True, 1800, 30000)]
HW_CASES += [Case(f"Chip-peak={v!r}", (lambda v=v: _chip(peak=v)), ValueError, "peak")
             for v in ({}, [], None, {"BF16": 1e12}, {"bf16": -1.0}, {"bf16": NAN}, {"bf16": "1"},
                       {"bf16": True}, {"": 1.0}, {16: 1.0})]
HW_CASES += [Case(f"Chip-{f}={v!r}", (lambda v=v, f=f: _chip(**{f: v})), ValueError, f)
             for f in ("kind", "mem_kind", "notes", "mem_alloc_how") for v in (5, None)]
HW_CASES += [Case(f"Chip-name={v!r}", (lambda v=v: _chip(name=v)), ValueError, "name") for v in ("", 5, None)]
HW_CASES += cases_for("peak_flops", CHIP.peak_flops, "prec",
                       [("bf17", ValueError), ("fp64", ValueError), (None, TypeError), (16, TypeError),
                        (["bf16"], TypeError)])
HW_CASES += cases_for("ridge_point", CHIP.ridge_point, "prec", [("int4", ValueError), (None, TypeError)])
HW_CASES += cases_for("roofline_time", lambda v: CHIP.roofline_time(v, 1.0), "flops", REAL_BAD)
HW_CASES += cases_for("roofline_time", lambda v: CHIP.roofline_time(1.0, v), "nbytes", REAL_BAD)
HW_CASES += cases_for("roofline_time", lambda v: CHIP.roofline_time(1.0, 1.0, v), "prec", [("fp4", ValueError)])
HW_CASES += cases_for("bound", lambda v: CHIP.bound(v, 1.0), "flops", REAL_BAD)
HW_CASES += cases_for("bound", lambda v: CHIP.bound(1.0, v), "nbytes", REAL_BAD)
HW_CASES += cases_for("attainable_flops", CHIP.attainable_flops, "intensity", REAL_BAD)
HW_CASES += cases_for("link_time", CHIP.link_time, "nbytes", REAL_BAD)
HW_CASES += cases_for("derived_alloc", HW.derived_alloc, "mem_cap", POS_REAL_BAD)
HW_CASES += cases_for("with_alloc", HW.with_alloc, "chip", [(None, TypeError), ("H100", TypeError)])
HW_CASES += cases_for("with_alloc", lambda v: HW.with_alloc(CHIP, v), "measured",
                       [(True, TypeError), ("80e9", TypeError), (-1.0, ValueError), (NAN, ValueError),
                        (0, ValueError)])
HW_CASES += cases_for("chip_rows", HW.chip_rows, "chips",
                       [([], ValueError), ([1], TypeError), ("H100", TypeError), (5, TypeError)])
HW_CASES += cases_for("chip_rows", lambda v: HW.chip_rows(None, v), "prec",
                       [("bf17", ValueError), (None, TypeError), (16, TypeError)])


@params(HW_CASES)
def test_hw_specs_bad_input(case):
    check_case(case)


def test_hw_specs_case_count():
    assert len(HW_CASES) >= 100, len(HW_CASES)


def test_hw_specs_legal_edges():
    assert CHIP.roofline_time(0, 0) == 0.0 and CHIP.bound(0, 0) == "compute"    # 不搬数据：算术强度无穷大
    assert CHIP.attainable_flops(0) == 0.0 and CHIP.link_time(0) == 0.0
    assert CHIP.peak_flops("BF16") == CHIP.peak["bf16"] == CHIP.peak_flops(np.str_("bf16"))
    assert HW.chip_rows(HW.CHIPS) == HW.chip_rows() == HW.chip_rows(list(HW.CHIPS.values()), "BF16")
    rows = HW.chip_rows([HW.TPU_V5E], "int8")
    assert rows[0][1] == f"{HW.TPU_V5E.peak['int8'] / 1e12:.0f}"
    assert HW.chip_rows([HW.TPU_V5E, CHIP], "fp8")[0][1] == "—"                 # 有的芯片有、有的没有：写 "—"
    c = HW.with_alloc(_chip(), measured=np.float64(2e9))
    assert c.alloc_bytes == 2e9 and c.mem_alloc_how.startswith("measured")
    assert _chip(year=2024, power_w=np.float32(300)).power_w == 300.0


# =============================================================================
# course_utils：check_* 与格式化
# =============================================================================
CU_CASES = [
    Case("format_table-headers=str", lambda: CU.format_table("ab", [[1, 2]]), TypeError, "headers"),
    Case("format_table-headers=None", lambda: CU.format_table(None, []), TypeError, "headers"),
    Case("format_table-rows=None", lambda: CU.format_table(["a"], None), TypeError, "rows"),
    Case("format_table-rows=str", lambda: CU.format_table(["a", "b"], "ab"), TypeError, "rows"),
    Case("format_table-row=str", lambda: CU.format_table(["a", "b"], ["xy"]), TypeError, "rows"),
    Case("format_table-row-len", lambda: CU.format_table(["a", "b"], [[1]]), ValueError, "rows"),
    Case("format_table-align-typo", lambda: CU.format_table(["a", "b"], [[1, 2]], align="<^"), ValueError, "align"),
    Case("format_table-empty-headers", lambda: CU.format_table([], []), ValueError, "headers"),
    Case("figure_path-what=None", lambda: CU.figure_path("/tmp/x.py", None), TypeError, "what"),
    Case("figure_path-what=3", lambda: CU.figure_path("/tmp/x.py", 3), TypeError, "what"),
    Case("figure_path-what-folder", lambda: CU.figure_path("/tmp/x.py", "a/b"), ValueError, "what"),
    Case("figure_path-quick=str", lambda: CU.figure_path("/tmp/x.py", "a", quick="yes"), TypeError, "quick"),
    Case("figure_path-script=None", lambda: CU.figure_path(None, "a"), TypeError, "script"),
    Case("committed_figure-replot=1", lambda: CU.committed_figure("x.py", "a.png", 1), TypeError, "replot"),
    Case("committed_figure-name", lambda: CU.committed_figure("x.py", "a.jpg", False), ValueError, "name"),
    Case("merge_identical-short-ys", lambda: CU.merge_identical([("a", [1, 2], [3])]), ValueError, "ys"),
    Case("merge_identical-not-triple", lambda: CU.merge_identical([("a", [1])]), TypeError, "series"),
    Case("merge_identical-str-ys", lambda: CU.merge_identical([("a", [1], ["3"])]), TypeError, "ys"),
    Case("merge_identical-atol<0", lambda: CU.merge_identical([], atol=-1), ValueError, "atol"),
    Case("ratio_errors-empty", lambda: CU.ratio_errors([]), ValueError, "ratios"),
    Case("ratio_errors-zero", lambda: CU.ratio_errors([1.0, 0.0]), ValueError, "ratios"),
    Case("ratio_errors-nan", lambda: CU.ratio_errors([NAN]), ValueError, "ratios"),
]
for _fn, _arg in ((CU.fmt_si, "x"), (CU.fmt_count, "n"), (CU.fmt_bytes, "n"), (CU.fmt_time, "s")):
    CU_CASES += cases_for(_fn.__name__, _fn, _arg, [("1", TypeError), (None, TypeError), (True, TypeError),
                                                     (NAN, ValueError)])
CU_CASES += [
    Case("fmt_time-negative", lambda: CU.fmt_time(-1e-3), ValueError, "s"),
    Case("fmt_si-digits=0", lambda: CU.fmt_si(1.0, digits=0), ValueError, "digits"),
    Case("fmt_si-digits=True", lambda: CU.fmt_si(1.0, digits=True), TypeError, "digits"),
    Case("fmt_si-unit=5", lambda: CU.fmt_si(1.0, unit=5), TypeError, "unit"),
]
CU_CASES += cases_for("check_seed", lambda v: CU.check_seed("seed", v), "seed",
                       [("x", TypeError), (-1, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError),
                        (__import__("random").Random(0), TypeError), (np.random.RandomState(0), TypeError)])
CU_CASES += cases_for("check_torch_seed", lambda v: CU.check_torch_seed("seed", v), "seed",
                       [("x", TypeError), (-1, ValueError), (2 ** 64, ValueError), (1.0, TypeError), (True, TypeError),
                        (None, TypeError)])
CU_CASES += cases_for("check_dtype", lambda v: CU.check_dtype("dtype", v), "dtype",
                       [("float17", TypeError), (None, TypeError), (np.int32, TypeError), (complex, TypeError),
                        ("U4", TypeError), (object, TypeError)])
CU_CASES += [
    Case("check_memory-huge", lambda: CU.check_memory("n", HUGE), ValueError, "n"),
    Case("check_memory-limit", lambda: CU.check_memory("batch", 11, where="f", limit=10), ValueError, "f：batch"),
    Case("check_int-bool", lambda: CU.check_int("k", True), TypeError, "k"),
    Case("check_real-str", lambda: CU.check_real("r", "1"), TypeError, "r"),
    Case("check_bool-str", lambda: CU.check_bool("flag", "True"), TypeError, "flag"),
    Case("check_choice-typo", lambda: CU.check_choice("mode", "rign", ("ring",)), ValueError, "mode"),
    Case("check_array-str", lambda: CU.check_array("a", ["x"]), TypeError, "a"),
    Case("check_array-object", lambda: CU.check_array("a", np.array([1, None], dtype=object)), TypeError, "a"),
]


@params(CU_CASES)
def test_course_utils_bad_input(case):
    check_case(case)


def test_course_utils_legal_edges(tmp_path):
    assert CU.fmt_si(INF, "B") == "inf B" and CU.fmt_si(-INF) == "-inf" and CU.fmt_time(INF) == "inf s"
    assert CU.fmt_count(np.int64(124_000_000)) == "124M" and CU.fmt_time(0) == "0 µs"
    assert CU.fmt_si(np.float32(2.5e6), "B") == "2.5 MB"
    assert CU.format_table(("a", "b"), iter([(1, 2)])).splitlines()[2].split() == ["1", "2"]
    assert CU.merge_identical([("a", [1, 2], [NAN, 1]), ("b", [1, 2], [NAN, 1])])[1:] != []   # NaN ≠ NaN：不合并
    assert CU.check_torch_seed("seed", np.int64(7)) == 7
    assert CU.check_torch_seed("seed", CU.TORCH_SEED_MAX) == 2 ** 64 - 1
    rng = CU.check_seed("seed", np.int64(5))
    assert rng.integers(0, 10 ** 9) == np.random.default_rng(5).integers(0, 10 ** 9)
    g = np.random.default_rng(3)
    assert CU.check_seed("seed", g) is g
    assert CU.check_dtype("dtype", "float32") == np.float32 and CU.check_dtype("d", np.int8, "iu") == np.int8
    assert CU.check_memory("n", 10, limit=10) == 10
    mem = CU.machine_memory_bytes()
    assert mem is None or mem > 2 ** 28
    assert CU.figure_path(str(tmp_path / "s.py"), "ok") == os.path.join(tmp_path, "figures", "s_ok.png")


@settings(deadline=None, max_examples=60)
@given(x=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30),
       digits=st.integers(1, 8))
def test_fmt_si_round_trip(x, digits):
    """fmt_si 的数字乘回前缀的倍数，等于把 x 四舍五入到 digits 位有效数字。"""
    text = CU.fmt_si(x, "B", digits)
    num, unit = text.split(" ") if " " in text else (text, "")
    scale = {"Y": 1e24, "Z": 1e21, "E": 1e18, "P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3}.get(unit[:-1], 1)
    want = float(f"{x / scale:.{digits}g}") * scale if x else 0.0
    assert math.isclose(float(num) * scale, want, rel_tol=1e-12)


@settings(deadline=None, max_examples=60)
@given(seed=st.one_of(st.integers(-5, 2 ** 64), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3)))
def test_check_seed_accepts_exactly_nonneg_ints(seed):
    """check_seed 的律：收下的正是 ≥ 0 的整数（生成的流和 default_rng 相同），其余一律报错。"""
    ok = type(seed) is int and seed >= 0
    if ok:
        assert CU.check_seed("seed", seed).random() == np.random.default_rng(seed).random()
    else:
        with pytest.raises((TypeError, ValueError), match="seed"):
            CU.check_seed("seed", seed)


@settings(deadline=None, max_examples=40)
@given(n=st.integers(0, 2 ** 70), limit=st.integers(1, 2 ** 70))
def test_check_memory_is_a_threshold(n, limit):
    if n <= limit:
        assert CU.check_memory("n", n, limit=limit) == n
    else:
        with pytest.raises(ValueError, match="n 太大"):
            CU.check_memory("n", n, limit=limit)
