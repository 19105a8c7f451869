"""Data sources (batching: test_pipeline; packing onto a mesh: test_sharding)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from dtcli import data as D
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig


def write_idx(path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.fixture
def idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (100, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(100) % 10, compress=False)
    return tmp_path


def test_idx_single_pair_splits_in_halves(idx_folder):
    ds = D.load(DataConfig(source="idx", path=str(idx_folder)))
    assert (len(ds.train), len(ds.eval)) == (50, 50)
    assert ds.train.x.shape == (50, 784) and ds.train.x.dtype == np.float32
    assert 0.0 <= ds.train.x.min() and ds.train.x.max() <= 1.0
    assert ds.eval.y[0] == 0 and ds.train.y[3] == 3 and ds.num_classes == 10
    images = D.load(DataConfig(source="idx", path=str(idx_folder), flatten=False))
    assert images.input_shape == (28, 28, 1)


def test_idx_ranges_and_their_errors(idx_folder):
    ds = D.load(
        DataConfig(source="idx", path=str(idx_folder), train_range=(0, 80), eval_range=(80, 100))
    )
    assert (len(ds.train), len(ds.eval)) == (80, 20)
    with pytest.raises(UsageError, match=r"'data.eval_range': \[40, 100\] overlaps"):
        D.load(
            DataConfig(
                source="idx", path=str(idx_folder), train_range=(0, 50), eval_range=(40, 100)
            )
        )
    with pytest.raises(
        UsageError, match=r"'data.train_range': \[0, 500\) is past the 100 examples"
    ):
        D.load(DataConfig(source="idx", path=str(idx_folder), train_range=(0, 500)))


def test_idx_missing_folder_or_files(tmp_path):
    with pytest.raises(UsageError, match=r"'data.path': '.*nope' is not a folder"):
        D.load(DataConfig(source="idx", path=str(tmp_path / "nope")))
    with pytest.raises(UsageError, match=r"'data.path': no IDX files"):
        D.load(DataConfig(source="idx", path=str(tmp_path)))


def test_real_mnist_idx_matches_its_readme(shared_mnist):
    import hashlib

    raw = gzip.decompress((shared_mnist / "t10k-labels-idx1-ubyte.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest().startswith("ff7bcfd4")
    ds = D.load(DataConfig(source="idx", path=str(shared_mnist)))
    assert (len(ds.train), len(ds.eval)) == (5000, 5000)
    assert ds.train.y[:5].tolist() == [7, 2, 1, 0, 4]  # the first test-set labels


def test_embedded_digits():
    ds = D.load(DataConfig())
    assert ds.input_shape == (64,) and ds.num_classes == 10
    assert len(ds.train) + len(ds.eval) == 1797
    assert set(np.unique(ds.eval.y)) == set(range(10))
    assert ds.train.x.max() == pytest.approx(1.0)
    with pytest.raises(UsageError, match=r"'data.name'"):
        D.load(DataConfig(name="iris"))


def test_synthetic_is_learnable_shape():
    ds = D.load(DataConfig(source="synthetic", shape=(4, 4, 1), classes=3, count=64, eval_count=16))
    assert ds.train.x.shape == (64, 16) and set(np.unique(ds.train.y)) <= {0, 1, 2}


def test_an_unreachable_download_host_fails_at_once_naming_it():
    # Without network TFDS' downloader retried for minutes; dtcli asks each host first. A host
    # under .invalid never resolves (RFC 2606), so this needs no network and sends nothing.
    from dtcli.data import tfds as tfds_source

    class Builder:
        url_infos = {"https://dtcli-offline.invalid/data/train.gz": None}

    cfg = DataConfig(source="tfds", name="mnist", download=True)
    with pytest.raises(UsageError) as info:
        tfds_source.check_reachable(Builder(), cfg)
    message = str(info.value)
    assert message.startswith(
        "recipe key 'data.download': cannot reach dtcli-offline.invalid to download TFDS 'mnist'"
    )
    assert "set data.data_dir=DIR" in message


def test_train_with_an_unreachable_download_leaves_nothing(tmp_path, monkeypatch, cli):
    import tensorflow_datasets as tfds

    unreachable = {"https://dtcli-offline.invalid/mnist/train.gz": None}
    monkeypatch.setattr(tfds.core.DatasetBuilder, "url_infos", property(lambda self: unreachable))
    result = cli(
        "train",
        "recipes/quickstart.yaml",
        *("--set", "data.source=tfds", "--set", "data.name=mnist", "--set", "data.download=true"),
        *("--set", f"data.data_dir={tmp_path / 'tfds'}", "--out", tmp_path / "run"),
    )
    assert result.code == 2, result.err
    assert result.err_lines[-1].startswith(
        "error: recipe key 'data.download': cannot reach dtcli-offline.invalid"
    ), result.err
    assert "Traceback" not in result.err
    assert not (tmp_path / "run").exists()
