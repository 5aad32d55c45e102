"""第 5 讲练习的错误答案语料（只给老师）：每一个都必须让对应练习至少一个检查失败。

5.1 的错误调度共用一个紧凑的迭代级循环（_schedule，只支持 KV 预留，是 simulate_continuous 用到的那部分），
每个变体打开一个学生常犯的错误。
"""
import math

import numpy as np

from grading import Wrong

L, M = "lecture05", "serving_sim"


def _schedule(arrival, prompt, output, step, max_batch, reserve=None, chunk=None, t_limit=None, history=None,
              ids=None, mistake=None):
    n, cap = len(arrival), int(step.kv_capacity_tokens())
    reserve = list(reserve) if reserve is not None else [p + o for p, o in zip(prompt, output)]
    a1 = step.model.attn_flops_per_token(1)
    prog, gen = [0] * n, [0] * n
    admit_t, times = [math.nan] * n, [[] for _ in range(n)]
    t, arrived, active, held, iters, occ = 0.0, 0, [], 0, 0, 0
    waiting = []                                           # 已到达、还没接纳（按到达顺序）
    done = 0
    while done < n:
        while arrived < n and arrival[arrived] <= t:
            waiting.append(arrived)
            arrived += 1
        if not active and not waiting:
            t = arrival[arrived]
            continue
        may_admit = not (mistake == "admit_only_when_empty" and active)
        limit = max_batch + 4 if mistake == "exceeds_max_batch" else max_batch
        for k in list(waiting) if may_admit else []:
            if len(active) >= limit:
                break
            if mistake != "ignore_reserve" and held + reserve[k] > cap:
                if mistake == "skip_head":
                    continue                               # 放不下就看下一个（插队）
                break
            held += reserve[k]
            admit_t[k] = t
            active.append(k)
            waiting.remove(k)
        dec = [k for k in active if prog[k] == prompt[k]]
        ctx = sum(prompt[k] + gen[k] for k in dec)
        budget = math.inf if chunk is None else max(chunk - len(dec), 0)
        pieces, p_tok, p_attn, p_ctx = [], 0, 0.0, 0
        for k in active:
            left = prompt[k] - prog[k]
            if budget <= 0:
                break
            if left:
                c, o = int(min(left, budget)), prog[k]
                pieces.append((k, c))
                p_tok, p_ctx, budget = p_tok + c, p_ctx + o, budget - c
                p_attn += a1 * (c * o + c * (c + 1) / 2)
        t += step.mixed_time(len(dec), ctx, p_tok, p_attn, *((p_ctx,) if p_ctx else ()))
        iters, occ = iters + 1, occ + len(dec) + len(pieces)
        for k in dec:
            gen[k] += 1
            times[k].append(t)
        for k, c in pieces:
            prog[k] += c
            if prog[k] == prompt[k]:
                gen[k] = 1
                times[k].append(t)
        for k in list(active):
            if gen[k] == output[k]:
                done += 1
                held -= reserve[k]
                active.remove(k)
    return {"admit_t": admit_t, "token_times": times, "iters": iters, "mean_batch": occ / max(iters, 1),
            "done": done, "deadlock": False, "deadlock_t": None, "admit_order": [], "peak_reserved": 0,
            "peak_used": 0, "mean_reserved": 0.0, "mean_used": 0.0}


def _variant(mistake):
    def fn(arrival, prompt, output, step, max_batch, reserve=None, chunk=None, t_limit=None, history=None, ids=None):
        return _schedule(arrival, prompt, output, step, max_batch, reserve, chunk, t_limit, history, ids, mistake)
    fn.__name__ = f"iteration_schedule_{mistake}"
    return fn


VARIANTS = [
    Wrong("5.1", L, M, "iteration_schedule", "只在批空了时才接纳（正在 decode 时不接纳新请求）",
          _variant("admit_only_when_empty")),
    Wrong("5.1", L, M, "iteration_schedule", "批大小超过 max_batch", _variant("exceeds_max_batch")),
    Wrong("5.1", L, M, "iteration_schedule", "接纳时不看 KV 预留", _variant("ignore_reserve")),
    Wrong("5.1", L, M, "iteration_schedule", "队头放不下时让后面的插队（违反 FCFS）", _variant("skip_head")),
]
