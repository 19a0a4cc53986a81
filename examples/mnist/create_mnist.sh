#!/usr/bin/env sh
# Convert the bundled MNIST digits (IDX, gzipped) into LMDBs, as Caffe's create_mnist.sh does.
set -e
DATA=examples/mnist/data
OUT=examples/mnist
rm -rf $OUT/mnist_train_lmdb $OUT/mnist_test_lmdb
cct convert_mnist_data $DATA/train-images-idx3-ubyte.gz $DATA/train-labels-idx1-ubyte.gz \
  $OUT/mnist_train_lmdb --backend=lmdb
cct convert_mnist_data $DATA/t10k-images-idx3-ubyte.gz $DATA/t10k-labels-idx1-ubyte.gz \
  $OUT/mnist_test_lmdb --backend=lmdb
echo "Done."
