#include "worker/tensor/tensor.h"

#include <algorithm>
#include <cstdlib>

#include "common/check.h"
#include "absl/strings/str_join.h"

namespace distrain {

int64_t Tensor::NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DISTRAIN_CHECK_GE(d, 0) << "negative dimension in shape";
    n *= d;
  }
  return n;
}

Tensor::Tensor(std::vector<int64_t> shape, float fill)
    : shape_(std::move(shape)), data_(NumElements(shape_), fill) {}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  DISTRAIN_CHECK_EQ(static_cast<int64_t>(data_.size()), NumElements(shape_))
      << "value count does not match shape " << ShapeString();
}

void Tensor::Resize(std::vector<int64_t> shape) {
  data_.resize(NumElements(shape));
  shape_ = std::move(shape);
}

void Tensor::Fill(float value) { std::fill(data_.begin(), data_.end(), value); }

std::string Tensor::ShapeString() const { return "[" + absl::StrJoin(shape_, ", ") + "]"; }

}  // namespace distrain
