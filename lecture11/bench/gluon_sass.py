"""
gluon_sass · 不用 GPU，gluon_flash 的内核编译出来是什么样？改写内核的写法（比如把参数捆成 aggregate）花不花时间？

Triton 能在没有 GPU、没有驱动的机器上把内核一路编到 sm_90 的 cubin（ptxas、cuobjdump 随 triton 一起装）。这里把
gluon_flash 的每一种启动（6 个 variant × d ∈ {64, 128} × causal 与否，反向的 3 个内核 × d × causal）照主机代码
原样走一遍——_launch / _launch_bwd 建描述符、算 grid，只把"启动"换成"编译"——记下每个内核的共享内存和 SASS 里
每种指令的条数。两份记录的指令条数逐项相等 = 生成的机器码只差寄存器编号和指令顺序：重写没有多出一条指令。
  python3 lecture11/bench/gluon_sass.py --measure [--out DIR]      编译、写 DIR/gluon_sass.json（要 triton 3.6）
  python3 lecture11/bench/gluon_sass.py --compare A.json [B.json]  逐项比两份（B 默认提交的 results/gluon_sass.json）
  python3 lecture11/bench/gluon_sass.py --replot                   重印提交的那一份（什么都不用装）
内核按 triton 3.6 的 Gluon 写（gluon_flash 的开头）；别的版本编不了时 SKIP、退出码 77。
形状：B = 2、N = 300（不是块的倍数）、H = 4、Hk = 2（GQA）、bf16；持久内核 8 个程序。
"""
import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")    # 新版 Triton 没设它时每次编译都警告一次
HERE = os.path.dirname(os.path.abspath(__file__))        # lecture11/bench
LESSON = os.path.dirname(HERE)
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
from course_utils import format_table, load_json  # noqa: E402

RESULTS = os.path.join(HERE, "results")
KERNELS = ("_attn_fwd", "_attn_bwd", "_bwd_preprocess", "_dq_convert")
SHAPE = dict(batch=2, n=300, hq=4, hk=2)


def _specialize(fn, args, kwargs):
    """一次启动的参数 → (签名, constexpr, 属性, 编译选项)：照 Triton 启动时的规则特化（== 1 的整数当常数，
    16 的倍数、16 字节对齐的指针标成可整除）。"""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    options = {k: kwargs.pop(k) for k in ("num_warps", "maxnreg", "num_stages") if k in kwargs}
    bound = fn.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        if fn.params[i].is_constexpr or value is None or (type(value) is int and value == 1):
            signature[name], constexprs[(i,)] = "constexpr", value
            continue
        ty, key = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = ty
        if key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs, options


def _opcodes(cubin_bytes):
    """cubin → SASS 里每种指令（去掉谓词和操作数）的条数。"""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin_bytes)
        fh.flush()
        sass = subprocess.run([tool, "-sass", fh.name], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        if "*/" in line and ";" in line:                     # /*0040*/  @!P0 BRA `(.L_x_1) ;
            words = line.split("*/", 1)[1].split(";")[0].split()
            words = words[1:] if words and words[0].startswith("@") else words
            if words:
                ops[words[0]] += 1
    return dict(sorted(ops.items()))


def measure(out_dir):
    """每一种启动编译一次，写 out_dir/gluon_sass.json。没有 3.6 的 Gluon 时返回 77。"""
    import gluon_flash as gf
    if gf.GLUON_ERROR is not None or gf.torch is None:
        print(f"SKIP: 要 torch 和 triton 3.6 的 Gluon（{gf.GLUON_ERROR or '没有 torch'}）")
        return 77
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource
    torch, records, tag = gf.torch, {}, [""]

    class Compile:                                            # 代替 kernel[grid](...)：编译、记下，不启动
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def call(*args, **kwargs):
                sig, consts, attrs, opts = _specialize(self.fn, args, kwargs)
                source = (GluonASTSource if self.fn.is_gluon() else ASTSource)(self.fn, sig, consts, attrs)
                kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=opts)
                ops = _opcodes(kernel.asm["cubin"])
                records[f"{tag[0]}/{self.fn.__name__}"] = dict(shared=kernel.metadata.shared,
                                                               instructions=sum(ops.values()), opcodes=ops)
            return call

    saved = {name: getattr(gf, name) for name in KERNELS}
    for name in KERNELS:
        setattr(gf, name, Compile(saved[name]))
    try:
        b, n, hq, hk = SHAPE["batch"], SHAPE["n"], SHAPE["hq"], SHAPE["hk"]
        for d, causal in itertools.product(gf.HEAD_DIMS, (False, True)):
            q = torch.zeros(b, n, hq, d, dtype=torch.bfloat16)
            k, v = torch.zeros(b, n, hk, d, dtype=torch.bfloat16), torch.zeros(b, n, hk, d, dtype=torch.bfloat16)
            for variant in gf.VARIANTS:
                tag[0] = f"{variant} d={d} {'causal' if causal else 'full'}"
                gf._launch(q, k, v, causal, d ** -0.5, variant, True, programs=8)
            tag[0] = f"bwd d={d} {'causal' if causal else 'full'}"
            out, lse = torch.zeros_like(q), torch.zeros(b, hq, n)
            gf._launch_bwd(q, k, v, out, lse, torch.zeros_like(q), causal, d ** -0.5)
    except Exception as exc:                                  # 别的 triton 版本：Gluon 的接口变了，编不了
        print(f"SKIP: 这个 triton（{triton.__version__}）编译不了按 3.6 写的 Gluon 内核：{type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:160]}")
        return 77
    finally:
        for name, fn in saved.items():
            setattr(gf, name, fn)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gluon_sass.json")
    with open(path, "w") as fh:
        json.dump(dict(triton=triton.__version__, target="cuda sm_90", shape=SHAPE, launches=records), fh, indent=1)
    show(records)
    print(f"写好 {path}（{len(records)} 个内核）")
    return 0


