"""练习的 CI 不变量（在真实的课程上）：

(1) 解答树通过每个练习检查（检查本身就是 tests/exercises 里的测试）；这里另查：每个练习都有检查和 EXERCISES.md 标题，
    标记、格式、错误答案的个数一致（tools/exercises.py check）；
(2) 生成的学生树里：每个练习检查以它自己练习的 NotImplementedError 失败（预测：还没填），别的测试通过或报告
    "blocked by 练习 N"，check_all 没有 ✗（被挡住的显示 blocked），评分报告每个练习"还没做"、0 分；
(3) 没有解答行漏进学生树（check 的一部分）；
(4) 错误答案语料被拒绝：tests/exercises/test_wrong_corpus.py。
每个不变量在埋了错的玩具课程上会失败：tests/test_exercises_tools.py。
学生树里不跑本文件（它检查的就是学生树）。
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path[:0] = [os.path.join(ROOT, "tools"), os.path.join(ROOT, "tests", "exercises")]
import exercises  # noqa: E402

IN_STUDENT_TREE = os.path.exists(os.path.join(ROOT, exercises.STUDENT_STAMP))
pytestmark = pytest.mark.skipif(IN_STUDENT_TREE, reason="这里就是学生树：不变量在解答树里检查")
NESTED_TIMEOUT = 1800
# 学生树里的 pytest 不再跑这两个：玩具课程的工具测试两棵树里一样；每个自检 / 演示由下面的 check_all 跑一遍
NESTED_DESELECT = ["tests/test_exercises_tools.py", "tests/test_harness.py::test_item"]


def _run(cwd, argv, env=None, timeout=NESTED_TIMEOUT):
    e = dict(os.environ, MPLBACKEND="Agg", PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1")
    for var in ("CS349E_REPORT", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST"):
        e.pop(var, None)
    e.update(env or {})
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=e, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)


def _has_exercises():
    info, _ = exercises.exercise_info(ROOT)
    return bool(info)


@pytest.fixture
def student(tmp_path):
    if not _has_exercises():
        pytest.skip("还没有任何练习")
    out = str(tmp_path / "student")
    exercises.write_student_tree(out, ROOT, check=False)     # 一致性由 test_exercises_are_consistent 查
    return out


def test_exercises_are_consistent():
    errors = exercises.check_tree(ROOT)
    assert not errors, f"{len(errors)} 个问题：\n" + "\n".join(errors)


def test_every_registered_exercise_has_checks_and_a_heading():
    from grading import load_exercise_tests
    checks = load_exercise_tests()
    info, _ = exercises.exercise_info(ROOT)
    assert set(checks) <= set(info), f"这些练习有检查、没有 EXERCISES.md 标题：{sorted(set(checks) - set(info))}"
    assert all(checks.get(ex) for ex in info), f"这些练习没有检查：{sorted(ex for ex in info if not checks.get(ex))}"


def _hole_ok(row, preds):
    """学生树里一个练习检查的结果对不对：以它自己练习的 NotImplementedError 失败（预测：还没填；GPU：跳过）。"""
    ex, props = row["props"]["exercise"], row["props"]
    if row["outcome"] == "skipped":
        return row["reason"].startswith("需要 GPU")
    if row["outcome"] != "failed":
        return False
    if ex in preds:
        return "还没填这个预测" in props.get("error", "")
    return props.get("hole") == ex


def test_student_tree_tests(student, tmp_path):
    report = tmp_path / "report.jsonl"
    args = ["-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"]
    for d in NESTED_DESELECT:
        args += ["--deselect", d]
    r = _run(student, args, env={"CS349E_REPORT": str(report)})
    assert report.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(ln) for ln in report.read_text(encoding="utf-8").splitlines()]
    preds = exercises.prediction_exercises(ROOT)
    bad_checks, broken, blocked, checks = [], [], 0, 0
    for row in rows:
        if "exercise" in row["props"]:
            checks += row["when"] == "call" or row["outcome"] != "passed"
            if not _hole_ok(row, preds):
                bad_checks.append(f"{row['nodeid']}（{row['when']}）：{row['outcome']} {row['props'].get('error', '')}"
                                  f"{row['reason']}")
        elif row["outcome"] == "failed":
            broken.append(f"{row['nodeid']}（{row['when']}）：{row['reason'][-500:]}")
        else:
            blocked += row["reason"].startswith("blocked by")
    assert not broken, ("学生树里这些测试坏了（不是被练习挡住）：\n" + "\n".join(broken[:30])
                        + f"\n----- pytest 输出末尾 -----\n{r.stdout[-3000:]}")
    assert not bad_checks, "学生树里这些练习检查没有以自己练习的 NotImplementedError 失败：\n" + "\n".join(bad_checks)
    assert checks, r.stdout[-3000:]
    print(f"学生树：{checks} 个练习检查都以自己的留空处失败，{blocked} 个别的测试 blocked")


def test_student_tree_check_all(student):
    r = _run(student, ["tools/check_all.py"])
    failed = [ln for ln in r.stdout.splitlines() if "] ✗" in ln]
    assert r.returncode == 0 and not failed, "学生树的 check_all 有 ✗：\n" + "\n".join(failed) + "\n" + r.stdout[-4000:]


def test_student_tree_grade_all_not_done(student):
    r = _run(student, ["tools/grade.py"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.load(open(os.path.join(student, "grade.json"), encoding="utf-8"))
    info, _ = exercises.exercise_info(ROOT)
    assert res["score"] == 0 and res["max_score"] == sum(d["points"] for d in info.values()), r.stdout
    assert len(res["tests"]) == len(info)
    not_done = [t["name"] for t in res["tests"] if not t["output"].startswith(("还没做", "需要 GPU"))]
    assert not not_done, "学生树的评分里这些练习不是「还没做」：\n" + "\n".join(not_done) + "\n" + r.stdout
