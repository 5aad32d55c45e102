"""预备课 5 comm_sim 的坏输入：模拟（dtype、形状、NaN/inf、回绕的整数和、设备数、放不下的副本）、账本、代价模型、
nccl-tests 口径与拟合。

每个用例断言异常类型和消息里的参数名；合法的边界输入（放得下的 int8 和、P = 1、长度 0、numpy 整数的 P……）
对照 numpy 直接算出的答案。整数的律：结果要么等于精确的和（放得进 dtype），要么报错——绝不回绕。
"""
import numpy as np
import pytest
from bad_input_cases import Case, cases_for, check_case, params
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

cs = load_lab("prereq5", "comm_sim")

NAN, INF = float("nan"), float("inf")
REDUCERS = [cs.ring_all_reduce, cs.tree_all_reduce, cs.rec_doubling_all_reduce, cs.rabenseifner_all_reduce,
            cs.ring_reduce_scatter]
GOOD = [np.arange(4.0), np.arange(4.0)]


def _ledger():
    led = cs.Ledger(3)
    led.new_step()
    led.send(0, 1, 8)
    return led


def _big(n):
    return np.broadcast_to(np.zeros(1), (n,))      # 不占内存的大数组


CASES = []
# ---- 模拟：缓冲区 -------------------------------------------------------------------------------------
BUF_BAD = [
    ([np.array([100, 100], np.int8)] * 2, ValueError),        # 100 + 100 在 int8 里回绕成 −56
    ([np.array([200], np.uint8), np.array([100], np.uint8)], ValueError),
    ([np.array([2 ** 62], np.int64)] * 2, ValueError),
    ([np.array([60000], np.float16)] * 2, ValueError),        # 溢出成 inf
    ([np.array([True, False])] * 2, TypeError),               # 按位或
    ([np.array(["a", "b"])] * 2, TypeError),                  # 拼接
    ([np.array([1 + 1j])] * 2, TypeError),
    ([np.array([1, None], dtype=object)] * 2, TypeError),
    ([np.array([1.0, NAN])] * 2, ValueError),
    ([np.array([INF, 1.0])] * 2, ValueError),
    ([np.ones((2, 2))] * 2, ValueError),
    ([np.ones(3), np.ones(4)], ValueError),
    ([np.ones(3), np.ones(3, np.float32)], ValueError),
    ([[1.0, 2.0]] * 2, TypeError),
    ([], ValueError),
    (np.ones((2, 3)), TypeError),
    ([np.ones(2)] * (cs.MAX_SIM_DEVICES + 1), ValueError),
    ([_big(10 ** 15)] * 2, ValueError),                       # 副本放不下
]
for _fn in REDUCERS:
    CASES += cases_for(_fn.__name__, _fn, "xs", BUF_BAD)
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(GOOD, op=v), "op",
                        [("prod", ValueError), ("SUM", ValueError), (np.add, ValueError)])
CASES += cases_for("ring_all_reduce", lambda v: cs.ring_all_reduce(GOOD, trace=v), "trace",
                    [(True, TypeError), ({}, TypeError), ((), TypeError)])
CASES += [Case("ring_all_reduce-trace-memory", lambda: cs.ring_all_reduce([_big(10 ** 13)] * 4, trace=[]),
               ValueError, "xs")]
for _fn in (cs.ring_all_gather, cs.rec_doubling_all_gather):
    CASES += cases_for(_fn.__name__, _fn, "chunks",
                        [([np.array([True])] * 2, TypeError), ([np.array(["a"])] * 2, TypeError),
                         ([np.array([NAN])] * 2, ValueError), ([np.ones(2), np.ones(2, np.int32)], ValueError),
                         ([], ValueError), ("ab", TypeError)])
CASES += cases_for("ring_all_gather", lambda v: cs.ring_all_gather(GOOD, trace=v), "trace", [("yes", TypeError)])
CASES += cases_for("pairwise_all_to_all", cs.pairwise_all_to_all, "xs",
                    [([np.array([True])] * 2, TypeError), ([np.array([INF])] * 2, ValueError), ([], ValueError)])
CASES += [Case("rec_halving-not-pow2", lambda: cs.rec_halving_reduce_scatter([np.ones(6)] * 3), ValueError, "P"),
          Case("rec_doubling_all_gather-not-pow2", lambda: cs.rec_doubling_all_gather([np.ones(2)] * 3), ValueError,
               "P")]
