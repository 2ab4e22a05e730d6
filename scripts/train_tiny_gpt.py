"""Train chapter 09's GPT for longer, from a fixed seed, and save a small float16 checkpoint.

    PYTHONPATH=solutions python scripts/train_tiny_gpt.py    # 5000 steps, about 10 min on one core

The model and the recipe are the chapter's (3 layers of 4 heads, width 96, RoPE, windows of 65
characters of Shakespeare, :func:`attnkit.text.shakespeare_corpus`, AdamW with a one-cycle
schedule, gradients clipped to 1), only trained for more steps. The text ships with the package,
so every Python reads the same characters; the run uses one thread and fixed seeds, so the same
torch and machine type give the same weights. Writes, under ``--out`` (default
``solutions/attnkit/data/tiny_gpt``, shipped with the package so that every install has it):

* ``checkpoint.pt``: the state dict in float16 (the read-out is tied to the embedding and stored
  once), under 1 MB;
* ``config.json``: the model and training settings, the tokenizer's characters (the checkpoint's
  own tokenizer: ``CharTokenizer("".join(config["chars"]))``), the Python and torch versions, and the validation bits per character *of the saved float16 weights*, scored as
  the chapter scores its model (:func:`attnkit.gpt.windowed_bits_per_char`);
* ``train.log``: the training and validation loss along the way.

Chapter 09 loads the checkpoint (:func:`attnkit.gpt.load_tiny_gpt`), recomputes that validation
loss and asserts it on every Python, and samples from it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from attnkit.gpt import GPT, TINY_GPT_PATH, language_model_loss, windowed_bits_per_char
from attnkit.text import CharTokenizer, shakespeare_corpus

MODEL = dict(embed_dim=96, num_heads=4, num_layers=3, position="rope", dropout=0.0)
CONTEXT, MIN_CONTEXT, BATCH, LR, SEED = 64, 32, 32, 1e-2, 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)  # the committed checkpoint
    parser.add_argument("--out", type=Path, default=TINY_GPT_PATH)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    train_text, val_text, _ = shakespeare_corpus()
    tokenizer = CharTokenizer(train_text + val_text)
    train_ids, val_ids = tokenizer.encode(train_text), tokenizer.encode(val_text)
    V = len(tokenizer)
    val_rows = torch.linspace(0, len(val_ids) - CONTEXT - 2, 256).long()[:, None] + torch.arange(CONTEXT + 1)
    val_batch = val_ids[val_rows]  # (256, CONTEXT + 1): the chapter's curve windows

    torch.manual_seed(SEED)
    data_gen = torch.Generator().manual_seed(SEED)
    model = GPT(V, max_len=CONTEXT + 1, **MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LR, total_steps=args.steps, pct_start=0.1)
    log, recent, start = [], [], time.perf_counter()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train_ids) - CONTEXT - 1, (BATCH,), generator=data_gen)
        batch = train_ids[starts[:, None] + torch.arange(CONTEXT + 1)]  # (BATCH, CONTEXT + 1)
        loss = language_model_loss(model(batch)[0], batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        recent.append(loss.item() / math.log(2))
        if step % 250 == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                val = language_model_loss(model(val_batch)[0], val_batch).item() / math.log(2)
            model.train()
            line = (f"step {step:5d}  train {sum(recent) / len(recent):.3f}  validation windows {val:.3f} "
                    f"bits/char  {time.perf_counter() - start:.0f} s")
            print(line, flush=True)
            log.append(line)
            recent = []

    state = {k: v.half() for k, v in model.state_dict().items() if k != "readout.weight"}  # tied
    torch.save(state, args.out / "checkpoint.pt")
    saved = load(args.out, {"vocab_size": V, "max_len": CONTEXT + 1, **MODEL})  # as the chapter sees it
    bits, end = windowed_bits_per_char(saved, val_ids, CONTEXT, MIN_CONTEXT)
    config = {
        "model": {"vocab_size": V, "max_len": CONTEXT + 1, **MODEL},
        "training": {"steps": args.steps, "batch": BATCH, "context": CONTEXT, "lr": LR, "seed": SEED,
                     "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0.01), OneCycleLR(pct_start=0.1), "
                                  "clip_grad_norm 1.0, 1 thread"},
        "chars": tokenizer.chars,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "validation_bits_per_char": bits,
        "text": "attnkit.text.shakespeare_corpus(): every 10th work held out for validation",
        "scored": f"windowed_bits_per_char(model, val_ids, {CONTEXT}, {MIN_CONTEXT}): characters "
                  f"{MIN_CONTEXT}..{end - 1} of the validation text",
        "train_seconds": round(time.perf_counter() - start),
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    log.append(f"saved float16 weights: {bits:.4f} bits/char on the validation characters "
               f"{MIN_CONTEXT}..{end - 1} (Python {config['python']}, torch {config['torch']})")
    (args.out / "train.log").write_text("\n".join(log) + "\n")
    print(log[-1])
    print(f"{(args.out / 'checkpoint.pt').stat().st_size / 1e6:.2f} MB written to {args.out}", file=sys.stderr)


def load_tokenizer(folder: Path) -> CharTokenizer:
    """The checkpoint's own tokenizer, rebuilt from the characters ``folder/config.json`` lists."""
    return CharTokenizer("".join(json.loads((folder / "config.json").read_text())["chars"]))


def load(folder: Path, settings: dict | None = None) -> GPT:
    """The checkpoint in ``folder`` as a float32 :class:`GPT` in eval mode (``settings``: the model's
    constructor arguments, by default those of ``folder/config.json``)."""
    settings = settings or json.loads((folder / "config.json").read_text())["model"]
    model = GPT(**settings)
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing != ["readout.weight"] or unexpected:  # the read-out is the embedding, tied
        raise ValueError(f"checkpoint does not fit the model: missing {missing}, unexpected {unexpected}")
    return model.eval()


if __name__ == "__main__":
    main()
