"""pycaffe-style code, unchanged, against a ``caffe`` package that only re-exports cct (through
cct.install_as_caffe, so ``caffe.io``, ``caffe.draw``, ``caffe.coord_map``,
``caffe.classifier`` and ``caffe.detector`` are cct's modules). Each snippet runs in its own
interpreter so the alias stays out of this test process."""
import os
import subprocess
import sys
import textwrap


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CAFFE_PACKAGE = """\
from cct import *  # noqa: F401,F403
from cct import install_as_caffe
install_as_caffe()
"""

# A tiny classifier: 4 x 3 x 8 x 8 input, conv, ip to 5 classes, softmax "prob".
SETUP = """
import os
import numpy as np
import caffe
from caffe import layers as L, params as P

caffe.init_log(1)
n = caffe.NetSpec()
n.data = L.Input(shape=dict(dim=[4, 3, 8, 8]))
n.conv = L.Convolution(n.data, num_output=4, kernel_size=3, weight_filler=dict(type="xavier"),
                       bias_filler=dict(type="constant", value=0.1))
n.relu = L.ReLU(n.conv, in_place=True)
n.ip = L.InnerProduct(n.relu, num_output=5, weight_filler=dict(type="xavier"))
n.prob = L.Softmax(n.ip)
model = os.path.join(os.getcwd(), "deploy.prototxt")
with open(model, "w") as f:
    f.write(str(n.to_proto()))
weights = os.path.join(os.getcwd(), "w.caffemodel")
caffe.set_random_seed(1)
caffe.Net(model, caffe.TEST).save(weights)
rng = np.random.default_rng(0)
"""


