#!/usr/bin/env python3
"""不用 GPU 量一个 Triton 内核搬了多少字节：在解释器（TRITON_INTERPRET=1）里数它的每一次 tl.load / tl.store。

GPU 上 HBM 流量的下界是内核真正读写的元素：带 mask 的 load/store 只数 mask 为真的元素，乘元素字节数，
按指针落在哪个张量参数里归账。FlashAttention 的 IO 公式（lecture11/flash_lab.py 的 fa_io_formula）说的正是
这个数（K/V 被每个 Q 块各读一遍，Q 读一遍，O、LSE 写一遍），所以"解释器计数 ÷ 公式"就是不上 GPU 的速度评分：
把 N×N 的分数矩阵写回内存、每个 K/V 块都重读一遍 Q、causal 时不跳过整块被掩码的块，都会让这个比值变大。
不数的：L2/共享内存的复用（这里每次 load 都算 HBM 流量，和公式的假设一致）、标量参数。

用法（内核必须已经以解释器模式定义：先设 TRITON_INTERPRET=1 再 import 定义内核的模块）：
    with count_io() as io:
        out = some_launcher(...)
    io.bytes()                   # 全部字节；io.bytes("read", tensor="Q") 只看读 Q
    print(io.table())            # 每个内核、每个张量参数：读 / 写的元素和字节
命令行：python3 tools/triton_io.py 对课程的 v1 前向内核数一次，和 fa_io_formula 对账。
"""
import contextlib
import dataclasses
import os
import sys

import numpy as np


@dataclasses.dataclass
class Launch:
    kernel: str
    grid: tuple
    ranges: list                      # [(起始地址, 结束地址, 参数名)]，按起始地址排序
    read: dict = dataclasses.field(default_factory=dict)     # 参数名 -> [元素数, 字节数]
    write: dict = dataclasses.field(default_factory=dict)


class IOCount:
    """count_io() 交出的记账本：launches 按启动顺序。"""

    def __init__(self):
        self.launches = []

    def bytes(self, kind=None, tensor=None, kernel=None):
        """读 + 写（kind="read" / "write" 只看一边）的字节；tensor、kernel 按参数名、内核名筛选。"""
        return self._sum(1, kind, tensor, kernel)

    def elements(self, kind=None, tensor=None, kernel=None):
        return self._sum(0, kind, tensor, kernel)

    def _sum(self, idx, kind, tensor, kernel):
        if kind not in (None, "read", "write"):
            raise ValueError(f"kind 只能是 None、'read'、'write'，收到 {kind!r}")
        total = 0
        for la in self.launches:
            if kernel is not None and la.kernel != kernel:
                continue
            for side in ("read", "write"):
                if kind in (None, side):
                    total += sum(v[idx] for name, v in getattr(la, side).items() if tensor in (None, name))
        return int(total)

    def table(self):
        rows = [f"{'kernel':<24} {'tensor':<10} {'read elems':>12} {'read B':>12} {'write elems':>12} {'write B':>12}"]
        for la in self.launches:
            for name in sorted(set(la.read) | set(la.write)):
                r, w = la.read.get(name, [0, 0]), la.write.get(name, [0, 0])
                rows.append(f"{la.kernel:<24} {name:<10} {r[0]:>12,} {r[1]:>12,} {w[0]:>12,} {w[1]:>12,}")
        rows.append(f"{'total':<35} {self.elements('read'):>12,} {self.bytes('read'):>12,} "
                    f"{self.elements('write'):>12,} {self.bytes('write'):>12,}")
        return "\n".join(rows)


_ACTIVE = []          # 正在记账的 IOCount（count_io 可以嵌套，全部都记）


def _tensor_ranges(names, values):
    """张量参数 -> 它的存储所占的地址区间（视图和原张量共用存储时记在第一个名字上）。"""
    out, seen = [], set()
    for name, val in zip(names, values):
        if hasattr(val, "untyped_storage") and hasattr(val, "data_ptr"):
            st = val.untyped_storage()
            if st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            out.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))
    return sorted(out)


