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

# triton.language 的库函数（tl.cdiv……）在第一次 import triton 时就定成"解释"或"编译"两种之一。没有 GPU 时
# 只有解释器能跑内核：先以解释器模式导入一次，这样别的测试文件（如 gluon_flash 的）先 import triton 也不会
# 让后面的解释器测试拿到编译模式的 tl.cdiv（与测试文件的先后顺序无关）。有 GPU 时不动：GPU 测试要编译模式。
if not torch.cuda.is_available():
    from triton_interp import interpreter_env  # noqa: E402
    with interpreter_env():
        try:
            import triton.language  # noqa: F401
        except ImportError:                  # 没有 triton：解释器测试自己会 skip
            pass


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
