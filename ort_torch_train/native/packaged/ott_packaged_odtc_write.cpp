// ORT's ODTC checkpoint (FlatBuffers, file identifier "ODTC", version 2): the writer, building the buffer call for
// call as ort_torch_train/checkpoint/odtc_write.py (and ORT's save::FromCheckpointState) does, so that the bytes equal
// the Python engine's for the same state.
#include <algorithm>
#include <cstring>

#include "ott_packaged.h"

namespace ott {

namespace {

// The FlatBuffers builder as python-flatbuffers' Builder works: back to front, alignment relative to the end,
// vtables shared when equal.
class Builder {
 public:
  size_t offset() const { return bytes_.size(); }
  void prep(size_t size, size_t additional) {
    minalign_ = std::max(minalign_, size);
    size_t align = (~(offset() + additional) + 1) & (size - 1);
    pad(align);
  }
  void pad(size_t count) { bytes_.insert(bytes_.end(), count, 0); }
  template <typename T>
  void place(T value) {  // stored reversed: the buffer is the reverse of bytes_
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    for (size_t i = sizeof(T); i-- > 0;) bytes_.push_back(raw[i]);
  }
  template <typename T>
  void prepend(T value) {
    prep(sizeof(T), 0);
    place(value);
  }
  void prepend_offset(size_t target) {
    prep(4, 0);
    place(uint32_t(offset() - target + 4));
  }
  template <typename T>
  void slot(int index, T value, T fallback) {
    if (value == fallback) return;
    prepend(value);
    vtable_[size_t(index)] = offset();
  }
  void offset_slot(int index, size_t target) {
    if (target == 0) return;
    prepend_offset(target);
    vtable_[size_t(index)] = offset();
  }
  void start_object(size_t fields) {
    vtable_.assign(fields, 0);
    object_end_ = offset();
  }
  size_t end_object();
  void start_vector(size_t element, size_t count, size_t alignment) {
    prep(4, element * count);
    prep(alignment, element * count);
    vector_count_ = count;
  }
  size_t end_vector() {
    place(uint32_t(vector_count_));
    return offset();
  }
  size_t string(const std::string& text) {
    prep(4, text.size() + 1);
    place(uint8_t(0));
    bytes_.insert(bytes_.end(), text.rbegin(), text.rend());
    vector_count_ = text.size();
    return end_vector();
  }
  size_t byte_vector(const uint8_t* data, size_t size) {
    prep(4, size);
    for (size_t i = size; i-- > 0;) bytes_.push_back(data[i]);
    vector_count_ = size;
    return end_vector();
  }
  size_t offsets(const std::vector<size_t>& targets) {
    start_vector(4, targets.size(), 4);
    for (size_t i = targets.size(); i-- > 0;) prepend_offset(targets[i]);
    return end_vector();
  }
  std::vector<uint8_t> finish(size_t root, const char identifier[4]) {
    prep(minalign_, 8);
    prep(4, 4);
    for (int i = 3; i >= 0; i--) place(uint8_t(identifier[i]));
    prepend_offset(root);
    return std::vector<uint8_t>(bytes_.rbegin(), bytes_.rend());
  }

