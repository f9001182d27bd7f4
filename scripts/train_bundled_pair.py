"""Train the bundled target/draft pair on the Python standard library's source.

Writes two Hugging Face-format directories (config.json, model.safetensors in
bfloat16, tokenizer files) under ``minedraft/bundled/``. The draft is distilled
from the target (KL(target || draft) on the same batches): what speculative
decoding needs is agreement with the target, not quality of its own.

Run: python scripts/train_bundled_pair.py  (about 40 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

EOS = "<|endoftext|>"
PAD = "<|pad|>"
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}

TARGET_SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=64, intermediate_size=1024)
DRAFT_SHAPE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, intermediate_size=768)


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """Stdlib source files without tests, split 95/5 into train and held-out by file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not (set(p.relative_to(root).parts[:-1]) & EXCLUDED_DIRS)
        and not p.name.startswith("test_")
    )
    held_out = [p for i, p in enumerate(files) if i % 20 == 7]
    train = [p for i, p in enumerate(files) if i % 20 != 7]
    return train, held_out


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def make_config(shape: dict, vocab_size: int, eos_id: int, pad_id: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size, max_position_embeddings=2048, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id,
        pad_token_id=pad_id, rms_norm_eps=1e-6, attention_dropout=0.0, **shape,
    )


def batches(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        yield torch.stack([stream[s:s + seq] for s in starts.tolist()])


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def held_out_loss(model, windows: torch.Tensor) -> float:
    model.eval()
    losses = [model(w[None], labels=w[None]).loss.item() for w in windows]
    model.train()
    return sum(losses) / len(losses)


def train(name, model, teacher, stream, args, gen) -> dict:
    steps = args.target_steps if teacher is None else args.draft_steps
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    start = time.time()
    data = batches(stream, args.batch, args.seq, gen)
    loss_value = float("nan")
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, args.lr, warmup=50)
        ids = next(data)
        if teacher is None:
            loss = model(ids, labels=ids).loss
        else:
            with torch.no_grad():
                target_logp = F.log_softmax(teacher(ids).logits.float(), dim=-1)
            draft_logp = F.log_softmax(model(ids).logits.float(), dim=-1)
            loss = F.kl_div(draft_logp, target_logp, log_target=True, reduction="none").sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        if step % 20 == 0 or step == steps - 1:
            elapsed = time.time() - start
            eta = elapsed / (step + 1) * (steps - step - 1)
            print(f"[{name}] step {step + 1}/{steps} loss {loss_value:.3f} "
                  f"elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min", flush=True)
    return {"steps": steps, "final_train_loss": round(loss_value, 4),
            "train_minutes": round((time.time() - start) / 60, 1)}


def save(model, hf_tok: PreTrainedTokenizerFast, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # Shards of at most 12 MB: each file stays small enough for the repository.
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="12MB")
    hf_tok.save_pretrained(out)
    model.to(torch.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "minedraft" / "bundled")
    parser.add_argument("--vocab-size", type=int, default=3072)
    parser.add_argument("--target-steps", type=int, default=800)
    parser.add_argument("--draft-steps", type=int, default=700)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()

    train_files, held_out_files = stdlib_files()
    train_texts = [read(p) for p in train_files]
    held_out_texts = [read(p) for p in held_out_files]
    print(f"corpus: {len(train_files)} train files, {len(held_out_files)} held-out files", flush=True)

    tok = train_tokenizer(train_texts, args.vocab_size)
    eos_id, pad_id = tok.token_to_id(EOS), tok.token_to_id(PAD)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                     bos_token=EOS, unk_token=None, model_max_length=2048)
    train_stream = encode_stream(tok, train_texts)
    held_stream = encode_stream(tok, held_out_texts)
    print(f"tokens: {len(train_stream)} train, {len(held_stream)} held-out "
          f"({time.time() - t0:.0f} s)", flush=True)
    eval_gen = torch.Generator().manual_seed(1234)
    eval_windows = next(batches(held_stream, 48, args.seq, eval_gen))

    target = Qwen3ForCausalLM(make_config(TARGET_SHAPE, args.vocab_size, eos_id, pad_id))
    target_stats = train("target", target, None, train_stream, args, gen)
    target_stats["held_out_loss"] = round(held_out_loss(target, eval_windows), 4)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    draft = Qwen3ForCausalLM(make_config(DRAFT_SHAPE, args.vocab_size, eos_id, pad_id))
    draft_stats = train("draft", draft, target, train_stream, args, gen)
    draft_stats["held_out_loss"] = round(held_out_loss(draft, eval_windows), 4)

    save(target, hf_tok, args.out / "target")
    save(draft, hf_tok, args.out / "draft")
    report = {
        "corpus": "Python %s standard library source (.py), test directories excluded; "
                  "every 20th file held out" % sysconfig.get_python_version(),
        "train_files": len(train_files), "held_out_files": len(held_out_files),
        "train_tokens": len(train_stream), "held_out_tokens": len(held_stream),
        "vocab_size": args.vocab_size, "batch": args.batch, "seq": args.seq, "lr": args.lr,
        "target": {"shape": TARGET_SHAPE, "params": sum(p.numel() for p in target.parameters()), **target_stats},
        "draft": {"shape": DRAFT_SHAPE, "params": sum(p.numel() for p in draft.parameters()),
                  "objective": "KL(target || draft) on the target's training batches", **draft_stats},
        "total_minutes": round((time.time() - t0) / 60, 1),
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
