"""What one `minedraft bench` invocation runs: the presets (--quick, --sweep, --memory-bound),
the list of (mode, k, concurrency) runs they expand to, the order of each round of them
(--rounds), how many prompts a run sends, how each mode's services are started, and the
progress line printed before each run, because a sweep runs for hours."""

from __future__ import annotations

import argparse
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from minedraft import bundled
from minedraft.bench.headline import ONE_CORE_AR
from minedraft.bench.phases import poisson_arrivals
from minedraft.bench.workload import DATA, longest_prompt_tokens
from minedraft.config import RunnerConfig
from minedraft.constants import BENCH_MODES, acceptance_rates_valid
from minedraft.launcher import ServeConfig
from minedraft.service.placement import parse_cpus

MEMORY_BOUND = DATA / "memory_bound"
MEMORY_BOUND_ACCEPTANCE = 0.7
# --sweep: every mode over the range of loads a server sees; psd also at k = 8, where its
# overlap has the most drafting to hide.
SWEEP_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
SWEEP_K = [2, 4, 6]
SWEEP_PSD_K = [2, 4, 6, 8]
# --num-prompts' default: PROMPTS_PER_SLOT x C, so most of a run is steady serving rather than
# the burst it opens with and the tail it ends with (at 2C a run at C = 8 lasted 3-4 s, and
# auto's first decisions, made in the burst, were most of it); never fewer than MIN_PROMPTS:
# at C = 1 or 2 a few prompts last a second or two, which this machine's noise swamps.
PROMPTS_PER_SLOT = 4
MIN_PROMPTS = 16
# KV cache blocks per service when --num-blocks is not given (kv_blocks): room for every
# request of the run, a quarter more, and never fewer than MIN_KV_BLOCKS.
KV_HEADROOM = 1.25
MIN_KV_BLOCKS = 256
PEERS = "peers"          # transformers' rows (peers.py), one entry for the pair at a concurrency
SERVER = "server"        # --server: the running gateway's own mode and k
UNEQUAL = "psd-2xC"


@dataclass(frozen=True)
class RunSpec:
    mode: str
    k: int
    concurrency: int

    @property
    def label(self) -> str:
        what = {PEERS: "transformers", SERVER: "the running gateway"}.get(self.mode, f"{self.mode} k={self.k}")
        return f"{what} C={self.concurrency}"


def apply_presets(args: argparse.Namespace) -> str | None:
    """Expand --quick, --sweep and --memory-bound into the flags they stand for (so the
    stored config says what ran); -> what is wrong with the combination, or None."""
    if args.quick and args.sweep:
        return "--quick and --sweep are two different presets: choose one"
    if args.rate_steps and args.request_rate is not None:
        return "--rate-steps and --request-rate both set the arrival rate: choose one"
    if args.quick:
        args.modes, args.k, args.concurrency = list(BENCH_MODES), [4, 6], [8]
        args.num_prompts = args.num_prompts or 16
    if args.sweep:
        args.modes, args.k, args.psd_k = list(BENCH_MODES), list(SWEEP_K), list(SWEEP_PSD_K)
        args.concurrency = list(SWEEP_CONCURRENCY)
    if args.memory_bound:
        args.target, args.draft = prepare_memory_bound(Path(args.out))
        args.random_weights = True
        if args.synthetic_acceptance is None:
            args.synthetic_acceptance = [MEMORY_BOUND_ACCEPTANCE]
    if args.rate_steps and not poisson_arrivals(args.rate_steps):
        return "the --rate-steps schedule sends no request: raise a rate or lengthen a phase"
    if args.peers and args.random_weights:
        return "--peers runs transformers on the checkpoints: it cannot run with random weights"
    if min([*args.concurrency, *args.k, *(args.psd_k or []), 1 if args.auto_k is None else args.auto_k,
            args.rounds]) < 1:
        return "--concurrency, --k, --psd-k, --auto-k and --rounds must be at least 1"
    if args.num_blocks is not None and args.num_blocks < 1:
        return f"--num-blocks must be at least 1, got {args.num_blocks}"
    if not args.warmup_s >= 0:
        return "--warmup-s is a duration in seconds: 0 or more"
    if args.synthetic_acceptance is not None and not acceptance_rates_valid(args.synthetic_acceptance):
        return f"--synthetic-acceptance: rates must be in [0, 1], got {args.synthetic_acceptance}"
    return None


