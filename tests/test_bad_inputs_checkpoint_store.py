"""lecture04/checkpoint_store.py 的坏输入：每个公开入口（canon、state_digest、config_diff、CheckpointStore 的
每个方法、ResultCache、interrupted）、每种坏值。

每个用例断言异常类型和消息里的参数名；坏输入在写任何文件之前就报错（文件夹里什么也不留）。
合法的边界输入：bf16 / float64 / 整数 / bool / 空张量 / 0 维张量的存→读逐位相同；中文名字；旧配置不是字典。
hypothesis：存→读恒等（state_digest 相同）；结果缓存 put→get 恒等；摘要与键的顺序无关。整个文件 < 30 s。
"""
import itertools
import os
import tempfile

import numpy as np
import pytest
import torch
from bad_input_cases import Case, check_case, params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from labload import load_lab

cs = load_lab("lecture04", "checkpoint_store")

NAN, INF = float("nan"), float("inf")
SCRATCH = os.path.join(tempfile.mkdtemp(prefix="bad_inputs_ckpt_"), "store")   # 坏用例不该在这里写下任何东西
STORE = cs.CheckpointStore(SCRATCH, "test")
CACHE = cs.ResultCache(os.path.join(SCRATCH, "cache.json"))


def _build():
    return torch.nn.Sequential(torch.nn.Linear(3, 2))


NET = _build()
OPT = torch.optim.SGD(NET.parameters(), lr=0.1)
STATE = NET.state_dict()
NAME_BAD = [(None, TypeError), (3, TypeError), ("", ValueError), ("a/b", ValueError), ("../x", ValueError)]
JSON_BAD = [({1, 2}, TypeError), (object(), TypeError), (NAN, ValueError), ({"a": INF}, ValueError),
            ({1: "a", "b": 2}, TypeError), (torch.zeros(2), TypeError)]
STATE_BAD = [(None, TypeError), ([], TypeError), ({"w": 3}, TypeError), ({"w": np.zeros(2)}, TypeError),
             ({1: torch.zeros(1)}, TypeError), ("abc", TypeError),
             ({"w": torch.zeros(2, 2).to_sparse()}, TypeError)]


def _show(val):
    """用例 id 里的值：每个 xdist 进程收集到的要一样（临时目录、随机权重的 repr 各不相同）。"""
    if isinstance(val, (dict, torch.Tensor, torch.nn.Module)) and not (isinstance(val, dict) and len(repr(val)) < 60):
        return type(val).__name__
    return repr(val).replace(os.path.dirname(SCRATCH), "<tmp>")


def _cases(prefix, fn, arg, bad):
    return [Case(f"{prefix}-{arg}={_show(val)}", (lambda val=val: fn(val)), exc, arg) for val, exc in bad]


CASES = []
CASES += _cases("canon", cs.canon, "obj", JSON_BAD)
CASES += _cases("state_digest", cs.state_digest, "state", STATE_BAD)
CASES += _cases("config_diff", lambda x: cs.config_diff({}, x), "new",
                [(None, TypeError), ([], TypeError), ("ab", TypeError)])
CASES += _cases("config_diff", lambda x: cs.config_diff({}, {"a": 1}, prefix=x), "prefix",
                [(3, TypeError), (None, TypeError)])
CASES += _cases("CheckpointStore", cs.CheckpointStore, "folder",
                [(None, TypeError), (3, TypeError), ("", ValueError), (b"x", TypeError)])
CASES += _cases("CheckpointStore", lambda x: cs.CheckpointStore(SCRATCH, x), "retrain_hint",
                [(None, TypeError), (3, TypeError)])
CASES += _cases("path", STORE.path, "name", NAME_BAD + [(".", ValueError)])
CASES += _cases("path", lambda x: STORE.path("m", x), "suffix", [(3, TypeError), (None, TypeError)])
# ---- save
REC = {"steps": 2}
CASES += _cases("save", lambda x: STORE.save(x, STATE, {}, REC), "name", NAME_BAD)
CASES += _cases("save", lambda x: STORE.save("m", x, {}, REC), "state", STATE_BAD[:4])
CASES += _cases("save", lambda x: STORE.save("m", STATE, x, REC), "config", JSON_BAD[:4])
CASES += _cases("save", lambda x: STORE.save("m", STATE, {}, x), "record",
                [(None, TypeError), ([], TypeError), ("x", TypeError), ({"steps": 3, "x": {1, 2}}, TypeError),
                 ({"steps": 3, "loss": -INF}, ValueError)])
CASES += _cases("save", lambda x: STORE.save("m", STATE, {}, {"steps": x}), "steps",
                [(True, TypeError), (2.0, TypeError), ("3", TypeError)])
CASES += _cases("save", lambda x: STORE.save("m", STATE, {}, REC, extra_files=x), "extra_files",
                [("curve.csv", TypeError), ([3], TypeError), ([os.path.join(SCRATCH, "missing.csv")], ValueError),
                 (None, TypeError)])