def _account(side, ptrs, mask):
    if not _ACTIVE or not _ACTIVE[0].launches:
        return
    addr = np.asarray(ptrs.data).astype(np.uint64).ravel()
    on = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
    addr = addr[on]
    if addr.size == 0:
        return
    ety = ptrs.get_element_ty()
    nbytes = max(int(getattr(ety, "primitive_bitwidth", 8)) // 8, 1)
    for book in _ACTIVE:
        la = book.launches[-1]
        starts = np.array([r[0] for r in la.ranges], dtype=np.uint64)
        idx = np.searchsorted(starts, addr, side="right") - 1
        names = [r[2] for r in la.ranges] + ["<unknown>"]
        ends = np.array([r[1] for r in la.ranges], dtype=np.uint64)
        inside = (idx >= 0) & (addr < ends[np.clip(idx, 0, None)]) if la.ranges else np.zeros(addr.size, bool)
        idx = np.where(inside, idx, len(la.ranges))
        for i, cnt in zip(*np.unique(idx, return_counts=True)):
            acc = getattr(la, side).setdefault(names[int(i)], [0, 0])
            acc[0] += int(cnt)
            acc[1] += int(cnt) * nbytes


@contextlib.contextmanager
def count_io():
    """在 with 块里数解释器内核的 load / store（块外不受影响；不是解释器模式时报 RuntimeError）。"""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise RuntimeError("count_io 只在 Triton 解释器里能数：先设 TRITON_INTERPRET=1（在 import triton 之前）")
    from triton.runtime import interpreter as interp
    builder, Grid = interp.interpreter_builder, interp.GridExecutor
    book = IOCount()
    saved = {name: builder.__dict__.get(name) for name in ("create_masked_load", "create_masked_store",
                                                           "create_atomic_rmw", "create_atomic_cas")}
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = getattr(builder, "create_atomic_rmw", None), getattr(builder, "create_atomic_cas", None)
    old_call = Grid.__call__

    def masked_load(ptrs, mask, *a, **kw):
        _account("read", ptrs, mask)
        return load(ptrs, mask, *a, **kw)

    def masked_store(ptrs, value, mask, *a, **kw):
        _account("write", ptrs, mask)
        return store(ptrs, value, mask, *a, **kw)

    def atomic_rmw(op, ptr, val, mask, *a, **kw):      # 原子加 = 读一次 + 写一次
        _account("read", ptr, mask)
        _account("write", ptr, mask)
        return rmw(op, ptr, val, mask, *a, **kw)

    def atomic_cas(ptr, cmp, val, *a, **kw):
        ones = type(ptr)(np.ones(np.shape(ptr.data), dtype=bool), None)
        _account("read", ptr, ones)
        _account("write", ptr, ones)
        return cas(ptr, cmp, val, *a, **kw)

    def call(self, *args, **kwargs):
        names = list(self.arg_names)
        vals = list(args) + [kwargs.get(n) for n in names[len(args):]]
        for b in _ACTIVE:
            b.launches.append(Launch(getattr(self.fn, "__name__", "?"), self.grid, _tensor_ranges(names, vals)))
        return old_call(self, *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    if rmw is not None:
        builder.create_atomic_rmw = atomic_rmw
    if cas is not None:
        builder.create_atomic_cas = atomic_cas
    Grid.__call__ = call
    _ACTIVE.append(book)
    try:
        yield book
    finally:
        _ACTIVE.remove(book)
        Grid.__call__ = old_call
        for name, val in saved.items():
            if val is None:
                builder.__dict__.pop(name, None)
            else:
                setattr(builder, name, val)


def _main():
    os.environ["TRITON_INTERPRET"] = "1"
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    sys.path.insert(0, os.path.join(root, "tests"))
    import torch
    from labload import load_lab
    tf, fl = load_lab("lecture11", "triton_flash"), load_lab("lecture11", "flash_lab")
    torch.manual_seed(0)
    B, N, H, d = 1, 80, 2, 32
    q, k, v = (torch.randn(B, N, H, d, dtype=torch.float16) for _ in range(3))
    br, bc = tf.MINI_BLOCKS
    for causal in (False, True):
        with count_io() as io:
            tf.mini_attention(q, k, v, causal=causal)
        elems = fl.fa_io_formula(N, d, None, Br=br, Bc=bc, causal=causal)
        want = B * H * ((elems - N) * 2 + N * 4)            # LSE 是 float32，其余 fp16
        print(io.table())
        print(f"causal={causal}: 计数 {io.bytes():,} B，fa_io_formula {want:,} B，比值 {io.bytes() / want:.3f}\n")


if __name__ == "__main__":
    _main()
