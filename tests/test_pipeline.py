"""The input pipeline: streamed splits (TFRecord files, image folders) in an order that is a pure
function of (seed, epoch), resumed at the same example, read in disjoint shares by the clients of
a multi-client run; the same batches as the in-memory route for the same data in file order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RECIPES, write_tfrecords

from dtcli import data as data_lib
from dtcli import pipeline as P
from dtcli import recipe as R
from dtcli.errors import UsageError


def test_ragged_last_batch_is_padded_and_masked():
    split = data_lib.Split(np.arange(10, dtype=np.float32)[:, None], np.arange(10, dtype=np.int32))
    out = list(P.batches(split, 4))
    assert [b.x.shape for b in out] == [(4, 1)] * 3
    assert out[-1].mask.tolist() == [1, 1, 0, 0]
    assert out[-1].y[:2].tolist() == [8, 9]
    seen = np.concatenate([b.y[b.mask > 0] for b in out])
    assert sorted(seen.tolist()) == list(range(10))  # every example exactly once
    # a partial order (resuming mid-epoch) gives only its own batches
    rest = list(P.batches(split, 4, np.arange(4, 10)))
    assert len(rest) == 2 and rest[-1].mask.tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("rows", [None, np.array([2, 3]), np.array([0, 1])])
def test_positions_name_the_examples_of_the_host_batches(rows):
    """A split placed on the devices is batched by positions: the same examples, padding and
    mask as the host batches, for the whole batch and for a client's rows of it."""
    split = data_lib.Split(
        np.arange(10, dtype=np.float32)[:, None] * 10, np.arange(10, dtype=np.int32)
    )
    order = P.epoch_order(10, 3, 1, True)
    host = list(P.batches(split, 4, order, rows))
    picks = list(P.positions(10, 4, order, rows))
    assert len(picks) == len(host) == 3
    for p, b in zip(picks, host, strict=True):
        assert p.index.dtype == np.int32
        np.testing.assert_array_equal(p.mask, b.mask)
        real = p.mask > 0
        np.testing.assert_array_equal(split.y[p.index[real]], b.y[real])
        np.testing.assert_array_equal(split.x[p.index[real]], b.x[real])
        assert not p.index[~real].any()  # padding points at example 0, masked out


def test_epoch_order_is_a_function_of_seed_and_epoch():
    a = P.epoch_order(100, 7, 3, True)
    assert np.array_equal(a, P.epoch_order(100, 7, 3, True))
    assert not np.array_equal(a, P.epoch_order(100, 7, 4, True))
    assert sorted(a.tolist()) == list(range(100))
    assert P.epoch_order(5, 7, 3, False).tolist() == [0, 1, 2, 3, 4]


def stream(counts: tuple[int, ...], kind: str = "tfrecord") -> data_lib.Stream:
    cfg = R.DataConfig()
    files = tuple(f"f{i}" for i in range(len(counts)))
    return data_lib.Stream(kind, files, counts, (), (4,), cfg, 10)


@pytest.mark.parametrize(
    "counts, groups, shares",
    [
        ((5, 3, 4), 1, [12]),
        ((5, 3, 4), 2, [9, 3]),  # files 0 and 2, file 1
        ((5, 3, 4), 3, [5, 3, 4]),
        ((5, 3, 4), 4, [3, 3, 3, 3]),  # fewer files than groups: every 4th example
        ((5, 3, 4), 5, [3, 3, 2, 2, 2]),
    ],
)
def test_each_group_reads_a_share_and_all_shares_make_the_split(counts, groups, shares):
    got = data_lib.share_counts(stream(counts), groups)
    assert got == shares and sum(got) == sum(counts)


def ids(batches: list[P.Batch]) -> list[int]:
    """The example ids of real rows: the generated examples carry their id in pixels 0-1."""
    out = []
    for b in batches:
        pixels = np.round(b.x[:, :2] * 255).astype(int)
        out += list((pixels[:, 0] * 256 + pixels[:, 1])[b.mask == 1])
    return out


@pytest.fixture(scope="module")
def numbered(tmp_path_factory, cpu8):
    """300 examples whose pixels 0-1 hold their id, in 4 TFRecord files, and as numpy."""
    folder = tmp_path_factory.mktemp("numbered")
    n = 300
    x = np.zeros((n, 4, 4), np.uint8)
    x[:, 0, 0], x[:, 0, 1] = np.arange(n) // 256, np.arange(n) % 256
    x[:, 1:, :] = np.random.default_rng(0).integers(0, 256, (n, 3, 4))
    y = np.arange(n) % 10
    write_tfrecords(x, y, folder, "train", 4)
    write_tfrecords(x[:50], y[:50], folder, "eval", 1)
    sets = [
        "data.source=tfrecord",
        f"data.path={folder}/train-*",
        f"data.eval_path={folder}/eval-*",
        "data.shape=[4,4]",
        "data.shuffle_buffer=64",
    ]
    cfg = R.load(RECIPES / "quickstart.yaml", sets).data
    return data_lib.load(cfg), cfg, data_lib.Split(x.reshape(n, -1) / 255.0, y.astype(np.int32))


