"""HDF5Data: rows across files in order, wrap-around, shuffling of files and rows, exact resume,
and the errors for bad lists and datasets."""
import h5py
import numpy as np
import pytest

from cct.errors import CCTError
from tests.gradient_check import build_layer


def write_h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)
    return path


def two_files(tmp_path):
    """File a: rows 0..4, file b: rows 5..7; data row r is filled with r, label r."""
    def rows(lo, hi):
        r = np.arange(lo, hi)
        return dict(data=np.broadcast_to(r[:, None, None, None], (hi - lo, 2, 1, 3)).astype(
            np.float32), label=r.astype(np.int32))
    write_h5(tmp_path / "a.h5", **rows(0, 5))
    write_h5(tmp_path / "b.h5", **rows(5, 8))
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path}/a.h5\n{tmp_path}/b.h5\n")
    return listing


def h5_layer(listing, batch=3, shuffle=False, tops=("data", "label"), extra="", seed=1701):
    text = ('type: "HDF5Data" ' + "".join(f'top: "{t}" ' for t in tops)
            + f'hdf5_data_param {{ source: "{listing}" batch_size: {batch} '
            + f'shuffle: {str(shuffle).lower()} }} {extra}')
    return build_layer(text, [], num_tops=len(tops), dtype=np.float32, seed=seed)


def labels_of(layer, top, n):
    out = []
    for _ in range(n):
        layer.forward([], top)
        np.testing.assert_array_equal(top[0].data[:, 0, 0, 0], top[1].data)  # rows stay paired
        out.append(top[1].data.copy())
    return np.concatenate(out) if out else np.zeros(0)


def test_rows_run_across_files_and_wrap(tmp_path, capsys):
    layer, _, top = h5_layer(two_files(tmp_path), batch=3)
    assert top[0].shape == (3, 2, 1, 3) and top[1].shape == (3,)
    np.testing.assert_array_equal(labels_of(layer, top, 4), [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3])
    err = capsys.readouterr().err
    assert "hdf5_data_layer.cpp:80] Loading list of HDF5 filenames from:" in err
    assert "hdf5_data_layer.cpp:94] Number of HDF5 files: 2" in err


def test_a_single_file_with_integer_data_and_more_rows_than_one_batch(tmp_path):
    write_h5(tmp_path / "x.h5", data=np.arange(10, dtype=np.int64).reshape(5, 2))
    (tmp_path / "l.txt").write_text(f"{tmp_path}/x.h5")
    layer, _, top = h5_layer(tmp_path / "l.txt", batch=7, tops=("data",))
    layer.forward([], top)
    assert top[0].shape == (7, 2)
    np.testing.assert_array_equal(top[0].data[:, 0], [0, 2, 4, 6, 8, 0, 2])


def test_shuffle_permutes_files_and_rows_each_pass(tmp_path):
    layer, _, top = h5_layer(two_files(tmp_path), batch=4, shuffle=True, seed=5)
    labels = labels_of(layer, top, 8).reshape(4, 8)
    for epoch in labels:
        assert sorted(epoch) == list(range(8))
        a_first = epoch[0] < 5  # each file's rows come together, in some order
        firsts, seconds = (epoch[:5], epoch[5:]) if a_first else (epoch[:3], epoch[3:])
        assert len({int(v) < 5 for v in firsts}) == 1 and len({int(v) < 5 for v in seconds}) == 1
    assert len({tuple(e) for e in labels}) > 1


@pytest.mark.parametrize("done", [0, 1, 2, 5])
def test_a_restored_layer_repeats_the_uninterrupted_run(tmp_path, done):
    listing = two_files(tmp_path)
    ref, _, top = h5_layer(listing, batch=3, shuffle=True, seed=12)
    want = labels_of(ref, top, done + 5)[done * 3:]
    first, _, top = h5_layer(listing, batch=3, shuffle=True, seed=12)
    labels_of(first, top, done)
    import json
    state = json.loads(json.dumps(first.data_state()))
    resumed, _, top = h5_layer(listing, batch=3, shuffle=True, seed=40)
    resumed.load_data_state(state)
    np.testing.assert_array_equal(labels_of(resumed, top, 5), want)


