"""lecture19/ring_dist.py 的坏输入：每个公开入口（ring_attention_dist、RingEvents、uncovered / covered /
timeline_summary、init_distributed、run_ring、make_qkv、full_attention）、每种坏值。

每个用例断言异常类型和消息里的参数名；坏输入在起进程、建进程组、分配之前就报错（run_ring 的坏用例一个进程也不起）。
合法的边界输入：单进程的进程组（gloo，world = 1）上的 ring_attention_dist = full_attention（float64，max-abs < 1e-12）；
2 个进程、gloo、最小的 N（每个进程一个 token）的 run_ring = full_attention。hypothesis：
uncovered + covered = 区间长度，露在外面的几段互不相交、不被任何 spans 盖住。整个文件在 2 核 CPU 上 < 30 s。
"""
import contextlib
import importlib.util
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from bad_input_cases import Case, check_case, params
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

RD = load_lab("lecture19", "ring_dist")

SEED = 20261219
print(f"test_bad_inputs_ring_dist 的随机种子 {SEED}")
F64 = torch.float64
NAN, INF = float("nan"), float("inf")
HUGE = 10 ** 12
INT_BAD = [(True, TypeError), ("3", TypeError), (None, TypeError), (2.5, TypeError), (2.0, TypeError),
           (0, ValueError), (-1, ValueError)]
FLAG_BAD = [("False", TypeError), (1, TypeError), (None, TypeError), (0.0, TypeError)]
NO_CUDA = not torch.cuda.is_available()


def _r(*shape, dtype=F64, seed=SEED):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


q, k, v = (_r(6, 4, seed=SEED + i) for i in range(3))


def _nan(t):
    t = t.clone()
    t.view(-1)[0] = NAN
    return t


def _rad(**kw):
    args = dict(q=q, k=k, v=v)
    args.update(kw)
    return RD.ring_attention_dist(**args)


@contextlib.contextmanager
def _env(**kw):
    """暂时改环境变量（值为 None 的删掉），退出时原样恢复。"""
    old = {key: os.environ.get(key) for key in kw}
    try:
        for key, val in kw.items():
            os.environ.pop(key, None) if val is None else os.environ.__setitem__(key, val)
        yield
    finally:
        for key, val in old.items():
            os.environ.pop(key, None) if val is None else os.environ.__setitem__(key, val)


GOOD_ENV = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", LOCAL_RANK="0")


def _init(backend=None, **env):
    with _env(**dict(GOOD_ENV, **env)):
        return RD.init_distributed(backend)


def _job(**kw):
    return dict(dict(N=4, d=2), **kw)


def _cases(prefix, fn, arg, bad):
    return [Case(f"{prefix}-{arg}={val!r}", (lambda val=val: fn(val)), exc, arg) for val, exc in bad]


# =============================================================================
# make_qkv / full_attention
# =============================================================================
CASES = []
CASES += _cases("make_qkv", lambda x: RD.make_qkv(x, 4, 0), "N", INT_BAD)
CASES += _cases("make_qkv", lambda x: RD.make_qkv(8, x, 0), "d", INT_BAD)
CASES += _cases("make_qkv", lambda x: RD.make_qkv(8, 4, 0, heads=x), "heads",
                INT_BAD[:2] + INT_BAD[3:])                           # None 是合法的：没有头维
CASES += _cases("make_qkv", lambda x: RD.make_qkv(8, 4, x), "seed",
                [(True, TypeError), ("0", TypeError), (None, TypeError), (1.5, TypeError), (2 ** 64, ValueError)])
CASES += _cases("make_qkv", lambda x: RD.make_qkv(8, 4, 0, dtype=x), "dtype",
                [("float64", TypeError), (torch.int64, TypeError), (torch.bool, TypeError), (None, TypeError),
                 (np.float64, TypeError), (torch.complex128, TypeError)])
