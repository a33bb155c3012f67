#pragma once
// Test helpers: float64 tensors from literals, element-wise comparison, gradcheck assertions.
#include "qkv/core/xarray.hpp"  // before any other xtensor header: see the note in it

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <filesystem>
#include <string>

#include "qkv/core/autograd.hpp"
#include "qkv/core/gradcheck.hpp"
#include "qkv/core/ops.hpp"

namespace qkv::test {

// A fresh, empty folder under the system's temporary directory, unique to this process.
inline std::string scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A full disk, as this process sees it while the object lives: a write past `bytes` into any file
// fails (EFBIG, the signal it would raise ignored).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    signal_ = std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, old_.rlim_max};
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, signal_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*signal_)(int) = nullptr;
};

// Values in row-major order, in the given shape.
inline Array<double> shaped(std::initializer_list<double> values, const Shape& shape) {
  Array<double> a = Array<double>::from_shape(shape);
  REQUIRE(a.size() == values.size());
  std::copy(values.begin(), values.end(), a.begin());
  return a;
}
// A (n,1) column: {{1}, {2}} is ambiguous between xarray's 1-D and 2-D initializer lists.
inline Array<double> column(std::initializer_list<double> values) { return shaped(values, {values.size(), 1}); }

inline Tensor f64(Array<double> value, bool requires_grad = false) { return Tensor(std::move(value), requires_grad); }
inline Tensor f32(Array<float> value, bool requires_grad = false) { return Tensor(std::move(value), requires_grad); }

// Every element of `actual` within `tolerance` of `expected`, and the same shape.
inline void check_close(const Array<double>& actual, const Array<double>& expected, double tolerance = 1e-12) {
  REQUIRE(to_string(to_shape(actual.shape())) == to_string(to_shape(expected.shape())));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("flat index " << i);
    CHECK(actual.data()[i] == Approx(expected.data()[i]).margin(tolerance).epsilon(0));
  }
}
inline void check_close(const Tensor& actual, const Array<double>& expected, double tolerance = 1e-12) {
  REQUIRE(actual.defined());
  check_close(actual.dtype() == DType::float64 ? actual.value<double>() : actual.to(DType::float64).value<double>(),
              expected, tolerance);
}

inline void check_gradients(const GradcheckFunction& f, const std::vector<Tensor>& inputs, GradcheckOptions options = {}) {
  const GradcheckResult r = gradcheck(f, inputs, options);
  INFO(r.failure);
  CHECK(r.passed);
  CHECK(r.checked > 0);
}

// The message of the exception of type E that `f` throws ("" if it throws none).
template <class E, class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}
template <class F>
std::string runtime_error_message(F&& f) {
  return error_message<std::runtime_error>(f);
}
template <class F>
std::string invalid_argument_message(F&& f) {
  return error_message<std::invalid_argument>(f);
}

}  // namespace qkv::test

// The library's layers above nn, named in tests without their namespaces: `using namespace qkv::test`.
namespace qkv::tasks {}
namespace qkv::analysis {}
namespace qkv::report {}
namespace qkv::training {}
namespace qkv::experiments {}
namespace qkv::test {
using namespace qkv::tasks;
using namespace qkv::analysis;
using namespace qkv::report;
using namespace qkv::training;
using namespace qkv::experiments;
}  // namespace qkv::test
