// pybind11 bindings of the CPU kernels (module cct._C). Arrays are NCHW, C-contiguous, float32
// or float64; every kernel releases the GIL while it runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <stdexcept>

#include "kernels.h"

namespace py = pybind11;
using Pair = std::array<int, 2>;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
py::tuple max_pool_forward(Arr<T> x, Pair k, Pair s, Pair p, Pair out) {
  if (x.ndim() != 4) throw std::invalid_argument("max_pool_forward: bottom must be 4-D (NCHW)");
  const int64_t n = x.shape(0), c = x.shape(1);
  const int h = int(x.shape(2)), w = int(x.shape(3));
  Arr<T> y({n, c, int64_t(out[0]), int64_t(out[1])});
  py::array_t<int64_t> mask({n, c, int64_t(out[0]), int64_t(out[1])});
  const T* xd = x.data();
  T* yd = y.mutable_data();
  int64_t* md = mask.mutable_data();
  {
    py::gil_scoped_release release;
    cct::max_pool_forward<T>(xd, yd, md, n * c, h, w, k[0], k[1], s[0], s[1], p[0], p[1],
                             out[0], out[1]);
  }
  return py::make_tuple(y, mask);
}

template <typename T>
Arr<T> max_pool_backward(Arr<T> dy, py::array_t<int64_t, py::array::c_style | py::array::forcecast> mask,
                         std::array<int64_t, 4> x_shape) {
  Arr<T> dx({x_shape[0], x_shape[1], x_shape[2], x_shape[3]});
  const T* dyd = dy.data();
  const int64_t* md = mask.data();
  T* dxd = dx.mutable_data();
  {
    py::gil_scoped_release release;
    cct::max_pool_backward<T>(dyd, md, dxd, x_shape[0] * x_shape[1], int(x_shape[2]),
                              int(x_shape[3]), int(dy.shape(2)), int(dy.shape(3)));
  }
  return dx;
}

template <typename T>
Arr<T> ave_pool_forward(Arr<T> x, Pair k, Pair s, Pair p, Pair out) {
  if (x.ndim() != 4) throw std::invalid_argument("ave_pool_forward: bottom must be 4-D (NCHW)");
  const int64_t n = x.shape(0), c = x.shape(1);
  Arr<T> y({n, c, int64_t(out[0]), int64_t(out[1])});
  const T* xd = x.data();
  T* yd = y.mutable_data();
  {
    py::gil_scoped_release release;
    cct::ave_pool_forward<T>(xd, yd, n * c, int(x.shape(2)), int(x.shape(3)), k[0], k[1], s[0],
                             s[1], p[0], p[1], out[0], out[1]);
  }
  return y;
}

template <typename T>
Arr<T> ave_pool_backward(Arr<T> dy, std::array<int64_t, 4> x_shape, Pair k, Pair s, Pair p) {
  Arr<T> dx({x_shape[0], x_shape[1], x_shape[2], x_shape[3]});
  const T* dyd = dy.data();
  T* dxd = dx.mutable_data();
  {
    py::gil_scoped_release release;
    cct::ave_pool_backward<T>(dyd, dxd, x_shape[0] * x_shape[1], int(x_shape[2]),
                              int(x_shape[3]), k[0], k[1], s[0], s[1], p[0], p[1],
                              int(dy.shape(2)), int(dy.shape(3)));
  }
  return dx;
}

template <typename T>
void bind_dtype(py::module_& m) {
  m.def("max_pool_forward", &max_pool_forward<T>, py::arg("x"), py::arg("kernel"),
        py::arg("stride"), py::arg("pad"), py::arg("out"));
  m.def("max_pool_backward", &max_pool_backward<T>, py::arg("dy"), py::arg("mask"),
        py::arg("x_shape"));
  m.def("ave_pool_forward", &ave_pool_forward<T>, py::arg("x"), py::arg("kernel"),
        py::arg("stride"), py::arg("pad"), py::arg("out"));
  m.def("ave_pool_backward", &ave_pool_backward<T>, py::arg("dy"), py::arg("x_shape"),
        py::arg("kernel"), py::arg("stride"), py::arg("pad"));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "cct CPU kernels (C++)";
  // float64 first: pybind11 tries overloads in order and forcecast would narrow doubles.
  bind_dtype<double>(m);
  bind_dtype<float>(m);
}
