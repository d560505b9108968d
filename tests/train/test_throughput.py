"""Observability (issue 25): tokens/s, MFU and memory in every train record, the profiler trace."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.model.flops import training_flops_per_token
from epochal.train.observe.metrics import read_metrics
from epochal.train.observe.throughput import ThroughputMeter, peak_tflops
from tests.train.test_trainer import trainer


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_cpu_records_carry_throughput_and_process_memory_but_no_mfu(tmp_path):
    tr = trainer(tmp_path)
    result = tr.train()
    records = _train_records(tmp_path)
    assert len(records) == 4
    flops = training_flops_per_token(tr.model_config, tr.config.data.seq_length)
    for r in records:
        assert r["tokens_per_s"] > 0
        assert r["tflops"] == pytest.approx(r["tokens_per_s"] * flops / 1e12)
        assert 0 < r["mem_peak_rss_gib"] < 1024
        assert 0 < r["mem_peak_rss_pct"] <= 100
        assert "mfu" not in r  # no known peak on the CPU
    assert result.mfu is None
    assert result.hardware.startswith("cpu") and "fp32" in result.hardware
    assert "sdpa" in result.hardware
    assert "peak RSS" in result.utilization


def test_mfu_against_a_configured_peak(tmp_path):
    tr = trainer(tmp_path, "--logging.peak_tflops=0.5", "--training.attention_backend=math")
    result = tr.train()
    flops = training_flops_per_token(tr.model_config, tr.config.data.seq_length)
    for r in _train_records(tmp_path):
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * flops / 0.5e12)
    assert result.mfu == pytest.approx(result.tokens_per_s * flops / 0.5e12)
    assert "MFU" in result.utilization and "peak 0.5 TFLOP/s" in result.hardware
    assert "sdpa[math]" in result.hardware


def test_mfu_is_per_device_and_the_gpu_table_is_used_by_name(monkeypatch):
    meter = ThroughputMeter.__new__(ThroughputMeter)
    meter.flops_per_token, meter.peak_tflops, meter.num_devices = 1e9, 100.0, 4
    assert meter.mfu(4e5) == pytest.approx(1e5 * 1e9 / 100e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    assert peak_tflops(torch.device("cuda", 0)) == 989.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 PCIe")
    assert peak_tflops(torch.device("cuda", 0)) == 756.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100-SXM4-80GB")
    assert peak_tflops(torch.device("cuda", 0)) == 312.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Some Future GPU")
    assert peak_tflops(torch.device("cuda", 0)) is None
    assert peak_tflops(torch.device("cuda", 0), 123.0) == 123.0
    assert peak_tflops(torch.device("cpu")) is None


def test_profile_steps_write_a_chrome_trace_of_those_steps_only(tmp_path):
    result = trainer(tmp_path, "--logging.profile_steps=[2, 3]").train()
    traces = sorted((tmp_path / "profile").glob("*.json"))
    assert [p.name for p in traces] == ["trace_steps_2-3.json"]
    assert result.profile_files == traces
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 2  # two optimizer steps recorded, not the others
    names = {e.get("name", "") for e in events}
    # the model's matrix products (canonical units run them as batched products)
    assert any(n in ("aten::mm", "aten::addmm", "aten::bmm") for n in names)
    assert not list((tmp_path / "profile").glob("*.pickle"))  # memory snapshots: CUDA only


def test_profile_steps_option_is_checked(tmp_path):
    from epochal.model import ConfigError

    for bad in ("[0, 2]", "[3, 2]", "[1]"):
        with pytest.raises(ConfigError, match="logging.profile_steps"):
            trainer(tmp_path, f"--logging.profile_steps={bad}")
