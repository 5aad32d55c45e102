"""坏输入测试共用的小工具：一个用例 = (标签, 调用, 期望的异常类型, 消息里必须出现的参数名)。

test_bad_inputs_*.py 把每个模块的用例列成表，逐个断言：抛的是期望的异常类型，消息里写出了调用者传的那个参数。
classify(case) 给"改之前"的试跑用：clear（对的异常、写了参数名）/ obscure（别的异常或没写参数名）/
silent（没有报错）/ crash（MemoryError 或超时）。
"""
import re
import signal
from typing import Callable, NamedTuple

import pytest


class Case(NamedTuple):
    label: str
    call: Callable
    exc: type
    name: str


def params(cases):
    """pytest 参数化：每个用例一个测试，标签当 id。"""
    labels = [re.sub(r" at 0x[0-9a-fA-F]+", "", c.label) for c in cases]   # 同一次收集在每个 xdist 进程里都一样
    assert len(set(labels)) == len(labels), "用例标签重复"
    return pytest.mark.parametrize("case", cases, ids=labels)


def names(message, name):
    """消息里有没有这个参数名（整词：'n' 不算在 'operand' 里出现）。"""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def short_repr(value, i):
    """用例 id 里的值：短的写 repr，长的（大数组、嵌套结构）写类型名和序号，id 才读得下去。"""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else f"{type(value).__name__}#{i}"


def cases_for(prefix, fn, arg, bad):
    """一个参数的一串坏值 → 用例：bad = [(值, 期望的异常类型), ...]，fn(值) 应该抛出它，消息里写出 arg。"""
    return [Case(f"{prefix}-{arg}={short_repr(v, i)}", (lambda v=v: fn(v)), exc, arg) for i, (v, exc) in enumerate(bad)]


def generator(seed):
    """固定种子的 torch 随机数发生器。"""
    import torch
    return torch.Generator().manual_seed(seed)


def randn(*shape, dtype=None, seed=0):
    """固定种子的标准正态张量（坏输入测试只要一组确定的合法输入，不关心分布）。"""
    import torch
    return torch.randn(*shape, generator=generator(seed), dtype=dtype or torch.float64)


def check_case(case):
    with pytest.raises(case.exc) as info:
        case.call()
    assert names(str(info.value), case.name), (case.label, str(info.value))


class _Timeout(Exception):
    pass


def classify(case, seconds=20):
    """改之前的试跑：clear / obscure / silent / crash。"""
    def alarm(*_):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        case.call()
    except (MemoryError, _Timeout):
        return "crash"
    except Exception as e:                       # noqa: BLE001  试跑要看到一切异常
        return "clear" if isinstance(e, case.exc) and names(str(e), case.name) else "obscure"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return "silent"
