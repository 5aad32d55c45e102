#!/usr/bin/env python3
"""给练习打分：跑 tests/exercises 里的检查，每个练习一行：得分、状态、用时、第一条没满足的性质。

状态：通过 / 未通过 / 还没做（它自己的 NotImplementedError）/ 被练习 X 挡住（别的练习的）/ 需要 GPU
（检查以"需要 GPU"跳过）。得分 = 分值 × 通过的检查数 / 检查总数。预测练习逐项打分，打印允许的范围和原因。
结果同时写进本树根目录的 grade.json（Gradescope 的结果格式：score、max_score、execution_time、tests），
自学、GitHub Classroom 和 Gradescope 用同一次运行；不需要服务器。

用法（通常通过 Makefile）：
    python3 tools/grade.py                    # 全部练习（make grade）
    python3 tools/grade.py --lecture lecture11 --ex 11.2 --hint 1
全部检查在这一个进程里跑（pytest.main + 一个收集结果的小插件），2 核 CPU 上两分钟以内。
"""
import argparse
import contextlib
import io
import json
import os
import re
import signal
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EX_DIR = os.path.join(ROOT, "tests", "exercises")
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(ROOT, "lecture01")]
import exercises  # noqa: E402
from course_utils import format_table  # noqa: E402

GPU_PREFIX = "需要 GPU"
CHECK_TIMEOUT_S = 120                # 一个检查最多跑这么久（最慢的检查在空闲的 2 核上几秒）：死循环不会让评分卡住
UNFILLED = "还没填这个预测"          # tests/exercises/test_predictions.py 的 evaluate() 的消息开头
STATUS_TEXT = {"passed": "通过", "failed": "未通过", "not_done": "还没做", "blocked": "被练习 {} 挡住",
               "gpu": "需要 GPU", "no_checks": "没有检查"}


class Collector:
    """pytest 插件：只留下选中练习的检查，记下每个检查的结果。"""

    def __init__(self, ids):
        self.ids = set(ids)
        self.results = {}          # nodeid -> dict
        self.collect_errors = []

    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for it in items:
            m = it.get_closest_marker("exercise")
            (keep if m is not None and m.args[0] in self.ids else drop).append(it)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        """每个检查限时：学生的代码写成死循环时，这个检查失败，别的照样评分（grade.json 照样写出）。"""
        def alarm(*_):
            raise TimeoutError(f"这个检查跑了 {CHECK_TIMEOUT_S} 秒还没结束：多半是循环没有推进（死循环）")
        use = hasattr(signal, "SIGALRM")
        if use:
            old = signal.signal(signal.SIGALRM, alarm)
            signal.alarm(CHECK_TIMEOUT_S)
        try:
            yield
        finally:
            if use:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}：\n{report.longrepr}")

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        r = self.results.setdefault(report.nodeid, {"ex": props.get("exercise"), "outcome": "passed",
                                                     "message": "", "hole": None, "duration": 0.0})
        r["duration"] += report.duration
        r["ex"] = r["ex"] or props.get("exercise")
        if report.failed and r["outcome"] != "failed":
            r["outcome"] = "failed"
            r["message"] = _one_line(props.get("error") or _longrepr_line(report))
            r["hole"] = props.get("hole")
            if r["message"].startswith(UNFILLED):        # 预测还是 null：和代码练习的留空处一样算"还没做"
                r["hole"] = r["ex"]
        elif report.skipped and r["outcome"] == "passed":
            r["outcome"] = "skipped"
            r["message"] = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            r["message"] = _one_line(re.sub(r"^Skipped:\s*", "", r["message"]))


def _longrepr_line(report):
    text = str(report.longrepr).strip().splitlines()
    errs = [ln[2:].strip() for ln in text if ln.startswith("E ")]
    return errs[0] if errs else (text[-1] if text else "")


def _one_line(text):
    text = re.sub(r"^(AssertionError|NotImplementedError):\s*", "", str(text).strip())
    return text.splitlines()[0] if text else ""


