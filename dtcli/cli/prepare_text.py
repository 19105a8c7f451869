"""`dtcli prepare-text`: text tokenized into the shards `data.source: tokens` streams."""

from __future__ import annotations

import typer


def prepare_text(
    source: str = typer.Argument(
        ..., help="A text file, a folder or a glob of them, or tfds:NAME (a TFDS text data set)."
    ),
    out: str = typer.Option(..., "--out", help="A new (or empty) folder for the shards."),
    tokenizer: str = typer.Option(
        "bytes",
        "--tokenizer",
        help="bytes, bpe:N (a byte-level BPE of N ids trained on the training split), or a "
        "tokenizer.json (or a folder holding one: a hub model's, a run's).",
    ),
    eval_fraction: float = typer.Option(
        0.1, "--eval-fraction", help="Files: the last part of their bytes kept for evaluation."
    ),
    shard_tokens: int = typer.Option(1 << 20, "--shard-tokens", help="Token ids per shard."),
    train_split: str = typer.Option("train", "--train-split", help="tfds: the training split."),
    eval_split: str = typer.Option("test", "--eval-split", help="tfds: the evaluation split."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="tfds: its data folder."),
    download: bool = typer.Option(False, "--download", help="tfds: download and prepare it."),
) -> None:
    """Tokenize text into the binary shards `data.source: tokens` streams (never all in memory).
    A failure, Ctrl-C (exit 130) or SIGTERM (exit 143) leaves nothing of --out behind."""
    from dtcli.data import prepare

    tfds = prepare.TfdsOptions(train_split, eval_split, data_dir, download)
    index = prepare.prepare_text(source, tokenizer, out, eval_fraction, shard_tokens, tfds)
    for split, info in index["splits"].items():
        per = info["bytes"] / max(info["tokens"], 1)
        docs, shards = info["documents"], len(info["shards"])
        print(
            f"{split}: {info['tokens']:,} tokens ({per:.2f} bytes each) of {docs:,} "
            f"document{'s' * (docs != 1)} in {shards:,} shard{'s' * (shards != 1)}"
        )
    print(f"{out}: {index['dtype']} ids of {index['tokenizer']}")
