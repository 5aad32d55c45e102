"""没有 GPU 也能为 sm_90（H100 / H200）编译一个 Triton 内核，读出它要的共享内存（test_lecture11_decode.py 用）。

Triton 把 Python 写的内核一路编到 cubin（ptxas 随 triton 一起装），不需要驱动：给 triton.compile 一个 ASTSource
（参数的类型、编译期常数、哪些参数 16 字节对齐）和目标 GPUTarget("cuda", 90, 32)，编出来的 metadata.shared
就是启动时 Triton 拿去和 GPU 上限比的那个数（超过就是 OutOfResources）。参数的特化照 Triton 启动时的规则：
指针按 16 字节对齐、整数 % 16 == 0 标成可整除、== 1 的整数当常数——对齐决定了能不能用 cp.async 流水，
共享内存差好几倍。必须在没有打开 TRITON_INTERPRET 的进程里用（解释器里的内核不能编译）。
"""
import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")      # 新版 Triton 没设它时每次编译都警告一次

import triton                                                 # noqa: E402
from triton.backends.compiler import GPUTarget                # noqa: E402
from triton.compiler import ASTSource                         # noqa: E402


class Ptr:
    """一个指针参数：元素类型（Triton 的写法，"fp16"、"bf16"、"fp32"、"i32"、"i64"），是否 16 字节对齐。"""

    def __init__(self, dtype, aligned=True):
        self.dtype, self.aligned = dtype, aligned


def _spec(value):
    """一个运行期参数 → (类型, 是否标成 16 的倍数, 是否当常数)。"""
    if isinstance(value, Ptr):
        return "*" + value.dtype, value.aligned, False
    if isinstance(value, bool):
        return "i1", False, False
    if isinstance(value, int):
        if value == 1:
            return "constexpr", False, True
        return ("i32" if -2**31 <= value < 2**31 else "i64"), value % 16 == 0, False
    if isinstance(value, float):
        return "fp32", False, False
    raise TypeError(f"不认识的参数 {value!r}")


def sm90_shared(kernel, args, num_warps, num_stages):
    """kernel（@triton.jit 函数）按 args（参数名 → 值；没给的用默认值）为 sm_90 编译 → 共享内存字节数。"""
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        param = kernel.params[i]
        value = args[name] if name in args else param.default
        if param.is_constexpr or value is None:
            signature[name], constexprs[(i,)] = "constexpr", value
            continue
        kind, aligned16, const = _spec(value)
        signature[name] = kind
        if const:
            constexprs[(i,)] = value
        if aligned16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    return compiled.metadata.shared