def exercise_status(ex_id, checks):
    """一个练习的检查结果 → (状态, 通过数, 第一条没满足的性质, 挡住它的练习)。"""
    if not checks:
        return "no_checks", 0, "没有找到给它打分的检查", None
    passed = sum(c["outcome"] == "passed" for c in checks)
    failed = [c for c in checks if c["outcome"] == "failed"]
    skipped = [c for c in checks if c["outcome"] == "skipped"]
    if failed:
        first = failed[0]
        own = [c for c in failed if c["hole"] == ex_id]
        other = [c for c in failed if c["hole"] and c["hole"] != ex_id]
        if own and not passed:
            return "not_done", passed, own[0]["message"], None
        if other:                  # 有检查卡在别的练习的洞上：先做那个（通过了的检查照样算分）
            return "blocked", passed, other[0]["message"], other[0]["hole"]
        return "failed", passed, first["message"], None
    if skipped:
        gpu = [c for c in skipped if c["message"].startswith(GPU_PREFIX)]
        return ("gpu" if gpu else "failed"), passed, skipped[0]["message"], None
    return "passed", passed, "", None


def select_ids(info, preds, lecture=None, ex=None):
    ids = sorted(info, key=_id_key)
    if lecture:
        folders = sorted({d["folder"] for d in info.values()})
        if lecture not in folders:
            raise SystemExit(f"L={lecture}：这个讲次没有练习；有练习的讲次：{' '.join(folders) or '（无）'}")
        ids = [i for i in ids if info[i]["folder"] == lecture]
    if ex:
        wanted = [e for e in re.split(r"[,\s]+", ex) if e]
        unknown = [e for e in wanted if e not in info]
        if unknown:
            raise SystemExit(f"EX={ex}：没有练习 {' '.join(unknown)}；现有：{' '.join(ids)}")
        ids = [i for i in ids if i in wanted]
    return ids


def _id_key(ex_id):
    head, n = ex_id.split(".")
    return (not head.startswith("P"), int(head.lstrip("P")), int(n))