CASES += [
    Case("make_qkv-N-too-big", lambda: RD.make_qkv(HUGE, 4, 0), ValueError, "N"),
    Case("make_qkv-d-too-big", lambda: RD.make_qkv(8, HUGE, 0), ValueError, "d"),
    Case("make_qkv-heads-too-big", lambda: RD.make_qkv(8, 4, 0, heads=HUGE), ValueError, "heads"),
]
CASES += _cases("full_attention", lambda x: RD.full_attention(q, k, v, causal=x), "causal", FLAG_BAD[:3])
CASES += [
    Case("full_attention-Q-list", lambda: RD.full_attention(q.tolist(), k, v), TypeError, "Q"),
    Case("full_attention-Q-numpy", lambda: RD.full_attention(q.numpy(), k, v), TypeError, "Q"),
    Case("full_attention-K-int", lambda: RD.full_attention(q, k.long(), v), TypeError, "K"),
    Case("full_attention-V-float32", lambda: RD.full_attention(q, k, v.float()), TypeError, "V"),
    Case("full_attention-K-shape", lambda: RD.full_attention(q, k[:5], v), ValueError, "K"),
    Case("full_attention-V-shape", lambda: RD.full_attention(q, k, v[:, :3]), ValueError, "V"),
    Case("full_attention-Q-1d", lambda: RD.full_attention(q[0], k[0], v[0]), ValueError, "Q"),
    Case("full_attention-Q-nan", lambda: RD.full_attention(_nan(q), k, v), ValueError, "Q"),
    Case("full_attention-V-inf", lambda: RD.full_attention(q, k, v / 0), ValueError, "V"),
    Case("full_attention-d=0", lambda: RD.full_attention(q[:, :0], k[:, :0], v[:, :0]), ValueError, "Q"),
]

# =============================================================================
# ring_attention_dist（坏输入在碰进程组之前就报错：这里没有进程组）
# =============================================================================
CASES += _cases("ring_attention_dist", lambda x: _rad(causal=x), "causal", FLAG_BAD)
CASES += _cases("ring_attention_dist", lambda x: _rad(overlap=x), "overlap", FLAG_BAD)
CASES += _cases("ring_attention_dist", lambda x: _rad(layout=x), "layout",
                [("stripe", ValueError), (None, ValueError), (0, ValueError), ("Contiguous", ValueError)])
CASES += _cases("ring_attention_dist", lambda x: _rad(stats=x), "stats",
                [([], TypeError), ("rounds", TypeError), (3, TypeError)])
CASES += _cases("ring_attention_dist", lambda x: _rad(block=x), "block", [(3, TypeError), ("flash", TypeError)])
CASES += _cases("ring_attention_dist", lambda x: _rad(events=x), "events",
                [("cpu", TypeError), (object(), TypeError), ({}, TypeError)])
CASES += _cases("ring_attention_dist", lambda x: _rad(group=x), "group", [("world", TypeError), (0, TypeError)])
CASES += [
    Case("ring_attention_dist-q-list", lambda: _rad(q=q.tolist()), TypeError, "q"),
    Case("ring_attention_dist-k-int", lambda: _rad(k=k.long()), TypeError, "k"),
    Case("ring_attention_dist-v-float32", lambda: _rad(v=v.float()), TypeError, "v"),
    Case("ring_attention_dist-k-shape", lambda: _rad(k=k[:5]), ValueError, "k"),
    Case("ring_attention_dist-v-shape", lambda: _rad(v=v[:, :2]), ValueError, "v"),
    Case("ring_attention_dist-q-1d", lambda: _rad(q=q[0], k=k[0], v=v[0]), ValueError, "q"),
    Case("ring_attention_dist-q-nan", lambda: _rad(q=_nan(q)), ValueError, "q"),
    Case("ring_attention_dist-v-inf", lambda: _rad(v=v / 0), ValueError, "v"),
    Case("ring_attention_dist-d=0", lambda: _rad(q=q[:, :0], k=k[:, :0], v=v[:, :0]), ValueError, "q"),
    Case("ring_attention_dist-no-process-group", lambda: _rad(), RuntimeError, "init_distributed"),
]

# =============================================================================
# RingEvents / uncovered / covered / timeline_summary
# =============================================================================
CASES += _cases("RingEvents", RD.RingEvents, "device",
                [("gpu", ValueError), (3.5, TypeError), (None, TypeError), ([], TypeError)]
                + ([("cuda", ValueError)] if NO_CUDA else []))
