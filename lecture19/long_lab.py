"""
CS349E · 第 19 讲实验模块：long_lab.py —— 长上下文：大海捞针、RoPE 外推、稀疏注意力、环形注意力

【这一讲要回答的问题】
    1. 只在 128 个 token 上训练过的小模型，能在 1024、2048 个 token 的"草堆"里找到那根"针"吗？
       RoPE 的外推、位置插值（PI [S85]）、调大 base、在更长的序列上继续训练，各起什么作用？
    2. 滑动窗口 / 跨步 / 空洞这些稀疏注意力省下了多少 (查询, 键) 对，又看不见什么？
    3. 序列长到一块设备放不下时，环形注意力（Ring Attention）怎样把第 18 讲的"分块 + 在线 softmax"
       摊到 P 个进程上：每个进程只存自己那一段 Q/K/V，K/V 块沿环传递，传输和计算重叠。

【里面有什么】
    NeedleTask                    玩具世界：词表 <pad> <s> Q N + 16 个键 + 16 个值 + 32 个填充词；
                                  train_batch（训练：2–6 根针，问题有放回地抽，只在答案处计损失）、
                                  needle_batch（测试：目标针放在指定深度，另有 3 根干扰针）
    attention_mask / pattern_pairs  full / window / strided / dilated 四种因果模式及其 (q, k) 对数
    LongAttention / LongBlock / LongLM / build_model   Llama 式小模型（d = 128、2 层、2 个头），RoPE 可调 base
                                  与插值倍数 scale，或不用位置编码（NoPE）；注意力模式可换
    train_needle / niah_grid      训练（AdamW、预热 + 余弦、课程学习、梯度裁剪）与"长度 × 深度"准确率表
    save_model / load_model / get_model / CHECKPOINTS / get_checkpoint / cached_grid   检查点（checkpoint_store）、
                                  演示用的模型配置与 NIAH 表缓存；demo_start（演示 01–03 的开头）、niah_heatmap
    TASK_SEED / DATA_SEED / EVAL_SEED   草堆、训练数据、测试题的种子（模型初始化的在 CHECKPOINTS 里）
    RingLedger / ring_attention   环形注意力的单进程模拟（contiguous / striped 两种切法），记账每轮工作量和发送量
    （真正的多进程环形注意力在 ring_dist.py：torch.distributed 点对点收发，用这里的 shard_index 和 _block）
    flops_per_token               训练每个 token 的 FLOPs（参数部分 + 注意力部分）
    activation_bytes / max_seq_len   每层激活显存（Ring Attention 论文表 1；用第 18 讲的那一份）

【约定】注意力的输入 (N, d) 或 (..., N, d)；模型的 ids 是 (B, T) 的 long；准确率是比例（0–1）；字节按 BF16。
【运行】python3 lecture19/long_lab.py      # 自检，几秒
【依赖】torch；lecture04/modern_lm.py（RMSNorm、SwiGLU、RoPE），lecture18/flash_lab.py（分块状态的合并）。
"""

import bisect
import copy
import itertools
import math
import os
import random
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
for _d in ("lecture01", "lecture18", "lecture04"):
    _p = os.path.join(HERE, "..", _d)
    if _p not in sys.path:
        sys.path.insert(0, _p)


def _import_lecture18_flash_lab():
    """lecture11 也有一个 flash_lab：如果进程里已经有别的文件夹的同名模块，先挪开，导入第 18 讲的那个。"""
    want = os.path.abspath(os.path.join(HERE, "..", "lecture18"))
    other = sys.modules.get("flash_lab")
    if other is not None and os.path.dirname(os.path.abspath(getattr(other, "__file__", "") or "")) == want:
        return other
    if other is not None:
        del sys.modules["flash_lab"]
    sys.path.insert(0, want)
    try:
        import flash_lab as fl18
    finally:
        sys.path.remove(want)
        if other is not None:
            sys.modules["flash_lab"] = other    # 放回去：别人手里的 flash_lab 不变
        else:
            sys.modules.pop("flash_lab", None)  # 也不留下裸名字：之后 `import flash_lab` 的（第 11 讲）拿到自己的那个
    return fl18


_fl18 = _import_lecture18_flash_lab()
block_state, merge_states, finalize = _fl18.block_state, _fl18.merge_states, _fl18.finalize
from course_utils import (check_bool, check_choice, check_device, check_int, check_memory, check_real,  # noqa: E402,F401
                          check_torch_seed, format_table)
from modern_lm import RMSNorm, SwiGLU, apply_rope_half, rope_angles  # noqa: E402
from checkpoint_store import (CheckpointStore, ResultCache, canon, interrupted, state_digest,  # noqa: E402
                              stop_on_ctrl_c)

CKPT = os.path.join(HERE, "checkpoints")
MANIFEST = "manifest.json"
STORE_DTYPE = torch.float16     # 检查点里权重的类型（见 save_model）
CURRICULUM_T = 64       # 课程学习第一阶段（不放草堆）的长度：6 根针 + 12 个问题 = 1 + 18 + 36 = 55 个 token
MASK_KINDS = ("full", "window", "strided", "dilated")
LAYOUTS = ("contiguous", "striped")
POS_KINDS = ("rope", "none")
MODEL_KEYS = ("seed", "pos", "base", "scale", "mask", "mask_kw", "d_model", "n_layers", "n_heads")   # build_model 的键
TRAIN_KEYS = ("steps", "T", "lr", "data_offset", "curriculum", "zone", "warmup", "init", "batch")   # get_model 加上的
MASK_KW = ("window", "stride", "segments")               # attention_mask 的关键字参数
# 决定演示 01–03 结果的种子（模型初始化的种子在 CHECKPOINTS 每一项的 cfg["seed"] 里）；demo_start 把它们打印出来
TASK_SEED = 0             # NeedleTask：草堆（填充词马尔可夫链）
DATA_SEED = 0             # train_needle：训练数据
EVAL_SEED = 12345         # niah_grid / cached_grid：测试题（所有模型答同一批题）
MODEL_SEED = 1            # 模型初始化：cfg 里没写 "seed" 时的默认（CHECKPOINTS 每一项都写明了）


