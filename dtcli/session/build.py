"""A recipe built on its mesh: `prepare` configures the devices, loads the data, and builds the
model and optimizer with their layouts and the feeds that batch the data for this process (or,
where one device compiles with XLA, all of it on plain variables); `Session` holds the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import cpuinfo, models, optimizers, tfruntime
from dtcli import data as data_lib
from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import pipeline as pipeline_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.recipe import Recipe
from dtcli.session import choice as choice_lib


@dataclass
class Session:
    """Everything a recipe builds on its mesh; shared by train and eval."""

    recipe: Recipe  # resolved: mesh sizes and devices filled in
    devices: devices_lib.Devices
    axes: dict[str, int]
    mesh: Any
    data: data_lib.Dataset
    plans: list[layout_lib.WeightPlan]
    model: models.Built
    optimizer: Any
    packer: pipeline_lib.Packer
    train_feed: pipeline_lib.Feed
    eval_feed: pipeline_lib.Feed
    cluster: cluster_lib.Cluster | None = None  # set in a multi-client run
    # The training split's (x, y) placed on the devices (data.placement), or None.
    placed: tuple[Any, Any] | None = None
    # Whether the train step has run in this process (its first call traces and compiles it).
    compiled: bool = False
    # A LoRA run's base as its checkpoints name it (session.finetune.base_record), once loaded.
    base: dict[str, Any] | None = None
    # What compiles the steps (mesh.step_compiler): xla or graph on plain variables (`mesh`
    # None), dtensor on a mesh.
    compiler: str = mesh_lib.DTENSOR
    # `auto`'s measured choice of compiler for this CPU and shape (session.choice), if any, and
    # the seconds this process spent measuring it (counted into the first step's compile time).
    choice: dict[str, Any] | None = None
    probe_seconds: float = 0.0

    @property
    def local_device_count(self) -> int:
        """The devices this process computes on: the mesh's local ones (plain: the one)."""
        return 1 if self.mesh is None else self.mesh.num_local_devices()

    @property
    def xla(self) -> bool:
        """Whether the steps compile with XLA on plain variables (train.compile; `mesh` None)."""
        return self.compiler == mesh_lib.XLA

    def checkpoint_objects(self) -> dict[str, Any]:
        """What a checkpoint holds: the model (a LoRA run's adapters alone), the optimizer."""
        return {**self.model.checkpointed(), "optimizer": self.optimizer.trackable}


def prepare(
    recipe: Recipe,
    splits: tuple[str, ...] = ("train", "eval"),
    cluster: cluster_lib.Cluster | None = None,
    use_devices: int | None = None,
    devices_key: str = devices_lib.RECIPE_KEY,
    tokenizer_file: Any = None,
    command: str = "train",
) -> Session:
    """Configure devices, then load data and build the model and optimizer on the mesh.

    `splits` (): no data is read, only its shape (for generation).
    `command`: what runs the session (recipe.COMMANDS); only `train` has its batches and its
    training split checked (eval and generate run neither; eval --split train reads that split
    in eval batches).
    `use_devices`: build the mesh over only the first N of the configured devices (so that one
    process can compare a 1-device mesh with a multi-device one, as `dtcli doctor` does).
    With a `cluster` this process is one client of a multi-client run: it configures only its
    own devices and the mesh spans every client's (the global device list).
    `devices_key`: how messages name the devices (--devices when the command line gave them).
    `tokenizer_file`: where the run keeps a language model's tokenizer (rundir.TOKENIZER): read
    when it is there, else the recipe's tokenizer is made (its `data.tokenizer` to be saved).
    """
    want = mesh_lib.device_count_for(recipe.mesh)
    devices = devices_lib.configure(recipe.devices, want, devices_key, cluster=cluster)
    if use_devices is not None:
        devices = devices_lib.Devices(devices.device_type, use_devices)
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    recipe_lib.check_batches(recipe, axes, command)
    trains = command == "train" and "train" in splits
    dataset = _load_data(recipe, splits, tokenizer_file, trains)
    plans, initial = models.weight_plans(recipe, dataset.input_shape, dataset.num_classes, axes)
    compiler = _compiler(recipe, axes, devices, cluster)
    mesh = _mesh(compiler, axes, devices, cluster, use_devices)
    built, optimizer = _model_on_mesh(recipe, dataset, mesh, plans, initial, compiler)
    resolved = recipe_lib.replace(recipe, command=command, mesh=axes, devices=devices.text)
    packer = (
        pipeline_lib.Packer(mesh, recipe.layouts.data_axis) if mesh else pipeline_lib.PlainPacker()
    )
    if trains:
        _check_steps_per_epoch(recipe, dataset)
    placed = None
    if "train" in splits and place_on_device(recipe.data, dataset.train, devices.local_count):
        placed = packer.place(dataset.train.x), packer.place(dataset.train.y)
    feeds = (
        _train_feed(recipe, dataset.train, packer, placed is not None),
        eval_feed(recipe, dataset.eval, packer),
    )
    parts = (dataset, plans, built, optimizer)
    session = Session(resolved, devices, axes, mesh, *parts, packer, *feeds)
    session.cluster, session.placed, session.compiler = cluster, placed, compiler
    choice_lib.settle(session, probe=trains)
    return session


