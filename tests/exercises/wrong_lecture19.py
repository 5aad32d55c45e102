"""第 19 讲的错误答案语料（只给老师）：环形注意力与位置插值里学生常犯的错。"""
import torch

from grading import Wrong, module

ll = module("lecture19", "long_lab")
F19 = ("lecture19", "long_lab")


# ---- 19.1 环形注意力 ----
def _ring_variant(local_positions=False, own_kpos=False, rounds_less=0, contiguous_writeback=False, step=-1):
    def ring(Q, K, V, P, causal=True, layout="contiguous", ledger=None):
        N, d = Q.shape[-2], Q.shape[-1]
        ledger = ledger if ledger is not None else ll.RingLedger(P)
        idx = ll.shard_index(N, P, layout)
        acc, held = [None] * P, list(range(P))
        rounds = P - rounds_less
        for rnd in range(rounds):
            work = []
            for r in range(P):
                qi, kj = idx[r], idx[held[r]]
                if local_positions:       # 掩码用块内的下标：每个转过来的块都被当成对角块
                    qpos, kpos = torch.arange(len(qi)), torch.arange(len(kj))
                elif own_kpos:            # 掩码用的是自己那段的位置，而不是手上这块 K/V 的
                    qpos, kpos = qi, qi
                else:
                    qpos, kpos = qi, kj
                st, pairs = ll._block(Q[..., qi, :], K[..., kj, :], V[..., kj, :], qpos, kpos, causal, d ** -0.5)
                work.append(pairs)
                if st is not None:
                    acc[r] = ll.merge_states(acc[r], st) if acc[r] is not None else st
            ledger.work.append(work)
            if rnd == rounds - 1:
                break
            for r in range(P):
                ledger.sent[r] += 2 * K[..., idx[held[r]], :].numel()
            held = [held[(r + step) % P] for r in range(P)]      # step = +1：环反着转
        O = torch.empty_like(Q)
        n = N // P
        for r in range(P):
            where = torch.arange(r * n, (r + 1) * n) if contiguous_writeback else idx[r]
            O[..., where, :] = ll.finalize(acc[r])[0]
        return O, ledger
    return ring


# ---- 19.2 位置插值 ----
def positions_inverse(self, T):
    """倒过来：乘 scale（= 除以 L_训练 / L_目标），位置被拉得更远。"""
    return torch.arange(T, dtype=torch.float32) * self.scale


def positions_not_interpolated(self, T):
    """忘了插值：scale 被忽略。"""
    return torch.arange(T, dtype=torch.float32)


def rotate_base_scaled(self, q, k):
    """缩的不是位置而是 base 乘 scale（以为"调大 base"就是插值）：每个频率缩的倍数都不同。"""
    T = q.shape[-2]
    cos, sin = ll.rope_angles(torch.arange(T, dtype=torch.float32), self.dk, self.base * self.scale)
    return ll.apply_rope_half(q, cos, sin), ll.apply_rope_half(k, cos, sin)


def rotate_only_q(self, q, k):
    """只给 q 插值，k 仍按原来的位置转。"""
    T = q.shape[-2]
    cos, sin = self.rope(T, q.device)
    cos0, sin0 = ll.rope_angles(torch.arange(T, dtype=torch.float32), self.dk, self.base)
    return ll.apply_rope_half(q, cos, sin), ll.apply_rope_half(k, cos0, sin0)


VARIANTS = [
    Wrong("19.1", *F19, "ring_attention", "转过来的块用块内下标做因果掩码（忘了它的全局位置）",
          _ring_variant(local_positions=True)),
    Wrong("19.1", *F19, "ring_attention", "因果掩码用了自己那段的位置，而不是手上这块 K/V 的", _ring_variant(own_kpos=True)),
    Wrong("19.1", *F19, "ring_attention", "少跑了最后一轮（只转 P − 1 轮就结束）", _ring_variant(rounds_less=1)),
    Wrong("19.1", *F19, "ring_attention", "条带切法的输出按连续切法写回", _ring_variant(contiguous_writeback=True)),
    Wrong("19.1", *F19, "ring_attention", "环反着转（从下一块设备收）：输出一样，但不是题目的环",
          _ring_variant(step=1), says="从上一块 r − 1 收"),
    Wrong("19.2", *F19, "LongAttention.positions", "插值倍数倒过来：位置乘 scale", positions_inverse),
    Wrong("19.2", *F19, "LongAttention.positions", "忘了插值：位置不除以 scale", positions_not_interpolated),
    Wrong("19.2", *F19, "LongAttention.rotate", "缩的是 base（乘 scale）而不是位置", rotate_base_scaled),
    Wrong("19.2", *F19, "LongAttention.rotate", "只给 q 插值，k 没插值", rotate_only_q),
]