# ---- verify
CASES += _cases("verify", lambda x: STORE.verify(x, {}, _build), "name", NAME_BAD[:4])
CASES += _cases("verify", lambda x: STORE.verify("m", {}, x), "build",
                [(None, TypeError), (3, TypeError), ("ModernLM", TypeError), (NET, TypeError)])
CASES += _cases("verify", lambda x: STORE.verify("m", x, _build), "config", JSON_BAD[:3])
# ---- 续训
CASES += _cases("for_resume", lambda x: cs.CheckpointStore.for_resume(x, "f"), "resume_path",
                [(None, TypeError), (3, TypeError), ("x.pt", ValueError), (".resume.pt", ValueError),
                 ("/tmp/.resume.pt", ValueError)])
CASES += _cases("for_resume", lambda x: cs.CheckpointStore.for_resume("a.resume.pt", x), "where",
                [(3, TypeError), (None, TypeError)])
CASES += _cases("save_resume", lambda x: STORE.save_resume(x, NET, OPT, 1, {}, {}), "name", NAME_BAD[:3])
CASES += _cases("save_resume", lambda x: STORE.save_resume("m", x, OPT, 1, {}, {}), "model",
                [(None, TypeError), (STATE, TypeError)])
CASES += _cases("save_resume", lambda x: STORE.save_resume("m", NET, x, 1, {}, {}), "opt",
                [(None, TypeError), ("adam", TypeError)])
CASES += _cases("save_resume", lambda x: STORE.save_resume("m", NET, OPT, x, {}, {}), "step",
                [(-1, ValueError), (2.5, TypeError), (True, TypeError), ("3", TypeError), (None, TypeError)])
CASES += _cases("save_resume", lambda x: STORE.save_resume("m", NET, OPT, 1, x, {}), "config", JSON_BAD[:2])
CASES += _cases("save_resume", lambda x: STORE.save_resume("m", NET, OPT, 1, {}, x), "meta",
                [({1}, TypeError), ({"s": NAN}, ValueError)])
CASES += _cases("load_resume", lambda x: STORE.load_resume(x, NET, OPT, {}), "name", NAME_BAD[:3])
CASES += _cases("load_resume", lambda x: STORE.load_resume("m", x, OPT, {}), "model",
                [(None, TypeError), (STATE, TypeError)])
CASES += _cases("load_resume", lambda x: STORE.load_resume("m", NET, x, {}), "opt",
                [(None, TypeError), ("adam", TypeError)])
CASES += _cases("load_resume", lambda x: STORE.load_resume("m", NET, OPT, {}, log=x), "log",
                [("print", TypeError), (3, TypeError)])
CASES += _cases("load_resume", lambda x: STORE.load_resume("m", NET, OPT, x), "config", JSON_BAD[:2])
CASES += _cases("drop_resume", STORE.drop_resume, "name", NAME_BAD[:4])
# ---- 结果缓存
CASES += _cases("ResultCache", cs.ResultCache, "path", [(None, TypeError), (3, TypeError), ("", ValueError)])
CASES += _cases("get", CACHE.get, "key", JSON_BAD[:4])
CASES += _cases("put", lambda x: CACHE.put(x, {"a": 1}), "key", JSON_BAD[:3])
CASES += _cases("put", lambda x: CACHE.put({"k": 1}, x), "value",
                [(None, TypeError), ([1, 2], TypeError), ("x", TypeError), ({"a": NAN}, ValueError),
                 ({1: 2}, TypeError), ({"a": {1}}, TypeError)])
CASES += _cases("put", lambda x: CACHE.put({"k": 1}, {"a": 1}, label=x), "label", [(3, TypeError), (None, TypeError)])
# ---- Ctrl-C 的一行话
CASES += _cases("interrupted", lambda x: cs.interrupted(x, 1, 2, "a.resume.pt"), "name", [(None, TypeError),
                                                                                          (3, TypeError)])
CASES += _cases("interrupted", lambda x: cs.interrupted("m", x, 2, "a.resume.pt"), "step",
                [(-1, ValueError), (2.5, TypeError), ("3", TypeError)])
CASES += _cases("interrupted", lambda x: cs.interrupted("m", 1, x, "a.resume.pt"), "total",
                [(0, ValueError), ("x", TypeError), (True, TypeError)])
CASES += [Case("interrupted-step>total", lambda: cs.interrupted("m", 3, 2, "a.resume.pt"), ValueError, "step")]
CASES += _cases("interrupted", lambda x: cs.interrupted("m", 1, 2, x), "resume_path",
                [(3, TypeError), (None, TypeError)])


@params(CASES)
def test_checkpoint_store_bad_input(case):
    check_case(case)


def test_checkpoint_store_case_count():
    assert len(CASES) >= 100, len(CASES)


def test_bad_inputs_write_nothing():
    """坏输入在写任何文件之前报错：试过全部用例后，临时文件夹里没有 .pt、没有 manifest、没有缓存文件。"""
    for case in CASES:
        with pytest.raises(case.exc):
            case.call()
    left = os.listdir(SCRATCH) if os.path.isdir(SCRATCH) else []
    assert left == [], left


