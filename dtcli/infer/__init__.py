"""The inference passes every reading command shares (score, generate, the lm-eval harness):
a target's log probability over windows (logprobs.py), the decoding loop and its windowing
policy on the host (decoding.py), and the two forward passes that drive it on the mesh
(forward.py). TensorFlow is imported only inside the functions that run on the mesh."""
