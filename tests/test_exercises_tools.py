"""练习工具（tools/exercises.py、tools/grade.py、check_all 的 blocked、conftest 的 blocked）在一个玩具课程上的测试。

玩具课程：lecture01/toy_lab.py 有两个练习（1.1 hole + instructor 参考实现，1.2 hole），lecture01/predictions.yaml
一个预测练习（1.3），lecture02 的模块和演示导入 toy_lab；检查、错误答案、一个普通测试。每个"埋下的错"
（标记不成对、解答行泄漏、错误答案通过、留空处弄坏别的讲次）都要被对应的不变量抓住。
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COPY = ["tools/exercises.py", "tools/grade.py", "tools/check_all.py", "lecture01/course_utils.py",
        "tests/conftest.py", "tests/labload.py", "tests/triton_interp.py", "tests/exercises/grading.py",
        "tests/exercises/test_wrong_corpus.py", "tests/exercises/test_predictions.py", "pyproject.toml"]

TOY = {
    ".gitignore": "__pycache__/\n.hypothesis/\ngrade.json\ndist/\n",
    "lecture01/toy_lab.py": '''
        """玩具实验模块：缩放与求和。"""
        import os
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import course_utils  # noqa: E402


        def scale(x, k):
            """每个元素乘以 k。"""
            course_utils.check_real("k", k)
            # >>> 练习 1.1
            scaled_values = [v * k for v in x]
            return scaled_values
            # <<< 练习 1.1


        def total(x):
            """元素之和。"""
            # >>> 练习 1.2
            running_sum_value = 0.0
            for v in x:
                running_sum_value = running_sum_value + v
            return running_sum_value
            # <<< 练习 1.2


        # >>> 练习 1.1 instructor
        def _reference_scale(x, k):
            return [k * value for value in x]
        # <<< 练习 1.1


        def helper_name():
            return 42


        def _selftest():
            assert scale([1.0, 2.0], 2.0) == [2.0, 4.0]
            print("toy_lab 自检通过")


        if __name__ == "__main__":
            _selftest()
        ''',
    "lecture02/user_lab.py": '''
        """玩具：用第 1 讲的 toy_lab。"""
        import os
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lecture01"))
        import toy_lab  # noqa: E402
        from toy_lab import helper_name  # noqa: E402


        def _selftest():
            assert helper_name() == 42
            assert toy_lab.total(toy_lab.scale([1.0, 2.0], 3.0)) == 9.0
            print("user_lab 自检通过")


        if __name__ == "__main__":
            _selftest()
        ''',
    "lecture02/01_demo.py": '''
        """玩具演示。"""
        import argparse
        import os
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lecture01"))
        import toy_lab  # noqa: E402


        def main():
            argparse.ArgumentParser().add_argument("--quick", action="store_true")
            print("和", toy_lab.total([1.0, 2.0]))


        if __name__ == "__main__":
            main()
        ''',
    "lecture01/EXERCISES.md": '''
        # 第 1 讲练习：玩具

        先做 1.1。`make grade L=lecture01`。

        ## 练习 1.1：缩放
        - 分值：2
        - 依赖：无
        - 位置：`lecture01/toy_lab.py` 的 `scale`
        - 评分：`tests/exercises/test_ex_lecture01.py` 中标记 `exercise("1.1")` 的检查
        - 预计用时：5 分钟（CPU）
        - 要求：每个元素乘以 k。

        ### 提示
        1. 一个元素一个元素地乘。
        2. 用列表推导。
        3. `[v * k for v in x]` 的意思。

        ## 练习 1.2：求和
        - 分值：3
        - 依赖：1.1
        - 位置：`lecture01/toy_lab.py` 的 `total`
        - 评分：`tests/exercises/test_ex_lecture01.py` 中标记 `exercise("1.2")` 的检查
        - 预计用时：5 分钟（CPU）
        - 要求：求和。

        ### 提示
        1. 从 0 开始累加。
        2. 一个循环。
        3. 每步加上当前元素。

        ## 练习 1.3：预测
        - 分值：2
        - 依赖：无
        - 位置：`lecture01/predictions.yaml`
        - 评分：`tests/exercises/test_predictions.py`
        - 预计用时：10 分钟
        - 要求：写下数字。

        ### 提示
        1. 想想量级。
        2. 算一算。
        3. 大约是 2。
        ''',
    "lecture01/predictions.yaml": '''
        exercise: "1.3"
        items:
          - id: two
            question: "一加一等于几？"
            unit: 个
            answer: 2.1        # 由加法算出
            reference: {file: lecture01/bench/results/toy.json, path: [sums, 0, "value"], scale: 2.0}
            band: 1.5
            reason: "因为一加一等于二。"
          - id: ten
            question: "五加五等于几？"
            unit: 个
            answer: 9
            reference: {file: lecture01/bench/results/toy.json, path: [sums, 1, "value"]}
            band: 1.2
            reason: "五加五等于十。"
        ''',
    "lecture01/bench/results/toy.json": '{"sums": [{"value": 1.0}, {"value": 10.0}]}\n',
    "tests/exercises/test_ex_lecture01.py": '''
        from grading import exercise, expect, expect_no_calls, module

        tl = module("lecture01", "toy_lab")


        @exercise("1.1")
        def test_scale_values():
            expect(tl.scale([1.0, 2.0, 3.0], 2.0) == [2.0, 4.0, 6.0], "每个元素都要乘以 k")


        @exercise("1.1")
        def test_scale_no_reference():
            expect_no_calls(tl.scale, ["_reference_scale"])


        @exercise("1.2")
        def test_total_value():
            expect(tl.total([1.0, 2.5, 4.0]) == 7.5, "和不对")
        ''',
    "tests/exercises/wrong_lecture01.py": '''
        from grading import Wrong


        def add_instead(x, k):
            return [v + k for v in x]


        def drops_last(x, k):
            return [v * k for v in x[:-1]]


        def off_by_one(x):
            return sum(x) - 1


        def counts(x):
            return float(len(x))


        VARIANTS = [
            Wrong("1.1", "lecture01", "toy_lab", "scale", "加法代替乘法", add_instead),
            Wrong("1.1", "lecture01", "toy_lab", "scale", "丢了最后一个", drops_last),
            Wrong("1.2", "lecture01", "toy_lab", "total", "少一", off_by_one),
            Wrong("1.2", "lecture01", "toy_lab", "total", "数个数", counts),
        ]
        ''',
    "tests/test_toy.py": '''
        from labload import load_lab


        def test_total_of_scaled():
            tl = load_lab("lecture01", "toy_lab")
            assert tl.total(tl.scale([1.0], 2.0)) == 2.0


        def test_plain():
            assert 1 + 1 == 2
        ''',
}


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def _git_init(root):
    subprocess.run(["git", "init", "-q", root], check=True)


def make_tree(base, changes=None):
    """在 base 里造玩具课程（changes：{相对路径: 新内容或 None=删掉}），返回根目录。"""
    os.makedirs(base, exist_ok=True)
    for rel in COPY:
        os.makedirs(os.path.dirname(os.path.join(base, rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(base, rel))
    # 玩具课程用不到 Triton 解释器的那段设置（省下每个子进程导入 torch / triton 的几秒）；被挡住的测试那段照用
    conftest = open(os.path.join(ROOT, "tests", "conftest.py"), encoding="utf-8").read()
    a, b = conftest.index("# ---- Triton 解释器测试"), conftest.index("# ---- 学生树")
    with open(os.path.join(base, "tests", "conftest.py"), "w", encoding="utf-8") as f:
        f.write(conftest[:a] + "import pytest  # noqa: E402\n\n\n" + conftest[b:])
    for rel, text in {**TOY, **(changes or {})}.items():
        if text is None:
            os.remove(os.path.join(base, rel))
        else:
            _write(base, rel, text)
    _git_init(base)
    return base


def run(root, *argv, env=None, timeout=300):
    e = dict(os.environ, MPLBACKEND="Agg", PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1")
    e.pop("CS349E_REPORT", None)
    e.update(env or {})
    return subprocess.run([sys.executable, *argv], cwd=root, env=e, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """玩具课程（解答树）和它的学生树。"""
    base = str(tmp_path_factory.mktemp("toy") / "course")
    make_tree(base)
    student = os.path.join(os.path.dirname(base), "student")
    r = run(base, "tools/exercises.py", "student", "--out", student)
    assert r.returncode == 0, r.stdout + r.stderr
    return base, student


def test_check_passes_on_the_solution_tree(toy):
    r = run(toy[0], "tools/exercises.py", "check")
    assert r.returncode == 0, r.stderr
    assert "3 个练习" in r.stdout


def test_student_tree_content(toy):
    _, student = toy
    text = open(os.path.join(student, "lecture01", "toy_lab.py"), encoding="utf-8").read()
    assert "raise NotImplementedError('练习 1.1 未完成：缩放（见 lecture01/EXERCISES.md）')" in text
    assert "scaled_values" not in text and "_reference_scale" not in text and "running_sum_value" not in text
    assert "    course_utils.check_real" in text                # hole 前的参数检查留着
    import yaml
    preds = yaml.safe_load(open(os.path.join(student, "lecture01", "predictions.yaml"), encoding="utf-8"))
    assert [it["answer"] for it in preds["items"]] == [None, None]
    assert "由加法算出" not in open(os.path.join(student, "lecture01", "predictions.yaml"), encoding="utf-8").read()
    assert not os.path.exists(os.path.join(student, "tests", "exercises", "wrong_lecture01.py"))
    assert not os.path.exists(os.path.join(student, "tests", "exercises", "test_wrong_corpus.py"))


def test_scripts_in_student_tree_report_blocked(toy):
    _, student = toy
    for script, ex in (("lecture01/toy_lab.py", "1.1"), ("lecture02/user_lab.py", "1.1")):
        r = run(student, script)
        assert r.returncode == 78, r.stdout + r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert f"✗ 被练习 {ex} 挡住：缩放。先完成它：make grade EX={ex}" in r.stderr, r.stderr
    r = run(student, "tools/check_all.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "✗" not in r.stdout and "3 blocked" in r.stdout, r.stdout
    assert "blocked by 练习 1.2" in r.stdout                     # 演示调用 total：被 1.2 挡住


def test_pytest_in_student_tree_skips_blocked_tests(toy, tmp_path):
    _, student = toy
    report = tmp_path / "report.jsonl"
    r = run(student, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", env={"CS349E_REPORT": str(report)})
    rows = [json.loads(ln) for ln in report.read_text(encoding="utf-8").splitlines()]
    by = {row["nodeid"].split("::")[-1]: row for row in rows}
    assert by["test_total_of_scaled"]["outcome"] == "skipped", r.stdout
    assert by["test_total_of_scaled"]["reason"] == "blocked by 练习 1.1"
    assert by["test_plain"]["outcome"] == "passed"
    for name, ex in (("test_scale_values", "1.1"), ("test_scale_no_reference", "1.1"), ("test_total_value", "1.2")):
        assert by[name]["outcome"] == "failed", by[name]
        assert by[name]["props"]["hole"] == ex, by[name]
    assert "还没填这个预测" in by["test_prediction_1_3_two"]["props"]["error"]


def _grade(root, *args):
    r = run(root, "tools/grade.py", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.load(open(os.path.join(root, "grade.json"), encoding="utf-8"))


def test_grade_solution_tree_full_marks(toy):
    base, _ = toy
    out, res = _grade(base)
    # 预测 1.3：第一项 2.1 / 2.0 在 ×1.5 内，第二项 9 / 10 在 ×1.2 内
    assert res["score"] == res["max_score"] == 7, out
    assert {t["name"] for t in res["tests"]} == {"练习 1.1：缩放", "练习 1.2：求和", "练习 1.3：预测"}
    assert all(t["status"] == "passed" and t["visibility"] == "visible" for t in res["tests"])
    assert "execution_time" in res and "因为一加一等于二" in out and "比值" in out


def test_grade_student_tree_not_done(toy):
    _, student = toy
    out, res = _grade(student, "--hint", "2")
    assert res["score"] == 0 and res["max_score"] == 7
    assert [t["status"] for t in res["tests"]] == ["failed"] * 3
    assert out.count("还没做") == 3 and "还没填这个预测" in out
    assert "填了才显示" in out and "因为一加一等于二" not in out       # 没填的预测：不先给实测值和原因
    assert "2. 用列表推导" in out and "3. " not in out.split("提示")[-1], out


def test_grade_statuses_and_filters(tmp_path):
    # 1.1 做错了（加法）、1.2 依赖 1.1（求和里调用 scale）、只评 1.1 和 1.2；第二个预测填错了
    root = make_tree(str(tmp_path / "c"))
    lab = os.path.join(root, "lecture01", "toy_lab.py")
    r = run(root, "tools/exercises.py", "student", "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    s = str(tmp_path / "s")
    lab = os.path.join(s, "lecture01", "toy_lab.py")
    text = open(lab, encoding="utf-8").read()
    text = text.replace("raise NotImplementedError('练习 1.1 未完成：缩放（见 lecture01/EXERCISES.md）')",
                        "return [v + k for v in x]")
    text = text.replace("raise NotImplementedError('练习 1.2 未完成：求和（见 lecture01/EXERCISES.md）')",
                        "return sum(x)")
    open(lab, "w", encoding="utf-8").write(text)
    out, res = _grade(s, "--ex", "1.1,1.2")
    t = {x["name"][:6]: x for x in res["tests"]}
    assert t["练习 1.1"]["score"] == 1.0 and "每个元素都要乘以 k" in t["练习 1.1"]["output"], out   # 1/2 个检查
    assert t["练习 1.2"]["score"] == 3 and res["max_score"] == 5
    r = run(s, "tools/grade.py", "--ex", "9.9")
    assert r.returncode != 0 and "没有练习 9.9" in r.stdout + r.stderr


def test_grade_reports_blocked_by_another_exercise(tmp_path):
    checks = TOY["tests/exercises/test_ex_lecture01.py"].replace("tl.total([1.0, 2.5, 4.0])",
                                                                  "tl.total(tl.scale([1.0, 2.5, 4.0], 1.0))")
    root = make_tree(str(tmp_path / "c"), {"tests/exercises/test_ex_lecture01.py": checks})
    s = str(tmp_path / "s")
    assert run(root, "tools/exercises.py", "student", "--out", s).returncode == 0
    text = open(os.path.join(s, "lecture01", "toy_lab.py"), encoding="utf-8").read()
    hole = "raise NotImplementedError('练习 1.2 未完成：求和（见 lecture01/EXERCISES.md）')"
    text = text.replace(hole, "return sum(x)")
    open(os.path.join(s, "lecture01", "toy_lab.py"), "w", encoding="utf-8").write(text)
    out, res = _grade(s, "--lecture", "lecture01")
    assert "被练习 1.1 挡住" in out, out


# ---- 埋下的错：每个不变量都要抓住它 ----
def test_planted_unbalanced_marker_refused(tmp_path):
    bad = TOY["lecture01/toy_lab.py"].replace("            # <<< 练习 1.2\n", "")
    root = make_tree(str(tmp_path / "c"), {"lecture01/toy_lab.py": bad})
    out = tmp_path / "s"
    r = run(root, "tools/exercises.py", "student", "--out", str(out))
    assert r.returncode == 2 and "lecture01/toy_lab.py:27：练习 1.2 的区域还没结束" in r.stderr, r.stderr
    assert not out.exists()


def test_planted_leaked_line_named(tmp_path):
    leak = TOY["lecture02/01_demo.py"].replace('    print("和", toy_lab.total([1.0, 2.0]))',
                                                '    x, k = [1.0], 2.0\n            scaled_values = [v * k for v in x]')
    root = make_tree(str(tmp_path / "c"), {"lecture02/01_demo.py": leak})
    r = run(root, "tools/exercises.py", "check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "lecture01/toy_lab.py:13：练习 1.1 的解答行出现在学生树的 lecture02/01_demo.py:13" in r.stderr, r.stderr
    assert "scaled_values = [v * k for v in x]" in r.stderr
    r = run(root, "tools/exercises.py", "student", "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and not (tmp_path / "s").exists()


def test_planted_passing_wrong_variant_flagged(tmp_path):
    wrong = TOY["tests/exercises/wrong_lecture01.py"].replace("return sum(x) - 1", "return sum(x)")
    root = make_tree(str(tmp_path / "c"), {"tests/exercises/wrong_lecture01.py": wrong})
    r = run(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/exercises/test_wrong_corpus.py")
    assert r.returncode == 1, r.stdout
    assert "1 failed" in r.stdout and "错误答案「少一」（练习 1.2）通过了全部 1 个检查" in r.stdout, r.stdout


def test_planted_hole_breaking_another_lecture_is_broken_not_blocked(tmp_path):
    # instructor 区域删掉了第 2 讲导入的 helper_name：学生树里那是 ImportError（坏了），不是"被练习挡住"
    lab = TOY["lecture01/toy_lab.py"].replace("        def helper_name():\n            return 42\n",
                                               "        # >>> 练习 1.1 instructor\n        def helper_name():\n"
                                               "            return 42\n        # <<< 练习 1.1\n")
    root = make_tree(str(tmp_path / "c"), {"lecture01/toy_lab.py": lab})
    s = str(tmp_path / "s")
    r = run(root, "tools/exercises.py", "student", "--out", s)
    assert r.returncode == 0, r.stderr
    r = run(s, "tools/check_all.py")
    assert r.returncode == 1, r.stdout
    rows = [ln for ln in r.stdout.splitlines() if "lecture02/user_lab.py" in ln and "s" in ln]
    assert rows and "✗" in rows[0], r.stdout
    assert "ImportError" in r.stdout


def test_check_finds_inconsistencies(tmp_path):
    md = TOY["lecture01/EXERCISES.md"]
    md = md.replace("        3. 每步加上当前元素。\n", "")              # 1.2 只剩两条提示
    md = md.replace("- 依赖：1.1", "- 依赖：1.9")
    md = md.replace("- 分值：2\n        - 依赖：无\n        - 位置：`lecture01/toy_lab.py`",
                    "- 分值：两\n        - 依赖：无\n        - 位置：`lecture01/toy_lab.py`")
    md += textwrap.dedent('''
        ## 练习 1.4：没有标记
        - 分值：1
        - 依赖：无
        - 位置：无
        - 评分：无
        - 预计用时：1 分钟

        ### 提示
        1. a
        2. b
        3. c
        ''').replace("\n", "\n        ")
    wrong = TOY["tests/exercises/wrong_lecture01.py"].replace(
        '            Wrong("1.2", "lecture01", "toy_lab", "total", "数个数", counts),\n', "")
    root = make_tree(str(tmp_path / "c"), {"lecture01/EXERCISES.md": md, "tests/exercises/wrong_lecture01.py": wrong})
    r = run(root, "tools/exercises.py", "check")
    assert r.returncode == 2
    for text in ("练习 1.2 的「### 提示」要正好 3 条", "依赖的 '1.9' 不是已有的练习", "练习 1.1 的分值要写正整数",
                 "练习 1.4 在代码里没有标记", "练习 1.4 没有登记任何检查", "练习 1.2 的错误答案不足两个"):
        assert text in r.stderr, (text, r.stderr)


def test_student_parser_unit():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import exercises as ex
    src = ("def f():\n    x = 1\n    # >>> 练习 2.1\n    y = compute_something_long(x)\n    return y\n"
           "    # <<< 练习 2.1\n")
    out = ex.student_text(src, titles={"2.1": "标题"})
    assert out == "def f():\n    x = 1\n    raise NotImplementedError('练习 2.1 未完成：标题')\n"
    assert ex.solution_lines(src, ex.parse_regions(src)) == [(4, "y = compute_something_long(x)")]
    for bad in ("# >>> 练习 2.1 secret\n# <<< 练习 2.1\n", "# >>> 练习 2.1\n# >>> 练习 2.2\n",
                "# <<< 练习 2.1\n", "# >>> 练习 2.1\n# <<< 练习 2.2\n", "#>>> 练习2.1\n"):
        with pytest.raises(ex.MarkerError):
            ex.parse_regions(bad)
    assert ex.student_predictions("items:\n  - answer: 3.1   # 由模型算出\n    band: 2\n") == \
        "items:\n  - answer: null      # 你的预测（单位见 unit）\n    band: 2\n"


def test_make_targets():
    if shutil.which("make") is None:
        pytest.skip("没有 make")

    def dry(*args):
        r = subprocess.run(["make", "-n", "-B", "--no-print-directory", *args], cwd=ROOT, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert "tools/grade.py --lecture lecture11 --ex 11.2 --hint 1" in dry("grade", "L=lecture11", "EX=11.2", "HINT=1")
    plain = dry("grade")          # 不给 L / EX / HINT：只有 tools/grade.py（行尾可能有空格）
    assert re.search(r"tools/grade\.py[ \t]*$", plain, re.M) and "--lecture" not in plain and "--ex" not in plain, plain
    assert "tools/exercises.py student --out dist/student" in dry("student")
    assert "tools/grade_gpu.py --ex 11.7" in dry("grade-gpu", "EX=11.7")