# =====================================================================
# 1. 大海捞针的玩具世界
# =====================================================================
class NeedleTask:
    """
    【参数】n_keys / n_values / n_filler：三类 token 各有几个；seed：生成填充词马尔可夫链用的种子
    【属性】vocab_size；PAD=0、BOS=1、Q=2、N=3；键从 key0、值从 val0、填充词从 fil0 开始编号
    【方法】
        train_batch(gen_seed, B, T, min_needles=2, max_needles=6, hay=True, q_per_needle=2, zone=(0, 1))
            -> (ids [B, T], targets [B, T])。每个序列 n 根针 "N k v"（n 在 [min, max] 里均匀抽），
            结尾 q_per_needle·n 个问题 "Q k v"，问哪根针是**有放回**地抽的；targets 只在每个问题的 k 处
            等于答案 v（预测下一个 token），别处 −100。hay=False：课程学习的第一阶段，不放草堆，针紧挨着，
            后面补 <pad>。zone=(a, b)：针只插在草堆的 [a, b] 这一段（按比例）。
        needle_batch(gen_seed, B, T, depth, n_distractors=3) -> (ids [B, T], answer [B], distance)：
            目标针放在草堆的 depth（0 = 紧跟 <s>，1 = 紧挨结尾的问题），另有 n_distractors 根干扰针
            （不同的键、随机位置）；结尾 "Q k"，要预测 v。distance ≈ 目标针的 v 离最后一个位置多远。
    【为什么这样设计】键值配对每个序列都重新抽，没法背下来，只能"回头找同一个 k，把它后面的 v 抄过来"
        ——这正是归纳头（induction head）做的事，也是大海捞针测试（needle in a haystack [S87]）的最小版本。
        问题有放回地抽：每根针恰好问一次的话，最后几个问题可以靠排除法答对，而不去比对键。
        测试时另放干扰针：只有一根针时，"抄 N 后面第二个 token"就能答对，测不出检索。
    """

    def __init__(self, n_keys=16, n_values=16, n_filler=32, seed=TASK_SEED):
        n_keys = check_int("n_keys", n_keys, lo=7, where="NeedleTask")       # 测试要 1 + 6 个不同的键
        n_values = check_int("n_values", n_values, lo=1, where="NeedleTask")
        n_filler = check_int("n_filler", n_filler, lo=4, where="NeedleTask")  # 每个填充词有 4 个后继
        self.PAD, self.BOS, self.Q, self.N = range(4)          # 4 个特殊 token
        self.key0, self.val0, self.fil0 = 4, 4 + n_keys, 4 + n_keys + n_values
        self.n_keys = n_keys
        self.n_values = n_values
        self.n_filler = n_filler
        self.vocab_size = 4 + n_keys + n_values + n_filler
        # 草堆 = 一条随机马尔可夫链：每个填充词只会接 4 种填充词。有规律、可预测，但和问题无关
        chain = random.Random(seed)
        self.next_fill = []
        for _f in range(n_filler):
            succ = chain.sample(range(n_filler), 4)
            weights = [chain.random() + 0.2 for _ in succ]
            self.next_fill.append((succ, weights))
        # 累计权重先算好：_haystack 每走一步只抽一个均匀数再二分（和 rng.choices(succ, weights) 逐位相同）
        self._cum = [(list(succ), list(itertools.accumulate(w)), sum(w) + 0.0) for succ, w in self.next_fill]
        for succ, _cw, _total in self._cum:
            succ[:] = [x + self.fil0 for x in succ]                       # 直接存 token 编号

    def names(self):
        """每个编号的可读名字（打印例子用）。"""
        return (["<pad>", "<s>", "Q", "N"] + [f"k{i}" for i in range(self.n_keys)]
                + [f"v{i}" for i in range(self.n_values)] + [f"f{i}" for i in range(self.n_filler)])

    def min_train_T(self, max_needles=6, q_per_needle=2):
        """train_batch 放得下 max_needles 根针和它们的问题所需的最短长度（<s> + 3 个/针 + 3 个/问题）。"""
        return 1 + 3 * max_needles + 3 * q_per_needle * max_needles

    def _haystack(self, rng, length):
        """length 个填充词：从随机的一个出发，沿马尔可夫链走（每步 = rng.choices(后继, 权重)，写成一次二分）。"""
        state = rng.randrange(self.n_filler)
        word, words, cum, uniform = state + self.fil0, [], self._cum, rng.random
        for _i in range(length):
            words.append(word)
            succ, cw, total = cum[word - self.fil0]
            word = succ[bisect.bisect(cw, uniform() * total, 0, 3)]
        return words

    def _draw_needles(self, rng, n):
        keys = rng.sample(range(self.n_keys), n)           # 一个序列里的键互不相同：问题才有唯一答案
        return keys, [rng.randrange(self.n_values) for _ in keys]

    def _insert(self, hay, spots, needles):
        """把针 "N k v" 插进草堆：needles[i] 插在 hay[spots[i]] 之前（spots 已按顺序排好）。"""
        out, cut = [self.BOS], 0
        for s, (k, v) in zip(spots, needles):
            out.extend(hay[cut:s])
            out.extend((self.N, self.key0 + k, self.val0 + v))
            cut = s
        return out + hay[cut:]

    def train_batch(self, gen_seed, B, T, min_needles=2, max_needles=6, hay=True, q_per_needle=2,
                    zone=(0.0, 1.0)):
        self._check_train(B, T, min_needles, max_needles, hay, q_per_needle, zone)
        gen = random.Random(gen_seed)
        rows, at, answers = [], [], []                      # 每行的 token；答案的 (行, 列) 与值，最后一次写进张量
        for row in range(B):
            n_needles = gen.randint(min_needles, max_needles)
            keys, vals = self._draw_needles(gen, n_needles)
            n_questions = q_per_needle * n_needles
            hay_len = (T - 1 - 3 * n_needles - 3 * n_questions) if hay else 0
            lo = round(zone[0] * hay_len)
            hi = round(zone[1] * hay_len)
            spots = sorted(gen.randint(lo, hi) for _n in range(n_needles))
            order = list(range(n_needles))
            gen.shuffle(order)                              # 针在序列里的顺序和键的编号无关
            seq = self._insert(self._haystack(gen, hay_len), spots, [(keys[i], vals[i]) for i in order])
            for _q in range(n_questions):
                which = gen.randrange(n_needles)            # 有放回：同一根针可能被问好几次
                answer = self.val0 + vals[which]
                seq.extend((self.Q, self.key0 + keys[which]))
                at.append(row * T + len(seq) - 1)           # 读到 "Q k" 的 k 时，下一个 token 应是 v
                answers.append(answer)
                seq.append(answer)
            rows.append(seq + [self.PAD] * (T - len(seq)))  # hay=False 时序列较短，后面是 <pad>（不计损失）
        ids = torch.tensor(rows, dtype=torch.long)
        tgt = torch.full((B * T,), -100, dtype=torch.long)  # −100 = 不计损失
        tgt[torch.tensor(at, dtype=torch.long)] = torch.tensor(answers, dtype=torch.long)
        return ids, tgt.view(B, T)

    def needle_batch(self, gen_seed, B, T, depth, n_distractors=3):
        self._check_needle(B, T, depth, n_distractors)
        gen = random.Random(gen_seed)
        n_needles = n_distractors + 1
        hay_len = T - 3 * n_needles - 3                    # <s>、针、结尾的 "Q k" 之外都是草堆
        pos = round(depth * hay_len)                       # 目标针插在 hay[pos] 之前
        ids = torch.zeros((B, T), dtype=torch.long)
        answers = torch.zeros(B, dtype=torch.long)
        for row in range(B):
            keys, vals = self._draw_needles(gen, n_needles)   # 第 0 根是目标，其余是干扰针
            hay = self._haystack(gen, hay_len)
            spots = [pos] + [gen.randint(0, hay_len) for _d in range(n_distractors)]
            order = sorted(range(n_needles), key=lambda i: (spots[i], i))   # 同一位置时目标针在前
            seq = self._insert(hay, [spots[i] for i in order], [(keys[i], vals[i]) for i in order])
            ids[row] = torch.tensor(seq + [self.Q, self.key0 + keys[0]])
            answers[row] = vals[0] + self.val0
        distance = (T - 1) - (pos + 3)                     # 目标针的 v 在位置 pos + 3，最后一个位置是 T − 1
        return ids, answers, distance

    # ---- 输入检查 ----
    def _check_train(self, B, T, min_needles, max_needles, hay, q_per_needle, zone):
        w = "train_batch"
        check_int("B", B, lo=1, where=w)
        min_needles = check_int("min_needles", min_needles, lo=1, hi=self.n_keys, where=w)
        max_needles = check_int("max_needles", max_needles, lo=min_needles, hi=self.n_keys, where=w)
        q_per_needle = check_int("q_per_needle", q_per_needle, lo=1, where=w)
        check_bool("hay", hay, where=w)
        if not (isinstance(zone, (tuple, list)) and len(zone) == 2):
            raise TypeError(f"{w}：zone 必须是 (a, b) 两个比例，收到 {zone!r}")
        a = check_real("zone[0]", zone[0], lo=0, hi=1, where=w)
        check_real("zone[1]", zone[1], lo=a, hi=1, where=w)
        need = self.min_train_T(max_needles, q_per_needle)
        why = f"{w}（{max_needles} 根针和 {q_per_needle * max_needles} 个问题要 {need} 个 token）"
        check_int("T", T, lo=need, where=why)

    def _check_needle(self, B, T, depth, n_distractors):
        w = "needle_batch"
        check_int("B", B, lo=1, where=w)
        n_distractors = check_int("n_distractors", n_distractors, lo=0, hi=self.n_keys - 1, where=w)
        need = 1 + 3 * (1 + n_distractors) + 2
        check_int("T", T, lo=need, where=f"{w}（{1 + n_distractors} 根针和问题要 {need} 个 token）")
        check_real("depth", depth, lo=0, hi=1, where=w)


