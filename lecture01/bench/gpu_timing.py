"""
gpu_timing.py —— GPU 测量脚本（各讲的 bench/）共用的计时和"在哪测的"

【问题】每个 GPU 工作台都要量一次调用花多少时间（设备上的、主机上的）、核对 CUDA 图重放和直接调用逐位相同，
    并在结果 JSON 里记下 GPU、驱动、torch / CUDA / triton / NCCL 版本和日期。这些只写一份，就在这里。
    课（讲次根目录的实验模块和演示）不导入它：工作台导入课，课从不导入工作台。
        sys.path.insert(0, os.path.join(ROOT, "lecture01", "bench"))
        from gpu_timing import cuda_time, gpu_meta

【里面有什么】
    cuda_time(fn, reps, trials, warmup)        CUDA 事件计时：trials 组、每组连调 reps 次，取最快一组的平均（秒）
    wall_per_call / wall_per_call_many         主机墙钟（每组前后同步 GPU），几个调用轮流量、各取最快的一轮
    capture_graph / graph_matches_eager        把调用录进 CUDA 图；重放 = 直接调用（逐位）
    gpu_meta(torch, **extra) / nccl_environment(torch)
                                               "在哪测的"：GPU、驱动、版本、日期（+ NCCL 版本、NCCL_NVLS_ENABLE、拓扑）

【约定】时间单位秒；torch 只在调用时导入（由调用者传入或函数里导入），本模块级只依赖标准库和 course_utils。
    参数（fn 可调用、次数是整数……）在导入 torch、碰 GPU 之前查一次，消息写出参数名；计时的循环里不加任何检查。
【运行】python3 lecture01/bench/gpu_timing.py      # 自检：没有 GPU 时只查 CPU 上能查的（gpu_meta、nccl_environment 的
                                                  # 回退、主机计时的轮流顺序）；有 GPU 时再查 cuda_time 和 CUDA 图
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))          # lecture01/bench
sys.path.insert(0, os.path.dirname(HERE))                  # lecture01：course_utils
from course_utils import check_int, expect_errors  # noqa: E402


def _check_fn(name, fn, where):
    if not callable(fn):
        raise TypeError(f"{where}：{name} 必须是可调用（不带参数的函数，如 lambda: f(x)），收到 {type(fn).__name__}")


def _check_torch(torch, where):
    if not hasattr(torch, "cuda") or not hasattr(torch, "__version__"):
        raise TypeError(f"{where}：torch 必须是已导入的 torch 模块，收到 {type(torch).__name__}")


# =============================================================================
# 1. 计时
# =============================================================================
def cuda_time(fn, reps, trials=5, warmup=1):
    """
    GPU 上一次 fn() 的时间（秒）：先预热 warmup 次，再 trials 组、每组连着调 reps 次，用 CUDA 事件量一组的平均，
    取最快的一组。组内不同步主机（事件记在流上）；取最快的一组，是为了不把偶然的卡顿（建通道、别的进程、
    频率爬升）算进去。torch 只在调用时导入（本模块只依赖标准库）。
    【报错】fn 不可调用 → TypeError；reps、trials < 1、warmup < 0、不是整数 → ValueError / TypeError。
    """
    w = "cuda_time"
    _check_fn("fn", fn, w)
    reps, trials = check_int("reps", reps, lo=1, where=w), check_int("trials", trials, lo=1, where=w)
    warmup = check_int("warmup", warmup, lo=0, where=w)
    import torch
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best


def wall_per_call(fn, calls, warmup=20, trials=5):
    """
    每次调用的墙钟时间（秒）：calls 次分成 trials 组连续调用，每组前后各同步一次 GPU，取最快一组的平均。
    主机比 GPU 慢时，这就是每次调用的主机时间。取最快的一组（和 cuda_time 一样）：共用的主机上别的进程、
    中断只会让一组变慢，不会变快。几个调用要互相比较时用 wall_per_call_many（轮流量）。
    """
    _check_fn("fn", fn, "wall_per_call")
    trials = check_int("trials", trials, lo=1, where="wall_per_call")
    return _wall_rounds({0: fn}, calls, warmup, trials, "wall_per_call")[0]


def wall_per_call_many(fns, calls, warmup=20, rounds=5):
    """
    {名字: fn} → {名字: 每次调用的墙钟时间（秒）}。每个 fn 的 calls 次分成 rounds 轮，每一轮把所有 fn 各量一组，
    各取最快的一轮。轮流量而不是一个量完再量下一个：共用主机上的慢段常常持续好几秒，一个一个量时先量的和后量的
    会落在不同的段里（同一个 SDPA 调用在几次运行里量出 23–41 µs），轮流量时每个 fn 都有几组落在快的段里。
    【报错】fns 不是 {名字: 可调用} → TypeError；calls、rounds < 1、warmup < 0、calls < rounds（每组不到一次调用）
    → ValueError。
    """
    rounds = check_int("rounds", rounds, lo=1, where="wall_per_call_many")
    return _wall_rounds(fns, calls, warmup, rounds, "wall_per_call_many")


def _wall_rounds(fns, calls, warmup, rounds, where):
    import time
    from collections.abc import Mapping

    if not isinstance(fns, Mapping) or not all(callable(f) for f in fns.values()):
        raise TypeError(f"{where}：fns 必须是 {{名字: 可调用}}，收到 {type(fns).__name__}")
    calls = check_int("calls", calls, lo=rounds, where=where)
    warmup = check_int("warmup", warmup, lo=0, where=where)
    import torch
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per = calls // rounds
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(per):
                fn()
            torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - t0) / per)
    return best


def capture_graph(fn, calls=1, warmup=2):
    """
    把 calls 次 fn() 录进一张 CUDA 图，返回 (graph, 最后一次调用的返回值)。录之前在旁路 stream 上先调 warmup 次：
    编译、autotune、cuBLAS / SDPA 的工作区、快速路径的记录都在图外完成（图里只有内核启动）。
    【报错】fn 不可调用 → TypeError；calls < 1、warmup < 0、不是整数 → ValueError / TypeError。
    """
    _check_fn("fn", fn, "capture_graph")
    calls = check_int("calls", calls, lo=1, where="capture_graph")
    warmup = check_int("warmup", warmup, lo=0, where="capture_graph")
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    return graph, out


def graph_matches_eager(fn, inputs):
    """
    把 fn() 录进 CUDA 图（capture_graph），原地换一组随机输入后重放，再直接调用一次，两者逐位比较。
    fn 每次可能写同一个张量（out=），所以先拷走重放的结果。inputs：fn 读的那些张量的列表或元组。
    """
    import torch
    _check_fn("fn", fn, "graph_matches_eager")
    if not isinstance(inputs, (list, tuple)) or not all(torch.is_tensor(t) for t in inputs):
        raise TypeError(f"graph_matches_eager：inputs 必须是 fn 读的张量的列表或元组，收到 {inputs!r:.80}")
    graph, out = capture_graph(fn, warmup=1)
    for t in inputs:
        t.copy_(torch.randn_like(t))
    graph.replay()
    replayed = out.clone()
    return bool(torch.equal(replayed, fn()))


# =============================================================================
# 2. "在哪测的"
# =============================================================================
def _nvidia_smi(field):
    """nvidia-smi --query-gpu=<field> 的第一行（如 "driver_version"）；没有 nvidia-smi 时返回 "unknown"。"""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


META_KEYS = ("gpu", "driver", "torch", "cuda", "triton", "date")


def gpu_meta(torch, **extra):
    """
    测量结果里"在哪测的"：GPU、驱动、torch / CUDA / triton 版本、日期，再加上调用者给的键。
    没有 CUDA（torch.cuda.is_available() 为假）时 gpu、driver 是 None，其余照样填：CPU 上的测量也能用它。
    【报错】torch 不是 torch 模块、extra 里有和上面重名的键（会悄悄盖掉测出来的值）→ TypeError。
    """
    import datetime
    _check_torch(torch, "gpu_meta")
    clash = [k for k in extra if k in META_KEYS]
    if clash:
        raise TypeError(f"gpu_meta：extra 的键 {clash[0]} 和自动填的重名（{' / '.join(META_KEYS)}），换个名字")
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    return dict(gpu=torch.cuda.get_device_name() if cuda else None,
                driver=_nvidia_smi("driver_version") if cuda else None, torch=torch.__version__,
                cuda=torch.version.cuda, triton=triton_version, date=datetime.date.today().isoformat(), **extra)


def nccl_environment(torch):
    """
    多卡结果文件的"这是在哪测的"：gpu_meta（GPU、驱动、torch / CUDA / triton 版本、日期）
    再加 NCCL 版本、NCCL_NVLS_ENABLE 和 `nvidia-smi topo -m`（GPU 之间怎么连）。传入已导入的 torch。
    """
    import subprocess
    _check_torch(torch, "nccl_environment")
    try:
        topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError) as e:
        topology = f"unavailable: {e}"
    return gpu_meta(torch, nccl=".".join(map(str, torch.cuda.nccl.version())),
                    NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"), topology=topology)


# =============================================================================
# 自检
# =============================================================================
def _selftest():
    import time
    from types import SimpleNamespace

    import torch
    # 1. "在哪测的"：没有 CUDA 时 gpu、driver 是 None，版本和日期照样有；nccl_environment 在没有 nvidia-smi 时也返回
    fake = SimpleNamespace(__version__="9.9", version=SimpleNamespace(cuda=None),
                           cuda=SimpleNamespace(is_available=lambda: False, get_device_name=None,
                                                nccl=SimpleNamespace(version=lambda: (2, 28, 9))))
    meta = gpu_meta(fake, dtype="float32")
    assert meta["gpu"] is None and meta["driver"] is None and meta["torch"] == "9.9" and meta["dtype"] == "float32"
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = ""                                   # 找不到 nvidia-smi
    try:
        env = nccl_environment(fake)
        assert env["nccl"] == "2.28.9" and env["topology"].startswith("unavailable") and _nvidia_smi("x") == "unknown"
    finally:
        os.environ["PATH"] = saved
    # 2. 主机计时：轮流量（a b a b …），各取最快的一轮；假时钟，GPU 同步换成空函数
    clock, log = [0.0], []
    real_clock, real_sync = time.perf_counter, torch.cuda.synchronize
    time.perf_counter, torch.cuda.synchronize = (lambda: clock[0]), (lambda *a: None)
    try:
        def make(name, cost):
            def fn():
                log.append(name)
                clock[0] += cost
            return fn
        out = wall_per_call_many({"a": make("a", 1.0), "b": make("b", 3.0)}, calls=6, warmup=1, rounds=3)
        assert out == {"a": 1.0, "b": 3.0} and log[2:] == ["a", "a", "b", "b"] * 3, (out, log)
        assert wall_per_call(make("c", 2.0), calls=4, warmup=0, trials=2) == 2.0
    finally:
        time.perf_counter, torch.cuda.synchronize = real_clock, real_sync
    expect_errors([(lambda: wall_per_call_many([len], calls=3), TypeError, "fns"),
                   (lambda: wall_per_call_many({"a": len}, calls=2, rounds=3), ValueError, "calls"),
                   (lambda: wall_per_call(len, calls=3, trials=0), ValueError, "trials")])
    extra = "没有 CUDA：cuda_time 与 CUDA 图没有查"
    # 3. 有 GPU 时：cuda_time 给正数；CUDA 图重放 = 直接调用
    if torch.cuda.is_available():
        a = torch.randn(257, 129, device="cuda")
        b = torch.randn(129, 63, device="cuda")
        out = torch.empty(257, 63, device="cuda")
        assert cuda_time(lambda: torch.mm(a, b, out=out), reps=3) > 0
        assert graph_matches_eager(lambda: torch.mm(a, b, out=out), [a, b])
        extra = f"cuda_time 与 CUDA 图（{torch.cuda.get_device_name()}）"
    print(f"gpu_timing 自检通过：gpu_meta / nccl_environment 的回退、主机计时的轮流与取最快、坏输入；{extra}")


if __name__ == "__main__":
    # check-all 以 --replot 运行每个 bench/*.py：这里没有图要画，参数一律忽略，只跑自检
    _selftest()
