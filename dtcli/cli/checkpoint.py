"""The commands that read a checkpoint: `dtcli eval`, `dtcli generate`, `dtcli score` and
`dtcli export`; and `dtcli import-hf`, which writes one."""

from __future__ import annotations

import sys
from typing import Any

import typer

from dtcli.cli.options import (
    DevicesOption,
    MeshOption,
    NoStatusOption,
    SetOption,
    console,
    overrides,
)

# `dtcli eval --tasks`: lm-evaluation-harness's options, as its own CLI means them.
TasksOption = typer.Option(
    None,
    "--tasks",
    help="lm-evaluation-harness tasks, comma-separated (a language model's run), instead of "
    "the split's loss: the table printed, lm-eval's results file into RUN_DIR/lm_eval/.",
)
IncludePathOption = typer.Option(
    None, "--include-path", help="--tasks: a folder of task YAML files of your own."
)
LimitOption = typer.Option(
    None, "--limit", help="--tasks: N examples per task (or a fraction of each, below 1)."
)
NumFewshotOption = typer.Option(
    None, "--num-fewshot", help="--tasks: K examples before each (default: the task's)."
)
SeedOption = typer.Option(
    None,
    "--seed",
    help="--tasks: lm-eval's seeds (Python, NumPy, torch, few-shot): one for all, or four "
    "(default 0,1234,1234,1234).",
)
LogSamplesOption = typer.Option(
    False, "--log-samples", help="--tasks: also write every request and answer (JSON Lines)."
)
ChatTemplateTasksOption = typer.Option(
    False, "--apply-chat-template", help="--tasks: each request in the run's chat template."
)
OutputPathOption = typer.Option(
    None,
    "--output-path",
    help="--tasks: the results into this folder (a folder per model in it) or this .json "
    "file's name (with the date), instead of RUN_DIR/lm_eval/.",
)


def eval_(
    checkpoint: str = typer.Argument(
        ..., help="A run directory (its latest checkpoint) or one checkpoint folder."
    ),
    split: str | None = typer.Option(None, "--split", help="eval (the default) or train."),
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    batch_size: int | None = typer.Option(None, "--batch-size", help="Evaluation batch size."),
    sets: list[str] | None = SetOption,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object on the last line (--tasks: lm-eval's results).",
    ),
    no_progress: bool = typer.Option(
        False,
        "--no-progress",
        help="Into a pipe or a file, no line every 10 s while it restores, compiles and evaluates.",
    ),
    tasks: str | None = TasksOption,
    include_path: str | None = IncludePathOption,
    limit: float | None = LimitOption,
    num_fewshot: int | None = NumFewshotOption,
    seed: str | None = SeedOption,
    log_samples: bool = LogSamplesOption,
    apply_chat_template: bool = ChatTemplateTasksOption,
    output_path: str | None = OutputPathOption,
) -> None:
    """Evaluate a checkpoint, on the mesh it was trained on or another one: its loss and
    accuracy, or a language model's lm-evaluation-harness tasks (--tasks)."""
    from dtcli import evaluate as evaluate_lib

    o = overrides(sets, mesh, devices)
    if tasks is None:
        evaluate_lib.refuse_task_options(
            {
                "--include-path": include_path,
                "--limit": limit,
                "--num-fewshot": num_fewshot,
                "--seed": seed,
                "--log-samples": log_samples,
                "--apply-chat-template": apply_chat_template,
                "--output-path": output_path,
            }
        )
        result = evaluate_lib.evaluate_path(
            checkpoint, split or "eval", o, batch_size, progress=not no_progress
        )
        if as_json:
            import json

            print(json.dumps(result))
            return
        evaluate_lib.render(result, console())
        return
    options = evaluate_lib.task_options(
        tasks, include_path, limit, num_fewshot, batch_size, seed, log_samples, apply_chat_template
    )
    _eval_tasks(checkpoint, options, o, output_path, split, as_json, not no_progress)


def _eval_tasks(
    checkpoint: str,
    options: Any,
    o: Any,
    output_path: str | None,
    split: str | None,
    as_json: bool,
    progress: bool,
) -> None:
    """--tasks: lm-eval's table (or its results, --json) on stdout, then its files written and
    where they went on stderr."""
    from dtcli import evaluate as evaluate_lib
    from dtcli import harness

    found = evaluate_lib.evaluate_tasks(checkpoint, options, o, output_path, progress, split)
    print(evaluate_lib.results_json(found) if as_json else harness.table(found.results))
    for line in evaluate_lib.write_task_results(found, output_path):
        print(line, file=sys.stderr)


ChatOption = typer.Option(
    False,
    "--chat",
    help="Each prompt is a user message in the run's chat template; print the answer only, "
    "ending at the template's end of turn. --prompts FILE.jsonl: instruction records.",
)
ChatTemplateOption = typer.Option(
    None,
    "--chat-template",
    help="With --chat: plain, alpaca, chatml, llama3 or a Jinja file, instead of the run's.",
)
JsonLinesOption = typer.Option(
    False,
    "--json",
    help='One JSON object a line per prompt: {"prompt", "text", "tokens", "stopped"}.',
)


