"""pytest 的公共设置：测试文件可以 `from labload import load_lab`，也能导入 tools/check_all.py 的发现逻辑。"""
import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for extra in (TESTS_DIR, os.path.join(TESTS_DIR, "..", "tools")):
    if extra not in sys.path:
        sys.path.insert(0, extra)
# 子进程和本进程里的 matplotlib 都不开窗口
os.environ.setdefault("MPLBACKEND", "Agg")