def feed(split, batch=32, shuffle=True, group=0, groups=1, rows=None) -> P.Feed:
    return P.Feed(split, batch, 7, shuffle, P.Share(rows, group, groups))


def test_stream_order_is_a_pure_function_of_seed_and_epoch(numbered):
    train = numbered[0].train
    f = feed(train)
    assert f.steps == 10  # 300 examples in batches of 32: the last one padded
    first, again, second = (ids(list(f.epoch(e))) for e in (1, 1, 2))
    assert first == again
    assert sorted(first) == sorted(second) == list(range(300))  # every example once an epoch
    assert first != second
    assert ids([next(feed(train, shuffle=False).epoch(0))]) == list(range(32))  # file order


def test_a_resumed_epoch_continues_at_the_same_example(numbered):
    f = feed(numbered[0].train)
    whole = list(f.epoch(3))
    resumed = list(f.epoch(3, start=6))
    assert len(resumed) == 4
    for a, b in zip(whole[6:], resumed):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.mask, b.mask)


@pytest.mark.parametrize("groups", [2, 8])  # 2: files dealt out; 8 > 4 files: every 8th example
def test_groups_read_disjoint_shares_and_run_the_same_steps(numbered, groups):
    train = numbered[0].train
    # A global batch of 8 rows per group; each group's process feeds its 8.
    feeds = [feed(train, 8 * groups, True, g, groups, np.arange(8)) for g in range(groups)]
    seen = [ids(list(f.epoch(1))) for f in feeds]
    assert {f.steps for f in feeds} == {feeds[0].steps}  # collectives need the same step count
    assert all(len(list(f.epoch(1))) == feeds[0].steps for f in feeds)
    flat = [i for s in seen for i in s]
    assert sorted(flat) == list(range(300)), "each example read by exactly one group"


def test_file_order_gives_the_in_memory_batches(numbered):
    """TFRecords in file order batch as the same data held in memory (IDX, embedded) batches."""
    train, in_memory = numbered[0].train, numbered[2]
    for a, b in zip(feed(train, shuffle=False).epoch(0), feed(in_memory, shuffle=False).epoch(0)):
        np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(a.y, b.y)
        np.testing.assert_array_equal(a.mask, b.mask)


def test_images_and_tfrecords_of_the_same_digits_hold_the_same_examples(digit_files):
    """The image folder lists files class by class, the TFRecords in split order: the same
    examples (decoded PNG = raw bytes), each once, in another order."""
    cfgs = [R.load(RECIPES / "quickstart.yaml", digit_files[k]).data for k in digit_files]
    splits = [data_lib.load(c).eval for c in cfgs]
    rows = []
    for split in splits:
        batches = list(feed(split, shuffle=False).epoch(0))
        assert len(batches) == 12  # 360 eval digits in batches of 32, the last padded
        x = np.concatenate([b.x[b.mask == 1] for b in batches])
        y = np.concatenate([b.y[b.mask == 1] for b in batches])
        table = np.column_stack([y, np.round(x * 255)])
        rows.append(table[np.lexsort(table.T[::-1])])
    assert rows[0].shape == (360, 65)
    np.testing.assert_array_equal(rows[0], rows[1])


@pytest.mark.parametrize(
    "change, key",
    [
        (["data.image_key=pixels"], "data.image_key"),
        (["data.label_key=class"], "data.label_key"),
        (["data.shape=[5,5]"], "data.shape"),
        # uint8 records of 16 bytes read as float32: 4 values, not 16 (and not the shape's
        # fault: 16 bytes are data.shape in uint8).
        (["data.dtype=float32"], "data.dtype"),
        (["data.dtype=float32", "data.shape=[2,2]"], None),  # 16 bytes are 4 float32 values
        (["data.encoding=encoded"], "data.encoding"),
        (["data.path=/nonexistent/*.tfrecord"], "data.path"),
    ],
)
def test_bad_tfrecord_settings_fail_at_load_naming_the_key(numbered, change, key):
    cfg = R.load(RECIPES / "quickstart.yaml", [*_sets(numbered[1]), *change]).data
    if key is None:  # settings that read the records (as other values): no error
        data_lib.load(cfg)
        return
    with pytest.raises(UsageError, match=f"^recipe key '{key}': ") as caught:
        data_lib.load(cfg)
    assert "Op:" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_label_outside_the_classes_stops_reading_naming_data_classes(numbered):
    """Labels 0-9 with data.classes 5: the first record loads (label 0); label 5 stops it."""
    cfg = R.load(RECIPES / "quickstart.yaml", [*_sets(numbered[1]), "data.classes=5"]).data
    with pytest.raises(UsageError, match="^recipe key 'data.classes': .*in \\[0, 5\\)"):
        list(feed(data_lib.load(cfg).train).epoch(0))


def _sets(cfg) -> list[str]:
    return [
        "data.source=tfrecord",
        f"data.path={cfg.path}",
        f"data.eval_path={cfg.eval_path}",
        "data.shape=[4,4]",
    ]
