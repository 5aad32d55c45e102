"""练习 11.7、11.8（Triton v1 内核）的错误答案语料：学生常写出的、看起来对的内核。

每个变体是一个完整的 @triton.jit 内核，换掉 triton_flash 的模块属性（mini_attention 启动时按名字取
_mini_fwd_kernel 等，所以换属性就生效）；"把 N×N 分数矩阵写回内存"要多一个缓冲区，换的是主机端的 _mini_fwd。
内核默认在解释器模式下定义（CPU 检查都在解释器里跑）；tools/grade_gpu.py 设 GRADE_GPU_VARIANTS=1 再导入，
得到编译模式的同一批内核和 GPU_VARIANTS（GPU 评分的语料：缓存结果的作弊、跳过掩码的错解、不跳块的慢解）。
没装 triton 时语料为空（检查本身也会 skip）。
"""
import contextlib
import importlib.util
import os

import torch

from grading import Wrong

GPU = os.environ.get("GRADE_GPU_VARIANTS") == "1"
VARIANTS, GPU_VARIANTS = [], {}
if importlib.util.find_spec("triton") is not None:
    from labload import load_lab
    from triton_interp import interpreter_env, load_triton_flash

    # 第一次 import triton 要在解释器模式里（见 tests/triton_interp.py）；GPU 评分时用编译模式
    with contextlib.nullcontext() if GPU else interpreter_env():
        import triton
        import triton.language as tl
        tf = load_lab("lecture11", "triton_flash") if GPU else load_triton_flash()
        _mini_visible = tf._mini_visible

        # ---------------------------------------------------------------- 11.7 前向
        @triton.jit
        def _fwd_no_rescale(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_i = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp(s - m_i[:, None])               # 错：换了新最大值，旧的 l、acc 没有乘 exp(m_old − m_new)
                l_i = l_i + tl.sum(p, 1)
                acc = acc + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        @triton.jit
        def _fwd_causal_strict(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                ok = (cols < N)[None, :]
                if CAUSAL:
                    ok = ok & (cols[None, :] < rows[:, None])     # 错：j < i，少了对角线（自己看不见自己）
                s = tl.where(ok, s, -1e30)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        @triton.jit
        def _fwd_fp16_accumulate(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            dt = q.dtype                                   # 错：l、acc 用输入的 dtype（fp16）累加
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=dt)
            acc = tl.zeros([BLOCK_M, D], dtype=dt)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = (l_i * alpha + tl.sum(p, 1)).to(dt)
                acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC, out_dtype=dt)).to(dt)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i.to(tl.float32)), mask=rows < N)

        @triton.jit
        def _fwd_p_not_cast(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)   # 错：P 是 fp32，V 是 fp16
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        @triton.jit
        def _fwd_no_lse(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i, mask=rows < N)     # 错：存的是行最大值 m，忘了加 log l

        @triton.jit
        def _fwd_reload_q(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                # 错（慢）：每个 K/V 块都从 HBM 重读一遍 Q 块（结果对，IO 多了）
                q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None],
                            other=0.0)
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        @triton.jit
        def _fwd_no_tile_skip(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                              D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            for start_n in range(0, N, BLOCK_N):        # 错（慢）：causal 时整块看不见的 K/V 块也读、也算
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        @triton.jit
        def _fwd_scores_to_hbm(Q, K, V, O, LSE, S, sm_scale, N, H, stride_b, stride_n, stride_h,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               CAUSAL: tl.constexpr, PREC: tl.constexpr):
            """错（慢）：第一遍把 S = QKᵀ 写进 N×N 的缓冲区、求 m 和 l，第二遍读回 S 算 P·V（结果对，IO 是 Θ(N²)）。"""
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start_n in range(0, N, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                k = tl.load(K + base + cols[:, None] * stride_n + offs_d[None, :], mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where(_mini_visible(rows, cols, N, CAUSAL), s, float("-inf"))
                tl.store(S + pid_bh * N * N + rows[:, None] * N + cols[None, :], s,
                         mask=(rows < N)[:, None] & (cols < N)[None, :])
                m_new = tl.maximum(m_i, tl.max(s, 1))
                l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(s - m_new[:, None]), 1)
                m_i = m_new
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            for start_n in range(0, N, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                s = tl.load(S + pid_bh * N * N + rows[:, None] * N + cols[None, :],
                            mask=(rows < N)[:, None] & (cols < N)[None, :], other=float("-inf"))
                v = tl.load(V + base + cols[:, None] * stride_n + offs_d[None, :], mask=(cols < N)[:, None], other=0.0)
                p = tl.exp(s - m_i[:, None]) / l_i[:, None]
                acc += tl.dot(p.to(v.dtype), v, input_precision=PREC)
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], acc.to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        def _fwd_with_score_buffer(q, k, v, causal, scale):
            batch, n, heads, _ = q.shape
            o = torch.empty_like(q)
            lse = torch.empty((batch, heads, n), dtype=torch.float32)
            scores = torch.empty((batch * heads, n, n), dtype=torch.float32)      # N×N 的分数矩阵进了内存
            tf._mini_launch(_fwd_scores_to_hbm, (triton.cdiv(n, tf.MINI_BLOCKS[0]), batch * heads),
                            q, k, v, o, lse, scores, scale, n, heads, *q.stride()[:3], **tf._mini_meta(q, causal))
            return o, lse

        @triton.jit
        def _fwd_diagonal_unmasked(Q, K, V, O, LSE, sm_scale, N, H, stride_b, stride_n, stride_h,
                                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            q = tl.load(Q + base + rows[:, None] * stride_n + offs_d[None, :], mask=(rows < N)[:, None], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                s = tl.where((cols < N)[None, :], s, float("-inf"))   # 错：省掉了 causal 掩码（以为跳过整块就够了）
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
            tl.store(O + base + rows[:, None] * stride_n + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
                     mask=(rows < N)[:, None])
            tl.store(LSE + pid_bh * N + rows, m_i + tl.log(l_i), mask=rows < N)

        _CACHE, _REAL_FWD = {}, tf._mini_fwd

        def _fwd_caching(q, k, v, causal, scale):
            """作弊：同样形状的第二次调用直接交出上一次的结果（计时循环里每次都是新输入，所以是错的）。"""
            key = (tuple(q.shape), q.dtype, causal)
            if key not in _CACHE:
                _CACHE[key] = _REAL_FWD(q, k, v, causal, scale)
            return _CACHE[key]

        # ---------------------------------------------------------------- 11.8 反向
        @triton.jit
        def _dkdv_no_delta(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_n = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_d = tl.arange(0, D)
            kv = base + cols[:, None] * stride_n + offs_d[None, :]
            k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
            v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
            dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            lo = 0
            if CAUSAL:
                lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
            for start_m in range(lo, N, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                qo = base + rows[:, None] * stride_n + offs_d[None, :]
                q = tl.load(Q + qo, mask=(rows < N)[:, None], other=0.0)
                do = tl.load(DO + qo, mask=(rows < N)[:, None], other=0.0)
                lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * dp                                   # 错：softmax 的导数少了 − D_i（D = Σ dO∘O）
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
            tl.store(DK + kv, (dk * sm_scale).to(DK.dtype.element_ty), mask=(cols < N)[:, None])
            tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=(cols < N)[:, None])

        @triton.jit
        def _dkdv_skip_diagonal(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_n = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_d = tl.arange(0, D)
            kv = base + cols[:, None] * stride_n + offs_d[None, :]
            k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
            v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
            dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            lo = 0
            if CAUSAL:
                lo = (pid_n * BLOCK_N + BLOCK_N) // BLOCK_M * BLOCK_M    # 错：从 key 块的末尾开始，漏掉对角线上的 Q 块
            for start_m in range(lo, N, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                qo = base + rows[:, None] * stride_n + offs_d[None, :]
                q = tl.load(Q + qo, mask=(rows < N)[:, None], other=0.0)
                do = tl.load(DO + qo, mask=(rows < N)[:, None], other=0.0)
                lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
                delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
            tl.store(DK + kv, (dk * sm_scale).to(DK.dtype.element_ty), mask=(cols < N)[:, None])
            tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=(cols < N)[:, None])

        @triton.jit
        def _dkdv_unscaled(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_n = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_d = tl.arange(0, D)
            kv = base + cols[:, None] * stride_n + offs_d[None, :]
            k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
            v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
            dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
            lo = 0
            if CAUSAL:
                lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
            for start_m in range(lo, N, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                qo = base + rows[:, None] * stride_n + offs_d[None, :]
                q = tl.load(Q + qo, mask=(rows < N)[:, None], other=0.0)
                do = tl.load(DO + qo, mask=(rows < N)[:, None], other=0.0)
                lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
                delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
            tl.store(DK + kv, dk.to(DK.dtype.element_ty), mask=(cols < N)[:, None])   # 错：dK 忘了乘 softmax_scale
            tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=(cols < N)[:, None])

        @triton.jit
        def _dq_unmasked(Q, K, V, DO, DQ, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D)
            qo = base + rows[:, None] * stride_n + offs_d[None, :]
            q = tl.load(Q + qo, mask=(rows < N)[:, None], other=0.0)
            do = tl.load(DO + qo, mask=(rows < N)[:, None], other=0.0)
            lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
            delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
            dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            hi = N
            if CAUSAL:
                hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                kv = base + cols[:, None] * stride_n + offs_d[None, :]
                k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
                v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                p = tl.exp(s - lse[:, None])                  # 错：重算 P 时没有掩码（对角块里 j > i 的也算了）
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
            tl.store(DQ + qo, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rows < N)[:, None])

        @triton.jit
        def _dkdv_fp16_accumulate(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, N, H, stride_b, stride_n, stride_h,
                                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  CAUSAL: tl.constexpr, PREC: tl.constexpr):
            pid_n = tl.program_id(0)
            pid_bh = tl.program_id(1)
            base = (pid_bh // H) * stride_b + (pid_bh % H) * stride_h
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_d = tl.arange(0, D)
            kv = base + cols[:, None] * stride_n + offs_d[None, :]
            k = tl.load(K + kv, mask=(cols < N)[:, None], other=0.0)
            v = tl.load(V + kv, mask=(cols < N)[:, None], other=0.0)
            dk = tl.zeros([BLOCK_N, D], dtype=k.dtype)      # 错：dK、dV 用输入的 dtype（fp16）累加
            dv = tl.zeros([BLOCK_N, D], dtype=k.dtype)
            lo = 0
            if CAUSAL:
                lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
            for start_m in range(lo, N, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                qo = base + rows[:, None] * stride_n + offs_d[None, :]
                q = tl.load(Q + qo, mask=(rows < N)[:, None], other=0.0)
                do = tl.load(DO + qo, mask=(rows < N)[:, None], other=0.0)
                lse = tl.load(LSE + pid_bh * N + rows, mask=rows < N, other=0.0)
                delta = tl.load(DELTA + pid_bh * N + rows, mask=rows < N, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * sm_scale
                p = tl.where(_mini_visible(rows, cols, N, CAUSAL), tl.exp(s - lse[:, None]), 0.0)
                dv = (dv + tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)).to(k.dtype)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dk = (dk + tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC) * sm_scale).to(k.dtype)
            tl.store(DK + kv, dk.to(DK.dtype.element_ty), mask=(cols < N)[:, None])
            tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=(cols < N)[:, None])

    _W = lambda ex, attr, label, fn: Wrong(ex, "lecture11", "triton_flash", attr, label, fn)  # noqa: E731
    VARIANTS = [
        _W("11.7", "_mini_fwd_kernel", "前向：换了新最大值不重新缩放旧的 l 和 acc", _fwd_no_rescale),
        _W("11.7", "_mini_fwd_kernel", "前向：causal 掩码差一（j < i，看不见对角线）", _fwd_causal_strict),
        _W("11.7", "_mini_fwd_kernel", "前向：l、acc 用 fp16 累加", _fwd_fp16_accumulate),
        Wrong("11.7", "lecture11", "triton_flash", "_mini_fwd_kernel", "前向：P 没转成 V 的 dtype 就做 tl.dot",
              _fwd_p_not_cast, says="p.to(v.dtype)"),
        _W("11.7", "_mini_fwd_kernel", "前向：LSE 存成行最大值 m（忘了 + log l）", _fwd_no_lse),
        _W("11.7", "_mini_fwd_kernel", "前向：每个 K/V 块都重读 Q（结果对、IO 多）", _fwd_reload_q),
        _W("11.7", "_mini_fwd_kernel", "前向：causal 不跳过整块看不见的 K/V 块（结果对、IO 多）", _fwd_no_tile_skip),
        _W("11.7", "_mini_fwd", "前向：N×N 分数矩阵写回内存再读回（结果对、IO 是 N²）", _fwd_with_score_buffer),
        _W("11.7", "_mini_fwd_kernel", "前向：causal 只跳过整块、对角块里不做掩码", _fwd_diagonal_unmasked),
        _W("11.8", "_mini_dkdv_kernel", "反向：dS = P∘dP，少了 − D", _dkdv_no_delta),
        _W("11.8", "_mini_dkdv_kernel", "反向：causal 的 dK/dV 从 key 块末尾开始，漏了对角块", _dkdv_skip_diagonal),
        _W("11.8", "_mini_dkdv_kernel", "反向：dK 忘了乘 softmax_scale", _dkdv_unscaled),
        _W("11.8", "_mini_dkdv_kernel", "反向：dK、dV 用 fp16 累加", _dkdv_fp16_accumulate),
        _W("11.8", "_mini_dq_kernel", "反向：dQ 内核重算 P 时没做 causal 掩码", _dq_unmasked),
    ]
    # GPU 评分（tools/grade_gpu.py --variant 名字）的语料：名字 -> (练习, 属性, 替换, 说明, 应得的结果)
    GPU_VARIANTS = {
        "cache": ("11.7", "_mini_fwd", _fwd_caching, "同形状的第二次调用交出上一次的结果（缓存作弊）", "refused"),
        "diag_unmasked": ("11.7", "_mini_fwd_kernel", _fwd_diagonal_unmasked, "对角块里不做 causal 掩码", "refused"),
        "no_tile_skip": ("11.7", "_mini_fwd_kernel", _fwd_no_tile_skip, "causal 时不跳过整块看不见的 K/V 块（慢、对）",
                         "partial"),
        "dq_unmasked": ("11.8", "_mini_dq_kernel", _dq_unmasked, "dQ 内核重算 P 时没做 causal 掩码", "refused"),
    }