def show(records):
    print(format_table(("启动/内核", "共享内存 B", "SASS 指令"),
                       [(tag, r["shared"], r["instructions"]) for tag, r in records.items()]))


def compare(a, b):
    """两份记录逐项比：共享内存、每种指令的条数。返回退出码（0 = 全部相同）。"""
    ra, rb = a["launches"], b["launches"]
    rows, diff = [], 0
    for tag in sorted(set(ra) | set(rb)):
        x, y = ra.get(tag), rb.get(tag)
        if x is None or y is None:
            count = ["—" if r is None else r["instructions"] for r in (x, y)]
            rows.append((tag, *count, "缺一边"))
            diff += 1
            continue
        changed = [op for op in set(x["opcodes"]) | set(y["opcodes"]) if x["opcodes"].get(op) != y["opcodes"].get(op)]
        same = not changed and x["shared"] == y["shared"]
        diff += not same
        rows.append((tag, x["instructions"], y["instructions"],
                     "相同" if same else f"不同：{', '.join(sorted(changed)[:4])}" + ("" if x["shared"] == y["shared"]
                                                                                    else "、共享内存")))
    print(format_table(("启动/内核", "A 的指令", "B 的指令", "每种指令的条数"), rows))
    print(f"{len(rows) - diff} / {len(rows)} 个内核每种指令的条数和共享内存都相同")
    return 0 if diff == 0 else 1


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description="gluon_flash 的内核为 sm_90 编译：共享内存、SASS 指令条数（不要 GPU）")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--measure", action="store_true", help="编译每一种启动，写 DIR/gluon_sass.json（要 triton 3.6）")
    mode.add_argument("--compare", nargs="+", metavar="JSON", help="A.json [B.json]：逐项比（B 默认提交的那一份）")
    mode.add_argument("--replot", action="store_true", help="重印提交的 results/gluon_sass.json")
    ap.add_argument("--out", default=RESULTS, help="--measure 写到哪个目录")
    return ap.parse_args(argv)


def main(argv=None):
    args = _parse_args(argv)
    if args.measure:
        return measure(args.out)
    committed = os.path.join(RESULTS, "gluon_sass.json")
    if args.compare:
        if len(args.compare) > 2:
            raise SystemExit("--compare 收一个或两个 JSON")
        paths = args.compare + [committed] * (2 - len(args.compare))
        data = [load_json(p) for p in paths]
        for p, x in zip(paths, data):
            if x is None:
                raise SystemExit(f"gluon_sass：没有 {p}")
        return compare(*data)
    data = load_json(committed)
    if data is None:
        print(f"SKIP: 没有 {os.path.relpath(committed)}（先 --measure）")
        return 77
    print(f"triton {data['triton']}，{data['target']}，形状 {data['shape']}")
    show(data["launches"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
