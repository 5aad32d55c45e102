"""
第 19 讲 · 演示 1：大海捞针的玩具世界，和一个在 T = 128 上训练的基座模型

你会看到：
    1. 数据长什么样：课程学习第一阶段（没有草堆，针一根接一根）、正式训练（草堆里藏 2–6 根针，结尾问两倍多个问题）、
       测试（目标针放在指定深度，另有 3 根干扰针，结尾问一次）。
    2. 基座模型（d = 128、2 层、2 个头、RoPE base 10000，种子 1）的训练曲线：课程学习阶段准确率从 ≈ 1/针数
       突然跳到 ≈ 1（学会了"比对键、抄后面的值"），换上草堆后保持住。
    3. NIAH 准确率表（长度 128…1024 × 深度 0…1，热力图）：训练长度上每个深度都找得到；更长时从远处开始失效。
    4. 第二层注意力在最后一个位置上看哪里（T = 256）：权重集中在目标针附近（图）。

运行：python3 lecture19/01_needle_base.py [--quick]
      模型从 checkpoints/base.pt 读取（没有、损坏或配置不符时重新训练，几分钟）；
      --quick 也读它、只缩小评测（读不到时只在内存里训 20 步，不写文件）。
图：lecture19/figures/01_needle_base_grid.png、01_needle_base_attention.png
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import long_lab as L  # noqa: E402
from course_utils import pyplot, save_figure  # noqa: E402


def show(task, ids, tgt=None, width=24):
    names = task.names()
    toks = [names[t] for t in ids.tolist()]
    if tgt is not None:
        toks = [f"[{x}]" if int(y) != -100 else x for x, y in zip(toks, tgt.tolist())]
    text = " ".join(toks)
    return text if len(toks) <= width else " ".join(toks[:width // 2]) + " … " + " ".join(toks[-width // 2:])


def examples(task):
    ids, tgt = task.train_batch(1, 1, L.CURRICULUM_T, hay=False)
    print("课程学习第一阶段（不放草堆，[x] = 要预测下一个 token 的位置）：")
    keep = ids[0] != task.PAD                                       # 去掉结尾补的 <pad>
    print("  " + show(task, ids[0][keep], tgt[0][keep], width=60))
    ids, tgt = task.train_batch(2, 1, 128)
    print("正式训练（T = 128，填充词按马尔可夫链生成）：")
    print("  " + show(task, ids[0], tgt[0], width=40))
    ids, ans, dist = task.needle_batch(3, 1, 128, 0.25)
    print(f"测试（T = 128，深度 0.25；答案 {task.names()[ans[0]]}，离结尾约 {dist} 个 token）：")
    print("  " + show(task, ids[0], width=40))


def curve_table(curve, curriculum):
    rows = [[s, "无草堆" if s <= curriculum else "T = 128", f"{loss:.3f}", f"{acc:.3f}"] for s, loss, acc in curve]
    print(L.format_table(["step", "数据", "损失（答案处）", "答案准确率"], rows))
    print(f"前 {curriculum} 步是课程学习（不放草堆，长 {L.CURRICULUM_T}）：准确率从 ≈ 1/针数 跳到 ≈ 1 的那一段，"
          "就是模型学会\"比对键、抄后面的值\"的时候；之后换上草堆，准确率保持住。")


def grid_table(grid, lengths, depths):
    rows = [[T] + [f"{grid[(T, d)]:.2f}" for d in depths] + [f"{min(grid[(T, d)] for d in depths):.2f}"]
            for T in lengths]
    print(L.format_table(["T \\ 深度"] + [f"{d:.2f}" for d in depths] + ["最差"], rows))


def attention_view(task, model, T):
    ids, ans, _ = task.needle_batch(99, 1, T, 0.3)
    for blk in model.blocks:
        blk.attn.keep_attn = True
    with torch.no_grad():
        pred = model(ids, last_only=True).argmax(-1)
    att = model.blocks[-1].attn.last_attn[0, :, -1]                 # [H, T]：第二层、最后一个位置
    for blk in model.blocks:
        blk.attn.keep_attn = False
    seq = ids[0].tolist()
    v_pos = next(i + 2 for i in range(T - 2) if seq[i] == task.N and seq[i + 1] == seq[-1])   # 目标针里 v 的位置
    top = att.max(0).values.topk(3).indices.tolist()
    print(f"\nT = {T}，深度 0.3：模型答 {task.names()[pred[0]]}，正确答案 {task.names()[ans[0]]}；"
          f"第二层注意力权重最大的 3 个位置 {top}，目标针的值在 {v_pos}"
          f"（这一位置的权重：{', '.join(f'{a:.2f}' for a in att[:, v_pos].tolist())}）")
    return att, v_pos, ids[0]


def plot(grid, lengths, depths, att, v_pos, ids, task, quick):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    im = L.niah_heatmap(ax, grid, lengths, depths)
    ax.set_xlabel("context length T (tokens; trained at 128)")
    ax.set_ylabel("needle depth (0 = start)")
    # 标题里的数由表算出（不是写死的结论）：训练长度以内、以外的平均准确率，最差的那一格
    inside = [grid[(T, d)] for T in lengths if T <= 128 for d in depths]
    outside = [grid[(T, d)] for T in lengths if T > 128 for d in depths]
    T_w, d_w = min(grid, key=grid.get)
    ax.set_title(f"Base model NIAH accuracy: mean {sum(inside) / len(inside):.2f} up to T = 128, "
                 f"{sum(outside) / max(len(outside), 1):.2f} beyond\nworst cell {grid[(T_w, d_w)]:.2f} "
                 f"(T = {T_w}, depth {d_w:.2f})")
    fig.colorbar(im, ax=ax, label="retrieval accuracy (fraction correct)")
    paths = [save_figure(fig, __file__, "grid", quick=quick)]
    # 每个头一块小图（共用横轴）：画在一张图上时 head 1 正好盖住 head 0
    H = att.shape[0]
    fig, axes = plt.subplots(H, 1, figsize=(9, 2.2 + 1.6 * H), sharex=True, squeeze=False)
    needles = (ids == task.N).nonzero().flatten().tolist()
    for h, ax in enumerate(axes[:, 0]):
        for p in needles:
            ax.axvline(p + 2, color="gray", ls=":", lw=1.5, label="all needles' values" if p == needles[0] else None)
        ax.axvline(v_pos, color="tab:red", ls="--", lw=1.5, label="target needle's value")
        ax.plot(att[h].numpy(), color="tab:blue", lw=2, label=f"layer 2, head {h}")
        ax.set_ylim(-0.05, 1.1)
        ax.set_ylabel(f"head {h}\nweight")
        ax.legend(loc="upper right", fontsize=12)
    axes[-1, 0].set_xlabel("key position (tokens)")
    share = float(att[:, v_pos].min())
    axes[0, 0].set_title(f"Last query: every layer-2 head puts ≥ {share:.0%} of its attention\n"
                         "on the target needle's value (weights sum to 1 per head)")
    paths.append(save_figure(fig, __file__, "attention", quick=quick))
    return paths


def main():
    args, task = L.demo_start("大海捞针：基座模型与准确率表", "读入库的检查点、小表（读不到时只训练 20 步，不写文件）")
    print(f"词表 {task.vocab_size} 个 token：<pad> <s> Q N、{task.n_keys} 个键、{task.n_values} 个值、"
          f"{task.n_filler} 个填充词")
    examples(task)
    print()
    model, curve = L.get_checkpoint(task, "base", quick=args.quick)
    print(f"基座模型：{sum(p.numel() for p in model.parameters()):,} 个参数；配置 {L.CHECKPOINTS['base']}")
    if curve:
        curve_table(curve, L.CHECKPOINTS["base"]["curriculum"])
    lengths = (128, 256) if args.quick else (128, 256, 512, 1024)
    depths = (0.0, 0.5, 1.0) if args.quick else L.NIAH_DEPTHS
    n = 8 if args.quick else 64
    grid = L.cached_grid(task, "base", model, lengths, depths, n=n, quick=args.quick, log=print)
    print(f"\nNIAH 准确率（每格 {n} 个测试序列，1 根目标针 + 3 根干扰针，随机猜 = 1/16）：")
    grid_table(grid, lengths, depths)
    if not args.quick:
        worst = min(grid[(128, d)] for d in depths)
        assert worst >= 0.9, f"基座模型在训练长度上应当每个深度都 ≥ 0.9，最差 {worst}"
        print(f"训练长度 128 上最差的深度也有 {worst:.2f}。")
    att, v_pos, ids = attention_view(task, model, 256)
    for p in plot(grid, lengths, depths, att, v_pos, ids, task, args.quick):
        print(f"图：{os.path.relpath(p)}")


if __name__ == "__main__":
    main()