CASES += [Case("RingEvents-timeline-before-ring", lambda: RD.RingEvents("cpu").timeline(), RuntimeError,
               "ring_attention_dist")]
SPAN_BAD = [((2.0, 1.0), ValueError), ("ab", TypeError), ((1.0,), TypeError), ((NAN, 1.0), ValueError),
            ((0.0, INF), ValueError), ((True, 2.0), TypeError), (None, TypeError), ((0.0, "1"), TypeError)]
SPANS_BAD = [(None, TypeError), ([(1.0,)], TypeError), ([(2.0, 1.0)], ValueError), ([("a", "b")], TypeError),
             ([(NAN, 1.0)], ValueError), ("ab", TypeError), (3, TypeError), ([None], TypeError)]
for _fn in (RD.uncovered, RD.covered):
    CASES += _cases(_fn.__name__, lambda x, f=_fn: f(x, [(0.0, 1.0)]), "span", SPAN_BAD)
    CASES += _cases(_fn.__name__, lambda x, f=_fn: f((0.0, 3.0), x), "spans", SPANS_BAD)
GOOD_TL = {"ring_s": 5.0, "rounds": [{"compute": (0.0, 2.0), "comm": (1.0, 3.0)},
                                     {"compute": (3.0, 4.0), "comm": None}]}


def _tl(**kw):
    return dict(GOOD_TL, **kw)


CASES += _cases("timeline_summary", RD.timeline_summary, "tl", [
    (None, TypeError), ([], TypeError), ({}, ValueError), ({"rounds": []}, ValueError),
    (_tl(ring_s="5"), TypeError), (_tl(ring_s=NAN), ValueError), (_tl(ring_s=-1.0), ValueError),
    (_tl(rounds="ab"), TypeError), (_tl(rounds=[3]), TypeError), (_tl(rounds=[{"comm": None}]), ValueError),
    (_tl(rounds=[{"compute": (2.0, 1.0), "comm": None}]), ValueError),
    (_tl(rounds=[{"compute": (0.0, 1.0), "comm": "x"}]), TypeError),
    (_tl(rounds=[{"compute": (0.0, 1.0), "comm": (NAN, 1.0)}]), ValueError),
])

# =============================================================================
# init_distributed（坏的环境变量在建进程组之前就报错）
# =============================================================================
CASES += _cases("init_distributed", _init, "backend",
                [("mpi", ValueError), (3, ValueError), ("NCCL", ValueError)]
                + ([("nccl", ValueError)] if NO_CUDA else []))
CASES += [
    Case("init_distributed-no-RANK", lambda: _init(RANK=None), ValueError, "RANK"),
    Case("init_distributed-WORLD_SIZE-text", lambda: _init(WORLD_SIZE="two"), ValueError, "WORLD_SIZE"),
    Case("init_distributed-WORLD_SIZE=0", lambda: _init(WORLD_SIZE="0"), ValueError, "WORLD_SIZE"),
    Case("init_distributed-RANK>=WORLD_SIZE", lambda: _init(RANK="1"), ValueError, "RANK"),
    Case("init_distributed-no-MASTER_ADDR", lambda: _init(MASTER_ADDR=None), ValueError, "MASTER_ADDR"),
    Case("init_distributed-MASTER_PORT-text", lambda: _init(MASTER_PORT="x"), ValueError, "MASTER_PORT"),
    Case("init_distributed-MASTER_PORT-range", lambda: _init(MASTER_PORT="70000"), ValueError, "MASTER_PORT"),
    Case("init_distributed-LOCAL_RANK-text", lambda: _init(LOCAL_RANK="a"), ValueError, "LOCAL_RANK"),
]

# =============================================================================
# run_ring（坏用例一个进程也不起）
# =============================================================================
CASES += _cases("run_ring", lambda x: RD.run_ring(x, [_job()]), "P",
                [(True, TypeError), ("2", TypeError), (None, TypeError), (2.0, TypeError), (-1, ValueError),
                 (10 ** 6, ValueError)])