for _fn in (cs.tree_broadcast, cs.scatter_allgather_broadcast):
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(np.ones(4), v), "p",
                        [(0, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError),
                         (10 ** 7, ValueError), (cs.MAX_SIM_DEVICES + 1, ValueError)])
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(np.ones(4), 4, v), "root",
                        [(4, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)])
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(v, 4), "x",
                        [([1.0, 2.0], TypeError), (np.array([True]), TypeError), (np.array([NAN]), ValueError),
                         (np.ones((2, 2)), ValueError), (_big(10 ** 13), ValueError)])
CASES += cases_for("hierarchical_all_reduce", lambda v: cs.hierarchical_all_reduce([np.ones(4)] * 6, v),
                    "gpus_per_node", [(4, ValueError), (0, ValueError), (2.0, TypeError), ("2", TypeError)])
CASES += cases_for("hierarchical_all_reduce", lambda v: cs.hierarchical_all_reduce(v, 2), "xs",
                    [([np.array([100], np.int8)] * 4, ValueError), ([np.array([True])] * 4, TypeError)])
# ---- 账本 ----------------------------------------------------------------------------------------------
CASES += cases_for("Ledger", cs.Ledger, "p", [(0, ValueError), (2.5, TypeError), ("4", TypeError), (True, TypeError)])
CASES += cases_for("Ledger.send", lambda v: _ledger().send(v, 2, 8), "src",
                    [(1.5, TypeError), (-1, ValueError), (3, ValueError), (True, TypeError)])
CASES += cases_for("Ledger.send", lambda v: _ledger().send(1, v, 8), "dst", [(2.0, TypeError), (5, ValueError)])
CASES += cases_for("Ledger.send", lambda v: _ledger().send(1, 2, v), "nbytes",
                    [(-8, ValueError), (2.7, TypeError), (NAN, TypeError), ("8", TypeError)])
CASES += cases_for("Ledger.send", lambda v: _ledger().send(1, 2, 8, kind=v), "kind",
                    [("nvlink", ValueError), (None, ValueError)])
CASES += [Case("Ledger.send-before-step", lambda: cs.Ledger(2).send(0, 1, 8), RuntimeError, "new_step"),
          Case("Ledger.send-port-twice", lambda: _ledger().send(0, 2, 8), RuntimeError, "0")]
CASES += cases_for("Ledger.cost", lambda v: _ledger().cost(v), "kind", [("Intra", ValueError), (3, ValueError)])
CASES += cases_for("Ledger.total_bytes", lambda v: _ledger().total_bytes(v), "kind", [("links", ValueError)])
CASES += cases_for("Ledger.step_messages", lambda v: _ledger().step_messages(v), "step",
                    [("0", TypeError), (5, ValueError), (-1, ValueError), (0.0, TypeError)])
CASES += cases_for("Ledger.time", lambda v: _ledger().time(v, 1e-9), "alpha",
                    [(-1.0, ValueError), (NAN, ValueError), ("1", TypeError), (None, TypeError)])
CASES += cases_for("Ledger.time", lambda v: _ledger().time(1e-6, v), "beta", [(INF, ValueError), (True, TypeError)])
CASES += [Case("Ledger.time-dict-missing", lambda: _ledger().time({"intra": 1e-6}, 1e-9), ValueError, "alpha"),
          Case("Ledger.time-dict-bad", lambda: _ledger().time({"link": -1.0}, 1e-9), ValueError, "alpha['link']")]
CASES += cases_for("Cost.time", lambda v: cs.Cost(2, 10.0).time(v, 1e-9), "alpha",
                    [("x", TypeError), (-1.0, ValueError), (NAN, ValueError)])
CASES += cases_for("Cost.time", lambda v: cs.Cost(2, 10.0).time(1e-6, v), "beta", [(np.array(["1"]), TypeError)])
# ---- 代价模型 ------------------------------------------------------------------------------------------
for _fn in (cs.allreduce_terms, cs.allgather_terms, cs.reduce_scatter_terms, cs.broadcast_terms, cs.alltoall_terms):
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(v, 4), "n_bytes",
                        [(-1, ValueError), (NAN, ValueError), (INF, ValueError), ("1e6", TypeError), (True, TypeError),
                         (np.array(["1e6"]), TypeError), (np.array([True, False]), TypeError),
                         (np.array([1.0, -1.0]), ValueError)])
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(1e6, v), "p", [(0, ValueError), (2.5, TypeError)])
    CASES += cases_for(_fn.__name__, lambda v, f=_fn: f(1e6, 4, v), "algo", [("butterfly", ValueError)])
CASES += cases_for("cost_terms", lambda v: cs.cost_terms(v, 1e6, 4), "collective",
                    [("all_reduce", ValueError), (None, ValueError)])
