// Which package a CreateTrainingSession call trains, so that a program written for ONNX Runtime (model files in, as
// examples/native/train.c passes them) runs unchanged: a package folder given as the training model is that package;
// a model file's package is the folder $ORT_TORCH_TRAIN_PACKAGE names, else the folder "package" beside the file,
// where `ort-torch-train package ARTIFACTS_DIR` writes it. The models given (files or buffers) must be those the
// package was built from: their sha1 against the digests its description records.
#include <c10/util/hash.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ott_packaged.h"

namespace ott {
namespace {

constexpr const char* kVariable = "ORT_TORCH_TRAIN_PACKAGE";

bool is_directory(const std::string& path) {
  struct stat found;
  return ::stat(path.c_str(), &found) == 0 && S_ISDIR(found.st_mode);
}

// The artifact lines of the package's description: model role -> sha1 of the file it was built from.
std::map<std::string, std::string> recorded_digests(const std::string& folder) {
  std::ifstream in(folder + "/native_steps.txt");
  if (!in)
    throw Error(ORT_NO_SUCHFILE, "CreateTrainingSession: no package at '" + folder + "' (expected the folder " +
                                     "`ort-torch-train package` writes: pass it as train_model_path, set " + kVariable +
                                     " to it, or build it beside the models)");
  Prepared prepared;
  std::string line, key;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    if ((words >> key) && key == "artifact") prepared.read(key, words, line);
  }
  return prepared.artifacts;
}

// A name as an error message shows it: each control character as \xHH, so that none cuts or hides the message.
std::string shown(const std::string& name) {
  std::string text;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", unsigned(c));
      text += escaped;
    } else {
      text += char(c);
    }
  }
  return text;
}

}  // namespace

std::string package_file(const std::string& folder, const std::string& name, const std::string& entry) {
  const char* wrong = nullptr;
  if (name.empty()) wrong = "is empty";
  else if (name[0] == '/') wrong = "is absolute";
  else if (name.find_first_of("/\\") != std::string::npos) wrong = "holds a path separator";
  else if (name == "." || name == "..") wrong = "names a folder";
  else if (std::any_of(name.begin(), name.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
    wrong = "holds a control character";
  if (wrong != nullptr)
    throw Error(ORT_FAIL, "package '" + folder + "': the entry '" + shown(entry) + "' of native_steps.txt names the " +
                              "file '" + shown(name) + "', which " + wrong + "; expected the name of a file in the " +
                              "package folder (not empty, no '/' or '\\', not '.' or '..', no control character)");
  return folder + "/" + name;
}

std::string package_folder_for(const std::string& train_model_path) {
  if (is_directory(train_model_path)) return train_model_path;
  const char* named = std::getenv(kVariable);
  if (named != nullptr && *named != '\0') return named;
  size_t slash = train_model_path.rfind('/');
  return (slash == std::string::npos ? std::string(".") : train_model_path.substr(0, slash)) + "/package";
}

void check_models(const std::string& folder, const std::vector<GivenModel>& models) {
  std::map<std::string, std::string> recorded = recorded_digests(folder);
  if (recorded.empty())
    throw invalid_argument("CreateTrainingSession: package '" + folder + "' records no digests of the models it was " +
                           "built from; build it again (`ort-torch-train package`)");
  for (const GivenModel& model : models) {
    auto found = recorded.find(model.role);
    if (found == recorded.end())
      throw invalid_argument("CreateTrainingSession: package '" + folder + "' was built without a " + model.role +
                             "; " + model.where + " is one");
    std::string digest = c10::sha1(model.bytes).str();
    if (model.bytes.empty()) digest = "da39a3ee5e6b4b0d3255bfef95601890afd80709";  // c10::sha1 of "" is unset
    if (digest != found->second)
      throw invalid_argument("CreateTrainingSession: package '" + folder + "' was built from another " + model.role +
                             " (sha1 " + found->second + "); " + model.where + " has sha1 " + digest +
                             "; build the package again from these models");
  }
}

}  // namespace ott
