# CS349E 命令索引。`make`（= make help）列出全部目标。
# 每个目标都依赖 setup：全新克隆上第一条命令就可以是 `make check-all` 或 `make test`。
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-setup
# 先装的 torch 规格：默认由 tools/pick_torch.py 自动挑（无 GPU 的 Linux 上用本地 CPU wheel，避免几 GB 的 CUDA 构建）
TORCH_SPEC ?= $(shell $(PYTHON) tools/pick_torch.py 2>/dev/null)
PYTEST_ARGS ?= -n 2
# pip 对本机配置里不存在的本地索引目录逐个发警告，过滤掉这类噪声（pipefail 保留 pip 的退出码）
PIP_QUIET := { grep --line-buffered -v 'is ignored: it is neither a file nor a directory' || true; }
FOLDERS := $(sort $(wildcard prereq[0-9]* lecture[0-9]*))

.PHONY: help setup check-all test lint figures checkpoints student grade grade-gpu clean distclean

help:  ## 列出所有目标
	@echo "CS349E —— 用法：make <目标>"
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-16s %s\n", $$1, $$2}'
	@echo "  check-<讲次>      只检查一个讲次：$(addprefix check-,$(FOLDERS))"
	@echo "变量：PYTHON=$(PYTHON)  VENV=$(VENV)  TORCH_SPEC='$(TORCH_SPEC)'  PYTEST_ARGS='$(PYTEST_ARGS)'"

setup: $(STAMP)  ## 建 .venv 并安装 requirements.txt（幂等；PYTHON=... 换解释器）

$(STAMP): requirements.txt tools/pick_torch.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), f"需要 Python ≥ 3.10，现在是 {sys.version.split()[0]}：用 make PYTHON=python3.11 ..."'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH_SPEC)" ]; then echo "[1/2] 安装 torch（$(TORCH_SPEC)）：约 0.75 GB，pip 逐行显示进度 ..."; \
	  $(PY) -m pip install --progress-bar off $(TORCH_SPEC) 2>&1 | $(PIP_QUIET); fi
	@echo "[2/2] 安装 requirements.txt（numpy、matplotlib、triton ≈ 1 GB、pytest …）：空闲的 2 核机器上约 1–2 分钟，pip 逐行显示进度 ..."
	@$(PY) -m pip install --progress-bar off -r requirements.txt 2>&1 | $(PIP_QUIET)
	@$(PY) -c 'import numpy, torch, matplotlib; print(f"环境就绪：numpy {numpy.__version__}, torch {torch.__version__}, CUDA {torch.cuda.is_available()}")'
	@touch $(STAMP)

check-all: setup  ## 全部自检 + 全部演示（--quick）+ 各讲 bench/ 的工作台（--replot，不用 GPU），打印 ✓/✗/skip 表
	@$(PY) tools/check_all.py

check-%: setup  ## （模式）只检查一个讲次，如 make check-lecture02
	@$(PY) tools/check_all.py --folders $*

test: setup  ## pytest：每个自检与演示（子进程）+ 各讲次的单元 / 性质测试
	@$(PY) -m pytest $(PYTEST_ARGS)

# 练习：学生树和评分（README 的"做练习"）。学生树与本树共用 .venv（符号链接），不用再装一遍
student: setup  ## 写学生树 dist/student/：练习的解答换成 raise NotImplementedError（先查标记、格式、解答行泄漏）
	@$(PY) tools/exercises.py student --out dist/student
	@if [ -d $(VENV) ] && [ ! -e dist/student/.venv ]; then ln -s $(abspath $(VENV)) dist/student/.venv; fi
	@echo "下一步：cd dist/student，改代码，然后 make grade（或 make grade EX=11.2 HINT=1）"

grade: setup  ## 给练习打分：make grade [L=lecture11] [EX=11.2] [HINT=1..3]；结果也写进 grade.json（Gradescope 格式）
	@$(PY) tools/grade.py $(if $(L),--lecture $(L)) $(if $(EX),--ex $(EX)) $(if $(HINT),--hint $(HINT))

grade-gpu: setup  ## 只在 GPU 机器上：需要 GPU 的练习检查，make grade-gpu [EX=11.7]
	@$(PY) tools/grade_gpu.py $(if $(EX),--ex $(EX))

lint: setup  ## ruff 检查
	@$(PY) -m ruff check .

figures: setup  ## 以完整规模运行所有演示，图存到 <讲次>/figures/
	@$(PY) tools/check_all.py --full --jobs 1

checkpoints: setup  ## 训练各讲次缓存的模型（运行每个 <讲次>/train_checkpoints.py）
	@found=0; for f in $(addsuffix /train_checkpoints.py,$(FOLDERS)); do \
	  if [ -f $$f ]; then found=1; echo "== $$f"; $(PY) $$f || exit 1; fi; done; \
	  if [ $$found = 0 ]; then echo "目前还没有讲次需要训练检查点（lecture04/18/19 加入后会有）。"; fi

clean:  ## 删除生成的图、缓存（保留 .venv 和检查点）
	rm -rf $(addsuffix /figures,$(FOLDERS)) $(addsuffix /bench/figures,$(FOLDERS)) .pytest_cache .ruff_cache .hypothesis grade.json
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# 入库的检查点（lecture04、lecture19）保留：只删 git 不跟踪的文件（续训文件、锁、没入库的讲次的检查点）
distclean: clean  ## 删除 .venv 和未入库的检查点文件（入库的检查点保留）
	rm -rf $(VENV)
	@for d in $(addsuffix /checkpoints,$(FOLDERS)); do \
	  if [ -d $$d ]; then git clean -fdxq -- $$d 2>/dev/null || echo "不在 git 仓库里：保留 $$d（要删请手动）"; fi; done
