"""lecture11/bench/ncu_profile.py：读已提交的 ncu CSV（results/ncu/），不需要 GPU。
查解析出来的数有物理意义（时间 > 0、百分比在 0–100 之间、cuDNN 的内核名里有 cudnn），停顿原因的挑法对，
合计和 × cuDNN 由 CSV 算，--out 被尊重，ncu 失败的目标让 --measure 以 1 退出（假的 ncu，不需要 GPU）。"""
import math
import os
import shutil
import types

import pytest

from labload import load_lab

ncu = load_lab("lecture11/bench", "ncu_profile")
COMMITTED_DIR = ncu.RESULTS                   # 测试里 monkeypatch 掉 ncu.RESULTS 时仍从这里拿已提交的 CSV
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


def test_every_target_is_committed_and_nothing_else():
    """results/ncu/ 里的 CSV 正好是 TARGETS 的每一个：删掉一个、多出一个都不行。"""
    names = os.listdir(ncu.RESULTS)
    found = {f[len("ncu_"):-len(".csv")] for f in names if f.startswith("ncu_") and f.endswith(".csv")}
    assert found == set(ncu.TARGETS)


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


def test_totals_and_ratio_come_from_the_csv():
    tot = ncu.totals()
    assert set(tot) == set(ncu.TARGETS)
    for name, (count, us) in tot.items():
        summaries = [ncu.summarise(r) for r in ncu.read_csv(os.path.join(ncu.RESULTS, f"ncu_{name}.csv"))]
        assert count == len(summaries) and us == pytest.approx(sum(s["us"] for s in summaries))
    assert ncu.vs_cudnn("cudnn-fwd", tot) == ncu.vs_cudnn("cudnn-bwd", tot) == 1.0
    assert ncu.vs_cudnn("ours-bwd", tot) == pytest.approx(tot["ours-bwd"][1] / tot["cudnn-bwd"][1])
    assert ncu.vs_cudnn("ours-fwd", {"ours-fwd": (1, 5.0)}) is None            # 没有 cuDNN 的 CSV：不编一个比值


def test_committed_backward_csvs_hold_no_grad_accumulation():
    """run_target 在计数前清掉 .grad：反向的 CSV 里没有预热留下的 `.grad +=`（PyTorch 的加法内核
    CUDAFunctor_add，修正之前的 CSV 里 q、k、v 各一个）。"""
    for name in ("ours-bwd", "gluon-bwd", "cudnn-bwd"):
        names = [ncu.summarise(r)["kernel"] for r in ncu.read_csv(os.path.join(ncu.RESULTS, f"ncu_{name}.csv"))]
        assert names and not [k for k in names if "CUDAFunctor_add" in k], (name, names)


def test_report_reads_the_given_directory(tmp_path, capsys):
    assert ncu.report(str(tmp_path)) == ncu.SKIP                              # 空目录：SKIP，不回退到已提交的
    shutil.copy(os.path.join(ncu.RESULTS, "ncu_ours-fwd.csv"), tmp_path)
    assert ncu.main(["--out", str(tmp_path)]) == 0                            # 命令行的 --out 也读这个目录
    out = capsys.readouterr().out
    assert "ours-fwd" in out and "cudnn-fwd" not in out
    assert "—" in out.splitlines()[-1]                                        # 没有 cuDNN：× cuDNN 一栏空着


def test_measure_returns_1_when_ncu_fails(tmp_path, monkeypatch, capsys):
    """假的 ncu：ours-fwd 成功（输出已提交的 CSV），cudnn-fwd 失败、gluon-fwd 超时。表照样打印，但退出码是 1。"""
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/fake/ncu")

    def fake_run(cmd, **kw):
        target = cmd[-1]
        if target == "cudnn-fwd":
            return types.SimpleNamespace(returncode=2, stdout="", stderr="==ERROR== 假的失败")
        if target == "gluon-fwd":                                             # 卡住的目标：超时也只算失败
            raise ncu.subprocess.TimeoutExpired(cmd, 300)
        with open(os.path.join(ncu.RESULTS, f"ncu_{target}.csv")) as fh:
            return types.SimpleNamespace(returncode=0, stdout=fh.read(), stderr="")
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    assert ncu.measure(str(tmp_path), ("ours-fwd", "cudnn-fwd")) == 1
    out = capsys.readouterr().out
    assert "_fwd_kernel" in out and "cudnn-fwd" in out.splitlines()[-1]
    assert ncu.measure(str(tmp_path), ("ours-fwd", "gluon-fwd")) == 1         # 超时：不崩，退出码 1
    assert "gluon-fwd" in capsys.readouterr().out.splitlines()[-1]
    assert ncu.measure(str(tmp_path), ("ours-fwd",)) == 0                     # 全部成功：0


