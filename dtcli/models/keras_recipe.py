"""The Keras model a recipe names: its `model.layers` list as a Sequential (each layer's name and
arguments checked, one line per mistake), its `model.build` function (imported from beside the
recipe and called, whatever it raises said in one line), or dtcli's transformer."""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

from dtcli.errors import UsageError
from dtcli.models.base import first_line, message_line, with_article
from dtcli.recipe import ModelConfig

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _numbers(value: Any) -> Any:
    """YAML 1.1 reads 1e-5 as a string; layer arguments that look like numbers become floats."""
    if isinstance(value, str) and _FLOAT.fullmatch(value):
        return float(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def _layer_list(cfg: ModelConfig) -> list:
    import tf_keras
    from tf_keras.src.utils.generic_utils import to_snake_case

    layers, counts = [], {}
    for i, entry in enumerate(cfg.layers or []):
        key = f"model.layers[{i}]"
        if isinstance(entry, str):
            name, args = entry, {}
        elif isinstance(entry, dict) and len(entry) == 1:
            name, args = next(iter(entry.items()))
            args = args or {}
        else:
            raise UsageError(
                f"recipe key '{key}': expected a layer name or {{LayerName: {{args}}}}"
            )
        if not isinstance(args, dict):
            raise UsageError(f"recipe key '{key}.{name}': expected a mapping of layer arguments")
        cls = getattr(tf_keras.layers, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, tf_keras.layers.Layer)):
            import difflib

            known = [n for n in dir(tf_keras.layers) if n[:1].isupper()]
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"recipe key '{key}': unknown tf-keras layer {name!r}{hint}")
        args = _numbers(dict(args))
        # Names must not depend on how many layers this process made before (Keras' counters):
        # they are the keys the layout rules match.
        base = to_snake_case(name)
        args.setdefault("name", f"{base}_{counts.get(base, 0)}")
        counts[base] = counts.get(base, 0) + 1
        try:
            layers.append(cls(**args))
        except (TypeError, ValueError) as exc:
            why = message_line(exc) + _activation_hint(args.get("activation"))
            raise UsageError(f"recipe key '{key}.{name}': {why}") from None
        except Exception as exc:  # noqa: BLE001 - a layer's constructor may raise anything
            raise UsageError(f"recipe key '{key}.{name}': {first_line(exc)}") from None
    return layers


def _activation_hint(activation: Any) -> str:
    """For an activation tf-keras does not know: the close name, or the names it knows."""
    import difflib

    import tf_keras

    helpers = ("_", "get", "serialize", "deserialize")  # functions that are not activations
    names = dir(tf_keras.activations)
    known = sorted(n for n in names if n.islower() and not n.startswith(helpers))
    if not isinstance(activation, str) or activation in known:
        return ""
    close = difflib.get_close_matches(activation, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"


def make_model(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    compute: Any = None,
    adapters: Any = None,
) -> Any:
    """The Keras model of the recipe: its `model.build` function's, dtcli's transformer, or the
    layer list as a Sequential (recipe checks allow exactly one). `compute`: how the
    transformer's layers read their weights (models.compute); `adapters`: its LoRA adapters
    by kernel path (models.lora)."""
    import tf_keras

    tf_keras.backend.reset_uids()
    # Dropout and other random layers need tf.random.Generator under DTensor.
    tf_keras.backend.experimental.enable_tf_random_generator()
    if cfg.build is not None:
        return _user_model(cfg, input_shape, num_classes)
    if cfg.transformer is not None:
        from dtcli.models import transformer

        return transformer.build(cfg.transformer, num_classes, compute, adapters)
    return _sequential(cfg, input_shape)


def _sequential(cfg: ModelConfig, input_shape: tuple[int, ...]) -> Any:
    import tf_keras

    layers = _layer_list(cfg)
    try:
        return tf_keras.Sequential(
            [tf_keras.Input(shape=input_shape, name="inputs"), *layers], name="model"
        )
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for layers that do not fit
        import tensorflow as tf

        if isinstance(exc, tf.errors.OpError):
            raise  # TensorFlow's runtime failed, not the recipe: reported as such, exit 1
        why = message_line(exc) if isinstance(exc, (TypeError, ValueError)) else first_line(exc)
        raise UsageError(
            f"recipe key 'model.layers': the layers do not fit together ({why})"
        ) from None


def _user_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The model the recipe's `model.build` function returns; it must be a tf_keras.Model."""
    import tf_keras

    model = _call_build(_load_build_fn(cfg), cfg, input_shape, num_classes)
    if not isinstance(model, tf_keras.Model):
        # Keras 3 (`import keras`) has no DTensor support on TensorFlow.
        keras3 = type(model).__module__.split(".")[0] == "keras"
        hint = " (a Keras 3 model: build it with tf_keras, or tf.keras)" if keras3 else ""
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} returned {type(model).__name__}, "
            f"expected a tf_keras.Model{hint}"
        )
    return model


def _load_build_fn(cfg: ModelConfig) -> Any:
    """`model.build` ("module:function") imported, from beside the recipe or the cwd."""
    module_name, fn_name = cfg.build.split(":")
    for folder in (cfg.build_path, "."):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)  # user code beside the recipe, or in the cwd
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"recipe key 'model.build': cannot load {cfg.build!r} ({message_line(exc)})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - user code may raise anything at import
        raise UsageError(
            f"recipe key 'model.build': cannot load {cfg.build!r} (importing {module_name} "
            f"raised {first_line(exc)})"
        ) from None
    try:
        fn = getattr(module, fn_name)
    except AttributeError as exc:
        raise UsageError(
            f"recipe key 'model.build': cannot load {cfg.build!r} ({message_line(exc)})"
        ) from None
    if not callable(fn):
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} is {with_article(type(fn).__name__)}, "
            "expected a function"
        )
    return fn


def _call_build(fn: Any, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """Call the recipe's build function: arguments it does not take name model.args, anything
    it raises names model.build; one line either way."""
    import inspect

    args = (input_shape, num_classes)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and the like: no signature to check
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **cfg.args)
        except TypeError as exc:
            raise UsageError(
                f"recipe key 'model.args': {cfg.build} rejected them ({message_line(exc)})"
            ) from None
    try:
        return fn(*args, **cfg.args)
    except TypeError as exc:
        if signature is None:
            raise UsageError(
                f"recipe key 'model.args': {cfg.build} rejected them ({message_line(exc)})"
            ) from None
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} raised {first_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - user code may raise anything
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} raised {first_line(exc)}"
        ) from None
