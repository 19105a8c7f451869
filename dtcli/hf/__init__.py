"""Hugging Face model folders: config.json (`config`), tensor names (`names`), safetensors files
(`safetensors_io`) and the tokenizer files that travel with a model. No TensorFlow, no
transformers or torch: plain JSON and NumPy, so `plan HF_DIR` reads a model before anything is
loaded.
"""