def prepare_memory_bound(out: Path) -> tuple[str, str]:
    """Model directories for the memory-bound stand-in under `out`: the shipped config.json of
    each (weights are drawn at random) and, for the target, the bundled tokenizer the gateway
    encodes prompts with. Its vocabulary (3072) is smaller than the stand-in's (4096): token
    ids above it decode to nothing, which leaves timing, all this pair is for, unchanged."""
    paths = []
    for name in ("target", "draft"):
        directory = out / "memory_bound" / name
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MEMORY_BOUND / name / "config.json", directory / "config.json")
        paths.append(str(directory))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(bundled.TARGET) / name, Path(paths[0]) / name)
    return paths[0], paths[1]


def num_prompts(concurrency: int, args: argparse.Namespace) -> int:
    """--num-prompts, by default max(16, 4C): every request slot refilled three times."""
    return args.num_prompts or max(MIN_PROMPTS, PROMPTS_PER_SLOT * concurrency)


def mode_ks(mode: str, args: argparse.Namespace) -> list[int]:
    """The draft lengths a mode runs at: none for plain decoding, k_max for auto, which picks
    each request's k itself (--auto-k, default the longest draft any fixed setting of the run
    gets: --k and --psd-k, so auto is never capped below a setting it is compared with),
    --psd-k (default --k) for psd."""
    if mode in ("ar", ONE_CORE_AR):
        return [0]
    if mode == "auto":
        return [args.auto_k or max([*args.k, *(args.psd_k or [])])]
    if mode == "psd" and args.psd_k:
        return list(args.psd_k)
    return list(args.k)


