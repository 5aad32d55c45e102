"""
第 5 讲 · 演示 6：StepModel 对上 H200 的实测 —— 默认假设差多少，拟合之后还差在哪

你会看到：
  1. 已提交的实测（lecture05/results/step_measure.json：H200、BF16，Llama-3.2-1B 与 Llama-3.1-8B 形状的随机权重模型；
     文件里记着日期、GPU、驱动、torch / CUDA 版本，每步启动几个 GPU 内核、注意力用的哪个内核）；
  2. 每一点：实测、StepModel 用默认假设（mfu 0.6、mbu 0.8、每步 1 ms）的预测和比值，拟合之后的预测和比值；
     prefill 是 eager，decode 分 eager（逐个启动内核）和 CUDA graph（整步录成一张图再重放）；
  3. 拟合（Σ log²(模型 / 实测) 最小）出的 mfu、mbu、eager / graph 两种开销；中位误差、最差的点和它差在哪；
  4. 第 11 讲时间线模型的那一步（1B、批 1、上下文 160）：eager 与 CUDA graph 差多少；
  5. 图：lecture05/results/step_calibration.png（模型 vs 实测，对数坐标，拟合前后；--quick 的小图进 figures/quick/）。

在 H200 上重新测（约 1–2 分钟）：python3 lecture05/step_bench.py --measure
只读结果、拟合、画图（没有 GPU 也行）：python3 lecture05/06_step_calibration.py [--quick] [--results PATH]
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serving_sim as ss  # noqa: E402
import step_bench as sb  # noqa: E402
from course_utils import format_table, pyplot, save_figure  # noqa: E402

SKIP = 77
KEYS = ("mfu", "mbu", "overhead_eager", "overhead_graph")


def shape_text(p):
    return f"{p['n_prompts']}×{p['prompt_len']}" if p["kind"] == "prefill" else f"B {p['batch']} × ctx {p['context']}"


def print_meta(res):
    m = res["meta"]
    print(f"实测：{m.get('gpu')}，驱动 {m.get('driver')}，torch {m.get('torch')}，CUDA {m.get('cuda')}，"
          f"{m.get('date')}，{m.get('dtype')}" + ("（合成数据：StepModel 生成的“实测”）" if m.get("synthetic") else ""))
    for name, k in m.get("kernels", {}).items():
        pre, dec = k.get("prefill", {}), k.get("decode", {})
        attn = sorted(set(pre.get("attention_kernels", []) + dec.get("attention_kernels", [])))
        print(f"  {name}：一次 prefill（1×128）启动 {pre.get('n_kernels', '?')} 个 GPU 内核，一次 decode（批 8）"
              f"{dec.get('n_kernels', '?')} 个；注意力 / softmax 内核：{attn[:3]}")
    bad = [p for p in res["points"] if p.get("status") != "ok"]
    for p in bad:
        print(f"  没测：{p['model']} {p['kind']} {shape_text(p)} {p['mode']} —— {p.get('status')}：{p.get('reason')}")


def table(before, after):
    rows = []
    for b, a in zip(before, after):
        rows.append([b["model"], b["kind"], shape_text(b), b["mode"], f"{b['seconds'] * 1e3:.3f}",
                     f"{b['model_s'] * 1e3:.3f}", f"{b['ratio']:.2f}", f"{a['model_s'] * 1e3:.3f}", f"{a['ratio']:.2f}",
                     a["bound"]])
    heads = ["模型", "步", "形状", "执行", "实测 ms", "默认模型 ms", "默认/实测", "拟合模型 ms", "拟合/实测",
             "拟合后受限于"]
    print(format_table(heads, rows))


def _param_text(key, v):
    if v is None:
        return "-"
    return f"{v * 1e3:.3f} ms" if key.startswith("overhead") else f"{v:.3f}"


def print_fit(fit, before, after):
    print("\n=== 拟合出的参数（mfu、mbu 两种执行方式共用）===")
    rows = []
    for k in KEYS:
        rows.append([k, _param_text(k, sb.DEFAULT_PARAMS[k]), _param_text(k, fit[k])])
    print(format_table(["参数", "默认假设", "H200 拟合"], rows))
    eb, ea = sb.error_summary(before), sb.error_summary(after)
    print(f"  中位 |模型/实测 − 1|：默认 {eb['median']:.0%} → 拟合后 {ea['median']:.0%}（{fit['n_points']} 个点；"
          f"Σ log² 从 {sum(math.log(r['ratio']) ** 2 for r in before):.2f} 降到 {fit['loss']:.2f}）")
    return ea


def print_groups(after):
    """拟合后按 (模型, 步, 执行方式) 分组：比值的中位数与范围——系统性的偏差在这里看得出来。"""
    groups = {}
    for r in after:
        groups.setdefault((r["model"], r["kind"], r["mode"]), []).append(r["ratio"])
    rows = [[m, k, mode, len(v), f"{sorted(v)[len(v) // 2]:.2f}", f"{min(v):.2f} – {max(v):.2f}"]
            for (m, k, mode), v in groups.items()]
    print(format_table(["模型", "步", "执行", "点数", "拟合/实测 中位", "范围"], rows))


def print_worst(worst, configs, meta, after=()):
    print(f"\n=== 拟合后最差的一点：{worst['model']} {worst['kind']} {shape_text(worst)} {worst['mode']}，"
          f"模型 {worst['model_s'] * 1e3:.3f} ms vs 实测 {worst['seconds'] * 1e3:.3f} ms"
          f"（比值 {worst['ratio']:.2f}）===")
    n_k = meta.get("kernels", {}).get(worst["model"], {}).get("decode", {}).get("n_kernels")
    peers = [r["seconds"] for r in after if shape_text(r) != shape_text(worst)
             and all(r[k] == worst[k] for k in ("model", "kind", "mode"))]
    for note in sb.explain_point(worst, configs[worst["model"]], kernels_per_step=n_k, peers=peers):
        print(f"  · {note}")


def print_lecture11_point(after):
    pts = {r["mode"]: r for r in after if r["model"] == "Llama-3.2-1B" and r["kind"] == "decode"
           and r["batch"] == 1 and r["context"] == 160}
    if set(pts) != {"eager", "graph"}:
        return
    e, g = pts["eager"], pts["graph"]
    print("\n=== 第 11 讲时间线模型的那一步（Llama-3.2-1B，批 1，上下文 160）===")
    print(f"  eager {e['seconds'] * 1e6:.0f} µs，CUDA graph {g['seconds'] * 1e6:.0f} µs：图省掉了 "
          f"{(e['seconds'] - g['seconds']) * 1e6:.0f} µs 的主机开销（{e['seconds'] / g['seconds']:.1f}×）；"
          f"拟合模型给 {g['model_s'] * 1e6:.0f} µs（graph）")


def check_constants(fit, meta, results_path):
    """serving_sim.H200_MEASURED 必须等于对已提交 JSON 的拟合（只对默认的结果文件检查）。"""
    if os.path.abspath(results_path) != os.path.abspath(sb.RESULTS):
        return
    if ss.H200_MEASURED is None:
        print("\nserving_sim.H200_MEASURED 还没有填：把下面三行粘贴进 lecture05/serving_sim.py"
              "（替换 H200_MEASURED = None）\n" + sb.constant_text(fit, meta))
        return
    for k in KEYS:
        assert abs(ss.H200_MEASURED[k] - fit[k]) <= 1e-3 * abs(fit[k]), (k, ss.H200_MEASURED[k], fit[k])
    print("\nserving_sim.H200_MEASURED 与这次拟合一致（相对 1e-3 内）。")


def plot(before, after, meta, quick):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.8), sharex=True, sharey=True)
    markers = {("prefill", "eager"): ("o", "prefill (eager)"), ("decode", "eager"): ("^", "decode, eager"),
               ("decode", "graph"): ("s", "decode, CUDA graph")}
    names = sorted({r["model"] for r in before})
    for ax, rows, title in ((axes[0], before, "before: default mfu 0.6, mbu 0.8, 1 ms"),
                            (axes[1], after, "after: fitted on these points")):
        for ci, name in enumerate(names):
            for (kind, mode), (mk, label) in markers.items():
                sel = [r for r in rows if r["model"] == name and r["kind"] == kind and r["mode"] == mode]
                if sel:
                    ax.loglog([r["seconds"] * 1e3 for r in sel], [r["model_s"] * 1e3 for r in sel], mk,
                              color=f"C{ci}", alpha=0.75, label=f"{name}: {label}")
        lo = min(min(r["seconds"], r["model_s"]) for r in before + after) * 1e3 / 1.5
        hi = max(max(r["seconds"], r["model_s"]) for r in before + after) * 1e3 * 1.5
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xlabel("measured step time (ms)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("StepModel step time (ms)")
    axes[1].legend(loc="upper left", fontsize=12)
    fig.suptitle(f"StepModel vs measured engine steps "
                 f"({meta.get('gpu')}, torch {meta.get('torch')}, {meta.get('date')})")
    path = save_figure(fig, __file__, "fit", quick=quick, path=os.path.join(HERE, "results", "step_calibration.png"))
    print(f"\n图：{path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--results", default=sb.RESULTS, help="测量 JSON（step_bench.py --measure 写的）")
    ap.add_argument("--quick", action="store_true", help="同完整版：只读已提交的结果；图进 figures/quick/")
    args = ap.parse_args()
    if not os.path.exists(args.results):
        print(f"SKIP: 没有实测结果 {os.path.relpath(args.results)}；"
              f"在 H200 上运行 python3 lecture05/step_bench.py --measure")
        sys.exit(SKIP)
    res, configs = sb.load_results(args.results)
    print_meta(res)
    before = sb.compare_points(res["points"], configs, sb.DEFAULT_PARAMS)
    fit = sb.fit_step_params(res["points"], configs)
    after = sb.compare_points(res["points"], configs, fit)
    print("\n=== 逐点：实测 vs StepModel（默认假设 / 拟合后）===")
    table(before, after)
    ea = print_fit(fit, before, after)
    print_groups(after)
    print_worst(ea["worst"], configs, res["meta"], after)
    print_lecture11_point(after)
    # 结论：拟合不会比默认更差（默认值是拟合的候选起点之一）；参数在 StepModel 允许的范围里
    assert fit["loss"] <= sum(math.log(r["ratio"]) ** 2 for r in before) + 1e-12
    assert 0 < fit["mfu"] <= 1 and 0 < fit["mbu"] <= 1 and fit["overhead_eager"] >= 0
    check_constants(fit, res["meta"], args.results)
    plot(before, after, res["meta"], args.quick)


if __name__ == "__main__":
    main()
