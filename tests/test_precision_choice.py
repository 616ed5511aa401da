"""--precision auto: bf16 only where the hardware runs it natively, decided from a capability probe faked both ways."""
from __future__ import annotations

import logging

import pytest

from pyserini_mores import precision
from pyserini_mores.precision import Bf16Support, cpu_bf16_support, cpu_flags, resolve_precision

AVX2_FLAGS = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"})
AMX_FLAGS = AVX2_FLAGS | {"avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}


@pytest.fixture(autouse=True)
def _fresh_log_once():
    precision._log_once.cache_clear()
    precision._warn_once.cache_clear()
    yield


def _fake_cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_support",
                        lambda: Bf16Support(native, "faked AMX CPU" if native else "faked AVX2 CPU"))


def test_cpu_flags_decide_native_bf16():
    assert not cpu_bf16_support(AVX2_FLAGS, "AVX2").native
    assert cpu_bf16_support(AMX_FLAGS, "AVX512").native
    assert cpu_bf16_support(AVX2_FLAGS | {"avx512_bf16"}, "AVX512").native
    # AVX-512 without its bf16 extension still emulates bf16
    assert not cpu_bf16_support(AVX2_FLAGS | {"avx512f", "avx512bw"}, "AVX512").native
    assert "amx_bf16" in cpu_bf16_support(AMX_FLAGS, "AVX512").reason


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 amx_bf16\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_is_bf16_only_where_native_and_says_why_once(monkeypatch, caplog, native, expected):
    _fake_cpu(monkeypatch, native)
    with caplog.at_level(logging.INFO, logger="pyserini_mores.precision"):
        assert resolve_precision("auto") == expected
        assert resolve_precision("auto") == expected
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"precision auto: {expected} (faked")


def test_explicit_choices_are_honoured_and_emulated_bf16_is_warned_about(monkeypatch, caplog):
    _fake_cpu(monkeypatch, native=False)
    with caplog.at_level(logging.INFO, logger="pyserini_mores.precision"):
        assert resolve_precision("fp32") == "fp32"
        assert resolve_precision("bf16") == "bf16"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "slower than fp32" in warnings[0], warnings
    _fake_cpu(monkeypatch, native=True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyserini_mores.precision"):
        assert resolve_precision("bf16") == "bf16"
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, not 'fp16'"):
        resolve_precision("fp16")


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_rerankers_and_training_default_to_auto(monkeypatch, tiny_maxsim_dir, native, expected):
    import torch

    from pyserini_mores import get_reranker
    from pyserini_mores.train.trainer import TrainingSettings, training_precision

    _fake_cpu(monkeypatch, native)
    assert get_reranker("maxsim", model=str(tiny_maxsim_dir)).precision == expected
    assert training_precision(TrainingSettings.bf16, TrainingSettings.precision, torch.device("cpu")) == expected
    # an explicit --bf16 / --no-bf16 wins over auto
    assert training_precision(True, "auto", "cpu") == "bf16"
    assert training_precision(False, "auto", "cpu") == "fp32"


def test_the_suite_computes_auto_in_fp32_on_every_cpu():
    """conftest's stand-in answers here, on any CPU: without it the exactness tests would run in bf16 on AMX and
    AVX512-BF16 machines and fail there."""
    assert "test suite" in precision.cpu_bf16_support().reason
    assert resolve_precision("auto") == "fp32"


@pytest.mark.real_cpu_precision
def test_this_machine_answers():
    """The real probe runs on whatever CPU this is and gives a reason a user can read."""
    support = precision.bf16_support("cpu")
    assert isinstance(support.native, bool) and "CPU" in support.reason
    assert "test suite" not in support.reason, "the suite's fp32 stand-in answered instead of the real probe"


@pytest.mark.parametrize("native, expected", [(True, ["bf16"]), (False, ["fp32"])])
def test_the_benchmark_measures_the_auto_precision_by_default(monkeypatch, native, expected):
    import argparse

    from pyserini_mores.bench.__main__ import config_from_args, define_bench_args

    _fake_cpu(monkeypatch, native)
    parser = argparse.ArgumentParser()
    define_bench_args(parser)
    assert config_from_args(parser.parse_args(["--device", "cpu"])).precisions == expected
    assert config_from_args(parser.parse_args(["--device", "cpu", "--precision", "both"])).precisions == ["fp32",
                                                                                                         "bf16"]