# =====================================================================
# 2. 注意力模式
# =====================================================================
def attention_mask(kind, T, window=16, stride=8, segments=((8, 1), (32, 4), (128, 16))):
    """
    (T, T) 的布尔矩阵：allowed[i, j] = 第 i 个查询能不能看第 j 个键。四种模式都是因果的（j ≤ i），对角线永远允许
    （每行至少有一个键，softmax 不会整行 −∞）。
        "full"    普通因果注意力，每个查询看 i + 1 个键；
        "window"  滑动窗口：只看最近 window 个 token（含自己）——Mistral、Longformer 的局部部分；
        "strided" Sparse Transformer（Child et al., 2019）的跨步模式：最近 stride 个 token，外加所有与自己
                  相距 stride 整数倍的 token；stride ≈ √T 时每个查询看 O(√T) 个键；
        "dilated" LongNet 的空洞注意力（Ding et al., 2023）的简化版：对每个 (w, r)，序列切成长 w 的段，
                  查询看同一段里下标 ≡ 0 (mod r) 的键；几组合起来，近处密、远处疏。
                  （原文还把查询按 r 抽稀、不同的头错开起点；我们只有 2 个头，只抽稀键。）
    """
    _check_mask_args(kind, T, window, stride, segments)
    qi = torch.arange(T)[:, None]                      # [T, 1] 查询位置
    kj = torch.arange(T)[None, :]                      # [1, T] 键位置
    gap = qi - kj                                      # [T, T] 往回看多远
    causal = gap >= 0
    if kind == "window":
        return causal & (gap < window)
    if kind == "strided":
        return causal & ((gap < stride) | (gap % stride == 0))
    if kind == "full":
        return causal
    seen = gap == 0                                    # dilated：对角线 + 每一组 (w, r)
    for w, r in segments:
        seen |= (qi // w == kj // w) & ((kj % w) % r == 0)
    return causal & seen


def pattern_pairs(kind, T, **kw):
    """一种模式要计算的 (查询, 键) 对数 = 掩码里 True 的个数；注意力的计算量和分数矩阵的显存都正比于它。"""
    allowed = attention_mask(kind, T, **kw)
    return int(allowed.sum())


def _check_mask_args(kind, T, window, stride, segments):
    w = "attention_mask"
    check_choice("kind", kind, MASK_KINDS, where=w)
    check_int("T", T, lo=1, where=w)
    check_memory(f"T × T = {T} × {T} 的掩码（int64 的距离 + 几份布尔中间结果）", 26 * T * T, w)
    check_int("window", window, lo=1, where=w)
    check_int("stride", stride, lo=1, where=w)
    if not isinstance(segments, (tuple, list)) or not segments:
        raise TypeError(f"{w}：segments 必须是非空的 ((w, r), ...)，收到 {segments!r}")
    for seg in segments:
        if not (isinstance(seg, (tuple, list)) and len(seg) == 2):
            raise TypeError(f"{w}：segments 的每一项必须是 (w, r)，收到 {seg!r}")
        check_int("segments 的段长 w", seg[0], lo=1, where=w)
        check_int("segments 的间隔 r", seg[1], lo=1, where=w)


# =====================================================================
# 3. 模型
# =====================================================================
class LongAttention(nn.Module):
    """
    多头因果注意力，位置编码可换：
        pos="rope"：RoPE（第 4 讲），base 可调；scale > 1 时做位置插值（PI，Chen et al., 2023）：位置 m → m / scale，
                    长 scale·L 的序列被"压回"训练时见过的角度范围；
        pos="none"：不加位置编码（NoPE），只靠因果掩码分辨先后。
    【参数】d_model、n_heads、pos、base、mask_kind（见 attention_mask）、mask_kw
    【属性】scale、base 训练后可以改（零样本换一种位置编码测更长的序列）；keep_attn=True 时把注意力权重
        存到 last_attn（走逐项算分数的参考路径，演示画图用）。
    【快慢两条路】训练走 F.scaled_dot_product_attention（full 用 is_causal，其它模式传布尔掩码）；
        keep_attn 走 softmax(QKᵀ/√d + mask)·V 的参考写法。两条路的一致性在自检里核对。
    """

    def __init__(self, d_model, n_heads, pos="rope", base=10000.0, mask_kind="full", mask_kw=None):
        super().__init__()
        self._check(d_model, n_heads, pos, base, mask_kind)
        self.h = n_heads
        self.dk = d_model // n_heads                    # 每个头的维度
        self.pos, self.base, self.scale = pos, float(base), 1.0
        self.mask_kind, self.mask_kw = mask_kind, _check_mask_kw(mask_kind, mask_kw)
        self.qkv = nn.Linear(d_model, d_model * 3, bias=False)          # Q、K、V 一次算出
        self.out = nn.Linear(in_features=d_model, out_features=d_model, bias=False)
        self._cache = {}
        self.keep_attn = False
        self.last_attn = None

    def allowed(self, T, device):
        """(T, T) 布尔掩码（缓存）。"""
        device = check_device("device", device, where="LongAttention.allowed", type_error=ValueError)
        key = ("mask", self.mask_kind, T, repr(sorted(self.mask_kw.items())), str(device))
        if key not in self._cache:
            self._cache[key] = attention_mask(self.mask_kind, T, **self.mask_kw).to(device)
        return self._cache[key]

    def rope(self, T, device):
        """RoPE 的 cos、sin（缓存；键里带上 scale、base，改了它们自然换一份）。"""
        T = check_int("T", T, lo=1, where="LongAttention.rope")
        device = check_device("device", device, where="LongAttention.rope", type_error=ValueError)
        key = ("rope", T, self.scale, self.base, str(device))
        if key not in self._cache:
            self._cache[key] = tuple(t.to(device) for t in rope_angles(self.positions(T), self.dk, self.base))
        return self._cache[key]

    def positions(self, T):
        """
        RoPE 看到的 T 个位置（float32 [T]）。位置插值 scale 倍（scale = L_目标 / L_训练 ≥ 1）：第 m 个 token 的
        位置记作 m · L_训练 / L_目标 = m / scale——长 scale·L 的序列被压回训练时见过的位置范围 [0, L)。
        scale = 1 时就是 0 … T−1。
        """
        # >>> 练习 19.2
        return torch.arange(T, dtype=torch.float32).div_(self.scale)
        # <<< 练习 19.2

    def rotate(self, q, k):
        """给 q、k [B, H, T, dk] 加上 RoPE（按 positions 的位置，cos、sin 由 rope 缓存）：返回 (q, k)。"""
        # >>> 练习 19.2
        cos, sin = self.rope(q.shape[-2], q.device)
        return apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
        # <<< 练习 19.2

    def forward(self, x):
        """x [B, T, d_model]（浮点）→ [B, T, d_model]。"""
        _check_x("LongAttention", x, self.h * self.dk, [self])
        return self._forward(x)

    def _forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.dk).permute(2, 0, 3, 1, 4)   # 各 [B, H, T, dk]
        if self.pos == "rope":
            q, k = self.rotate(q, k)
        if self.keep_attn:                                                        # 参考路径：显式的分数矩阵
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.dk)              # [B, H, T, T]
            probs = torch.softmax(scores.masked_fill(~self.allowed(T, x.device), float("-inf")), dim=-1)
            self.last_attn = probs.detach()
            o = probs @ v
        elif self.mask_kind == "full":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed(T, x.device))
        return self.out(o.transpose(1, 2).reshape(B, T, D))                       # [B, T, H·dk]

    @staticmethod
    def _check(d_model, n_heads, pos, base, mask_kind):
        w = "LongAttention"
        d_model = check_int("d_model", d_model, lo=2, where=w)
        n_heads = check_int("n_heads", n_heads, lo=1, where=w)
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"{w}：d_model / n_heads 必须是偶数（RoPE 按两半旋转），收到 {d_model} / {n_heads}")
        check_choice("pos", pos, POS_KINDS, where=w)
        check_real("base", base, lo=1, lo_open=True, where=w)
        check_choice("mask_kind", mask_kind, MASK_KINDS, where=w)
        check_memory(f"4 个 d_model × d_model = {d_model} × {d_model} 的矩阵（float32）", 16 * d_model * d_model, w)


class LongBlock(nn.Module):
    """一层 Llama 式的块：x + attn(RMSNorm(x))，再 + SwiGLU(RMSNorm(x))。"""

    def __init__(self, d_model, n_heads, d_ff, **attn_kw):
        super().__init__()
        _check_sizes("LongBlock", d_model, n_heads, d_ff, 1)
        self.n1 = RMSNorm(d_model)
        self.n2 = RMSNorm(d_model)
        self.attn = LongAttention(d_model=d_model, n_heads=n_heads, **attn_kw)
        self.ffn = SwiGLU(d_model=d_model, d_ff=d_ff)

    def forward(self, x):
        """x [B, T, d_model]（浮点）→ 同形状。"""
        _check_x("LongBlock", x, self.n1.d, [self.attn])
        return self._forward(x)

    def _forward(self, x):
        h = x + self.attn._forward(self.n1(x))                 # 先归一化再进子层（pre-norm），残差加回
        return h + self.ffn(self.n2(h))


class LongLM(nn.Module):
    """
    小 Transformer 语言模型（Llama 式：RMSNorm、RoPE、SwiGLU、无偏置），约 42 万参数。
    【参数】vocab_size、d_model=128、n_layers=2、n_heads=2、d_ff=352；pos / base / mask_kind / mask_kw 传给每层注意力
    【为什么每个头 64 维】比对 16 种键需要足够宽的 QK 空间：每头 16 维（d = 64、4 个头）时连最简单的检索都学不会。
    【方法】forward(ids [B, T]) -> logits [B, T, V]；set_rope(scale=None, base=None)：改所有层的插值倍数和 base。
    """

    def __init__(self, vocab_size, d_model=128, n_layers=2, n_heads=2, d_ff=352, **attn_kw):
        super().__init__()
        check_int("vocab_size", vocab_size, lo=1, where="LongLM")
        check_int("n_layers", n_layers, lo=1, where="LongLM")
        _check_sizes("LongLM", d_model, n_heads, d_ff, n_layers, vocab_size)
        self.tok = nn.Embedding(num_embeddings=vocab_size, embedding_dim=d_model)
        layers = [LongBlock(d_model, n_heads, d_ff, **attn_kw) for _layer in range(n_layers)]
        self.blocks = nn.ModuleList(layers)
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(in_features=d_model, out_features=vocab_size, bias=False)
        for mod in self.modules():                    # 所有矩阵 N(0, 0.02²)，和 GPT-2 一样
            if isinstance(mod, (nn.Embedding, nn.Linear)):
                nn.init.normal_(mod.weight, mean=0.0, std=0.02)

    def forward(self, ids, last_only=False):
        """last_only=True 只对最后一个位置算 logits [B, V]（大海捞针的测试只看最后一个位置）。"""
        last_only = check_bool("last_only", last_only, where="LongLM.forward")
        _check_ids(ids, self.tok.num_embeddings)
        _check_activations("LongLM.forward", "ids 的 [B, T]", ids.shape[0], ids.shape[1], self.tok.embedding_dim,
                           self.tok.num_embeddings, [b.attn for b in self.blocks], _d_ff(self))
        x = self.tok(ids)                                   # [B, T, d]
        for blk in self.blocks:
            x = blk._forward(x)
        if last_only:
            x = x[:, -1]                                    # [B, d]
        x = self.norm(x)
        return self.head(x)

    def set_rope(self, scale=None, base=None):
        if scale is not None:
            scale = check_real("scale", scale, lo=0, lo_open=True, where="set_rope")
        if base is not None:
            base = check_real("base", base, lo=1, lo_open=True, where="set_rope")
        for blk in self.blocks:
            if scale is not None:
                blk.attn.scale = scale
            if base is not None:
                blk.attn.base = base
        return self


