#include "worker/model/optimizer.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"
#include "worker/tensor/ops_dispatch.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/backend.h"
#endif

namespace distrain {

bool Optimizer::Apply(absl::Span<Parameter* const> params) {
  if (loss_scale_ != nullptr && !loss_scale_->Update(params)) return false;
  ++iterations_;
  for (Parameter* p : params) {
    DISTRAIN_CHECK(p->grad.SameShape(p->value))
        << p->name << ": grad " << p->grad.ShapeString() << " vs value " << p->value.ShapeString();
    DISTRAIN_CHECK(p->grad.device_id() == p->value.device_id())
        << p->name << ": grad on " << p->grad.device_id().ToString() << ", value on "
        << p->value.device_id().ToString();
    if (ops::OnGpu(p->value.device_id())) {
      ApplyOnDevice(p->name, p->grad, &p->value, iterations_);
    } else {
      ApplyDense(p->name, p->value.span(), p->grad.span(), iterations_);
    }
  }
  return true;
}

void Optimizer::ApplyDenseRange(const std::string& name, int64_t size, int64_t offset,
                                absl::Span<float> value, absl::Span<const float> grad,
                                int64_t iteration) {
  const float lr = RateOf(iteration);
  if (weight_decay_ != 0.0f) {
    cpu::WeightDecay(static_cast<int64_t>(value.size()), weight_decay_, lr, value.data());
  }
  UpdateRange(name, size, offset, value, grad, iteration, lr);
}

void Optimizer::ApplyOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                              int64_t iteration) {
  const float lr = RateOf(iteration);
  if (weight_decay_ != 0.0f) {
    DISTRAIN_CUDA_ONLY(cuda::WeightDecay(value->device_id().ordinal, value->size(),
                                         weight_decay_, lr, value->data()));
  }
  UpdateOnDevice(name, grad, value, iteration, lr);
}

void Optimizer::EnableDynamicLossScale(int64_t growth_steps) {
  loss_scale_ = std::make_unique<DynamicLossScale>(growth_steps);
}

std::map<std::string, Tensor> Optimizer::SlotState() const {
  std::map<std::string, Tensor> slots = RuleSlotState();
  if (loss_scale_ != nullptr) loss_scale_->AddState(&slots);
  return slots;
}

absl::Status Optimizer::RestoreState(const std::map<std::string, Tensor>& slots,
                                     int64_t iterations) {
  std::map<std::string, Tensor> rule_slots;
  for (const auto& [name, tensor] : slots) {
    if (!DynamicLossScale::IsStateKey(name)) rule_slots.emplace(name, tensor);
  }
  if (loss_scale_ != nullptr) {
    if (absl::Status s = loss_scale_->RestoreState(slots); !s.ok()) return s;
  }
  return RestoreRuleState(rule_slots, iterations);
}

namespace {

absl::Status CheckRange(const char* field, float value, bool zero_ok, bool below_one) {
  const bool ok = std::isfinite(value) && (zero_ok ? value >= 0.0f : value > 0.0f) &&
                  (!below_one || value < 1.0f);
  if (ok) return absl::OkStatus();
  const char* range = below_one ? (zero_ok ? "in [0, 1)" : "in (0, 1)") : (zero_ok ? ">= 0" : "> 0");
  return absl::InvalidArgumentError(
      absl::StrCat("spec.training.optimizer.", field, ": must be ", range, ", got ", value));
}

// Slot variables of one optimizer: for every variable name, `slot_names.size()`
// zero-initialised tensors sized like the variable.
class SlotTable {
 public:
  explicit SlotTable(std::vector<std::string> slot_names) : slot_names_(std::move(slot_names)) {}

  // The slots of `var` on `device`, created zero-filled with n elements on
  // first use. Slots restored from a checkpoint (on the host) move to the
  // device of their variable on first use, and stay there.
  std::vector<Tensor>& Get(const std::string& var, int64_t n,
                           DeviceId device = DeviceId::Cpu()) {
    auto [it, inserted] = slots_.try_emplace(var);
    if (inserted) {
      for (size_t s = 0; s < slot_names_.size(); ++s) {
        it->second.emplace_back(std::vector<int64_t>{n}, device);
      }
    }
    for (Tensor& slot : it->second) ops::MoveTo(device, &slot);
    for (size_t s = 0; s < slot_names_.size(); ++s) {
      // A restored slot that does not match the live variable means the
      // checkpoint belongs to another model; the checkpoint loader compares
      // variable shapes first, so reaching this is a bug.
      DISTRAIN_CHECK_EQ(it->second[s].size(), n)
          << "slot " << var << "/" << slot_names_[s] << " does not match its variable";
    }
    return it->second;
  }

