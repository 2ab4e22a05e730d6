"""Chapter 09's second act: the command that trains its checkpoint runs as its docstring says, and writes
what the chapter loads (a float16 state dict under 1 MB, its config and its log).

The command is taken from the script's own docstring; only ``--steps`` and ``--out`` are added, so the run
takes seconds instead of the checkpoint's ten minutes or so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.gpt import GPT

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "train_tiny_gpt.py"
pytestmark = pytest.mark.slow


def documented_command() -> list[str]:
    doc = SCRIPT.read_text().split('"""')[1]
    line = next(line.strip() for line in doc.splitlines() if "scripts/train_tiny_gpt.py" in line)
    words = shlex.split(line.split("#")[0])
    env = [w for w in words if re.fullmatch(r"\w+=\S*", w)]
    assert env == ["PYTHONPATH=solutions"] and words[len(env)] == "python", words
    return words[len(env) + 1:]


def test_the_documented_command_writes_what_chapter_09_loads(tmp_path):
    out = tmp_path / "tiny_gpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "solutions")}
    proc = subprocess.run([sys.executable, *documented_command(), "--steps", "3", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert {"model", "training", "chars", "python", "validation_bits_per_char"} <= set(config)
    assert config["training"]["steps"] == 3 and 0 < config["validation_bits_per_char"] < 8
    assert (out / "checkpoint.pt").stat().st_size < 1 << 20 and (out / "train.log").read_text().strip()
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert {v.dtype for v in state.values()} == {torch.float16}
    missing, unexpected = GPT(**config["model"]).load_state_dict({k: v.float() for k, v in state.items()},
                                                                strict=False)
    assert missing == ["readout.weight"] and not unexpected  # tied to the embedding, stored once
    from attnkit.text import CharTokenizer, shakespeare_corpus
    train, val, _ = shakespeare_corpus()
    assert config["chars"] == CharTokenizer(train + val).chars  # the shipped text, whatever the Python
