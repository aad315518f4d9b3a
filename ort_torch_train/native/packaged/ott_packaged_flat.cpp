// The flat buffers a training session keeps behind the checkpoint state's trainable parameters and moments.
#include "ott_packaged.h"

namespace ott {

at::Tensor flatten(const std::vector<at::Tensor*>& tensors, const std::string& what) {
  const at::Tensor& first = *tensors.at(0);
  int64_t total = 0;
  bool laid = true;
  for (const at::Tensor* tensor : tensors) {
    if (tensor->scalar_type() != first.scalar_type() || tensor->device() != first.device())
      throw invalid_argument("CreateTrainingSession: the " + what + " do not share one dtype and device (" +
                             dtype_name(first.scalar_type()) + ", then " + dtype_name(tensor->scalar_type()) +
                             "); the package's optimizer program takes them as one flat buffer");
    laid = laid && tensor->is_contiguous() && tensor->storage().is_alias_of(first.storage()) &&
           tensor->storage_offset() == first.storage_offset() + total;
    total += tensor->numel();
  }
  if (laid) return first.as_strided({total}, {1}, first.storage_offset());
  at::Tensor flat = at::empty({total}, first.options());
  int64_t offset = 0;
  for (at::Tensor* tensor : tensors) {
    at::Tensor view = flat.narrow(0, offset, tensor->numel()).view(tensor->sizes());
    view.copy_(*tensor);
    *tensor = view;
    offset += tensor->numel();
  }
  return flat;
}

}  // namespace ott
