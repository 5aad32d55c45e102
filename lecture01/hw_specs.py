"""
hw_specs.py —— 第 1 讲：今天的加速器能算多快、能搬多快、能装多少

【问题】llm_math 算出一个 token 要做多少运算、搬多少字节；换算成"多少秒"还要芯片的三个数：
    峰值算力 peak（FLOP/s，按精度分）、显存带宽 mem_bw（byte/s）、显存容量（byte：手册数字 mem_cap 只用来显示，
    放不放得下用程序实际能分配的 alloc_bytes，H200 实测比手册多 6.5%）。
    peak / mem_bw 叫 ridge point（"屋脊点"，FLOP/byte）：算术强度高于它受算力限制，低于它受带宽限制。
    今天芯片的 ridge point（bf16）在 160（RTX 4090）到 560（TPU v6e）之间，而 batch 1 的 decode 强度只有 ≈ 1——
    这就是第 1 讲最重要的一句话："decode 是在搬数据，不是在算"。

【里面有什么】
    Chip     一块芯片的规格 + peak_flops / ridge_point / roofline_time 等方法
    芯片表    H100_SXM、H100_PCIE、H200、B200、MI300X、TPU_V5E、TPU_V5P、TPU_V6E、RTX_4090；CHIPS（名字 → 芯片）
             （A100 在第 5 讲：serving_sim.A100_40G，Orca 的实验平台）
    可分配显存 H200_ALLOC_MEASURED（实测）、ALLOC_PER_DATASHEET_BYTE、derived_alloc、with_alloc（芯片 + alloc_bytes）

【约定】
    - 算力全是稠密（dense）数字：NVIDIA 手册常印带 2:4 稀疏的数字（带星号），稠密 = 稀疏 / 2。
    - peak 的键小写："bf16"、"fp16"、"fp8"、"int8"（单位是 OP/s）、"fp32"（非 Tensor Core）、"fp4"；
      芯片不支持或厂商没公布的精度不出现在字典里。
    - 字节用十进制（1 GB = 10⁹ B）。link_bw 是**每个方向**的片间（scale-up）带宽：NVLink 的 "900 GB/s"
      是双向合计，每个方向 450 GB/s（A100 的 "600 GB/s" 就是每方向 300e9）。
    - 每个数字的出处写在 notes 里，键（如 [S5]）在仓库根目录的 SOURCES.md 里查；查不到的（如 TPU 功耗）填 None。

【运行】python3 lecture01/hw_specs.py     # 自检 + 打印芯片表
【依赖】只用 Python 标准库（参数检查来自同一文件夹的 course_utils.py）。
"""

from dataclasses import dataclass, field

from course_utils import check_real   # 参数检查（同一文件夹；只用标准库）

PRECISIONS = ("fp4", "fp8", "int8", "fp16", "bf16", "fp32")    # 认识的精度名（小写）


