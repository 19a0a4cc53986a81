#!/usr/bin/env sh
# Create the LMDBs from the bundled digits, then train LeNet (run from the repository root).
set -e
sh examples/mnist/create_mnist.sh
cct train --solver=examples/mnist/lenet_solver.prototxt "$@"