def build_model(task, cfg):
    """
    按配置字典构造模型（先 torch.manual_seed(cfg["seed"])，默认 1）。
    键：seed、pos、base、scale（位置插值倍数）、mask、mask_kw、d_model、n_layers、n_heads（都有默认值）。
    【为什么默认种子是 1】检索能力是"突然学会"的，出不出现和初始化很有关系（见 train_needle）。
    """
    _check_cfg_keys("build_model", cfg, MODEL_KEYS + TRAIN_KEYS)
    if not isinstance(task, NeedleTask):
        raise TypeError(f"build_model：task 必须是 NeedleTask，收到 {type(task).__name__}")
    get = cfg.get
    torch.manual_seed(check_torch_seed("seed", get("seed", MODEL_SEED), where="build_model"))
    attn_kw = dict(pos=get("pos", "rope"), base=get("base", 10000.0), mask_kind=get("mask", "full"),
                   mask_kw=get("mask_kw"))
    model = LongLM(task.vocab_size, d_model=get("d_model", 128), n_layers=get("n_layers", 2),
                   n_heads=get("n_heads", 2), **attn_kw)
    return model.set_rope(scale=get("scale", 1.0))


def lr_at(step, steps, warmup, lr):
    """学习率：前 warmup 步线性升到 lr，之后余弦降到 0.1·lr。step 从 1 数到 steps（train_needle 的第 step 步）。"""
    check_int("warmup", warmup, lo=1, where="lr_at")        # warmup = 0：第 0 步是 0 / 0
    check_int("steps", steps, lo=1, where="lr_at")
    check_int("step", step, lo=0, hi=steps, where="lr_at")   # 负的步数给出负的学习率
    check_real("lr", lr, lo=0, lo_open=True, where="lr_at")
    if step <= warmup:
        return lr * step / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def train_needle(model, task, steps, T, batch=32, lr=1e-3, seed=DATA_SEED, log=None, log_every=0, warmup=100,
                 data_offset=0, curriculum=0, zone=(0.0, 1.0), progress=False, resume_path=None):
    """
    在大海捞针的数据上训练（每步现造一批新数据；只在答案处计损失）。
    【参数】steps、T（训练长度）、batch、lr（AdamW，线性预热 + 余弦衰减到 10%）、seed（数据种子）、
        data_offset（数据种子的偏移：继续训练时换一批数据）、zone（针插在草堆的哪一段）、
        curriculum：前多少步用不放草堆的简单数据（长 CURRICULUM_T）。
        【为什么要课程学习】答案只在几个位置上有梯度，而第二层注意力起初均匀地摊在上百个填充词上，
        "比对键"这条电路拿到的信号太弱，模型停在"随便抄一根针的值"（准确率 ≈ 1/针数）。没有草堆时
        几百步就学会比对；学会之后再放进草堆，准确率保持得住。
        log / log_every：每 log_every 步记一个点（并调用 log 打印）；progress=True 显示 tqdm 进度条（tokens/s、ETA）。
        resume_path：每 log_every 步（没有就每 50 步）存续训文件；它在、设置和起点权重都相同就接着训。
        Ctrl-C 在两步之间停下：存好续训文件，一行话退出（SystemExit，没有 traceback）。
    【返回】[(step, 这段的平均损失, 这段的答案准确率), ...]
    """
    _check_train_args(steps, T, batch, lr, warmup, curriculum)
    _check_model_task("train_needle", model, task)
    check_int("seed", seed, lo=0, where="train_needle")
    if log is not None and not callable(log):
        raise TypeError(f"train_needle：log 必须是 None 或可调用的（如 print），收到 {type(log).__name__}")
    _check_activations("train_needle", "[batch, T]", batch, max(T, CURRICULUM_T), model.tok.embedding_dim,
                       model.tok.num_embeddings, [b.attn for b in model.blocks], _d_ff(model), len(model.blocks))
    check_int("data_offset", data_offset, lo=0, where="train_needle")
    check_int("log_every", log_every, lo=0, where="train_needle")
    progress = check_bool("progress", progress, where="train_needle")
    curve, _session = _needle_loop(model, task, steps, T, batch, lr, seed, log, log_every, warmup, data_offset,
                                   curriculum, zone, progress, resume_path)
    return curve


def _needle_loop(model, task, steps, T, batch, lr, seed, log, log_every, warmup, data_offset, curriculum, zone,
                 progress, resume_path):
    """train_needle 的循环；另返回这一段的 {start, seconds, seconds_before, tokens}（tokens/s 只按这一段算）。"""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    curve, run, start, before = [], [0.0, 0.0, 0], 0, 0.0
    run_cfg = {"train": dict(steps=steps, T=T, batch=batch, lr=lr, seed=seed, warmup=warmup, data_offset=data_offset,
                             curriculum=curriculum, zone=list(zone), log_every=log_every),
               "start_weights": state_digest(model.state_dict())}        # 起点权重（种子、父模型）也要相同
    store = name = None
    if resume_path:
        store, name = CheckpointStore.for_resume(resume_path, "train_needle")
        start, meta = store.load_resume(name, model, opt, run_cfg, log=log)
        if meta is not None:
            curve, run, before = [tuple(c) for c in meta["curve"]], meta["run"], float(meta["seconds"])
    bar = _progress(steps, progress, start)
    t0, tokens = time.time(), 0

    def save(done):
        if store is not None:
            store.save_resume(name, model, opt, done, run_cfg,
                              {"curve": curve, "run": run, "seconds": before + time.time() - t0})
    model.train()
    step = start
    with stop_on_ctrl_c() as stop:
        while step < steps:
            if stop.requested:
                save(step)
                if bar is not None:
                    bar.close()
                raise interrupted(name or "train_needle", step, steps, resume_path or "（没有续训文件）")
            step += 1
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, warmup, lr)
            easy = step <= curriculum
            ids, tgt = task.train_batch(seed * 10_000_019 + data_offset + step, batch, CURRICULUM_T if easy else T,
                                        hay=not easy, zone=zone)
            loss, acc = _train_step(model, opt, ids, tgt)
            tokens += ids.numel()
            run[0] += loss
            run[1] += acc
            run[2] += 1
            if bar is not None:
                bar.update(1)
                rate = bar.format_dict["rate"] or 0.0                      # 步/秒（tqdm 的平滑估计，只算这一段）
                bar.set_postfix_str(f"损失 {loss:.3f} 准确率 {acc:.2f} {rate * ids.numel():,.0f} tok/s", refresh=False)
            if log_every > 0 and step % log_every == 0:
                curve.append((step, run[0] / run[2], run[1] / run[2]))
                if log:
                    log(f"    step {step:5d}  损失 {curve[-1][1]:.3f}  答案准确率 {curve[-1][2]:.3f}")
                run = [0.0, 0.0, 0]
            if step % (log_every or 50) == 0 and step < steps:
                save(step)
    if bar is not None:
        bar.close()
    model.eval()
    return curve, {"start": start, "seconds": time.time() - t0, "seconds_before": before, "tokens": tokens}


def _train_step(model, opt, ids, tgt):
    """一步：前向、只在答案处的交叉熵、反向、裁剪到 1、更新。返回 (损失, 答案准确率)。"""
    logits = model(ids)                                                   # [B, T, V]
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1), ignore_index=-100)   # 只有答案处 ≠ −100
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    at = tgt != -100
    acc = (logits.detach()[at].argmax(-1) == tgt[at]).float().mean().item()
    return loss.item(), acc


def _progress(steps, on, start=0):
    if not on:
        return None
    from tqdm import tqdm
    return tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True, mininterval=1.0)


def _check_train_args(steps, T, batch, lr, warmup, curriculum):
    w = "train_needle"
    check_int("steps", steps, lo=1, where=w)
    check_int("T", T, lo=1, where=w)
    check_int("batch", batch, lo=1, where=w)
    check_real("lr", lr, lo=0, lo_open=True, where=w)
    check_int("warmup", warmup, lo=1, where=w)
    check_int("curriculum", curriculum, lo=0, where=w)