  std::map<std::string, Tensor> State() const {
    std::map<std::string, Tensor> out;
    for (const auto& [var, tensors] : slots_) {
      for (size_t s = 0; s < slot_names_.size(); ++s) {
        Tensor host;  // checkpoints are written from host memory
        ops::Copy(tensors[s], &host);
        out.emplace(absl::StrCat(var, "/", slot_names_[s]), std::move(host));
      }
    }
    return out;
  }

  // Validates the whole map first, so a bad checkpoint leaves the table as it
  // was.
  absl::Status Restore(const std::map<std::string, Tensor>& state, const char* optimizer) {
    absl::flat_hash_map<std::string, std::vector<Tensor>> restored;
    const std::string expected =
        slot_names_.empty() ? "none"
                            : absl::StrCat("<variable>/",
                                           absl::StrJoin(slot_names_, " or <variable>/"));
    for (const auto& [name, tensor] : state) {
      const size_t slash = name.rfind('/');
      int slot = -1;
      if (slash != std::string::npos && slash > 0) {
        for (size_t s = 0; s < slot_names_.size(); ++s) {
          if (name.compare(slash + 1, std::string::npos, slot_names_[s]) == 0) {
            slot = static_cast<int>(s);
          }
        }
      }
      if (slot < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state: slot \"", name, "\" is not a slot of the ", optimizer,
            " optimizer (expected ", expected, "); the checkpoint was written with a different "
            "spec.training.optimizer.type — restore with the same optimizer or start fresh"));
      }
      if (tensor.rank() != 1) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer state: slot \"", name,
                                                       "\" has shape ", tensor.ShapeString(),
                                                       ", want a 1-D tensor"));
      }
      std::vector<Tensor>& slots = restored[name.substr(0, slash)];
      slots.resize(slot_names_.size());
      slots[slot] = tensor;
    }
    for (const auto& [var, slots] : restored) {
      for (size_t s = 0; s < slot_names_.size(); ++s) {
        if (slots[s].rank() != 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer state: variable \"", var, "\" has no \"", var, "/",
                           slot_names_[s], "\" slot; the checkpoint is incomplete"));
        }
        if (slots[s].size() != slots[0].size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "optimizer state: slots \"", var, "/", slot_names_[0], "\" ",
              slots[0].ShapeString(), " and \"", var, "/", slot_names_[s], "\" ",
              slots[s].ShapeString(), " differ in size"));
        }
      }
      auto live = slots_.find(var);
      if (live != slots_.end() && live->second[0].size() != slots[0].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state: slot \"", var, "/", slot_names_[0], "\" has shape ",
            slots[0].ShapeString(), " but variable \"", var, "\" has ", live->second[0].size(),
            " elements; the checkpoint belongs to a different model"));
      }
    }
    slots_ = std::move(restored);
    return absl::OkStatus();
  }

 private:
  std::vector<std::string> slot_names_;
  absl::flat_hash_map<std::string, std::vector<Tensor>> slots_;
};

// A caller's bug, not input: the ps sizes every range from its own shard.
void CheckUpdateRange(const std::string& name, int64_t size, int64_t offset,
                      absl::Span<float> value, absl::Span<const float> grad) {
  DISTRAIN_CHECK_EQ(value.size(), grad.size()) << name;
  DISTRAIN_CHECK(offset >= 0 && offset + static_cast<int64_t>(value.size()) <= size)
      << name << ": elements [" << offset << ", " << offset + static_cast<int64_t>(value.size())
      << ") of " << size;
}

