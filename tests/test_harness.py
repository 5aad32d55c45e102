"""每个实验模块的 `_selftest()`、每个演示脚本的 `--quick`、每个工作台脚本（`<讲次>/bench/*.py`）的 `--replot`，
各在自己的子进程里跑一遍。

项目列表和 `make check-all` 用的是同一个发现逻辑（tools/check_all.py），新讲次自动加入。
子进程：lecture11 与 lecture18 各有一个 `flash_lab`，不能在同一个进程里导入。
"""
import os

import pytest

import check_all

ITEMS = check_all.discover()


def test_course_has_items():
    # 发现逻辑本身：至少找到了 lecture01 的两个实验模块（防止规则写坏后“什么都不跑也通过”）
    labels = {it.label for it in ITEMS}
    assert "lecture01/llm_math.py" in labels and "lecture01/hw_specs.py" in labels, sorted(labels)[:10]


def test_discover_rules(tmp_path):
    # 在临时目录里造一个假课程，检查发现规则：讲次排序、实验模块 vs 演示、非课程文件夹被忽略
    for folder in ("lecture10", "lecture02", "prereq5", "notes"):
        (tmp_path / folder).mkdir()
    (tmp_path / "lecture02" / "lab.py").write_text(
        'def _selftest():\n    pass\n\n\nif __name__ == "__main__":\n    _selftest()\n')
    (tmp_path / "lecture02" / "helper.py").write_text("x = 1\n")
    (tmp_path / "lecture02" / "02_b.py").write_text("")
    (tmp_path / "lecture02" / "01_a.py").write_text("")
    (tmp_path / "notes" / "lab.py").write_text("def _selftest():\n    pass\n")
    # 工作台：bench/ 里的 .py 是自己的一类（里面的 _selftest 不算实验模块），_ 开头的辅助文件不跑
    (tmp_path / "lecture02" / "bench").mkdir()
    (tmp_path / "lecture02" / "bench" / "sweep.py").write_text((tmp_path / "lecture02" / "lab.py").read_text())
    (tmp_path / "lecture02" / "bench" / "_common.py").write_text("")
    (tmp_path / "lecture02" / "bench" / "README.md").write_text("")
    assert check_all.course_folders(str(tmp_path)) == ["prereq5", "lecture02", "lecture10"]
    items = check_all.discover(str(tmp_path))
    assert [(it.label, it.kind) for it in items] == [
        ("lecture02/lab.py", "selftest"), ("lecture02/01_a.py", "demo"), ("lecture02/02_b.py", "demo"),
        ("lecture02/bench/sweep.py", "bench")]
    argv = {it.kind: it.argv("py")[1:] for it in items}
    assert argv["bench"][0].endswith(os.path.join("lecture02", "bench", "sweep.py"))
    assert argv["bench"][1:] == ["--replot"]
    assert argv["demo"][1:] == ["--quick"] and argv["selftest"][1:] == []
    assert items[-1].argv("py", full=True)[-1] == "--replot"             # --full 只影响演示
    with pytest.raises(ValueError, match="lecture99"):
        check_all.discover(str(tmp_path), folders=["lecture99"])


@pytest.mark.parametrize("item", ITEMS, ids=[f"{it.kind}:{it.label}" for it in ITEMS])
def test_item(item):
    status, dt, info = check_all.run_item(item)
    if status == "skip":
        pytest.skip(f"{item.label}: {info}")
    if status == "blocked":                          # 学生树：跑到了还没做的练习（info = "blocked by 练习 X"）
        pytest.skip(info)
    assert status == "ok", f"{item.label} 失败（{dt:.1f} s）：\n{info}"
    if item.kind == "demo":
        # --quick 的小图进 figures/quick/，不覆盖 make figures 生成的完整图
        import re
        written = re.findall(r"[\w./\\-]+\.png", info)
        full = [p for p in written if "quick" not in p.replace("\\", "/").split("/")]
        assert not full, f"{item.label} --quick 把图写到了完整图的位置：{full}"


def test_lab_module_must_call_selftest(tmp_path):
    # 定义了 _selftest() 却不在 __main__ 里调用：`python file.py` 什么也不查就以 0 退出，必须被发现规则拒绝
    (tmp_path / "lecture03").mkdir()
    good = tmp_path / "lecture03" / "good.py"
    good.write_text('def _selftest():\n    pass\n\n\nif __name__ == "__main__":\n    np = 1\n    _selftest()\n')
    assert check_all.is_lab_module(str(good))
    bad = tmp_path / "lecture03" / "bad.py"
    bad.write_text("def _selftest():\n    assert False\n")
    with pytest.raises(ValueError, match="没有调用"):
        check_all.is_lab_module(str(bad))


def test_labload_shares_one_copy_of_a_uniquely_named_module():
    # lecture02 的 transformer_lab 以裸名字导入 llm_math；测试里按路径加载的 llm_math 必须是同一个对象，
    # 否则两边的 ModelConfig 是两个不同的类
    from labload import ambiguous_names, load_lab
    lm = load_lab("lecture01", "llm_math")
    tl = load_lab("lecture02", "transformer_lab")
    assert tl.ModelConfig is lm.ModelConfig
    assert "llm_math" not in ambiguous_names()


