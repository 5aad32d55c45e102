"""
fast_launch · 同一组形状第二次起，跳过 Triton 每次启动的 Python 开销，直接调用编译好的内核。

省的是什么：Triton 的正常启动每次都要绑定几十个参数、算特化键、查编译缓存、过 autotuner；小形状上这就是全部的
时间（H200 上每次调用 ≈ 170–220 µs 的主机时间，内核本身几 µs）。_Plan 在第一次启动之后记下编译好的内核、网格和
参数表，之后只换掉张量的地址。triton_flash（flash_attn_func）和 flash_decode 的快速路径都建在它上面；
键（调用者给）必须包含决定编译结果的一切：形状、步长、dtype、设备、标量参数、指针是否 16 字节对齐。
测得的效果（每次调用的主机开销）见 lecture11/bench/README.md。

内容：_Plan（记下 / 重放一次启动）、_should_record（第二次见到一个键才记）、_launch_hooks_active（profiler 的
钩子装着时不走快速路径）、_current_stream。
自检（CPU 上几毫秒）：python3 lecture11/fast_launch.py；GPU 上的逐位对照在 tests/test_lecture11_triton.py、_decode.py。
"""
import inspect

import torch
import triton

_STREAM_OF = []       # [triton 的 get_current_stream]：第一次用时取一次（每次经过 driver.active 的代理要多花时间）


def _current_stream(device_index):
    if not _STREAM_OF:
        _STREAM_OF.append(triton.runtime.driver.active.get_current_stream)
    return _STREAM_OF[0](device_index)


class _Plan:
    """
    同一组形状的一次内核启动。Triton 的正常启动每次都要绑定四十几个参数、算特化键、查编译缓存、过 autotuner
    （H200 上实测每次调用 ≈ 170–220 µs 的主机时间）；这里第一次照常启动，把编译好的内核、网格和
    参数表记下来，之后只换掉其中的张量，直接调用编译好的内核（Triton 的 C 启动器）。
    键（调用者给）必须包含决定编译结果的一切：形状、步长、dtype、设备、标量参数、指针是否 16 字节对齐。
    """
    __slots__ = ("vals", "slots", "grid", "run", "function", "head", "keep")
    launches = 0                      # 走快速路径的启动次数（检查快速路径真的用上了）

    @classmethod
    def build(cls, jit_fn, args, kwargs, grid, tensors):
        """记下一次启动；这个 Triton 版本的内部接口不一样时返回 False（以后照常走正常启动）。"""
        try:
            kernel = jit_fn.run(*args, grid=grid, warmup=True, **kwargs)      # 已经编译过：直接从缓存拿
            params = jit_fn.signature.parameters
            given = dict(zip(jit_fn.arg_names, args), **{n: kwargs[n] for n in jit_fn.arg_names if n in kwargs})
            plan = cls()
            plan.vals = [given[n] if n in given else params[n].default for n in jit_fn.arg_names]
            where = {id(t): j for j, t in enumerate(tensors)}
            plan.slots = [(i, where[id(x)]) for i, x in enumerate(plan.vals) if id(x) in where]
            for i, _ in plan.slots:
                plan.vals[i] = None                        # 不留住第一次调用的张量
            # 其余的张量（草稿区、缓存的 cu_seqlens）每次都一样：现在就换成地址。Triton 的启动器拿到张量时每个指针
            # 要调 data_ptr() 再问一次驱动（cuPointerGetAttribute），拿到整数就直接用；keep 留住这些张量，地址一直有效
            plan.keep = [x for x in plan.vals if isinstance(x, torch.Tensor)]
            plan.vals = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in plan.vals]
            plan.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
            plan.run, plan.function = kernel.run, kernel.function
            plan.head = (kernel.packed_metadata, None, None, None)    # 元数据、launch_metadata、两个钩子
            plan._direct(kernel.run)
            return plan
        except (AttributeError, KeyError, TypeError):
            return False

    def _direct(self, launcher):
        """
        Triton 3.6 的启动器（CudaLauncher）是一层 Python：每次调用先为全局 / profile 草稿区各问一次分配器，再调 C 写的
        launch。内核不要草稿区时（我们的都不要）直接调那个 C 函数，参数照它的顺序补上：协作网格、PDL、两个
        草稿区（None）。只认 3.6 的样子（_direct_launch_ok）：别的版本的 C 函数参数不同（3.9 的是通用的
        utils.launch），照常经过 CudaLauncher。
        实测（H200，triton 3.6，2026-12-01，bench/results/decode_host_parts.log）：空内核经 CudaLauncher 4.8 / 5.8 µs、
        直接调 4.0 / 4.1 µs（两遍），每次启动省 0.8–1.7 µs；flash_decode 每次发两个内核，主机开销 14–19 µs。
        """
        if _direct_launch_ok(launcher):
            self.run = launcher.launch
            self.head = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, *self.head)

    def __call__(self, tensors, device_index):
        """用新的张量启动；有启动钩子（profiler）时返回 False，让调用者走正常路径。"""
        if _launch_hooks_active():
            return False
        self.launch(tensors, _current_stream(device_index))
        return True

    def launch(self, tensors, stream):
        """不查钩子、stream 由调用者给（一次调用启动几个内核时，这两件事只做一次）。"""
        # 键已确认它们是这块 GPU 上的张量：只传地址，启动器不再问驱动
        self.launch_ptrs([t.data_ptr() for t in tensors], stream)

    def launch_ptrs(self, ptrs, stream):
        """同 launch，但调用者已经取好了各张量的地址（ptrs[j] = tensors[j].data_ptr()）：几个内核共用一次取地址。"""
        vals = self.vals.copy()
        for i, j in self.slots:
            vals[i] = ptrs[j]
        self.run(*self.grid, stream, self.function, *self.head, *vals)
        _Plan.launches += 1