@dataclass(frozen=True, eq=False)
class Chip:
    """
    一块加速器的规格。

    【字段】
        name     ：名字；kind：类别（"GPU"、"TPU"……）
        peak     ：{精度: 稠密峰值 FLOP/s}，键小写，例如 {"bf16": 989e12, "fp8": 1979e12}
        mem_bw   ：显存带宽，byte/s
        mem_cap  ：显存容量，byte
        mem_kind ：显存类型（"HBM3"、"GDDR6X"……）
        link_bw  ：片间互联（NVLink / Infinity Fabric / ICI）**每个方向**的带宽，byte/s；
                   没有专用互联的卡填 PCIe 的单向带宽
        power_w  ：功耗（TDP / TBP），瓦；厂商没公布时为 None
        year     ：发布（或开始出货）的年份
        notes    ：出处和说明
    【边界】peak 不能为空、值必须为正；mem_bw、mem_cap、link_bw 必须为正；power_w 为正或 None。不满足时报 ValueError。
    【Python 小知识】eq=False：两块芯片按"是不是同一个对象"比较，可以当 dict 的键（peak 是字典，按值比较就没法哈希）。
    """
    name: str
    kind: str
    peak: dict
    mem_bw: float
    mem_cap: float
    mem_kind: str
    link_bw: float
    power_w: float = None
    year: int = None
    notes: str = field(default="", repr=False)
    mem_alloc: float = None          # 程序实际能分配的字节（见 alloc_bytes）；None = 没有这个数，用 mem_cap
    mem_alloc_how: str = ""          # 这个数怎么来的："measured …" / "derived …"

    @property
    def alloc_bytes(self):
        """
        一个程序能分配的显存（字节）：凡是"放不放得下"都用它（乘上 vLLM 式的 mem_util），mem_cap 只用来显示。

        为什么和 mem_cap 不一样：手册写的 "141 GB" 是营销数字（大致是 GiB），实测 H200 上
        torch.cuda.get_device_properties(0).total_memory = 150,109,880,320 B（139.8 GiB，比 141e9 多 6.5%）；
        vLLM 的 gpu_memory_utilization 就是这个"报告的总量"的比例。没有 mem_alloc 的芯片（例如原课程第 6 讲模块
        自己定义的 A100）退回 mem_cap。
        """
        return self.mem_cap if self.mem_alloc is None else self.mem_alloc

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name 必须是非空字符串，收到 {self.name!r}")
        for nm in ("kind", "mem_kind", "notes", "mem_alloc_how"):
            if not isinstance(getattr(self, nm), str):
                raise ValueError(f"{self.name}: {nm} 必须是字符串，收到 {getattr(self, nm)!r}")
        if not isinstance(self.peak, dict) or not self.peak:
            raise ValueError(f"{self.name}: peak 必须是非空字典 {{精度: FLOP/s}}，收到 {self.peak!r}")
        # 规格数字必须是正的有限实数；老约定：一切坏值（含 bool、字符串）都报 ValueError
        spec = dict(lo=0.0, lo_open=True, where=self.name, type_error=ValueError)
        clean = {}
        for k, v in self.peak.items():
            if not isinstance(k, str) or k != k.lower() or not k:
                raise ValueError(f"{self.name}: peak 的键必须是小写精度名（如 'bf16'），收到 {k!r}")
            check_real(f"peak[{k!r}]", v, **spec)
            clean[k] = float(v)
        object.__setattr__(self, "peak", clean)              # 复制一份，外面改原字典不影响芯片
        for nm in ("mem_bw", "mem_cap", "link_bw"):
            check_real(nm, getattr(self, nm), **spec)
        if self.power_w is not None:
            check_real("power_w", self.power_w, **spec)
        if self.mem_alloc is not None:
            check_real("mem_alloc", self.mem_alloc, **spec)
        if self.year is not None and (isinstance(self.year, bool) or not isinstance(self.year, int)
                                      or not 1950 <= self.year <= 2100):
            raise ValueError(f"{self.name}: year 必须是 1950…2100 的整数年份或 None，收到 {self.year!r}")

    @property
    def precisions(self):
        """这块芯片有峰值数字的精度，按 PRECISIONS 的顺序（不认识的名字排在最后）。"""
        order = {p: i for i, p in enumerate(PRECISIONS)}
        return tuple(sorted(self.peak, key=lambda p: (order.get(p, len(order)), p)))

    def peak_flops(self, prec="bf16"):
        """
        某个精度的稠密峰值（FLOP/s）。

        【边界】精度名不区分大小写；芯片没有这个精度时抛出 ValueError，消息里列出它有哪些精度；
            prec 不是字符串 → TypeError。
        """
        if not isinstance(prec, str):
            raise TypeError(f"{self.name}：prec 必须是精度名字符串（如 'bf16'），收到 {type(prec).__name__} 类型的 "
                            f"{prec!r}")
        key = prec.lower()
        if key not in self.peak:
            raise ValueError(f"{self.name} 没有精度 prec={prec!r} 的峰值；可选：{', '.join(self.precisions)}")
        return self.peak[key]

    def ridge_point(self, prec="bf16"):
        """屋脊点 = 峰值 / 带宽（FLOP/byte）：算术强度高于它受算力限制，低于它受带宽限制。"""
        return self.peak_flops(prec) / self.mem_bw

    def roofline_time(self, flops, nbytes, prec="bf16"):
        """
        roofline 时间（秒）= max(flops / 峰值, nbytes / 带宽)：假设运算和搬数据完美重叠、都能跑到峰值。

        【边界】flops、nbytes 必须是有限实数且 ≥ 0（NaN、无穷、负数报 ValueError，非数字报 TypeError）。
            这是下界：真实内核还有启动开销、达不到峰值等（第 6、11 讲）。
        """
        check_real("flops", flops, lo=0.0)
        check_real("nbytes", nbytes, lo=0.0)
        return max(flops / self.peak_flops(prec), nbytes / self.mem_bw)

    def bound(self, flops, nbytes, prec="bf16"):
        """这段计算受什么限制："compute"（算力）或 "memory"（带宽）。flops、nbytes 同 roofline_time。
        按算术强度和屋脊点比（flops / nbytes ≥ ridge_point，和 flops / 峰值 ≥ nbytes / 带宽 等价）：两边各除以峰值、
        带宽在极小的数上会下溢成 0，强度不会；nbytes = 0 时强度无穷大，算力受限。"""
        check_real("flops", flops, lo=0.0)
        check_real("nbytes", nbytes, lo=0.0)
        ridge = self.ridge_point(prec)                    # 先查精度名（没有这个精度：ValueError）
        return "compute" if nbytes == 0 or flops / nbytes >= ridge else "memory"

    def attainable_flops(self, intensity, prec="bf16"):
        """roofline 曲线本身：算术强度为 intensity 时最多能跑到的 FLOP/s = min(峰值, 强度 × 带宽)。

        【边界】intensity 必须是有限实数且 ≥ 0：NaN 不能悄悄变成峰值（min(峰值, nan) 会返回峰值）。
        """
        check_real("intensity", intensity, lo=0.0)
        return min(self.peak_flops(prec), intensity * self.mem_bw)

    def link_time(self, nbytes):
        """单方向把 nbytes 发给另一块芯片的时间下界（秒）：nbytes / link_bw（不计延迟；α-β 模型见 prereq5）。"""
        check_real("nbytes", nbytes, lo=0.0)
        return nbytes / self.link_bw