def run_pycaffe(tmp_path, code):
    pkg = tmp_path / "pkg" / "caffe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(CAFFE_PACKAGE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "pkg"), REPO]))
    script = tmp_path / "script.py"
    script.write_text(SETUP + textwrap.dedent(code) + "\nprint('OK')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
    return proc.stdout


def test_the_alias_resolves_pycaffe_modules(tmp_path):
    run_pycaffe(tmp_path, """
        import cct
        import caffe.io, caffe.draw, caffe.coord_map, caffe.classifier, caffe.detector
        from caffe.proto import caffe_pb2
        assert caffe is cct and caffe.io is cct.io and caffe.draw is cct.draw
        assert caffe.coord_map is cct.coord_map and caffe.classifier.Classifier is caffe.Classifier
        assert caffe.detector.Detector is caffe.Detector and caffe_pb2 is cct.proto.caffe_pb2
        names = ("Net SGDSolver NesterovSolver AdaGradSolver RMSPropSolver AdaDeltaSolver "
                 "AdamSolver NCCL Timer init_log log set_mode_cpu set_mode_gpu set_device Layer "
                 "get_solver layer_type_list set_random_seed solver_count set_solver_count "
                 "solver_rank set_solver_rank set_multiprocess has_nccl __version__ TRAIN TEST "
                 "Classifier Detector io layers params NetSpec to_proto").split()
        assert [x for x in names if not hasattr(caffe, x)] == []
        assert "Convolution" in caffe.layer_type_list()
        net = caffe.Net(model, weights, caffe.TEST)
        assert net.layers[1].type == "Convolution" and net.layer_dict["prob"].type == "Softmax"
        t = caffe.Timer(); t.start(); t.stop(); assert t.ms >= 0
    """)


def test_nccl_presence_as_a_cpu_build(tmp_path):
    run_pycaffe(tmp_path, """
        assert caffe.has_nccl() is False
        assert (caffe.solver_count(), caffe.solver_rank(), caffe.multiprocess()) == (1, 0, False)
        caffe.set_solver_count(2); caffe.set_solver_rank(1); caffe.set_multiprocess(True)
        assert (caffe.solver_count(), caffe.solver_rank(), caffe.multiprocess()) == (2, 1, True)
        try:
            caffe.NCCL(None, "uid")
        except caffe.CCTError as e:
            assert "no NCCL" in str(e) and "--devices" in str(e) and "--groups" in str(e)
        else:
            raise AssertionError("NCCL() did not raise")
    """)


def test_forward_all_batches_more_inputs_than_the_batch(tmp_path):
    run_pycaffe(tmp_path, """
        net = caffe.Net(model, weights, caffe.TEST)
        data = rng.random((10, 3, 8, 8)).astype(np.float32)   # batch is 4: 4 + 4 + 2 padded
        out = net.forward_all(data=data, blobs=["ip"])
        assert sorted(out) == ["ip", "prob"] and out["prob"].shape == (10, 5)
        for i in range(10):
            batch = np.zeros((4, 3, 8, 8), np.float32); batch[0] = data[i]
            one = net.forward(data=batch)["prob"][0]
            np.testing.assert_allclose(out["prob"][i], one, rtol=1e-5, atol=1e-7)
        top_diff = rng.random((10, 5)).astype(np.float32)
        blobs, diffs = net.forward_backward_all(data=data, prob=top_diff)
        assert blobs["prob"].shape == (10, 5) and diffs["data"].shape == (10, 3, 8, 8)
        np.testing.assert_allclose(blobs["prob"], out["prob"], rtol=1e-6)
    """)


def test_classifier_predict_as_classify_py(tmp_path):
    run_pycaffe(tmp_path, """
        mean = np.array([0.4, 0.5, 0.6]) * 255
        clf = caffe.Classifier(model, weights, image_dims=(10, 12), mean=mean, raw_scale=255.0,
                               channel_swap=(2, 1, 0))
        images = [rng.random((20, 15, 3)).astype(np.float32) for _ in range(3)]
        pred = clf.predict(images)                      # oversample: 10 crops each
        assert pred.shape == (3, 5)
        np.testing.assert_allclose(pred.sum(1), 1, rtol=1e-5)
        t = clf.transformer
        for i, im in enumerate(images):
            crops = caffe.io.oversample([caffe.io.resize_image(im, (10, 12))], (8, 8))
            probs = []
            for c in crops:
                batch = np.zeros((4, 3, 8, 8), np.float32); batch[0] = t.preprocess("data", c)
                probs.append(clf.forward(data=batch)["prob"][0].copy())
            np.testing.assert_allclose(pred[i], np.mean(probs, 0), rtol=1e-5, atol=1e-7)
        centre = clf.predict(images, oversample=False)
        resized = caffe.io.resize_image(images[0], (10, 12))
        batch = np.zeros((4, 3, 8, 8), np.float32)
        batch[0] = t.preprocess("data", resized[1:9, 2:10])
        np.testing.assert_allclose(centre[0], clf.forward(data=batch)["prob"][0], rtol=1e-5)
    """)


def test_detector_on_windows(tmp_path):
    run_pycaffe(tmp_path, """
        from PIL import Image
        img = (rng.random((16, 20, 3)) * 255).astype(np.uint8)
        Image.fromarray(img).save("im.png")
        det = caffe.Detector(model, weights, raw_scale=255.0, channel_swap=(2, 1, 0),
                             mean=np.array([100.0, 110.0, 120.0]))
        windows = [np.array([0, 0, 8, 8]), np.array([2, 3, 14, 19]), np.array([5, 5, 9, 9])]
        dets = det.detect_windows([("im.png", windows)])
        assert [d["filename"] for d in dets] == ["im.png"] * 3 and len(dets) == 3
        image = caffe.io.load_image("im.png")
        for d, w in zip(dets, windows):
            batch = np.zeros((4, 3, 8, 8), np.float32)
            batch[0] = det.transformer.preprocess("data", image[w[0]:w[2], w[1]:w[3]])
            np.testing.assert_allclose(d["prediction"], det.forward(data=batch)["prob"][0],
                                       rtol=1e-5)
            assert d["window"] is w
        ctx = caffe.Detector(model, weights, raw_scale=255.0, context_pad=2,
                             mean=np.array([100.0, 110.0, 120.0]))
        assert ctx.crop(image, windows[0]).shape == (8, 8, 3)
        assert len(ctx.detect_windows([("im.png", windows)])) == 3
        try:
            det.detect_selective_search(["im.png"])
        except caffe.CCTError as e:
            assert "selective search is not available" in str(e)
        else:
            raise AssertionError("detect_selective_search did not raise")
    """)


def test_fcn_surgery_crop_and_draw(tmp_path):
    run_pycaffe(tmp_path, """
        import caffe.draw
        from caffe.coord_map import crop
        from caffe.proto import caffe_pb2
        n = caffe.NetSpec()
        n.data = L.Input(shape=dict(dim=[1, 3, 64, 64]))
        n.conv1 = L.Convolution(n.data, num_output=4, kernel_size=3, pad=100)
        n.pool1 = L.Pooling(n.conv1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
        n.score = L.Convolution(n.pool1, num_output=2, kernel_size=1)
        n.upscore = L.Deconvolution(n.score, convolution_param=dict(num_output=2, kernel_size=4,
                                    stride=2, bias_term=False))
        n.out = crop(n.upscore, n.data)
        proto = n.to_proto()
        # by hand: upscore -> data composes to (a, b) = (1, 100) from conv1 (1, 99),
        # pool1 (1/2, -1/4) and upscore (2, 3/2); its inverse gives the crop offset 100
        assert list(proto.layer[-1].crop_param.offset) == [100]
        net = caffe.Net(proto, caffe.TEST)
        assert net.blobs["out"].data.shape == (1, 2, 64, 64)

        caffe.draw.draw_net_to_file(proto, "net.png", "TB", phase=caffe.TEST)
        assert open("net.png", "rb").read(4) == b"\\x89PNG"
        assert caffe.draw.draw_net(proto, "LR", ext="png")[:4] == b"\\x89PNG"
        conv = proto.layer[1]
        assert caffe.draw.get_layer_label(conv, "LR") == (
            '"conv1\\\\n(Convolution)\\\\nkernel size: 3\\\\nstride: 1\\\\npad: 100"')
        assert caffe.draw.get_layer_label(proto.layer[2], "TB") == (
            '"pool1 (Pooling MAX) kernel size: 2 stride: 2 pad: 0"')
        assert caffe.draw.get_layer_label(conv, "TB", display_lrm=True).endswith(
            'lr mult: 1.0, 1.0"')
        assert caffe.draw.get_edge_label(conv) == "4" and caffe.draw.get_edge_label(
            proto.layer[0]) == '""'
        assert caffe.draw.get_pooling_types_dict()[0] == "MAX"
        assert caffe.draw.choose_color_by_layertype("Pooling") == "#FF9900"
        assert caffe.draw.get_layer_lr_mult(conv) == (1.0, 1.0)
        try:
            import pydot  # noqa: F401
        except ImportError:
            try:
                caffe.draw.get_pydot_graph(proto, "LR")
            except caffe.CCTError as e:
                assert "pip install pydot" in str(e)
            else:
                raise AssertionError("get_pydot_graph without pydot did not raise")
        else:
            graph = caffe.draw.get_pydot_graph(proto, "LR")
            assert len(graph.get_edges()) == 12
    """)
