"""错误答案语料：每个练习至少两个"看起来对、其实错"的实现，每一个都必须让该练习至少一个检查失败。

语料在 wrong_<讲次>.py 的 VARIANTS 里（只给老师：学生树里没有这些文件）。这里把实验模块里的函数
换成错误版本，直接调用该练习的全部检查；一个都没失败，说明这组检查分不出这种错误。
"""
import importlib
import os

import pytest

from grading import CHECKS, PREDICTIONS, load_exercise_tests, patched, run_checks

HERE = os.path.dirname(os.path.abspath(__file__))


def _variants():
    out = []
    for fn in sorted(os.listdir(HERE)):
        if fn.startswith("wrong_") and fn.endswith(".py"):
            out.extend(importlib.import_module(fn[:-3]).VARIANTS)
    return out


VARIANTS = _variants()


@pytest.mark.parametrize("w", VARIANTS, ids=[f"{w.ex}-{w.label}" for w in VARIANTS])
def test_wrong_variant_is_rejected(w):
    load_exercise_tests()
    assert CHECKS.get(w.ex), f"练习 {w.ex} 没有登记任何检查"
    with patched(w.folder, w.name, w.attr, w.fn):
        results = run_checks(w.ex)
    failed = [name for name, err in results if err is not None]
    assert failed, f"错误答案「{w.label}」（练习 {w.ex}）通过了全部 {len(results)} 个检查：检查分不出这种错误"
    if w.says:
        messages = [str(err) for _, err in results if err is not None]
        assert any(w.says in m for m in messages), (
            f"错误答案「{w.label}」被拒了，但没有一条消息说出「{w.says}」：{messages}")


def test_every_exercise_has_two_wrong_variants():
    load_exercise_tests()
    per = {}
    for w in VARIANTS:
        per[w.ex] = per.get(w.ex, 0) + 1
    thin = {ex: per.get(ex, 0) for ex in CHECKS if per.get(ex, 0) < 2 and ex not in PREDICTIONS}
    assert not thin, f"这些练习的错误答案不足两个：{thin}"
