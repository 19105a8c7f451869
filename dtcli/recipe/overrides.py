"""What the command line changes in a recipe (--set, --mesh, --devices, --epochs, eval's
--batch-size): one `Overrides` that applies itself to a raw recipe, names the option that set a
recipe key in a message about that key, and turns itself back into those options for the
clients `dtcli launch` starts."""

from __future__ import annotations

import contextlib
import copy
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from dtcli import devices as devices_lib
from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED
from dtcli.recipe.files import DuplicateKey, load_yaml
from dtcli.recipe.typed import shown


@dataclass(frozen=True)
class Overrides:
    """The command line's changes to a recipe; empty: the recipe as written."""

    sets: tuple[str, ...] = ()  # --set KEY.PATH=VALUE, applied in order
    mesh: str | None = None  # --mesh AXIS=SIZE,...
    devices: str | None = None  # --devices
    epochs: int | None = None  # --epochs
    eval_batch_size: int | None = None  # eval's --batch-size

    def __post_init__(self) -> None:
        # The command line gives a list: kept as a tuple, so equal overrides compare equal.
        object.__setattr__(self, "sets", tuple(self.sets))

    def apply(self, raw: dict) -> dict:
        """A copy of the raw recipe with the overrides applied: each --set in order, then
        --mesh, --devices and --epochs. Raises UsageError naming the option at fault."""
        raw = copy.deepcopy(raw)
        for assignment in self.sets:
            apply_set(raw, assignment)
        if self.mesh is not None:
            raw["mesh"] = _with_layout_axes(parse_mesh_arg(self.mesh), raw.get("layouts"))
            if self.devices is None and isinstance(raw.get("devices"), str):
                # A new mesh without --devices: the device count follows the mesh
                # ("cpu:8" -> "cpu").
                raw["devices"] = raw["devices"].split(":")[0]
        if self.devices is not None:
            devices_lib.parse(self.devices, "--devices")
            raw["devices"] = self.devices
        if self.epochs is not None:
            _set_epochs(raw, self.epochs)
        if self.eval_batch_size is not None:
            if not isinstance(raw.setdefault("data", {}), dict):
                raise UsageError("recipe key 'data': expected a mapping")
            raw["data"]["eval_batch_size"] = self.eval_batch_size
        return raw

    def options(self) -> dict[str, str]:
        """{recipe key: the option that set it, with its value} for each option given that
        sets a recipe key (--set aside: it names its keys itself)."""
        given = {
            "mesh": None if self.mesh is None else f"--mesh {self.mesh!r}",
            "devices": None if self.devices is None else f"--devices {self.devices!r}",
            "train.epochs": None if self.epochs is None else f"--epochs {self.epochs}",
            "data.eval_batch_size": None
            if self.eval_batch_size is None
            else f"--batch-size {self.eval_batch_size}",
        }
        return {key: option for key, option in given.items() if option is not None}

    def named(self, exc: UsageError) -> UsageError:
        """`exc` as the user should read it: a message that starts with a recipe key an option
        set (`recipe key 'train.epochs'`, `recipe key 'mesh.batch'`, `recipe key 'devices' =
        'gpu'`) names that option instead (`--epochs 0`), since the value is the one typed on
        the command line; any other message as it is."""
        found = _KEY_FIRST.match(str(exc))
        if found is None:
            return exc
        key = found.group(1)
        for set_key, option in self.options().items():
            if key == set_key or key.startswith(set_key + "."):
                return UsageError(option + str(exc)[found.end() :])
        return exc

    @contextlib.contextmanager
    def naming(self) -> Iterator[None]:
        """UsageErrors raised inside name the option that set their recipe key (`named`)."""
        try:
            yield
        except UsageError as exc:
            renamed = self.named(exc)
            if renamed is exc:
                raise
            raise renamed from exc

    def to_argv(self) -> list[str]:
        """The overrides as `dtcli train` options (what `dtcli launch` passes to each client)."""
        argv: list[str] = []
        for assignment in self.sets:
            argv += ["--set", assignment]
        if self.mesh is not None:
            argv += ["--mesh", self.mesh]
        if self.epochs is not None:
            argv += ["--epochs", str(self.epochs)]
        if self.devices is not None:
            argv += ["--devices", self.devices]
        if self.eval_batch_size is not None:
            argv += ["--batch-size", str(self.eval_batch_size)]
        return argv


# A message that starts with a recipe key, and that key's value where it shows one
# (devices._named).
_KEY_FIRST = re.compile(r"recipe key '([^']*)'(?: = '[^']*')?")

# No overrides: the recipe as written (a default argument: Overrides is frozen).
NO_OVERRIDES = Overrides()


def _set_epochs(raw: dict, epochs: int) -> None:
    raw.setdefault("train", {})
    if not isinstance(raw["train"], dict):
        raise UsageError("recipe key 'train': expected a mapping")
    if raw["train"].get("steps") is not None:
        raise UsageError(
            "--epochs: this recipe counts train.steps (the total); use --set train.steps=N"
        )
    raw["train"]["epochs"] = epochs