# =============================================================================
# 芯片表（每个数字的出处写在 notes 里，键见 SOURCES.md 第 1 节）
# =============================================================================
H100_SXM = Chip(
    "H100-SXM", "GPU",
    peak={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "int8": 1979e12, "fp32": 67e12},
    mem_bw=3.35e12, mem_cap=80e9, mem_kind="HBM3", link_bw=450e9, power_w=700, year=2022,
    notes="NVIDIA H100 SXM5 数据手册 [S5,S6]：BF16/FP16 989 TFLOPS（稀疏 1979），FP8/INT8 1979，FP32 67；"
          "Hopper 白皮书理论值 989.4 [S5]；80 GB HBM3，3.35 TB/s；NVLink4 900 GB/s 双向 = 每方向 450 [S5,S6,S40]；"
          "最高 700 W；2022 年 3 月发布 [S7]",
)
H100_PCIE = Chip(
    "H100-PCIe", "GPU",
    peak={"bf16": 756e12, "fp16": 756e12, "fp8": 1513e12, "int8": 1513e12, "fp32": 51e12},
    mem_bw=2.0e12, mem_cap=80e9, mem_kind="HBM2e", link_bw=300e9, power_w=350, year=2022,
    notes="NVIDIA H100 PCIe 数据手册 [S6]：BF16 756（稀疏 1513），FP8/INT8 1513，FP32 51；80 GB HBM2e，"
          "2.0 TB/s [S6]（产品简介写 >2,000 GB/s [S8]）；NVLink 桥 600 GB/s 双向 = 每方向 300 [S6]；"
          "350 W [S8]；2022 年 10 月出货 [S7]",
)
H200 = Chip(
    "H200-SXM", "GPU",
    peak={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "int8": 1979e12, "fp32": 67e12},
    mem_bw=4.8e12, mem_cap=141e9, mem_kind="HBM3e", link_bw=450e9, power_w=700, year=2024,
    notes="和 H100 SXM 同一颗 GH100 芯片，算力相同 [S9,S12]（[S10] 把稀疏数字标成了稠密）；"
          "141 GB HBM3e，4.8 TB/s [S9,S10,S11]；NVLink4 900 GB/s 双向 = 每方向 450 [S9,S11]；"
          "最高 700 W [S9,S11]；2023 年 11 月发布、2024 年出货 [S10,S12]",
)
B200 = Chip(
    "B200", "GPU",
    peak={"bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12, "int8": 4500e12, "fp4": 9000e12, "fp32": 80e12},
    mem_bw=8.0e12, mem_cap=180e9, mem_kind="HBM3e", link_bw=900e9, power_w=1000, year=2024,
    notes="HGX B200（1000 W）[S13,S14]：BF16 2.25 PFLOPS（稀疏 4.5），FP8/INT8 4.5，FP4 9 [S13,S14]；FP32 80 [S13]"
          "（另一版手册 75 [S14]）；显存 180 GB 可用（DGX B200 1440 GB / 8 [S15]，物理 192 GB [S13]）；8 TB/s [S13,S15]"
          "（另一版 7.7 [S14]）；NVLink5 1.8 TB/s 双向 = 每方向 900 [S14,S16]；2024 年 3 月发布、2025 年出货 [S17]",
)
MI300X = Chip(
    "MI300X", "GPU",
    peak={"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12, "int8": 2614.9e12, "fp32": 163.4e12},
    mem_bw=5.3e12, mem_cap=192e9, mem_kind="HBM3", link_bw=448e9, power_w=750, year=2023,
    notes="AMD Instinct MI300X：BF16/FP16 1307.4 TFLOPS，FP8 2614.9 [S23,S24]，INT8 2614.9 [S24]，"
          "FP32 向量 163.4 [S24]；192 GB HBM3 [S25,S26]，5.3 TB/s [S23,S25]；"
          "Infinity Fabric 7 条链路合计 896 GB/s [S25]（每条 128 GB/s [S27]），"
          "按双向合计理解，每方向 448（假设，来源未注明方向）；750 W [S25,S28]；2023 年 12 月 [S26]",
)
TPU_V5E = Chip(
    "TPU-v5e", "TPU",
    peak={"bf16": 197e12, "int8": 393e12},
    mem_bw=819e9, mem_cap=16e9, mem_kind="HBM2", link_bw=200e9, power_w=None, year=2023,
    notes="Google Cloud TPU v5e 文档 [S31]：BF16 197 TFLOPS，INT8 393 TOPS；16 GB HBM2，819 GB/s"
          "（另一版文档写 800 GiB/s）；ICI 每芯片 400 GB/s 双向 = 每方向 200（4 个端口，2D torus）[S31]；"
          "功耗未公布；2023 年 8 月 [S32]",
)
TPU_V5P = Chip(
    "TPU-v5p", "TPU",
    peak={"bf16": 459e12, "fp8": 459e12, "int8": 918e12},
    mem_bw=2.765e12, mem_cap=95e9, mem_kind="HBM2e", link_bw=600e9, power_w=None, year=2023,
    notes="Google Cloud TPU v5p 文档 [S33]：BF16 459 TFLOPS（文档也列 FP8 459），INT8 918 [S34]；"
          "95 GB HBM2e，2765 GB/s [S33]；ICI 文档写每芯片 1200 GB/s 双向 = 每方向 600"
          "（较早的文档 / 博客写 4800 Gbps = 600 GB/s 合计，两版不一致）[S33,S32]；功耗未公布；"
          "2023 年 12 月发布、2024 年 4 月 GA [S34]",
)
TPU_V6E = Chip(
    "TPU-v6e", "TPU",
    peak={"bf16": 918e12, "int8": 1836e12},
    mem_bw=1.638e12, mem_cap=32e9, mem_kind="HBM", link_bw=400e9, power_w=None, year=2024,
    notes="Google Cloud TPU v6e（Trillium）文档 [S35]：BF16 918 TFLOPS，INT8 1836 TOPS；32 GB HBM，1638 GB/s；"
          "ICI 每芯片 800 GB/s 双向 = 每方向 400（4 个端口，2D torus）[S35]；功耗未公布；2024 年",
)
RTX_4090 = Chip(
    "RTX-4090", "GPU",
    peak={"bf16": 165.2e12, "fp16": 165.2e12, "fp8": 330.3e12, "int8": 660.6e12, "fp32": 82.6e12},
    mem_bw=1.008e12, mem_cap=24e9, mem_kind="GDDR6X", link_bw=32e9, power_w=450, year=2022,
    notes="GeForce RTX 4090 [S36,S37]：BF16/FP16（FP32 累加）165.2 TFLOPS（FP16 累加时 330.3），"
          "FP8 330.3（FP32 累加），INT8 660.6，FP32 82.6；24 GB GDDR6X，1008 GB/s；450 W；2022 年 10 月。"
          "没有 NVLink，卡间只能走 PCIe："
          "link_bw 取 PCIe 4.0 x16 的每方向约 32 GB/s（PCIe 代数来源未确认 [S38]，这里是假设）",
)

# ---- 可分配显存（alloc_bytes）：H200 是实测，其余按同一条规则推出来、标明"derived" ----
# 实测（NVIDIA H200，torch 2.11）：torch.cuda.get_device_properties(0).total_memory = 150,109,880,320 B
# （nvidia-smi 显示 143,771 MiB；差的约 616 MiB 是驱动保留的）。
H200_ALLOC_MEASURED = 150_109_880_320
# 规则：手册的 "N GB" 实际上接近 N GiB，可分配量 ≈ mem_cap × (H200 实测 ÷ 141e9) = mem_cap × 1.0646。
# 这是估计，不是测量：换一块卡实测 total_memory 后填进 mem_alloc，把 how 改成 "measured"。
ALLOC_PER_DATASHEET_BYTE = H200_ALLOC_MEASURED / 141e9


def derived_alloc(mem_cap):
    """没有实测时的可分配字节：mem_cap × ALLOC_PER_DATASHEET_BYTE（H200 实测的比例），取整。"""
    check_real("mem_cap", mem_cap, lo=0.0, lo_open=True)
    return float(round(mem_cap * ALLOC_PER_DATASHEET_BYTE))


def with_alloc(chip, measured=None):
    """chip 加上可分配字节：measured（torch total_memory 的实测）给了就用它，否则按 derived_alloc 推出；
    mem_alloc_how 写明是哪一种（推出的写上 ALLOC_PER_DATASHEET_BYTE 的值）。第 5 讲的 A100_40G 也这样建。"""
    from dataclasses import replace
    if not isinstance(chip, Chip):
        raise TypeError(f"with_alloc：chip 必须是 hw_specs.Chip，收到 {type(chip).__name__} 类型的 {chip!r}")
    if measured is not None:
        measured = check_real("measured", measured, lo=0.0, lo_open=True, where="with_alloc")
        return replace(chip, mem_alloc=float(measured), mem_alloc_how="measured: torch total_memory (torch 2.11)")
    return replace(chip, mem_alloc=derived_alloc(chip.mem_cap),
                   mem_alloc_how=f"derived: mem_cap × H200 measured/datasheet ratio {ALLOC_PER_DATASHEET_BYTE:.4f}")


H200 = with_alloc(H200, measured=H200_ALLOC_MEASURED)
H100_SXM, H100_PCIE, B200, MI300X, TPU_V5E, TPU_V5P, TPU_V6E, RTX_4090 = (
    with_alloc(c) for c in (H100_SXM, H100_PCIE, B200, MI300X, TPU_V5E, TPU_V5P, TPU_V6E, RTX_4090))

CHIPS = {c.name: c for c in (H100_SXM, H100_PCIE, H200, B200, MI300X, TPU_V5E, TPU_V5P, TPU_V6E, RTX_4090)}


def chip_rows(chips=None, prec="bf16"):
    """
    芯片表的一行行数据（给 format_table / 演示打印用）：
    [名字, 峰值 TFLOP/s, 带宽 TB/s, 容量 GB（手册）, 可分配 GB（带 * 的是实测，其余按 derived_alloc 推出）,
     屋脊点 FLOP/B, 互联 GB/s（每方向）, 功耗 W, 年份]。

    【边界】chips：None（全部）、{名字: 芯片} 或芯片的列表（不能为空）；prec 不区分大小写，至少要有一块芯片有它
        （全都没有多半是拼错了 → ValueError）；没有 prec 精度的芯片，峰值和屋脊点写 "—"。
    """
    chips, prec = _check_chip_rows(chips, prec)
    rows = []
    for c in chips:
        has = prec in c.peak
        rows.append([c.name, f"{c.peak[prec] / 1e12:.0f}" if has else "—", f"{c.mem_bw / 1e12:.2f}",
                     f"{c.mem_cap / 1e9:.0f}",
                     f"{c.alloc_bytes / 1e9:.1f}" + ("*" if c.mem_alloc_how.startswith("measured") else ""),
                     f"{c.ridge_point(prec):.0f}" if has else "—",
                     f"{c.link_bw / 1e9:.0f}", "?" if c.power_w is None else f"{c.power_w:.0f}", str(c.year)])
    return rows


def _check_chip_rows(chips, prec):
    """chip_rows 的输入：chips 是 None（全部）、{名字: 芯片} 或芯片的列表（非空）；prec 至少有一块芯片有。"""
    from collections.abc import Mapping
    if chips is None:
        chips = list(CHIPS.values())
    elif isinstance(chips, Mapping):
        chips = list(chips.values())
    elif isinstance(chips, (list, tuple)):
        chips = list(chips)
    else:
        raise TypeError(f"chip_rows：chips 必须是芯片的列表、{{名字: 芯片}} 或 None，收到 {type(chips).__name__}")
    if not chips:
        raise ValueError("chip_rows：chips 是空的（要全部芯片就传 None）")
    bad = [c for c in chips if not isinstance(c, Chip)]
    if bad:
        raise TypeError(f"chip_rows：chips 的元素必须是 hw_specs.Chip，收到 {bad[0]!r}")
    if not isinstance(prec, str):
        raise TypeError(f"chip_rows：prec 必须是精度名字符串（如 'bf16'），收到 {type(prec).__name__} 类型的 {prec!r}")
    prec = prec.lower()
    if not any(prec in c.peak for c in chips):
        raise ValueError(f"chip_rows：没有一块芯片有精度 prec={prec!r}；可选：{', '.join(PRECISIONS)}")
    return chips, prec


CHIP_HEADERS = ["芯片", "峰值 TFLOP/s", "带宽 TB/s", "显存 GB(手册)", "可分配 GB(*实测)",
                "屋脊点 FLOP/B", "互联 GB/s(单向)", "功耗 W", "年份"]


# =============================================================================
# 自检
# =============================================================================
def _expect_value_error(fn, *must_contain):
    try:
        fn()
    except ValueError as e:
        for s in must_contain:
            assert s in str(e), (s, str(e))
        return
    raise AssertionError("应当抛出 ValueError")


def _selftest():
    # 1) 表里每块芯片：有 bf16；低精度不慢于高精度；出处写了
    for name, c in CHIPS.items():
        assert name == c.name and "bf16" in c.peak, name
        if "fp8" in c.peak:
            assert c.peak["fp8"] >= c.peak["bf16"], name
        if "fp32" in c.peak:
            assert c.peak["fp32"] < c.peak["bf16"], name
        assert "[S" in c.notes, name
        assert 100 < c.ridge_point() < 600, (name, c.ridge_point())   # 今天的芯片：屋脊点在 160–560 之间
    assert "A100" not in " ".join(CHIPS)                                 # A100 由第 6 讲自己定义
    # 2) 几个关系：H200 = H100 SXM 的算力 + 更多更快的显存；B200 的 bf16 约 2.3 倍；互联按"每方向"
    assert H200.peak == H100_SXM.peak and H200.mem_bw > H100_SXM.mem_bw and H200.mem_cap > H100_SXM.mem_cap
    assert 2.2 < B200.peak_flops() / H100_SXM.peak_flops() < 2.4
    assert H100_SXM.link_bw == 450e9 and B200.link_bw == 2 * H100_SXM.link_bw
    assert abs(H100_SXM.ridge_point() - 295.2) < 0.1
    # 3) roofline：取两者较大；跨过屋脊点，限制因素由带宽变成算力；时间随 flops、bytes 单调不减
    c = H100_SXM
    r = c.ridge_point()
    nbytes = 1e9
    assert c.bound(0.5 * r * nbytes, nbytes) == "memory" and c.bound(2 * r * nbytes, nbytes) == "compute"
    assert c.roofline_time(0.5 * r * nbytes, nbytes) == nbytes / c.mem_bw
    assert c.roofline_time(2 * r * nbytes, nbytes) == 2 * r * nbytes / c.peak_flops()
    ts = [c.roofline_time(f, nbytes) for f in (0, 1e12, 1e14, 1e15, 1e16)]
    assert all(a <= b for a, b in zip(ts, ts[1:]))
    assert c.attainable_flops(1.0) == c.mem_bw and c.attainable_flops(1e6) == c.peak_flops()
    assert c.peak_flops("BF16") == c.peak_flops("bf16")
    # 4) 坏输入
    _expect_value_error(lambda: TPU_V5E.peak_flops("fp8"), "bf16", "int8", "fp8")
    good = dict(name="x", kind="GPU", peak={"bf16": 1e12}, mem_bw=1e9, mem_cap=1e9, mem_kind="HBM", link_bw=1e9)
    for bad in (dict(peak={}), dict(peak={"BF16": 1e12}), dict(peak={"bf16": -1.0}), dict(mem_bw=0),
                dict(mem_cap=-5), dict(link_bw=0), dict(power_w=0), dict(name=""), dict(year="2024")):
        _expect_value_error(lambda bad=bad: Chip(**{**good, **bad}))
    _expect_value_error(lambda: c.roofline_time(-1, 0), "flops")
    _expect_value_error(lambda: c.roofline_time(float("nan"), 1), "flops")
    _expect_value_error(lambda: c.roofline_time(1, float("inf")), "nbytes")
    _expect_value_error(lambda: c.attainable_flops(float("nan")), "intensity")
    _expect_value_error(lambda: c.bound(1, float("nan")), "nbytes")
    _expect_value_error(lambda: c.link_time(-1.0), "nbytes")
    # 4b) 可分配显存：H200 是实测值；其余按同一比例推出；放不放得下用 alloc_bytes，mem_cap 只显示
    assert H200.alloc_bytes == 150_109_880_320 and H200.mem_cap == 141e9
    for c in CHIPS.values():
        assert c.alloc_bytes > c.mem_cap and c.mem_alloc_how, c.name
        if c is not H200:
            assert abs(c.alloc_bytes / c.mem_cap - H200.alloc_bytes / H200.mem_cap) < 1e-9
    assert Chip(**good).alloc_bytes == good["mem_cap"]                  # 没有 mem_alloc：退回 mem_cap
    _expect_value_error(lambda: Chip(**{**good, "mem_alloc": -1.0}), "mem_alloc")
    # 5) 第 6 讲 decode_lab 的写法能用（关键字参数、A100 的约定）
    a100 = Chip("A100-SXM4-40GB", "GPU", peak={"bf16": 312e12, "fp16": 312e12, "int8": 624e12},
                mem_bw=1.555e12, mem_cap=40e9, mem_kind="HBM2", link_bw=300e9, power_w=400, year=2020, notes="test")
    assert a100.peak_flops("bf16") == 312e12 and round(a100.ridge_point()) == 201

    ridge = ", ".join(f"{n} {c.ridge_point():.0f}" for n, c in CHIPS.items())
    print(f"hw_specs 自检通过：{len(CHIPS)} 块芯片，bf16 屋脊点（FLOP/byte）：{ridge}")


if __name__ == "__main__":
    _selftest()