def test_check_all_prints_each_item_once(capsys, monkeypatch):
    # 每项完成时打印一行，最后不再把整张表重印一遍。
    # 只测打印：run_item 换成立刻返回成功的替身（各项真的跑一遍是 test_item 的事）
    calls = []

    def fake_run_item(item, **kw):
        calls.append(item.label)
        return "ok", 0.1 * len(calls), f"{item.label} ok"

    monkeypatch.setattr(check_all, "run_item", fake_run_item)
    rc = check_all.main(["--folders", "lecture01", "--jobs", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("[")]       # 每项一行（完成时打印）
    items = check_all.discover(folders=["lecture01"])
    assert len(rows) == len(items), out
    assert sorted(calls) == sorted(it.label for it in items)                   # 每项只"运行"一次
    for it in items:
        assert sum(f" {it.label} " in ln for ln in out.splitlines()[:-1]) == 1, (it.label, out)
    assert "最慢" in out


def test_every_demo_passes_quick_to_save_figure():
    # --quick 的图进 figures/quick/；每个存图的演示都要把 args.quick 传下去
    import os
    import re
    for it in ITEMS:
        if it.kind != "demo":
            continue
        text = open(os.path.join(check_all.ROOT, it.folder, it.filename), encoding="utf-8").read()
        for call in re.findall(r"save_figure\((?:[^()]|\([^()]*\))*\)", text):
            assert "quick=" in call, (it.label, call)


def _make_dry_run(target):
    import shutil
    import subprocess
    if shutil.which("make") is None:
        pytest.skip("没有 make")
    out = subprocess.run(["make", "-n", "-B", target], cwd=check_all.ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_distclean_keeps_committed_checkpoints():
    # make distclean 只删 .venv 和 checkpoints/ 里 git 不跟踪的文件：入库的检查点（lecture04、lecture19）不能删
    cmds = _make_dry_run("distclean")
    rm_lines = [ln for ln in cmds.splitlines() if "rm -rf" in ln]
    assert rm_lines and not any("checkpoints" in ln for ln in rm_lines), rm_lines
    assert "git clean -fdx" in cmds and "lecture04/checkpoints" in cmds


def test_setup_shows_pip_progress():
    # pip 不能安静地跑两分钟：每一步先打印装什么，pip 不带 -q
    cmds = _make_dry_run("setup")
    pip = [ln for ln in cmds.splitlines() if "pip install" in ln]
    assert pip and not any(" -q " in ln for ln in pip), pip
    assert "[1/2]" in cmds and "[2/2]" in cmds


def test_readme_demo_numbers_match_folders():
    # README 说的演示编号范围要和每个讲次文件夹里实际的最大编号一致
    import os
    import re
    readme = open(os.path.join(check_all.ROOT, "README.md"), encoding="utf-8").read()
    for folder in sorted({it.label.split("/")[0] for it in ITEMS}):
        nums = [int(m.group(1)) for f in os.listdir(os.path.join(check_all.ROOT, folder))
                if (m := re.match(r"(\d\d)_.*\.py$", f))]
        if nums and max(nums) > 5:
            line = next(ln for ln in readme.splitlines() if "演示脚本" in ln and "01_" in ln)
            assert folder in line and f"到 0{max(nums)}" in line, (folder, max(nums), line)


def test_lessons_never_import_bench():
    # 讲次根目录是课本身：工作台可以导入课，课从不导入工作台（没有 GPU 的学生读课时用不到 bench/）
    import os
    import re
    reach = re.compile(r"sys\.path\.\w+\(.*[\"']bench[\"']|^\s*(from|import)\s+bench\b|[\"']bench[/\\\\]\w+\.py",
                       re.MULTILINE)
    for folder in check_all.course_folders():
        for name in sorted(os.listdir(os.path.join(check_all.ROOT, folder))):
            if name.endswith(".py"):
                text = open(os.path.join(check_all.ROOT, folder, name), encoding="utf-8").read()
                assert not reach.search(text), f"{folder}/{name} 导入了 bench/：{reach.search(text).group(0)}"


def _imported_names(path):
    import ast
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_every_script_reaches_course_utils():
    # 学生树里脚本跑到还没做的练习时，course_utils 装的 excepthook 只打印一行"被练习 X 挡住"（退出码 78）。
    # 所以每个可能碰到留空处的自检 / 演示 / 工作台脚本都要直接或经由别的课程模块导入 course_utils
    modules = {}
    for folder in check_all.course_folders():
        for sub in ("", "bench"):
            d = os.path.join(check_all.ROOT, folder, sub)
            if os.path.isdir(d):
                for name in os.listdir(d):
                    if name.endswith(".py") and not name[0].isdigit():
                        modules.setdefault(name[:-3], []).append(os.path.join(d, name))

    def reaches(path, seen):
        names = _imported_names(path)
        if "course_utils" in names:
            return True
        for n in names - seen:
            seen.add(n)
            if any(reaches(p, seen) for p in modules.get(n, [])):
                return True
        return False

    def can_meet_a_hole(path):       # 自己有练习标记，或导入了别的课程模块（那里可能有留空处）
        return "# >>> 练习" in open(path, encoding="utf-8").read() or bool(_imported_names(path) & set(modules))

    paths = {it.label: os.path.join(check_all.ROOT, it.folder, it.filename) for it in ITEMS}
    missing = [label for label, p in paths.items() if label != "lecture01/course_utils.py"
               and can_meet_a_hole(p) and not reaches(p, set())]
    assert not missing, f"这些脚本没有（直接或间接）导入 course_utils，学生树里碰到留空处会打印整屏 traceback：" \
                        f"{missing}"