absl::Status CheckIterations(int64_t iterations) {
  if (iterations >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer state: iterations must be >= 0, got ", iterations));
}

class SgdOptimizer : public Optimizer {
 public:
  explicit SgdOptimizer(const OptimizerConfig& c)
      : Optimizer(c), slots_({}) {}

  void UpdateRange(const std::string& name, int64_t size, int64_t offset,
                   absl::Span<float> value, absl::Span<const float> grad, int64_t iteration,
                   float lr) override {
    CheckUpdateRange(name, size, offset, value, grad);
    cpu::SgdUpdate(static_cast<int64_t>(value.size()), lr, grad.data(), value.data());
  }
  void UpdateOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                      int64_t iteration, float lr) override {
    DISTRAIN_CUDA_ONLY(
        cuda::SgdUpdate(value->device_id().ordinal, value->size(), lr, grad.data(), value->data()));
  }
  std::map<std::string, Tensor> RuleSlotState() const override { return {}; }
  absl::Status RestoreRuleState(const std::map<std::string, Tensor>& slots,
                                int64_t iterations) override {
    if (absl::Status s = CheckIterations(iterations); !s.ok()) return s;
    if (absl::Status s = slots_.Restore(slots, "sgd"); !s.ok()) return s;
    iterations_ = iterations;
    return absl::OkStatus();
  }

 private:
  SlotTable slots_;  // always empty; validates that a checkpoint has no slots
};

class MomentumOptimizer : public Optimizer {
 public:
  explicit MomentumOptimizer(const OptimizerConfig& c)
      : Optimizer(c),
        momentum_(c.momentum),
        nesterov_(c.nesterov),
        slots_({"momentum"}) {}

  void UpdateRange(const std::string& name, int64_t size, int64_t offset,
                   absl::Span<float> value, absl::Span<const float> grad, int64_t iteration,
                   float lr) override {
    CheckUpdateRange(name, size, offset, value, grad);
    const int64_t n = static_cast<int64_t>(value.size());
    std::vector<Tensor>& s = slots_.Get(name, size);
    cpu::MomentumUpdate(n, lr, momentum_, nesterov_, grad.data(), s[0].data() + offset,
                        value.data());
  }
  void UpdateOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                      int64_t iteration, float lr) override {
    std::vector<Tensor>& s = slots_.Get(name, value->size(), value->device_id());
    DISTRAIN_CUDA_ONLY(cuda::MomentumUpdate(value->device_id().ordinal, value->size(), lr,
                                            momentum_, nesterov_, grad.data(), s[0].data(),
                                            value->data()));
  }
  std::map<std::string, Tensor> RuleSlotState() const override { return slots_.State(); }
  absl::Status RestoreRuleState(const std::map<std::string, Tensor>& slots,
                                int64_t iterations) override {
    if (absl::Status s = CheckIterations(iterations); !s.ok()) return s;
    if (absl::Status s = slots_.Restore(slots, "momentum"); !s.ok()) return s;
    iterations_ = iterations;
    return absl::OkStatus();
  }

 private:
  float momentum_;
  bool nesterov_;
  SlotTable slots_;
};

class AdamOptimizer : public Optimizer {
 public:
  explicit AdamOptimizer(const OptimizerConfig& c)
      : Optimizer(c),
        beta1_(c.beta1),
        beta2_(c.beta2),
        epsilon_(c.epsilon),
        slots_({"m", "v"}) {}

  void UpdateRange(const std::string& name, int64_t size, int64_t offset,
                   absl::Span<float> value, absl::Span<const float> grad, int64_t iteration,
                   float lr) override {
    CheckUpdateRange(name, size, offset, value, grad);
    DISTRAIN_CHECK_GE(iteration, 1) << name << ": Adam iterations are 1-based";
    const int64_t n = static_cast<int64_t>(value.size());
    std::vector<Tensor>& s = slots_.Get(name, size);
    cpu::AdamUpdate(n, CorrectedRate(lr, iteration), beta1_, beta2_, epsilon_, grad.data(),
                    s[0].data() + offset, s[1].data() + offset, value.data());
  }
  void UpdateOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                      int64_t iteration, float lr) override {
    DISTRAIN_CHECK_GE(iteration, 1) << name << ": Adam iterations are 1-based";
    std::vector<Tensor>& s = slots_.Get(name, value->size(), value->device_id());
    DISTRAIN_CUDA_ONLY(cuda::AdamUpdate(value->device_id().ordinal, value->size(),
                                        CorrectedRate(lr, iteration), beta1_, beta2_, epsilon_,
                                        grad.data(), s[0].data(), s[1].data(), value->data()));
  }
  std::map<std::string, Tensor> RuleSlotState() const override { return slots_.State(); }
  absl::Status RestoreRuleState(const std::map<std::string, Tensor>& slots,
                                int64_t iterations) override {
    if (absl::Status s = CheckIterations(iterations); !s.ok()) return s;
    if (absl::Status s = slots_.Restore(slots, "adam"); !s.ok()) return s;
    iterations_ = iterations;
    return absl::OkStatus();
  }

 private:
  // lr * sqrt(1 - b2^t) / (1 - b1^t), in double as Keras computes it.
  float CorrectedRate(float lr, int64_t iteration) const {
    const double t = static_cast<double>(iteration);
    return static_cast<float>(double{lr} * std::sqrt(1.0 - std::pow(double{beta2_}, t)) /
                              (1.0 - std::pow(double{beta1_}, t)));
  }

  float beta1_;
  float beta2_;
  float epsilon_;
  SlotTable slots_;
};