for _name in ("allreduce_time", "allgather_time", "reduce_scatter_time", "broadcast_time", "alltoall_time"):
    _fn = getattr(cs, _name)
    CASES += cases_for(_name, lambda v, f=_fn: f(1e6, 4, v, 1e-9), "alpha", [(-1e-6, ValueError), ("1", TypeError)])
    CASES += cases_for(_name, lambda v, f=_fn: f(1e6, 4, 1e-6, v), "beta", [(NAN, ValueError)])
CASES += cases_for("hierarchical_allreduce_terms", lambda v: cs.hierarchical_allreduce_terms(1e6, v, 8), "n_nodes",
                    [(0, ValueError), (1.5, TypeError)])
CASES += cases_for("hierarchical_allreduce_terms", lambda v: cs.hierarchical_allreduce_terms(1e6, 2, v),
                    "gpus_per_node", [(0, ValueError)])
CASES += cases_for("hierarchical_allreduce_terms", lambda v: cs.hierarchical_allreduce_terms(1e6, 2, 8, v),
                    "allreduce 的 algo", [("mesh", ValueError)])
CASES += cases_for("hierarchical_allreduce_time",
                    lambda v: cs.hierarchical_allreduce_time(1e6, 2, 8, 1e-6, 1e-9, v, 1e-9), "alpha_inter",
                    [(-1.0, ValueError), ("x", TypeError)])
CASES += cases_for("tp_allreduce_time", lambda v: cs.tp_allreduce_time(1e6, v, 450e9), "tp",
                    [(0, ValueError), (8.0, TypeError), (True, TypeError)])
CASES += cases_for("tp_allreduce_time", lambda v: cs.tp_allreduce_time(1e6, 8, v), "link_bw",
                    [(0.0, ValueError), (INF, ValueError), ("450e9", TypeError)])
CASES += cases_for("tp_allreduce_time", lambda v: cs.tp_allreduce_time(v, 1, 450e9), "n_bytes", [(-1, ValueError)])
CASES += cases_for("tp_allreduce_time", lambda v: cs.tp_allreduce_time(1e6, 1, 450e9, algo=v), "algo",
                    [("Ring", ValueError)])
CASES += cases_for("crossover_bytes", lambda v: cs.crossover_bytes("allreduce", v, 1e-6, 1e-9), "p",
                    [(1, ValueError), (0, ValueError)])
CASES += cases_for("crossover_bytes", lambda v: cs.crossover_bytes("allreduce", 8, 1e-6, v), "beta",
                    [(0.0, ValueError)])
# ---- nccl-tests 口径、NCCL 延迟、拟合 -------------------------------------------------------------------
CASES += cases_for("bus_factor", lambda v: cs.bus_factor(v, 8), "collective", [("all-reduce", ValueError)])
CASES += cases_for("bus_factor", lambda v: cs.bus_factor("allreduce", v), "p", [(0, ValueError), (8.0, TypeError)])
CASES += cases_for("algbw", lambda v: cs.algbw(1e6, v), "seconds", [(0.0, ValueError), (NAN, ValueError)])
CASES += cases_for("busbw", lambda v: cs.busbw("allreduce", v, 1e-3, 8), "n_bytes", [(-5, ValueError)])
CASES += cases_for("nccl_ring_latency", lambda v: cs.nccl_ring_latency(8, v), "protocol",
                    [("ll", ValueError), ("LL256", ValueError)])
CASES += cases_for("nccl_ring_latency", lambda v: cs.nccl_ring_latency(8, collective=v), "collective",
                    [("alltoall", ValueError)])
CASES += cases_for("nccl_ring_latency", cs.nccl_ring_latency, "p", [(0, ValueError), ("8", TypeError)])
SIZES = np.geomspace(1e3, 1e8, 6)
CASES += cases_for("fit_alpha_beta", lambda v: cs.fit_alpha_beta(v, cs.allreduce_time(SIZES, 4, 1e-5, 1e-9), 4),
                    "n_bytes", [(SIZES.astype(str), TypeError), (np.ones(6, bool), TypeError),
                                (np.full(6, 1e6), ValueError), (-SIZES, ValueError)])
CASES += cases_for("fit_alpha_beta", lambda v: cs.fit_alpha_beta(SIZES, v, 4), "seconds",
                    [(np.zeros(6), ValueError), (np.full(6, NAN), ValueError), (np.ones(5), ValueError)])
CASES += cases_for("fit_alpha_beta", lambda v: cs.fit_alpha_beta(SIZES, np.ones(6), v), "p", [(1, ValueError)])


