"""两个 Triton 解释器测试文件（test_lecture11_triton.py、test_lecture11_decode.py）共用的一份设置。

解释器必须在定义内核之前打开，启动内核时 Triton 还会再读一次：load_triton_flash() 加载模块时临时设置
TRITON_INTERPRET=1、加载完恢复原值；测试文件再写 `pytestmark = pytest.mark.usefixtures("triton_interpret")`，
conftest.py 里的 triton_interpret 只在那个文件的测试运行期间设上（不影响同一进程里的其他测试文件）。
"""
import contextlib
import os

import pytest
from labload import load_lab


@contextlib.contextmanager
def interpreter_env():
    """在 with 块里 TRITON_INTERPRET=1（要在第一次 import triton 之前：triton 导入时就定下 tl 库函数的模式），
    出来时恢复原值。"""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def load_triton_flash():
    """以解释器模式加载 lecture11/triton_flash.py；没有 triton 时 skip 整个测试文件。"""
    with interpreter_env():
        pytest.importorskip("triton", reason="没有安装 triton（requirements.txt 只在 Linux 上装它）")
        return load_lab("lecture11", "triton_flash")
