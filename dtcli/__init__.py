"""dtcli: train neural networks on TensorFlow DTensor meshes from a YAML recipe."""

from dtcli.tfruntime import set_runtime_env

__version__ = "0.1.0"

# DTensor reads these when TensorFlow starts: set them before anything imports it.
set_runtime_env()