CASES += _cases("run_ring", lambda x: RD.run_ring(2, x), "jobs",
                [(None, TypeError), ("N=4", TypeError), ([3], TypeError), ([[("N", 4)]], TypeError), (3, TypeError)])
CASES += _cases("run_ring", lambda x: RD.run_ring(2, [_job()], backend=x), "backend",
                [("mpi", ValueError), (None, ValueError)] + ([("nccl", ValueError)] if NO_CUDA else []))
for _arg, _bad in (("N", INT_BAD), ("d", INT_BAD[:4] + INT_BAD[5:]), ("heads", INT_BAD[:2] + INT_BAD[5:]),
                   ("seed", [(True, TypeError), (-1, ValueError), ("0", TypeError), (2 ** 64, ValueError)]),
                   ("events", FLAG_BAD[:2]), ("causal", FLAG_BAD[:1] + FLAG_BAD[2:3]),
                   ("layout", [("zigzag", ValueError), (None, ValueError)])):
    CASES += _cases("run_ring-job", lambda x, a=_arg: RD.run_ring(2, [_job(**{a: x})]), _arg, _bad)
CASES += [
    Case("run_ring-job-missing-d", lambda: RD.run_ring(2, [dict(N=4)]), TypeError, "d"),
    Case("run_ring-job-typo-key", lambda: RD.run_ring(2, [_job(casual=True)]), ValueError, "casual"),
    Case("run_ring-job-N-too-big", lambda: RD.run_ring(2, [_job(N=2 * HUGE)]), ValueError, "N"),
    Case("run_ring-job-d-too-big", lambda: RD.run_ring(2, [_job(d=HUGE)]), ValueError, "d"),
    Case("run_ring-second-job-bad", lambda: RD.run_ring(2, [_job(), _job(layout="x")]), ValueError, "layout"),
]


@params(CASES)
def test_ring_dist_bad_input(case):
    check_case(case)


def test_ring_dist_case_count():
    assert len(CASES) >= 100, len(CASES)


# =============================================================================
# 合法的边界输入
# =============================================================================
@pytest.fixture
def world_of_one(tmp_path):
    """本进程里一个 world = 1 的 gloo 进程组（FileStore，不占端口），测完拆掉。"""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ring_attention_dist_world_of_one_equals_full_attention(world_of_one):
    """P = 1：没有收发，一块就是整条序列；各种边界（N = 1、d = 1、头维、float64）都和 full_attention 一样。"""
    for N, d, heads in ((1, 1, None), (7, 3, None), (5, 2, 3), (1, 4, 2)):
        Q, K, V = RD.make_qkv(N, d, SEED + N, heads)
        for causal in (True, False):
            for layout in ("contiguous", "striped"):
                stats, ev = {}, RD.RingEvents("cpu")
                O = RD.ring_attention_dist(Q, K, V, causal, layout, stats=stats, events=ev, overlap=False)
                assert O.shape == Q.shape and O.dtype == F64
                assert (O - RD.full_attention(Q, K, V, causal)).abs().max() < 1e-12
                assert [r["sent"] for r in stats["rounds"]] == [0]
                tl = ev.timeline()
                assert len(tl["rounds"]) == 1 and tl["rounds"][0]["comm"] is None
                assert RD.timeline_summary(tl)["overlap"] is None
    g = dist.new_group([0])                                        # 显式给进程组：同样的答案
    Q, K, V = RD.make_qkv(6, 2, SEED, None)
    O = RD.ring_attention_dist(Q, K, V, group=g, causal=False)
    assert (O - RD.full_attention(Q, K, V, False)).abs().max() < 1e-12
    assert RD.init_distributed("gloo")[:2] == (0, 1)                  # 已经加入了：原样返回


