"""lecture01/bench/gpu_timing.py 的坏输入（在 CPU 上就能查的参数）：cuda_time、wall_per_call、wall_per_call_many、
capture_graph、graph_matches_eager、gpu_meta、nccl_environment。

每个用例断言异常类型和消息里的参数名；检查都在导入 torch、碰 GPU 之前（没有 GPU 的机器上报的也是参数的错，
不是 "CUDA 不可用"）。合法的边界输入（calls = rounds、warmup = 0、numpy 整数、空的 fns）用假时钟核对答案。
"""
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bad_input_cases import Case, check_case, params
from labload import load_lab

GT = load_lab("lecture01/bench", "gpu_timing")

COUNT_BAD = [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError), ("3", TypeError),
             (None, TypeError)]
FN_BAD = [(None, TypeError), (3, TypeError), ("fn", TypeError)]


def _ok():
    return None


def _cases(prefix, fn, arg, bad):
    return [Case(f"{prefix}-{arg}={val!r}", (lambda val=val: fn(val)), exc, arg) for val, exc in bad]


FAKE = SimpleNamespace(__version__="9.9", version=SimpleNamespace(cuda=None),
                       cuda=SimpleNamespace(is_available=lambda: False, get_device_name=None,
                                            nccl=SimpleNamespace(version=lambda: (2, 28, 9))))
TORCH_BAD = [(None, TypeError), ("torch", TypeError), (3, TypeError), (np, TypeError)]

CASES = []
CASES += _cases("cuda_time", lambda x: GT.cuda_time(x, 3), "fn", FN_BAD)
CASES += _cases("cuda_time", lambda x: GT.cuda_time(_ok, x), "reps", COUNT_BAD)
CASES += _cases("cuda_time", lambda x: GT.cuda_time(_ok, 3, trials=x), "trials", COUNT_BAD[:4])
CASES += _cases("cuda_time", lambda x: GT.cuda_time(_ok, 3, warmup=x), "warmup", [(-1, ValueError), (True, TypeError),
                                                                                 (1.5, TypeError)])
CASES += _cases("wall_per_call", lambda x: GT.wall_per_call(x, 3), "fn", FN_BAD + [({"a": _ok}, TypeError)])
CASES += _cases("wall_per_call", lambda x: GT.wall_per_call(_ok, x, trials=1), "calls", COUNT_BAD)
CASES += [Case("wall_per_call-calls<trials", lambda: GT.wall_per_call(_ok, 3, trials=5), ValueError, "calls")]
CASES += _cases("wall_per_call", lambda x: GT.wall_per_call(_ok, 5, warmup=x), "warmup", [(-1, ValueError),
                                                                                        ("1", TypeError)])
CASES += _cases("wall_per_call", lambda x: GT.wall_per_call(_ok, 5, trials=x), "trials", [(0, ValueError),
                                                                                        (True, TypeError)])
CASES += _cases("wall_per_call_many", lambda x: GT.wall_per_call_many(x, 3), "fns",
                [([_ok], TypeError), (None, TypeError), ({"a": 3}, TypeError), ("ab", TypeError), (_ok, TypeError)])
CASES += _cases("wall_per_call_many", lambda x: GT.wall_per_call_many({"a": _ok}, x, rounds=1), "calls",
                COUNT_BAD[:3])
CASES += _cases("wall_per_call_many", lambda x: GT.wall_per_call_many({"a": _ok}, 5, warmup=x), "warmup",
                [(-1, ValueError)])
CASES += _cases("wall_per_call_many", lambda x: GT.wall_per_call_many({"a": _ok}, 5, rounds=x), "rounds",
                [(0, ValueError), (2.5, TypeError), (None, TypeError)])
CASES += _cases("capture_graph", GT.capture_graph, "fn", FN_BAD[:2])
CASES += _cases("capture_graph", lambda x: GT.capture_graph(_ok, calls=x), "calls", COUNT_BAD[:3])
CASES += _cases("capture_graph", lambda x: GT.capture_graph(_ok, warmup=x), "warmup", [(-1, ValueError),
                                                                                     (True, TypeError)])
CASES += _cases("graph_matches_eager", lambda x: GT.graph_matches_eager(x, []), "fn", FN_BAD[:2])
CASES += _cases("graph_matches_eager", lambda x: GT.graph_matches_eager(_ok, x), "inputs",
                [(None, TypeError), (3, TypeError), ([3], TypeError), ("ab", TypeError), ([np.zeros(2)], TypeError),
                 (torch.zeros(2), TypeError)])
CASES += _cases("gpu_meta", GT.gpu_meta, "torch", TORCH_BAD)
CASES += [Case("gpu_meta-extra-overrides-gpu", lambda: GT.gpu_meta(FAKE, gpu="H200"), TypeError, "gpu"),
          Case("gpu_meta-extra-overrides-date", lambda: GT.gpu_meta(FAKE, date="today"), TypeError, "date")]
CASES += _cases("nccl_environment", GT.nccl_environment, "torch", TORCH_BAD)


@params(CASES)
def test_gpu_timing_bad_input(case):
    check_case(case)


def test_gpu_timing_case_count():
    assert len(CASES) >= 30, len(CASES)


@pytest.fixture
def fake_clock(monkeypatch):
    """假时钟：每次调用走 cost 秒；GPU 同步换成空函数（CPU 上也能查主机计时的算术）。"""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return clock


def test_wall_timing_legal_edges(fake_clock):
    calls = []

    def make(name, cost):
        def fn():
            calls.append(name)
            fake_clock[0] += cost
        return fn
    assert GT.wall_per_call(make("a", 2.0), calls=np.int64(3), warmup=0, trials=3) == 2.0     # 每组一次调用
    assert calls == ["a"] * 3
    assert GT.wall_per_call_many({}, calls=5) == {}
    calls.clear()
    out = GT.wall_per_call_many({"x": make("x", 1.0), "y": make("y", 0.5)}, calls=2, warmup=0, rounds=2)
    assert out == {"x": 1.0, "y": 0.5} and calls == ["x", "y", "x", "y"]
    assert GT.wall_per_call(make("b", 1.5), calls=7, warmup=np.int64(1), trials=2) == 1.5  # 7 // 2 = 3 次一组


def test_gpu_meta_legal_edges():
    meta = GT.gpu_meta(FAKE)
    assert meta["gpu"] is None and meta["torch"] == "9.9" and set(meta) == {"gpu", "driver", "torch", "cuda", "triton",
                                                                             "date"}
    assert GT.gpu_meta(FAKE, heads=16, note=None)["heads"] == 16
    assert GT.gpu_meta(torch)["torch"] == torch.__version__
