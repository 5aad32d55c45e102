"""pytest 的公共设置：测试文件可以 `from labload import load_lab`，也能导入 tools/check_all.py 的发现逻辑。"""
import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for extra in (TESTS_DIR, os.path.join(TESTS_DIR, "..", "tools")):
    if extra not in sys.path:
        sys.path.insert(0, extra)
# 子进程和本进程里的 matplotlib 都不开窗口
os.environ.setdefault("MPLBACKEND", "Agg")


# ---- Triton 解释器测试（test_lecture11_triton.py、test_lecture11_decode.py）共用的两个 fixture ----
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def triton_interpret(monkeypatch):
    """本测试运行期间打开 Triton 解释器（测试文件用 pytestmark 的 usefixtures 打开它）。"""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def gen(request):
    """每个测试一组新的随机输入（种子由测试名和随机数决定，打印出来，失败时可复现）。"""
    seed = (hash(request.node.name) ^ int(torch.randint(0, 2**30, (1,)))) % 2**31
    print("seed", seed)
    return torch.Generator().manual_seed(seed)