@torch.no_grad()
def niah_grid(model, task, lengths, depths, n=64, seed=EVAL_SEED, batch=64):
    """
    大海捞针的准确率表：grid[(T, depth)] = n 个测试序列里答对的比例（每个序列 1 根目标针 + 3 根干扰针）。
    【公平】测试序列只由 (seed, T, depth 的序号) 决定：所有模型答同一批题。训练数据的种子是
        seed_train·10000019 + step（≤ 10⁵ 量级偏移），测试默认 seed = EVAL_SEED（12345）+ 1000·T + …，两者不重叠。
    """
    check_int("n", n, lo=1, where="niah_grid")
    check_int("batch", batch, lo=1, where="niah_grid")
    check_int("seed", seed, lo=0, where="niah_grid")
    _check_model_task("niah_grid", model, task)
    lengths, depths = _check_grid_axes("niah_grid", lengths, depths)
    for T in lengths:
        check_int("lengths 的每一项", T, lo=1, where="niah_grid")
        _check_activations("niah_grid", "[min(batch, n), lengths 的一项]", min(batch, n), T, model.tok.embedding_dim,
                           model.tok.num_embeddings, [b.attn for b in model.blocks], _d_ff(model))
    for depth in depths:
        check_real("depths 的每一项", depth, lo=0, hi=1, where="niah_grid")
    model.eval()
    grid = {}
    for T in lengths:
        for k, depth in enumerate(depths):
            hits = 0
            for start in range(0, n, batch):
                size = min(batch, n - start)
                ids, ans, _ = task.needle_batch(seed + 1000 * T + 17 * k + start, size, T, depth)
                hits += int((model(ids, last_only=True).argmax(-1) == ans).sum())
            grid[(T, depth)] = hits / n
    return grid


# =====================================================================
# 4. 检查点：state_dict + manifest.json
# =====================================================================
def _canon(cfg):
    """配置 → 可比较的 JSON 形式（元组变列表），缓存按它匹配。"""
    return canon(cfg)


def _store(folder):
    return CheckpointStore(folder or CKPT, "python3 lecture19/train_checkpoints.py")


def read_manifest(folder=None):
    """checkpoints/manifest.json 里的各项：名字 → {config, files: {文件: SHA-256}, record, seal}。"""
    return _store(folder).read()[0]


@torch.no_grad()
def _round_to_storage(model):
    """把权重舍入到存盘的精度（FP16 再转回 FP32）：之后量的 NIAH 表就是读回来的模型会得到的数。"""
    for t in model.state_dict().values():
        if t.is_floating_point():
            t.copy_(t.to(STORE_DTYPE).float())


def save_model(model, name, cfg, extra=None, folder=None):
    """
    存 checkpoints/<name>.pt：纯 state_dict，张量按 STORE_DTYPE（FP16）存（一个模型 0.84 MB，全部检查点才放得进
    12 MB；读的时候转回 FP32；torch.load(weights_only=True) 可读）。manifest.json 里记下配置、extra（训练曲线、
    步数、秒数……，必须有 steps ≥ 1）、文件的 SHA-256 和把它们封在一起的 seal。
    """
    state = {k: v.detach().cpu().to(STORE_DTYPE) if v.is_floating_point() else v.detach().cpu()
             for k, v in model.state_dict().items()}
    store = _store(folder)
    store.save(name, state, cfg, dict(extra or {}))
    return store.path(name)


def load_model(task, name, cfg, folder=None, log=None):
    """
    读缓存。返回 (model, extra)；不存在、配置不同（警告里写出哪几项，旧 → 新）、SHA-256 对不上或读不出来时返回
    (None, None)。manifest 缺失 / 坏了 / 数字被改过：模型照读（文件本身核对过），extra 里没有训练记录，只有 "why"。
    """
    store = _store(folder)
    if not os.path.isfile(store.path(name)):
        return None, None
    model, why, record = store.verify(name, _canon(cfg), lambda: build_model(task, cfg))
    if model is not None:
        return model, (dict(record, why=why) if record is not None else {"why": why})
    warnings.warn(f"checkpoints/{name}.pt {why}：将重新训练", stacklevel=2)
    if log:
        log(f"  警告：checkpoints/{name}.pt {why}，重新训练")
    return None, None


