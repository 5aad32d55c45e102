"""练习评分的公共部件：每个练习的检查登记在这里，错误答案语料也用它来替换实现。

一个"检查"（check）是不带参数的函数，用 `@exercise("11.2")` 标出它给哪个练习打分：
    - 它同时是一个 pytest 测试（带 `pytest.mark.exercise("11.2")` 标记），`make test` 和 `make grade` 都跑它；
    - 它登记在 CHECKS["11.2"] 里，错误答案语料（wrong_<讲次>.py）把实验模块里的函数换成错误版本后，
      直接调用这些检查，要求至少一个失败。
检查通过实验模块的属性调用被测函数（`flash_lab.merge_states(...)`，不要 `from flash_lab import merge_states`），
这样替换才生效；失败时用 `expect(条件, "中文：第一条没满足的性质")` 给出学生看得懂的一句话。
"""
import ast
import contextlib
import functools
import inspect
import os
import re
import sys
import textwrap
from typing import Callable, NamedTuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
from labload import load_lab  # noqa: E402

CHECKS = {}          # 练习编号 -> [检查函数, ...]（按定义顺序）
PREDICTIONS = set()  # 预测练习的编号：学生写数字，不写代码，所以没有错误答案语料


def exercise(ex_id):
    """把一个不带参数的检查函数登记为练习 ex_id 的评分测试。"""
    if not isinstance(ex_id, str) or "." not in ex_id:
        raise ValueError(f"ex_id 要写成 '11.2' 这样的字符串，收到 {ex_id!r}")

    def deco(fn):
        if inspect.signature(fn).parameters:
            raise TypeError(f"{fn.__name__}：练习检查不能带参数（错误答案语料要直接调用它）")
        CHECKS.setdefault(ex_id, []).append(fn)
        return pytest.mark.exercise(ex_id)(fn)
    return deco


def expect(cond, message):
    """条件不成立时以一句中文说明失败（评分报告里"第一条没满足的性质"就是它）。"""
    if not cond:
        raise AssertionError(message)


def close(actual, expected, atol, rtol, message):
    """逐元素比较：最大绝对误差和相对误差都要在界内（几行错的结果在范数里会被淹没，所以看 max-abs）。"""
    import numpy as np
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    expect(a.shape == e.shape, f"{message}：形状应为 {e.shape}，得到 {a.shape}")
    expect(bool(np.all(np.isfinite(a)) or np.array_equal(np.isfinite(a), np.isfinite(e))),
           f"{message}：结果里有 NaN/inf")
    err = np.abs(a - e)
    bound = atol + rtol * np.abs(e)
    bad = ~(err <= bound)
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(bad, err, -1))), a.shape)) if a.ndim else ()
        raise AssertionError(f"{message}（最大绝对误差 {float(err.max()):.3g}，位置 {idx}："
                             f"得到 {float(a[idx]):.6g}，应为 {float(e[idx]):.6g}）")


def module(folder, name):
    """按路径加载实验模块（与 tests/ 里别的测试共用同一个模块对象）。"""
    return load_lab(folder, name)


def called_names(fn):
    """函数源码里调用到的名字（`f(...)` 的 f、`m.f(...)` 的 f）。用来检查练习函数没有调用课程自己的参考实现。"""
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                names.add(f.id)
            elif isinstance(f, ast.Attribute):
                names.add(f.attr)
    return names


_HOLE_RAISE = re.compile(r"NotImplementedError\((['\"])(练习 (?:P?\d+)\.\d+ 未完成[：:].*?)\1\)")


def expect_no_calls(fn, forbidden, why="练习函数要自己写出计算"):
    """fn 的源码里没有调用 forbidden 里的名字。fn 还是学生树里的留空处（只有一行 raise）时，这条检查也不能算通过：
    照样抛出那个 NotImplementedError（学生树里每个检查都要以它自己练习的 NotImplementedError 失败）。"""
    hole = _HOLE_RAISE.search(inspect.getsource(inspect.unwrap(fn)))
    if hole:
        raise NotImplementedError(hole.group(2))
    used = called_names(fn) & set(forbidden)
    expect(not used, f"{fn.__qualname__} 调用了 {sorted(used)}：{why}，不能调用课程的参考实现")


class Wrong(NamedTuple):
    """错误答案语料的一项：把 folder/name 模块里的 attr（可带点，如 'ModelConfig.n_params'）换成 fn。"""
    ex: str
    folder: str
    name: str
    attr: str
    label: str            # 这个错误是什么（中文，一句话）
    fn: Callable
    says: str = None      # 给了的话：某个失败的检查的消息里要有这句话（评分说对了错在哪，不只是"不对"）


@contextlib.contextmanager
def patched(folder, name, attr, value):
    """暂时把模块属性（或类属性）换掉，离开时还原。"""
    owner = module(folder, name)
    *path, last = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    old = owner.__dict__[last] if isinstance(owner, type) else getattr(owner, last)
    setattr(owner, last, value)
    try:
        yield
    finally:
        setattr(owner, last, old)


def run_checks(ex_id):
    """依次调用练习 ex_id 的全部检查；返回 [(检查名, 异常或 None)]。"""
    out = []
    for check in CHECKS.get(ex_id, []):
        try:
            check()
            out.append((check.__name__, None))
        except Exception as e:           # 检查失败或被测函数出错，都算"这个错误答案被拒绝"
            out.append((check.__name__, e))
    return out


@functools.lru_cache(maxsize=None)
def load_exercise_tests():
    """导入 tests/exercises/test_ex_*.py 和 test_predictions.py，让 CHECKS 完整（错误答案语料测试要用全部检查）。"""
    import importlib
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    for fn in sorted(os.listdir(HERE)):
        if (fn.startswith("test_ex_") or fn == "test_predictions.py") and fn.endswith(".py"):
            importlib.import_module(fn[:-3])
    return dict(CHECKS)