def _load_data(
    recipe: Recipe, splits: tuple[str, ...], tokenizer_file: Any, trains: bool
) -> data_lib.Dataset:
    """The recipe's `splits` read (none: only the data's shape); to train on, the batch checked
    against the training split."""
    if splits:
        dataset = data_lib.load(recipe.data, splits, tokenizer_file, recipe.model.real_vocab)
    else:
        dataset = data_lib.no_data(recipe.data, tokenizer_file, recipe.model.real_vocab)
    if trains:
        data_lib.check_batch_fits(recipe.data, dataset)
    return dataset


def _compiler(
    recipe: Recipe,
    axes: dict[str, int],
    devices: devices_lib.Devices,
    cluster: cluster_lib.Cluster | None,
) -> str:
    """What compiles the steps (mesh.step_compiler)."""
    clients = 1 if cluster is None else cluster.num_clients
    return mesh_lib.step_compiler(
        recipe.train.compile, axes, clients, bf16_cpu(recipe, devices.device_type)
    )


def _mesh(
    compiler: str,
    axes: dict[str, int],
    devices: devices_lib.Devices,
    cluster: cluster_lib.Cluster | None,
    use_devices: int | None,
) -> Any:
    """The DTensor mesh of `axes`, or None where one device runs on plain variables (XLA, or
    TensorFlow's own kernels): training, evaluation and generation alike."""
    if compiler in mesh_lib.PLAIN:
        if compiler == mesh_lib.XLA:
            tfruntime.open_xla_cache()
        return None
    return mesh_lib.build_mesh(
        axes, devices.device_type, distributed=cluster is not None, count=use_devices
    )


def bf16_cpu(recipe: Recipe, device_type: str) -> bool:
    """Whether the recipe's steps run bf16 matmuls on a CPU that takes bfloat16 natively
    (mesh.step_compiler keeps them off XLA there)."""
    return recipe.train.precision == "bf16" and device_type == "CPU" and cpuinfo.runs_bf16()


def _model_on_mesh(
    recipe: Recipe,
    dataset: data_lib.Dataset,
    mesh: Any,
    plans: list,
    initial: dict,
    compiler: str,
) -> tuple[models.Built, Any]:
    """The model built on the mesh (None: plain variables on the one device), and its
    optimizer with its slots made (a restore fills them)."""
    built = models.build(recipe, dataset.input_shape, dataset.num_classes, mesh, plans, initial)
    fused = compiler == mesh_lib.GRAPH
    optimizer = optimizers.make(built.api, recipe.optimizer, mesh, fused=fused)
    trainable = {id(v) for v in built.trainable_variables}
    no_decay = [
        var
        for path, var in built.variables.items()
        if id(var) in trainable and not optimizers.decayed(recipe.optimizer, path)
    ]
    optimizer.build(built.trainable_variables, no_decay)
    return built, optimizer


def _check_steps_per_epoch(recipe: Recipe, dataset: data_lib.Dataset) -> None:
    """A train.steps run's epochs (train.eval_every steps) fit in one pass over the data."""
    batch_size, t = recipe.data.batch_size, recipe.train
    steps = t.steps_per_epoch
    one_pass = pipeline_lib.steps_per_epoch(len(dataset.train), batch_size)
    if not t.steps or steps <= one_pass:
        return
    data = f"the training data ({len(dataset.train)} examples in batches of {batch_size}: "
    if steps == t.steps:  # eval_every not given (it defaults to train.steps), or set equal
        raise UsageError(
            f"recipe key 'train.steps': {steps} steps between evaluations (train.eval_every "
            f"unset or equal to train.steps) is more than one pass over {data}{one_pass} "
            f"batches); set train.eval_every to at most {one_pass}"
        )
    raise UsageError(
        f"recipe key 'train.eval_every': {steps} steps is more than one pass over {data}"
        f"{one_pass} batches); use at most {one_pass}"
    )


def _train_feed(
    recipe: Recipe, split: Any, packer: pipeline_lib.Packer, on_device: bool
) -> pipeline_lib.Feed:
    """The training split read in the recipe's batches, shuffled as it says."""
    cfg = recipe.data
    return pipeline_lib.Feed(
        split,
        cfg.batch_size,
        recipe.seed,
        cfg.shuffle,
        packer.share(cfg.batch_size),
        on_device=on_device,
    )


def eval_feed(recipe: Recipe, split: Any, packer: pipeline_lib.Packer) -> pipeline_lib.Feed:
    """`split` read for evaluation: unshuffled, in eval batches, the last one padded and masked,
    so that each example counts once."""
    size = recipe.data.eval_batch_size or recipe.data.batch_size
    return pipeline_lib.Feed(split, size, recipe.seed, False, packer.share(size))


# data.placement auto: the most bytes the copies of a training split on this process's devices
# may take together (virtual CPUs share host memory; a GPU holds one copy in its own).
ON_DEVICE_BYTES = 1 << 30


def place_on_device(cfg: recipe_lib.DataConfig, split: Any, local_devices: int) -> bool:
    """Whether the training split lives on the devices (see data.placement)."""
    if cfg.placement == "host" or not isinstance(split, data_lib.Split):
        return False
    if isinstance(split, data_lib.TextSplit):
        return False  # windows are views of the tokens; a batch copies a few bytes
    if cfg.placement == "device":
        return True
    return (split.x.nbytes + split.y.nbytes) * local_devices <= ON_DEVICE_BYTES


def flops_per_token(session: Session) -> float | None:
    """Training FLOPs per token of dtcli's transformer (None for other models)."""
    cfg = session.recipe.model.transformer
    if cfg is None:
        return None
    context = models.transformer.window(session.data.input_shape)
    return models.transformer.flops_per_token(cfg, session.data.num_classes, context)
