"""
gluon_flash 反向的 A/B：两份 gluon_flash.py（例如 git 里的前一版和现在的）在 06 的基准形状上的反向时间，和 cuDNN 比，
梯度也和 cuDNN 比。NOTES v12 里 "LSE、D 由生产者用 TMA 读" 前后的对照（gluon_bwd_lse_ab.log / .json）就是这样量的：
  git show e043a93:lecture11/gluon_flash.py > /tmp/gluon_flash_v11.py
  python3 lecture11/results/gluon_bwd_ab.py /tmp/gluon_flash_v11.py lecture11/gluon_flash.py --out DIR
只在 Hopper GPU 上（没有 GPU 时一行 SKIP、退出码 77）。计时 = autograd 的 backward（do_bench，每次清梯度）。
"""
import argparse
import functools
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LECTURE = os.path.dirname(HERE)
sys.path.insert(0, LECTURE)
sys.path.insert(0, os.path.join(LECTURE, "..", "lecture01"))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gluon(attention, q, k, v, causal):
    return attention(q, k, v, causal=causal)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ns", type=int, nargs="+", default=[4096, 16384])
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: 要 CUDA GPU（Hopper）")
        sys.exit(77)
    from triton.testing import do_bench
    import flash_lab as fl
    import triton_flash as tf
    impls = {"old": load(args.old, "gluon_old").attention, "new": load(args.new, "gluon_new").attention}
    cudnn = tf.sdpa_fn("sdpa-cudnn")
    runs = {name: functools.partial(_gluon, f) for name, f in impls.items()}
    runs["cudnn"] = cudnn
    rows, t0 = [], time.time()
    for d in (64, 128):
        for n in args.ns:
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
            q, k, v, do = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for causal in (False, True):
                row, grads = dict(d=d, N=n, causal=causal, ms={}, rel_diff_vs_cudnn={}), {}
                for name, run in runs.items():
                    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
                    out = run(qg, kg, vg, causal)
                    out.backward(do, retain_graph=True)
                    grads[name] = [t.grad.float() for t in (qg, kg, vg)]
                    row["ms"][name] = do_bench(functools.partial(out.backward, do, retain_graph=True), warmup=5,
                                               rep=20, grad_to_none=[qg, kg, vg])
                for name in impls:
                    row["rel_diff_vs_cudnn"][name] = [float((a - b).norm() / b.norm())
                                                      for a, b in zip(grads[name], grads["cudnn"])]
                rows.append(row)
                ref = row["ms"]["cudnn"]
                print(f"d={d} N={n:5d} causal={int(causal)}  " + "  ".join(
                    f"{name} {ms:.3f} ms (cuDNN ×{ref / ms:.3f})" for name, ms in row["ms"].items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gluon_bwd_ab.json"), "w") as fh:
        json.dump(dict(old=args.old, new=args.new, seconds=time.time() - t0, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
