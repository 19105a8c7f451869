"""cpuinfo reads the CPU's model and flags once from /proc/cpuinfo, and says nothing where it
cannot (no such file: another OS)."""

from __future__ import annotations

import pytest

from dtcli import cpuinfo

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse avx2 fma\n"


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    def write(text: str | None) -> None:
        path = tmp_path / "cpuinfo"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(cpuinfo, "CPUINFO", path)
        cpuinfo.lines.cache_clear()

    yield write
    cpuinfo.lines.cache_clear()


def test_a_cpu_with_amx_takes_bf16_and_its_lines_are_read_once(cpu):
    cpu(XEON)
    assert cpuinfo.model_name() == "Intel(R) Xeon(R) Processor"
    assert {"avx512f", "amx_bf16"} <= cpuinfo.flags()
    assert cpuinfo.runs_bf16()
    assert len(cpuinfo.lines()) == 2  # each CPU repeats them: kept once (the XLA cache's key)


def test_an_avx2_cpu_does_not_and_an_unreadable_file_says_nothing(cpu):
    cpu(EPYC)
    assert cpuinfo.model_name() == "AMD EPYC 7B12" and not cpuinfo.runs_bf16()
    cpu(None)
    assert cpuinfo.lines() == () and cpuinfo.model_name() == "" and not cpuinfo.runs_bf16()


def test_doctor_names_the_cpu_and_what_bf16_does_on_it(cpu):
    from dtcli import doctor

    cpu(XEON)
    check = doctor._cpu()
    assert check.status == "ok" and "Intel(R) Xeon(R) Processor" in check.detail
    assert "amx_bf16, avx512_bf16" in check.detail and "oneDNN" in check.detail
    cpu(EPYC)
    detail = doctor._cpu().detail
    assert "AMD EPYC 7B12; no bf16 matmul units" in detail and "oneDNN" not in detail
    cpu(None)
    assert "bf16 units unknown" in doctor._cpu().detail