def serve_config(mode: str, k: int, concurrency: int, args: argparse.Namespace) -> ServeConfig:
    """A mode's services at concurrency C. Every mode but ar-1core computes on --all-cpus:
    ar's verifier and sd-colocated's two services on all of them, the others' verifier and
    drafter on a core each (the defaults, 0 and 1)."""
    base = dict(k=k, port=0, data_plane=args.data_plane, target=args.target, draft=args.draft,
                synthetic_acceptance=None if args.synthetic_acceptance is None else tuple(args.synthetic_acceptance),
                random_weights=args.random_weights,
                dtype=args.dtype, target_device=args.target_device, draft_device=args.draft_device,
                num_blocks=kv_blocks(concurrency, k, args), http_port=0)    # the bench speaks gRPC only
    all_cpus = args.all_cpus
    all_threads = max(1, len(parse_cpus(all_cpus)))
    if mode == "psd":
        return ServeConfig(mode="psd", max_batch=max(1, concurrency // 2), **base)
    if mode == "auto":
        # Cores as psd's; the launcher lends the drafter's to the verifier while auto decodes plainly.
        return ServeConfig(mode="auto", max_batch=concurrency, **base)
    if mode == "ar":
        return ServeConfig(mode="ar", max_batch=concurrency, target_cpus=all_cpus, target_threads=all_threads, **base)
    if mode == ONE_CORE_AR:
        return ServeConfig(mode="ar", max_batch=concurrency, **base)
    if mode == "sd-colocated":
        return ServeConfig(mode="sd", max_batch=concurrency, target_cpus=all_cpus, draft_cpus=all_cpus,
                           target_threads=all_threads, draft_threads=all_threads, **base)
    return ServeConfig(mode=mode, max_batch=concurrency, **base)


def kv_blocks(concurrency: int, k: int, args: argparse.Namespace) -> int:
    """KV cache blocks per service: --num-blocks, else room for `concurrency` requests of the
    dataset's longest prompt (in the target's tokens), --max-tokens, a verify of k + 1 and the
    step plain decoding keeps in flight past the end, KV_HEADROOM times over. The services'
    own default (4096) gives the memory-bound stand-in's target a 5 GiB cache: a --paired
    run starts every setting's services at once, and four of them took the host's memory
    (the kernel killed an idle cluster's verifier)."""
    if args.num_blocks:
        return args.num_blocks
    block = RunnerConfig.block_size
    per_request = math.ceil((longest_prompt_tokens(args.dataset, args.target) + args.max_tokens + k + 2) / block)
    return max(MIN_KV_BLOCKS, math.ceil(KV_HEADROOM * concurrency * per_request))


def run_list(args: argparse.Namespace) -> list[RunSpec]:
    """Every run, in the order they are made: per concurrency, each mode at each of its k."""
    specs = []
    for concurrency in args.concurrency:
        if args.server:
            specs.append(RunSpec(SERVER, 0, concurrency))
        else:
            specs += [RunSpec(mode, k, concurrency) for mode in args.modes for k in mode_ks(mode, args)]
            if args.unequal and "psd" in args.modes:
                specs += [RunSpec(UNEQUAL, k, concurrency) for k in mode_ks("psd", args)]
        if args.peers:
            specs.append(RunSpec(PEERS, 0, concurrency))
    return specs


def round_order(specs: list[RunSpec], index: int, rounds: int) -> list[RunSpec]:
    """The runs of round `index` (from 0) of `rounds`: every spec once, the modes spread over
    the round (`spread_modes`). Odd rounds run the previous round's order backwards, so over a
    pair of rounds a slow drift of the machine's speed weighs on every spec alike; each pair
    starts a further len/pairs specs along the list, so no spec always runs first."""
    if not specs:
        return []
    pairs = (rounds + 1) // 2
    spread = spread_modes(specs)
    shift = index // 2 * max(1, len(spread) // pairs) % len(spread)
    order = spread[shift:] + spread[:shift]
    return order[::-1] if index % 2 else order


def spread_modes(specs: list[RunSpec]) -> list[RunSpec]:
    """The specs with each mode's runs spread evenly over the list (its j-th of n at (j + 1/2)
    / n of the way), not one after the other: run together, a mode's settings shared whatever
    the machine's speed was for those minutes (a sweep's round 1 had sd at 44-67 tok/s and psd
    at 81-91 at C = 1, round 2 sd at 64-78 and psd at 65-76), and the best of a mode's
    settings stood for a fast spell, not the mode. A mode of one run lands mid-round."""
    by_mode: dict[str, list[RunSpec]] = {}
    for spec in specs:
        by_mode.setdefault(spec.mode, []).append(spec)
    placed = [((j + 0.5) / len(runs), m, spec)
              for m, runs in enumerate(by_mode.values()) for j, spec in enumerate(runs)]
    return [spec for *_, spec in sorted(placed, key=lambda p: p[:2])]


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(done: int, total: int, elapsed_s: float, label: str) -> str:
    """"[3/84] psd k=4 C=16 | elapsed 5m12s, ETA 2h25m": the ETA assumes the runs left take
    as long as the mean of those done (later ones, at higher concurrency, take longer)."""
    eta = f"ETA {_duration(elapsed_s / done * (total - done))}" if done else "ETA -"
    return f"[{done + 1}/{total}] {label} | elapsed {_duration(elapsed_s)}, {eta}"


class Progress:
    """Prints progress_line before each run, naming its round where there is more than one."""

    def __init__(self, total: int, rounds: int = 1) -> None:
        self.total, self.rounds, self.done, self.started = total, rounds, 0, time.perf_counter()

    def begin(self, spec: RunSpec, index: int = 0) -> None:
        label = f"round {index + 1}/{self.rounds}: {spec.label}" if self.rounds > 1 else spec.label
        print(progress_line(self.done, self.total, time.perf_counter() - self.started, label), flush=True)

    def end(self) -> None:
        self.done += 1

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started