# Triton 3.6 的 CudaLauncher.__call__ 的参数：只有长这样时，它的 .launch 才是按 (网格, stream, 函数, 协作网格, PDL,
# 两个草稿区, 元数据, launch_metadata, 两个钩子, *参数) 收参数的那个 C 函数（见 _Plan._direct）
_CUDA_LAUNCHER_CALL_36 = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")


def _direct_launch_ok(launcher):
    """launcher 是 Triton 3.6 样子的 CudaLauncher、内核不要全局 / profile 草稿区 → True（可以直接调 C 的 launch）。"""
    try:
        params = tuple(inspect.signature(type(launcher).__call__).parameters)
    except (TypeError, ValueError):
        return False
    return (params == _CUDA_LAUNCHER_CALL_36 and callable(getattr(launcher, "launch", None))
            and getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0
            and hasattr(launcher, "launch_cooperative_grid") and hasattr(launcher, "launch_pdl"))


_N_SM = {}                # 设备号 → SM 个数（flash_decode 的段数、gluon_flash 的持久内核网格）


def _sm_count(device):
    """设备的 SM 个数：每个设备只问一次（只是属性，不同步）；解释器（CPU 张量）按 H100/H200 的 132 算，
    和 GPU 上选同样的段数。"""
    if device.type != "cuda":
        return 132
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _N_SM:
        _N_SM[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _N_SM[key]


_PLANS = {}
_SEEN = set()
_MAX_PLANS = 4096         # 形状一直在变（例如解码时 K/V 越来越长）时不让缓存无限长


def _should_record(plan_key):
    """一个键第二次出现时才记 _Plan：只出现一次的形状（解码时每步的新长度）不多付记录的开销。"""
    if plan_key is None or plan_key in _PLANS:
        return False
    if plan_key in _SEEN:
        return True
    if len(_SEEN) >= _MAX_PLANS:
        _SEEN.clear()
        _PLANS.clear()
    _SEEN.add(plan_key)
    return False


def _launch_hooks_active():
    """Triton 的启动钩子（proton 等 profiler 用）有没有装上：空的 HookChain 不算。没有 knobs 的版本按"有"处理。
    每次启动都要问：不用生成器、不建元组（快速路径上每一处零点几 µs 都算数）。"""
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return True
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return ((enter is not None and getattr(enter, "calls", True) != [])
            or (leave is not None and getattr(leave, "calls", True) != []))


def _selftest():
    """不要 GPU 的几条：第二次见到一个键才记；缓存满了整体清空；空的钩子不算装着；不像 3.6 的启动器不直接调。"""
    saved = (dict(_PLANS), set(_SEEN))
    _PLANS.clear()
    _SEEN.clear()
    try:
        assert not _should_record(None)
        assert not _should_record("k") and _should_record("k"), "第二次见到才记"
        _PLANS["k"] = False
        assert not _should_record("k"), "记过（哪怕失败）就不再记"
        for i in range(_MAX_PLANS + 1):
            _should_record(("fill", i))
        assert len(_SEEN) <= _MAX_PLANS and "k" not in _PLANS, "缓存满了要整体清空"
    finally:
        _PLANS.clear()
        _PLANS.update(saved[0])
        _SEEN.clear()
        _SEEN.update(saved[1])
    assert isinstance(_launch_hooks_active(), bool)

    class NotALauncher:
        def __call__(self, grid, stream):
            pass
    assert not _direct_launch_ok(NotALauncher()) and not _direct_launch_ok(object())
    direct = "可以" if triton.__version__.startswith("3.6.") else "不"
    print(f"fast_launch 自检通过：记录规则、缓存上限 {_MAX_PLANS}、启动钩子、直接启动的判断"
          f"（这个 triton {triton.__version__} 上{direct}直接调 C 的 launch）")


if __name__ == "__main__":
    _selftest()
