import os
import sys

# 让测试文件能 `from labload import load_lab`，也让 tools/ 里的发现逻辑可以被测试复用。
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
os.environ.setdefault("MPLBACKEND", "Agg")