def parse_mesh_arg(text: str) -> dict[str, int]:
    """`batch=4,model=2` -> {"batch": 4, "model": 2} (the --mesh argument)."""
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(
                f"--mesh {text!r}: expected AXIS=SIZE[,AXIS=SIZE...], like batch=4,model=2"
            )
        if name in mesh:
            raise UsageError(f"--mesh {text!r}: axis '{name}' appears twice")
        if not size.strip():
            raise UsageError(
                f"--mesh {text!r}: axis '{name}' has no size (expected {name}=SIZE, "
                "a positive integer or -1)"
            )
        try:
            value = int(size)
        except ValueError:
            raise UsageError(f"--mesh {text!r}: size of axis '{name}' must be an integer") from None
        if value == 0 or value < -1:
            raise UsageError(
                f"--mesh {text!r}: size of axis '{name}' must be a positive integer or -1, "
                f"got {value}"
            )
        mesh[name] = value
    return mesh


def _with_layout_axes(axes: dict[str, int], layouts: Any) -> dict[str, int]:
    """A --mesh that leaves out axes the layout rules name gets them with size 1.

    So `--mesh batch=8` runs a tensor-parallel recipe data-parallel (its `model` rules shard
    nothing), and a checkpoint evaluates on any mesh. In the recipe file itself, an axis the
    mesh lacks is still an error (most likely a typo).
    """
    named: list[str] = []
    if isinstance(layouts, dict):
        data_axis = layouts.get("data_axis", "batch")
        named.append(data_axis if isinstance(data_axis, str) else "")
        rules = layouts.get("rules") or {}
        if isinstance(rules, dict):
            for dims in rules.values():
                if isinstance(dims, list):
                    named += [d for d in dims if isinstance(d, str)]
    else:
        named.append("batch")
    out = dict(axes)
    used = [a for a in named if a and a != UNSHARDED]
    for axis in axes:
        close = difflib.get_close_matches(axis, [a for a in used if a not in axes], n=1)
        if axis not in used and close:
            raise UsageError(
                f"--mesh: axis '{axis}' is named by no layout rule nor layouts.data_axis "
                f"(did you mean '{close[0]}'?)"
            )
    for axis in used:
        if axis not in out:
            out[axis] = 1
    return out


def apply_set(raw: dict, assignment: str) -> None:
    """Apply one `--set key.path=value` to the raw recipe mapping (value parsed as YAML)."""
    key, sep, text = assignment.partition("=")
    # `layers[0].Dense` reads as `layers.0.Dense`: both reach into a list, which says how.
    parts = re.sub(r"\[(\w*)\]", r".\1", key.strip()).split(".")
    if not sep or not key.strip() or any(not p for p in parts):
        raise UsageError(
            f"--set {assignment!r}: expected KEY.PATH=VALUE, like optimizer.learning_rate=3e-4"
        )
    if not text.strip():  # an empty $STEPS in a script: to YAML null, a silent full run
        raise UsageError(
            f"--set {assignment!r}: empty value (write {key.strip()}=null to unset it)"
        )
    try:
        value = load_yaml(text)
    except DuplicateKey as dup:
        inner = dup.path if dup.path.startswith("[") else f".{dup.path}"
        raise UsageError(
            f"--set {assignment!r}: key '{key.strip()}{inner}' appears twice"
        ) from None
    except (yaml.YAMLError, ValueError, OverflowError):
        raise UsageError(f"--set {assignment!r}: the value is not valid YAML") from None
    if text.strip().endswith(":") and isinstance(value, dict) and list(value.values()) == [None]:
        # `bpe:` (a BPE whose size was left out) is, to YAML, the mapping {bpe: null}: the text
        # as given goes to the key's own check, which says what it lacks.
        value = text.strip()
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if isinstance(child, list):
            raise _list_item_error(assignment, parts[: i + 1], child, parts[i + 1 :], value)
        if not isinstance(child, dict):
            raise UsageError(f"--set {assignment!r}: '{'.'.join(parts[: i + 1])}' is not a mapping")
        node = child
    node[parts[-1]] = value


def _list_item_error(
    assignment: str, list_path: list[str], items: list, rest: list[str], value: Any
) -> UsageError:
    """`--set` cannot reach into a list: say so, with the whole-list form that sets the item."""
    key = ".".join(list_path)
    hint = f"--set '{key}=[...]'"
    changed = copy.deepcopy(items)
    node: Any = changed
    try:
        for part in rest[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(rest[-1])] = value
        elif isinstance(node, dict):
            node[rest[-1]] = value
        else:
            raise TypeError
        hint = f"--set '{key}={shown(changed)}'"
    except (LookupError, ValueError, TypeError):
        pass
    return UsageError(
        f"--set {assignment!r}: '{key}' is a list: set an item by replacing the whole list, {hint}"
    )
