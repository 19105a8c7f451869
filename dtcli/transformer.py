"""Moved to dtcli/models/transformer.py (its layers: dtcli/models/gpt_layers.py).

r23-merge: this shim keeps `from dtcli import transformer` working for bench/lm_throughput.py;
remove it once bench imports `from dtcli.models import transformer`.
"""

from dtcli.models.transformer import build, flops_per_token, parameters

__all__ = ["build", "flops_per_token", "parameters"]