def get_model(task, name, cfg, steps, T, quick=False, log=print, init_from=None, lr=1e-3, data_offset=0,
              setup=None, curriculum=0, zone=(0.0, 1.0), warmup=100, folder=None, eval_fn=None, batch=32):
    """
    有缓存就读，没有（或损坏、配置不符）就训练并缓存；中断过的训练（<name>.resume.pt）接着训。
    【参数】init_from=(model 或 返回 model 的函数, 它的名字)：从这个模型的权重继续训练（扩展上下文）；
        setup(model)：训练前（以及读缓存后）对模型做的修改，例如改 RoPE 的 base 或插值倍数；
        quick=True：缓存能用就只读它（不到一秒：--quick 从不比完整版慢）；用不了时只在内存里训练 20 步、每批 4 条、
            长度最多 CURRICULUM_T（课程最多 10 步），不写任何文件（冒烟测试）；
        eval_fn(model) -> dict：训练完后算一些数，一起记进 manifest（和权重封在一起）。
    【返回】(model, 训练曲线)
    """
    quick = check_bool("quick", quick, where="get_model")
    _check_cfg_keys("get_model", cfg, MODEL_KEYS)
    _check_train_args(steps, T, batch, lr, warmup, curriculum)     # steps = 0 在这里就拒绝：不训练、不写 manifest
    check_int("data_offset", data_offset, lo=0, where="get_model")
    parent = init_from[1] if init_from else None
    full_cfg = dict(cfg, steps=steps, T=T, lr=lr, data_offset=data_offset, curriculum=curriculum,
                    zone=list(zone), warmup=warmup, init=parent)
    if batch != 32:                                     # 只有不是默认值时才进配置（老检查点的配置里没有这一项）
        full_cfg["batch"] = batch
    store = _store(folder)
    with warnings.catch_warnings():
        if quick:                                       # quick 用不了缓存时不重训、不存盘：那些"将重新训练"的警告不适用
            warnings.simplefilter("ignore")
        model, extra = load_model(task, name, full_cfg, folder=folder, log=None if quick else log)
    if model is not None:
        if setup:
            setup(model)
        if log and "steps" in extra:
            log(f"  （读取缓存的模型：checkpoints/{name}.pt，{extra['steps']} 步，训练用了 {extra['seconds']:.0f} s；"
                f"配置与 SHA-256 已核对）")
        elif log:
            log(f"  （读取缓存的模型：checkpoints/{name}.pt，{extra['why']}）")
        return model, [tuple(c) for c in extra.get("curve", [])]
    if quick and log:
        log(f"  （--quick：checkpoints/{name}.pt 用不了，只在内存里训练 20 步）")
    if not quick:
        if not os.path.isfile(store.path(name)):
            warnings.warn(f"checkpoints/{name}.pt 不存在：将重新训练（几分钟）", stacklevel=2)
        if log:
            log(f"  训练 {name}（{steps} 步，T = {T}，种子 {cfg.get('seed', MODEL_SEED)}）……")
    model = build_model(task, cfg)
    if parent is not None:                              # 继续训练：从父模型的权重出发
        src = init_from[0]() if callable(init_from[0]) else init_from[0]   # 可以给函数：用到时才去取父模型
        model.load_state_dict(src.state_dict())
    if setup:
        setup(model)
    if quick:                                           # 冒烟测试：20 步、每批 4 条、长度最多 CURRICULUM_T
        steps, curriculum, warmup, T = 20, min(curriculum, 10), min(warmup, 20), min(T, CURRICULUM_T)
    curve, session = _needle_loop(model, task, steps, T, 4 if quick else batch, lr, DATA_SEED, log,
                                  0 if quick else max(1, steps // 10), warmup, data_offset, curriculum, zone,
                                  not quick, None if quick else store.path(name, ".resume.pt"))
    if not quick:
        _round_to_storage(model)                        # 之后的评测用的就是存盘后读回来的那份权重
        extra = {"curve": curve, "steps": steps, "seconds": round(session["seconds_before"] + session["seconds"], 1),
                 "tokens_per_s": round(session["tokens"] / max(session["seconds"], 1e-9)),   # 只算这一次跑的步数
                 "seed": cfg.get("seed", MODEL_SEED)}
        if eval_fn is not None:
            extra.update(eval_fn(model))
        save_model(model, name, full_cfg, extra, folder=folder)
        store.drop_resume(name)
        if log:
            log(f"  （存到了 checkpoints/{name}.pt，累计训练 {extra['seconds']:.0f} s，"
                f"这次 {extra['tokens_per_s']:,} tokens/s）")
    return model, curve


# 课程要用的检查点：名字 → get_model 的参数。train_checkpoints.py 和各演示都从这里取，配置只写一份。
# "init" 给出从哪个检查点继续训练；"eval" 是存盘时记进 manifest 的 NIAH 表的长度（默认 NIAH_LENGTHS）。
# 继续训练用不同的 data_offset：换一批训练数据。
NIAH_LENGTHS = (128, 256, 512, 1024, 2048)
NIAH_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
_SPARSE = dict(steps=150, T=128, init="base", lr=5e-4, warmup=20, data_offset=3_000_000, eval=(128, 512))
CHECKPOINTS = {
    "base": dict(cfg={"seed": 1}, steps=1500, T=128, curriculum=700),
    # 扩展上下文：在更长的序列上继续训练一小段（ext_512 同时把位置插值 4 倍：训练时的角度范围和基座一样）
    "ext_256": dict(cfg={"seed": 1}, steps=150, T=256, init="base", lr=5e-4, warmup=20, data_offset=1_000_000),
    "ext_512": dict(cfg={"seed": 1, "scale": 4.0}, steps=150, T=512, batch=16, init="base", lr=5e-4, warmup=20,
                    data_offset=2_000_000),
    # 不加位置编码（NoPE）：和基座同样的训练
    "nope": dict(cfg={"seed": 1, "pos": "none"}, steps=1500, T=128, curriculum=700),
    # 稀疏模式：从基座出发，换上掩码微调一小段
    "sparse_window": dict(cfg={"seed": 1, "mask": "window", "mask_kw": {"window": 16}}, **_SPARSE),
    "sparse_strided": dict(cfg={"seed": 1, "mask": "strided", "mask_kw": {"stride": 8}}, **_SPARSE),
    "sparse_dilated": dict(cfg={"seed": 1, "mask": "dilated"}, **_SPARSE),
}


def get_checkpoint(task, name, quick=False, log=print, eval_lengths=NIAH_LENGTHS):
    """
    按 CHECKPOINTS[name] 取模型（有缓存就读，否则训练并存盘，顺手把 NIAH 表算进 grids.json）。
    quick=True：缓存能用就只读；用不了时每个模型只在内存里训练 20 步、不写缓存（演示的 --quick 用）。
    返回 (model, curve)。
    """
    check_choice("name", name, tuple(CHECKPOINTS), where="get_checkpoint")
    quick = check_bool("quick", quick, where="get_checkpoint")
    if quick and name in _QUICK_MODELS:                  # quick：同一进程里同一个小模型只训练一次
        model, curve = _QUICK_MODELS[name]
        return copy.deepcopy(model), curve
    spec = dict(CHECKPOINTS[name])
    init = spec.pop("init", None)
    lengths = spec.pop("eval", eval_lengths)

    def parent():                                        # 只有真要训练时才去取父模型
        return get_checkpoint(task, init, quick, log, eval_lengths)[0]

    init_from = (parent, init) if init else None

    def eval_fn(model):
        t0 = time.time()
        cached_grid(task, name, model, lengths, NIAH_DEPTHS, log=log)
        return {"niah_seconds": round(time.time() - t0, 1)}

    model, curve = get_model(task, name, spec.pop("cfg"), quick=quick, log=log, init_from=init_from,
                             eval_fn=eval_fn, **spec)
    if quick:
        _QUICK_MODELS[name] = (copy.deepcopy(model), curve)
    return model, curve


_QUICK_MODELS = {}


GRIDS = "grids.json"
GRID_BATCH = 64          # niah_grid 的 batch：n > batch 时它也决定题目（种子里有 start），所以进缓存键


def _model_key(model):
    """决定一个模型答题结果的一切：权重的摘要 + 每层注意力的设置（位置编码、base、插值倍数、掩码）。"""
    attn = [[b.attn.pos, b.attn.base, b.attn.scale, b.attn.mask_kind, b.attn.mask_kw] for b in model.blocks]
    return {"weights": state_digest(model.state_dict()), "attn": attn}


def _task_key(task):
    return {"sizes": [task.n_keys, task.n_values, task.n_filler], "chain": task.next_fill}


def grid_key(task, model, depths, n=64, seed=EVAL_SEED):
    """cached_grid 的缓存键：模型（权重 + RoPE / 掩码设置）、任务、深度表（第 k 个深度的题目种子含 k）、n、种子。"""
    return {"what": "niah_grid", "model": _model_key(model), "task": _task_key(task),
            "depths": [float(d) for d in depths], "n": n, "seed": seed, "batch": GRID_BATCH}


def cached_grid(task, name, model, lengths, depths, n=64, seed=EVAL_SEED, variant="", quick=False, log=None,
                folder=None):
    """
    niah_grid 加一层缓存（checkpoints/grids.json）：键 = grid_key（模型权重的摘要和它此刻的 RoPE / 掩码设置、
    任务、深度表、n、种子）——决定结果的一切；name、variant 只是标签。set_rope 改过的模型、换过的权重都不会命中
    旧的格子；手改过的格子 seal 对不上，当作没有、重算。只算还没有的长度。quick=True 时不读也不写缓存。
    """
    quick = check_bool("quick", quick, where="cached_grid")
    check_int("n", n, lo=1, where="cached_grid")
    cache = ResultCache(os.path.join(folder or CKPT, GRIDS))
    key = grid_key(task, model, depths, n, seed) if not quick else None
    cells = {} if quick else dict(cache.get(key) or {})     # {"T": [每个深度的准确率]}
    todo = [T for T in lengths if str(T) not in cells]
    if todo:
        t0 = time.time()
        got = niah_grid(model, task, todo, depths, n=n, seed=seed, batch=GRID_BATCH)
        new = {str(T): [got[(T, d)] for d in depths] for T in todo}
        cells.update(new)
        if log:
            what = name + (f" {variant}" if variant else "")
            log(f"  （{what}：新算了 {len(todo)} 个长度 × {len(depths)} 个深度，{time.time() - t0:.0f} s）")
        if not quick:
            cache.put(key, new, label=name + (f"|{variant}" if variant else ""))
    return {(T, d): cells[str(T)][k] for T in lengths for k, d in enumerate(depths)}


def niah_heatmap(ax, grid, lengths, depths):
    """在 ax 上画 NIAH 准确率表（行 = 深度，列 = 长度，每格写出数字，0 红 1 绿），返回 imshow 的图像（给 colorbar）。"""
    _check_heatmap(ax, grid, lengths, depths)
    acc = [[grid[(T, d)] for T in lengths] for d in depths]
    im = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(acc):
        for j, a in enumerate(row):
            ax.text(j, i, f"{a:.2f}", ha="center", va="center", fontsize=12)
    ax.set_xticks(range(len(lengths)), [str(T) for T in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
    return im


def demo_start(description, quick_help):
    """
    演示 01–03 共用的开头：解析 --quick；--quick 时单线程（它常和别的测试并行跑，单线程反而快）；
    打印决定结果的种子，返回 (args, NeedleTask())。
    没有 --seed：结果由几个固定的种子决定（提交的检查点、manifest 里的 NIAH 表就是按它们算的），打印的就是
    真正用到的那几个。要换种子：改这几个常量（或 CHECKPOINTS 的 cfg["seed"]），再删掉 checkpoints/ 里的旧文件、
    重新训练（检查点的配置里只记了 cfg["seed"]：别的种子改了，旧的检查点和 NIAH 表照样会被读到）。
    """
    for name, text in (("description", description), ("quick_help", quick_help)):
        if not isinstance(text, str):
            raise TypeError(f"demo_start：{name} 必须是 str，收到 {type(text).__name__}")
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    args = ap.parse_args()
    if args.quick:
        torch.set_num_threads(1)
    init = sorted({spec["cfg"].get("seed", MODEL_SEED) for spec in CHECKPOINTS.values()})
    print(f"随机种子（固定，写在 long_lab 里）：模型初始化 {', '.join(map(str, init))}（CHECKPOINTS 的 cfg['seed']）、"
          f"草堆 TASK_SEED = {TASK_SEED}、训练数据 DATA_SEED = {DATA_SEED}、测试题 EVAL_SEED = {EVAL_SEED}")
    return args, NeedleTask()


# =====================================================================
# 5. 环形注意力：单进程模拟
# =====================================================================
class RingLedger:
    """环形传递的账本：sent[r] = 设备 r 一共发给下一块设备多少个元素；work[轮][r] = 设备 r 这一轮算了多少 (q, k) 对。"""

    def __init__(self, P):
        self.P = check_int("P", P, lo=1, where="RingLedger")
        check_memory(f"P={self.P} 个设备的账本（Python 列表）", 64 * self.P, "RingLedger")
        self.sent = [0] * self.P
        self.work = []

    def round_time(self):
        """每一轮所有设备同步（等最慢的一块）：总时间 ∝ Σ_轮 max_设备 工作量。"""
        return sum(max(per_device) for per_device in self.work)

    def total_work(self):
        return sum(sum(r) for r in self.work)


def shard_index(N, P, layout):
    """每块设备拿哪些 token：contiguous → 第 r 段连续的 N/P 个；striped → token t 给设备 t mod P。"""
    N = check_int("N", N, lo=1, where="shard_index")
    check_memory(f"N={N} 个 token 的下标（int64）", 16 * N, "shard_index")
    P = check_int("P", P, lo=1, hi=N, where="shard_index")
    check_choice("layout", layout, LAYOUTS, where="shard_index")
    if layout != "striped":
        return [torch.arange(r * N // P, (r + 1) * N // P) for r in range(P)]
    return [torch.arange(r, N, P) for r in range(P)]


def _block(q, k, v, qpos, kpos, causal, scale):
    """
    一块注意力的在线 softmax 状态：q [..., n, d] 对 k、v [..., m, d]；返回 (状态 或 None, 要算的 (q, k) 对数)。
    整块都在未来时直接跳过（不做矩阵乘法）。部分被掩的块这里仍按稠密的 n×m 算分数再掩掉；
    FlashAttention 这样的核函数会跳过整片被掩的小块，真实耗时才 ∝ 对数（RingLedger 记的就是对数）。
    """
    if causal:
        allowed = kpos.unsqueeze(0) <= qpos.unsqueeze(1)            # [n, m]：键在查询之前（含自己）；在 CPU 上数
        pairs = int(allowed.sum())
        if pairs == 0:
            return None, 0
    S = (q @ k.transpose(-2, -1)) * scale                          # [..., n, m]
    if not causal:
        return block_state(S, v), S.shape[-2] * S.shape[-1]
    return block_state(S.masked_fill(~allowed.to(S.device), float("-inf")), v), pairs


def ring_attention(Q, K, V, P, causal=True, layout="contiguous", ledger=None):
    """
    环形注意力（Liu et al., 2023）的单进程模拟。
    【思路】N 个 token 分给 P 块设备，设备 r 持有自己那段的 Q_r、K_r、V_r。共 P 轮：每一轮每块设备用手上
        当前的 K、V 块和自己的 Q_r 算一块注意力，把 (m, ℓ, o) 状态合并进累加器（第 18 讲的在线 softmax），
        然后把 K、V 块交给环上的下一块设备、从上一块收一块。P 轮后每块设备见过全部 K、V，得到精确输出。
        传递顺序就是使用顺序，所以下一块可以在算这一块的时候就在路上（见 ring_attention_dist）。
    【参数】Q、K、V：(N, d) 或 (..., N, d)；P：设备数（N 要能被 P 整除）；causal；
        layout："contiguous" 或 "striped"（Brandon et al., 2023：token t 给设备 t mod P，因果掩码下各设备工作量均衡）；
        ledger：RingLedger（不给就新建）
    【返回】(O，形状同 Q；ledger)
    """
    N, d = _check_ring(Q, K, V, P, causal, layout)
    if ledger is not None and not isinstance(ledger, RingLedger):
        raise TypeError(f"ring_attention：ledger 必须是 None 或 RingLedger，收到 {type(ledger).__name__}")
    if ledger is not None and ledger.P != P:
        raise ValueError(f"ring_attention：ledger 是 RingLedger({ledger.P})，和 P = {P} 不符")
    if ledger is None:
        ledger = RingLedger(P)
    O = torch.empty_like(Q)
    # >>> 练习 19.1
    idx = shard_index(N, P, layout)
    scale = d ** -0.5
    acc = [None] * P
    held = list(range(P))                       # held[r]：设备 r 手上现在是谁的 K、V
    for step in range(P):
        work = []
        for r in range(P):
            qi = idx[r]                 # 我的查询
            kj = idx[held[r]]           # 手上这块键值
            st, pairs = _block(Q[..., qi, :], K[..., kj, :], V[..., kj, :], qi, kj, causal, scale)
            work.append(pairs)
            if st is not None:
                acc[r] = merge_states(acc[r], st) if acc[r] is not None else st
        ledger.work.append(work)
        if step == P - 1:                       # 最后一轮算完就结束，不再传
            break
        for r in range(P):
            ledger.sent[r] += 2 * K[..., idx[held[r]], :].numel()    # K 块和 V 块
        held = [held[(r - 1) % P] for r in range(P)]                  # 从上一块设备收
    for r in range(P):
        O[..., idx[r], :] = finalize(acc[r])[0]
    # <<< 练习 19.1
    return O, ledger


def _check_ring(Q, K, V, P, causal, layout):
    w = "ring_attention"
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not torch.is_tensor(t) or t.dim() < 2 or not t.is_floating_point():
            raise TypeError(f"{w}：{name} 必须是 (..., N, d) 的浮点张量")
    if Q.shape != K.shape or K.shape != V.shape:
        raise ValueError(f"{w}：Q、K、V 的形状必须相同，收到 {tuple(Q.shape)}、{tuple(K.shape)}、{tuple(V.shape)}")
    if not Q.dtype == K.dtype == V.dtype:
        raise TypeError(f"{w}：Q、K、V 的 dtype 必须相同，收到 {Q.dtype}、{K.dtype}、{V.dtype}")
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not torch.isfinite(t).all():
            raise ValueError(f"{w}：{name} 只能含有限值，发现了 NaN 或 ∞")
    P = check_int("P", P, lo=1, where=w)
    check_bool("causal", causal, where=w)
    check_choice("layout", layout, LAYOUTS, where=w)
    N, d = Q.shape[-2], Q.shape[-1]
    if N < 1 or d < 1:     # d = 0：缩放 d^(−1/2) 是除以零
        raise ValueError(f"{w}：Q、K、V 的 N、d 都必须 ≥ 1，收到形状 {tuple(Q.shape)}")
    if N % P:
        raise ValueError(f"{w}：序列长度 N = {N} 必须能被设备数 P = {P} 整除")
    return N, d


# =====================================================================
# 6. 代价公式
# =====================================================================
def flops_per_token(n_params, n_layers, d_model, T, causal=True):
    """
    训练时每个 token 的 FLOPs：6·N_参数（前向 2、反向 4）加上注意力那一块。
    【注意力部分】每层前向 QKᵀ、PV 各 2·T·d（一个查询对 T 个键），反向 ≈ 前向 × 2，合计 12·L·T·d；
        因果掩码下只有一半的对要算（FlashAttention 跳过未来的块）：6·L·T·d。
    【返回】(参数部分, 注意力部分)
    """
    w = "flops_per_token"
    check_real("n_params", n_params, lo=0, where=w)
    check_int("n_layers", n_layers, lo=1, where=w)
    check_int("d_model", d_model, lo=1, where=w)
    check_real("T", T, lo=0, where=w)
    check_bool("causal", causal, where=w)
    return 6 * n_params, (6 if causal else 12) * n_layers * T * d_model


# =====================================================================
# 输入检查（放在教学代码后面）
# =====================================================================
def _check_cfg_keys(where, cfg, allowed):
    """配置字典里拼错的键（{'sede': 7}）要报错，不能悄悄用默认值。"""
    if not isinstance(cfg, dict):
        raise TypeError(f"{where}：cfg 必须是 dict，收到 {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{where}：cfg 里有不认识的键 {unknown}；允许的键：{list(allowed)}")


def _check_mask_kw(mask_kind, mask_kw):
    """构造时就查 mask_kw（否则要等到第一次前向才在 attention_mask 里报错）。"""
    if mask_kw is None:
        return {}
    if not isinstance(mask_kw, dict):
        raise TypeError(f"LongAttention：mask_kw 必须是 dict 或 None，收到 {type(mask_kw).__name__}")
    _check_cfg_keys("LongAttention：mask_kw", mask_kw, MASK_KW)
    kw = dict(mask_kw)
    _check_mask_args(mask_kind, 1, kw.get("window", 16), kw.get("stride", 8),
                     kw.get("segments", ((8, 1), (32, 4), (128, 16))))
    return kw


def _check_sizes(where, d_model, n_heads, d_ff, n_layers, vocab=0):
    """模型的宽度：整数，而且 n_layers 层的参数（float32）放得进内存。在建任何一层之前查（消息写调用者传的参数名）。"""
    d_model = check_int("d_model", d_model, lo=2, where=where)
    check_int("n_heads", n_heads, lo=1, where=where)
    d_ff = check_int("d_ff", d_ff, lo=1, where=where)
    n = n_layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) + 2 * vocab * d_model + d_model
    what = f"d_model={d_model}、d_ff={d_ff}、n_layers={n_layers}" + (f"、vocab_size={vocab}" if vocab else "")
    check_memory(f"{what} 的 {n:,} 个参数（float32）", 4 * n, where)


def _check_activations(where, what, B, T, d, V, attns, d_ff=0, train=0):
    """一次前向的激活 [B, T, ·]（训练时每层都留着）加上显式的 [T, T] 掩码 / [B, H, T, T] 分数。"""
    per_token = 8 * d + 3 * d_ff + 2 * V
    n = 4 * B * T * per_token * (train + 2)
    for attn in attns[:1]:
        if attn.mask_kind != "full":
            n += 26 * T * T + 2 * 4 * B * attn.h * T * T
        if attn.keep_attn:
            n += 3 * 4 * B * attn.h * T * T
    check_memory(f"{what} = [{B}, {T}] 的激活与注意力分数", n, where)


def _d_ff(model):
    return model.blocks[0].ffn.w_gate.out_features


def _check_x(where, x, d, attns):
    if not torch.is_tensor(x) or x.ndim != 3 or x.shape[-1] != d or not x.is_floating_point():
        what = f"形状 {tuple(x.shape)}、dtype={x.dtype}" if torch.is_tensor(x) else type(x).__name__
        raise TypeError(f"{where}：x 必须是 [B, T, d_model={d}] 的浮点张量，收到 {what}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{where}：x 不能是空的，收到形状 {tuple(x.shape)}")
    _check_activations(where, "x 的 [B, T]", x.shape[0], x.shape[1], d, 0, attns)


def _check_grid_axes(where, lengths, depths):
    out = []
    for name, axis in (("lengths", lengths), ("depths", depths)):
        if isinstance(axis, (str, bytes)) or not hasattr(axis, "__iter__"):
            raise TypeError(f"{where}：{name} 必须是数的序列（list / tuple），收到 {type(axis).__name__}")
        axis = list(axis)
        if not axis:
            raise ValueError(f"{where}：{name} 不能是空的")
        out.append(axis)
    return out


def _check_heatmap(ax, grid, lengths, depths):
    w = "niah_heatmap"
    if not hasattr(ax, "imshow"):
        raise TypeError(f"{w}：ax 必须是 matplotlib 的 Axes，收到 {type(ax).__name__}")
    if not isinstance(grid, dict):
        raise TypeError(f"{w}：grid 必须是 niah_grid 返回的 dict，收到 {type(grid).__name__}")
    lengths, depths = _check_grid_axes(w, lengths, depths)
    missing = [(T, d) for d in depths for T in lengths if (T, d) not in grid]
    if missing:
        raise ValueError(f"{w}：grid 里缺 {len(missing)} 格（lengths × depths），例如 {missing[0]}")
    for key in ((T, d) for d in depths for T in lengths):
        check_real(f"grid[{key}]", grid[key], lo=0, hi=1, where=w)


def _check_ids(ids, vocab):
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        what = f"{tuple(ids.shape)} {ids.dtype}" if torch.is_tensor(ids) else type(ids).__name__
        raise TypeError(f"LongLM.forward：ids 必须是 [B, T] 的整数张量（int64 / int32），收到 {what}")
    if ids.numel() == 0:
        raise ValueError(f"LongLM.forward：ids 不能是空的，收到形状 {tuple(ids.shape)}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"LongLM.forward：ids 的 token id 必须在 [0, vocab_size={vocab}) 内，收到最小 {lo}、最大 {hi}")


def _check_model_task(where, model, task):
    if not isinstance(model, LongLM):
        raise TypeError(f"{where}：model 必须是 LongLM，收到 {type(model).__name__}")
    if not isinstance(task, NeedleTask):
        raise TypeError(f"{where}：task 必须是 NeedleTask，收到 {type(task).__name__}")
    if task.vocab_size > model.tok.num_embeddings:
        raise ValueError(f"{where}：task 的词表 {task.vocab_size} 大于 model 的 vocab_size {model.tok.num_embeddings}")


# 每层激活显存（Ring Attention 论文表 1 [S83]）：第 18 讲已经有一份（还能分注意力 / 前馈两列、换元素字节数），
# 这里直接用它，不再写第二份。activation_bytes(kind, s, h, n_heads, c=4096, b=1)：
#   vanilla 2·b·n·s²（分数矩阵）；flash 8·b·s·h（前馈的 4h 中间层）；bpt 2·b·s·h；ring 6·b·c·h（和 s 无关）。
# max_seq_len(kind, budget_bytes, h, n_heads, ..., devices)：预算内能放下的最长序列（ring 按设备数切）。
activation_bytes = _fl18.activation_bytes
max_seq_len = _fl18.max_seq_len
ACT_KINDS = _fl18.KINDS


# =====================================================================
# 自检
# =====================================================================
def _expect(exc, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except exc:
        return
    raise AssertionError(f"{fn.__name__} 应当抛出 {exc.__name__}")


def _selftest():
    t_start = time.time()
    torch.manual_seed(0)
    task = NeedleTask()
    # 1. 任务：形状、答案就在针里、问题和针的键一致
    ids, tgt = task.train_batch(3, 8, 128)
    assert ids.shape == tgt.shape == (8, 128)
    for b in range(8):
        seq = ids[b].tolist()
        pairs = {seq[i + 1]: seq[i + 2] for i in range(len(seq) - 2) if seq[i] == task.N}
        for t in (tgt[b] != -100).nonzero().flatten().tolist():
            assert seq[t - 1] == task.Q and pairs[seq[t]] == tgt[b, t] == seq[t + 1]
    ids0, _ = task.train_batch(3, 4, CURRICULUM_T, hay=False)
    assert int(((ids0 >= task.fil0)).sum()) == 0 and (ids0[:, -1] == task.PAD).all()
    dists = []
    for depth in (0.0, 0.5, 1.0):
        ids, ans, dist = task.needle_batch(7, 6, 200, depth)
        for b in range(6):
            seq = ids[b].tolist()
            needles = {seq[i + 1]: seq[i + 2] for i in range(198) if seq[i] == task.N}
            assert seq[-2] == task.Q and needles[seq[-1]] == ans[b]
            assert sum(s == task.N for s in seq) == 4
        dists.append(dist)
    assert dists[0] == 200 - 4 and dists[0] > dists[1] > dists[2] > 0
    # 2. 掩码：因果、对角线、对数 = 手算
    T = 50
    for kind in MASK_KINDS:
        m = attention_mask(kind, T)
        assert m.shape == (T, T) and bool(m.diagonal().all()) and not bool(m.triu(1).any())
    assert pattern_pairs("full", T) == T * (T + 1) // 2
    w = 16
    assert pattern_pairs("window", T, window=w) == sum(min(i + 1, w) for i in range(T))
    assert pattern_pairs("strided", T, stride=8) == sum(sum(1 for j in range(i + 1) if i - j < 8 or (i - j) % 8 == 0)
                                                       for i in range(T))
    # 3. 模型：SDPA 快路径 = 显式 softmax 参考；改 RoPE 后输出会变；前向 + 反向有限
    for mk in ("full", "dilated"):
        model = build_model(task, {"seed": 1, "mask": mk})
        x = torch.randint(0, task.vocab_size, (2, 40))
        fast = model(x)
        for blk in model.blocks:
            blk.attn.keep_attn = True
        slow = model(x)
        assert (fast - slow).abs().max() < 1e-5
    model = build_model(task, {"seed": 1})
    before = model(x)
    model.set_rope(scale=2.0, base=50000.0)
    assert (model(x) - before).abs().max() > 1e-4
    curve = train_needle(model, task, steps=3, T=128, batch=4, log_every=1, warmup=2, curriculum=1)
    assert len(curve) == 3 and all(math.isfinite(c[1]) for c in curve)
    grid = niah_grid(model, task, [64], [0.0, 1.0], n=4, batch=3)
    assert set(grid) == {(64, 0.0), (64, 1.0)} and all(0 <= a <= 1 for a in grid.values())
    # 4. 环形注意力 = 整条序列的注意力（两种切法、因果与否、几种 P；不规则的 d）
    g = torch.Generator().manual_seed(1)
    for N, d in ((48, 16), (60, 7)):
        Q, K, V = (torch.randn(N, d, generator=g, dtype=torch.float64) for _ in range(3))
        for causal in (True, False):
            ref = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
            for layout in LAYOUTS:
                for P in (1, 3, 4, 6):
                    O, led = ring_attention(Q, K, V, P, causal=causal, layout=layout)
                    assert (O - ref).abs().max() < 1e-12, (N, causal, layout, P)
                    assert led.total_work() == (N * (N + 1) // 2 if causal else N * N)
                    assert led.sent == [2 * (N // P) * d * (P - 1)] * P
    led_c = ring_attention(Q, K, V, 4, True, "contiguous")[1]
    led_s = ring_attention(Q, K, V, 4, True, "striped")[1]
    assert led_s.round_time() < led_c.round_time()          # 条带式在因果掩码下更均衡
    # 5. 代价公式：已知值
    assert flops_per_token(1e9, 10, 1000, 2000) == (6e9, 6 * 10 * 2000 * 1000)
    assert flops_per_token(1, 1, 1, 10, causal=False)[1] == 120
    assert activation_bytes("vanilla", 1024, 4096, 32) == 2 * 32 * 1024 ** 2
    assert activation_bytes("ring", 10 ** 6, 4096, 32) == activation_bytes("ring", 10, 4096, 32) == 6 * 4096 * 4096
    # 6. 坏输入
    _expect(ValueError, ring_attention, Q, K, V, 7)
    _expect(ValueError, ring_attention, Q, K, V, 4, layout="diagonal")
    _expect(ValueError, attention_mask, "random", 8)
    _expect(ValueError, task.train_batch, 0, 2, 40)
    _expect(ValueError, task.needle_batch, 0, 2, 10, 0.5)
    _expect(ValueError, activation_bytes, "paged", 10, 10, 1)
    full = pattern_pairs("full", 512)
    rows = [[k, pattern_pairs(k, 512, stride=23), f"{pattern_pairs(k, 512, stride=23) / full:.2f}"] for k in MASK_KINDS]
    print(format_table(["模式", "T = 512 的 (q, k) 对数", "/ full"], rows))
    print(f"long_lab 自检通过（{time.time() - t_start:.1f} s）："
          "任务、掩码、SDPA = 参考、环形注意力 = 全注意力、代价公式、坏输入")


if __name__ == "__main__":
    _selftest()
