"""Virtual CPU devices share the machine's cores: each gets its share of intra-op threads."""

from __future__ import annotations

import os

from dtcli import devices


def test_each_virtual_cpu_gets_its_share_of_the_cores():
    assert devices.intra_op_threads(1, 2) is None  # one device: TensorFlow's default
    assert devices.intra_op_threads(8, 2) == 1
    assert devices.intra_op_threads(2, 2) == 1
    assert devices.intra_op_threads(8, 16) == 2
    assert devices.intra_op_threads(4, 18) == 4


def test_the_virtual_cpus_of_this_process_run_ops_on_their_share(cpu8):
    import tensorflow as tf

    cores = len(os.sched_getaffinity(0))
    want = 0 if os.environ.get("TF_NUM_INTRAOP_THREADS") else devices.intra_op_threads(8, cores)
    assert tf.config.threading.get_intra_op_parallelism_threads() == want
