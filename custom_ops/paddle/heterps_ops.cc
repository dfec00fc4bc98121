// Paddle bindings over the core table: heterps_pull (ids -> rows) and its grad op, which pushes the
// rows' gradients through the table's fused optimizer.
//
// Why a `Handle` input: ids are int64 and never need a gradient, so without a float input that does,
// Paddle's backward (static append_backward and dygraph autograd alike) would prune the grad op and the
// push would never run.  The handle is a one-element parameter; its "gradient" is zero.
//
// Tables are found by the `table` attribute in the process-wide registry of libheterps_table.so (the
// same library the Python binding loads), created on first use from the `config` attribute, so any
// process that runs the program (e.g. a PS trainer) gets the same table without extra setup.
#include <string>
#include <vector>

#include "heterps/table.h"
#include "paddle/extension.h"

#ifdef HETERPS_WITH_CUDA
#include "gpu_table.h"
#endif

namespace {

void check_ids(const paddle::Tensor& ids) {
  PD_CHECK(ids.dtype() == paddle::DataType::INT64, "heterps_pull: ids must be int64, got ", ids.dtype());
}

std::vector<int64_t> out_shape(const std::vector<int64_t>& ids_shape, const std::string& config) {
  std::vector<int64_t> s = ids_shape;
  s.push_back(heterps::TableConfig::parse(config).dim);
  return s;
}

}  // namespace

std::vector<paddle::Tensor> HeterpsPullForward(const paddle::Tensor& ids, const paddle::Tensor& handle,
                                               const std::string& table, const std::string& config) {
  check_ids(ids);
  auto shape = out_shape(ids.shape(), config);
#ifdef HETERPS_WITH_CUDA
  if (ids.is_gpu()) {
    auto out = paddle::empty(shape, paddle::DataType::FLOAT32, ids.place());
    int dev = ids.place().GetDeviceId();
    if (heterps_gpu_table_open(table.c_str(), config.c_str(), dev) != 0 ||
        heterps_gpu_table_pull(table.c_str(), ids.data<int64_t>(), static_cast<size_t>(ids.numel()), out.data<float>(),
                               ids.stream()) != 0) {
      PD_THROW("heterps_pull(", table, "): ", heterps_gpu_last_error());
    }
    return {out};
  }
#endif
  PD_CHECK(ids.is_cpu(), "heterps_pull: ids on an unsupported place (this build has no CUDA table)");
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  try {
    auto t = heterps::get_or_create_table(table, config);
    t->pull(ids.data<int64_t>(), static_cast<size_t>(ids.numel()), out.data<float>());
  } catch (const std::exception& e) {
    PD_THROW("heterps_pull(", table, "): ", e.what());
  }
  return {out};
}

std::vector<paddle::Tensor> HeterpsPullBackward(const paddle::Tensor& ids, const paddle::Tensor& handle,
                                                const paddle::Tensor& out_grad, const std::string& table,
                                                const std::string& config) {
  check_ids(ids);
  PD_CHECK(out_grad.dtype() == paddle::DataType::FLOAT32, "heterps_pull_grad: gradient must be float32");
  PD_CHECK(out_grad.numel() == ids.numel() * heterps::TableConfig::parse(config).dim,
           "heterps_pull_grad: gradient has ", out_grad.numel(), " values for ", ids.numel(), " ids");
#ifdef HETERPS_WITH_CUDA
  if (ids.is_gpu()) {
    auto g = out_grad.is_gpu() ? out_grad : out_grad.copy_to(ids.place(), true);
    if (heterps_gpu_table_open(table.c_str(), config.c_str(), ids.place().GetDeviceId()) != 0 ||
        heterps_gpu_table_push(table.c_str(), ids.data<int64_t>(), static_cast<size_t>(ids.numel()), g.data<float>(),
                               ids.stream()) != 0) {
      PD_THROW("heterps_pull_grad(", table, "): ", heterps_gpu_last_error());
    }
    return {paddle::full(handle.shape(), 0.0f, paddle::DataType::FLOAT32, handle.place())};
  }
#endif
  auto g = out_grad.is_cpu() ? out_grad : out_grad.copy_to(paddle::CPUPlace(), true);
  try {
    auto t = heterps::get_or_create_table(table, config);
    t->push(ids.data<int64_t>(), static_cast<size_t>(ids.numel()), g.data<float>());
  } catch (const std::exception& e) {
    PD_THROW("heterps_pull_grad(", table, "): ", e.what());
  }
  return {paddle::full(handle.shape(), 0.0f, paddle::DataType::FLOAT32, handle.place())};
}

std::vector<std::vector<int64_t>> HeterpsPullInferShape(const std::vector<int64_t>& ids_shape,
                                                        const std::vector<int64_t>& handle_shape,
                                                        const std::string& table, const std::string& config) {
  return {out_shape(ids_shape, config)};
}

std::vector<paddle::DataType> HeterpsPullInferDtype(const paddle::DataType& ids_dtype,
                                                    const paddle::DataType& handle_dtype) {
  return {paddle::DataType::FLOAT32};
}

std::vector<std::vector<int64_t>> HeterpsPullGradInferShape(const std::vector<int64_t>& ids_shape,
                                                            const std::vector<int64_t>& handle_shape,
                                                            const std::vector<int64_t>& grad_shape,
                                                            const std::string& table, const std::string& config) {
  return {handle_shape};
}

std::vector<paddle::DataType> HeterpsPullGradInferDtype(const paddle::DataType& ids_dtype,
                                                        const paddle::DataType& handle_dtype,
                                                        const paddle::DataType& grad_dtype) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(heterps_pull)
    .Inputs({"Ids", "Handle"})
    .Outputs({"Out"})
    .Attrs({"table: std::string", "config: std::string"})
    .SetKernelFn(PD_KERNEL(HeterpsPullForward))
    .SetInferShapeFn(PD_INFER_SHAPE(HeterpsPullInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(HeterpsPullInferDtype));

PD_BUILD_GRAD_OP(heterps_pull)
    .Inputs({"Ids", "Handle", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Handle")})
    .Attrs({"table: std::string", "config: std::string"})
    .SetKernelFn(PD_KERNEL(HeterpsPullBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(HeterpsPullGradInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(HeterpsPullGradInferDtype));