def test_causal_measure_is_forwarded_and_labelled(tmp_path, monkeypatch, capsys):
    """--causal：传给 ncu 里面跑的那一段（在 --target 之前），形状记进 ncu_shape.json，读这个目录时按它打印；
    已提交的目录没有这个文件，按默认（不 causal）打印。"""
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/fake/ncu")
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        with open(os.path.join(ncu.RESULTS, f"ncu_{cmd[-1]}.csv")) as fh:
            return types.SimpleNamespace(returncode=0, stdout=fh.read(), stderr="")
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    out_dir = str(tmp_path / "causal")
    assert ncu.main(["--measure", "--causal", "--only", "ours-fwd", "--out", out_dir]) == 0
    assert seen[-1][-3:] == ["--causal", "--target", "ours-fwd"]
    assert ncu.measured_shape(out_dir)["causal"] is True
    assert "causal = True" in capsys.readouterr().out
    assert ncu.main(["--out", ncu.RESULTS]) == 0                              # 已提交的：不 causal
    assert "causal = False" in capsys.readouterr().out and ncu.SHAPE["causal"] is False
    with open(os.path.join(out_dir, ncu.SHAPE_FILE), "w") as fh:              # 坏的形状文件：报错，不乱标
        fh.write('{"B": 1}')
    with pytest.raises(ValueError, match="ncu_shape.json"):
        ncu.measured_shape(out_dir)


def test_causal_measure_never_lands_in_the_non_causal_directory(tmp_path, monkeypatch, capsys):
    """--measure --causal 不给 --out：写 CAUSAL_RESULTS（results/ncu/causal/），不盖掉不 causal 的 CSV；
    --causal 读的时候也默认读它。--out 指向已有另一种 causal 的 CSV 的目录：拒绝（退出码 2），一个 ncu 都不跑。"""
    plain, causal = tmp_path / "ncu", tmp_path / "ncu" / "causal"
    plain.mkdir()
    shutil.copy(os.path.join(ncu.RESULTS, "ncu_ours-fwd.csv"), plain)          # 已有的不 causal 的 CSV
    monkeypatch.setattr(ncu, "RESULTS", str(plain))
    monkeypatch.setattr(ncu, "CAUSAL_RESULTS", str(causal))
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/fake/ncu")
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd[-1])
        with open(os.path.join(COMMITTED_DIR, f"ncu_{cmd[-1]}.csv")) as fh:
            return types.SimpleNamespace(returncode=0, stdout=fh.read(), stderr="")
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    before = (plain / "ncu_ours-fwd.csv").read_bytes()
    assert ncu.main(["--measure", "--causal", "--only", "ours-fwd"]) == 0
    assert seen == ["ours-fwd"] and (causal / "ncu_ours-fwd.csv").is_file()
    assert ncu.measured_shape(str(causal))["causal"] is True
    assert (plain / "ncu_ours-fwd.csv").read_bytes() == before and not (plain / ncu.SHAPE_FILE).exists()
    capsys.readouterr()
    assert ncu.main(["--causal"]) == 0 and "causal = True" in capsys.readouterr().out
    assert ncu.main([]) == 0 and "causal = False" in capsys.readouterr().out
    assert ncu.main(["--measure", "--causal", "--out", str(plain)]) == 2                 # 不 causal 的目录
    assert ncu.main(["--measure", "--only", "ours-fwd", "--out", str(causal)]) == 2      # 反过来也一样
    assert seen == ["ours-fwd"] and (plain / "ncu_ours-fwd.csv").read_bytes() == before
    out = capsys.readouterr().out
    assert out.count("换一个 --out") == 2 and "causal = False 的 CSV" in out
