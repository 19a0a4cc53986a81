"""Tests of Caffe's tools as cct subcommands."""
import lmdb


def records(path):
    """Every (key, value) of an LMDB, in key order."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return list(txn.cursor())
    finally:
        env.close()