def generate(
    checkpoint: str = typer.Argument(
        ..., help="A language model's run directory (its latest checkpoint) or one checkpoint."
    ),
    prompt: list[str] | None = typer.Option(
        None,
        "--prompt",
        help="The text to continue (default: a newline); repeat it for several prompts, "
        "generated together.",
    ),
    prompts_file: str | None = typer.Option(
        None, "--prompts", help="A file of prompts, one a line (blank lines skipped)."
    ),
    tokens: int = typer.Option(200, "--tokens", help="How many new tokens per prompt."),
    temperature: float = typer.Option(
        1.0, "--temperature", help="Softmax temperature; 0: greedy (the most likely token)."
    ),
    top_k: int | None = typer.Option(None, "--top-k", help="Sample among the K most likely."),
    top_p: float | None = typer.Option(
        None,
        "--top-p",
        help="Sample among the fewest most likely tokens whose probabilities add up to P "
        "(nucleus; 0 < P <= 1).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling (same seed, same text)."),
    no_cache: bool = typer.Option(
        False,
        "--no-cache",
        help="Run the whole window for every token instead of the KV cache (same greedy text; "
        "for comparison and debugging).",
    ),
    chat: bool = ChatOption,
    chat_template: str | None = ChatTemplateOption,
    as_json: bool = JsonLinesOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    sets: list[str] | None = SetOption,
    no_progress: bool = NoStatusOption,
) -> None:
    """Generate text from a language model checkpoint: the new text on stdout (a block per
    prompt when there are several), tokens/s on stderr."""
    from dtcli import generate as generate_lib

    prompts = generate_lib.command_prompts(prompt, prompts_file, chat, chat_template)
    settings = generate_lib.Settings(tokens, temperature, top_k, top_p, seed, not no_cache)
    generate_lib.check_options(settings)  # before the model is built
    generator = generate_lib.Generator(
        checkpoint,
        mesh,
        devices,
        sets=tuple(sets or ()),
        progress=not no_progress,
        chat=chat,
        chat_template=chat_template,
    )
    write = generate_lib.write_json if as_json else generate_lib.write
    write(generator, prompts, settings, sys.stdout, sys.stderr)


def export(
    checkpoint: str = typer.Argument(..., help="A run directory or one checkpoint folder."),
    out: str = typer.Option(..., "--out", help="A folder for the export (new or empty)."),
    format: str = typer.Option(
        "savedmodel",
        "--format",
        help="savedmodel (plain tensors on one device), hf (a Hugging Face model folder: "
        "config.json, model.safetensors, the tokenizer) or peft (a LoRA run's adapters: "
        "adapter_config.json, adapter_model.safetensors).",
    ),
    merge: bool = typer.Option(
        False,
        "--merge",
        help="hf of a LoRA run: the adapters folded into the base's weights, in its dtype.",
    ),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="hf: float32, bfloat16 or float16 (default: the imported model's, else float32).",
    ),
    max_shard_size: str | None = typer.Option(
        None, "--max-shard-size", help="hf: shard the weights above this size (default 5GB)."
    ),
) -> None:
    """Export a checkpoint as a SavedModel serving plain tensors on one device, as a Hugging
    Face model folder (--format hf; a LoRA run's with --merge), or a LoRA run's adapters as a
    peft adapter folder (--format peft)."""
    from dtcli import export as export_lib

    print(export_lib.export_path(checkpoint, out, format, dtype, max_shard_size, merge))


def score(
    checkpoint: str = typer.Argument(
        ..., help="A language model's run directory (its latest checkpoint) or one checkpoint."
    ),
    text: str | None = typer.Option(None, "--text", help="The text to score."),
    file: str | None = typer.Option(None, "--file", help="A UTF-8 text file to score, whole."),
    stride: int | None = typer.Option(
        None,
        "--stride",
        help="A text longer than the context: the sliding window advances this many tokens "
        "(1 to the context; default context // 2: each token sees at least half a context).",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print one JSON object: {"tokens", "logprobs", "sum", "count", "perplexity", '
        '"bits_per_byte"}.',
    ),
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    sets: list[str] | None = SetOption,
    no_progress: bool = NoStatusOption,
) -> None:
    """Score a text under a language model checkpoint: each token's log probability given the
    tokens before it, their sum, the perplexity and the bits per byte."""
    from dtcli import score as score_lib

    found = score_lib.read_text(text, file)
    result = score_lib.score_path(
        checkpoint, found, stride, overrides(sets, mesh, devices), progress=not no_progress
    )
    if as_json:
        print(score_lib.as_json(result))
        return
    score_lib.render(result, console())


def import_hf(
    hf_dir: str = typer.Argument(
        ..., help="A Hugging Face model folder: config.json, model.safetensors, tokenizer.json."
    ),
    out: str = typer.Option(..., "--out", help="The run directory to write (new or empty)."),
    context: int | None = typer.Option(
        None, "--context", help="The window to train and generate (default: the model's)."
    ),
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    sets: list[str] | None = SetOption,
    no_progress: bool = NoStatusOption,
) -> None:
    """Import a Hugging Face GPT-2 or Llama model folder as a run directory (its weights as the
    step-0 checkpoint) that eval, generate, score, export and plan read, on any mesh."""
    from dtcli import import_hf as import_lib

    print(
        import_lib.import_hf(
            hf_dir, out, context, overrides(sets, mesh, devices), progress=not no_progress
        )
    )
