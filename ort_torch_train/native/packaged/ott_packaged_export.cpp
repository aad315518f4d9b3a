// ExportModelForInferencing over a package: the package prepared, for each output set, the inference model's bytes
// with each parameter's data at a known byte range (training/package/exports.py); an export is a copy of those bytes
// with the current parameter values in the ranges, written whole and renamed into place. No ONNX is parsed here.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ott_packaged.h"

namespace ott {
namespace {

ExportSet& export_numbered(Prepared& prepared, std::istringstream& words, const std::string& line) {
  int64_t index = -1;
  words >> index;
  auto found = prepared.exports.find(index);
  if (!words || found == prepared.exports.end())
    throw Error(ORT_FAIL, "package description: line '" + line + "' names no export declared before it");
  return *found->second;
}

std::string names_text(const std::vector<std::string>& names) {
  std::string text = "[";
  for (size_t i = 0; i < names.size(); i++) text += (i ? ", " : "") + names[i];
  return text + "]";
}

}  // namespace

bool Prepared::read(const std::string& key, std::istringstream& words, const std::string& line) {
  if (key == "artifact") {
    std::string role, digest;
    words >> role >> digest;
    if (!words || digest.size() != 40) throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
    artifacts[role] = digest;
  } else if (key == "export") {
    auto set = std::make_shared<ExportSet>();
    int64_t index = -1;
    words >> index >> set->model_file >> set->program_file;
    if (!words || index < 0 || exports.count(index))
      throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
    set->index = index;  // its file names are checked where they are read (package_file)
    set->folder = folder;
    exports[index] = set;
  } else if (key == "export_input") {
    ExportSet& set = export_numbered(*this, words, line);
    set.inputs.push_back(read_spec(words, line));
  } else if (key == "export_output") {
    ExportSet& set = export_numbered(*this, words, line);
    set.outputs.emplace_back();
    if (!(words >> set.outputs.back())) throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
  } else if (key == "export_parameter") {
    ExportSet& set = export_numbered(*this, words, line);
    ExportSet::Range range;
    words >> range.offset >> range.length;
    if (!words) throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
    range.tensor = read_spec(words, line);
    int64_t count = 1;
    for (int64_t extent : range.tensor.shape) {
      if (extent < 0 || (extent > 0 && count > (int64_t(1) << 40) / extent))
        throw Error(ORT_FAIL, "package description: parameter size out of range in '" + line + "'");
      count *= extent;
    }
    if (range.length != uint64_t(count) * at::elementSize(range.tensor.dtype) || range.offset > kModelLimit ||
        range.length > kModelLimit - range.offset)
      throw Error(ORT_FAIL, "package description: the byte range of '" + range.tensor.name + "' is malformed");
    set.parameters.push_back(range);
  } else {
    return false;
  }
  return true;
}

std::string read_file(const std::string& path, size_t limit, const std::string& what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(ORT_NO_SUCHFILE, what + ": cannot open '" + path + "'");
  std::streamoff size = in.tellg();
  if (size < 0 || uint64_t(size) > limit)
    throw invalid_argument(what + ": '" + path + "' is not a file of at most " + std::to_string(limit) + " bytes");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) throw Error(ORT_FAIL, what + ": cannot read '" + path + "'");
  return bytes;
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  std::string temporary = path + ".tmp";  // written whole, then renamed over the file
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(bytes.data(), std::streamsize(bytes.size())) || !out.flush()) {
      out.close();
      std::remove(temporary.c_str());
      throw Error(ORT_FAIL, what + ": cannot write '" + temporary + "'");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw Error(ORT_FAIL, what + ": cannot replace '" + path + "'");
  }
}

void export_model(const Prepared& prepared, CheckpointData& state, const std::string& path,
                  const std::vector<std::string>& outputs) {
  const ExportSet* chosen = nullptr;
  std::string prepared_sets;
  for (const auto& [index, set] : prepared.exports) {
    if (set->outputs == outputs) chosen = set.get();
    prepared_sets += (prepared_sets.empty() ? "" : ", ") + names_text(set->outputs);
  }
  if (chosen == nullptr)
    throw invalid_argument("ExportModelForInferencing: the package prepared the output sets " +
                           (prepared_sets.empty() ? std::string("(none: its artifacts hold no eval model)")
                                                  : prepared_sets) +
                           "; got " + names_text(outputs) +
                           " (build the package with `ort-torch-train package --export-outputs NAMES`)");
  if (state.is_nominal)
    throw invalid_argument("ExportModelForInferencing: the checkpoint state is nominal (no parameter values)");
  std::string model = package_file(prepared.folder, chosen->model_file, "export " + std::to_string(chosen->index));
  std::string bytes = read_file(model, kModelLimit, "ExportModelForInferencing");
  for (const ExportSet::Range& range : chosen->parameters) {
    at::Tensor* tensor = state.find(range.tensor.name);
    if (tensor == nullptr || tensor->scalar_type() != range.tensor.dtype || tensor->sizes().vec() != range.tensor.shape)
      throw invalid_argument("ExportModelForInferencing: parameter '" + range.tensor.name + "' is " +
                             dtype_name(range.tensor.dtype) + " " + shape_text(range.tensor.shape) +
                             " in the package's export, not so in the checkpoint state");
    if (range.offset + range.length > bytes.size())
      throw Error(ORT_FAIL, "ExportModelForInferencing: the package's '" + chosen->model_file +
                                "' is shorter than its parameters' ranges (damaged)");
    at::Tensor value = tensor->contiguous();
    if (range.length) std::memcpy(bytes.data() + range.offset, value.data_ptr(), range.length);
  }
  write_file_atomically(path, bytes, "ExportModelForInferencing");
}

}  // namespace ott
