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
        budget = math.inf if chunk is None else max(chunk - (mistake != "chunk_ignores_decode") * len(dec), 0)
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
            if prog[k] == prompt[k] and mistake != "no_token_at_prefill":
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


def _summarize(reqs, slo_ttft=None, slo_tpot=None, warmup=0.0, mistake=None):
    rs = sorted(reqs, key=lambda r: (r.arrival, r.rid))
    rs = rs[int(len(rs) * warmup):]
    end = max((r.t_last if mistake == "span_to_last_token" else r.t_finish) for r in rs)
    span = end - (0.0 if mistake == "span_from_zero" else rs[0].arrival)
    ttft = np.array([r.ttft for r in rs])
    tpot = np.array([r.tpot for r in rs])
    e2e = np.array([r.e2e for r in rs])
    itl = np.concatenate([np.diff(r.token_times) for r in rs if len(r.token_times) > 1])
    ok_ttft = np.ones(len(rs), bool) if slo_ttft is None else ttft <= slo_ttft
    if slo_tpot is None:
        ok_tpot = np.ones(len(rs), bool)
    elif mistake == "nan_tpot_fails":
        ok_tpot = tpot <= slo_tpot                       # nan <= x 是 False：只出 1 个 token 的请求被算作违约
    else:
        ok_tpot = np.isnan(tpot) | (tpot <= slo_tpot)
    ok = (ok_ttft | ok_tpot) if mistake == "slo_or" else (ok_ttft & ok_tpot)
    if mistake == "goodput_is_throughput":
        ok = np.ones(len(rs), bool)

    def pct(x, q):
        x = x[~np.isnan(x)]
        return float(x.max()) if (mistake == "p99_is_max" and q == 99) else float(np.percentile(x, q))

    def mean(x):
        return float(np.mean(x)) if mistake == "mean_keeps_nan" else float(np.nanmean(x))
    out = {"n": len(rs), "span": span, "req_per_s": len(rs) / span, "tok_per_s": sum(r.output for r in rs) / span,
           "queue_mean": float(np.mean([r.queue_delay for r in rs])), "itl_p99": pct(itl, 99),
           "slo_frac": float(ok.mean()), "goodput": float(ok.sum()) / span}
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_mean"], out[f"{name}_p50"], out[f"{name}_p99"] = mean(x), pct(x, 50), pct(x, 99)
    return out


def _summary_variant(mistake):
    def fn(reqs, slo_ttft=None, slo_tpot=None, warmup=0.0):
        return _summarize(reqs, slo_ttft, slo_tpot, warmup, mistake)
    fn.__name__ = f"summarize_{mistake}"
    return fn


VARIANTS = [
    Wrong("5.2", L, M, "summarize", "goodput 把全部完成的请求都算上（= 吞吐）",
          _summary_variant("goodput_is_throughput")),
    Wrong("5.2", L, M, "summarize", "两个 SLO 满足一个就算（或，不是且）", _summary_variant("slo_or")),
    Wrong("5.2", L, M, "summarize", "只出 1 个 token 的请求被算作违反 TPOT SLO", _summary_variant("nan_tpot_fails")),
    Wrong("5.2", L, M, "summarize", "p99 取了最大值", _summary_variant("p99_is_max")),
    Wrong("5.2", L, M, "summarize", "均值没跳过 nan 的 TPOT", _summary_variant("mean_keeps_nan")),
    Wrong("5.2", L, M, "summarize", "统计窗口从 t = 0 算起", _summary_variant("span_from_zero")),
    Wrong("5.2", L, M, "summarize", "统计窗口到最后一个 token（不是离开）", _summary_variant("span_to_last_token")),
    Wrong("5.1", L, M, "iteration_schedule", "只在批空了时才接纳（正在 decode 时不接纳新请求）",
          _variant("admit_only_when_empty")),
    Wrong("5.1", L, M, "iteration_schedule", "批大小超过 max_batch", _variant("exceeds_max_batch")),
    Wrong("5.1", L, M, "iteration_schedule", "接纳时不看 KV 预留", _variant("ignore_reserve")),
    Wrong("5.1", L, M, "iteration_schedule", "队头放不下时让后面的插队（违反 FCFS）", _variant("skip_head")),
    Wrong("5.1", L, M, "iteration_schedule", "prefill 那一步不产出第 1 个 token（要多等一次 decode）",
          _variant("no_token_at_prefill")),
    Wrong("5.1", L, M, "iteration_schedule", "分块 prefill 的预算没扣掉这一步 decode 的 token",
          _variant("chunk_ignores_decode")),
]
