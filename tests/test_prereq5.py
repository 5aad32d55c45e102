"""预备课 5（comm_sim）的单元测试与性质测试：模拟 = numpy、账本 = α-β 公式、坏输入报错。"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

cs = load_lab("prereq5", "comm_sim")
CU = load_lab("lecture01", "course_utils")

SETTINGS = settings(deadline=None, max_examples=40)
AR_ALGOS = cs.ALGORITHMS["allreduce"]


def rand_bufs(seed, p, n, dtype=np.float64):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-50, 50, size=n).astype(dtype) for _ in range(p)]
    return [rng.standard_normal(n).astype(dtype) for _ in range(p)]


# ---------------------------------------------------------------- 模拟 = numpy
@SETTINGS
@given(p=st.integers(1, 9), n=st.integers(0, 40), seed=st.integers(0, 10**6), algo=st.sampled_from(AR_ALGOS))
def test_allreduce_equals_numpy_any_p_and_n(p, n, seed, algo):
    xs = rand_bufs(seed, p, n)
    outs, ledger = cs.SIMULATORS[("allreduce", algo)](xs)
    ref = np.sum(np.stack(xs), axis=0) if n else np.zeros(0)
    assert len(outs) == p
    for o in outs:
        assert o.shape == (n,) and np.allclose(o, ref, rtol=1e-12, atol=1e-12)
        assert np.array_equal(o, outs[0]), "所有设备的结果应逐位相同"
    if algo == "ring":                                       # 总字节数与 n 能否整除无关
        assert ledger.total_bytes() == 2 * (p - 1) * n * 8


@SETTINGS
@given(p=st.integers(1, 7), n=st.integers(0, 30), seed=st.integers(0, 10**6),
       op=st.sampled_from(["sum", "max", "min"]), algo=st.sampled_from(AR_ALGOS))
def test_integer_allreduce_is_exact(p, n, seed, op, algo):
    xs = rand_bufs(seed, p, n, np.int64)
    outs, _ = cs.SIMULATORS[("allreduce", algo)](xs, op=op)
    ref = getattr(np, op)(np.stack(xs), axis=0) if n else np.zeros(0, np.int64)
    assert all(np.array_equal(o, ref) for o in outs)


@SETTINGS
@given(k=st.integers(0, 3), n=st.integers(0, 40), seed=st.integers(0, 10**6))
def test_reduce_scatter_both_algorithms(k, n, seed):
    p = 1 << k
    xs = rand_bufs(seed, p, n)
    ref = np.array_split(np.sum(np.stack(xs), axis=0), p)
    for fn in (cs.ring_reduce_scatter, cs.rec_halving_reduce_scatter):
        outs, _ = fn(xs)
        assert all(np.allclose(o, r, rtol=1e-12, atol=1e-12) and o.shape == r.shape for o, r in zip(outs, ref))


@SETTINGS
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=8), seed=st.integers(0, 10**6))
def test_allgather_with_unequal_chunks(sizes, seed):
    rng = np.random.default_rng(seed)
    chunks = [rng.standard_normal(s) for s in sizes]
    ref = np.concatenate(chunks)
    outs, ledger = cs.ring_all_gather(chunks)
    assert all(np.array_equal(o, ref) for o in outs)
    p = len(sizes)
    assert ledger.total_bytes() == (p - 1) * ref.nbytes       # 每块都要送到另外 P − 1 个设备
    if p & (p - 1) == 0:
        outs, _ = cs.rec_doubling_all_gather(chunks)
        assert all(np.array_equal(o, ref) for o in outs)


@SETTINGS
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=7), seed=st.integers(0, 10**6))
def test_alltoall_is_a_block_transpose(sizes, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s) for s in sizes]
    p = len(xs)
    outs, ledger = cs.pairwise_all_to_all(xs)
    for d in range(p):
        ref = np.concatenate([np.array_split(x, p)[d] for x in xs])
        assert np.array_equal(outs[d], ref)
    kept = sum(np.array_split(x, p)[r].nbytes for r, x in enumerate(xs))
    assert ledger.total_bytes() == sum(x.nbytes for x in xs) - kept      # 留给自己的块不过链路


@SETTINGS
@given(p=st.integers(1, 9), n=st.integers(0, 30), data=st.data())
def test_broadcast_from_any_root(p, n, data):
    root = data.draw(st.integers(0, p - 1))
    x = np.arange(n, dtype=np.float64) * 1.5 - 7
    for fn in (cs.tree_broadcast, cs.scatter_allgather_broadcast):
        outs, ledger = fn(x, p, root=root)
        assert all(np.array_equal(o, x) for o in outs)
        assert all(m.src != m.dst for m in ledger.messages)
    _, ledger = cs.tree_broadcast(x, p, root=root)
    assert all(m.dst != root for m in ledger.messages), "树形广播：没有人需要给根发数据"
    assert sorted(m.dst for m in ledger.messages) == sorted(set(range(p)) - {root}), "每个非根设备恰好收一次"


def test_simulation_does_not_modify_inputs():
    xs = rand_bufs(1, 5, 13)
    before = [x.copy() for x in xs]
    for algo in AR_ALGOS:
        cs.SIMULATORS[("allreduce", algo)](xs)
    cs.hierarchical_all_reduce(rand_bufs(2, 4, 8), 2)
    assert all(np.array_equal(a, b) for a, b in zip(xs, before))


# ---------------------------------------------------------------- 账本 = 公式
@SETTINGS
@given(p=st.integers(2, 9), k=st.integers(1, 3), key=st.sampled_from(sorted(cs.SIMULATORS)))
def test_ledger_equals_cost_terms(p, k, key):
    coll, algo = key
    if (algo == "rec_halving" or (coll, algo) == ("allgather", "rec_doubling")) and p & (p - 1):
        p = 1 << (p.bit_length() - 1)
    q = 1 << (p.bit_length() - 1)
    n = k * p * q                                           # 能被 P 和 q 整除
    xs = rand_bufs(p + k, p, n)
    if coll == "broadcast":
        _, ledger = cs.SIMULATORS[key](xs[0], p)
    elif coll == "allgather":
        _, ledger = cs.SIMULATORS[key](np.array_split(xs[0], p))
    else:
        _, ledger = cs.SIMULATORS[key](xs)
    got, model = ledger.cost(), cs.cost_terms(coll, n * 8, p, algo)
    assert got.steps == model.steps and math.isclose(got.bytes, model.bytes, rel_tol=1e-12)
    alpha, beta = 2e-6, 1 / 3e9
    assert math.isclose(ledger.time(alpha, beta), model.time(alpha, beta), rel_tol=1e-12)


def test_ring_each_device_sends_2_p_minus_1_over_p_n():
    for p in (2, 3, 5, 8):
        n = 7 * p
        _, ledger = cs.ring_all_reduce(rand_bufs(p, p, n))
        assert np.all(ledger.bytes_sent() == 2 * (p - 1) * 7 * 8)
        assert np.all(ledger.bytes_received() == ledger.bytes_sent())
        links = ledger.link_bytes()
        assert set(links) == {(r, (r + 1) % p) for r in range(p)}, "ring 只用环上相邻的链路"


@SETTINGS
@given(nodes=st.integers(1, 4), g=st.integers(1, 4), k=st.integers(1, 3))
def test_hierarchical_matches_numpy_and_terms(nodes, g, k):
    p, n = nodes * g, k * nodes * g
    xs = rand_bufs(p * 31 + k, p, n)
    outs, ledger = cs.hierarchical_all_reduce(xs, g)
    ref = np.sum(np.stack(xs), axis=0)
    assert all(np.allclose(o, ref, rtol=1e-12, atol=1e-12) for o in outs)
    terms = cs.hierarchical_allreduce_terms(n * 8, nodes, g)
    for kind in ("intra", "inter"):
        c = ledger.cost(kind)
        assert c.steps == terms[kind].steps and math.isclose(c.bytes, terms[kind].bytes, abs_tol=1e-9)
    # 退化情形：1 个节点 = 节点内 ring；每节点 1 块 GPU = 节点间 ring
    if nodes == 1:
        assert terms["inter"].steps == 0 and terms["intra"] == cs.allreduce_terms(n * 8, g)
    if g == 1:
        assert terms["intra"].steps == 0 and terms["inter"] == cs.allreduce_terms(n * 8, nodes)


def test_ledger_enforces_one_port_and_kinds():
    led = cs.Ledger(3)
    led.new_step()
    led.send(0, 1, 8)
    with pytest.raises(RuntimeError):
        led.send(0, 2, 8)                                   # 同一步里发第二条
    with pytest.raises(ValueError, match="inter"):
        led.time({"link": 1.0}, {"inter": 1.0})


# ---------------------------------------------------------------- α-β 模型的性质
@SETTINGS
@given(p=st.integers(2, 300), n=st.floats(1.0, 1e10), alpha=st.floats(1e-7, 1e-4), bw=st.floats(1e9, 1e12))
def test_model_properties(p, n, alpha, bw):
    beta = 1 / bw
    ring = cs.allreduce_time(n, p, alpha, beta, "ring")
    rab = cs.allreduce_time(n, p, alpha, beta, "rabenseifner")
    assert math.isclose(ring, cs.reduce_scatter_time(n, p, alpha, beta) + cs.allgather_time(n, p, alpha, beta))
    if p & (p - 1) == 0:
        assert rab <= ring * (1 + 1e-12), "2 的幂时 Rabenseifner 的两项都不大于 ring"
    # 步数与 n 无关，字节项对 n 线性
    for algo in AR_ALGOS:
        c1, c2 = cs.allreduce_terms(n, p, algo), cs.allreduce_terms(2 * n, p, algo)
        assert c1.steps == c2.steps and math.isclose(c2.bytes, 2 * c1.bytes, rel_tol=1e-12)
    # 交叉点：α 项 = β 项，busbw = 链路带宽的一半
    for coll in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
        ns = cs.crossover_bytes(coll, p, alpha, beta)
        c = cs.cost_terms(coll, ns, p)
        assert math.isclose(c.steps * alpha, c.bytes * beta, rel_tol=1e-9)
        t = c.time(alpha, beta)
        assert math.isclose(cs.busbw(coll, ns, t, p), bw / 2, rel_tol=1e-9)


def test_busbw_definitions_match_nccl_tests():
    p, bw = 8, 450e9
    assert cs.bus_factor("allreduce", p) == 2 * 7 / 8
    for coll in ("allgather", "reduce_scatter", "alltoall"):
        assert cs.bus_factor(coll, p) == 7 / 8
    assert cs.bus_factor("broadcast", p) == 1.0
    for coll in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
        t = cs.cost_terms(coll, 1e9, p).time(0.0, 1 / bw)
        assert math.isclose(cs.busbw(coll, 1e9, t, p), bw), "纯带宽的环形算法：busbw = 链路带宽"
    t_tree = cs.broadcast_time(1e9, p, 0.0, 1 / bw, "tree")
    assert math.isclose(cs.busbw("broadcast", 1e9, t_tree, p), bw / 3), "二项树广播：每步整条消息，lg P 步"


def test_vectorized_sizes_match_scalar_calls():
    sizes = np.array([0.0, 1e3, 7.5e6, 2e9])
    for algo in AR_ALGOS:
        vec = cs.allreduce_time(sizes, p=6, alpha=1e-6, beta=1e-10, algo=algo)
        assert np.allclose(vec, [cs.allreduce_time(float(s), p=6, alpha=1e-6, beta=1e-10,
                                                   algo=algo) for s in sizes], rtol=1e-15)


# ---------------------------------------------------------------- 第 5 讲用的接口
def test_tp_allreduce_time_interface():
    assert cs.tp_allreduce_time(1e6, 1, 450e9) == 0.0
    for tp in (2, 4, 8):
        for algo in AR_ALGOS:
            got = cs.tp_allreduce_time(3.3e6, tp, 450e9, algo=algo)
            assert math.isclose(got, cs.allreduce_time(3.3e6, tp, cs.DEFAULT_ALPHA, 1 / 450e9, algo))
    t = [cs.tp_allreduce_time(1e8, tp, 450e9) for tp in (2, 4, 8)]
    assert t[0] < t[1] < t[2], "ring：2(tp−1)/tp 随 tp 增大"
    assert cs.tp_allreduce_time(np.float64(2.0) * 4096 * 8192, np.int64(8), 300e9, alpha=0.0) > 0
    # 小消息时由 α 主导：8 卡约 14 µs，和 NCCL LL 协议的模型（15 µs）同一量级
    small = cs.tp_allreduce_time(2 * 8192, 8, 450e9)
    assert 0.5 < small / cs.nccl_ring_latency(8, "LL") < 1.5


@pytest.mark.parametrize("call, match", [
    (lambda: cs.tp_allreduce_time(1e6, 0, 450e9), "tp"),
    (lambda: cs.tp_allreduce_time(1e6, 2.5, 450e9), "tp"),
    (lambda: cs.tp_allreduce_time(1e6, 8, 0.0), "link_bw"),
    (lambda: cs.tp_allreduce_time(-1.0, 8, 450e9), "n_bytes"),
    (lambda: cs.tp_allreduce_time(-1.0, 1, 450e9), "n_bytes"),
    (lambda: cs.tp_allreduce_time(1e6, 8, 450e9, algo="nvls"), "ring"),
    (lambda: cs.allreduce_time(n_bytes=1e6, p=4, alpha=-1e-6, beta=1e-9), "alpha"),
    (lambda: cs.allreduce_time(float("nan"), p=4, alpha=1e-6, beta=1e-9), "n_bytes"),
    (lambda: cs.allgather_time(n_bytes=1e6, p=6, alpha=1e-6, beta=1e-9, algo="rec_doubling"), "2 的幂"),
    (lambda: cs.reduce_scatter_terms(1e6, 3, "rec_halving"), "2 的幂"),
    (lambda: cs.rec_halving_reduce_scatter(rand_bufs(0, 6, 12)), "2 的幂"),
    (lambda: cs.cost_terms("gather", 1e6, 4), "allreduce"),
    (lambda: cs.ring_all_reduce([np.ones(3), np.ones(4)]), "长度"),
    (lambda: cs.ring_all_reduce([np.ones(3), np.ones(3, np.float32)]), "dtype"),
    (lambda: cs.ring_all_reduce([np.ones((2, 2))]), "一维"),
    (lambda: cs.ring_all_reduce([]), "P ≥ 1"),
    (lambda: cs.ring_all_reduce([np.ones(3)], op="prod"), "sum"),
    (lambda: cs.tree_broadcast(np.ones(3), 4, root=4), "root"),
    (lambda: cs.hierarchical_all_reduce(rand_bufs(0, 6, 12), 4), "gpus_per_node"),
    (lambda: cs.crossover_bytes("allreduce", p=1, alpha=1e-6, beta=1e-9), "p"),
    (lambda: cs.fit_alpha_beta([1e3, 1e3], [1e-5, 2e-5], p=2), "不同"),
])
def test_bad_inputs_raise_with_named_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_type_errors():
    with pytest.raises(TypeError, match="p"):
        cs.allreduce_time(n_bytes=1e6, p=4.0, alpha=1e-6, beta=1e-9)
    with pytest.raises(TypeError, match="xs"):
        cs.ring_all_reduce(np.ones((4, 3)))
    with pytest.raises(TypeError, match="n_bytes"):
        cs.allreduce_time("1e6", p=4, alpha=1e-6, beta=1e-9)


# ---------------------------------------------------------------- 拟合与表格
@SETTINGS
@given(alpha=st.floats(1e-6, 1e-3), bw=st.floats(1e8, 1e11), p=st.integers(2, 16), seed=st.integers(0, 10**6))
def test_fit_alpha_beta_recovers_parameters(alpha, bw, p, seed):
    sizes = np.geomspace(1e2, 1e9, 12)
    t = cs.allreduce_time(sizes, p, alpha, 1 / bw)
    fit = cs.fit_alpha_beta(sizes, t, p=p)
    assert math.isclose(fit.alpha, alpha, rel_tol=1e-6) and math.isclose(fit.beta, 1 / bw, rel_tol=1e-6)
    noisy = t * np.exp(np.random.default_rng(seed).normal(0, 0.02, size=t.shape))    # 2% 乘性噪声
    fit = cs.fit_alpha_beta(sizes, noisy, p=p)
    assert abs(fit.beta * bw - 1) < 0.1 and fit.max_rel_err < 0.1


def test_format_table_aligns_by_display_width():
    text = cs.format_table(["设备", "bytes"], [["d0", 12], ["长名字", 3456]])
    lines = text.splitlines()
    widths = {CU.display_width(line) for line in lines}
    assert len(lines) == 4 and len(widths) == 1, "表头、分隔线、两行数据的显示宽度相同（中文占两格）"
    with pytest.raises(ValueError, match="rows"):
        cs.format_table(["a", "b"], [[1]])


def test_demos_label_byte_sizes_one_way():
    # 所有演示的字节数都走 course_utils.fmt_bytes（十进制，小写 k：1 kB = 10³ B）；
    # 不许自己除以 1e3/1e6 再手写单位（曾经出现 "4194 KB" 与 "4.19 MB" 并存），也不许写大写的 "KB"
    import pathlib
    import re
    hand_scaled = re.compile(r"/\s*1e\d+[^}]*\}\s*[kKMGT]B(?![/\w])")   # f"{n / 1e3:.0f} KB"；GB/s 不算
    glued = re.compile(r"\}B\b")                                   # f"{n}B" 这种（没有空格、没有换算）
    folder = pathlib.Path(__file__).resolve().parents[1] / "prereq5"
    bad = []
    for path in sorted(folder.glob("0*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bKB\b", line) or hand_scaled.search(line) or glued.search(line):
                bad.append(f"{path.name}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
    assert CU.fmt_bytes(4 * 2 ** 20) == "4.19 MB" and CU.fmt_bytes(1024) == "1.02 kB"


# β < 0 不是答案；非整数的个数全课程同一个约定（TypeError）
def test_fit_alpha_beta_rejects_decreasing_times_and_non_integer_counts():
    n = np.array([1e3, 1e4, 1e5, 1e6])
    with pytest.raises(ValueError, match="斜率"):
        cs.fit_alpha_beta(n, [4e-3, 3e-3, 2e-3, 1e-3], p=4)
    with pytest.raises(TypeError, match="p"):
        cs.allreduce_time(1e6, 2.5, 1e-6, 1e-9)
    lm = load_lab("lecture01", "llm_math")
    with pytest.raises(TypeError, match="d_model"):
        lm.ModelConfig("x", n_layers=2, d_model=2.5, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128, vocab=100)


def test_nccl_environment_builds_on_gpu_meta(monkeypatch, tmp_path):
    """gpu_timing.nccl_environment = gpu_meta + NCCL 版本、NCCL_NVLS_ENABLE、拓扑；没有 nvidia-smi 时照样返回。"""
    from types import SimpleNamespace
    fake_torch = SimpleNamespace(__version__="9.9", version=SimpleNamespace(cuda="12.0"),
                                 cuda=SimpleNamespace(is_available=lambda: True, get_device_name=lambda *a: "FakeGPU",
                                                      nccl=SimpleNamespace(version=lambda: (2, 28, 9))))
    monkeypatch.setenv("PATH", str(tmp_path))                # 找不到 nvidia-smi
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    meta = load_lab("lecture01/bench", "gpu_timing").nccl_environment(fake_torch)
    assert (meta["gpu"], meta["torch"], meta["cuda"], meta["nccl"]) == ("FakeGPU", "9.9", "12.0", "2.28.9")
    assert meta["NCCL_NVLS_ENABLE"] == "0" and meta["driver"] == "unknown"
    assert meta["topology"].startswith("unavailable") and {"date", "triton"} <= set(meta)


def test_gloo_demo_never_oversubscribes_cores():
    # 核数少于进程数时测的是调度（α 被撑大、拟合变差）；演示只用不超过核数的进程数，1 个核时一个也不起
    from labload import load_demo
    demo = load_demo("prereq5", "05_gloo_allreduce_measure.py")
    assert demo.process_counts((2, 4), 2) == ([2], [4])
    assert demo.process_counts((2, 4), 16) == ([2, 4], [])
    assert demo.process_counts((4,), 1) == ([], [4])
    assert demo.process_counts((2,), 1) == ([], [2])           # all-reduce 至少 2 个进程：1 个核时不测（SKIP）
    prev = []
    for cores in range(1, 9):                                     # 重复、乱序的请求：去重、排好；每个数恰好在一边；
        keep, drop = demo.process_counts((4, 2, 2), cores)        # 核越多，留下的只多不少
        assert sorted(keep + drop) == [2, 4] and keep == sorted(keep) and set(prev) <= set(keep), (cores, keep)
        prev = keep
    assert 1 <= demo.usable_cores()
