"""The recipe's keys: frozen dataclasses, their defaults, and what each key means.

This is the reference for a recipe file: `Recipe` is the top level, each `*Config` one section.
Types are checked by dtcli.recipe.typed, rules between keys by dtcli.recipe.checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dtcli.recipe.trackers import TrackerConfig

# Sources read through tf.data, never held whole in memory.
STREAMED_SOURCES = ("tfds", "tfrecord", "images", "tokens", "jsonl")
# The sources of language-model tokens (task language_model), each with a data.tokenizer.
TEXT_SOURCES = ("text", "tokens", "jsonl")
# data.source text: byte-level tokens, one per byte.
BYTE_VOCAB = 256
# data.tokenizer {train: bpe}: the largest vocabulary (a typo guard: 2**20 ids), and the
# smallest (the 256 bytes and the end-of-document token).
MAX_VOCAB = 1 << 20
MIN_BPE_VOCAB = 257


@dataclass(frozen=True)
class TrainTokenizerConfig:
    """data.tokenizer {train: bpe, vocab_size: N}: a byte-level BPE of at most N ids (the
    end-of-document token, the 256 bytes, merges), trained on the training split's text at the
    start of a new run."""

    train: Literal["bpe"] = "bpe"
    vocab_size: int = 1024


@dataclass(frozen=True)
class DataConfig:
    """Where examples come from and how they are batched."""

    source: Literal[
        "embedded", "tfds", "idx", "synthetic", "tfrecord", "images", "text", "tokens", "jsonl"
    ] = "embedded"
    # embedded: the data set's name ("digits"); tfds: the TFDS name ("mnist").
    name: str = "digits"
    # idx: a folder holding MNIST-format IDX files (train-* and/or t10k-*); tfrecord: a glob of
    # training files; images: a folder with one subfolder of images per class.
    path: str | None = None
    # text: a file, a folder (every file in it, sorted, concatenated) or a glob; null: the Python
    # standard library's own source files (a corpus every installation carries).
    # tokens: the folder `dtcli prepare-text` wrote (token shards, index.json, tokenizer.json).
    # jsonl: a JSON Lines file of instruction examples, one a line.
    # tfrecord: a glob of evaluation files; images: a folder of the same class subfolders;
    # text: files to evaluate on (default: the last data.eval_fraction of data.path's bytes);
    # jsonl: a JSON Lines file (default: a fixed data.eval_fraction of data.path's lines).
    eval_path: str | None = None
    # text: the tokens the model sees per window (default: model.transformer.context); each
    # training window starts at any byte (stride 1), evaluation windows do not overlap.
    context: int | None = None
    eval_fraction: float = 0.1
    # text: null or "bytes" (one token per byte, vocabulary 256), a tokenizer.json (or a folder
    # holding one: GPT-2's, Llama's, a run's), or {train: bpe, vocab_size: N} ("bpe:N" for
    # short, read as that). tokens: null (the shards' own tokenizer). A run keeps the tokenizer
    # it used (RUN_DIR/tokenizer.json); the model's vocabulary is its size rounded up to a
    # multiple of 64.
    tokenizer: str | TrainTokenizerConfig | None = None
    # jsonl: the chat template: plain, alpaca, chatml, llama3, or a Jinja template file; null:
    # the chat_template of the tokenizer_config.json beside the tokenizer, else plain.
    chat_template: str | None = None
    # jsonl: only the responses (each assistant turn and its end-of-turn token) are in the loss;
    # false: every token but padding.
    mask_prompt: bool = True
    # jsonl: several examples per window, greedily in file order (x [3, context]: ids,
    # segments, positions; nothing attends or counts positions across an example's edge);
    # false: one example per window, padded.
    packing: bool = False
    # jsonl: an example longer than the context: prompt_start cuts its prompt's start (its end
    # where the responses alone do not fit), end cuts its end, refuse stops with its line.
    truncate: Literal["prompt_start", "end", "refuse"] = "prompt_start"
    # tfrecord: the tf.train.Example features holding the image (bytes) and the class (int64);
    # the image is raw bytes of data.shape in data.dtype, or an encoded PNG/JPEG/GIF/BMP.
    image_key: str = "image"
    label_key: str = "label"
    encoding: Literal["raw", "encoded"] = "raw"
    dtype: Literal["uint8", "float32"] = "uint8"
    # Streamed sources (tfrecord, tfds): records held in the seeded shuffle buffer.
    shuffle_buffer: int = 10_000
    # tfds: split strings, TFDS slicing allowed ("train[:5000]").
    train_split: str = "train"
    eval_split: str = "test"
    data_dir: str | None = None
    download: bool = False
    # idx (and embedded): example index ranges [start, stop) when one file pair serves both.
    train_range: tuple[int, int] | None = None
    eval_range: tuple[int, int] | None = None
    # synthetic: the shape of one example, the class count, the example counts; tfrecord: the
    # shape and classes too; images: [height, width, channels] to decode and resize to.
    shape: tuple[int, ...] = (28, 28, 1)
    classes: int = 10
    count: int = 4096
    eval_count: int = 1024
    # The global batch (all devices together); it must divide by the data axis size.
    batch_size: int = 128
    eval_batch_size: int | None = None
    flatten: bool = True
    shuffle: bool = True
    # In-memory sources (embedded, idx, synthetic): "device" places the training split on the
    # devices once and each step gathers its batch there (no host copy per step); "host"
    # copies each block of batches from the host; "auto" places it when every local device's
    # copy together stays under 1 GiB.
    placement: Literal["auto", "device", "host"] = "auto"


@dataclass(frozen=True)
class LayoutConfig:
    """How tensors are laid out on the mesh."""

    # The mesh axis input batches are sharded along; replicated along the other axes.
    data_axis: str = "batch"
    # Ordered rules: regex over weight paths -> one entry per tensor dim (axis name or unsharded).
    rules: dict[str, list[str]] = field(default_factory=dict)
    # FSDP (ZeRO-3 style): also shard every weight's largest dim that the data axis divides and
    # the rules leave unsharded, on the data axis; each device then holds 1/N of the weights and
    # optimizer state, gathered where a layer uses them.
    fsdp: bool = False


@dataclass(frozen=True)
class RopeScalingConfig:
    """model.transformer.rope_scaling: Llama 3.1's long-context adjustment of RoPE's inverse
    frequencies (Hugging Face's `rope_type: llama3`): wavelengths longer than
    original_context / low_freq_factor are divided by `factor`, those shorter than
    original_context / high_freq_factor kept, the ones between interpolated."""

    type: Literal["llama3"] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # The context the model was pretrained at (Hugging Face's original_max_position_embeddings).
    original_context: int = 8192


@dataclass(frozen=True)
class TransformerConfig:
    """dtcli's decoder-only GPT (dtcli.transformer): its weight paths are documented there."""

    layers: int = 4
    d_model: int = 128
    heads: int = 4
    mlp_ratio: int = 4
    context: int = 64
    dropout: float = 0.0
    # The output head is the token embedding's transpose (no weights of its own).
    tie_embeddings: bool = True
    # Biases in the Dense layers and LayerNorms (nanoGPT's default: none).
    bias: bool = False
    # The MLP: gelu (exact, erf), gelu_tanh (GPT-2's tanh approximation) or swiglu (Llama's:
    # proj(silu(gate(x)) * fc(x)), a third matrix), over a hidden width of mlp_hidden
    # (null: mlp_ratio * d_model).
    activation: Literal["gelu", "gelu_tanh", "swiglu"] = "gelu"
    mlp_hidden: int | None = None
    # The norms: layernorm, or rmsnorm (x * rsqrt(mean(x^2) + eps) * gamma: no mean, no beta).
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    # Positions: a learned table of max_positions rows (null: context), or rope (rotary, the
    # "rotate_half" layout of Hugging Face's Llama; max_positions then only records the
    # source model's limit). `context` may be at most max_positions.
    positions: Literal["learned", "rope"] = "learned"
    rope_theta: float = 10000.0
    rope_scaling: RopeScalingConfig | None = None
    max_positions: int | None = None
    # Key/value heads (null: heads): fewer give grouped-query attention (1: multi-query);
    # query head i uses key/value head i // (heads // kv_heads).
    kv_heads: int | None = None
    # The real vocabulary (an imported model's): the tables get it rounded up to a multiple of
    # 64 and the logits of the ids past it are -inf everywhere. null: the tokenizer's ids
    # rounded up, nothing masked.
    vocab_size: int | None = None
    # Activation checkpointing: keep only each block's input for the backward pass and recompute
    # the block's forward there (less memory, about one more forward pass of time).
    remat: bool = False

    @property
    def hidden(self) -> int:
        """The MLP's hidden width."""
        return self.mlp_ratio * self.d_model if self.mlp_hidden is None else self.mlp_hidden

    @property
    def key_heads(self) -> int:
        """Key/value heads (kv_heads, default heads)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (max_positions, default context)."""
        return self.context if self.max_positions is None else self.max_positions


@dataclass(frozen=True)
class ModelConfig:
    """The model: a tf-keras layer list, build function or transformer, or a Core-API MLP."""

    api: Literal["keras", "core"] = "keras"
    # keras: a list of layers, each `ClassName` or `{ClassName: {arg: value}}`.
    layers: list[Any] | None = None
    # keras: "package.module:function" returning a tf_keras.Model, called with
    # (input_shape, num_classes, **args).
    build: str | None = None
    # The folder `build`'s module is imported from (default: the recipe file's folder, filled in
    # at load so that the resolved recipe in a run directory still finds it).
    build_path: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    # keras: dtcli's GPT for task language_model.
    transformer: TransformerConfig | None = None
    # A Hugging Face model folder (config.json, model.safetensors, tokenizer.json) to start from:
    # model.transformer and data.tokenizer come from it, and a new run's step-0 weights.
    from_hf: str | None = None
    # A dtcli run directory (its newest checkpoint that verifies) or one of its checkpoint
    # folders to start from: the model section, task and data.tokenizer come from the
    # checkpoint's recipe, and a new run's step-0 weights (resolved at load by
    # dtcli.rundir.base: the resolved recipe names the checkpoint folder itself).
    from_run: str | None = None
    # core: hidden layer widths and activation; the output layer has one unit per class.
    hidden: list[int] = field(default_factory=lambda: [128])
    activation: Literal["relu", "tanh", "sigmoid", "gelu"] = "relu"

    @property
    def real_vocab(self) -> int | None:
        """model.transformer.vocab_size: the model's real vocabulary (None: the tokenizer's)."""
        return None if self.transformer is None else self.transformer.vocab_size


@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["sgd", "adam", "adamw"] = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    weight_decay: float = 0.004
    # adamw: weights whose path this regex finds (re.search) are not decayed, e.g. biases and
    # LayerNorm: '(bias|gamma|beta)$'.
    no_decay: str | None = None
    # The learning rate per step: constant, or cosine (linear warmup over warmup_steps, then a
    # cosine decay to min_learning_rate at decay_steps, default the run's last step).
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    decay_steps: int | None = None
    min_learning_rate: float = 0.0
    # Clip the gradients to this global norm (null: no clipping).
    clip_norm: float | None = None


@dataclass(frozen=True)
class LoraConfig:
    """lora: low-rank adapters beside dtcli's GPT's kernels, the base weights frozen
    (docs/fine-tuning.md). A LoRA recipe starts from a base: model.from_hf or model.from_run."""

    # The kernels to adapt: a regex searched (re.search) in each weight path; biases, norm
    # scales and embeddings are never adapted.
    targets: str = r"attention\.(query|value)\.kernel$"
    # The adapters' inner dim r: A [kernel's input dims..., r], B [r, kernel's output dims...].
    rank: int = 8
    # The adapters' output is scaled by alpha / rank.
    alpha: float = 16.0
    # Dropout on the adapters' input only (as peft's lora_dropout).
    dropout: float = 0.0
    # float32, or bf16: the frozen base weights stored in bfloat16 (half their memory); the
    # adapters, their gradients and optimizer state stay float32.
    base_precision: Literal["float32", "bf16"] = "float32"
    # A peft adapter folder (adapter_config.json, adapter_model.safetensors) whose weights are
    # the adapters' step-0 values.
    from_peft: str | None = None


@dataclass(frozen=True)
class EvalTasksConfig:
    """train.eval_tasks: lm-evaluation-harness tasks run on the model at each evaluation of a
    language model, their metrics recorded beside the eval loss as TASK/METRIC
    (docs/language-models.md). Needs the eval extra (lm_eval)."""

    # Task names (or groups) lm-eval knows: its own, or those of the YAMLs under include_path.
    tasks: tuple[str, ...] = ()
    # A folder of task YAMLs (lm-eval's --include_path); a relative path is taken from the
    # working directory, as data.path is, and recorded absolute in the resolved recipe.
    include_path: str | None = None
    # lm-eval's --limit: the first N documents of each task, or below 1 that fraction of them.
    limit: float | None = None
    # lm-eval's --num_fewshot (null: each task's own).
    num_fewshot: int | None = None
    # Requests per forward pass (null: data.eval_batch_size, else data.batch_size), rounded up
    # to a multiple of the data axis.
    batch_size: int | None = None


# The default K of train.steps_per_call, chosen by measurement (bench/throughput.py: on 1 device
# K=16 reached 0.94x the limit loop, K=4 0.69x; on 8 virtual CPUs K=4, 8, 16 were within noise).
STEPS_PER_CALL = 16


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    # Stop each epoch after this many steps (None: one pass over the training data).
    steps_per_epoch: int | None = None
    # Save a checkpoint every N epochs (0: only at the end) and keep the last K. A train.steps
    # run's epochs are its stretches of eval_every steps: every N evaluations.
    checkpoint_every: int = 1
    keep: int = 3
    # Write the per-step training loss to TensorBoard every N steps.
    log_every: int = 10
    # Training steps per compiled call: K batches go to the mesh as one block and the host reads
    # the step results back once per call. Progress, Ctrl-C and mid-epoch saves happen between
    # calls. A loss that is not finite stops the updates inside the call.
    steps_per_call: int = STEPS_PER_CALL
    # Train this many optimizer steps in all instead of whole epochs, evaluating and
    # checkpointing every eval_every steps (default: once, at the end). Each stretch of
    # eval_every steps reads the start of a new permutation of the training data.
    steps: int | None = None
    eval_every: int | None = None
    # Gradient accumulation: each optimizer step runs data.batch_size in this many micro-batches
    # (each 1/N of it) inside the compiled call and applies their summed gradient once.
    accumulate: int = 1
    # bf16: the matmuls of dtcli's GPT and Core MLPs run in bfloat16; master weights, optimizer
    # state, LayerNorm, softmax, the loss and checkpoints stay float32.
    precision: Literal["float32", "bf16"] = "float32"
    # How the steps compile. auto: on a mesh of one device of one process plain variables (no
    # SPMD needed; the same numbers, checkpoints and plan) compiled by XLA, or run on
    # TensorFlow's own kernels for bf16 on a CPU with AMX or AVX512-BF16 (XLA:CPU computes bf16
    # dots in float32; oneDNN runs them on the CPU's bf16 units); DTensor on a bigger mesh.
    # xla: XLA; graph: TensorFlow's own kernels without XLA (fused Adam); both refused on a mesh
    # of more than one device (DTensor's XLA SPMD is TPU-only).
    # dtensor: DTensor's own compilation on any mesh (one device included).
    compile: Literal["auto", "xla", "graph", "dtensor"] = "auto"
    # A language model's lm-evaluation-harness tasks, run after each evaluation (null: none).
    eval_tasks: EvalTasksConfig | None = None


@dataclass(frozen=True)
class Recipe:
    name: str = "run"
    seed: int = 0
    # classify: one class per example; language_model: the next token at every position.
    task: Literal["classify", "language_model"] = "classify"
    # cpu, cpu:N (N virtual CPUs), gpu, gpu:N, tpu, or auto.
    devices: str = "auto"
    # Ordered named mesh axes; one size may be -1 (the remaining devices).
    mesh: dict[str, int] = field(default_factory=lambda: {"batch": -1})
    layouts: LayoutConfig = field(default_factory=LayoutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # LoRA adapters on a frozen base (null: every weight trains).
    lora: LoraConfig | None = None
    # Experiment trackers beside metrics.jsonl and steps.jsonl (null: tensorboard alone; []:
    # none): tensorboard, mlflow, wandb, or {mlflow: {...}} / {wandb: {...}} with options.
    track: tuple[TrackerConfig, ...] | None = None