@pytest.mark.parametrize("done", [0, 1, 2, 5])
def test_the_same_layer_restored_repeats_itself_reading_only_another_file(tmp_path, done):
    """The optimizer's probes restore one layer's position at every branch: the file in
    memory is not read again (CIFAR10-quick's took 21 ms a read), another file is."""
    layer, _, top = h5_layer(two_files(tmp_path), batch=3, shuffle=True, seed=12)
    labels_of(layer, top, done)
    state = layer.data_state()
    want = labels_of(layer, top, 5)
    reads = []
    read = layer._read
    layer._read = lambda file_id: reads.append(file_id) or read(file_id)
    wanted = state["file_order"][state["file_index"]]
    same_file = layer.loaded == wanted
    layer.load_data_state(state)
    assert reads == ([] if same_file else [wanted])
    np.testing.assert_array_equal(labels_of(layer, top, 5), want)


def test_missing_dataset_names_file_list_line_and_what_is_there(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.zeros((2, 3)), labels=np.zeros(2))
    (tmp_path / "l.txt").write_text(f"\n{tmp_path}/a.h5\n")
    with pytest.raises(CCTError, match=r"a.h5' \(line 2 of .*l.txt'\) has no dataset 'label'.*"
                                       r"holds: data, labels"):
        h5_layer(tmp_path / "l.txt")


def test_mismatched_rows_and_shapes_are_errors(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.zeros((4, 3)), label=np.zeros(3))
    (tmp_path / "l.txt").write_text(f"{tmp_path}/a.h5")
    with pytest.raises(CCTError, match="'label' has 3 rows but 'data' has 4"):
        h5_layer(tmp_path / "l.txt")
    write_h5(tmp_path / "b.h5", data=np.zeros((2, 3)), label=np.zeros(2))
    write_h5(tmp_path / "c.h5", data=np.zeros((2, 4)), label=np.zeros(2))
    (tmp_path / "l2.txt").write_text(f"{tmp_path}/b.h5 {tmp_path}/c.h5")
    layer, _, top = h5_layer(tmp_path / "l2.txt", batch=2)
    # The next file is loaded as soon as the first is used up, as in Caffe.
    with pytest.raises(CCTError, match=r"c.h5' \(line 1 of .*'data' has rows of shape \(4,\), "
                                       r"but the first file's have \(3,\)"):
        layer.forward([], top)


def test_a_damaged_hdf5_file_names_the_file_and_line(tmp_path):
    """h5py reports damaged structures as RuntimeError, KeyError, ... (here: the root group's
    name heap), before raw; and a broken link among the datasets."""
    path = write_h5(tmp_path / "a.h5", data=np.zeros((2, 3)), label=np.zeros(2))
    raw = bytearray(path.read_bytes())
    heap = raw.find(b"HEAP")
    raw[heap + 1] ^= 0xFF
    path.write_bytes(bytes(raw))
    (tmp_path / "l.txt").write_text(f"{path}\n")
    with pytest.raises(CCTError, match=r"a.h5' \(line 1 of .*l.txt'\) cannot be read as HDF5: "
                                       r"it is damaged or not an HDF5 file \(\w+Error"):
        h5_layer(tmp_path / "l.txt")
    path = write_h5(tmp_path / "b.h5", data=np.zeros((2, 3)))
    with h5py.File(path, "r+") as f:
        f["other"] = h5py.SoftLink("/nowhere")
    (tmp_path / "l2.txt").write_text(f"{path}\n")
    with pytest.raises(CCTError, match=r"b.h5' .* has no dataset 'label' .*holds: data$"):
        h5_layer(tmp_path / "l2.txt")


@pytest.mark.parametrize("listing,extra,message", [
    ("missing.txt", "", "cannot open the HDF5 file list"),
    ("empty.txt", "", "lists no HDF5 files"),
    ("nofile.txt", "", r"gone.h5' \(line 1 of .*\) does not exist"),
    ("bad.txt", "", "cannot be read as HDF5"),
    ("ok.txt", "transform_param { scale: 2 }", "HDF5Data does not transform data"),
])
def test_list_errors(tmp_path, listing, extra, message):
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "nofile.txt").write_text(f"{tmp_path}/gone.h5\n")
    (tmp_path / "junk.h5").write_text("not hdf5")
    (tmp_path / "bad.txt").write_text(f"{tmp_path}/junk.h5\n")
    write_h5(tmp_path / "ok.h5", data=np.zeros((2, 1)), label=np.zeros(2))
    (tmp_path / "ok.txt").write_text(f"{tmp_path}/ok.h5\n")
    with pytest.raises(CCTError, match=message):
        h5_layer(tmp_path / listing, extra=extra)
