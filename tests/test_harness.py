"""每个实验模块的 `_selftest()` 和每个演示脚本的 `--quick`，各在自己的子进程里跑一遍。

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
    (tmp_path / "lecture02" / "lab.py").write_text("def _selftest():\n    pass\n")
    (tmp_path / "lecture02" / "helper.py").write_text("x = 1\n")
    (tmp_path / "lecture02" / "02_b.py").write_text("")
    (tmp_path / "lecture02" / "01_a.py").write_text("")
    (tmp_path / "notes" / "lab.py").write_text("def _selftest():\n    pass\n")
    assert check_all.course_folders(str(tmp_path)) == ["prereq5", "lecture02", "lecture10"]
    items = check_all.discover(str(tmp_path))
    assert [(it.label, it.kind) for it in items] == [
        ("lecture02/lab.py", "selftest"), ("lecture02/01_a.py", "demo"), ("lecture02/02_b.py", "demo")]
    with pytest.raises(ValueError, match="lecture99"):
        check_all.discover(str(tmp_path), folders=["lecture99"])


@pytest.mark.parametrize("item", ITEMS, ids=[f"{it.kind}:{it.label}" for it in ITEMS])
def test_item(item):
    timeout = int(os.environ.get("CHECK_TIMEOUT", "600"))
    status, dt, info = check_all.run_item(item, timeout=timeout)
    if status == "skip":
        pytest.skip(f"{item.label}: {info}")
    assert status == "ok", f"{item.label} 失败（{dt:.1f} s）：\n{info}"