 private:
  std::vector<uint8_t> bytes_;  // reversed
  std::vector<size_t> vtable_;
  std::map<std::vector<size_t>, size_t> vtables_;  // key -> offset of a vtable written
  size_t object_end_ = 0, vector_count_ = 0, minalign_ = 1;
};

size_t Builder::end_object() {
  prepend(int32_t(0));
  size_t object = offset();
  std::vector<size_t> key;
  bool trim = true;
  size_t trailing = 0;
  for (size_t i = vtable_.size(); i-- > 0;) {
    if (vtable_[i] == 0 && trim) {
      trailing++;
      continue;
    }
    trim = false;
    key.push_back(vtable_[i] ? object - vtable_[i] : 0);
  }
  key.push_back(object - object_end_);
  auto found = vtables_.find(key);
  size_t vtable;
  if (found == vtables_.end()) {
    for (size_t i = 0; i + 1 < key.size(); i++) prepend(uint16_t(key[i]));
    prepend(uint16_t(object - object_end_));
    prepend(uint16_t((vtable_.size() - trailing + 2) * 2));
    vtable = offset();
    vtables_[key] = vtable;
  } else {
    vtable = found->second;
  }
  int32_t relative = int32_t(int64_t(vtable) - int64_t(object));
  if (found != vtables_.end()) bytes_.resize(object);  // nothing was written past the object
  uint8_t raw[4];
  std::memcpy(raw, &relative, 4);
  for (int i = 0; i < 4; i++) bytes_[object - 1 - size_t(i)] = raw[i];
  return object;
}

size_t write_tensor(Builder& b, const Named& named, bool nominal) {
  size_t name = b.string(named.name);
  std::vector<int64_t> dims = named.tensor.sizes().vec();
  if (nominal && named.tensor.numel() == 0) dims.clear();
  b.start_vector(8, dims.size(), dims.empty() ? 4 : 8);
  for (size_t i = dims.size(); i-- > 0;) b.prepend(dims[i]);
  size_t dims_at = b.end_vector();
  at::Tensor data = named.tensor.contiguous();
  size_t raw = b.byte_vector(static_cast<const uint8_t*>(data.data_ptr()), data.nbytes());
  b.start_object(7);
  b.offset_slot(0, name);
  b.offset_slot(2, dims_at);
  b.slot<int32_t>(3, int32_t(onnx_type(named.tensor.scalar_type())), 0);
  b.offset_slot(4, raw);
  return b.end_object();
}

std::vector<size_t> write_tensors(Builder& b, std::vector<Named> tensors, bool nominal) {
  std::sort(tensors.begin(), tensors.end(), [](const Named& x, const Named& y) { return x.name < y.name; });
  std::vector<size_t> written;
  for (const Named& named : tensors) written.push_back(write_tensor(b, named, nominal));
  return written;
}

}  // namespace

std::vector<uint8_t> write_checkpoint(const CheckpointData& state, bool include_optimizer_state) {
  Builder b;
  size_t module = 0;
  if (!state.trainable.empty() || !state.frozen.empty()) {
    std::vector<size_t> trainable_tensors = write_tensors(b, state.trainable, state.is_nominal);
    std::vector<size_t> frozen_tensors = write_tensors(b, state.frozen, state.is_nominal);
    size_t trainable = b.offsets(trainable_tensors);
    size_t frozen = b.offsets(frozen_tensors);
    b.start_object(4);
    b.offset_slot(0, trainable);
    b.offset_slot(1, frozen);
    b.slot<uint8_t>(2, state.is_nominal, 0);
    module = b.end_object();
  }
  std::vector<size_t> groups;
  if (include_optimizer_state && state.has_optimizer) {
    std::vector<size_t> params;
    for (const auto& [param, moments] : state.optimizer.momentums) {  // std::map: sorted by name
      std::vector<size_t> tensors = write_tensors(b, moments, state.is_nominal);
      size_t name = b.string(param);
      size_t list = b.offsets(tensors);
      b.start_object(2);
      b.offset_slot(0, name);
      b.offset_slot(1, list);
      params.push_back(b.end_object());
    }
    size_t name = b.string(state.optimizer.name);
    size_t list = b.offsets(params);
    b.start_object(4);
    b.offset_slot(0, name);
    b.slot<float>(2, state.optimizer.initial_learning_rate, 0.0f);
    b.slot<int64_t>(1, state.optimizer.step, 0);
    b.offset_slot(3, list);
    groups.push_back(b.end_object());
  }
  size_t bag = 0;
  if (!state.properties.empty()) {
    std::vector<Property> sorted = state.properties;
    std::sort(sorted.begin(), sorted.end(), [](const Property& x, const Property& y) { return x.name < y.name; });
    std::vector<size_t> kinds[3];
    for (const Property& property : sorted) {
      size_t name = b.string(property.name);
      size_t value = property.kind == 2 ? b.string(property.string_value) : 0;
      b.start_object(2);
      b.offset_slot(0, name);
      if (property.kind == 0) b.slot<int64_t>(1, property.int_value, 0);
      if (property.kind == 1) b.slot<float>(1, property.float_value, 0.0f);
      if (property.kind == 2) b.offset_slot(1, value);
      kinds[property.kind].push_back(b.end_object());
    }
    size_t vectors[3];
    for (int kind = 0; kind < 3; kind++) vectors[kind] = b.offsets(kinds[kind]);
    b.start_object(3);
    for (int kind = 0; kind < 3; kind++) b.offset_slot(kind, vectors[kind]);
    bag = b.end_object();
  }
  size_t group_list = b.offsets(groups);
  b.start_object(4);
  b.slot<int32_t>(0, 2, 0);  // the checkpoint version
  b.offset_slot(1, module);
  b.offset_slot(2, group_list);
  b.offset_slot(3, bag);
  return b.finish(b.end_object(), "ODTC");
}

}  // namespace ott