# =============================================================================
# 合法的边界输入
# =============================================================================
def _odd_state():
    g = torch.Generator().manual_seed(7)
    return {"bf16": torch.randn(3, 5, generator=g).bfloat16(), "f64": torch.randn(4, generator=g, dtype=torch.float64),
            "i64": torch.randint(-9, 9, (2, 3), generator=g), "flag": torch.tensor([True, False]),
            "empty": torch.zeros(0, 4), "scalar": torch.tensor(-0.0), "strided": torch.arange(12.0).view(3, 4).t()}


class _Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for key, val in _odd_state().items():
            self.register_buffer(key, torch.zeros_like(val.contiguous()))


def test_round_trip_is_bit_identical_for_odd_tensors(tmp_path):
    state = _odd_state()
    store = cs.CheckpointStore(tmp_path / "模型", "重训命令")            # PathLike、中文文件夹
    store.save("小模型", state, {"t": (1, 2), "lr": 1e-3}, {"steps": np.int64(1), "curve": [[1, 2.5]]})
    plain = torch.load(store.path("小模型"), weights_only=True)             # 逐位（含 −0.0、0 维、转置过的）
    assert plain.keys() == state.keys()
    for key, val in state.items():
        assert plain[key].dtype == val.dtype and plain[key].shape == val.shape
        assert plain[key].reshape(-1).view(torch.uint8).tolist() == val.reshape(-1).view(torch.uint8).tolist(), key
    model, why, rec = store.verify("小模型", {"t": [1, 2], "lr": 1e-3}, _Holder)    # 元组 = 列表（规范 JSON）
    assert why == "ok" and rec == {"steps": 1, "curve": [[1, 2.5]]}
    assert cs.state_digest(model.state_dict()) == cs.state_digest({k: v.contiguous() for k, v in state.items()})


def test_other_legal_edges(tmp_path):
    assert cs.config_diff(None, {"a": 1}) == ["a: '缺' → 1"]                      # 旧配置不是字典：当作空的
    assert cs.config_diff({"a": {"b": 1}}, {"a": {"b": 2}}, prefix="x.") == ["x.a.b: 1 → 2"]
    assert cs.canon({"b": (1, 2), "a": None}) == {"a": None, "b": [1, 2]}
    assert cs.state_digest({}) == cs.state_digest({}) and len(cs.state_digest({})) == 64
    store = cs.CheckpointStore(str(tmp_path))
    assert store.verify("nothing", {}, _build) == (None, "缺文件 nothing.pt", None)
    assert store.load_resume("nothing", NET, OPT, {}, log=None) == (0, None)
    store.drop_resume("nothing")                                               # 不存在：什么也不做
    assert "第 2/2 步" in str(cs.interrupted("m", 2, 2, tmp_path / "m.resume.pt"))
    assert "第 0/3 步" in str(cs.interrupted("m", np.int64(0), 3, "m.resume.pt"))
    s, name = cs.CheckpointStore.for_resume(tmp_path / "a.b.resume.pt", "f")
    assert name == "a.b" and s.folder == str(tmp_path)
    store.save_resume("m", NET, OPT, 0, {"a": 1}, {"seconds": 0.0})
    fresh = _build()
    assert store.load_resume("m", fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), {"a": 1}, log=None) == \
        (0, {"seconds": 0.0})
    cache = cs.ResultCache(tmp_path / "sub" / "c.json")
    cache.put({"k": 1}, {})
    assert cache.get({"k": 1}) == {} and cache.get({"k": 2}) is None


_FRESH = itertools.count()
_KEY = st.text("abcxyz", min_size=1, max_size=4)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10 ** 6, 10 ** 6) | st.floats(allow_nan=False,
                                                                                            allow_infinity=False)
                     | st.text(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(_KEY, c, max_size=3),
                     max_leaves=8)


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8]),
       seed=st.integers(0, 2 ** 31))
def test_save_then_load_is_identity(tmp_path, shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    state = {f"t{i}": (torch.randn(s, generator=g) * 50).abs().to(dtype) for i, s in enumerate(shapes)}
    store = cs.CheckpointStore(str(tmp_path / f"s{next(_FRESH)}"))
    store.save("m", state, {"seed": seed}, {"steps": 1})
    back = torch.load(store.path("m"), weights_only=True)
    assert cs.state_digest(back) == cs.state_digest(state)



@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.dictionaries(_KEY, _JSON, max_size=4), value=st.dictionaries(_KEY, _JSON, max_size=4))
def test_cache_put_then_get_is_identity(tmp_path, key, value):
    cache = cs.ResultCache(str(tmp_path / f"c{next(_FRESH)}.json"))             # 每个例子一个新文件（put 会合并）
    cache.put(key, value)
    assert cache.get(key) == cs.canon(value) == cs.canon(cs.canon(value))
    assert cs._digest(key) == cs._digest(dict(reversed(list(key.items())))) == cs._digest(cs.canon(key))
