"""lecture11 拆成几个模块以后，按名字互相取用的东西都还在：GPU 才走到的路径（gluon_flash 的持久内核网格、
bench/ 的脚本）在 CPU 上的测试里跑不到，一个搬走了的私有名字要到 H200 上才报 AttributeError。
这里静态地找出每个文件里 `triton_flash.X` / `_triton_flash().X` / `tf.X`（tf 指哪个模块按文件定）的 X，逐个查它存在。"""
import os
import re

import pytest

from labload import ROOT
from triton_interp import load_triton_flash

tf = load_triton_flash()
fd = __import__("sys").modules["flash_decode"]    # triton_flash 导入时加载的同一份

# 文件 → 其中 tf 指哪个模块
USERS = {
    "lecture11/gluon_flash.py": tf, "lecture11/gluon_kernels.py": tf, "lecture11/flash_attn_compat.py": tf,
    "lecture11/bench/gluon_sweep.py": tf, "lecture11/bench/triton_bench.py": tf, "lecture11/bench/ncu_profile.py": tf,
    "lecture11/bench/flash_attn_suite.py": tf, "lecture11/bench/decode_bench.py": fd,
    "lecture18/flash_lab.py": tf, "lecture19/bench/ring_multi_gpu.py": tf,
}
TF_NAME = re.compile(r"(?:\btriton_flash|_triton_flash\(\))\.([A-Za-z_][A-Za-z0-9_]*)")   # 一定是 triton_flash
TF_ALIAS = re.compile(r"\btf\.([A-Za-z_][A-Za-z0-9_]*)")                               # 按文件定（USERS）


def _missing(text, alias_module):
    """text 里取用而 triton_flash / alias_module 里没有的名字（"triton_flash.py" 这样的文件名不算）。"""
    wanted = [(tf, m.group(1)) for m in TF_NAME.finditer(text) if m.group(1) != "py"]
    wanted += [(alias_module, m.group(1)) for m in TF_ALIAS.finditer(text)]
    return sorted({f"{mod.__name__}.{n}" for mod, n in wanted if not hasattr(mod, n)})


@pytest.mark.parametrize("path", sorted(USERS))
def test_names_taken_from_triton_flash_exist(path):
    if not os.path.exists(os.path.join(ROOT, path)):
        pytest.skip(f"{path} 不在")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        missing = _missing(f.read(), USERS[path])
    assert not missing, f"{path} 用到不存在的名字：{missing}"


def test_the_check_sees_a_missing_name():
    """这个检查会失败：不存在的名字被点名，两种写法都是。"""
    assert _missing("x = tf.no_such_name(1)", fd) == ["flash_decode.no_such_name"]
    assert _missing("_triton_flash()._gone(q.device)", fd) == [f"{tf.__name__}._gone"]
    assert _missing("tf._sm_count(d); triton_flash.flash_attn_func", fd) == []
