"""Write TFRecord files dtcli's `source: tfrecord` reads: MNIST IDX files converted, or generated
MNIST-like examples of a given total size.

    python bench/make_tfrecords.py --idx ../shared/data/mnist --out /tmp/mnist-tfr --files 4
    python bench/make_tfrecords.py --generate-gb 1.0 --out /tmp/gen-1gb --files 16

Each record is a tf.train.Example: `image` (the 28x28 uint8 pixels as raw bytes) and `label`
(int64). Converted IDX keeps the file order: record i of the files read in order is example i,
so `data.shuffle=false` gives the same batches as `source: idx`. The t10k pair (the only one in
../shared/data/mnist) is split as dtcli's IDX route splits it: first half train, second eval.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def write_tfrecords(
    x: np.ndarray, y: np.ndarray, folder: Path, prefix: str, files: int = 1
) -> list[Path]:
    """Write examples as `source: tfrecord` reads them by default (`image`: the raw bytes of x[i],
    `label`: int64), in order over `files` files named PREFIX-00000-of-0000N.tfrecord."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(y)), files)):
        path = folder / f"{prefix}-{i:05d}-of-{files:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for j in part:
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[x[j].tobytes()])
                            ),
                            "label": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[int(y[j])])
                            ),
                        }
                    )
                )
                w.write(example.SerializeToString())
        paths.append(path)
    return paths


def generate(gigabytes: float, folder: Path, files: int, seed: int = 0) -> int:
    """MNIST-shaped examples whose label is a fixed function of the pixels; returns the count.
    Written file by file, so that this script's own memory stays small."""
    per_example = 838  # bytes a record takes on disk (784 pixels, the keys and framing)
    total = int(gigabytes * 1e9 / per_example)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((28 * 28, 10)).astype(np.float32)
    for i, part in enumerate(np.array_split(np.arange(total), files)):
        x = rng.integers(0, 256, (len(part), 28, 28), dtype=np.uint8)
        y = np.argmax(x.reshape(len(part), -1).astype(np.float32) @ w, axis=1)
        write_tfrecords(x, y, folder, f"train{i:05d}", 1)
    x = rng.integers(0, 256, (1000, 28, 28), dtype=np.uint8)
    y = np.argmax(x.reshape(1000, -1).astype(np.float32) @ w, axis=1)
    write_tfrecords(x, y, folder, "eval", 1)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--files", type=int, default=4, help="training files to write (default 4)")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--idx", type=Path, help="a folder of MNIST IDX files to convert")
    group.add_argument("--generate-gb", type=float, help="generate this many GB of examples")
    args = ap.parse_args()
    from dtcli.tfruntime import import_tensorflow

    import_tensorflow()  # without TensorFlow's native start-up notices
    if args.idx is not None:
        from dtcli.data import read_idx

        x = read_idx(next(args.idx.glob("t10k-images-idx3-ubyte*")))
        y = read_idx(next(args.idx.glob("t10k-labels-idx1-ubyte*")))
        half = len(y) // 2
        write_tfrecords(x[:half], y[:half], args.out, "train", args.files)
        write_tfrecords(x[half:], y[half:], args.out, "eval", 1)
        print(f"{half} train + {len(y) - half} eval examples in {args.out}")
    else:
        n = generate(args.generate_gb, args.out, args.files)
        print(f"{n} train examples (+1000 eval) in {args.out}")


if __name__ == "__main__":
    main()
