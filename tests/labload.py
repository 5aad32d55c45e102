"""按路径加载课程的实验模块（lab module），给每个模块一个唯一的名字。

为什么需要它：讲次之间靠 `sys.path` 垫片互相导入（`import llm_math`），模块名是裸名字；
lecture11 和 lecture18 又各有一个 `flash_lab`。pytest 把所有测试放在一个进程里，
直接 `import flash_lab` 会拿到先导入的那一个。这里：
  - 目标模块以 "<讲次>.<模块>"（如 "lecture11.flash_lab"）登记在 sys.modules；
  - 名字在整个课程里唯一的模块（llm_math、transformer_lab……）同时以裸名字登记，
    这样别的讲次 `from llm_math import ModelConfig` 拿到的是**同一个**模块对象（同一个类），
    而不是第二份拷贝；反过来，已经被别的模块以裸名字导入过的同一个文件直接复用；
  - 在多个讲次里重名的模块（flash_lab）永远不以裸名字登记；加载期间若 sys.modules 里有来自别的文件夹的
    同名裸模块，先挪开，之后放回。
  - 加载期间把模块所在的文件夹放到 sys.path 最前面，它自己的垫片再加上依赖的讲次。
所有 `_selftest()` 和演示脚本另外在子进程里跑（见 test_harness.py），不经过这里。
"""
import functools
import importlib.util
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
_FOLDER_RE = re.compile(r"^(prereq|lecture)\d+$")


def lab_path(folder, name):
    path = os.path.join(ROOT, folder, name + ".py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"没有这个实验模块：{folder}/{name}.py")
    return path


@functools.lru_cache(maxsize=None)
def ambiguous_names():
    """在不止一个讲次文件夹里出现的模块名（如两个 flash_lab）：它们不能以裸名字共享。"""
    seen, dup = set(), set()
    for folder in os.listdir(ROOT):
        if _FOLDER_RE.match(folder) and os.path.isdir(os.path.join(ROOT, folder)):
            for fn in os.listdir(os.path.join(ROOT, folder)):
                if fn.endswith(".py"):
                    stem = fn[:-3]
                    (dup if stem in seen else seen).add(stem)
    return frozenset(dup)


def _same_file(mod, path):
    f = getattr(mod, "__file__", None)
    return bool(f) and os.path.abspath(f) == os.path.abspath(path)


def load_lab(folder, name):
    """加载 ROOT/<folder>/<name>.py，返回模块对象（同一个文件只加载一次）。"""
    key = f"{folder}.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = lab_path(folder, name)
    here = os.path.dirname(path)
    bare = sys.modules.get(name)
    if bare is not None and _same_file(bare, path):
        sys.modules[key] = bare            # 已经被别的模块以裸名字导入过：复用，不要第二份
        return bare
    shareable = name not in ambiguous_names()
    moved = bare is not None
    if moved:
        del sys.modules[name]
    sys.path.insert(0, here)
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    if shareable and not moved:
        sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(key, None)
        if sys.modules.get(name) is mod:
            del sys.modules[name]
        raise
    finally:
        sys.path.remove(here)
        if moved:
            sys.modules[name] = bare
    return mod


def load_demo(folder, filename, **bare):
    """
    按路径加载演示脚本（文件名以数字开头，不能 import），模块名 "<讲次>_<文件名>"。bare：演示里以裸名字导入、要拿到
    指定那一份的模块（例如 flash_lab=第 11 讲的那份），加载期间临时放进 sys.modules，之后恢复原样。
    """
    saved = {k: sys.modules.get(k) for k in bare}
    sys.modules.update(bare)
    try:
        spec = importlib.util.spec_from_file_location(f"{folder}_{filename[:-3]}", os.path.join(ROOT, folder, filename))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, m in saved.items():
            if m is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = m
    return mod