class RmspropOptimizer : public Optimizer {
 public:
  explicit RmspropOptimizer(const OptimizerConfig& c)
      : Optimizer(c),
        rho_(c.rho),
        epsilon_(c.epsilon),
        centered_(c.centered),
        slots_(c.centered ? std::vector<std::string>{"velocity", "average_gradient"}
                          : std::vector<std::string>{"velocity"}) {}

  void UpdateRange(const std::string& name, int64_t size, int64_t offset,
                   absl::Span<float> value, absl::Span<const float> grad, int64_t iteration,
                   float lr) override {
    CheckUpdateRange(name, size, offset, value, grad);
    std::vector<Tensor>& s = slots_.Get(name, size);
    cpu::RmspropUpdate(static_cast<int64_t>(value.size()), lr, rho_, epsilon_, grad.data(),
                       s[0].data() + offset, centered_ ? s[1].data() + offset : nullptr,
                       value.data());
  }
  void UpdateOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                      int64_t iteration, float lr) override {
    std::vector<Tensor>& s = slots_.Get(name, value->size(), value->device_id());
    DISTRAIN_CUDA_ONLY(cuda::RmspropUpdate(value->device_id().ordinal, value->size(), lr, rho_,
                                           epsilon_, grad.data(), s[0].data(),
                                           centered_ ? s[1].data() : nullptr, value->data()));
  }
  std::map<std::string, Tensor> RuleSlotState() const override { return slots_.State(); }
  absl::Status RestoreRuleState(const std::map<std::string, Tensor>& slots,
                                int64_t iterations) override {
    if (absl::Status s = CheckIterations(iterations); !s.ok()) return s;
    if (absl::Status s = slots_.Restore(slots, centered_ ? "centered rmsprop" : "rmsprop");
        !s.ok()) {
      return s;
    }
    iterations_ = iterations;
    return absl::OkStatus();
  }

 private:
  float rho_;
  float epsilon_;
  bool centered_;
  SlotTable slots_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                             Precision precision) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Create(config);
  if (optimizer.ok() && precision == Precision::kMixedFloat16) {
    (*optimizer)->EnableDynamicLossScale();
  }
  return optimizer;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config) {
  // Only the fields the chosen rule reads are checked; the others keep their
  // (valid) defaults or are ignored, as in Keras.
  if (absl::Status s = CheckRange("learningRate", config.learning_rate, false, false); !s.ok()) {
    return s;
  }
  if (config.weight_decay) {
    if (absl::Status s = CheckRange("weightDecay", *config.weight_decay, true, false); !s.ok()) {
      return s;
    }
  }
  switch (config.type) {
    case OptimizerType::kSgd:
      return std::unique_ptr<Optimizer>(new SgdOptimizer(config));
    case OptimizerType::kMomentum:
      if (absl::Status s = CheckRange("momentum", config.momentum, true, true); !s.ok()) return s;
      return std::unique_ptr<Optimizer>(new MomentumOptimizer(config));
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      if (absl::Status s = CheckRange("beta1", config.beta1, true, true); !s.ok()) return s;
      if (absl::Status s = CheckRange("beta2", config.beta2, true, true); !s.ok()) return s;
      if (absl::Status s = CheckRange("epsilon", config.epsilon, false, false); !s.ok()) return s;
      return std::unique_ptr<Optimizer>(new AdamOptimizer(config));
    case OptimizerType::kRmsprop:
      if (absl::Status s = CheckRange("rho", config.rho, true, true); !s.ok()) return s;
      if (absl::Status s = CheckRange("epsilon", config.epsilon, false, false); !s.ok()) return s;
      return std::unique_ptr<Optimizer>(new RmspropOptimizer(config));
  }
  return absl::InvalidArgumentError(absl::StrCat("spec.training.optimizer.type: unknown type ",
                                                 static_cast<int>(config.type),
                                                 "; use sgd, momentum, adam, adamw or rmsprop"));
}

}  // namespace distrain