@params(CASES)
def test_comm_sim_bad_input(case):
    check_case(case)


def test_case_count():
    assert len(CASES) >= 100, len(CASES)


# =============================================================================
# 合法的边界输入：对照 numpy
# =============================================================================
@pytest.mark.parametrize("fn", [cs.ring_all_reduce, cs.tree_all_reduce, cs.rec_doubling_all_reduce,
                                cs.rabenseifner_all_reduce])
def test_small_ints_that_fit_are_exact_and_keep_their_dtype(fn):
    xs = [np.array([100, -100, 27], np.int8), np.array([27, -28, 100], np.int8)]
    outs, led = fn(xs)
    for o in outs:
        assert o.dtype == np.int8 and np.array_equal(o, [127, -128, 127])
    assert led.total_bytes() % 1 == 0 and all(m.nbytes <= 3 for m in led.messages)   # 字节按 int8 记


def test_wrap_in_the_middle_is_fine_when_the_total_fits():
    """整数回绕是模运算：部分和中途越界，只要最终的和在范围里，结果仍然精确（和 NCCL 的 int8 一样）。"""
    xs = [np.array([100], np.int8), np.array([100], np.int8), np.array([-100], np.int8)]
    for fn in (cs.ring_all_reduce, cs.tree_all_reduce):
        outs, _ = fn(xs)
        assert all(o.dtype == np.int8 and o[0] == 100 for o in outs)
    outs, _ = cs.ring_all_reduce([np.array([100], np.int8)] * 3, op="max")   # max 不会溢出：照常
    assert all(o[0] == 100 for o in outs)


def test_edges_p1_empty_numpy_ints():
    outs, led = cs.ring_all_reduce([np.arange(5.0)])
    assert np.array_equal(outs[0], np.arange(5.0)) and led.n_steps == 0
    outs, _ = cs.ring_all_reduce([np.zeros(0)] * 3)
    assert all(o.shape == (0,) for o in outs)
    bufs, _ = cs.tree_broadcast(np.arange(3.0), np.int64(3), root=np.int32(2))
    assert all(np.array_equal(b, np.arange(3.0)) for b in bufs)
    led = cs.Ledger(np.int64(2))
    led.new_step()
    led.send(np.int64(0), 1, np.int64(16), kind="inter")
    assert led.cost("inter") == cs.Cost(1, 16) and led.cost("intra") == cs.Cost(0, 0)
    assert led.time({"inter": 1e-6}, {"inter": 1e-9}) == 1e-6 + 16e-9
    assert np.allclose(cs.allreduce_time(np.array([0, 1e6], dtype=np.int64), 4, 0.0, 1e-9), [0.0, 1.5e-3])
    outs, _ = cs.ring_all_reduce([np.array([2 ** 40], np.int64)] * 3)     # int64 放得下：精确
    assert outs[0][0] == 3 * 2 ** 40


@settings(deadline=None, max_examples=30)
@given(p=st.integers(1, 6), n=st.integers(1, 8), seed=st.integers(0, 10 ** 6),
       dtype=st.sampled_from([np.int8, np.uint8, np.int16]), algo=st.sampled_from(cs.ALGORITHMS["allreduce"]))
def test_integer_allreduce_never_wraps(p, n, seed, dtype, algo):
    """律：整数 all-reduce 的结果要么等于精确的和（放得进 dtype），要么 ValueError 写明 xs——绝不回绕。"""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    xs = [rng.integers(info.min, int(info.max) + 1, size=n).astype(dtype) for _ in range(p)]
    exact = np.sum(np.stack(xs).astype(object), axis=0)
    fits = info.min <= min(exact) and max(exact) <= info.max
    fn = cs.SIMULATORS[("allreduce", algo)]
    if fits:
        outs, _ = fn(xs)
        assert all(o.dtype == dtype and list(o) == list(exact) for o in outs)
    else:
        with pytest.raises(ValueError, match="xs"):
            fn(xs)


@settings(deadline=None, max_examples=20)
@given(p=st.integers(2, 6), n=st.integers(1, 8), seed=st.integers(0, 10 ** 6))
def test_float16_allreduce_is_finite_or_refused(p, n, seed):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(n) * 2e4).astype(np.float16) for _ in range(p)]
    bound = sum(float(np.max(np.abs(x))) for x in xs)
    if bound <= float(np.finfo(np.float16).max):
        outs, _ = cs.ring_all_reduce(xs)
        assert all(np.isfinite(o).all() for o in outs)
    else:
        with pytest.raises(ValueError, match="xs"):
            cs.ring_all_reduce(xs)
