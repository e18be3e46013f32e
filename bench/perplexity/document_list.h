// drt-ppl's documents: several --text flags, each a file or a folder, the
// way PG19-style evaluation averages over many books (review-tools 14).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace drt::ppl {

// Every value given to the flag `name` in argv, in order: "--name V",
// "--name=V", "-name V" and "-name=V", up to a lone "--" (absl's end of
// flags). absl keeps only the last value of a repeated string flag; this
// reads them all.
std::vector<std::string> RepeatedFlagValues(int argc, char** argv, std::string_view name);

// The documents `paths` name, each once: a file is one document, a folder
// gives every regular file directly in it (sorted by name; subfolders are
// skipped). NOT_FOUND naming `flag` for a path that is neither a file nor a
// folder; INVALID_ARGUMENT naming it for a folder without a regular file or a
// file named twice (by two flags, or by a flag and its folder).
absl::StatusOr<std::vector<std::string>> ListDocuments(std::string_view flag,
                                                       const std::vector<std::string>& paths);

}  // namespace drt::ppl