def run_checks(ids, info, preds):
    """在本进程里跑选中练习的检查；返回 ({编号: [检查结果]}, 收集错误, 秒数)。"""
    import pytest
    folders = sorted({info[i]["folder"] for i in ids})
    files = [os.path.join(EX_DIR, fn) for fn in sorted(os.listdir(EX_DIR))
             if any(fn == f"test_ex_{f}.py" or (fn.startswith(f"test_ex_{f}_") and fn.endswith(".py"))
                    for f in folders)]
    if any(i in preds for i in ids):
        files.append(os.path.join(EX_DIR, "test_predictions.py"))
    col = Collector(ids)
    t0 = time.perf_counter()
    if files:
        args = ["-q", "--tb=short", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore", *files]
        os.environ.setdefault("MPLBACKEND", "Agg")
        log = io.StringIO()                 # pytest 自己的输出不给学生看（收集出错时附在报告后面）
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            rc = pytest.main(args, plugins=[col])
        if rc not in (0, 1, 5) and not col.collect_errors:
            col.collect_errors.append(f"pytest 退出码 {rc}：\n{log.getvalue()[-3000:]}")
    wall = time.perf_counter() - t0
    per = {i: [] for i in ids}
    for nodeid, r in col.results.items():
        if r["ex"] in per:
            per[r["ex"]].append(dict(r, nodeid=nodeid))
    return per, col.collect_errors, wall


def prediction_rows(ex_id, preds):
    """预测练习逐项的结果：[(项, 预测, 实测, 比值, 范围, 结果, 原因)]。"""
    if EX_DIR not in sys.path:
        sys.path[:0] = [EX_DIR, os.path.dirname(EX_DIR)]
    import test_predictions as tp
    path = os.path.join(ROOT, preds[ex_id], "predictions.yaml")
    _, items, _ = tp.load_predictions(path, ROOT)
    rows = []
    for it in items:
        r = tp.evaluate(it)
        if r["ratio"] is None:          # 还没填（或填的不是数）：实测值和原因不给看，先自己估
            rows.append((it["id"], "未填" if it["answer"] is None else repr(it["answer"]), "填了才显示", "",
                         f"×{float(it['band']):g}", "✗", None))
            continue
        rows.append((it["id"], f"{it['answer']:.4g} {it['unit']}", f"{it['measured']:.4g} {it['unit']}",
                     f"{r['ratio']:.2f}", f"×{float(it['band']):g}", "✓" if r["ok"] else "✗",
                     str(it["reason"]).strip()))
    return rows


def grade(ids, info, preds, hint=0, out=sys.stdout):
    per, collect_errors, wall = run_checks(ids, info, preds)
    rows, tests, total, max_total = [], [], 0.0, 0
    for ex_id in ids:
        d, checks = info[ex_id], per[ex_id]
        status, passed, message, blocker = exercise_status(ex_id, checks)
        pts = d["points"] or 0
        score = round(pts * passed / len(checks), 2) if checks else 0.0
        total += score
        max_total += pts
        shown = STATUS_TEXT[status].format(blocker)
        secs = sum(c["duration"] for c in checks)
        rows.append([ex_id, d["title"], f"{score:g}/{pts}", f"{passed}/{len(checks)}", shown, f"{secs:.1f} s",
                     message])
        output = f"{shown}：通过 {passed}/{len(checks)} 个检查"
        output += f"。第一条没满足的性质：{message}" if message else ""
        tests.append({"name": f"练习 {ex_id}：{d['title']}", "score": score, "max_score": pts, "output": output,
                      "visibility": "visible", "status": "passed" if status == "passed" else "failed",
                      "_status": status, "_hints": d["hints"]})
    print(format_table(["练习", "标题", "得分", "检查", "状态", "用时", "第一条没满足的性质"], rows,
                       align=["<", "<", ">", ">", "<", ">", "<"]), file=out)
    for ex_id in ids:
        if ex_id in preds:
            prow = prediction_rows(ex_id, preds)
            print(f"\n练习 {ex_id}（预测）逐项：", file=out)
            print(format_table(["项", "你的预测", "实测", "比值", "允许", "结果"], [r[:6] for r in prow]), file=out)
            for r in prow:
                if r[6] is not None:
                    print(f"  {r[0]}：{r[6]}", file=out)
            if any(r[6] is None for r in prow):
                print(f"  没填的项：在 {preds[ex_id]}/predictions.yaml 里把 answer: null 换成你的数"
                      "（先估，再看实测）", file=out)
    if hint:
        for t, ex_id in zip(tests, ids):
            if t["_status"] != "passed" and info[ex_id]["hints"]:
                print(f"\n练习 {ex_id} 的提示（{info[ex_id]['location']}）：", file=out)
                for k, h in enumerate(info[ex_id]["hints"][:hint], 1):
                    print(f"  {k}. {h}", file=out)
    for err in collect_errors:
        print(f"\n✗ 检查文件导入失败：多半是被检查的模块导入时就出错了（比如你改的代码有语法错误），"
              f"先单独运行它（python3 <讲次>/<模块>.py）看看：{err}", file=out)
    done = sum(t["_status"] == "passed" for t in tests)
    print(f"\n总分 {total:g} / {max_total}：{done}/{len(ids)} 个练习通过（检查用时 {wall:.0f} s）。"
          + ("" if hint or done == len(ids) else "要提示：make grade EX=<编号> HINT=1（1 到 3 越来越具体）"), file=out)
    result = {"score": round(total, 2), "max_score": max_total, "execution_time": round(wall, 1),
              "visibility": "visible", "stdout_visibility": "visible",
              "tests": [{k: v for k, v in t.items() if not k.startswith("_")} for t in tests]}
    return result, collect_errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lecture", "-L", help="只评这个讲次的练习（如 lecture11）")
    ap.add_argument("--ex", help="只评这些练习（如 11.2，多个用逗号隔开）")
    ap.add_argument("--hint", type=int, default=0, help="对没通过的练习打印第 1..N 条提示（N = 1..3）")
    ap.add_argument("--json", default=os.path.join(ROOT, "grade.json"), help="结果文件（Gradescope 格式）")
    a = ap.parse_args(argv)
    if not 0 <= a.hint <= 3:
        ap.error(f"--hint（HINT=）要在 0..3 之间，收到 {a.hint}")
    info, errors = exercises.exercise_info(ROOT)
    if errors:
        print("EXERCISES.md 有格式问题：\n  " + "\n  ".join(errors), file=sys.stderr)
        return 2
    if not info:
        print("还没有任何练习（各讲的 EXERCISES.md 里没有 `## 练习 …` 标题）。")
        return 0
    preds = exercises.prediction_exercises(ROOT)
    ids = select_ids(info, preds, a.lecture, a.ex)
    print(f"评分：{len(ids)} 个练习" + (f"（{a.lecture}）" if a.lecture else "") + " ……", flush=True)
    result, collect_errors = grade(ids, info, preds, a.hint)
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
    print(f"结果写在 {os.path.relpath(a.json)}（Gradescope 格式）")
    return 2 if collect_errors else 0


if __name__ == "__main__":
    sys.exit(main())
