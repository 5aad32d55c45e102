"""lecture11/ncu_profile.py：读已提交的 ncu CSV（results/ncu/），不需要 GPU。
查解析出来的数有物理意义（时间 > 0、百分比在 0–100 之间、cuDNN 的内核名里有 cudnn），停顿原因的挑法对。"""
import math
import os

import pytest

from labload import load_lab

ncu = load_lab("lecture11", "ncu_profile")
COMMITTED = [t for t in ncu.TARGETS if os.path.isfile(os.path.join(ncu.RESULTS, f"ncu_{t}.csv"))]


@pytest.mark.parametrize("target", COMMITTED)
def test_committed_csv_parses(target):
    rows = ncu.read_csv(os.path.join(ncu.RESULTS, f"ncu_{target}.csv"))
    assert rows, "CSV 里没有内核"
    summaries = [ncu.summarise(r) for r in rows]
    main = max(summaries, key=lambda s: s["us"])                     # 最长的那个内核：注意力本身
    assert main["us"] > 100                                          # B·N = 32k 个 token：毫秒级
    for key in ("sm", "tensor", "issue", "occupancy"):
        assert 0 <= main[key] <= 100, (key, main[key])
    assert main["regs"] >= 16 and main["smem_kb"] > 0
    assert main["stalls"] and all(v >= 0 for v, _ in main["stalls"])
    if target.startswith("cudnn"):
        assert "cudnn" in main["kernel"]
    else:
        assert "cudnn" not in main["kernel"]


def test_at_least_the_first_run_is_committed():
    assert {"ours-fwd", "cudnn-fwd", "ours-bwd", "cudnn-bwd"} <= set(COMMITTED)


def test_summarise_picks_largest_stalls_and_skips_selected():
    row = {"Kernel Name": "k(int)", "gpu__time_duration.sum": "2,000",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "3.0",
           "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": "9.0",
           "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "1.0",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "2.0",
           "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "0.5"}
    s = ncu.summarise(row)
    assert s["us"] == 2.0                                           # ns → µs，千位分隔符去掉
    assert [k for _, k in s["stalls"]] == ["barrier", "long_scoreboard", "wait"]
    assert s["cycles_per_issue"] == pytest.approx(6.5)
    assert math.isnan(s["tensor"])                                  # 没有的计数器：NaN，不是 0


def test_report_prints_table(capsys):
    assert ncu.report() == 0
    out = capsys.readouterr().out
    assert "cudnn" in out and "_fwd_kernel" in out
