"""按路径加载课程的实验模块（lab module），给每个模块一个唯一的名字。

为什么需要它：讲次之间靠 `sys.path` 垫片互相导入（`import llm_math`），模块名是裸名字；
lecture11 和 lecture18 又各有一个 `flash_lab`。pytest 把所有测试放在一个进程里，
直接 `import flash_lab` 会拿到先导入的那一个。这里：
  - 目标模块以 "<讲次>.<模块>"（如 "lecture11.flash_lab"）登记在 sys.modules，不和裸名字冲突；
  - 加载期间把它所在的文件夹放到 sys.path 最前面，它自己的垫片再加上依赖的讲次；
  - 若 sys.modules 里已有同名裸模块但来自别的文件夹（两个 flash_lab），加载期间先挪开，之后放回。
所有 `_selftest()` 和演示脚本另外在子进程里跑（见 test_harness.py），不经过这里。
"""
import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def lab_path(folder, name):
    path = os.path.join(ROOT, folder, name + ".py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"没有这个实验模块：{folder}/{name}.py")
    return path


def load_lab(folder, name):
    """加载 ROOT/<folder>/<name>.py，返回模块对象（同一个文件只加载一次）。"""
    key = f"{folder}.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = lab_path(folder, name)
    here = os.path.dirname(path)
    shadow = sys.modules.get(name)
    moved = shadow is not None and os.path.dirname(os.path.abspath(getattr(shadow, "__file__", "") or "")) != here
    if moved:
        del sys.modules[name]
    sys.path.insert(0, here)
    try:
        spec = importlib.util.spec_from_file_location(key, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[key]
            raise
    finally:
        sys.path.remove(here)
        if moved:
            sys.modules[name] = shadow
    return mod