def test_run_ring_smallest_legal_jobs():
    """2 个进程、gloo：每个进程一个 token（N = P）、d = 1、头维 1、numpy 整数；空任务表不起进程。"""
    assert RD.run_ring(2, []) == []
    jobs = [dict(N=2, d=1, causal=True, layout="striped", seed=1), dict(N=np.int64(2), d=3, causal=False, heads=1,
                                                                         seed=2, events=True)]
    for job, (O, stats) in zip(jobs, RD.run_ring(2, jobs)):
        Q, K, V = RD.make_qkv(int(job["N"]), job["d"], job["seed"], job.get("heads"))
        assert O.shape == Q.shape
        assert (O - RD.full_attention(Q, K, V, job["causal"])).abs().max() < 1e-12
        assert len(stats) == 2


def test_make_qkv_legal_edges():
    Q, K, V = RD.make_qkv(np.int64(3), 2, 2 ** 64 - 1, dtype=torch.float32)
    assert Q.shape == (3, 2) and Q.dtype == torch.float32 and not torch.equal(Q, K)
    assert all(torch.equal(a, b) for a, b in zip(RD.make_qkv(3, 2, 5, 1), RD.make_qkv(3, 2, 5, 1)))
    assert RD.make_qkv(1, 1, 0, heads=2)[0].shape == (2, 1, 1)


def test_interval_edges():
    assert RD.uncovered((1.0, 1.0), []) == [] and RD.covered((1.0, 1.0), [(0.0, 2.0)]) == 0.0
    assert RD.uncovered((0, 4), [(1, 2)]) == [(0, 1), (2, 4)]                     # 整数端点原样返回
    assert RD.covered((0.0, 4.0), ((1.0, 2.0), [2.0, 3.0], np.array([3.5, 9.0]))) == 2.5
    s = RD.timeline_summary({"ring_s": 0.0, "rounds": []})
    assert s["overlap"] is None and s["compute_s"] == 0 and s["exposed_s"] == 0.0


_T = st.floats(-50, 50, allow_nan=False)


@settings(deadline=None, max_examples=60)
@given(a=_T, b=_T, spans=st.lists(st.tuples(_T, _T).map(sorted), max_size=6))
def test_uncovered_plus_covered_is_the_length(a, b, spans):
    span = (min(a, b), max(a, b))
    free = RD.uncovered(span, spans)
    tol = 1e-9 * (1 + abs(a) + abs(b))
    assert abs(RD.covered(span, spans) + sum(e - s for s, e in free) - (span[1] - span[0])) <= tol
    assert all(span[0] <= s < e <= span[1] for s, e in free)
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(free, free[1:]))
    for s, e in free:                                             # 露在外面的一段，中点不在任何 spans 里
        m = (s + e) / 2
        assert not any(lo < m < hi for lo, hi in spans)


def test_device_check_is_the_shared_one():
    """ring_dist、long_lab、step_bench、triton_flash、gluon_flash 的设备检查是 course_utils.check_device
    这一份；它的约定：
    整数 N = cuda:N，bool / 浮点数 → TypeError（type_error 可换），没有的 GPU、不允许的种类 → ValueError
    （error 可换）。"""
    cu = load_lab("lecture01", "course_utils")
    users = [RD, load_lab("lecture19", "long_lab"), load_lab("lecture05", "step_bench")]
    if importlib.util.find_spec("triton") is not None:
        users += [load_lab("lecture11", "triton_flash"), load_lab("lecture11", "gluon_flash")]
    for mod in users:
        assert mod.check_device.__code__ is cu.check_device.__code__, mod.__name__
        assert not hasattr(mod, "_check_device"), mod.__name__
    assert cu.check_device("device", "cpu") == torch.device("cpu")
    assert cu.check_device("device", torch.device("cpu"), kinds=("cpu",)).type == "cpu"
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for bad, err in [(True, TypeError), (1.5, TypeError), (None, TypeError), ("gpu", ValueError),
                     ("meta", ValueError), (n_gpu, ValueError), (f"cuda:{n_gpu}", ValueError), (-1, ValueError)]:
        with pytest.raises(err, match="device"):
            cu.check_device("device", bad, where="w")
    with pytest.raises(ValueError, match="w：device"):
        cu.check_device("device", [0], where="w", type_error=ValueError)
    with pytest.raises(RuntimeError, match="Hopper"):
        cu.check_device("q", torch.device("cpu"), kinds=("cuda",), error=RuntimeError, hint="（要 Hopper）")
