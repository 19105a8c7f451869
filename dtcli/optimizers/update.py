"""Adam's update of one weight (or of like weights at once, on a mesh) on its slots m and v."""

from __future__ import annotations

from typing import Any

from dtcli.recipe import OptimizerConfig


def adam_alpha(cfg: OptimizerConfig, lr: Any, step: Any) -> Any:
    """Adam's step size at 1-based step `step` (float32), both bias corrections in it, as
    tf-keras computes it: once per step, shared by every weight's update."""
    import tensorflow as tf

    beta_1_power, beta_2_power = adam_powers(cfg, step)
    return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def adam_update(
    cfg: OptimizerConfig,
    grad: Any,
    variable: Any,
    m: Any,
    v: Any,
    alpha: Any,
    decay: Any = None,
) -> None:
    """One weight's Adam update on its slots m and v, tf-keras' dense update term for term;
    `decay`, AdamW's (weight_decay, rate): the weight less weight * weight_decay * rate first,
    as tf-keras' AdamW decays it. The weight and its slots are each read once and written
    once, the update computed from the values written: on a mesh every read and write is an
    op on every device (gpt_fsdp_tp at 2 layers: 1,457 -> 1,339 op executions a step per
    device, the numbers unchanged to the bit), and no variable is read after its write, which
    DTensor's all-reduce combining pass may reorder (steps/step.py, _as_weights)."""
    adam_update_like(cfg, [grad], [variable], [m], [v], alpha, decay)


def adam_update_like(
    cfg: OptimizerConfig,
    grads: list,
    variables: list,
    ms: list,
    vs: list,
    alpha: Any,
    decay: Any = None,
) -> None:
    """adam_update of like weights at once (the same shape, layout and decay: `like_weights`):
    their values stacked, so each term of the update is one op for all of them, and split
    back into each one's write. Each weight's numbers are adam_update's (the same elementwise
    ops). On a mesh each op runs on every device: gpt_fsdp_tp's 8 blocks hold 24 like query,
    key and value kernels."""
    import tensorflow as tf

    one = len(variables) == 1

    def values(items: list) -> Any:
        return _read(items[0]) if one else tf.stack([_read(item) for item in items])

    grad = values(grads)
    m_new = values(ms)
    m_new = m_new + (grad - m_new) * (1 - cfg.beta_1)
    v_new = values(vs)
    v_new = v_new + (tf.square(grad) - v_new) * (1 - cfg.beta_2)
    weight = values(variables)
    if decay is not None:
        weight = weight - weight * decay[0] * decay[1]
    weight = weight - (m_new * alpha) / (tf.sqrt(v_new) + cfg.epsilon)
    for targets, value in ((ms, m_new), (vs, v_new), (variables, weight)):
        # Split, not unstacked: DTensor has no layout propagation for Unpack.
        parts = [value] if one else tf.split(value, len(targets))
        for target, part in zip(targets, parts):
            target.assign(part if one else tf.reshape(part, target.shape))


def like_weights(variables: list, decayed: list[bool]) -> list[list[int]]:
    """The variables' indices in groups adam_update_like updates at once: on a mesh, those of
    the same shape, layout and decay (`decayed`, each variable's), in order; plain variables
    (a one-device run, which XLA fuses) one each."""
    groups: dict[Any, list[int]] = {}
    for i, (variable, decays) in enumerate(zip(variables, decayed)):
        layout = getattr(variable, "layout", None)
        key = i if layout is None else (tuple(variable.shape), layout.to_string(), decays)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _read(variable: Any) -> Any:
    """A variable's value, read once (each use of the variable itself would read it again)."""
    import tensorflow as tf

    return tf.convert_to_tensor(variable)


def fused_adam_update(
    cfg: OptimizerConfig,
    grad: Any,
    variable: Any,
    m: Any,
    v: Any,
    lr: Any,
    powers: tuple,
    decay: bool,
) -> None:
    """One weight's AdamW step as TensorFlow's fused CPU/GPU kernels, for plain variables run
    without XLA (train.compile graph): the decay as one multiply, `var * (1 - lr * wd)` (tf-keras:
    `var - var * wd * lr`, equal but for rounding), then `ResourceApplyAdam`, whose kernel
    updates m, v and the weight in one pass over them with adam_update's terms (alpha = lr *
    sqrt(1 - beta_2^t) / (1 - beta_1^t), from `powers`, (beta_1^t, beta_2^t)), but for
    `1 - beta`, which the kernel computes in float32: 1 - float32(0.999) is 0.0009999871, 1.3e-5
    off 0.001, so the second moments differ by that much (0.99: 9e-7). Op by op the same
    update passes over each weight-sized array about 15 times: on the GPT-2-small shape's 85 M
    weights (2 cores of a Xeon, alone) 107 ms a step against 273; the decay as
    ResourceApplyGradientDescent took 123 (its read of the weight makes the kernel copy it).
    DTensor cannot lower these kernels (an LLVM error in its Sqrt inference), and XLA fuses the
    op-by-op update by itself (161 ms)."""
    import tensorflow as tf

    if decay:
        variable.assign(variable * (1 - lr * cfg.weight_decay))
    tf.raw_ops.ResourceApplyAdam(
        var=variable.handle,
        m=m.handle,
        v=v.handle,
        beta1_power=powers[0],
        beta2_power=powers[1],
        lr=lr,
        beta1=tf.constant(cfg.beta_1, tf.float32),
        beta2=tf.constant(cfg.beta_2, tf.float32),
        epsilon=tf.constant(cfg.epsilon, tf.float32),
        grad=grad,
    )


def adam_powers(cfg: OptimizerConfig, step: Any) -> tuple[Any, Any]:
    """(beta_1^t, beta_2^t) at 1-based step `step` (float32)."""
    import tensorflow as tf

    return (
        tf.pow(tf.constant(cfg.beta_1, tf.float32), step),
        tf.pow(tf.constant(cfg.beta_2, tf.float32), step),
    )
